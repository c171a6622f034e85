"""An include the cache cannot track (``#include MACRO`` it cannot resolve,
``#include_next``, one name for two files) is refused in the command line's words:
``-D HDR='"name.h"'`` and ``--no-cache`` for ``cuforge compile`` (and ``cache
explain``, which reports the refusal rather than a miss), a manifest's ``defines``
for ``cuforge warm`` -- never ``ProgramOptions.define_macro``, ``cache=`` or
``extra_digest=`` (docs/cli.md). Each way out a message names is then taken, and
works. Through the installed ``cuforge`` script, real NVRTC compiles, real caches."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from _cli import isolated_env, run
from cuforge.compile import Program, ProgramOptions
from cuforge.storage import InMemoryProgramCache

NEXT = ("-I", "inc", "-I", "inc2")
KERNEL = 'extern "C" __global__ void k(int* a) { *a = 1; }\n'
#: What only the Python API can do: none of it may reach a command-line user.
PYTHON_WORDS = ("ProgramOptions", "define_macro", "cache=", "extra_digest", "make_program_cache")


def _cli_words(text: str) -> None:
    for word in PYTHON_WORDS:
        assert word not in text, (word, text)


def _failed(done, source: str) -> str:
    """The one refusal line ``compile`` printed for ``source`` (exit 1)."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    # Refused before any compiler ran: never "compile failed" (newcomer pass 10).
    refused = f"{source} (cubin, sm_90): refused, not compiled: the cache cannot track its"
    assert refused in done.stdout and "compile failed" not in done.stdout, done.stdout
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith(f"{source} (sm_90): ")]
    assert len(lines) == 1, done.stderr
    _cli_words(lines[0])
    return lines[0]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """m.cu (#include HDR), n.cu (a header using #include_next: -I inc -I inc2), t.cu
    (cfg.h naming two files: -I two), p.h."""
    (tmp_path / "m.cu").write_text("#include HDR\n" + KERNEL)
    (tmp_path / "p.h").write_text("#define V 3\n")
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "x.h").write_text("#include_next <x.h>\n")
    (tmp_path / "inc2").mkdir()
    (tmp_path / "inc2" / "x.h").write_text("#define X 1\n")
    (tmp_path / "n.cu").write_text("#include <x.h>\n" + KERNEL)
    for sub, text in (("a", "#define A 1\n"), ("b", "#define B 2\n")):
        (tmp_path / "two" / sub).mkdir(parents=True)
        (tmp_path / "two" / sub / "h.h").write_text('#include "cfg.h"\n')
        (tmp_path / "two" / sub / "cfg.h").write_text(text)
    (tmp_path / "t.cu").write_text('#include "a/h.h"\n#include "b/h.h"\n' + KERNEL)
    return tmp_path


def _compile(folder: Path, *args: str):
    return run(folder, "compile", *args, "--arch", "sm_90", "--cache", str(folder / "cache"),
               cwd=folder, env=isolated_env(folder))  # fmt: skip


def test_an_unresolvable_include_macro_says_minus_d_and_no_cache(folder):
    said = _failed(_compile(folder, "m.cu"), "m.cu")
    assert "HDR is not a macro" in said
    assert said.endswith(
        "Spell the name out, define the macro in the source or with -D HDR='\"name.h\"', "
        "or compile with --no-cache"
    ), said
    # The -D it shows, as a shell reads it (name.h: the header's name), compiles and hits.
    shown = shlex.split(said[said.index("-D HDR") : said.index(", or compile")])
    assert shown == ["-D", 'HDR="name.h"']
    define = ["-D", shown[1].replace("name.h", "p.h")]
    first, second = _compile(folder, "m.cu", *define), _compile(folder, "m.cu", *define)
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    assert second.stdout.rstrip().endswith("cache hit"), second.stdout
    done = run(folder, "compile", "m.cu", "--arch", "sm_90", "--no-cache", "-D", 'HDR="p.h"',
               cwd=folder, env=isolated_env(folder))  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_include_next_and_two_files_say_no_cache(folder):
    said = _failed(_compile(folder, "n.cu", *NEXT), "n.cu")
    assert "x.h:1 uses #include_next" in said
    assert said.endswith("include the header by a path of its own, or compile with --no-cache")
    said = _failed(_compile(folder, "t.cu", "-I", "two"), "t.cu")
    assert "'cfg.h' means different files" in said
    assert said.endswith("Give one of the headers another name or path, or compile with --no-cache")
    for source, includes in (("n.cu", NEXT), ("t.cu", ("-I", "two"))):
        # The way out it names is real: uncached, NVRTC itself resolves the includes.
        done = run(folder, "compile", source, "--arch", "sm_90", "--no-cache", *includes,
                   cwd=folder, env=isolated_env(folder))  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_explain_reports_the_refusal_not_a_miss(folder):
    # An entry of m.cu compiled with -D HDR: explain once answered with the option
    # that differs ("miss: option --define-macro=HDR=... removed"), as if it would compile.
    stored = _compile(folder, "m.cu", "-D", 'HDR="p.h"')
    assert stored.returncode == 0, stored.stderr
    for args, said in (
        (("m.cu",), "m.cu:1: cuforge cannot tell which file this include reads"),
        (("n.cu", *NEXT), "x.h:1 uses #include_next"),
        (("t.cu", "-I", "two"), "'cfg.h' means different files"),
    ):
        done = run(folder, "cache", "explain", *args, "--arch", "sm_90", "--cache",
                   str(folder / "cache"), cwd=folder, env=isolated_env(folder))  # fmt: skip
        # compile's status for it, 1 (it was 2: a usage error here, 1 in compile)
        assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        line = lines[0]
        assert line.startswith("cuforge cache explain: error: cuforge compile would refuse it: ")
        assert said in line and "--no-cache" in line and "miss" not in done.stdout, line
        _cli_words(line)
    hit = run(folder, "cache", "explain", "m.cu", "-D", 'HDR="p.h"', "--arch", "sm_90",
              "--cache", str(folder / "cache"), cwd=folder, env=isolated_env(folder))  # fmt: skip
    assert hit.returncode == 0 and hit.stdout.startswith("hit:"), (hit.stdout, hit.stderr)


def test_warm_says_the_manifests_defines(folder):
    (folder / "w.toml").write_text(
        '[[kernel]]\nsource = "m.cu"\narch = "sm_90"\n'
        '[[kernel]]\nsource = "n.cu"\narch = "sm_90"\nincludes = ["inc", "inc2"]\n'
    )
    done = run(folder, "warm", "w.toml", "--cache", str(folder / "cache"),
               cwd=folder, env=isolated_env(folder))  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    _cli_words(done.stdout + done.stderr)
    assert "define the macro in the source or in defines = ['HDR=\"name.h\"']" in done.stdout
    assert "include the header by a path of its own\n" in done.stdout, done.stdout
    assert "--no-cache" not in done.stdout  # warm compiles into the cache only


def test_the_python_api_keeps_its_own_words(folder):
    opts = ProgramOptions(arch="sm_90", name="m.cu")
    with pytest.raises(ValueError, match=r"ProgramOptions\.define_macro.*extra_digest="):
        Program((folder / "m.cu").read_text(), "c++", opts).compile(
            "cubin", cache=InMemoryProgramCache()
        )


def test_compile_and_explain_agree_on_a_refused_include(folder):
    """Newcomer pass 10: compile printed "compile failed" (exit 1) for a source no
    compiler saw, and explain called the same source a usage error (exit 2). Both
    now exit 1 -- compile still compiles and writes the other files it was given --
    and compile's line says the source was refused; --json marks it ``refused``."""
    (folder / "s.cu").write_text(KERNEL)
    done = _compile(folder, "m.cu", "s.cu", "--outdir", "o")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert (folder / "o" / "s.cubin").stat().st_size > 0
    assert not (folder / "o" / "m.cubin").exists()
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "m.cu (cubin, sm_90): refused, not compiled: the cache cannot track its includes "
        "(why: on stderr)"
    ), lines
    assert lines[1].startswith("s.cu -> "), lines
    as_json = _compile(folder, "m.cu", "--json")
    assert as_json.returncode == 1, as_json.stderr
    [result] = json.loads(as_json.stdout)
    assert result["refused"] is True and "HDR is not a macro" in result["error"], result
    explained = run(folder, "cache", "explain", "m.cu", "--arch", "sm_90", "--cache",
                    str(folder / "cache"), cwd=folder, env=isolated_env(folder))  # fmt: skip
    assert explained.returncode == done.returncode == 1, explained.stderr
    # A real compile error is still "compile failed", without "refused".
    (folder / "bad.cu").write_text("this is not C++\n")
    bad = _compile(folder, "bad.cu", "--json")
    assert bad.returncode == 1 and "refused" not in json.loads(bad.stdout)[0], bad.stdout
    assert "bad.cu (cubin, sm_90): compile failed" in _compile(folder, "bad.cu").stdout
