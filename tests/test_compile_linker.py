"""Linker on nvJitLink: LTO-IR + LTO-IR -> cubin/PTX, mixed inputs, error paths."""

from __future__ import annotations

import pytest

from cuforge.compile import CompileError, Linker, LinkerOptions, ObjectCode, Program, ProgramOptions

ARCH = "sm_90"
LIB = 'extern "C" __device__ int twice(int x) { return 2 * x; }'
MAIN = """
extern "C" __device__ int twice(int x);
extern "C" __global__ void apply(int* p) { *p = twice(*p); }
"""


@pytest.fixture(scope="module")
def ltoirs() -> tuple[ObjectCode, ObjectCode]:
    opts = ProgramOptions(arch=ARCH, relocatable_device_code=True, link_time_optimization=True)
    lib = Program(LIB, "c++", opts).compile("ltoir")
    main = Program(MAIN, "c++", opts).compile("ltoir")
    return lib, main


def test_ltoir_plus_ltoir_to_cubin(ltoirs):
    with Linker(*ltoirs, options=LinkerOptions(arch=ARCH, link_time_optimization=True)) as linker:
        cubin = linker.link("cubin")
        assert "LTO" in linker.get_info_log() or linker.get_info_log() == ""
    assert cubin.code_type == "cubin"
    assert cubin.code[:4] == b"\x7fELF"
    assert b"apply" in cubin.code


def test_ltoir_link_to_ptx_needs_lto(ltoirs):
    ptx = Linker(*ltoirs, options=LinkerOptions(arch=ARCH, link_time_optimization=True)).link("PTX")
    assert ptx.code_type == "ptx" and b".entry apply" in ptx.code
    # twice() was inlined across modules: LTO really happened.
    assert b"twice" not in ptx.code
    with pytest.raises(ValueError, match="link_time_optimization=True"):
        Linker(*ltoirs, options=LinkerOptions(arch=ARCH)).link("ptx")


def test_link_cubin_inputs_relocatable():
    opts = ProgramOptions(arch=ARCH, relocatable_device_code=True)
    lib = Program(LIB, "c++", opts).compile("cubin")
    main = Program(MAIN, "c++", opts).compile("ptx")
    cubin = Linker(lib, main, options=LinkerOptions(arch=ARCH)).link("cubin")
    assert cubin.code[:4] == b"\x7fELF"


def test_unresolved_symbol_is_compile_error_with_log(ltoirs):
    _, main = ltoirs
    with pytest.raises(CompileError) as info:
        Linker(main, options=LinkerOptions(arch=ARCH, link_time_optimization=True)).link("cubin")
    assert info.value.backend == "nvJitLink"
    assert "twice" in info.value.log
    assert "-lto" in info.value.options


def test_linker_argument_errors(ltoirs):
    with pytest.raises(ValueError, match="at least one"):
        Linker(options=LinkerOptions(arch=ARCH))
    with pytest.raises(TypeError, match=r"object_codes\[1\]"):
        Linker(ltoirs[0], b"raw bytes", options=LinkerOptions(arch=ARCH))
    with pytest.raises(TypeError, match="LinkerOptions"):
        Linker(ltoirs[0], options=ProgramOptions(arch=ARCH))
    linker = Linker(*ltoirs, options=LinkerOptions(arch=ARCH, link_time_optimization=True))
    with pytest.raises(ValueError, match="'cubin', 'ptx'"):
        linker.link("ltoir")
    linker.close()
    with pytest.raises(RuntimeError, match="closed"):
        linker.link("cubin")


def test_symbol_mappings_carry_through_link():
    opts = ProgramOptions(arch=ARCH, relocatable_device_code=True, link_time_optimization=True)
    tmpl = Program("template <int N> __global__ void k(int* p) { *p = N; }", "c++", opts).compile(
        "ltoir", name_expressions=["k<3>"]
    )
    linked = Linker(tmpl, options=LinkerOptions(arch=ARCH, link_time_optimization=True)).link(
        "cubin"
    )
    assert linked.symbol_mapping["k<3>"].startswith("_Z")
    assert linked.symbol_mapping["k<3>"].encode() in linked.code
