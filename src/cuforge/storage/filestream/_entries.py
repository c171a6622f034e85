"""File-stream entries by their public id: listing them and removing one.

An entry's id is the 64 hex digits of its key digest, which are also its path
(``entries/<2 hex>/<62 hex>``), so an id maps to its files without any index.
Listing is a directory scan (``_scan``): only pairs with both files present are
listed, with their sizes, times and the metadata read from the sidecar. Reading
and checking by id go through the cache's own verified read.

Guarantees and failure modes: listing never verifies payloads (``check_entry``
does) and never raises for files that vanish meanwhile -- an unreadable sidecar
lists with ``meta=None``; removal is stat-guarded, so a pair a writer replaced
since it was looked at survives, and OS errors mean "not removed". Imported on
first use: a cache hit never loads it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from .._fsutil import O_NOFOLLOW, fingerprint, unlink_if_unchanged
from .._integrity import SIDECAR_READ, SIDECAR_SIZE, parse_sidecar
from ..entry import EntryInfo, is_entry_id
from ._scan import scan_entries

__all__ = ["list_entries", "read_meta", "remove_pair"]

_O_READ = os.O_RDONLY | O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)


def list_entries(entries_dir: str) -> Iterator[EntryInfo]:
    """Entries of ``entries_dir`` with both files present; ``meta`` read from each sidecar."""
    found, _ = scan_entries(entries_dir)
    for e in found:
        if e.payload is None or e.sidecar is None:
            continue
        assert e.payload_fp is not None and e.sidecar_fp is not None
        shard, name = os.path.split(e.payload)
        eid = os.path.basename(shard) + name
        if not is_entry_id(eid):
            continue
        yield EntryInfo(
            eid,
            e.payload_fp.size + e.sidecar_fp.size,
            e.payload_fp.mtime_ns,
            max(e.atime_ns, e.payload_fp.mtime_ns),
            read_meta(e.sidecar),
        )


def read_meta(sidecar: str) -> bytes | None:
    """The metadata a sidecar file holds (unverified), or None if unreadable."""
    try:
        with open(os.open(sidecar, _O_READ), "rb") as f:
            side = f.read(SIDECAR_READ)
            _, total = parse_sidecar(side)
            if len(side) < total:
                side += f.read(total - len(side))
    except OSError:
        return None
    return side[SIDECAR_SIZE:total] if total else None


def remove_pair(payload: str, sidecar: str, dir_fd: int | None = None) -> tuple[int, bool]:
    """Remove both files as they stand now (each stat-guarded; relative to ``dir_fd``
    when given, following no link); ``(bytes freed, whether the payload went)``. OS
    errors leave a file in place."""
    freed = 0
    removed = False
    for path in (payload, sidecar):
        with contextlib.suppress(OSError):
            st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
            if unlink_if_unchanged(path, fingerprint(st), dir_fd):
                freed += st.st_size
                removed = removed or path == payload
    return freed, removed
