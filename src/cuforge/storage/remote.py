"""The one remote implementation: a driver over a server's connection.

Every backend whose entries live on a server (Redis, an S3 bucket) is a
:class:`RemoteDriver` over its :class:`Store` -- the connection, which the backend
writes: get, put, delete, list, lease objects and counters in the server's own
terms. What is the same for every server is here, once:

- **Framing.** An entry is one value (``storage.frame``, the store's magic): a
  lookup is one read, verified against the key; a value that does not verify is a
  damaged entry, dropped only if it is still the value read (compare-and-delete on
  the server, through ``ownership.delete_owned`` with the store's name proof).
- **Failing open and fast.** A request that raises is a counted miss or a dropped
  store, never an error; the first failure of a handle warns once
  (``CacheReadWarning`` for a lookup, ``CacheWriteWarning`` otherwise), naming the
  cause and the back-off, and when the fleet's counters get the handle's counts
  (:data:`LATER_FAILURES`, per cause: a server that is down, only if it answers
  again before the handle closes; one that refused the request -- a password or
  rights it does not grant -- only if it accepts them; a request never sent, only
  if one can be). A server
  that does not answer is skipped for ``retry_after`` seconds (doubling to
  ``max_retry_after``; ``_breaker``) instead of costing a timeout per compile; one
  that answers with an error is not backed off from. Maintenance calls (listing,
  ``len``, ``clear``, totals) raise one ``ConnectionError`` naming the server and
  the cause instead.
- **Single flight across hosts** (``storage.lease``): a lease taken per key,
  renewed while held, released only if still ours. A waiter waits on the store's
  terms (Redis: the holder's notification; S3: checks sized from the expected fill
  time), costs O(1) requests per fill, stops as soon as the entry is stored -- and
  when the try that found it also read it, hands it over (``claim``: a tier puts it
  in its local levels, so nobody asks the server again).
- **Fleet counters.** What this handle counted since its last flush is sent to
  the server on the core's schedule, at close and at exit (never while backing
  off); ``total_stats()`` reads the fleet's sum. A read-only handle writes nothing
  at all: no stores, removals, leases or counters.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ._breaker import CircuitBreaker
from .base import CacheReadWarning, CacheWriteWarning
from .connection import Store
from .driver import Driver
from .entry import CacheEntry, EntryInfo
from .handle import SharedCache
from .lease import Renewal, wait_for
from .outcome import FAILED, PRESENT, STORED_OUTCOME, UNREACHABLE, Damaged, StoreOutcome
from .ownership import delete_owned
from .stats import CacheStats
from .units import positive_seconds

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from .driver import Found

__all__ = ["LATER_FAILURES", "RemoteCache", "RemoteDriver", "Store"]

#: The end of a handle's one warning, per cause: ``Store.problem``'s ``answered``
#: (False: the server could not be reached; True: it is up and refused the request;
#: None: nothing was sent). The server's counters get what the handle counted only
#: when a flush reaches it and it accepts it; none is sent while backing off. So a
#: process that ends while the server is down, refuses it or cannot be sent to loses
#: its counts (the CLI says so in its words: ``cli._LATER_FAILURES``).
_LATER = (
    "Later failures of this handle are counted in stats() (read_failures, write_failures) "
    "without a warning; the server's shared counters (total_stats()) get them, and the "
    "handle's other counts, "
)
LATER_FAILURES: dict[bool | None, str] = {
    False: _LATER + "only if it answers again before the handle is closed.",
    True: _LATER + "only if it accepts them before the handle is closed: while it refuses "
    "them (as a server refusing the password or the rights does), they are not kept.",
    None: _LATER + "only if this process can send them before the handle is closed: while "
    "it cannot (the cause above), they are not kept.",
}

#: Names listed per batch of listing reads.
_BATCH = 100


class RemoteDriver(Driver):
    """A :class:`~cuforge.storage.driver.Driver` over ``store`` (module docstring)."""

    remote = True
    claim_reads_first = True  # a take answers the entry when it is there

    def __init__(
        self,
        store: Store,
        read_only: bool,
        lock_lease: float,
        retry: tuple[float, float],
        flush: tuple[int, float],
    ) -> None:
        """``retry``: ``(retry_after, max_retry_after)`` seconds of the breaker;
        ``flush``: counters every ``(stats_every operations, stats_interval seconds)``;
        ValueError naming the argument that is not a positive number."""
        self.store = store
        self.frame = store.frame
        self.read_only = bool(read_only)
        self.label = f"cuforge {store.kind} cache {store.where}"
        self.flush_every = max(1, int(flush[0]))
        self.flush_interval_s = positive_seconds("stats_interval", flush[1])
        self._breaker = CircuitBreaker(
            positive_seconds("retry_after", retry[0]), positive_seconds("max_retry_after", retry[1])
        )
        self._lease_s = positive_seconds("lock_lease", lock_lease)
        self._flushed = CacheStats()  # what the fleet has of this handle's counts
        #: What a store skipped while backing off is: UNREACHABLE after an outage,
        #: FAILED after a request this process could not send (``Store.problem``).
        self._skipped = UNREACHABLE
        #: How long the last fill this handle saw took (its own, or a holder's that a
        #: wait measured), in seconds: the hint its leases give waiters.
        self.fill_s: float | None = None
        if store.get_many is not None:
            self.read_many = self._read_many
        if store.put_many is not None:
            self.write_many = self._write_many
        if not read_only:
            self.lease = self._lease
            self.claim = self._claim

    # -- failures -------------------------------------------------------------------
    def _allow(self) -> bool:
        """Whether a request may go out now: the store is usable in this process (else
        warned once) and the breaker is closed or due a probe."""
        broken = self.store.broken
        if broken is not None:
            self.reports.warn_once("remote", CacheReadWarning, f"{self.label}: {broken}")
            return False
        return self._breaker.allow()

    def _failed(self, exc: BaseException, what: str) -> tuple[str, bool | None]:
        """A failed request: back off unless the server answered; warn once per handle.
        Remembers what a store skipped while backing off is (``_skipped``)."""
        phrase, answered = self.store.problem(exc)
        if answered:
            after = f"the server answered with an error, so {what}s fail"
        else:
            self._skipped = UNREACHABLE if answered is False else FAILED
            sent = "" if answered is False else "nothing was sent to the server, so "
            after = (
                f"{sent}lookups are misses and stores are skipped, retrying in "
                f"{self._breaker.failure():g} s"
            )
        self.reports.warn_once(
            "remote",
            CacheReadWarning if what == "lookup" else CacheWriteWarning,
            f"{self.label}: {what} failed ({phrase}); {after}. Compiles are not affected. "
            + LATER_FAILURES[answered],
        )
        return phrase, answered

    @contextmanager
    def _maintenance(self, what: str) -> Iterator[None]:
        """A maintenance call: a failed request is one ConnectionError."""
        store = self.store
        if store.broken is not None:
            raise ConnectionError(f"{store.kind} cache {store.where}: could not {what} "
                                  f"({store.broken})")  # fmt: skip
        try:
            yield
        except store.errors as exc:
            raise ConnectionError(
                f"{store.kind} cache {store.where}: could not {what} ({store.problem(exc)[0]})"
            ) from exc

    # -- lookups --------------------------------------------------------------------
    def locate(self, kd: bytes) -> tuple[bytes, Any]:
        return kd, self.store.name(kd)

    def read(self, loc: tuple[bytes, Any]) -> Found:
        if not self._allow():
            self.reports.unreachable()
            return None
        try:
            value, token = self.store.get(loc[1])
        except Exception as exc:  # every server problem is a miss
            self.reports.unreachable()
            self._failed(exc, "lookup")
            return None
        self._breaker.success()
        return None if value is None else self._verify(loc[0], value, token)

    def _verify(self, kd: bytes, value: bytes, token: Any) -> CacheEntry | Damaged:
        found = self.frame.unpack(kd, value)
        return found if type(found) is CacheEntry else Damaged(found, (value, token))

    def _read_many(self, locs: Sequence[tuple[bytes, Any]]) -> list[Found]:
        """Every key at once (one round trip, or concurrent requests); a server fault
        makes each a counted miss. Each value keeps the token ``get`` would give it,
        so a damaged one is dropped only as it was read."""
        values = None
        if self._allow():
            try:
                values = self.store.get_many([name for _, name in locs])
            except Exception as exc:  # every server problem is a miss
                self._failed(exc, "lookup")
            else:
                self._breaker.success()
        if values is None:
            self.reports.unreachable(len(locs))
            return [None] * len(locs)
        return [
            None
            if v is None
            else self._verify_cut(kd, v, token)
            if type(v) is tuple
            else self._verify(kd, v, token)
            for (kd, _), (v, token) in zip(locs, values, strict=True)
        ]

    def _verify_cut(
        self, kd: bytes, value: tuple[bytes, bytes], token: Any
    ) -> CacheEntry | Damaged:
        """:meth:`_verify` of a value the store read cut before its payload
        (``Frame.unpack_cut``: the payload is not copied); a damaged one keeps the
        whole value, as ``get`` would give it, to be dropped only as it was read."""
        found = self.frame.unpack_cut(kd, *value)
        return found if type(found) is CacheEntry else Damaged(found, (b"".join(value), token))

    def drop(self, loc: tuple[bytes, Any], damaged: Damaged) -> None:
        """Delete a damaged value unless it was replaced since it was read: the name
        is the key's just looked up (the proof); the compare runs on the server."""
        if self.read_only:
            return
        value, token = damaged.token
        store = self.store
        with contextlib.suppress(Exception):
            delete_owned(
                [loc[1]], lambda n: store.id_of(n) is not None,
                lambda names: store.delete_if_same(names[0], value, token), store.where,
            )  # fmt: skip

    def peek(self, loc: tuple[bytes, Any]) -> Found:
        with self._maintenance("read an entry"):
            value = self.store.quiet_get(loc[1])
        return None if value is None else self._verify(loc[0], value, None)

    # -- stores ---------------------------------------------------------------------
    def write(self, loc: tuple[bytes, Any], data: bytes, meta: bytes) -> StoreOutcome:
        kd, name = loc
        entry = CacheEntry(data, meta)
        return self._put([(name, self.frame.pack(kd, data, meta, time.time_ns()), entry)])

    def _write_many(
        self, batch: Sequence[tuple[tuple[bytes, Any], bytes, bytes]]
    ) -> list[StoreOutcome]:
        """Every entry in one request (a pipeline): one outcome, the same for each."""
        now = time.time_ns()
        outcome = self._put(
            [(name, self.frame.pack(kd, d, m, now), CacheEntry(d, m)) for (kd, name), d, m in batch]
        )
        return [outcome] * len(batch)

    def _put(self, batch: list[tuple[Any, bytes, CacheEntry]]) -> StoreOutcome:
        store = self.store
        if not self._allow():
            return StoreOutcome(self._skipped, f"{store.kind} {store.where}: backing off")
        try:
            if len(batch) == 1:
                wrote = store.put(*batch[0])
            else:
                store.put_many([(name, value) for name, value, _ in batch])
                wrote = True
        except Exception as exc:  # a store never breaks the caller
            phrase, answered = self._failed(exc, "store")
            return StoreOutcome(
                UNREACHABLE if answered is False else FAILED,
                f"{store.kind} {store.where}: {phrase}",
            )
        self._breaker.success()
        return STORED_OUTCOME if wrote else PRESENT

    # -- removal and listing (maintenance) --------------------------------------------
    def _proof(self, name: Any) -> bool:
        return self.store.id_of(name) is not None

    def remove(self, loc: tuple[bytes, Any]) -> bool:
        store = self.store
        with self._maintenance("remove an entry"):
            return delete_owned([loc[1]], self._proof, store.unlink, store.where).removed == 1

    def clear(self) -> None:
        """Unlink every name that is provably an entry; everything else stays."""
        store = self.store
        with self._maintenance("clear"):
            batch: list[Any] = []
            for name, _ in store.names():
                batch.append(name)
                if len(batch) >= 500:
                    delete_owned(batch, self._proof, store.unlink, store.where)
                    batch = []
            delete_owned(batch, self._proof, store.unlink, store.where)

    def scan(self) -> Iterator[EntryInfo]:
        store = self.store
        with self._maintenance("list entries"):
            batch: list[tuple[Any, Any]] = []
            for listed in store.names():
                if store.id_of(listed[0]) is None:
                    continue
                batch.append(listed)
                if len(batch) >= _BATCH:
                    yield from store.describe(batch)
                    batch = []
            yield from store.describe(batch)

    def count(self) -> int:
        store = self.store
        with self._maintenance("count entries"):
            return sum(1 for name, _ in store.names() if store.id_of(name) is not None)

    # -- single flight --------------------------------------------------------------
    @contextmanager
    def _lease(self, loc: tuple[bytes, Any], timeout: float | None) -> Iterator[bool]:
        """The key's lease, yielding whether it is held (see :meth:`_claim`); an entry
        the wait read is left for the caller's look-again."""
        with self._claim(loc, timeout, False) as (held, _):
            yield held

    @contextmanager
    def _claim(
        self, loc: tuple[bytes, Any], timeout: float | None, entry_first: bool = True
    ) -> Iterator[tuple[bool, Found]]:
        """The key's lease, yielding ``(held, found)``: ``(True, None)`` while this
        process fills the key; ``(False, entry)`` when the entry was there or stored
        while this one waited and the answer carried it (verified here; damaged is
        None: the look-again drops it); ``(False, None)`` when it was stored but not
        read, at once when the server cannot be reached (or a request fails: warned,
        counted), and at the timeout. ``entry_first``: see ``Store.take``. The lease
        is renewed while held and released after, only if still ours."""
        kd, name = loc
        store, lease_s, expect = self.store, self._lease_s, self.fill_s
        deadline = float("inf") if timeout is None else time.monotonic() + timeout
        # 128 random bits from the OS, as secrets.token_hex(16) (whose import, ~4 ms
        # with base64, hmac and random, a rank paid at its first wait on the fleet).
        token = os.urandom(16).hex()
        got = None
        if self._allow():
            try:
                got = wait_for(
                    lambda: store.take(kd, name, token, lease_s, expect, entry_first),
                    lambda busy, until: store.await_fill(kd, name, busy, until, expect),
                    deadline,
                )
                self._breaker.success()
            except Exception as exc:  # no lease: compile unlocked
                self._failed(exc, "lock")
        held = None if got is None else got.held
        if held is None:
            found: Found = None
            if got is not None:
                if got.fill_s is not None:
                    self._learn(got.fill_s)
                if got.value is not None:
                    found = self._verify(kd, got.value, None) or None
            yield False, found
            return
        began = time.monotonic()
        renewal = Renewal(
            lambda: store.renew(held, lease_s), lease_s / 3, f"cuforge-{store.kind.lower()}-lease"
        )
        try:
            yield True, None
        finally:
            renewal.stop()
            self._learn(time.monotonic() - began)
            with contextlib.suppress(Exception):  # else it expires after one lease
                delete_owned(
                    [held.name], lambda n: n == held.name, lambda _: store.release(held),
                    held.name,
                )  # fmt: skip

    def _learn(self, seconds: float) -> None:
        """One fill took ``seconds``: the hint is the mean of it and the last one."""
        last = self.fill_s
        self.fill_s = seconds if last is None else (last + seconds) / 2

    # -- counters -------------------------------------------------------------------
    def flush(self, stats: CacheStats, final: bool) -> None:
        """Send what this handle counted since its last flush (never while backing off
        or on a read-only handle); errors propagate and nothing is marked sent."""
        if self.read_only or self.store.broken is not None or not self._breaker.allow():
            return
        try:
            self._send(stats, final)
        except Exception as exc:
            if final:  # the last chance: say the counts are lost (once; a failed
                # request warned already, naming what it loses)
                phrase = self.store.problem(exc)[0]
                self.reports.warn_once(
                    "remote", CacheWriteWarning,
                    f"{self.label}: this process's counts (hits and misses included) could "
                    f"not be sent to the server ({phrase}), so the server's counters do not "
                    "include them",
                )  # fmt: skip
            raise

    def _send(self, stats: CacheStats, final: bool) -> None:
        current = stats.copy()
        self.store.send(current - self._flushed, final)
        self._flushed = current

    def totals(self, stats: CacheStats) -> CacheStats:
        """The fleet's counters, after sending this handle's unsent counts."""
        with self._maintenance("read statistics"):
            if not self.read_only:
                self._send(stats, False)
            return self.store.fleet()

    def zero(self, stats: CacheStats) -> None:
        """Restart the fleet's counters for every handle: this one's counts are sent
        first, then the counters deleted; live handles elsewhere go on sending only
        what they count from their last flush."""
        with self._maintenance("reset statistics"):
            self._send(stats, False)
            self.store.zero_fleet()

    # -- lifetime -------------------------------------------------------------------
    def close(self) -> None:
        self.store.close()

    def after_fork(self) -> None:
        self._flushed = CacheStats()
        self.store.after_fork()


class RemoteCache(SharedCache):
    """A handle on a cache on a server: the storage core over a :class:`RemoteDriver`.
    A backend builds its :class:`Store` and calls this constructor with the options
    every remote cache takes (see :class:`RemoteDriver`)."""

    _store: Store

    def __init__(
        self,
        store: Store,
        read_only: bool,
        lock_lease: float,
        retry: tuple[float, float],
        flush: tuple[int, float],
    ) -> None:
        self._store = store
        super().__init__(RemoteDriver(store, read_only, lock_lease, retry, flush))

    @property
    def prefix(self) -> str:
        """Where this cache's names start on the server (other programs' may share it)."""
        return self._store.prefix

    def check_server(self, writes: bool) -> str | None:
        """Whether the server can be used, asked with requests bounded by this handle's
        own timeouts that change nothing on the server (``cuforge doctor``): one read
        (``Store.probe_read``) and, with ``writes``, one request the server checks as a
        store (``Store.probe_write``), sent only once the read answered -- so nothing
        reaches a bucket or database that is not there (a server that creates buckets
        on a first PUT would create it).

        Returns None when the server answers (and, with ``writes``, would take a
        store), else the server's reason for refusing a store. Raises ConnectionError
        naming the server (``Redis cache H:P/0: could not read from the server
        (...)``) when it cannot be reached or refuses reads -- what ``cuforge cache
        stats`` would fail with.
        """
        store = self._store
        if store.broken is not None:
            raise self._unreachable(store.broken)
        try:
            store.probe_read()
        except Exception as exc:
            raise self._unreachable(store.problem(exc)[0]) from exc
        if not writes:
            return None
        try:
            store.probe_write()
        except Exception as exc:
            refused, answered = store.problem(exc)
            if answered is False:
                raise self._unreachable(refused) from exc
            return refused
        return None

    def _unreachable(self, why: str) -> ConnectionError:
        store = self._store
        return ConnectionError(f"{store.kind} cache {store.where}: could not read from the "
                               f"server ({why})")  # fmt: skip

    def total_stats(self) -> CacheStats:
        """Counters summed over every host and process that used this prefix. Live
        handles contribute what they flushed (every ``stats_every`` operations, every
        ``stats_interval`` seconds, at close and at exit); this handle's own unsent
        counts are sent first, and nothing else is written."""
        return super().total_stats()

    def zero_stats(self) -> None:
        """Restart the fleet's counters (``total_stats()``) from zero for every host and
        process using this prefix: this handle first sends what it counted, then the
        fleet's counters are deleted on the server. Live handles elsewhere keep their
        own counters and go on sending only what they count from their last flush, so
        nothing after the reset is counted twice; what one had counted but not sent
        yet (at most ``stats_every`` operations or ``stats_interval`` seconds' worth)
        still arrives. ``stats()`` (this handle's own) is unchanged. PermissionError on
        a read-only handle, ConnectionError when the server cannot be reached."""
        super().zero_stats()
