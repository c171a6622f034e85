"""``cuforge compile`` writes what was asked for, and nothing it must not touch.

Through the installed console script (or ``_fake_device.py``, the same CLI with
device 0 reporting a chosen arch) in subprocesses, real NVRTC/libNVVM compiles and
real directory caches:

- a target a source's code type does not compile to (NVVM IR to cubin, PTX to PTX)
  is a one-line usage error on every path, and no cache entry is stored under it
  (the compile layer refuses it too).
"""

from __future__ import annotations

import pathlib

import pytest

from _cli import SAXPY, one_line_error, run
from test_compile_nvvm import STORE

KERNEL = 'extern "C" __global__ void twice(float* a) { a[threadIdx.x] *= 2; }\n'


def _stored(cache: pathlib.Path) -> list[pathlib.Path]:
    """The files a directory cache holds under ``entries/``."""
    entries = cache / "entries"
    return [p for p in entries.rglob("*") if p.is_file()] if entries.is_dir() else []


# -- issue 32 item 3: targets a code type does not compile to ------------------------------
def _nvvm(tmp_path: pathlib.Path, suffix: str) -> pathlib.Path:
    path = tmp_path / f"store{suffix}"
    path.write_text(STORE)
    return path


@pytest.mark.parametrize("suffix", [".ll", ".bc", ".nvvm"])
@pytest.mark.parametrize(
    ("how", "words"),
    [
        (("-o", "store.cubin"), "NVVM IR, which compiles to ptx or ltoir only, not cubin"),
        (("--outdir", "out"), "NVVM IR, which compiles to ptx or ltoir only, not cubin"),
        (("-o", "store.cubin", "--no-cache"), "--target ptx or --target ltoir"),
        (("-o", "x.fatbin", "--arch", "sm_80"), "-o x.fatbin packs a cubin for sm_90"),
    ],
)
def test_nvvm_ir_to_cubin_is_a_usage_error_and_stores_nothing(tmp_path, suffix, how, words):
    """It exited 0 with "compiled and stored", wrote PTX text to the .cubin and left a
    cubin entry in the cache (the cached path skipped the target check); a fatbin of
    two archs ended in an nvFatbin traceback; --no-cache exited 1."""
    src = _nvvm(tmp_path, suffix)
    cache = tmp_path / "c"
    where = () if "--no-cache" in how else ("--cache", str(cache))
    result = run(tmp_path, "compile", src.name, "--arch", "sm_90", *where, *how, cwd=tmp_path)
    assert words in one_line_error(result, "cuforge compile")
    assert not (tmp_path / "store.cubin").exists() and not (tmp_path / "x.fatbin").exists()
    assert not (tmp_path / "out" / "store.cubin").exists()
    assert _stored(cache) == [] and not (tmp_path / "xdg").exists()


@pytest.mark.parametrize("target", ["ptx", "ltoir"])
@pytest.mark.parametrize("cached", [True, False])
def test_ptx_to_anything_but_cubin_is_a_usage_error(tmp_path, target, cached):
    """It was an nvJitLink failure (exit 1, "compile failed") on the cached path and
    "compile failed" on the uncached one: a usage error, nothing compiled."""
    ptx = tmp_path / "k.ptx"
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--target", "ptx",
               "-o", str(ptx), "--no-cache")  # fmt: skip
    assert made.returncode == 0, made.stderr
    cache = ("--cache", str(tmp_path / "c")) if cached else ("--no-cache",)
    out = tmp_path / f"out.{target}"
    result = run(tmp_path, "compile", str(ptx), "--arch", "sm_90", "--target", target,
                 "-o", str(out), *cache)  # fmt: skip
    line = one_line_error(result, "cuforge compile")
    assert f"is PTX, which compiles to cubin only, not {target}: leave --target out" in line
    assert not out.exists() and _stored(tmp_path / "c") == []


def test_warm_refuses_a_target_a_source_does_not_compile_to(tmp_path):
    """``cuforge warm`` compiled NVVM IR "to cubin" and stored the PTX as a cubin."""
    _nvvm(tmp_path, ".ll")
    (tmp_path / "k.ptx").write_text(".version 8.0\n")
    cache = tmp_path / "c"
    for kernel, words in (
        ('source = "store.ll"', 'store.ll is NVVM IR, which compiles to ptx or ltoir only, not '
                                'cubin: set target = "ptx" or "ltoir"'),
        ('source = "k.ptx"\ntarget = "ptx"', "k.ptx is PTX, which compiles to cubin only"),
        ('source = "store.ll"\narch = "sm90"', "ProgramOptions.arch"),
    ):  # fmt: skip
        manifest = tmp_path / "m.toml"
        manifest.write_text(f'[defaults]\narch = "sm_90"\n[[kernel]]\n{kernel}\n')
        line = one_line_error(run(tmp_path, "warm", str(manifest), "--cache", str(cache)),
                              "cuforge warm")  # fmt: skip
        assert "m.toml kernel 1 variant 1: " in line and words in line, line
        assert _stored(cache) == []
    manifest.write_text('[defaults]\narch = "sm_90"\n[[kernel]]\nsource = "store.ll"\n'
                        'target = "ptx"\n')  # fmt: skip
    ok = run(tmp_path, "warm", str(manifest), "--cache", str(cache))
    assert ok.returncode == 0 and "1 compiled" in ok.stdout, ok.stdout + ok.stderr


def test_the_compile_layer_never_stores_an_output_under_a_target_it_did_not_make():
    """The cache pipeline itself (API path): NVVM IR "to cubin" through the cache was
    compiled by libNVVM to PTX and stored as the cubin entry of its key."""
    from cuforge.compile import Program, ProgramOptions
    from cuforge.compile.cached import compile_through_cache, pipeline
    from cuforge.storage import InMemoryProgramCache

    program = Program(STORE, "nvvm", ProgramOptions(arch="sm_90"))
    cache = InMemoryProgramCache()
    message = "unsupported target_type 'cubin' for code_type 'nvvm'"
    with pytest.raises(ValueError, match=message):
        compile_through_cache(program, "cubin", (), None, cache)
    with pytest.raises(ValueError, match=message):
        pipeline(program, "cubin", (), None, cache)  # what Program.compile calls after its checks
    with pytest.raises(ValueError, match=message):
        program._compile_uncached("cubin", (), None)
    assert len(cache) == 0
    with pytest.raises(ValueError, match=message):
        program.compile("cubin", cache=cache)
    assert len(cache) == 0 and cache.stats().stores == 0
    ptx = compile_through_cache(program, "PTX", (), None, cache)  # canonical spelling kept
    assert ptx.obj.code_type == "ptx" and b".entry store42" in ptx.obj.code and len(cache) == 1
