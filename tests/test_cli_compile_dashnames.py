"""File names that start with ``-`` (``-weird.cu``): docs/cli.md says any file name the
OS accepts compiles, and NVRTC used to read such a program name as a flag ("invalid
number: ird.cu"). Through the installed ``cuforge`` script in a subprocess, real
NVRTC/nvJitLink/libNVVM compiles, real file caches; NVRTC is handed ``./-weird.cu``
while the program's name -- and so its cache key -- stays ``-weird.cu``."""

from __future__ import annotations

import os
import shutil
import sys

from _cli import SAXPY, isolated_env, run
from cuforge.compile import Program, ProgramOptions
from cuforge.storage import FileStreamProgramCache

ELF = b"\x7fELF"


def _ok(done) -> str:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


def test_a_source_named_with_a_leading_dash_compiles_without_a_cache(tmp_path):
    shutil.copy(SAXPY, tmp_path / "-weird.cu")
    env = isolated_env(tmp_path)
    # After "--" and as ./-weird.cu: both reach NVRTC, neither is read as a flag.
    out = _ok(run(tmp_path, "compile", "--arch", "sm_90", "--no-cache", "--", "-weird.cu",
                  cwd=tmp_path, env=env))  # fmt: skip
    assert "-weird.cu -> -weird.cubin" in out, out
    first = (tmp_path / "-weird.cubin").read_bytes()
    assert first[:4] == ELF
    (tmp_path / "-weird.cubin").unlink()
    _ok(run(tmp_path, "compile", "--arch", "sm_90", "--no-cache", "./-weird.cu",
            cwd=tmp_path, env=env))  # fmt: skip
    assert (tmp_path / "-weird.cubin").read_bytes() == first


def test_a_source_named_with_a_leading_dash_is_cached_and_hit(tmp_path):
    shutil.copy(SAXPY, tmp_path / "-weird.cu")
    env = isolated_env(tmp_path)
    args = ("compile", "--arch", "sm_90", "--cache", str(tmp_path / "cache"), "--", "-weird.cu")
    first = _ok(run(tmp_path, *args, cwd=tmp_path, env=env))
    second = _ok(run(tmp_path, *args, cwd=tmp_path, env=env))
    assert "cache miss" in first and second.rstrip().endswith("cache hit"), (first, second)
    assert (tmp_path / "-weird.cubin").read_bytes()[:4] == ELF


def test_nvrtc_diagnostics_name_the_source_as_handed_to_it(tmp_path):
    # The one visible change: NVRTC's own log lines say ./-w.cu (what it was handed).
    (tmp_path / "-w.cu").write_text(
        'extern "C" __global__ void k(int* a) { int unused_x; *a = 1; }\n'
    )
    done = run(tmp_path, "compile", "--arch", "sm_90", "--no-cache", "--", "-w.cu",
               cwd=tmp_path, env=isolated_env(tmp_path))  # fmt: skip
    _ok(done)
    assert "./-w.cu(1): warning" in done.stderr, done.stderr
    assert "Command-line error" not in done.stderr


def test_headers_and_ir_named_with_a_leading_dash_compile_and_hit(tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    from test_compile_nvvm import STORE

    env = isolated_env(tmp_path)
    (tmp_path / "-inc").mkdir()
    (tmp_path / "-inc" / "-h.h").write_text("#define V 7\n")
    (tmp_path / "-i.cu").write_text(
        '#include "-h.h"\nextern "C" __global__ void k(int* a) { *a = V; }\n'
    )
    _ok(run(tmp_path, "compile", "--arch", "sm_90", "--target", "ptx", "--no-cache",
            "-o", "./-s.ptx", str(SAXPY), cwd=tmp_path, env=env))  # fmt: skip
    (tmp_path / "-k.ll").write_text(STORE)
    cache = str(tmp_path / "cache")
    for name, extra in (
        ("-i.cu", ("-I", "./-inc")),
        ("-s.ptx", ()),
        ("-k.ll", ("--target", "ptx")),
    ):
        args = ("compile", "--arch", "sm_90", "--cache", cache, *extra, "--", name)
        first = _ok(run(tmp_path, *args, cwd=tmp_path, env=env))
        second = _ok(run(tmp_path, *args, cwd=tmp_path, env=env))
        assert "cache miss" in first and second.rstrip().endswith("cache hit"), (first, second)


def test_the_api_compiles_a_dash_name_and_keeps_it(tmp_path):
    options = ProgramOptions(arch="sm_90", name="-weird.cu")
    with FileStreamProgramCache(tmp_path / "cache") as cache:
        stored = Program(SAXPY.read_text(), "c++", options).compile("cubin", cache=cache)
        served = Program(SAXPY.read_text(), "c++", options).compile("cubin", cache=cache)
        assert cache.stats().hits == 1
    assert stored.code[:4] == ELF and served.code == stored.code
    assert stored.name == "-weird.cu"


# With every machine-dependent input pinned, what main's code gave (computed there):
# the name in the key is the program's own, never the ./ NVRTC is handed.
_PINNED_DASH_KEY = "1baaffcfc8c10ad742bcefd63d569c49f5a0d23de8eea14204ef2e4fa25e222d"


def test_a_dash_names_key_is_the_name_itself(monkeypatch):
    from cuforge.compile.cache import _identity, _toolkit
    from cuforge.utils import make_program_cache_key

    monkeypatch.setattr(_identity, "nvrtc_identity", lambda: b"nvrtc:pinned")
    monkeypatch.setattr(_toolkit, "toolkit_identity", lambda: b"headers:pinned")
    src = 'extern "C" __global__ void f(float* a) { a[0] = 1; }\n'

    def key(name: str) -> str:
        options = ProgramOptions(arch="sm_90", name=name)
        return make_program_cache_key(
            code=src, code_type="c++", options=options, target_type="cubin"
        ).hex()

    assert key("-weird.cu") == _PINNED_DASH_KEY
    assert key("./-weird.cu") != key("-weird.cu")
