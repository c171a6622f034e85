"""Per-kind node getters and the graphs that live inside nodes, tested on the GPU.

What cuda.core's definition suite checks of node parameters (see
``tests/graph_coverage.md``; no upstream code or text): every node kind reads back
what it was given -- from the creating object, from views listed by ``nodes()`` or
reached through ``pred``, after updates, and (for what the driver holds) on a
clone -- graph allocations refuse an empty size, and a child node's graph view lives
and dies with its node.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    HOSTFN,
    cfg,
    expect_raises,
    kernels,
    no_leftover_bundles,
    read_ints,
    setup_device,
    write_ints,
)

pytestmark = pytest.mark.gpu


@pytest.fixture
def dev():
    return setup_device()


def _fn() -> None:
    pass


def _node_kinds(dev, g, k, buf, other, ev, host):
    """One node of every kind in ``g`` (no memory nodes: CUDA forbids cloning those),
    each with the attribute values it must read back."""
    from cuforge import LaunchConfig
    from cuforge.graph import GraphDefinition

    child = GraphDefinition()
    child.launch(cfg(), k["noop"])
    child.launch(cfg(), k["noop"])
    # A condition belongs to one conditional node: each gets its own.
    cond = [g.create_condition(0) for _ in range(4)]
    shaped = LaunchConfig(grid=(2, 3, 1), block=(32, 4, 1), shmem_size=128)
    clustered = LaunchConfig(grid=2, block=32, cluster=2)
    base = buf.handle
    made = {
        "kernel": (
            g.launch(shaped, k["noop"]),
            {
                "config": shaped,
                "grid": (2, 3, 1),
                "block": (32, 4, 1),
                "shmem_size": 128,
                "kernel": k["noop"],
                "launch_attributes": ((0, 0, 0), False),
            },
        ),
        "cluster kernel": (
            g.launch(clustered, k["cluster_size"], other),
            {"config": clustered, "grid": (2, 1, 1), "kernel": k["cluster_size"]},
        ),
        "memset u8": (
            g.memset(buf, 42, 256),
            {"dptr": base, "value": 42, "element_size": 1, "width": 256, "height": 1, "pitch": 256},
        ),
        "memset u16": (
            g.memset(buf, b"\xab\xcd", 128),
            {"dptr": base, "value": 0xCDAB, "element_size": 2, "width": 128, "pitch": 256},
        ),
        "memset u32": (
            g.memset(buf, b"\x01\x02\x03\x04", 64),
            {"value": 0x04030201, "element_size": 4, "width": 64},
        ),
        "memset 2d": (
            g.memset(buf, 0xFF, 64, height=4, pitch=64),
            {"value": 0xFF, "width": 64, "height": 4, "pitch": 64},
        ),
        "memcpy": (
            g.memcpy(other, buf, 256),
            {"dst": other.handle, "src": base, "size": 256},
        ),
        "python callback": (g.callback(_fn), {"fn": _fn}),
        "ctypes callback": (g.callback(host), {"fn": host}),
        "record": (g.record(ev), {"event": ev}),
        "wait": (g.wait(ev), {"event": ev}),
        "if": (g.if_then(cond[0]), {"kind": "if", "condition": cond[0]}),
        "if_else": (g.if_else(cond[1]), {"kind": "if_else", "condition": cond[1]}),
        "while": (g.while_loop(cond[2]), {"kind": "while", "condition": cond[2]}),
        "switch": (g.switch(cond[3], 3), {"kind": "switch", "condition": cond[3]}),
        "child": (g.embed(child), {}),
    }
    child.close()
    return made


def test_every_node_kind_reads_back_its_parameters_also_through_nodes(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    buf, other = dev.allocate(256), dev.allocate(256)
    ev = dev.create_event()
    host = HOSTFN(lambda p: None)
    g = GraphDefinition()
    made = _node_kinds(dev, g, k, buf, other, ev, host)
    listed = {n: n for n in g.nodes()}
    assert len(listed) == len(made)
    for label, (node, want) in made.items():
        view = listed[node]
        assert view is not node, label  # a fresh view from the driver's node list
        for attr, value in want.items():
            assert getattr(node, attr) == value, (label, attr, getattr(node, attr))
            assert getattr(view, attr) == value, (label, attr, "through nodes()")

    # Conditional nodes: the listed view has the same body graphs and Condition.
    for label, count in (("if", 1), ("if_else", 2), ("while", 1), ("switch", 3)):
        node = made[label][0]
        view = listed[node]
        assert len(node.branches) == count
        assert view.branches == node.branches and view.body == node.body
    assert made["if_else"][0].else_ == listed[made["if_else"][0]].branches[1]
    child_view = made["child"][0].child_graph
    assert len(child_view.nodes()) == 2
    assert listed[made["child"][0]].child_graph == child_view  # one view per graph

    g.close()


def test_a_clones_nodes_answer_what_the_driver_holds(dev) -> None:
    """Python objects given to nodes are not copied with the graph: on a clone those
    getters answer None; everything the driver holds reads back."""
    from cuforge import LaunchConfig
    from cuforge.graph import GraphDefinition

    k = kernels()
    buf, other = dev.allocate(64), dev.allocate(64)
    ev = dev.create_event()
    config = LaunchConfig(grid=3, block=64, shmem_size=16)
    g = GraphDefinition()
    g.launch(config, k["noop"]).memcpy(other, buf, 64).record(ev).callback(_fn)
    copy = g.clone()
    by_kind = {type(n).__name__: n for n in copy.nodes()}
    assert set(by_kind) == {"KernelNode", "MemcpyNode", "EventRecordNode", "HostCallbackNode"}
    assert by_kind["KernelNode"].config == config and by_kind["KernelNode"].kernel is None
    assert (by_kind["MemcpyNode"].dst, by_kind["MemcpyNode"].size) == (other.handle, 64)
    assert by_kind["EventRecordNode"].event is None
    assert by_kind["HostCallbackNode"].fn is None
    copy.close()
    g.close()


def test_getters_follow_definition_updates_and_refuse_destroyed_nodes(dev) -> None:
    from cuforge import LaunchConfig
    from cuforge.graph import GraphDefinition

    k = kernels()
    buf, other = dev.allocate(64), dev.allocate(64)
    ev1, ev2 = dev.create_event(), dev.create_event()
    g = GraphDefinition()
    kern = g.launch(cfg(), k["noop"])
    kern.update(LaunchConfig(grid=4, block=64), k["add_one"], buf, 16)
    assert kern.config == LaunchConfig(grid=4, block=64) and kern.kernel is k["add_one"]
    ms = g.memset(buf, 1, 64)
    ms.update(other, b"\x07\x00", 8, height=2, pitch=32)
    assert (ms.dptr, ms.value, ms.element_size, ms.width, ms.height, ms.pitch) == (
        other.handle, 7, 2, 8, 2, 32
    )  # fmt: skip
    cp = g.memcpy(other, buf, 64)
    cp.update(buf, other, 32)
    assert (cp.dst, cp.src, cp.size) == (buf.handle, other.handle, 32)
    cb = g.callback(_fn)
    host = HOSTFN(lambda p: None)
    cb.update(host)
    assert cb.fn is host
    rec = g.record(ev1)
    rec.update(ev2)
    assert rec.event is ev2
    assert {n.event for n in g.nodes() if type(n).__name__ == "EventRecordNode"} == {ev2}

    ms.destroy()
    for attr in ("dptr", "value", "width"):
        expect_raises(ValueError, getattr, ms, attr)
    kern.destroy()
    expect_raises(ValueError, getattr, kern, "config")
    expect_raises(ValueError, getattr, kern, "kernel")
    g.close()
    expect_raises(ValueError, getattr, cp, "size")  # the graph is closed


def test_graph_memory_nodes_read_back_and_refuse_an_empty_size(dev) -> None:
    from cuforge.graph import GraphDefinition

    g = GraphDefinition()
    for size, exc in ((0, ValueError), (-8, ValueError), (1.5, TypeError), (True, TypeError)):
        expect_raises(exc, g.allocate, size)
    assert g.nodes() == ()  # nothing reached the driver
    a = g.allocate(1024)
    expect_raises(ValueError, a.allocate, 0)
    b = a.allocate(512, device=dev)
    free_b = b.deallocate(b)
    free_a = free_b.deallocate(a.dptr)
    assert a.dptr and b.dptr and a.dptr != b.dptr
    assert (a.bytesize, b.bytesize) == (1024, 512)
    assert a.device_id == b.device_id == dev.device_id
    assert (free_b.dptr, free_a.dptr) == (b.dptr, a.dptr)
    listed = {n: n for n in g.nodes()}
    assert listed[b].bytesize == 512 and listed[free_a].dptr == a.dptr
    assert free_b.pred == (b,)
    g.close()


@pytest.mark.parametrize("kind", ["memcpy", "record", "wait", "free", "kernel"])
def test_nodes_reached_through_pred_after_their_objects_are_gone(dev, kind) -> None:
    from cuforge import Program, ProgramOptions
    from cuforge.graph import EventRecordNode, EventWaitNode, GraphDefinition, KernelNode
    from cuforge.runtime.event import EventOptions

    src, dst = dev.allocate(8), dev.allocate(8)
    ev = dev.create_event(EventOptions(enable_timing=True))  # its options must survive
    g = GraphDefinition()
    if kind == "memcpy":
        node = g.memcpy(dst, src, 8)
        want = (dst.handle, src.handle, 8)

        def check(n):
            return (n.dst, n.src, n.size) == want
    elif kind in ("record", "wait"):
        node = g.record(ev) if kind == "record" else g.wait(ev)
        cls = EventRecordNode if kind == "record" else EventWaitNode

        def check(n):
            e = n.event
            return (
                isinstance(n, cls)
                and e is ev_ref()
                and e.handle == handle
                and (e.is_timing_disabled is False and e.is_done and e.device == dev)
            )
    elif kind == "free":
        alloc = g.allocate(64)
        want_ptr = alloc.dptr
        node = alloc.deallocate(alloc)

        def check(n):
            return n.dptr == want_ptr
    else:  # a kernel whose Program and ObjectCode are gone keeps working
        code = Program('extern "C" __global__ void k7(int *p) { p[0] = 7; }', "c++",
                       ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin")  # fmt: skip
        node = g.launch(cfg(), code.get_kernel("k7"), dst)
        del code

        def check(n):
            return isinstance(n, KernelNode) and n.kernel.name == "k7" and n.kernel.param_sizes

    ev_ref, handle = weakref.ref(ev), ev.handle
    succ = node.empty()
    del node, ev  # the view below is made from the driver's answer alone
    gc.collect()
    (back,) = succ.pred
    assert check(back)
    if kind == "kernel":
        s = dev.create_stream()
        write_ints(dst, [0])
        exe = g.instantiate()
        exe.launch(s)
        s.sync()
        assert read_ints(dst, 1)[0] == 7
        exe.close()
    g.close()


def test_a_listed_body_outlives_its_parent_definition_object(dev) -> None:
    from cuforge.graph import ConditionalNode, GraphDefinition

    g = GraphDefinition()
    g.while_loop(g.create_condition(0))
    (listed,) = [n for n in g.nodes() if isinstance(n, ConditionalNode)]
    body = listed.body
    assert listed.kind == "while"
    del g, listed
    gc.collect()
    assert body.nodes() == ()
    body.launch(cfg(), kernels()["noop"])
    assert len(body.nodes()) == 1


def test_child_graph_view_follows_its_node(dev) -> None:
    """The view edits the embedded copy (later instantiations run it), outlives the
    parent definition object, keeps its hash, and closes -- with the views nested in
    it -- when its node is destroyed or updated. Executables keep their own copy."""
    from cuforge.graph import ChildGraphNode, GraphDefinition

    k = kernels()
    s = dev.create_stream()
    c = dev.allocate(4)
    write_ints(c, [0])
    inner = GraphDefinition()
    inner.launch(cfg(), k["add_one"], c, 1)
    middle = GraphDefinition()
    middle.embed(inner)
    outer = GraphDefinition()
    node = outer.embed(middle)
    inner.close()
    middle.close()
    view = node.child_graph
    (nested,) = [n for n in view.nodes() if isinstance(n, ChildGraphNode)]
    inner_view = nested.child_graph
    (inner_kernel,) = inner_view.nodes()
    inner_kernel.launch(cfg(), k["add_one"], c, 1)  # the embedded copy now adds 2
    exe = outer.instantiate()
    exe.launch(s)
    s.sync()
    assert read_ints(c, 1)[0] == 2

    # The view keeps the parent graph alive after the definition object goes.
    w_outer = weakref.ref(outer)
    del outer
    gc.collect()
    assert w_outer() is None and len(view.nodes()) == 1
    before = hash(view)
    spare = GraphDefinition()
    spare.empty()
    other = node.graph.embed(spare).child_graph
    spare.close()
    table = {view: "first", other: "second"}

    # Updating the node from its own embedded graph is safe (the update clones it
    # first) and replaces the embedded graph: every view of the old one closes.
    node.update(view)
    assert view.is_closed and inner_view.is_closed
    assert not nested.is_valid and not inner_kernel.is_valid
    expect_raises(ValueError, view.nodes)
    expect_raises(ValueError, inner_kernel.launch, cfg(), k["noop"])
    fresh = node.child_graph
    assert fresh != view and len(fresh.nodes()) == 1

    node.destroy()
    assert fresh.is_closed and not node.is_valid
    expect_raises(ValueError, getattr, fresh, "handle")
    assert hash(view) == before and table[view] == "first" and table[other] == "second"
    assert view != other

    exe.launch(s)  # the executable runs its own copy, untouched by the edits above
    s.sync()
    assert read_ints(c, 1)[0] == 4
    exe.close()
    node.graph.close()
