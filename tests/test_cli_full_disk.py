"""A directory cache that cannot take stores -- a full disk, a ``tmp/`` that cannot be
written -- through the installed ``cuforge`` console script in subprocesses, on real
NVRTC compiles; each test fails on the main it was written against.

- A failed store's warning said later failures are ``counted in cuforge cache stats
  (write failures)``, yet ``cache stats`` counted none of them, misses included: a
  handle's counter record is staged through ``tmp/``. Now the counts are added into
  the cache's existing ``stats/merged`` in place, and where that fails too the
  warning says they are not counted.
- ``cuforge doctor`` said ``writable yes`` for such a cache (permission bits, which a
  full disk, an immutable directory and root pass); it now tries a file in ``tmp/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from _cli import SAXPY, run
from _disk import fill, tmpfs
from reliability._figures import record

_WARNING = (
    "cuforge: warning: program cache {cache}: could not store an entry ({why}); the result "
    "is still returned, only not cached. "
)
_COUNTED = (
    "Later write failures of this cache handle are counted in cuforge cache stats (write "
    "failures) without a warning."
)
_NOT_COUNTED = (
    "Later write failures are not warned about, and not counted in cuforge cache stats; "
    "neither is any other count of this command (misses included): the cache's counters "
    "could not be written either ({why})."
)


@contextlib.contextmanager
def _unwritable(*dirs: Path) -> Iterator[None]:
    """``dirs`` (directories or files) made unwritable -- immutable (``chattr +i``) as
    root, whose rights pass permission bits; read (and search) only otherwise -- and
    put back after."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("no chattr(1) to make a directory immutable")
        done: list[Path] = []
        try:
            for d in dirs:
                made = subprocess.run(["chattr", "+i", str(d)], capture_output=True, text=True)
                if made.returncode != 0:
                    pytest.skip(f"chattr +i is not supported here: {made.stderr.strip()}")
                done.append(d)
            yield
        finally:
            for d in done:
                subprocess.run(["chattr", "-i", str(d)], check=False)
        return
    modes = {d: d.stat().st_mode & 0o777 for d in dirs}
    try:
        for d in dirs:
            d.chmod(0o500 if d.is_dir() else 0o400)
        yield
    finally:
        for d, mode in modes.items():
            d.chmod(mode)


def _compile(home: Path, cache: Path, arch: str) -> subprocess.CompletedProcess[str]:
    result = run(home, "compile", str(SAXPY), "--arch", arch, "-o", str(home / f"{arch}.cubin"),
                 "--cache", str(cache))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (home / f"{arch}.cubin").stat().st_size > 0
    return result


def _stats(home: Path, cache: Path) -> dict[str, int]:
    result = run(home, "cache", "stats", "--json", "--cache", str(cache))
    assert result.returncode == 0, result.stderr
    found: dict[str, int] = json.loads(result.stdout)
    return found


def _doctor(home: Path, cache: Path) -> tuple[str, dict[str, object]]:
    """doctor's ``writable`` line, and its --json."""
    text = run(home, "doctor", "--cache", str(cache))
    (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith("writable")]
    reported = json.loads(run(home, "doctor", "--json", "--cache", str(cache)).stdout)
    assert isinstance(reported, dict)
    return " ".join(line.split()), reported


def _failed_stores(home: Path, cache: Path, archs: tuple[str, ...], later: str, why: str) -> None:
    """Compile each arch (a miss each): every store fails, with the one warning."""
    for arch in archs:
        result = _compile(home, cache, arch)
        assert result.stdout.endswith("cache miss (compiled; not stored: failed)\n"), result.stdout
        (warning,) = result.stderr.splitlines()
        assert warning == _WARNING.format(cache=cache, why=why) + later, warning


def _counts(stats: dict[str, int]) -> tuple[int, int, int, int]:
    return stats["hits"], stats["misses"], stats["stores"], stats["write_failures"]


def test_a_full_disk_counts_what_its_warning_says_and_doctor_says_not_writable(
    tmp_path: Path,
) -> None:
    """The repro: a 100 KiB tmpfs, one entry stored, then filled; three compiles.
    Before: stats showed 1 miss and 0 write failures, and doctor ``writable yes``."""
    with tmpfs(tmp_path / "small", "100k") as mount:
        cache = mount / "c"
        _compile(tmp_path, cache, "sm_90")  # stored while there is room
        fill(mount)
        _failed_stores(tmp_path, cache, ("sm_80", "sm_75", "sm_86"), _COUNTED,
                       "No space left on device")  # fmt: skip
        assert _counts(_stats(tmp_path, cache)) == (0, 4, 1, 3)
        line, reported = _doctor(tmp_path, cache)
        why = "a file cannot be written in its tmp/: No space left on device"
        assert line == f"writable no ({why})", line
        assert (reported["writable"], reported["writable_reason"]) == (False, why)
        assert sorted(p.name for p in (cache / "tmp").iterdir()) == []  # doctor left nothing
    record(
        "use", "cli", "compile x3 on a full 100 KiB tmpfs (one entry stored before), then "
        "cache stats and doctor (text, --json)", 3,
        "each: 'not stored: failed' and the warning 'counted in cuforge cache stats (write "
        "failures)'; stats: 4 misses, 3 write failures; doctor 'writable no (a file cannot be "
        "written in its tmp/: No space left on device)', nothing left in tmp/ (before: stats "
        "1 miss, 0 write failures; doctor 'writable yes')", scale="all",
    )  # fmt: skip


def test_an_unwritable_tmp_counts_and_says_so_and_doctor_tries_it(tmp_path: Path) -> None:
    """``tmp/`` immutable (root) or read-only (others): the counts land in
    ``stats/merged`` in place; with that file unwritable as well, the warning says
    nothing of the command is counted. Before: 'counted' both times, stats unchanged,
    and doctor ``writable yes``."""
    cache = tmp_path / "c"
    _compile(tmp_path, cache, "sm_90")
    with _unwritable(cache / "tmp"):
        why = "Operation not permitted" if os.geteuid() == 0 else "Permission denied"
        _failed_stores(tmp_path, cache, ("sm_80", "sm_75"), _COUNTED, why)
        assert _counts(_stats(tmp_path, cache)) == (0, 3, 1, 2)
        line, reported = _doctor(tmp_path, cache)
        assert line == f"writable no (a file cannot be written in its tmp/: {why})", line
        assert reported["writable"] is False
        with _unwritable(cache / "stats" / "merged"):  # the counters cannot be written
            _failed_stores(tmp_path, cache, ("sm_86",), _NOT_COUNTED.format(why=why), why)
            assert _counts(_stats(tmp_path, cache)) == (0, 3, 1, 2)  # as the warning said
    assert _doctor(tmp_path, cache)[0] == "writable yes"
    assert sorted(p.name for p in (cache / "tmp").iterdir() if not p.name.endswith(".alive")) == []
    record(
        "use", "cli", "compile x2 with the cache's tmp/ immutable (chattr +i; not root: "
        "mode 500), then stats and doctor; once more with stats/merged immutable too", 3,
        "the 2: warning 'counted in cuforge cache stats (write failures)', stats 3 misses, 2 "
        "write failures (added into stats/merged in place), doctor 'writable no (a file "
        "cannot be written in its tmp/: Operation not permitted)'; the third: the warning says "
        "no count of the command is counted there, and stats is unchanged (before: 'counted' "
        "each time, stats 1 miss, 0 write failures, doctor 'writable yes')", scale="all",
    )  # fmt: skip
