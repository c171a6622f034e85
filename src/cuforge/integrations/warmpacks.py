"""Warm-set packs: a warm set's entries stored as a few large entries, so a prefetch
is a handful of requests instead of one per entry.

**What a pack is.** When a warm set is published with ``replace=True`` (a job that
ended well) and its key list is not the one its current pack was built for,
:func:`build` reads every listed entry through the cache -- a verified get, as any
get; an entry missing is left out -- and stores their ``(key, meta, data)`` records
concatenated in chunks of about :data:`CHUNK_BYTES`, each an ordinary cache entry
under ``cuforge-warm-pack\\0<name>\\0<pack id>\\0<i>`` (the pack id: a digest of the
sorted listed keys) whose metadata record has ``kind = "warm-pack"``. The chunks go
into the levels behind the local one (a tier's shared levels; a cache that is no
tier: that cache), never into the local level. The set then refers to its pack
(:class:`PackRef`: id, chunks, entries) -- chunks first, the set last, so no reader
sees a reference to a pack not yet stored; the previous pack's chunks are removed
after (:func:`remove`, best effort: pack keys are cuforge's own).

**What is packed.** Only entries of the kinds whose key is derived from everything
that makes their contents (:data:`PACKED_KINDS`: cuforge programs, Triton, Inductor,
CuPy, JAX): their packed bytes are the right output for their key for as long as the
key exists. Entries rewritten in place under one key -- header manifests, the
directory mirror's files and indexes, raw entries of unknown kind -- are not packed,
so a prefetch reads them one by one as they are now, never an older version.

**The guarantee.** A packed entry is exactly the bytes a verified get of its key
returned when the pack was built; a chunk is an entry, so its frame digest and its
``$CUFORGE_CACHE_SECRET`` signature cover the records since, and a chunk that does
not verify is a miss through the levels' own checks. :func:`land` writes a record
into the local level only when the set lists its key and the local level lacked it.

**Failure modes.** A pack that fails to build or store is one warning and no
reference (the set is stored without one); the chunks of the failed pack already
stored are removed. A chunk missing, damaged, unsigned, of another pack or that does
not decode (lengths past its end, more records than :data:`MAX_RECORDS`) is one
warning: its entries are fetched one by one, never a wrong entry, never a failure;
the pack is then noted as incomplete in this process so the next ``replace`` publish
of the set builds it again even though the key list is the same. A pack is a
snapshot: an entry removed from the shared cache after the pack was built (``cuforge
cache prune`` of that entry) can still be brought into a local level by a prefetch
until the next pack replaces it; ``cache clear`` removes packs too (they are
entries).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import itertools
import struct
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from cuforge._stack import outside_level
from cuforge.storage.base import (
    CacheReadWarning,
    CacheWriteWarning,
    ProgramCacheResource,
    lookup_of,
)
from cuforge.storage.entry import CacheEntry
from cuforge.storage.record import decode_record, encode_record

__all__ = [
    "CHUNK_BYTES",
    "KIND",
    "MAX_RECORDS",
    "MIN_MISSING",
    "PACKED_KINDS",
    "PackRef",
    "build",
    "chunk_key",
    "is_pack_key",
    "land",
    "pack_id",
    "remove",
    "shared_levels",
]

KIND = "warm-pack"
#: A chunk is closed once its records pass this many bytes (one record larger than
#: this is a chunk of its own).
CHUNK_BYTES = 8 << 20
#: The kinds a pack holds: keys derived from everything their contents depend on.
PACKED_KINDS = frozenset({"program", "triton", "inductor", "cupy", "jax"})
#: A pack is fetched when at least this many listed keys are missing locally (and at
#: least a quarter of the pack's entries): fewer go one by one, cheaper than the pack.
MIN_MISSING = 16
#: Bounds on what a damaged or hostile chunk can make a reader hold.
MAX_RECORDS = 1_000_000
MAX_CHUNKS = 100_000
_MAX_KEY = 1 << 20
_MAX_META = 16 << 20
_PREFIX = b"cuforge-warm-pack\0"
_MAGIC = b"CFWPACK1"
_HEAD = struct.Struct("<IIQ")  # key, meta, data lengths
_BATCH = 64
#: (set name, pack id) of packs a prefetch found incomplete in this process.
_incomplete: set[tuple[str, str]] = set()


class PackRef:
    """The pack a warm set refers to: its ``id``, how many ``chunks``, how many
    ``entries`` it holds."""

    __slots__ = ("chunks", "entries", "id")

    def __init__(self, id: str, chunks: int, entries: int) -> None:
        self.id, self.chunks, self.entries = id, chunks, entries

    def as_record(self) -> dict[str, Any]:
        return {"id": self.id, "chunks": self.chunks, "entries": self.entries}

    @classmethod
    def of_record(cls, found: object) -> PackRef | None:
        """The reference a set's record holds, or None when it holds none (or no
        valid one: a wrong type, a count out of bounds)."""
        if not isinstance(found, dict):
            return None
        pid, chunks, entries = found.get("id"), found.get("chunks"), found.get("entries")
        if not (
            isinstance(pid, str) and len(pid) == 32 and all(c in "0123456789abcdef" for c in pid)
        ):
            return None
        for n, top in ((chunks, MAX_CHUNKS), (entries, MAX_RECORDS)):
            if type(n) is not int or not 0 < n <= top:
                return None
        return cls(pid, chunks, entries)  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PackRef) and self.as_record() == other.as_record()

    def __hash__(self) -> int:
        return hash((self.id, self.chunks, self.entries))

    def __repr__(self) -> str:
        return f"PackRef({self.id!r}, chunks={self.chunks}, entries={self.entries})"


def pack_id(keys: Iterable[bytes]) -> str:
    """The id of the pack of a set listing ``keys``: blake2b-128 of the sorted keys."""
    h = hashlib.blake2b(b"cuforge-warm-pack-1\0", digest_size=16)
    for k in sorted(set(keys)):
        h.update(len(k).to_bytes(8, "little"))
        h.update(k)
    return h.hexdigest()


def chunk_key(name: str, pid: str, i: int) -> bytes:
    """The cache key of chunk ``i`` of pack ``pid`` of the warm set ``name``."""
    return b"%s%s\0%s\0%d" % (_PREFIX, name.encode("utf-8"), pid.encode("ascii"), i)


def is_pack_key(key: bytes) -> bool:
    """Whether ``key`` is a pack chunk's (a warm set never lists one)."""
    return key.startswith(_PREFIX)


def _warn(category: type[Warning], what: str) -> None:
    warnings.warn(f"cuforge: {what}", category, stacklevel=outside_level())


def shared_levels(cache: ProgramCacheResource) -> list[ProgramCacheResource]:
    """Where ``cache``'s packs are stored: a tier's writable levels behind its first
    persistent one (the local level; when that is the tier's last level, that level
    itself); a cache that is no tier, itself; nothing for a cache in memory only."""
    from cuforge.storage.handle import DriverCache
    from cuforge.storage.tiered import TieredProgramCache

    def in_memory(level: ProgramCacheResource) -> bool:
        return isinstance(level, DriverCache) and level.in_memory

    if not isinstance(cache, TieredProgramCache):
        return [] if in_memory(cache) else [cache]
    levels, ro = cache.levels, set(cache.read_only)
    first = next((i for i, lv in enumerate(levels) if not in_memory(lv)), None)
    if first is None:
        return []
    if first == len(levels) - 1:
        return [] if first in ro else [levels[first]]
    return [lv for i, lv in enumerate(levels) if i > first and i not in ro]


# -- the chunks' format -----------------------------------------------------------------


def _records(found: Iterable[tuple[bytes, CacheEntry]]) -> Iterator[bytes]:
    for key, entry in found:
        yield _HEAD.pack(len(key), len(entry.meta), len(entry.data))
        yield key
        yield entry.meta
        yield entry.data


def decode_chunk(payload: bytes) -> list[tuple[bytes, bytes, bytes]] | None:
    """A chunk's ``(key, meta, data)`` records, or None when it is not one (another
    magic, a length past its end or over the bounds, too many records)."""
    if not payload.startswith(_MAGIC):
        return None
    out: list[tuple[bytes, bytes, bytes]] = []
    at, end = len(_MAGIC), len(payload)
    head = _HEAD.size
    while at < end:
        if at + head > end or len(out) >= MAX_RECORDS:
            return None
        kl, ml, dl = _HEAD.unpack_from(payload, at)
        at += head
        stop = at + kl + ml + dl
        if not 0 < kl <= _MAX_KEY or ml > _MAX_META or stop > end:
            return None
        km = at + kl
        out.append((payload[at:km], payload[km : km + ml], payload[km + ml : stop]))
        at = stop
    return out


def _chunk_meta(name: str, pid: str, i: int, entries: int) -> bytes:
    return encode_record(
        KIND,
        {"name": f"{name} (pack {pid[:12]}, {i + 1})", "set": name, "pack": pid, "chunk": i,
         "entries": entries},
    )  # fmt: skip


def _is_chunk(meta: bytes, name: str, pid: str, i: int) -> bool:
    record = decode_record(meta, KIND)
    return (
        record is not None
        and record.get("set") == name
        and record.get("pack") == pid
        and record.get("chunk") == i
    )


# -- building ----------------------------------------------------------------------------


def build(cache: ProgramCacheResource, name: str, keys: Iterable[bytes]) -> PackRef | None:
    """Build and store the pack of the warm set ``name`` listing ``keys`` (see the
    module docstring); its reference, or None when there is nothing to pack, nowhere
    to store it, or it failed (warned; the chunks already stored removed)."""
    listed = sorted({k for k in keys if not is_pack_key(k)})
    if len(listed) < MIN_MISSING:
        return None
    try:  # opens the levels behind the local one: one that cannot open is no pack
        targets = shared_levels(cache)
    except Exception as exc:
        _warn(CacheWriteWarning, f"warm set {name!r}: no pack ({type(exc).__name__}: {exc})")
        return None
    if not targets:
        return None
    pid = pack_id(listed)
    stored = 0
    try:
        chunks = _chunks(cache, listed)
        entries = 0
        for i, (count, payload) in enumerate(chunks):
            key = chunk_key(name, pid, i)
            meta = _chunk_meta(name, pid, i, count)
            took = [_stored(lv.set_entry(key, payload, meta)) for lv in targets]  # each level
            if not any(took):
                raise OSError(f"chunk {i} was stored in no level")
            stored, entries = i + 1, entries + count
    except Exception as exc:  # a pack is an optimisation: never a failure of the job
        _warn(CacheWriteWarning, f"warm set {name!r}: no pack ({type(exc).__name__}: {exc})")
        remove(cache, name, PackRef(pid, stored, 1) if stored else None)
        return None
    return PackRef(pid, stored, entries) if stored else None


def _stored(outcome: Any) -> bool:
    return outcome is None or bool(getattr(outcome, "stored", False))


def _chunks(cache: ProgramCacheResource, listed: list[bytes]) -> Iterator[tuple[int, bytes]]:
    """The packed kinds' entries of ``listed``, read through ``cache`` uncounted, as
    chunks of about CHUNK_BYTES: (how many records, payload)."""
    parts: list[tuple[bytes, CacheEntry]] = []
    size = 0
    for key in listed:
        entry = lookup_of(cache, key, False, None)
        if entry is None:
            continue
        record = decode_record(entry.meta)
        if record is None or record["kind"] not in PACKED_KINDS:
            continue
        parts.append((key, entry))
        size += _HEAD.size + len(key) + len(entry.meta) + len(entry.data)
        if size >= CHUNK_BYTES:
            yield len(parts), b"".join(itertools.chain((_MAGIC,), _records(parts)))
            parts, size = [], 0
    if parts:
        yield len(parts), b"".join(itertools.chain((_MAGIC,), _records(parts)))


def remove(cache: ProgramCacheResource, name: str, ref: PackRef | None, keep: int = 0) -> None:
    """Delete the chunks of ``ref`` from the levels packs are stored in, best effort
    (pack keys: provably cuforge's own); ``keep``: the first ``keep`` chunks stay (a
    pack rebuilt under the same id wrote them again)."""
    if ref is None:
        return
    try:
        levels = shared_levels(cache)
    except Exception:  # a level that cannot open: its chunks are left for prune
        return
    for level in levels:
        for i in range(keep, ref.chunks):
            with contextlib.suppress(Exception):  # absent, or a fault: left for prune
                del level[chunk_key(name, ref.id, i)]


def stale(name: str, ref: PackRef | None) -> bool:
    """Whether a prefetch in this process found ``ref`` incomplete."""
    return ref is not None and (name, ref.id) in _incomplete


# -- landing -----------------------------------------------------------------------------


def land(
    tier: ProgramCacheResource,
    name: str,
    ref: PackRef,
    keys: Sequence[bytes],
    *,
    workers: int = 2,
) -> tuple[int, list[bytes]]:
    """Bring ``keys`` into ``tier``'s local level (its first level) through the pack
    ``ref``: how many of them are there now, and the keys still to fetch one by one.
    The local level is asked first which keys it lacks; the pack is fetched from the
    levels behind it (``workers`` chunks at a time, each verified as any entry) only
    when enough are missing (:data:`MIN_MISSING`, and a quarter of the pack), and
    each record whose key is listed and missing is written into the local level in
    batches (``set_entries``). Never raises for a cache fault."""
    try:  # opens the levels behind: one that cannot open leaves it all to the per-key way
        levels: tuple[ProgramCacheResource, ...] = getattr(tier, "levels", ())
    except Exception:
        return 0, list(keys)
    if len(levels) < 2:
        return 0, list(keys)
    local, behind = levels[0], levels[1:]
    missing: set[bytes] = set()
    present = 0
    for at in range(0, len(keys), _BATCH):
        part = keys[at : at + _BATCH]
        try:
            found = local.get_entries(part)
        except Exception:  # the local level failing: everything goes one by one
            return 0, list(keys)
        present += sum(e is not None for e in found)
        missing.update(k for k, e in zip(part, found, strict=True) if e is None)
    if len(missing) < MIN_MISSING or 4 * len(missing) < ref.entries:
        return present, [k for k in keys if k in missing]
    wanted = len(missing)
    broken = _fetch(local, behind, name, ref, missing, workers)
    if broken:
        _incomplete.add((name, ref.id))
        _warn(
            CacheReadWarning,
            f"warm set {name!r}: pack chunks {', '.join(map(str, broken))} missing, damaged "
            "or not a pack; their entries are fetched one by one",
        )
    return present + wanted - len(missing), [k for k in keys if k in missing]


def _fetch(
    local: ProgramCacheResource,
    behind: Sequence[ProgramCacheResource],
    name: str,
    ref: PackRef,
    missing: set[bytes],
    workers: int,
) -> list[int]:
    """Fetch ``ref``'s chunks from ``behind`` and write the records ``missing`` names
    into ``local`` (removing them from ``missing``); the chunks that failed."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from cuforge.storage.tiered import TieredProgramCache

    source = (
        behind[0]
        if len(behind) == 1  # read-only: a chunk found behind is not copied forward
        else TieredProgramCache(*behind, read_only=range(len(behind)))
    )

    def get(i: int) -> CacheEntry | None:
        try:
            return source.get_entries([chunk_key(name, ref.id, i)])[0]
        except Exception:  # a fault is a missing chunk
            return None

    broken: list[int] = []
    with ThreadPoolExecutor(max(1, workers), "cuforge-pack") as pool:
        todo = iter(range(ref.chunks))
        ahead: collections.deque[tuple[int, Future[CacheEntry | None]]] = collections.deque(
            (i, pool.submit(get, i)) for i in itertools.islice(todo, max(1, workers))
        )
        while ahead:
            i, future = ahead.popleft()
            entry = future.result()
            for j in itertools.islice(todo, 1):
                ahead.append((j, pool.submit(get, j)))
            records = None
            if entry is not None and _is_chunk(entry.meta, name, ref.id, i):
                records = decode_chunk(entry.data)
            if records is None:
                broken.append(i)
                continue
            del entry
            wanted = [r for r in records if r[0] in missing]
            for at in range(0, len(wanted), _BATCH):
                part = wanted[at : at + _BATCH]
                try:
                    outcomes = local.set_entries([(k, d, m) for k, m, d in part])
                except Exception as exc:  # the per-key path tries these again
                    _warn(
                        CacheWriteWarning, f"prefetch: store failed ({type(exc).__name__}: {exc})"
                    )
                    continue
                missing.difference_update(
                    k for (k, _, _), o in zip(part, outcomes, strict=True) if _stored(o)
                )
    return broken
