"""Never a stale hit: every file a C++ compile can read is tracked (real NVRTC compiles).

Each test compiles to PTX and reads back the constant the kernel stores, so "the
output changed" is checked on what NVRTC produced, not on keys.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _backends import FACTORIES
from _cache_workers import ARCH
from cuforge.compile import CompileError, Program, ProgramOptions, _nvrtc
from cuforge.compile.cache import _manifest, _tracking, _watch
from cuforge.compile.cache._includes import UntrackableInclude, scan
from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache
from cuforge.storage.record import decode_record, encode_record
from cuforge.utils import explain, fingerprint_headers, make_program_cache_key

KERNEL = 'extern "C" __global__ void k(int* a) { *a = VALUE; }\n'
_VALUE = re.compile(rb"mov\.u32\s+%r\d+,\s*(-?\d+);")


def value(obj) -> int:
    found = _VALUE.findall(obj.code)
    assert len(found) == 1, obj.code.decode()
    return int(found[0])


class Compiles:
    """Counts real NVRTC compiles."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = _nvrtc.compile_cpp

        def counting(*args, **kwargs):
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(_nvrtc, "compile_cpp", counting)


@pytest.fixture
def compiles(monkeypatch) -> Compiles:
    return Compiles(monkeypatch)


@pytest.fixture(params=["memory", "filestream"])
def cache(request, tmp_path):
    c = (
        InMemoryProgramCache()
        if request.param == "memory"
        else FileStreamProgramCache(tmp_path / "cache")
    )
    yield c
    c.close()


def compile_value(cache, src: str, **fields) -> int:
    opts = ProgramOptions(**{"arch": ARCH, **fields})
    return value(Program(src, "c++", opts).compile("ptx", cache=cache))


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- each way a header can be found ---------------------------------------------------------


def test_header_through_include_path(cache, compiles, tmp_path):
    write(tmp_path / "inc" / "params.h", "#define VALUE 1\n")
    src = '#include "params.h"\n' + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc) == 1
    assert compile_value(cache, src, include_path=inc) == 1  # unchanged: a hit
    assert compiles.count == 1
    write(tmp_path / "inc" / "params.h", "#define VALUE 2\n")
    assert compile_value(cache, src, include_path=inc) == 2
    assert compiles.count == 2
    assert compile_value(cache, src, include_path=inc) == 2
    assert compiles.count == 2


def test_header_beside_a_source_named_with_a_directory(cache, compiles, tmp_path):
    write(tmp_path / "src" / "params.h", "#define VALUE 5\n")
    name = str(tmp_path / "src" / "k.cu")
    src = '#include "params.h"\n' + KERNEL
    assert compile_value(cache, src, name=name) == 5
    write(tmp_path / "src" / "params.h", "#define VALUE 6\n")
    assert compile_value(cache, src, name=name) == 6
    assert compile_value(cache, src, name=name) == 6
    assert compiles.count == 2


def test_header_in_the_current_directory(cache, compiles, tmp_path, monkeypatch):
    """The issue's reproduction: a quoted include resolved from the working directory."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "params.h", "#define VALUE 1\n")
    src = '#include "params.h"\n' + KERNEL
    assert compile_value(cache, src) == 1
    write(tmp_path / "params.h", "#define VALUE 2\n")
    assert compile_value(cache, src) == 2
    assert compiles.count == 2


def test_pre_include_file(cache, compiles, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "pre.h", "#define VALUE 10\n")
    assert compile_value(cache, KERNEL, pre_include="pre.h") == 10
    assert compile_value(cache, KERNEL, pre_include="pre.h") == 10
    write(tmp_path / "pre.h", "#define VALUE 11\n")
    assert compile_value(cache, KERNEL, pre_include="pre.h") == 11
    assert compiles.count == 2


def test_nested_include(cache, compiles, tmp_path):
    write(tmp_path / "inc" / "outer.h", '#include "detail/inner.h"\n')
    write(tmp_path / "inc" / "detail" / "inner.h", "#define VALUE 20\n")
    src = "#include <outer.h>\n" + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc) == 20
    write(tmp_path / "inc" / "detail" / "inner.h", "#define VALUE 21\n")
    assert compile_value(cache, src, include_path=inc) == 21
    assert compiles.count == 2


def test_new_header_shadowing_one_later_in_the_search_path(cache, compiles, tmp_path):
    write(tmp_path / "b" / "params.h", "#define VALUE 30\n")
    (tmp_path / "a").mkdir()
    src = "#include <params.h>\n" + KERNEL
    inc = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert compile_value(cache, src, include_path=inc) == 30
    write(tmp_path / "a" / "params.h", "#define VALUE 31\n")  # earlier in the search
    assert compile_value(cache, src, include_path=inc) == 31
    assert compiles.count == 2
    (tmp_path / "a" / "params.h").unlink()
    assert compile_value(cache, src, include_path=inc) == 30  # the old variant holds again
    assert compiles.count == 2


def test_deleted_header_is_a_compile_error_never_a_stale_hit(cache, compiles, tmp_path):
    write(tmp_path / "inc" / "params.h", "#define VALUE 40\n")
    src = '#include "params.h"\n' + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc) == 40
    (tmp_path / "inc" / "params.h").unlink()
    with pytest.raises(CompileError, match=r"params\.h"):
        compile_value(cache, src, include_path=inc)


def test_if_guarded_include_toggled_by_define(cache, compiles, tmp_path):
    write(tmp_path / "inc" / "one.h", "#define VALUE 50\n")
    write(tmp_path / "inc" / "two.h", "#define VALUE 51\n")
    src = '#ifdef USE_TWO\n#include "two.h"\n#else\n#include "one.h"\n#endif\n' + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc) == 50
    assert compile_value(cache, src, include_path=inc, define_macro="USE_TWO") == 51
    # Editing the header of the inactive branch is a miss too (a safe superset).
    write(tmp_path / "inc" / "two.h", "#define VALUE 52\n")
    assert compile_value(cache, src, include_path=inc, define_macro="USE_TWO") == 52
    assert compile_value(cache, src, include_path=inc) == 50
    assert compiles.count == 4


# Spellings of an include that do not read "#include": NVRTC accepts each of them
# (the trigraph ones below C++17 only).
_SPELLINGS = {
    "line splice": ('#inc\\\nlude "params.h"', {}),
    "line splice, CRLF": ('#inc\\\r\nlude "params.h"', {}),
    "digraph": ('%:include "params.h"', {}),
    "comment after the hash": ('#/* pick */include "params.h"', {}),
    "comment spanning lines": ('# /* a\n b */ include /* c */ "params.h"', {}),
    "trigraph splice": ('#inc??/\nlude "params.h"', {"std": "c++14"}),
    "trigraph hash": ('??=include "params.h"', {"std": "c++14"}),
}


@pytest.mark.parametrize("spelling", sorted(_SPELLINGS))
def test_include_spelled_without_hash_include(cache, compiles, tmp_path, spelling):
    directive, fields = _SPELLINGS[spelling]
    write(tmp_path / "inc" / "params.h", "#define VALUE 70\n")
    src = directive + "\n" + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc, **fields) == 70
    write(tmp_path / "inc" / "params.h", "#define VALUE 71\n")
    assert compile_value(cache, src, include_path=inc, **fields) == 71
    assert compile_value(cache, src, include_path=inc, **fields) == 71  # a hit
    assert compiles.count == 2


def test_include_through_a_macro(cache, compiles, tmp_path):
    write(tmp_path / "inc" / "cfg_a.h", "#define VALUE 60\n")
    write(tmp_path / "inc" / "cfg_b.h", "#define VALUE 61\n")
    src = "#include CONFIG\n" + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc, define_macro='CONFIG="cfg_a.h"') == 60
    assert compile_value(cache, src, include_path=inc, define_macro="CONFIG=<cfg_b.h>") == 61
    write(tmp_path / "inc" / "cfg_a.h", "#define VALUE 62\n")
    assert compile_value(cache, src, include_path=inc, define_macro='CONFIG="cfg_a.h"') == 62
    # A macro defined in the source, through another macro.
    src2 = '#define PICK "cfg_b.h"\n#define CONFIG PICK\n#include CONFIG\n' + KERNEL
    assert compile_value(cache, src2, include_path=inc) == 61
    write(tmp_path / "inc" / "cfg_b.h", "#define VALUE 63\n")
    assert compile_value(cache, src2, include_path=inc) == 63
    assert compiles.count == 5
    # The macro's definition continued on a second line.
    src3 = '#define CONFIG \\\n  "cfg_b.h"\n#include CONFIG\n' + KERNEL
    assert compile_value(cache, src3, include_path=inc) == 63
    write(tmp_path / "inc" / "cfg_b.h", "#define VALUE 64\n")
    assert compile_value(cache, src3, include_path=inc) == 64
    assert compiles.count == 7


def test_an_edited_header_is_scanned_again(cache, compiles, tmp_path):
    # What a scan found is remembered per content; an edit that adds an include or
    # redefines the macro of a computed include must be seen on the next compile.
    write(tmp_path / "inc" / "outer.h", "#define VALUE 80\n")
    write(tmp_path / "inc" / "inner.h", "#define VALUE 81\n")
    src = '#include "outer.h"\n' + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc) == 80
    write(tmp_path / "inc" / "outer.h", '#include "inner.h"\n')
    assert compile_value(cache, src, include_path=inc) == 81
    write(tmp_path / "inc" / "inner.h", "#define VALUE 82\n")  # reached only via the edit
    assert compile_value(cache, src, include_path=inc) == 82
    write(tmp_path / "inc" / "cfg_a.h", "#define VALUE 83\n")
    write(tmp_path / "inc" / "cfg_b.h", "#define VALUE 84\n")
    write(tmp_path / "inc" / "pick.h", '#define PICK "cfg_a.h"\n')
    src2 = '#include "pick.h"\n#include PICK\n' + KERNEL
    assert compile_value(cache, src2, include_path=inc) == 83
    write(tmp_path / "inc" / "pick.h", '#define PICK "cfg_b.h"\n')
    assert compile_value(cache, src2, include_path=inc) == 84
    assert compiles.count == 5


def test_has_include_sees_a_header_created_later(cache, compiles, tmp_path):
    (tmp_path / "inc").mkdir()
    src = '#if __has_include("extra.h")\n#include "extra.h"\n#else\n#define VALUE 70\n#endif\n'
    src += KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc) == 70
    write(tmp_path / "inc" / "extra.h", "#define VALUE 71\n")
    assert compile_value(cache, src, include_path=inc) == 71
    assert compiles.count == 2


def test_stat_shortcut_never_hides_a_same_size_edit(cache, compiles, tmp_path):
    header = tmp_path / "inc" / "params.h"
    write(header, "#define VALUE 80\n")
    old = header.stat()
    os.utime(header, ns=(old.st_atime_ns - 10**10, old.st_mtime_ns - 10**10))  # look old
    src = '#include "params.h"\n' + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc) == 80
    before = header.stat()
    header.write_text("#define VALUE 81\n")  # same size
    os.utime(header, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same mtime
    assert compile_value(cache, src, include_path=inc) == 81
    assert compiles.count == 2


# -- sharing and explanation ------------------------------------------------------------


def _tree(root: Path, value: int) -> None:
    write(root / "inc" / "params.h", f"#define VALUE {value}\n")
    write(root / "src" / "k.cu", '#include "params.h"\n' + KERNEL)


def test_two_checkouts_at_different_roots_share_an_entry(tmp_path, monkeypatch, compiles):
    with FileStreamProgramCache(tmp_path / "cache") as cache:
        for root in (tmp_path / "runner1", tmp_path / "runner2"):
            _tree(root, 90)
            monkeypatch.chdir(root)
            src = (root / "src" / "k.cu").read_text()
            assert compile_value(cache, src, name="src/k.cu", include_path=["inc"]) == 90
        assert compiles.count == 1  # the second checkout hit the first one's entry
        write(tmp_path / "runner2" / "inc" / "params.h", "#define VALUE 91\n")
        assert compile_value(cache, src, name="src/k.cu", include_path=["inc"]) == 91
        assert compiles.count == 2


def test_explain_names_the_changed_header_and_option(tmp_path, caplog):
    write(tmp_path / "inc" / "params.h", "#define VALUE 1\n")
    src = '#include "params.h"\n' + KERNEL
    opts = ProgramOptions(arch=ARCH, include_path=[str(tmp_path / "inc")], name="k.cu")
    with FileStreamProgramCache(tmp_path / "cache") as cache:
        Program(src, "c++", opts).compile("ptx", cache=cache)
        assert explain(Program(src, "c++", opts), "ptx", cache).hit
        write(tmp_path / "inc" / "params.h", "#define VALUE 2\n")
        why = explain(Program(src, "c++", opts), "ptx", cache)
        assert not why.hit and "params.h" in str(why) and "edited" in str(why)
        with caplog.at_level(logging.DEBUG, logger="cuforge.cache"):
            Program(src, "c++", opts).compile("ptx", cache=cache)
        assert any("params.h edited" in r.getMessage() for r in caplog.records)
        faster = ProgramOptions(arch=ARCH, include_path=[str(tmp_path / "inc")], name="k.cu",
                                use_fast_math=True)  # fmt: skip
        why = explain(Program(src, "c++", faster), "ptx", cache)
        assert not why.hit and "option --use_fast_math added" in str(why)
        stats = cache.stats()
    # explain() never counts as a lookup.
    assert (stats.hits, stats.misses) == (0, 2)


# -- what cannot be tracked is refused before compiling ------------------------------------


def test_unknown_computed_include_is_refused(cache, compiles, tmp_path):
    src = "#include SOMEWHERE\n" + KERNEL
    with pytest.raises(UntrackableInclude, match="SOMEWHERE"):
        compile_value(cache, src, include_path=[str(tmp_path)])
    assert compiles.count == 0


def test_include_next_is_refused(cache, compiles, tmp_path):
    write(tmp_path / "inc" / "wrap.h", "#include_next <wrap.h>\n")
    src = '#include "wrap.h"\n' + KERNEL
    with pytest.raises(UntrackableInclude, match="include_next"):
        compile_value(cache, src, include_path=[str(tmp_path / "inc")])
    assert compiles.count == 0


def test_one_name_meaning_two_files_is_refused(cache, compiles, tmp_path):
    write(tmp_path / "inc" / "a" / "x.h", '#include "cfg.h"\n')
    write(tmp_path / "inc" / "a" / "cfg.h", "#define VALUE 1\n")
    write(tmp_path / "inc" / "b" / "y.h", '#include "cfg.h"\n')
    write(tmp_path / "inc" / "b" / "cfg.h", "#define OTHER 2\n")
    src = '#include "a/x.h"\n#include "b/y.h"\n' + KERNEL
    with pytest.raises(UntrackableInclude, match=r"'cfg\.h' means different files"):
        compile_value(cache, src, include_path=[str(tmp_path / "inc")])


def test_text_that_only_looks_like_an_include_is_not_refused(cache, tmp_path):
    src = '__device__ const char* s = "#include NOT_A_MACRO";\n#include <params.h>\n' + KERNEL
    write(tmp_path / "inc" / "params.h", "#define VALUE 3\n")
    assert compile_value(cache, src, include_path=[str(tmp_path / "inc")]) == 3


def test_sources_without_user_headers_take_the_plain_key(cache, tmp_path):
    Program(KERNEL.replace("VALUE", "4"), "c++", ProgramOptions(arch=ARCH)).compile(
        "ptx", cache=cache
    )
    # One entry, no manifest: nothing on disk could change the output.
    assert len(cache) == 1


def test_scan_finds_every_form():
    found = scan(
        b'#include "a.h"\n  #  include <b/c.h>\n/* c */ #include D\n#import "e.h"\n'
        b'#if __has_include(<f.h>) && __has_include_next("g.h")\n#endif\n'
        b'#include \\\n  "h.h"\n'
    )
    spellings = {(d.kind, d.spelling, d.angle, d.macro) for d in found}
    assert ("include", "a.h", False, None) in spellings
    assert ("include", "b/c.h", True, None) in spellings
    assert ("include", None, False, "D") in spellings
    assert ("include", "e.h", False, None) in spellings
    assert ("has_include", "f.h", True, None) in spellings
    assert ("has_include_next", "g.h", False, None) in spellings
    assert ("include", "h.h", False, None) in spellings
    # Digraph and trigraph hashes, comments around the name, a trigraph splice.
    found = scan(
        b'%:include "i.h"\n??=include <j.h>\n#/* x\n */include/**/"k.h"\n'
        b'#inc??/\nlude "l.h"\n#if __has_include /* y */ ("m.h")\n#endif\n'
    )
    spellings = {(d.kind, d.spelling, d.angle, d.macro) for d in found}
    for name, angle in (("i.h", False), ("j.h", True), ("k.h", False), ("l.h", False)):
        assert ("include", name, angle, None) in spellings
    assert ("has_include", "m.h", False, None) in spellings


# -- make_program_cache_key and fingerprint_headers ---------------------------------------


@pytest.mark.parametrize("directive", ['#include "params.h"', '#inc\\\nlude "params.h"'])
def test_make_program_cache_key_tracks_headers_without_extra_digest(
    tmp_path, monkeypatch, directive
):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "params.h", "#define VALUE 1\n")
    src = directive + "\n" + KERNEL
    opts = ProgramOptions(arch=ARCH)

    def key():
        return make_program_cache_key(code=src, code_type="c++", options=opts, target_type="ptx")

    first = key()
    assert key() == first
    write(tmp_path / "params.h", "#define VALUE 2\n")
    assert key() != first
    # With extra_digest the caller fingerprints: files are not read.
    digest = fingerprint_headers([tmp_path / "params.h"])
    with_extra = make_program_cache_key(
        code=src, code_type="c++", options=opts, target_type="ptx", extra_digest=digest
    )
    (tmp_path / "params.h").unlink()
    assert (
        make_program_cache_key(
            code=src, code_type="c++", options=opts, target_type="ptx", extra_digest=digest
        )
        == with_extra
    )


def test_fingerprint_headers(tmp_path):
    write(tmp_path / "a.h", "one")
    write(tmp_path / "b.h", "two")
    both = fingerprint_headers([tmp_path / "a.h", tmp_path / "b.h"])
    assert len(both) == 32
    assert fingerprint_headers([str(tmp_path / "b.h"), tmp_path / "a.h"]) != both
    write(tmp_path / "b.h", "twO")
    assert fingerprint_headers([tmp_path / "a.h", tmp_path / "b.h"]) != both
    with pytest.raises(TypeError, match="list of paths"):
        fingerprint_headers(str(tmp_path / "a.h"))
    with pytest.raises(FileNotFoundError, match=r"gone\.h"):
        fingerprint_headers([tmp_path / "gone.h"])


# -- the command line ----------------------------------------------------------------------


def test_cli_compile_with_include_dir_hits_and_misses_after_an_edit(tmp_path):
    write(tmp_path / "inc" / "params.h", "#define VALUE 100\n")
    write(tmp_path / "k.cu", '#include "params.h"\n' + KERNEL)

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-m", "cuforge", "compile", "k.cu", "--arch", ARCH, "--target",
             "ptx", "-I", "inc", "--cache", str(tmp_path / "cache"), "-o", "k.ptx"],
            capture_output=True, text=True, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "miss" in run()
    assert "hit" in run()
    write(tmp_path / "inc" / "params.h", "#define VALUE 101\n")
    assert "miss" in run()
    assert b"101" in (tmp_path / "k.ptx").read_bytes()
    shutil.rmtree(tmp_path / "cache")


def test_user_header_named_like_a_toolkit_header_wins_and_is_tracked(cache, compiles, tmp_path):
    write(tmp_path / "inc" / "cuda_fp16.h", "#define VALUE 110\n")
    src = "#include <cuda_fp16.h>\n" + KERNEL
    inc = [str(tmp_path / "inc")]
    assert compile_value(cache, src, include_path=inc) == 110
    write(tmp_path / "inc" / "cuda_fp16.h", "#define VALUE 111\n")
    assert compile_value(cache, src, include_path=inc) == 111
    assert compiles.count == 2


def test_toolkit_headers_are_the_compilers_not_tracked(cache, compiles):
    src = "#include <cuda_fp16.h>\n" + KERNEL.replace("VALUE", "__half2float(__float2half(3.0f))")
    opts = ProgramOptions(arch=ARCH)
    first = Program(src, "c++", opts).compile("ptx", cache=cache)
    assert Program(src, "c++", opts).compile("ptx", cache=cache).code == first.code
    assert compiles.count == 1
    assert len(cache) == 1  # the plain key: no manifest, nothing to stat on a hit


@pytest.mark.parametrize("backend", sorted(FACTORIES))
def test_manifests_work_on_every_backend(backend, request, tmp_path, compiles):
    """Manifests and entries go through get_entry/set_entry: every backend carries them."""
    cache = FACTORIES[backend](tmp_path, request)
    try:
        write(tmp_path / "inc" / "params.h", "#define VALUE 120\n")
        src = '#include "params.h"\n' + KERNEL
        inc = [str(tmp_path / "inc")]
        assert compile_value(cache, src, include_path=inc) == 120
        assert compile_value(cache, src, include_path=inc) == 120
        assert compiles.count == 1
        write(tmp_path / "inc" / "params.h", "#define VALUE 121\n")
        assert compile_value(cache, src, include_path=inc) == 121
        assert compiles.count == 2
        assert explain(Program(src, "c++", ProgramOptions(arch=ARCH, include_path=inc)),
                       "ptx", cache).hit  # fmt: skip
    finally:
        cache.close()


# -- absent candidates behind symbolic links ---------------------------------------------
# include_path is [first, second] and the header is found in second/; the earlier
# candidate in first/ does not exist because the lookup of its path fails somewhere --
# often behind a symbolic link that leads nowhere yet. Then the tree changes so that
# NVRTC would read the candidate in first/: the cache must not serve the old entry.
# Each scenario runs twice: hits validated by stat (the watcher off, as with
# CUFORGE_WATCH=0, and the racy window shortened so that the test's directories count
# as old and the witness shortcut is in charge), and hits served by the watcher (its
# no-stat hit shown in charge first). Every cached compile is compared with an
# uncached one, which NVRTC resolves through -I itself.
SETTLE_NS = 200_000_000  # the racy window in these tests (ctime cannot be set back)
_REAL_CHECK = _manifest.check


class _Shadowing:
    """A FileStream cache compiling ``#include "<spelling>"`` with include_path
    [first, second]; ``second/<spelling>`` holds VALUE 1."""

    def __init__(self, tmp_path: Path, mode: str, checks: list[int], spelling: str) -> None:
        self.first, self.second = tmp_path / "first", tmp_path / "second"
        self.first.mkdir()
        write(self.second / spelling, "#define VALUE 1\n")
        self.src = f'#include "{spelling}"\n' + KERNEL
        self.opts = ProgramOptions(arch=ARCH, include_path=[str(self.first), str(self.second)])
        self.cache = FileStreamProgramCache(tmp_path / "cache")
        self.mode = mode
        self.checks = checks

    def value(self) -> int:
        """The cached compile's VALUE, asserted equal to an uncached compile's."""
        cached = Program(self.src, "c++", self.opts).compile("ptx", cache=self.cache)
        uncached = Program(self.src, "c++", self.opts).compile("ptx")
        assert value(cached) == value(uncached)
        return value(cached)

    def proven(self) -> bool:
        """Whether every absent candidate of the newest variant is proven absent now
        by its witness and links (the stat shortcut, no stat of the candidate)."""
        program = Program(self.src, "c++", self.opts)
        roots = _tracking.roots_if_tracked(program.source)
        assert roots is not None
        mkey = _tracking.manifest_key(program.source, "ptx", ())
        newest = _tracking.lookup_manifest(self.cache, mkey, roots)[0]
        unproven: list[str] = []
        return (
            all(g.trusted_dir is not None for g in newest.groups)
            and not _REAL_CHECK(newest, unproven=unproven)
            and not unproven
        )

    def settle(self, expected: int, proven: bool = True) -> None:
        """Let the tree age past the racy window, then compile until the shortcut
        under test answers: the absence proof (unless not ``proven``: the lookup
        fails elsewhere now) and, with the watcher, its hit without validation."""
        time.sleep(SETTLE_NS / 1e9 * 1.5)
        for _ in range(2):
            assert self.value() == expected
        assert self.proven() or not proven
        validated = len(self.checks)
        assert self.value() == expected
        if self.mode == "watched":
            assert len(self.checks) == validated

    def close(self) -> None:
        self.cache.close()


@pytest.fixture(params=["stat", "watched"])
def shadowing(request, monkeypatch, tmp_path):
    """A factory of :class:`_Shadowing` sessions, hits validated by stat or watched."""
    (tmp_path / "cwd").mkdir()  # the source's directory, searched first: left alone
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(_manifest, "RACY_NS", SETTLE_NS)
    if request.param == "stat":  # what CUFORGE_WATCH=0 gives a process
        monkeypatch.setattr(_watch, "_instance", None)
        monkeypatch.setattr(_watch, "_failed", True)
    elif _watch.watcher() is None:
        pytest.skip("no inotify here")
    checks: list[int] = []
    real = _manifest.check

    def counting(*args, **kwargs):
        checks.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_manifest, "check", counting)
    sessions: list[_Shadowing] = []

    def make(spelling: str = "sub/params.h") -> _Shadowing:
        sessions.append(_Shadowing(tmp_path, request.param, checks, spelling))
        return sessions[-1]

    yield make
    for s in sessions:
        s.close()


def _relink(link: Path, target: str) -> None:
    """Re-point ``link`` at once, as ``ln -sfn`` does."""
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target)
    os.replace(tmp, link)


@pytest.mark.parametrize("target", ["absolute", "relative"])
def test_dangling_link_whose_target_is_created_later(shadowing, tmp_path, target):
    """The finder's reproduction: first/sub -> else/x, which does not exist."""
    s = shadowing()
    (tmp_path / "else").mkdir()
    (s.first / "sub").symlink_to(tmp_path / "else" / "x" if target == "absolute" else "../else/x")
    s.settle(1)
    write(tmp_path / "else" / "x" / "params.h", "#define VALUE 2\n")
    assert s.value() == 2
    write(tmp_path / "else" / "x" / "params.h", "#define VALUE 3\n")  # now a dependency
    assert s.value() == 3


def test_link_target_directory_appears_before_the_header(shadowing, tmp_path):
    """The lookup's failure point moves down (else -> else/x) while the variant holds."""
    s = shadowing()
    (tmp_path / "else").mkdir()
    (s.first / "sub").symlink_to(tmp_path / "else" / "x")
    s.settle(1)
    (tmp_path / "else" / "x").mkdir()
    s.settle(1, proven=False)  # the lookup fails in else/x now
    write(tmp_path / "else" / "x" / "params.h", "#define VALUE 2\n")
    assert s.value() == 2


def test_dangling_link_deeper_down_behind_another_link(shadowing, tmp_path):
    """first/a/lib -> ../../vendor/lib (a directory), vendor/lib/sub -> /.../else/x."""
    s = shadowing("a/lib/sub/params.h")
    (tmp_path / "vendor" / "lib").mkdir(parents=True)
    (tmp_path / "else").mkdir()
    (s.first / "a").mkdir()
    (s.first / "a" / "lib").symlink_to("../../vendor/lib")
    (tmp_path / "vendor" / "lib" / "sub").symlink_to(tmp_path / "else" / "x")
    s.settle(1)
    write(tmp_path / "else" / "x" / "params.h", "#define VALUE 2\n")
    assert s.value() == 2


def _chain(s: _Shadowing, tmp_path: Path) -> None:
    """first/sub -> hop1 -> ../hops/hop2 -> /.../else/x, which does not exist."""
    (tmp_path / "hops").mkdir()
    (tmp_path / "else").mkdir()
    (s.first / "sub").symlink_to("hop1")
    (s.first / "hop1").symlink_to("../hops/hop2")
    (tmp_path / "hops" / "hop2").symlink_to(tmp_path / "else" / "x")


def test_chain_of_links_whose_end_is_created_later(shadowing, tmp_path):
    s = shadowing()
    _chain(s, tmp_path)
    s.settle(1)
    write(tmp_path / "else" / "x" / "params.h", "#define VALUE 2\n")
    assert s.value() == 2


def test_link_in_the_middle_of_a_chain_repointed(shadowing, tmp_path):
    """Nothing changes in the directory where the lookup failed (else): only the
    re-pointed link, in a directory of its own, says the lookup goes elsewhere now."""
    s = shadowing()
    _chain(s, tmp_path)
    write(tmp_path / "other" / "y" / "params.h", "#define VALUE 3\n")
    s.settle(1)
    _relink(tmp_path / "hops" / "hop2", str(tmp_path / "other" / "y"))
    assert s.value() == 3
    _relink(tmp_path / "hops" / "hop2", str(tmp_path / "else" / "x"))  # and back
    assert s.value() == 1


def test_dangling_link_in_place_of_the_header(shadowing, tmp_path):
    """first/params.h -> ../else/params.h, which does not exist yet."""
    s = shadowing("params.h")
    (tmp_path / "else").mkdir()
    (s.first / "params.h").symlink_to("../else/params.h")
    s.settle(1)
    write(tmp_path / "else" / "params.h", "#define VALUE 2\n")
    assert s.value() == 2


def test_missing_directory_created_then_the_header(shadowing, tmp_path):
    """No link: first/sub is created (the variant still holds), then first/sub/params.h."""
    s = shadowing()
    s.settle(1)
    (s.first / "sub").mkdir()
    s.settle(1, proven=False)
    write(s.first / "sub" / "params.h", "#define VALUE 2\n")
    assert s.value() == 2


def test_missing_include_directory_created_with_the_header(shadowing, tmp_path):
    """include_path names a directory that does not exist yet (a build's output)."""
    s = shadowing("params.h")
    s.first.rmdir()
    s.settle(1, proven=False)  # no directory to prove it by
    write(s.first / "params.h", "#define VALUE 2\n")
    assert s.value() == 2


def test_dotdot_through_a_directory_later_replaced_by_a_link(shadowing, tmp_path):
    """The candidate's path climbs out of first/a/d with "..": the kernel climbs out
    of whatever a/d is then, so the proof must not shorten the path to first/."""
    s = shadowing("a/d/../../params.h")
    (s.first / "a" / "d").mkdir(parents=True)
    (tmp_path / "elsewhere" / "y" / "z").mkdir(parents=True)
    write(tmp_path / "elsewhere" / "params.h", "#define VALUE 2\n")
    s.settle(1)
    (s.first / "a" / "d").rmdir()
    (s.first / "a" / "d").symlink_to(tmp_path / "elsewhere" / "y" / "z")
    assert s.value() == 2


def test_rows_an_older_cuforge_wrote_keep_no_witness(shadowing, tmp_path):
    """A variant written before the proof followed links names first/ as the witness
    of first/sub/params.h (rows of three, no links): it must not be trusted."""
    s = shadowing()
    (tmp_path / "else").mkdir()
    (s.first / "sub").symlink_to(tmp_path / "else" / "x")
    s.settle(1)
    mkey = _tracking.manifest_key(Program(s.src, "c++", s.opts).source, "ptx", ())
    entry = s.cache.get_entry(mkey)
    record = decode_record(entry.data, "manifest")
    st = s.first.stat()
    for v in record["variants"]:  # as cuforge wrote them before: first/ the witness
        v["dirs"] = [["0", "", st.st_ino, st.st_mtime_ns, st.st_ctime_ns]]
        v["absent"] = [[pos, rel, 0 if pos == "0" else -1] for pos, rel, *_ in v["absent"]]
        v.pop("links", None)
    fields = {k: record[k] for k in record if k not in ("v", "kind")}
    s.cache.set_entry(mkey, encode_record("manifest", fields), entry.meta)
    assert s.value() == 1
    write(tmp_path / "else" / "x" / "params.h", "#define VALUE 2\n")
    assert s.value() == 2
