"""DLPack in both directions, through ctypes (no compiled helper needed).

Export: ``Buffer.__dlpack__`` hands out a legacy ``"dltensor"`` capsule describing the
buffer as 1-D uint8. The capsule (then the consumer) holds the buffer's allocation, so
the memory outlives ``Buffer.close()`` for as long as the consumer's tensor lives.
Import: :func:`dlpack_pointer` reads the data pointer out of any ``__dlpack__`` object
(the caller keeps that object alive). Thread safety: the keep-alive table is guarded
by a lock; deleters may run on any thread that holds the GIL.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuforge.runtime.memory import Buffer

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
_DEVICE_TYPES = (kDLCUDA, kDLCUDAHost, kDLCUDAManaged)


class DLDevice(ctypes.Structure):
    _fields_ = (("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32))


class DLDataType(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16))


class DLTensor(ctypes.Structure):
    _fields_ = (
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    )


_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = (("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter))


# Private prototypes: setting argtypes on ctypes.pythonapi's shared function objects
# would change them for every other user in the process.
_api = ctypes.pythonapi
_capsule_new = ctypes.PYFUNCTYPE(
    ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p
)(("PyCapsule_New", _api))
_capsule_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
# The destructor sees a capsule whose refcount already reached zero: it must not be
# wrapped as a Python object again, so these take a raw pointer.
_capsule_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api)
)
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)

_NAME = b"dltensor"
_live: dict[int, tuple[Any, ...]] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def _drop_tensor(managed: int | None) -> None:
    if not managed:
        return
    ctx = DLManagedTensor.from_address(managed).manager_ctx
    with _lock:
        _live.pop(ctx, None)


_deleter = _Deleter(_drop_tensor)


def _drop_unconsumed(capsule: int | None) -> None:
    # A capsule still named "dltensor" was never consumed: its tensor is ours to drop.
    if capsule and _capsule_is_valid_raw(capsule, _NAME):
        _deleter(_get_pointer_raw(capsule, _NAME))


_capsule_destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_drop_unconsumed)


def dlpack_device(buf: Buffer) -> tuple[int, int]:
    if buf.is_host_accessible:
        return (kDLCUDAHost, 0)
    return (kDLCUDA, buf.device_id)


def to_dlpack(
    buf: Buffer, max_version: Any = None, dl_device: Any = None, copy: bool | None = None
) -> Any:
    """Export ``buf`` as a legacy DLPack capsule (1-D uint8)."""
    if copy:
        raise BufferError("cuforge Buffers export without copying only")
    device = dlpack_device(buf)
    if dl_device is not None and tuple(dl_device) != device:
        raise BufferError(f"cannot export to device {tuple(dl_device)}; buffer is on {device}")
    alloc = buf.allocation
    managed = DLManagedTensor()
    shape = (ctypes.c_int64 * 1)(buf.size)
    t = managed.dl_tensor
    t.data = buf.handle
    t.device = DLDevice(*device)
    t.ndim = 1
    t.dtype = DLDataType(1, 8, 1)  # kDLUInt, 8 bits, 1 lane
    t.shape = shape
    t.strides = None
    t.byte_offset = 0
    ctx = next(_ids)
    managed.manager_ctx = ctx
    managed.deleter = _deleter
    with _lock:
        _live[ctx] = (managed, shape, alloc)
    return _capsule_new(
        ctypes.addressof(managed), _NAME, ctypes.cast(_capsule_destructor, ctypes.c_void_p)
    )


def dlpack_pointer(obj: Any) -> int:
    """The device data pointer of a ``__dlpack__`` object (data + byte_offset).

    Raises TypeError when the object's memory is not CUDA-accessible.
    """
    return dlpack_extent(obj)[0]


def contiguous_nbytes(
    shape: Sequence[int], itemsize: int, byte_strides: Sequence[int] | None
) -> int | None:
    """Byte size of a C-contiguous array (``byte_strides`` None: compact), else None."""
    count = 1
    for n in shape:
        count *= int(n)
    if byte_strides is not None:
        expect = itemsize
        for n, stride in zip(reversed(shape), reversed(byte_strides), strict=True):
            if n != 1 and stride != expect:
                return None
            expect *= int(n)
    return count * itemsize


def dlpack_extent(obj: Any) -> tuple[int, int | None]:
    """(device data pointer, byte size) of a ``__dlpack__`` object.

    The size is None when the tensor is not C-contiguous (its extent is then not a
    single range). Raises TypeError when the memory is not CUDA-accessible.
    """
    capsule = obj.__dlpack__()
    managed = DLManagedTensor.from_address(_capsule_get_pointer(capsule, _NAME))
    t = managed.dl_tensor
    if t.device.device_type not in _DEVICE_TYPES:
        raise TypeError(f"DLPack device type {t.device.device_type} is not CUDA memory")
    ptr = (t.data or 0) + t.byte_offset
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    # DLPack strides count elements (NULL: compact row-major).
    strides = [t.strides[i] * itemsize for i in range(t.ndim)] if t.strides else None
    nbytes = contiguous_nbytes(shape, itemsize, strides)
    del capsule  # unconsumed: its destructor hands the tensor back to the producer
    return ptr, nbytes
