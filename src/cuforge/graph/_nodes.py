"""Graph nodes and the node-adding methods shared by GraphDefinition and GraphNode.

On a :class:`GraphDefinition` a method adds a node with no dependencies; on a
:class:`GraphNode` the new node depends on that node. Every add or update packs
what the node references into a new immutable owner bundle on the graph (see
``_state``), so a later update or node deletion never frees what a clone, an
executable graph or an in-flight launch still uses.

Failure modes: bad operands raise TypeError/ValueError before anything reaches
the driver; driver refusals raise CUDAError with the driver's reason, and then no
node is added and nothing is retained.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

from cuforge._cuda import driver
from cuforge._native._launch import add_kernel_node as _c_add
from cuforge._native._launch import add_kernel_node_args as _c_add_args
from cuforge.graph import _operands as ops
from cuforge.graph._state import GraphState
from cuforge.runtime.args import plan_for
from cuforge.runtime.errors import CUDAError, check, error_for
from cuforge.runtime.launch import LaunchConfig, _validate_plan, driver_entry
from cuforge.runtime.memory import Buffer
from cuforge.runtime.module import Kernel

if TYPE_CHECKING:
    from cuforge.graph._definition import Condition, GraphDefinition

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_T = driver.CUgraphNodeType
_COND = driver.CUgraphConditionalNodeType
_CLONE = driver.CUgraphChildGraphNodeOwnership.CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE


def _commit(state: GraphState, node: driver.CUgraphNode, owners: tuple[Any, ...]) -> None:
    try:
        state.add_bundle(owners)
    except BaseException:
        driver.cuGraphDestroyNode(node)
        raise


_add_entry: int | None = None  # cuGraphAddKernelNode's address; 0 when unavailable


def _resolve_add_entry() -> int:
    global _add_entry
    _add_entry = driver_entry(b"cuGraphAddKernelNode")
    return _add_entry


def _add_kernel_node(
    state: GraphState, dep: int, config: Any, kernel: Any, args: tuple[Any, ...]
) -> KernelNode:
    """Add a kernel node after node address ``dep`` (0: none) and record its owners.

    The common case (a plain LaunchConfig and a cuforge Kernel) packs the arguments
    and adds the node in one C call (arrays and other values C cannot pack are
    packed into the graph's scratch memory first); everything else goes through
    cuda.bindings. Like every CUgraph, a definition must not be modified from two
    threads at once (the scratch memory relies on that too).
    """
    if type(config) is not LaunchConfig or type(kernel) is not Kernel:
        return _add_kernel_node_generic(state, [dep] if dep else [], config, kernel, args)
    plain = config._plain
    entry = _add_entry if _add_entry is not None else _resolve_add_entry()
    if plain is None or not entry:
        return _add_kernel_node_generic(state, [dep] if dep else [], config, kernel, args)
    res: Any = -1
    last = kernel._last
    if last is not None:  # the types last validated for this kernel (C checks them)
        res = _c_add_args(entry, state.handle_int, dep, kernel._function_int, state.ctx_int,
                          plain, last[0], last[1], args)  # fmt: skip
    if type(res) is tuple:
        pass  # added
    elif args:
        plan = plan_for(args)
        if plan not in kernel._checked:
            _validate_plan(kernel, plan, len(args))
        codes = plan.ccodes
        if codes is not None:  # -1: a value C leaves to Python (closed Buffer, range)
            kernel._last = (codes, plan.types)
            res = _c_add_args(entry, state.handle_int, dep, kernel._function_int,
                              state.ctx_int, plain, codes, None, args)  # fmt: skip
        if type(res) is not tuple:
            if plan.nbytes > state.scratch_size:
                state.grow_scratch(plan.nbytes)
            try:
                held = plan.fill(args, state.scratch, state.scratch_addr)
            except struct.error:  # unsigned 64-bit values and overflow: pack_args sorts them
                return _add_kernel_node_generic(state, [dep] if dep else [], config, kernel, args)
            params = state.scratch_addr
    else:
        if None not in kernel._checked:
            _validate_plan(kernel, None, 0)
        kernel._last = (b"", ())
        held, params = (), 0
    if type(res) is tuple:
        err, node, held = res
    else:
        err, node = _c_add(entry, state.handle_int, dep, kernel._function_int, state.ctx_int,
                           plain, params)  # fmt: skip
    if err:
        raise error_for(driver.CUresult(err), "cuGraphAddKernelNode")
    # held: the allocations of Buffer arguments and the arrays passed by pointer
    # (a Buffer's close() must not free them); args: everything else passed.
    owners = (kernel, args, held)
    lst = state.pending
    if lst is not None:
        lst.append(owners)
    else:  # a body graph, or no open bundle list yet
        _commit(state, driver.CUgraphNode(node), owners)
    out = object.__new__(KernelNode)
    out._state = state
    out._h = node
    if state.destroyed:  # the driver reuses node addresses: this one lives again
        state.destroyed.discard(node)
    return out


def _add_kernel_node_generic(
    state: GraphState, deps: list[int], config: Any, kernel: Any, args: tuple[Any, ...]
) -> KernelNode:
    p, owners = ops.kernel_params(config, kernel, args)
    if int(p.kern):
        p.ctx = state.ctx  # run in the graph's context whatever is current
    dep_objs = [driver.CUgraphNode(d) for d in deps]
    node = check(driver.cuGraphAddKernelNode(state.handle, dep_objs, len(dep_objs), p),
                 "cuGraphAddKernelNode")  # fmt: skip
    try:
        ops.set_kernel_node_attributes(node, config)
    except BaseException:
        driver.cuGraphDestroyNode(node)
        raise
    _commit(state, node, owners)
    return KernelNode._wrap(state, node)


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


class _Adder:
    """Node-adding methods; subclasses say which graph and which dependencies."""

    __slots__ = ()

    def _target(self) -> tuple[GraphState, list[int]]:
        """The graph to add to and the addresses of the new node's dependencies."""
        raise NotImplementedError

    def _add(
        self, cls: type[GraphNode], fn: Any, *args: Any, owners: tuple[Any, ...] = (),
        in_context: bool = False,
    ):  # fmt: skip
        state, deps = self._target()
        if in_context:
            args = (*args, state.ctx)
        dep_objs = [driver.CUgraphNode(d) for d in deps]
        node = check(fn(state.handle, dep_objs, len(dep_objs), *args), fn.__name__)
        _commit(state, node, owners)
        return cls._wrap(state, node)

    def launch(self, config: Any, kernel: Any, *args: Any) -> KernelNode:
        """Add a kernel node; retains the kernel, ``args`` and their allocations.

        Cluster and cooperative configs become the node's launch attributes.
        """
        state, deps = self._target()
        return _add_kernel_node(state, deps[0] if deps else 0, config, kernel, args)

    def memcpy(
        self, dst: Any, src: Any, size: int, *, dst_owner: Any = None, src_owner: Any = None
    ) -> MemcpyNode:
        """Add a 1-D copy of ``size`` bytes; Buffer operands are retained, ints are not."""
        p, owners = MemcpyNode._params(dst, src, size, dst_owner, src_owner)
        try:
            return self._add(MemcpyNode, driver.cuGraphAddMemcpyNode, p, owners=owners,
                             in_context=True)  # fmt: skip
        except CUDAError as exc:
            raise ops.explain_copy_failure(exc, self._target()[0].device_id, p) from None

    def memset(
        self, dst: Any, value: Any, width: int, height: int = 1, pitch: int = 0, *,
        dst_owner: Any = None,
    ) -> MemsetNode:  # fmt: skip
        """Add a memset of ``width`` x ``height`` elements (element size from ``value``)."""
        p, owners = MemsetNode._params(dst, value, width, height, pitch, dst_owner)
        _same_device(self._target()[0], dst, "memset dst")
        return self._add(MemsetNode, driver.cuGraphAddMemsetNode, p, owners=owners,
                         in_context=True)  # fmt: skip

    def callback(self, fn: Any, *, user_data: Any = None) -> HostCallbackNode:
        """Add a host node running ``fn``; retains fn and a private copy of user_data."""
        p, owners = ops.host_callback(fn, user_data)
        return self._add(HostCallbackNode, driver.cuGraphAddHostNode, p, owners=owners)

    def record(self, event: Any) -> EventRecordNode:
        """Add an event-record node; retains the event."""
        _same_device(self._target()[0], event, "record(event)")
        return self._add(EventRecordNode, driver.cuGraphAddEventRecordNode,
                         ops.event_handle(event), owners=(event,))  # fmt: skip

    def wait(self, event: Any) -> EventWaitNode:
        """Add an event-wait node; retains the event."""
        return self._add(EventWaitNode, driver.cuGraphAddEventWaitNode,
                         ops.event_handle(event), owners=(event,))  # fmt: skip

    def embed(self, child: Any) -> ChildGraphNode:
        """Add a child-graph node: CUDA copies ``child`` (a definition, or a builder
        that finished building) together with its owners."""
        from cuforge.graph._builder import _as_definition

        child = _as_definition(child, "embed(child)")
        child._state.check_open()
        self._target()[0].require_same_context(child._state, "embed(child)")
        child._state.flush()
        return self._add(ChildGraphNode, driver.cuGraphAddChildGraphNode, child._state.handle)

    def empty(self) -> EmptyNode:
        """Add an empty node (a pure dependency point)."""
        return self._add(EmptyNode, driver.cuGraphAddEmptyNode)

    def allocate(self, size: int, device: Any = None) -> AllocNode:
        """Add a graph memory allocation of ``size`` bytes; its address is ``node.dptr``."""
        state, deps = self._target()
        dev_id = getattr(device, "device_id", device)
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

    def deallocate(self, ptr: Any) -> FreeNode:
        """Add a node freeing graph-allocated memory (an AllocNode or its address)."""
        address = ptr.dptr if isinstance(ptr, AllocNode) else int(ptr)
        return self._add(FreeNode, driver.cuGraphAddMemFreeNode, driver.CUdeviceptr(address))

    def _conditional(self, cond: Condition, kind: Any, size: int) -> ConditionalNode:
        from cuforge.graph._definition import Condition, GraphDefinition

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
        bodies = tuple(
            GraphDefinition._wrap(GraphState(g, parent=state))
            for g in list(p.conditional.phGraph_out)[:size]
        )
        out = ConditionalNode._wrap(state, node)
        out._branches = bodies
        out._condition = cond
        return out

    def if_then(self, condition: Condition) -> ConditionalNode:
        """Add an IF node; fill ``node.body`` (runs when the condition is non-zero)."""
        return self._conditional(condition, _COND.CU_GRAPH_COND_TYPE_IF, 1)

    def if_else(self, condition: Condition) -> ConditionalNode:
        """Add an IF/ELSE node; ``node.branches`` is (then, else)."""
        return self._conditional(condition, _COND.CU_GRAPH_COND_TYPE_IF, 2)

    def while_loop(self, condition: Condition) -> ConditionalNode:
        """Add a WHILE node; ``node.body`` repeats while the condition is non-zero."""
        return self._conditional(condition, _COND.CU_GRAPH_COND_TYPE_WHILE, 1)

    def switch(self, condition: Condition, count: int) -> ConditionalNode:
        """Add a SWITCH node with ``count`` branches selected by the condition's value."""
        return self._conditional(condition, _COND.CU_GRAPH_COND_TYPE_SWITCH, int(count))


class GraphNode(_Adder):
    """A node of a graph definition; adding from it makes the new node depend on it."""

    # _h: the node's address; _hobj: its CUgraphNode, made on first use (the hot
    # kernel-node path never needs one).
    __slots__ = ("_h", "_hobj", "_state")
    _KIND = "node"

    def __init__(self) -> None:
        raise TypeError("graph nodes are created by GraphDefinition/GraphNode methods")

    @classmethod
    def _wrap(cls, state: GraphState, handle: driver.CUgraphNode) -> Any:
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

    def launch(self, config: Any, kernel: Any, *args: Any) -> KernelNode:
        """Add a kernel node depending on this one (see GraphDefinition.launch)."""
        state = self._state
        if state.closed or state.parent is not None or state.destroyed:
            self._check_live()
        return _add_kernel_node(state, self._h, config, kernel, args)

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
        reuses its address for a new node of the graph (CUDA's handles are addresses)."""
        state = self._state
        state.check_open()
        if state.destroyed and self._h in state.destroyed:
            return
        check(driver.cuGraphDestroyNode(self._handle), "cuGraphDestroyNode")
        if state.destroyed is None:
            state.destroyed = set()
        state.destroyed.add(self._h)

    def _check_live(self) -> None:
        """ValueError if this node's graph is closed or the node was destroyed."""
        state = self._state
        state.check_open()
        if state.destroyed and self._h in state.destroyed:
            raise ValueError(f"{type(self).__name__} {self._h:#x} was destroyed")

    @property
    def is_valid(self) -> bool:
        """False once the node was destroyed or its graph closed."""
        state = self._state
        if state.closed or (state.parent is not None and state.parent.closed):
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

    def update(self, config: Any, kernel: Any, *args: Any) -> None:
        """New launch parameters for this node (old owners stay with older versions).

        Cluster dims and the cooperative flag follow ``config``.
        """
        self._check_live()
        p, owners = ops.kernel_params(config, kernel, args)
        if int(p.kern):
            p.ctx = self._state.ctx
        current = ops.node_launch_attributes(self._handle)
        check(driver.cuGraphKernelNodeSetParams(self._handle, p), "cuGraphKernelNodeSetParams")
        ops.set_kernel_node_attributes(self._handle, config, current)
        self._state.add_bundle(owners)

    @property
    def launch_attributes(self) -> tuple[tuple[int, int, int], bool]:
        """(cluster dims, cooperative) as the driver holds them; (0, 0, 0) = no cluster."""
        self._state.check_open()
        return ops.node_launch_attributes(self._handle)


class MemcpyNode(GraphNode):
    __slots__ = ()

    @staticmethod
    def _params(dst: Any, src: Any, size: int, dst_owner: Any, src_owner: Any):
        size = int(size)
        d, downers = ops.resolve_pointer(dst, dst_owner, "memcpy dst", size)
        s, sowners = ops.resolve_pointer(src, src_owner, "memcpy src", size)
        return ops.memcpy_params(d, s, size), downers + sowners

    def update(self, dst: Any, src: Any, size: int, *, dst_owner: Any = None,
               src_owner: Any = None) -> None:  # fmt: skip
        self._update(*self._params(dst, src, size, dst_owner, src_owner))

    def _set(self, p: Any) -> None:
        try:
            check(driver.cuGraphMemcpyNodeSetParams(self._handle, p), "cuGraphMemcpyNodeSetParams")
        except CUDAError as exc:
            raise ops.explain_copy_failure(exc, self._state.device_id, p) from None


class MemsetNode(GraphNode):
    __slots__ = ()

    @staticmethod
    def _params(dst: Any, value: Any, width: int, height: int, pitch: int, dst_owner: Any):
        width, height, pitch = int(width), int(height), int(pitch)
        elem = ops.memset_value(value)[1]
        extent = (pitch or width * elem) * (height - 1) + width * elem
        d, owners = ops.resolve_pointer(dst, dst_owner, "memset dst", extent)
        return ops.memset_params(d, value, width, height, pitch), owners

    def update(self, dst: Any, value: Any, width: int, height: int = 1, pitch: int = 0, *,
               dst_owner: Any = None) -> None:  # fmt: skip
        self._update(*self._params(dst, value, width, height, pitch, dst_owner))

    def _set(self, p: Any) -> None:
        check(driver.cuGraphMemsetNodeSetParams(self._handle, p), "cuGraphMemsetNodeSetParams")


class HostCallbackNode(GraphNode):
    __slots__ = ()

    def update(self, fn: Any, *, user_data: Any = None) -> None:
        self._update(*ops.host_callback(fn, user_data))

    def _set(self, p: Any) -> None:
        check(driver.cuGraphHostNodeSetParams(self._handle, p), "cuGraphHostNodeSetParams")


class EventRecordNode(GraphNode):
    __slots__ = ()

    def update(self, event: Any) -> None:
        self._update(ops.event_handle(event), (event,))

    def _set(self, ev: Any) -> None:
        check(driver.cuGraphEventRecordNodeSetEvent(self._handle, ev), "cuGraphEventRecordNodeSetEvent")  # fmt: skip  # noqa: E501


class EventWaitNode(GraphNode):
    __slots__ = ()

    def update(self, event: Any) -> None:
        self._update(ops.event_handle(event), (event,))

    def _set(self, ev: Any) -> None:
        check(driver.cuGraphEventWaitNodeSetEvent(self._handle, ev), "cuGraphEventWaitNodeSetEvent")  # fmt: skip  # noqa: E501


class ChildGraphNode(GraphNode):
    __slots__ = ()

    def update(self, child: GraphDefinition) -> None:
        """Make this node run a copy of ``child`` from now on (this definition only).

        The node keeps a private clone of ``child`` (which holds every owner of
        ``child``) for as long as any version of this graph may run it; older
        versions keep what they embedded. ValueError if ``child`` is of another
        device; CUDAError if the driver refuses the new contents.
        """
        state = self._state
        state.check_open()
        child._state.check_open()
        state.require_same_context(child._state, "update(child)")
        child._state.flush()
        snapshot = check(driver.cuGraphClone(child._state.handle), "cuGraphClone")
        keep = GraphState(snapshot, ctx=child._state.ctx)
        p = driver.CUgraphNodeParams()
        p.type = _T.CU_GRAPH_NODE_TYPE_GRAPH
        p.graph.graph = snapshot
        p.graph.ownership = _CLONE
        try:
            check(driver.cuGraphNodeSetParams(self._handle, p), "cuGraphNodeSetParams(child)")
            state.add_bundle((keep,))
        except BaseException:
            keep.close()
            raise


class EmptyNode(GraphNode):
    __slots__ = ()


class AllocNode(GraphNode):
    __slots__ = ()

    @property
    def dptr(self) -> int:
        """The device address this node allocates (valid while the graph runs)."""
        p = check(driver.cuGraphMemAllocNodeGetParams(self._handle), "cuGraphMemAllocNodeGetParams")
        return int(p.dptr)


class FreeNode(GraphNode):
    __slots__ = ()


class ConditionalNode(GraphNode):
    __slots__ = ("_branches", "_condition")

    @property
    def branches(self) -> tuple[GraphDefinition, ...]:
        """The body graphs (IF: 1, IF/ELSE: 2, WHILE: 1, SWITCH: count)."""
        return self._branches

    @property
    def body(self) -> GraphDefinition:
        """The first (or only) body graph."""
        return self._branches[0]

    then = body  # IF and IF/ELSE: the branch taken when the condition is non-zero

    @property
    def else_(self) -> GraphDefinition:
        """IF/ELSE: the branch taken when the condition is zero."""
        if len(self._branches) != 2:
            raise AttributeError("only an IF/ELSE node has an else branch")
        return self._branches[1]

    @property
    def condition(self) -> Condition:
        return self._condition
