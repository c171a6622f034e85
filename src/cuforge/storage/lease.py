"""Leases on a shared medium: wait for one without polling the fleet; keep it alive.

A lease is a lock that expires: its holder renews it while it works, so a holder
that dies or loses the network frees it within one lease. How a lease is taken,
renewed and released, and how a waiter learns that the holder is done, is the
medium's (a Redis key set ``NX PX`` and a list the holder pushes to; an S3 object
created ``If-None-Match: *``); the loop around them is the same everywhere, so it is
here.

- :func:`wait_for` alternates two calls the medium writes: ``take()`` -- one try, a
  :class:`Claim`: the lease is ours, the entry is stored (with its value when the
  try read it), or another holds the lease (:class:`Busy`: until when, since when,
  how long its fills take) -- and ``await_fill(busy, deadline)``, which waits for
  that holder: a Claim when the entry was stored, None when the lease may be free
  (released without an entry, or past its expiry: take again). A waiter costs O(1)
  requests per fill: Redis blocks on the holder's notification, S3 checks on the
  schedule of :class:`Backoff`, never a fixed fast poll. Every wait ends by the
  lease's expiry (plus :func:`expiry_jitter`), so a holder that died is replaced
  within one lease: of the waiters that try then, exactly one takes it (the
  medium's conditional write decides). Nothing waits past ``deadline``.
- :class:`Renewal` renews a held lease from a daemon thread every ``period``
  seconds until :meth:`Renewal.stop`; a renewal that answers False (the lease was
  taken over: no longer ours) ends it, one that raises is retried at the next
  period (if the medium stays away, the lease runs out and frees the waiters).
"""

from __future__ import annotations

import random
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["Backoff", "Busy", "Claim", "Held", "Renewal", "expiry_jitter", "wait_for"]

#: How long a fill is expected to take when neither the holder nor this process has
#: seen one (seconds): S3 waiters first look this long after the holder started.
DEFAULT_FILL_S = 1.0
#: Waiters look again after a holder's expiry within this share of the lease (at
#: most :data:`MAX_EXPIRY_JITTER_S`), so they do not all ask at the same instant.
EXPIRY_JITTER = 0.05
MAX_EXPIRY_JITTER_S = 0.25

_random = random.Random()  # seeded from os.urandom: processes jitter differently


class Held:
    """A lease held: its ``name`` on the medium, the holder's ``token``, ``tag``
    (what the medium needs to renew or release exactly this lease: an ETag) and
    ``extra`` (what the medium keeps in it besides: S3's start time and hint)."""

    __slots__ = ("extra", "name", "tag", "token")

    def __init__(self, name: Any, token: str, tag: Any = None, extra: Any = None) -> None:
        self.name = name
        self.token = token
        self.tag = tag
        self.extra = extra


class Busy:
    """Another process holds the lease: it ``expires`` (monotonic seconds, this
    process's clock) unless renewed; the holder ``started`` (monotonic, None when
    the medium does not say) and expects its fill to take ``expect`` seconds (None:
    no hint); ``tag`` is what the medium waits on (Redis: the holder's done list)."""

    __slots__ = ("expect", "expires", "started", "tag")

    def __init__(
        self, expires: float, started: float | None = None, expect: float | None = None,
        tag: Any = None,
    ) -> None:  # fmt: skip
        self.expires = expires
        self.started = started
        self.expect = expect
        self.tag = tag


class Claim:
    """One answer of a take or a wait: ``held`` (the lease, now ours), ``stored`` (the
    entry is there: ``value`` is its bytes when the answer carried them, else None
    and the caller reads it), or ``busy`` (who holds it). ``fill_s``: how long the
    fill that stored the entry took, when the medium could tell (S3: the entry's
    store time minus the lease's start, both the holder's clock)."""

    __slots__ = ("busy", "fill_s", "held", "stored", "value")

    def __init__(
        self, held: Held | None = None, stored: bool = False, value: bytes | None = None,
        busy: Busy | None = None, fill_s: float | None = None,
    ) -> None:  # fmt: skip
        self.held = held
        self.stored = stored
        self.value = value
        self.busy = busy
        self.fill_s = fill_s


def expiry_jitter(lease_s: float) -> float:
    """Seconds to wait past a lease's expiry before trying it: a random share of
    :data:`EXPIRY_JITTER` of the lease, at most :data:`MAX_EXPIRY_JITTER_S`."""
    return _random.random() * min(MAX_EXPIRY_JITTER_S, EXPIRY_JITTER * lease_s)


def wait_for(
    take: Callable[[], Claim],
    await_fill: Callable[[Busy, float], Claim | None],
    deadline: float,
) -> Claim:
    """Take the lease, or wait until its entry is stored; a Claim that is held or
    stored, or an empty Claim at ``deadline`` (monotonic; inf: no limit). What
    ``take`` and ``await_fill`` raise propagates (the caller fails open)."""
    while True:
        got = take()
        if got.held is not None or got.stored:
            return got
        if time.monotonic() >= deadline:
            return Claim()
        busy = got.busy
        if busy is None:  # an answer that says nothing (a timed-out try): ask again
            busy = Busy(time.monotonic() + 0.05 + 0.05 * _random.random())
        filled = await_fill(busy, deadline)
        if filled is not None and filled.stored:
            return filled
        if time.monotonic() >= deadline:
            return Claim()


class Backoff:
    """When a waiter with no notification (S3) looks whether the entry is there.

    With ``E`` the expected fill time (the holder's hint, else this process's last
    fill, else :data:`DEFAULT_FILL_S`) and ``t0`` when the holder started, the
    checks fall at ``t0 + E * (2**k + 1) / 2`` -- E, 1.5 E, 2.5 E, 4.5 E, ... (the
    first after now): a fill a little slower than its hint costs half a hint, not
    a whole one -- each moved later by a random 0-20 % of its distance from ``t0``
    (so waiters that started together spread out), with no two checks more than
    ``most`` seconds apart (a quarter of the lease). A fill of C seconds costs a
    waiter one check when the hint is right, about ``2 + log2(C / E)`` when it is
    low: never a fixed fast poll. Past the lease's expiry the caller takes again.
    """

    __slots__ = ("_expect", "_k", "_last", "_most", "_start")

    def __init__(self, start: float, expect: float, most: float) -> None:
        self._start = start
        self._expect = max(expect, 0.001)
        self._most = max(most, self._expect)
        self._k = 0
        self._last = start

    def next(self, now: float) -> float:
        """The monotonic time of the next check after ``now``."""
        at = max(self._last, now) + self._most  # never further apart than `most`
        while self._k < 60:
            point = self._start + self._expect * ((1 << self._k) + 1) / 2
            if point > now:
                at = min(at, point)
                break
            self._k += 1
        at += _random.random() * 0.2 * min(at - self._start, self._most)
        self._last = at
        return at


class Renewal:
    """Calls ``renew()`` every ``period`` seconds from a daemon thread named ``name``
    until :meth:`stop` (see the module docstring)."""

    def __init__(self, renew: Callable[[], bool], period: float, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(renew, period), name=name, daemon=True
        )
        self._thread.start()

    def _run(self, renew: Callable[[], bool], period: float) -> None:
        while not self._stop.wait(period):
            try:
                if not renew():
                    return  # taken over: not ours any more
            except Exception:  # the lease runs out if the medium stays away
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
