"""Node objects for nodes that already exist in a graph (``nodes()``, ``edges()``,
``pred``, ``succ``): the right class for each driver node type.

Listing makes new views of the same nodes: equal (by node address) to the objects
that created them, not identical. A conditional node listed this way has the bodies
and Condition cuforge made it with (the same graphs as the creating object's), and
none for a node cuforge did not make in this graph (a captured or cloned one: the
driver does not hand bodies back).
"""

from __future__ import annotations

from typing import Any

from cuda.bindings import driver

from cuforge.graph._nested import ChildGraphNode, ConditionalNode
from cuforge.graph._nodes import (
    AllocNode,
    EmptyNode,
    EventRecordNode,
    EventWaitNode,
    FreeNode,
    GraphNode,
    HostCallbackNode,
    KernelNode,
    MemcpyNode,
    MemsetNode,
)
from cuforge.graph._state import GraphState, NodeGraphs
from cuforge.runtime.errors import check

_T = driver.CUgraphNodeType


def query_nodes(fn: Any, *args: Any) -> list[driver.CUgraphNode]:
    """The nodes ``fn`` (a driver listing call taking a count) reports."""
    count = check(fn(*args, 0))[-1]
    if not count:
        return []
    return list(check(fn(*args, count))[0])[:count]


class OtherNode(GraphNode):
    """A node kind cuforge has no class for (e.g. external semaphores)."""

    __slots__ = ()


_BY_TYPE = {
    _T.CU_GRAPH_NODE_TYPE_KERNEL: KernelNode,
    _T.CU_GRAPH_NODE_TYPE_MEMCPY: MemcpyNode,
    _T.CU_GRAPH_NODE_TYPE_MEMSET: MemsetNode,
    _T.CU_GRAPH_NODE_TYPE_HOST: HostCallbackNode,
    _T.CU_GRAPH_NODE_TYPE_GRAPH: ChildGraphNode,
    _T.CU_GRAPH_NODE_TYPE_EMPTY: EmptyNode,
    _T.CU_GRAPH_NODE_TYPE_EVENT_RECORD: EventRecordNode,
    _T.CU_GRAPH_NODE_TYPE_WAIT_EVENT: EventWaitNode,
    _T.CU_GRAPH_NODE_TYPE_MEM_ALLOC: AllocNode,
    _T.CU_GRAPH_NODE_TYPE_MEM_FREE: FreeNode,
}


def wrap_node(state: GraphState, handle: driver.CUgraphNode) -> GraphNode:
    """A node object of the right class for an existing node."""
    kind = check(driver.cuGraphNodeGetType(handle), "cuGraphNodeGetType")
    cls = _BY_TYPE.get(kind, OtherNode)
    node = cls._wrap(state, handle)
    if cls is OtherNode and kind == _T.CU_GRAPH_NODE_TYPE_CONDITIONAL:
        from cuforge.graph._definition import GraphDefinition

        node = ConditionalNode._wrap(state, handle)
        entry = state.meta.get(node._h)
        if isinstance(entry, NodeGraphs):
            n = len(entry.handles)
            node._branches = tuple(GraphDefinition._wrap(entry.graph(state, i)) for i in range(n))
            node._condition = entry.condition
        else:
            node._branches = ()
            node._condition = None
    return node
