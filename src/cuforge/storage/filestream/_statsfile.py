"""Persisted statistics for a shared cache directory.

Each handle owns one fixed-size record file ``stats/<host>-<pid>-<random>.cnt``
that it holds a file lock on and overwrites in place (one ``pwrite``) every
``FLUSH_EVERY`` operations and at close -- O(1), no directory scan per op.
Totals are the sum of ``stats/merged`` and every record file. To keep the
directory small, ``compact()`` folds records whose lock is free (owner closed or
died: the OS drops the lock with the process) into ``merged`` under
``stats/merge.lock``. ``zero_totals()`` writes the current sum to ``stats/baseline``,
which totals subtract: counters restart from zero for every process, live ones
included, without touching the records their owners keep rewriting. Persistence is
best effort and never fails a caller. A handle whose record cannot be made or
written -- a full disk, a ``tmp/`` that cannot be written -- adds what it counted since
into ``merged`` in place instead (one ``pwrite`` under ``stats/merge.lock``, the lock
``compact`` and ``zero_totals`` rewrite it under, so no fold is lost or counted twice):
an existing file's bytes are rewritten, no new block is needed, and the sum stays
exact (the record keeps what it last held, ``merged`` gets the rest). When that fails
too (a read-only file system, an unwritable ``stats/``), the handle's counters stay in
memory only and ``lost`` says why (the warning says so). A read-only handle writes
nothing (its counters stay in memory). Folding
deletes only records named as handles name them (``<host>-<pid>-<8 hex>.cnt``) in a
root proven the cache's (``_owned``): a user's ``stats/x.cnt`` stays.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat as stat_mod

from .._filelock import poll, try_lock, unlock
from .._fsutil import O_NOFOLLOW, PRIVATE_FILE, fingerprint, read_at0, write_at0
from ..stats import MAX_RECORD_SIZE, CacheStats
from ._locking import LOCK_WAIT_S
from ._owned import is_stats_record, remake_dir, unlink_owned, unlink_special

__all__ = ["FLUSH_EVERY", "StatsStore", "read_totals", "zero_totals"]

FLUSH_EVERY = 256
_SUFFIX = ".cnt"
_MERGED = "merged"
_MERGE_LOCK = "merge.lock"
_BINARY = getattr(os, "O_BINARY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _mode(file_mode: int | None) -> int:
    return PRIVATE_FILE if file_mode is None else file_mode


_BASELINE = "baseline"


def _hostname() -> str:
    # os.uname is what socket.gethostname reads on POSIX, without importing socket.
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket  # pragma: no cover - Windows

    return socket.gethostname()  # pragma: no cover


def _read_record(path: str) -> CacheStats | None:
    """The record in ``path``; None when absent, unreadable or not a regular file (a
    FIFO planted there is never waited on: opened non-blocking, then judged)."""
    try:
        with open(os.open(path, os.O_RDONLY | O_NOFOLLOW | _NONBLOCK | _BINARY), "rb") as f:
            if not stat_mod.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            return CacheStats.from_record(f.read(MAX_RECORD_SIZE + 1))
    except OSError:
        return None


def read_totals(stats_dir: str) -> CacheStats:
    """Sum of every persisted record under ``stats_dir`` (all processes), less the
    baseline ``zero_totals`` recorded (never below zero)."""
    total = _sum_records(stats_dir)
    base = _read_record(os.path.join(stats_dir, _BASELINE))
    if base is None:
        return total
    return CacheStats(
        *(max(0, a - b) for a, b in zip(total._values(), base._values(), strict=True))
    )


def zero_totals(stats_dir: str, tmp_dir: str, file_mode: int | None) -> None:
    """Record the current sum as the baseline (under the merge lock, so no record
    is half-folded meanwhile). Raises OSError when it cannot be written."""
    lock = os.open(
        os.path.join(stats_dir, _MERGE_LOCK), os.O_RDWR | os.O_CREAT | O_NOFOLLOW, _mode(file_mode)
    )
    try:
        held = poll(lambda: try_lock(lock), 5.0)
        try:
            total = _sum_records(stats_dir)
            tmp = os.path.join(tmp_dir, f"baseline-{os.getpid()}-{os.urandom(4).hex()}")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _BINARY, _mode(file_mode))
            try:
                if file_mode is not None:
                    with contextlib.suppress(OSError, AttributeError):
                        os.fchmod(fd, file_mode)
                os.write(fd, total.to_record())
            finally:
                os.close(fd)
            os.replace(tmp, os.path.join(stats_dir, _BASELINE))
        finally:
            if held:
                unlock(lock)
    finally:
        os.close(lock)


def _sum_records(stats_dir: str) -> CacheStats:
    total = CacheStats()
    try:
        names = os.listdir(stats_dir)
    except OSError:
        return total
    for name in names:
        if name == _MERGED or is_stats_record(name):
            rec = _read_record(os.path.join(stats_dir, name))
            if rec is not None:
                total = total + rec
    return total


class StatsStore:
    """This handle's record file (created lazily at the first flush). ``owned``: the
    root's proof (folding deletes records only then); ``read_only``: write nothing."""

    def __init__(
        self,
        stats_dir: str,
        tmp_dir: str,
        dir_mode: int | None,
        file_mode: int | None,
        *,
        owned: bool,
        read_only: bool = False,
    ) -> None:
        self._dir = stats_dir
        self._tmp = tmp_dir
        self._dir_mode = dir_mode
        self._file_mode = file_mode
        self._create_mode = PRIVATE_FILE if file_mode is None else file_mode
        self._fd = -1
        self._path = ""
        self._owned = owned
        self._read_only = read_only
        self._broken = read_only
        self._in_record = b""  # the record's bytes as last written (b"": none)
        self._in_merged: CacheStats | None = None  # added into merged (None: not used)
        #: Why this handle's counts cannot be persisted (None: they are, or are not
        #: tried yet): its record could not be written, nor ``merged`` updated in place.
        self.lost: str | None = None

    def _create(self) -> None:
        # Locked before it gets its final name, so compact() never sees it unlocked.
        name = f"{_hostname()}-{os.getpid()}-{os.urandom(4).hex()}{_SUFFIX}"
        tmp = os.path.join(self._tmp, "stats-" + name)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | _BINARY, self._create_mode)
        try:
            if self._file_mode is not None:
                with contextlib.suppress(OSError, AttributeError):
                    os.fchmod(fd, self._file_mode)
            try_lock(fd)
            remake_dir(self._dir, os.path.dirname(self._dir), self._dir_mode, self._file_mode)
            path = os.path.join(self._dir, name)
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._fd, self._path = fd, path

    def flush(self, stats: CacheStats) -> None:
        """Persist ``stats`` (this handle's counters so far); never raises."""
        if self._broken:
            return
        if self._in_merged is None:
            try:
                if self._fd < 0:
                    self._create()
                record = stats.to_record()
                write_at0(self._fd, record)
                self._in_record = record
                return
            except OSError:  # full, or tmp/ unwritable: add into merged from now on
                self._in_merged = CacheStats()
        in_record = CacheStats.from_record(self._in_record) or CacheStats()
        try:
            self._add_to_merged(stats - in_record - self._in_merged)
            self._in_merged = stats - in_record
        except TimeoutError:
            pass  # merge.lock busy past the bound: the next flush adds it
        except OSError as exc:
            self._broken = True  # read-only or full: keep counting in memory only
            self.lost = exc.strerror or type(exc).__name__

    def _add_to_merged(self, delta: CacheStats) -> None:
        """Add ``delta`` into ``stats/merged`` in place, under the merge lock (which
        ``compact`` and ``zero_totals`` hold while they read and rewrite it). Raises
        OSError when it cannot be written -- a file there that is no record is never
        overwritten -- and TimeoutError when the lock stays busy past the bound. A
        write that lands short is undone (the old bytes put back): never a torn count."""
        if not any(delta._values()):
            return
        lock = os.open(
            os.path.join(self._dir, _MERGE_LOCK),
            os.O_RDWR | os.O_CREAT | O_NOFOLLOW,
            self._create_mode,
        )
        try:
            if not poll(lambda: try_lock(lock), LOCK_WAIT_S):
                raise TimeoutError
            try:
                self._add_locked(delta)
            finally:
                unlock(lock)
        finally:
            os.close(lock)

    def _add_locked(self, delta: CacheStats) -> None:
        path = os.path.join(self._dir, _MERGED)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | O_NOFOLLOW | _NONBLOCK | _BINARY,
                     self._create_mode)  # fmt: skip
        try:
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EEXIST, "stats/merged is not a regular file")
            old = read_at0(fd, MAX_RECORD_SIZE + 1)
            held = CacheStats() if not old else CacheStats.from_record(old)
            if held is None:
                raise OSError(errno.EINVAL, "stats/merged is not a counter record")
            new = (held + delta).to_record()
            # A longer record of a later version keeps its extra counters: only the
            # fields this version knows are rewritten.
            written = write_at0(fd, new)
            if written != len(new):
                write_at0(fd, old[:written])
                if written > len(old):
                    os.ftruncate(fd, len(old))
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        finally:
            os.close(fd)

    def forget_after_fork(self) -> None:
        """In a forked child: drop the parent's record (it stays the parent's)."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd, self._path, self._broken = -1, "", self._read_only
        self._in_record, self._in_merged, self.lost = b"", None, None

    def close(self) -> None:
        """Release the record (flushed by the caller) and fold released records into
        ``merged``."""
        if self._read_only:
            return
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                unlock(self._fd)
            os.close(self._fd)
            self._fd = -1
        compact(self._dir, self._file_mode, self._owned)


def compact(stats_dir: str, file_mode: int | None, owned: bool) -> None:
    """Fold records nobody holds into ``merged`` (best effort, never raises); records
    are deleted only when ``owned`` (see the module docstring)."""
    try:
        lock = os.open(
            os.path.join(stats_dir, _MERGE_LOCK),
            os.O_RDWR | os.O_CREAT | O_NOFOLLOW,
            _mode(file_mode),
        )
    except OSError:
        return
    try:
        if not poll(lambda: try_lock(lock), LOCK_WAIT_S):
            return
        try:
            _compact_locked(stats_dir, file_mode, owned)
        finally:
            unlock(lock)
    except OSError:
        pass
    finally:
        os.close(lock)


def _compact_locked(stats_dir: str, file_mode: int | None, owned: bool) -> None:
    merged_path = os.path.join(stats_dir, _MERGED)
    merged = _read_record(merged_path) or CacheStats()
    folded = False
    if not owned:
        return  # folding deletes records: only in a root proven the cache's
    for name in os.listdir(stats_dir):
        if not is_stats_record(name):
            continue  # not a handle's record (a user's x.cnt): left alone
        path = os.path.join(stats_dir, name)
        try:
            fd = os.open(path, os.O_RDWR | O_NOFOLLOW | _NONBLOCK)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat_mod.S_ISREG(st.st_mode):
                # a FIFO or device planted here: no record of ours
                unlink_special(owned, path, is_stats_record, stats_dir, st.st_ino)
                continue
            if not try_lock(fd):
                continue  # its owner is alive
            rec = CacheStats.from_record(os.read(fd, MAX_RECORD_SIZE + 1))
            if not unlink_owned(owned, path, fingerprint(st), None, _record, stats_dir):
                continue  # replaced since it was opened: not the record read
            if rec is not None:
                merged = merged + rec
                folded = True
        except OSError:
            continue
        finally:
            os.close(fd)
    if folded:
        fd = os.open(merged_path, os.O_RDWR | os.O_CREAT | O_NOFOLLOW | _BINARY, _mode(file_mode))
        try:
            if file_mode is not None:
                with contextlib.suppress(OSError, AttributeError):
                    os.fchmod(fd, file_mode)
            record = merged.to_record()
            write_at0(fd, record)
            os.ftruncate(fd, len(record))  # a longer record from another version
        finally:
            os.close(fd)


def _record(path: str) -> bool:
    return is_stats_record(os.path.basename(path))
