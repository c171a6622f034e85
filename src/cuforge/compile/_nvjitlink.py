"""nvJitLink backend: link cubin/PTX/LTO-IR/fatbin/object/library inputs.

Guarantee: one call owns one nvJitLink handle and destroys it on every path. Any
nvJitLink failure raises CompileError carrying the error log (falling back to the
info log) and the flags used.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuforge import _cuda
from cuforge._names import shown
from cuforge.compile.errors import CompileError, decode_log

# ObjectCode.code_type -> nvjitlink.InputType member name
_INPUT_TYPES = {
    "cubin": "CUBIN",
    "ptx": "PTX",
    "ltoir": "LTOIR",
    "fatbin": "FATBIN",
    "object": "OBJECT",
    "library": "LIBRARY",
}


def _read_log(handle: int, which: str) -> str:
    from cuda.bindings import nvjitlink

    try:
        size = getattr(nvjitlink, f"get_{which}_log_size")(handle)
        if size <= 1:
            return ""
        buf = bytearray(size)
        getattr(nvjitlink, f"get_{which}_log")(handle, buf)
    except Exception:
        return ""
    return decode_log(buf)


def link(
    inputs: Sequence[tuple[bytes, str, str]],
    options: Sequence[bytes],
    target: str,
    name: str = "",
) -> tuple[bytes, str]:
    """Link ``(code, code_type, name)`` inputs to ``target`` ("cubin" or "ptx").

    Returns ``(code, info_log)``.

    Raises:
        CompileError: nvJitLink rejected an option, an input or the link.
        ToolkitNotFoundError: nvJitLink is not of the bindings' CUDA major.
    """
    _cuda.require("nvJitLink")
    from cuda.bindings import nvjitlink

    flags = [o.decode() for o in options]
    try:
        handle = nvjitlink.create(len(flags), flags)
    except nvjitlink.nvJitLinkError as exc:
        raise CompileError("nvJitLink", str(exc), "", flags, name) from None
    try:
        try:
            for code, code_type, input_name in inputs:
                kind = getattr(nvjitlink.InputType, _INPUT_TYPES[code_type])
                # nvJitLink takes the label as UTF-8 text: a name's bytes that are not
                # UTF-8 go as \xNN (cuforge._names).
                label = shown(input_name or code_type)
                nvjitlink.add_data(handle, kind, code, len(code), label)
            nvjitlink.complete(handle)
            if target == "cubin":
                buf = bytearray(nvjitlink.get_linked_cubin_size(handle))
                nvjitlink.get_linked_cubin(handle, buf)
            else:
                buf = bytearray(nvjitlink.get_linked_ptx_size(handle))
                nvjitlink.get_linked_ptx(handle, buf)
        except nvjitlink.nvJitLinkError as exc:
            log = _read_log(handle, "error") or _read_log(handle, "info")
            raise CompileError("nvJitLink", str(exc), log, flags, name) from None
        info = _read_log(handle, "info")
    finally:
        nvjitlink.destroy(handle)
    code = bytes(buf)
    return (code.rstrip(b"\0") if target == "ptx" else code), info
