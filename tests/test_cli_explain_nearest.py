"""``cuforge cache explain`` names what stands between a compile and a hit -- against the
manifest variant its headers differ from least, not always the newest one."""

from __future__ import annotations

import os
import time
from pathlib import Path

from _cli import run

SRC = (
    '#include "p.h"\n#if __has_include("opt.h")\n#include "opt.h"\n#endif\n'
    'extern "C" __global__ void k(float* a) { *a = P; }\n'
)


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    old = time.time() - 10  # not "racy": a change the tracker sees by its time stamp
    os.utime(path, (old, old))


def test_explain_names_only_what_stands_between_the_compile_and_a_hit(tmp_path: Path) -> None:
    # The newest variant had a p.h beside the source, since deleted; the older variant
    # (p.h from -I inc) was a hit after that deletion. A new inc/opt.h then made a miss,
    # and explain named both "p.h deleted" (already harmless: it had just hit) and the
    # new opt.h -- a newcomer read both as causes.
    work = tmp_path / "h"
    (work / "inc").mkdir(parents=True)
    _write(work / "inc" / "p.h", "#define P 1\n")
    _write(work / "s.cu", SRC)
    common = ("--cache", str(tmp_path / "c"), "-I", "inc", "--arch", "sm_90")
    build = ("compile", "s.cu", *common, "-o", "s.cubin")
    assert "cache miss" in run(tmp_path, *build, cwd=work).stdout
    _write(work / "p.h", "#define P 2\n")  # shadows inc/p.h: a second variant
    assert "cache miss" in run(tmp_path, *build, cwd=work).stdout
    (work / "p.h").unlink()
    hit = run(tmp_path, *build, cwd=work)
    assert "cache hit" in hit.stdout, hit.stdout  # the first variant again
    _write(work / "inc" / "opt.h", "#define X 1\n")
    why = run(tmp_path, "cache", "explain", "s.cu", *common, cwd=work)
    assert why.returncode == 1, why.stderr
    lines = [ln for ln in why.stdout.splitlines() if ln.startswith("miss")]
    assert len(lines) == 1 and "opt.h" in lines[0] and "now exists" in lines[0], why.stdout
