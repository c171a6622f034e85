"""Why a size cap is refused where the cache is chosen (``storage.config``): a SQLite
cap below its floor, or a cap given for a cache whose last level takes none -- the
words only; the choice itself stays in ``config``. ``where`` is the value's origin
as a message starts (``--cache``, ``cache in FILE``).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from .spec import CacheSpec

__all__ = ["too_small", "uncapped"]


def too_small(scheme: str, cap: int) -> str | None:
    """Why ``cap`` is too small for a cache of ``scheme`` (a SQLite cache has a floor:
    ``storage.sqlite._floor``), or None. A URL's own ``max_size`` is checked with the
    URL (``check_levels``)."""
    if scheme != "sqlite":
        return None
    from .sqlite._floor import cap_problem

    return cap_problem(cap)


def uncapped(specs: list[CacheSpec], where: str, given: int, capped_schemes: Iterable[str]) -> str:
    """Why a caller's cap of ``given`` bytes is refused: it goes to the last level
    (:meth:`Selection.target` adds it to the last level's URL), and that level takes
    none. For a tier, the way to cap a level that takes one: its own ``?max_size=``."""
    last = specs[-1]
    if len(specs) == 1:
        return (
            f"{last.scheme}:// caches take no size cap ({where}); only "
            "directory, sqlite:// and memory:// caches do"
        )
    import re  # only for this message

    name = re.sub(r"(://[^/@,]*?:)[^/@,]*@", r"\1***@", last.text.split("?", 1)[0])
    capped = [spec for spec in specs[:-1] if spec.scheme in capped_schemes]
    if capped:
        level = capped[-1].text.split("?", 1)[0]
        if "://" not in level:  # a plain directory
            level = f"file://{capped[-1].location}"
        way = f"; to cap {level}, give it its own in the URL ({level}?max_size={given})"
    else:
        way = "; none of its levels takes one"
    return (
        f"a tier's size cap goes to its last level, here {name}, and {last.scheme}:// caches "
        f"take no size cap ({where}){way}"
    )
