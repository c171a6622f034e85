"""Open cache handles that must hear about ``fork()`` and interpreter exit.

A backend keeps one :class:`LiveHandles` and adds each handle it opens. In a forked
child every live handle's ``_after_fork_in_child()`` runs (it drops locks,
connections and counters inherited from the parent, which are not the child's); at
exit each one's ``_flush_at_exit()`` runs (counters and ledgers are written). Handles
are held weakly, so a handle that was garbage collected is simply gone. A failing
hook is ignored: it must not break a fork or an exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import weakref

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["LiveHandles"]


class LiveHandles:
    """The live handles of one backend; ``child_first`` runs in a forked child before
    any handle's hook (module-level state the handles rely on)."""

    def __init__(self, child_first: Callable[[], None] | None = None) -> None:
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()
        self._child_first = child_first
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._in_child)
        atexit.register(self._at_exit)

    def first_in_child(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` in a forked child before any handle's (module-level state a
        backend's handles rely on, such as a registry of shared lock files)."""
        previous = self._child_first

        def both() -> None:
            if previous is not None:
                previous()
            hook()

        self._child_first = both

    def add(self, handle: Any) -> None:
        self._live.add(handle)

    def discard(self, handle: Any) -> None:
        self._live.discard(handle)

    def handles(self) -> list[Any]:
        """The live handles now (a copy)."""
        return list(self._live)

    def _in_child(self) -> None:
        if self._child_first is not None:
            self._child_first()
        for handle in list(self._live):
            with contextlib.suppress(Exception):
                handle._after_fork_in_child()

    def _at_exit(self) -> None:
        for handle in list(self._live):
            with contextlib.suppress(Exception):
                handle._flush_at_exit()
