"""Opening a SQLite cache file: judge it, make it ours, or move a damaged one aside.

Nothing is created, written, renamed or deleted at or beside a path until the file
there is judged (:func:`refuse_unless_ours`, before ``<path>.lock`` exists): absent
or empty (new), provably ours (its header carries cuforge's application id), or an
SQLite database without an application id whose schema is empty (a peer is creating
it) or cuforge's (a legacy cache, marked on open). Anything else -- a user's file,
someone else's database, a file with no provable header -- raises
``ForeignDatabaseError`` (a ``CachePathError``) and is left exactly as it was. A lock
file proves nothing: anyone can leave one.

A damaged file (truncated, unreadable through SQLite, or failing ``quick_check``
after damage was reported while open: ``<path>.damaged``) is renamed
``<path>.corrupt-<timestamp>`` and replaced by an empty cache only if its header
carries our application id (``owned_database``, checked again just before the move,
through ``ownership.delete_owned``) and only while no other process uses it (the
exclusive hold of byte 0 in ``<path>.lock``): SQLite must never see its file renamed
under an open connection. A peer waiting to do the same finds the new file instead.
When the file cannot be repaired the handle serves misses.
"""

from __future__ import annotations

import contextlib
import os
import stat as stat_mod
import time
from typing import Any, NamedTuple

from .. import ownership
from ..diskspace import no_space
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
    owned_database,
    probe,
)

__all__ = ["Opened", "default_db_path", "mark_damaged", "open_database", "refuse_unless_ours"]

_MAGIC = b"SQLite format 3\x00"
#: How long a file that may be a peer's first write in progress is looked at again.
_LOOK_AGAIN_S = 0.25


class Opened(NamedTuple):
    """The outcome of opening: why the handle must serve misses (None: it need not),
    a notice to warn about (a repair, or why none was possible), and whether the file
    could only be opened for reading (a read-only file system or file: hits only)."""

    broken: str | None
    notice: str | None
    read_only: bool = False
    #: Why stores fail on a file opened for reading only because its file system is
    #: full (None: it is not): said as a failure, not as a read-only cache.
    full: str | None = None


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


def refuse_unless_ours(sqlite: Any, path: str, timeout: float) -> None:
    """Raise ForeignDatabaseError unless the file at ``path`` is absent, empty, provably
    a cuforge database, or an SQLite database without an application id whose schema is
    empty or cuforge's (see the module docstring). Reads only.

    Closes a race of openers on a new path: a file seen between a peer's creating it
    and its first page landing (longer than a header but read short, or unreadable by
    SQLite while the peer writes) is looked at again for up to 0.25 s, not refused.
    """
    deadline = time.monotonic() + _LOOK_AGAIN_S
    while True:
        why, passing = _why_not_ours(sqlite, path, timeout)
        if why is None:
            return
        if not passing or time.monotonic() >= deadline:
            raise ForeignDatabaseError(path, why)
        time.sleep(0.01)


def _why_not_ours(sqlite: Any, path: str, timeout: float) -> tuple[str | None, bool]:
    """``(why the file is not ours or None, whether that may pass)``."""
    try:
        if not stat_mod.S_ISREG(os.stat(path).st_mode):
            return None, False  # prepare_db_file refuses it, naming what it is
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(path, flags)
    except OSError:
        return None, False  # absent: new; unreadable: opening says why (creating nothing)
    try:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            return None, False  # replaced meanwhile: judged as the above
        head = os.read(fd, 100)
        size = os.fstat(fd).st_size
    except OSError:
        return None, False
    finally:
        os.close(fd)
    if size == 0:
        return None, False  # new, or a peer's just created: it holds nothing to lose
    if len(head) < 100:
        return f"{size} bytes, shorter than an SQLite header", size >= 100
    if head[:16] != _MAGIC:
        return "not an SQLite database: its header is not SQLite's", False
    app = int.from_bytes(head[68:72], "big")
    if app == APPLICATION_ID:
        return None, False
    if app != 0:
        return f"another program's SQLite database: application_id {app:#x}", False
    return _look_inside(sqlite, path, head[18] == 2, timeout)


def _look_inside(sqlite: Any, path: str, wal_mode: bool, timeout: float) -> tuple[str | None, bool]:
    """Judge an SQLite file without an application id by its schema, read-only and
    creating nothing beside it: ``mode=ro`` would create the WAL and its index of a
    WAL-mode database that has none (and leave them), so such a file -- complete in
    itself -- is read ``immutable=1``."""
    from urllib.parse import quote

    companions = os.path.lexists(path + "-wal") and os.path.lexists(path + "-shm")
    how = "immutable=1" if wal_mode and not companions else "mode=ro"
    try:
        conn = sqlite.connect(
            f"file:{quote(path)}?{how}", uri=True, timeout=timeout, isolation_level=None
        )
        try:
            kind, detail = inspect(conn)
        finally:
            conn.close()
    except sqlite.Error as exc:
        if is_busy(exc):
            return f"another process held it locked for over {timeout:g} s", False
        return f"SQLite cannot read it: {exc}", True  # a peer's first page, mid-write
    if kind == "foreign":
        return f"another program's SQLite database: {detail}", False
    return None, False


def _forget_marker(path: str) -> None:
    """Delete ``<path>.damaged`` of a database just proven ours: only an empty regular
    file (what :func:`mark_damaged` leaves) is taken for the marker."""

    def is_marker(name: str) -> bool:
        try:
            st = os.lstat(name)
        except OSError:
            return False
        return stat_mod.S_ISREG(st.st_mode) and st.st_size == 0

    def unlink(names: list[str]) -> int:
        for name in names:
            with contextlib.suppress(OSError):
                os.unlink(name)
        return len(names)

    ownership.delete_owned([path + ".damaged"], is_marker, unlink, where=path)


def _diagnose(sqlite: Any, conns: Connections, path: str, timeout: float) -> str | None:
    """None when the file is ours and current (made so if new, legacy or stale); else
    what is wrong with it. Raises ForeignDatabaseError, and OperationalError (busy past
    ``timeout`` seconds, I/O)."""
    problem = file_problem(path)
    if problem is not None:
        return problem
    try:
        conn = conns.get()
        marked = os.path.exists(path + ".damaged")
        if marked:
            result = conn.execute("PRAGMA quick_check").fetchall()
            if result != [("ok",)]:
                return f"damaged ({result[0][0]})"
        ensure_schema(conn, path, timeout)
        probe(conn)
    except sqlite.DatabaseError as exc:
        if is_corruption(exc):
            return f"SQLite cannot read it: {exc}"
        raise
    if marked:
        _forget_marker(path)
    return None


def _move_aside_if_ours(path: str) -> str | None:
    """Rename the damaged database aside if its header proves it ours (through the
    ownership gate); where it went, or None when the proof failed (nothing moved)."""
    dest: list[str] = []

    def move(paths: list[str]) -> int:
        dest.append(move_aside(paths[0]))
        return 1

    ownership.delete_owned([path], owned_database, move, where=path)
    return dest[0] if dest else None


def _unprovable(path: str, problem: str) -> ForeignDatabaseError:
    return ForeignDatabaseError(
        path, f"damaged ({problem}) and its header does not carry cuforge's application id"
    )


def open_database(
    sqlite: Any, conns: Connections, locks: LockFile, path: str, timeout: float
) -> Opened:
    """Make ``path`` a usable cache database (see the module docstring); the caller
    has already called :func:`refuse_unless_ours`.

    Raises ForeignDatabaseError, and OSError when the file cannot be opened at all.
    """
    locks.use(timeout)
    try:
        problem = _diagnose(sqlite, conns, path, timeout)
        if problem is None:
            return Opened(None, None)
        if not owned_database(path):
            conns.close_all()
            raise _unprovable(path, problem)
        return _recover(sqlite, conns, locks, path, timeout, problem)
    except sqlite.OperationalError as exc:
        conns.close_all()
        if is_busy(exc):
            why = f"another connection held it locked for over {timeout:g} s"
            return Opened(why, why)
        full = _full(path)
        if (_cannot_write(path) or full) and _open_read_only(sqlite, conns, path):
            return Opened(None, None, read_only=True, full=full)
        raise OSError(f"cannot open the SQLite program cache {path}: {exc}") from exc


def _full(path: str) -> str | None:
    """Why a file in ``path``'s directory cannot grow: its file system has no free
    block (for this user) -- SQLite's open then fails ("disk I/O error") as it makes
    the WAL index -- else None. Such a cache is served for reading: a full disk must
    not stop the compiles it would hit."""
    return no_space(os.path.dirname(path) or ".")


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
            if file_problem(path) is None and inspect(conns.get())[0] in ("ours", "legacy"):
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
            dest = _move_aside_if_ours(path)
        except OSError as exc:
            why = f"it is damaged ({again}) and could not be moved aside ({exc})"
            return Opened(why, why)
        if dest is None:
            raise _unprovable(path, again)
        notice = f"it was damaged ({again}); moved it to {dest} and started an empty cache"
        still = _diagnose(sqlite, conns, path, timeout)
        if still is not None:
            conns.close_all()
            return Opened(f"a new database could not be made ({still})", notice)
        return Opened(None, notice)
    finally:
        locks.share()
