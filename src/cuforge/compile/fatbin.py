"""One fatbin from several compiled programs: cubins (one per real arch) and PTX
(for virtual archs, which the driver JIT-compiles for GPUs newer than any cubin).

:func:`pack_fatbin` packs with nvFatbin (``cuda.bindings.nvfatbin``; the
``nvidia-nvfatbin`` wheel, in the ``cu13``/``cu12`` extras). The parts are ordinary
ObjectCode, so each is compiled -- and cached -- per arch: adding an arch to a
fatbin compiles that arch only. The result is an ``ObjectCode`` of code type
``fatbin``, loadable like a cubin (``get_kernel``), and written as is by
``cuforge compile -o k.fatbin``.

Guarantee: one call owns one nvFatbin handle and destroys it on every path; an
nvFatbin failure raises CompileError naming the part and the library's message.
Raises ValueError for a part that is not a cubin or PTX, or two parts of one arch
and kind (the fatbin could hold only one of them).
"""

from __future__ import annotations

from collections.abc import Sequence

from cuforge import _cuda
from cuforge.compile.errors import CompileError
from cuforge.compile.object_code import ObjectCode

__all__ = ["pack_fatbin"]


def _arch_number(arch: str) -> str:
    """``sm_90`` / ``compute_90a`` -> ``90`` / ``90a`` (what nvFatbin takes)."""
    for prefix in ("sm_", "compute_", "lto_"):
        if arch.startswith(prefix) and arch[len(prefix) :][:1].isdigit():
            return arch[len(prefix) :]
    raise ValueError(f"pack_fatbin: arch {arch!r} is not sm_XY or compute_XY")


def pack_fatbin(parts: Sequence[tuple[ObjectCode, str]], name: str = "") -> ObjectCode:
    """A fatbin holding every ``(ObjectCode, arch)`` of ``parts`` (cubin or PTX).

    Raises:
        ValueError: no parts, a part that is not cubin/PTX, a bad arch, or two
            parts of one arch and kind.
        ToolkitNotFoundError: nvFatbin is not installed.
        CompileError: nvFatbin refused a part.
    """
    if not parts:
        raise ValueError("pack_fatbin needs at least one cubin or PTX")
    seen: set[tuple[str, str]] = set()
    checked = []
    for obj, arch in parts:
        if not isinstance(obj, ObjectCode) or obj.code_type not in ("cubin", "ptx"):
            kind = obj.code_type if isinstance(obj, ObjectCode) else type(obj).__name__
            raise ValueError(f"pack_fatbin takes cubin and PTX ObjectCode, got {kind}")
        number = _arch_number(arch)
        if (obj.code_type, number) in seen:
            raise ValueError(f"pack_fatbin: two {obj.code_type} parts for arch {arch}")
        seen.add((obj.code_type, number))
        checked.append((obj, number))
    _cuda.require("nvfatbin")
    from cuda.bindings import nvfatbin

    handle = nvfatbin.create([], 0)
    try:
        for obj, number in checked:
            label = obj.name or name or "program"
            try:
                if obj.code_type == "cubin":
                    nvfatbin.add_cubin(handle, obj.code, len(obj.code), number, label)
                else:
                    ptx = obj.code if obj.code.endswith(b"\0") else obj.code + b"\0"
                    nvfatbin.add_ptx(handle, ptx, len(ptx), number, label, "")
            except nvfatbin.nvFatbinError as exc:
                status = getattr(getattr(exc, "status", None), "name", type(exc).__name__)
                log = f"the {obj.code_type} for arch {number}: {exc}"
                raise CompileError("nvFatbin", str(status), log, [], label) from None
        buffer = bytearray(nvfatbin.size(handle))
        nvfatbin.get(handle, buffer)
    finally:
        nvfatbin.destroy(handle)
    return ObjectCode._trusted(bytes(buffer), "fatbin", name, {})
