"""``compile(cache=)`` for C++ that reads headers: manifests and the closed world.

When a source can read files outside the compiler's own headers (see
``_includes.may_read_user_files``), a compile through a cache goes like this:

1. The manifest key covers everything but the headers (source, flags with include
   directories by position, compiler, name). Its entry is a manifest
   (``_manifest``): variants of header versions, each naming the entry key of the
   compile that used them.
2. A variant that still holds here (same content in every file, every absent
   candidate still absent) gives the entry key: a hit, without reading headers
   (stat shortcuts) and without compiling.
3. Otherwise, under the manifest key's lock: resolve the headers now (read them
   all), derive the entry key from exactly what NVRTC will be given, reuse the entry
   if another checkout already compiled it, else compile in the *closed world* --
   NVRTC gets the resolved files in memory, no user include directory and no source
   directory, so it can read nothing the resolution did not see -- and store the
   entry and the manifest with the new variant in front.

A manifest names files by search position and relative name, so two checkouts at
different roots share manifests and entries. A file the resolution missed cannot
be read (the closed world turns it into a compile error), so a stale hit is not
possible; ``UntrackableInclude`` refuses the few cases a scan cannot decide.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from cuforge._log import debug_enabled, get_logger
from cuforge.compile import _includes, _manifest, _toolkit, _watch
from cuforge.compile.cache_key import _digest, source_roots
from cuforge.compile.cached import (
    LOGGER,
    _get_entry,
    _hit,
    _store,
    count_miss,
    program_record,
    single_flight,
    uncount,
)
from cuforge.compile.object_code import ObjectCode
from cuforge.storage.entry import CacheEntry, entry_id
from cuforge.storage.record import encode_record

if TYPE_CHECKING:
    from cuforge.compile.program import Program

__all__ = ["compile_tracked", "lookup_manifest", "roots_if_tracked", "toolkit_dirs"]

_SCAN_MEMO_MAX = 1024
_scan_lock = threading.Lock()
_scan_memo: OrderedDict[bytes, _includes.Analysis] = OrderedDict()


def toolkit_dirs() -> tuple[str, ...]:
    """The compiler's own include directories (CUDA runtime headers, CCCL): what is
    found there is covered by the key's toolkit identity and is not tracked."""
    return _toolkit.toolkit_include_dirs()


def _analysis(code: bytes) -> _includes.Analysis:
    """``_includes.analyse(code)``, remembered per source (the hit path asks each time)."""
    with _scan_lock:
        found = _scan_memo.get(code)
        if found is not None:
            _scan_memo.move_to_end(code)
            return found
    found = _includes.analyse(code)
    with _scan_lock:
        _scan_memo[code] = found
        if len(_scan_memo) > _SCAN_MEMO_MAX:
            _scan_memo.popitem(last=False)
    return found


def _roots(options: Any) -> _includes.Roots:
    """``source_roots`` for ``options`` here, memoised per options and working directory
    (options are frozen; the working directory is the only other input)."""
    cwd = os.getcwd()
    memo: tuple[str, _includes.Roots] | None = options.__dict__.get("_cuforge_roots")
    if memo is not None and memo[0] == cwd:
        return memo[1]
    roots = source_roots(options, toolkit_dirs())
    options.__dict__["_cuforge_roots"] = (cwd, roots)
    return roots


def roots_if_tracked(program: Program) -> _includes.Roots | None:
    """The search roots when ``program`` can read user files; None when it cannot
    (then the plain key covers every input)."""
    code = program._code
    options = program._options
    if b"include" not in code and b"import" not in code and not options.pre_include:
        return None
    roots = _roots(options)
    if options.pre_include or _includes.may_read_user_files(
        _analysis(code).directives, bool(roots.user), roots.source is not None
    ):
        return roots
    return None


def _manifest_key(program: Program, target: str, names: tuple[str | bytes, ...]) -> bytes:
    return _digest(
        "c++", target, program._options, program._code, names, None,
        closed=True, label=b"manifest",
    )  # fmt: skip


def lookup_manifest(
    cache: Any, mkey: bytes, roots: _includes.Roots
) -> list[_manifest.Prepared] | None:
    """The variants of the manifest under ``mkey``, prepared for ``roots`` (its
    lookup is not counted as a request); None when there is none."""
    entry = _get_entry(cache, mkey)
    uncount(cache, entry)
    record = None if entry is None else _manifest.decode(entry.data)
    if record is None:
        return None
    assert entry is not None
    return _manifest.prepare(entry.data, record, roots)


# Manifest key -> (roots, entry key, watcher epoch) of a variant validated while
# watched: it stands until the watcher reports a relevant change.
_VALIDATED_MAX = 4096
_validated_lock = threading.Lock()
_validated: OrderedDict[bytes, tuple[_includes.Roots, bytes, int]] = OrderedDict()


def _remember_valid(mkey: bytes, roots: _includes.Roots, key: bytes, epoch: int) -> None:
    with _validated_lock:
        _validated[mkey] = (roots, key, epoch)
        _validated.move_to_end(mkey)
        if len(_validated) > _VALIDATED_MAX:
            _validated.popitem(last=False)


def _recall(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    cache: Any,
    roots: _includes.Roots,
    mkey: bytes,
) -> ObjectCode | None:
    """A hit through a manifest variant that holds here; counts one hit or miss."""
    name = program._options.name or ""
    watcher = _watch.watcher()
    if watcher is not None:
        known = _validated.get(mkey)
        if known is not None and known[0] == roots and known[2] == watcher.epoch():
            obj = _hit(cache, known[1], target, name, names)
            if obj is not None:
                return obj
            uncount(cache, None)
    variants = lookup_manifest(cache, mkey, roots)
    if variants is None:
        reason = "no manifest for this source, options and compiler"
    else:
        reason = ""
        for variant in variants:
            watched = watcher is not None and watcher.watch(
                list(variant.watch_files), list(variant.watch_dirs)
            )
            epoch = watcher.epoch() if watcher is not None else 0
            problems = _manifest.check(variant)
            if problems:
                reason = reason or str(problems[0])
                continue
            obj = _hit(cache, variant.key, target, name, names)
            if obj is not None:
                if watched:
                    _remember_valid(mkey, roots, variant.key, epoch)
                return obj
            uncount(cache, None)  # the entry is gone; a later variant may still hold
            reason = reason or "the entry of a matching variant is gone (evicted?)"
    count_miss(cache)
    if debug_enabled(LOGGER):
        get_logger(LOGGER).debug("miss %s %s: %s", entry_id(mkey)[:12], name, reason)
    return None


def compile_tracked(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
    roots: _includes.Roots,
) -> ObjectCode:
    """``compile_cached`` for a C++ program that can read user headers."""
    mkey = _manifest_key(program, target, names)
    return single_flight(
        cache,
        mkey,
        lambda: _recall(program, target, names, cache, roots, mkey),
        lambda: _fill(program, target, names, logs, cache, roots, mkey),
    )


def _fill(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
    roots: _includes.Roots,
    mkey: bytes,
) -> ObjectCode:
    options = program._options
    name = options.name or ""
    deps = _includes.resolve(
        program._code, name or "<source>", roots, options.define_macro or (),
        options.pre_include or (), _analysis(program._code),
    )  # fmt: skip
    key = _digest("c++", target, options, program._code, names, None, closed=True, deps=deps)
    obj = _hit(cache, key, target, name, names)  # another checkout may have compiled it
    if obj is None:
        uncount(cache, None)
        obj = program._compile_uncached(target, names, logs, headers=deps.headers)
        record = program_record(program, target, obj, names, deps.header_digests())
        _store(cache, key, obj.code, record)
    else:
        uncount(cache, CacheEntry(obj.code, b""))
    old = _get_entry(cache, mkey)
    uncount(cache, old)
    previous = None if old is None else _manifest.decode(old.data)
    manifest = _manifest.add_variant(previous, name, key, deps, roots)
    info = encode_record(
        "manifest", {"name": name, "target": target, "arch": options.arch, "code_type": "c++"}
    )
    _store(cache, mkey, manifest, info)
    return obj
