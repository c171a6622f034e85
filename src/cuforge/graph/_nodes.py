"""Graph nodes and the node-adding methods shared by GraphDefinition and GraphNode.

On a :class:`GraphDefinition` a method adds a node with no dependencies; on a
:class:`GraphNode` the new node depends on that node. Every add or update packs
what the node references into a new immutable owner bundle on the graph (see
``_state``), so a later update or node deletion never frees what a clone, an
executable graph or an in-flight launch still uses. The node kinds that hold
graphs (conditional and child-graph nodes) live in ``_nested``.

Failure modes: bad operands raise TypeError/ValueError before anything reaches
the driver; driver refusals raise CUDAError with the driver's reason, and then no
node is added and nothing is retained.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, TypeVar

from cuforge._cuda import driver
from cuforge.graph import _operands as ops
from cuforge.graph import _params as _read
from cuforge.graph._kernel_add import add_kernel_node, commit
from cuforge.graph._state import GraphState, NodeGraphs
from cuforge.runtime.errors import CUDAError, check
from cuforge.runtime.launch import LaunchConfig
from cuforge.runtime.memory import Buffer
from cuforge.runtime.module import Kernel

if TYPE_CHECKING:
    from collections.abc import Callable

    from cuforge._typing import DevicePointer, ReadableBuffer, Self
    from cuforge.graph._builder import GraphBuilder
    from cuforge.graph._definition import Condition, GraphDefinition
    from cuforge.graph._nested import ChildGraphNode, ConditionalNode
    from cuforge.runtime.device import Device
    from cuforge.runtime.event import Event

_N = TypeVar("_N", bound="GraphNode")

_T = driver.CUgraphNodeType
_COND = driver.CUgraphConditionalNodeType


def _same_device(state: GraphState, obj: Any, what: str) -> None:
    """ValueError if ``obj`` (a Buffer or Event) lives on another device than the graph."""
    if isinstance(obj, Buffer):
        dev = None if obj.is_closed else obj.device_id
    else:
        dev = getattr(getattr(obj, "_device", None), "device_id", None)
    if dev is not None and dev != state.device_id:
        raise ValueError(
            f"{what}: it belongs to device {dev} but this graph to device {state.device_id}; "
            "a cuforge graph runs on one device"
        )


def _kernel_node(state: GraphState, h: int) -> KernelNode:
    out = object.__new__(KernelNode)
    out._state = state
    out._h = h
    return out


class _Adder:
    """Node-adding methods; subclasses say which graph and which dependencies."""

    __slots__ = ()

    def _target(self) -> tuple[GraphState, list[int]]:
        """The graph to add to and the addresses of the new node's dependencies."""
        raise NotImplementedError

    def _add(
        self, cls: type[_N], fn: Any, *args: Any, owners: tuple[Any, ...] = (),
        in_context: bool = False, meta: Any = None,
    ) -> _N:  # fmt: skip
        state, deps = self._target()
        if in_context:
            args = (*args, state.ctx)
        dep_objs = [driver.CUgraphNode(d) for d in deps]
        node = check(fn(state.handle, dep_objs, len(dep_objs), *args), fn.__name__)
        commit(state, node, owners)
        out = cls._wrap(state, node)
        if meta is not None:
            state.meta[out._h] = meta
        return out

    def launch(
        self, config: LaunchConfig, kernel: Kernel | driver.CUfunction, *args: object
    ) -> KernelNode:
        """Add a kernel node; retains the kernel, ``args`` and their allocations.

        Cluster and cooperative configs become the node's launch attributes; a
        ``programmatic_stream_serialization`` config makes the edges from kernel
        predecessors programmatic (docs/graphs.md).
        """
        state, deps = self._target()
        h = add_kernel_node(state, deps[0] if deps else 0, config, kernel, args)
        return _kernel_node(state, h)

    def memcpy(
        self, dst: DevicePointer, src: DevicePointer, size: int, *, dst_owner: object = None,
        src_owner: object = None,
    ) -> MemcpyNode:  # fmt: skip
        """Add a 1-D copy of ``size`` bytes; Buffer operands are retained, ints are not."""
        p, owners = MemcpyNode._params(dst, src, size, dst_owner, src_owner)
        try:
            return self._add(MemcpyNode, driver.cuGraphAddMemcpyNode, p, owners=owners,
                             in_context=True)  # fmt: skip
        except CUDAError as exc:
            raise ops.explain_copy_failure(exc, self._target()[0].device_id, p) from None

    def memset(
        self, dst: DevicePointer, value: int | ReadableBuffer, width: int, height: int = 1,
        pitch: int = 0, *, dst_owner: object = None,
    ) -> MemsetNode:  # fmt: skip
        """Add a memset of ``width`` x ``height`` elements (element size from ``value``)."""
        p, owners = MemsetNode._params(dst, value, width, height, pitch, dst_owner)
        _same_device(self._target()[0], dst, "memset dst")
        return self._add(MemsetNode, driver.cuGraphAddMemsetNode, p, owners=owners,
                         in_context=True)  # fmt: skip

    def callback(
        self, fn: Callable[..., object], *, user_data: int | ReadableBuffer | None = None
    ) -> HostCallbackNode:
        """Add a host node running ``fn``; retains fn and a private copy of user_data."""
        p, owners = ops.host_callback(fn, user_data)
        return self._add(HostCallbackNode, driver.cuGraphAddHostNode, p, owners=owners, meta=fn)

    def record(self, event: Event | driver.CUevent) -> EventRecordNode:
        """Add an event-record node; retains the event."""
        _same_device(self._target()[0], event, "record(event)")
        return self._add(EventRecordNode, driver.cuGraphAddEventRecordNode,
                         ops.event_handle(event), owners=(event,), meta=event)  # fmt: skip

    def wait(self, event: Event | driver.CUevent) -> EventWaitNode:
        """Add an event-wait node; retains the event."""
        return self._add(EventWaitNode, driver.cuGraphAddEventWaitNode,
                         ops.event_handle(event), owners=(event,), meta=event)  # fmt: skip

    def embed(self, child: GraphDefinition | GraphBuilder) -> ChildGraphNode:
        """Add a child-graph node: CUDA copies ``child`` (a definition, or a builder
        that finished building) together with its owners."""
        from cuforge.graph._builder import _as_definition
        from cuforge.graph._nested import ChildGraphNode

        state = _as_definition(child, "embed(child)")._state
        state.check_open()
        self._target()[0].require_same_context(state, "embed(child)")
        state.flush()
        return self._add(ChildGraphNode, driver.cuGraphAddChildGraphNode, state.handle)

    def empty(self) -> EmptyNode:
        """Add an empty node (a pure dependency point)."""
        return self._add(EmptyNode, driver.cuGraphAddEmptyNode)

    def allocate(self, size: int, device: Device | int | None = None) -> AllocNode:
        """Add a graph memory allocation of ``size`` bytes; its address is ``node.dptr``.

        Memory that no ``deallocate`` node of the graph frees outlives the launch and is
        the caller's to free (``cuMemFreeAsync``/``cuMemFree``, or a free node in another
        graph); CUDA refuses to launch the graph again while it is allocated.

        TypeError unless ``size`` is an int, ValueError unless it is positive (CUDA
        refuses empty allocations too)."""
        try:
            if isinstance(size, bool):
                raise TypeError
            size = operator.index(size)
        except TypeError:
            raise TypeError(f"allocate(size): expected an int, got {type(size).__name__}") from None
        if size <= 0:
            raise ValueError(f"allocate(size): the size must be positive, got {size}")
        state, deps = self._target()
        dev_id: Any = getattr(device, "device_id", device)  # a Device (or alike) or an ordinal
        if dev_id is None:
            dev_id = state.device_id
        p = driver.CUDA_MEM_ALLOC_NODE_PARAMS()
        p.poolProps.allocType = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        p.poolProps.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        p.poolProps.location.id = int(dev_id)
        p.bytesize = int(size)
        dep_objs = [driver.CUgraphNode(d) for d in deps]
        node = check(driver.cuGraphAddMemAllocNode(state.handle, dep_objs, len(dep_objs), p),
                     "cuGraphAddMemAllocNode")  # fmt: skip
        return AllocNode._wrap(state, node)

    def deallocate(self, ptr: AllocNode | int) -> FreeNode:
        """Add a node freeing graph-allocated memory (an AllocNode or its address)."""
        address = ptr.dptr if isinstance(ptr, AllocNode) else int(ptr)
        return self._add(FreeNode, driver.cuGraphAddMemFreeNode, driver.CUdeviceptr(address))

    def _conditional(self, cond: Condition, kind: Any, size: int, name: str) -> ConditionalNode:
        from cuforge.graph._definition import Condition, GraphDefinition
        from cuforge.graph._nested import ConditionalNode

        if not isinstance(cond, Condition):
            raise TypeError(f"expected a Condition, got {type(cond).__name__}")
        state, deps = self._target()
        p = driver.CUgraphNodeParams()
        p.type = _T.CU_GRAPH_NODE_TYPE_CONDITIONAL
        p.conditional.handle = cond.handle
        p.conditional.type = kind
        p.conditional.size = size
        p.conditional.ctx = state.ctx
        dep_objs = [driver.CUgraphNode(d) for d in deps]
        node = check(driver.cuGraphAddNode(state.handle, dep_objs, None, len(dep_objs), p),
                     "cuGraphAddNode(conditional)")  # fmt: skip
        bodies = tuple(int(g) for g in list(p.conditional.phGraph_out)[:size])
        entry = NodeGraphs(name, bodies, cond)
        out = ConditionalNode._wrap(state, node)
        state.add_inner(out._h, entry)
        out._branches = tuple(GraphDefinition._wrap(entry.graph(state, i)) for i in range(size))
        out._condition = cond
        return out

    def if_then(self, condition: Condition) -> ConditionalNode:
        """Add an IF node; fill ``node.body`` (runs when the condition is non-zero)."""
        return self._conditional(condition, _COND.CU_GRAPH_COND_TYPE_IF, 1, "if")

    def if_else(self, condition: Condition) -> ConditionalNode:
        """Add an IF/ELSE node; ``node.branches`` is (then, else)."""
        return self._conditional(condition, _COND.CU_GRAPH_COND_TYPE_IF, 2, "if_else")

    def while_loop(self, condition: Condition) -> ConditionalNode:
        """Add a WHILE node; ``node.body`` repeats while the condition is non-zero."""
        return self._conditional(condition, _COND.CU_GRAPH_COND_TYPE_WHILE, 1, "while")

    def switch(self, condition: Condition, count: int) -> ConditionalNode:
        """Add a SWITCH node with ``count`` branches selected by the condition's value."""
        return self._conditional(condition, _COND.CU_GRAPH_COND_TYPE_SWITCH, int(count), "switch")


class GraphNode(_Adder):
    """A node of a graph definition; adding from it makes the new node depend on it."""

    # _h: the node's address; _hobj: its CUgraphNode, made on first use (the hot
    # kernel-node path never needs one).
    __slots__ = ("_h", "_hobj", "_state")
    _h: int
    _hobj: driver.CUgraphNode
    _state: GraphState
    _KIND = "node"

    def __init__(self) -> None:
        raise TypeError("graph nodes are created by GraphDefinition/GraphNode methods")

    @classmethod
    def _wrap(cls, state: GraphState, handle: driver.CUgraphNode) -> Self:
        self = object.__new__(cls)
        self._state = state
        self._h = h = int(handle)
        self._hobj = handle
        if state.destroyed:  # the driver reuses node addresses: this one lives again
            state.destroyed.discard(h)
        return self

    def _target(self) -> tuple[GraphState, list[int]]:
        state = self._state
        if state.closed or state.parent is not None or state.destroyed:
            self._check_live()
        return state, [self._h]

    def launch(
        self, config: LaunchConfig, kernel: Kernel | driver.CUfunction, *args: object
    ) -> KernelNode:
        """Add a kernel node depending on this one (see GraphDefinition.launch)."""
        state = self._state
        if state.closed or state.parent is not None or state.destroyed:
            self._check_live()
        return _kernel_node(state, add_kernel_node(state, self._h, config, kernel, args))

    @property
    def _handle(self) -> driver.CUgraphNode:
        try:
            return self._hobj
        except AttributeError:  # not made yet (kernel nodes from the C path)
            h = self._hobj = driver.CUgraphNode(self._h)
            return h

    @property
    def handle(self) -> driver.CUgraphNode:
        return self._handle

    @property
    def graph(self) -> GraphDefinition:
        from cuforge.graph._definition import GraphDefinition

        return GraphDefinition._wrap(self._state)

    @property
    def pred(self) -> tuple[GraphNode, ...]:
        """The nodes this node depends on."""
        self._check_live()
        from cuforge.graph._listing import query_nodes, wrap_node

        found = query_nodes(driver.cuGraphNodeGetDependencies, self._handle)
        return tuple(wrap_node(self._state, n) for n in found)

    @property
    def succ(self) -> tuple[GraphNode, ...]:
        """The nodes that depend on this node."""
        self._check_live()
        from cuforge.graph._listing import query_nodes, wrap_node

        found = query_nodes(driver.cuGraphNodeGetDependentNodes, self._handle)
        return tuple(wrap_node(self._state, n) for n in found)

    def join(self, *nodes: GraphNode) -> EmptyNode:
        """An empty node depending on this node and ``nodes``."""
        from cuforge.graph._definition import GraphDefinition

        return GraphDefinition._wrap(self._state).join(self, *nodes)

    def destroy(self) -> None:
        """Remove this node; owners stay with the graph version that had them.

        Idempotent; afterwards the node (any object naming it) refuses further use,
        executable-graph updates included, with ValueError -- until the driver
        reuses its address for a new node of the graph (CUDA's handles are addresses).
        Graphs that lived inside the node (conditional bodies, a child graph view)
        are closed with it. If the driver refuses (CUDA keeps the nodes of graphs with
        memory nodes), CUDAError is raised and the node stays as it was."""
        state = self._state
        state.check_open()
        if state.destroyed and self._h in state.destroyed:
            return
        check(driver.cuGraphDestroyNode(self._handle), "cuGraphDestroyNode")
        if state.destroyed is None:
            state.destroyed = set()
        state.destroyed.add(self._h)
        state.forget_node(self._h)

    def _check_live(self) -> None:
        """ValueError if this node's graph is closed or the node was destroyed."""
        state = self._state
        state.check_open()
        if state.destroyed and self._h in state.destroyed:
            raise ValueError(f"{type(self).__name__} {self._h:#x} was destroyed")

    @property
    def is_valid(self) -> bool:
        """False once the node was destroyed or its graph closed (a body or child
        graph view is closed with the node it lived in)."""
        state = self._state
        if not state.is_open:
            return False
        return not (state.destroyed and self._h in state.destroyed)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GraphNode) and other._h == self._h

    def __hash__(self) -> int:
        return hash(self._h)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._h:#x}>"

    # Definition-level update: subclasses give _params and _set.
    def _update(self, params: Any, owners: tuple[Any, ...]) -> None:
        self._check_live()
        self._set(params)
        self._state.add_bundle(owners)

    def _set(self, params: Any) -> None:
        raise TypeError(f"{type(self).__name__} cannot be updated")


class KernelNode(GraphNode):
    __slots__ = ()

    def update(
        self, config: LaunchConfig, kernel: Kernel | driver.CUfunction, *args: object
    ) -> None:
        """New launch parameters for this node (old owners stay with older versions).

        Cluster dims and the cooperative flag follow ``config``; its programmatic
        flag must match the node's edges (ValueError otherwise: edges stay).
        """
        self._check_live()
        p, owners = ops.kernel_params(config, kernel, args)
        if int(p.kern):
            p.ctx = self._state.ctx
        _read.require_same_programmatic(self._handle, config, "KernelNode.update")
        current = ops.node_launch_attributes(self._handle)
        check(driver.cuGraphKernelNodeSetParams(self._handle, p), "cuGraphKernelNodeSetParams")
        ops.set_kernel_node_attributes(self._handle, config, current)
        self._state.add_bundle(owners)
        self._state.meta[self._h] = kernel

    @property
    def launch_attributes(self) -> tuple[tuple[int, int, int], bool]:
        """(cluster dims, cooperative) as the driver holds them; (0, 0, 0) = no cluster."""
        self._check_live()
        return ops.node_launch_attributes(self._handle)

    @property
    def config(self) -> LaunchConfig:
        """The LaunchConfig the node runs with, read from the driver (its programmatic
        flag: whether kernel predecessors are programmatic dependencies)."""
        self._check_live()
        return _read.kernel_config(self._handle)

    grid = _read.field(_read.launch_fields, 0, "config.grid")
    block = _read.field(_read.launch_fields, 1, "config.block")
    shmem_size = _read.field(_read.launch_fields, 2, "config.shmem_size")

    @property
    def kernel(self) -> Kernel | None:
        """The Kernel cuforge gave this node (None for nodes of clones and captures)."""
        self._check_live()
        k = self._state.meta.get(self._h)
        return k if isinstance(k, Kernel) else None


class MemcpyNode(GraphNode):
    __slots__ = ()

    @staticmethod
    def _params(
        dst: DevicePointer, src: DevicePointer, size: int, dst_owner: object, src_owner: object
    ) -> tuple[driver.CUDA_MEMCPY3D, tuple[Any, ...]]:
        size = int(size)
        d, downers = ops.resolve_pointer(dst, dst_owner, "memcpy dst", size)
        s, sowners = ops.resolve_pointer(src, src_owner, "memcpy src", size)
        return ops.memcpy_params(d, s, size), downers + sowners

    def update(self, dst: DevicePointer, src: DevicePointer, size: int, *,
               dst_owner: object = None, src_owner: object = None) -> None:  # fmt: skip
        self._update(*self._params(dst, src, size, dst_owner, src_owner))

    def _set(self, p: Any) -> None:
        try:
            check(driver.cuGraphMemcpyNodeSetParams(self._handle, p), "cuGraphMemcpyNodeSetParams")
        except CUDAError as exc:
            raise ops.explain_copy_failure(exc, self._state.device_id, p) from None

    dst = _read.field(_read.memcpy_fields, 0, "The destination address.")
    src = _read.field(_read.memcpy_fields, 1, "The source address.")
    size = _read.field(_read.memcpy_fields, 2, "Bytes copied.")


class MemsetNode(GraphNode):
    __slots__ = ()

    @staticmethod
    def _params(
        dst: DevicePointer, value: int | ReadableBuffer, width: int, height: int, pitch: int,
        dst_owner: object,
    ) -> tuple[driver.CUDA_MEMSET_NODE_PARAMS, tuple[Any, ...]]:  # fmt: skip
        width, height, pitch = int(width), int(height), int(pitch)
        elem = ops.memset_value(value)[1]
        extent = (pitch or width * elem) * (height - 1) + width * elem
        d, owners = ops.resolve_pointer(dst, dst_owner, "memset dst", extent)
        return ops.memset_params(d, value, width, height, pitch), owners

    def update(self, dst: DevicePointer, value: int | ReadableBuffer, width: int,
               height: int = 1, pitch: int = 0, *, dst_owner: object = None) -> None:  # fmt: skip
        self._update(*self._params(dst, value, width, height, pitch, dst_owner))

    def _set(self, p: Any) -> None:
        check(driver.cuGraphMemsetNodeSetParams(self._handle, p), "cuGraphMemsetNodeSetParams")

    _f = _read.memset_fields
    dptr = _read.field(_f, 0, "The destination address.")
    value = _read.field(_f, 1, "The element value (element_size bytes, little-endian).")
    element_size = _read.field(_f, 2, "Bytes per element (1, 2 or 4).")
    width = _read.field(_f, 3, "Elements per row.")
    height = _read.field(_f, 4, "Rows.")
    pitch = _read.field(_f, 5, "Bytes between rows (width * element_size if none was given).")
    del _f


class HostCallbackNode(GraphNode):
    __slots__ = ()

    def update(
        self, fn: Callable[..., object], *, user_data: int | ReadableBuffer | None = None
    ) -> None:
        self._update(*ops.host_callback(fn, user_data))

    def _set(self, p: Any) -> None:
        check(driver.cuGraphHostNodeSetParams(self._handle, p), "cuGraphHostNodeSetParams")

    def _update(self, params: Any, owners: tuple[Any, ...]) -> None:
        super()._update(params, owners)
        self._state.meta[self._h] = owners[0]  # the callable (see ops.host_callback)

    @property
    def fn(self) -> Any:
        """The callable or ctypes function cuforge gave this node (None for nodes of
        clones and captures). (``callback`` adds a host node after this one.)"""
        self._check_live()
        return self._state.meta.get(self._h)


class _EventNode(GraphNode):
    __slots__ = ()

    def update(self, event: Event | driver.CUevent) -> None:
        self._update(ops.event_handle(event), (event,))
        self._state.meta[self._h] = event

    @property
    def event(self) -> Any:
        """The Event cuforge gave this node (None for nodes of clones and captures)."""
        self._check_live()
        return self._state.meta.get(self._h)


class EventRecordNode(_EventNode):
    __slots__ = ()

    def _set(self, ev: Any) -> None:
        check(driver.cuGraphEventRecordNodeSetEvent(self._handle, ev), "cuGraphEventRecordNodeSetEvent")  # fmt: skip  # noqa: E501


class EventWaitNode(_EventNode):
    __slots__ = ()

    def _set(self, ev: Any) -> None:
        check(driver.cuGraphEventWaitNodeSetEvent(self._handle, ev), "cuGraphEventWaitNodeSetEvent")  # fmt: skip  # noqa: E501


class EmptyNode(GraphNode):
    __slots__ = ()


class AllocNode(GraphNode):
    __slots__ = ()

    _f = _read.alloc_fields
    dptr = _read.field(_f, 0, "The device address allocated (valid while the graph runs).")
    bytesize = _read.field(_f, 1, "Bytes allocated.")
    device_id = _read.field(_f, 2, "The device the memory is allocated on.")
    del _f


class FreeNode(GraphNode):
    __slots__ = ()

    dptr = _read.field(_read.free_fields, 0, "The address this node frees.")
