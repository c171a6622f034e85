"""Errors raised by the runtime layer, and the one helper that checks driver results.

Every driver call in :mod:`cuforge.runtime` goes through :func:`check`, so a failure
always surfaces as :class:`CUDAError` carrying the ``CUresult`` name and the driver's
own explanation. A missing driver library (no NVIDIA driver installed) is reported as
a :class:`CUDAError` too, never as cuda.pathfinder's loader exception.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from typing import Any

    from cuda.bindings import driver
else:  # imported on first use: a script that only compiles never loads the driver
    from cuforge._cuda import bindings_driver as driver

_SUCCESS = 0  # CUresult.CUDA_SUCCESS (CUresult compares as an int)


class CUDAError(RuntimeError):
    """A CUDA driver call failed, or no usable driver/device exists.

    ``result`` is the ``CUresult`` (None when the driver could not even be loaded),
    ``name`` its enum name (e.g. ``"CUDA_ERROR_INVALID_VALUE"``).
    """

    def __init__(self, message: str, result: driver.CUresult | None = None) -> None:
        super().__init__(message)
        self.result = result
        self.name = result.name if result is not None else "CUDA_ERROR_NO_DRIVER"


def describe(result: driver.CUresult) -> str:
    """``"NAME: explanation"`` for a CUresult; never raises."""
    try:
        err, text = driver.cuGetErrorString(result)
        detail = text.decode() if err == _SUCCESS and text else "no description"
    except Exception:  # the driver may be unloaded or half-initialised
        detail = "no description"
    name = getattr(result, "name", str(result))
    return f"{name}: {detail}"


def error_for(result: driver.CUresult, context: str = "") -> CUDAError:
    """Build the CUDAError for a failed ``result``; ``context`` says what was attempted."""
    prefix = f"{context}: " if context else ""
    return CUDAError(prefix + describe(result), result)


def check(result: tuple[Any, ...], context: str = "") -> Any:
    """Raise CUDAError unless ``result[0]`` is CUDA_SUCCESS, else return the payload.

    A driver binding returns ``(CUresult, *values)``: this returns None for no values,
    the value itself for one, and the tuple of values for several.
    """
    err = result[0]
    if err != _SUCCESS:
        raise error_for(err, context)
    n = len(result)
    if n == 1:
        return None
    if n == 2:
        return result[1]
    return result[1:]


def no_driver_error(exc: BaseException) -> CUDAError:
    """The CUDAError for a machine where the driver library cannot be loaded."""
    err = CUDAError(
        "no CUDA driver found: the NVIDIA driver library (libcuda) could not be loaded "
        f"({exc}). cuforge's compile and cache layers work without it; running kernels, "
        "streams, events and memory needs an NVIDIA GPU with its driver installed."
    )
    err.__cause__ = exc
    return err
