"""Graph operand resolution and kernel-node packing, checked without a GPU.

The graph layer turns copy operands and kernel arguments into addresses plus the
objects that must stay alive; these checks need no driver (Buffers wrap made-up
addresses and are never dereferenced).
"""

from __future__ import annotations

import ctypes
import struct

import pytest


class ArrayLike:
    """A __cuda_array_interface__ producer with a chosen shape and strides."""

    def __init__(self, ptr: int, shape: tuple, typestr: str = "<i4", strides=None) -> None:
        self.ptr, self.shape, self.typestr, self.strides = ptr, shape, typestr, strides

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.typestr, "strides": self.strides,
                "data": (self.ptr, False), "version": 3}  # fmt: skip


def test_copy_operands_resolve_to_address_and_owner():
    from cuforge.graph._operands import resolve_pointer
    from cuforge.runtime import Buffer

    buf = Buffer.from_handle(0x7F00_0000_1000, 64)
    assert resolve_pointer(buf, None, "dst", 64) == (buf.handle, (buf.allocation,))
    arr = ArrayLike(0x7F00_0000_2000, (4, 4))
    assert resolve_pointer(arr, None, "src", 64) == (arr.ptr, (arr,))
    owner = object()
    assert resolve_pointer(0x1234, owner, "dst", 8) == (0x1234, (owner,))
    assert resolve_pointer(0x1234, None, "dst", 8) == (0x1234, ())
    with pytest.raises(ValueError, match="dst: an owner may only accompany a raw int"):
        resolve_pointer(buf, owner, "dst", 8)
    with pytest.raises(ValueError, match="src: an owner may only accompany a raw int"):
        resolve_pointer(arr, owner, "src", 8)
    with pytest.raises(TypeError, match="memcpy dst: expected a Buffer"):
        resolve_pointer("nope", None, "memcpy dst", 8)
    with pytest.raises(TypeError, match="bool"):
        resolve_pointer(True, None, "dst", 8)
    buf.close()
    with pytest.raises(ValueError, match="the Buffer is closed"):
        resolve_pointer(buf, None, "dst", 8)


def test_copy_extent_beyond_the_operand_is_refused():
    from cuforge.graph._operands import resolve_pointer
    from cuforge.runtime import Buffer

    buf = Buffer.from_handle(0x7F00_0000_1000, 64)
    with pytest.raises(ValueError, match="memcpy dst: the node touches 65 bytes but the operand holds 64"):  # fmt: skip  # noqa: E501
        resolve_pointer(buf, None, "memcpy dst", 65)
    arr = ArrayLike(0x7F00_0000_2000, (4, 4), "<f8")  # 128 bytes
    resolve_pointer(arr, None, "src", 128)
    with pytest.raises(ValueError, match="holds 128"):
        resolve_pointer(arr, None, "src", 129)
    # Non-contiguous arrays have no single extent: the caller's size is taken as is.
    strided = ArrayLike(0x7F00_0000_3000, (4, 4), "<i4", strides=(32, 4))
    assert resolve_pointer(strided, None, "src", 1 << 20)[0] == strided.ptr
    # Explicit C-contiguous strides are recognised as contiguous.
    explicit = ArrayLike(0x7F00_0000_4000, (4, 4), "<i4", strides=(16, 4))
    with pytest.raises(ValueError, match="holds 64"):
        resolve_pointer(explicit, None, "src", 65)


def test_node_fill_packs_like_pack_args_and_names_owners():
    from cuforge.runtime import Buffer
    from cuforge.runtime.args import pack_args, plan_for

    buf = Buffer.from_handle(0x7F00_0000_1000, 64)
    arr = ArrayLike(0x7F00_0000_2000, (4,))
    args = (buf, 7, arr, 2.5)
    plan = plan_for(args)
    scratch = (ctypes.c_char * plan.nbytes)()
    held = plan.fill(args, scratch, ctypes.addressof(scratch))
    assert held == (buf.allocation, arr)
    packed = pack_args(args)
    n = len(args)
    # The value area is identical; the pointer table points into each one's own memory.
    assert bytes(scratch)[8 * n :] == ctypes.string_at(packed.params, plan.nbytes)[8 * n :]
    base = ctypes.addressof(scratch)
    table = struct.unpack_from(f"<{n}Q", bytes(scratch))
    values = [ctypes.string_at(p, s) for p, s in zip(table, plan.sizes, strict=True)]
    assert values == [struct.pack("<Q", buf.handle), struct.pack("<q", 7),
                      struct.pack("<Q", arr.ptr), struct.pack("<d", 2.5)]  # fmt: skip
    assert all(base <= p < base + plan.nbytes for p in table)
