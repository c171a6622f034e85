"""Listing and bulk maintenance of a Redis cache: ``len``, ``clear``, entries by id.

Each is a SCAN of the server under this handle's prefix (never a hit path), so
it lives apart from :class:`cuforge.storage.redis.RedisProgramCache`, which mixes
it in; errors of the server become one ConnectionError (``_maintenance``).

Ownership: the prefix may be shared with other programs' keys (``myapp:`` holding
``myapp:{cart:42}`` and ``myapp:notes``). ``clear`` and ``remove_entry`` go through
:func:`~cuforge.storage.ownership.delete_owned`: a key is removed only when its name
is exactly an entry name of this prefix (``<prefix>{<64 lowercase hex digits>}``)
and it holds a string -- the type checked on the server in the same script that
unlinks it. A string under an entry name is this cache's even when it does not
verify (an emptied or damaged entry: ``verify`` names it, ``--fix`` removes it), so
``ls``, ``stats`` and ``clear`` agree on what the entries are. Reads here never
count as a use of an entry (``_quiet``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from ..entry import CacheEntry, EntryInfo
from ..ownership import delete_owned
from . import _frame as frame
from ._quiet import QuietReads, by_node

__all__ = ["SCAN_COUNT", "UNLINK_STRING", "EntryListing", "is_entry_id"]

SCAN_COUNT = 500

#: Unlink KEYS[1] if it holds a string (what an entry is); 1 if it went. A hash or
#: list under an entry's name is someone else's, and stays.
UNLINK_STRING = """
if redis.call('type', KEYS[1])['ok'] == 'string' then
    return redis.call('unlink', KEYS[1])
end
return 0
"""


def is_entry_id(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class EntryListing:
    """The listing half of RedisProgramCache (a mixin: the handle supplies the
    connection, names and checks declared below)."""

    __slots__ = ()

    _quiet: QuietReads
    _cluster: bool
    _where: str
    _prefix: str
    _pre: bytes

    # Supplied by RedisProgramCache.
    def _conn(self) -> Any:
        raise NotImplementedError

    def _maintenance(self, what: str) -> AbstractContextManager[None]:
        raise NotImplementedError

    def _entry_name(self, kd: bytes) -> bytes:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _check_writable(self) -> None:
        raise NotImplementedError

    def _id_of(self, name: bytes) -> str | None:
        """The entry id ``name`` is the entry name of, or None: the ownership proof of
        an entry key (exactly ``<prefix>{<64 lowercase hex digits>}``)."""
        if not name.startswith(self._pre):
            return None
        inner = name[len(self._pre) :]
        if len(inner) != 66 or inner[:1] != b"{" or inner[-1:] != b"}":
            return None
        eid = inner[1:-1].decode("ascii", "replace")
        return eid if is_entry_id(eid) else None

    def _names(self) -> Iterator[bytes]:
        """Every string key the SCAN pattern ``<prefix>{*}`` matches: candidates,
        which ``_id_of`` proves or not."""
        match = _glob_escape(self._prefix) + "{*}"
        yield from self._conn().scan_iter(match=match, count=SCAN_COUNT, _type="string")

    def __len__(self) -> int:
        """Entries under this prefix: the strings under entry names (a SCAN)."""
        self._check_open()
        with self._maintenance("count entries"):
            return sum(1 for name in self._names() if self._id_of(name) is not None)

    def clear(self) -> None:
        """Remove every entry under this prefix (SCAN + an owned unlink of each);
        counters, locks and every key that is not provably an entry stay."""
        self._check_writable()
        with self._maintenance("clear"):
            batch: list[bytes] = []
            for name in self._names():
                batch.append(name)
                if len(batch) >= SCAN_COUNT:
                    self._remove_owned(batch)
                    batch = []
            self._remove_owned(batch)

    def _remove_owned(self, names: list[bytes]) -> int:
        """Unlink the names that are entries of this cache (``delete_owned``: the
        name parses; the server checks it holds a string as it unlinks); how many went."""
        return delete_owned(
            names, lambda name: self._id_of(name) is not None, self._unlink_strings, self._where
        ).removed

    def _unlink_strings(self, names: list[bytes]) -> int:
        removed = 0
        for node, some in by_node(self._conn(), self._cluster, names):
            pipe = node.pipeline(transaction=False)
            for name in some:  # a script per key: one slot each
                pipe.eval(UNLINK_STRING, 1, name)
            removed += sum(int(n) for n in pipe.execute())
        return removed

    def iter_entries(self) -> Iterator[EntryInfo]:
        """Entries under this prefix with size, store time, last use and metadata.

        The last use is the server's idle time of the key: reading the entries here
        does not reset it where the server has ``CLIENT NO-TOUCH`` (Redis 7.2; see
        ``_quiet``). Keys under the prefix that are no entry names are left out.
        """
        self._check_open()
        with self._maintenance("list entries"):
            client = self._conn()
            batch: list[bytes] = []
            for name in self._names():
                if self._id_of(name) is None:
                    continue
                batch.append(name)
                if len(batch) >= 100:
                    yield from self._describe(client, batch)
                    batch = []
            yield from self._describe(client, batch)

    def _describe(self, client: Any, names: list[bytes]) -> Iterator[EntryInfo]:
        for node, some in by_node(client, self._cluster, names):
            yield from frame.describe(node, some, self._id_of, self._quiet)

    def _value_of_id(self, entry_id: str) -> tuple[bytes, bytes | None]:
        """The value stored for ``entry_id``, read without counting as a use."""
        if not isinstance(entry_id, str) or not is_entry_id(entry_id):
            return b"", None
        kd = bytes.fromhex(entry_id)
        name = self._entry_name(kd)
        with self._maintenance("read an entry"):
            ((node, _),) = by_node(self._conn(), self._cluster, [name])
            (value,) = self._quiet.run(node, lambda pipe: pipe.get(name))
            if isinstance(value, Exception):
                raise value
            return kd, value

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
        """Remove the entry listed as ``entry_id``; False when there is none (or the
        key of that name holds no string: not one of this cache's)."""
        self._check_writable()
        if not isinstance(entry_id, str) or not is_entry_id(entry_id):
            return False
        with self._maintenance("remove an entry"):
            return self._remove_owned([self._entry_name(bytes.fromhex(entry_id))]) == 1

    @property
    def size_bytes(self) -> int:
        """Sum of the entry values' sizes (a SCAN of the server)."""
        return sum(e.size for e in self.iter_entries())
