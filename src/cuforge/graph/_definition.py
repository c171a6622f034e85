"""``GraphDefinition``: a CUDA graph built explicitly, node by node.

Guarantees: every node keeps what it references alive (kernel, arguments and their
allocations, callables and private copies of user data, copy operands that are
Buffers, events) for as long as this graph, its clones, graphs it is embedded in,
its executable graphs and their in-flight launches may use them -- through owner
bundles held by CUDA user objects, released off CUDA's thread. Raw int addresses
are the caller's to keep valid unless an owner is named.

Failure modes: use after ``close()`` -> ValueError; driver refusals -> CUDAError
carrying the driver's reason.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cuforge._cuda import driver
from cuforge._native import _release
from cuforge.graph import _operands as ops
from cuforge.graph import _owners
from cuforge.graph._listing import query_nodes, wrap_node
from cuforge.graph._nodes import EmptyNode, GraphNode, _Adder
from cuforge.graph._state import GraphState
from cuforge.runtime import capture_guard, init
from cuforge.runtime.errors import check, error_for

if TYPE_CHECKING:
    from cuforge._typing import IsStreamT, StrPath
    from cuforge.graph._exec import Graph

_F = driver.CUgraphInstantiate_flags


@dataclass(frozen=True)
class GraphCompleteOptions:
    """How to instantiate a graph (names follow cuda.core).

    ``auto_free_on_launch``: graph allocations not freed in the graph are freed at the
    next launch. ``upload_stream``: upload the executable graph on this stream right
    away. ``device_launch``: make it launchable from the device. ``use_node_priority``:
    honour per-node priorities.
    """

    auto_free_on_launch: bool = False
    upload_stream: IsStreamT | None = None
    device_launch: bool = False
    use_node_priority: bool = False

    def flags(self) -> int:
        f = 0
        if self.auto_free_on_launch:
            f |= int(_F.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
        if self.device_launch:
            f |= int(_F.CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH)
        if self.use_node_priority:
            f |= int(_F.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY)
        return f


@dataclass(frozen=True)
class GraphDebugPrintOptions:
    """What ``debug_dot_print`` writes; ``verbose`` turns on every detail."""

    verbose: bool = False

    def flags(self) -> int:
        return int(driver.CUgraphDebugDot_flags.CU_GRAPH_DEBUG_DOT_FLAGS_VERBOSE) if self.verbose else 0  # fmt: skip  # noqa: E501


class Condition:
    """A conditional handle: set it on the GPU with ``cudaGraphSetConditional``.

    Pass ``condition.handle`` (an unsigned 64-bit value) to the kernel that sets it.
    """

    __slots__ = ("_handle", "default_value")

    def __init__(self, handle: Any, default_value: int | None) -> None:
        self._handle = handle
        self.default_value = default_value

    @property
    def handle(self) -> Any:
        """The ``CUgraphConditionalHandle``; ``int(handle)`` is its kernel-argument value."""
        return self._handle

    def __int__(self) -> int:
        return int(self._handle)

    def __kernel_arg_u64__(self) -> int:
        """Passed to a kernel (launch or kernel node) as its 64-bit handle value."""
        return int(self._handle)

    def __repr__(self) -> str:
        return f"<Condition {int(self._handle):#x} default={self.default_value}>"


def create_condition(state: GraphState, default_value: int | None) -> Condition:
    state.check_open()
    flags = 0 if default_value is None else 1  # CU_GRAPH_COND_ASSIGN_DEFAULT
    handle = check(
        driver.cuGraphConditionalHandleCreate(
            state.handle, state.ctx, int(default_value or 0), flags
        ),
        "cuGraphConditionalHandleCreate",
    )
    return Condition(handle, default_value)


class GraphDefinition(_Adder):
    """A CUDA graph under construction; ``instantiate()`` makes a launchable Graph."""

    __slots__ = ("__weakref__", "_state")

    def __init__(self) -> None:
        """An empty graph for the device whose context is current on this thread."""
        init.ensure_initialized()  # returns at once after the first time
        c = _owners.native_graph()
        if not c:
            ctx = ops.current_context()
            graph = check(driver.cuGraphCreate(0), "cuGraphCreate")
            self._state = GraphState(graph, ctx=ctx)
            return
        if _release.queued():
            # Releases whose drain request the interpreter refused (its pending-call
            # queue was full) would otherwise wait for the next destructor call.
            _owners.drain()
        # The graph and its first bundle list (see GraphState) in one C call.
        lst: list[Any] = []
        token = _owners.register(lst)
        err, ctx, graph, _committed = c.create(0, token)
        if err or not ctx:
            _owners.unregister(token)
            if graph:
                capture_guard.destroy(b"cuGraphDestroy", graph)
            if not ctx:
                ops.current_context()  # raises the "no current context" CUDAError
            raise error_for(driver.CUresult(err), "cuGraphCreate")
        state = self._state = GraphState._new(graph, ctx)
        state.pending = lst

    @classmethod
    def _wrap(cls, state: GraphState) -> GraphDefinition:
        self = object.__new__(cls)
        self._state = state
        return self

    def _target(self) -> tuple[GraphState, list[int]]:
        self._state.check_open()
        return self._state, []

    @property
    def handle(self) -> driver.CUgraph:
        self._state.check_open()
        return self._state.handle

    def join(self, *nodes: GraphNode) -> EmptyNode:
        """An empty node depending on every node in ``nodes``."""
        state = self._state
        state.check_open()
        deps = []
        for n in nodes:
            if not isinstance(n, GraphNode):
                raise TypeError(f"join expects graph nodes, got {type(n).__name__}")
            if n._state.handle_int != state.handle_int:
                raise ValueError("join: every node must belong to this graph")
            deps.append(n._handle)
        node = check(driver.cuGraphAddEmptyNode(state.handle, deps, len(deps)), "cuGraphAddEmptyNode")  # fmt: skip  # noqa: E501
        return EmptyNode._wrap(state, node)

    def create_condition(self, default_value: int | None = None) -> Condition:
        """A conditional handle for a conditional node of this graph."""
        return create_condition(self._state, default_value)

    def nodes(self) -> tuple[GraphNode, ...]:
        """Every node of this graph (not of its bodies or children)."""
        self._state.check_open()
        found = query_nodes(driver.cuGraphGetNodes, self._state.handle)
        return tuple(wrap_node(self._state, n) for n in found)

    def edges(self) -> tuple[tuple[GraphNode, GraphNode], ...]:
        """Every dependency edge as (from, to)."""
        self._state.check_open()
        res = check(driver.cuGraphGetEdges(self._state.handle, 0), "cuGraphGetEdges")
        count = res[-1]
        if not count:
            return ()
        res = check(driver.cuGraphGetEdges(self._state.handle, count), "cuGraphGetEdges")
        src, dst = list(res[0])[:count], list(res[1])[:count]
        s = self._state
        return tuple((wrap_node(s, a), wrap_node(s, b)) for a, b in zip(src, dst, strict=True))

    def _edge(self, src: GraphNode, dst: GraphNode) -> tuple[Any, Any]:
        self._state.check_open()
        for n in (src, dst):
            if not isinstance(n, GraphNode):
                raise TypeError(f"expected a GraphNode, got {type(n).__name__}")
            n._check_live()
        return [src._handle], [dst._handle]

    def add_dependencies(self, src: GraphNode, dst: GraphNode) -> None:
        """Make ``dst`` depend on ``src`` (CUDAError for a self edge, an existing edge
        or a node of another graph)."""
        a, b = self._edge(src, dst)
        check(driver.cuGraphAddDependencies(self._state.handle, a, b, None, 1),
              "cuGraphAddDependencies")  # fmt: skip

    def remove_dependencies(self, src: GraphNode, dst: GraphNode) -> None:
        """Drop the edge ``src`` -> ``dst`` (CUDAError if there is none)."""
        a, b = self._edge(src, dst)
        check(driver.cuGraphRemoveDependencies(self._state.handle, a, b, None, 1),
              "cuGraphRemoveDependencies")  # fmt: skip

    def clone(self) -> GraphDefinition:
        """An independent copy; CUDA gives the copy its own references to every owner."""
        self._state.check_open()
        self._state.flush()
        graph = check(driver.cuGraphClone(self._state.handle), "cuGraphClone")
        return GraphDefinition._wrap(GraphState(graph, ctx=self._state.ctx))

    def instantiate(self, options: GraphCompleteOptions | None = None) -> Graph:
        """Create an executable :class:`Graph` from the current contents."""
        from cuforge.graph._exec import Graph

        return Graph._instantiate(self._state, options)

    def debug_dot_print(self, path: StrPath, options: GraphDebugPrintOptions | None = None) -> None:
        """Write a Graphviz description of the graph to ``path``."""
        self._state.check_open()
        if options is not None and not isinstance(options, GraphDebugPrintOptions):
            raise TypeError(
                f"options must be a GraphDebugPrintOptions, not {type(options).__name__}"
            )
        flags = options.flags() if options is not None else 0
        check(driver.cuGraphDebugDotPrint(self._state.handle, os.fsencode(path), flags),
              "cuGraphDebugDotPrint")  # fmt: skip

    def __eq__(self, other: object) -> bool:
        """Two views of one graph (e.g. ``node.graph`` and the definition) are equal."""
        return isinstance(other, GraphDefinition) and other._state is self._state

    def __hash__(self) -> int:
        return hash(("cuforge.GraphDefinition", id(self._state)))

    def close(self) -> None:
        """Destroy the graph now (executables and clones are unaffected); idempotent.

        For a conditional body, only this view is closed: the body belongs to its node.
        """
        if self._state.is_body:
            return
        self._state.close()

    destroy = close

    @property
    def is_closed(self) -> bool:
        return not self._state.is_open

    def __enter__(self) -> GraphDefinition:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._state.closed else f"{self._state.handle_int:#x}"
        return f"<GraphDefinition {state}>"
