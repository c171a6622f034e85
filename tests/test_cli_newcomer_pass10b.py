"""The tenth newcomer pass, second part (every message true): each test runs the
installed ``cuforge`` console script in a subprocess, real NVRTC compiles on real
caches, and fails on the main it was written against.

- 5. an empty source's error said ``code must not be empty``, naming no file.
"""

from __future__ import annotations

from _cli import SAXPY, one_line_error, run


def test_an_empty_or_blank_source_is_named(tmp_path):
    empty, blank = tmp_path / "e.cu", tmp_path / "b.ptx"
    empty.write_bytes(b"")
    blank.write_bytes(b" \n\t\n")
    out = tmp_path / "o"
    done = run(tmp_path, "compile", str(SAXPY), str(empty), "--arch", "sm_90", "--outdir",
               str(out))  # fmt: skip
    line = one_line_error(done, "cuforge compile")
    assert line == f"cuforge compile: error: {empty} is empty: nothing to compile", line
    assert not list(out.iterdir())  # refused before anything compiled
    done = run(tmp_path, "compile", str(blank), "--arch", "sm_90", "--no-cache")
    line = one_line_error(done, "cuforge compile")
    assert line == f"cuforge compile: error: {blank} is empty (only blanks): nothing to compile"
    done = run(tmp_path, "cache", "explain", str(empty), "--arch", "sm_90")
    line = one_line_error(done, "cuforge cache explain")
    assert line == f"cuforge cache explain: error: {empty} is empty: nothing to compile", line
