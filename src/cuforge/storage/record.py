"""Small versioned records stored with (or as) cache entries: one encoding, no pickle.

A record is a JSON object with two reserved fields, ``"v"`` (the format version,
an int) and ``"kind"`` (a short string: ``"program"``, ``"manifest"``, ...). The
encoding is compact and deterministic (sorted keys), so equal records are equal
bytes. Cache contents may come from other users and hosts: decoding never
executes anything and rejects anything that is not such an object.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import Any

__all__ = ["KINDS", "RECORD_VERSION", "decode_record", "encode_record"]

#: The version written; readers accept records of this version only.
RECORD_VERSION = 1

#: Every ``kind`` cuforge writes: compiled programs and header manifests (the
#: compile layer); the integrations' entries (``cuforge.integrations``: Triton,
#: Inductor, CuPy, JAX); warm sets and their packs; the directory mirror's files and
#: indexes. A writer of a new kind adds it here, so ``cuforge cache ls --kind`` offers
#: it.
KINDS = (
    "program",
    "manifest",
    "triton",
    "inductor",
    "cupy",
    "jax",
    "warm-set",
    "warm-pack",
    "mirror",
    "mirror-index",
)

# Records are metadata: a few KiB at most. Refuse to parse anything huge.
_MAX_RECORD_BYTES = 16 << 20


def encode_record(kind: str, fields: dict[str, Any]) -> bytes:
    """``fields`` plus ``v`` and ``kind`` as compact, key-sorted JSON bytes.

    Raises TypeError/ValueError for values JSON cannot represent (bytes, sets,
    NaN) -- records hold str, int, bool, None, lists and dicts only.
    """
    if "v" in fields or "kind" in fields:
        raise ValueError("record fields must not set the reserved names 'v' or 'kind'")
    import json  # on use: a cache hit without name expressions never needs it

    body = {"v": RECORD_VERSION, "kind": kind, **fields}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def decode_record(data: bytes | None, kind: str | None = None) -> dict[str, Any] | None:
    """The record in ``data``, or None when it is not one we wrote (or not of ``kind``)."""
    if not data or len(data) > _MAX_RECORD_BYTES or data[:1] != b"{":
        return None
    import json

    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(body, dict) or body.get("v") != RECORD_VERSION:
        return None
    if not isinstance(body.get("kind"), str) or (kind is not None and body["kind"] != kind):
        return None
    return body
