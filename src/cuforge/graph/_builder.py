"""``GraphBuilder``: build a CUDA graph by capturing the work issued on a stream.

**Stream-capture lifetime contract.** Operations recorded during capture (kernel
launches, copies, memsets issued on the builder's stream) reference caller-owned
memory and are *not* retained: keep their buffers and arguments alive until every
graph made from this capture, and every launch of it, is done. Host callbacks are
the one exception: ``callback(fn, user_data=...)`` retains ``fn`` and a private
copy of ``user_data`` with the captured graph, exactly as the explicit
:class:`GraphDefinition` API retains everything. Child graphs embedded with
``embed`` carry their own owners.

States: a primary builder is INIT until ``begin_building``, BUILDING until
``end_building``, then BUILT; ``split`` forks builders that share the primary's
capture (FORKED); conditional methods return body builders (BODY).
``graph_definition`` is available on a primary only once BUILT, on a body before
``begin_building`` and once BUILT, never on a forked builder, never during capture,
and never after ``close()`` (a definition taken earlier stays valid).

Failure modes: calls in the wrong state -> RuntimeError naming the state; driver
refusals (e.g. an invalidated capture) -> CUDAError with the driver's reason.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from cuforge._cuda import driver
from cuforge.graph import _operands as ops
from cuforge.graph import _owners
from cuforge.graph._definition import Condition, GraphDefinition, create_condition
from cuforge.graph._state import GraphState, require_same_context
from cuforge.runtime import capture_guard
from cuforge.runtime.device import ContextScope
from cuforge.runtime.errors import CUDAError, check, error_for

if TYPE_CHECKING:
    from collections.abc import Callable

    from cuforge._typing import IsStreamT, ReadableBuffer, StrPath
    from cuforge.graph._definition import GraphCompleteOptions, GraphDebugPrintOptions
    from cuforge.graph._exec import Graph

_MODES = {
    "global": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}
_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
_SET_DEPS = driver.CUstreamUpdateCaptureDependencies_flags.CU_STREAM_SET_CAPTURE_DEPENDENCIES
_COND = driver.CUgraphConditionalNodeType
PRIMARY, FORKED, BODY = "primary", "forked", "conditional body"
INIT, BUILDING, BUILT, CLOSED = "not started", "building", "built", "closed"


def _new_stream(ctx: driver.CUcontext) -> driver.CUstream:
    flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
    with ContextScope(ctx):
        return check(driver.cuStreamCreate(flags), "cuStreamCreate")


class GraphBuilder:
    """Captures stream work into a graph (see the module docstring for the contract)."""

    __slots__ = (
        "__weakref__",
        "_bodies",
        "_body_state",
        "_capture",
        "_ctx",
        "_kind",
        "_own_streams",
        "_pending",
        "_phase",
        "_primary",
        "_state",
        "_stream",
    )
    _bodies: list[GraphState]
    _body_state: GraphState | None
    _capture: (
        tuple[
            capture_guard.Capture,
            weakref.finalize[[capture_guard.Capture, int, bool], GraphBuilder],
        ]
        | None
    )
    _ctx: driver.CUcontext
    _kind: str
    _own_streams: list[driver.CUstream]
    # Host-callback bundles captured so far; forks share their origin's list.
    _pending: list[tuple[Any, ...]]
    _phase: str
    _primary: GraphBuilder | None
    _state: GraphState | None
    _stream: IsStreamT | driver.CUstream

    def __init__(self, stream: IsStreamT) -> None:
        """A primary builder capturing on ``stream`` (a Stream or ``__cuda_stream__``)."""
        self._init(PRIMARY, stream)

    @classmethod
    def _from_stream(cls, stream: IsStreamT) -> GraphBuilder:
        """The factory ``Stream.create_graph_builder()`` uses."""
        return cls(stream)

    def _init(
        self,
        kind: str,
        stream: IsStreamT | driver.CUstream,
        primary: GraphBuilder | None = None,
        pending: list[tuple[Any, ...]] | None = None,
    ) -> None:
        handle = ops.stream_handle(stream)  # TypeError early for non-streams
        # The builder's graphs belong to its stream's context (see GraphState).
        if primary is not None:
            self._ctx = primary._ctx
        else:
            self._ctx = check(driver.cuStreamGetCtx(handle), "cuStreamGetCtx")
        self._kind = kind
        self._stream = stream
        self._phase = INIT if kind != FORKED else BUILDING
        self._primary = primary
        self._state = None
        self._body_state = None
        self._capture = None  # (capture_guard record, its abandon finalizer)
        self._own_streams = []
        self._bodies = []
        self._pending = pending if pending is not None else []
        if kind == PRIMARY:
            # Streams made for forks and bodies live until the primary goes.
            weakref.finalize(self, _destroy_streams, self._own_streams).atexit = False

    @classmethod
    def _child(
        cls,
        kind: str,
        stream: driver.CUstream,
        primary: GraphBuilder,
        pending: list[tuple[Any, ...]] | None = None,
    ) -> GraphBuilder:
        self = object.__new__(cls)
        self._init(kind, stream, primary, pending)
        return self

    # --- state ----------------------------------------------------------------------
    def _require(self, *phases: str) -> None:
        if self._phase not in phases:
            raise RuntimeError(
                f"GraphBuilder ({self._kind}) is {self._phase}; this needs it "
                + " or ".join(phases)
            )

    @property
    def stream(self) -> IsStreamT | driver.CUstream:
        return self._stream

    @property
    def handle(self) -> driver.CUstream:
        """The capturing stream's handle (so the builder can stand in for a stream)."""
        return ops.stream_handle(self._stream)

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, int(self.handle))

    @property
    def is_building(self) -> bool:
        return self._phase == BUILDING

    @property
    def is_join_required(self) -> bool:
        """True for builders made by ``split`` (they must be joined back before
        ``end_building``); False for the primary."""
        return self._kind == FORKED

    def _body_graph(self) -> GraphState:
        """A body builder's graph (set when the conditional node was added)."""
        state = self._body_state
        if state is None:
            raise RuntimeError(f"a {self._kind} graph builder has no body graph")
        return state

    def _built_graph(self) -> GraphState:
        """A primary builder's captured graph (set by end_building, cleared by close)."""
        state = self._state
        if state is None:
            raise RuntimeError(f"GraphBuilder ({self._kind}) has no captured graph")
        return state

    def _root(self) -> GraphBuilder:
        return self._primary if self._primary is not None else self

    # --- capture --------------------------------------------------------------------
    def begin_building(self, mode: str = "thread_local") -> GraphBuilder:
        """Start capturing (``mode``: "global", "thread_local" or "relaxed")."""
        if self._kind == FORKED:
            raise RuntimeError("a forked builder is already capturing; use join()")
        self._require(INIT)
        try:
            m = _MODES[mode]
        except KeyError:
            raise ValueError(f"mode must be one of {sorted(_MODES)}, got {mode!r}") from None
        if self._kind == BODY:
            check(driver.cuStreamBeginCaptureToGraph(self.handle, self._body_graph().handle,
                                                     None, None, 0, m),
                  "cuStreamBeginCaptureToGraph")  # fmt: skip
        else:
            check(driver.cuStreamBeginCapture(self.handle, m), "cuStreamBeginCapture")
        # Releases that this capture forbids are deferred until it ends (capture_guard).
        stream = int(self.handle)
        rec = capture_guard.begin(stream, mode)
        fin = weakref.finalize(self, _abandon, rec, stream, self._kind == PRIMARY)
        fin.atexit = False
        self._capture = (rec, fin)
        self._phase = BUILDING
        return self

    def _capture_over(self) -> None:
        """The capture ended (or was abandoned): run the releases it deferred."""
        if self._capture is not None:
            rec, fin = self._capture
            self._capture = None
            fin.detach()
            capture_guard.end(rec)

    def end_building(self) -> GraphBuilder:
        """Stop capturing; the captured graph (and retained callbacks) become the result."""
        if self._kind == FORKED:
            raise RuntimeError("end_building on the primary builder, after join()")
        self._require(BUILDING)
        pending = list(self._pending)
        self._pending.clear()
        try:
            graph = check(driver.cuStreamEndCapture(self.handle), "cuStreamEndCapture")
        finally:
            self._capture_over()  # ended, successfully or not
        self._phase = BUILT
        if self._kind == BODY:
            body = self._body_graph()
            for owners in pending:
                body.add_bundle(owners)
        else:
            state = self._state = GraphState(graph, ctx=self._ctx)
            for owners in pending:
                state.add_bundle(owners)
            for body_state in self._bodies:
                body_state.parent = state
        return self

    def complete(self, options: GraphCompleteOptions | None = None) -> Graph:
        """Instantiate the built graph as a :class:`Graph`."""
        if self._kind != PRIMARY:
            raise RuntimeError(f"complete() is for the primary builder, not a {self._kind} one")
        self._require(BUILT)
        return self.graph_definition.instantiate(options)

    def debug_dot_print(self, path: StrPath, options: GraphDebugPrintOptions | None = None) -> None:
        """Write a Graphviz description of the built graph (see GraphDefinition)."""
        self.graph_definition.debug_dot_print(path, options)

    @property
    def graph_definition(self) -> GraphDefinition:
        """The captured graph as a GraphDefinition sharing it (rules in the module doc)."""
        if self._kind == FORKED:
            raise RuntimeError("a forked builder has no graph of its own; use the primary")
        if self._kind == PRIMARY:
            self._require(BUILT)
            return GraphDefinition._wrap(self._built_graph())
        self._require(INIT, BUILT)
        return GraphDefinition._wrap(self._body_graph())

    # --- capture-time operations -----------------------------------------------------
    def _capture_info(self) -> tuple[driver.CUgraph, list[driver.CUgraphNode]]:
        res = check(driver.cuStreamGetCaptureInfo(self.handle), "cuStreamGetCaptureInfo")
        status, graph, deps, count = res[0], res[2], res[3], res[-1]
        if status != _ACTIVE:
            raise CUDAError(f"the builder's stream is not capturing (status {status.name})")
        return graph, list(deps)[:count]

    def _insert(self, node: driver.CUgraphNode) -> None:
        check(driver.cuStreamUpdateCaptureDependencies(self.handle, [node], None, 1, _SET_DEPS),
              "cuStreamUpdateCaptureDependencies")  # fmt: skip

    def callback(
        self, fn: Callable[..., object], *, user_data: int | ReadableBuffer | None = None
    ) -> None:
        """Capture a host callback; ``fn`` and a copy of ``user_data`` are retained."""
        self._require(BUILDING)
        p, owners = ops.host_callback(fn, user_data)
        self._capture_info()  # refuse before enqueueing: outside capture it would run
        # Straight to the driver: cuda-bindings' cuLaunchHostFunc wraps the function in
        # one-shot state, which a graph launched twice would call after it was freed.
        c = _owners.native_graph()
        if not c:
            raise CUDAError("capturing a host callback needs cuforge's C helpers (not built)")
        err = c.host_func(int(self.handle), int(p.fn), int(p.userData or 0))
        if err:
            raise error_for(driver.CUresult(err), "cuLaunchHostFunc")
        self._pending.append(owners)

    def embed(self, child: GraphDefinition | GraphBuilder) -> None:
        """Capture ``child`` (a definition, or a builder that finished building) as a
        child-graph node; CUDA copies it with its owners."""
        self._require(BUILDING)
        state = _as_definition(child, "embed(child)")._state
        state.check_open()
        require_same_context("embed(child)", state, self._ctx)
        state.flush()
        graph, deps = self._capture_info()
        node = check(driver.cuGraphAddChildGraphNode(graph, deps, len(deps), state.handle),
                     "cuGraphAddChildGraphNode")  # fmt: skip
        self._insert(node)

    def split(self, count: int) -> tuple[GraphBuilder, ...]:
        """``count`` builders: this one plus forks that start after the work so far."""
        self._require(BUILDING)
        if count < 1:
            raise ValueError("split count must be at least 1")
        root = self._root()
        out = [self]
        for _ in range(count - 1):
            s = _new_stream(self._ctx)
            root._own_streams.append(s)
            _fork_wait(self.handle, s)
            out.append(GraphBuilder._child(FORKED, s, root, self._pending))
        return tuple(out)

    @staticmethod
    def join(*builders: GraphBuilder) -> GraphBuilder:
        """Make one builder wait for all the others and return it: the primary when it
        is among ``builders`` (so ``end_building`` can follow), else ``builders[0]``.
        The other forked builders are closed."""
        if not builders:
            raise ValueError("join needs at least one builder")
        first = builders[0]
        for b in builders:
            if not isinstance(b, GraphBuilder):
                raise TypeError(f"join expects GraphBuilders, got {type(b).__name__}")
            b._require(BUILDING)
            if b._root() is not first._root():
                raise ValueError(
                    "join: every builder must come from the same capture (split() of one "
                    "builder); builders of separate captures or devices cannot be joined"
                )
        target = next((b for b in builders if b._kind != FORKED), first)
        for b in builders:
            if b is not target:
                _fork_wait(b.handle, target.handle)
                if b._kind == FORKED:
                    b._phase = CLOSED
        return target

    def create_condition(self, default_value: int | None = None) -> Condition:
        """A condition for a conditional node of the graph being captured."""
        return self.create_conditional_handle(default_value)

    def create_conditional_handle(self, default_value: int | None = None) -> Condition:
        """A condition for a conditional node of the graph being captured."""
        self._require(BUILDING)
        graph, _ = self._capture_info()
        return create_condition(GraphState(graph, owned=False, ctx=self._ctx), default_value)

    def _conditional(self, cond: Condition, kind: Any, size: int) -> tuple[GraphBuilder, ...]:
        self._require(BUILDING)
        if not isinstance(cond, Condition):
            raise TypeError(f"expected a Condition, got {type(cond).__name__}")
        graph, deps = self._capture_info()
        p = driver.CUgraphNodeParams()
        p.type = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
        p.conditional.handle = cond.handle
        p.conditional.type = kind
        p.conditional.size = size
        p.conditional.ctx = self._ctx
        node = check(driver.cuGraphAddNode(graph, deps, None, len(deps), p),
                     "cuGraphAddNode(conditional)")  # fmt: skip
        self._insert(node)
        root = self._root()
        out = []
        for g in list(p.conditional.phGraph_out)[:size]:
            s = _new_stream(self._ctx)
            root._own_streams.append(s)
            body = GraphBuilder._child(BODY, s, root)
            parent = self._body_state if self._kind == BODY else None
            body._body_state = GraphState(g, parent=parent, owned=False, ctx=self._ctx)
            if parent is None:
                root._bodies.append(body._body_state)
            out.append(body)
        return tuple(out)

    def if_cond(self, handle: Condition) -> GraphBuilder:
        """Body builder of an IF node (runs when the condition is non-zero)."""
        return self._conditional(handle, _COND.CU_GRAPH_COND_TYPE_IF, 1)[0]

    if_then = if_cond  # cuda.core's newer name

    def if_else(self, handle: Condition) -> tuple[GraphBuilder, GraphBuilder]:
        """(then, else) body builders of an IF/ELSE node."""
        then, other = self._conditional(handle, _COND.CU_GRAPH_COND_TYPE_IF, 2)
        return then, other

    def while_loop(self, handle: Condition) -> GraphBuilder:
        """Body builder of a WHILE node (repeats while the condition is non-zero)."""
        return self._conditional(handle, _COND.CU_GRAPH_COND_TYPE_WHILE, 1)[0]

    def switch(self, handle: Condition, count: int) -> tuple[GraphBuilder, ...]:
        """``count`` body builders of a SWITCH node."""
        return self._conditional(handle, _COND.CU_GRAPH_COND_TYPE_SWITCH, int(count))

    # --- teardown ---------------------------------------------------------------------
    def _release_streams(self) -> None:
        _destroy_streams(self._own_streams)

    def close(self) -> None:
        """Release the builder; a capture in progress is abandoned. Idempotent."""
        if self._phase == CLOSED:
            return
        if self._phase == BUILDING and self._kind != FORKED:
            res = driver.cuStreamEndCapture(self.handle)  # abandon the capture
            self._capture_over()
            if self._kind == PRIMARY and res[0] == driver.CUresult.CUDA_SUCCESS and int(res[1]):
                capture_guard.destroy(b"cuGraphDestroy", int(res[1]))
        self._phase = CLOSED
        self._pending = []
        self._state = None
        if self._kind == PRIMARY:
            self._release_streams()

    def __enter__(self) -> GraphBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<GraphBuilder {self._kind} {self._phase}>"


def _as_definition(obj: GraphDefinition | GraphBuilder, what: str) -> GraphDefinition:
    """``obj`` as a GraphDefinition: itself, or a finished builder's graph."""
    if isinstance(obj, GraphDefinition):
        return obj
    if isinstance(obj, GraphBuilder):
        if obj._phase == CLOSED:
            raise ValueError(f"{what}: the graph builder is closed")
        if obj._kind == PRIMARY and obj._phase != BUILT:
            raise ValueError(f"{what}: the graph builder has not finished building")
        return obj.graph_definition
    raise TypeError(f"{what}: expected a GraphDefinition or GraphBuilder, got {type(obj).__name__}")


def _destroy_streams(streams: list[driver.CUstream]) -> None:
    while streams:
        capture_guard.destroy(b"cuStreamDestroy", int(streams.pop()))


def _abandon(rec: capture_guard.Capture, stream: int, primary: bool) -> None:
    """A builder collected mid-capture: end its capture (CUDA refuses if another thread
    began it in a strict mode) and stop deferring releases on its account."""
    res = driver.cuStreamEndCapture(driver.CUstream(stream))
    capture_guard.end(rec)
    if primary and res[0] == driver.CUresult.CUDA_SUCCESS and int(res[1]):
        capture_guard.destroy(b"cuGraphDestroy", int(res[1]))


def _fork_wait(src: driver.CUstream, dst: driver.CUstream) -> None:
    """Make ``dst`` wait for the work captured on ``src`` so far (joins the capture)."""
    flags = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
    ev = check(driver.cuEventCreate(flags), "cuEventCreate")
    try:
        check(driver.cuEventRecord(ev, src), "cuEventRecord")
        check(driver.cuStreamWaitEvent(dst, ev, 0), "cuStreamWaitEvent")
    finally:
        driver.cuEventDestroy(ev)
