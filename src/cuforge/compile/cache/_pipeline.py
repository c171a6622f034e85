"""``Program.compile(cache=)``: one straight pipeline through a cache.

    key -> (validate the manifest, when headers are tracked) -> lookup -> compile -> store

:func:`pipeline` runs the steps in order, each a call that returns: the key from
``compile.cache_key``; the manifest steps from ``_tracking`` (only for C++ that can
read user headers: the manifest key, a variant that still holds here, resolving the
headers and the closed-world entry key); the lookup and store steps from ``_steps``;
the record stored with each entry from ``_records``. A hit is the key, one lookup
and the ObjectCode. :func:`compile_through_cache` returns the ObjectCode with what
the pipeline did (:class:`Compiled`: whether the compiler ran, the store's
:class:`~cuforge.storage.outcome.StoreOutcome`), so a caller such as the CLI can say
"not stored: read-only" instead of guessing.

Guarantees:
- A hit returns a fresh ObjectCode equal to what the miss produced -- same bytes,
  code type, name and ``symbol_mapping`` -- without creating a compiler program,
  and writes the miss's compile log (its warnings, kept in the entry's record) to
  ``logs`` as the compile did.
- Concurrent misses of one key compile once: the filler holds the key's lock
  (``cache.lock``) while it compiles and stores; the others wait, look again and
  read its result. A holder that dies or outlasts the lock timeout costs the
  waiters a compile of their own, never a hang.
- Each request counts one hit or one miss: the first lookup counts a hit only, the
  look-again under the lock counts the answer (``count_miss``).
- The cache never breaks a compile: a failing lookup is a miss, a failing store is
  a ``CacheWriteWarning`` (once per cache) plus a ``write_failures`` count, and the
  compiled ObjectCode is returned either way (``storage.failopen``).
- A PTX hit warns exactly as a fresh PTX compile does when the driver is older
  than the compiler that wrote it.
- An entry is stored only under the target its backend made: the compile step
  refuses (ValueError) a code type and target no backend pairs, such as NVVM IR to
  cubin (``targets.compile_target``), so nothing reaches the store step for it.

Logging: the ``cuforge.cache`` logger records every hit, miss (with why) and store
at DEBUG (short entry id and source name); nothing above DEBUG on the hit path.
Fail-open events are a WARNING once per cause and cache handle, then DEBUG.
"""

from __future__ import annotations

from cuforge.compile.cache import _tracking
from cuforge.compile.cache._key import program_key
from cuforge.compile.cache._records import program_record
from cuforge.compile.cache._steps import lookup, store
from cuforge.storage import failopen
from cuforge.storage.base import ProgramCacheResource

TYPE_CHECKING = False  # typing is not imported at run time: a first compile(cache=) paid ~4 ms
if TYPE_CHECKING:
    from typing import Any

    from cuforge.compile.object_code import ObjectCode
    from cuforge.compile.program import Program, ProgramSource
    from cuforge.storage.outcome import StoreOutcome
    from cuforge.storage.protocol import ProgramCache

__all__ = ["Compiled", "compile_through_cache", "pipeline", "read_files", "tracks_headers"]

Names = tuple[str | bytes, ...]


class Compiled:
    """What :func:`compile_through_cache` did: ``obj`` (the ObjectCode), ``hit`` (no
    fill ran: served from the cache, possibly by a concurrent filler), ``ran``
    (whether the compiler ran: a fill may reuse an entry another checkout stored),
    ``store`` (the store step's outcome; None when nothing was stored) and ``keys``
    (the keys the fill stored under: the entry's, and a tracked program's manifest;
    a later compile needs all of them to hit)."""

    __slots__ = ("hit", "keys", "obj", "ran", "store")

    def __init__(
        self,
        obj: ObjectCode,
        hit: bool,
        store: StoreOutcome | None = None,
        ran: bool = False,
        keys: tuple[bytes, ...] = (),
    ) -> None:
        self.obj = obj
        self.hit = hit
        self.store = store
        self.ran = ran
        self.keys = keys

    def __repr__(self) -> str:
        return f"Compiled(hit={self.hit}, ran={self.ran}, store={self.store!r})"


class _Report:
    """Where a fill writes what it did (``compile_through_cache`` asks; a plain
    compile passes none, so its hit path carries nothing extra)."""

    __slots__ = ("filled", "keys", "ran", "store")

    def __init__(self) -> None:
        self.filled = False
        self.ran = False
        self.store: StoreOutcome | None = None
        self.keys: list[bytes] = []


def compile_through_cache(
    program: Program, target: str, names: Names, logs: Any, cache: ProgramCache
) -> Compiled:
    """``program`` compiled to ``target`` through ``cache``, with what the pipeline did.

    ``target`` is canonical (``cubin``, ``ptx``, ``ltoir``). Raises TypeError when
    ``cache`` is not a program cache, RuntimeError for a closed program, and
    ValueError for a target this code type does not compile to (NVVM IR to cubin),
    one the options contradict (a cubin for ``compute_XY``) or (``UntrackableInclude``)
    when the headers the compile may read cannot all be known. Nothing is looked up
    or stored for a refused target.
    """
    from cuforge.compile.targets import compile_target

    # Program.compile's rule, before a hit could hide it or a fill store its output
    # under a target the backend did not make.
    target = compile_target(program.source.code_type, program.source.options, target)
    report = _Report()
    obj = pipeline(program, target, names, logs, cache, report)
    return Compiled(obj, not report.filled, report.store, report.ran, tuple(report.keys))


def pipeline(
    program: Program,
    target: str,
    names: Names,
    logs: Any,
    cache: ProgramCache,
    report: _Report | None = None,
) -> ObjectCode:
    """The steps, in order; a fill tells ``report`` (when given) what it did.
    ``Program.compile`` calls it directly: its hit path is the key, one lookup and
    the ObjectCode, nothing more."""
    # A type seen before costs a set probe, no call; anything else is checked (and a
    # duck-typed mapping wrapped): TypeError for what is no cache at all.
    resource: ProgramCacheResource = (
        cache  # type: ignore[assignment]
        if type(cache) in failopen.CACHE_TYPES
        else failopen.as_cache(cache)
    )
    src = program.source
    if src.closed:  # a hit must not hide what an uncached compile would raise
        raise RuntimeError("Program is closed")
    roots = _tracking.roots_if_tracked(src) if src.code_type == "c++" else None
    if roots is not None:
        return _tracked(program, target, names, logs, resource, roots, report)
    key = program_key(src.code_type, target, src.options, src.code, names, None)
    name = src.options.name or ""
    obj = lookup(resource, key, target, name, names, logs, count_miss=False)
    if obj is not None:
        return obj
    with failopen.lock(resource, key):  # single flight: look again, then fill
        obj = lookup(resource, key, target, name, names, logs)
        if obj is None:
            obj = _compile_and_store(program, target, names, logs, resource, key, report)
    return obj


def tracks_headers(program: Program) -> bool:
    """Whether ``program`` goes through the manifest steps (C++ that can read user
    headers): its entry key then depends on those headers, not only on the plain key."""
    src = program.source
    return src.code_type == "c++" and _tracking.roots_if_tracked(src) is not None


def read_files(program: Program) -> tuple[str, ...]:
    """The paths of the user files a compile of ``program`` reads -- every header and
    ``pre_include`` file the header tracking resolves here and now (a superset: every
    ``#if`` branch), which is all a compile through a cache can read (the closed world)
    and what NVRTC reads without one; () for a program that can read none
    (:func:`tracks_headers`). Reads them all, as a tracked miss does: not for a hit
    path. Raises UntrackableInclude (a ValueError) where they cannot all be known."""
    src = program.source
    roots = _tracking.roots_if_tracked(src) if src.code_type == "c++" else None
    if roots is None:
        return ()
    deps = _tracking.resolve(src, roots)
    return tuple(path for pos, rel in deps.files if (path := roots.path(pos, rel)) is not None)


def _tracked(
    program: Program,
    target: str,
    names: Names,
    logs: Any,
    cache: ProgramCacheResource,
    roots: Any,
    report: _Report | None,
) -> ObjectCode:
    """The manifest steps: a variant that holds here gives the entry; else, under the
    manifest key's lock, look again and fill (``_fill_tracked``)."""
    src = program.source
    mkey = _tracking.manifest_key(src, target, names)
    obj, _ = _tracking.recall(src, target, names, cache, roots, mkey, logs, count_miss=False)
    if obj is not None:
        return obj
    with failopen.lock(cache, mkey):
        obj, pending = _tracking.recall(src, target, names, cache, roots, mkey, logs)
        if obj is None:
            obj = _fill_tracked(program, target, names, logs, cache, roots, mkey, report, pending)
    return obj


def _compile_and_store(
    program: Program,
    target: str,
    names: Names,
    logs: Any,
    cache: ProgramCacheResource,
    key: bytes,
    report: _Report | None,
    headers: dict[str, bytes] | None = None,
    header_digests: list[tuple[str, str]] | None = None,
) -> ObjectCode:
    """The compile and store steps (``headers``: a closed world's in-memory files)."""
    log: list[str] = []
    obj = program.compile_uncached(target, names, logs, headers=headers, captured=log)
    src: ProgramSource = program.source
    record = program_record(src, target, obj, names, header_digests, "".join(log))
    outcome = store(cache, key, obj.code, record)
    if report is not None:
        report.filled, report.ran, report.store = True, True, outcome
        report.keys.append(key)
    return obj


def _fill_tracked(
    program: Program,
    target: str,
    names: Names,
    logs: Any,
    cache: ProgramCacheResource,
    roots: Any,
    mkey: bytes,
    report: _Report | None,
    pending: str | None = None,
) -> ObjectCode:
    """A tracked miss, under the manifest key's lock: resolve the headers, key the
    entry by them, reuse it if another checkout (or other include directories)
    compiled it, else compile in the closed world and store; then store the manifest
    with this variant in front. ``pending``: the reason of a miss no lookup counted
    yet -- counted here as the hit of the entry reused, else as that miss."""
    src = program.source
    deps = _tracking.resolve(src, roots)
    key = _tracking.entry_key(src, target, names, deps)
    # uncounted and, missing, unlogged: this request's miss is counted and logged once
    obj = lookup(cache, key, target, src.options.name or "", names, logs, False, False)
    if pending is not None:
        if obj is not None:
            _tracking.hit(cache, key, obj)
        else:
            _tracking.miss(cache, mkey, src.options.name or "", pending)
    if obj is None:
        obj = _compile_and_store(
            program, target, names, logs, cache, key, report, deps.headers, deps.header_digests()
        )
    manifest = _tracking.store_variant(src, target, cache, mkey, key, deps, roots)
    if report is not None:
        entry = report.store
        report.filled = True
        report.keys[:] = [key, mkey]  # an entry another checkout stored is needed too
        if entry is None or (entry.stored and not manifest.stored):
            report.store = manifest  # what a later compile of this program depends on
    return obj
