"""A FileStream cache's entries by public id: listing, checking, reading and removing
them, and the foreign objects ``cuforge cache verify`` reports (``ls``, ``verify``,
``show``, ``prune``; never a hit path).

Mixed into :class:`cuforge.storage.filestream.FileStreamProgramCache`, which
supplies the names, reads and removals declared below. Reads by id go through the
cache's own verified read (``_pairread``); listing and the foreign-object scan load
``_entries`` and ``_scan`` on first use, so a cache hit never imports them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from .._fsutil import DIR_FD
from ..entry import CacheEntry, EntryInfo
from ._anchor import EntriesAnchor
from ._owned import entry_file_at, is_entry_file, is_shard, remove_foreign_owned
from ._pairread import Mismatch, PairNames, read_pair

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from ._hitmemo import HitMemo

__all__ = ["EntriesById"]


class EntriesById:
    """Listing and maintenance by entry id (a mixin: the handle supplies the state
    and helpers declared here)."""

    _entries: str
    _anchor: EntriesAnchor
    _memo: HitMemo
    _owned: bool

    def _check_open(self) -> None:
        raise NotImplementedError

    def _check_writable(self) -> None:
        raise NotImplementedError

    def _names_of_id(self, entry_id: str) -> PairNames:
        raise NotImplementedError

    def _read_failed(self, exc: OSError) -> None:
        raise NotImplementedError

    def _remove_by_names(self, names: PairNames) -> tuple[int, bool]:
        raise NotImplementedError

    def _ledger_add(self, delta: int) -> int:
        raise NotImplementedError

    def iter_entries(self) -> Iterator[EntryInfo]:
        """Entries with both files present; ``meta`` read from each sidecar."""
        self._check_open()
        from ._entries import list_entries

        yield from list_entries(self._entries)

    def check_entry(self, entry_id: str) -> str | None:
        self._check_open()
        result = read_pair(self._names_of_id(entry_id), None, self._read_failed, self._anchor)
        if result is None:
            raise KeyError(entry_id)
        return result.problem if type(result) is Mismatch else None

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        self._check_open()
        try:
            names = self._names_of_id(entry_id)
        except KeyError:
            return None
        result = read_pair(names, None, self._read_failed, self._anchor)
        return result if type(result) is CacheEntry else None

    def remove_entry(self, entry_id: str) -> bool:
        self._check_writable()
        try:
            names = self._names_of_id(entry_id)
        except KeyError:
            return False
        self._memo.forget(names.payload)
        freed, removed = self._remove_by_names(names)
        if freed:
            with contextlib.suppress(OSError):
                self._ledger_add(-freed)
        return removed

    def foreign_objects(self) -> list[tuple[str, str]]:
        """``(path, what)`` of every object under ``entries/`` that is not the cache's: a
        FIFO, socket, device, link or directory where an entry file belongs, anything
        but a directory where a shard belongs (``cuforge cache verify`` lists them).
        Paths are relative to ``entries/``; nothing is opened."""
        self._check_open()
        from ._scan import find_foreign

        return find_foreign(self._entries)

    def remove_foreign_object(self, path: str) -> bool:
        """Remove one object :meth:`foreign_objects` named (a directory with what it
        holds; links are removed, never followed). Whether it went; a regular entry
        file is never removed here, nor anything at a name that is not the layout's
        (a shard's, an entry file's) or in a root not proven the cache's."""
        self._check_writable()
        shard, _, name = path.partition("/")
        if not is_shard(shard) or (name and not is_entry_file(name)):
            return False
        owned, where = self._owned, self._entries
        try:
            if not DIR_FD:
                full = os.path.join(where, shard, name) if name else None
                return full is not None and remove_foreign_owned(
                    owned, full, None, entry_file_at, where
                )
            if not name:
                return remove_foreign_owned(
                    owned, shard, self._anchor.entries_fd(), is_shard, where, files_too=True
                )
            dfd = self._anchor.shard(shard)
        except OSError:
            return False
        try:
            return remove_foreign_owned(owned, name, dfd, is_entry_file, where)
        finally:
            os.close(dfd)
