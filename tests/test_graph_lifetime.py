"""Graph attachments: what nodes use stays alive exactly as long as CUDA may use it.

Every test drops or closes the Python objects a node references before the graph
runs, then checks results on the device and that the owners go once the graph,
its clones, its executables and their launches are gone (bounded polling).
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    HOSTFN,
    cfg,
    expect_raises,
    kernels,
    no_leftover_bundles,
    read_ints,
    released,
    setup_device,
    write_ints,
)


@pytest.fixture
def dev():
    return setup_device()


pytestmark = pytest.mark.gpu

N = 256


def _weak(buf):
    from cuforge.runtime.memory import weak_handle

    return weak_handle(buf)


def test_dropped_args_callbacks_user_data_and_operands_run_correctly(dev) -> None:
    from cuforge.graph import GraphDefinition, live_bundles

    k = kernels()
    stream = dev.create_stream()
    out = dev.allocate(N * 4)
    base = live_bundles()
    g = GraphDefinition()
    work = dev.allocate(N * 4)
    w_work = _weak(work)
    n1 = g.memset(work, 0, N * 4)  # byte memset over the whole buffer
    n2 = n1.launch(cfg(1, N), k["add_one"], work, N)
    n3 = n2.launch(cfg(1, N), k["add_one"], work, N)
    n4 = n3.memcpy(out, work, N * 4)
    work.close()
    del work

    seen: list[int] = []
    n5 = n4.callback(lambda: seen.append(1))  # the lambda has no other reference

    got: list[bytes] = []
    fnptr = HOSTFN(lambda p: got.append(__import__("ctypes").string_at(p, 5)))
    w_fnptr = weakref.ref(fnptr)
    data = bytearray(b"hello")
    n5.callback(fnptr, user_data=data)
    data[:] = b"XXXXX"  # the node holds a private copy
    del fnptr
    gc.collect()
    assert w_work.alive and w_fnptr() is not None

    exe = g.instantiate()
    g.close()
    exe.launch(stream)
    stream.sync()
    assert (read_ints(out, N) == 2).all()
    assert seen == [1] and got == [b"hello"]

    exe.close()
    assert released(lambda: not w_work.alive and w_fnptr() is None)
    assert released(lambda: live_bundles() <= base)


def test_owners_outlive_definition_clone_and_exec_until_all_gone(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    buf = dev.allocate(4)
    write_ints(buf, [0])
    w = _weak(buf)
    g = GraphDefinition()
    g.launch(cfg(), k["add_one"], buf, 1)
    keep_ptr = buf.handle
    del buf
    c = g.clone()
    exe = c.instantiate()
    g.close()
    assert released(lambda: True) and w.alive  # c and exe still hold it
    c.close()
    gc.collect()
    assert w.alive  # exe still holds it
    exe.launch(stream)
    exe.launch(stream)
    stream.sync()
    assert read_ints(keep_ptr, 1)[0] == 2
    exe.close()
    assert released(lambda: not w.alive)


def test_definition_update_while_exec_in_flight_keeps_old_owners(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    a, b = dev.allocate(4), dev.allocate(4)
    write_ints(a, [0])
    write_ints(b, [0])
    wa = _weak(a)
    g = GraphDefinition()
    node = g.launch(cfg(), k["spin_add"], a, 200_000_000)  # ~200 ms
    exe = g.instantiate()
    exe.launch(stream)  # in flight, using a
    node.update(cfg(), k["spin_add"], b, 1000)
    g.close()
    a_ptr = a.handle
    del a
    exe.close()  # CUDA frees it after the launch; the launch still uses a
    gc.collect()
    # Only CUDA's in-flight launch holds a now. Hold it ourselves for the read below:
    # once the launch ends, the release may run at any moment and free a_ptr.
    held = wa._ref()
    assert held is not None
    stream.sync()
    assert read_ints(a_ptr, 1)[0] == 1
    del held
    assert released(lambda: not wa.alive)
    del b


def test_exec_node_update_in_flight_then_idle_prunes(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    a, b, c, d = (dev.allocate(4) for _ in range(4))
    for x in (a, b, c, d):
        write_ints(x, [0])
    g = GraphDefinition()
    node = g.launch(cfg(), k["spin_add"], a, 1000)
    exe = g.instantiate()
    view = exe[node]  # exec node updates name nodes of the (open) source definition
    view.update(cfg(), k["spin_add"], b, 200_000_000)
    wb, b_ptr = _weak(b), b.handle
    del b
    exe.launch(stream)  # ~200 ms on b
    view.update(cfg(), k["spin_add"], c, 1000)  # in flight: b must stay
    gc.collect()
    assert wb.alive
    stream.sync()
    assert read_ints(b_ptr, 1)[0] == 1
    view.update(cfg(), k["spin_add"], d, 1000)  # idle now: superseded b may go
    assert released(lambda: not wb.alive)
    exe.launch(stream)
    stream.sync()
    assert read_ints(d, 1)[0] == 1 and read_ints(c, 1)[0] == 0
    g.close()
    expect_raises(ValueError, view.update, cfg(), k["spin_add"], c, 1000)
    exe.close()
    del a


def test_launch_before_any_exec_update_keeps_the_instantiated_owners(dev) -> None:
    """Launches made before the first exec node update record no idle event; the
    versions set later are never used by them, so pruning stays correct."""
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    a, b, c = (dev.allocate(4) for _ in range(3))
    for x in (a, b, c):
        write_ints(x, [0])
    wa, wb, a_ptr = _weak(a), _weak(b), a.handle
    g = GraphDefinition()
    node = g.launch(cfg(), k["spin_add"], a, 200_000_000)
    del a
    exe = g.instantiate()
    exe.launch(stream)  # ~200 ms on a
    exe[node].update(cfg(), k["spin_add"], b, 1000)
    del b
    exe[node].update(cfg(), k["spin_add"], c, 1000)  # b was never launched: it may go
    assert released(lambda: not wb.alive)
    assert wa.alive  # the running launch's own parameters stay
    stream.sync()
    assert read_ints(a_ptr, 1)[0] == 1  # (b's memory is gone: it must not be read)
    exe.launch(stream)
    stream.sync()
    assert read_ints(c, 1)[0] == 1
    exe.close()
    g.close()
    assert released(lambda: not wa.alive)


def test_failed_exec_update_rolls_back(dev) -> None:
    from cuforge import CUDAError
    from cuforge.graph import GraphDefinition

    stream = dev.create_stream()
    dst = dev.allocate(64)
    other = dev.allocate(64)
    wo = _weak(other)
    g = GraphDefinition()
    node = g.memset(dst, 7, 64)
    exe = g.instantiate()
    expect_raises(CUDAError, exe[node].update, other, 9, 16, 2)  # 2-D update of 1-D memset
    expect_raises(TypeError, exe[node].update, object(), 9, 64)
    del other
    assert released(lambda: not wo.alive)  # the refused update retained nothing
    exe.launch(stream)
    stream.sync()
    assert (read_ints(dst, 16) == 0x07070707).all()

    # Whole-graph update with another topology is refused; the exec keeps working.
    g2 = GraphDefinition()
    g2.memset(dst, 1, 64).memset(dst, 2, 64)
    with pytest.raises(CUDAError):
        exe.update(g2)
    write_ints(dst, [0] * 16)
    exe.launch(stream)
    stream.sync()
    assert (read_ints(dst, 16) == 0x07070707).all()
    exe.close()


def test_child_embedding_and_clone_carry_owners(dev) -> None:
    from cuforge.graph import GraphDefinition

    stream = dev.create_stream()
    target = dev.allocate(64)
    w = _weak(target)
    t_ptr = target.handle
    child = GraphDefinition()
    child.memset(target, 3, 64)
    del target
    parent = GraphDefinition()
    parent.embed(child)
    child.close()
    twin = parent.clone()
    parent.close()
    gc.collect()
    assert w.alive
    exe = twin.instantiate()
    twin.close()
    exe.launch(stream)
    stream.sync()
    assert (read_ints(t_ptr, 16) == 0x03030303).all()
    exe.close()
    assert released(lambda: not w.alive)


def test_capture_retains_callbacks_only(dev) -> None:
    k = kernels()
    stream = dev.create_stream()
    captured = dev.allocate(4)
    wc = _weak(captured)
    seen: list[int] = []

    def cb() -> None:
        seen.append(1)

    wcb = weakref.ref(cb)
    gb = stream.create_graph_builder()
    gb.begin_building()
    from cuforge import launch

    launch(gb, cfg(), k["noop"])
    gb.callback(cb)
    del cb
    gb.end_building()
    exe = gb.complete()
    gb.close()
    gc.collect()
    assert wcb() is not None
    exe.launch(stream)
    stream.sync()
    assert seen == [1]
    # Captured operations are caller-owned: the builder kept nothing of `captured`.
    del captured
    gc.collect()
    assert not wc.alive
    exe.close()
    assert released(lambda: wcb() is None)


def test_memcpy_memset_owner_rules(dev) -> None:
    from cuforge.graph import GraphDefinition

    stream = dev.create_stream()
    src, dst = dev.allocate(64), dev.allocate(64)
    g = GraphDefinition()
    expect_raises(ValueError, lambda: g.memcpy(dst, src, 64, dst_owner=object()))
    expect_raises(ValueError, lambda: g.memcpy(dst, src, 64, src_owner=object()))
    expect_raises(ValueError, lambda: g.memset(dst, 0, 64, dst_owner=object()))

    class Owner:
        pass

    owner = Owner()
    wo = weakref.ref(owner)
    g.memset(src, 5, 64).memcpy(dst.handle, src.handle, 64, dst_owner=owner)
    del owner
    gc.collect()
    assert wo() is not None
    exe = g.instantiate()
    g.close()
    exe.launch(stream)
    stream.sync()
    assert (read_ints(dst, 16) == 0x05050505).all()
    exe.close()
    assert released(lambda: wo() is None)


def test_retained_memory_is_valid_under_sanitizer(dev) -> None:
    """Closed Buffers used by kernel and copy nodes are still valid memory at launch."""
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    out = dev.allocate(N * 4)
    g = GraphDefinition()
    for _ in range(3):
        tmp = dev.allocate(N * 4)
        write_ints(tmp, np.arange(N))
        g.launch(cfg(1, N), k["add_one"], tmp, N).memcpy(out, tmp, N * 4)
        tmp.close()
    del tmp
    exe = g.instantiate()
    del g
    exe.launch(stream)
    stream.sync()
    assert (read_ints(out, N) == np.arange(N) + 1).all()
    exe.close()


def test_exec_closed_during_a_launch_keeps_its_update_owners_until_the_launch_ends(dev) -> None:
    """An exec node update's owners belong to the exec; closing the exec while a
    launch that uses them runs must not free them before that launch ends."""
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    a, b = dev.allocate(4), dev.allocate(4)
    write_ints(a, [0])
    write_ints(b, [0])
    g = GraphDefinition()
    node = g.launch(cfg(), k["spin_add"], a, 1000)
    exe = g.instantiate()
    exe[node].update(cfg(), k["spin_add"], b, 300_000_000)  # ~300 ms on b
    wb, b_ptr = _weak(b), b.handle
    del b
    exe.launch(stream)
    exe.close()
    g.close()
    gc.collect()
    assert wb.alive, "closing the exec freed what its running launch uses"
    held = wb._ref()  # hold it for the read below (it may go as soon as the launch ends)
    stream.sync()
    assert read_ints(b_ptr, 1)[0] == 1
    del held
    assert released(lambda: not wb.alive)
    del a


def test_whole_graph_update_during_a_launch_keeps_the_old_update_owners(dev) -> None:
    from cuforge.graph import GraphDefinition

    k = kernels()
    stream = dev.create_stream()
    a, b, c = (dev.allocate(4) for _ in range(3))
    for x in (a, b, c):
        write_ints(x, [0])
    g = GraphDefinition()
    node = g.launch(cfg(), k["spin_add"], a, 1000)
    exe = g.instantiate()
    exe[node].update(cfg(), k["spin_add"], b, 300_000_000)
    wb, b_ptr = _weak(b), b.handle
    del b
    exe.launch(stream)  # ~300 ms on b
    g2 = GraphDefinition()
    g2.launch(cfg(), k["spin_add"], c, 1000)
    exe.update(g2)  # replaces every parameter; the running launch still reads b
    g2.close()
    gc.collect()
    assert wb.alive
    held = wb._ref()
    stream.sync()
    assert read_ints(b_ptr, 1)[0] == 1
    del held
    assert released(lambda: not wb.alive)
    exe.launch(stream)
    stream.sync()
    assert read_ints(c, 1)[0] == 1 and read_ints(a, 1)[0] == 0
    exe.close()
    g.close()
    del a, c
