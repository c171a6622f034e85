"""Lazy, thread-safe ``cuInit``: done once, on the first runtime call that needs it.

Importing :mod:`cuforge.runtime` never touches the driver; the first object that needs
it calls :func:`ensure_initialized`. A machine with no driver, or a driver with no
device, gets a :class:`~cuforge.runtime.errors.CUDAError` saying so -- every time it
asks, since a driver installed later cannot be picked up by this process anyway.
"""

from __future__ import annotations

import threading

from cuforge.runtime.errors import CUDAError, check, no_driver_error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cuda.bindings import driver
else:  # imported on first use: a script that only compiles never loads the driver
    from cuforge._cuda import bindings_driver as driver

_lock = threading.Lock()
_done = False
_failure: CUDAError | None = None


def _loader_errors() -> tuple[type[BaseException], ...]:
    # cuda.pathfinder raises its own exception types when libcuda is absent; their
    # names moved between releases, so collect whichever exist.
    found: list[type[BaseException]] = [OSError]
    try:
        import cuda.pathfinder as pathfinder
    except ImportError:  # pragma: no cover - cuda-bindings depends on it
        return tuple(found)
    for name in ("DynamicLibNotFoundError", "DynamicLibNotAvailableError"):
        cls = getattr(pathfinder, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


def ensure_initialized() -> None:
    """Run ``cuInit(0)`` once per process; raise CUDAError when impossible."""
    global _done, _failure
    if _done:
        return
    with _lock:
        if _done:
            return
        if _failure is not None:
            # A fresh exception each time: re-raising one instance grows its traceback.
            raise CUDAError(str(_failure), _failure.result) from _failure.__cause__
        try:
            check(driver.cuInit(0), "cuInit")
            count = check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
        except _loader_errors() as exc:
            _failure = no_driver_error(exc)
            raise _failure from exc
        except CUDAError as exc:
            _failure = CUDAError(f"CUDA driver unusable: {exc}", exc.result)
            raise _failure from exc
        if count == 0:
            _failure = CUDAError("the CUDA driver reports no device", None)
            raise _failure
        _done = True


def device_count() -> int:
    """Number of CUDA devices; raises CUDAError without a driver."""
    ensure_initialized()
    return int(check(driver.cuDeviceGetCount()))


def driver_entry(name: bytes) -> int:
    """The address of driver function ``name`` (its CUDA 12.0 ABI, default-stream
    semantics as cuda.bindings uses), or 0 when the driver does not provide it."""
    try:
        flags = driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        err, pfn, _status = driver.cuGetProcAddress(name, 12000, flags)
        return int(pfn) if err == driver.CUresult.CUDA_SUCCESS and pfn else 0
    except Exception:
        return 0
