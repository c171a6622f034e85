"""``cuforge compile`` writes what was asked for, and nothing it must not touch.

Through the installed console script (or ``_fake_device.py``, the same CLI with
device 0 reporting a chosen arch) in subprocesses, real NVRTC/libNVVM compiles and
real directory caches:

- an arch taken from device 0 is never answered by the fast hit path (which does
  not ask the driver), so a changed device 0 gets its own binary;
- a target a source's code type does not compile to (NVVM IR to cubin, PTX to PTX)
  is a one-line usage error on every path, and no cache entry is stored under it
  (the compile layer refuses it too);
- no output is ever written over an input, by the full or the fast path.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
import time

import pytest

from _cli import ROOT, SAXPY, isolated_env, one_line_error, run
from test_compile_nvvm import STORE

FAKE_DEVICE = ROOT / "tests" / "_fake_device.py"
KERNEL = 'extern "C" __global__ void twice(float* a) { a[threadIdx.x] *= 2; }\n'


def _elf_arch(data: bytes) -> str:
    """The sm_XY a cubin was built for, from its ELF e_flags: bits 0-7 in the CUDA 12 ABI
    (EI_ABIVERSION 7), bits 8-15 in the CUDA 13 ABI (EI_ABIVERSION 8)."""
    assert data[:4] == b"\x7fELF", data[:16]
    flags = struct.unpack_from("<I", data, 0x30)[0]
    return f"sm_{(flags if data[8] < 8 else flags >> 8) & 0xFF}"


def _records(home: pathlib.Path) -> list[pathlib.Path]:
    """The fast hit path's records in the isolated state directory."""
    folder = home / "state" / "cli-hits"
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []


def _stored(cache: pathlib.Path) -> list[pathlib.Path]:
    """The files a directory cache holds under ``entries/``."""
    entries = cache / "entries"
    return [p for p in entries.rglob("*") if p.is_file()] if entries.is_dir() else []


def _on_device(home: pathlib.Path, arch: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``cuforge ARGS`` with device 0 an ``arch`` GPU (tests/_fake_device.py)."""
    return subprocess.run(
        [sys.executable, str(FAKE_DEVICE), *args],
        capture_output=True,
        text=True,
        cwd=home,
        env=isolated_env(home, TEST_DEVICE0_ARCH=arch),
        timeout=240,
    )


# -- issue 32 item 2: an arch from device 0 ------------------------------------------------
def test_an_arch_taken_from_device_0_is_never_answered_by_the_fast_path(tmp_path):
    """Three compiles on an sm_90 device 0, then one with device 0 an sm_80: the fast
    path answered "cache hit" with the sm_90 cubin (its record names nothing of the
    device). Now such a command leaves no record, and the sm_80 run gets an sm_80
    cubin, exactly as the full path (``-v``) gave."""
    (tmp_path / "k.cu").write_text(KERNEL)
    named = ("compile", "k.cu", "--arch", "sm_90", "-o", "named.cubin")
    for wait in (0, 2.1):  # sys.path[0] (tests/) changed < 2 s ago: identity not kept yet
        time.sleep(wait)
        assert _on_device(tmp_path, "sm_90", *named).returncode == 0
        if _records(tmp_path):
            break
    else:
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
    before = _records(tmp_path)
    args = ("compile", "k.cu", "-o", "k.cubin", "--json")
    for _ in range(3):
        done = _on_device(tmp_path, "sm_90", *args)
        assert done.returncode == 0, done.stderr
        assert _elf_arch((tmp_path / "k.cubin").read_bytes()) == "sm_90"
    other = _on_device(tmp_path, "sm_80", *args)
    assert other.returncode == 0, other.stderr
    (report,) = json.loads(other.stdout)
    assert (report["arch"], report["cache"]) == ("sm_80", "miss"), report
    assert _elf_arch((tmp_path / "k.cubin").read_bytes()) == "sm_80"
    assert _records(tmp_path) == before  # no record for a request that names no arch
    # A named arch still takes the fast path: --arch, and a settings file's arch
    # (its stat identity is in the request digest, _config.fingerprint).
    again = _on_device(tmp_path, "sm_80", *named)
    assert again.returncode == 0 and again.stdout.rstrip().endswith("cache hit"), again.stderr
    assert _elf_arch((tmp_path / "named.cubin").read_bytes()) == "sm_90"
    (tmp_path / "cuforge.toml").write_text('arch = "sm_90"\n')
    configured = ("compile", "k.cu", "-o", "conf.cubin")
    assert _on_device(tmp_path, "sm_80", *configured).returncode == 0
    assert len(_records(tmp_path)) == len(before) + 1
    assert _elf_arch((tmp_path / "conf.cubin").read_bytes()) == "sm_90"


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
        ('source = "store.ll"\narch = "sm90"', "arch must look like 'sm_90'"),
    ):  # fmt: skip
        manifest = tmp_path / "m.toml"
        manifest.write_text(f'[defaults]\narch = "sm_90"\n[[kernel]]\n{kernel}\n')
        line = one_line_error(run(tmp_path, "warm", str(manifest), "--cache", str(cache)),
                              "cuforge warm")  # fmt: skip
        # a kernel without variants is named as "kernel 1", in the manifest's words
        # (it was "kernel 1 variant 1: ProgramOptions.arch ..."; issue 36, newcomer item 4)
        assert "m.toml kernel 1: " in line and words in line, line
        assert "ProgramOptions" not in line and "variant" not in line, line
        assert _stored(cache) == []
    manifest.write_text('[defaults]\narch = "sm_90"\n[[kernel]]\nsource = "store.ll"\n'
                        'target = "ptx"\n')  # fmt: skip
    ok = run(tmp_path, "warm", str(manifest), "--cache", str(cache))
    assert ok.returncode == 0 and "1 compiled" in ok.stdout, ok.stdout + ok.stderr


def test_the_compile_layer_never_stores_an_output_under_a_target_it_did_not_make():
    """The cache pipeline itself (API path): NVVM IR "to cubin" through the cache was
    compiled by libNVVM to PTX and stored as the cubin entry of its key."""
    from cuforge.compile import Program, ProgramOptions
    from cuforge.compile.cache import compile_through_cache, pipeline
    from cuforge.storage import InMemoryProgramCache

    program = Program(STORE, "nvvm", ProgramOptions(arch="sm_90"))
    cache = InMemoryProgramCache()
    message = "unsupported target_type 'cubin' for code_type 'nvvm'"
    with pytest.raises(ValueError, match=message):
        compile_through_cache(program, "cubin", (), None, cache)
    with pytest.raises(ValueError, match=message):
        pipeline(program, "cubin", (), None, cache)  # what Program.compile calls after its checks
    with pytest.raises(ValueError, match=message):
        program.compile_uncached("cubin", (), None)
    assert len(cache) == 0
    with pytest.raises(ValueError, match=message):
        program.compile("cubin", cache=cache)
    assert len(cache) == 0 and cache.stats().stores == 0
    ptx = compile_through_cache(program, "PTX", (), None, cache)  # canonical spelling kept
    assert ptx.obj.code_type == "ptx" and b".entry store42" in ptx.obj.code and len(cache) == 1


# -- issue 32 item 8: an output onto an input -----------------------------------------------
def _sources(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "k.cu").write_text(KERNEL)
    (tmp_path / "pre.h").write_text("#define PRE 1\n")
    (tmp_path / "sub").mkdir()
    return tmp_path / "k.cu"


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("same path", "-o k.cu is the input k.cu (the same file)"),
        ("other spelling", "-o ./sub/../k.cu is the input k.cu"),
        ("symbolic link", "-o link.cubin is the input k.cu"),
        ("hard link", "-o hard.cubin is the input k.cu"),
        ("an -include file", "-o pre.h is the input pre.h"),
        ("fatbin link", "-o k.fatbin is the input k.cu"),
        ("beside the source", "the output k.cubin of k.cubin would overwrite the input k.cubin"),
        ("outdir", "--outdir sub: the output sub/k.cubin of k.cu would overwrite the input"),
    ],
)
def test_no_output_is_written_over_an_input(tmp_path, case, words):
    """``cuforge compile saxpy.cu -o saxpy.cu`` replaced the source with a cubin."""
    src = _sources(tmp_path)
    base = ("compile", "k.cu", "--arch", "sm_90", "--cache", str(tmp_path / "c"))
    args: tuple[str, ...] = (*base, "-o", "k.cu")
    if case == "other spelling":
        args = (*base, "-o", "./sub/../k.cu")
    elif case == "symbolic link":
        (tmp_path / "link.cubin").symlink_to("k.cu")
        args = (*base, "-o", "link.cubin")
    elif case == "hard link":
        os.link(src, tmp_path / "hard.cubin")
        args = (*base, "-o", "hard.cubin")
    elif case == "an -include file":
        args = (*base, "-include", "pre.h", "-o", "pre.h")
    elif case == "fatbin link":
        (tmp_path / "k.fatbin").symlink_to("k.cu")
        args = ("compile", "k.cu", "--arch", "sm_80,sm_90", *base[4:], "-o", "k.fatbin")
    elif case == "beside the source":  # a C++ source named like its own default output
        src = tmp_path / "k.cubin"
        src.write_text(KERNEL)
        args = ("compile", "k.cubin", *base[2:])
    elif case == "outdir":
        (tmp_path / "sub" / "k.cubin").write_text("#define PRE 2\n")
        args = (*base, "-include", "sub/k.cubin", "--outdir", "sub")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    result = run(tmp_path, *args, cwd=tmp_path)
    assert words in one_line_error(result, "cuforge compile")
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before  # every input untouched, nothing written, nothing stored
    assert src.read_text() == KERNEL


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_the_fast_path_never_writes_over_an_input(tmp_path, link):
    """The fast path replays the recorded output path: made a link to the source after
    the record was written, it wrote the cubin through it into the source."""
    src = _sources(tmp_path)
    args = ("compile", "k.cu", "--arch", "sm_90", "-o", "k.cubin", "--cache", str(tmp_path / "c"))
    for _ in range(2):  # a miss, then a hit (the record is left by the full path)
        assert run(tmp_path, *args, cwd=tmp_path).returncode == 0
    if not _records(tmp_path):
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
    (tmp_path / "k.cubin").unlink()
    if link == "symbolic":
        (tmp_path / "k.cubin").symlink_to("k.cu")
    else:
        os.link(src, tmp_path / "k.cubin")
    result = run(tmp_path, *args, cwd=tmp_path)
    assert "-o k.cubin is the input k.cu (the same file)" in one_line_error(
        result, "cuforge compile"
    )
    assert src.read_text() == KERNEL
    (tmp_path / "k.cubin").unlink()  # and with the link gone, the fast path serves again
    served = run(tmp_path, *args, cwd=tmp_path)
    assert served.returncode == 0 and served.stdout.rstrip().endswith("cache hit")
    assert _elf_arch((tmp_path / "k.cubin").read_bytes()) == "sm_90"


def test_pruning_hit_records_removes_only_records(tmp_path: pathlib.Path) -> None:
    """A shard past its bound drops its older records, never a file that is not one
    (issue 32: nothing that is not provably cuforge's is deleted)."""
    from cuforge.cli import _direct

    shard = tmp_path / "ab"
    shard.mkdir(mode=0o700)
    planted = {"notes.txt": b"mine", "ab" + "0" * 37 + ".bak": b"a backup", "AB" + "1" * 38: b"x"}
    for name, data in planted.items():
        (shard / name).write_bytes(data)
        os.utime(shard / name, ns=(1, 1))  # the oldest of all: first in line if counted
    for i in range(70):
        record = shard / f"ab{i:038x}"
        record.write_bytes(b"record")
        os.utime(record, ns=(10 + i, 10 + i))
    _direct._write(str(tmp_path), "ab" + "f" * 38, b"new record")
    left = {p.name for p in shard.iterdir()}
    assert all((shard / name).read_bytes() == data for name, data in planted.items())
    records = {n for n in left if n not in planted}
    assert "ab" + "f" * 38 in records
    assert len(records) == 36  # 71 records past the bound of 64: the older 35 removed
    assert f"ab{0:038x}" not in records and f"ab{69:038x}" in records
