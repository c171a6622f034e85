"""The Python side of one ``CUgraph``: who destroys it and its uncommitted bundles.

Bundles of a top-level graph are *group-committed*: each node add/update appends
its immutable owner tuple to ``pending``, and :meth:`GraphState.flush` moves all of
them into one new user object retained on the graph. Flushing happens before
anything that lets CUDA copy the graph's references (instantiate, clone, child
embedding, whole-graph exec update), so CUDA sees exactly the same owners as with
one user object per bundle, for a fraction of the driver calls. Until then the
``GraphState`` holds them itself: nothing but this graph can use them yet.
Conditional-body graphs (owned by their parent's node) attach each bundle at once.

Every graph belongs to one CUDA context (and so one device): the context current
when it was created, its parent's for a body, the capturing stream's for a builder.
Nodes are added to run in that context whatever is current later, and operations
that would mix contexts (embedding, exec updates, launches) are refused.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

from cuda.bindings import driver

from cuforge.graph import _owners
from cuforge.graph._operands import context_device, current_context


def require_same_context(what: str, theirs: GraphState, ctx: driver.CUcontext) -> None:
    """ValueError unless ``theirs`` (a graph used by ``what``) belongs to context ``ctx``."""
    if theirs.ctx_int != int(ctx):
        raise ValueError(
            f"{what}: it belongs to device {theirs.device_id} (context {theirs.ctx_int:#x}) "
            f"but this graph to device {context_device(ctx)} (context {int(ctx):#x}); "
            "a cuforge graph runs on one device"
        )


def _destroy(handle: driver.CUgraph) -> None:
    driver.cuGraphDestroy(handle)


class GraphState:
    """Owns (or borrows) one CUgraph and the owner bundles not yet given to CUDA."""

    __slots__ = (
        "__weakref__", "_device_id", "_finalizer", "closed", "ctx", "ctx_int", "handle",
        "handle_int", "owned", "parent", "pending", "scratch", "scratch_addr", "scratch_size",
    )  # fmt: skip

    def __init__(
        self,
        handle: driver.CUgraph,
        parent: GraphState | None = None,
        owned: bool = True,
        ctx: driver.CUcontext | None = None,
    ) -> None:
        self.handle = handle
        self.handle_int = int(handle)
        if ctx is None:
            ctx = parent.ctx if parent is not None else current_context()
        self.ctx = ctx
        self.ctx_int = int(ctx)
        self._device_id: int | None = None
        # Kernel-node parameters are packed here for the add call (the driver copies them).
        self.scratch: Any = None
        self.scratch_addr = 0
        self.scratch_size = 0
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

    def grow_scratch(self, nbytes: int) -> None:
        """Make the parameter scratch memory at least ``nbytes`` long."""
        size = max(nbytes, 2 * self.scratch_size, 256)
        self.scratch = (ctypes.c_char * size)()
        self.scratch_addr = ctypes.addressof(self.scratch)
        self.scratch_size = size

    @property
    def device_id(self) -> int:
        """The ordinal of the device this graph's context belongs to."""
        if self._device_id is None:
            self._device_id = context_device(self.ctx)
        return self._device_id

    def require_same_context(self, other: GraphState, what: str) -> None:
        """ValueError unless ``other`` (a graph used by ``what``) shares this one's context."""
        require_same_context(what, other, self.ctx)

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
