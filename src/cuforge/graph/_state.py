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

*Node metadata* (``meta``): what cuforge gave a node that the driver cannot hand back
as a Python object -- a kernel node's Kernel, a host node's callable, an event
node's Event, a conditional node's kind, Condition and bodies, a child node's graph
view -- keyed by node address and replaced by each definition-level update. Nodes
of copies (clones, captures) have none: those getters answer None there. The
entries only name objects the graph's bundles already keep alive, so they extend no
lifetime; graphs that live inside a node (bodies, child views) are held weakly and
closed when that node is destroyed or its child replaced.

Every graph belongs to one CUDA context (and so one device): the context current
when it was created, its parent's for a body, the capturing stream's for a builder.
Nodes are added to run in that context whatever is current later, and operations
that would mix contexts (embedding, exec updates, launches) are refused.
"""

from __future__ import annotations

import ctypes
import sys
import weakref
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


class NodeGraphs:
    """Metadata of a node that graphs live inside: a conditional node's bodies
    (``kind`` "if", "if_else", "while" or "switch", with its Condition) or a child
    node's graph (``kind`` "child"). ``handles`` are the CUgraph addresses; the
    GraphStates made for them are held weakly in ``inner`` (None: none made yet)."""

    __slots__ = ("condition", "handles", "inner", "kind")

    def __init__(self, kind: str, handles: tuple[int, ...], condition: Any = None) -> None:
        self.kind = kind
        self.handles = handles
        self.condition = condition
        self.inner: list[Any] = [None] * len(handles)

    def close_all(self) -> None:
        """Close every GraphState made for these graphs (their node went)."""
        for ref in self.inner:
            g = ref() if ref is not None else None
            if g is not None:
                g.close()

    def graph(self, owner: GraphState, i: int) -> GraphState:
        """The GraphState of inner graph ``i`` (one per graph while any is alive)."""
        ref = self.inner[i]
        g = ref() if ref is not None else None
        if g is None:
            g = GraphState(self.handles[i], parent=owner)
            self.inner[i] = weakref.ref(g)
        return g


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
        "handle_int", "has_inner", "meta", "owned", "parent", "pending", "scratch", "scratch_addr",
        "scratch_size",
    )  # fmt: skip
    _ctx: driver.CUcontext | None
    _device_id: int | None
    _hobj: driver.CUgraph | None
    closed: bool
    ctx_int: int
    destroyed: set[int] | None  # addresses of nodes destroyed here
    handle_int: int
    owned: bool
    parent: GraphState | None
    pending: list[Any] | None  # the open bundle list (owned graphs)
    scratch: ctypes.Array[ctypes.c_char] | None
    scratch_addr: int
    scratch_size: int

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
        self._device_id = None
        # Kernel-node parameters are packed here for the add call (the driver copies them).
        self.scratch = None
        self.scratch_addr = 0
        self.scratch_size = 0
        # A body graph lives inside its parent's node: hold the parent so the CUgraph
        # that owns this one cannot be destroyed under us.
        self.parent = parent
        self.owned = owned and parent is None
        self.pending = None
        self.closed = False
        self.destroyed: set[int] | None = None  # addresses of nodes destroyed here
        self.meta: dict[int, Any] = {}  # node address -> what cuforge gave it (module doc)
        self.has_inner = False  # whether meta ever held a NodeGraphs (graphs inside nodes)

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
        self.meta = {}
        self.has_inner = False
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
        """ValueError if this graph, or a graph it lives in, is closed (a body or a
        child view is closed when its node is destroyed or its child replaced)."""
        if self.closed:
            raise ValueError(
                "the graph definition is closed" if self.owned else
                "this graph lived inside a node that was destroyed or replaced, or "
                "inside a graph that was closed"
            )  # fmt: skip
        p = self.parent
        while p is not None:
            if p.closed:
                raise ValueError("the graph this graph lives in is closed")
            p = p.parent

    @property
    def is_open(self) -> bool:
        """False once this graph, or a graph it lives in, is closed."""
        s: GraphState | None = self
        while s is not None:
            if s.closed:
                return False
            s = s.parent
        return True

    def forget_node(self, node: int) -> None:
        """A node of this graph was destroyed (or its child replaced): drop its
        metadata and close the graphs that lived inside it."""
        entry = self.meta.pop(node, None)
        if type(entry) is NodeGraphs:
            entry.close_all()

    def add_inner(self, node: int, entry: NodeGraphs) -> None:
        """Record the graphs that live inside ``node``."""
        self.meta[node] = entry
        self.has_inner = True

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
        meta, self.meta = self.meta, {}
        if self.has_inner:  # close the graphs inside nodes too, dropping their metadata
            for entry in meta.values():
                if type(entry) is NodeGraphs:
                    entry.close_all()
