"""Digest sidecars: integrity for raw payload files without framing them.

A file-stream entry is two files: the payload (the compiled binary, untouched,
so cuobjdump/nvdisasm read it directly) and a 56-byte sidecar next to it::

    magic "CFS1" | algorithm (1 byte) + 3 zero bytes | payload length (u64 LE)
    | CRC-32 of the payload seeded with the key digest (u32 LE) | 4 zero bytes
    | key digest (32 bytes)

A reader accepts an entry only when the sidecar equals the one it would write for
the bytes it read under the key it asked for. That catches truncated and empty
payloads exactly (length), a payload or sidecar moved to another key's path
exactly (key digest in the sidecar) or with probability 1 - 2**-32 (payload
alone: the CRC is seeded per key), and bit flips (CRC-32 detects every burst of
up to 32 bits, and random damage with probability 1 - 2**-32). This guards
against accidents -- crashes, torn copies, bad disks -- not against someone who
can write the cache directory, who could write a matching sidecar too. CRC-32 is
used rather than a cryptographic hash because it costs ~1 us per 4 KiB where
blake2b costs ~5, and the hit path budget is 10 us; the algorithm byte leaves
room to change it.
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["SIDECAR_SIZE", "SIDECAR_SUFFIX", "key_seed", "payload_size", "sidecar_for"]

SIDECAR_SUFFIX = ".cfsum"
_MAGIC = b"CFS1"
_ALG_CRC32 = 1
_HEADER = struct.Struct("<4sB3xQI4x")
KEY_DIGEST_SIZE = 32
SIDECAR_SIZE = _HEADER.size + KEY_DIGEST_SIZE


def key_seed(key_digest: bytes) -> int:
    """The CRC seed that binds a payload to its key."""
    return zlib.crc32(key_digest)


def sidecar_for(key_digest: bytes, seed: int, payload: bytes) -> bytes:
    """The exact sidecar bytes for ``payload`` stored under ``key_digest``."""
    return _HEADER.pack(_MAGIC, _ALG_CRC32, len(payload), zlib.crc32(payload, seed)) + key_digest


# Never allocate more than this on the say-so of a (possibly damaged) sidecar.
_MAX_TRUSTED_SIZE = 1 << 32


def payload_size(sidecar: bytes) -> int:
    """The payload length a sidecar claims, or 0 if it is not a plausible sidecar
    (the pair then fails verification anyway)."""
    if len(sidecar) != SIDECAR_SIZE:
        return 0
    size = int.from_bytes(sidecar[8:16], "little")
    return size if size <= _MAX_TRUSTED_SIZE else 0
