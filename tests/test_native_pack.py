"""The C argument packer (``cuforge._native._launch``) against the Python one.

Runs without a GPU: a ctypes function stands in for the driver's cuLaunchKernel /
cuGraphAddKernelNode entry point and reads back the parameters it is handed. Every
packable type must give the bytes ``pack_args`` gives, and anything C leaves to
Python (a closed Buffer, a value out of its type's range, arrays) must come back
as -1 with no exception, so the caller's general path reports it.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cuforge._native import _launch
from cuforge.runtime.args import pack_args, plan_for
from cuforge.runtime.memory import Buffer

LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, *([ctypes.c_uint] * 7), ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
)  # fmt: skip


class NodeParams(ctypes.Structure):
    _fields_ = (
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shmem", ctypes.c_uint),
        ("kernel_params", ctypes.POINTER(ctypes.c_void_p)),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    )


ADD_NODE = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.POINTER(NodeParams),
)  # fmt: skip


def _values(params, sizes) -> list[bytes]:
    return [ctypes.string_at(params[i], n) for i, n in enumerate(sizes)]


def _python_bytes(args) -> list[bytes]:
    packed = pack_args(args)
    arr = ctypes.cast(packed.params, ctypes.POINTER(ctypes.c_void_p))
    return _values(arr, packed.sizes)


def _addr(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


CASES = [
    (1, 2.5, True, False, -(2**63)),
    (np.float32(1.5), np.float64(-2.25), np.int8(-7), np.uint8(250), np.int16(-300)),
    (np.uint16(65000), np.int32(-(2**31)), np.uint32(2**32 - 1), np.int64(2**62)),
    (np.uint64(2**64 - 1), np.bool_(True), 7, np.float32(-0.0)),
]


@pytest.mark.parametrize("args", CASES, ids=lambda a: ",".join(type(x).__name__ for x in a))
def test_c_launch_packs_exactly_like_python(args) -> None:
    buf = Buffer.from_handle(0x7F00_0000_1000, 64)
    args = (buf, *args, buf)
    plan = plan_for(args)
    assert plan.ccodes is not None
    seen: list = []

    @LAUNCH
    def fake(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        seen.append(((f, gx, gy, gz, bx, by, bz, shmem, stream), _values(params, plan.sizes)))
        return 0

    dims = (2, 3, 4, 32, 1, 1, 128)
    entry = _addr(fake)
    for types in (None, plan.types):  # unchecked, and checked against the plan's types
        assert _launch.launch_args(entry, 0xF00, dims, 0x5000, plan.ccodes, types, args) == 0
    assert len(seen) == 2
    for call, got in seen:
        assert call == (0xF00, *dims, 0x5000)
        assert got == _python_bytes(args)
    # Arguments of other types than the cached plan's: -2, nothing launched.
    other = (*args[:-1], 1.0)
    assert _launch.launch_args(entry, 0xF00, dims, 0x5000, plan.ccodes, plan.types, other) == -2
    assert len(seen) == 2


def test_c_kernel_node_packs_like_python_and_returns_buffer_allocations() -> None:
    a = Buffer.from_handle(0x7F00_0000_1000, 64)
    b = Buffer.from_handle(0x7F00_0000_2000, 64)
    args = (a, np.float32(3.0), b, 5)
    plan = plan_for(args)
    seen: list = []

    @ADD_NODE
    def fake(node, graph, deps, ndeps, p):
        q = p.contents
        seen.append((graph, ndeps, deps[0] if ndeps else None, q.kern, q.ctx,
                     tuple(q.grid), tuple(q.block), q.shmem,
                     _values(q.kernel_params, plan.sizes)))  # fmt: skip
        node[0] = 0xABC
        return 0

    err, node, held = _launch.add_kernel_node_args(
        _addr(fake), 0x6000, 0x7000, 0xF00, 0xC7, (1, 1, 1, 64, 1, 1, 0), plan.ccodes,
        plan.types, args,
    )  # fmt: skip
    assert (err, node) == (0, 0xABC)
    assert held == (a.allocation, b.allocation)
    ((graph, ndeps, dep, kern, ctx, grid, block, shmem, got),) = seen
    assert (graph, ndeps, dep, kern, ctx) == (0x6000, 1, 0x7000, 0xF00, 0xC7)
    assert (grid, block, shmem) == ((1, 1, 1), (64, 1, 1), 0)
    assert got == _python_bytes(args)


def test_what_c_cannot_pack_comes_back_as_minus_one_without_an_exception() -> None:
    calls: list = []

    @LAUNCH
    def fake(*a):
        calls.append(a)
        return 0

    closed = Buffer.from_handle(0x1000, 8)
    closed.close()
    dims = (1, 1, 1, 1, 1, 1, 0)
    for args in ((closed,), (2**64 + 1,), (2**63,), (np.float32(1.0),)):
        codes = b"Pqqi"[: len(args)] if args[0] is not closed else b"P"
        if isinstance(args[0], np.float32):
            codes = b"b"  # an int8 slot cannot take a float
        assert _launch.launch_args(_addr(fake), 1, dims, 0, codes, None, args) == -1
    assert _launch.launch_args(_addr(fake), 1, dims, 0, b"b", None, (np.int16(300),)) == -1
    assert _launch.launch_args(_addr(fake), 1, dims, 0, b"f", None, (1e300,)) == -1
    assert calls == []  # nothing reached the "driver"


def test_plans_that_need_python_have_no_c_codes() -> None:
    assert plan_for((np.float16(1.0),)).ccodes is None
    assert plan_for((ctypes.c_int(3),)).ccodes is None
    assert plan_for((1, 2.0, True)).ccodes == b"qd?"
