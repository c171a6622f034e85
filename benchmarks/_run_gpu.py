"""``bench_run.py --jit numba-cuda`` and ``--jit torch-cuda``: ``cuforge run`` on the GPU
against the stock JIT's cold and warm-local start, one run, side by side.

Three configurations, each a fresh process, alternated round by round (the order
reversed in odd rounds):

- ``stock cold``: a fresh host -- empty JIT directories (``NUMBA_CACHE_DIR``, or
  ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``), ``HOME``, ``XDG_CACHE_HOME``
  and ``$TMPDIR`` -- nothing cached anywhere: the JIT compiles;
- ``stock warm-local``: the directories, home and ``$TMPDIR`` an earlier stock process
  filled (the host that compiled before);
- ``cuforge run, fresh host``: empty directories, home and ``$TMPDIR`` again, the job
  started as ``cuforge run --cache file://<empty local>,file://<shared> -- python
  job.py`` (no code change) on a shared cache that another ``cuforge run`` process --
  another fresh host -- filled before the rounds. The GPU machine has no Redis, so a
  directory on the same file system stands in for the fleet's cache: the tier's
  second level, behind an empty local level (``$CUFORGE_CACHE``'s usual
  ``file://<local>,redis://<fleet>`` shape).

Each process is timed three ways: ``first result`` from before the framework's
import to the first result on the host (the device synchronised), as the job itself
measures it (the CPU modes' figure); ``from launch``: from the moment the parent
starts the command to that same first result (``CLOCK_MONOTONIC``, which every
process of the host shares) -- for ``cuforge run`` its own start, opening the cache
and hydrating the mirrored directories included; and the process's ``wall`` time
(``cuforge run``'s final publish included). The figure ``bench_check.py --gpu``
checks (``run_numbacuda_fresh_host``, ``run_torchcuda_fresh_host`` in
``thresholds.toml``) is ``from launch``: cuforge run's fresh host over stock
warm-local, medians.

numba-cuda: four ``@cuda.jit(cache=True)`` kernels in a module written once to the
work directory (numba caches per source file, in ``<dir>_<sha1 of its path>`` under
``NUMBA_CACHE_DIR``, its index stamped with the file's mtime and size: every host
runs the same file, as from one container image), each launched once, the results
copied back and checked against NumPy; the mirror's ``numba`` profile carries the
directory (keyed by numba's and numba-cuda's versions; numba-cuda's own index key
names the compute capability and the CUDA runtime). numba-cuda's first compile
fails with numpy >= 2.5 (numba-cuda 0.30.4): the processes must find a numpy < 2.5
first on ``PYTHONPATH`` (``scripts/gpu-test`` installs ``.whl/numba/*.whl`` into a
private folder for this bench); a newer one is refused before anything runs.

torch-cuda: bench_coldstart's MLP (Linear, GELU, Linear, LayerNorm; width 1024) under
``torch.compile`` (default mode); ``cuforge run`` wires Inductor's FX-graph and
AOT-autograd caches and Triton's cache manager to the tier. ``--device cpu`` runs
the same harness on a CPU (width 64, Inductor's C++): a check of the harness, not a
figure.

Every process's counters are checked (a cold run compiled, a warm one hit; numba's
``cache_hits``/``cache_misses`` per kernel, Inductor's FX-graph counters; the fill
left entries in the shared directory), so a figure never measures the wrong thing.
"""

from __future__ import annotations

import compileall
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _results

JITS = ("numba-cuda", "torch-cuda")
KINDS = ("stock cold", "stock warm-local", "cuforge run, fresh host")
MEASURES = ("first_s", "from_launch_s", "wall_s", "cpu_s")
#: bench_check.py's figure for each JIT (thresholds.toml [gpu.run_*]).
FIGURE = {"numba-cuda": "run_numbacuda_fresh_host", "torch-cuda": "run_torchcuda_fresh_host"}
TIMEOUT_S = 600
#: The processes before the rounds: (label, kind, host). The stock one's host is the
#: warm-local one; the cuforge run fills the shared cache as another fresh host.
FILLS = (
    ("fill: stock (the warm-local host)", "stock cold", "stock-warm"),
    ("fill: cuforge run (the shared cache)", "cuforge run, cold", "fill-host"),
)
#: Variables a fresh host does not inherit: the JITs', cuforge's, the driver's JIT cache.
_DROPPED = ("CUFORGE_", "NUMBA_", "TORCHINDUCTOR_", "TRITON_", "BENCH_RUN_")

KERNELS = '''"""bench_run's numba-cuda kernels: each cached by numba (cache=True)."""
import math

from numba import cuda


@cuda.jit(cache=True)
def saxpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


@cuda.jit(cache=True)
def smooth(x, out):
    i = cuda.grid(1)
    if i < out.size:
        v = x[i] * 0.001
        out[i] = math.sin(v) * math.exp(-v * v) + math.sqrt(v + 1.0)


@cuda.jit(cache=True)
def total(x, out):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(out, 0, x[i])


@cuda.jit(cache=True)
def scale_rows(m, s, out):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = m[i, j] * s[j]
'''

NUMBA_JOB = """
import time
T0 = time.perf_counter()
import json, math, os, sys
import numpy as np
from numba import cuda
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cuda_kernels as k

n, rows, cols, threads = 1 << 20, 512, 512, 256
blocks = (n + threads - 1) // threads
x = np.arange(n, dtype=np.float32) * np.float32(0.5)
y = np.ones(n, dtype=np.float32)
m = np.arange(rows * cols, dtype=np.float32).reshape(rows, cols) * np.float32(0.01)
s = np.linspace(0.5, 1.5, cols).astype(np.float32)
dx, dy, dm, ds = (cuda.to_device(a) for a in (x, y, m, s))
d_saxpy, d_smooth = cuda.device_array_like(dx), cuda.device_array_like(dx)
d_total, d_rows = cuda.to_device(np.zeros(1, dtype=np.float32)), cuda.device_array_like(dm)
k.saxpy[blocks, threads](np.float32(2.0), dx, dy, d_saxpy)
k.smooth[blocks, threads](dx, d_smooth)
k.total[blocks, threads](dy, d_total)
k.scale_rows[(rows // 16, cols // 16), (16, 16)](dm, ds, d_rows)
cuda.synchronize()
got = [a.copy_to_host() for a in (d_saxpy, d_smooth, d_total, d_rows)]
seconds = time.perf_counter() - T0
done = time.clock_gettime(time.CLOCK_MONOTONIC)
v = x * np.float32(0.001)
want = [2 * x + y, np.sin(v) * np.exp(-v * v) + np.sqrt(v + 1), np.array([n], np.float32), m * s]
correct = all(np.allclose(g, w, rtol=1e-4, atol=1e-3) for g, w in zip(got, want))
kernels = {}
for name in ("saxpy", "smooth", "total", "scale_rows"):
    stats = getattr(getattr(k, name), "stats", None)
    kernels[name] = None if stats is None else {
        "hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values())}
report = {"seconds": seconds, "done": done, "correct": bool(correct), "kernels": kernels,
          "numpy": np.__version__}
print("RESULT " + json.dumps(report), flush=True)
"""

TORCH_JOB = """
import time
T0 = time.perf_counter()
import json, os, sys
import torch
device = os.environ["BENCH_RUN_DEVICE"]
width = int(os.environ["BENCH_RUN_WIDTH"])
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(width, 4 * width),
    torch.nn.GELU(),
    torch.nn.Linear(4 * width, width),
    torch.nn.LayerNorm(width),
).to(device)
x = torch.randn(64, width, device=device)
with torch.no_grad():
    out = torch.compile(model)(x)
    first = out.sum().item()  # on the host: the device synchronised
seconds = time.perf_counter() - T0
done = time.clock_gettime(time.CLOCK_MONOTONIC)
with torch.no_grad():
    correct = bool(torch.allclose(out, model(x), rtol=1e-2, atol=1e-2))
from torch._dynamo.utils import counters
report = {"seconds": seconds, "done": done, "correct": correct,
          "fxgraph": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")},
          "wired": "cuforge.integrations.inductor" in sys.modules}
triton = sys.modules.get("cuforge.integrations.triton")  # read, never imported here
if triton is not None:
    report["triton"] = dict(triton.counters)
print("RESULT " + json.dumps(report), flush=True)
"""


class Bench:
    """One JIT's processes, under the work directory ``work``."""

    def __init__(self, jit: str, work: Path, device: str = "cuda") -> None:
        self.jit = jit
        self.work = work
        self.device = device
        self.py = sys.executable
        self.job = work / "job.py"
        self.shared = work / "shared"  # the fleet's cache, filled by another process
        self.job.write_text(NUMBA_JOB if jit == "numba-cuda" else TORCH_JOB)
        if jit == "numba-cuda":
            (work / "bench_cuda_kernels.py").write_text(KERNELS)

    def host(self, name: str) -> dict[str, str]:
        """A host's environment, its directories under ``work/name`` (made empty when
        new; a second call gives the same ones, as warm-local's processes share them):
        its home, ``$TMPDIR``, the JIT's directories and cuforge's local level."""
        root = self.work / name
        dirs = {"HOME": root / "home", "TMPDIR": root / "tmp"}
        if self.jit == "numba-cuda":
            dirs["NUMBA_CACHE_DIR"] = root / "numba"
        else:
            dirs["TORCHINDUCTOR_CACHE_DIR"] = root / "inductor"
            dirs["TRITON_CACHE_DIR"] = root / "triton"
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
        # The driver's JIT cache follows HOME; an installed cuforge has its bytecode.
        for name_ in ("CUDA_CACHE_PATH", "PYTHONDONTWRITEBYTECODE"):
            env.pop(name_, None)
        env.update({k: str(v) for k, v in dirs.items()})
        env["XDG_CACHE_HOME"] = str(dirs["HOME"] / ".cache")
        if self.jit == "torch-cuda":
            env["TRITON_HOME"] = str(dirs["HOME"])
            env["BENCH_RUN_DEVICE"] = self.device
            env["BENCH_RUN_WIDTH"] = "64" if self.device == "cpu" else "1024"
        return env

    def url(self, name: str) -> str:
        """The tier a ``cuforge run`` on host ``name`` uses: its own empty local level,
        then the shared directory."""
        return f"file://{self.work / name / 'cuforge'},file://{self.shared}"

    def command(self, kind: str, name: str) -> list[str]:
        job = [self.py, str(self.job)]
        if kind.startswith("cuforge"):
            return [self.py, "-m", "cuforge", "run", "--cache", self.url(name), "--", *job]
        return job

    def launch(self, kind: str, name: str) -> dict[str, Any]:
        """One process of ``kind`` on host ``name``: its report and timings."""
        env = self.host(name)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.clock_gettime(time.CLOCK_MONOTONIC)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(
                self.command(kind, name), env=env, capture_output=True, text=True,
                timeout=TIMEOUT_S,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            raise SystemExit(f"bench_run: {self.jit} {kind} ran past {TIMEOUT_S} s") from None
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            raise SystemExit(
                f"bench_run: {self.jit} {kind} failed (exit {proc.returncode}):\n"
                f"{proc.stderr[-4000:]}"
            )
        report: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
        report.update(
            first_s=report["seconds"],
            from_launch_s=report["done"] - start,
            wall_s=wall,
            cpu_s=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        )
        return report

    def problems(self, kind: str, report: dict[str, Any]) -> list[str]:
        """What makes ``report`` not the ``kind`` of process it should be (the fills'
        kinds, ``stock cold`` and ``cuforge run, cold``, compile as cold ones do)."""
        out = [] if report["correct"] else ["the result is wrong"]
        warm = kind in ("stock warm-local", "cuforge run, fresh host")
        if self.jit == "numba-cuda":
            for name, stats in report["kernels"].items():
                if stats is None:
                    out.append(f"{name}: numba-cuda reports no cache counters")
                elif warm and (stats["misses"] or not stats["hits"]):
                    out.append(f"{name} compiled instead of a cache hit ({stats})")
                elif not warm and (stats["hits"] or not stats["misses"]):
                    out.append(f"{name} was not compiled ({stats})")
        else:
            fx = report["fxgraph"]
            if warm and (not fx.get("fxgraph_cache_hit") or fx.get("fxgraph_cache_miss")):
                out.append(f"not an FX-graph cache hit ({fx})")
            if not warm and (fx.get("fxgraph_cache_hit") or not fx.get("fxgraph_cache_miss")):
                out.append(f"not a cold compile ({fx})")
            if kind.startswith("cuforge") and not report["wired"]:
                out.append("cuforge run did not wire Inductor in the job")
            if kind.startswith("stock") and report["wired"]:
                out.append("a stock process was wired to cuforge")
        return out

    def shared_files(self) -> int:
        """How many files the shared cache holds under ``entries/``."""
        return sum(len(files) for _, _, files in os.walk(self.shared / "entries"))


def check_numpy(bench: Bench) -> str | None:
    """The numpy version the numba-cuda processes import, or None where it will do;
    a refusal (one line) for numpy >= 2.5 or none at all."""
    env = bench.host("numpy-probe")
    probe = [bench.py, "-c", "import numpy; print(numpy.__version__, numpy.__file__)"]
    out = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    if out.returncode:
        return f"numpy does not import for the numba-cuda processes: {out.stderr.strip()[-300:]}"
    version, where = out.stdout.split()[:2]
    print(f"numba-cuda processes import numpy {version} from {os.path.dirname(where)}")
    major, minor = (int(p) for p in version.split(".")[:2])
    if (major, minor) >= (2, 5):
        return (
            f"numba-cuda's first compile fails with numpy {version} (it needs numpy < 2.5): "
            "put a numpy < 2.5 first on PYTHONPATH (scripts/gpu-test installs "
            ".whl/numba/*.whl into a private folder for this bench)"
        )
    return None


def host_name(kind: str, r: int) -> str:
    """The host a ``kind`` of process runs on in round ``r``: warm-local's is the one
    its fill made, every other a new one."""
    return FILLS[0][2] if kind == "stock warm-local" else f"{kind.split()[0]}-{r}"


def measure(bench: Bench, rounds: int) -> dict[str, Any]:
    """The fills, then ``rounds`` alternated rounds of every kind."""
    samples: list[dict[str, Any]] = []
    problems: list[str] = []

    def run(kind: str, name: str, label: str) -> dict[str, Any]:
        report = bench.launch(kind, name)
        problems.extend(f"{label}: {why}" for why in bench.problems(kind, report))
        samples.append({"label": label, "kind": kind, **report})
        print(
            f"  {label:34s} first result {report['first_s']:7.2f} s, from launch "
            f"{report['from_launch_s']:7.2f} s, wall {report['wall_s']:7.2f} s",
            flush=True,
        )
        return report

    for label, kind, name in FILLS:
        run(kind, name, label)
    if not bench.shared_files():
        problems.append(f"the fill left nothing in the shared cache {bench.shared}")
    times: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    for r in range(rounds):
        order = KINDS if r % 2 == 0 else KINDS[::-1]
        for kind in order:
            name = host_name(kind, r)
            report = run(kind, name, f"round {r}, {kind}")
            times[kind].append({m: report[m] for m in MEASURES})
            if name != "stock-warm":
                shutil.rmtree(bench.work / name, ignore_errors=True)
    med = {k: {m: statistics.median(t[m] for t in v) for m in MEASURES} for k, v in times.items()}
    base = med["stock warm-local"]
    ratios = {k: {m: v[m] / base[m] for m in MEASURES} for k, v in med.items()}
    fresh = ratios["cuforge run, fresh host"]["from_launch_s"]
    # A CPU run checks the harness: its ratio is no GPU figure for bench_check.
    figures = {} if bench.device == "cpu" else {FIGURE[bench.jit]: fresh}
    return {
        "jit": bench.jit,
        "device": bench.device,
        "rounds": rounds,
        "shared_cache": "file://<empty local>,file://<shared directory another process filled>",
        "seconds": times,
        "median_s": med,
        "ratios_to_warm_local": ratios,
        "figures": figures,
        "problems": problems,
        "samples": samples,
    }


def report(results: dict[str, Any], goal: float) -> None:
    jit, rounds = results["jit"], results["rounds"]
    print(
        f"\n{jit} on {results['device']}, {rounds} alternated rounds, medians: first result "
        "(from before the framework's import), from launch (cuforge run's own start and "
        "hydration included), process wall time; ratio to stock warm-local. The shared "
        "cache: a file:// tier, an empty local level before a directory another "
        "cuforge run filled (no Redis on this machine)"
    )
    for kind, med in results["median_s"].items():
        ratio = results["ratios_to_warm_local"][kind]
        print(
            f"  {kind:24s} first {med['first_s']:6.2f} s ({ratio['first_s']:5.2f}x)  "
            f"from launch {med['from_launch_s']:6.2f} s ({ratio['from_launch_s']:5.2f}x)  "
            f"wall {med['wall_s']:6.2f} s ({ratio['wall_s']:5.2f}x)"
        )
    for figure, value in results["figures"].items():
        print(f"{figure} = {value:.3f} (cuforge run, fresh host / stock warm-local, from "
              f"launch; goal <= {goal})")  # fmt: skip
    if not results["figures"]:
        print("a check of the harness on the CPU: no figure")


GOAL = {"numba-cuda": 1.2, "torch-cuda": 1.1}


def main(jit: str, rounds: int, device: str, json_path: str | None, note: str,
         dry_run: bool) -> int:  # fmt: skip
    """Run (or with ``dry_run`` only print) one GPU mode; the exit status."""
    if device == "cpu" and jit != "torch-cuda":
        print("bench_run: --device cpu: only --jit torch-cuda has a CPU harness check",
              file=sys.stderr)  # fmt: skip
        return 2
    work = Path(tempfile.mkdtemp(prefix=f"bench-run-{jit}-"))
    try:
        bench = Bench(jit, work, device)
        if jit == "numba-cuda":
            refused = check_numpy(bench)
            if refused:
                print(f"bench_run: {refused}", file=sys.stderr)
                return 2
        if dry_run:
            return _dry_run(bench)
        import cuforge  # byte-compiled once, as an installed cuforge is

        compileall.compile_dir(os.path.dirname(cuforge.__file__), quiet=1)
        results = measure(bench, rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results, GOAL[jit])
    for p in results["problems"]:
        print(f"PROBLEM: {p}")
    _results.write(json_path, "bench_run", results, note)
    return 1 if results["problems"] else 0


def _dry_run(bench: Bench) -> int:
    """Each configuration's command and the environment it gets (what differs from
    this one's), without starting anything."""
    rounds = [(f"round 0, {kind}", kind, host_name(kind, 0)) for kind in KINDS]
    for label, kind, name in (*FILLS, *rounds):
        env = bench.host(name)
        changed = {k: v for k, v in env.items() if os.environ.get(k) != v}
        dropped = sorted(k for k in os.environ if k not in env)
        print(f"{label} (host {name}):\n  {' '.join(bench.command(kind, name))}")
        for k, v in sorted(changed.items()):
            print(f"    {k}={v}")
        if dropped:
            print(f"    unset: {' '.join(dropped)}")
    return 0
