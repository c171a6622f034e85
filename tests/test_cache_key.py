"""make_program_cache_key: determinism, what perturbs it, compiler identity, rejections.

Real NVRTC/nvJitLink/libNVVM libraries are probed; the only simulation is replacing
an identity probe (we cannot install a second build of a compiler here).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from _cache_workers import ARCH, SRC, TEMPLATE_SRC, keys_for_cases
from cuforge.compile import Program, ProgramOptions, cache_key
from cuforge.compile.cache import _identity, _identity_store
from cuforge.utils import make_program_cache_key

WORKERS = os.path.join(os.path.dirname(__file__), "_cache_workers.py")

PTX_SRC = """\
.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p) {
  .reg .b64 %rd<2>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p];
  mov.u32 %r1, 1;
  st.global.u32 [%rd1], %r1;
  ret;
}
"""
NVVM_SRC = 'target triple = "nvptx64-nvidia-cuda"\ndefine void @k() {\n  ret void\n}\n'


_DEFAULT = object()


def key(code=SRC, code_type="c++", options=_DEFAULT, target_type="cubin", **kw) -> bytes:
    if options is _DEFAULT:
        options = ProgramOptions(arch=ARCH)
    return make_program_cache_key(
        code=code, code_type=code_type, options=options, target_type=target_type, **kw
    )


def cpp_key(**fields) -> bytes:
    return key(options=ProgramOptions(**{"arch": ARCH, **fields}))


def ptx_key(**fields) -> bytes:
    return key(PTX_SRC, "ptx", ProgramOptions(**{"arch": ARCH, **fields}), "cubin")


def nvvm_key(**fields) -> bytes:
    extra = fields.pop("extra_digest", None)
    return key(
        NVVM_SRC, "nvvm", ProgramOptions(**{"arch": ARCH, **fields}), "ptx", extra_digest=extra
    )


@pytest.fixture
def fresh_identity(monkeypatch):
    """Clear the per-process identity memo before and after (probes re-run for real,
    not served from the identity store)."""
    monkeypatch.setenv("CUFORGE_STATE_DIR", "off")
    probes = ("nvrtc_identity", "nvjitlink_identity", "nvvm_identity", "driver_identity")
    for name in probes:
        getattr(_identity, name).cache_clear()
    _identity_store.forget()
    yield
    for name in probes:
        getattr(_identity, name).cache_clear()


# -- determinism and shape --------------------------------------------------------------


def test_key_is_32_bytes_and_deterministic():
    k = key()
    assert isinstance(k, bytes) and len(k) == 32
    assert key() == k
    # A fresh, equal ProgramOptions (no shared memo) gives the same key.
    assert key(options=ProgramOptions(arch=ARCH)) == k
    for code, code_type, target in ((PTX_SRC, "ptx", "cubin"), (NVVM_SRC, "nvvm", "ltoir")):
        a = key(code, code_type, ProgramOptions(arch=ARCH), target)
        assert len(a) == 32 and a == key(code, code_type, ProgramOptions(arch=ARCH), target)


def test_key_is_the_same_in_a_fresh_process():
    env = dict(os.environ, PYTHONHASHSEED="12345")  # a different str hash than ours
    out = subprocess.run(
        [sys.executable, WORKERS, "keys"], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)["keys"]
    ours = keys_for_cases()
    assert theirs == ours
    assert len(set(ours)) == len(ours)


def test_equal_flags_give_equal_keys():
    # Canonicalised options (str vs one-element list) emit the same flags: same key.
    assert cpp_key(define_macro="A") == cpp_key(define_macro=["A"])
    assert cpp_key(diag_suppress=177) == cpp_key(diag_suppress=[177])


# -- every flag-emitting option perturbs the key -------------------------------------------

# field -> a value that emits a flag (for C++ through NVRTC).
CPP_FIELDS = {
    "arch": "sm_80",
    "relocatable_device_code": True,
    "extensible_whole_program": True,
    "debug": True,
    "lineinfo": True,
    "device_code_optimize": True,
    "ptxas_options": "-v",
    "max_register_count": 32,
    "ftz": True,
    "prec_sqrt": False,
    "prec_div": False,
    "fma": False,
    "use_fast_math": True,
    "extra_device_vectorization": True,
    "link_time_optimization": True,
    "gen_opt_lto": True,
    "define_macro": "FOO=1",
    "undefine_macro": "BAR",
    "no_source_include": True,
    "std": "c++17",
    "builtin_move_forward": False,
    "builtin_initializer_list": False,
    "disable_warnings": True,
    "restrict": True,
    "device_as_default_execution_space": True,
    "device_int128": True,
    "device_float128": True,
    "optimization_info": "inline",
    "no_display_error_number": True,
    "diag_error": 177,
    "diag_suppress": 177,
    "diag_warn": 177,
    "brief_diagnostics": True,
    "split_compile": 2,
    "fdevice_syntax_only": True,
    "minimal": True,
    "no_cache": True,
    "frandom_seed": "42",
    "ofast_compile": "max",
    "pch_verbose": True,
    "pch_messages": True,
    "instantiate_templates_in_pch": True,
    "numba_debug": True,
}
# Fields the key refuses (side effects) or needs an extra_digest for (file content):
# covered by the rejection tests below.
CPP_REFUSED = {"time", "fdevice_time_trace", "create_pch"}
CPP_NEED_DIGEST = {"include_path": "inc", "pre_include": "pre.h", "pch": True}
CPP_NEED_DIGEST_PATHS = {"use_pch": "x.pch", "pch_dir": "pchdir"}


def _nvrtc_fields() -> set[str]:
    return {
        f.name for f in dataclasses.fields(ProgramOptions) if "nvrtc" in f.metadata.get("emit", {})
    }


def test_the_perturbation_matrix_covers_every_nvrtc_flag():
    covered = set(CPP_FIELDS) | CPP_REFUSED | set(CPP_NEED_DIGEST) | set(CPP_NEED_DIGEST_PATHS)
    assert _nvrtc_fields() <= covered, sorted(_nvrtc_fields() - covered)


@pytest.mark.parametrize("field", sorted(CPP_FIELDS))
def test_each_cpp_option_perturbs_the_key(field):
    value = CPP_FIELDS[field]
    target = "ltoir" if field in ("link_time_optimization", "gen_opt_lto") else "cubin"
    base = key(options=ProgramOptions(arch=ARCH), target_type=target)
    changed = key(options=ProgramOptions(**{"arch": ARCH, field: value}), target_type=target)
    assert changed != base


@pytest.mark.parametrize("field", sorted(CPP_NEED_DIGEST | CPP_NEED_DIGEST_PATHS))
def test_external_content_options_perturb_the_key_with_a_digest(field):
    value = {**CPP_NEED_DIGEST, **CPP_NEED_DIGEST_PATHS}[field]
    digest = b"\x01" * 32
    base = key(options=ProgramOptions(arch=ARCH), extra_digest=digest)
    assert key(options=ProgramOptions(**{"arch": ARCH, field: value}), extra_digest=digest) != base


@pytest.mark.parametrize("field", ["ftz", "prec_div", "prec_sqrt", "fma"])
def test_tristate_options_have_three_distinct_keys(field):
    keys = {cpp_key(), cpp_key(**{field: True}), cpp_key(**{field: False})}
    assert len(keys) == 3


def test_option_values_perturb_not_just_presence():
    assert cpp_key(max_register_count=32) != cpp_key(max_register_count=64)
    assert cpp_key(define_macro="A=1") != cpp_key(define_macro="A=2")
    assert cpp_key(std="c++17") != cpp_key(std="c++20")
    assert cpp_key(diag_suppress=[1, 2]) != cpp_key(diag_suppress=[1])


PTX_FIELDS = {
    "arch": "sm_80",
    "debug": True,
    "lineinfo": True,
    "max_register_count": 32,
    "ftz": True,
    "prec_div": False,
    "prec_sqrt": False,
    "fma": False,
    "ptxas_options": "-v",
    "split_compile": 2,
    "no_cache": True,
}


@pytest.mark.parametrize("field", sorted(PTX_FIELDS))
def test_each_ptx_option_perturbs_the_key(field):
    assert ptx_key(**{field: PTX_FIELDS[field]}) != ptx_key()


NVVM_FIELDS = {
    "arch": "sm_80",
    "debug": True,
    "device_code_optimize": False,
    "ftz": True,
    "prec_div": False,
    "prec_sqrt": False,
    "fma": False,
}


@pytest.mark.parametrize("field", sorted(NVVM_FIELDS))
def test_each_nvvm_option_perturbs_the_key(field):
    assert nvvm_key(**{field: NVVM_FIELDS[field]}) != nvvm_key()


def test_nvvm_extra_sources_and_libdevice_perturb():
    helper = "define i32 @h() {\n  ret i32 7\n}\n"
    base = nvvm_key()
    one = nvvm_key(extra_sources=[("h", helper)])
    assert one != base
    assert nvvm_key(extra_sources=[("h", helper.replace("7", "8"))]) != one
    assert nvvm_key(extra_sources=[("g", helper)]) != one
    d = b"libdevice-digest"
    assert nvvm_key(use_libdevice=True, extra_digest=d) != nvvm_key(extra_digest=d)


def test_nvvm_accepts_bytes_code_equal_to_its_text():
    text = key(NVVM_SRC, "nvvm", target_type="ptx")
    assert key(NVVM_SRC.encode(), "nvvm", target_type="ptx") == text


# -- code, types, names, extra_digest ------------------------------------------------------


def test_code_perturbs():
    assert key(SRC) != key(SRC.replace("1;", "2;"))
    assert key(SRC) != key(SRC + " ")


def test_code_type_and_target_perturb():
    cubin, ptx, ltoir = (key(target_type=t) for t in ("cubin", "ptx", "ltoir"))
    assert len({cubin, ptx, ltoir}) == 3
    # Same text, different code_type.
    assert key(NVVM_SRC, "nvvm", target_type="ptx") != key(NVVM_SRC, "c++", target_type="ptx")


def test_target_and_code_type_are_case_insensitive():
    assert key(target_type="CUBIN") == key(target_type="cubin")
    assert key(target_type=" Ptx ") == key(target_type="ptx")
    assert key(code_type="C++") == key(code_type="c++")


def test_name_expressions_order_insensitive_and_typed():
    k = key(TEMPLATE_SRC, name_expressions=["fill<float>", "fill<int>"])
    assert key(TEMPLATE_SRC, name_expressions=("fill<int>", "fill<float>")) == k
    assert k != key(TEMPLATE_SRC)
    assert k != key(TEMPLATE_SRC, name_expressions=["fill<float>"])
    # str and bytes are distinct: symbol_mapping is keyed by the object given.
    s = key(TEMPLATE_SRC, name_expressions=["fill<float>"])
    b = key(TEMPLATE_SRC, name_expressions=[b"fill<float>"])
    assert s != b
    with pytest.raises(TypeError, match="bytearray"):
        key(TEMPLATE_SRC, name_expressions=[bytearray(b"fill<float>")])


def test_options_name_perturbs():
    assert cpp_key(name="a.cu") != cpp_key(name="b.cu")
    assert cpp_key(name="a.cu") != cpp_key()
    assert ptx_key(name="a.ptx") != ptx_key()
    assert nvvm_key(name="a.ll") != nvvm_key()


def test_extra_digest_perturbs_and_must_be_bytes():
    base = key()
    a = key(extra_digest=b"a")
    assert a != base and a != key(extra_digest=b"b")
    assert key(extra_digest=b"") != base  # given-but-empty is not "not given"
    for bad in (1, "abc", bytearray(b"a"), memoryview(b"a")):
        with pytest.raises(TypeError, match="extra_digest must be bytes"):
            key(extra_digest=bad)


def test_schema_version_perturbs(monkeypatch):
    before = key(options=ProgramOptions(arch=ARCH))
    from cuforge.compile.cache import _key  # where the key is made

    monkeypatch.setattr(_key, "KEY_SCHEMA_VERSION", _key.KEY_SCHEMA_VERSION + 1)
    # Fresh options: the per-options prefix memo was built under the old version.
    assert key(options=ProgramOptions(arch=ARCH)) != before


# -- compiler identity ----------------------------------------------------------------------


def _all_keys() -> dict[str, bytes]:
    """One key per backend, from fresh options (no memo shared with other tests)."""
    return {
        "c++": key(options=ProgramOptions(arch=ARCH)),
        "ptx": key(PTX_SRC, "ptx", ProgramOptions(arch=ARCH), "cubin"),
        "nvvm": key(NVVM_SRC, "nvvm", ProgramOptions(arch=ARCH), "ptx"),
    }


@pytest.mark.parametrize(
    "probe, changes",
    [
        ("nvrtc_identity", {"c++"}),
        ("nvjitlink_identity", {"ptx"}),
        ("nvvm_identity", {"nvvm"}),
        # nvJitLink is available here, so the PTX path does not depend on the driver.
        ("driver_identity", set()),
    ],
)
def test_compiler_identity_perturbs_only_its_backend(monkeypatch, probe, changes):
    from cuforge.compile.linker import linker_backend

    assert linker_backend() == "nvjitlink"
    before = _all_keys()
    monkeypatch.setattr(cache_key._identity, probe, lambda: b"another build")
    after = _all_keys()
    changed = {ct for ct in before if before[ct] != after[ct]}
    assert changed == changes
    # The memo is keyed by identity, so restoring the probe restores the key.
    monkeypatch.undo()
    assert _all_keys() == before


def test_driver_linker_path_is_pinned_to_the_driver(monkeypatch):
    from cuforge.compile import linker

    nvjitlink_key = key(PTX_SRC, "ptx", ProgramOptions(arch=ARCH), "cubin")
    monkeypatch.setattr(linker, "linker_backend", lambda: "driver")
    monkeypatch.setattr(cache_key._identity, "driver_identity", lambda: b"driver:13000")
    k13000 = key(PTX_SRC, "ptx", ProgramOptions(arch=ARCH), "cubin")
    assert k13000 != nvjitlink_key
    monkeypatch.setattr(cache_key._identity, "driver_identity", lambda: b"driver:13010")
    assert key(PTX_SRC, "ptx", ProgramOptions(arch=ARCH), "cubin") != k13000
    # nvJitLink's build does not matter when the driver links.
    monkeypatch.setattr(cache_key._identity, "nvjitlink_identity", lambda: b"other")
    monkeypatch.setattr(cache_key._identity, "driver_identity", lambda: b"driver:13000")
    assert key(PTX_SRC, "ptx", ProgramOptions(arch=ARCH), "cubin") == k13000


def test_driver_linker_path_rejects_options_it_cannot_apply(monkeypatch):
    from cuforge.compile import linker

    monkeypatch.setattr(linker, "linker_backend", lambda: "driver")
    with pytest.raises(ValueError, match="ftz"):
        key(PTX_SRC, "ptx", ProgramOptions(arch=ARCH, ftz=True), "cubin")


def test_failed_probe_fails_closed_but_stays_stable(monkeypatch, fresh_identity):
    good = _all_keys()

    def no_library(name):
        raise OSError(f"{name} is not installed")

    monkeypatch.setattr(_identity, "_loaded_library", no_library)
    _identity.nvrtc_identity.cache_clear()
    assert _identity.nvrtc_identity() == b"unavailable:OSError"
    failed = _all_keys()
    assert failed["c++"] != good["c++"]
    assert _all_keys() == failed  # stable: a failure is a deterministic miss
    # Probes already cached keep their answer (probed once per process).
    assert failed["ptx"] == good["ptx"] and failed["nvvm"] == good["nvvm"]


def test_identity_pins_the_library_build():
    ident = _identity.nvrtc_identity()
    assert ident.startswith(b"nvrtc:")
    # The library and its builtins are both pinned by GNU build id.
    assert ident.count(b"build-id:") == 2
    assert b"build-id:" in _identity.nvjitlink_identity()
    assert b"build-id:" in _identity.nvvm_identity()


def _lib(name: str) -> str:
    return _identity._loaded_library(name)


def _builtins_path() -> str:
    directory = os.path.dirname(_lib("nvrtc"))
    return next(
        os.path.join(directory, e) for e in sorted(os.listdir(directory)) if "builtins" in e
    )


def test_library_fingerprints_differ_between_libraries():
    prints = {_identity.library_fingerprint(_lib(n)) for n in ("nvrtc", "nvJitLink", "nvvm")}
    assert len(prints) == 3


def test_build_id_byte_change_changes_the_fingerprint_and_path_does_not(tmp_path):
    original = _builtins_path()
    build_id = _identity._elf_build_id(original)
    assert build_id and len(build_id) >= 16
    copy = tmp_path / "copy.so"
    shutil.copyfile(original, copy)
    # Same build elsewhere: same fingerprint (a cache filled on CI serves the fleet).
    assert _identity.library_fingerprint(str(copy)) == _identity.library_fingerprint(original)
    data = bytearray(copy.read_bytes())
    at = data.find(build_id)
    assert at > 0 and data.find(build_id, at + 1) == -1
    data[at] ^= 0x01
    copy.write_bytes(bytes(data))
    assert _identity._elf_build_id(str(copy)) != build_id
    assert _identity.library_fingerprint(str(copy)) != _identity.library_fingerprint(original)


def test_fingerprint_without_build_id_uses_size_and_content(tmp_path):
    a, b = tmp_path / "a.dll", tmp_path / "b.dll"
    a.write_bytes(b"MZ" + b"\0" * 100)
    b.write_bytes(b"MZ" + b"\0" * 99 + b"\1")
    assert _identity._elf_build_id(str(a)) is None
    fa, fb = _identity.library_fingerprint(str(a)), _identity.library_fingerprint(str(b))
    assert fa.startswith(b"size:") and fa != fb


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")
@pytest.mark.parametrize("name", ["nvrtc", "nvJitLink", "nvvm", "builtins"])
def test_elf_build_id_matches_readelf(name):
    path = _builtins_path() if name == "builtins" else _lib(name)
    out = subprocess.run(["readelf", "-n", path], capture_output=True, text=True, check=True).stdout
    ids = [line.split("Build ID:")[1].strip() for line in out.splitlines() if "Build ID:" in line]
    assert len(ids) == 1
    assert _identity._elf_build_id(path).hex() == ids[0]


# -- rejections -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value",
    [("create_pch", "out.pch"), ("time", "timing.csv"), ("fdevice_time_trace", "trace.json")],
)
def test_side_effect_options_are_rejected_even_with_a_digest(field, value):
    options = ProgramOptions(**{"arch": ARCH, field: value})
    for extra in (None, b"digest"):
        with pytest.raises(ValueError, match=f"{field}.*side effect.*without cache="):
            key(options=options, extra_digest=extra)


@pytest.mark.parametrize("field, value", [("pch", True), ("use_pch", "x.pch"), ("pch_dir", "d")])
def test_precompiled_headers_need_extra_digest(field, value):
    options = ProgramOptions(**{"arch": ARCH, field: value})
    with pytest.raises(ValueError, match=f"options.{field}.*extra_digest="):
        key(options=options)
    assert len(key(options=options, extra_digest=b"headers")) == 32


def test_false_switches_are_not_external_content():
    # pch=False asks NVRTC for nothing: no digest needed.
    assert len(cpp_key(pch=False)) == 32


def test_nvvm_libdevice_needs_extra_digest():
    with pytest.raises(ValueError, match=r"use_libdevice.*extra_digest="):
        nvvm_key(use_libdevice=True)
    assert len(nvvm_key(use_libdevice=True, extra_digest=b"libdevice")) == 32


def test_a_directory_in_the_name_is_harmless_for_ptx_and_nvvm():
    # PTX and NVVM have no #include: a directory in the name changes only the name.
    assert len(ptx_key(name=os.path.join("kernels", "k.ptx"))) == 32
    assert len(nvvm_key(name=os.path.join("kernels", "k.ll"))) == 32


@pytest.mark.parametrize("code_type, target", [("c++", "cubin"), ("ptx", "cubin")])
def test_bytes_code_is_rejected_outside_nvvm(code_type, target):
    code = (SRC if code_type == "c++" else PTX_SRC).encode()
    with pytest.raises(TypeError, match="nvvm"):
        key(code, code_type, target_type=target)
    with pytest.raises(TypeError):
        key(bytearray(code), code_type, target_type=target)


@pytest.mark.parametrize("code_type, code", [("c++", SRC), ("ptx", PTX_SRC)])
def test_extra_sources_outside_nvvm_is_rejected(code_type, code):
    options = ProgramOptions(arch=ARCH, extra_sources=[("h", "define void @h() { ret void }")])
    # The message Program(code, code_type, options) gives too (compile/_inputs.py order).
    refused = rf"extra_sources is not supported for code_type '{re.escape(code_type)}'"
    with pytest.raises(ValueError, match=refused):
        key(code, code_type, options, "cubin")
    with pytest.raises(ValueError, match=refused):
        key(code, code_type, options, "cubin", extra_digest=b"d")
    with pytest.raises(ValueError, match=refused):
        Program(code, code_type, options)


@pytest.mark.parametrize(
    "code_type, target, valid",
    [
        ("c++", "fatbin", "'ptx', 'cubin', 'ltoir'"),
        ("ptx", "ptx", "'cubin'"),
        ("nvvm", "cubin", "'ptx', 'ltoir'"),
    ],
)
def test_unsupported_pair_lists_valid_targets(code_type, target, valid):
    code = {"c++": SRC, "ptx": PTX_SRC, "nvvm": NVVM_SRC}[code_type]
    with pytest.raises(ValueError, match=f"valid targets are {valid}"):
        key(code, code_type, target_type=target)


def test_unknown_code_type_lists_valid_ones():
    with pytest.raises(ValueError, match="valid code types are 'c\\+\\+', 'ptx', 'nvvm'"):
        key(code_type="fortran")


def test_options_must_be_program_options():
    with pytest.raises(TypeError, match="ProgramOptions"):
        key(options={"arch": ARCH})
    with pytest.raises(TypeError, match="ProgramOptions"):
        key(options=None)


def test_a_repeated_key_skips_only_the_checks_its_options_and_pair_already_passed():
    opts = ProgramOptions(arch=ARCH)

    def key(**kw):
        args = {"code": SRC, "code_type": "c++", "options": opts, "target_type": "cubin"}
        return make_program_cache_key(**{**args, **kw})

    first = key()
    assert key() == first
    assert key(code_type=" C++ ", target_type="CUBIN") == first
    assert key(code_type="C++", target_type="cubin") == first  # spelled as before
    # What differs per call is checked on every call, in Program.compile's order.
    with pytest.raises(ValueError, match="code must not be empty"):
        key(code="  ")
    with pytest.raises(TypeError, match=r"name_expressions\[0\]"):
        key(name_expressions=[1])
    with pytest.raises(TypeError, match="extra_digest must be bytes"):
        key(extra_digest="abc")
    with pytest.raises(ValueError, match="unsupported target_type"):
        key(target_type="fatbin")
    # A pair these options have not passed yet is checked in full.
    virtual = ProgramOptions(arch="compute_90")
    make_program_cache_key(code=SRC, code_type="c++", options=virtual, target_type="ptx")
    with pytest.raises(ValueError, match="needs a real architecture"):
        make_program_cache_key(code=SRC, code_type="c++", options=virtual, target_type="cubin")
    with pytest.raises(ValueError, match="name_expressions apply to code_type 'c\\+\\+' only"):
        make_program_cache_key(
            code=".version 8.0", code_type="ptx", options=opts, target_type="cubin",
            name_expressions=["k"],
        )  # fmt: skip
