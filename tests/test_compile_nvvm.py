"""Program with NVVM IR (libNVVM): PTX and LTO-IR output, libdevice, extra_sources."""

from __future__ import annotations

import pytest

from cuforge.compile import CompileError, Linker, LinkerOptions, Program, ProgramOptions

ARCH = "sm_90"
_LAYOUT = (
    "e-p:64:64:64-i1:8:8-i8:8:8-i16:16:16-i32:32:32-i64:64:64-i128:128:128-"
    "f32:32:32-f64:64:64-v16:16:16-v32:32:32-v64:64:64-v128:128:128-n16:32:64"
)


def _version_metadata(index: int) -> str:
    from cuda.bindings import nvvm

    major, minor, dbg_major, dbg_minor = nvvm.ir_version()
    return (
        f"!nvvmir.version = !{{!{index}}}\n"
        f"!{index} = !{{i32 {major}, i32 {minor}, i32 {dbg_major}, i32 {dbg_minor}}}\n"
    )


def nvvm_module(body: str, kernels: list[tuple[str, str]]) -> str:
    """A complete NVVM IR text module: header, ``body``, kernel annotations, version."""
    annotations = "".join(
        f'!{i} = !{{{sig} @{name}, !"kernel", i32 1}}\n' for i, (name, sig) in enumerate(kernels)
    )
    refs = ", ".join(f"!{i}" for i in range(len(kernels)))
    return (
        f'target datalayout = "{_LAYOUT}"\ntarget triple = "nvptx64-nvidia-cuda"\n\n'
        f"{body}\n"
        f"!nvvm.annotations = !{{{refs}}}\n{annotations}" + _version_metadata(len(kernels))
    )


STORE = nvvm_module(
    """
define void @store42(i32* %p) {
entry:
  store i32 42, i32* %p
  ret void
}
""",
    [("store42", "void (i32*)*")],
)


def test_nvvm_to_ptx():
    obj = Program(STORE, "nvvm", ProgramOptions(arch=ARCH)).compile("ptx")
    assert obj.code_type == "ptx"
    assert b".entry store42" in obj.code
    assert b".target sm_90" in obj.code
    assert b"42" in obj.code


def test_nvvm_bytes_to_ltoir_is_linkable():
    ltoir = Program(STORE.encode(), "NVVM", ProgramOptions(arch=ARCH)).compile("ltoir")
    assert ltoir.code_type == "ltoir" and ltoir.code[:4] == b"\xedCN\x7f"
    linker = Linker(ltoir, options=LinkerOptions(arch=ARCH, link_time_optimization=True))
    assert linker.link("cubin").code[:4] == b"\x7fELF"
    # Note: with this text IR, nvJitLink's LTO keeps no kernel (the cubin is empty);
    # see the report of the compile work. PTX output (above) keeps it.


def test_nvvm_options_reach_libnvvm():
    fast = Program(STORE, "nvvm", ProgramOptions(arch=ARCH, device_code_optimize=False))
    assert fast.compile("ptx").code_type == "ptx"


SQRT = nvvm_module(
    """
declare float @__nv_sqrtf(float)

define void @root(float* %p) {
entry:
  %v = load float, float* %p
  %r = call float @__nv_sqrtf(float %v)
  store float %r, float* %p
  ret void
}
""",
    [("root", "void (float*)*")],
)


def test_use_libdevice_resolves_nv_functions():
    unresolved = Program(SQRT, "nvvm", ProgramOptions(arch=ARCH)).compile("ptx")
    assert b".extern .func" in unresolved.code and b"__nv_sqrtf" in unresolved.code
    ptx = Program(SQRT, "nvvm", ProgramOptions(arch=ARCH, use_libdevice=True)).compile("ptx")
    assert b".entry root" in ptx.code and b"sqrt" in ptx.code
    assert b"__nv_sqrtf" not in ptx.code  # linked in and inlined, not left external


def test_extra_sources_are_linked_at_ir_level():
    helper = nvvm_module("define i32 @helper() {\nentry:\n  ret i32 7\n}\n", []).replace(
        "!nvvm.annotations = !{}\n", ""
    )
    caller = nvvm_module(
        """
declare i32 @helper()

define void @use_helper(i32* %p) {
entry:
  %v = call i32 @helper()
  store i32 %v, i32* %p
  ret void
}
""",
        [("use_helper", "void (i32*)*")],
    )
    opts = ProgramOptions(arch=ARCH, extra_sources=[("helper", helper)])
    ptx = Program(caller, "nvvm", opts).compile("ptx")
    assert b".entry use_helper" in ptx.code and b"7" in ptx.code


def test_bad_ir_is_compile_error_with_log():
    with pytest.raises(CompileError) as info:
        Program("this is not IR", "nvvm", ProgramOptions(arch=ARCH, name="bad.ll")).compile("ptx")
    assert info.value.backend == "libNVVM"
    assert info.value.log  # libNVVM's parser message
    assert "-arch=compute_90" in info.value.options


def test_nvvm_target_and_option_errors():
    with pytest.raises(ValueError, match="'ptx', 'ltoir'"):
        Program(STORE, "nvvm", ProgramOptions(arch=ARCH)).compile("cubin")
    with pytest.raises(ValueError, match=r"ProgramOptions\.std"):
        Program(STORE, "nvvm", ProgramOptions(arch=ARCH, std="c++17"))
    with pytest.raises(ValueError, match="c\\+\\+"):
        Program(STORE, "nvvm", ProgramOptions(arch=ARCH)).compile("ptx", name_expressions=["x"])
