"""Shared set-up for the graph tests (kernels compiled here with NVRTC, sm_90 cubin).

Imported by the test_graph_* modules; holds no tests of its own.
"""

from __future__ import annotations

import ctypes
import functools
import gc

import numpy as np

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

extern "C" __global__ void set_cond(cuforge_cond_t h, long long value) {
    cudaGraphSetConditional(h, (unsigned int)value);
}
"""


@functools.cache
def kernels():
    """Device 0 current; the compiled kernels by name."""
    from cuforge import Device, Program, ProgramOptions

    dev = Device(0)
    dev.set_current()
    arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
    code = Program(KERNELS, "c++", ProgramOptions(arch=arch)).compile("cubin")
    names = ("add_one", "noop", "spin_add", "count_while", "set_cond")
    return {n: code.get_kernel(n) for n in names}


def setup_device():
    """Device 0, made current, with the test kernels compiled and loaded."""
    from cuforge import Device

    d = Device(0)
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
