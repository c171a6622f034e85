"""Compiles after warm-up: a process that declared itself warm hears about every
compile it still makes.

A serving process loads or prefetches its kernels, then declares itself warm --
``cuforge.mark_warm()``, or ``$CUFORGE_WARM=1`` in its environment (warm from the
start, as ``cuforge run --warm`` sets). From then on every compile that goes
through cuforge or one of its integrations (a cuforge ``Program`` compiled, a Triton
kernel, an Inductor graph, a CuPy kernel, a JAX module that missed the cache):

- warns (:class:`CompileAfterWarmWarning`, a ``RuntimeWarning``) naming the system
  and the kernel, once per kernel and process: a kernel compiled again is counted,
  not warned about again;
- is counted in this process (:func:`compiles_after_warm`) and in the counters of
  the cache it went through (``warm_compiles``: ``cuforge cache stats`` and its
  OpenMetrics output sum them over every process that used the cache, where the
  backend keeps shared counters). The warning's parenthesis says which
  (:data:`COUNTED`): not in any cache's for a compile without one, in the handle's
  own only for a read-only cache (it writes no shared counters) or an in-memory one
  (gone with the process).

Counting never fails a compile: a cache whose counters cannot be reached is
skipped. Checking costs one global read on the compile path and nothing on a hit.
"""

from __future__ import annotations

import os
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, TypeVar

    T = TypeVar("T")

__all__ = [
    "ENV_WARM",
    "CompileAfterWarmWarning",
    "compiles_after_warm",
    "compiling_through",
    "env_problem",
    "is_warm",
    "mark_warm",
    "note_compile",
    "through",
    "watch",
]

#: ``1`` (or ``true``/``yes``/``on``): the process is warm from the start; unset,
#: empty, ``0`` (``false``/``no``/``off``): it is not. Any other value is not warm
#: either, and the command line refuses it (:func:`env_problem`).
ENV_WARM = "CUFORGE_WARM"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")

#: The warning's parenthesis, per answer of the cache's counter (:data:`counter`;
#: ``cuforge.storage.base.count_warm_compile``): where the compile was counted, and
#: why nowhere shared when it was not. The command line says each in its words.
COUNTED = {
    "shared": "(counted in warm_compiles)",
    "no-cache": "(counted in compiles_after_warm() only: it went through no cache)",
    "read-only": "(counted in compiles_after_warm() and this handle's stats() only: the "
    "cache is read-only, and a read-only handle writes no shared counters)",
    "memory": "(counted in compiles_after_warm() and the in-memory cache's stats() only: "
    "gone with this process)",
    "none": "(counted in compiles_after_warm() only: the cache keeps no counters)",
}

_lock = threading.Lock()
_state = {"warm": (os.environ.get(ENV_WARM) or "").strip().lower() in _TRUE, "count": 0}
_warned: set[tuple[str, str]] = set()
#: The cache a cuforge compile of this thread goes through (``through``), so its
#: miss -- compiled where the cache is not passed on -- is counted there.
_current = threading.local()


class CompileAfterWarmWarning(RuntimeWarning):
    """A process that declared itself warm compiled a kernel (see :func:`mark_warm`)."""


def env_problem() -> str | None:
    """The line for a ``$CUFORGE_WARM`` that is no switch (``banana``), naming the
    variable and what it takes; None when it is one (or unset). The library reads
    such a value as not warm; ``cuforge compile`` and ``cuforge warm`` refuse it."""
    raw = os.environ.get(ENV_WARM)
    if raw is None or raw.strip().lower() in _TRUE + _FALSE:
        return None
    return (
        f"${ENV_WARM}={raw!r} is not a switch: 1 (or true, yes, on) marks the process "
        "warm; 0 (or false, no, off), empty or unset does not"
    )


def mark_warm(warm: bool = True) -> None:
    """Declare this process warm (``warm=False``: not warm again). Every compile after
    it is warned about once per kernel and counted (see the module docstring)."""
    with _watch_lock:
        _state["warm"] = bool(warm)
        for switch in tuple(watchers):
            switch(bool(warm))


#: Called with the new state by :func:`mark_warm`: ``compile.program`` switches its
#: compile path there, so a process that is not warm does no warm-up work on a hit.
watchers: list[Callable[[bool], None]] = []
_watch_lock = threading.Lock()


def watch(switch: Callable[[bool], None]) -> None:
    """Call ``switch`` with the state now, and with the new state at every
    :func:`mark_warm` after (once, however often it is given). Under the lock
    ``mark_warm`` holds, which closes the race of a watcher that joins while another
    thread marks the process warm: it could read the old state, miss that thread's
    call and keep the old path."""
    with _watch_lock:
        if switch not in watchers:
            watchers.append(switch)
        switch(bool(_state["warm"]))


def is_warm() -> bool:
    """Whether this process has declared itself warm (``mark_warm`` or ``$CUFORGE_WARM``)."""
    return bool(_state["warm"])


def compiles_after_warm() -> int:
    """How many compiles this process made after it declared itself warm."""
    return int(_state["count"])


def note_compile(system: str, name: str, cache: Any = None) -> None:
    """A compile of ``name`` by ``system`` is about to run (or ran): when the process is
    warm, count it (here and in ``cache``'s counters) and warn once per kernel."""
    if not _state["warm"]:
        return
    with _lock:
        _state["count"] += 1
        first = (system, name) not in _warned
        if first:
            if len(_warned) >= 4096:
                _warned.clear()
            _warned.add((system, name))
    where = "no-cache" if cache is None else _count_in(cache)
    if first:
        import warnings

        from cuforge._stack import outside_level

        warnings.warn(
            f"cuforge: {system} compiles {name or '?'} after the process was marked warm "
            + COUNTED[where],
            CompileAfterWarmWarning,
            stacklevel=outside_level(),
        )


#: How a cache counts a warm compile in the counters it reports for all its users,
#: answering where that count lives (a key of :data:`COUNTED`): set by
#: ``cuforge.storage`` (``base.count_warm_compile``) when it loads -- counters are
#: storage's to write; a cache exists only once storage is loaded.
counter: Callable[[Any], str] | None = None


def through(cache: Any, run: Callable[[], T]) -> T:
    """``run()`` with ``cache`` as this thread's :func:`compiling_through` (restored
    after): a cuforge compile through ``cache`` in a warm process runs in it, so that
    a miss's compile is counted in ``cache``'s ``warm_compiles``. Only a warm process
    takes this path (see :data:`watchers`)."""
    previous = getattr(_current, "cache", None)
    _current.cache = cache
    try:
        return run()
    finally:
        _current.cache = previous


def compiling_through() -> Any:
    """The cache the cuforge compile running in this thread goes through (set by
    :func:`through`), or None."""
    return getattr(_current, "cache", None)


def _count_in(cache: Any) -> str:
    """Count one ``warm_compiles`` in ``cache``'s counters (through storage); where it
    was counted (a key of :data:`COUNTED`). Never raises."""
    count = counter
    if count is None:
        return "none"
    try:
        where = count(cache)
    except Exception:  # a handle without counters: counted in this process only
        return "none"
    return where if where in COUNTED else "shared"
