"""``Graph``: an executable CUDA graph, with per-node updates that keep owners alive.

Ownership of an executable graph:
- at instantiation CUDA copies every user-object reference of the source graph, so
  the definition's bundles outlive the definition for as long as the exec exists
  (and until its in-flight launches finish);
- node updates on the exec (``graph[node].update(...)``) put their new owners into
  the exec's *accumulator*: a registry entry owned by a user object that was
  retained on the source graph just before ``cuGraphInstantiate`` and released from
  it right after, so the exec holds the only reference;
- a superseded accumulator entry is dropped only when the exec has no launch in
  flight (an event recorded after each launch says so; launches of one exec are
  ordered), otherwise it stays until the exec is destroyed;
- ``update(definition)`` replaces every reference with the new definition's plus a
  fresh accumulator; CUDA keeps the old ones until in-flight launches finish.
A failed update changes nothing: the new owners are only recorded on success.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cuda.bindings import driver

from cuforge._native._launch import graph_launch as _c_graph_launch
from cuforge.graph import _operands as ops
from cuforge.graph import _owners
from cuforge.graph._nodes import (
    ChildGraphNode,
    EventRecordNode,
    EventWaitNode,
    GraphNode,
    HostCallbackNode,
    KernelNode,
    MemcpyNode,
    MemsetNode,
)
from cuforge.graph._state import GraphState
from cuforge.runtime.device import _ContextScope
from cuforge.runtime.errors import CUDAError, check, error_for
from cuforge.runtime.launch import driver_entry
from cuforge.runtime.stream import Stream

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_MOVE = driver.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE
# DEBUG records of instantiate, launch and close; each site checks the level first,
# so with DEBUG off a launch pays one isEnabledFor call.
_log = logging.getLogger("cuforge.graph")
_DEBUG = logging.DEBUG


_launch_entries: tuple[int, int] | None = None  # (cuGraphLaunch, cuEventRecord); () if absent


def _resolve_launch_entries() -> tuple[int, int] | tuple[()]:
    global _launch_entries
    found = (driver_entry(b"cuGraphLaunch"), driver_entry(b"cuEventRecord"))
    _launch_entries = found if all(found) else ()
    return _launch_entries


def _with_accumulator(state: GraphState, action: Any) -> tuple[Any, int, dict]:
    """Run ``action()`` (instantiate/update) with a new accumulator on the source graph.

    Returns (action's result, accumulator id, accumulator). The source graph's
    reference is dropped afterwards, whatever happened, so only the exec holds it.
    """
    state.check_open()
    state.flush()
    acc: dict[int, list[tuple[Any, ...]]] = {}
    token, uobj = _owners.create_user_object(acc)
    err = driver.cuGraphRetainUserObject(state.handle, uobj, 1, _MOVE)[0]
    if err != _SUCCESS:
        driver.cuUserObjectRelease(uobj, 1)
        raise error_for(err, "cuGraphRetainUserObject")
    try:
        result = action()
    finally:
        driver.cuGraphReleaseUserObject(state.handle, uobj, 1)
    return result, token, acc


class Graph:
    """An executable graph: ``launch`` it on a stream; update nodes through ``graph[node]``."""

    __slots__ = (
        "__weakref__", "_acc", "_acc_token", "_device_id", "_event", "_handle", "_source",
        "_untracked",
    )  # fmt: skip

    def __init__(self) -> None:
        raise TypeError("use GraphDefinition.instantiate() or GraphBuilder.complete()")

    @classmethod
    def _instantiate(cls, state: GraphState, options: Any) -> Graph:
        flags = options.flags() if options is not None else 0
        started = time.perf_counter() if _log.isEnabledFor(_DEBUG) else 0.0

        def go() -> driver.CUgraphExec:
            return check(driver.cuGraphInstantiate(state.handle, flags), "cuGraphInstantiate")

        handle, token, acc = _with_accumulator(state, go)
        self = object.__new__(cls)
        self._handle = handle
        self._acc, self._acc_token = acc, token
        self._event = None
        self._untracked = False  # a launch whose completion event was never recorded
        # Exec node calls name nodes of the graph this was instantiated from: keep it.
        self._source = state
        self._device_id = state.device_id
        upload = getattr(options, "upload_stream", None)
        if upload is not None:
            self.upload(upload)
        if started:
            _log.debug(
                "instantiate graph %#x: exec %#x in %.1f us", int(state.handle), int(handle),
                (time.perf_counter() - started) * 1e6,
            )  # fmt: skip
        return self

    @property
    def handle(self) -> driver.CUgraphExec:
        if self._handle is None:
            raise ValueError("the graph is closed")
        return self._handle

    def launch(self, stream: Any) -> None:
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
        handle = self.handle
        # The idle event only matters once exec node updates have put versions in the
        # accumulator: a version is used only by launches made after it was set, and
        # from then on every launch records (see _idle).
        ev = self._event
        if self._acc:
            if ev is None:
                flags = driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
                ev = self._event = check(driver.cuEventCreate(flags), "cuEventCreate")
        else:
            ev = 0
        entries = _launch_entries if _launch_entries is not None else _resolve_launch_entries()
        if entries:
            launched, recorded = _c_graph_launch(*entries, int(handle), s, int(ev))
        else:
            launched = int(driver.cuGraphLaunch(handle, s)[0])
            recorded = int(driver.cuEventRecord(ev, s)[0]) if ev and not launched else 0
        if launched:
            raise error_for(driver.CUresult(launched), "cuGraphLaunch")
        if recorded:
            # This launch's end cannot be observed: never treat the graph as idle again.
            self._untracked = True
            raise error_for(driver.CUresult(recorded), "cuEventRecord")
        if _log.isEnabledFor(_DEBUG):
            _log.debug("launch exec %#x on stream %#x", int(handle), s)

    def upload(self, stream: Any) -> None:
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
        versions = self._acc.setdefault(int(node._handle), [])
        if versions and self._idle():
            versions.clear()  # nothing in flight can use a superseded version
        versions.append(owners)

    def update(self, definition: Any) -> None:
        """Take every node's parameters from ``definition`` (same topology required).

        On failure the graph is unchanged and CUDAError names the driver's reason.
        """
        state = definition._state
        if self._source is not None:
            self._source.require_same_context(state, "update(definition)")
        info: list[Any] = []

        def go() -> None:
            err, result = driver.cuGraphExecUpdate(self.handle, state.handle)
            if err != _SUCCESS:
                info.append(result)
                raise error_for(err, f"cuGraphExecUpdate ({_reason(result)})")

        _, token, acc = _with_accumulator(state, go)
        self._acc, self._acc_token = acc, token

    def __getitem__(self, node: GraphNode) -> ExecNode:
        if not isinstance(node, GraphNode):
            raise TypeError(f"index a Graph with a node of its definition, not {type(node).__name__}")  # fmt: skip  # noqa: E501
        view = _VIEWS.get(type(node))
        if view is None:
            raise TypeError(f"{type(node).__name__} has no executable-graph view")
        self.handle  # noqa: B018 - raises if closed
        return view(self, node)

    def close(self) -> None:
        """Destroy the executable graph; launches in flight finish first (CUDA's rule)."""
        if self._handle is not None:
            h, self._handle = self._handle, None
            driver.cuGraphExecDestroy(h)
            if _log.isEnabledFor(_DEBUG):
                _log.debug("close exec %#x", int(h))
        if self._event is not None:
            ev, self._event = self._event, None
            driver.cuEventDestroy(ev)
        self._acc = {}
        self._source = None

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None and not _owners._native.is_shut_down():
            self.close()

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reason(result: Any) -> str:
    try:
        return driver.CUgraphExecUpdateResult(int(result.result)).name
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
        return source

    def _apply(self, setter: Any, params: Any, owners: tuple[Any, ...], *extra: Any) -> None:
        self._live_source()
        # The owners are recorded only after the driver accepted the parameters: a
        # refused update leaves the exec and its accumulator exactly as they were.
        check(setter(self._graph.handle, self._node._handle, params, *extra), setter.__name__)
        self._graph._retain(self._node, owners)


class ExecKernelNode(ExecNode):
    __slots__ = ()

    def update(self, config: Any, kernel: Any, *args: Any) -> None:
        self._live_source()  # the node must still exist before the driver is asked about it
        p, owners = ops.kernel_params(config, kernel, args)
        if ops.config_launch_attributes(config) != ops.node_launch_attributes(self._node._handle):
            raise ValueError(
                "an executable-graph update cannot change a kernel node's cluster dims or "
                "cooperative flag: update the definition's node and call Graph.update(definition)"
            )
        if hasattr(kernel, "function"):
            # Executable-graph updates take the function of the current context (the
            # node's own); the CUkernel form is only for adding nodes.
            p.kern = None
            with _ContextScope(self._live_source().ctx):
                p.func = kernel.function()
        self._apply(driver.cuGraphExecKernelNodeSetParams, p, owners)


class ExecMemcpyNode(ExecNode):
    __slots__ = ()

    def update(self, dst: Any, src: Any, size: int, *, dst_owner: Any = None,
               src_owner: Any = None) -> None:  # fmt: skip
        p, owners = MemcpyNode._params(dst, src, size, dst_owner, src_owner)
        self._apply(driver.cuGraphExecMemcpyNodeSetParams, p, owners, self._live_source().ctx)


class ExecMemsetNode(ExecNode):
    __slots__ = ()

    def update(self, dst: Any, value: Any, width: int, height: int = 1, pitch: int = 0, *,
               dst_owner: Any = None) -> None:  # fmt: skip
        p, owners = MemsetNode._params(dst, value, width, height, pitch, dst_owner)
        self._apply(driver.cuGraphExecMemsetNodeSetParams, p, owners, self._live_source().ctx)


class ExecHostCallbackNode(ExecNode):
    __slots__ = ()

    def update(self, fn: Any, *, user_data: Any = None) -> None:
        p, owners = ops.host_callback(fn, user_data)
        self._apply(driver.cuGraphExecHostNodeSetParams, p, owners)


class ExecEventRecordNode(ExecNode):
    __slots__ = ()

    def update(self, event: Any) -> None:
        self._apply(driver.cuGraphExecEventRecordNodeSetEvent, ops.event_handle(event), (event,))


class ExecEventWaitNode(ExecNode):
    __slots__ = ()

    def update(self, event: Any) -> None:
        self._apply(driver.cuGraphExecEventWaitNodeSetEvent, ops.event_handle(event), (event,))


class ExecChildGraphNode(ExecNode):
    __slots__ = ()

    def update(self, child: Any) -> None:
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
