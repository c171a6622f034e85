"""The bytes of one S3 cache object: header, integrity digest, metadata, payload.

Layout (version 1), integers little-endian::

    offset  size
     0       4   magic b"CFS3"
     4       1   layout version (1)
     5       1   digest algorithm (1 = blake2b-128)
     6       2   reserved, zero
     8       8   stored_ns: wall-clock nanoseconds of the store
    16       4   meta_len
    20       8   payload_len
    28      16   blake2b-128 (person "cuforge-s3-1") of the key digest (32 bytes),
                 bytes 0..27, the metadata and the payload
    44       -   metadata, then payload

One object per entry, so a lookup is one GET and a store one conditional PUT.
The digest binds the object to its key (an object copied under another key's
name fails) and catches truncation and damage; it is no signature (signed caches
cover writers who can write the bucket). Metadata comes first so a listing reads
it with one ranged GET.
"""

from __future__ import annotations

import hashlib
import struct

from ..entry import CacheEntry

__all__ = ["PREFIX_SIZE", "pack", "peek", "unpack"]

MAGIC = b"CFS3"
VERSION = 1
_ALG = 1
_HEADER = struct.Struct("<4sBBHQIQ")
_DIGEST = 16
_PERSON = b"cuforge-s3-1"
#: Bytes before the metadata.
PREFIX_SIZE = _HEADER.size + _DIGEST
_MAX_META = 16 << 20


def _digest(kd: bytes, header: bytes | memoryview, meta: bytes | memoryview,
            payload: bytes | memoryview) -> bytes:  # fmt: skip
    h = hashlib.blake2b(kd, digest_size=_DIGEST, person=_PERSON)
    h.update(header)
    h.update(meta)
    h.update(payload)
    return h.digest()


def pack(kd: bytes, payload: bytes, meta: bytes, stored_ns: int) -> bytes:
    """The object body for ``payload`` + ``meta`` stored under key digest ``kd``."""
    header = _HEADER.pack(MAGIC, VERSION, _ALG, 0, stored_ns, len(meta), len(payload))
    return b"".join((header, _digest(kd, header, meta, payload), meta, payload))


def unpack(kd: bytes, body: bytes) -> CacheEntry | str:
    """The verified entry in ``body``, or one line saying what is wrong with it."""
    if len(body) < PREFIX_SIZE:
        return f"object is {len(body)} bytes, shorter than the {PREFIX_SIZE}-byte header"
    magic, version, alg, _, _, meta_len, payload_len = _HEADER.unpack_from(body)
    if magic != MAGIC:
        return "not a cuforge entry (bad magic)"
    if version != VERSION or alg != _ALG:
        return f"unknown entry layout {version}/{alg} (written by another cuforge version)"
    if len(body) != PREFIX_SIZE + meta_len + payload_len:
        return (
            f"object is {len(body)} bytes, its header says {PREFIX_SIZE + meta_len + payload_len}"
        )
    view = memoryview(body)
    end = PREFIX_SIZE + meta_len
    if (
        _digest(kd, view[: _HEADER.size], view[PREFIX_SIZE:end], view[end:])
        != body[_HEADER.size : PREFIX_SIZE]
    ):
        return "digest mismatch (payload or metadata damaged, or stored under another key)"
    return CacheEntry(body[end:], body[PREFIX_SIZE:end])


def peek(head: bytes) -> tuple[int, int] | None:
    """``(stored_ns, meta_len)`` from an object's first bytes (unverified), or None."""
    if len(head) < PREFIX_SIZE or head[:4] != MAGIC:
        return None
    _, _, _, _, stored_ns, meta_len, _ = _HEADER.unpack_from(head)
    return None if meta_len > _MAX_META else (stored_ns, meta_len)
