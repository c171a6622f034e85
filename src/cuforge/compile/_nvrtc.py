"""NVRTC backend: CUDA C++ source -> PTX, cubin or LTO-IR.

Guarantee: one call creates, compiles and destroys its own NVRTC program, so
nothing leaks on any path and a ``Program`` costs nothing until it compiles. Any
NVRTC failure raises CompileError with the program log and the flags used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from cuforge import _cuda
from cuforge.compile.errors import CompileError, decode_log

# target -> (size getter, getter) names in cuda.bindings.nvrtc
_OUTPUTS = {
    "ptx": ("nvrtcGetPTXSize", "nvrtcGetPTX"),
    "cubin": ("nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
    "ltoir": ("nvrtcGetLTOIRSize", "nvrtcGetLTOIR"),
}


class _Failed(Exception):
    def __init__(self, status: Any) -> None:
        self.status = status


def _check(result: tuple[Any, ...]) -> tuple[Any, ...]:
    from cuda.bindings import nvrtc

    err, *rest = result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise _Failed(err)
    return tuple(rest)


def _log(prog: Any) -> str:
    from cuda.bindings import nvrtc

    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return decode_log(buf)


def _program_name(name: str) -> bytes:
    """The name NVRTC is handed for ``name``: as the OS spells it (any file name, UTF-8
    or not), and ``./`` before one that starts with ``-``, which NVRTC would otherwise
    read as a command-line flag (``-weird.cu``: "invalid number: ird.cu"). Only what
    NVRTC sees changes -- its diagnostics then say ``./-weird.cu`` -- never the
    program's name in the cache key, its errors or its ObjectCode."""
    raw = os.fsencode(name)
    return b"./" + raw if raw.startswith(b"-") else raw


def compile_cpp(
    source: bytes,
    name: str,
    options: Sequence[bytes],
    target: str,
    name_expressions: Sequence[str | bytes] = (),
    headers: Mapping[str, bytes] | None = None,
) -> tuple[bytes, str, dict[str | bytes, str]]:
    """Compile ``source`` with ``options`` to ``target``.

    ``headers`` (include name -> content) are handed to NVRTC in memory; it takes
    them before any directory it searches.

    Returns ``(code, log, symbol_mapping)``: the raw output bytes, the program log
    (warnings; "" when clean) and each name expression -> its mangled name (str).

    Raises:
        CompileError: NVRTC rejected the options, the source or a name expression.
        ToolkitNotFoundError: no NVRTC of the bindings' CUDA major (names the extra).
    """
    _cuda.require("nvrtc")
    from cuda.bindings import nvrtc

    names = list(headers or ())
    err, prog = nvrtc.nvrtcCreateProgram(
        source,
        _program_name(name),
        len(names),
        [headers[n] for n in names] if headers else [],
        [n.encode("utf-8", "surrogateescape") for n in names],
    )
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError("NVRTC", err.name, "", options, name)
    log = ""
    try:
        try:
            for expr in name_expressions:
                raw = expr.encode() if isinstance(expr, str) else expr
                _check(nvrtc.nvrtcAddNameExpression(prog, raw))
            _check(nvrtc.nvrtcCompileProgram(prog, len(options), list(options)))
            log = _log(prog)
            size_fn, get_fn = _OUTPUTS[target]
            (size,) = _check(getattr(nvrtc, size_fn)(prog))
            buf = b" " * size
            _check(getattr(nvrtc, get_fn)(prog, buf))
            mapping: dict[str | bytes, str] = {}
            for expr in name_expressions:
                raw = expr.encode() if isinstance(expr, str) else expr
                (lowered,) = _check(nvrtc.nvrtcGetLoweredName(prog, raw))
                mapping[expr] = lowered.decode() if isinstance(lowered, bytes) else str(lowered)
        except _Failed as failed:
            raise CompileError(
                "NVRTC", failed.status.name, log or _log(prog), options, name
            ) from None
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    # PTX is NUL-terminated text; the other outputs are exact-size binaries.
    code = buf.rstrip(b"\0") if target == "ptx" else buf
    return code, log, mapping
