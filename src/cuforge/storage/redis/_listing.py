"""Listing and bulk maintenance of a Redis cache: ``len``, ``clear``, entries by id.

Each is a SCAN of the server under this handle's prefix (never a hit path), so
it lives apart from :class:`cuforge.storage.redis.RedisProgramCache`, which mixes
it in; errors of the server become one ConnectionError (``_maintenance``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..entry import CacheEntry, EntryInfo
from . import _frame as frame

__all__ = ["SCAN_COUNT", "EntryListing", "is_entry_id"]

SCAN_COUNT = 500


def is_entry_id(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class EntryListing:
    """The listing half of RedisProgramCache (a mixin: the handle supplies the
    connection, names and checks declared below)."""

    __slots__ = ()

    # Supplied by RedisProgramCache.
    def _conn(self) -> Any:
        raise NotImplementedError

    def _maintenance(self, what: str) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _names(self) -> Iterator[bytes]:
        raise NotImplementedError

    def _entry_name(self, kd: bytes) -> bytes:
        raise NotImplementedError

    def _id_of(self, name: bytes) -> str | None:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _check_writable(self) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        """Entries under this prefix (a SCAN of the server)."""
        self._check_open()
        with self._maintenance("count entries"):
            return sum(1 for _ in self._names())

    def clear(self) -> None:
        """Remove every entry under this prefix (SCAN + UNLINK); counters stay."""
        self._check_writable()
        with self._maintenance("clear"):
            client = self._conn()
            batch: list[bytes] = []
            for name in self._names():
                batch.append(name)
                if len(batch) >= SCAN_COUNT:
                    self._unlink(client, batch)
            self._unlink(client, batch)

    @staticmethod
    def _unlink(client: Any, names: list[bytes]) -> None:
        if names:
            pipe = client.pipeline(transaction=False)
            for name in names:  # one key per command: keys of a cluster live on many shards
                pipe.unlink(name)
            pipe.execute()
            names.clear()

    def iter_entries(self) -> Iterator[EntryInfo]:
        """Entries under this prefix with size, store time, idle time and metadata.

        Reading the metadata counts as a use for the server's LRU clock.
        """
        self._check_open()
        with self._maintenance("list entries"):
            client = self._conn()
            batch: list[bytes] = []
            for name in self._names():
                batch.append(name)
                if len(batch) >= 100:
                    yield from frame.describe(client, batch, self._id_of)
                    batch = []
            yield from frame.describe(client, batch, self._id_of)

    def _value_of_id(self, entry_id: str) -> tuple[bytes, bytes | None]:
        if not isinstance(entry_id, str) or not is_entry_id(entry_id):
            return b"", None
        kd = bytes.fromhex(entry_id)
        with self._maintenance("read an entry"):
            return kd, self._conn().get(self._entry_name(kd))

    def check_entry(self, entry_id: str) -> str | None:
        self._check_open()
        kd, value = self._value_of_id(entry_id)
        if value is None:
            raise KeyError(entry_id)
        result = frame.unpack(kd, value)
        return None if isinstance(result, CacheEntry) else result

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        self._check_open()
        kd, value = self._value_of_id(entry_id)
        result = None if value is None else frame.unpack(kd, value)
        return result if type(result) is CacheEntry else None

    def remove_entry(self, entry_id: str) -> bool:
        self._check_writable()
        if not isinstance(entry_id, str) or not is_entry_id(entry_id):
            return False
        with self._maintenance("remove an entry"):
            return bool(self._conn().delete(self._entry_name(bytes.fromhex(entry_id))))

    @property
    def size_bytes(self) -> int:
        """Sum of the entry values' sizes (a SCAN of the server)."""
        return sum(e.size for e in self.iter_entries())
