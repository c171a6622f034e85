"""Newcomer pass 22 (nothing untrue found; one message incomplete): ``-o`` given for
several archs said only "use --outdir DIR for several files or archs", though ``-o
NAME.fatbin`` packs them -- what the same error for a settings file's archs already
said. Through the installed ``cuforge`` console script."""

from __future__ import annotations

import shutil
from pathlib import Path

from _cli import SAXPY, one_line_error, run


def test_o_for_several_archs_names_the_fatbin_and_for_several_files_only_outdir(
    tmp_path: Path,
) -> None:
    shutil.copy(SAXPY, tmp_path / "b.cu")
    out = str(tmp_path / "x.cubin")
    archs = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80,sm_90", "-o", out,
                "--no-cache")  # fmt: skip
    assert archs.returncode == 2
    assert one_line_error(archs, "cuforge compile") == (
        "cuforge compile: error: -o names one output; use --outdir DIR for several archs, "
        "or -o NAME.fatbin to pack them"
    )
    files = run(tmp_path, "compile", str(SAXPY), str(tmp_path / "b.cu"), "--arch", "sm_90",
                "-o", out, "--no-cache")  # fmt: skip
    assert files.returncode == 2
    assert one_line_error(files, "cuforge compile") == (
        "cuforge compile: error: -o names one output; use --outdir DIR for several files"
    )
    packed = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80,sm_90", "-o",
                 str(tmp_path / "x.fatbin"), "--no-cache")  # fmt: skip
    assert packed.returncode == 0 and "packed from 2 parts" in packed.stdout, packed.stderr
