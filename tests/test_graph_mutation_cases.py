"""Argument checks, graph mutation and node updates that cuda.core's suite checks,
tested on cuforge (see ``tests/graph_coverage.md``; no upstream code or text).
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    cfg,
    kernels,
    no_leftover_bundles,
    read_ints,
    released,
    setup_device,
    write_ints,
)

pytestmark = pytest.mark.gpu


@pytest.fixture
def dev():
    return setup_device()


@pytest.mark.parametrize(
    "method, args",
    [("if_then", (42,)), ("if_else", ("cond",)), ("while_loop", (None,)), ("switch", ([1], 4))],
)
def test_conditional_methods_take_conditions_only(dev, method, args) -> None:
    from cuforge.graph import GraphDefinition

    g = GraphDefinition()
    with pytest.raises(TypeError, match="Condition"):
        getattr(g, method)(*args)
    g.close()


def test_argument_and_driver_refusals(dev) -> None:
    from cuforge import CUDAError
    from cuforge.graph import GraphDefinition

    g, other = GraphDefinition(), GraphDefinition()
    with pytest.raises(TypeError, match="GraphDefinition or GraphBuilder"):
        g.embed("not a graph")
    with pytest.raises(CUDAError):
        g.deallocate(0)
    a = g.allocate(64)
    with pytest.raises(ValueError, match="1, 2 or 4 bytes"):
        a.memset(a.dptr, b"\x01\x02\x03", 8)
    with pytest.raises(CUDAError):
        g.switch(g.create_condition(0), 0)
    with pytest.raises(CUDAError):
        other.if_then(g.create_condition(0))  # a condition of another graph
    joined = a.join()  # one dependency only
    assert joined.pred == (a,)
    for device in (dev, dev.device_id):  # the allocating device, as a Device or ordinal
        assert g.allocate(64, device=device).dptr != 0
    from cuforge.graph import Condition

    assert isinstance(g.create_condition(), Condition)  # no default value
    n1, n2 = g.empty(), other.empty()
    with pytest.raises(TypeError, match="GraphNode"):
        g.add_dependencies(n1, "node")
    with pytest.raises(CUDAError):
        g.add_dependencies(n1, n1)  # a self edge
    with pytest.raises(CUDAError):
        g.add_dependencies(n1, n2)  # a node of another graph
    e1, e2 = other.instantiate(), other.instantiate()  # (no memory nodes: CUDA allows two)
    assert e1 is not e2
    e1.close()
    e2.close()
    g.close()
    other.close()


def test_unfreed_graph_allocation_and_default_conditions(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    s = dev.create_stream()
    c = dev.allocate(12)
    write_ints(c, [0, 0, 0])
    g = GraphDefinition()
    kept = g.allocate(1024)  # not freed in the graph: it outlives the launch (CUDA's rule)
    w = g.memset(c, 0, 12).while_loop(g.create_condition(0))
    w.body.launch(cfg(), k["add_one"], c, 1)
    i = g.if_then(g.create_condition(0))
    i.body.launch(cfg(), k["add_one"], c.handle + 4, 1)
    sw = g.switch(g.create_condition(99), 3)  # out of range: no branch
    for b in sw.branches:
        b.launch(cfg(), k["add_one"], c.handle + 8, 1)
    exe = g.instantiate()
    exe.launch(s)
    s.sync()
    assert list(read_ints(c, 3)) == [0, 0, 0]
    from cuda.bindings import driver

    # The launch's allocation is the caller's to free (memcheck reports it otherwise).
    assert driver.cuMemFreeAsync(kept.dptr, s.handle)[0] == driver.CUresult.CUDA_SUCCESS
    s.sync()
    exe.close()
    g.close()


def test_destroying_and_rewiring_nodes_changes_what_runs(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    s = dev.create_stream()
    c = dev.allocate(4)
    g = GraphDefinition()
    first = g.memset(c, 0, 4)
    k1 = first.launch(cfg(), k["add_one"], c, 1)
    k2 = k1.launch(cfg(), k["add_one"], c, 1)
    k3 = k2.launch(cfg(), k["add_one"], c, 1)
    assert set(g.edges()) == {(first, k1), (k1, k2), (k2, k3)}
    k2.destroy()
    k2.destroy()  # again: nothing happens
    assert not k2.is_valid and k1.is_valid
    assert k2 not in g.nodes()
    g.add_dependencies(k1, k3)
    assert set(g.edges()) == {(first, k1), (k1, k3)}
    for use in (lambda: k2.pred, lambda: k2.launch(cfg(), k["noop"]),
                lambda: k2.update(cfg(), k["add_one"], c, 1)):  # fmt: skip
        with pytest.raises(ValueError, match="destroyed"):
            use()
    exe = g.instantiate()
    exe.launch(s)
    s.sync()
    assert read_ints(c, 1)[0] == 2
    g.remove_dependencies(k1, k3)
    assert set(g.edges()) == {(first, k1)}
    exe.close()
    g.close()


def test_exec_views_enable_disable_and_refuse_what_they_cannot_update(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    s = dev.create_stream()
    src, dst = dev.allocate(4), dev.allocate(4)
    write_ints(src, [7])
    write_ints(dst, [0])
    g = GraphDefinition()
    kern = g.launch(cfg(), k["add_one"], dst, 1)
    copy = g.memcpy(src, dst, 4)
    fill = g.memset(src, 0, 4)
    empty = g.empty()
    gone = g.launch(cfg(), k["noop"])
    exe = g.instantiate()
    for node in (kern, copy, fill):
        view = exe[node]
        assert view.is_enabled
        view.disable()
        view.disable()
        assert not view.is_enabled
    exe.launch(s)
    s.sync()
    assert (read_ints(src, 1)[0], read_ints(dst, 1)[0]) == (7, 0)  # nothing ran
    exe[kern].enable()
    exe.launch(s)
    s.sync()
    assert read_ints(dst, 1)[0] == 1
    with pytest.raises(TypeError, match="no executable-graph view"):
        exe[empty]
    with pytest.raises(TypeError):
        exe[object()]
    gone.destroy()
    with pytest.raises(ValueError, match="no longer valid"):
        exe[gone]
    exe.close()
    g.close()


def test_definition_updates_reach_later_execs_only_and_exec_updates_stay_per_exec(dev) -> None:
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    called: list[str] = []

    def make(tag):
        def fn() -> None:
            called.append(tag)

        return fn

    g = GraphDefinition()
    node = g.callback(make("original"))
    old = g.instantiate()
    node.update(make("updated"))
    new = g.instantiate()
    first, second = make("first"), make("second")
    w_first, w_second = weakref.ref(first), weakref.ref(second)
    old[node].update(first)
    new[node].update(second)
    del first, second
    gc.collect()
    for exe in (old, new):
        exe.launch(s)
    s.sync()
    assert called == ["first", "second"]
    old.close()
    assert released(lambda: w_first() is None)  # each exec's updates are its own
    assert w_second() is not None
    new.close()
    assert released(lambda: w_second() is None)
    g.close()


def test_copy_node_updated_from_host_to_host_into_host_to_device(dev) -> None:
    import ctypes

    from cuforge import PinnedMemoryResource
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    pinned = PinnedMemoryResource(dev)
    host_src, host_dst = pinned.allocate(16), pinned.allocate(16)
    src_view = np.ctypeslib.as_array((ctypes.c_uint8 * 16).from_address(host_src.handle))
    dst_view = np.ctypeslib.as_array((ctypes.c_uint8 * 16).from_address(host_dst.handle))
    src_view[:] = 0x5A
    dst_view[:] = 0
    device = dev.allocate(16)
    g = GraphDefinition()
    node = g.memcpy(host_dst, host_src, 16)
    node.update(device, host_src, 16)  # now host -> device
    node.memcpy(host_dst, device, 16)  # then device -> host
    exe = g.instantiate()
    exe.launch(s)
    s.sync()
    assert (dst_view == 0x5A).all()
    exe.close()
    g.close()


def test_whole_graph_update_from_builders_and_definitions(dev) -> None:
    from cuforge import CUDAError, launch
    from cuforge.graph import GraphDefinition

    k = kernels()
    s = dev.create_stream()
    c = dev.allocate(8)
    write_ints(c, [0, 0])
    called: list[str] = []

    def new() -> None:
        called.append("new")

    w_new = weakref.ref(new)
    gb = dev.create_graph_builder().begin_building()
    cond = gb.create_condition(0)
    launch(gb, cfg(), k["set_cond"], cond, 0)
    body = gb.if_then(cond)
    body.graph_definition.launch(cfg(), k["add_one"], c, 1)
    graph = gb.end_building().complete()
    unfinished = dev.create_graph_builder().begin_building()
    with pytest.raises(ValueError, match="not finished"):
        graph.update(unfinished)
    unfinished.end_building()
    unfinished.close()
    with pytest.raises(TypeError, match="GraphDefinition or GraphBuilder"):
        graph.update("not a graph")
    other = dev.create_graph_builder().begin_building()  # same shape, other target
    cond2 = other.create_condition(0)
    launch(other, cfg(), k["set_cond"], cond2, 1)
    other.if_then(cond2).graph_definition.launch(cfg(), k["add_one"], c.handle + 4, 1)
    other.end_building()
    graph.update(other)
    graph.launch(s)
    s.sync()
    assert list(read_ints(c, 2)) == [0, 1]
    mismatch = GraphDefinition()
    mismatch.callback(new)
    with pytest.raises(CUDAError, match="GRAPH_EXEC_UPDATE_FAILURE"):
        graph.update(mismatch)  # refused: nothing of it is adopted
    mismatch.close()
    del new
    assert released(lambda: w_new() is None)
    graph.close()
    for b in (gb, other):
        b.close()
