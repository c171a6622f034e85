"""libNVVM backend: NVVM IR (text or bitcode) -> PTX or LTO-IR.

Guarantee: one call owns one libNVVM program and destroys it on every path. The
program is verified before it is compiled, so malformed IR fails with the
verifier's log. Any libNVVM failure raises CompileError with the program log and
the flags used.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from cuforge import _cuda
from cuforge._names import shown
from cuforge.compile.errors import CompileError, decode_log


@functools.cache
def libdevice_path() -> str:
    """Absolute path of ``libdevice.10.bc`` as cuda-pathfinder finds it.

    Raises:
        RuntimeError: libdevice cannot be found (install ``nvidia-nvvm``).
    """
    try:
        from cuda.pathfinder import find_bitcode_lib

        return str(find_bitcode_lib("device"))
    except Exception as exc:
        raise RuntimeError(
            f"use_libdevice=True but libdevice was not found ({exc}); install nvidia-nvvm"
        ) from None


def _log(prog: int) -> str:
    from cuda.bindings import nvvm

    try:
        size = nvvm.get_program_log_size(prog)
        if size <= 1:
            return ""
        buf = bytearray(size)
        nvvm.get_program_log(prog, buf)
    except Exception:
        return ""
    return decode_log(buf)


def compile_nvvm(
    modules: Sequence[tuple[bytes, str]],
    options: Sequence[bytes],
    use_libdevice: bool = False,
    name: str = "",
) -> tuple[bytes, str]:
    """Link ``(ir, module_name)`` modules (and libdevice, lazily) and compile them.

    The output is PTX, or LTO-IR when ``options`` holds ``-gen-lto``. Returns
    ``(code, log)``.

    Raises:
        CompileError: libNVVM rejected a module, the options or the program.
        ToolkitNotFoundError: no libNVVM (or cuda-bindings without cuda.bindings.nvvm).
    """
    _cuda.require("nvvm")
    from cuda.bindings import nvvm

    flags = [o.decode() for o in options]
    libdevice = b""
    if use_libdevice:
        with open(libdevice_path(), "rb") as f:
            libdevice = f.read()
    prog = nvvm.create_program()
    try:
        try:
            for code, module_name in modules:
                # libNVVM takes the name as UTF-8 text: bytes that are not UTF-8 go as
                # \xNN (cuforge._names).
                nvvm.add_module_to_program(prog, code, len(code), shown(module_name))
            if libdevice:
                # Lazy: only the functions the program calls are linked in.
                nvvm.lazy_add_module_to_program(prog, libdevice, len(libdevice), "libdevice")
            nvvm.verify_program(prog, len(flags), flags)
            nvvm.compile_program(prog, len(flags), flags)
            log = _log(prog)
            buf = bytearray(nvvm.get_compiled_result_size(prog))
            nvvm.get_compiled_result(prog, buf)
        except nvvm.nvvmError as exc:
            raise CompileError("libNVVM", str(exc), _log(prog), flags, name) from None
    finally:
        nvvm.destroy_program(prog)
    code = bytes(buf)
    return (code if "-gen-lto" in flags else code.rstrip(b"\0")), log
