"""Warm sets: the entries a job read or stored, kept under a name, fetched in bulk.

**Where a set lives.** In the cache itself: one entry under the key
``cuforge-warm-set\\0<name>`` whose metadata record has ``kind = "warm-set"``, the
name and how many entries it lists, and whose payload is the zlib-compressed list
of the listed entries' cache keys (hex, one a line). Keys, not entry ids: a key is
what a batched read (``get_entries``) and a store into another level need, and an
id cannot be turned back into one. The set is an entry like any other: integrity-
checked, signed with ``$CUFORGE_CACHE_SECRET``, shown by ``cuforge cache ls``.
A set that does not verify, does not decode, or lists more than ``MAX_KEYS`` keys
is treated as absent (a warning), never as a partial list. Its record may refer to
the set's pack (``warmpacks``: the listed entries as a few large entries in the
shared levels), under ``"pack"``.

**Recording.** :class:`Recorder` wraps the cache a job's integrations use and notes
the key of every entry read (a hit) or stored; with a journal file it appends each
new key there at once (one line, ``O_APPEND``), so a process that is killed has
already written what it touched. :func:`publish` merges what the recorders noted
into the named set: ``replace=True`` (a job that ended well) makes the set exactly
what this run read or stored; otherwise (periodic publishes, a failed or killed
job) the run's keys are added to the set. A ``replace`` publish also packs the set
when its keys are not the ones its pack holds (``warmpacks.build``); adding keeps
the set's pack.

**Prefetching.** :func:`prefetch` reads every listed entry into the local level of
a tier -- the first persistent level of ``file:///local,redis://shared`` -- in
batches, through the tier's own batched read in two steps (``lookup_entries``): two
threads look batches up while the calling thread writes what the batches before
found, so the network and the disk work at once with no more threads than a 2-core
host runs (each thread more cost CPU in GIL hand-offs and gained nothing: see
docs/integrations.md). Each level is asked in one batch for what the faster ones
missed (Redis: one MGET; S3: concurrent GETs, ``s3._store.GET_CONCURRENCY`` at a
time), every entry verified, and what a batch found is written into the local level
in one batch write (``set_entries``:
FileStream opens its directories once and updates its size ledger once per batch,
each entry still staged and renamed on its own, so a crash leaves it whole or a
miss; SQLite writes the batch in one transaction). An entry absent or damaged is
skipped (a miss the job may compile), a level that fails is a counted failure:
prefetching never fails the job. Given the set's pack, the keys the local level
lacks come from the pack's chunks first (``warmpacks.land``: a few requests instead
of one per entry), and only what the pack did not bring goes the way above.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import threading
import time
import warnings
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from cuforge._stack import outside_level
from cuforge.storage.base import (
    CacheReadWarning,
    CacheWriteWarning,
    EntryCache,
    ProgramCacheResource,
    lookup_of,
)
from cuforge.storage.entry import CacheEntry
from cuforge.storage.outcome import STORED_OUTCOME, StoreOutcome
from cuforge.storage.record import decode_record, encode_record

from . import warmpacks
from .warmpacks import PackRef

__all__ = [
    "KIND",
    "MAX_KEYS",
    "Listed",
    "Prefetched",
    "Recorder",
    "load",
    "load_set",
    "local_tier",
    "prefetch",
    "publish",
    "read_journals",
    "recording",
    "set_key",
    "store",
]

KIND = "warm-set"
#: A set listing more keys than this is refused (as absent): a bound on what a
#: damaged or hostile set can make a job fetch.
MAX_KEYS = 1_000_000
_MAX_PAYLOAD = 256 << 20  # decompressed
_PREFIX = b"cuforge-warm-set\0"


def set_key(name: str) -> bytes:
    """The cache key of the warm set ``name``; ValueError for an empty or odd name."""
    if not isinstance(name, str) or not name.strip() or "\0" in name or "\n" in name:
        raise ValueError(f"warm set name: expected a non-empty one-line name, got {name!r}")
    return _PREFIX + name.encode("utf-8")


def _encode(keys: Iterable[bytes]) -> bytes:
    return zlib.compress(b"\n".join(sorted({k.hex().encode() for k in keys})), 6)


def _decode(payload: bytes) -> list[bytes] | None:
    try:
        inflate = zlib.decompressobj()
        raw = inflate.decompress(payload, _MAX_PAYLOAD)
        if inflate.unconsumed_tail or not inflate.eof:
            return None
        lines = raw.split(b"\n") if raw else []
        if len(lines) > MAX_KEYS:
            return None
        return [bytes.fromhex(line.decode("ascii")) for line in lines]
    except (zlib.error, ValueError, UnicodeDecodeError):
        return None


class Listed:
    """A stored warm set: the ``keys`` it lists and the ``pack`` it refers to (a
    :class:`~cuforge.integrations.warmpacks.PackRef`, or None)."""

    __slots__ = ("keys", "pack")

    def __init__(self, keys: list[bytes], pack: PackRef | None) -> None:
        self.keys, self.pack = keys, pack


def load(cache: ProgramCacheResource, name: str) -> list[bytes] | None:
    """The keys the warm set ``name`` lists, or None when there is no such set (also
    when the stored one does not verify or decode: warned, treated as absent)."""
    found = load_set(cache, name)
    return None if found is None else found.keys


def load_set(cache: ProgramCacheResource, name: str) -> Listed | None:
    """The warm set ``name`` (its keys and its pack), or None as :func:`load` says."""
    key = set_key(name)
    try:  # a set is no program: its lookup is not one of the cache's hits or misses
        entry = lookup_of(cache, key, count=False)
    except Exception as exc:  # a cache fault: no set, the job goes on
        _warn(CacheReadWarning, f"warm set {name!r}: lookup failed ({type(exc).__name__}: {exc})")
        return None
    if entry is None:
        return None
    record = decode_record(entry.meta, KIND)
    keys = None if record is None or record.get("name") != name else _decode(entry.data)
    if keys is None or record is None:
        _warn(CacheReadWarning, f"warm set {name!r}: the stored set is not one; ignored")
        return None
    return Listed(keys, PackRef.of_record(record.get("pack")))


def store(
    cache: ProgramCacheResource, name: str, keys: Iterable[bytes], pack: PackRef | None = None
) -> bool:
    """Store the warm set ``name`` listing ``keys`` (and referring to ``pack``); False
    when the store was dropped (warned)."""
    key = set_key(name)
    # a set never lists sets or packs
    listed = {k for k in keys if not k.startswith(_PREFIX) and not warmpacks.is_pack_key(k)}
    payload = _encode(listed)
    fields: dict[str, Any] = {"name": name, "key": name, "entries": len(listed)}
    if pack is not None:
        fields["pack"] = pack.as_record()
    meta = encode_record(KIND, fields)
    try:
        outcome = cache.set_entry(key, payload, meta)
    except Exception as exc:  # a cache fault never fails the job
        _warn(CacheWriteWarning, f"warm set {name!r}: store failed ({type(exc).__name__}: {exc})")
        return False
    return outcome is None or bool(getattr(outcome, "stored", True))


def publish(cache: ProgramCacheResource, name: str, keys: Iterable[bytes], *, replace: bool) -> int:
    """Make the warm set ``name`` list ``keys`` (``replace``) or add them to it; returns
    how many keys the set lists now (0 when the store was dropped). Under the set's
    lock, so two jobs publishing the same set at once never lose each other's keys
    when adding. ``replace`` also packs the set (``warmpacks``) when its key list is
    not the one its pack was built for: the chunks stored first, the set referring
    to them last, the previous pack's chunks removed after; adding keeps the set's
    pack as it is (it still covers the keys it holds)."""
    keys = {k for k in keys if not k.startswith(_PREFIX) and not warmpacks.is_pack_key(k)}
    base = cache.inner if isinstance(cache, Recorder) else cache
    with contextlib.ExitStack() as stack:
        with contextlib.suppress(Exception):  # no lock: a lost update, never a failure
            stack.enter_context(cache.lock(set_key(name), timeout=10.0))
        before = load_set(cache, name)
        old = None if before is None else before.pack
        if not replace:
            keys |= set(() if before is None else before.keys)
            return len(keys) if store(cache, name, keys, old) else 0
        pack = old
        if old is None or old.id != warmpacks.pack_id(keys) or warmpacks.stale(name, old):
            pack = warmpacks.build(base, name, keys)
        if not store(cache, name, keys, pack):
            if pack is not old:  # nobody refers to the new pack
                warmpacks.remove(base, name, pack, keep=_kept(old, pack))
            return 0
        if old is not None and pack is not old:
            warmpacks.remove(base, name, old, keep=_kept(pack, old))
        return len(keys)
    return 0  # pragma: no cover - mypy: the with block always returns


def _kept(other: PackRef | None, ref: PackRef | None) -> int:
    """How many of ``ref``'s chunks ``other`` (under the same id) stored again: those
    stay when ``ref`` is removed."""
    return other.chunks if other is not None and ref is not None and other.id == ref.id else 0


def _warn(category: type[Warning], what: str) -> None:
    warnings.warn(f"cuforge: {what}", category, stacklevel=outside_level())


# -- recording -------------------------------------------------------------------------


class Recorder(EntryCache):
    """``inner`` as it is, noting the key of every entry read (a hit) or stored.

    Everything is ``inner``'s: lookups, stores, locks, counters, listing. ``keys()``
    is what was noted so far. With ``journal`` (a path), each key noted for the
    first time is also appended there as one hex line at once (``O_APPEND``, one
    ``write``), so a killed process loses nothing it noted; a journal that cannot
    be written is warned about once and dropped (recording goes on in memory).
    """

    def __init__(self, inner: ProgramCacheResource, journal: str | None = None) -> None:
        # ProgramCacheResource.__init__ is not called: the counters are inner's.
        self._inner = inner
        self._seen: set[bytes] = set()
        self._mutex = threading.Lock()
        self._journal_fd: int | None = None
        if journal is not None:
            try:
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
                self._journal_fd = os.open(journal, flags, 0o600)
            except OSError as exc:
                _warn(CacheWriteWarning, f"warm set journal {journal}: {exc.strerror or exc}")

    @property
    def inner(self) -> ProgramCacheResource:
        """The cache that does the work."""
        return self._inner

    def keys(self) -> set[bytes]:
        """The keys noted so far (a copy)."""
        with self._mutex:
            return set(self._seen)

    def note(self, key: bytes) -> None:
        """Note ``key`` as used by this job though it was neither read nor stored
        through here (a mirrored file that was already in its directory)."""
        self._note(key)

    def _note(self, key: Any) -> None:
        k = key if type(key) is bytes else _coerce(key)
        if k in self._seen:
            return
        with self._mutex:
            if k in self._seen:
                return
            self._seen.add(k)
            fd = self._journal_fd
            if fd is None:
                return
            try:
                os.write(fd, k.hex().encode() + b"\n")
            except OSError as exc:
                self._journal_fd = None
                with contextlib.suppress(OSError):
                    os.close(fd)
                _warn(CacheWriteWarning, f"warm set journal: {exc.strerror or exc}; not kept")

    # -- reads --------------------------------------------------------------------------
    def get_entry(
        self, key: Any, *, count: bool = True, count_miss: bool | None = None
    ) -> CacheEntry | None:
        """``inner``'s entry, counted there as this lookup says (``count_miss``: see
        ``storage.base.EntryCache``)."""
        entry = lookup_of(self._inner, key, count, count_miss)
        if entry is not None:
            self._note(key)
        return entry

    def get_entries(self, keys: Iterable[Any]) -> list[Any]:
        ks = list(keys)
        found = self._inner.get_entries(ks)
        for k, entry in zip(ks, found, strict=True):
            if entry is not None:
                self._note(k)
        return found

    def __getitem__(self, key: Any) -> bytes:
        data = self._inner[key]
        self._note(key)
        return data

    def get(self, key: Any, default: bytes | None = None) -> bytes | None:
        data = self._inner.get(key)
        if data is None:
            return default
        self._note(key)
        return data

    # -- writes -------------------------------------------------------------------------
    def set_entry(self, key: Any, value: Any, meta: bytes = b"") -> StoreOutcome:
        """``inner``'s store, and its outcome."""
        outcome = self._inner.set_entry(key, value, meta)
        self._note(key)
        return outcome or STORED_OUTCOME

    def set_entries(self, items: Iterable[tuple[Any, Any, bytes]]) -> list[StoreOutcome]:
        """``inner``'s batch store, and its outcomes."""
        batch = list(items)
        outcomes = self._inner.set_entries(batch)
        for key, _, _ in batch:
            self._note(key)
        return [o or STORED_OUTCOME for o in outcomes]

    def __setitem__(self, key: Any, value: Any) -> None:
        self._inner[key] = value
        self._note(key)

    def __delitem__(self, key: Any) -> None:
        del self._inner[key]

    # -- everything else is inner's -----------------------------------------------------
    def __len__(self) -> int:
        return len(self._inner)

    def clear(self) -> None:
        self._inner.clear()

    def lock(self, key: Any, timeout: float | None = 120.0) -> Any:
        return self._inner.lock(key, timeout)

    def iter_entries(self) -> Iterator[Any]:
        return self._inner.iter_entries()

    def check_entry(self, entry_id: str) -> str | None:
        return self._inner.check_entry(entry_id)

    def read_entry(self, entry_id: str) -> Any:
        return self._inner.read_entry(entry_id)

    def remove_entry(self, entry_id: str) -> bool:
        return self._inner.remove_entry(entry_id)

    def stats(self) -> Any:
        return self._inner.stats()

    def _begin_request(self) -> None:
        self._inner._begin_request()

    def _tally_answer(self, key: bytes, entry: CacheEntry | None) -> None:
        self._inner._tally_answer(key, entry)

    def zero_stats(self) -> None:
        self._inner.zero_stats()

    def close(self) -> None:
        """Close the journal (the inner cache is its owner's to close)."""
        with self._mutex:
            fd, self._journal_fd = self._journal_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_inner", "_seen", "_mutex", "_journal_fd"):
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"Recorder({self._inner!r})"


def _coerce(key: Any) -> bytes:
    if isinstance(key, str):
        return key.encode("utf-8")
    return bytes(key)


def recording(cache: ProgramCacheResource, tag: str) -> ProgramCacheResource:
    """``cache`` in a :class:`Recorder` journaling into this process's journal ``tag``
    of the ``cuforge run --warm-set`` job it belongs to (``_bootstrap.journal_file``:
    ``$CUFORGE_RUN_JOURNAL/<pid>-<tag>.keys``), so what it reads or stores through
    ``cache`` joins the run's warm set as a Python job's ``compile(cache=True)`` does;
    ``cache`` itself outside such a job. The caller closes a Recorder it got (its
    journal; ``cache`` stays the caller's). A journal that cannot be written is one
    warning (:class:`Recorder`)."""
    from ._bootstrap import journal_file

    path = journal_file(tag)
    return cache if path is None else Recorder(cache, path)


def read_journals(directory: str) -> set[bytes]:
    """Every key the journals (``*.keys``) in ``directory`` list; lines that are not
    whole hex keys (a write cut short by a kill) are skipped."""
    keys: set[bytes] = set()
    try:
        names = os.listdir(directory)
    except OSError:
        return keys
    for fname in names:
        if not fname.endswith(".keys"):
            continue
        try:
            with open(os.path.join(directory, fname), "rb") as f:
                lines = f.read().split(b"\n")
        except OSError:
            continue
        for line in lines[:-1] if lines and lines[-1] != b"" else lines:
            with contextlib.suppress(ValueError):
                if line:
                    keys.add(bytes.fromhex(line.decode("ascii")))
    return keys


# -- prefetching -----------------------------------------------------------------------


class Prefetched:
    """What :func:`prefetch` did: ``listed`` keys, ``fetched`` (now in the local
    level), ``missing`` (in no level, or damaged), ``seconds``."""

    __slots__ = ("fetched", "listed", "missing", "seconds")

    def __init__(self, listed: int, fetched: int, missing: int, seconds: float) -> None:
        self.listed, self.fetched, self.missing, self.seconds = listed, fetched, missing, seconds

    def __repr__(self) -> str:
        return (
            f"Prefetched(listed={self.listed}, fetched={self.fetched}, "
            f"missing={self.missing}, seconds={self.seconds:.3f})"
        )


def local_tier(cache: ProgramCacheResource) -> ProgramCacheResource | None:
    """The tier to prefetch through: ``cache``'s levels from its first persistent one
    (the local level) on, so memory levels in front are not filled in this process;
    None when ``cache`` is no tier with a writable local level and a level behind it
    (there is no local level to fetch into)."""
    from cuforge.storage.tiered import TieredProgramCache

    inner = cache.inner if isinstance(cache, Recorder) else cache
    if not isinstance(inner, TieredProgramCache):
        return None
    # The first persistent level is open (a URL's always is); those behind it are not
    # opened here: one that cannot open is the prefetch's counted failure, not ours.
    found = inner.first_persistent()
    if found is None:
        return None
    first = found[0]
    if first in set(inner.read_only) or first == inner.depth - 1:
        return None
    return inner if first == 0 else inner.tail(first)


def prefetch(
    cache: ProgramCacheResource,
    keys: list[bytes],
    *,
    batch: int = 64,
    workers: int = 2,
    name: str | None = None,
    pack: PackRef | None = None,
) -> Prefetched:
    """Read ``keys`` into ``cache``'s local level (see the module docstring), ``batch``
    keys per lookup, ``workers`` batches looked up at a time on threads of their own
    while this thread writes what the batches before found (the tier's
    ``lookup_entries``: at most ``workers + 2`` batches are held in memory). ``cache``
    is the tier :func:`local_tier` returned (another cache: one ``get_entries`` per
    batch). With the set's ``name`` and ``pack`` (``load_set``), the keys the local
    level lacks come from the pack's chunks first (``warmpacks.land``); what the pack
    did not bring goes the way above. Never raises for a cache fault."""
    start = time.perf_counter()
    listed, landed = len(keys), 0
    if pack is not None and name is not None:
        landed, keys = warmpacks.land(cache, name, pack, keys, workers=workers)
    batches = [keys[i : i + batch] for i in range(0, len(keys), batch)]
    lookup = getattr(cache, "lookup_entries", None)

    def look(part: list[bytes]) -> tuple[list[Any], Any]:
        try:
            if lookup is None:
                return cache.get_entries(part), None
            found, backfill = lookup(part)
            return found, backfill
        except Exception as exc:  # a fault is a miss for the whole batch
            _warn(CacheReadWarning, f"prefetch: lookup failed ({type(exc).__name__}: {exc})")
            return [], None

    def land(looked: tuple[list[Any], Any]) -> int:
        found, backfill = looked
        if backfill is not None:
            try:
                backfill()
            except Exception as exc:  # the levels count their own; anything else warns
                _warn(CacheWriteWarning, f"prefetch: store failed ({type(exc).__name__}: {exc})")
        return sum(e is not None for e in found)

    fetched = 0
    if len(batches) <= 1 or workers < 1:
        fetched = sum(land(look(b)) for b in batches)
    else:
        from concurrent.futures import Future, ThreadPoolExecutor

        todo = iter(batches)
        with ThreadPoolExecutor(min(workers, len(batches)), "cuforge-prefetch") as pool:
            ahead: collections.deque[Future[tuple[list[Any], Any]]] = collections.deque(
                pool.submit(look, b) for b in itertools.islice(todo, workers + 1)
            )
            while ahead:
                looked = ahead.popleft().result()
                for b in itertools.islice(todo, 1):
                    ahead.append(pool.submit(look, b))
                fetched += land(looked)
    fetched += landed
    return Prefetched(listed, fetched, listed - fetched, time.perf_counter() - start)
