"""The directory mirror against the stock JITs: time to first result, side by side.

For Warp (CPU kernels) and Numba (``cache=True``), in interleaved rounds:

- ``warm``: the stock JIT in a fresh process with its own warm directory (the
  floor: nothing to compile);
- ``mirror``: a fresh process with an EMPTY directory through the mirror -- a
  runner process (what ``cuforge run`` does: start Python, open the cache, hydrate)
  then the JIT's process -- until the JIT's first result;
- ``cold``: the stock JIT in a fresh process with an empty directory (it compiles).

Prints each median and ``mirror / warm`` (the target: <= 1.2) and ``cold / warm``.
``--cache URL`` chooses the shared cache (default: a FileStream directory in a temp
directory); ``--rounds N``. ``make bench-mirror`` runs it in the JIT venv.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = str(ROOT / "tests" / "_jit_child.py")
VARIABLE = {"warp": "WARP_CACHE_PATH", "numba": "NUMBA_CACHE_DIR"}

RUNNER = """
import subprocess, sys
from cuforge.integrations.mirror import PROFILES, Mirror
jit, url, child = sys.argv[1:4]
mirror = Mirror(PROFILES[jit], url)
result = mirror.hydrate()
assert result.written, result
sys.exit(subprocess.run([sys.executable, child, jit]).returncode)
"""


def run(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed:\n{proc.stderr[-2000:]}")
    return took


def bench(jit: str, url: str, work: Path, rounds: int) -> dict[str, float]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WARP_", "NUMBA_"))}
    var = VARIABLE[jit]

    def env_for(directory: Path) -> dict[str, str]:
        return {**base, var: str(directory), "CUFORGE_MIRROR_CACHE": url}

    # Publish once from a first job (what the first host of a fleet does).
    from cuforge.integrations.mirror import PROFILES, Mirror

    seed_env = env_for(work / f"{jit}-seed")
    run([sys.executable, CHILD, jit], seed_env)
    seeded = Mirror(PROFILES[jit], url, env=seed_env, settle_s=0.2).publish()
    assert seeded.stored, seeded
    warm_env = env_for(work / f"{jit}-seed")  # the stock JIT's own warm directory
    times: dict[str, list[float]] = {"warm": [], "mirror": [], "cold": []}
    for i in range(rounds):
        times["warm"].append(run([sys.executable, CHILD, jit], warm_env))
        fresh = env_for(work / f"{jit}-fresh-{i}")
        times["mirror"].append(run([sys.executable, "-c", RUNNER, jit, url, CHILD], fresh))
        if i < max(1, rounds // 3):  # compiling is slow: fewer rounds
            times["cold"].append(
                run([sys.executable, CHILD, jit], env_for(work / f"{jit}-cold-{i}"))
            )
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", help="the shared cache URL (default: a temp FileStream)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--jit", action="append", choices=sorted(VARIABLE))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-mirror-"))
    try:
        url = args.cache or f"file://{work / 'cache'}"
        print(f"cache: {url.split('?')[0]}; medians of {args.rounds} fresh processes")
        print(
            f"{'jit':<6} {'warm s':>8} {'mirror s':>9} {'cold s':>8} "
            f"{'mirror/warm':>12} {'cold/warm':>10}"
        )
        for jit in args.jit or sorted(VARIABLE):
            m = bench(jit, url, work, args.rounds)
            print(
                f"{jit:<6} {m['warm']:8.3f} {m['mirror']:9.3f} {m['cold']:8.3f} "
                f"{m['mirror'] / m['warm']:12.2f} {m['cold'] / m['warm']:10.2f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
