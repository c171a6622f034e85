"""Start-up cost stays low: what a cold process imports for a cache hit.

Timing lives in ``benchmarks/bench_cli.py``; these tests pin the structure that makes
it fast, so a new eager import shows up as a failure rather than as a slow benchmark.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# Modules that cost a cold process milliseconds each and that a hit does not need.
HEAVY = {"typing", "dataclasses", "hashlib", "json", "logging", "socket", "secrets",
         "platformdirs", "argparse", "inspect", "ctypes", "cuda", "cuda.bindings",
         "cuda.pathfinder"}  # fmt: skip
# What a backend or an integration needs, never ``import cuforge`` or a cache hit.
HEAVY |= {"sqlite3", "redis", "torch", "triton", "cupy", "boto3", "botocore", "obstore"}


def _modules_after(statement: str) -> set[str]:
    """The modules ``statement`` adds to a fresh interpreter (what site-packages'
    .pth files import at start-up -- cuda-bindings 12 imports the ``cuda`` namespace
    there -- is every process's, not the statement's)."""
    code = (
        f"import sys\nbefore = set(sys.modules)\n{statement}\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import cuforge",
        "import cuforge.utils",
        "import cuforge.storage",
        "import cuforge.storage.filestream",
        "from cuforge.compile.cache import _identity_store",
        "import cuforge.cli._direct",
    ],
)
def test_hit_path_modules_import_nothing_heavy(statement):
    assert not _modules_after(statement) & HEAVY


def test_lazy_packages_still_export_their_names():
    found = _modules_after(
        "import cuforge.utils as u, cuforge.compile as c, cuforge.storage as s\n"
        "assert u.FileStreamProgramCache is s.FileStreamProgramCache\n"
        "assert callable(u.make_program_cache_key) and callable(u.explain)\n"
        "assert c.Program.__name__ == 'Program' and 'Program' in dir(c)\n"
        "assert set(u.__all__) <= set(dir(u))"
    )
    assert "cuforge.compile.program" in found


def test_first_use_of_a_cache_class_loads_storage_only():
    found = _modules_after("import cuforge.utils\ncuforge.utils.FileStreamProgramCache")
    assert "cuforge.storage.filestream" in found
    assert not {m for m in found if m.startswith("cuforge.compile")}


def test_the_readme_import_line_loads_no_driver_bindings():
    """``from cuforge import Device, LaunchConfig, Program, ProgramOptions, launch``
    imported cuda.bindings.driver (~50 ms): a script that only compiles paid for it.
    The runtime now loads the driver bindings on first use."""
    found = _modules_after(
        "from cuforge import Device, LaunchConfig, Program, ProgramOptions, launch\n"
        "LaunchConfig(grid=1, block=32)"  # no driver call: validation only
    )
    assert "cuforge.runtime.launch" in found and "cuda.bindings.driver" not in found


#: The README's import lines (issue 36, item 9): a script that only compiles, and one
#: that also launches.
COMPILE_LINE = "from cuforge import Program, ProgramOptions"
RUNTIME_LINE = "from cuforge import Device, LaunchConfig, Program, ProgramOptions, launch"
#: What only a compile through a cache needs: the pipeline, keys, header tracking, the
#: watcher, the toolkit's headers, the compiler identity, storage.
PIPELINE = ("cuforge.compile.cache", "cuforge.storage", "cuforge.compile.cache_key",
            "cuforge._cuda", "cuforge._warm", "cuforge._hashing")  # fmt: skip


def test_the_compile_only_line_imports_no_pipeline_and_nothing_heavy():
    """It imported the whole cache pipeline -- keys, header tracking, the watcher, the
    toolkit and identity modules, storage -- and with them typing, dataclasses,
    inspect, re and hashlib: 81-126 ms against python -c pass's 18-25. Those load with
    the first compile(cache=) now."""
    found = _modules_after(COMPILE_LINE)
    assert "cuforge.compile.program" in found and "cuforge.compile.options" in found
    assert not [m for m in found if m.startswith((*PIPELINE, "cuforge.runtime"))], sorted(found)
    assert not found & (HEAVY | {"re", "enum", "collections", "contextlib", "threading"})


def test_the_runtime_line_imports_nothing_heavy():
    found = _modules_after(RUNTIME_LINE)
    assert "cuforge.runtime.launch" in found
    assert not [m for m in found if m.startswith(PIPELINE[:3])], sorted(found)
    assert not found & (HEAVY | {"re", "enum", "contextlib"})


def test_what_the_import_lines_leave_out_loads_when_used():
    """The pipeline loads with the first compile(cache=), ctypes with the first packing
    plan -- and a ctypes argument imported after cuforge still packs as one."""
    found = _modules_after(
        f"{RUNTIME_LINE}\n"
        "from cuforge.runtime.args import pack_args\n"
        "import ctypes\n"
        "assert pack_args([ctypes.c_int32(7), 1.5]).sizes == (4, 8)\n"
        "from cuforge.storage import InMemoryProgramCache\n"
        "source = 'extern \"C\" __global__ void k(int* p) { *p = 1; }'\n"
        "options = ProgramOptions(arch='sm_90')\n"
        "cache = InMemoryProgramCache()\n"
        "first = Program(source, 'c++', options).compile('cubin', cache=cache)\n"
        "again = Program(source, 'c++', options).compile('cubin', cache=cache)\n"
        "assert first.code == again.code and cache.stats().hits == 1"
    )
    assert {"cuforge.compile.cache._pipeline", "cuforge.compile.cache._key"} <= found


def test_a_first_compile_that_hits_imports_no_dataclasses_or_inspect(tmp_path):
    """A process's first compile(cache=) imports the pipeline; its header tracking's
    two dataclasses imported ``dataclasses`` and with it ``inspect``, ``ast``, ``dis``
    and ``tokenize``: 11 ms of CPU against 6 for the whole first hit without them, paid
    by every rank of a job at the same instant (docs/scaling.md)."""
    cache = f"file://{tmp_path / 'cache'}"
    compile_line = (
        f"{COMPILE_LINE}\n"
        "from cuforge.utils import open_cache\n"
        "source = 'extern \"C\" __global__ void k(int* p) { *p = 1; }'\n"
        f"cache = open_cache({cache!r})\n"
        "obj = Program(source, 'c++', ProgramOptions(arch='sm_90')).compile('cubin', cache=cache)\n"
    )
    _modules_after(compile_line)  # fills the cache
    found = _modules_after(compile_line + "assert cache.stats().hits == 1")
    assert "cuforge.compile.cache._includes" in found
    assert not found & {"dataclasses", "inspect", "ast", "dis", "tokenize"}, sorted(found)


def test_a_first_compile_of_a_program_without_includes_compiles_no_scan_patterns(tmp_path):
    """The include scanner's seven regular expressions were compiled when the pipeline
    loaded (~1 ms of a process's first compile(cache=)); a program that can read no
    file is never scanned. One that can is, and is tracked as before."""
    (tmp_path / "h.cuh").write_text("#define V 3\n")
    found = _modules_after(
        "import re\n"
        "compiled = []\n"
        "real = re.compile\n"
        "def counted(pattern, flags=0):\n"
        "    compiled.append(pattern if isinstance(pattern, bytes) else pattern.encode())\n"
        "    return real(pattern, flags)\n"
        "re.compile = counted\n"
        "def scanners():\n"
        "    return [p for p in compiled if b'include' in p or b'define' in p]\n"
        f"{COMPILE_LINE}\n"
        "from cuforge.storage import InMemoryProgramCache\n"
        "cache = InMemoryProgramCache()\n"
        "options = ProgramOptions(arch='sm_90')\n"
        "plain = 'extern \"C\" __global__ void k(int* p) { *p = 1; }'\n"
        "Program(plain, 'c++', options).compile('cubin', cache=cache)\n"
        "assert not scanners(), scanners()\n"
        "included = '#include \"h.cuh\"\\n' + plain.replace('= 1', '= V')\n"
        f"options = ProgramOptions(arch='sm_90', include_path=[{str(tmp_path)!r}])\n"
        "Program(included, 'c++', options).compile('cubin', cache=cache)\n"
        "assert scanners()\n"
    )
    assert "cuforge.compile.cache._includes" in found


def test_a_first_compile_through_a_cache_imports_no_typing_or_hashlib(tmp_path):
    """A fresh process's first compile(cache=) imported ``typing`` (the pipeline's
    modules), ``hashlib`` with OpenSSL (five modules for blake2b alone) and, for a
    program that reads no header, the manifest and watcher modules it never uses:
    ~7.5 ms of CPU of a first hit's ~13 (docs/performance.md). A tracked program
    (one that includes a header) loads those two, still without ``typing``."""
    (tmp_path / "h.cuh").write_text("#define V 3\n")
    cache = f"file://{tmp_path / 'cache'}"
    plain = 'extern "C" __global__ void k(int* p) { *p = 1; }'
    included = '#include "h.cuh"\n' + plain.replace("= 1", "= V")
    for source, tracked in ((plain, False), (included, True)):
        line = (
            f"{COMPILE_LINE}\n"
            "from cuforge.utils import open_cache\n"
            f"cache = open_cache({cache!r})\n"
            f"options = ProgramOptions(arch='sm_90', include_path=[{str(tmp_path)!r}])\n"
            f"Program({source!r}, 'c++', options).compile('cubin', cache=cache)\n"
        )
        _modules_after(line)  # the miss fills the cache
        found = _modules_after(line + "assert cache.stats().hits == 1")
        assert not found & {"typing", "hashlib", "_hashlib"}, sorted(found)
        manifest = {"cuforge.compile.cache._manifest", "cuforge.compile.cache._watch"}
        assert (manifest <= found) if tracked else not (manifest & found), sorted(found)
