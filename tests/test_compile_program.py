"""Program with CUDA C++ (NVRTC) and PTX (nvJitLink): outputs, name expressions,
logs, every error path, and the no-driver import guarantee."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import warnings

import pytest

from cuforge.compile import CompileError, ObjectCode, Program, ProgramOptions, _versions
from cuforge.compile.cache import _toolkit

ARCH = "sm_90"
SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
TEMPLATE = r"""
template <typename T> __global__ void fill(T* p, T v) { p[threadIdx.x] = v; }
namespace ns { __global__ void plain(int* p) { *p = 1; } }
"""


@pytest.fixture(scope="module")
def opts() -> ProgramOptions:
    return ProgramOptions(arch=ARCH)


@pytest.fixture(scope="module")
def saxpy_ptx(opts) -> ObjectCode:
    return Program(SAXPY, "c++", opts).compile("ptx")


def test_cpp_to_ptx(saxpy_ptx):
    assert saxpy_ptx.code_type == "ptx"
    assert b".entry saxpy" in saxpy_ptx.code
    assert b".target sm_90" in saxpy_ptx.code
    assert not saxpy_ptx.code.endswith(b"\0")
    assert saxpy_ptx.name == "<default program>"


def test_cpp_to_cubin_and_ltoir_case_insensitive(opts):
    program = Program(SAXPY, "C++", opts)
    cubin = program.compile("CUBIN")
    assert cubin.code_type == "cubin" and cubin.code[:4] == b"\x7fELF"
    ltoir = program.compile(" LtoIR ")
    assert ltoir.code_type == "ltoir"
    # LTO-IR is an NVVM container, neither ELF nor text.
    assert ltoir.code[:4] == b"\xedCN\x7f"


def test_name_expressions_map_to_mangled_names(opts):
    obj = Program(TEMPLATE, "c++", opts).compile(
        "cubin", name_expressions=["fill<float>", b"fill<int>", "ns::plain"]
    )
    mapping = obj.symbol_mapping
    assert set(mapping) == {"fill<float>", b"fill<int>", "ns::plain"}
    assert mapping["fill<float>"] == "_Z4fillIfEvPT_S0_"
    assert (
        mapping[b"fill<int>"].startswith("_Z") and mapping[b"fill<int>"] != mapping["fill<float>"]
    )
    assert mapping["ns::plain"].startswith("_ZN2ns5plain")
    # The mangled names are real symbols of the cubin.
    for mangled in mapping.values():
        assert mangled.encode() in obj.code
    # symbol_mapping is a copy: mutating it does not change the ObjectCode.
    mapping.clear()
    assert obj.symbol_mapping


def test_logs_receive_warnings_on_success(opts):
    logs = io.StringIO()
    Program("__global__ void k() { int unused; }", "c++", opts).compile("ptx", logs=logs)
    assert "unused" in logs.getvalue() and "warning" in logs.getvalue()
    clean = io.StringIO()
    Program(SAXPY, "c++", opts).compile("ptx", logs=clean)
    assert clean.getvalue() == ""


def test_compile_failure_is_compile_error_with_log_and_options():
    options = ProgramOptions(arch=ARCH, name="broken.cu", std="c++17")
    with pytest.raises(CompileError) as info:
        Program("__global__ void k() { nope(); }", "c++", options).compile("cubin")
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.backend == "NVRTC" and err.status == "NVRTC_ERROR_COMPILATION"
    assert 'identifier "nope" is undefined' in err.log
    assert "broken.cu" in err.log
    # The user's flags, then the toolkit's include directories (see test_compile_toolkit.py).
    toolkit = tuple(f"--include-path={d}" for d in _toolkit.toolkit_include_dirs())
    assert toolkit, "the header wheels cuforge depends on should be found here"
    assert err.options == ("--gpu-architecture=sm_90", "--std=c++17", *toolkit)
    assert "nope" in str(err)


def test_invalid_name_expression_is_compile_error(opts):
    with pytest.raises(CompileError):
        Program(TEMPLATE, "c++", opts).compile("ptx", name_expressions=["does_not_exist<int>"])


@pytest.mark.parametrize("code_type", ["cuda", "c", "", "PTXAS"])
def test_bad_code_type_lists_valid_ones(code_type, opts):
    with pytest.raises(ValueError, match=r"'c\+\+', 'ptx', 'nvvm'"):
        Program(SAXPY, code_type, opts)


def test_code_type_must_be_str(opts):
    with pytest.raises(TypeError, match="code_type"):
        Program(SAXPY, None, opts)


@pytest.mark.parametrize(
    ("code_type", "target", "valid"),
    [
        ("c++", "fatbin", "'ptx', 'cubin', 'ltoir'"),
        ("c++", "sass", "'ptx', 'cubin', 'ltoir'"),
        ("ptx", "ptx", "'cubin'"),
        ("ptx", "ltoir", "'cubin'"),
    ],
)
def test_bad_target_pair_lists_valid_targets(code_type, target, valid, opts, saxpy_ptx):
    code = SAXPY if code_type == "c++" else saxpy_ptx.code.decode()
    with pytest.raises(ValueError, match=valid):
        Program(code, code_type, opts).compile(target)


def test_argument_type_errors(opts):
    with pytest.raises(TypeError, match="code"):
        Program(b"bytes source", "c++", opts)
    with pytest.raises(ValueError, match="empty"):
        Program("   ", "c++", opts)
    with pytest.raises(TypeError, match="ProgramOptions"):
        Program(SAXPY, "c++", {"arch": ARCH})
    program = Program(TEMPLATE, "c++", opts)
    with pytest.raises(TypeError, match=r"name_expressions\[0\]"):
        program.compile("ptx", name_expressions=[bytearray(b"fill<int>")])
    with pytest.raises(TypeError, match="target_type"):
        program.compile(3)
    with pytest.raises(TypeError, match="logs"):
        program.compile("ptx", logs=[])


def test_target_contradicting_options_is_value_error():
    lto = ProgramOptions(arch=ARCH, link_time_optimization=True)
    with pytest.raises(ValueError, match="ltoir"):
        Program(SAXPY, "c++", lto).compile("cubin")
    assert Program(SAXPY, "c++", lto).compile("ltoir").code_type == "ltoir"
    virtual = ProgramOptions(arch="compute_90")
    with pytest.raises(ValueError, match="sm_XY"):
        Program(SAXPY, "c++", virtual).compile("cubin")
    assert b".target sm_90" in Program(SAXPY, "c++", virtual).compile("ptx").code


def test_unsupported_option_fails_at_construction():
    with pytest.raises(ValueError, match=r"ProgramOptions\.use_libdevice"):
        Program(SAXPY, "c++", ProgramOptions(arch=ARCH, use_libdevice=True))


def test_cache_argument_must_be_a_program_cache(opts):
    with pytest.raises(TypeError, match=r"cache must be a cuforge\.utils\.ProgramCacheResource"):
        Program(SAXPY, "c++", opts).compile("ptx", cache=object())


def test_close_and_context_manager(opts):
    with Program(SAXPY, "c++", opts) as program:
        assert program.backend == "NVRTC"
        program.compile("ptx")
    with pytest.raises(RuntimeError, match="closed"):
        program.compile("ptx")
    program.close()  # idempotent


def test_ptx_to_cubin_with_nvjitlink(saxpy_ptx):
    program = Program(saxpy_ptx.code.decode(), "ptx", ProgramOptions(arch=ARCH, lineinfo=True))
    assert program.backend == "nvJitLink"
    cubin = program.compile("cubin")
    assert cubin.code[:4] == b"\x7fELF" and b"saxpy" in cubin.code


def test_bad_ptx_is_compile_error():
    with pytest.raises(CompileError) as info:
        bad = ".version 9.0\n.target sm_90\nthis is not ptx"
        Program(bad, "ptx", ProgramOptions(arch=ARCH)).compile("cubin")
    assert info.value.backend == "nvJitLink"
    assert "-arch=sm_90" in info.value.options


def test_ptx_options_nvjitlink_cannot_apply_fail_early(saxpy_ptx):
    with pytest.raises(ValueError, match=r"ProgramOptions\.std"):
        Program(saxpy_ptx.code.decode(), "ptx", ProgramOptions(arch=ARCH, std="c++17"))


def test_ptx_loadability_warning_text():
    assert _versions.ptx_loadability_warning((13, 5), 13000) is not None
    assert "13.5" in _versions.ptx_loadability_warning((13, 5), 13000)
    assert _versions.ptx_loadability_warning((13, 0), 13000) is None
    assert _versions.ptx_loadability_warning((12, 8), 13000) is None


def test_ptx_toolkit_version_read_from_header(saxpy_ptx):
    assert _versions.ptx_toolkit_version(saxpy_ptx.code) == _versions.nvrtc_version()
    assert _versions.ptx_toolkit_version(b".version 9.0\n") is None


def test_ptx_compile_warns_only_when_driver_is_older(opts):
    driver = _versions.driver_version()
    compiler = _versions.nvrtc_version()
    expect = driver is not None and _versions.ptx_loadability_warning(compiler, driver)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Program(SAXPY, "c++", opts).compile("ptx")
        Program(SAXPY, "c++", opts).compile("cubin")
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == (1 if expect else 0)
    if expect:
        # The warning points at the caller's compile(), not into cuforge.
        assert runtime[0].filename == __file__


def test_compile_layer_never_loads_the_driver():
    # cuda.bindings.nvrtc imports the driver *bindings* module itself; what must not
    # happen is libcuda being loaded, or cuforge's runtime layer being imported.
    script = textwrap.dedent(
        """
        import sys
        import cuforge
        from cuforge import Program, ProgramOptions
        p = Program('extern "C" __global__ void k() {}', "c++", ProgramOptions(arch="sm_90"))
        assert "cuda.bindings.nvrtc" not in sys.modules, "NVRTC loaded before compile"
        p.compile("cubin")
        with open("/proc/self/maps") as f:
            maps = f.read()
        assert "libcuda.so" not in maps, "libcuda mapped"
        assert "cuforge.runtime" not in " ".join(sys.modules), "runtime layer imported"
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
