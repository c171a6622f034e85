"""The Python side of one ``CUgraph``: who destroys it and its open bundle list.

Bundles of a top-level graph are *group-committed*: the first node add/update after
a seal opens a list owned by one new user object retained on the graph (``pending``),
and later adds/updates append their immutable owner tuples to it. :meth:`GraphState.flush`
*seals* the list (the next add opens a new one) before anything lets CUDA copy the
graph's references (instantiate, clone, child embedding, whole-graph exec update):
a copy holds the list as it was, and nothing is ever appended to a list a copy
holds. So CUDA sees exactly the owners it would with one user object per bundle,
for one user object per seal. Conditional-body graphs (owned by their parent's
node) attach each bundle at once.

Every graph belongs to one CUDA context (and so one device): the context current
when it was created, its parent's for a body, the capturing stream's for a builder.
Nodes are added to run in that context whatever is current later, and operations
that would mix contexts (embedding, exec updates, launches) are refused.
"""

from __future__ import annotations

import ctypes
import sys
from typing import Any

from cuda.bindings import driver

from cuforge.graph import _owners
from cuforge.graph._operands import context_device, current_context
from cuforge.runtime import capture_guard


def require_same_context(what: str, theirs: GraphState, ctx: Any) -> None:
    """ValueError unless ``theirs`` (a graph used by ``what``) belongs to context ``ctx``."""
    if theirs.ctx_int != int(ctx):
        raise ValueError(
            f"{what}: it belongs to device {theirs.device_id} (context {theirs.ctx_int:#x}) "
            f"but this graph to device {context_device(ctx)} (context {int(ctx):#x}); "
            "a cuforge graph runs on one device"
        )


def _destroy(handle: int) -> None:
    # Queued while a stream capture forbids it (see cuforge.runtime.capture_guard).
    capture_guard.destroy(b"cuGraphDestroy", handle)


class GraphState:
    """Owns (or borrows) one CUgraph and the owner bundles not yet given to CUDA.

    ``handle_int``/``ctx_int`` are the graph and context addresses; ``handle`` and
    ``ctx`` are cuda.bindings objects for them, made on first use (the hot paths
    never need them). An owned graph is destroyed by ``close()`` or when this
    object is collected (not during interpreter shutdown).
    """

    __slots__ = (
        "__weakref__", "_ctx", "_device_id", "_hobj", "closed", "ctx_int", "destroyed",
        "handle_int", "owned", "parent", "pending", "scratch", "scratch_addr", "scratch_size",
    )  # fmt: skip

    def __init__(
        self,
        handle: Any,
        parent: GraphState | None = None,
        owned: bool = True,
        ctx: Any = None,
    ) -> None:
        """``handle`` and ``ctx``: CUgraph/CUcontext objects or their addresses."""
        if ctx is None:
            ctx = parent.ctx_int if parent is not None else current_context()
        self.handle_int = int(handle)
        self._hobj = handle if not isinstance(handle, int) else None
        self.ctx_int = int(ctx)
        self._ctx = ctx if not isinstance(ctx, int) else None
        self._device_id: int | None = None
        # Kernel-node parameters are packed here for the add call (the driver copies them).
        self.scratch: Any = None
        self.scratch_addr = 0
        self.scratch_size = 0
        # A body graph lives inside its parent's node: hold the parent so the CUgraph
        # that owns this one cannot be destroyed under us.
        self.parent = parent
        self.owned = owned and parent is None
        self.pending: list[Any] | None = None  # the open bundle list (owned graphs)
        self.closed = False
        self.destroyed: set[int] | None = None  # addresses of nodes destroyed here

    @classmethod
    def _new(cls, handle: int, ctx: int) -> GraphState:
        """An owned top-level graph from addresses (the GraphDefinition() fast path)."""
        self = object.__new__(cls)
        self.handle_int = handle
        self._hobj = None
        self.ctx_int = ctx
        self._ctx = None
        self._device_id = None
        self.scratch = None
        self.scratch_addr = 0
        self.scratch_size = 0
        self.parent = None
        self.owned = True
        self.pending = None
        self.closed = False
        self.destroyed = None
        return self

    def __del__(self) -> None:
        if self.owned and not self.closed and not sys.is_finalizing():
            self.closed = True
            _destroy(self.handle_int)

    @property
    def handle(self) -> driver.CUgraph:
        h = self._hobj
        if h is None:
            h = self._hobj = driver.CUgraph(self.handle_int)
        return h

    @property
    def ctx(self) -> driver.CUcontext:
        c = self._ctx
        if c is None:
            c = self._ctx = driver.CUcontext(self.ctx_int)
        return c

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
            lst = self.pending
            if lst is None:
                lst = self.open_list()
            lst.append(owners)
        else:
            _owners.attach(self.handle_int, owners)

    def open_list(self) -> list[Any]:
        """A new bundle list, owned by a new user object on the graph (CUDAError, and
        no list, if the driver refuses)."""
        lst: list[Any] = []
        _owners.attach(self.handle_int, lst)
        self.pending = lst
        return lst

    def flush(self) -> None:
        """Seal the open bundle list: CUDA may copy the graph's references now, and
        what is added later goes to a new list."""
        if self.parent is not None:
            self.parent.flush()
            return
        self.pending = None

    def close(self) -> None:
        """Destroy the CUgraph now (top-level graphs only); idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.owned:
            _destroy(self.handle_int)
        self.pending = None
