"""Memory of one device used by another: the documented switches, the errors that
name them, and copies and kernels across two devices (issue 11, section 3).

The two-device tests need devices 0 and 1 with peer capability (the two-H200
machine); the rest run on any GPU machine.
"""

from __future__ import annotations

import numpy as np
import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    cfg,
    kernels,
    no_leftover_bundles,
    read_ints,
    write_ints,
)

pytestmark = pytest.mark.gpu
N = 1024  # ints


def test_peer_capability_and_access_switches_validate_their_arguments() -> None:
    from cuda.bindings import driver

    from cuforge import Device
    from cuforge.runtime.init import device_count

    d0 = Device(0)
    assert d0.can_access_peer(d0) and d0.can_access_peer(0)
    for i in range(1, device_count()):
        expected = driver.cuDeviceCanAccessPeer(d0._cu_device, Device(i)._cu_device)[1]
        assert d0.can_access_peer(i) is bool(expected)
    with pytest.raises(TypeError, match="Device or a device ordinal"):
        d0.can_access_peer("1")
    mr = d0.memory_resource
    with pytest.raises(ValueError, match="its own pool"):
        mr.peer_accessible_by = [0]
    with pytest.raises(TypeError, match="Devices or ordinals"):
        mr.peer_accessible_by = ["1"]
    assert isinstance(mr.peer_accessible_by, tuple)
    d0.enable_peer_access(d0)  # its own memory: nothing to do


@pytest.fixture
def pair():
    """Devices 0 and 1 with no pool access granted either way (restored after)."""
    from cuforge import Device
    from cuforge.runtime.init import device_count

    if device_count() < 2:
        pytest.skip("needs two devices")
    d0, d1 = Device(0), Device(1)
    if not (d0.can_access_peer(d1) and d1.can_access_peer(d0)):
        pytest.skip("devices 0 and 1 cannot access each other")
    kernels()  # compiled and loaded (the library serves both devices)
    saved = (d0.memory_resource.peer_accessible_by, d1.memory_resource.peer_accessible_by)
    d0.memory_resource.peer_accessible_by = []
    d1.memory_resource.peer_accessible_by = []
    yield d0, d1
    d0.memory_resource.peer_accessible_by = saved[0]
    d1.memory_resource.peer_accessible_by = saved[1]
    d0.set_current()


def _filled(dev, stream, values):
    buf = dev.allocate(4 * len(values), stream)
    stream.sync()
    _write(buf, values)
    return buf


def _write(buf, values) -> None:
    """Host -> a device's pool memory, in that device's context (the other device may
    not access the pool: that is what some tests check)."""
    with buf.device._scope():
        write_ints(buf, values)


def _read(buf_or_ptr, n, dev):
    with dev._scope():
        return read_ints(buf_or_ptr, n)


def test_copies_between_devices_without_access_say_what_to_call(pair) -> None:
    from cuforge import CUDAError
    from cuforge.graph import GraphDefinition

    d0, d1 = pair
    s0, s1 = d0.create_stream(), d1.create_stream()
    a = _filled(d0, s0, np.arange(N))
    b = _filled(d1, s1, np.zeros(N))
    with pytest.raises(
        CUDAError, match=r"Device\(0\)\.memory_resource\.peer_accessible_by = \[1\]"
    ):
        b.copy_from(a, stream=s1)
    d1.set_current()
    g = GraphDefinition()  # a device-1 graph
    with pytest.raises(
        CUDAError, match=r"Device\(0\)\.memory_resource\.peer_accessible_by = \[1\]"
    ):
        g.memcpy(b, a, 4 * N)
    g.close()
    a.close(s0)
    b.close(s1)


def test_peer_copies_both_ways_on_streams_and_in_graphs(pair) -> None:
    from cuforge.graph import GraphDefinition

    d0, d1 = pair
    d0.memory_resource.peer_accessible_by = [1]
    d1.memory_resource.peer_accessible_by = [0]
    assert d0.memory_resource.peer_accessible_by == (1,)
    assert d1.memory_resource.peer_accessible_by == (0,)
    rng = np.random.default_rng()
    s0, s1 = d0.create_stream(), d1.create_stream()
    src0 = rng.integers(-(2**31), 2**31, N, dtype=np.int64)
    src1 = rng.integers(-(2**31), 2**31, N, dtype=np.int64)
    a = _filled(d0, s0, src0)
    b = _filled(d1, s1, src1)
    x1 = _filled(d1, s1, np.full(N, -7))
    x0 = _filled(d0, s0, np.full(N, -7))

    # On streams: 0 -> 1 on a device-1 stream, 1 -> 0 on a device-0 stream.
    x1.copy_from(a, stream=s1)
    x0.copy_from(b, stream=s0)
    s0.sync()
    s1.sync()
    assert (_read(x1, N, d1) == src0.astype(np.int32)).all()
    assert (_read(x0, N, d0) == src1.astype(np.int32)).all()

    # In graphs: a device-0 graph copies 1 -> 0, a device-1 graph copies 0 -> 1.
    for buf in (x0, x1):
        _write(buf, np.full(N, -7))
    d0.set_current()
    g0 = GraphDefinition()
    g0.memcpy(x0, b, 4 * N)
    d1.set_current()
    g1 = GraphDefinition()
    g1.memcpy(x1, a, 4 * N)
    e0, e1 = g0.instantiate(), g1.instantiate()
    g0.close()
    g1.close()
    e0.launch(s0)
    e1.launch(s1)
    s0.sync()
    s1.sync()
    assert (_read(x0, N, d0) == src1.astype(np.int32)).all()
    assert (_read(x1, N, d1) == src0.astype(np.int32)).all()
    e0.close()
    e1.close()
    for buf, s in ((a, s0), (x0, s0), (b, s1), (x1, s1)):
        buf.close(s)


def test_device1_graph_kernel_reads_and_writes_a_device0_buffer(pair) -> None:
    from cuforge.graph import GraphDefinition

    d0, d1 = pair
    d0.memory_resource.peer_accessible_by = [1]
    s0, s1 = d0.create_stream(), d1.create_stream()
    start = np.arange(N) * 3
    on0 = _filled(d0, s0, start)
    d1.set_current()
    g = GraphDefinition()
    assert g._state.device_id == 1
    block = 256
    g.launch(cfg(N // block, block), kernels()["add_one"], on0, N).launch(
        cfg(N // block, block), kernels()["add_one"], on0, N
    )
    ptr = on0.handle
    on0.close(s0)  # the graph holds the allocation from here on
    exe = g.instantiate()
    g.close()
    exe.launch(s1)
    s1.sync()
    assert (_read(ptr, N, d0) == start + 2).all()  # read while the exec still holds it
    exe.close()


def test_enable_peer_access_is_idempotent(pair) -> None:
    from cuda.bindings import driver

    d0, d1 = pair
    d0.enable_peer_access(d1)
    d0.enable_peer_access(1)
    with d0._scope():
        driver.cuCtxDisablePeerAccess(d1.context)


def test_two_devices_keep_callback_parameters_separate() -> None:
    """Host nodes of graphs on two devices: each runs its own callable with its own
    copy of user data, every launch, after the caller dropped its references."""
    import ctypes
    import gc

    from cuforge import Device
    from cuforge.graph import GraphDefinition
    from cuforge.runtime.init import device_count

    if device_count() < 2:
        pytest.skip("needs two devices")
    hostfn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    seen: list[tuple[str, int]] = []

    @hostfn
    def c_cb(data):
        seen.append(("c", ctypes.cast(data, ctypes.POINTER(ctypes.c_uint8))[0]))

    runs = []
    for ordinal in (0, 1):
        dev = Device(ordinal)
        dev.set_current()
        payload = bytearray([10 + ordinal])
        g = GraphDefinition()
        g.callback(lambda o=ordinal: seen.append(("py", o))).callback(c_cb, user_data=payload)
        exe = g.instantiate()
        g.close()
        payload[0] = 99  # each node holds its own copy, taken when it was added
        runs.append((dev, dev.create_stream(), exe))
    del c_cb, payload
    gc.collect()
    for _ in range(2):
        for _dev, stream, exe in runs:
            exe.launch(stream)
    for _dev, stream, _exe in runs:
        stream.sync()
    assert sorted(seen) == sorted([("py", 0), ("py", 1), ("c", 10), ("c", 11)] * 2)
    for dev, stream, exe in runs:
        exe.close()
        with dev._scope():
            stream.close()
    Device(0).set_current()
