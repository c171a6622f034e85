"""``cuforge run`` against the stock JIT's cold and warm-local start, each a fresh
process, one run printing every configuration side by side with its ratio.

    .venv-jit/bin/python benchmarks/bench_run.py [--rounds 3]              # JAX
    .venv-int/bin/python benchmarks/bench_run.py --jit torch [--rounds 3]  # torch.compile
    python3 benchmarks/bench_run.py --jit numba-cuda [--rounds 3] [--json PATH]  # on a GPU
    python3 benchmarks/bench_run.py --jit torch-cuda [--rounds 3] [--json PATH]  # on a GPU
    python3 benchmarks/bench_run.py --jit numba-cuda --dry-run   # the processes' set-up only

Each configuration is a fresh process running one compiled function to its first
result, timed from before the framework's import (reported by the process itself)
and as wall time of the process (``cuforge run``'s own work included).

JAX (a jitted function of ~25 ops): ``stock cold`` (JAX's own cache in an empty
directory), ``stock warm-local`` (a directory an earlier process filled),
``cuforge run, shared`` (``cuforge run --cache file:///<empty>,redis://... --warm-set``
on a Redis another process filled, its local level empty; no code change).

torch.compile on the CPU (a function of 6 matmul/tanh/sin steps on 64x64, Inductor's
C++ kernels), each configuration a fresh host -- an empty ``TORCHINDUCTOR_CACHE_DIR``,
home and ``$TMPDIR`` (where Inductor keeps its precompiled header whatever its
directory) -- but ``stock warm-local`` (the directory and ``$TMPDIR`` an earlier
process filled): ``stock cold`` (nothing cached anywhere), ``remote FX cache only``
(the job wired as ``cuforge run`` wires it, without the mirror), ``cuforge run`` (a
file+Redis tier whose local level is empty; the mirror's ``torchinductor`` and
``torchinductor-pch`` profiles hydrate the C++ libraries and the precompiled
header), and the same with ``TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0`` (no
precompiled header at all).

Prints each configuration's median (JAX: best) over the rounds and its ratio to
warm-local (goal <= 1.2).

On the GPU (``_run_gpu``; ``scripts/gpu-test --bench run`` runs both and checks them
against ``thresholds.toml`` [gpu]): ``--jit numba-cuda`` (four ``@cuda.jit(cache=True)``
kernels, the ``numba`` mirror profile) and ``--jit torch-cuda`` (bench_coldstart's MLP
under ``torch.compile``, default mode): stock cold, stock warm-local, and ``cuforge
run`` on a fresh host (empty ``NUMBA_CACHE_DIR`` / ``TORCHINDUCTOR_CACHE_DIR`` and
``TRITON_CACHE_DIR``, home, ``$TMPDIR``) against a shared cache another ``cuforge
run`` filled. The GPU machine has no Redis: the shared cache is the tier
``file://<empty local>,file://<shared directory>``, a shared file system standing in
for the fleet's cache. Medians of alternated rounds, each process timed from before
the framework's import, from its launch (``cuforge run``'s own start and hydration
included: the checked figure) and as wall time; goals 1.2x (numba-cuda) and 1.1x
(torch-cuda) of stock warm-local. ``--json PATH`` writes the results (the GPU modes).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import _results  # noqa: E402 -- from HERE
import _run_gpu  # noqa: E402

JOB = """
import time
t0 = time.perf_counter()
import jax, jax.numpy as jnp
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
@jax.jit
def step(x, w):
    for i in range(24):
        x = jnp.tanh(x @ w) + jnp.sin(x) * (i + 1)
    return x.sum()
x = jnp.ones((128, 128), dtype=jnp.float32)
r = float(step(x, x * 0.01))
print(time.perf_counter() - t0)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUFORGE_", "JAX_"))}
    env.update(extra)
    return env


def _time(cmd: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """``cmd``'s first result (what it prints last), its wall time, and the CPU seconds
    (user + system) of every process it ran, the compilers its job started included:
    on a machine shared with other work, the figure that work disturbs least."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return float(out.stdout.strip().splitlines()[-1]), wall, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--jit", choices=("jax", "torch", *_run_gpu.JITS), default="jax")
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="--jit torch-cuda only: cpu checks the harness on a CPU (not a figure)",
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="GPU modes: print each configuration's command and environment, run nothing",
    )
    _results.add_arguments(ap)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds: expected 1 or more, got {args.rounds}")
    if args.jit in _run_gpu.JITS:
        return _run_gpu.main(args.jit, args.rounds, args.device, args.json, args.note, args.dry_run)
    given = [flag for flag, on in (("--json", args.json), ("--note", args.note),
             ("--dry-run", args.dry_run), ("--device", args.device != "cuda")) if on]  # fmt: skip
    if given:
        ap.error(f"{', '.join(given)}: only with --jit {' or '.join(_run_gpu.JITS)}")
    return _torch(args.rounds) if args.jit == "torch" else _jax(args.rounds)


def _jax(rounds: int) -> int:
    from _redis import RedisServer

    work = Path(tempfile.mkdtemp(prefix="bench-run-"))
    job = work / "job.py"
    job.write_text(JOB)
    py = sys.executable
    cli = str(Path(py).with_name("cuforge"))
    redis = RedisServer(work / "redis")
    times: dict[str, list[tuple[float, float, float]]] = {}
    try:
        warm = work / "stock-warm"
        _time([py, str(job)], _env(JAX_COMPILATION_CACHE_DIR=str(warm)))  # fill
        shared = redis.url
        fill = [cli, "run", "--cache", f"file://{work / 'fill-local'},{shared}",
                "--warm-set", "bench", "--", py, str(job)]  # fmt: skip
        _time(fill, _env())
        for r in range(rounds):
            cold = work / f"cold-{r}"
            times.setdefault("stock cold", []).append(
                _time([py, str(job)], _env(JAX_COMPILATION_CACHE_DIR=str(cold)))
            )
            times.setdefault("stock warm-local", []).append(
                _time([py, str(job)], _env(JAX_COMPILATION_CACHE_DIR=str(warm)))
            )
            local = work / f"local-{r}"
            cmd = [cli, "run", "--cache", f"file://{local},{shared}", "--warm-set", "bench",
                   "--", py, str(job)]  # fmt: skip
            times.setdefault("cuforge run, shared", []).append(_time(cmd, _env()))
            shutil.rmtree(cold, ignore_errors=True)
            shutil.rmtree(local, ignore_errors=True)
        print(f"jax on the CPU, {rounds} rounds, best: first result (process wall time)")
        best = {k: (min(t[0] for t in v), min(t[1] for t in v)) for k, v in times.items()}
        for name, (first, wall) in best.items():
            print(f"  {name:22s} {first:6.3f} s  ({wall:6.3f} s)")
        ratio = best["cuforge run, shared"][0] / best["stock warm-local"][0]
        wall_ratio = best["cuforge run, shared"][1] / best["stock warm-local"][1]
        print(f"cuforge run / stock warm-local = {ratio:.2f} first result, "
              f"{wall_ratio:.2f} wall (goal <= 1.2)")  # fmt: skip
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


TORCH_JOB = """
import time
t0 = time.perf_counter()
import torch
def f(x, w):
    for i in range(6):
        x = torch.tanh(x @ w) + torch.sin(x) * (i + 1)
    return x.sum(dim=0)
torch.manual_seed(0)
x = torch.randn(64, 64)
w = torch.randn(64, 64) * 0.1
r = torch.compile(f)(x, w)
e = f(x, w)
diff = ((r - e).abs().max().item(), r[:4].tolist(), e[:4].tolist())
assert torch.allclose(r, e, rtol=1e-4, atol=1e-3), diff
print(time.perf_counter() - t0)
"""


def _torch_env(work: Path, name: str, **extra: str) -> dict[str, str]:
    """A fresh process's environment: its own empty home and Inductor directory."""
    home = work / name
    home.mkdir(parents=True)
    env = {k: v for k, v in _env().items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"))
    env["TORCHINDUCTOR_CACHE_DIR"] = str(home / "inductor")
    env.update(extra)
    return env


def _torch(rounds: int) -> int:
    from _redis import RedisServer
    from cuforge.cli.run import child_env

    work = Path(tempfile.mkdtemp(prefix="bench-run-torch-"))
    job = work / "job.py"
    job.write_text(TORCH_JOB)
    py = sys.executable
    cli = str(Path(py).with_name("cuforge"))
    redis = RedisServer(work / "redis")
    times: dict[str, list[tuple[float, float, float]]] = {}

    def timed(name: str, cmd: list[str], env: dict[str, str]) -> None:
        times.setdefault(name, []).append(_time(cmd, env))

    def fresh(name: str, **extra: str) -> dict[str, str]:
        """A fresh host: empty home and Inductor directory, and its own $TMPDIR."""
        tmp = work / f"tmp-{name}"
        tmp.mkdir()
        return _torch_env(work, name, TMPDIR=str(tmp), **extra)

    def run(local: str) -> list[str]:
        return [cli, "run", "--cache", f"file://{work / local},{redis.url}", "--", py, str(job)]

    try:
        warm_dir, warm_tmp = work / "stock-warm", work / "tmp-stock-warm"
        warm_tmp.mkdir()
        stock = {"TORCHINDUCTOR_CACHE_DIR": str(warm_dir), "TMPDIR": str(warm_tmp)}
        _time([py, str(job)], _torch_env(work, "fill-stock", **stock))
        _time(run("fill-local"), fresh("fill-run"))  # a fresh host: publishes the header too
        for r in range(rounds):
            timed("stock cold, fresh host", [py, str(job)], fresh(f"cold-{r}"))
            timed("stock warm-local", [py, str(job)], _torch_env(work, f"warm-{r}", **stock))
            url = f"file://{work / f'fx-local-{r}'},{redis.url}"
            fx = child_env(fresh(f"fx-{r}"), url, None, False)  # no mirror
            timed("remote FX cache only, fresh host", [py, str(job)], fx)
            timed("cuforge run, fresh host", run(f"run-local-{r}"), fresh(f"run-{r}"))
            nopch = fresh(f"nopch-{r}", TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS="0")
            timed("cuforge run, fresh host, no PCH", run(f"nopch-local-{r}"), nopch)
        print(f"torch.compile on the CPU, {rounds} rounds: median (best) first result, "
              "wall and CPU time of the process tree; ratios of medians to stock "
              "warm-local")  # fmt: skip
        med = {k: tuple(statistics.median(t[i] for t in v) for i in range(3))
               for k, v in times.items()}  # fmt: skip
        base = med["stock warm-local"]
        for name, (first, wall, cpu) in med.items():
            best = min(t[0] for t in times[name])
            print(f"  {name:34s} {first:6.2f} s ({best:6.2f})  wall {wall:6.2f} s  cpu {cpu:6.2f} s"
                  f"   {first / base[0]:5.2f}x ({wall / base[1]:5.2f}x wall, "
                  f"{cpu / base[2]:5.2f}x cpu)")  # fmt: skip
        print("goal: cuforge run, fresh host <= 1.2x stock warm-local")
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
