"""File names that are not UTF-8 (``k\\xfc.cu``, a Latin-1 byte): any name the OS
accepts compiles -- CUDA C++, PTX and NVVM IR, with and without a cache, headers in
such folders or named so tracked -- and is printed as docs/cli.md says, each byte
that is not UTF-8 as ``\\xfc``. Through the installed ``cuforge`` script in a
subprocess (bytes out: nothing is decoded on the way), real NVRTC/nvJitLink/libNVVM
compiles, real file caches; and a UTF-8 name's cache key is what it always was."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from _cli import SAXPY, SCRIPT, isolated_env
from cuforge.compile import Program, ProgramOptions
from cuforge.storage import FileStreamProgramCache

ELF = b"\x7fELF"
LATIN1 = b"k\xfc"  # "kü" in Latin-1: not UTF-8
SHOWN = b"k\\xfc"  # how it is printed: a backslash, x, f, c
_VALUE = re.compile(rb"mov\.u32\s+%r\d+,\s*(-?\d+);")


def _name(raw: bytes) -> str:
    return os.fsdecode(raw)


def cuforge(tmp_path, *args: str, env: dict[str, str] | None = None):
    """``cuforge ARGS`` with stdout and stderr as bytes, exactly as written."""
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, timeout=240,
        env=env if env is not None else isolated_env(tmp_path),
    )  # fmt: skip


def _ok(done: subprocess.CompletedProcess[bytes]) -> bytes:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert b"Traceback" not in done.stderr
    return done.stdout


def _printed_escaped(out: bytes) -> None:
    """``out`` names the file as ``k\\xfc``: never the raw byte, nor ``\\udcfc``."""
    assert SHOWN in out, out
    assert b"\xfc" not in out and b"udcfc" not in out, out


@pytest.fixture(autouse=True)
def _fs_takes_any_bytes(tmp_path):
    try:
        (tmp_path / _name(LATIN1 + b".probe")).write_bytes(b"")
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system does not take a name that is not UTF-8")


def test_a_non_utf8_source_name_compiles_without_a_cache(tmp_path):
    src = tmp_path / _name(LATIN1 + b".cu")
    shutil.copy(SAXPY, src)
    out = tmp_path / "x.cubin"
    done = cuforge(tmp_path, "compile", str(src), "--arch", "sm_90", "--no-cache", "-o", str(out))
    _printed_escaped(_ok(done))
    assert out.read_bytes()[:4] == ELF
    # The default output, beside the source, takes the source's name, bytes and all.
    done = cuforge(tmp_path, "compile", str(src), "--arch", "sm_90", "--no-cache")
    _printed_escaped(_ok(done))
    assert (tmp_path / _name(LATIN1 + b".cubin")).read_bytes() == out.read_bytes()


def test_a_non_utf8_source_name_is_cached_and_hit(tmp_path):
    src = tmp_path / _name(LATIN1 + b".cu")
    shutil.copy(SAXPY, src)
    cache = tmp_path / "cache"
    outdir = tmp_path / _name(b"out-" + LATIN1)
    args = ("compile", str(src), "--arch", "sm_90", "--cache", str(cache), "--outdir", str(outdir))
    first, second = _ok(cuforge(tmp_path, *args)), _ok(cuforge(tmp_path, *args))
    assert first.rstrip().endswith(f"cache miss (compiled and stored in {cache})".encode()), first
    assert second.rstrip().endswith(b"cache hit"), second
    _printed_escaped(first)
    _printed_escaped(second)
    assert (outdir / _name(LATIN1 + b".cubin")).read_bytes()[:4] == ELF
    # The entry's name: escaped in the table, the exact name back from the JSON.
    listed = _ok(cuforge(tmp_path, "cache", "ls", "--cache", str(cache)))
    _printed_escaped(listed)
    rows = json.loads(_ok(cuforge(tmp_path, "cache", "ls", "--cache", str(cache), "--json")))
    assert [os.fsencode(row["name"]) for row in rows] == [LATIN1 + b".cu"]


def test_the_api_compiles_a_source_read_from_a_non_utf8_path(tmp_path):
    path = tmp_path / _name(LATIN1 + b".cu")
    shutil.copy(SAXPY, path)
    options = ProgramOptions(arch="sm_90", name=os.path.basename(path))
    plain = Program(path.read_text(), "c++", options).compile("cubin")
    with FileStreamProgramCache(tmp_path / "cache") as cache:
        stored = Program(path.read_text(), "c++", options).compile("cubin", cache=cache)
        served = Program(path.read_text(), "c++", options).compile("cubin", cache=cache)
        assert cache.stats().hits == 1
    assert plain.code == stored.code == served.code and plain.code[:4] == ELF


def test_ptx_and_nvvm_ir_with_non_utf8_names_compile_and_hit(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_compile_nvvm import STORE

    ptx = tmp_path / _name(LATIN1 + b".ptx")
    _ok(cuforge(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--target", "ptx",
                "--no-cache", "-o", str(ptx)))  # fmt: skip
    ll = tmp_path / _name(LATIN1 + b".ll")
    ll.write_text(STORE)
    cache = tmp_path / "cache"
    for src, target in ((ptx, "cubin"), (ll, "ptx")):
        args = ("compile", str(src), "--arch", "sm_90", "--target", target, "--cache", str(cache))
        first, second = _ok(cuforge(tmp_path, *args)), _ok(cuforge(tmp_path, *args))
        assert b"cache miss" in first and second.rstrip().endswith(b"cache hit"), (first, second)
        _printed_escaped(first)
        out = _ok(cuforge(tmp_path, *args[:-2], "--no-cache", "-o", str(tmp_path / "o")))
        _printed_escaped(out)


def _value(path) -> int:
    found = _VALUE.findall(path.read_bytes())
    assert len(found) == 1
    return int(found[0])


def test_headers_with_non_utf8_names_are_tracked(tmp_path):
    folder = tmp_path / _name(b"inc-" + LATIN1)
    folder.mkdir()
    header = folder / _name(LATIN1 + b".h")
    beside = folder / "value.h"
    src = folder / "k.cu"  # in a folder whose name is not UTF-8, a quoted include
    src.write_text(
        '#include "value.h"\nextern "C" __global__ void k(int* a) { *a = VALUE + V2; }\n'
    )
    cache, out = tmp_path / "cache", tmp_path / "k.ptx"
    # -include of a file named so, found in an -I folder named so
    compile_ = ("compile", str(src), "--arch", "sm_90", "--target", "ptx", "-o", str(out),
                "-I", str(folder), "-include", os.path.basename(header))  # fmt: skip
    args = (*compile_, "--cache", str(cache))
    for value, v2, said in ((3, 4, b"cache miss"), (3, 4, b"cache hit"), (5, 4, b"cache miss"),
                            (5, 6, b"cache miss"), (5, 6, b"cache hit")):  # fmt: skip
        beside.write_text(f"#define VALUE {value}\n")
        header.write_text(f"#define V2 {v2}\n")
        done = _ok(cuforge(tmp_path, *args))
        assert said in done, (value, v2, done)
        assert _value(out) == value + v2
    header.write_text("#define V2 7\n")
    _ok(cuforge(tmp_path, *compile_, "--no-cache"))
    assert _value(out) == 12


def test_a_missing_non_utf8_file_is_named_escaped(tmp_path):
    missing = tmp_path / _name(LATIN1 + b".cu")
    done = cuforge(tmp_path, "compile", str(missing), "--arch", "sm_90", "--no-cache")
    assert done.returncode == 2 and done.stdout == b"", done
    _printed_escaped(done.stderr)
    assert done.stderr.count(b"\n") == 1 and b"cannot read " in done.stderr


def test_a_compile_error_in_a_non_utf8_file_names_it_escaped(tmp_path):
    folder = tmp_path / _name(b"inc-" + LATIN1)
    folder.mkdir()
    src = tmp_path / _name(LATIN1 + b".cu")
    src.write_text('extern "C" __global__ void f() { oops; }\n')
    done = cuforge(
        tmp_path, "compile", str(src), "--arch", "sm_90", "--no-cache", "-I", str(folder)
    )
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done
    _printed_escaped(done.stdout + done.stderr)
    assert b"\xef\xbf\xbd" not in done.stderr  # no U+FFFD for the byte either
    # the compiler's log (its own copy of the name) and the flags, escaped alike
    assert SHOWN + b'.cu(1): error: identifier "oops" is undefined' in done.stderr
    assert b"--include-path=" + os.fsencode(str(tmp_path)) + b"/inc-" + SHOWN in done.stderr


def test_a_warm_manifest_in_a_non_utf8_folder_fills_what_compile_hits(tmp_path):
    # TOML is UTF-8 text with no byte escapes, so a manifest cannot name such a file;
    # it can live in a folder so named, its sources relative to it.
    folder = tmp_path / _name(b"proj-" + LATIN1)
    folder.mkdir()
    shutil.copy(SAXPY, folder / "saxpy.cu")
    manifest = folder / _name(b"warm-" + LATIN1 + b".toml")
    manifest.write_text('[defaults]\narch = ["sm_90"]\n[[kernel]]\nsource = "saxpy.cu"\n')
    cache = str(tmp_path / "cache")
    first = _ok(cuforge(tmp_path, "warm", str(manifest), "--cache", cache, "--jobs", "1"))
    assert b"1 compiled" in first, first
    again = _ok(cuforge(tmp_path, "warm", str(manifest), "--cache", cache, "--jobs", "1"))
    assert b"1 already cached" in again, again
    src = str(folder / "saxpy.cu")
    hit = _ok(cuforge(tmp_path, "compile", src, "--arch", "sm_90", "--cache", cache))
    assert hit.rstrip().endswith(b"cache hit"), hit
    _printed_escaped(hit)


# A UTF-8 name's key, with every machine-dependent input pinned, is what main's code
# gave for the same program (computed there): the names that are not UTF-8 took a
# new encoding, the others must keep every entry already stored.
_PINNED_KEYS = {
    "c++": "7a2edf7211e940214309c59fb98ece4903b55162aaccd011e010fb1a33a750bc",
    "c++ ascii": "dbecd68ef77a4a88bb59df2d0fbfeb507b3952d275369cb1ba34e96e6625aa82",
    "nvvm": "f1d17bb8d3aba355e6802cd47b4c384dbb6a6a6c1a5380cf6e24e4d1f6477187",
}


def test_a_utf8_names_key_is_unchanged(monkeypatch):
    from cuforge.compile.cache import _identity, _toolkit
    from cuforge.utils import make_program_cache_key

    monkeypatch.setattr(_identity, "nvrtc_identity", lambda: b"nvrtc:pinned")
    monkeypatch.setattr(_identity, "nvvm_identity", lambda: b"nvvm:pinned")
    monkeypatch.setattr(_toolkit, "toolkit_identity", lambda: b"headers:pinned")
    src = 'extern "C" __global__ void f(float* a) { a[0] = 1; }\n'
    utf8 = ProgramOptions(
        arch="sm_90", name="k\u00fc.cu", include_path=["d\u00fc"], pre_include=["h\u00fc.h"],
        define_macro=["N=\u00fc"],
    )  # fmt: skip
    ascii_ = ProgramOptions(arch="sm_90", name="saxpy.cu")
    ir = ProgramOptions(arch="sm_90", name="k\u00fc.ll")
    keys = {
        "c++": make_program_cache_key(code=src, code_type="c++", options=utf8, target_type="cubin"),
        "c++ ascii": make_program_cache_key(
            code=src, code_type="c++", options=ascii_, target_type="cubin"
        ),
        "nvvm": make_program_cache_key(
            code="; ir", code_type="nvvm", options=ir, target_type="ptx"
        ),
    }
    assert {k: v.hex() for k, v in keys.items()} == _PINNED_KEYS
    # ... and a name that is not UTF-8 has a key of its own (its bytes are in it).
    latin1 = ProgramOptions(arch="sm_90", name=_name(LATIN1 + b".cu"))
    other = make_program_cache_key(code=src, code_type="c++", options=latin1, target_type="cubin")
    assert other not in keys.values()
