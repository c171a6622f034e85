"""ProgramOptions / LinkerOptions: validation, canonical forms, per-backend flags.

Flag lists are checked against the real NVRTC and nvJitLink: every flag we emit
must be one the compiler accepts.
"""

from __future__ import annotations

import pathlib

import pytest

from cuforge.compile import CompileError, LinkerOptions, Program, ProgramOptions
from cuforge.compile._versions import current_device_arch

ARCH = "sm_90"


def test_arch_missing_without_device_raises_value_error():
    if current_device_arch() is not None:
        pytest.skip("a CUDA device is present here, so arch defaults to it")
    with pytest.raises(ValueError, match=r"arch=") as info:
        ProgramOptions()
    assert "ProgramOptions.arch" in str(info.value)
    with pytest.raises(ValueError, match=r"LinkerOptions.arch"):
        LinkerOptions()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("debug", 1),
        ("ftz", "yes"),
        ("max_register_count", True),
        ("max_register_count", 3.0),
        ("arch", 90),
        ("std", 17),
        ("include_path", b"/usr/include"),
        ("define_macro", 5),
        ("define_macro", [("A", 1)]),
        ("diag_error", "177"),
        ("ptxas_options", [1]),
        ("name", b"prog"),
        ("extra_sources", [("m", 5)]),
    ],
)
def test_wrong_type_is_type_error_naming_field(field, value):
    with pytest.raises(TypeError, match=rf"ProgramOptions\.{field}"):
        ProgramOptions(arch=ARCH, **{field: value}) if field != "arch" else ProgramOptions(
            arch=value
        )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("arch", "90"),
        ("arch", "sm90"),
        ("arch", "lto_90"),
        ("std", "c++18"),
        ("max_register_count", 0),
        ("split_compile", -1),
        ("diag_error", [-3]),
        ("optimization_info", "everything"),
        ("ofast_compile", "fast"),
        ("define_macro", "1BAD"),
        ("define_macro", "has space=1"),
        ("name", ""),
        ("extra_sources", [("m", b"")]),
    ],
)
def test_wrong_value_is_value_error_naming_field(field, value):
    kwargs = {"arch": ARCH, field: value}
    with pytest.raises(ValueError, match=rf"ProgramOptions\.{field}"):
        ProgramOptions(**kwargs)


def test_canonical_forms_and_hashable():
    a = ProgramOptions(
        arch=ARCH,
        include_path=pathlib.Path("/opt/inc"),
        define_macro=("N", "4"),
        diag_suppress=177,
        ptxas_options="-v",
    )
    assert a.include_path == ("/opt/inc",)
    assert a.define_macro == ("N=4",)
    assert a.diag_suppress == (177,)
    assert a.ptxas_options == ("-v",)
    b = ProgramOptions(
        arch=ARCH, include_path=["/opt/inc"], define_macro=["N=4"], diag_suppress=[177],
        ptxas_options=("-v",),
    )  # fmt: skip
    assert a == b and hash(a) == hash(b)
    assert a.as_nvrtc_options() == b.as_nvrtc_options()


def test_frozen():
    opts = ProgramOptions(arch=ARCH)
    with pytest.raises(AttributeError):
        opts.arch = "sm_80"


def test_nvrtc_flags_exact_and_ordered():
    opts = ProgramOptions(
        arch=ARCH,
        std="c++17",
        define_macro=[("A", "1"), "B"],
        undefine_macro="C",
        include_path=["/x", "/y"],
        ftz=False,
        fma=True,
        diag_warn=[1, 2],
        device_code_optimize=True,
    )
    assert opts.as_nvrtc_options() == [
        b"--gpu-architecture=sm_90",
        b"--dopt=on",
        b"--ftz=false",
        b"--fmad=true",
        b"--define-macro=A=1",
        b"--define-macro=B",
        b"--undefine-macro=C",
        b"--include-path=/x",
        b"--include-path=/y",
        b"--std=c++17",
        b"--diag-warn=1,2",
    ]
    # Deterministic: a second call and an equal instance give the same list.
    assert opts.as_nvrtc_options() == opts.as_nvrtc_options()


def test_nvjitlink_and_nvvm_flags():
    opts = ProgramOptions(arch="sm_90a", debug=True, ftz=True, ptxas_options=["-O1", "-v"])
    assert opts.as_nvjitlink_options() == [
        b"-arch=sm_90a",
        b"-g",
        b"-Xptxas=-O1",
        b"-Xptxas=-v",
        b"-ftz=1",
    ]
    nvvm = ProgramOptions(arch="sm_90", device_code_optimize=False, prec_div=False)
    assert nvvm.as_nvvm_options() == [b"-arch=compute_90", b"-opt=0", b"-prec-div=0"]
    driver = ProgramOptions(arch="sm_80", max_register_count=64, lineinfo=True)
    assert driver.as_driver_linker_options() == [
        b"target=80",
        b"generate_line_info=1",
        b"max_registers=64",
    ]


@pytest.mark.parametrize(
    ("method", "field", "value"),
    [
        ("as_nvvm_options", "std", "c++17"),
        ("as_nvvm_options", "use_fast_math", True),
        ("as_nvjitlink_options", "define_macro", "A"),
        ("as_nvjitlink_options", "use_libdevice", True),
        ("as_nvrtc_options", "extra_sources", [("m", "x")]),
        ("as_driver_linker_options", "ftz", True),
    ],
)
def test_option_a_backend_cannot_honour_is_value_error(method, field, value):
    opts = ProgramOptions(arch=ARCH, **{field: value})
    with pytest.raises(ValueError, match=rf"ProgramOptions\.{field} is not supported"):
        getattr(opts, method)()


def test_false_switch_is_not_an_unsupported_option():
    # False asks for nothing, so every backend can honour it.
    assert ProgramOptions(arch=ARCH, use_fast_math=False).as_nvvm_options() == [b"-arch=compute_90"]


def test_every_nvrtc_flag_is_accepted_by_nvrtc(tmp_path):
    opts = ProgramOptions(
        arch=ARCH,
        relocatable_device_code=False,
        extensible_whole_program=True,  # NVRTC rejects it with rdc=true
        lineinfo=True,
        device_code_optimize=True,
        ptxas_options=["-O2"],
        max_register_count=64,
        ftz=True,
        prec_sqrt=False,
        prec_div=False,
        fma=True,
        use_fast_math=True,
        extra_device_vectorization=True,
        define_macro=[("A", "1"), "B"],
        undefine_macro=["C"],
        include_path=[str(tmp_path)],
        no_source_include=True,
        std="c++17",
        builtin_move_forward=True,
        builtin_initializer_list=True,
        disable_warnings=True,
        restrict=True,
        device_as_default_execution_space=True,
        device_int128=True,
        optimization_info="inline",
        no_display_error_number=True,
        diag_error=[20],
        diag_suppress=[177],
        diag_warn=[550],
        brief_diagnostics=True,
        split_compile=0,
        minimal=True,
        no_cache=True,
        frandom_seed="7",
        ofast_compile="0",
        pch_verbose=False,
        pch_messages=False,
        instantiate_templates_in_pch=False,
    )
    src = 'extern "C" __global__ void k(int* p) { *p = A; }'
    obj = Program(src, "c++", opts).compile("cubin")
    assert obj.code[:4] == b"\x7fELF"


def test_side_effect_flags_reach_nvrtc(tmp_path):
    trace = tmp_path / "time.csv"
    opts = ProgramOptions(arch=ARCH, time=trace)
    Program('extern "C" __global__ void k() {}', "c++", opts).compile("ptx")
    assert trace.exists() and "CUDA C++ Frontend" in trace.read_text()


def test_an_invalid_flag_combination_is_a_compile_error_with_the_flags():
    # numba_debug requires debug; NVRTC (not us) decides that, and we surface it.
    opts = ProgramOptions(arch=ARCH, numba_debug=True)
    with pytest.raises(CompileError) as info:
        Program('extern "C" __global__ void k() {}', "c++", opts).compile("ptx")
    assert "-numba-debug" in info.value.options
    assert "numba-debug" in info.value.log


def test_linker_options_validation_and_flags():
    with pytest.raises(TypeError, match=r"LinkerOptions\.time"):
        LinkerOptions(arch=ARCH, time="yes")
    with pytest.raises(ValueError, match=r"LinkerOptions\.optimization_level"):
        LinkerOptions(arch=ARCH, optimization_level=4)
    with pytest.raises(ValueError, match=r"LinkerOptions\.arch"):
        LinkerOptions(arch="hopper")
    opts = LinkerOptions(
        arch=ARCH,
        max_register_count=32,
        time=True,
        verbose=True,
        link_time_optimization=True,
        optimization_level=3,
        lineinfo=True,
        ftz=False,
        prec_div=True,
        prec_sqrt=True,
        fma=True,
        kernels_used=["k"],
        variables_used="v",
        optimize_unused_variables=True,
        ptxas_options="-v",
        split_compile=2,
        split_compile_extended=2,
        no_cache=True,
    )
    assert opts.as_nvjitlink_options() == [
        b"-arch=sm_90",
        b"-maxrregcount=32",
        b"-time",
        b"-verbose",
        b"-lto",
        b"-O3",
        b"-lineinfo",
        b"-ftz=0",
        b"-prec-div=1",
        b"-prec-sqrt=1",
        b"-fma=1",
        b"-kernels-used=k",
        b"-variables-used=v",
        b"-optimize-unused-variables",
        b"-Xptxas=-v",
        b"-split-compile=2",
        b"-split-compile-extended=2",
        b"-no-cache",
    ]
    assert LinkerOptions(arch=ARCH) == LinkerOptions(arch=ARCH)


# -- ProgramOptions is made without importing dataclasses (issue 36, item 9) ---------------
def test_program_options_behave_as_the_frozen_dataclass_they_were():
    """``from cuforge import Program, ProgramOptions`` imported dataclasses (and inspect,
    ast, dis, tokenize behind it): ~6 ms of every compile-only script. The class is now
    made by ``cuforge._fields``; everything public a frozen dataclass offered holds."""
    import copy
    import dataclasses
    import inspect
    import pickle

    opts = ProgramOptions(arch=ARCH, define_macro="N=4", include_path=pathlib.Path("/x"))
    assert repr(opts).startswith("ProgramOptions(name='<default program>', arch='sm_90', ")
    assert "define_macro=('N=4',), undefine_macro=None, include_path=('/x',)" in repr(opts)
    names = [f.name for f in dataclasses.fields(ProgramOptions)]
    assert names[:3] == ["name", "arch", "relocatable_device_code"] and len(names) == 54
    assert [f.name for f in dataclasses.fields(opts)] == names
    assert dataclasses.fields(ProgramOptions)[0].default == "<default program>"
    assert dataclasses.is_dataclass(opts) and dataclasses.is_dataclass(ProgramOptions)
    assert dataclasses.fields(ProgramOptions)[1].metadata["emit"]["nvrtc"] == "--gpu-architecture"
    changed = dataclasses.replace(opts, arch="sm_80", define_macro=("M", "1"))
    assert (changed.arch, changed.define_macro) == ("sm_80", ("M=1",))
    assert changed.include_path == ("/x",)
    with pytest.raises(TypeError, match=r"ProgramOptions\.std"):
        dataclasses.replace(opts, std=17)  # validated like a new instance
    assert dataclasses.asdict(opts)["define_macro"] == ("N=4",)
    assert ProgramOptions.__match_args__ == tuple(names)
    for attempt in (lambda: setattr(opts, "arch", "sm_80"), lambda: delattr(opts, "arch"),
                    lambda: setattr(opts, "fresh", 1)):  # fmt: skip
        with pytest.raises(dataclasses.FrozenInstanceError):
            attempt()
    assert opts.arch == ARCH
    same = ProgramOptions(arch=ARCH, define_macro=["N=4"], include_path="/x")
    assert opts == same and hash(opts) == hash(same) and opts != changed
    assert (opts == ("not", "options")) is False
    assert pickle.loads(pickle.dumps(opts)) == opts == copy.deepcopy(opts)
    assert ProgramOptions("p", ARCH).name == "p"  # positional, in field order
    with pytest.raises(TypeError, match=r"ProgramOptions.__init__\(\) got an unexpected keyword"):
        ProgramOptions(arch=ARCH, no_such_option=True)  # type: ignore[call-arg]
    params = list(inspect.signature(ProgramOptions).parameters)
    assert params == names
    assert inspect.signature(ProgramOptions).parameters["arch"].default is None


@pytest.mark.parametrize("options", ["StreamOptions", "EventOptions"])
def test_runtime_options_stay_frozen_dataclasses(options):
    import dataclasses

    import cuforge

    cls = getattr(cuforge, options)
    made = cls()
    assert dataclasses.is_dataclass(made) and made == cls() and hash(made) == hash(cls())
    first = dataclasses.fields(cls)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, first.name, first.default)
    assert repr(made).startswith(f"{options}({first.name}=")


def test_a_fields_class_refuses_to_inherit_fields_it_would_drop():
    """``cuforge._fields`` reads a class's own annotations only: a subclass of such a
    class (or of a dataclass) is refused rather than made without the base's fields."""
    import dataclasses

    from cuforge._fields import dataclass

    with pytest.raises(TypeError, match=r"Child: .* cannot inherit fields \(ProgramOptions\)"):

        @dataclass(frozen=True)
        class Child(ProgramOptions):
            extra: int = 0

    @dataclasses.dataclass(frozen=True)
    class Real:
        a: int = 0

    with pytest.raises(TypeError, match=r"cannot inherit fields \(Real\)"):

        @dataclass(frozen=True)
        class Other(Real):
            b: int = 0


def test_the_arch_and_macro_checks_read_as_the_patterns_they_replace():
    """``_validate`` compiled two regular expressions at import (``re``: ~3 ms of a cold
    process); the checks written out accept exactly what the patterns accepted."""
    import re

    from hypothesis import given, settings
    from hypothesis import strategies as st

    from cuforge.compile import _validate

    arch = re.compile(r"(sm|compute)_(\d{2,3})([af]?)")
    macro = re.compile(r"[A-Za-z_]\w*(\([\w\s,.]*\))?")
    pieces = st.sampled_from(
        ["sm", "compute", "_", "9", "90", "100", "a", "f", "x", "(", ")", ",", ".", " ", "\t",
         "\u0663", "\u00e9", "N", "_A", "=", "-", "\u2167", "\u00a0"]
    )  # fmt: skip
    texts = st.one_of(st.lists(pieces, max_size=8).map("".join), st.text(max_size=12))

    @settings(max_examples=3000, derandomize=True, deadline=None)
    @given(texts)
    def same(text: str) -> None:
        assert _validate.arch_ok(text) is bool(arch.fullmatch(text)), text
        assert _validate.macro_name_ok(text) is bool(macro.fullmatch(text)), text

    same()
    for ok in ("sm_90", "sm_90a", "compute_100f", "sm_121", "F(x, y)", "_M", "A1(a.b)"):
        assert _validate.arch_ok(ok) or _validate.macro_name_ok(ok)
