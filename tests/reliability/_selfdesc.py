"""Values that describe their own key: any returned byte that is wrong is detectable.

``make(key, version, size)`` is ``MAGIC | blake2b-16(key) | version u32 | size u32 |
body``, where the body is a keystream of (key, version). ``problem(key, data)`` says
what is wrong with ``data`` as a value of ``key`` (None when it is one of ``key``'s
values, any version): another key's value, a truncated or extended one, a flipped
byte anywhere. Metadata is ``META | blake2b-16(key) | version``, checked the same way.
"""

from __future__ import annotations

import hashlib
import struct

MAGIC = b"CFSD"
META = b"CFSM"
_HEAD = struct.Struct("<4s16sII")


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=16).digest()


def _body(key: bytes, version: int, n: int) -> bytes:
    seed = hashlib.blake2b(key + version.to_bytes(4, "little"), digest_size=64).digest()
    return (seed * (n // 64 + 1))[:n]


def make(key: bytes, version: int, size: int) -> bytes:
    """A value of ``key`` with ``size`` bytes in all (at least the 28-byte header)."""
    n = max(0, size - _HEAD.size)
    return _HEAD.pack(MAGIC, _digest(key), version, n) + _body(key, version, n)


def problem(key: bytes, data: bytes) -> str | None:
    if len(data) < _HEAD.size:
        return f"{len(data)} bytes: shorter than a header"
    magic, digest, version, n = _HEAD.unpack_from(data)
    if magic != MAGIC:
        return "not a self-describing value"
    if digest != _digest(key):
        return "a value of another key"
    if len(data) != _HEAD.size + n:
        return f"length {len(data)} != {_HEAD.size + n} (partial or extended)"
    if data[_HEAD.size :] != _body(key, version, n):
        return "body bytes differ"
    return None


def make_meta(key: bytes, version: int) -> bytes:
    return META + _digest(key) + version.to_bytes(4, "little")


def meta_problem(key: bytes, meta: bytes) -> str | None:
    if len(meta) != 24 or meta[:4] != META:
        return f"metadata {meta[:24]!r} is not a self-describing record"
    if meta[4:20] != _digest(key):
        return "metadata of another key"
    return None


def version_of(data: bytes) -> int:
    return _HEAD.unpack_from(data)[2]
