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
"""

from __future__ import annotations

from dataclasses import dataclass

from cuforge.cli import _select
from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cuforge.storage.base import ProgramCacheResource

__all__ = ["Part", "parts", "read_only_note"]


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
