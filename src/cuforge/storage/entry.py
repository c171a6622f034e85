"""What a cache stores per key: a payload, a small metadata record, and its public id.

Every backend stores an entry as ``(payload, meta)``: the payload is the raw
compiled binary (cubin/PTX/LTO-IR, or any bytes a caller stores), ``meta`` is a
small opaque byte string kept with it and covered by the same integrity check
(``b""`` when the caller gave none). ``Program.compile(cache=)`` puts a versioned
record there (see :mod:`cuforge.storage.record`): target, arch, source name,
compiler build, symbol mapping, the inputs that made the key.

Entries are named in listings by :func:`entry_id` -- the hex blake2b-256 of the
key -- on every backend, so ``cuforge cache ls`` prints the same id for the same
compile whether the entry sits in a directory, a database or Redis.
"""

from __future__ import annotations

from collections import namedtuple

from cuforge._hashing import blake2b

__all__ = ["CacheEntry", "EntryInfo", "entry_id", "is_entry_id", "key_digest"]


# collections.namedtuple rather than typing.NamedTuple: typing costs a cold process
# ~5 ms of imports, and a cache hit from a fresh process needs these types.
class CacheEntry(namedtuple("CacheEntry", ["data", "meta"])):
    """A verified entry: the payload bytes and the metadata stored with them."""

    __slots__ = ()
    data: bytes
    meta: bytes


class EntryInfo(namedtuple("EntryInfo", ["id", "size", "stored_ns", "used_ns", "meta"])):
    """One entry as a listing sees it (not verified; see ``check_entry``).

    ``stored_ns`` and ``used_ns`` are wall-clock nanoseconds of the last store and
    the last read (a backend that cannot tell gives its best estimate). ``meta`` is
    the stored metadata, or None when it could not be read.
    """

    __slots__ = ()
    id: str
    size: int
    stored_ns: int
    used_ns: int
    meta: bytes | None


def key_digest(key: bytes) -> bytes:
    """The 32-byte digest that names ``key`` on every backend."""
    return blake2b(key, digest_size=32).digest()


def entry_id(key: bytes) -> str:
    """The public id of ``key``'s entry: 64 hex digits."""
    return blake2b(key, digest_size=32).hexdigest()


def is_entry_id(text: str) -> bool:
    """Whether ``text`` has the form of an entry id: 64 lowercase hex digits."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)
