"""The second newcomer pass over the README and docs (issue 36): each test runs the
installed ``cuforge`` console script in a subprocess, on real caches filled by real
NVRTC compiles, and fails on the main it was written against.

- ``cuforge run --warm-set`` recorded nothing for cuforge's own ``compile(cache=True)``
  in the job (only the integrations' caches were wrapped), and ``cuforge warm --set``
  then told the user to run what they had just run.
- A warm manifest's kernel with both ``source`` and ``sources`` compiled only
  ``sources`` (exit 0); ``arch = "compute_90"`` for a cubin said
  ``ProgramOptions.arch is 'compute_90'``.
- ``cache explain`` read entries as a use: under relatime their access time (the
  entry's last use, which ``prune --unused-for`` and eviction go by) jumped to now.
- ``cache clear`` on a read-only mount printed ``error: [Errno 30] Read-only file
  system: '/.../entries/4a/d2ca...'`` where cli.md promises a line saying how many
  stayed; and it printed only ``cleared DIR``, also on an empty cache, though cli.md
  says it counts the entries that went.
- ``--cache 'file:///DIR?mode=777'`` said ``use a group mode such as 0o2770, or pass
  trust_shared=True``: the Python API's words on the command line.
- ``arch = []`` in cuforge.toml said ``arch must be an architecture such as 'sm_90'
  (or 'sm_80,sm_90'), got ''`` -- neither what the file says nor its documented form;
  ``arch = ["sm_80", ""]`` compiled sm_80 alone, silently.
- Exit statuses: ``CUFORGE_TOOLKIT_HEADERS=/nonexist`` made ``compile`` say "compile
  failed" (exit 1), ``--arch sm_999`` (and a settings file's) reached NVRTC (exit 1,
  ``invalid value for --gpu-architecture``) where ``warm`` refused it as a usage
  error, and ``-include nothere.h`` was an NVRTC catastrophic error (exit 1) where a
  missing source is exit 2.
- A signed entry listed without the secret was ``raw`` in ``cache ls`` and ``1 raw`` in
  ``stats``, though raw means "stored without a record".
- ``cache show 1`` with three entries starting with 1 said ``1 matches 3 entries (a,
  b, c...)``: the ``...`` promised more than it showed.
- ``cache stats --json`` named the cache ``"path"`` where ``zero-stats``, ``clear`` and
  ``dir --json`` call it ``"cache"``.
- Papercuts: ``--older-than -5d`` said "expected one argument"; ``--cache ''`` meant
  the default cache, unsaid; ``--arch``'s help left out the settings files; ``cache
  show`` said ``size 4161`` for a 3720-byte cubin; unknown options ended ``(see
  --help)``; a read-only cache's store warning named a writer's temp file; ``doctor``
  saw no problem in ``CUFORGE_STATE_DIR=/etc/passwd``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from _cli import EXAMPLES, SAXPY, isolated_env, one_line_error, read_only_run, run
from cuforge.integrations import warmsets
from cuforge.storage.entry import entry_id
from cuforge.storage.urls import open_cache
from reliability._figures import record

PY = sys.executable


def _ids(home: Path, cache: Path, kind: str = "program") -> list[str]:
    listed = run(home, "cache", "ls", "--json", "--kind", kind, "--cache", str(cache))
    assert listed.returncode == 0, listed.stderr
    return sorted(e["id"] for e in json.loads(listed.stdout))


# -- 1. cuforge's own cached compiles join the warm set -------------------------------------
def test_a_run_records_its_own_cached_compiles_in_the_warm_set(tmp_path: Path) -> None:
    """``compile(cache=True)`` inside ``cuforge run --warm-set`` stored its entry but no
    set was recorded; now the miss's store and, in the next run, the hit are both the set."""
    cache = tmp_path / "cache"
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(
            f"""
            from cuforge import Program, ProgramOptions
            source = open({str(SAXPY)!r}).read()
            options = ProgramOptions(arch="sm_90", name="k.cu")
            Program(source, "c++", options).compile("cubin", cache=True)
            """
        )
    )
    for attempt in ("miss", "hit"):
        result = run(tmp_path, "run", "--cache", str(cache), "--warm-set", "job1", "--", PY,
                     str(job))  # fmt: skip
        assert result.returncode == 0, (attempt, result.stderr)
        (program,) = _ids(tmp_path, cache)
        with open_cache(str(cache)) as opened:
            listed = warmsets.load(opened, "job1")
        assert listed is not None, (attempt, result.stderr)
        assert [entry_id(k) for k in listed] == [program], attempt
    fetched = run(tmp_path, "warm", "--set", "job1", "--cache", str(cache))
    assert fetched.returncode == 0, fetched.stderr
    assert fetched.stdout.startswith("warm set job1: 1 entry listed, 1 in the cache"), (
        fetched.stdout
    )
    record(
        "use", "cli", "cuforge run --warm-set job1 -- python (compile(cache=True) of one "
        "kernel): a miss, then a hit in a second run", 2,
        "the set lists exactly the program's entry both times, and warm --set job1 finds it "
        "(before: no set was recorded, warm --set said 'no warm set')", scale="all",
    )  # fmt: skip


def test_a_run_that_recorded_nothing_says_so(tmp_path: Path) -> None:
    """A job that reads or stores nothing through the cache records no set: the run says
    so, and ``warm --set`` does not tell the user to do what they just did."""
    cache = tmp_path / "cache"
    result = run(tmp_path, "run", "--cache", str(cache), "--warm-set", "job1", "--", PY, "-c",
                 "pass")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warm set 'job1': the job read or stored nothing through the cache" in result.stderr
    fetched = run(tmp_path, "warm", "--set", "job1", "--cache", str(cache))
    assert fetched.returncode == 1
    assert "records one from a job that reads or stores entries" in fetched.stderr, fetched.stderr


# -- 2, 6. warm manifests in the manifest's words --------------------------------------------
def _project(tmp_path: Path, settings: str = "") -> tuple[Path, dict[str, str]]:
    """A folder with saxpy.cu and relu.cu (and cuforge.toml holding ``settings``), and
    an environment whose user settings file is absent."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(SAXPY, project / "saxpy.cu")
    shutil.copy(SAXPY, project / "relu.cu")
    if settings:
        (project / "cuforge.toml").write_text(settings)
    return project, isolated_env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "no-config"))


MANIFESTS = [
    ('source = "saxpy.cu"\nsources = ["relu.cu"]\narch = "sm_90"',
     'm.toml kernel 1: give source = "FILE" or sources = [...], not both'),
    ('source = "saxpy.cu"\narch = "compute_90"',
     "m.toml kernel 1: saxpy.cu: arch 'compute_90' is a virtual architecture and has no "
     'cubin: set arch = "sm_90", or target = "ptx"'),
    ('source = "saxpy.cu"\nvariants = [{arch = "compute_90"}]',
     "m.toml kernel 1 variant 1: saxpy.cu: arch 'compute_90' is a virtual architecture"),
]  # fmt: skip


def test_warm_manifest_mistakes_are_usage_errors_in_its_words(tmp_path: Path) -> None:
    """``source`` beside ``sources`` compiled relu.cu alone, exit 0 (saxpy.cu silently
    dropped); a virtual arch for a cubin said ``ProgramOptions.arch is 'compute_90'``."""
    project, env = _project(tmp_path)
    for n, (kernel, said) in enumerate(MANIFESTS):
        (project / "m.toml").write_text(f"[[kernel]]\n{kernel}\n")
        cache = tmp_path / f"c{n}"
        result = run(tmp_path, "warm", "m.toml", "--cache", str(cache), cwd=project, env=env)
        line = one_line_error(result, "cuforge warm")
        assert line.startswith(f"cuforge warm: error: {said}"), line
        assert "ProgramOptions" not in line, line
        assert result.stdout == "" and not cache.exists()  # nothing compiled, nothing opened
    # the virtual arch from a settings file: said where it came from
    (project / "cuforge.toml").write_text('arch = "compute_90"\n')
    (project / "m.toml").write_text('[[kernel]]\nsource = "saxpy.cu"\n')
    result = run(tmp_path, "warm", "m.toml", "--cache", str(tmp_path / "cs"), cwd=project,
                 env=env)  # fmt: skip
    line = one_line_error(result, "cuforge warm")
    assert "arch 'compute_90' (from arch in project config " in line, line
    assert 'set arch = "sm_90", or target = "ptx"' in line, line
    record(
        "inputs", "cli", "warm manifests: source and sources in one kernel; arch compute_90 "
        "for a cubin (a kernel's, a variant's, a settings file's)", len(MANIFESTS) + 1,
        "every one: exit 2 before anything compiles, one line naming the kernel and key in "
        "the manifest's words (before: source dropped silently, exit 0; 'ProgramOptions.arch "
        "is compute_90')", scale="all",
    )  # fmt: skip


# -- 3. explain is not a use -----------------------------------------------------------------
_WEEK_NS = 7 * 86400 * 10**9


def _payloads(cache: Path) -> list[Path]:
    """A directory cache's entry payloads (whose access time is the entry's last use)."""
    return sorted(p for p in (cache / "entries").rglob("*") if p.is_file() and not p.suffix)


def _age(files: list[Path]) -> dict[Path, int]:
    """Set each file's access and modification times a week back (an entry stored and
    last used a week ago); the access times set."""
    ages = {}
    for path in files:
        then = path.stat().st_mtime_ns - _WEEK_NS
        os.utime(path, ns=(then, then))
        ages[path] = path.stat().st_atime_ns
    return ages


def _reads_move_atime(folder: Path) -> bool:
    """Whether a plain read of a week-old file moves its atime here (relatime, strictatime)."""
    probe = folder / "atime-probe"
    probe.write_bytes(b"x")
    (before,) = _age([probe]).values()
    probe.read_bytes()
    return probe.stat().st_atime_ns != before


@pytest.mark.parametrize("source", ["saxpy.cu", "scale.cu"])  # scale.cu: a header manifest
def test_explain_leaves_every_entrys_use_time(tmp_path: Path, source: str) -> None:
    """``cache explain`` (documented as compiling and counting nothing) moved a week-old
    entry's access time to now, keeping it alive against ``prune --unused-for``."""
    if not _reads_move_atime(tmp_path):
        pytest.skip("reads do not move access times on this file system (noatime)")
    project = tmp_path / "project"
    shutil.copytree(EXAMPLES, project)
    cache = tmp_path / "cache"
    c = ("--arch", "sm_90", "--cache", str(cache))
    built = run(tmp_path, "compile", source, *c, "-o", "out.cubin", cwd=project)
    assert built.returncode == 0, built.stderr
    payloads = _payloads(cache)
    assert len(payloads) == (2 if source == "scale.cu" else 1), payloads  # entry (+ manifest)
    before = _age(payloads)
    for args in ((), ("--json",)):
        answer = run(tmp_path, "cache", "explain", source, *c, *args, cwd=project)
        assert answer.returncode == 0, answer.stderr  # a hit
        assert {p: p.stat().st_atime_ns for p in payloads} == before, args
    # the same entries are still "unused for 5 days": prune --dry-run would remove them
    pruned = run(tmp_path, "cache", "prune", "--unused-for", "5d", "--dry-run", "--json",
                 "--cache", str(cache))  # fmt: skip
    assert pruned.returncode == 0, pruned.stderr
    assert len(json.loads(pruned.stdout)["removed"]) == len(payloads), pruned.stdout
    record(
        "use", "cli", f"cache explain (text and --json) of {source} whose entry files' "
        "access times were a week old, on relatime ext4", 2,
        "every access time unchanged, and prune --unused-for 5d --dry-run still selects "
        "them (before: explain's read moved them to now, a use)", scale="all",
    )  # fmt: skip


# -- 4, 11. clear says what it did ---------------------------------------------------------
def _filled(tmp_path: Path, archs: str = "sm_80,sm_90") -> Path:
    cache = tmp_path / "cache"
    built = run(tmp_path, "compile", str(SAXPY), "--arch", archs, "--outdir",
                str(tmp_path / "out"), "--cache", str(cache))  # fmt: skip
    assert built.returncode == 0, built.stderr
    return cache


def test_clear_counts_what_went(tmp_path: Path) -> None:
    """``clear --yes`` printed only ``cleared DIR``, also on an already empty cache."""
    cache = _filled(tmp_path)
    size = sum(e["size"] for e in json.loads(
        run(tmp_path, "cache", "ls", "--json", "--cache", str(cache)).stdout))  # fmt: skip
    from cuforge.storage.units import format_size

    cleared = run(tmp_path, "cache", "clear", "--yes", "--cache", str(cache))
    assert cleared.returncode == 0, cleared.stderr
    assert cleared.stdout == f"removed 2 entries ({format_size(size)}) from {cache}\n"
    again = run(tmp_path, "cache", "clear", "--yes", "--cache", str(cache))
    assert again.stdout == f"removed 0 entries (0 B) from {cache}\n", again.stdout
    _filled(tmp_path, "sm_90")
    reported = run(tmp_path, "cache", "clear", "--yes", "--json", "--cache", str(cache))
    report = json.loads(reported.stdout)
    assert (report["removed"], report["not_removed"], report["cleared"]) == (1, 0, True)
    assert report["removed_bytes"] > 0
    record(
        "use", "cli", "cache clear --yes on 2 entries, then on the empty cache, then --json on "
        "1 entry", 3,
        "'removed 2 entries (SIZE) from DIR', 'removed 0 entries (0 B) from DIR', --json "
        "removed 1 with removed_bytes (before: 'cleared DIR' every time)", scale="all",
    )  # fmt: skip


def _read_only(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cuforge ARGS`` on a read-only bind mount of ``cache`` (``_cli.read_only_run``)."""
    return read_only_run(cache, *args)


def test_clear_on_a_read_only_mount_says_how_many_stayed(tmp_path: Path) -> None:
    """It printed ``[Errno 30] Read-only file system: '/.../entries/4a/d2ca...'``."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a private read-only mount")
    cache = _filled(tmp_path)
    for args in ((), ("--json",)):
        result = _read_only(cache, "cache", "clear", "--yes", "--cache", str(cache), *args)
        assert result.returncode == 1, result.stdout + result.stderr
        assert result.stderr == (
            f"cuforge cache clear: could not remove 2 of 2 entries of {cache} "
            "(Read-only file system)\n"
        ), result.stderr
        assert "Traceback" not in result.stderr and "entries/" not in result.stderr
        if args:
            report = json.loads(result.stdout)
            assert (report["cleared"], report["removed"], report["not_removed"]) == (False, 0, 2)
        else:
            assert result.stdout == f"removed 0 entries (0 B) from {cache}\n"
    assert len(_ids(tmp_path, cache)) == 2
    record(
        "use", "cli", "cache clear --yes (text and --json) on a read-only bind mount of a "
        "cache of 2 entries", 2,
        "exit 1, 'removed 0 entries', and one stderr line 'could not remove 2 of 2 entries of "
        "DIR (Read-only file system)'; both entries still there (before: 'error: [Errno 30] "
        "Read-only file system: <a file inside the cache>')", scale="all",
    )  # fmt: skip


# -- 5. the command line's words for a world-writable ?mode= -------------------------------
def test_a_world_writable_mode_is_refused_in_the_url_words(tmp_path: Path) -> None:
    """``?mode=777`` was refused with ``... or pass trust_shared=True``."""
    cache = tmp_path / "c"
    url = f"file://{cache}?mode=777"
    given = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                str(tmp_path / "x.cubin"), "--cache", url)  # fmt: skip
    from_env = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                   str(tmp_path / "x.cubin"),
                   env=isolated_env(tmp_path, CUFORGE_CACHE=url))  # fmt: skip
    for result, where in ((given, "--cache"), (from_env, "$CUFORGE_CACHE")):
        line = one_line_error(result, "cuforge compile")
        assert line == (
            f"cuforge compile: error: {where}: ?mode=777 lets every user write the cache (and "
            "plant programs this process runs); use a group mode such as ?mode=2770, or add "
            "?trust=shared to the cache URL"
        ), line
    assert not cache.exists() and not (tmp_path / "x.cubin").exists()
    shared = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                 str(tmp_path / "x.cubin"), "--cache", url + "&trust=shared")  # fmt: skip
    assert shared.returncode == 0, shared.stderr  # the way out it names works
    record(
        "inputs", "cli", "compile --cache file:///DIR?mode=777, and the same URL in "
        "$CUFORGE_CACHE", 2,
        "each: exit 2, one line in the URL's words (?mode=777, ?mode=2770, ?trust=shared; "
        "before: mode=0o777, 0o2770, pass trust_shared=True), and ?trust=shared compiles",
        scale="all",
    )  # fmt: skip


# -- 7. a settings file's arch, quoted as the file writes it -------------------------------
SETTINGS_ARCHS = [("[]", "[]"), ('""', '""'), ('["sm_80", ""]', '["sm_80", ""]'),
                  ("[1]", "[1]"), ('["sm_80,sm_90"]', '["sm_80,sm_90"]')]  # fmt: skip


def test_a_bad_settings_arch_is_quoted_as_the_file_writes_it(tmp_path: Path) -> None:
    project, env = _project(tmp_path)
    for written, quoted in SETTINGS_ARCHS:
        (project / "cuforge.toml").write_text(f"arch = {written}\n")
        result = run(tmp_path, "compile", "saxpy.cu", "--outdir", "out", "--cache",
                     str(tmp_path / "c"), cwd=project, env=env)  # fmt: skip
        line = one_line_error(result, "cuforge compile")
        assert line == (
            f"cuforge compile: error: {project / 'cuforge.toml'}: arch must be an "
            f'architecture such as "sm_90", or a list such as ["sm_80", "sm_90"], got {quoted}'
        ), line
        assert not (project / "out").exists()
    record(
        "inputs", "cli", 'cuforge.toml arch = [], "", ["sm_80", ""], [1], ["sm_80,sm_90"]',
        len(SETTINGS_ARCHS),
        "each: exit 2, one line naming the file, the documented list form and the value as "
        "the file writes it (before: got '' for [] and \"\"; ['sm_80', ''] compiled sm_80 "
        "alone)", scale="all",
    )  # fmt: skip


# -- 8. what compile would refuse is a usage error before anything compiles -----------------
def _no_output(project: Path) -> None:
    assert not (project / "x.cubin").exists() and not (project / "c").exists()


def test_bad_environment_arch_and_include_are_usage_errors(tmp_path: Path) -> None:
    project, env = _project(tmp_path)
    out = ("-o", "x.cubin", "--cache", "c")
    cases: list[tuple[list[str], dict[str, str], str]] = [
        (["--arch", "sm_90"], {"CUFORGE_TOOLKIT_HEADERS": "/nonexist"},
         "CUFORGE_TOOLKIT_HEADERS='/nonexist': no cuda_runtime.h under /nonexist/include"),
        (["--arch", "sm_999"], {}, "--arch sm_999 is not one NVRTC "),
        (["--arch", "sm_90", "-include", "nothere.h"], {},
         "-include nothere.h: no such file (looked in the working directory, the -I "
         "directories and the CUDA headers)"),
        (["--arch", "sm_90", "-include", str(tmp_path / "nothere.h")], {},
         f"-include {tmp_path / 'nothere.h'}: no such file"),
    ]  # fmt: skip
    for args, extra, said in cases:
        for command in (["compile", "saxpy.cu", *args, *out],
                        ["cache", "explain", "saxpy.cu", *args, "--cache", "c"]):  # fmt: skip
            result = run(tmp_path, *command, cwd=project, env={**env, **extra})
            prog = "cuforge " + " ".join(command[:2] if command[0] == "cache" else command[:1])
            line = one_line_error(result, prog)
            assert said in line, line
            _no_output(project)
    # a settings file's arch: named with its file, by compile, explain and doctor
    (project / "cuforge.toml").write_text('arch = "sm_999"\n')
    toml = project / "cuforge.toml"
    said = f"arch 'sm_999' in project config {toml} is not one NVRTC "
    for command in (["compile", "saxpy.cu", *out], ["cache", "explain", "saxpy.cu"]):
        line = one_line_error(run(tmp_path, *command, cwd=project, env=env),
                              "cuforge " + " ".join(command[:2] if command[0] == "cache"
                                                    else command[:1]))  # fmt: skip
        assert said in line, line
        _no_output(project)
    doctor = run(tmp_path, "doctor", "--json", cwd=project, env=env)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert any(said in p for p in json.loads(doctor.stdout)["problems"]), doctor.stdout
    toml.unlink()
    # a warm manifest's pre_include that is not there
    (project / "m.toml").write_text('[[kernel]]\nsource = "saxpy.cu"\narch = "sm_90"\n'
                                    'pre_include = ["nothere.h"]\n')  # fmt: skip
    line = one_line_error(run(tmp_path, "warm", "m.toml", "--cache", "c", cwd=project, env=env),
                          "cuforge warm")  # fmt: skip
    assert "m.toml kernel 1: pre_include nothere.h: no such file (looked in the manifest's" in line
    _no_output(project)
    # what the compiler does find still compiles: the CUDA headers, an -I directory
    (project / "inc").mkdir()
    (project / "inc" / "pre.h").write_text("#define PRE 1\n")
    found = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "-include", "cuda_fp16.h",
                "-include", "pre.h", "-I", "inc", *out, cwd=project, env=env)  # fmt: skip
    assert found.returncode == 0, found.stderr
    record(
        "inputs", "cli", "compile and explain with CUFORGE_TOOLKIT_HEADERS=/nonexist, --arch "
        "sm_999, arch = sm_999 in cuforge.toml (and doctor), -include of a missing relative "
        "and absolute file; warm's pre_include of a missing file", 12,
        "every one: exit 2 before anything compiles, one line naming the variable, flag, "
        "file or key (before: compile failed, exit 1: NVRTC's invalid value for "
        "--gpu-architecture, a catastrophic error); doctor lists the arch as a problem; "
        "-include of a CUDA header or a file on -I still compiles", scale="all",
    )  # fmt: skip


def test_a_settings_files_virtual_arch_is_named_as_the_file_wrote_it(tmp_path: Path) -> None:
    """``arch = "compute_90"`` in cuforge.toml made compile say ``--arch compute_90 is a
    virtual architecture`` (no --arch was given) and explain ``ProgramOptions.arch is
    'compute_90'``; ``explain --arch compute_90`` said the latter too."""
    project, env = _project(tmp_path, 'arch = "compute_90"\n')
    toml = project / "cuforge.toml"
    said = (f"arch 'compute_90' in project config {toml} is a virtual architecture and has "
            'no cubin: set arch = "sm_90" there, pass --arch sm_90, or --target ptx')  # fmt: skip
    for command, prog in ((["compile", "saxpy.cu", "-o", "x.cubin"], "cuforge compile"),
                          (["cache", "explain", "saxpy.cu"], "cuforge cache explain")):  # fmt: skip
        line = one_line_error(run(tmp_path, *command, "--cache", "c", cwd=project, env=env), prog)
        assert line == f"{prog}: error: {said}", line
        _no_output(project)
    toml.unlink()
    flag = run(tmp_path, "cache", "explain", "saxpy.cu", "--arch", "compute_90", "--cache", "c",
               cwd=project, env=env)  # fmt: skip
    assert one_line_error(flag, "cuforge cache explain") == (
        "cuforge cache explain: error: --arch compute_90 is a virtual architecture and has no "
        "cubin: use --arch sm_90, or --target ptx"
    )
    record(
        "inputs", "cli", 'compile and explain with arch = "compute_90" in cuforge.toml; explain '
        "--arch compute_90", 3,
        "each: exit 2, one line naming the value where it was set and the fix there (before: "
        "'--arch compute_90' for a flag never given; explain: 'ProgramOptions.arch is "
        "compute_90')", scale="all",
    )  # fmt: skip


# -- 9. a signed entry listed without the secret --------------------------------------------
def test_a_signed_entry_without_the_secret_is_listed_as_signed(tmp_path: Path) -> None:
    secret = "0123456789abcdef0123456789abcdef"
    cache = str(tmp_path / "c")
    signed_env = isolated_env(tmp_path, CUFORGE_CACHE_SECRET=secret)
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                str(tmp_path / "x.cubin"), "--cache", cache, env=signed_env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    c = ("--cache", cache)
    (entry,) = json.loads(run(tmp_path, "cache", "ls", "--json", *c).stdout)
    assert entry["kind"] == "signed", entry
    assert run(tmp_path, "cache", "ls", *c).stdout.split("\t")[1] == "signed"
    stats = run(tmp_path, "cache", "stats", *c)
    assert "entries             1 (1 signed)" in stats.stdout, stats.stdout
    assert json.loads(run(tmp_path, "cache", "stats", "--json", *c).stdout)["kinds"] == {
        "signed": 1
    }
    only = json.loads(run(tmp_path, "cache", "ls", "--json", "--kind", "signed", *c).stdout)
    assert [e["id"] for e in only] == [entry["id"]]
    assert json.loads(run(tmp_path, "cache", "ls", "--json", "--kind", "raw", *c).stdout) == []
    shown = run(tmp_path, "cache", "show", entry["id"][:12], *c)
    assert "kind            signed\n" in shown.stdout, shown.stdout
    assert "signature not checked: the entry is signed and no secret is set" in shown.stdout
    # with the secret: what it is
    (known,) = json.loads(run(tmp_path, "cache", "ls", "--json", *c, env=signed_env).stdout)
    assert (known["kind"], known["name"]) == ("program", "saxpy.cu")
    record(
        "use", "cli", "cache ls (text, --json, --kind signed/raw), stats (text, --json) and show "
        "of a signed entry without the secret; ls with it", 7,
        "listed as signed, counted '1 signed', show says the record is not read and the "
        "signature not checked; with the secret: program saxpy.cu (before: raw, '1 raw', "
        "though raw means stored without a record)", scale="all",
    )  # fmt: skip


# -- 10. an ambiguous prefix names its matches, and "..." only for more ----------------------
def test_an_ambiguous_prefix_says_dots_only_when_matches_are_left_out(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    wanted = {"1": 3, "a": 6}
    found: dict[str, list[str]] = {p: [] for p in wanted}
    with open_cache(str(cache)) as opened:
        n = 0
        while any(len(found[p]) < k for p, k in wanted.items()):
            key = f"key-{n}".encode()
            n += 1
            eid = entry_id(key)
            if eid[0] in found and len(found[eid[0]]) < wanted[eid[0]]:
                opened.set_entry(key, b"payload", b"")
                found[eid[0]].append(eid)
    three = one_line_error(run(tmp_path, "cache", "show", "1", "--cache", str(cache)),
                           "cuforge cache show")  # fmt: skip
    listed = three.split("(", 1)[1].split(")", 1)[0]
    assert sorted(listed.split(", ")) == sorted(e[:12] for e in found["1"]), three
    assert three.endswith("1 matches 3 entries (" + listed + "): give more digits"), three
    assert "..." not in three
    six = one_line_error(run(tmp_path, "cache", "show", "a", "--cache", str(cache)),
                         "cuforge cache show")  # fmt: skip
    names = six.split("(", 1)[1].split(")", 1)[0].split(", ")
    assert "a matches 6 entries (" in six and names[-1] == "...", six
    assert len(names) == 5 and all(x[:12] in {e[:12] for e in found["a"]} for x in names[:4])
    record(
        "use", "cli", "cache show with a prefix 3 entries share, then one 6 share", 2,
        "the 3 named with no '...'; 4 of the 6 named, then '...' (before: '...' after all 3)",
        scale="all",
    )  # fmt: skip


# -- 13. one key names the cache in every --json ----------------------------------------------
def test_every_json_names_the_cache_by_one_key(tmp_path: Path) -> None:
    cache = str(_filled(tmp_path, "sm_90"))
    c = ("--cache", cache)
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", *c).stdout)
    assert stats["cache"] == cache and stats["path"] == cache  # "path": the deprecated alias
    for action in (["dir"], ["zero-stats"], ["clear", "--yes"]):
        said = json.loads(run(tmp_path, "cache", *action, "--json", *c).stdout)
        assert said["cache"] == cache, (action, said)


# -- 12. papercuts -------------------------------------------------------------------------
NEGATIVE = [
    (["cache", "prune", "--older-than", "-5d"], "--older-than", "-5d", "5d"),
    (["cache", "prune", "--older-than=-5d"], "--older-than", "-5d", "5d"),
    (["cache", "prune", "--unused-for", "-0.5d"], "--unused-for", "-0.5d", "0.5d"),
    (["cache", "prune", "--max-size", "-1G"], "--max-size", "-1G", "1G"),
    (["cache", "prune", "--max-size=-1G"], "--max-size", "-1G", "1G"),
    (["compile", str(SAXPY), "--arch", "sm_90", "--max-size", "-1G"], "--max-size", "-1G", "1G"),
]  # fmt: skip


def test_negative_durations_and_sizes_are_said_as_such(tmp_path: Path) -> None:
    cache = _filled(tmp_path, "sm_90")
    for args, flag, value, bare in NEGATIVE:
        result = run(tmp_path, *args, "--cache", str(cache))
        prog = "cuforge " + " ".join(args[:2] if args[0] == "cache" else args[:1])
        line = one_line_error(result, prog)
        kind = "size" if flag == "--max-size" else "duration"
        assert line == (
            f"{prog}: error: argument {flag}: {value} is negative: give a {kind} above zero, "
            f"such as {bare} (see {prog} --help)"
        ), line
    assert len(_ids(tmp_path, cache)) == 1  # nothing pruned
    record(
        "inputs", "cli", "--older-than -5d, --older-than=-5d, --unused-for -0.5d, --max-size "
        "-1G (prune, compile), --max-size=-1G", len(NEGATIVE),
        "each: exit 2, one line saying the value is negative and what to write (before: "
        "'expected one argument', or 'not a duration'); nothing removed", scale="all",
    )  # fmt: skip


def test_an_empty_cache_flag_is_a_usage_error(tmp_path: Path) -> None:
    """``--cache ''`` compiled into the default cache while ``-o ''`` was an error."""
    out = tmp_path / "x.cubin"
    for command in (["compile", str(SAXPY), "--arch", "sm_90", "-o", str(out)],
                    ["cache", "stats"], ["cache", "ls"], ["doctor"]):  # fmt: skip
        prog = "cuforge " + " ".join(command[:2] if command[0] == "cache" else command[:1])
        result = run(tmp_path, *command, "--cache", "")
        if command == ["doctor"]:  # doctor lists it as the problem it is
            assert result.returncode == 1 and "--cache needs a cache URL" in result.stdout
            continue
        line = one_line_error(result, prog)
        assert line == (
            f"{prog}: error: --cache needs a cache URL or directory (it was given an empty "
            "one); leave --cache out for the default cache"
        ), line
    assert not out.exists() and not (tmp_path / "xdg").exists()  # no default cache made
    bare = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(out), "--cache")
    assert bare.returncode == 0, bare.stderr  # --cache alone: as if not given (documented)
    assert "stored in " + str(tmp_path / "xdg") in bare.stdout
    unset = run(tmp_path, "cache", "dir", env=isolated_env(tmp_path, CUFORGE_CACHE=""))
    assert unset.stdout.strip() == str(tmp_path / "xdg" / "cuforge" / "program-cache")


def test_arch_help_names_the_settings_files(tmp_path: Path) -> None:
    for command in (["compile"], ["cache", "explain"]):
        text = " ".join(run(tmp_path, *command, "--help").stdout.split())
        assert "arch in the settings files -- cuforge.toml, then your config.toml -- else " \
               "this GPU's" in text, text  # fmt: skip


def test_show_labels_the_stored_size_and_the_artifacts(tmp_path: Path) -> None:
    cache = _filled(tmp_path, "sm_90")
    (eid,) = _ids(tmp_path, cache)
    cubin = (tmp_path / "out" / "saxpy.cubin").read_bytes()
    stored = json.loads(run(tmp_path, "cache", "ls", "--json", "--cache", str(cache)).stdout)
    size = stored[0]["size"]
    assert size > len(cubin)
    shown = run(tmp_path, "cache", "show", eid[:12], "--cache", str(cache))
    assert f"size            {size} B stored (artifact: {len(cubin)} B)\n" in shown.stdout
    as_json = json.loads(run(tmp_path, "cache", "show", eid[:12], "--json", "--cache",
                             str(cache)).stdout)  # fmt: skip
    assert (as_json["size"], as_json["artifact_bytes"]) == (size, len(cubin))


def test_every_usage_error_points_at_the_commands_help(tmp_path: Path) -> None:
    for command in (["compile", str(SAXPY), "--bogus"], ["cache", "ls", "--bogus"],
                    ["cache", "prune", "--older-than", "1d", "--bogus"]):  # fmt: skip
        prog = "cuforge " + " ".join(command[:2] if command[0] == "cache" else command[:1])
        line = one_line_error(run(tmp_path, *command), prog)
        assert line == f"{prog}: error: unrecognized arguments: --bogus (see {prog} --help)"


def test_a_read_only_caches_store_warning_names_the_cache_not_a_temp(tmp_path: Path) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a private read-only mount")
    cache = _filled(tmp_path, "sm_80")
    result = _read_only(cache, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                        str(tmp_path / "y.cubin"), "--cache", str(cache))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "cache miss (compiled; not stored: read-only)" in result.stdout
    assert result.stderr.startswith(
        f"cuforge: warning: program cache {cache}: could not store an entry "
        "(Read-only file system); the result is still returned"
    ), result.stderr
    assert ".alive" not in result.stderr and ".new" not in result.stderr


def test_doctor_flags_a_state_dir_that_cannot_keep_records(tmp_path: Path) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("not a directory\n")
    for state, said in ((afile, f"state dir {afile} is not a directory"),
                        (afile / "sub", f"state dir {afile / 'sub'} cannot be made: {afile} "
                                        "is not a directory")):  # fmt: skip
        env = isolated_env(tmp_path, CUFORGE_STATE_DIR=str(state))
        doctor = run(tmp_path, "doctor", "--json", env=env)
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr
        problems = json.loads(doctor.stdout)["problems"]
        assert any(p.startswith(said) and "CUFORGE_STATE_DIR" in p for p in problems), problems
    fine = run(tmp_path, "doctor", "--json")
    assert not any("state dir" in p for p in json.loads(fine.stdout)["problems"]), fine.stdout
    record(
        "inputs", "cli", "papercuts: --cache '' (compile, stats, ls, doctor); --arch help; cache "
        "show's sizes; unknown options' help pointer; a read-only cache's store warning; "
        "doctor with CUFORGE_STATE_DIR a file or under one", 11,
        "--cache '': exit 2 naming the flag, no default cache made (doctor: the problem); the "
        "help names the settings files; show 'N B stored (artifact: M B)'; '(see cuforge CMD "
        "--help)'; the warning names the cache and 'Read-only file system', no temp file; "
        "doctor lists the state dir (before: each silent or in other words)", scale="all",
    )  # fmt: skip
