"""Tiered caches: several backends read fastest first, e.g. memory -> FileStream -> Redis.

``TieredProgramCache(*levels, read_only=())``:

- **Read through, backfill.** A lookup asks each level in order and stops at the
  first hit; the faster writable levels that missed get a copy (so the next hit is
  served by the fastest level).
- **Write through.** A store goes to every writable level; it counts as the tier's
  store when one level took it (a value larger than every level's cap is none). A
  read-only level (the shared cache a CI job fills and workers only read) is never
  written: not by stores, backfills, deletions or ``clear``.
- **Isolated failures.** A level that raises is skipped for that call (a miss
  there, a ``read_failures``/``write_failures`` count and one warning): a dead Redis
  never hides the local disk. Backends that fail open by themselves (Redis,
  FileStream) count their own failures.
- **Single-flight** uses the lock of the widest writable level (the last one):
  where the result will be shared is where concurrent fillers must meet.
- **One waiter per host.** When the first persistent level is a writable local one
  (FileStream, SQLite: its lock holds every process of the host) with levels behind
  it, that is the *host level*: ``lock(key)`` takes its lock first, then the widest
  level's, so of the processes of one host that miss a key only one talks to the
  levels behind (the fleet) while the others wait on the local lock, then hit
  locally (FileStream: a waiter whose holder stored the entry gets it from the
  lock's ``claim`` and holds nothing, ``lock`` yielding False as after a hand-over
  from the fleet; it does not take the lock in its turn). A request's first lookup
  (``count_miss=False``: a look-again under the lock follows a miss) stops at the
  host level; the look-again asks every level. An entry the widest level's wait
  handed over (``DriverCache.claim``; a signed level's only once its signature
  verifies) is put in the levels before it at once, so the look-again hits there.
  Counted as without the hand-over: one hit where it was found, and one miss at
  each level the first lookup asked in front of it (the look-again, which would
  count them, finds the copy there). Signed levels (``SignedProgramCache``) count
  as the handle they sign.
- **Lazy levels.** ``open_cache`` opens the levels up to the first persistent one
  and wraps those behind it in a :class:`~cuforge.storage.tiered._lazylevel.LazyLevel`:
  imported and connected the first time a lookup (or lock) reaches it, so a hit in
  a front level never touches the levels behind it; stores to a level not yet open
  are deferred and written when it opens, at ``close()`` or at exit.

``stats()`` counts what callers saw (a hit at any level is one hit) plus every
level's failure counters; ``level_stats()`` gives each level's own counters;
``total_stats()`` is the widest level's shared totals (e.g. the fleet's, for Redis).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from threading import get_ident
from typing import Any

from cuforge._stack import outside_level

from .. import events
from .._values import coerce_key, coerce_value
from ..base import (
    DEFAULT_LOCK_TIMEOUT,
    CacheKey,
    CacheReadWarning,
    CacheValue,
    CacheWriteWarning,
    EntryCache,
    ProgramCacheResource,
    check_meta,
    lookup_of,
)
from ..entry import CacheEntry, EntryInfo
from ..handle import DriverCache
from ..outcome import FAILED, READ_ONLY, STORED, STORED_OUTCOME, StoreOutcome
from ..stats import CacheStats
from ._claims import handle_of, hold
from ._lazylevel import LazyLevel, opened
from ._ledger import Ledger, count_at, tally_answer
from ._sealed import read_level, write_level

# LazyLevel: what urls.open_tiered wraps the levels behind the first persistent one in.
__all__ = ["LazyLevel", "TieredProgramCache", "opened"]

#: What a read-only level did with a store: nothing, by design.
_READ_ONLY_LEVEL = StoreOutcome(READ_ONLY, "a read-only level")

_FAILURE_FIELDS = (
    "evictions",
    "integrity_failures",
    "write_failures",
    "signature_failures",
    "read_failures",
    "lock_timeouts",
)


class TieredProgramCache(EntryCache):
    """Levels fastest first; ``read_only`` holds indices or the level objects themselves."""

    def __init__(self, *levels: ProgramCacheResource, read_only: Iterable[Any] = ()) -> None:
        super().__init__()
        if not levels:
            raise ValueError("TieredProgramCache needs at least one level")
        for i, level in enumerate(levels):
            if not isinstance(level, ProgramCacheResource):
                raise TypeError(
                    f"level {i} must be a ProgramCacheResource, got {type(level).__name__}"
                )
        self._levels: tuple[ProgramCacheResource, ...] = levels
        ro: set[int] = set()
        for item in read_only:
            if isinstance(item, int) and not isinstance(item, bool):
                if not -len(levels) <= item < len(levels):
                    raise ValueError(
                        f"read_only index {item} is out of range (0..{len(levels) - 1})"
                    )
                ro.add(item % len(levels))
            else:
                found = [i for i, lv in enumerate(levels) if lv is item]
                if not found:
                    raise ValueError("read_only names an object that is not one of the levels")
                ro.update(found)
        self._writable = tuple(i not in ro for i in range(len(levels)))
        widest = max((i for i in range(len(levels)) if self._writable[i]), default=None)
        self._locker_index = widest
        self._host = self._host_level()
        # What a request's first lookup asks: up to the host level (module docstring).
        self._front = levels if self._host is None else levels[: self._host + 1]
        # Keys a thread's claim just answered, for the look-again under that lock:
        # key -> (the thread's id, the index of the level whose claim handed the entry
        # over -- or -1: the widest level's claim found it absent and took the lease).
        self._claimed: dict[bytes, tuple[int, int]] = {}
        self._ledger = Ledger()  # what this thread's request counted where (_ledger)
        self._warned = False

    def _host_level(self) -> int | None:
        """The host level's index (module docstring), or None."""
        for i, level in enumerate(self._levels):
            if isinstance(level, DriverCache) and level.in_memory:
                continue
            handle = handle_of(level)
            local = handle is not None and handle.host_lock
            return i if local and self._writable[i] and i < len(self._levels) - 1 else None
        return None

    @property
    def levels(self) -> tuple[ProgramCacheResource, ...]:
        """Every level, fastest first; reading this opens each lazy level (``LazyLevel``)."""
        return tuple(lv.open() if isinstance(lv, LazyLevel) else lv for lv in self._levels)

    def level(self, i: int) -> ProgramCacheResource:
        """Level ``i``, opened now if it is a lazy one; raises what opening it raises
        (the CLI opens a tier's local levels so that a refused one is a usage error)."""
        level = self._levels[i]
        return level.open() if isinstance(level, LazyLevel) else level

    @property
    def depth(self) -> int:
        """How many levels; opens none."""
        return len(self._levels)

    def tail(self, start: int) -> TieredProgramCache:
        """Levels ``start`` on as a tier of their own, read-only where they are here,
        sharing this tier's level objects: a lazy level stays unopened (its opening,
        and a failure to open, come when a call reaches it, as here)."""
        ro = [i - start for i in self.read_only if i >= start]
        return TieredProgramCache(*self._levels[start:], read_only=ro)

    def first_persistent(self) -> tuple[int, ProgramCacheResource] | None:
        """The first level that is not in-memory and its index, if it is open (a URL's
        first persistent level always is); never opens a lazy level."""
        for i, level in enumerate(self._levels):
            if not (isinstance(level, DriverCache) and level.in_memory):
                inner = opened(level)
                return None if inner is None else (i, inner)
        return None

    def _kind(self, i: int) -> str:
        """Level ``i``'s class name, or its URL while a lazy level is not open."""
        level = self._levels[i]
        inner = opened(level)
        if inner is None and isinstance(level, LazyLevel):
            return level.name
        return repr(level) if inner is None else type(inner).__name__

    @property
    def read_only(self) -> tuple[int, ...]:
        """Indices of the read-only levels."""
        return tuple(i for i, w in enumerate(self._writable) if not w)

    # -- failures ---------------------------------------------------------------------------
    def _level_failed(self, i: int, exc: BaseException, what: str, counter: str) -> None:
        self._tally_failure(counter)
        if self._warned:
            return
        self._warned = True
        level = self._levels[i]
        if isinstance(level, LazyLevel) and level.opened is None:  # opening it failed
            from .._safedir import CachePathError  # its line names the path and the fix

            cause = str(exc) if isinstance(exc, CachePathError) else f"{type(exc).__name__}: {exc}"
            said = f"could not be opened ({cause}); it is skipped"
        else:
            said = f"failed to {what} ({type(exc).__name__}: {exc}); it is skipped for that call"
        warnings.warn(
            f"cuforge tiered cache: level {i} ({self._kind(i)}) {said} and the other levels "
            "serve. Later failures are counted in this handle's stats() without a warning.",
            CacheReadWarning if counter == "read_failures" else CacheWriteWarning,
            stacklevel=outside_level(),
        )

    # -- reads ------------------------------------------------------------------------------
    def get_entry(
        self, key: CacheKey, *, count: bool = True, count_miss: bool | None = None
    ) -> CacheEntry | None:
        """The first level's entry that has one (each level asked in order, counted as
        this lookup is); the writable levels that missed get a copy. A request's first
        lookup (``count_miss=False``) stops at the host level."""
        k = coerce_key(key)
        missed: list[int] = []
        found = None
        miss_counted = count if count_miss is None else count_miss
        ledger = self._ledger
        skip, quiet = self._after_claim(k, miss_counted) if self._claimed else (-1, False)
        for i, level in enumerate(self._front if count_miss is False else self._levels):
            if i == skip:  # this thread's claim found it absent and holds its lease:
                self._missed_behind(i, miss_counted)
                missed.append(i)  # a miss there, counted as the lookup would count it
                continue
            try:  # (an entry handed over was counted where it was found, not here)
                found = (
                    lookup_of(level, k, False, None)
                    if quiet
                    else lookup_of(level, k, count, count_miss)
                )
            except Exception as exc:  # one level never hides the others
                self._level_failed(i, exc, "look up an entry", "read_failures")
                found = None
            if ledger.open:  # a request that counts its answer itself (_ledger)
                ledger.asked(
                    i, k, found is not None, count and not quiet, miss_counted and not quiet
                )
            if found is not None:
                break
            missed.append(i)
        self._tally(found, count if found is not None else miss_counted)
        if found is not None:
            for j in missed:
                if self._writable[j]:
                    self._put(j, k, found.data, found.meta, "store a backfill")
        return found

    def get_entries(self, keys: Iterable[CacheKey]) -> list[CacheEntry | None]:
        """Level by level, fastest first, each level asked in one batch for the keys
        the faster levels missed; the entries a level found are back-filled into the
        writable levels that missed them, as ``get_entry`` does, in one batch write
        per level (``set_entries``)."""
        found, backfill = self.lookup_entries(keys)
        backfill()
        return found

    def lookup_entries(
        self, keys: Iterable[CacheKey]
    ) -> tuple[list[CacheEntry | None], Callable[[], None]]:
        """:meth:`get_entries` in two steps, for a pipeline that looks up the next batch
        while the last one is written: the lookups now (each level asked in one batch
        for what the faster ones missed, every entry verified and counted), the
        back-fills -- the same batch writes, nothing written before -- when the
        returned function is called (once; a level that fails is counted and warned
        about there, as ``get_entries`` does)."""
        ks = [coerce_key(key) for key in keys]
        out: list[CacheEntry | None] = [None] * len(ks)
        todo = list(range(len(ks)))
        missed_by: list[int] = []  # the levels every key still in todo has missed
        writes: list[tuple[int, list[tuple[bytes, bytes, bytes]], bool]] = []
        for i, level in enumerate(self._levels):
            if not todo:
                break
            sealed = [False] * len(missed_by)
            stored: list[bytes] | None = None
            try:  # signed levels under one secret: see _sealed
                found, stored, sealed = read_level(
                    level, [ks[n] for n in todo], [self._levels[j] for j in missed_by]
                )
            except Exception as exc:  # one level never hides the others
                self._level_failed(i, exc, "look up entries", "read_failures")
                found = [None] * len(todo)
            rest = []
            backfill: list[tuple[bytes, bytes, bytes]] = []  # one batch per level
            for n, entry in zip(todo, found, strict=True):
                if entry is None:
                    rest.append(n)
                    continue
                out[n] = entry
                backfill.append((ks[n], entry.data, entry.meta))
            if backfill:
                as_stored = backfill
                if stored is not None:  # the same entries, their metadata as stored
                    as_stored = [(k, d, m) for (k, d, _), m in zip(backfill, stored, strict=True)]
                writes.extend(
                    (j, as_stored if seal else backfill, seal)
                    for j, seal in zip(missed_by, sealed, strict=True)
                    if self._writable[j]
                )
            todo = rest
            missed_by.append(i)
        for entry in out:
            self._tally(entry)

        def write_backfills() -> None:
            for j, items, seal in writes:
                self._put_many(j, items, "store a backfill", seal)

        return out, write_backfills

    # -- writes -----------------------------------------------------------------------------
    def _put(self, i: int, key: bytes, data: bytes, meta: bytes, what: str) -> StoreOutcome:
        """Write to level ``i``; what it did (a level that raised: ``FAILED`` with the
        error, counted and warned)."""
        try:
            return self._levels[i].set_entry(key, data, meta) or STORED_OUTCOME
        except Exception as exc:  # isolated per level
            self._level_failed(i, exc, what, "write_failures")
            return StoreOutcome(FAILED, f"{type(exc).__name__}: {exc}")

    def _put_many(
        self,
        i: int,
        items: Sequence[tuple[CacheKey, CacheValue, bytes]],
        what: str,
        sealed: bool = False,
    ) -> list[StoreOutcome]:
        """Write ``items`` to level ``i`` in one batch (its ``set_entries``; ``sealed``:
        entries verified under its secret, their metadata as stored: its
        ``set_entries_sealed``, see ``_sealed``); what it did with each (a level that
        raised: ``FAILED`` each, counted and warned once, as :meth:`_put` does)."""
        try:
            done = write_level(self._levels[i], items, sealed)
        except Exception as exc:  # isolated per level
            self._level_failed(i, exc, what, "write_failures")
            return [StoreOutcome(FAILED, f"{type(exc).__name__}: {exc}")] * len(items)
        return [STORED_OUTCOME if o is None else o for o in done]

    def set_entry(self, key: CacheKey, value: CacheValue, meta: bytes = b"") -> StoreOutcome:
        """Store in every writable level (each level's failure is its own). Stored, and
        counted as a store, when one level took it; when every level dropped it (a
        value larger than each level's cap, say), the last level's reason. Either
        way the outcome's ``levels`` say what each level did, and a stored outcome's
        detail names the levels that dropped it."""
        k = coerce_key(key)
        data = coerce_value(value, "TieredProgramCache.__setitem__")
        check_meta(meta)
        if self._locker_index is None:  # every level is read-only
            return self._nowhere()
        levels = [
            self._put(i, k, data, meta, "store an entry") if self._writable[i] else _READ_ONLY_LEVEL
            for i in range(len(self._levels))
        ]
        return self._combined(levels, len(data))

    def set_entries(
        self, items: Iterable[tuple[CacheKey, CacheValue, bytes]]
    ) -> list[StoreOutcome]:
        """``set_entry`` of each ``(key, value, meta)``, in order, with the same
        outcomes (each level's among them) and counters; each writable level takes
        them in one batch write (its ``set_entries``). Bad arguments raise before
        anything is stored."""
        batch = [
            (coerce_key(k), coerce_value(v, "TieredProgramCache.set_entries"), check_meta(m))
            for k, v, m in items
        ]
        if self._locker_index is None:
            return [self._nowhere() for _ in batch]
        per_level = [
            self._put_many(i, batch, "store an entry")
            if self._writable[i]
            else [_READ_ONLY_LEVEL] * len(batch)
            for i in range(len(self._levels))
        ]
        return [
            self._combined([done[n] for done in per_level], len(data))
            for n, (_, data, _) in enumerate(batch)
        ]

    def _nowhere(self) -> StoreOutcome:
        """A store into a tier whose every level is read-only: counted and noted."""
        every = (_READ_ONLY_LEVEL,) * len(self._levels)
        outcome = StoreOutcome(READ_ONLY, "every level is read-only", levels=every)
        self._tally_failure("write_failures")
        events.note_dropped(outcome.reason, outcome.detail)
        return outcome

    def _combined(self, levels: Sequence[StoreOutcome], nbytes: int) -> StoreOutcome:
        """One store's outcome from what each level did (``levels``, one per level):
        stored, and counted, when one writable level took it; else the last writable
        level's reason."""
        dropped = [
            i for i, done in enumerate(levels) if self._writable[i] and done.reason != STORED
        ]
        if len(dropped) == sum(self._writable):
            last = levels[dropped[-1]]
            return StoreOutcome(last.reason, last.detail, last.kept, tuple(levels))
        self._tally_store(nbytes)
        if not dropped:
            return StoreOutcome(STORED, levels=tuple(levels))
        why = "; ".join(
            f"level {i} ({self._kind(i)}) {levels[i].reason}: {levels[i].detail}" for i in dropped
        )
        return StoreOutcome(STORED, f"not stored in {why}", levels=tuple(levels))

    def __setitem__(self, key: CacheKey, value: CacheValue) -> None:
        self.set_entry(key, value)

    def __delitem__(self, key: CacheKey) -> None:
        """Delete from every writable level; KeyError if none of them had it."""
        k = coerce_key(key)
        removed = False
        for i, level in enumerate(self._levels):
            if self._writable[i]:
                try:
                    del level[k]
                    removed = True
                except KeyError:
                    pass
        if not removed:
            raise KeyError(key)

    def clear(self) -> None:
        """Clear every writable level (read-only levels keep their entries)."""
        for i, level in enumerate(self._levels):
            if self._writable[i]:
                level.clear()

    def __len__(self) -> int:
        """Distinct entries over all levels (lists every level)."""
        return len({e.id for e in self.iter_entries()})

    # -- listing and maintenance --------------------------------------------------------------
    def iter_entries(self) -> Iterator[EntryInfo]:
        """Each entry once, as the fastest level holding it describes it."""
        seen: set[str] = set()
        for level in self._levels:
            for info in level.iter_entries():
                if info.id not in seen:
                    seen.add(info.id)
                    yield info

    def check_entry(self, entry_id: str) -> str | None:
        """None when every level holding the entry verifies it, else the first problem
        (prefixed with its level). KeyError when no level holds it."""
        present = False
        for i, level in enumerate(self._levels):
            try:
                problem = level.check_entry(entry_id)
            except KeyError:
                continue
            present = True
            if problem is not None:
                return f"level {i} ({self._kind(i)}): {problem}"
        if not present:
            raise KeyError(entry_id)
        return None

    def read_entry(self, entry_id: str) -> CacheEntry | None:
        for level in self._levels:
            entry = level.read_entry(entry_id)
            if entry is not None:
                return entry
        return None

    def remove_entry(self, entry_id: str) -> bool:
        """Remove from every writable level; whether any removed it."""
        removed = False
        for i, level in enumerate(self._levels):
            if self._writable[i]:
                removed = level.remove_entry(entry_id) or removed
        return removed

    # -- single-flight ------------------------------------------------------------------------
    def lock(
        self, key: CacheKey, timeout: float | None = DEFAULT_LOCK_TIMEOUT
    ) -> AbstractContextManager[bool]:
        """The widest writable level's lock (threads of this process if none is
        writable), behind the host level's when there is one (module docstring); one
        ``timeout`` bounds both waits."""
        return hold(self, coerce_key(key), timeout)

    def _missed_behind(self, i: int, counted: bool) -> None:
        """Count the miss a lookup of level ``i`` would have counted, without asking it."""
        if counted:
            count_at(self._levels[i], None)
            if self._ledger.open:
                self._ledger.counted.setdefault(i, False)

    def _begin_request(self) -> None:  # a request counting its answer itself (_ledger)
        self._ledger.start()

    def _tally_answer(self, key: bytes, entry: CacheEntry | None) -> None:
        """Count a request's answer here and at the levels it reached (``_ledger``)."""
        tally_answer(self._ledger, self._levels, key, entry)
        self._tally(entry)

    def _after_claim(self, key: bytes, counted: bool) -> tuple[int, bool]:
        """For a look-again under this thread's claim of ``key``: the widest level's
        index when the claim found it absent there (it holds the lease), else -1; and
        whether a claim handed the entry over (counted as a hit where it was found, so
        the look-again asks quietly). After a hand-over, each level the first lookup
        asked in front of the level that handed it over counts its miss here, as
        ``counted`` says (each level counts every lookup that reached it)."""
        mark = self._claimed.get(key)
        if mark is None or mark[0] != get_ident():
            return -1, False
        if mark[1] >= 0:
            for i in range(min(mark[1], len(self._front))):
                self._missed_behind(i, counted)
            if self._ledger.open:
                self._ledger.counted[mark[1]] = True  # its claim counted the hit
            return -1, True
        return (-1 if self._locker_index is None else self._locker_index), False

    # -- statistics and lifetime ----------------------------------------------------------------
    def stats(self) -> CacheStats:
        """What callers saw, plus each level's failure counters."""
        out = self._stats.copy()
        for level in self._levels:
            own = level.stats()
            for name in _FAILURE_FIELDS:
                setattr(out, name, getattr(out, name) + getattr(own, name))
        return out

    def level_stats(self) -> list[CacheStats]:
        """Each level's own counters, fastest first."""
        return [level.stats() for level in self._levels]

    def totals_level(self) -> int | None:
        """The index of the level ``total_stats()`` reports, None for ``stats()``."""
        return self._totals_level()

    def _totals_level(self) -> int | None:
        """The index of the level ``total_stats()`` reports, None for ``stats()``."""
        for i in reversed(range(len(self._levels))):
            if hasattr(self._levels[i], "total_stats"):
                return i
        return None

    def total_stats(self) -> CacheStats:
        """The widest level that keeps shared totals (``total_stats``): e.g. the fleet's."""
        i = self._totals_level()
        if i is None:
            return self.stats()
        totals: CacheStats = getattr(self._levels[i], "total_stats")()  # noqa: B009 - not on the ABC
        return totals

    def zero_stats(self) -> None:
        """Restart ``stats()`` and ``total_stats()`` from zero: this cache's own
        counters and every writable level's (each level's ``zero_stats()``: for a
        shared level, for all its users, e.g. a Redis fleet's).

        A read-only level is never written, so its counters are left alone; when it is
        the level ``total_stats()`` reports, PermissionError (its ``level``: that
        level's index), and nothing is reset. A
        writable level that cannot reset its counters (NotImplementedError) or fails
        (OSError) does not stop the others: the first such error is raised after them,
        naming its level.
        """
        shown = self._totals_level()
        if shown is not None and not self._writable[shown]:
            refused = PermissionError(
                f"level {shown} ({self._kind(shown)}) is read-only: its "
                "shared counters, which total_stats() reports, are its writers' to reset"
            )
            refused.level = shown  # type: ignore[attr-defined]  # which one, for a caller's words
            raise refused
        failed: list[tuple[int, Exception]] = []
        for i, level in enumerate(self._levels):
            if self._writable[i]:
                try:
                    level.zero_stats()
                except (NotImplementedError, OSError) as exc:
                    failed.append((i, exc))
        self._stats = CacheStats()
        if failed:
            where, first = failed[0]
            kinds = (NotImplementedError, ConnectionError, PermissionError, OSError)
            kind = next(k for k in kinds if isinstance(first, k))
            raise kind(f"level {where} ({self._kind(where)}): {first}") from first

    def close(self) -> None:
        """Close every level (each once, even if one raises)."""
        errors = []
        for level in self._levels:
            try:
                level.close()
            except Exception as exc:  # close the rest, then report
                errors.append(exc)
        if errors:
            raise errors[0]

    def __repr__(self) -> str:
        inner = ", ".join(
            repr(lv) + ("" if self._writable[i] else " (read-only)")
            for i, lv in enumerate(self._levels)
        )
        return f"TieredProgramCache({inner})"
