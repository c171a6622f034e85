"""Single-flight across hosts on an object store: a lease object per cache key.

The lease is the object ``<prefix>locks/<id>`` whose body is ``<expiry_ns> <token>``
(the holder's wall clock). Taking it is a conditional create (``If-None-Match: *``):
of any number of racing hosts exactly one gets 200, the rest 412. A lease whose
expiry has passed -- its holder crashed or lost the network -- is taken over by a
conditional overwrite naming the ETag just read (``If-Match``), so of several
waiters that all saw it expire exactly one wins; a crashed holder therefore blocks
others for at most one lease. While the compile runs a daemon thread renews the
lease every third of it, also with ``If-Match`` on its own ETag: a holder whose
lease was taken over learns it and stops renewing rather than overwriting the new
holder's lease. Release deletes the object after checking it is still ours (a
take-over in the moment between the check and the delete costs one duplicate
compile, never a wrong entry: entries are write-once and verified).

Expiry compares wall clocks of different hosts: keep them within a fraction of the
lease (NTP does). Waiters poll -- take the lease or see the entry stored -- from
5 ms apart backing off to 100 ms.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from typing import Any

from ..ownership import delete_owned

__all__ = ["Lease", "poll_lease"]

_FIRST_POLL_S = 0.005
_MAX_POLL_S = 0.1


def _body(lease_s: float, token: str) -> bytes:
    return b"%d %s" % (time.time_ns() + int(lease_s * 1e9), token.encode())


def _expired(body: bytes) -> bool:
    head = body.split(b" ", 1)[0]
    # A lease body that does not parse (damaged, foreign) counts as expired.
    return not head.isdigit() or int(head) < time.time_ns()


def _try_take(obs: Any, store: Any, path: str, lease_s: float, token: str) -> str | None:
    """The new lease's ETag when this call took it, else None. Server errors propagate."""
    from obstore.exceptions import AlreadyExistsError, GenericError, PreconditionError

    try:
        return str(obs.put(store, path, _body(lease_s, token), mode="create")["e_tag"])
    except AlreadyExistsError:
        pass
    except GenericError:
        # No answer in time: some servers (SeaweedFS) hold racing conditional PUTs
        # of one object for a second or more. Not taken -- unless it was, which the
        # next poll sees by our token in the body. A server that is really gone
        # fails the entry check that follows.
        return None
    try:
        found = obs.get(store, path)
    except FileNotFoundError:
        return None  # released meanwhile: the next poll creates it
    body = bytes(found.bytes())
    if body.endswith(b" " + token.encode()):
        return str(found.meta["e_tag"])  # our create went through after all
    if not _expired(body):
        return None
    try:
        etag = found.meta["e_tag"]
        return str(obs.put(store, path, _body(lease_s, token), mode={"e_tag": etag})["e_tag"])
    except (PreconditionError, AlreadyExistsError, FileNotFoundError):
        return None  # another waiter took it over first


def poll_lease(
    obs: Any, store: Any, path: str, entry_path: str, lease_s: float, deadline: float
) -> tuple[Lease | None, bool]:
    """Wait for the lease or the entry until ``deadline`` (monotonic; inf: no limit).

    ``(lease, False)`` when held, ``(None, True)`` when the entry was stored
    meanwhile (look again), ``(None, False)`` at the deadline. Errors propagate.
    """
    token = secrets.token_hex(16)
    delay = _FIRST_POLL_S
    while True:
        etag = _try_take(obs, store, path, lease_s, token)
        if etag is not None:
            return Lease(obs, store, path, token, etag, lease_s), False
        try:
            obs.head(store, entry_path)
            return None, True
        except FileNotFoundError:
            pass
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, False
        time.sleep(min(delay, remaining))
        delay = min(delay * 1.5, _MAX_POLL_S)


class Lease:
    """A held lease, renewed from a daemon thread until :meth:`release`."""

    def __init__(self, obs: Any, store: Any, path: str, token: str, etag: str, lease_s: float):
        self._obs, self._store, self._path = obs, store, path
        self._token, self._etag, self._lease_s = token, etag, lease_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="cuforge-s3-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        from obstore.exceptions import PreconditionError

        while not self._stop.wait(self._lease_s / 3):
            try:
                body = _body(self._lease_s, self._token)
                put = self._obs.put(self._store, self._path, body, mode={"e_tag": self._etag})
                self._etag = str(put["e_tag"])
            except (PreconditionError, FileNotFoundError):
                return  # taken over after we lost it: no longer ours
            except Exception:  # the lease runs out if the server stays away
                continue

    def release(self) -> None:
        """Stop renewing and delete the lease if it is still ours (errors ignored:
        the lease then expires by itself)."""
        self._stop.set()
        self._thread.join()

        def remove(paths: list[str]) -> int:
            if self._obs.head(self._store, paths[0])["e_tag"] != self._etag:
                return 0  # taken over: the new holder's
            self._obs.delete(self._store, paths[0])
            return 1

        with contextlib.suppress(Exception):  # only this lease's own object
            delete_owned([self._path], lambda p: p == self._path, remove, self._path)
