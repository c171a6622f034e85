"""The main job, end to end: compile an example kernel twice through the cache.

Run by ``make demo``. Each compile is a separate ``cuforge`` process, as a build
system or CI job would run it: the first misses and compiles with NVRTC, the second
is served from the cache without compiling. Then ``cuforge cache stats`` shows what
the cache saw across both processes. Needs no GPU: the architecture is given.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def cuforge(*args: str) -> tuple[str, float]:
    """Run ``python -m cuforge ARGS``; return its output and wall time (process included)."""
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "cuforge", *args], capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"cuforge {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout.strip(), elapsed


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="cuforge-demo-"))
    cache = work / "cache"
    source = HERE / "saxpy.cu"
    try:
        print(f"cache directory: {cache}\n")
        for label in ("cold (miss)", "warm (hit)"):
            out, wall = cuforge(
                "compile",
                str(source),
                "--arch",
                "sm_90",
                "--cache",
                str(cache),
                "-o",
                str(work / "saxpy.cubin"),
            )
            print(f"{label:12} {out}\n{'':12} process wall time {wall * 1000:.0f} ms")
        cubin = (work / "saxpy.cubin").read_bytes()
        is_elf = cubin[:4] == b"\x7fELF"
        print(f"\noutput is a raw cubin (ELF): {is_elf} ({len(cubin)} bytes)\n")
        out, _ = cuforge("cache", "stats", "--cache", str(cache))
        print(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
