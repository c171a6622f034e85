"""``Graph``: an executable CUDA graph, with per-node updates that keep owners alive.

Ownership of an executable graph:
- at instantiation CUDA copies every user-object reference of the source graph, so
  the definition's bundles outlive the definition for as long as the exec exists
  (and until its in-flight launches finish);
- node updates on the exec (``graph[node].update(...)``) put their new owners into
  the exec's *accumulator* (node -> versions), made at the first such update and
  held by this object. From then on every launch also records the exec's *idle
  event* (launches of one exec are ordered, so its completion means no launch is
  running);
- a superseded version is dropped only when the exec is idle; otherwise it stays;
- when the exec is closed, or ``update(definition)`` replaces every reference (the
  new definition's bundles are copied in by CUDA), the old accumulator is dropped
  once the idle event completes: at once if it has, else by a host function that
  CUDA runs after it (on a cuforge stream that waits for the event), which only
  queues the release for Python (``cuforge_release``, as user-object destructors do).
A failed update changes nothing: the new owners are only recorded on success.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from cuda.bindings import driver

from cuforge._log import get_logger
from cuforge._native import _release
from cuforge._native._launch import graph_launch as _c_graph_launch
from cuforge.graph import _operands as ops
from cuforge.graph import _owners
from cuforge.graph import _params as _read
from cuforge.graph._nested import ChildGraphNode
from cuforge.graph._nodes import (
    EventRecordNode,
    EventWaitNode,
    GraphNode,
    HostCallbackNode,
    KernelNode,
    MemcpyNode,
    MemsetNode,
)
from cuforge.graph._state import GraphState
from cuforge.runtime import capture_guard
from cuforge.runtime.device import ContextScope, Device
from cuforge.runtime.errors import CUDAError, check, error_for
from cuforge.runtime.init import driver_entry
from cuforge.runtime.stream import Stream

if TYPE_CHECKING:
    from collections.abc import Callable

    from cuforge._typing import DevicePointer, IsStreamT, ReadableBuffer
    from cuforge.graph._builder import GraphBuilder
    from cuforge.graph._definition import GraphCompleteOptions, GraphDefinition
    from cuforge.runtime.event import Event
    from cuforge.runtime.launch import LaunchConfig
    from cuforge.runtime.module import Kernel

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_LAUNCH = 0  # cuGraphLaunch's address; -1: unavailable (use the bindings)
_RECORD = 0  # cuEventRecord's address
# DEBUG records of instantiate, launch and close; each site checks the level first,
# so with DEBUG off a launch pays one isEnabledFor call.
_log = get_logger("cuforge.graph")  # with the cuforge NullHandler in place (cuforge._log)
_DEBUG = 10  # logging.DEBUG


def _resolve_launch_entries() -> int:
    global _LAUNCH, _RECORD
    launch, record = driver_entry(b"cuGraphLaunch"), driver_entry(b"cuEventRecord")
    _LAUNCH, _RECORD = (launch, record) if launch and record else (-1, 0)
    return _LAUNCH


def _instantiate_native(c: Any, state: GraphState, flags: int) -> int:
    """Seal the bundle list and instantiate in one C call; the exec's address."""
    state.check_open()
    state.flush()
    err, _stage, h = c.instantiate(state.handle_int, 0, flags)
    exec_address: int = h
    if err:
        raise error_for(driver.CUresult(err), "cuGraphInstantiate")
    return exec_address


# --- dropping an accumulator once no launch can use it -----------------------------
_release_streams: dict[int, driver.CUstream] = {}
_kept_until_exit: list[Any] = []  # accumulators of execs whose launches were untracked


def _release_stream(device_id: int) -> driver.CUstream:
    """A cuforge-internal stream of ``device_id`` for deferred releases (never closed)."""
    s = _release_streams.get(device_id)
    if s is None:
        with Device(device_id)._scope():
            flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING
            s = _release_streams[device_id] = check(driver.cuStreamCreate(flags), "cuStreamCreate")
    return s


def _drop_after_launches(acc: Any, ev: Any, untracked: bool, device_id: int, own: bool) -> None:
    """Drop ``acc`` once every launch that may read it has finished (see the module
    doc); destroys ``ev`` afterwards when ``own``. Queued while a capture forbids it."""
    capture_guard.release(_drop_when_idle, acc, ev, untracked, device_id, own)


def _drop_when_idle(acc: Any, ev: Any, untracked: bool, device_id: int, own: bool) -> None:
    try:
        if untracked:  # a launch's end cannot be observed: never drop (rare error path)
            _kept_until_exit.append(acc)
            return
        if ev is None or driver.cuEventQuery(ev)[0] == _SUCCESS:
            return  # idle: acc goes with this frame
        token = _owners.register(acc)
        s = _release_stream(device_id)
        c = _owners.native_graph()
        if c and c.release_after(int(s), int(ev), token) == 0:
            return  # CUDA runs cuforge_release(token) after the last launch
        check(driver.cuEventSynchronize(ev), "cuEventSynchronize")  # fallback: wait here
        _owners.unregister(token)
    finally:
        if own and ev is not None:
            capture_guard.destroy(b"cuEventDestroy", int(ev))


class Graph:
    """An executable graph: ``launch`` it on a stream; update nodes through ``graph[node]``."""

    # _h: the exec's address (0 once closed); _hobj: its CUgraphExec, made on first use.
    __slots__ = (
        "__weakref__", "_acc", "_device_id", "_event", "_h", "_hobj", "_source", "_untracked",
    )  # fmt: skip
    _acc: dict[int, list[tuple[Any, ...]]] | None  # made by the first exec node update
    _device_id: int
    _event: driver.CUevent | None
    _h: int
    _hobj: driver.CUgraphExec | None
    _source: GraphState | None
    _untracked: bool

    def __init__(self) -> None:
        raise TypeError("use GraphDefinition.instantiate() or GraphBuilder.complete()")

    @classmethod
    def _instantiate(cls, state: GraphState, options: GraphCompleteOptions | None) -> Graph:
        flags = options.flags() if options is not None else 0
        started = time.perf_counter() if _log.isEnabledFor(_DEBUG) else 0.0
        c = _owners.native_graph()
        if c:
            h = _instantiate_native(c, state, flags)
        else:
            state.check_open()
            state.flush()
            h = int(check(driver.cuGraphInstantiate(state.handle, flags), "cuGraphInstantiate"))
        self = object.__new__(cls)
        self._h = h
        self._hobj = None
        self._acc = None
        self._event = None
        self._untracked = False  # a launch whose completion event was never recorded
        # Exec node calls name nodes of the graph this was instantiated from: keep it.
        self._source = state
        dev = state._device_id
        self._device_id = dev if dev is not None else state.device_id
        if options is not None:
            upload = getattr(options, "upload_stream", None)
            if upload is not None:
                self.upload(upload)
        if started:
            _log.debug(
                "instantiate graph %#x: exec %#x in %.1f us", int(state.handle), h,
                (time.perf_counter() - started) * 1e6,
            )  # fmt: skip
        return self

    @property
    def handle(self) -> driver.CUgraphExec:
        h = self._hobj
        if h is None:
            if not self._h:
                raise ValueError("the graph is closed")
            h = self._hobj = driver.CUgraphExec(self._h)
        return h

    def launch(self, stream: IsStreamT | driver.CUstream) -> None:
        """Enqueue one run on ``stream`` (ordered after previous launches of this graph).

        ValueError if ``stream`` is a cuforge Stream of another device.
        """
        if type(stream) is Stream:
            dev = stream._device
            if dev is not None and dev._id != self._device_id:
                raise ValueError(
                    f"launch: the stream belongs to device {dev._id} but this graph to "
                    f"device {self._device_id}"
                )
            if stream._handle is None:
                raise ValueError("cannot launch on a closed stream")
            s = stream._handle_int
        else:
            s = int(ops.stream_handle(stream))
        h = self._h
        if not h:
            raise ValueError("the graph is closed")
        # The idle event only matters once exec node updates have put versions in the
        # accumulator: a version is used only by launches made after it was set, and
        # from then on every launch records (see _idle).
        ev = 0
        if self._acc:
            if self._event is None:
                flags = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
                self._event = check(driver.cuEventCreate(flags), "cuEventCreate")
            ev = int(self._event)
        if _LAUNCH > 0 or (not _LAUNCH and _resolve_launch_entries() > 0):
            r = _c_graph_launch(_LAUNCH, _RECORD, h, s, ev)
            launched, recorded = (r, 0) if r >= 0 else (0, -r)
        else:
            launched = int(driver.cuGraphLaunch(self.handle, s)[0])
            recorded = int(driver.cuEventRecord(ev, s)[0]) if ev and not launched else 0
        if launched:
            raise error_for(driver.CUresult(launched), "cuGraphLaunch")
        if _log.isEnabledFor(_DEBUG):
            _log.debug("launch exec %#x on stream %#x", h, s)
        if recorded:
            # This launch's end cannot be observed: never treat the graph as idle again.
            self._untracked = True
            raise error_for(driver.CUresult(recorded), "cuEventRecord")

    def upload(self, stream: IsStreamT | driver.CUstream) -> None:
        """Upload the graph's device resources ahead of the first launch."""
        check(driver.cuGraphUpload(self.handle, ops.stream_handle(stream)), "cuGraphUpload")

    def _idle(self) -> bool:
        """True when no launch that may use an accumulated version can still be running.

        Launches record the event only while the accumulator holds versions; an
        unrecorded launch (made before any version existed) uses none of them.
        """
        if self._untracked:
            return False
        ev = self._event
        return ev is None or driver.cuEventQuery(ev)[0] == _SUCCESS

    def _retain(self, node: GraphNode, owners: tuple[Any, ...]) -> None:
        acc = self._acc
        if acc is None:
            acc = self._acc = {}
        versions = acc.setdefault(node._h, [])
        if versions and self._idle():
            versions.clear()  # nothing in flight can use a superseded version
        versions.append(owners)

    def update(self, definition: GraphDefinition | GraphBuilder) -> None:
        """Take every node's parameters from ``definition`` (same topology required).

        ``definition`` may be a GraphBuilder that finished building. On failure the
        graph is unchanged and CUDAError names the driver's reason.
        """
        from cuforge.graph._builder import _as_definition

        state = _as_definition(definition, "update(definition)")._state
        if self._source is not None:
            self._source.require_same_context(state, "update(definition)")
        state.check_open()
        state.flush()  # CUDA copies the definition's references into the exec
        err, result = driver.cuGraphExecUpdate(self.handle, state.handle)
        if err != _SUCCESS:
            raise error_for(err, f"cuGraphExecUpdate ({_reason(result)})")
        old, self._acc = self._acc, None
        if old:  # every node now runs the definition's parameters
            _drop_after_launches(old, self._event, self._untracked, self._device_id, False)

    def __getitem__(self, node: GraphNode) -> ExecNode:
        if not isinstance(node, GraphNode):
            raise TypeError(f"index a Graph with a node of its definition, not {type(node).__name__}")  # fmt: skip  # noqa: E501
        view = _VIEWS.get(type(node))
        if view is None:
            raise TypeError(f"{type(node).__name__} has no executable-graph view")
        self.handle  # noqa: B018 - raises if closed
        destroyed = node._state.destroyed
        if destroyed and node._h in destroyed:
            # CUDA requires the node to still exist in the graph the exec came from.
            raise ValueError(
                f"{type(node).__name__} {node._h:#x} was destroyed: it is no longer valid"
            )
        return view(self, node)

    def close(self) -> None:
        """Destroy the executable graph; launches in flight finish first (CUDA's rule),
        and so do the owners of its node updates. Idempotent."""
        # Queued while a stream capture forbids it (see capture_guard).
        h = self._h
        if h:
            self._h = 0
            self._hobj = None
            capture_guard.destroy(b"cuGraphExecDestroy", h)
            if _log.isEnabledFor(_DEBUG):
                _log.debug("close exec %#x", h)
        acc, self._acc = self._acc, None
        ev, self._event = self._event, None
        if acc:
            _drop_after_launches(acc, ev, self._untracked, self._device_id, True)
        elif ev is not None:
            capture_guard.destroy(b"cuEventDestroy", int(ev))
        self._source = None

    def __del__(self) -> None:
        if getattr(self, "_h", 0) and not _release.is_shut_down():
            self.close()

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reason(result: Any) -> str:
    try:
        name: str = driver.CUgraphExecUpdateResult(int(result.result)).name
        return name
    except Exception:
        return "see CUresult"


class ExecNode:
    """A node of an executable graph: update its parameters, enable or disable it."""

    __slots__ = ("_graph", "_node")

    def __init__(self, graph: Graph, node: GraphNode) -> None:
        self._graph = graph
        self._node = node

    @property
    def node(self) -> GraphNode:
        return self._node

    @property
    def enabled(self) -> bool:
        self._live_source()
        res = check(driver.cuGraphNodeGetEnabled(self._graph.handle, self._node._handle),
                    "cuGraphNodeGetEnabled")  # fmt: skip
        return bool(res)

    @enabled.setter
    def enabled(self, on: bool) -> None:
        check(driver.cuGraphNodeSetEnabled(self._graph.handle, self._node._handle, int(bool(on))),
              "cuGraphNodeSetEnabled")  # fmt: skip

    is_enabled = enabled

    def enable(self) -> None:
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def _live_source(self) -> GraphState:
        source = self._graph._source
        if source is None or source.closed:
            raise ValueError(
                "node updates need the definition this graph was instantiated from, "
                "and it (or this graph) was closed"
            )
        destroyed = self._node._state.destroyed
        if destroyed and self._node._h in destroyed:
            raise ValueError("the node was destroyed in its definition: it is no longer valid")
        return source

    def _apply(
        self, setter: Callable[..., Any], params: Any, owners: tuple[Any, ...], *extra: Any
    ) -> None:
        self._live_source()
        # The owners are recorded only after the driver accepted the parameters: a
        # refused update leaves the exec and its accumulator exactly as they were.
        check(setter(self._graph.handle, self._node._handle, params, *extra), setter.__name__)
        self._graph._retain(self._node, owners)


class ExecKernelNode(ExecNode):
    __slots__ = ()

    def update(
        self, config: LaunchConfig, kernel: Kernel | driver.CUfunction, *args: object
    ) -> None:
        self._live_source()  # the node must still exist before the driver is asked about it
        p, owners = ops.kernel_params(config, kernel, args)
        if ops.config_launch_attributes(config) != ops.node_launch_attributes(self._node._handle):
            raise ValueError(
                "an executable-graph update cannot change a kernel node's cluster dims or "
                "cooperative flag: update the definition's node and call Graph.update(definition)"
            )
        _read.require_same_programmatic(self._node._handle, config, "executable-graph update")
        if hasattr(kernel, "function"):
            # Executable-graph updates take the function of the current context (the
            # node's own); the CUkernel form is only for adding nodes.
            p.kern = None
            with ContextScope(self._live_source().ctx):
                p.func = kernel.function()
        self._apply(driver.cuGraphExecKernelNodeSetParams, p, owners)


class ExecMemcpyNode(ExecNode):
    __slots__ = ()

    def update(self, dst: DevicePointer, src: DevicePointer, size: int, *,
               dst_owner: object = None, src_owner: object = None) -> None:  # fmt: skip
        p, owners = MemcpyNode._params(dst, src, size, dst_owner, src_owner)
        source = self._live_source()
        try:
            self._apply(driver.cuGraphExecMemcpyNodeSetParams, p, owners, source.ctx)
        except CUDAError as exc:
            raise ops.explain_copy_failure(exc, source.device_id, p) from None


class ExecMemsetNode(ExecNode):
    __slots__ = ()

    def update(self, dst: DevicePointer, value: int | ReadableBuffer, width: int,
               height: int = 1, pitch: int = 0, *, dst_owner: object = None) -> None:  # fmt: skip
        p, owners = MemsetNode._params(dst, value, width, height, pitch, dst_owner)
        self._apply(driver.cuGraphExecMemsetNodeSetParams, p, owners, self._live_source().ctx)


class ExecHostCallbackNode(ExecNode):
    __slots__ = ()

    def update(
        self, fn: Callable[..., object], *, user_data: int | ReadableBuffer | None = None
    ) -> None:
        p, owners = ops.host_callback(fn, user_data)
        self._apply(driver.cuGraphExecHostNodeSetParams, p, owners)


class ExecEventRecordNode(ExecNode):
    __slots__ = ()

    def update(self, event: Event | driver.CUevent) -> None:
        self._apply(driver.cuGraphExecEventRecordNodeSetEvent, ops.event_handle(event), (event,))


class ExecEventWaitNode(ExecNode):
    __slots__ = ()

    def update(self, event: Event | driver.CUevent) -> None:
        self._apply(driver.cuGraphExecEventWaitNodeSetEvent, ops.event_handle(event), (event,))


class ExecChildGraphNode(ExecNode):
    __slots__ = ()

    def update(self, child: GraphDefinition) -> None:
        """Copy ``child``'s parameters in; CUDA swaps in child's owner references."""
        child._state.check_open()
        self._live_source().require_same_context(child._state, "update(child)")
        child._state.flush()
        self._apply(driver.cuGraphExecChildGraphNodeSetParams, child._state.handle, ())


_VIEWS: dict[type, type[ExecNode]] = {
    KernelNode: ExecKernelNode,
    MemcpyNode: ExecMemcpyNode,
    MemsetNode: ExecMemsetNode,
    HostCallbackNode: ExecHostCallbackNode,
    EventRecordNode: ExecEventRecordNode,
    EventWaitNode: ExecEventWaitNode,
    ChildGraphNode: ExecChildGraphNode,
}

__all__ = ["CUDAError", "ExecNode", "Graph"]
