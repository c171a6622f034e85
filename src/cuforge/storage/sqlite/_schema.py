"""The SQLite cache's file: its schema, how an existing file is judged, and row checks.

Layout (``PRAGMA application_id`` marks the file as ours, ``user_version`` is the
schema version; auto_vacuum is INCREMENTAL and the journal is WAL)::

    cuforge_entries(rid INTEGER PRIMARY KEY,  -- first 8 bytes of the key digest
                    digest BLOB,              -- blake2b-256 of the key: the entry id
                    crc INTEGER,              -- row_check(): payload, length, metadata
                    size INTEGER,             -- payload + metadata bytes
                    stored_ns, used_ns INTEGER, meta BLOB, data BLOB)
    cuforge_entries_used                      -- index on used_ns: LRU order
    cuforge_state(id = 0, entries, total_bytes, <one column per CacheStats counter>)
    triggers keeping cuforge_state.entries / total_bytes equal to the table's count
    and sum of sizes, whoever inserts, replaces or deletes rows

A file is judged before it is used: absent or empty (new), ours, ours at an older
schema version (stale: our tables are dropped and rebuilt), ours at a newer one
(refused, never written: :class:`NewerSchemaError`), a valid SQLite database that is
not ours (foreign: refused, never written), or damaged (not SQLite, shorter than its
header says, or unreadable through SQLite).

**Versions.** ``user_version`` is the layout's version (:data:`SCHEMA_VERSION`, 2):
every cuforge since version 2 rebuilds -- drops -- a file of any other version, so it
changes only when the layout cannot be read as before. Additions an older cuforge
can live with change :data:`SCHEMA_REVISION` instead, and are made in place on the
first writable open: revision 3 adds the ``lock_timeouts`` and ``warm_compiles``
counter columns (``ALTER TABLE ... ADD COLUMN``, under the write lock, entries and
counters kept). An older cuforge opening a revision-3 file sees version 2 and keeps
working (it writes the counters it knows; the new columns keep their values); this
cuforge opening a revision-2 file it cannot write (a read-only handle) uses the
columns there are, and keeps the others per handle (:class:`Counters`).

Ours means provably ours: the header carries :data:`APPLICATION_ID`
(``ownership.SQLITE_APPLICATION_ID``, the mark cuforge has always written), or the
database has no application id and holds both of cuforge's tables (a legacy cache,
marked with :data:`APPLICATION_ID` on its first writable open).
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
import zlib
from typing import Any

from .. import ownership
from .._safedir import CachePathError
from ..stats import CacheStats

__all__ = [
    "APPLICATION_ID",
    "FOREIGN_WAY_OUT",
    "SCHEMA_REVISION",
    "SCHEMA_VERSION",
    "SQL",
    "STAT_COLUMNS",
    "Counters",
    "DatabaseIsDirectoryError",
    "ForeignDatabaseError",
    "NewerSchemaError",
    "counter_columns",
    "ensure_schema",
    "file_problem",
    "inspect",
    "is_busy",
    "is_corruption",
    "move_aside",
    "owned_database",
    "probe",
    "rid_of",
    "row_check",
]

#: Marks a database as a cuforge program cache ("CUFG"): written at creation, and the
#: proof that lets the cache move a damaged file aside.
APPLICATION_ID = ownership.SQLITE_APPLICATION_ID

SCHEMA_VERSION = 2  # user_version: 2: signature_failures and read_failures counters
SCHEMA_REVISION = 3  # 3: lock_timeouts and warm_compiles counters (version 2, added in place)
# The counters the state table persists, in CacheStats order: a file has columns for
# a prefix of them (revision 2: the first 10; revision 3: all 12). A counter added to
# CacheStats later is kept per handle only until a revision adds its column.
STAT_COLUMNS = tuple(CacheStats().as_dict())[:12]
_TABLES = ("cuforge_entries", "cuforge_state")

_DDL = (
    """CREATE TABLE cuforge_entries (
        rid INTEGER PRIMARY KEY,
        digest BLOB NOT NULL,
        crc INTEGER NOT NULL,
        size INTEGER NOT NULL,
        stored_ns INTEGER NOT NULL,
        used_ns INTEGER NOT NULL,
        meta BLOB NOT NULL,
        data BLOB NOT NULL)""",
    "CREATE INDEX cuforge_entries_used ON cuforge_entries(used_ns)",
    "CREATE TABLE cuforge_state (id INTEGER PRIMARY KEY CHECK (id = 0), "
    "entries INTEGER NOT NULL, total_bytes INTEGER NOT NULL, "
    + ", ".join(f"{c} INTEGER NOT NULL DEFAULT 0" for c in STAT_COLUMNS)
    + ")",
    "INSERT INTO cuforge_state (id, entries, total_bytes) VALUES (0, 0, 0)",
    """CREATE TRIGGER cuforge_entries_insert AFTER INSERT ON cuforge_entries BEGIN
        UPDATE cuforge_state SET entries = entries + 1, total_bytes = total_bytes + NEW.size;
    END""",
    """CREATE TRIGGER cuforge_entries_update AFTER UPDATE OF size ON cuforge_entries BEGIN
        UPDATE cuforge_state SET total_bytes = total_bytes - OLD.size + NEW.size;
    END""",
    """CREATE TRIGGER cuforge_entries_delete AFTER DELETE ON cuforge_entries BEGIN
        UPDATE cuforge_state SET entries = entries - 1, total_bytes = total_bytes - OLD.size;
    END""",
)


class SQL:
    """The statements the cache runs on the schema above."""

    get = "SELECT digest, crc, meta, data FROM cuforge_entries WHERE rid = ?"
    put = (
        "INSERT INTO cuforge_entries (rid, digest, crc, size, stored_ns, used_ns, meta, data) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(rid) DO UPDATE SET "
        "digest = excluded.digest, crc = excluded.crc, size = excluded.size, "
        "stored_ns = excluded.stored_ns, used_ns = excluded.used_ns, meta = excluded.meta, "
        "data = excluded.data"
    )
    #: Removes a damaged row only if no writer replaced it since it was read.
    drop_if_same = "DELETE FROM cuforge_entries WHERE rid = ? AND crc = ?"
    delete_key = "DELETE FROM cuforge_entries WHERE rid = ? AND digest = ?"
    #: Removes a row whose stored digest is damaged, only as it was read.
    drop_exact = "DELETE FROM cuforge_entries WHERE rid = ? AND digest IS ? AND crc IS ?"
    #: A recorded use: later than the stored one, or the stored one lies in the future
    #: (a clock that was ahead: re-stamped with the real time). Parameters: use, rid,
    #: use, now.
    touch = "UPDATE cuforge_entries SET used_ns = ? WHERE rid = ? AND (used_ns < ? OR used_ns > ?)"
    _list = "SELECT rid, digest, size, stored_ns, used_ns, meta FROM cuforge_entries WHERE rid "
    list_first = _list + ">= ? ORDER BY rid LIMIT 256"
    list_next = _list + "> ? ORDER BY rid LIMIT 256"


class Counters:
    """The statements over the counter columns one file has: the first ``n`` of
    :data:`STAT_COLUMNS` (``counter_columns``). ``add`` takes that many deltas."""

    __slots__ = ("add", "n", "read", "zero")

    def __init__(self, n: int) -> None:
        cols = STAT_COLUMNS[:n]
        self.n = n
        self.add = "UPDATE cuforge_state SET " + ", ".join(f"{c} = max(0, {c} + ?)" for c in cols)
        self.zero = "UPDATE cuforge_state SET " + ", ".join(f"{c} = 0" for c in cols)
        self.read = f"SELECT {', '.join(cols)} FROM cuforge_state"


def counter_columns(conn: Any) -> int:
    """How many of :data:`STAT_COLUMNS`, in order, the file's state table has (the
    first missing one ends the count)."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(cuforge_state)").fetchall()}
    n = 0
    while n < len(STAT_COLUMNS) and STAT_COLUMNS[n] in have:
        n += 1
    return n


class NewerSchemaError(CachePathError, ValueError):
    """The file is a cuforge cache of a newer layout than this cuforge reads (its
    ``user_version`` is above :data:`SCHEMA_VERSION`). Nothing was written: rebuilding
    it would drop the entries every newer cuforge sharing it uses. ``str()`` is one
    line naming the path, both versions and the fix."""

    def __init__(self, path: str, version: int) -> None:
        super().__init__(
            path,
            f"was written by a newer cuforge (SQLite cache schema version {version}; this "
            f"cuforge reads version {SCHEMA_VERSION}); nothing was changed -- upgrade "
            "cuforge, or give this one a database path of its own",
            kind="file",
        )


_MAGIC = b"SQLite format 3\x00"
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


#: The way out :class:`ForeignDatabaseError` names, in the Python API's words (the
#: command line says it in its own: the flag, variable or settings file to change).
FOREIGN_WAY_OUT = "give SQLiteProgramCache a path of its own, or move that file away"


class DatabaseIsDirectoryError(ValueError):
    """The path names a directory, not a database file; nothing was opened or created.
    ``path`` is the path; ``str()`` one line naming it and the fix, in the Python API's
    words (the command line says it in its own)."""

    def __init__(self, path: str) -> None:
        super().__init__(
            f"SQLiteProgramCache path {path} is a directory; give the path of "
            "a database file (e.g. .../program-cache.db)"
        )
        self.path = path


class ForeignDatabaseError(CachePathError, ValueError):
    """The path holds a file that is not provably a cuforge SQLite cache: another
    file, someone else's database, or a damaged file without cuforge's application
    id. Nothing was written, renamed or created beside it. A ``CachePathError`` (an
    ``OSError``) and, as before, a ``ValueError``; ``str()`` is one line naming the
    path, the problem and the fix."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(
            path,
            f"is not a cuforge SQLite cache ({why}); nothing was changed -- {FOREIGN_WAY_OUT}",
            kind="file",
        )


def owned_database(path: str) -> bool:
    """Whether the file at ``path`` is provably a cuforge database by its header
    alone: it carries our application id (or cuforge's earlier one). The proof a
    file must pass before it is moved aside (a link is judged by what it names)."""
    return ownership.sqlite_application_id(os.path.realpath(path)) == APPLICATION_ID


def rid_of(key_digest: bytes) -> int:
    """The row id of a key: its digest's first 8 bytes as a signed integer."""
    return int.from_bytes(key_digest[:8], "little", signed=True)


def row_check(seed: int, data: bytes, meta: bytes) -> int:
    """CRC-32 over the payload then the metadata, started from the key's seed
    (``_integrity.key_seed``) mixed with the payload length.

    The seed binds the row to its key, as the FileStream sidecar does; the length
    makes a byte moved between payload and metadata fail (CRC-32 is affine in its
    start value, so a different start always gives a different result for the same
    bytes).
    """
    return zlib.crc32(meta, zlib.crc32(data, (seed ^ len(data)) & 0xFFFFFFFF))


def file_problem(path: str) -> str | None:
    """What is wrong with the file at ``path`` without opening it through SQLite.

    None when it is absent, empty, growing as we read (a peer creating it), or
    plausible. Damaged: not an SQLite header (another file, zero-filled), or shorter
    than its header says while no WAL holds newer pages (truncated).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    if len(head) < 100 and size >= 100:
        # It grew after the read: a peer creating the database wrote its first page
        # just then. Not damage; SQLite itself judges the file next.
        return None
    if len(head) < 100 or head[:16] != _MAGIC:
        return "not an SQLite database (its header is not SQLite's)"
    page_size = _U16.unpack_from(head, 16)[0]
    page_size = 65536 if page_size == 1 else page_size
    if page_size < 512 or page_size & (page_size - 1):
        return f"damaged header (page size {page_size})"
    pages = _U32.unpack_from(head, 28)[0]
    header_size_valid = pages and head[24:28] == head[92:96]
    try:
        wal = os.path.getsize(path + "-wal")
    except OSError:
        wal = 0
    if header_size_valid and wal == 0 and size < pages * page_size:
        return f"truncated ({size} bytes, its header says {pages * page_size})"
    return None


def inspect(conn: Any) -> tuple[str, str]:
    """``(kind, detail)``: kind is "empty", "ours", "legacy" (ours and current, to be
    marked with APPLICATION_ID), "stale" (ours, an older schema version), "newer"
    (ours, a newer schema version; detail: the version) or "foreign".

    Ours: our application id, or no application id and both of our
    tables. Empty: no user version and no table, and no application id or ours (a new
    file, or one a peer is creating). Read in one transaction: read one statement at a
    time, a peer's creation could commit in between, and its tables would be seen
    without its application id.
    """
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        app = conn.execute("PRAGMA application_id").fetchall()[0][0]
        version = conn.execute("PRAGMA user_version").fetchall()[0][0]
        tables = sorted(
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite!_%' ESCAPE '!'"
            ).fetchall()
        )
    finally:
        if own:
            conn.execute("COMMIT")
    if app in (0, APPLICATION_ID) and version == 0 and not tables:
        return "empty", ""
    if app == APPLICATION_ID or (app == 0 and all(t in tables for t in _TABLES)):
        if version == SCHEMA_VERSION and all(t in tables for t in _TABLES):
            return ("ours", "") if app == APPLICATION_ID else ("legacy", "")
        if version > SCHEMA_VERSION and app == APPLICATION_ID:
            return "newer", str(version)
        return "stale", f"schema version {version}, expected {SCHEMA_VERSION}"
    shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
    return "foreign", f"application_id {app:#x}, tables: {shown or 'none'}"


def probe(conn: Any) -> None:
    """Read our state row and the newest entry page (raises DatabaseError if damaged)."""
    conn.execute("SELECT entries, total_bytes FROM cuforge_state").fetchall()
    conn.execute("SELECT max(rid) FROM cuforge_entries").fetchall()


def ensure_schema(conn: Any, path: str, wait_s: float) -> str:
    """Make the database ours and current; what was done: "ok", "created", "marked"
    (a legacy cache given our application id), "migrated" (revision 3's columns
    added in place) or "rebuilt".

    Raises ForeignDatabaseError or NewerSchemaError (before writing anything) for a
    database that is not ours or of a newer layout. Creation, marking, migration and
    rebuild run under the write lock, so concurrent openers do it once (each looks
    again under the lock). Waits at most ``wait_s`` for peers' locks (then raises busy).
    """
    kind, detail = inspect(conn)
    _refuse(kind, detail, path)
    if kind == "empty":  # both only take effect before the first table
        conn.execute("PRAGMA page_size = 4096")
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    _switch_to_wal(conn, wait_s, mark=kind == "empty")
    if kind == "ours":
        return "ok" if counter_columns(conn) == len(STAT_COLUMNS) else _migrate(conn, path)
    conn.execute("BEGIN IMMEDIATE")
    try:
        kind, detail = inspect(conn)  # again, under the lock: a peer may have done it
        _refuse(kind, detail, path)
        if kind in ("ours", "legacy"):
            _add_counter_columns(conn)
        if kind == "stale":  # ours (proven by inspect): only our own tables go
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'cuforge!_%' "
                "ESCAPE '!'"
            ).fetchall():
                conn.execute(f'DROP TABLE IF EXISTS "{name}"')
        if kind == "legacy":
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        elif kind != "ours":
            for statement in _DDL:
                conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if kind == "ours":  # a peer made it ours meanwhile
        return "ok"
    if kind != "legacy" and (
        kind == "stale" or conn.execute("PRAGMA auto_vacuum").fetchall()[0][0] != 2
    ):
        # Give back the old tables' pages, and make later evictions able to shrink the file.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("VACUUM")
    _header_now(conn)
    return {"stale": "rebuilt", "legacy": "marked"}.get(kind, "created")


def _migrate(conn: Any, path: str) -> str:
    """Bring a revision-2 file to revision 3 in place (``_add_counter_columns``, under
    the write lock, looked at again there); "migrated", or "ok" when nothing was left
    to add or a peer held the write lock past the connection's timeout (this handle
    then uses the columns there are, and a later open adds the rest: an upgrade
    never makes a cache unusable)."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except Exception as exc:  # sqlite3.OperationalError
        if is_busy(exc):
            return "ok"
        raise
    try:
        kind, detail = inspect(conn)
        _refuse(kind, detail, path)
        added = kind in ("ours", "legacy") and _add_counter_columns(conn)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return "migrated" if added else "ok"


def _refuse(kind: str, detail: str, path: str) -> None:
    """Raise for a file this cuforge must not write: another program's, or a newer
    cuforge's layout."""
    if kind == "foreign":
        raise _foreign(path, detail)
    if kind == "newer":
        raise NewerSchemaError(path, int(detail))


def _add_counter_columns(conn: Any) -> bool:
    """Add the counter columns a revision-2 file lacks (revision 3), in order, in the
    caller's write transaction: one ``ALTER TABLE ... ADD COLUMN`` each, which SQLite
    makes without rewriting a row (a default of 0), so entries and counters stay.
    Whether any was added."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(cuforge_state)").fetchall()}
    missing = [c for c in STAT_COLUMNS if c not in have]
    for column in missing:
        conn.execute(f"ALTER TABLE cuforge_state ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
    return bool(missing)


def _header_now(conn: Any) -> None:
    """Copy the new first page from the WAL into the file (a passive checkpoint: it
    waits for nobody), so a legacy cache's new application id is in the file's header
    -- the proof ``owned_database`` reads -- from now on, not only after the next fold.
    Best effort: a reader on an older snapshot leaves it for the next checkpoint."""
    with contextlib.suppress(Exception):  # sqlite3.Error: the next checkpoint writes it
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()


def _switch_to_wal(conn: Any, wait_s: float, mark: bool = False) -> None:
    """Put the database in WAL mode, waiting at most ``wait_s`` for peers; with
    ``mark`` (a new file), first give it our application id while it is still in
    rollback mode, so the id is in the file's own header from the start (in WAL mode it
    would sit in the WAL until a checkpoint no reader holds back) -- the proof
    ``owned_database`` reads.

    Closes a race of processes opening a new file together: the switch reads the file,
    then needs its write lock; while a peer holds that lock (its own switch, or its
    schema transaction) SQLite answers SQLITE_BUSY at once, without its busy handler
    (a reader waiting for a writer could deadlock). One of two openers then found the
    cache "locked" in milliseconds and served misses for its whole life, storing and
    counting nothing. Busy is retried here until the peer's switch is seen or
    ``wait_s`` passes; other errors raise.
    """
    deadline = time.monotonic() + wait_s
    delay = 0.001
    while True:
        try:
            if mark and conn.execute("PRAGMA application_id").fetchall()[0][0] != APPLICATION_ID:
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            if conn.execute("PRAGMA journal_mode").fetchall()[0][0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except Exception as exc:  # sqlite3.OperationalError; only busy is retried
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _foreign(path: str, detail: str) -> ForeignDatabaseError:
    return ForeignDatabaseError(path, f"another program's SQLite database: {detail}")


def move_aside(path: str) -> str:
    """Rename a damaged database (and its WAL) to ``<path>.corrupt-<timestamp>``.

    Only for a file ``owned_database`` proved ours: callers go through
    ``ownership.delete_owned`` with that proof (``_open._move_aside_if_ours``)."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    dest = f"{path}.corrupt-{stamp}"
    n = 1
    while os.path.lexists(dest):
        n += 1
        dest = f"{path}.corrupt-{stamp}-{n}"
    os.rename(path, dest)
    for suffix in ("-wal", "-journal"):
        if os.path.lexists(path + suffix):
            os.rename(path + suffix, dest + suffix)
    if os.path.lexists(path + "-shm"):
        os.unlink(path + "-shm")  # an index of the WAL: rebuilt from it when needed
    return dest


def _code(exc: BaseException) -> int:
    return getattr(exc, "sqlite_errorcode", -1) & 0xFF


def is_corruption(exc: BaseException) -> bool:
    """SQLITE_CORRUPT or SQLITE_NOTADB: the file itself is damaged."""
    code = _code(exc)
    if code in (11, 26):
        return True
    text = str(exc)
    return code == 0xFF and ("malformed" in text or "not a database" in text)


def is_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED: another connection held a lock past the timeout."""
    code = _code(exc)
    if code in (5, 6):
        return True
    return code == 0xFF and ("locked" in str(exc) or "busy" in str(exc))
