"""The bookkeeping of graphs that live inside nodes, checked without a GPU.

Conditional bodies and child-graph views are GraphStates made for CUgraph addresses
that a node owns; they must close when that node is destroyed or replaced and when
the graph holding the node closes, and the views listed later must be the same
states while any is alive. These checks use made-up addresses of graphs cuforge
does not own, so nothing reaches the driver.
"""

from __future__ import annotations

import gc

import pytest

from cuforge.graph._state import GraphState, NodeGraphs

NODE, OTHER = 0x1000, 0x2000


def _top() -> GraphState:
    return GraphState(0xA000, owned=False, ctx=0xC000)  # borrowed: close() destroys nothing


def test_inner_graphs_are_one_state_each_while_alive() -> None:
    top = _top()
    entry = NodeGraphs("switch", (0xB000, 0xB100), condition="cond")
    top.add_inner(NODE, entry)
    a = entry.graph(top, 0)
    assert entry.graph(top, 0) is a and entry.graph(top, 1) is not a
    assert a.parent is top and a.ctx_int == top.ctx_int and a.handle_int == 0xB000
    assert a.is_body and a.is_open
    first = id(a)
    del a
    gc.collect()
    again = entry.graph(top, 0)  # the old state is gone: a new one for the same graph
    assert again.handle_int == 0xB000 and again.is_open and entry.graph(top, 0) is again
    del first


def test_forgetting_a_node_closes_its_graphs_and_those_nested_in_them() -> None:
    top = _top()
    entry = NodeGraphs("if_else", (0xB000, 0xB100))
    top.add_inner(NODE, entry)
    then, other = entry.graph(top, 0), entry.graph(top, 1)
    nested_entry = NodeGraphs("while", (0xD000,))
    then.add_inner(OTHER, nested_entry)
    nested = nested_entry.graph(then, 0)
    top.meta[OTHER] = "a kernel"  # other metadata stays
    top.forget_node(NODE)
    assert NODE not in top.meta and top.meta[OTHER] == "a kernel"
    assert then.closed and other.closed and nested.closed  # closing cascades
    assert not nested.is_open
    for g in (then, other, nested):
        with pytest.raises(ValueError, match=r"destroyed or replaced"):
            g.check_open()
    top.forget_node(NODE)  # a second time: nothing left to do
    assert top.is_open


def test_a_graph_inside_a_closed_graph_refuses_use_even_if_never_closed_itself() -> None:
    top = _top()
    entry = NodeGraphs("while", (0xB000,))
    top.add_inner(NODE, entry)
    body = entry.graph(top, 0)
    top.closed = True  # as when the state is marked without walking its nodes
    assert not body.closed and not body.is_open
    with pytest.raises(ValueError, match=r"the graph this graph lives in is closed"):
        body.check_open()


def test_closing_a_graph_closes_every_graph_inside_its_nodes_and_drops_metadata() -> None:
    top = _top()
    entry = NodeGraphs("child", (0xB000,))
    top.add_inner(NODE, entry)
    top.meta[OTHER] = "a kernel"
    view = entry.graph(top, 0)
    top.close()
    assert top.meta == {} and view.closed and view.meta == {}
    with pytest.raises(ValueError):
        view.check_open()
    plain = _top()
    plain.meta[OTHER] = "a kernel"
    plain.close()  # no graphs inside nodes: nothing to walk
    assert plain.meta == {} and not plain.has_inner
