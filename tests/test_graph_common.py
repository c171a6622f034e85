"""Shared set-up for the graph tests (kernels compiled here with NVRTC, sm_90 cubin).

Imported by the test_graph_* modules; holds no tests of its own.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import traceback

import numpy as np
import pytest

from conftest import device_ordinal

KERNELS = r"""
typedef unsigned long long cuforge_cond_t;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cuforge_cond_t h,
                                                                      unsigned int value);

extern "C" __global__ void add_one(int *a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) a[i] += 1;
}

extern "C" __global__ void noop() {}

extern "C" __global__ void spin_add(int *a, long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < (unsigned long long)ns);
    if (threadIdx.x == 0 && blockIdx.x == 0) a[0] += 1;
}

extern "C" __global__ void count_while(int *counter, cuforge_cond_t h, long long limit) {
    int c = ++counter[0];
    cudaGraphSetConditional(h, c < limit ? 1u : 0u);
}

extern "C" __global__ void cluster_size(int *out) {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    if (threadIdx.x == 0) out[blockIdx.x] = (int)n;
}

extern "C" __global__ void set_cond(cuforge_cond_t h, long long value) {
    cudaGraphSetConditional(h, (unsigned int)value);
}

extern "C" __global__ void set_cond_bool(cuforge_cond_t h, bool value) {
    cudaGraphSetConditional(h, value ? 1u : 0u);
}
"""


@functools.cache
def kernels():
    """The test device current; the compiled kernels by name."""
    from cuforge import Device, Program, ProgramOptions

    dev = Device(device_ordinal())
    dev.set_current()
    arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
    code = Program(KERNELS, "c++", ProgramOptions(arch=arch)).compile("cubin")
    names = ("add_one", "noop", "spin_add", "count_while", "set_cond", "set_cond_bool",
             "cluster_size")  # fmt: skip
    return {n: code.get_kernel(n) for n in names}


def setup_device():
    """The test device (``CUFORGE_TEST_DEVICE``, default 0), made current, with the
    test kernels compiled and loaded."""
    from cuforge import Device

    d = Device(device_ordinal())
    d.set_current()
    kernels()
    return d


def cfg(grid=1, block=1):
    from cuforge import LaunchConfig

    return LaunchConfig(grid=grid, block=block)


def read_ints(ptr_or_buf, n: int) -> np.ndarray:
    from cuda.bindings import driver

    ptr = ptr_or_buf if isinstance(ptr_or_buf, int) else ptr_or_buf.handle
    out = np.zeros(n, dtype=np.int32)
    (err,) = driver.cuMemcpyDtoH(out.ctypes.data, ptr, out.nbytes)
    assert err == driver.CUresult.CUDA_SUCCESS, err
    return out


def write_ints(buf, values) -> None:
    from cuda.bindings import driver

    arr = np.ascontiguousarray(values, dtype=np.int32)
    (err,) = driver.cuMemcpyHtoD(buf.handle, arr.ctypes.data, arr.nbytes)
    assert err == driver.CUresult.CUDA_SUCCESS, err


def released(pred, timeout: float = 10.0) -> bool:
    """Poll (draining the release queue) until pred() holds; bounded."""
    from cuda.bindings import driver

    from cuforge.graph import _owners

    def check() -> bool:
        gc.collect()
        if pred():
            return True
        # CUDA may defer user-object destruction until the driver next does work
        # (seen under compute-sanitizer); a synchronize gives it that chance.
        driver.cuCtxSynchronize()
        return False

    return _owners.wait_until(check, timeout)


HOSTFN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@pytest.fixture(autouse=True)
def no_leftover_bundles():
    """Every test must leave no owner bundle behind once its graphs are gone."""
    from cuforge.graph import _owners, live_bundles

    before = set(_owners._registry)
    graphs_before = {id(o) for o in _live_graph_states()}
    yield
    if not released(lambda: live_bundles() <= len(before)):
        left = {t: _owners._registry[t] for t in set(_owners._registry) - before}
        kinds = {t: [type(o).__name__ for o in _flatten(b)] for t, b in left.items()}
        graphs = [g for g in _live_graph_states() if id(g) not in graphs_before]
        pytest.fail(
            f"{len(left)} bundle(s) left behind by this test: {kinds}; "
            f"{len(graphs)} graph(s) of this test still open, held by: "
            f"{[_holders(g, {id(graphs)}) for g in graphs]}"
        )


def _live_graph_states() -> list:
    from cuforge.graph._state import GraphState

    return [o for o in gc.get_objects() if isinstance(o, GraphState) and not o.closed]


def _holders(obj, ignore: set[int], depth: int = 5) -> list:
    """What refers to obj, a few levels up (frames by function name): failure diagnostics."""
    out: list = []
    if depth == 0:
        return out
    ignore = ignore | {id(out)}
    for r in gc.get_referrers(obj):
        if id(r) in ignore:
            continue
        if hasattr(r, "f_code"):
            if r.f_code.co_name not in ("_holders", "no_leftover_bundles"):
                out.append((f"frame {r.f_code.co_name}", _holders(r, ignore, depth - 1)))
            continue
        out.append((type(r).__name__, _holders(r, ignore, depth - 1)))
    return out[:8]


def _flatten(bundle) -> list:
    if isinstance(bundle, (tuple, list)):
        return [x for item in bundle for x in _flatten(item)]
    if isinstance(bundle, dict):
        return [f"dict[{len(bundle)}]"]
    return [bundle]


def expect_raises(exc: type[BaseException], fn, *args) -> None:
    """Like pytest.raises, but keeps no traceback (and so no frame locals) alive."""
    try:
        fn(*args)
    except exc as e:
        traceback.clear_frames(e.__traceback__)  # drop the failed call's locals now
        e.__traceback__ = None
        return
    raise AssertionError(f"{exc.__name__} not raised")
