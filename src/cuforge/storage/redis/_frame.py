"""The value of one Redis cache entry: header, integrity digest, metadata, payload.

Layout (version 1), all integers little-endian::

    offset  size
     0       4   magic b"CFRE"
     4       1   layout version (1)
     5       1   digest algorithm (1 = blake2b-128)
     6       2   reserved, zero
     8       8   stored_ns: wall-clock nanoseconds of the store
    16       4   meta_len
    20       8   payload_len
    28      16   digest: blake2b-128 (person "cuforge-redis-1") of
                 key digest (32 bytes) + bytes 0..27 + metadata + payload
    44       -   metadata (meta_len bytes), then the payload (payload_len bytes)

The whole entry is one Redis string, so a lookup is one GET. Metadata comes
before the payload so a listing reads it with one GETRANGE of the first few KiB.
The digest binds the value to its key (a value copied under another key's name
fails), and catches truncation and damage. It is not a signature: anyone who can
write to the server can write a matching digest (signed caches cover that).
Nothing here is ever executed or unpickled.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..entry import CacheEntry, EntryInfo
from ._quiet import QuietReads

__all__ = ["PREFIX_SIZE", "describe", "pack", "peek", "unpack"]

MAGIC = b"CFRE"
VERSION = 1
_ALG_BLAKE2B_128 = 1
_HEADER = struct.Struct("<4sBBHQIQ")
_DIGEST_SIZE = 16
_PERSON = b"cuforge-redis-1"
#: Bytes before the metadata: header + digest.
PREFIX_SIZE = _HEADER.size + _DIGEST_SIZE
# Never believe a header that claims more than this much metadata.
_MAX_META = 16 << 20
# A listing reads this much of each value: the header and typical metadata.
_LISTING_HEAD = 4096


def _digest(
    key_digest: bytes, header: bytes | memoryview, meta: bytes | memoryview,
    payload: bytes | memoryview,
) -> bytes:  # fmt: skip
    h = hashlib.blake2b(key_digest, digest_size=_DIGEST_SIZE, person=_PERSON)
    h.update(header)
    h.update(meta)
    h.update(payload)
    return h.digest()


def pack(key_digest: bytes, payload: bytes, meta: bytes, stored_ns: int) -> bytes:
    """The Redis value for ``payload`` + ``meta`` stored under ``key_digest``."""
    header = _HEADER.pack(MAGIC, VERSION, _ALG_BLAKE2B_128, 0, stored_ns, len(meta), len(payload))
    return b"".join((header, _digest(key_digest, header, meta, payload), meta, payload))


def unpack(key_digest: bytes, value: bytes) -> CacheEntry | str:
    """The verified entry in ``value``, or a one-line description of what is wrong."""
    if len(value) < PREFIX_SIZE:
        return f"value is {len(value)} bytes, shorter than the {PREFIX_SIZE}-byte header"
    magic, version, alg, _, _, meta_len, payload_len = _HEADER.unpack_from(value)
    if magic != MAGIC:
        return "not a cuforge entry (bad magic)"
    if version != VERSION or alg != _ALG_BLAKE2B_128:
        return f"unknown entry layout {version}/{alg} (written by another cuforge version)"
    if len(value) != PREFIX_SIZE + meta_len + payload_len:
        return (
            f"value is {len(value)} bytes, its header says {PREFIX_SIZE + meta_len + payload_len}"
        )
    view = memoryview(value)
    meta_end = PREFIX_SIZE + meta_len
    want = _digest(key_digest, view[: _HEADER.size], view[PREFIX_SIZE:meta_end], view[meta_end:])
    if want != value[_HEADER.size : PREFIX_SIZE]:
        return "digest mismatch (payload or metadata damaged, or stored under another key)"
    return CacheEntry(value[meta_end:], value[PREFIX_SIZE:meta_end])


def peek(head: bytes) -> tuple[int, int] | None:
    """``(stored_ns, meta_len)`` from the first bytes of a value (unverified), or None."""
    if len(head) < PREFIX_SIZE or head[:4] != MAGIC:
        return None
    _, _, _, _, stored_ns, meta_len, _ = _HEADER.unpack_from(head)
    if meta_len > _MAX_META:
        return None
    return stored_ns, meta_len


def _getrange(pipe: Any, name: bytes, end: int) -> None:
    pipe.getrange(name, 0, end - 1)


def describe(
    client: Any, names: list[bytes], id_of: Callable[[bytes], str | None], quiet: QuietReads
) -> Iterator[EntryInfo]:
    """Listing records for ``names`` (entry keys of the one server ``client`` talks
    to), read with one pipelined round trip (plus one GETRANGE per entry whose
    metadata outgrows the first read), without touching the keys (``_quiet``).

    A name that vanished since the SCAN is left out, and so is a key of another type
    (``clear`` leaves it too); a string value of any length that is still there is
    listed, even an empty one, so ``check_entry`` can name it damaged and
    ``remove_entry`` can remove it.
    """
    if not names:
        return

    def fill(pipe: Any) -> None:
        for name in names:
            pipe.object("idletime", name)  # never touches a key
            pipe.getrange(name, 0, _LISTING_HEAD - 1)
            pipe.strlen(name)
            pipe.exists(name)  # STRLEN and GETRANGE answer 0 / b"" for a vanished key too

    replies = quiet.run(client, fill)
    now = time.time_ns()
    for i, name in enumerate(names):
        idle, head, size, exists = replies[4 * i : 4 * i + 4]
        eid = id_of(name)
        if eid is None or isinstance(size, Exception) or exists != 1:
            continue
        peeked = peek(head) if isinstance(head, bytes) else None
        meta = None
        stored = now
        if peeked is not None:
            stored, end = peeked[0], PREFIX_SIZE + peeked[1]
            if end > len(head):
                (head,) = quiet.run(client, functools.partial(_getrange, name=name, end=end))
            meta = head[PREFIX_SIZE:end] if isinstance(head, bytes) and len(head) >= end else None
        used = now - int(idle) * 1_000_000_000 if isinstance(idle, int) else stored
        yield EntryInfo(eid, int(size), stored, max(used, stored), meta)
