"""What one hydrate or publish did: counts, and why nothing was done when not active."""

from __future__ import annotations

__all__ = ["HydrateResult", "PublishResult"]


class _Counts:
    """Counters (all 0 by default) plus ``active`` (False: nothing was tried) and
    ``reason`` (why not, or the fault that stopped it); equal when all fields are."""

    __slots__ = ("active", "reason")
    _counts: tuple[str, ...] = ()

    def __init__(self, *, active: bool = True, reason: str = "", **counts: int) -> None:
        self.active = active
        self.reason = reason
        for name in self._counts:
            setattr(self, name, counts.pop(name, 0))
        if counts:
            raise TypeError(f"{type(self).__name__}: unknown counts {sorted(counts)}")

    def _fields(self) -> tuple[object, ...]:
        return (self.active, self.reason, *(getattr(self, n) for n in self._counts))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = (
            []
            if self.active and not self.reason
            else [f"active={self.active}", f"reason={self.reason!r}"]
        )
        parts += [f"{n}={getattr(self, n)}" for n in self._counts if getattr(self, n)]
        return f"{type(self).__name__}({', '.join(parts)})"


class HydrateResult(_Counts):
    """What :meth:`Mirror.hydrate` did. ``written``: files written; ``replaced``: of
    those, older copies the mirror itself had written; ``present``: already there with
    the same bytes; ``skipped_newer``: a local file differs and the mirror did not
    write it (kept); ``skipped_other``: something not a regular file stands there, or
    a link on the way (left alone); ``verified_failures``: entries whose bytes did not
    verify; ``missing``: listed but absent from the cache; ``refused``: unsafe or
    skipped paths in the index; ``errors``: files that could not be written."""

    __slots__ = (
        "errors",
        "missing",
        "present",
        "refused",
        "replaced",
        "skipped_newer",
        "skipped_other",
        "verified_failures",
        "written",
    )
    _counts = (
        "written",
        "replaced",
        "present",
        "skipped_newer",
        "skipped_other",
        "verified_failures",
        "missing",
        "refused",
        "errors",
    )
    written: int
    replaced: int
    present: int
    skipped_newer: int
    skipped_other: int
    verified_failures: int
    missing: int
    refused: int
    errors: int


class PublishResult(_Counts):
    """What :meth:`Mirror.publish` did. ``stored``: files stored; ``unchanged``:
    already in the cache; ``pending``: not (yet) complete -- changed between two looks
    or while read; ``tampered``: changed in place after the mirror recorded them
    (never published); ``foreign``: not a regular file, or not this user's;
    ``too_large``: over the size limit; ``dropped``: the cache refused the store;
    ``errors``: files that could not be read."""

    __slots__ = (
        "dropped",
        "errors",
        "foreign",
        "pending",
        "stored",
        "tampered",
        "too_large",
        "unchanged",
    )
    _counts = (
        "stored",
        "unchanged",
        "pending",
        "tampered",
        "foreign",
        "too_large",
        "dropped",
        "errors",
    )
    stored: int
    unchanged: int
    pending: int
    tampered: int
    foreign: int
    too_large: int
    dropped: int
    errors: int
