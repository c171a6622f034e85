"""Graph nodes that hold graphs: conditional nodes (their bodies) and child-graph nodes.

A conditional node's bodies and a child-graph node's embedded graph are CUDA's
graphs, owned by the node; cuforge hands them out as :class:`GraphDefinition`
views registered on the parent graph (``GraphState.add_inner``), so they close
with the node: destroying or updating the node makes every view and its nodes
refuse use (ValueError). A child-graph update keeps a private clone of the new
child, with its owners, for as long as any version of the graph may run it.

Failure modes: a view used after its node went raises ValueError; the driver's
refusal of an update is a CUDAError, and then nothing is retained or forgotten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuforge._cuda import driver
from cuforge.graph import _params as _read
from cuforge.graph._nodes import GraphNode
from cuforge.graph._state import GraphState, NodeGraphs
from cuforge.runtime.errors import check

if TYPE_CHECKING:
    from cuforge.graph._definition import Condition, GraphDefinition

__all__ = ["ChildGraphNode", "ConditionalNode"]

_T = driver.CUgraphNodeType
_CLONE = driver.CUgraphChildGraphNodeOwnership.CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE


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
        state.forget_node(self._h)  # the graph it embedded before is gone, and its views

    @property
    def child_graph(self) -> GraphDefinition:
        """A view of the graph this node embeds (CUDA's copy, owned by the node).

        Nodes added through it change what the node runs in later instantiations;
        its bundles are attached to that graph at once. Closed (ValueError on use)
        when this node is destroyed or updated; ``close()`` on it does nothing."""
        from cuforge.graph._definition import GraphDefinition

        self._check_live()
        state = self._state
        entry = state.meta.get(self._h)
        if not isinstance(entry, NodeGraphs):
            entry = NodeGraphs("child", (_read.child_graph(self._handle),))
            state.add_inner(self._h, entry)
        return GraphDefinition._wrap(entry.graph(state, 0))


class ConditionalNode(GraphNode):
    __slots__ = ("_branches", "_condition")
    _branches: tuple[GraphDefinition, ...]
    # None for a node listed from a graph (GraphDefinition.nodes) rather than added
    _condition: Condition | None

    @property
    def branches(self) -> tuple[GraphDefinition, ...]:
        """The body graphs (one for IF and WHILE, two for IF/ELSE, ``count`` for SWITCH)."""
        return self._branches

    @property
    def body(self) -> GraphDefinition:
        """The first (or only) body graph."""
        return self._branches[0]

    then = body  # IF and IF/ELSE: the branch taken when the condition is non-zero

    @property
    def else_(self) -> GraphDefinition:
        """The branch an IF/ELSE node takes when the condition is zero."""
        if len(self._branches) != 2:
            raise AttributeError("only an IF/ELSE node has an else branch")
        return self._branches[1]

    @property
    def condition(self) -> Condition | None:
        """The Condition (None for a node listed from a captured graph)."""
        return self._condition

    @property
    def kind(self) -> str | None:
        """ "if", "if_else", "while" or "switch" (None for a node listed from a
        captured graph)."""
        self._check_live()
        entry = self._state.meta.get(self._h)
        return entry.kind if isinstance(entry, NodeGraphs) else None
