"""Eviction and ``clear()`` for a file-stream cache: the only scans that delete.

Guarantee: one deleting scan at a time per cache directory -- threads of a handle
by its mutex, processes by an exclusive lock on ``evict.lock`` -- and every deletion
is stat-guarded and goes through the ownership gate (``remove_scanned``), so an
entry a writer replaced after the scan survives and nothing but the cache's own
entries in a root proven the cache's ever goes. Eviction removes least-recently-read
entries until the scanned total is at or below the target, then resets the shared
size ledger to what the scan saw (less what it freed). The entry whose write started
an eviction is never its victim, and an access time in the future (a host whose
clock was ahead, a copied cache) ranks as the scan's now: before, such entries
outranked every other entry and each new store was evicted by its own write instead.

Failure modes: when ``evict.lock`` cannot be opened, or another process holds it
past the bounded wait (``_locking.BoundedWait``: 0.25 s, then 10 ms waits for a
while), eviction is deferred (the next write over the cap tries again; the caller
counts it) while ``clear()`` goes on without it; files that vanish or change
meanwhile are skipped, never an error. Imported on first eviction, ``clear()`` or
``len()``: a cache hit never loads it.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
import threading
import time
from collections.abc import Callable, Iterator

from .._filelock import unlock
from .._fsutil import O_NOFOLLOW, PRIVATE_FILE, fingerprint
from ._atomicwrite import sweep_temps
from ._locking import BoundedWait
from ._scan import Scanned, remove_scanned, scan_entries
from ._sizeindex import SizeLedger

__all__ = ["clear_all", "evict_lru", "exclusive_scan", "scan_all"]


def scan_all(
    entries_dir: str, tmp_dir: str, now_ns: int, stale_age_ns: int, owned: bool | None
) -> tuple[list[Scanned], int]:
    """Every entry and the bytes of entries plus live temp files; stale temps go when
    ``owned`` (None: a read-only handle, which only looks: temps are not counted)."""
    found, total = scan_entries(entries_dir)
    if owned is None:
        return found, total
    return found, total + sweep_temps(tmp_dir, now_ns, stale_age_ns, owned=owned)


@contextlib.contextmanager
def exclusive_scan(
    mutex: threading.Lock,
    lock_path: str,
    file_mode: int | None,
    wait: BoundedWait,
    on_busy: Callable[[], None],
) -> Iterator[bool]:
    """Serialise scans that delete: threads by ``mutex``, processes by ``lock_path``.

    Yields whether the file lock is held (False: it could not be opened, or another
    process held it past ``wait``'s bound -- then ``on_busy`` was called)."""
    with mutex:
        fd = -1
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | O_NOFOLLOW, PRIVATE_FILE)
            if file_mode is not None:
                with contextlib.suppress(OSError, AttributeError):
                    os.fchmod(fd, file_mode)
            held = wait.acquire(fd)
            if not held:
                on_busy()
        except OSError:
            held = False
        try:
            yield held
        finally:
            if fd >= 0:
                if held:
                    with contextlib.suppress(OSError):
                        unlock(fd)
                os.close(fd)


def evict_lru(
    ledger: SizeLedger,
    cap: int,
    low_water: float,
    exclusive: contextlib.AbstractContextManager[bool],
    scan: Callable[[int], tuple[list[Scanned], int]],
    keep: str | None = None,
    *,
    owned: bool,
) -> int:
    """Evict least-recently-read entries down to ``low_water * cap``; the entries
    evicted. Does nothing unless ``exclusive`` is held and the ledger is still over
    ``cap`` (another process may have evicted while this one waited).

    ``keep`` (the payload path of the entry just written) is never evicted: stamped
    a moment before the scan, it ranks older than entries whose access time lies in
    the future, and one nearly as large as the cap would go after all the others.
    A future access time ranks as ``now`` and is set to ``now`` (``_age_from_now``),
    so such an entry ages from this scan on instead of outranking every entry used
    here until the clock catches up."""
    with exclusive as held:
        if not held:
            return 0
        base = ledger.total()
        if base <= cap:
            return 0
        now = time.time_ns()
        found, total = scan(now)
        target = int(cap * low_water)
        for entry in found:
            if entry.atime_ns > now:
                _age_from_now(entry, now)
        found.sort(key=lambda e: min(e.atime_ns, now))  # as set just now
        evicted = 0
        for entry in found:
            if total <= target:
                break
            if entry.payload == keep:
                continue
            freed = remove_scanned(entry, now, force=False, owned=owned)
            if freed:
                total -= freed
                evicted += entry.payload is not None
        ledger.reconcile(base, total)
        return evicted


def _age_from_now(entry: Scanned, now_ns: int) -> None:
    """Set a future access time to ``now_ns``, keeping mtime, on the very file the
    scan saw (same inode, size and mtime; a link is not followed). A file of another
    user of a group-shared cache takes "now" for both times, as a hit does (explicit
    times need the file's owner). Best effort: a file that refuses keeps its time."""
    path = entry.payload
    if path is None:
        return
    with contextlib.suppress(OSError, NotImplementedError):
        st = os.stat(path, follow_symlinks=False)
        if not stat_mod.S_ISREG(st.st_mode) or fingerprint(st) != entry.payload_fp:
            return
        try:
            os.utime(path, ns=(now_ns, st.st_mtime_ns), follow_symlinks=False)
        except PermissionError:
            os.utime(path, follow_symlinks=False)


def clear_all(
    ledger: SizeLedger | None,
    exclusive: contextlib.AbstractContextManager[bool],
    scan: Callable[[int], tuple[list[Scanned], int]],
    owned: bool,
) -> None:
    """Remove every scanned entry (young orphan sidecars too) and reset the ledger.
    An entry that cannot be removed (an immutable shard, another user's file) is
    passed over and the others removed; the first such error is raised at the end
    (it stopped the whole clear at that entry, and named its cause for all that stayed)."""
    first: OSError | None = None
    with exclusive:
        base = ledger.total() if ledger is not None else 0
        now = time.time_ns()
        found, total = scan(now)
        for entry in found:
            try:
                total -= remove_scanned(entry, now, force=True, owned=owned)
            except OSError as exc:
                first = first or exc
        if ledger is not None:
            with contextlib.suppress(OSError):
                ledger.reconcile(base, total)
    if first is not None:
        raise first
