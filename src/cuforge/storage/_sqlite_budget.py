"""How a SQLite cache's size cap is shared out, so database + WAL + WAL index stay in it.

The WAL gets an allowance of a 16th of the cap (16 KiB to 64 MiB; 64 MiB without a
cap), the WAL index what SQLite needs to index that many frames, and the database
file the rest (its *share*); eviction leaves the pages in use at ~90 % of the share.
The WAL stays in its allowance because every write transaction is kept to about a
quarter of it (rows per eviction, clear or use write-back batch) and the cache folds
the WAL into the database (a checkpoint) once its file passes half the allowance.
A checkpoint cannot restart the WAL while a reader still uses an older snapshot; the
WAL then grows until the reader finishes, and a checkpoint that cannot finish is
never an error (the next write tries again).
"""

from __future__ import annotations

__all__ = ["PAGE", "WAL_MAX", "Budget"]

WAL_MAX = 64 << 20
PAGE = 4096  # the page size every cache database is created with (_sqlite_schema)
_INDEX_BLOCK = 32768  # the WAL index grows by 32 KiB per 4096 WAL frames
_INDEX_FRAMES = 4096


class Budget:
    """The shares of one cap (``None``: no cap, only the WAL's allowance applies)."""

    __slots__ = ("cap", "fold_at", "rows", "share", "wal")

    def __init__(self, cap: int | None) -> None:
        self.cap = cap
        #: Bytes the WAL file may take.
        self.wal = WAL_MAX if cap is None else min(WAL_MAX, max(16384, cap // 16))
        #: The WAL file size past which the cache folds it in.
        self.fold_at = self.wal // 2
        #: Rows one write transaction of eviction, clear or use write-back may touch:
        #: row ids are key digests, so each row sits on a page of its own and a row
        #: deleted or touched writes about two pages to the WAL.
        self.rows = max(2, self.wal // PAGE // 8)
        index = _INDEX_BLOCK * (1 + self.wal // PAGE // _INDEX_FRAMES)
        #: Bytes the database file may take (``inf`` without a cap).
        self.share = float("inf") if cap is None else float(cap - self.wal - index)

    def file_share(self, index_bytes: int) -> float:
        """The database file's share, given the WAL index's size on disk now."""
        if self.cap is None:
            return float("inf")
        return float(self.cap - self.wal - max(index_bytes, _INDEX_BLOCK))

    def room(self, index_bytes: int, low_water: float) -> float:
        """Bytes of pages in use that eviction leaves: ``low_water`` of the cap, less
        what the WAL and its index are allowed."""
        assert self.cap is not None
        return self.file_share(index_bytes) - self.cap * (1 - low_water)

    def needs_work(self, db: int, wal: int) -> bool:
        """Whether files of these sizes call for eviction or a checkpoint."""
        return wal > self.fold_at or db > self.share
