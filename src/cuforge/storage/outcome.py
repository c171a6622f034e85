"""What a store did, and what a read found that does not verify.

``set_entry`` answers a :class:`StoreOutcome`: stored, or not stored and why (the
reasons are ``events``' drop reasons, so a person reads them the same everywhere:
"not stored: read-only"). A driver's ``read`` answers a :class:`Damaged` for an
entry that exists but fails its check; the core counts it, logs it and asks the
driver to drop it.
"""

from __future__ import annotations

from collections import namedtuple

from . import events

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold hit ~5 ms
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "COMPILER_CHANGED",
    "FAILED",
    "LOCKED",
    "READ_ONLY",
    "STORED",
    "TOO_LARGE",
    "UNREACHABLE",
    "Damaged",
    "StoreOutcome",
]

#: The entry was written.
STORED = "stored"
#: The cache (or every level of it) is read-only: nothing is written by design.
READ_ONLY = events.READ_ONLY
#: The backend's server could not be reached (or is being backed off from).
UNREACHABLE = events.UNREACHABLE
#: Larger than the cache's size cap: refused before anything is evicted for it.
TOO_LARGE = events.TOO_LARGE
#: Another process held the backend's write lock past its bound.
LOCKED = events.LOCKED
#: The backend failed to write (full disk, permissions, an error it raised).
FAILED = events.FAILED
#: The compiler or its headers changed while this process ran: the key may lie.
COMPILER_CHANGED = "compiler changed"


class StoreOutcome:
    """What a store did: ``reason`` (``STORED``, or why not), ``detail`` (the backend's
    words, or ""), and ``kept``: not written yet but held to be written later (a
    SQLite store deferred while another process holds the write lock), so it counts
    as a lock timeout, not as a write failure."""

    __slots__ = ("detail", "kept", "reason")

    def __init__(self, reason: str, detail: str = "", kept: bool = False) -> None:
        self.reason = reason
        self.detail = detail
        self.kept = kept

    @property
    def stored(self) -> bool:
        return self.reason == STORED

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoreOutcome):
            return NotImplemented
        return (self.reason, self.detail, self.kept) == (other.reason, other.detail, other.kept)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StoreOutcome({self.reason!r}{', ' + repr(self.detail) if self.detail else ''})"


#: The one stored outcome without a detail (shared: outcomes are never changed).
STORED_OUTCOME = StoreOutcome(STORED)
#: A store found an equal entry already there (a peer stored it first): the entry is
#: in the cache, nothing was written, and no store is counted.
PRESENT = StoreOutcome(STORED, "an equal entry was already stored")


class Damaged(namedtuple("Damaged", ["problem", "token"])):
    """An entry that exists and does not verify: ``problem`` (one phrase, for logs and
    ``check_entry``) and ``token`` (what the driver needs to drop exactly what it read:
    fingerprints, a row's check, a value and its ETag)."""

    __slots__ = ()
    problem: str
    token: Any

    def __bool__(self) -> bool:
        """False, as None is: only a verified entry (a non-empty tuple) is true, so the
        hit path tests a read's answer with one truth test."""
        return False
