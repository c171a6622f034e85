"""``cuforge run`` with JAX on the CPU: a fresh process with empty local directories,
on a shared cache, against stock JAX's cold and warm-local start.

    .venv-jit/bin/python benchmarks/bench_run.py [--rounds 3]

Each configuration is a fresh process running one jitted function (a few jitted
modules) to its first result, timed from before ``import jax`` (reported by the
process itself) and as wall time of the process:

- ``stock cold``: JAX's own cache in an empty directory (compiles everything);
- ``stock warm-local``: JAX's own cache in a directory an earlier process filled;
- ``cuforge run, shared``: ``cuforge run --cache file:///<empty>,redis://... --warm-set``
  on a Redis another process filled, its local level empty (no code change).

Prints each configuration's best over the rounds and ``cuforge run / warm-local``
(goal <= 1.2).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

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


def _time(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    start = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return float(out.stdout.strip().splitlines()[-1]), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from _redis import RedisServer

    work = Path(tempfile.mkdtemp(prefix="bench-run-"))
    job = work / "job.py"
    job.write_text(JOB)
    py = sys.executable
    cli = str(Path(py).with_name("cuforge"))
    redis = RedisServer(work / "redis")
    times: dict[str, list[tuple[float, float]]] = {}
    try:
        warm = work / "stock-warm"
        _time([py, str(job)], _env(JAX_COMPILATION_CACHE_DIR=str(warm)))  # fill
        shared = redis.url
        fill = [cli, "run", "--cache", f"file://{work / 'fill-local'},{shared}",
                "--warm-set", "bench", "--", py, str(job)]  # fmt: skip
        _time(fill, _env())
        for r in range(args.rounds):
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
        print(f"jax on the CPU, {args.rounds} rounds, best: first result (process wall time)")
        best = {k: (min(a for a, _ in v), min(b for _, b in v)) for k, v in times.items()}
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


if __name__ == "__main__":
    sys.exit(main())
