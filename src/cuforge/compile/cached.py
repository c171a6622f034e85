"""``Program.compile(cache=...)``: one linear pipeline through a ProgramCacheResource.

    key -> (validate the manifest, when headers are tracked) -> lookup -> compile -> store

Each step is a function the next one calls: the key from ``cache_key``; the
manifest steps from ``_tracking`` (only for C++ that can read user headers: the
manifest key, a variant that still holds here, resolving the headers and the
closed-world entry key); lookup and store from ``_cacheio``; the record stored with
each entry from ``_records``. :func:`compile_through_cache` returns the ObjectCode
with what the store step did (:class:`~cuforge.compile._cacheio.StoreOutcome`), so a
caller such as the CLI can say "not stored: read-only" instead of guessing.

Guarantees:
- A hit returns a fresh ObjectCode equal to what the miss produced -- same bytes,
  code type, name and ``symbol_mapping`` -- without creating a compiler program,
  and writes the miss's compile log (its warnings, kept in the entry's record) to
  ``logs`` as the compile did.
- Concurrent misses of one key compile once: the filler holds the key's lock
  (``cache.lock``) while it compiles and stores; the others wait, look again and
  read its result. A holder that dies or outlasts the lock timeout costs the
  waiters a compile of their own, never a hang.
- The cache never breaks a compile: a failing lookup is a miss, a failing store is
  a ``CacheWriteWarning`` (once per cache) plus a ``write_failures`` count, and the
  compiled ObjectCode is returned either way.
- A PTX hit warns exactly as a fresh PTX compile does when the driver is older
  than the compiler that wrote it.
- An entry is stored only under the target its backend made: the compile step
  refuses (ValueError) a code type and target no backend pairs, such as NVVM IR to
  cubin (``targets.compile_target``), so nothing reaches the store step for it.

Logging: the ``cuforge.cache`` logger records every hit, miss (with why) and store
at DEBUG (short entry id and source name); nothing above DEBUG on the hit path.
Fail-open events (lookup raised, store failed, and the backends' own: unwritable,
damaged or unreadable entries) are a WARNING once per cause and cache handle, then
DEBUG (``cuforge.storage.events``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuforge.compile import _tracking
from cuforge.compile._cacheio import StoreOutcome, lookup, single_flight, store
from cuforge.compile._records import program_record
from cuforge.compile.cache_key import program_key
from cuforge.storage import failopen
from cuforge.storage.base import ProgramCacheResource

if TYPE_CHECKING:
    from cuforge.compile.object_code import ObjectCode
    from cuforge.compile.program import Program

__all__ = ["Compiled", "compile_cached", "compile_through_cache", "pipeline", "tracks_headers"]


class Compiled:
    """What :func:`compile_through_cache` did: ``obj`` (the ObjectCode), ``hit`` (no
    fill ran: served from the cache, possibly by a concurrent filler) and ``store``
    (the store step's outcome; None for a hit)."""

    __slots__ = ("hit", "obj", "store")

    def __init__(self, obj: ObjectCode, hit: bool, store: StoreOutcome | None = None) -> None:
        self.obj = obj
        self.hit = hit
        self.store = store

    def __repr__(self) -> str:
        return f"Compiled(hit={self.hit}, store={self.store!r})"


class _Report:
    """Where a fill writes what it did (``compile_through_cache`` asks; a plain
    compile passes none, so its hit path carries nothing extra)."""

    __slots__ = ("filled", "store")

    def __init__(self) -> None:
        self.filled = False
        self.store: StoreOutcome | None = None


def compile_cached(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
) -> ObjectCode:
    """``program`` compiled to ``target`` through ``cache`` (what ``Program.compile``
    runs; see the module doc)."""
    return pipeline(program, target, names, logs, cache)


def compile_through_cache(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
) -> Compiled:
    """``program`` compiled to ``target`` through ``cache``, with what the pipeline did.

    ``target`` is canonical (``cubin``, ``ptx``, ``ltoir``). Raises TypeError when
    ``cache`` is not a mapping-like program cache, RuntimeError for a closed program,
    and ValueError for a target this code type does not compile to (NVVM IR to cubin),
    one the options contradict (a cubin for ``compute_XY``) or
    (``UntrackableInclude``) when the headers the compile may read cannot all be
    known. Nothing is looked up or stored for a refused target.
    """
    from cuforge.compile.targets import compile_target

    # Program.compile's rule, before a hit could hide it or a fill store its output
    # under a target the backend did not make.
    target = compile_target(program._code_type, program._options, target)
    report = _Report()
    obj = pipeline(program, target, names, logs, cache, report)
    return Compiled(obj, not report.filled, report.store)


def pipeline(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
    report: _Report | None = None,
) -> ObjectCode:
    """The steps, in order; a fill tells ``report`` (when given) what it did.
    ``Program.compile`` calls it directly: its hit path is the key, one lookup and
    the ObjectCode, nothing more."""
    if not isinstance(cache, ProgramCacheResource):
        cache = failopen.as_cache(cache)  # TypeError for what is no cache at all
    if program._closed:  # a hit must not hide what an uncached compile would raise
        raise RuntimeError("Program is closed")
    roots = _tracking.roots_if_tracked(program) if program._code_type == "c++" else None
    if roots is None:
        key = program_key(program._code_type, target, program._options, program._code, names, None)
        name = program._options.name or ""
        return single_flight(
            cache,
            key,
            lambda again: lookup(cache, key, target, name, names, logs, count_miss=again),
            lambda: _compile_and_store(program, target, names, logs, cache, key, report),
        )
    mkey = _tracking.manifest_key(program, target, names)
    return single_flight(
        cache,
        mkey,
        lambda again: _tracking.recall(program, target, names, cache, roots, mkey, logs, again),
        lambda: _fill_tracked(program, target, names, logs, cache, roots, mkey, report),
    )


def tracks_headers(program: Program) -> bool:
    """Whether ``program`` goes through the manifest steps (C++ that can read user
    headers): its entry key then depends on those headers, not only on the plain key."""
    return program._code_type == "c++" and _tracking.roots_if_tracked(program) is not None


def _compile_and_store(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
    key: bytes,
    report: _Report | None,
    headers: dict[str, bytes] | None = None,
    header_digests: list[tuple[str, str]] | None = None,
) -> ObjectCode:
    """The compile and store steps (``headers``: a closed world's in-memory files)."""
    log: list[str] = []
    obj = program._compile_uncached(target, names, logs, headers=headers, captured=log)
    record = program_record(program, target, obj, names, header_digests, "".join(log))
    outcome = store(cache, key, obj.code, record)
    if report is not None:
        report.filled, report.store = True, outcome
    return obj


def _fill_tracked(
    program: Program,
    target: str,
    names: tuple[str | bytes, ...],
    logs: Any,
    cache: Any,
    roots: Any,
    mkey: bytes,
    report: _Report | None,
) -> ObjectCode:
    """A tracked miss, under the manifest key's lock: resolve the headers, key the
    entry by them, reuse it if another checkout compiled it, else compile in the
    closed world and store; then store the manifest with this variant in front."""
    deps = _tracking.resolve(program, roots)
    key = _tracking.entry_key(program, target, names, deps)
    obj = lookup(cache, key, target, program._options.name or "", names, logs, count=False)
    if obj is None:
        obj = _compile_and_store(
            program, target, names, logs, cache, key, report, deps.headers, deps.header_digests()
        )
    manifest = _tracking.store_variant(program, target, cache, mkey, key, deps, roots)
    if report is not None:
        entry = report.store
        report.filled = True
        if entry is None or (entry.stored and not manifest.stored):
            report.store = manifest  # what a later compile of this program depends on
    return obj
