"""A circuit breaker: after a failure, skip a remote backend for a while.

A cache in front of a remote server must not pay a connect or command timeout on
every compile while the server is down. After a failure the breaker opens for
``retry_after`` seconds; calls made meanwhile are told to skip the server. When
the time is up, one call is let through as a probe (the others keep skipping): a
success closes the breaker, another failure reopens it for twice as long, up to
``max_retry_after``.
"""

from __future__ import annotations

import threading
import time

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Thread-safe open/closed state with exponential back-off between probes."""

    def __init__(self, retry_after: float, max_retry_after: float) -> None:
        self.retry_after = retry_after
        self.max_retry_after = max(retry_after, max_retry_after)
        self._mutex = threading.Lock()
        self._open_until = 0.0  # monotonic; 0 means closed
        self._backoff = retry_after
        self.failures = 0  # consecutive failures

    @property
    def is_open(self) -> bool:
        """Whether calls are being skipped now (no probe is due)."""
        until = self._open_until
        return until != 0.0 and time.monotonic() < until

    def allow(self) -> bool:
        """Whether this call may use the server: closed, or the one probe now due."""
        until = self._open_until
        if until == 0.0:  # the hot path: closed, no lock
            return True
        with self._mutex:
            now = time.monotonic()
            if self._open_until == 0.0:
                return True
            if now < self._open_until:
                return False
            # This caller probes; everyone else keeps skipping until it reports.
            self._open_until = now + self._backoff
            return True

    def success(self) -> None:
        if self._open_until == 0.0 and self.failures == 0:
            return
        with self._mutex:
            self._open_until = 0.0
            self._backoff = self.retry_after
            self.failures = 0

    def failure(self) -> float:
        """Open (or reopen) the breaker; returns the seconds until the next probe."""
        with self._mutex:
            if self.failures:
                self._backoff = min(self._backoff * 2, self.max_retry_after)
            self.failures += 1
            self._open_until = time.monotonic() + self._backoff
            return self._backoff
