"""The driver surface: what a backend writes to become a cache.

A cache handle is the storage core (:class:`~cuforge.storage.handle.DriverCache`)
over a :class:`Driver`. The core owns the request lifecycle -- keys and their
digests, the closed and read-only checks, counting, fail-open events and their
warnings, the flush schedule of counters, per-key locks in the process, fork and
exit -- so a driver only moves bytes to and from its medium. Every method may
assume the core has checked the key, the handle and its mode; none counts, warns
or notes a drop (what it learns on its own it tells ``self.reports``, see
``storage.protocol.Reports``).

Required: :meth:`read`, :meth:`write`, :meth:`remove`, :meth:`scan`. The rest
have defaults: keys located by their digest, no batch variants, no cross-process
lease (the core's per-key thread locks still serialise this process), no persisted
counters, listing and clearing through ``scan``.
"""

from __future__ import annotations

from .entry import is_entry_id

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from contextlib import AbstractContextManager
    from typing import Any, Protocol, TypeAlias

    from .entry import CacheEntry, EntryInfo
    from .outcome import Damaged, StoreOutcome
    from .protocol import Reports
    from .stats import CacheStats

    #: What a read finds: a verified entry, a damaged one, or nothing.
    Found: TypeAlias = CacheEntry | Damaged | None

    class Reader(Protocol):
        def read(self, loc: Any, /) -> Found: ...


__all__ = ["Driver"]


class Driver:
    """The base of every driver; see the module docstring.

    ``label`` names the cache in messages (``"cuforge program cache /var/cache/x"``);
    ``read_only``: stores are refused by design (the core drops them, counted, without
    a warning) and nothing is deleted; ``remote``: the driver warns about its own
    failures (``storage.remote``: with the back-off it chose), so the core does not.
    ``lease`` (None here): ``lease(loc, timeout) -> context manager yielding whether
    the cross-process lock is held``, for drivers whose medium can lock. ``claim``
    (None here): the same lock yielding ``(held, found)``, where ``found`` is the
    entry when the wait for the lock ended because a peer stored it and the answer
    carried it (the core counts it as a hit); ``claim_reads_first``: the claim reads
    the entry before it takes the lock, so it holds the lock only where the entry is
    not (a remote driver's; a file lock's claim reads only after a wait).
    """

    label = "cuforge program cache"
    read_only = False
    remote = False
    #: Entries live in this process only (a tier's front level; never persisted).
    in_memory = False
    #: The size cap in bytes the driver keeps (None: none, or the medium's own).
    cap: int | None = None
    #: Counters are flushed every this many operations (and every ``flush_interval_s``).
    flush_every = 1 << 62
    flush_interval_s = 0.0
    lease: Callable[[Any, float | None], AbstractContextManager[bool]] | None = None
    claim: Callable[[Any, float | None], AbstractContextManager[tuple[bool, Found]]] | None = None
    claim_reads_first = False
    #: Batch variants, where the medium answers many keys at once (None: one by one).
    #: ``write_many`` takes ``(loc, data, meta)`` triples and answers one outcome per
    #: triple, in order, each what ``write`` would have answered for it.
    read_many: Callable[[Sequence[Any]], list[Found]] | None = None
    write_many: Callable[[Sequence[tuple[Any, bytes, bytes]]], list[StoreOutcome]] | None = None
    reports: Reports

    def bind(self, reports: Reports) -> None:
        """Called once by the core: where this driver tells what it learns."""
        self.reports = reports

    # -- required ---------------------------------------------------------------------
    def read(self, loc: Any) -> Found:
        """The verified entry at ``loc``, a :class:`Damaged` one, or None (absent, or
        the medium could not be read: then ``reports.unreadable``/``unreachable``)."""
        raise NotImplementedError

    def write(self, loc: Any, data: bytes, meta: bytes) -> StoreOutcome:
        """Store ``data`` with ``meta`` at ``loc``; what happened (never raises for the
        medium: a failure is an outcome)."""
        raise NotImplementedError

    def remove(self, loc: Any) -> bool:
        """Delete the entry at ``loc`` (through ``ownership.delete_owned``); whether
        one went."""
        raise NotImplementedError

    def scan(self) -> Iterator[EntryInfo]:
        """Every entry, unverified (``cuforge cache ls``)."""
        raise NotImplementedError

    # -- defaults ---------------------------------------------------------------------
    def reader(self) -> Reader:
        """Whose ``read`` the core calls for each lookup: this driver, or an object with
        the same answers that is faster to ask (a FileStream memo); asked once, when
        the handle opens."""
        return self

    def locate(self, kd: bytes) -> Any:
        """The driver's name for key digest ``kd`` (memoised per key by the core)."""
        return kd

    def locate_id(self, entry_id: str) -> Any:
        """The locator of a public entry id, or None when ``entry_id`` is not one."""
        if not isinstance(entry_id, str) or not is_entry_id(entry_id):
            return None
        return self.locate(bytes.fromhex(entry_id))

    def peek(self, loc: Any) -> Found:
        """A maintenance read (``verify``, ``show``): as :meth:`read`, but not a use
        (no access time, no recency)."""
        return self.read(loc)

    def drop(self, loc: Any, damaged: Damaged) -> None:
        """Remove the damaged entry ``read`` found, unless it was replaced since; by
        default it stays (a store overwrites it)."""

    def count(self) -> int:
        return sum(1 for _ in self.scan())

    def size(self) -> int:
        return sum(info.size for info in self.scan())

    def clear(self) -> None:
        for info in list(self.scan()):
            self.remove(self.locate_id(info.id))

    def flush(self, stats: CacheStats, final: bool) -> None:
        """Persist this handle's counters (``final``: at close, exit or for totals:
        wait for locks). Errors propagate; the core decides whether they matter."""

    def counts_lost(self, stats: CacheStats) -> str | None:
        """Why this handle's counters cannot reach the cache's shared counters, found
        by persisting ``stats`` now (the core asks once, when it first warns about a
        failed store, to word the warning); None when they are persisted, or the
        driver keeps no shared counters. Never raises."""
        return None

    def totals(self, stats: CacheStats) -> CacheStats:
        """Counters summed over every handle of this cache (``stats``: this one's)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no shared counters")

    def zero(self, stats: CacheStats) -> None:
        """Restart the shared counters from zero (``stats``: this handle's, so far)."""
        raise NotImplementedError(f"{self.label} cannot reset its statistics")

    def close(self) -> None:
        """Release what the driver holds (after the core's last flush)."""

    def after_fork(self) -> None:
        """In a forked child: drop what is the parent's (locks, connections)."""

    def at_exit(self) -> None:
        """At interpreter exit, after the core's last flush."""
