"""The levels ``cuforge cache prune|clear|verify --fix`` act on, one at a time.

A tier's levels are separate stores, and a level marked ``?ro`` is never written
(``storage.tiered``). So these commands treat each level as a cache of its own: its
entries are listed, removed and counted there, and a read-only level's entries are
reported as kept -- neither as removed nor as removals that failed. (Counted on the
tier as one cache, both went wrong: an entry that left the writable level but stayed
in the ``?ro`` one counted as not removed, so ``clear`` said ``removed 0`` having
emptied a level; and an entry a removal took from the writable level only counted
as gone, so ``prune`` said ``0 remain`` while the ``?ro`` level still served it.)

A cache of one level is one :class:`Part`, named as the command line names it. A
cache whose every level is read-only (``--cache DIR?ro``) is a UsageError naming
``?ro``: nothing in it could be removed. Reads and opens only; removes nothing.

A level that fails (a server that cannot be reached, a listing or removal refused) is
that level's failure, not the command's: :func:`attempt` hands its error back so the
command reports it on that level's line and goes on with the others. Every level is
listed before anything is removed, and a writable level that cannot be listed stops
every removal (:func:`stopper`): clearing or pruning the rest would leave the tier
half done while the unlisted level still serves its entries.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass

from cuforge.cli import _select
from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import TypeVar

    from cuforge.storage.base import ProgramCacheResource

    T = TypeVar("T")

__all__ = [
    "Part", "attempt", "count", "failure_words", "parts", "read_only_note", "still_there",
    "stopper",
]  # fmt: skip


@dataclass(frozen=True)
class Part:
    """One level of the chosen cache: ``index`` (None: the cache has one level and is
    not a tier), ``name`` (its URL as reports name it), the opened ``cache`` and
    whether it is ``read_only`` (``?ro`` in the URL: never written)."""

    index: int | None
    name: str
    cache: ProgramCacheResource
    read_only: bool

    def label(self) -> str:
        """``level 1 (file:///c)`` for a tier's level, else the cache's name."""
        return self.name if self.index is None else f"level {self.index} ({self.name})"

    def prefix(self) -> str:
        """What starts an entry's line: ``level 1: `` for a tier's level, else nothing."""
        return "" if self.index is None else f"level {self.index}: "


def parts(
    cache: ProgramCacheResource, choice: _select.Choice, command: str, writes: bool = True
) -> list[Part]:
    """Each level of ``cache`` (opening a tier's lazy levels: a server that cannot be
    reached raises here, as listing it would), or the cache itself when it is not a
    tier. ``writes``: the command removes entries, so a cache with no writable level
    is a UsageError naming ``?ro`` (``command``: its verb, ``prune``, ``clear``, ``fix``)."""
    from cuforge.storage.signing import SignedProgramCache
    from cuforge.storage.tiered import TieredProgramCache, opened

    inner = cache.inner if isinstance(cache, SignedProgramCache) else cache
    if not isinstance(inner, TieredProgramCache):
        return [Part(None, choice.shown(), cache, False)]
    names = [name for name, _ in _select.level_names(choice)]
    read_only = set(inner.read_only)
    out = []
    for i, level in enumerate(inner.levels):
        name = names[i] if i < len(names) else repr(opened(level) or level)
        out.append(Part(i, name, level, i in read_only))
    if writes and all(p.read_only for p in out):
        which = "its only level is" if len(out) == 1 else "every level of it is"
        raise UsageError(
            f"will not {command} {choice.shown()}: {which} read-only (?ro), and a "
            f"read-only level is never written (leave ?ro out of a level to {command} it)"
        )
    return out


def read_only_note(ro: list[Part]) -> str:
    """``read-only level 0`` / ``read-only levels 0, 2``: where kept entries stay."""
    ids = ", ".join(str(p.index) for p in ro)
    return f"read-only level{'s' if len(ro) > 1 else ''} {ids}"


def attempt(part: Part, call: Callable[[], T]) -> tuple[T | None, OSError | None]:
    """``call()``'s result, or its OSError (ConnectionError included) when ``part`` is a
    tier's level: the command reports it as that level's failure. A cache of one level
    re-raises it (the command's one-line error, exit 1, as before)."""
    try:
        return call(), None
    except OSError as exc:
        if part.index is None:
            raise
        return None, exc


_WHERE = re.compile(r"\w[\w ]* cache \S+: (could not .*)", re.S)


def failure_words(exc: OSError, what: str) -> str:
    """``could not list entries (ConnectionError: ...)``: what failed and why, on one
    line, without the cache's name (the level's label names it) or a path inside it."""
    found = _WHERE.match(str(exc))
    words = found.group(1) if found else f"could not {what} ({exc.strerror or exc})"
    return " ".join(words.split())


def why_words(failure: BaseException) -> str:
    """Why a removal failed, short: an OS error's words, or what a server-backed cache
    said it met (``... could not clear (NoPermissionError: ...)`` ->
    ``NoPermissionError: ...``: a refused command is no connection problem), else the
    error's type."""
    strerror = getattr(failure, "strerror", None)
    if strerror:
        return str(strerror)
    said = str(failure) if isinstance(failure, ConnectionError) else ""
    start = said.find("could not ")
    if start >= 0 and "(" in said[start:]:
        inner = said[said.index("(", start) + 1 :]
        return inner[:-1] if inner.endswith(")") else inner
    return said or type(failure).__name__


def stopper(levels: Sequence[Part], errors: Sequence[OSError | None]) -> Part | None:
    """The first writable level whose listing failed (``errors``, one per level): while
    one is, nothing is removed from any level. A read-only level never stops the others:
    nothing would be removed from it anyway."""
    return next(
        (p for p, e in zip(levels, errors, strict=True) if e is not None and not p.read_only), None
    )


def level_failures(command: str, stop: Part | None, failed: Sequence[Part], why: str = "") -> int:
    """Say on stderr why ``cuforge cache COMMAND`` exits 1 on a tier: ``stop``, a level
    that could not be listed (so nothing was removed anywhere; ``why``: what that
    kept), else the levels that ``failed`` part-way (their lines say how). 0 when
    neither."""
    if stop is not None:
        print(
            f"cuforge cache {command}: {stop.label()} could not be listed, so nothing was "
            f"removed from any level{why}",
            file=sys.stderr,
        )
        return 1
    if failed:
        names = ", ".join(part.label() for part in failed)
        print(f"cuforge cache {command}: {names} failed (see its line)", file=sys.stderr)
        return 1
    return 0


def count(n: int, noun: str) -> str:
    """``1 entry``, ``2 entries``, ``0 foreign objects``."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun[:-1]}ies" if noun.endswith("y") else f"{n} {noun}s"


def still_there(cache: ProgramCacheResource, entry_id: str) -> bool:
    """Whether entry ``entry_id`` still exists (a removal that said no may have lost a
    race with another remover: then it is gone all the same)."""
    try:
        cache.check_entry(entry_id)
    except KeyError:
        return False
    except NotImplementedError:
        return True
    return True
