"""Single-flight across hosts: an expiring Redis lock key per cache key.

The holder sets ``<lock key> = <random token>`` with ``SET NX PX <lease>`` and a
daemon thread renews the lease (every third of it) while the compile runs, so a
long compile keeps its lock and a holder that dies or loses the server frees it
within one lease. Renewal and release are Lua compare-and-set scripts, so only the
token's owner can extend or delete the lock -- never a lock that expired and was
taken by someone else.

A waiter polls, with one pipelined round trip per poll: ``SET NX`` (take the lock
if it is free) and ``EXISTS`` on the entry. It stops waiting as soon as the entry
exists (the holder stored it: the caller looks again and hits) or it holds the
lock. Polls start at 2 ms apart and back off to 50 ms.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Any

__all__ = ["RELEASE", "RENEW", "LockLease", "poll_lock"]

RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""

RENEW = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""

_FIRST_POLL_S = 0.002
_MAX_POLL_S = 0.05


def poll_lock(
    client: Any, lock_name: bytes, entry_name: bytes, lease_ms: int, deadline: float
) -> tuple[str | None, bool]:
    """Wait for the lock or the entry, until ``deadline`` (monotonic; inf: no limit).

    Returns ``(token, False)`` when the lock is ours, ``(None, True)`` when the entry
    was stored meanwhile, ``(None, False)`` at the deadline. Redis errors propagate.
    """
    token = secrets.token_hex(16)
    delay = _FIRST_POLL_S
    while True:
        pipe = client.pipeline(transaction=False)
        pipe.set(lock_name, token, nx=True, px=lease_ms)
        pipe.exists(entry_name)
        got, exists = pipe.execute()
        if got:
            return token, False
        if exists:
            return None, True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, False
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, _MAX_POLL_S)


class LockLease:
    """Keeps a held lock's lease alive from a daemon thread until ``stop()``.

    Renewal errors are ignored: if the server is gone the lease simply runs out,
    which frees waiters elsewhere (they compile themselves).
    """

    def __init__(self, renew: Any, lock_name: bytes, token: str, lease_ms: int) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(renew, lock_name, token, lease_ms),
            name="cuforge-redis-lock-lease",
            daemon=True,
        )
        self._thread.start()

    def _run(self, renew: Any, lock_name: bytes, token: str, lease_ms: int) -> None:
        while not self._stop.wait(lease_ms / 3000):
            try:
                if not renew(keys=[lock_name], args=[token, lease_ms]):
                    return  # expired and possibly taken by someone else: not ours
            except Exception:  # the lease runs out; nothing to report
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
