"""The seventh newcomer pass, second half (issue 36: every message true): each test runs
the installed ``cuforge`` console script in a subprocess (or a real Python process), on
real caches with real NVRTC compiles, and fails on the main it was written against.

- 2. ``cache verify`` without the secret said ``all verify`` of a signed entry whose
  signature it never checked; ``cache show`` said ``verifies  yes``.
- 9. doctor's problem line for a settings file's ``max_size = "2"`` and a short secret:
  ``the cache cannot be opened: ...``, not the line compile exits 2 with.
- 10. doctor on a cache capped by Python's ``max_size_bytes=``: ``set by an earlier
  --max-size or ?max_size=``.
- 11. the DEBUG log showed one cache miss as two lines (the first look, then the look
  again under the single-flight lock), plain and header-tracked.
- 12. compiled code given as a source: ``is LTO-IR, which compiles make``; ``run --help``
  said ``--warm`` warns on every compile (it warns once per kernel).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _cli import SAXPY, isolated_env, one_line_error, run
from reliability._figures import record

SECRET = "0123456789abcdef0123456789abcdef"


# -- 2. verify without the secret says what it did not check ---------------------------------
def test_verify_without_the_secret_says_signatures_were_not_checked(tmp_path: Path) -> None:
    cache = str(tmp_path / "c")
    signed_env = isolated_env(tmp_path, CUFORGE_CACHE_SECRET=SECRET)
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                str(tmp_path / "x.cubin"), "--cache", cache, env=signed_env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    c = ("--cache", cache)
    plain = run(tmp_path, "cache", "verify", *c)
    assert plain.returncode == 0, plain.stderr
    assert "all verify" not in plain.stdout, plain.stdout
    assert plain.stdout.strip() == (
        "checked 1 entry: all intact; 1 signed entry's signature was not checked "
        "(no secret set: CUFORGE_CACHE_SECRET or secret_file)"
    ), plain.stdout
    as_json = run(tmp_path, "cache", "verify", "--json", *c)
    assert as_json.returncode == 0, as_json.stderr
    report = json.loads(as_json.stdout)
    assert (report["checked"], report["bad"], report["signatures_unchecked"]) == (1, [], 1)
    # with the secret every check is made: all verify, none unchecked
    keyed = run(tmp_path, "cache", "verify", *c, env=signed_env)
    assert keyed.stdout.strip() == "checked 1 entry: all verify", keyed.stdout
    keyed_json = json.loads(run(tmp_path, "cache", "verify", "--json", *c, env=signed_env).stdout)
    assert keyed_json["signatures_unchecked"] == 0
    # another secret: the signature is checked and fails
    other = isolated_env(tmp_path, CUFORGE_CACHE_SECRET="other-secret-0123456789")
    wrong = run(tmp_path, "cache", "verify", *c, env=other)
    assert wrong.returncode == 1 and "signature does not verify" in wrong.stdout, wrong.stdout
    # show: "verifies" qualified without the secret, plain with it
    (entry,) = json.loads(run(tmp_path, "cache", "ls", "--json", *c).stdout)
    shown = run(tmp_path, "cache", "show", entry["id"][:12], *c)
    assert shown.returncode == 0, shown.stderr
    assert "verifies        yes" not in shown.stdout, shown.stdout
    assert "verifies        intact; the signature not checked (no secret set)\n" in shown.stdout
    shown_json = json.loads(run(tmp_path, "cache", "show", entry["id"][:12], "--json", *c).stdout)
    assert (shown_json["verifies"], shown_json["signature_checked"]) == (True, False)
    with_secret = run(tmp_path, "cache", "show", entry["id"][:12], *c, env=signed_env)
    assert "verifies        yes\n" in with_secret.stdout, with_secret.stdout
    assert (
        "signature_checked"
        not in run(tmp_path, "cache", "show", entry["id"][:12], "--json", *c, env=signed_env).stdout
    )
    record(
        "use", "cli", "cache verify (text, --json) and show (text, --json) of a signed entry "
        "without the secret; with it; with another secret", 7,
        "without: exit 0 'all intact; 1 signed entry's signature was not checked (no secret "
        "set ...)', signatures_unchecked 1, show 'verifies intact; the signature not checked', "
        "signature_checked false; with it: 'all verify'; another secret: exit 1 (before: "
        "'all verify' and 'verifies yes' for a check never made)", scale="all",
    )  # fmt: skip


# -- 12. the words of compiled code as input, and of run --warm ------------------------------
def test_compiled_code_as_input_and_run_warm_help_say_what_happens(tmp_path: Path) -> None:
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--target", "ltoir", "-o",
               str(tmp_path / "saxpy.ltoir"), "--no-cache")  # fmt: skip
    assert made.returncode == 0, made.stderr
    (tmp_path / "saxpy.cubin").write_bytes((tmp_path / "saxpy.ltoir").read_bytes())
    for name, kind in (("saxpy.ltoir", "LTO-IR"), ("saxpy.cubin", "a cubin")):
        line = one_line_error(
            run(tmp_path, "compile", name, "--arch", "sm_90", cwd=tmp_path), "cuforge compile"
        )
        assert "compiles make" not in line, line
        assert f"{name} is {kind}, the output of a compile, not a source; " in line, line
    helped = run(tmp_path, "run", "--help")
    assert helped.returncode == 0, helped.stderr
    words = " ".join(helped.stdout.split())  # argparse wraps the help
    assert "warn on every compile" not in words, words
    assert "--warm the job is warm from the start: warn once per kernel compiled" in words
    record(
        "use", "cli", "compile saxpy.ltoir and saxpy.cubin (compiled code as a source); run "
        "--help", 3,
        "each: exit 2, 'NAME is LTO-IR / a cubin, the output of a compile, not a source; "
        "cuforge compile takes sources: ...'; --warm 'warn once per kernel compiled' (before: "
        "'which compiles make', and 'warn on every compile', though it warns once per kernel)",
        scale="all",
    )  # fmt: skip


# -- 10. doctor names every way a cap file is written ----------------------------------------
def test_doctor_says_a_cap_file_may_come_from_pythons_max_size_bytes(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    made = subprocess.run(
        [sys.executable, "-c", "import sys; from cuforge.utils import FileStreamProgramCache; "
         "FileStreamProgramCache(sys.argv[1], max_size_bytes=2 << 30).close()", str(cache)],
        capture_output=True, text=True, env=isolated_env(tmp_path), timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    report = run(tmp_path, "doctor", "--json", "--cache", str(cache))
    assert report.returncode in (0, 1), report.stderr
    shown = json.loads(report.stdout)["settings"]["max_size"]
    assert shown == {
        "value": "2.0 GiB",
        "from": "the cache's cap file, set when the cache was opened with a cap: --max-size, "
        "?max_size=, max_size in a settings file or max_size_bytes=; it stays until a cap "
        f"given again replaces it, or {cache / 'cap'} is removed",
    }, shown
    text = run(tmp_path, "doctor", "--cache", str(cache)).stdout
    assert "max_size_bytes=" in text and "set by an earlier" not in text, text
    record(
        "use", "cli", "doctor on a directory cache capped by Python's FileStreamProgramCache("
        "max_size_bytes=2 << 30)", 1,
        "max size 2.0 GiB from 'the cache's cap file, set when the cache was opened with a "
        "cap: --max-size, ?max_size=, max_size in a settings file or max_size_bytes=; ...' "
        "(before: 'set by an earlier "
        "--max-size or ?max_size=', neither of which set it)", scale="all",
    )  # fmt: skip


# -- 9. doctor's problem is the line compile exits 2 with ------------------------------------
def test_doctor_problem_is_exactly_compiles_line(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    (project / "cuforge.toml").write_text('max_size = "2"\n')
    other = tmp_path / "q"
    other.mkdir()
    cases = {
        "max_size": (project, isolated_env(tmp_path)),
        "secret": (other, isolated_env(tmp_path, CUFORGE_CACHE_SECRET="short")),
    }
    for what, (cwd, env) in cases.items():
        compiled = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                       str(tmp_path / "x.cubin"), cwd=cwd, env=env)  # fmt: skip
        line = one_line_error(compiled, "cuforge compile").removeprefix("cuforge compile: error: ")
        assert what in line.lower() or "CUFORGE_CACHE_SECRET" in line, line
        report = run(tmp_path, "doctor", "--json", cwd=cwd, env=env)
        assert report.returncode == 1, report.stderr
        assert json.loads(report.stdout)["problems"] == [line], (what, report.stdout)
        text = run(tmp_path, "doctor", cwd=cwd, env=env).stdout
        problems = [ln for ln in text.splitlines() if ln.startswith("problem")]
        assert problems == [f"problem           {line}"], (what, problems)
    record(
        "use", "cli", "doctor (text, --json) and compile with max_size = \"2\" in cuforge.toml; "
        "with a 5-byte $CUFORGE_CACHE_SECRET", 2,
        "each: doctor's one problem line is exactly compile's exit-2 line (before: prefixed "
        "'the cache cannot be opened: ', wrong for a settings value or a secret)", scale="all",
    )  # fmt: skip


# -- 11. one miss, one DEBUG line ------------------------------------------------------------
_LOGGED = r"""
import logging, os, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s %(message)s")
from cuforge import Program, ProgramOptions
from cuforge.utils import FileStreamProgramCache
cache = FileStreamProgramCache(sys.argv[1])
plain = 'extern "C" __global__ void k2(){}'
tracked = '#include "k.h"\nextern "C" __global__ void k3(){ K; }'
for code in (plain, plain, tracked, tracked):
    Program(code, "c++", ProgramOptions(arch="sm_90")).compile("cubin", cache=cache)
print("misses", cache.stats().misses, "hits", cache.stats().hits)
"""


def test_one_cache_miss_is_one_debug_line(tmp_path: Path) -> None:
    (tmp_path / "k.h").write_text("#define K (void)0\n")
    env = isolated_env(tmp_path, CUFORGE_WATCH="0")
    ran = subprocess.run([sys.executable, "-c", _LOGGED, str(tmp_path / "c")], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=240)  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    misses = [ln for ln in lines if ln.startswith("cuforge.cache miss ")]
    hits = [ln for ln in lines if ln.startswith("cuforge.cache hit ")]
    # the plain kernel and the tracked one's manifest: one miss each, then one hit each
    assert lines[-1] == "misses 2 hits 2", lines
    assert len(misses) == 2 and len(set(misses)) == 2, misses
    assert "no entry for this key" in misses[0] and "no manifest" in misses[1], misses
    assert len(hits) == 2, lines
    record(
        "use", "logging", "compile(cache=FileStream) at DEBUG: a plain kernel and a "
        "header-tracked one, each a miss then a hit", 4,
        "2 miss lines for 2 counted misses, 2 hit lines (before: each miss logged twice, by "
        "the first look and the look-again under the single-flight lock)", scale="all",
    )  # fmt: skip
