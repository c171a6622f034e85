"""GPU tests of cuforge.runtime (run on the GPU machine via scripts/gpu-test).

Kernels are compiled here with the machine's own NVRTC to a cubin for the device's
arch, so the cubin always matches the driver that loads it.
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import threading
from dataclasses import dataclass, field

import numpy as np
import pytest

from conftest import device_ordinal

pytestmark = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void saxpy(float a, const float* x, const float* y, float* out,
                                 size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
extern "C" __global__ void empty() {}
extern "C" __global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
extern "C" __global__ void fill_i32(int* p, int v, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}
extern "C" __global__ void add_i32(int* p, int v, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}
extern "C" __global__ void cluster_rank(int* out) {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    if (threadIdx.x == 0) out[blockIdx.x] = (int)r;
}
"""


@dataclass
class StandInObjectCode:
    """The compile layer's ObjectCode contract, for testing the runtime on its own."""

    code: bytes
    code_type: str = "cubin"
    name: str = "runtime-test"
    symbol_mapping: dict = field(default_factory=dict)

    def __hash__(self) -> int:
        return id(self)


def nvrtc_cubin(source: str, arch: str) -> bytes:
    from cuda.bindings import nvrtc

    def ok(res):
        if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"NVRTC: {res[0]!r}")
        return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)

    prog = ok(nvrtc.nvrtcCreateProgram(source.encode(), b"runtime_test.cu", 0, [], []))
    opts = [f"-arch=sm_{arch}".encode(), b"-std=c++17"]
    res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    if res[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        size = ok(nvrtc.nvrtcGetProgramLogSize(prog))
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(log.decode(errors="replace"))
    size = ok(nvrtc.nvrtcGetCUBINSize(prog))
    cubin = b" " * size
    ok(nvrtc.nvrtcGetCUBIN(prog, cubin))
    nvrtc.nvrtcDestroyProgram(prog)
    return cubin


@pytest.fixture(scope="module")
def dev():
    from cuforge import Device

    d = Device(device_ordinal())
    d.set_current()
    return d


@pytest.fixture(scope="module")
def code(dev):
    return StandInObjectCode(nvrtc_cubin(SOURCE, dev.arch))


@pytest.fixture(scope="module")
def kernels(code):
    from cuforge.runtime.module import load_kernel

    names = ("saxpy", "empty", "spin", "fill_i32", "add_i32", "cluster_rank")
    return {n: load_kernel(code, n) for n in names}


def host_view(buf, dtype, count):
    """A numpy array over a pinned host Buffer."""
    raw = (ctypes.c_char * buf.size).from_address(buf.handle)
    return np.frombuffer(raw, dtype=dtype, count=count)


def to_device(dev, stream, array):
    from cuforge import PinnedMemoryResource

    pinned = PinnedMemoryResource(dev).allocate(array.nbytes)
    host_view(pinned, array.dtype, array.size)[:] = array
    buf = dev.allocate(array.nbytes, stream)
    buf.copy_from(pinned, stream=stream)
    stream.sync()
    pinned.close()
    return buf


def to_host(dev, stream, buf, dtype, count):
    from cuforge import PinnedMemoryResource

    pinned = PinnedMemoryResource(dev).allocate(buf.size)
    buf.copy_to(pinned, stream=stream)
    stream.sync()
    out = host_view(pinned, dtype, count).copy()
    pinned.close()
    return out


def foreign(obj):
    """A cuforge Stream over a torch/CuPy stream, by protocol when the library has it."""
    from cuforge import Stream

    if hasattr(obj, "__cuda_stream__"):
        return Stream.from_foreign(obj)
    raw = getattr(obj, "cuda_stream", None) or obj.ptr
    return Stream.from_handle(raw, owner=obj)


def grid_for(n, block=256):
    return (n + block - 1) // block


# --- device --------------------------------------------------------------------------
def test_device_identity_and_properties(dev):
    from cuforge import CUDAError, Device

    assert Device(dev.device_id) is dev and Device() is dev
    major, minor = dev.compute_capability
    assert dev.arch == f"{major}{minor}"
    assert isinstance(dev.name, str) and dev.name
    assert len(dev.uuid) == 36 and dev.uuid.count("-") == 4
    assert dev.properties.multiprocessor_count > 0
    assert dev.properties.max_threads_per_block >= 1024
    with pytest.raises(AttributeError):
        _ = dev.properties.no_such_attribute
    with pytest.raises(CUDAError, match="invalid device id 999"):
        Device(999)
    with pytest.raises(TypeError):
        Device("0")
    dev.sync()


def test_current_device_is_per_thread(dev):
    from cuda.bindings import driver

    from cuforge import Device

    seen = {}

    def worker():
        seen["ctx_before"] = int(driver.cuCtxGetCurrent()[1])
        seen["device"] = Device()
        s = dev.create_stream()  # adopts the device on a context-less thread
        seen["ctx_after"] = int(driver.cuCtxGetCurrent()[1])
        s.close()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["ctx_before"] == 0
    assert seen["device"] is Device(0)  # a thread without a context: device 0
    assert seen["ctx_after"] == int(dev.context)


# --- kernels and launch --------------------------------------------------------------
def test_kernel_loading_and_attributes(code, kernels, dev):
    from cuda.bindings import driver

    from cuforge.runtime.module import load_kernel

    k = kernels["saxpy"]
    assert load_kernel(code, "saxpy") is k
    assert k.num_arguments == 5
    assert k.param_sizes == (4, 8, 8, 8, 8)
    assert k.attributes.num_regs() > 0
    assert k.attributes.max_threads_per_block() >= 256
    assert k.attributes.shared_size_bytes() == 0
    assert k.attributes.max_dynamic_shared_size_bytes() >= 0
    fn = k.function()
    assert isinstance(fn, driver.CUfunction) and int(fn) != 0
    assert int(k.handle) != 0
    from cuforge import CUDAError

    with pytest.raises(CUDAError, match="CUDA_ERROR_NOT_FOUND"):
        load_kernel(code, "no_such_kernel")


def test_saxpy_on_buffers(dev, kernels):
    from cuforge import LaunchConfig, launch

    rng = np.random.default_rng()
    n = 100_003
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    a = np.float32(rng.standard_normal())
    s = dev.create_stream()
    dx, dy = to_device(dev, s, x), to_device(dev, s, y)
    out = dev.allocate(x.nbytes, s)
    launch(s, LaunchConfig(grid_for(n), 256), kernels["saxpy"], a, dx, dy, out, n)
    got = to_host(dev, s, out, np.float32, n)
    np.testing.assert_allclose(got, a * x + y, rtol=1e-6, atol=1e-6)
    for b in (dx, dy, out):
        b.close(s)
    s.close()


def test_saxpy_on_torch_tensors(dev, kernels):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from cuforge import LaunchConfig, launch

    rng = np.random.default_rng()
    n = 65_537
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    a = np.float32(1.75)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    tout = torch.empty_like(tx)
    s = foreign(torch.cuda.current_stream())
    launch(s, LaunchConfig(grid_for(n), 256), kernels["saxpy"], a, tx, ty, tout, n)
    np.testing.assert_allclose(tout.cpu().numpy(), a * x + y, rtol=1e-6, atol=1e-6)


def test_saxpy_on_cupy_arrays(dev, kernels):
    cp = pytest.importorskip("cupy", reason="cupy is not installed")
    from cuforge import LaunchConfig, launch

    rng = np.random.default_rng()
    n = 40_000
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    a = np.float32(-0.5)
    cx, cy = cp.asarray(x), cp.asarray(y)
    cout = cp.empty_like(cx)
    cs = cp.cuda.Stream(non_blocking=True)
    with cs:
        launch(foreign(cs), LaunchConfig(grid_for(n), 256), kernels["saxpy"], a, cx, cy, cout, n)
        got = cp.asnumpy(cout)
    np.testing.assert_allclose(got, a * x + y, rtol=1e-6, atol=1e-6)


def test_launch_from_a_thread_without_context(dev, kernels):
    from cuforge import LaunchConfig, launch

    s = dev.create_stream()
    buf = dev.allocate(4 * 1024, s)
    errors = []

    def worker():
        try:
            launch(s, LaunchConfig(4, 256), kernels["fill_i32"], buf, 7, 1024)
            launch(dev.default_stream, LaunchConfig(1, 1), kernels["empty"])
            s.sync()
        except Exception as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert not errors, errors
    assert (to_host(dev, s, buf, np.int32, 1024) == 7).all()


def test_cluster_launch(dev, kernels):
    from cuforge import LaunchConfig, launch

    if int(dev.arch) < 90:
        pytest.skip("thread block clusters need sm_90")
    s = dev.create_stream()
    out = dev.allocate(4 * 8, s)
    cfg = LaunchConfig(grid=4, block=32, cluster=2)
    assert cfg.grid_in_blocks == (8, 1, 1)
    launch(s, cfg, kernels["cluster_rank"], out)
    assert to_host(dev, s, out, np.int32, 8).tolist() == [0, 1] * 4


# --- streams and events --------------------------------------------------------------
def spin_cycles(dev, ms):
    try:
        khz = dev.properties.clock_rate
    except AttributeError:  # attribute retired in some driver versions
        khz = 2_000_000
    return int(khz * ms)


def test_stream_event_ordering_and_timing(dev, kernels):
    from cuforge import EventOptions, LaunchConfig, StreamOptions, launch

    s1 = dev.create_stream(options=StreamOptions(nonblocking=True))
    s2 = dev.create_stream(options=StreamOptions(nonblocking=True, priority=-1))
    assert s1.is_nonblocking and s2.priority <= s1.priority
    buf = dev.allocate(4 * 1024, s1)
    buf.fill(0, stream=s1, width=4)
    timing = EventOptions(enable_timing=True)
    start = s1.record(options=timing)
    launch(s1, LaunchConfig(1, 1), kernels["spin"], spin_cycles(dev, 50))
    launch(s1, LaunchConfig(4, 256), kernels["fill_i32"], buf, 5, 1024)
    end = s1.record(options=timing)
    assert not end.is_done  # the spin kernel is still running
    s2.wait(end)
    launch(s2, LaunchConfig(4, 256), kernels["add_i32"], buf, 1, 1024)
    s3 = dev.create_stream()
    s3.wait(s2)  # stream-on-stream wait
    launch(s3, LaunchConfig(4, 256), kernels["add_i32"], buf, 10, 1024)
    s3.sync()
    assert end.is_done and s1.is_done
    elapsed = end - start
    assert 40.0 < elapsed < 5000.0
    assert (to_host(dev, s3, buf, np.int32, 1024) == 16).all()
    untimed = s1.record()
    with pytest.raises(ValueError, match="timing"):
        _ = untimed - start
    untimed.sync()
    for obj in (start, end, untimed, s1, s2, s3):
        obj.close()
        obj.close()  # idempotent


def test_default_streams(dev, kernels):
    from cuforge import LaunchConfig, Stream, launch

    legacy = Stream.legacy_default()
    per_thread = Stream.per_thread_default()
    assert legacy is dev.default_stream
    for s in (legacy, per_thread):
        launch(s, LaunchConfig(1, 32), kernels["empty"])
        s.sync()
    legacy.close()  # borrowed: nothing is destroyed
    launch(dev.default_stream, LaunchConfig(1, 32), kernels["empty"])


# --- memory --------------------------------------------------------------------------
def test_pool_allocation_across_streams(dev, kernels):
    from cuforge import DeviceMemoryResource, LaunchConfig, launch

    mr = DeviceMemoryResource(dev)
    assert dev.memory_resource.device_id == dev.device_id and mr.is_device_accessible
    s1, s2 = dev.create_stream(), dev.create_stream()
    n = 1 << 16
    for round_ in range(20):
        buf = mr.allocate(4 * n, s1)
        launch(s1, LaunchConfig(grid_for(n), 256), kernels["fill_i32"], buf, round_, n)
        s2.wait(s1)
        launch(s2, LaunchConfig(grid_for(n), 256), kernels["add_i32"], buf, 1, n)
        if round_ == 19:
            assert (to_host(dev, s2, buf, np.int32, n) == 20).all()
        buf.close(stream=s2)  # freed in s2's order, after add_i32
    zero = mr.allocate(0, s1)
    assert zero.size == 0
    zero.close()
    s1.close()
    s2.close()


def test_free_on_a_closed_stream_is_safe(dev, kernels):
    s = dev.create_stream()
    buf = dev.allocate(1 << 20, s)
    s.close()
    buf.close()  # its free stream is gone: the resource synchronises instead
    dev.sync()


def test_allocation_outlives_closed_buffer(dev, kernels):
    from cuforge import LaunchConfig, launch
    from cuforge.runtime.memory import Buffer, weak_handle

    s = dev.create_stream()
    n = 4096
    buf = dev.allocate(4 * n, s)
    alloc = buf.allocation
    watch = weak_handle(buf)
    buf.close()
    buf.close()  # double close: no-op
    assert watch.alive
    with pytest.raises(ValueError, match="closed"):
        _ = buf.handle
    with pytest.raises(ValueError, match="closed"):
        launch(s, LaunchConfig(1, 1), kernels["fill_i32"], buf, 1, 1)
    # The memory is still valid through the allocation.
    view = Buffer.from_handle(alloc.ptr, alloc.size, owner=alloc)
    launch(s, LaunchConfig(grid_for(n), 256), kernels["fill_i32"], view, 3, n)
    assert (to_host(dev, s, view, np.int32, n) == 3).all()
    del alloc
    assert watch.alive  # `view` still owns it
    view.close()
    gc.collect()
    assert not watch.alive
    s.sync()
    s.close()


def test_pinned_memory(dev):
    from cuforge import PinnedMemoryResource

    mr = PinnedMemoryResource(dev)
    buf = mr.allocate(1024)
    assert buf.is_host_accessible and buf.is_device_accessible
    host_view(buf, np.uint8, 1024)[:] = 9
    s = dev.create_stream()
    d = buf.copy_to(dev.allocate(1024, s), stream=s)
    assert (to_host(dev, s, d, np.uint8, 1024) == 9).all()
    buf.close(stream=s)


def test_dlpack_and_cai_export(dev):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    s = dev.create_stream()
    buf = dev.allocate(256, s)
    buf.fill(42, stream=s)
    s.sync()
    cai = buf.__cuda_array_interface__
    assert cai["data"][0] == buf.handle and cai["shape"] == (256,)
    t = torch.from_dlpack(buf)
    assert t.device.type == "cuda" and t.dtype == torch.uint8 and t.numel() == 256
    assert t.data_ptr() == buf.handle
    from cuforge.runtime.memory import weak_handle

    watch = weak_handle(buf)
    buf.close()
    gc.collect()
    assert watch.alive  # the tensor holds the allocation
    assert int(t.sum().item()) == 42 * 256
    del t
    gc.collect()
    torch.cuda.synchronize()
    assert not watch.alive


# --- foreign streams -----------------------------------------------------------------
def test_wrap_torch_stream(dev, kernels):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from cuforge import LaunchConfig, launch

    ts = torch.cuda.Stream()
    s = dev.create_stream(ts) if hasattr(ts, "__cuda_stream__") else foreign(ts)
    assert int(s.handle) == ts.cuda_stream
    assert s.__cuda_stream__() == (0, ts.cuda_stream)
    launch(s, LaunchConfig(1, 1), kernels["empty"])
    s.close()  # borrowed: torch's stream lives on
    ts.synchronize()
    with torch.cuda.stream(ts):
        assert torch.ones(4, device="cuda").sum().item() == 4


def test_wrap_cupy_stream(dev, kernels):
    cp = pytest.importorskip("cupy", reason="cupy is not installed")
    from cuforge import LaunchConfig, Stream, launch

    cs = cp.cuda.Stream(non_blocking=True)
    s = foreign(cs)
    if hasattr(cs, "__cuda_stream__"):
        assert isinstance(Stream.from_foreign(cs), Stream)
    assert int(s.handle) == cs.ptr
    launch(s, LaunchConfig(1, 1), kernels["empty"])
    s.sync()
    s.close()
    cs.synchronize()


# --- error paths ---------------------------------------------------------------------
def test_launch_error_paths(dev, kernels):
    from cuforge import LaunchConfig, launch

    s = dev.create_stream()
    out = dev.allocate(64, s)
    cfg = LaunchConfig(1, 16)
    k = kernels["saxpy"]
    with pytest.raises(TypeError, match="takes 5 argument"):
        launch(s, cfg, k, np.float32(1), out, out, out)
    with pytest.raises(TypeError, match="argument 3: cannot pass"):
        launch(s, cfg, k, np.float32(1), out, out, object(), 16)
    with pytest.raises(TypeError, match=r"argument 0: packs 8 byte\(s\).*float32"):
        launch(s, cfg, k, 1.0, out, out, out, 16)
    with pytest.raises(TypeError, match="config"):
        launch(s, (1, 16), k)
    with pytest.raises(TypeError, match="__cuda_stream__"):
        launch(object(), cfg, kernels["empty"])
    with pytest.raises(TypeError, match=r"host|CUDA"):
        launch(s, cfg, kernels["fill_i32"], np.zeros(4, np.int32), 1, 4)
    launch(s, cfg, k, np.float32(1), out, out, out, 16)  # still fine afterwards
    s.sync()
    out.close()
    s.close()
    with pytest.raises(ValueError, match="closed"):
        launch(s, cfg, kernels["empty"])


def test_optional_compile_layer_get_kernel(dev):
    try:
        from cuforge import ObjectCode
    except Exception as exc:
        pytest.skip(f"compile layer not importable: {exc}")
    oc = ObjectCode.from_cubin(nvrtc_cubin(SOURCE, dev.arch))
    k = oc.get_kernel("empty")
    from cuforge import LaunchConfig, launch

    s = dev.create_stream()
    launch(s, LaunchConfig(1, 1), k)
    s.sync()


def test_plain_launches_take_the_c_entry_point_and_report_driver_errors(dev, kernels):
    """Plain configs go through cuforge._native._launch; its errors are CUDAErrors."""
    from cuforge import CUDAError, LaunchConfig, launch

    launch_module = importlib.import_module("cuforge.runtime.launch")

    s = dev.create_stream()
    launch(s, LaunchConfig(1, 1), kernels["empty"])
    s.sync()
    assert launch_module._entry, "cuLaunchKernel entry point was not resolved"
    assert launch_module._c_launch.__module__ == "cuforge._native._launch"
    too_much_shared = LaunchConfig(1, 1, shmem_size=1 << 30)
    with pytest.raises(CUDAError, match="CUDA_ERROR_INVALID_VALUE"):
        launch(s, too_much_shared, kernels["empty"])
    s.close()
