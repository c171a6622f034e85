"""Kernel loading: ``load_kernel(object_code, name) -> Kernel`` on the library API.

Guarantees:
- Each ObjectCode is loaded once (``cuLibraryLoadData``, context-independent, so one
  load serves every device); each kernel name is looked up once per loaded library.
  The cache follows the ObjectCode's lifetime (weakly referenced where possible).
- A ``Kernel`` keeps its library loaded; the library unloads when the ObjectCode's
  cache entry and every Kernel from it are gone (never during interpreter shutdown).
- Thread safe: concurrent loads of one ObjectCode load it once.
- Failure modes: no driver -> CUDAError; a code type that cannot be loaded
  ("ltoir", "object", "library": link it first) -> ValueError; a missing name ->
  CUDAError(CUDA_ERROR_NOT_FOUND) naming the kernel.
"""

from __future__ import annotations

import sys
import threading
import weakref

from cuforge.runtime import capture_guard
from cuforge.runtime.device import Device
from cuforge.runtime.errors import CUDAError, check
from cuforge.runtime.init import ensure_initialized

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from typing import Any

    from cuda.bindings import driver
else:  # imported on first use: a script that only compiles never loads the driver
    from cuforge._cuda import bindings_driver as driver


if TYPE_CHECKING:
    from cuforge.compile.object_code import ObjectCode
    from cuforge.runtime.args import _Plan

_LOADABLE = ("cubin", "ptx", "fatbin")
_INVALID_VALUE = 1  # CUresult.CUDA_ERROR_INVALID_VALUE (checked: test_runtime_nodriver.py)


class _Library:
    __slots__ = ("__weakref__", "handle", "kernels", "lock")

    def __init__(self, code: bytes) -> None:
        res = driver.cuLibraryLoadData(code, [], [], 0, [], [], 0)
        self.handle: driver.CUlibrary = check(res, "cuLibraryLoadData")
        self.kernels: dict[str, Kernel] = {}
        self.lock = threading.Lock()

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle is None or sys.is_finalizing():
            return
        try:  # not actionable in a finaliser (no contextlib: ~1 ms of import)  # noqa: SIM105
            # Queued while a capture forbids it (see capture_guard).
            capture_guard.destroy(b"cuLibraryUnload", int(handle))
        except Exception:
            pass


# id(object_code) -> (weakref or strong ref to it, library)
_libraries: dict[int, tuple[object, _Library]] = {}
_libraries_lock = threading.Lock()


def _code_bytes(object_code: ObjectCode) -> bytes:
    code_type = str(getattr(object_code, "code_type", "")).lower()
    if code_type not in _LOADABLE:
        raise ValueError(
            f"cannot load code of type {code_type!r}: only {', '.join(_LOADABLE)} load "
            "directly; link LTO-IR and relocatable objects into a cubin first"
        )
    raw: bytes | str = object_code.code
    code = bytes(raw.encode() if isinstance(raw, str) else raw)
    if code_type == "ptx" and not code.endswith(b"\0"):
        code += b"\0"  # the driver reads PTX as a C string
    return code


def _library_for(object_code: ObjectCode) -> _Library:
    key = id(object_code)
    entry = _libraries.get(key)
    if entry is not None and _referent(entry[0]) is object_code:
        return entry[1]
    with _libraries_lock:
        entry = _libraries.get(key)
        if entry is not None and _referent(entry[0]) is object_code:
            return entry[1]
        lib = _Library(_code_bytes(object_code))

        def forget(_ref: object, k: int = key) -> None:
            _libraries.pop(k, None)

        try:
            ref: object = weakref.ref(object_code, forget)
        except TypeError:
            # Not weak-referenceable: pin it, so its id cannot be reused while cached.
            ref = object_code
        _libraries[key] = (ref, lib)
        return lib


def _referent(ref: object) -> object:
    return ref() if isinstance(ref, weakref.ref) else ref


def load_kernel(object_code: ObjectCode, name: str | bytes) -> Kernel:
    """The kernel ``name`` (already mangled) from ``object_code``, loading it if needed."""
    ensure_initialized()
    lib = _library_for(object_code)
    key = name.decode() if isinstance(name, bytes) else str(name)
    kernel = lib.kernels.get(key)
    if kernel is not None:
        return kernel
    with lib.lock:
        kernel = lib.kernels.get(key)
        if kernel is None:
            handle = check(driver.cuLibraryGetKernel(lib.handle, key.encode()), f"kernel {key!r}")
            kernel = lib.kernels[key] = Kernel._new(handle, lib, key)
    return kernel


class KernelAttributes:
    """Per-device kernel attributes (``CU_FUNC_ATTRIBUTE_*``), read on demand."""

    __slots__ = ("_kernel",)

    def __init__(self, kernel: Kernel) -> None:
        self._kernel = kernel

    def _get(self, attr: driver.CUfunction_attribute, device_id: int | None) -> int:
        dev = Device(device_id)
        return int(
            check(
                driver.cuKernelGetAttribute(attr, self._kernel.handle, dev._cu_device),
                f"kernel attribute {attr.name}",
            )
        )

    def num_regs(self, device_id: int | None = None) -> int:
        return self._get(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS, device_id)

    def max_threads_per_block(self, device_id: int | None = None) -> int:
        a = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
        return self._get(a, device_id)

    def shared_size_bytes(self, device_id: int | None = None) -> int:
        """Static shared memory per block."""
        a = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES
        return self._get(a, device_id)

    def max_dynamic_shared_size_bytes(self, device_id: int | None = None) -> int:
        a = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        return self._get(a, device_id)

    def const_size_bytes(self, device_id: int | None = None) -> int:
        a = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES
        return self._get(a, device_id)

    def local_size_bytes(self, device_id: int | None = None) -> int:
        a = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES
        return self._get(a, device_id)

    def ptx_version(self, device_id: int | None = None) -> int:
        return self._get(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PTX_VERSION, device_id)

    def binary_version(self, device_id: int | None = None) -> int:
        a = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_BINARY_VERSION
        return self._get(a, device_id)


class Kernel:
    """A loaded kernel. ``handle`` is its ``CUkernel``; it keeps its library loaded."""

    __slots__ = (
        "__weakref__",
        "_as_function",
        "_checked",
        "_function_int",
        "_handle",
        "_last",
        "_lib",
        "_name",
        "_params",
    )
    _as_function: driver.CUfunction
    _checked: set[_Plan | None]
    _function_int: int
    _handle: driver.CUkernel
    # (C packing codes, argument types) of the last validated signature: launches
    # and kernel nodes with exactly these types skip planning (launch.py).
    _last: tuple[bytes, tuple[type, ...]] | None
    _lib: _Library
    _name: str
    _params: tuple[int, ...] | None

    def __init__(self) -> None:
        raise TypeError("use ObjectCode.get_kernel(name)")

    @classmethod
    def _new(cls, handle: driver.CUkernel, lib: _Library, name: str) -> Kernel:
        self = object.__new__(cls)
        self._handle = handle
        self._lib = lib
        self._name = name
        # cuLaunchKernelEx accepts a CUkernel cast to CUfunction (context from the stream).
        self._as_function = driver.CUfunction(int(handle))
        self._function_int = int(handle)  # the same, as an address for the C launcher
        self._params = None
        self._checked = set()
        self._last = None
        return self

    @property
    def handle(self) -> driver.CUkernel:
        return self._handle

    @property
    def name(self) -> str:
        return self._name

    @property
    def attributes(self) -> KernelAttributes:
        return KernelAttributes(self)

    def function(self, device: Device | int | None = None) -> driver.CUfunction:
        """The ``CUfunction`` of this kernel in ``device``'s primary context (default:
        the thread's current context)."""
        fn: driver.CUfunction
        if device is None:
            fn = check(driver.cuKernelGetFunction(self._handle), "cuKernelGetFunction")
            return fn
        dev = device if isinstance(device, Device) else Device(device)
        with dev._scope():
            fn = check(driver.cuKernelGetFunction(self._handle), "cuKernelGetFunction")
        return fn

    @property
    def param_sizes(self) -> tuple[int, ...]:
        """Byte size of each kernel parameter, from the kernel image."""
        params = self._params
        if params is None:
            try:
                params = self._read_param_sizes()
            except CUDAError as exc:
                if exc.result != driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
                    raise
                # The query needs some context; any device's will do.
                with Device()._scope():
                    params = self._read_param_sizes()
            self._params = params
        return params

    def _read_param_sizes(self) -> tuple[int, ...]:
        sizes: list[int] = []
        while True:
            res = driver.cuKernelGetParamInfo(self._handle, len(sizes))
            if res[0] == _INVALID_VALUE:
                return tuple(sizes)
            check(res, "cuKernelGetParamInfo")
            sizes.append(int(res[2]))

    @property
    def num_arguments(self) -> int:
        return len(self.param_sizes)

    def __repr__(self) -> str:
        return f"<Kernel {self._name}>"

    def __reduce__(self) -> Any:
        raise TypeError("Kernel objects cannot be pickled")


__all__ = ["CUDAError", "Kernel", "KernelAttributes", "load_kernel"]
