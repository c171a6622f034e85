"""The connection a remote backend writes: what the one remote driver asks of a server.

A backend whose entries live on a server (Redis, an S3 bucket) subclasses
:class:`Store` in the server's own terms -- get, put, compare-and-delete, listing,
lease objects, counters -- and hands it to ``storage.remote.RemoteDriver``, which
does framing, verification, failing open, single flight and counting once for every
server. Every method raises what the client raises; the driver turns that into
fail-open events (:meth:`Store.problem` says what an error means). Names the driver
deletes are proven with :meth:`Store.id_of` first (``storage.ownership``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from .entry import CacheEntry, EntryInfo
    from .frame import Frame
    from .lease import Busy, Claim
    from .stats import CacheStats

__all__ = ["Store"]


class Store:
    """A server's connection, as a backend writes it for :class:`RemoteDriver`.

    Names are the server's (bytes or str); every one the driver deletes is proven
    by :meth:`id_of` first. Methods raise what the client raises; the driver turns
    that into fail-open events (:meth:`problem` says what an error means).
    """

    kind = "remote"  # "Redis", "S3": messages say "cuforge <kind> cache <where>"
    where = ""
    prefix = ""  # where the cache's names start on the server
    frame: Frame
    #: Why this process cannot use the server at all (S3 in a forked child), or None.
    broken: str | None = None
    #: What maintenance calls turn into ConnectionError.
    errors: tuple[type[BaseException], ...] = (OSError,)
    #: (names) -> [(value or None, token)] as ``get`` answers each, fetched together
    #: (one round trip, or concurrent requests); None: one by one. A value may come as
    #: ``(head, payload)``, cut where ``frame.cut`` says (``Frame.unpack_cut``).
    get_many: Any = None
    put_many: Any = None  # (pairs of name and value) -> None; None: one by one

    def name(self, kd: bytes) -> Any:
        raise NotImplementedError

    def id_of(self, name: Any) -> str | None:
        """The entry id ``name`` is the name of, or None (the ownership proof)."""
        raise NotImplementedError

    def get(self, name: Any) -> tuple[bytes | None, Any]:
        """The value of ``name`` (None: absent) and a token to drop exactly it."""
        raise NotImplementedError

    def put(self, name: Any, value: bytes, entry: CacheEntry) -> bool:
        """Store ``value`` (framing ``entry``); False when an equal entry was there."""
        raise NotImplementedError

    def delete_if_same(self, name: Any, value: bytes, token: Any) -> int:
        """Delete ``name`` if it still holds ``value`` (as read with ``token``)."""
        raise NotImplementedError

    def unlink(self, names: list[Any]) -> int:
        """Delete proven entry names; how many went."""
        raise NotImplementedError

    def names(self) -> Iterator[tuple[Any, Any]]:
        """Every candidate entry name (not yet proven), each with what the listing
        said of it (or None)."""
        raise NotImplementedError

    def describe(self, listed: list[tuple[Any, Any]]) -> Iterator[EntryInfo]:
        """Listing records of proven entry names (as :meth:`names` gave them), read
        without counting as a use."""
        raise NotImplementedError

    def quiet_get(self, name: Any) -> bytes | None:
        """A maintenance read of ``name`` (not a use); None when absent."""
        raise NotImplementedError

    def take(
        self, kd: bytes, entry: Any, token: str, lease_s: float, expect_s: float | None,
        entry_first: bool,
    ) -> Claim:  # fmt: skip
        """One try at ``kd``'s lease (a ``lease.Claim``): held (ours now), stored (the
        entry ``entry`` is there: with its value when the try read it), or busy (who
        holds it, and until when: its ``expires`` includes ``lease.expiry_jitter``).
        ``entry_first``: an entry that is there is the answer (read, handed over, no
        lease taken); else a free lease is taken whether or not the entry is there
        (``lock``'s contract) and the entry is only looked at when the lease is busy.
        ``expect_s``: how long this process's fills take (a hint for waiters), or None."""
        raise NotImplementedError

    def await_fill(
        self, kd: bytes, entry: Any, busy: Busy, deadline: float, expect_s: float | None
    ) -> Claim | None:
        """Wait until ``busy``'s holder stored the entry (a stored Claim), or return None
        by ``busy.expires`` or ``deadline`` (monotonic), whichever is first: the lease
        may be free, take again. Never a fixed fast poll (``storage.lease``)."""
        raise NotImplementedError

    def renew(self, held: Any, lease_s: float) -> bool:
        """Extend a held lease; False when it is no longer ours."""
        raise NotImplementedError

    def release(self, held: Any) -> int:
        """Delete a held lease if it is still ours; 1 if it went."""
        raise NotImplementedError

    def send(self, counts: CacheStats, final: bool) -> None:
        """Add ``counts`` to the fleet's counters (``final``: at close or exit)."""
        raise NotImplementedError

    def fleet(self) -> CacheStats:
        """The fleet's counters."""
        raise NotImplementedError

    def zero_fleet(self) -> None:
        """Delete the fleet's counters (only the store's own counter names)."""
        raise NotImplementedError

    def problem(self, exc: BaseException) -> tuple[str, bool | None]:
        """What a failed request means, in a phrase; and whether the server answered
        (True: an answer is no outage, no back-off; False: it could not be reached;
        None: the request was never sent -- a set-up problem of this process, such as
        no credentials -- backed off like an outage but reported as a failure)."""
        return f"{type(exc).__name__}: {exc}", False

    def probe_read(self) -> None:
        """One read request that changes nothing (an absent name is an answer); raises
        what the client raises when the server cannot be reached or refuses it."""
        raise NotImplementedError

    def probe_write(self) -> None:
        """One request the server checks as a store -- rights, a read-only replica, a
        full server -- but that changes nothing; raises what the client raises."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    def after_fork(self) -> None:
        pass
