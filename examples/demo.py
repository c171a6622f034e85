"""The main job, end to end, through the ``cuforge`` command line.

Run by ``make demo``. Each step is a separate ``cuforge`` process, as a build system
or CI job would run it: the first compile misses and runs NVRTC, the repeats are
served by the cache from a cold process -- timed beside ``python -c pass``, the
floor any Python program pays -- then ``cuforge cache ls`` and ``cuforge cache
stats`` show what the cache holds and saw. Needs no GPU: the architecture is given.
Everything (cache, state) lives in a temporary directory, removed at the end.
"""

from __future__ import annotations

import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cuforge

HERE = Path(__file__).resolve().parent
CUFORGE = str(Path(sys.executable).with_name("cuforge"))


def timed(cmd: list[str], env: dict[str, str]) -> tuple[str, float]:
    """Run ``cmd``; its output and wall time (the whole process)."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout.rstrip(), elapsed * 1000


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="cuforge-demo-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_")}
    env["CUFORGE_STATE_DIR"] = str(work / "state")  # identity and hit records
    cache = str(work / "cache")
    out = str(work / "saxpy.cubin")
    compile_cmd = [CUFORGE, "compile", str(HERE / "saxpy.cu"), "--arch", "sm_90", "-o", out,
                   "--cache", cache]  # fmt: skip
    # Byte-compile cuforge as a wheel install does (an editable checkout with
    # PYTHONDONTWRITEBYTECODE=1 would otherwise recompile it in every process).
    compileall.compile_dir(os.path.dirname(cuforge.__file__), quiet=1)
    try:
        print(f"$ cuforge compile examples/saxpy.cu --arch sm_90 -o saxpy.cubin --cache {cache}")
        line, ms = timed(compile_cmd, env)
        print(f"{line}\n  (process: {ms:.0f} ms -- a miss: NVRTC compiled it)\n")
        time.sleep(2.1)  # files younger than 2 s are not trusted by their stat
        hits, floor = [], []
        for _ in range(10):
            line, ms = timed(compile_cmd, env)
            hits.append(ms)
            floor.append(timed([sys.executable, "-c", "pass"], env)[1])
        print("the same command again, 10 times, each a new process:")
        print(f"{line}")
        hit, base = statistics.median(hits), statistics.median(floor)
        print(
            f"  cold-process hit: {hit:.0f} ms wall (median of 10); `python -c pass`: "
            f"{base:.0f} ms; ratio {hit / base:.1f}x\n"
        )
        cubin = Path(out).read_bytes()
        is_elf = cubin[:4] == b"\x7fELF"
        print(f"the output is a raw cubin (ELF): {is_elf} ({len(cubin)} bytes)\n")
        for args in (["cache", "ls"], ["cache", "stats"]):
            print(f"$ cuforge {' '.join(args)} --cache {cache}", flush=True)
            subprocess.run(
                [CUFORGE, *args, "--cache", cache], env=env, check=True
            )  # to the terminal
            print()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
