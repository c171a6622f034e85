"""What a store did, and what a read found that does not verify.

``set_entry`` answers a :class:`StoreOutcome`: stored, or not stored and why (the
reasons are ``events``' drop reasons, so a person reads them the same everywhere:
"not stored: read-only"). A tier's outcome also says what each of its levels did
(``levels``): "stored" alone never hides that the Redis behind the disk was down,
or that only the in-memory level holds the entry. A driver's ``read`` answers a
:class:`Damaged` for an entry that exists but fails its check; the core counts it,
logs it and asks the driver to drop it.
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
    as a lock timeout, not as a write failure.

    ``levels``: for a tiered cache, what each level did, in the tier's order (a
    read-only level's is ``READ_ONLY``, a level that raised is ``FAILED`` with the
    error); empty for a cache of one level. A tier is stored when one level took
    the entry: ``levels`` says which (:meth:`stored_levels`) and which did not."""

    __slots__ = ("detail", "kept", "levels", "reason")

    def __init__(
        self,
        reason: str,
        detail: str = "",
        kept: bool = False,
        levels: tuple[StoreOutcome, ...] = (),
    ) -> None:
        self.reason = reason
        self.detail = detail
        self.kept = kept
        self.levels = levels

    @property
    def stored(self) -> bool:
        return self.reason == STORED

    def stored_levels(self) -> tuple[int, ...]:
        """The indices of the levels that took the entry (a tier's; ``()`` otherwise)."""
        return tuple(i for i, level in enumerate(self.levels) if level.reason == STORED)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoreOutcome):
            return NotImplemented
        return (self.reason, self.detail, self.kept, self.levels) == (
            other.reason, other.detail, other.kept, other.levels
        )  # fmt: skip

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        detail = f", {self.detail!r}" if self.detail else ""
        levels = f", levels={self.levels!r}" if self.levels else ""
        return f"StoreOutcome({self.reason!r}{detail}{levels})"


#: The one stored outcome without a detail (shared: outcomes are never changed).
STORED_OUTCOME = StoreOutcome(STORED)
#: A store found an equal entry already there (a peer stored it first): the entry is
#: in the cache, nothing was written, and no store is counted.
PRESENT = StoreOutcome(STORED, "an equal entry was already stored")
#: A tier level not opened yet holds the store, to write it when the level opens (at
#: the first lookup or lock that reaches it, at ``close()``, at a normal exit).
DEFERRED = StoreOutcome(STORED, "deferred: written when this level opens, at the latest at exit")


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
