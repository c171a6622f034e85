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

Each entry is stored with a ``program`` record as its metadata (see
``cuforge.storage.record``): code type, target, arch, source name, compiler build,
the flags, a digest of the source and the name-expression mapping. The payload
stays raw cubin/PTX/LTO-IR for cuobjdump. A hit with name expressions needs the
record's mapping to cover exactly the names asked for; anything else is a miss and
is recompiled. ``cuforge cache ls/show/explain`` read the same record.

Logging: the ``cuforge.cache`` logger records every hit, miss (with why) and store
at DEBUG (short entry id and source name); nothing above DEBUG on the hit path.
Fail-open events (lookup raised, store failed, and the backends' own: unwritable,
damaged or unreadable entries) are a WARNING once per cause and cache handle, then
DEBUG (``cuforge.storage.events``).
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cuforge._log import debug_enabled, get_logger
from cuforge.compile import _identity_store, _versions
from cuforge.compile._callers import outside_level
from cuforge.compile.cache_key import _BACKENDS, _digest
from cuforge.compile.object_code import ObjectCode
from cuforge.storage import events as _events
from cuforge.storage.base import ProgramCacheResource
from cuforge.storage.entry import CacheEntry, entry_id
from cuforge.storage.record import decode_record, encode_record

if TYPE_CHECKING:
    from cuforge.compile.program import Program

_WARNED_ATTR = "_cuforge_write_warned"
LOGGER = "cuforge.cache"  # logging is imported only once someone listens (see cuforge._log)


def _encode_mapping(mapping: dict[str | bytes, str]) -> list[list[str]]:
    return sorted(
        ["b", k.hex(), v] if isinstance(k, bytes) else ["s", k, v] for k, v in mapping.items()
    )


def _decode_mapping(items: Any) -> dict[str | bytes, str] | None:
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


def program_record(
    program: Program,
    target: str,
    obj: ObjectCode,
    names: tuple[str | bytes, ...],
    headers: list[tuple[str, str]] | None = None,
) -> bytes:
    """The metadata stored with a compiled entry (see the module docstring).

    ``headers``: the (name, digest) pairs a closed-world compile was given.
    """
    options = program._options
    backend = _BACKENDS[program._code_type]
    return encode_record(
        "program",
        {
            "headers": [list(h) for h in headers or ()],
            "include_path": list(options.include_path or ()) if program._code_type == "c++" else [],
            "code_type": program._code_type,
            "target": target,
            "arch": options.arch,
            "name": options.name or "",
            "compiler": backend.describe(),
            "options": backend.option_fingerprint(options).decode("utf-8", "replace").split("\0"),
            "source": hashlib.blake2b(program._code, digest_size=16).hexdigest(),
            "symbols": _encode_mapping(obj.symbol_mapping) if names else [],
            "created": int(time.time()),
        },
    )


def _get_entry(cache: Any, key: bytes) -> CacheEntry | None:
    try:
        getter = getattr(cache, "get_entry", None)
        if getter is None:  # a duck-typed mapping: metadata under a derived key
            return ProgramCacheResource.get_entry(cache, key)
        entry: CacheEntry | None = getter(key)
        return entry
    except Exception as exc:  # a broken backend is a miss, never a failed compile
        _warn_once(cache, f"cache lookup failed ({type(exc).__name__}: {exc}); compiling")
        _events.fail_open(
            cache, _events.UNAVAILABLE, "cache lookup failed (%s: %s); compiling",
            type(exc).__name__, exc,
        )  # fmt: skip
        return None


def _warn_once(cache: Any, message: str) -> None:
    from cuforge.storage import CacheWriteWarning

    try:
        if getattr(cache, _WARNED_ATTR, False):
            return
        setattr(cache, _WARNED_ATTR, True)
    except AttributeError:
        pass
    warnings.warn(message, CacheWriteWarning, stacklevel=outside_level())


def _store(cache: Any, key: bytes, value: Any, meta: bytes) -> None:
    if not _identity_store.confirm():
        # The key named a compiler identity kept on disk that a fresh probe now
        # contradicts (a library or header set changed during this process).
        stats = getattr(cache, "_stats", None)
        if stats is not None and hasattr(stats, "write_failures"):
            stats.write_failures += 1
        _warn_once(
            cache,
            "the compiler or its CUDA headers changed while this process ran; the "
            "program is returned but not cached",
        )
        return
    try:
        setter = getattr(cache, "set_entry", None)
        if setter is None:
            ProgramCacheResource.set_entry(cache, key, value, meta)
        else:
            setter(key, value, meta)
        if debug_enabled(LOGGER):
            get_logger(LOGGER).debug("store %s (%d bytes)", entry_id(key)[:12], len(value))
    except Exception as exc:
        stats = getattr(cache, "_stats", None)
        if stats is not None and hasattr(stats, "write_failures"):
            stats.write_failures += 1
        _warn_once(
            cache,
            f"cache write failed ({type(exc).__name__}: {exc}); the program compiled and is "
            "returned, but was not cached",
        )
        _events.fail_open(
            cache, _events.WRITE,
            "cache write failed (%s: %s); the program compiled and is returned, but was not "
            "cached", type(exc).__name__, exc,
        )  # fmt: skip


def _hit(
    cache: Any, key: bytes, target: str, name: str, names: tuple[str | bytes, ...]
) -> ObjectCode | None:
    entry = _get_entry(cache, key)
    if entry is None:
        if debug_enabled(LOGGER):
            get_logger(LOGGER).debug("miss %s %s: no entry for this key", entry_id(key)[:12], name)
        return None
    data = entry.data
    mapping: dict[str | bytes, str] = {}
    if names:
        record = decode_record(entry.meta, "program")
        decoded = None if record is None else _decode_mapping(record.get("symbols"))
        if decoded is None or set(decoded) != set(names):
            if debug_enabled(LOGGER):
                get_logger(LOGGER).debug(
                    "miss %s %s: entry lacks the name mapping", entry_id(key)[:12], name
                )
            return None
        mapping = decoded
    if debug_enabled(LOGGER):
        get_logger(LOGGER).debug("hit %s %s", entry_id(key)[:12], name)
    obj = ObjectCode._trusted(data, target, name, mapping)
    if target == "ptx":
        _versions.warn_if_ptx_unloadable(data, stacklevel=outside_level())
    return obj


def compile_cached(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
) -> ObjectCode:
    """``program`` compiled to ``target`` through ``cache`` (see the module doc).

    Raises TypeError when ``cache`` is not a mapping-like program cache, and
    ValueError (``UntrackableInclude``) when the headers the compile may read
    cannot all be known.
    """
    if not (callable(getattr(cache, "get", None)) and hasattr(cache, "__setitem__")):
        raise TypeError(
            "cache must be a cuforge.utils.ProgramCacheResource (get/__setitem__), got "
            f"{type(cache).__name__}"
        )
    if program._closed:  # a hit must not hide what an uncached compile would raise
        raise RuntimeError("Program is closed")
    if program._code_type == "c++":
        roots = _tracking.roots_if_tracked(program)
        if roots is not None:
            return _tracking.compile_tracked(program, target, names, logs, cache, roots)
    key = _digest(program._code_type, target, program._options, program._code, names, None)
    name = program._options.name or ""
    return single_flight(
        cache,
        key,
        lambda: _hit(cache, key, target, name, names),
        lambda: _fill(program, target, names, logs, cache, key),
    )


def single_flight(
    cache: Any,
    lock_key: bytes,
    lookup: Callable[[], ObjectCode | None],
    fill: Callable[[], ObjectCode],
) -> ObjectCode:
    """Look up; on a miss take ``lock_key``'s lock, look again, and fill.

    ``lookup`` counts one hit or miss in the cache's statistics; the look-again
    under the lock is the same request, so its miss is not counted twice. A lock
    that cannot be had (or a backend that cannot lock) costs a duplicate fill,
    never a failed compile.
    """
    obj = lookup()
    if obj is not None:
        return obj
    try:
        guard = cache.lock(lock_key)
    except Exception:
        guard = None
    if guard is None:
        return fill()
    with guard:
        uncount(cache, None)
        obj = lookup()
        if obj is not None:
            return obj
        return fill()


def uncount(cache: Any, entry: CacheEntry | None) -> None:
    """Take back the hit or miss a lookup of ``entry`` counted (a lookup that is
    part of a request already counted)."""
    stats = getattr(cache, "_stats", None)
    if stats is None:
        return
    if entry is None:
        if getattr(stats, "misses", 0) > 0:
            stats.misses -= 1
    elif getattr(stats, "hits", 0) > 0:
        stats.hits -= 1
        stats.bytes_read = max(0, stats.bytes_read - len(entry.data))


def count_miss(cache: Any) -> None:
    """Count a miss found without a counted lookup (no manifest variant held)."""
    stats = getattr(cache, "_stats", None)
    if stats is not None and hasattr(stats, "misses"):
        stats.misses += 1


def _fill(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
    key: bytes,
) -> ObjectCode:
    obj = program._compile_uncached(target, names, logs)
    _store(cache, key, obj.code, program_record(program, target, obj, names))
    return obj


from cuforge.compile import _tracking  # noqa: E402 - it builds on the helpers above

__all__ = ["compile_cached", "count_miss", "program_record", "single_flight", "uncount"]
