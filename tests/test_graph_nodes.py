"""Node kinds beyond the basics: cluster/cooperative kernels, array copy operands and
their extents, SWITCH and nested conditionals, child-node updates, one context per graph.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    cfg,
    expect_raises,
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


def _run(g, stream) -> None:
    exe = g.instantiate()
    exe.launch(stream)
    stream.sync()
    exe.close()


def test_cluster_kernel_node_and_its_updates(dev) -> None:
    from cuforge import LaunchConfig
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    out = dev.allocate(4 * 4)
    write_ints(out, [0] * 4)
    g = GraphDefinition()
    clustered = LaunchConfig(grid=2, block=32, cluster=2)  # 2 clusters of 2 blocks
    node = g.launch(clustered, k["cluster_size"], out)
    assert node.launch_attributes == ((2, 1, 1), False)
    exe = g.instantiate()
    exe.launch(stream)
    stream.sync()
    assert list(read_ints(out, 4)) == [2, 2, 2, 2]

    # An exec update cannot change launch attributes; the definition can.
    plain = LaunchConfig(grid=4, block=32)
    expect_raises(ValueError, exe[node].update, plain, k["cluster_size"], out)
    exe.close()
    node.update(plain, k["cluster_size"], out)
    assert node.launch_attributes[0] in ((0, 0, 0), (1, 1, 1))
    write_ints(out, [0] * 4)
    _run(g, stream)
    assert list(read_ints(out, 4)) == [1, 1, 1, 1]
    node.update(LaunchConfig(grid=1, block=32, cluster=4), k["cluster_size"], out)
    assert node.launch_attributes == ((4, 1, 1), False)
    write_ints(out, [0] * 4)
    _run(g, stream)
    assert list(read_ints(out, 4)) == [4, 4, 4, 4]
    g.close()


def test_cooperative_kernel_node(dev) -> None:
    from cuforge import LaunchConfig
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    buf = dev.allocate(64 * 4)
    write_ints(buf, np.arange(64))
    g = GraphDefinition()
    node = g.launch(LaunchConfig(grid=2, block=32, cooperative_launch=True), k["add_one"], buf, 64)
    assert node.launch_attributes == ((0, 0, 0), True)
    _run(g, stream)
    assert (read_ints(buf, 64) == np.arange(64) + 1).all()
    g.close()


class DLPackOnly:
    """A device array reachable only through DLPack (no __cuda_array_interface__)."""

    def __init__(self, tensor) -> None:
        self._t = tensor

    def __dlpack__(self, stream=None):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def test_array_copy_operands_are_retained_and_bounded(dev) -> None:
    torch = pytest.importorskip("torch")
    from cuforge.graph import GraphDefinition

    stream = dev.create_stream()
    dst = dev.allocate(64)
    t = torch.arange(16, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    src = DLPackOnly(t)
    w_src = weakref.ref(src)
    g = GraphDefinition()
    expect_raises(ValueError, g.memcpy, dst, src, 128)  # more than either operand holds
    expect_raises(ValueError, g.memset, dst, 0, 65)
    expect_raises(ValueError, g.memset, dst, b"\0\0\0\0", 8, 3)  # 2 rows of 32 + 32 bytes
    g.memcpy(dst, src, 64)
    del src, t
    gc.collect()
    assert w_src() is not None  # the node holds the array (and so the tensor)
    _run(g, stream)
    assert list(read_ints(dst, 16)) == list(range(16))
    g.close()
    assert released(lambda: w_src() is None)

    # A CUDA-array-interface array (torch) as a memcpy destination.
    t2 = torch.zeros(16, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    g = GraphDefinition()
    expect_raises(ValueError, g.memcpy, t2, dst, 65)
    g.memcpy(t2, dst, 64)
    _run(g, stream)
    assert t2.cpu().tolist() == list(range(16))
    g.close()
    del t2
    torch.cuda.empty_cache()  # hand torch's cached segment back (a leak to the sanitizer)


def test_switch_selects_one_branch_and_exec_update_retargets(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    hits = dev.allocate(3 * 4)
    write_ints(hits, [0, 0, 0])
    g = GraphDefinition()
    cond = g.create_condition()
    setter = g.launch(cfg(), k["set_cond"], int(cond), 1)
    sw = setter.switch(cond, 3)
    assert len(sw.branches) == 3
    for i, body in enumerate(sw.branches):
        body.launch(cfg(), k["add_one"], hits.handle + 4 * i, 1)
    exe = g.instantiate()
    exe.launch(stream)
    stream.sync()
    assert list(read_ints(hits, 3)) == [0, 1, 0]
    exe[setter].update(cfg(), k["set_cond"], int(cond), 2)
    exe.launch(stream)
    exe[setter].update(cfg(), k["set_cond"], int(cond), 7)  # no such branch: none runs
    exe.launch(stream)
    stream.sync()
    assert list(read_ints(hits, 3)) == [0, 1, 1]
    exe.close()
    g.close()


def test_nested_conditionals_if_inside_while(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    counter, inner = dev.allocate(4), dev.allocate(4)
    write_ints(counter, [0])
    write_ints(inner, [0])
    g = GraphDefinition()
    loop_cond = g.create_condition(default_value=1)
    loop = g.while_loop(loop_cond)
    body = loop.body
    if_cond = body.create_condition()
    step = body.launch(cfg(), k["count_while"], counter, int(loop_cond), 6)
    step.launch(cfg(), k["set_cond"], int(if_cond), 1).if_then(if_cond).body.launch(
        cfg(), k["add_one"], inner, 1
    )
    _run(g, stream)
    assert read_ints(counter, 1)[0] == 6 and read_ints(inner, 1)[0] == 6
    g.close()


def test_child_node_update_in_the_definition(dev) -> None:
    from cuforge.graph import GraphDefinition

    stream = dev.create_stream()
    first, second = dev.allocate(64), dev.allocate(64)
    write_ints(first, [0] * 16)
    write_ints(second, [0] * 16)
    w_second = weakref.ref(second.allocation)
    second_ptr = second.handle
    a = GraphDefinition()
    a.memset(first, 1, 64)
    parent = GraphDefinition()
    node = parent.embed(a)
    old = parent.instantiate()  # keeps running a's contents

    b = GraphDefinition()  # another topology: two nodes
    b.memset(second, 2, 64).memset(second, 3, 32)
    node.update(b)
    b.close()
    second.close()  # the parent's new version keeps the memory
    gc.collect()
    assert w_second() is not None
    _run(parent, stream)
    got = read_ints(second_ptr, 16)
    assert (got[:8] == 0x03030303).all() and (got[8:] == 0x02020202).all()
    assert (read_ints(first, 16) == 0).all()
    old.launch(stream)
    stream.sync()
    assert (read_ints(first, 16) == 0x01010101).all()
    old.close()
    parent.close()
    assert released(lambda: w_second() is None)


def _second_context(dev):
    from cuda.bindings import driver

    try:
        err, ctx = driver.cuCtxCreate(None, 0, dev._cu_device)
    except TypeError:  # older bindings: cuCtxCreate(flags, dev)
        err, ctx = driver.cuCtxCreate(0, dev._cu_device)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    driver.cuCtxPopCurrent()  # cuCtxCreate pushed it
    return ctx


def test_graphs_do_not_mix_contexts(dev) -> None:
    from cuda.bindings import driver

    from cuforge.graph import GraphBuilder, GraphDefinition

    ctx = _second_context(dev)
    try:
        driver.cuCtxPushCurrent(ctx)
        try:
            foreign = GraphDefinition()
            foreign.empty()
        finally:
            driver.cuCtxPopCurrent()
        assert foreign._state.device_id == dev.device_id
        g = GraphDefinition()
        g.empty()
        with pytest.raises(ValueError, match="context"):
            g.embed(foreign)
        exe = g.instantiate()
        with pytest.raises(ValueError, match="context"):
            exe.update(foreign)
        exe.close()

        s1, s2 = dev.create_stream(), dev.create_stream()
        b1 = GraphBuilder(s1).begin_building()
        b2 = GraphBuilder(s2).begin_building()
        with pytest.raises(ValueError, match="same capture"):
            GraphBuilder.join(b1, b2)
        with pytest.raises(ValueError, match="context"):
            b1.embed(foreign)
        b1.close()
        b2.close()
        foreign.close()
        g.close()
    finally:
        driver.cuCtxDestroy(ctx)
