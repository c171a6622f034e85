"""Windows sharing-violation handling: the predicate's truth table and simulated errors.

There is no Windows here, so the errors are simulated: os.replace / os.open /
os.unlink are replaced by versions that raise PermissionError carrying a winerror.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cuforge.storage import CacheWriteWarning, FileStreamProgramCache, _winretry
from cuforge.storage._winretry import RETRY_DELAYS, _is_windows_sharing_violation
from cuforge.storage.filestream import _atomicwrite


def perm(err: int = errno.EACCES, winerror: int | None = None) -> PermissionError:
    exc = PermissionError(err, "simulated")
    if winerror is not None:
        exc.winerror = winerror  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize(
    ("exc", "on_windows", "expected"),
    [
        (perm(winerror=32), True, True),  # ERROR_SHARING_VIOLATION
        (perm(winerror=33), True, True),  # ERROR_LOCK_VIOLATION
        (perm(winerror=5), True, True),  # ERROR_ACCESS_DENIED (file pending delete)
        (perm(winerror=32), False, True),  # decided by winerror alone
        (perm(errno.EACCES, winerror=1224), True, False),  # non-sharing winerror + EACCES
        (perm(errno.EACCES, winerror=2), True, False),
        (perm(errno.EACCES), True, True),  # bare EACCES on Windows
        (perm(errno.EACCES), False, False),  # off Windows a PermissionError is real
        (perm(errno.EPERM), True, False),
        (FileNotFoundError(errno.ENOENT, "x"), True, False),
        (OSError(errno.EACCES, "OSError maps EACCES to PermissionError"), True, True),
        (ValueError("x"), True, False),
    ],
)
def test_predicate_truth_table(monkeypatch, exc, on_windows, expected) -> None:
    monkeypatch.setattr(_winretry, "IS_WINDOWS", on_windows)
    assert _is_windows_sharing_violation(exc) is expected


def test_retry_budget_is_bounded() -> None:
    assert abs(sum(RETRY_DELAYS) - 0.185) < 1e-9


@pytest.fixture
def by_path(monkeypatch) -> None:
    """Writes take the path-based branch Windows uses (no directory descriptors there)."""
    monkeypatch.setattr(_atomicwrite, "DIR_FD", False)


def _flaky(real, failures: int, winerror: int, only=None):
    """``real`` failing its first ``failures`` calls; with ``only``, just the calls it
    accepts are counted and failed (the rest go through: another file's, not the one
    under test -- the counter record a failed store's warning writes, say)."""
    calls = {"n": 0}

    def op(*args, **kwargs):
        if only is not None and not only(*args):
            return real(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] <= failures:
            raise perm(winerror=winerror)
        return real(*args, **kwargs)

    return op, calls


def _into_entries(src, dst, *rest) -> bool:
    """A replace that moves an entry file into ``entries/`` (the path-based branch)."""
    return f"{os.sep}entries{os.sep}" in os.fspath(dst)


def test_replace_retried_then_succeeds(tmp_path: Path, monkeypatch, by_path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        op, calls = _flaky(os.replace, 3, 32, _into_entries)
        monkeypatch.setattr(os, "replace", op)
        c["k"] = b"v"
        monkeypatch.undo()
        assert c.get("k") == b"v" and calls["n"] >= 4
        assert c.stats().write_failures == 0


def test_replace_budget_exhausted_drops_write_with_warning(
    tmp_path: Path, monkeypatch, by_path
) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        op, calls = _flaky(os.replace, 100, 33, _into_entries)
        monkeypatch.setattr(os, "replace", op)
        with pytest.warns(CacheWriteWarning):
            c["k"] = b"v"  # does not raise
        monkeypatch.undo()
        assert calls["n"] == len(RETRY_DELAYS) + 1
        assert c.get("k") is None and c.stats().write_failures == 1
        assert list((tmp_path / "tmp").iterdir()) == []  # temp files cleaned up


def test_non_sharing_permission_error_is_not_retried(tmp_path: Path, monkeypatch, by_path) -> None:
    with FileStreamProgramCache(tmp_path) as c:
        op, calls = _flaky(os.replace, 100, 1224, _into_entries)
        monkeypatch.setattr(os, "replace", op)
        with pytest.warns(CacheWriteWarning):
            c["k"] = b"v"
        monkeypatch.undo()
        assert calls["n"] == 1  # propagated at once out of the retry helper


def test_read_retried_on_sharing_violation(tmp_path: Path, monkeypatch) -> None:
    from cuforge.storage.filestream import _pairread

    with FileStreamProgramCache(tmp_path) as c:
        c["k"] = b"v"
        monkeypatch.setattr(_pairread, "DIR_FD", False)  # Windows reads by path
        op, calls = _flaky(os.open, 2, 32)
        monkeypatch.setattr(os, "open", op)
        assert c.get("k") == b"v"
        monkeypatch.undo()
        assert calls["n"] >= 3


def test_unlink_retried_during_eviction(tmp_path: Path, monkeypatch) -> None:
    with FileStreamProgramCache(tmp_path, max_size_bytes=2000) as c:
        c["a"] = b"a" * 900
        c["b"] = b"b" * 900
        for key in ("a", "b"):  # older than "c" whatever the clock's granularity
            path = c._loc(key).payload
            os.utime(path, ns=(os.stat(path).st_atime_ns - 10**10, os.stat(path).st_mtime_ns))
        op, calls = _flaky(os.unlink, 2, 32)
        monkeypatch.setattr(os, "unlink", op)
        c["c"] = b"c" * 900  # crosses the cap: eviction unlinks through the retry
        monkeypatch.undo()
        assert calls["n"] >= 3 and c.stats().evictions >= 1
        assert c.get("c") == b"c" * 900
