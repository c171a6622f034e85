"""One entry as one byte string: header, integrity digest, metadata, payload.

The layout of every backend that stores an entry as a single value (a Redis
string, an S3 object, a file of the example driver). Each names its own magic and
digest person, so a value of one cannot pass for another's. Layout (version 1),
integers little-endian::

    offset  size
     0       4   magic (b"CFRE" Redis, b"CFS3" S3, ...)
     4       1   layout version (1)
     5       1   digest algorithm (1 = blake2b-128)
     6       2   reserved, zero
     8       8   stored_ns: wall-clock nanoseconds of the store
    16       4   meta_len
    20       8   payload_len
    28      16   digest: blake2b-128 (the frame's person) of the key digest
                 (32 bytes), bytes 0..27, the metadata and the payload
    44       -   metadata (meta_len bytes), then the payload (payload_len bytes)

A lookup is one read of one value; metadata comes before the payload, so a listing
reads it with one ranged read of the first few KiB, and a batched reader can take a
value in two, cut before its payload (:meth:`Frame.cut`), and check it as it came
(:meth:`Frame.unpack_cut`: the same digest, the payload not copied). The digest binds the value to
its key (a value copied under another key's name fails) and catches truncation and
damage; it is no signature (``signing`` covers writers who can write the medium).
Nothing here is ever executed or unpickled.
"""

from __future__ import annotations

import hashlib
import struct

from .entry import CacheEntry

__all__ = ["PREFIX_SIZE", "Frame"]

VERSION = 1
_ALG_BLAKE2B_128 = 1
_HEADER = struct.Struct("<4sBBHQIQ")
_DIGEST_SIZE = 16
#: Bytes before the metadata: header + digest.
PREFIX_SIZE = _HEADER.size + _DIGEST_SIZE
# Never believe a header that claims more metadata than this.
_MAX_META = 16 << 20
#: A listing reads this much of each value: the header and typical metadata.
LISTING_HEAD = 4096
_MISMATCH = "digest mismatch (payload or metadata damaged, or stored under another key)"


class Frame:
    """The layout above under ``magic`` (4 bytes) and digest ``person``; ``noun``
    names a value in messages ("value", "object")."""

    __slots__ = ("magic", "noun", "person")

    def __init__(self, magic: bytes, person: bytes, noun: str) -> None:
        self.magic = magic
        self.person = person
        self.noun = noun

    def _digest(
        self, kd: bytes, header: bytes | memoryview, meta: bytes | memoryview,
        payload: bytes | memoryview,
    ) -> bytes:  # fmt: skip
        h = hashlib.blake2b(kd, digest_size=_DIGEST_SIZE, person=self.person)
        h.update(header)
        h.update(meta)
        h.update(payload)
        return h.digest()

    def pack(self, kd: bytes, payload: bytes, meta: bytes, stored_ns: int) -> bytes:
        """The value for ``payload`` + ``meta`` stored under key digest ``kd``."""
        header = _HEADER.pack(
            self.magic, VERSION, _ALG_BLAKE2B_128, 0, stored_ns, len(meta), len(payload)
        )
        return b"".join((header, self._digest(kd, header, meta, payload), meta, payload))

    def unpack(self, kd: bytes, value: bytes) -> CacheEntry | str:
        """The verified entry in ``value``, or one line saying what is wrong with it."""
        noun = self.noun
        if len(value) < PREFIX_SIZE:
            return f"{noun} is {len(value)} bytes, shorter than the {PREFIX_SIZE}-byte header"
        magic, version, alg, _, _, meta_len, payload_len = _HEADER.unpack_from(value)
        if magic != self.magic:
            return "not a cuforge entry (bad magic)"
        if version != VERSION or alg != _ALG_BLAKE2B_128:
            return f"unknown entry layout {version}/{alg} (written by another cuforge version)"
        whole = PREFIX_SIZE + meta_len + payload_len
        if len(value) != whole:
            return f"{noun} is {len(value)} bytes, its header says {whole}"
        view = memoryview(value)
        end = PREFIX_SIZE + meta_len
        want = self._digest(kd, view[: _HEADER.size], view[PREFIX_SIZE:end], view[end:])
        if want != value[_HEADER.size : PREFIX_SIZE]:
            return _MISMATCH
        return CacheEntry(value[end:], value[PREFIX_SIZE:end])

    def unpack_cut(self, kd: bytes, head: bytes, tail: bytes) -> CacheEntry | str:
        """:meth:`unpack` of ``head + tail``, a value a reader cut where :meth:`cut`
        said: the payload is ``tail`` itself, not a copy of it (a value not cut there,
        or not of this layout, is joined and unpacked: the same answer)."""
        if len(head) != self.cut(head, len(head) + len(tail)):
            return self.unpack(kd, head + tail)
        _, version, alg, _, _, _, _ = _HEADER.unpack_from(head)
        if version != VERSION or alg != _ALG_BLAKE2B_128:
            return self.unpack(kd, head + tail)
        view = memoryview(head)
        want = self._digest(kd, view[: _HEADER.size], view[PREFIX_SIZE:], tail)
        if want != head[_HEADER.size : PREFIX_SIZE]:
            return _MISMATCH
        return CacheEntry(tail, head[PREFIX_SIZE:])

    def cut(self, head: bytes, size: int) -> int:
        """Where a value of ``size`` bytes that starts with ``head`` (at least
        ``PREFIX_SIZE`` bytes) ends before its payload, when its header says so and
        adds up to ``size``; else 0 (read it whole). A reader that cuts there hands
        :meth:`unpack_cut` the payload as its own string."""
        if len(head) < PREFIX_SIZE or head[:4] != self.magic:
            return 0
        _, _, _, _, _, meta_len, payload_len = _HEADER.unpack_from(head)
        end = PREFIX_SIZE + meta_len
        return end if end + payload_len == size else 0

    def peek(self, head: bytes) -> tuple[int, int] | None:
        """``(stored_ns, meta_len)`` from the first bytes of a value (unverified), or None."""
        if len(head) < PREFIX_SIZE or head[:4] != self.magic:
            return None
        _, _, _, _, stored_ns, meta_len, _ = _HEADER.unpack_from(head)
        return None if meta_len > _MAX_META else (stored_ns, meta_len)

    def meta_of(self, head: bytes) -> tuple[int, bytes | None, int]:
        """From a value's first bytes: ``(stored_ns, metadata, bytes needed)`` -- the
        metadata is None (and ``bytes needed`` says how many to read) when ``head``
        is too short for it; ``stored_ns`` 0 when the head is no frame of this kind."""
        peeked = self.peek(head)
        if peeked is None:
            return 0, None, 0
        end = PREFIX_SIZE + peeked[1]
        return peeked[0], (head[PREFIX_SIZE:end] if len(head) >= end else None), end
