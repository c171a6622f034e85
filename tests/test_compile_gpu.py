"""On a GPU machine: ObjectCodes compiled by cuforge load, and get_kernel works.

Cubin is compiled (not PTX): a newer NVRTC's PTX may not JIT on an older driver.
"""

from __future__ import annotations

import pytest

from cuforge.compile import ObjectCode, Program, ProgramOptions

pytestmark = pytest.mark.gpu

SRC = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
template <typename T> __global__ void fill(T* p, T v) { p[threadIdx.x] = v; }
"""


def test_compiled_cubin_loads_and_get_kernel_returns_kernels():
    options = ProgramOptions()  # arch from the current device
    assert options.arch.startswith("sm_")
    obj = Program(SRC, "c++", options).compile("cubin", name_expressions=["fill<float>"])
    assert obj.code[:4] == b"\x7fELF"
    saxpy = obj.get_kernel("saxpy")
    fill = obj.get_kernel("fill<float>")  # through symbol_mapping
    assert saxpy is not None and fill is not None
    assert saxpy.handle is not None and fill.handle is not None
    # A path-backed copy of the same cubin loads too.
    again = ObjectCode.from_cubin(obj.code, symbol_mapping=obj.symbol_mapping)
    assert again.get_kernel("fill<float>") is not None
