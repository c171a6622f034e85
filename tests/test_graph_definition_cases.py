"""GraphDefinition behaviours that cuda.core's definition and lifetime suites check,
tested on cuforge (see ``tests/graph_coverage.md``; no upstream code or text).

Topology queries, node classes and their round trip through ``nodes()``,
instantiation options, graph memory nodes, conditional nodes set from Condition
objects, DOT output, and lifetimes: copies made outside cuforge (``cuGraphClone`` on
``.handle``), several executables of one definition, deleted nodes, raw operands
with Buffer owners, and releases on the main thread.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref

import numpy as np
import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    HOSTFN,
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


def _ok(res):
    from cuda.bindings import driver

    assert res[0] == driver.CUresult.CUDA_SUCCESS, res[0]
    return res[1] if len(res) == 2 else None


def _topology(shape):
    from cuforge.graph import GraphDefinition

    g = GraphDefinition()
    if shape == "empty":
        return g, {}, set()
    a = g.empty()
    if shape == "single":
        return g, {"a": a}, set()
    if shape == "chain":
        b = a.empty()
        c = b.empty()
        return g, {"a": a, "b": b, "c": c}, {("a", "b"), ("b", "c")}
    if shape == "fan_out":
        b, c, d = a.empty(), a.empty(), a.empty()
        return g, {"a": a, "b": b, "c": c, "d": d}, {("a", "b"), ("a", "c"), ("a", "d")}
    if shape == "fan_in":
        b, c = g.empty(), g.empty()
        d = g.join(a, b, c)
        return g, {"a": a, "b": b, "c": c, "d": d}, {("a", "d"), ("b", "d"), ("c", "d")}
    if shape == "diamond":
        b, c = a.empty(), a.empty()
        d = b.join(c)
        return g, {"a": a, "b": b, "c": c, "d": d}, {("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")}
    b = g.empty()  # disconnected
    return g, {"a": a, "b": b}, set()


@pytest.mark.parametrize(
    "shape", ["empty", "single", "chain", "fan_out", "fan_in", "diamond", "disconnected"]
)
def test_topology_queries(dev, shape) -> None:
    g, named, edges = _topology(shape)
    name = {v: k for k, v in named.items()}
    assert set(g.nodes()) == set(named.values())
    assert {(name[a], name[b]) for a, b in g.edges()} == edges
    for n, node in named.items():
        assert {name[p] for p in node.pred} == {a for a, b in edges if b == n}
        assert {name[s] for s in node.succ} == {b for a, b in edges if a == n}
        assert node.graph == g
    g.close()


def test_node_classes_survive_the_round_trip_through_nodes(dev, tmp_path) -> None:
    from cuforge.graph import (
        AllocNode,
        ChildGraphNode,
        ConditionalNode,
        EmptyNode,
        EventRecordNode,
        EventWaitNode,
        FreeNode,
        GraphDefinition,
        GraphNode,
        HostCallbackNode,
        KernelNode,
        MemcpyNode,
        MemsetNode,
    )

    k = kernels()
    buf, other = dev.allocate(64), dev.allocate(64)
    ev = dev.create_event()
    g = GraphDefinition()
    child = GraphDefinition()
    child.launch(cfg(), k["noop"])
    child.launch(cfg(), k["noop"])
    alloc = g.allocate(256)
    made = {
        "kernel": (g.launch(cfg(), k["noop"]), KernelNode),
        "memset": (g.memset(buf, 7, 64), MemsetNode),
        "memcpy": (g.memcpy(other, buf, 64), MemcpyNode),
        "callback": (g.callback(lambda: None), HostCallbackNode),
        "ctypes callback": (g.callback(HOSTFN(lambda p: None)), HostCallbackNode),
        "record": (g.record(ev), EventRecordNode),
        "wait": (g.wait(ev), EventWaitNode),
        "child": (g.embed(child), ChildGraphNode),
        "empty": (g.empty(), EmptyNode),
        "alloc": (alloc, AllocNode),
        "free": (alloc.deallocate(alloc), FreeNode),
        "if": (g.if_then(g.create_condition(0)), ConditionalNode),
        "while": (g.while_loop(g.create_condition(0)), ConditionalNode),
        "switch": (g.switch(g.create_condition(0), 3), ConditionalNode),
    }
    listed = {n: n for n in g.nodes()}
    for label, (node, cls) in made.items():
        assert isinstance(node, cls) and isinstance(node, GraphNode), label
        assert isinstance(listed[node], cls), label
    assert alloc.dptr != 0
    assert len(made["switch"][0].branches) == 3
    assert len(made["if"][0].branches) == 1
    g.debug_dot_print(tmp_path / "g.dot")
    assert "digraph" in (tmp_path / "g.dot").read_text()
    with pytest.raises(TypeError, match="GraphDebugPrintOptions"):
        g.debug_dot_print(tmp_path / "h.dot", "verbose")
    g.close()
    child.close()


@pytest.mark.parametrize("options", ["none", "auto_free", "priority", "upload"])
def test_instantiate_options_run_graph_memory_and_copies(dev, options) -> None:
    from cuforge.graph import GraphCompleteOptions, GraphDefinition

    s = dev.create_stream()
    out = dev.allocate(256)
    write_ints(out, np.zeros(64))
    g = GraphDefinition()
    a = g.allocate(256)
    b = a.allocate(256)
    fill = b.memset(a.dptr, 0xAB, 256)
    copy = fill.memcpy(b.dptr, a.dptr, 256).memcpy(out, b.dptr, 256)
    copy.deallocate(a).deallocate(b)
    opts = {
        "none": None,
        "auto_free": GraphCompleteOptions(auto_free_on_launch=True),
        "priority": GraphCompleteOptions(use_node_priority=True),
        "upload": GraphCompleteOptions(upload_stream=s),
    }[options]
    exe = g.instantiate(opts)
    exe.launch(s)
    s.sync()
    assert (read_ints(out, 64) == np.int32(-0x54545455)).all()  # 0xABABABAB
    exe.close()
    g.close()


def test_device_launchable_kernel_graph_runs(dev) -> None:
    from cuforge.graph import GraphCompleteOptions, GraphDefinition

    s = dev.create_stream()
    c = dev.allocate(4)
    write_ints(c, [0])
    g = GraphDefinition()
    g.launch(cfg(), kernels()["add_one"], c, 1)
    exe = g.instantiate(GraphCompleteOptions(device_launch=True))
    exe.upload(s)
    exe.launch(s)
    s.sync()
    assert read_ints(c, 1)[0] == 1
    exe.close()
    g.close()


@pytest.mark.parametrize(
    "value", [True, False, ctypes.c_bool(True), ctypes.c_bool(False), np.bool_(True), 1, 0]
)
def test_conditions_are_kernel_arguments_and_if_else_follows_them(dev, value) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    setter = k["set_cond"] if type(value) is int else k["set_cond_bool"]
    s = dev.create_stream()
    c = dev.allocate(8)
    write_ints(c, [0, 0])
    g = GraphDefinition()
    cond = g.create_condition(0)
    node = g.launch(cfg(), setter, cond, value).if_else(cond)  # the Condition itself
    then, other = node.branches
    then.launch(cfg(), k["add_one"], c, 1).launch(cfg(), k["add_one"], c, 1)
    other.launch(cfg(), k["add_one"], c.handle + 4, 1)
    exe = g.instantiate()
    exe.launch(s)
    s.sync()
    truth = bool(value.value if isinstance(value, ctypes.c_bool) else value)
    assert list(read_ints(c, 2)) == ([2, 0] if truth else [0, 1])
    exe.close()
    g.close()


def test_switch_and_if_bodies_run_by_condition_value(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    s = dev.create_stream()
    c = dev.allocate(4)
    write_ints(c, [0])
    g = GraphDefinition()
    cond = g.create_condition(0)
    sw = g.memset(c, 0, 4).launch(cfg(), k["set_cond"], cond, 2).switch(cond, 4)
    for i, body in enumerate(sw.branches):
        node = body.launch(cfg(), k["add_one"], c, 1)
        for _ in range(i):  # chained: increments of one counter must not race
            node = node.launch(cfg(), k["add_one"], c, 1)
    exe = g.instantiate()
    exe.launch(s)
    s.sync()
    assert read_ints(c, 1)[0] == 3  # only branch 2 ran
    exe.close()
    g.close()


def test_bodies_outlive_their_parent_definition_object(dev) -> None:
    from cuforge.graph import GraphDefinition

    g = GraphDefinition()
    bodies = list(g.switch(g.create_condition(0), 3).branches)
    bodies.append(g.while_loop(g.create_condition(0)).body)
    del g
    gc.collect()
    for body in bodies:
        assert body.nodes() == ()
        body.launch(cfg(), kernels()["noop"])
        assert len(body.nodes()) == 1


def test_copies_made_outside_cuforge_keep_every_owner(dev) -> None:
    """A raw cuGraphClone of ``.handle`` (not GraphDefinition.clone) holds the graph's
    owners too: kernel argument buffers, events and callbacks."""
    from cuda.bindings import driver

    from cuforge.graph import GraphDefinition

    k = kernels()
    s = dev.create_stream()
    buf = dev.allocate(4)
    write_ints(buf, [0])
    ptr = buf.handle
    seen: list[int] = []
    ev = dev.create_event()
    g = GraphDefinition()
    g.launch(cfg(), k["add_one"], buf, 1).record(ev).wait(ev).callback(lambda: seen.append(1))
    w_buf, w_ev = _weak_alloc(buf), weakref.ref(ev)
    clone = _ok(driver.cuGraphClone(g.handle))
    del buf, ev, g
    gc.collect()
    assert w_buf.alive and w_ev() is not None
    exe = _ok(driver.cuGraphInstantiate(clone, 0))
    _ok(driver.cuGraphLaunch(exe, s.handle))
    s.sync()
    assert read_ints(ptr, 1)[0] == 1 and seen == [1]
    _ok(driver.cuGraphExecDestroy(exe))
    _ok(driver.cuGraphDestroy(clone))
    assert released(lambda: not w_buf.alive and w_ev() is None)


def _weak_alloc(buf):
    from cuforge.runtime.memory import weak_handle

    return weak_handle(buf)


def test_each_executable_keeps_its_own_version_of_deleted_and_new_nodes(dev) -> None:
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    called: list[str] = []

    def old() -> None:
        called.append("old")

    def new() -> None:
        called.append("new")

    w_old, w_new = weakref.ref(old), weakref.ref(new)
    g = GraphDefinition()
    node = g.callback(old)
    first, second = g.instantiate(), g.instantiate()
    node.destroy()
    g.callback(new)
    third = g.instantiate()
    del old, new, node, g
    gc.collect()
    for exe in (first, second, third):
        exe.launch(s)
    s.sync()
    assert called == ["old", "old", "new"]  # the third never runs the deleted node
    first.close()
    gc.collect()
    assert w_old() is not None  # the second still runs it
    second.close()
    gc.collect()
    # Owners go with the definition version that had them (one bundle list per
    # version): the third was made from a later version of the same graph, which
    # still carries the deleted node's bundle -- kept longer, never too short.
    assert w_old() is not None and w_new() is not None
    third.close()
    assert released(lambda: w_old() is None and w_new() is None)


def test_raw_operands_with_buffer_owners_survive_the_buffers_close(dev) -> None:
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    src, dst, out = dev.allocate(16), dev.allocate(16), dev.allocate(16)
    w_src, w_dst = _weak_alloc(src), _weak_alloc(dst)
    g = GraphDefinition()
    g.memset(src.handle, 0xCD, 16, dst_owner=src).memcpy(
        dst.handle, src.handle, 16, dst_owner=dst, src_owner=src
    ).memcpy(out, dst.handle, 16)
    src.close()
    dst.close()  # the graph holds both allocations, not the closed wrappers
    gc.collect()
    assert w_src.alive and w_dst.alive
    exe = g.instantiate()
    g.close()
    exe.launch(s)
    s.sync()
    assert (read_ints(out, 4) == np.int32(-0x32323233)).all()  # 0xCDCDCDCD
    exe.close()
    assert released(lambda: not w_src.alive and not w_dst.alive)
    g2 = GraphDefinition()
    with pytest.raises(ValueError, match="owner Buffer is closed"):
        g2.memset(out.handle, 0, 16, dst_owner=src)
    g2.close()


def test_owner_objects_go_with_the_graph(dev) -> None:
    from cuforge.graph import GraphDefinition

    class Sentinel:
        pass

    buf = dev.allocate(8)
    a, b = Sentinel(), Sentinel()
    wa, wb = weakref.ref(a), weakref.ref(b)
    g = GraphDefinition()
    g.memcpy(buf.handle, buf.handle + 4, 4, dst_owner=a, src_owner=b)
    del a, b
    gc.collect()
    assert wa() is not None and wb() is not None
    g.close()
    assert released(lambda: wa() is None and wb() is None)


def test_sixty_four_releases_all_run_on_the_main_thread(dev) -> None:
    from cuforge.graph import GraphDefinition

    threads: list[int] = []

    class Recording:
        def __call__(self) -> None:
            pass

        def __del__(self) -> None:
            threads.append(threading.get_ident())

    graphs = []
    for _ in range(64):
        g = GraphDefinition()
        g.callback(Recording())
        graphs.append(g)
    del g, graphs
    assert released(lambda: len(threads) == 64)
    assert set(threads) == {threading.main_thread().ident}


def test_kernel_and_event_stay_usable_after_their_names_go(dev) -> None:
    from cuforge import Program, ProgramOptions
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    src = 'extern "C" __global__ void bump(int *p) { p[0] += 5; }'
    code = Program(src, "c++", ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin")
    kernel = code.get_kernel("bump")
    buf = dev.allocate(4)
    write_ints(buf, [0])
    ev = dev.create_event()
    g = GraphDefinition()
    g.launch(cfg(), kernel, buf).record(ev)
    w_kernel = weakref.ref(kernel)
    del kernel, code, ev
    gc.collect()
    assert w_kernel() is not None
    exe = g.instantiate()
    g.close()
    exe.launch(s)
    s.sync()
    assert read_ints(buf, 1)[0] == 5
    exe.close()
    assert released(lambda: w_kernel() is None)


def test_integration_loop_branches_child_events_and_graph_memory(dev) -> None:
    """A while loop whose body halves an interval through an IF/ELSE (bisection for
    sqrt(2)), fed by graph memory set by a child graph, timed by event nodes, read
    back to pinned memory and checked in a host callback."""
    import ctypes

    from cuforge import EventOptions, PinnedMemoryResource, Program, ProgramOptions
    from cuforge.graph import GraphDefinition

    src = r"""
    typedef unsigned long long cond_t;
    extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cond_t h, unsigned v);
    extern "C" __global__ void probe(float *lo, float *hi, cond_t c) {
        float mid = 0.5f * (*lo + *hi);
        cudaGraphSetConditional(c, mid * mid > 2.0f ? 1u : 0u);
    }
    extern "C" __global__ void take_lower(float *lo, float *hi) { *hi = 0.5f * (*lo + *hi); }
    extern "C" __global__ void take_upper(float *lo, float *hi) { *lo = 0.5f * (*lo + *hi); }
    extern "C" __global__ void tick(int *n, cond_t c) { cudaGraphSetConditional(c, --*n > 0); }
    """
    code = Program(src, "c++", ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin")
    probe, lower, upper, tick = (code.get_kernel(n) for n in ("probe", "take_lower",
                                                                "take_upper", "tick"))  # fmt: skip
    host = PinnedMemoryResource(dev).allocate(4)
    got: list[float] = []
    start, end = (dev.create_event(EventOptions(enable_timing=True)) for _ in range(2))
    g = GraphDefinition()
    lo, hi, n = g.allocate(4), g.allocate(4), g.allocate(4)
    init = GraphDefinition()
    init.memset(lo.dptr, np.float32(0.0), 1).memset(hi.dptr, np.float32(2.0), 1).memset(
        n.dptr, np.int32(30), 1
    )
    loop_cond, side = g.create_condition(1), g.create_condition(0)
    loop = g.join(lo, hi, n).embed(init).record(start).while_loop(loop_cond)
    step = loop.body.launch(cfg(), probe, lo.dptr, hi.dptr, side).if_else(side)
    step.then.launch(cfg(), lower, lo.dptr, hi.dptr)
    step.else_.launch(cfg(), upper, lo.dptr, hi.dptr)
    step.launch(cfg(), tick, n.dptr, loop_cond)
    loop.record(end).memcpy(host, lo.dptr, 4).callback(
        lambda: got.append(ctypes.c_float.from_address(host.handle).value)
    ).deallocate(lo).deallocate(hi).deallocate(n)
    exe = g.instantiate()
    init.close()
    g.close()
    s = dev.create_stream()
    exe.launch(s)
    s.sync()
    assert len(got) == 1 and abs(got[0] - 2**0.5) < 1e-5
    assert (end - start) >= 0.0
    exe.close()


def test_raising_callback_is_reported_and_the_graph_goes_on(dev, monkeypatch) -> None:
    import ctypes
    import sys

    from cuforge.graph import GraphDefinition

    records: list = []
    monkeypatch.setattr(sys, "unraisablehook", records.append)
    s = dev.create_stream()
    buf, out = dev.allocate(16), dev.allocate(16)
    payload = ctypes.create_string_buffer(b"\x5a\x00\x00\x00")
    seen: list[tuple[int, int]] = []

    @HOSTFN
    def read_raw(p):
        seen.append((p, ctypes.cast(p, ctypes.POINTER(ctypes.c_uint8))[0]))

    def throws() -> None:
        raise RuntimeError("callback raised")

    g = GraphDefinition()
    g.memset(buf, 0x33, 16).callback(throws).memcpy(out, buf, 16).callback(
        read_raw,
        user_data=ctypes.addressof(payload),  # an int: the caller's pointer
    )
    exe = g.instantiate()
    g.close()
    exe.launch(s)
    s.sync()
    assert [r.exc_type for r in records] == [RuntimeError]
    assert "callback raised" in str(records[0].exc_value)
    assert (read_ints(out, 4) == 0x33333333).all()  # the nodes after it ran
    assert seen == [(ctypes.addressof(payload), 0x5A)]
    exe.close()
