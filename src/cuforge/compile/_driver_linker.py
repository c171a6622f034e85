"""Driver-linker fallback (``cuLink*``): PTX -> cubin when nvJitLink is unavailable.

Guarantee: used only when nvJitLink cannot be loaded (see ``linker.linker_backend``).
It needs a driver and a current CUDA context (the driver JIT targets that context's
device unless ``target=`` is given); without one it raises CompileError saying so.
The link state is destroyed on every path.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from typing import Any

from cuforge.compile.errors import CompileError, decode_log

_LOG_SIZE = 1 << 16


def _jit_options(options: Sequence[bytes]) -> tuple[list[Any], list[Any]]:
    """Translate ``ProgramOptions.as_driver_linker_options()`` into CUjit pairs."""
    from cuda.bindings import driver

    keys: list[Any] = []
    values: list[Any] = []
    jit = driver.CUjit_option
    for item in options:
        key, _, value = item.decode().partition("=")
        if key == "target":
            keys.append(jit.CU_JIT_TARGET)
            values.append(getattr(driver.CUjit_target, f"CU_TARGET_COMPUTE_{value.upper()}"))
        elif key == "max_registers":
            keys.append(jit.CU_JIT_MAX_REGISTERS)
            values.append(int(value))
        elif key == "generate_debug_info":
            keys.append(jit.CU_JIT_GENERATE_DEBUG_INFO)
            values.append(int(value))
        elif key == "generate_line_info":
            keys.append(jit.CU_JIT_GENERATE_LINE_INFO)
            values.append(int(value))
        else:  # pragma: no cover - as_driver_linker_options emits only the above
            raise ValueError(f"unknown driver linker option {item!r}")
    return keys, values


def link_ptx(ptx: bytes, options: Sequence[bytes], name: str = "") -> tuple[bytes, str]:
    """Link one PTX module to a cubin with the driver. Returns ``(cubin, info_log)``.

    Raises:
        CompileError: no driver/context, or the driver JIT rejected the PTX.
    """
    try:
        from cuda.bindings import driver

        driver.cuDriverGetVersion()
    except Exception as exc:
        raise CompileError(
            "driver linker",
            "NO_DRIVER",
            f"nvJitLink is unavailable and the CUDA driver cannot be loaded: {exc}",
            options,
            name,
        ) from None
    ok = driver.CUresult.CUDA_SUCCESS
    info_buf, error_buf = bytearray(_LOG_SIZE), bytearray(_LOG_SIZE)
    jit = driver.CUjit_option
    keys, values = _jit_options(options)
    keys += [
        jit.CU_JIT_INFO_LOG_BUFFER,
        jit.CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        jit.CU_JIT_ERROR_LOG_BUFFER,
        jit.CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ]
    values += [info_buf, _LOG_SIZE, error_buf, _LOG_SIZE]
    err, state = driver.cuLinkCreate(len(keys), keys, values)
    if err != ok:
        hint = " (is a CUDA context current?)" if "CONTEXT" in err.name else ""
        raise CompileError("driver linker", err.name + hint, "", options, name)
    try:
        data = ptx if ptx.endswith(b"\0") else ptx + b"\0"
        (err,) = driver.cuLinkAddData(
            state,
            driver.CUjitInputType.CU_JIT_INPUT_PTX,
            data,
            len(data),
            os.fsencode(name or "ptx"),  # any file name, as the OS spells it
            0,
            None,
            None,
        )
        if err == ok:
            err, cubin_ptr, size = driver.cuLinkComplete(state)
        if err != ok:
            raise CompileError("driver linker", err.name, decode_log(error_buf), options, name)
        # The image lives in the link state; copy it out before destroying that.
        cubin = ctypes.string_at(int(cubin_ptr), int(size))
    finally:
        driver.cuLinkDestroy(state)
    return cubin, decode_log(info_buf)
