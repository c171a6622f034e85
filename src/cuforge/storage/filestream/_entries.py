"""File-stream entries by their public id: listing them, removing one, and the foreign
objects ``cuforge cache verify`` reports.

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

from .._fsutil import DIR_FD, O_NOFOLLOW, Fingerprint, fingerprint
from .._integrity import SIDECAR_READ, SIDECAR_SIZE, SIDECAR_SUFFIX, parse_sidecar
from ..entry import EntryInfo, is_entry_id
from ._anchor import EntriesAnchor
from ._owned import entry_file_at, is_entry_file, is_shard, remove_foreign_owned, unlink_owned
from ._pairread import PairNames
from ._scan import scan_entries

__all__ = [
    "list_entries",
    "read_meta",
    "remove_foreign_object",
    "remove_names",
    "remove_pair",
    "unlink_pair",
]

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


def remove_pair(
    payload: str, sidecar: str, owned: bool, dir_fd: int | None = None
) -> tuple[int, bool]:
    """Remove both files as they stand now (each stat-guarded, through the ownership
    gate: ``owned`` is the root's proof; relative to ``dir_fd`` when given, following
    no link); ``(bytes freed, whether the payload went)``. OS errors leave a file in
    place."""
    freed = 0
    removed = False
    for path in (payload, sidecar):
        with contextlib.suppress(OSError):
            st = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
            if unlink_owned(owned, path, fingerprint(st), dir_fd, entry_file_at, path):
                freed += st.st_size
                removed = removed or path == payload
    return freed, removed


def remove_names(anchor: EntriesAnchor, names: PairNames, owned: bool) -> tuple[int, bool]:
    """:func:`remove_pair` of an entry's two files, relative to its shard's no-follow
    descriptor where the platform allows."""
    if not DIR_FD:
        return remove_pair(names.payload, names.sidecar, owned)
    try:
        dfd = anchor.shard(names.shard)
    except OSError:
        return 0, False
    try:
        return remove_pair(names.name, names.name + SIDECAR_SUFFIX, owned, dfd)
    finally:
        os.close(dfd)


def unlink_pair(
    anchor: EntriesAnchor,
    names: PairNames,
    payload_fp: Fingerprint,
    sidecar_fp: Fingerprint,
    owned: bool,
) -> int:
    """Remove a damaged pair's files if they are still the ones fingerprinted (a
    foreign object -- FIFO, directory, link -- in their place goes too), relative to
    the shard's no-follow descriptor, through the ownership gate; the bytes freed."""
    dfd = None
    where = os.path.dirname(os.path.dirname(names.payload))
    try:
        if DIR_FD:
            dfd = anchor.shard(names.shard)
        files = (names.name, names.name + SIDECAR_SUFFIX) if dfd is not None else names[:2]
        freed = 0
        for name, fp in zip(files, (payload_fp, sidecar_fp), strict=True):
            if unlink_owned(owned, name, fp, dfd, entry_file_at, where):
                freed += fp.size
            elif fp.ino >= 0:
                remove_foreign_owned(owned, name, dfd, entry_file_at, where, fp.ino)
        return freed
    except OSError:
        return 0
    finally:
        if dfd is not None:
            os.close(dfd)


def remove_foreign_object(anchor: EntriesAnchor, entries_dir: str, owned: bool, path: str) -> bool:
    """Remove one object ``_scan.find_foreign`` named (``path`` relative to ``entries/``;
    a directory with what it holds; links are removed, never followed). Whether it
    went; a regular entry file is never removed here, nor anything at a name that is
    not the layout's (a shard's, an entry file's) or in a root not proven the cache's."""
    shard, _, name = path.partition("/")
    if not is_shard(shard) or (name and not is_entry_file(name)):
        return False
    try:
        if not DIR_FD:
            full = os.path.join(entries_dir, shard, name) if name else None
            return full is not None and remove_foreign_owned(
                owned, full, None, entry_file_at, entries_dir
            )
        if not name:
            return remove_foreign_owned(
                owned, shard, anchor.entries_fd(), is_shard, entries_dir, files_too=True
            )
        dfd = anchor.shard(shard)
    except OSError:
        return False
    try:
        return remove_foreign_owned(owned, name, dfd, is_entry_file, entries_dir)
    finally:
        os.close(dfd)
