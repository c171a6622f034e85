"""One SQLite connection per thread to one database file, all closed together.

A connection is used only by the thread that opened it (so a thread waiting on a
lock never holds up another thread's reads); ``close_all`` may close them from any
thread, which is why they are opened with ``check_same_thread=False``. Connections
of threads that have ended are closed when a new one is opened.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Connections", "check_timeout", "immediate", "load_sqlite3", "pragmas"]


def check_timeout(timeout: object) -> float:
    """A ``timeout`` argument as seconds (a number, 0 <= it < 1e6); ValueError otherwise."""
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not (0 <= timeout < 1e6)
    ):
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    return float(timeout)


def load_sqlite3() -> Any:
    """Python's sqlite3 module, imported now (``import cuforge`` never needs it).

    Raises ImportError on interpreters built without it, RuntimeError when the
    SQLite library is older than 3.24 (UPSERT).
    """
    try:
        import sqlite3
    except ImportError as exc:
        raise ImportError(
            f"SQLiteProgramCache needs Python's sqlite3 module, which this interpreter "
            f"lacks ({exc}); use FileStreamProgramCache instead"
        ) from exc
    if sqlite3.sqlite_version_info < (3, 24, 0):
        raise RuntimeError(
            f"SQLiteProgramCache needs SQLite 3.24 or newer; Python here links "
            f"{sqlite3.sqlite_version}"
        )
    return sqlite3


def pragmas(durable: bool, wal_limit: int) -> tuple[str, ...]:
    """How every connection is set up."""
    return (
        f"PRAGMA synchronous = {'FULL' if durable else 'NORMAL'}",
        # The cache checkpoints itself when the WAL file passes half its budget
        # (SQLiteProgramCache._make_room); a restarted WAL is cut back to that.
        f"PRAGMA journal_size_limit = {wal_limit // 2}",
        "PRAGMA wal_autocheckpoint = 0",
        "PRAGMA cell_size_check = ON",
        # Some builds zero every freed page (SECURE_DELETE): WAL traffic for nothing.
        "PRAGMA secure_delete = FAST",
        "PRAGMA trusted_schema = OFF",
    )


class Connections:
    """Per-thread connections to ``path`` in autocommit mode, set up by ``pragmas``."""

    def __init__(self, sqlite: Any, path: str, timeout: float, pragmas: tuple[str, ...]) -> None:
        self._sqlite = sqlite
        self._path = path
        self._timeout = timeout
        self._pragmas = pragmas
        self._target, self._uri = path, False
        self._local = threading.local()
        self._by_thread: dict[int, Any] = {}
        self._mutex = threading.Lock()
        self._orphans: list[Any] = []

    def get(self) -> Any:
        """This thread's connection, opened on first use (raises sqlite3.Error)."""
        try:
            return self._local.conn
        except AttributeError:
            pass
        conn = self._sqlite.connect(
            self._target,
            uri=self._uri,
            timeout=self._timeout,
            isolation_level=None,
            check_same_thread=False,
            cached_statements=64,
        )
        try:
            for pragma in self._pragmas:
                conn.execute(pragma).fetchall()
        except BaseException:
            conn.close()
            raise
        me = threading.get_ident()
        with self._mutex:
            alive = {t.ident for t in threading.enumerate()}
            for ident in [i for i in self._by_thread if i not in alive or i == me]:
                with contextlib.suppress(Exception):
                    self._by_thread.pop(ident).close()
            self._by_thread[me] = conn
        self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def busy_timeout(self, conn: Any, ms: int) -> Iterator[None]:
        """Wait at most ``ms`` for locks on ``conn`` inside the block (blocks nest)."""
        before = getattr(self._local, "busy_ms", int(self._timeout * 1000))
        if before == ms:
            yield
            return
        conn.execute(f"PRAGMA busy_timeout = {ms}")
        self._local.busy_ms = ms
        try:
            yield
        finally:
            conn.execute(f"PRAGMA busy_timeout = {before}")
            self._local.busy_ms = before

    def set_busy(self, conn: Any, ms: int) -> None:
        """Make ``ms`` this thread's wait for locks from now on (one PRAGMA, only when it
        changes: stores set their bound once, not around every write)."""
        if getattr(self._local, "busy_ms", int(self._timeout * 1000)) != ms:
            conn.execute(f"PRAGMA busy_timeout = {ms}")
            self._local.busy_ms = ms

    def full_wait(self, conn: Any) -> contextlib.AbstractContextManager[None]:
        """Wait up to the cache's ``timeout`` inside the block (maintenance operations)."""
        return self.busy_timeout(conn, int(self._timeout * 1000))

    def read_only(self, how: str) -> None:
        """Open connections from now on as ``file:<path>?<how>`` (``mode=ro`` or
        ``immutable=1``); closes the ones open."""
        from urllib.parse import quote

        self.close_all()
        self._target, self._uri = f"file:{quote(self._path)}?{how}", True

    def close_all(self) -> None:
        with self._mutex:
            conns, self._by_thread = list(self._by_thread.values()), {}
        self._local = threading.local()
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()

    def forget_after_fork(self) -> None:
        """In a forked child: never use or close the parent's connections (SQLite's
        rule); they are kept, unclosed, for the life of the process."""
        self._orphans.extend(self._by_thread.values())
        self._by_thread = {}
        self._local = threading.local()
        self._mutex = threading.Lock()


@contextlib.contextmanager
def committed(conn: Any) -> Iterator[None]:
    """Commit the transaction ``conn`` has open when the block ends; roll it back (if
    still open) when the block or the commit raises, and re-raise."""
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def immediate(conn: Any, sql: str, params: Any = ()) -> Any:
    """Run one writing statement in a ``BEGIN IMMEDIATE`` transaction.

    In WAL mode a statement that starts reading and then writes fails with "database
    is locked" at once (no busy wait) when another connection committed meanwhile;
    taking the write lock first makes it wait its turn under the busy timeout.
    """
    conn.execute("BEGIN IMMEDIATE")
    with committed(conn):
        cur = conn.execute(sql, params)
    return cur
