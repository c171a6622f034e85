"""Newcomer pass 21, minor items: messages of the CLI that said something untrue or
unhelpful. Through the installed ``cuforge`` console script, real NVRTC compiles."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from _cli import SAXPY, SCRIPT, isolated_env, one_line_error, run

KERNEL = '#include "p.h"\nextern "C" __global__ void k(float* x) { x[0] = P; }\n'


def _header_kernel(tmp_path: Path) -> Path:
    work = tmp_path / "w"
    for d, value in (("dirA", "1.0f"), ("dirB", "2.0f"), ("dirC", "3.0f")):
        (work / d).mkdir(parents=True)
        (work / d / "p.h").write_text(f"#define P {value}\n")
    (work / "k.cu").write_text(KERNEL)
    return work


def test_explain_says_an_added_include_directory_shadows_the_header_not_an_edit(
    tmp_path: Path,
) -> None:
    work = _header_kernel(tmp_path)
    cache = str(tmp_path / "c")
    flags = ("--arch", "sm_90", "--cache", cache)
    made = run(tmp_path, "compile", "k.cu", "-I", "dirA", "-o", "k.cubin", *flags, cwd=work)
    assert made.returncode == 0, made.stderr
    # a directory added in front: its p.h shadows dirA/p.h, which nobody edited
    got = run(tmp_path, "cache", "explain", "k.cu", "-I", "dirB", "-I", "dirA", *flags, cwd=work)
    assert got.returncode == 1, got.stderr
    assert got.stdout.splitlines()[:2] == [
        "miss: option --include-path=dirB added",
        f"miss: header p.h now found at {work}/dirB/p.h, which shadows {work}/dirA/p.h",
    ], got.stdout
    # dirA's header edited as well: both said
    (work / "dirA" / "p.h").write_text("#define P 4.0f\n")
    got = run(tmp_path, "cache", "explain", "k.cu", "-I", "dirB", "-I", "dirA", *flags, cwd=work)
    assert got.stdout.splitlines()[1] == (
        f"miss: header p.h now found at {work}/dirB/p.h, which shadows {work}/dirA/p.h, "
        "itself edited since"
    ), got.stdout
    (work / "dirA" / "p.h").write_text("#define P 1.0f\n")
    # dirA replaced by dirC (one directory still: the manifest's variant is compared)
    got = run(tmp_path, "cache", "explain", "k.cu", "-I", "dirC", *flags, cwd=work)
    assert got.returncode == 1, got.stderr
    assert got.stdout.strip() == (
        f"miss: header p.h now found at {work}/dirC/p.h, not at {work}/dirA/p.h "
        "(include directory dirA is now dirC)"
    ), got.stdout
    # a real edit under the same directories is still an edit
    (work / "dirA" / "p.h").write_text("#define P 5.0f\n")
    got = run(tmp_path, "cache", "explain", "k.cu", "-I", "dirA", *flags, cwd=work)
    assert got.stdout.strip() == f"miss: header {work}/dirA/p.h edited", got.stdout


@pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr")
def test_zero_stats_a_cache_cannot_take_is_exit_1_as_clear_that_cannot_remove(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "c"
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
               str(tmp_path / "s.cubin"), "--cache", str(cache))  # fmt: skip
    assert made.returncode == 0, made.stderr
    stats = cache / "stats"
    if subprocess.run(["chattr", "+i", str(stats)], capture_output=True).returncode:
        pytest.skip("this file system keeps no immutable flag")
    try:
        got = run(tmp_path, "cache", "zero-stats", "--cache", str(cache))
    finally:
        subprocess.run(["chattr", "-i", str(stats)], check=False)
    assert got.returncode == 1, (got.stdout, got.stderr)
    assert got.stderr.strip() == (
        "cuforge cache zero-stats: error: cannot reset the statistics: Operation not permitted"
    ), got.stderr
    assert got.stdout == ""
    # a ?ro cache is still the usage error it was (the command asked what it cannot do)
    ro = run(tmp_path, "cache", "zero-stats", "--cache", f"file://{cache}?ro")
    assert "is opened read-only (?ro)" in one_line_error(ro, "cuforge cache zero-stats")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_a_report_standard_output_cannot_take_names_standard_output(
    tmp_path: Path, unbuffered: str
) -> None:
    cache = str(tmp_path / "c")
    compile_json = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "s.cubin"),
                    "--cache", cache, "--json")  # fmt: skip
    env = isolated_env(tmp_path)
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = unbuffered
    for _ in range(2):  # stored, then a hit record: the next hit takes the fast path
        assert run(tmp_path, *compile_json, env=env).returncode == 0
    miss = tuple("sm_80" if a == "sm_90" else a for a in compile_json)
    commands = {
        "cuforge compile": miss,  # a miss: the full path
        "cuforge compile ": compile_json,  # a hit: the fast path's report
        "cuforge cache stats": ("cache", "stats", "--cache", cache),
        "cuforge cache ls": ("cache", "ls", "--cache", cache),
        "cuforge": ("--version",),
    }
    for prog, args in commands.items():
        with open("/dev/full", "w") as full:
            got = subprocess.run([str(SCRIPT), *args], stdout=full, stderr=subprocess.PIPE,
                                 text=True, env=env, timeout=240)  # fmt: skip
        assert got.returncode == 1, (prog, got.stderr)
        assert got.stderr.strip() == (
            f"{prog.strip()}: error: cannot write standard output: No space left on device"
        ), got.stderr


def test_a_value_starting_with_a_dash_is_said_how_to_give(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
               str(tmp_path / "s.cubin"), "--cache", str(cache))  # fmt: skip
    assert made.returncode == 0, made.stderr
    prog = "cuforge cache ls"
    got = run(tmp_path, "cache", "ls", "--name", "-x*", "--cache", str(cache))
    line = one_line_error(got, prog)
    assert line == (
        f"{prog}: error: argument --name: expected one argument ('-x*' is read as an option: "
        f"give a value that starts with '-' joined to its flag, --name=-x*) (see {prog} --help)"
    ), line
    # what it says works: a name that matches nothing, an empty listing
    joined = run(tmp_path, "cache", "ls", "--name=-x*", "--cache", str(cache))
    assert (joined.returncode, joined.stdout, joined.stderr) == (0, "", "")
    # a value left out before another option is not said to start with '-'
    line = one_line_error(run(tmp_path, "cache", "ls", "--name", "--json"), prog)
    assert line == f"{prog}: error: argument --name: expected one argument (see {prog} --help)"
