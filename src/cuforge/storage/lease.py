"""Leases on a shared medium: wait for one, keep it alive, for any remote backend.

A lease is a lock that expires: its holder renews it while it works, so a holder
that dies or loses the network frees it within one lease. How a lease is taken,
renewed and released is the medium's (a Redis key set ``NX PX``, an S3 object
created ``If-None-Match: *``); waiting for one and renewing it is the same
everywhere, so it is here.

- :func:`wait_for` polls ``attempt()`` -- one try at the lease, and whether the
  entry it guards was stored meanwhile -- until the lease is held, the entry is
  there (the caller looks again and hits), or the deadline passes. Polls start
  ``first`` seconds apart and back off by half each time up to ``most``.
- :class:`Renewal` renews a held lease from a daemon thread every ``period``
  seconds until :meth:`Renewal.stop`; a renewal that answers False (the lease was
  taken over: no longer ours) ends it, one that raises is retried at the next
  period (if the medium stays away, the lease runs out and frees the waiters).
"""

from __future__ import annotations

import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["Held", "Renewal", "wait_for"]


class Held:
    """A lease held: its ``name`` on the medium, the holder's ``token``, and ``tag``
    (what the medium needs to renew or release exactly this lease: an ETag)."""

    __slots__ = ("name", "tag", "token")

    def __init__(self, name: Any, token: str, tag: Any = None) -> None:
        self.name = name
        self.token = token
        self.tag = tag


def wait_for(
    attempt: Callable[[], tuple[Held | None, bool]], deadline: float, first: float, most: float
) -> tuple[Held | None, bool]:
    """``(held, False)`` when ``attempt`` took the lease, ``(None, True)`` when the
    entry was stored meanwhile, ``(None, False)`` at ``deadline`` (monotonic; inf:
    no limit). What ``attempt`` raises propagates."""
    delay = first
    while True:
        held, stored = attempt()
        if held is not None:
            return held, False
        if stored:
            return None, True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, False
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, most)


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
