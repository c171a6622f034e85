"""Digest sidecars: integrity for raw payload files without framing them.

A file-stream entry is two files: the payload (the compiled binary, untouched,
so cuobjdump/nvdisasm read it directly) and a sidecar next to it that holds the
check and the entry's metadata::

    magic "CFS1" | algorithm (1 byte) + 3 zero bytes | payload length (u64 LE)
    | CRC-32 of payload then metadata, seeded with the key digest (u32 LE)
    | metadata length (u32 LE) | key digest (32 bytes) | metadata

An entry without metadata has a 56-byte sidecar (the metadata length is 0; this
is also exactly the layout of sidecars written before metadata existed). A reader
accepts an entry only when the sidecar equals the one it would write for the
payload and metadata it read under the key it asked for. That catches truncated
and empty payloads exactly (length), a payload or sidecar moved to another key's
path exactly (key digest in the sidecar) or with probability 1 - 2**-32 (payload
alone: the CRC is seeded per key), and bit flips in payload or metadata (CRC-32
detects every burst of up to 32 bits, and random damage with probability
1 - 2**-32). This guards against accidents -- crashes, torn copies, bad disks --
not against someone who can write the cache directory, who could write a
matching sidecar too (signed entries cover that). CRC-32 is used rather than a
cryptographic hash because it costs ~1 us per 4 KiB where blake2b costs ~5, and
the hit path budget is 10 us; the algorithm byte leaves room to change it.
"""

from __future__ import annotations

import struct
import zlib

__all__ = [
    "SIDECAR_READ",
    "SIDECAR_SIZE",
    "SIDECAR_SUFFIX",
    "key_seed",
    "mismatch_problem",
    "parse_sidecar",
    "sidecar_for",
]

SIDECAR_SUFFIX = ".cfsum"
_MAGIC = b"CFS1"
_ALG_CRC32 = 1
_HEADER = struct.Struct("<4sB3xQII")
KEY_DIGEST_SIZE = 32
#: Size of a sidecar without metadata (the fixed part of every sidecar).
SIDECAR_SIZE = _HEADER.size + KEY_DIGEST_SIZE
#: One read of this many bytes gets a whole sidecar with typical metadata.
SIDECAR_READ = 4096
# Metadata is small; never allocate more on the say-so of a damaged sidecar.
MAX_META_SIZE = 1 << 20
# Never allocate more than this on the say-so of a (possibly damaged) sidecar.
_MAX_TRUSTED_SIZE = 1 << 32


def key_seed(key_digest: bytes) -> int:
    """The CRC seed that binds a payload to its key."""
    return zlib.crc32(key_digest)


def sidecar_for(key_digest: bytes, seed: int, payload: bytes, meta: bytes = b"") -> bytes:
    """The exact sidecar bytes for ``payload`` and ``meta`` stored under ``key_digest``."""
    crc = zlib.crc32(payload, seed)
    if meta:
        crc = zlib.crc32(meta, crc)
    return _HEADER.pack(_MAGIC, _ALG_CRC32, len(payload), crc, len(meta)) + key_digest + meta


def parse_sidecar(sidecar: bytes) -> tuple[int, int]:
    """``(payload length, whole sidecar length)`` a sidecar claims; ``(0, 0)`` if it
    is not a plausible sidecar (the entry then fails verification anyway)."""
    if len(sidecar) < SIDECAR_SIZE or sidecar[:4] != _MAGIC:
        return 0, 0
    _, _, size, _, meta_len = _HEADER.unpack_from(sidecar)
    if size > _MAX_TRUSTED_SIZE or meta_len > MAX_META_SIZE:
        return 0, 0
    return size, SIDECAR_SIZE + meta_len


def mismatch_problem(sidecar: bytes, payload: bytes, key_digest: bytes) -> str:
    """Why ``sidecar`` and ``payload``, read under ``key_digest``, do not verify (one
    phrase for logs and ``check_entry``); call it only for a pair that failed."""
    size, total = parse_sidecar(sidecar)
    if total == 0:
        return "sidecar damaged (not a cuforge sidecar)"
    if len(sidecar) != total:
        return f"sidecar is {len(sidecar)} bytes, its header says {total}"
    if sidecar[SIDECAR_SIZE - KEY_DIGEST_SIZE : SIDECAR_SIZE] != key_digest:
        return "sidecar belongs to another key"
    if len(payload) != size:
        return f"payload is {len(payload)} bytes, sidecar says {size}"
    return "checksum mismatch (payload or metadata damaged)"


def sidecar_meta(sidecar: bytes) -> bytes:
    """The metadata bytes of a complete sidecar (unverified)."""
    return sidecar[SIDECAR_SIZE:]
