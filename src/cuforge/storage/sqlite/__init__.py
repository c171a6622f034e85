"""A program cache in one SQLite database file, shared by threads and processes.

Files: ``<path>`` (the database), ``<path>-wal`` and ``<path>-shm`` (SQLite's WAL
and its index, present while the database is open), ``<path>.lock`` (record locks,
see ``_lock``; kept after close) and, only after SQLite reported damage,
``<path>.damaged``.
The schema is described in ``_schema``. Python's ``sqlite3`` is imported when
a cache is opened, so ``import cuforge`` works on interpreters built without it.

The handle is the storage core (``storage.handle``) over the SQLite driver
(``_driver``: reads, rows by id, locks, counters; ``_writes``: stores, their
deferral and the write-back of uses and counters).

This module imports nothing: its names load on first use, so that checking a
``sqlite://`` URL (``_url``, at every open of a tier that names one) costs only
that module, not the handle and the driver.
"""

from __future__ import annotations

from cuforge import _lazy

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._cache import SQLiteProgramCache as SQLiteProgramCache
    from ._open import default_db_path as default_db_path
    from ._schema import FOREIGN_WAY_OUT as FOREIGN_WAY_OUT
    from ._schema import DatabaseIsDirectoryError as DatabaseIsDirectoryError
    from ._schema import ForeignDatabaseError as ForeignDatabaseError
    from ._schema import NewerSchemaError as NewerSchemaError

__all__ = ["CacheRecoveryWarning", "SQLiteProgramCache", "default_db_path"]


class CacheRecoveryWarning(RuntimeWarning):
    """A cache found its storage damaged: it moved it aside and started empty, or,
    when it could not, serves misses (compiles still work)."""


__getattr__, __dir__ = _lazy.exports(
    __name__,
    {
        "SQLiteProgramCache": "cuforge.storage.sqlite._cache",
        "default_db_path": "cuforge.storage.sqlite._open",
        # raised by the constructor
        "DatabaseIsDirectoryError": "cuforge.storage.sqlite._schema",
        "ForeignDatabaseError": "cuforge.storage.sqlite._schema",
        "NewerSchemaError": "cuforge.storage.sqlite._schema",
        # the way out ForeignDatabaseError's message ends with (the CLI rewords it)
        "FOREIGN_WAY_OUT": "cuforge.storage.sqlite._schema",
    },
)
