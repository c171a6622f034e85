"""What ``cuforge compile`` writes, and where it looks, as docs/cli.md says -- through the
installed ``cuforge`` script in a subprocess, real NVRTC compiles on real caches; each
test fails on the main it was written against.

1. ``compile scale.cu -o scale.h`` wrote the cubin over the header ``scale.cu``
   includes (exit 0), with or without a cache, on a miss and on a hit: only FILE and
   ``-include FILE`` were protected.
2. ``cd /tmp && compile ex/saxpy.cu -include scale.h`` passed the check (it searched the
   sources' directories), then NVRTC failed: ``cannot open source file "scale.h"``.
3. A refused ``compile ... --outdir DIR`` (a missing source, an arch NVRTC does not
   compile for, two sources with one stem) left an empty ``DIR`` behind.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from _cli import EXAMPLES, one_line_error, run

PROG = "cuforge compile"


def _examples(tmp_path: Path) -> Path:
    ex = tmp_path / "ex"
    shutil.copytree(EXAMPLES, ex)
    return ex


@pytest.mark.parametrize("how", ["miss", "hit", "no-cache"])
def test_an_output_is_never_written_over_a_header_the_compile_reads(
    tmp_path: Path, how: str
) -> None:
    ex = _examples(tmp_path)
    header = ex / "scale.h"
    # a header reached through -I, included by the header the source includes
    inc = ex / "inc"
    inc.mkdir()
    (inc / "factor.h").write_text("#define FACTOR 3.0f\n")
    header.write_text("#include <factor.h>\n#define SCALE (2.0f * FACTOR)\n")
    original = {p: p.read_bytes() for p in (header, inc / "factor.h")}
    (ex / "link.h").symlink_to("scale.h")
    os.link(header, ex / "hard.h")
    (ex / "od").mkdir()
    os.link(inc / "factor.h", ex / "od" / "scale.cubin")  # --outdir's name for the cubin
    base = ["compile", "scale.cu", "--arch", "sm_90", "-I", "inc"]
    extra = ["--no-cache"] if how == "no-cache" else ["--cache", str(tmp_path / "c")]
    if how == "hit":  # the entry and its manifest are there: the write is the only step left
        done = run(tmp_path, *base, *extra, "-o", "first.cubin", cwd=ex)
        assert done.returncode == 0, done.stderr
    cases = [
        (["-o", "scale.h"], "-o scale.h is the header scale.h that scale.cu reads"),
        (["-o", "link.h"], "-o link.h is the header scale.h that scale.cu reads"),
        (["-o", "hard.h"], "-o hard.h is the header scale.h that scale.cu reads"),
        (["-o", "inc/factor.h"], "-o inc/factor.h is the header inc/factor.h that scale.cu"),
        (["--outdir", "od"], "--outdir od: the output od/scale.cubin of scale.cu would "
         "overwrite the header inc/factor.h that scale.cu reads"),
    ]  # fmt: skip
    for args, says in cases:
        line = one_line_error(run(tmp_path, *base, *extra, *args, cwd=ex), PROG)
        assert says in line, line
        for path, content in original.items():
            assert path.read_bytes() == content, (args, path)
    if how == "miss":  # refused before anything compiled: no cache made
        assert not (tmp_path / "c").exists()
    # an output beside them that is no header is still written
    done = run(tmp_path, *base, *extra, "-o", "scale.cubin", cwd=ex)
    assert done.returncode == 0, done.stderr
    assert (ex / "scale.cubin").read_bytes()[:4] == b"\x7fELF"


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_include_is_looked_for_where_nvrtc_looks(tmp_path: Path, cache: bool) -> None:
    _examples(tmp_path)
    extra = ["--cache", str(tmp_path / "c")] if cache else ["--no-cache"]
    base = ["ex/saxpy.cu", "--arch", "sm_90", "-include", "scale.h", *extra]
    # scale.h is beside the source only: NVRTC does not look there for -include
    done = run(tmp_path, "compile", *base, "-o", "i.cubin", cwd=tmp_path)
    line = one_line_error(done, PROG)
    assert line == (
        "cuforge compile: error: -include scale.h: no such file (looked in the working "
        "directory, the -I directories and the CUDA headers)"
    ), line
    assert not (tmp_path / "i.cubin").exists()
    if cache:
        explained = run(tmp_path, "cache", "explain", *base, cwd=tmp_path)
        line = one_line_error(explained, "cuforge cache explain")
        assert "-include scale.h: no such file (looked in the working directory" in line
    # found where NVRTC looks (an -I directory): the check and the compile agree
    done = run(tmp_path, "compile", *base, "-I", "ex", "-o", "i.cubin", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "i.cubin").read_bytes()[:4] == b"\x7fELF"


def test_a_refused_command_leaves_no_outdir(tmp_path: Path) -> None:
    ex = _examples(tmp_path)
    (ex / "kernels" / "saxpy.cu").write_bytes((ex / "saxpy.cu").read_bytes())
    cases = [
        (["nothere.cu", "--arch", "sm_90"], "cannot read nothere.cu"),
        (["saxpy.cu", "--arch", "sm_999"], "--arch sm_999 is not one NVRTC"),
        (["saxpy.cu", "kernels/saxpy.cu", "--arch", "sm_90"], "would both be written to"),
    ]
    for outdir in ("o5", "deep/o5"):
        for args, says in cases:
            done = run(tmp_path, "compile", *args, "--outdir", outdir, cwd=ex)
            assert says in one_line_error(done, PROG)
            assert not (ex / outdir.split("/")[0]).exists(), (args, outdir)
    # a command that goes ahead makes it, parents included
    done = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "--outdir", "deep/o5", cwd=ex)
    assert done.returncode == 0, done.stderr
    assert (ex / "deep" / "o5" / "saxpy.cubin").is_file()
    # an outdir that cannot be made is still refused before anything compiles
    (ex / "afile").write_text("")
    done = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "--outdir", "afile/o", cwd=ex)
    assert one_line_error(done, PROG).endswith("--outdir afile/o: Not a directory")
