"""The header-tracking steps of the compile pipeline: manifests and the closed world.

``cached.py`` runs the pipeline; for C++ that can read files outside the compiler's
own headers (see ``_includes.may_read_user_files``) it calls these steps:

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

from cuforge._log import debug_enabled, get_logger
from cuforge.compile.cache import _includes, _toolkit
from cuforge.compile.cache._key import program_key, source_roots
from cuforge.compile.cache._records import manifest_record
from cuforge.compile.cache._steps import (
    LOGGER,
    StoreOutcome,
    lookup,
    lookup_entry,
    peek_entry,
    store,
)
from cuforge.storage import failopen
from cuforge.storage.base import ProgramCacheResource
from cuforge.storage.entry import CacheEntry, entry_id

TYPE_CHECKING = False  # typing is not imported at run time: a first compile(cache=) paid ~4 ms
if TYPE_CHECKING:
    from typing import Any

    from cuforge.compile.cache import _manifest
    from cuforge.compile.object_code import ObjectCode
    from cuforge.compile.program import ProgramSource

__all__ = [
    "entry_key",
    "lookup_manifest",
    "manifest_key",
    "recall",
    "resolve",
    "roots_if_tracked",
    "store_variant",
    "toolkit_dirs",
]

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


def roots_if_tracked(src: ProgramSource) -> _includes.Roots | None:
    """The search roots when ``src`` can read user files; None when it cannot
    (then the plain key covers every input)."""
    code = src.code
    options = src.options
    if not options.pre_include and not _includes.may_name_files(code):
        return None
    roots = _roots(options)
    if options.pre_include or _includes.may_read_user_files(
        _analysis(code).directives, bool(roots.user), roots.source is not None
    ):
        return roots
    return None


def manifest_key(src: ProgramSource, target: str, names: tuple[str | bytes, ...]) -> bytes:
    """The key step for a tracked program: the key of its manifest (everything but
    the headers)."""
    return program_key(
        "c++", target, src.options, src.code, names, None,
        closed=True, label=b"manifest",
    )  # fmt: skip


def lookup_manifest(
    cache: ProgramCacheResource, mkey: bytes, roots: _includes.Roots, *, peek: bool = False
) -> list[_manifest.Prepared] | None:
    """The variants of the manifest under ``mkey``, prepared for ``roots`` (its
    lookup is not counted as a request); None when there is none. ``peek``: read it
    as maintenance, not a use (``_steps.peek_entry``; ``explain``)."""
    found = peek_entry(cache, mkey) if peek else lookup_entry(cache, mkey, count=False)
    return _variants(found, roots)


def _variants(entry: CacheEntry | None, roots: _includes.Roots) -> list[_manifest.Prepared] | None:
    from cuforge.compile.cache import _manifest  # tracked programs only (see _tracked)

    record = None if entry is None else _manifest.decode(entry.data)
    if record is None or entry is None:
        return None
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


def recall(
    src: ProgramSource,
    target: str,
    names: tuple[str | bytes, ...],
    cache: ProgramCacheResource,
    roots: _includes.Roots,
    mkey: bytes,
    logs: Any = None,
    count_miss: bool = True,
) -> tuple[ObjectCode | None, str | None]:
    """The validate + lookup steps: a hit through a manifest variant that holds here
    (its compile log written to ``logs``), counted; and the reason of a miss left to
    the caller (None: nothing left to count). A request's first lookup
    (``count_miss=False``) counts no miss: its look-again does. An absent or rejected
    manifest is counted by its own lookup (a rejection with its miss); a look-again's
    miss no lookup counted (the manifest was there, no variant held) is the caller's,
    who counts it as :func:`miss`, or as the hit of the entry the headers as they are
    now key (compiled under other include directories, or in another checkout), once
    it has looked."""
    if not count_miss:  # a request's first look: it counts its answer itself
        failopen.begin(cache)
    obj, key, counted, reason = _recall(src, target, names, cache, roots, mkey, logs, count_miss)
    if obj is not None:
        hit(cache, key, obj)
        return obj, None
    if not count_miss:
        return None, None
    if counted:  # an absent or rejected manifest: its lookup counted the miss
        miss(cache, mkey, src.options.name or "", reason, count=False)
        return None, None
    return None, reason


def hit(cache: ProgramCacheResource, key: bytes, obj: ObjectCode) -> None:
    """Count a tracked request's hit: ``obj``, found under ``key``."""
    failopen.tally(cache, key, CacheEntry(obj.code, b""))


def miss(
    cache: ProgramCacheResource, mkey: bytes, name: str, reason: str, count: bool = True
) -> None:
    """Count (``count``) and log a tracked request's miss, for ``reason``."""
    if count:
        failopen.tally(cache, mkey, None)
    if debug_enabled(LOGGER):
        get_logger(LOGGER).debug("miss %s %s: %s", entry_id(mkey)[:12], name, reason)


def _recall(
    src: ProgramSource,
    target: str,
    names: tuple[str | bytes, ...],
    cache: ProgramCacheResource,
    roots: _includes.Roots,
    mkey: bytes,
    logs: Any,
    count_miss: bool,
) -> tuple[ObjectCode | None, bytes, bool, str]:
    """The answer, the key it was found under, whether the manifest's own lookup
    counted it as a miss, and why there is none."""
    name = src.options.name or ""
    from cuforge.compile.cache import _manifest, _watch  # tracked programs only

    watcher = _watch.watcher()
    if watcher is not None:
        known = _validated.get(mkey)
        if known is not None and known[0] == roots and known[2] == watcher.epoch():
            obj = lookup(cache, known[1], target, name, names, logs, count=False)
            if obj is not None:
                return obj, known[1], False, ""
    manifest = lookup_entry(cache, mkey, count=False, count_miss=count_miss)
    # A first look (count_miss False) logs no miss: its look-again logs the answer.
    quiet = None if count_miss else False
    variants = _variants(manifest, roots)
    if variants is None:
        reason = "no manifest for this source, options and compiler"
    else:
        reason = ""
        for variant in variants:
            # Epoch, then watches, then the check (the order _watch's docstring proves):
            # a change racing the watches moves the epoch past the one remembered.
            epoch = watcher.epoch() if watcher is not None else 0
            watched = watcher is not None and watcher.watch(
                list(variant.watch_files), list(variant.watch_dirs), variant.watch_absent
            )
            unproven: list[str] = []
            problems = _manifest.check(variant, unproven=unproven if watched else None)
            if problems:
                reason = reason or str(problems[0])
                continue
            obj = lookup(
                cache, variant.key, target, name, names, logs, count=False, count_miss=quiet
            )
            if obj is not None:
                if watched and unproven:
                    # A proof no longer holds (its lookups go further now, say): watch
                    # them as they go now, then check again after every watch.
                    assert watcher is not None
                    watched = watcher.watch([], [], unproven) and not _manifest.check(variant)
                if watched:
                    _remember_valid(mkey, roots, variant.key, epoch)
                return obj, variant.key, False, ""
            # the entry is gone; a later variant may still hold
            reason = reason or "the entry of a matching variant is gone (evicted?)"
    return None, mkey, manifest is None and count_miss, reason


def resolve(src: ProgramSource, roots: _includes.Roots) -> _includes.DepSet:
    """Read every header the compile may read now (under the manifest's lock)."""
    options = src.options
    return _includes.resolve(
        src.code, options.name or "<source>", roots, options.define_macro or (),
        options.pre_include or (), _analysis(src.code),
    )  # fmt: skip


def entry_key(
    src: ProgramSource, target: str, names: tuple[str | bytes, ...], deps: _includes.DepSet
) -> bytes:
    """The key of the entry a closed-world compile with ``deps`` produces."""
    return program_key("c++", target, src.options, src.code, names, None, closed=True, deps=deps)


def store_variant(
    src: ProgramSource,
    target: str,
    cache: ProgramCacheResource,
    mkey: bytes,
    key: bytes,
    deps: _includes.DepSet,
    roots: _includes.Roots,
) -> StoreOutcome:
    """Put the variant ``deps`` -> ``key`` in front of the manifest under ``mkey``."""
    name = src.options.name or ""
    old = lookup_entry(cache, mkey, count=False)
    from cuforge.compile.cache import _manifest

    previous = None if old is None else _manifest.decode(old.data)
    manifest = _manifest.add_variant(previous, name, key, deps, roots)
    info = manifest_record(name, target, src.options.arch)
    return store(cache, mkey, manifest, info)
