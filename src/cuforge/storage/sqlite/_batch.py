"""The SQLite cache's batched read: many entries in one query."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any
from zlib import crc32

from ..base import CacheKey
from ..entry import CacheEntry

__all__ = ["BatchRead", "get_entries"]

_U32 = 0xFFFFFFFF
_CHUNK = 500  # bound parameters per query (SQLite's limit is 999 on old builds)


def get_entries(cache: Any, keys: Iterable[CacheKey]) -> list[CacheEntry | None]:
    """``cache.get_entry`` of each key, the rows read by one SELECT (one read
    transaction, so one consistent snapshot) per 500 keys. A row that verifies is a
    hit counted here exactly as ``get_entry`` counts it; every other key (absent,
    damaged, kept back by a busy write lock, or a database that cannot be read) is
    handed to ``get_entry``, which counts the miss, drops a damaged row and answers a
    store this handle still holds back.
    """
    keys = list(keys)
    idents = [cache._ident(key) for key in keys]
    if cache._closed:
        raise ValueError("operation on a closed SQLiteProgramCache")
    rows: dict[int, tuple[Any, ...]] = {}
    if cache._broken is None and len(idents) > 1:
        rids = [rid for _kd, rid, _seed in idents]
        try:
            conn = cache._conns.get()
            for at in range(0, len(rids), _CHUNK):
                part = rids[at : at + _CHUNK]
                sql = (
                    "SELECT rid, digest, crc, meta, data FROM cuforge_entries WHERE rid IN ("
                    + ",".join("?" * len(part))
                    + ")"
                )
                for row in conn.execute(sql, part).fetchall():
                    rows[row[0]] = row[1:]
        except cache._error:
            rows = {}  # get_entry below meets the fault itself and handles it
    out: list[CacheEntry | None] = []
    stats = cache._stats
    pending = cache._pending
    for key, (kd, rid, seed) in zip(keys, idents, strict=True):
        row = rows.get(rid)
        if row is not None:
            digest, crc, meta, data = row
            if (
                type(data) is bytes
                and type(meta) is bytes
                and digest == kd
                and crc32(meta, crc32(data, (seed ^ len(data)) & _U32)) == crc
            ):
                stats.hits += 1
                stats.bytes_read += len(data)
                cache._ops += 1
                if rid not in pending:
                    pending[rid] = time.time_ns()
                out.append(CacheEntry(data, meta))
                continue
        out.append(cache.get_entry(key))
    return out


class BatchRead:
    """Mixes ``get_entries`` (one query for every key) into the SQLite cache."""

    def get_entries(self, keys: Iterable[CacheKey]) -> list[CacheEntry | None]:
        """The entries of ``keys`` in order, read by one query (see :func:`get_entries`)."""
        return get_entries(self, keys)
