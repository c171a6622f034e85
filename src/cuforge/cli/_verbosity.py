"""``-v`` / ``-q``: how much a command says on stderr besides its result.

Levels: ``-q`` shows errors only (no warnings); the default shows each cache
warning as one line (``cuforge: warning: ...``); ``-v`` adds cuforge's log at
DEBUG (``cuforge.cache``: hits, misses and why, stores, evictions, fail-open
events; ``cuforge.compile``: backend, flags and time of each compile;
``cuforge.graph``). The flags are accepted before or after the command name; a
``--`` ends them. The library itself configures no logging: only the command line
does, here.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["QUIET", "VERBOSE", "configure", "split", "verbose"]

QUIET = -1
VERBOSE = 1

_FLAGS = {"-q": QUIET, "--quiet": QUIET, "-v": VERBOSE, "--verbose": VERBOSE}


def verbose(argv: Sequence[str]) -> bool:
    """Whether ``argv`` asks for the log (the fast hit path, which logs nothing, then
    steps aside)."""
    return split(argv)[1] > 0


def split(argv: Sequence[str]) -> tuple[list[str], int]:
    """``argv`` without its ``-v``/``-q`` flags, and the level they ask for
    (negative: quiet; 0: default; positive: verbose). ``-vv`` counts as ``-v``."""
    rest: list[str] = []
    level = 0
    for i, arg in enumerate(argv):
        if arg == "--":
            rest.extend(argv[i:])
            break
        if arg in _FLAGS:
            level += _FLAGS[arg]
        elif len(arg) > 2 and arg[0] == "-" and arg[1] != "-" and set(arg[1:]) == {"v"}:
            level += len(arg) - 1
        else:
            rest.append(arg)
    return rest, level


def configure(level: int) -> Callable[[], None]:
    """Show cuforge's DEBUG log on stderr for a positive ``level`` (nothing otherwise;
    warnings are the caller's: ``level < 0`` hides them). Returns what undoes it:
    ``main`` may be called as a function, more than once in a process."""
    if level <= 0:
        return lambda: None
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("cuforge: %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("cuforge")
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)

    def undo() -> None:
        logger.removeHandler(handler)
        logger.setLevel(before)

    return undo
