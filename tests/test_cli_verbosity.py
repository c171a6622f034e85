"""``-v`` / ``-q``: the command line's stderr levels (cli/_verbosity.py), through the
installed console script with real compiles."""

from __future__ import annotations

import pytest

from _cli import SAXPY, run
from _redis import free_port
from cuforge.cli import _verbosity


@pytest.mark.parametrize(
    ("argv", "rest", "level"),
    [
        (["compile", "x.cu"], ["compile", "x.cu"], 0),
        (["-v", "compile", "x.cu"], ["compile", "x.cu"], 1),
        (["compile", "x.cu", "-vv"], ["compile", "x.cu"], 2),
        (["cache", "stats", "--quiet"], ["cache", "stats"], -1),
        (["compile", "-q", "x.cu", "--", "-v"], ["compile", "x.cu", "--", "-v"], -1),
        (["compile", "-vx"], ["compile", "-vx"], 0),  # not ours: left to the parser
    ],
)
def test_flags_are_taken_anywhere_before_a_double_dash(argv, rest, level) -> None:
    assert _verbosity.split(argv) == (rest, level)


def test_verbose_prints_the_debug_log_of_a_miss_and_of_a_hit(tmp_path) -> None:
    args = ("compile", str(SAXPY), "--arch", "sm_90", "--cache", str(tmp_path / "c"))
    first = run(tmp_path, "-v", *args, "-o", str(tmp_path / "a.cubin"))
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    assert any(
        line.startswith("cuforge: DEBUG cuforge.cache: miss ") and "no entry for this key" in line
        for line in lines
    ), first.stderr
    assert any(line.startswith("cuforge: DEBUG cuforge.compile: ") for line in lines)
    plain = run(tmp_path, *args, "-o", str(tmp_path / "b.cubin"))  # a hit, and a fast-path record
    assert plain.returncode == 0 and plain.stderr == "", plain.stderr
    # After the command name too; and a fast-path hit record must not swallow the log.
    again = run(tmp_path, *args, "-o", str(tmp_path / "b.cubin"), "--verbose")
    assert again.returncode == 0, again.stderr
    assert again.stdout.rstrip().endswith("cache hit")
    assert any(
        line.startswith("cuforge: DEBUG cuforge.cache: hit ") for line in again.stderr.splitlines()
    ), again.stderr


def test_quiet_hides_the_warning_the_default_shows(tmp_path) -> None:
    # Nothing listens on this port: every lookup and store fails open with one warning.
    url = f"redis://127.0.0.1:{free_port()}/0"
    base = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin"))
    shown = run(tmp_path, *base, "--cache", url)
    assert shown.returncode == 0, shown.stderr
    warnings = [w for w in shown.stderr.splitlines() if w.startswith("cuforge: warning: ")]
    assert len(warnings) == 1 and "Compiles are not affected" in warnings[0], shown.stderr
    quiet = run(tmp_path, "-q", *base, "--cache", url)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert (tmp_path / "k.cubin").read_bytes()[:4] == b"\x7fELF"
