"""The tenth newcomer pass, second part (every message true): each test runs the
installed ``cuforge`` console script in a subprocess, real NVRTC compiles on real
caches, and fails on the main it was written against.

- 5. an empty source's error said ``code must not be empty``, naming no file.
- 7. ``compile -- -weird.cu --arch sm_90`` took ``--arch`` as a file name and said
  ``no CUDA device here to take the architecture from; pass --arch sm_XY``.
- 8. ``-o /proc/x.cubin`` said ``cannot write /proc/x.cubin`` without ``-o``; ``cuforge
  --cach /tmp/x cache stats`` said ``invalid choice: '/tmp/x'`` without ``--cach``.
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
    assert not out.exists()  # refused before anything compiled: not even the --outdir made
    done = run(tmp_path, "compile", str(blank), "--arch", "sm_90", "--no-cache")
    line = one_line_error(done, "cuforge compile")
    assert line == f"cuforge compile: error: {blank} is empty (only blanks): nothing to compile"
    done = run(tmp_path, "cache", "explain", str(empty), "--arch", "sm_90")
    line = one_line_error(done, "cuforge cache explain")
    assert line == f"cuforge cache explain: error: {empty} is empty: nothing to compile", line


def test_compile_options_after_double_dash_are_named(tmp_path):
    (tmp_path / "-weird.cu").write_text('extern "C" __global__ void w(int* a) { *a = 1; }\n')
    for words, named in (
        (["--arch", "sm_90"], "--arch"),
        (["--arch=sm_90"], "--arch=sm_90"),
        (["-o", "w.cubin"], "-o"),
    ):
        done = run(tmp_path, "compile", "--no-cache", "--", "-weird.cu", *words, cwd=tmp_path)
        line = one_line_error(done, "cuforge compile")
        assert line == (
            f"cuforge compile: error: {named!r} after '--' is read as a file name (there is "
            "no such file); put options before '--'"
        ), line
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".cubin") == []
    # Options before '--' work; a file that is really named like an option compiles.
    done = run(tmp_path, "compile", "--arch", "sm_90", "--no-cache", "--", "-weird.cu",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0 and (tmp_path / "-weird.cubin").stat().st_size > 0, done.stderr
    (tmp_path / "-o").write_text('extern "C" __global__ void o(int* a) { *a = 2; }\n')
    done = run(tmp_path, "compile", "--arch", "sm_90", "--no-cache", "--outdir", "out", "--",
               "-o", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0 and (tmp_path / "out" / "-o.cubin").exists(), done.stderr


def test_an_output_that_cannot_be_written_names_its_option(tmp_path):
    for args, said in (
        (["-o", "/proc/x.cubin"], "-o: cannot write /proc/x.cubin: "),
        (["--outdir", "/proc"], "--outdir /proc: cannot write /proc/saxpy.cubin: "),
    ):
        done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--no-cache", *args)
        line = one_line_error(done, "cuforge compile")
        assert line.startswith(f"cuforge compile: error: {said}"), line


def test_an_unknown_option_before_an_invalid_command_is_named(tmp_path):
    for args, prog, what in (
        (["--cach", str(tmp_path), "cache", "stats"], "cuforge", "command"),
        (["cache", "--cach", str(tmp_path), "stats"], "cuforge cache", "action"),
    ):
        line = one_line_error(run(tmp_path, *args), prog)
        assert line.startswith(
            f"{prog}: error: unknown option --cach (so {str(tmp_path)!r} after it was read "
            f"as the {what}): argument {what.upper()}: invalid choice: "
        ), line
    # A mistyped command alone keeps argparse's words; a known option, its own hint.
    line = one_line_error(run(tmp_path, "cmpile", "x.cu"), "cuforge")
    assert line.startswith("cuforge: error: argument COMMAND: invalid choice: 'cmpile'"), line
    line = one_line_error(run(tmp_path, "--cache", str(tmp_path), "cache", "stats"), "cuforge")
    assert "--cache is an option of the command, so it goes after it" in line, line
