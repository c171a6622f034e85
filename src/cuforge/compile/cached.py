"""``Program.compile(cache=...)``: compile through a ProgramCacheResource.

Guarantees:
- A hit returns a fresh ObjectCode equal to what the miss produced -- same bytes,
  code type, name and ``symbol_mapping`` -- without creating a compiler program.
- Concurrent misses of one key compile once: the filler holds the key's lock
  (``cache.lock``) while it compiles and stores; the others wait, look again and
  read its result. A holder that dies or outlasts the lock timeout costs the
  waiters a compile of their own, never a hang.
- The cache never breaks a compile: a failing lookup is a miss, a failing store is
  a ``CacheWriteWarning`` (once per cache) plus a ``write_failures`` count, and the
  compiled ObjectCode is returned either way.
- A PTX hit warns exactly as a fresh PTX compile does when the driver is older
  than the compiler that wrote it.

Name-expression results keep their mapping in a second entry (a small JSON document
under a key derived from the program's key), so payload entries stay raw
cubin/PTX/LTO-IR for cuobjdump. A hit needs both entries; one without the other is a
miss and is recompiled.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import TYPE_CHECKING, Any

from cuforge.compile import _versions
from cuforge.compile.cache_key import _digest
from cuforge.compile.object_code import ObjectCode

if TYPE_CHECKING:
    from cuforge.compile.program import Program

_WARNED_ATTR = "_cuforge_write_warned"


def symbols_key(key: bytes) -> bytes:
    """The key of the entry that holds ``key``'s symbol mapping."""
    return hashlib.blake2b(key, digest_size=32, person=b"cuforge-symbols").digest()


def _encode_mapping(mapping: dict[str | bytes, str]) -> bytes:
    items = [["b", k.hex(), v] if isinstance(k, bytes) else ["s", k, v] for k, v in mapping.items()]
    return json.dumps(sorted(items), separators=(",", ":")).encode()


def _decode_mapping(data: bytes) -> dict[str | bytes, str] | None:
    """The mapping in ``data``, or None when it is not one we wrote."""
    try:
        items = json.loads(data)
        if not isinstance(items, list):
            return None
        mapping: dict[str | bytes, str] = {}
        for item in items:
            if not (isinstance(item, list) and len(item) == 3):
                return None
            tag, name, mangled = item
            if tag not in ("s", "b") or not isinstance(name, str) or not isinstance(mangled, str):
                return None
            mapping[bytes.fromhex(name) if tag == "b" else name] = mangled
        return mapping
    except (ValueError, RecursionError):  # not JSON, bad hex, or nested too deep
        return None


def _lookup(cache: Any, key: bytes) -> bytes | None:
    try:
        return cache.get(key)
    except Exception as exc:  # a broken backend is a miss, never a failed compile
        _warn_once(cache, f"cache lookup failed ({type(exc).__name__}: {exc}); compiling")
        return None


def _warn_once(cache: Any, message: str) -> None:
    from cuforge.storage import CacheWriteWarning

    try:
        if getattr(cache, _WARNED_ATTR, False):
            return
        setattr(cache, _WARNED_ATTR, True)
    except AttributeError:
        pass
    # stacklevel 6: _warn_once -> _lookup/_store -> _hit/_fill -> compile_cached ->
    # Program.compile -> the caller.
    warnings.warn(message, CacheWriteWarning, stacklevel=6)


def _store(cache: Any, key: bytes, value: Any) -> None:
    try:
        cache[key] = value
    except Exception as exc:
        stats = getattr(cache, "_stats", None)
        if stats is not None and hasattr(stats, "write_failures"):
            stats.write_failures += 1
        _warn_once(
            cache,
            f"cache write failed ({type(exc).__name__}: {exc}); the program compiled and is "
            "returned, but was not cached",
        )


def _hit(
    cache: Any, key: bytes, target: str, name: str, names: tuple[str | bytes, ...]
) -> ObjectCode | None:
    data = _lookup(cache, key)
    if data is None:
        return None
    mapping: dict[str | bytes, str] = {}
    if names:
        raw = _lookup(cache, symbols_key(key))
        decoded = None if raw is None else _decode_mapping(raw)
        if decoded is None or set(decoded) != set(names):
            return None
        mapping = decoded
    obj = ObjectCode._trusted(data, target, name, mapping)
    if target == "ptx":
        # stacklevel 4: warn_if -> _hit -> compile_cached -> Program.compile -> caller.
        _versions.warn_if_ptx_unloadable(data, stacklevel=4)
    return obj


def compile_cached(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
) -> ObjectCode:
    """``program`` compiled to ``target`` through ``cache`` (see the module doc).

    Raises TypeError when ``cache`` is not a mapping-like program cache.
    """
    if not (callable(getattr(cache, "get", None)) and hasattr(cache, "__setitem__")):
        raise TypeError(
            "cache must be a cuforge.utils.ProgramCacheResource (get/__setitem__), got "
            f"{type(cache).__name__}"
        )
    if program._closed:  # a hit must not hide what an uncached compile would raise
        raise RuntimeError("Program is closed")
    options = program._options
    key = _digest(program._code_type, target, options, program._code, names, None)
    name = options.name or ""
    obj = _hit(cache, key, target, name, names)
    if obj is not None:
        return obj
    try:
        guard = cache.lock(key)
    except Exception:
        guard = None
    if guard is None:
        return _fill(program, target, names, logs, cache, key)
    with guard:
        # The look-again is the same request as the first lookup: count one outcome.
        _forget_last_miss(cache)
        obj = _hit(cache, key, target, name, names)
        if obj is not None:
            return obj
        return _fill(program, target, names, logs, cache, key)


def _forget_last_miss(cache: Any) -> None:
    stats = getattr(cache, "_stats", None)
    if stats is not None and getattr(stats, "misses", 0) > 0:
        stats.misses -= 1


def _fill(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
    key: bytes,
) -> ObjectCode:
    # stacklevel 5: _compile_uncached -> _fill -> compile_cached -> Program.compile -> caller.
    obj = program._compile_uncached(target, names, logs, stacklevel=5)
    if names:
        # Mapping first: a reader that sees the payload then finds its mapping.
        _store(cache, symbols_key(key), _encode_mapping(obj.symbol_mapping))
    _store(cache, key, obj.code)
    return obj


__all__ = ["compile_cached", "symbols_key"]
