"""Opening a SQLite cache file: judge it, make it ours, or move a damaged one aside.

A damaged file (not SQLite, truncated, unreadable, or failing ``quick_check`` after
damage was reported while open: ``<path>.damaged``) is renamed
``<path>.corrupt-<timestamp>`` and replaced by an empty cache -- but only while no
other process uses it (the exclusive hold of byte 0 in ``<path>.lock``): SQLite must
never see its file renamed under an open connection. A peer waiting to do the same
finds the new file instead. When the file cannot be repaired the handle serves
misses. A foreign database raises ``ForeignDatabaseError`` before anything is written,
and so does a damaged-looking file that is not recognisably cuforge's (its header
does not carry our application id, and no ``<path>.lock`` shows cuforge used the
path before): a user's file at a mistyped path is never renamed or replaced.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, NamedTuple

from ._conn import Connections
from ._lock import LockFile
from ._schema import (
    APPLICATION_ID,
    ForeignDatabaseError,
    ensure_schema,
    file_problem,
    inspect,
    is_busy,
    is_corruption,
    move_aside,
    probe,
)

__all__ = ["Opened", "default_db_path", "mark_damaged", "open_database"]


class Opened(NamedTuple):
    """The outcome of opening: why the handle must serve misses (None: it need not),
    a notice to warn about (a repair, or why none was possible), and whether the file
    could only be opened for reading (a read-only file system or file: hits only)."""

    broken: str | None
    notice: str | None
    read_only: bool = False


def default_db_path() -> str:
    """``<user cache dir>/cuforge/program-cache.db``, next to the FileStream default."""
    from platformdirs import user_cache_path

    return str(user_cache_path("cuforge", appauthor=False) / "program-cache.db")


def mark_damaged(path: str) -> None:
    """Remember that SQLite reported damage: the next open checks the whole file."""
    with contextlib.suppress(OSError), open(path + ".damaged", "a"):
        pass


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _diagnose(sqlite: Any, conns: Connections, path: str, timeout: float) -> str | None:
    """None when the file is ours and current (made so if new or stale); else what is
    wrong with it. Raises ForeignDatabaseError, and OperationalError (busy past
    ``timeout`` seconds, I/O)."""
    problem = file_problem(path)
    if problem is not None:
        return problem
    try:
        conn = conns.get()
        marker = path + ".damaged"
        if os.path.exists(marker):
            result = conn.execute("PRAGMA quick_check").fetchall()
            if result != [("ok",)]:
                return f"damaged ({result[0][0]})"
            with contextlib.suppress(OSError):
                os.unlink(marker)
        ensure_schema(conn, path, timeout)
        probe(conn)
    except sqlite.DatabaseError as exc:
        if is_corruption(exc):
            return f"SQLite cannot read it: {exc}"
        raise
    return None


def _recognisably_ours(path: str, locks: LockFile) -> bool:
    """Whether a file that looks damaged may be moved aside: its SQLite header carries
    our application id, or ``<path>.lock`` was there before this process opened it
    (cuforge used the path). A file that has neither is someone else's."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError:
        return False
    ours = head[:16] == b"SQLite format 3\x00" and head[68:72] == APPLICATION_ID.to_bytes(4, "big")
    return ours or locks.used_before()


def open_database(
    sqlite: Any, conns: Connections, locks: LockFile, path: str, timeout: float
) -> Opened:
    """Make ``path`` a usable cache database (see the module docstring).

    Raises ForeignDatabaseError, and OSError when the file cannot be opened at all.
    """
    locks.use(timeout)
    try:
        problem = _diagnose(sqlite, conns, path, timeout)
        if problem is None:
            return Opened(None, None)
        if not _recognisably_ours(path, locks):
            conns.close_all()
            raise ForeignDatabaseError(
                f"{path} is not a cuforge program cache ({problem}) and was never used as "
                "one; refusing to touch it -- give SQLiteProgramCache a path of its own"
            )
        return _recover(sqlite, conns, locks, path, timeout, problem)
    except sqlite.OperationalError as exc:
        conns.close_all()
        if is_busy(exc):
            why = f"another connection held it locked for over {timeout:g} s"
            return Opened(why, why)
        if _cannot_write(path) and _open_read_only(sqlite, conns, path):
            return Opened(None, None, read_only=True)
        raise OSError(f"cannot open the SQLite program cache {path}: {exc}") from exc


def _cannot_write(path: str) -> bool:
    """The file or its directory is not writable (a read-only mount: EROFS for root too)."""
    return not os.access(path, os.W_OK) or not os.access(os.path.dirname(path) or ".", os.W_OK)


def _open_read_only(sqlite: Any, conns: Connections, path: str) -> bool:
    """Serve an existing, current cache file for reading. ``mode=ro`` first (it sees a
    WAL others write, but needs a writable directory for the WAL index), then
    ``immutable=1`` (a read-only mount: nobody can change the file under us)."""
    for how in ("mode=ro", "immutable=1"):
        conns.read_only(how)
        try:
            if file_problem(path) is None and inspect(conns.get())[0] == "ours":
                probe(conns.get())
                return True
        except sqlite.DatabaseError:
            pass
        conns.close_all()
    return False


def _recover(
    sqlite: Any, conns: Connections, locks: LockFile, path: str, timeout: float, problem: str
) -> Opened:
    conns.close_all()
    deadline = time.monotonic() + timeout
    seen = _identity(path)
    on_disk = file_problem(path) is not None  # seen without SQLite: cheap to look again
    while not locks.try_exclusive():
        if not locks.alone_in_process() or time.monotonic() >= deadline:
            locks.use(0)
            why = f"it is damaged ({problem}) and in use by another process"
            return Opened(why, why)
        locks.unuse()  # let a peer that waits for the same thing go first
        time.sleep(0.01)
        # A peer replaced the file, or what looked wrong on disk no longer does (a
        # transient state seen mid-write): judge it again rather than wait it out.
        if _identity(path) != seen or (on_disk and file_problem(path) is None):
            locks.use(timeout)
            again = _diagnose(sqlite, conns, path, timeout)
            if again is None:
                return Opened(None, None)
            problem, seen = again, _identity(path)
            on_disk = file_problem(path) is not None
            conns.close_all()
    try:
        again = _diagnose(sqlite, conns, path, timeout)  # a peer may have repaired it meanwhile
        if again is None:
            return Opened(None, None)
        conns.close_all()
        try:
            dest = move_aside(path)
        except OSError as exc:
            why = f"it is damaged ({again}) and could not be moved aside ({exc})"
            return Opened(why, why)
        notice = f"it was damaged ({again}); moved it to {dest} and started an empty cache"
        still = _diagnose(sqlite, conns, path, timeout)
        if still is not None:
            conns.close_all()
            return Opened(f"a new database could not be made ({still})", notice)
        return Opened(None, notice)
    finally:
        locks.share()
