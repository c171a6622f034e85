"""The metadata record stored with each compiled entry, and reading one back.

Each entry carries a ``program`` record (see ``cuforge.storage.record``): code type,
target, arch, source name, compiler build, the flags, a digest of the source, the
headers a closed-world compile was given, and the name-expression mapping. The
payload stays raw cubin/PTX/LTO-IR for cuobjdump. ``cuforge cache ls/show/explain``
read the same record. A record this module cannot read gives None, never an error:
the pipeline then treats the entry as a miss.
"""

from __future__ import annotations

import time

from cuforge._hashing import blake2b
from cuforge.compile.cache._key import _BACKENDS
from cuforge.storage.record import decode_record, encode_record

TYPE_CHECKING = False  # typing is not imported at run time: a first compile(cache=) paid ~4 ms
if TYPE_CHECKING:
    from typing import Any

    from cuforge.compile.object_code import ObjectCode
    from cuforge.compile.program import ProgramSource

__all__ = [
    "LOG_MAX_CHARS",
    "decode_mapping",
    "manifest_record",
    "program_record",
    "stored_log",
    "stored_mapping",
]


def _encode_mapping(mapping: dict[str | bytes, str]) -> list[list[str]]:
    return sorted(
        ["b", k.hex(), v] if isinstance(k, bytes) else ["s", k, v] for k, v in mapping.items()
    )


def decode_mapping(items: Any) -> dict[str | bytes, str] | None:
    """The mapping a record holds, or None when it is not one we wrote."""
    if not isinstance(items, list):
        return None
    mapping: dict[str | bytes, str] = {}
    try:
        for item in items:
            if not (isinstance(item, list) and len(item) == 3):
                return None
            tag, name, mangled = item
            if tag not in ("s", "b") or not isinstance(name, str) or not isinstance(mangled, str):
                return None
            mapping[bytes.fromhex(name) if tag == "b" else name] = mangled
    except ValueError:  # bad hex
        return None
    return mapping


def stored_mapping(meta: bytes, names: tuple[str | bytes, ...]) -> dict[str | bytes, str] | None:
    """The name-expression mapping ``meta`` records for exactly ``names``; None when
    the record is missing, unreadable or maps other names (then the entry is a miss)."""
    record = decode_record(meta, "program")
    decoded = None if record is None else decode_mapping(record.get("symbols"))
    if decoded is None or set(decoded) != set(names):
        return None
    return decoded


#: The most of a compile log an entry keeps (a record is at most 1 MiB).
LOG_MAX_CHARS = 64 * 1024


def stored_log(meta: bytes) -> str:
    """The compile log a record keeps ("" when none, or not a record we wrote)."""
    record = decode_record(meta, "program")
    log = None if record is None else record.get("log")
    return log if isinstance(log, str) else ""


def program_record(
    src: ProgramSource,
    target: str,
    obj: ObjectCode,
    names: tuple[str | bytes, ...],
    headers: list[tuple[str, str]] | None = None,
    log: str = "",
) -> bytes:
    """The metadata stored with a compiled entry (see the module docstring).

    ``headers``: the (name, digest) pairs a closed-world compile was given; ``log``:
    the compiler's warnings (kept when not empty, up to ``LOG_MAX_CHARS``), written
    to ``logs`` again on every hit.
    """
    options = src.options
    backend = _BACKENDS[src.code_type]
    extra = {"log": log[:LOG_MAX_CHARS]} if log else {}
    return encode_record(
        "program",
        {
            **extra,
            "headers": [list(h) for h in headers or ()],
            "include_path": list(options.include_path or ()) if src.code_type == "c++" else [],
            "code_type": src.code_type,
            "target": target,
            "arch": options.arch,
            "name": options.name or "",
            "compiler": backend.describe(),
            "options": backend.option_fingerprint(options).decode("utf-8", "replace").split("\0"),
            "source": blake2b(src.code, digest_size=16).hexdigest(),
            "symbols": _encode_mapping(obj.symbol_mapping) if names else [],
            "created": int(time.time()),
        },
    )


def manifest_record(name: str, target: str, arch: str | None) -> bytes:
    """The metadata stored with a manifest entry (what ``cuforge cache ls`` shows)."""
    return encode_record(
        "manifest", {"name": name, "target": target, "arch": arch, "code_type": "c++"}
    )
