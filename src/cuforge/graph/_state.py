"""The Python side of one ``CUgraph``: who destroys it and its uncommitted bundles.

Bundles of a top-level graph are *group-committed*: each node add/update appends
its immutable owner tuple to ``pending``, and :meth:`GraphState.flush` moves all of
them into one new user object retained on the graph. Flushing happens before
anything that lets CUDA copy the graph's references (instantiate, clone, child
embedding, whole-graph exec update), so CUDA sees exactly the same owners as with
one user object per bundle, for a fraction of the driver calls. Until then the
``GraphState`` holds them itself: nothing but this graph can use them yet.
Conditional-body graphs (owned by their parent's node) attach each bundle at once.
"""

from __future__ import annotations

import weakref
from typing import Any

from cuda.bindings import driver

from cuforge.graph import _owners


def _destroy(handle: driver.CUgraph) -> None:
    driver.cuGraphDestroy(handle)


class GraphState:
    """Owns (or borrows) one CUgraph and the owner bundles not yet given to CUDA."""

    __slots__ = ("__weakref__", "_finalizer", "closed", "handle", "owned", "parent", "pending")

    def __init__(
        self, handle: driver.CUgraph, parent: GraphState | None = None, owned: bool = True
    ) -> None:
        self.handle = handle
        # A body graph lives inside its parent's node: hold the parent so the CUgraph
        # that owns this one cannot be destroyed under us.
        self.parent = parent
        self.owned = owned and parent is None
        self.pending: list[tuple[Any, ...]] = []
        self.closed = False
        self._finalizer: weakref.finalize | None = None
        if self.owned:
            fin = weakref.finalize(self, _destroy, handle)
            fin.atexit = False  # no CUDA calls during interpreter shutdown
            self._finalizer = fin

    @property
    def is_body(self) -> bool:
        return not self.owned

    def check_open(self) -> None:
        if self.closed or (self.parent is not None and self.parent.closed):
            raise ValueError("the graph definition is closed")

    def add_bundle(self, owners: tuple[Any, ...]) -> None:
        """Keep ``owners`` alive for as long as CUDA may use this graph version."""
        if not owners:
            return
        if self.owned:
            self.pending.append(owners)
        else:
            _owners.attach(self.handle, owners)

    def flush(self) -> None:
        """Give every pending bundle to CUDA (one user object on the graph)."""
        if self.parent is not None:
            self.parent.flush()
            return
        if not self.owned or not self.pending:
            return
        owners = tuple(self.pending)
        _owners.attach(self.handle, owners)
        self.pending.clear()

    def close(self) -> None:
        """Destroy the CUgraph now (top-level graphs only); idempotent."""
        if self.closed:
            return
        self.closed = True
        if self._finalizer is not None:
            self._finalizer()
        self.pending.clear()
