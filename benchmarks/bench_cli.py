"""The command line from a cold process: what a build system pays per ``cuforge`` call.

- ``python -c pass``: the floor (interpreter start-up), measured interleaved with
  every other row so a busy machine slows both alike.
- ``import cuforge`` / ``import cuforge.utils``: whole processes, and their cost
  beyond the floor; the README's import lines, for a script that only compiles
  (``from cuforge import Program, ProgramOptions``) and for one that launches too
  (``from cuforge import Device, LaunchConfig, Program, ProgramOptions, launch``).
- ``cuforge compile k.cu --arch sm_90 -o k.cubin --cache DIR``, a hit, whole process:
  - the repeated command (``cli/_direct``: the fast hit path),
  - a kernel that includes a header (the full path: argparse, the compile layer,
    the header manifest; the compiler identity from ``_identity_store``),
  - with ``CUFORGE_STATE_DIR=off`` (nothing kept between processes: the identity
    is probed in every process -- what every hit cost before).
- ``cuforge warm`` on the example manifest (9 kernels x archs x variants, 18
  compiles) and on 8 CUB kernels: ``--jobs 1`` against ``--jobs 2`` with threads
  and with processes, each into an empty cache.

cuforge's modules are byte-compiled first (``compileall``), as a wheel install does:
an editable checkout under ``PYTHONDONTWRITEBYTECODE=1`` would otherwise recompile
every module in every process, which measures the checkout, not cuforge.

    python benchmarks/bench_cli.py [--runs 20] [--quick]
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import _results
import cuforge

SCRIPT = os.path.join(os.path.dirname(sys.executable), "cuforge")
if not os.path.exists(SCRIPT):  # installed for a system interpreter: on PATH
    SCRIPT = shutil.which("cuforge") or SCRIPT
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
#: The README's import lines: a script that only compiles, and one that launches too.
COMPILE_LINE = "from cuforge import Program, ProgramOptions"
RUNTIME_LINE = "from cuforge import Device, LaunchConfig, Program, ProgramOptions, launch"
KERNEL = 'extern "C" __global__ void k(float* a, float s) { a[threadIdx.x] *= s; }\n'
CUB_KERNEL = """#include <cub/block/block_reduce.cuh>
extern "C" __global__ void sum(const float* x, float* out) {
    using R = cub::BlockReduce<float, BLOCK>;
    __shared__ typename R::TempStorage tmp;
    float t = R(tmp).Sum(x[blockIdx.x * BLOCK + threadIdx.x]);
    if (threadIdx.x == 0) out[blockIdx.x] = t;
}
"""


def _env(state: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    env["CUFORGE_STATE_DIR"] = state or "off"
    return env


def _once(cmd: list[str], cwd: str, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)  # fmt: skip
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")
    return elapsed


def bench_processes(runs: int) -> dict[str, dict[str, float]]:
    """Median and min wall ms of each cold-process case, interleaved with the floor."""
    compileall.compile_dir(os.path.dirname(cuforge.__file__), quiet=1)
    work = tempfile.mkdtemp(prefix="cuforge-bench-cli-")
    try:
        state = os.path.join(work, "state")
        cache = os.path.join(work, "cache")
        with open(os.path.join(work, "k.cu"), "w") as f:
            f.write(KERNEL)
        with open(os.path.join(work, "h.h"), "w") as f:
            f.write("#define SCALE 2.0f\n")
        with open(os.path.join(work, "h.cu"), "w") as f:
            f.write('#include "h.h"\n' + KERNEL.replace("*= s", "*= s * SCALE"))
        old = time.time() - 10  # headers are trusted by stat once older than 2 s
        os.utime(os.path.join(work, "h.h"), (old, old))
        py = sys.executable
        hit = [SCRIPT, "compile", "k.cu", "--arch", "sm_90", "-o", "k.cubin", "--cache", cache]
        tracked = [SCRIPT, "compile", "h.cu", "--arch", "sm_90", "-o", "h.cubin", "--cache", cache]
        cases = {
            "python -c pass": ([py, "-c", "pass"], _env(state)),
            "import cuforge": ([py, "-c", "import cuforge"], _env(state)),
            "import cuforge.utils": ([py, "-c", "import cuforge.utils"], _env(state)),
            COMPILE_LINE: ([py, "-c", COMPILE_LINE], _env(state)),
            RUNTIME_LINE: ([py, "-c", RUNTIME_LINE], _env(state)),
            "compile hit (repeated command)": (hit, _env(state)),
            "compile hit (kernel with a header)": (tracked, _env(state)),
            "compile hit (nothing kept: STATE_DIR=off)": (hit, _env(None)),
        }
        for cmd, env in (
            cases["compile hit (repeated command)"],
            cases["compile hit (kernel with a header)"],
        ):
            for _ in range(3):  # fill; let the files settle; record identity and hit records
                _once(cmd, work, env)
                time.sleep(1.1)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(runs):
            for name, (cmd, env) in cases.items():
                times[name].append(_once(cmd, work, env) * 1000)
        return {name: {"median": statistics.median(v), "min": min(v)} for name, v in times.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _cub_manifest(folder: str, n: int) -> str:
    lines = ['[defaults]\narch = "sm_90"\n']
    for i in range(n):
        name = f"sum{i}.cu"
        with open(os.path.join(folder, name), "w") as f:
            f.write(f"#define BLOCK {64 * (i + 1)}\n" + CUB_KERNEL)
        lines.append(f'[[kernel]]\nsource = "{name}"\n')
    path = os.path.join(folder, "cub.toml")
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return path


def bench_warm(rounds: int, n_cub: int = 8) -> dict[str, dict[str, float]]:
    """Median seconds of ``cuforge warm`` into an empty cache per manifest and mode."""
    work = tempfile.mkdtemp(prefix="cuforge-bench-warm-")
    try:
        manifests = {
            "example manifest (18 compiles)": os.path.join(EXAMPLES, "warm.toml"),
            f"{n_cub} CUB kernels": _cub_manifest(work, n_cub),
        }
        modes = {
            "--jobs 1": ["--jobs", "1"],
            "--jobs 2 threads": ["--jobs", "2", "--threads"],
            "--jobs 2 processes": ["--jobs", "2"],
        }
        out: dict[str, dict[str, float]] = {}
        for label, manifest in manifests.items():
            seconds: dict[str, list[float]] = {m: [] for m in modes}
            for r in range(rounds):
                for mode, extra in modes.items():
                    cache = os.path.join(work, f"c-{len(out)}-{r}-{len(seconds[mode])}")
                    cmd = [SCRIPT, "warm", manifest, "--cache", cache, *extra]
                    seconds[mode].append(_once(cmd, work, _env(None)))
                    shutil.rmtree(cache, ignore_errors=True)
            out[label] = {m: statistics.median(v) for m, v in seconds.items()}
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def measure(runs: int, warm_rounds: int) -> dict[str, Any]:
    """The raw numbers: cold-process medians and minima (ms) and warm medians (s)."""
    return {
        "runs": runs,
        "warm_rounds": warm_rounds,
        "cpus": os.cpu_count(),
        "process_ms": bench_processes(runs),
        "warm_s": bench_warm(warm_rounds),
    }


def rows(
    runs: int, warm_rounds: int, raw: dict[str, Any] | None = None
) -> list[tuple[str, str, str, str]]:
    """(measurement, value, x python -c pass, target) rows for run.py and main(); from
    ``raw`` (what ``measure`` returns) when given, else measured now."""
    raw = raw or measure(runs, warm_rounds)
    p = raw["process_ms"]
    floor = p["python -c pass"]["median"]
    out = [("python -c pass (the floor)", f"{floor:.1f} ms", "1.00x", "")]
    targets = {
        "import cuforge": "<= 30 ms",
        "import cuforge.utils": "<= 15 ms beyond the floor",
        COMPILE_LINE: "<= 2x",
        RUNTIME_LINE: "<= 3x",
        "compile hit (repeated command)": "<= 60 ms, <= 2.5x",
    }
    for name, v in p.items():
        if name == "python -c pass":
            continue
        extra = f" (+{v['median'] - floor:.1f})" if "import" in name else ""
        out.append((
            f"{name}, whole process",
            f"{v['median']:.1f} ms{extra}",
            f"{v['median'] / floor:.2f}x",
            targets.get(name, ""),
        ))  # fmt: skip
    for label, modes in raw["warm_s"].items():
        one = modes["--jobs 1"]
        for mode, seconds in modes.items():
            speed = "" if mode == "--jobs 1" else f"speed-up {one / seconds:.2f}x"
            out.append((f"warm, {label}, {mode}", f"{seconds:.2f} s", "", speed))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20, help="processes per case (median)")
    ap.add_argument("--warm-rounds", type=int, default=3, help="warm runs per mode (median)")
    ap.add_argument("--quick", action="store_true", help="5 runs, 1 warm round")
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    runs, rounds = (5, 1) if args.quick else (args.runs, args.warm_rounds)
    raw = measure(runs, rounds)
    table = rows(runs, rounds, raw)
    head = ("measurement (median)", "cuforge", "x pass", "target")
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(4)]
    for r in [head, *table]:
        print("  ".join(f"{c:<{widths[i]}}" if i in (0, 3) else f"{c:>{widths[i]}}"
                        for i, c in enumerate(r)))  # fmt: skip
    print(f"\n{os.cpu_count()} CPUs; {runs} processes per case, interleaved with python -c pass.")
    _results.write(args.json, "bench_cli", raw, args.note)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
