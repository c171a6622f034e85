"""A newcomer's pass over the README and docs (issue 36: every message true, one
meaning for every word). Each test runs the installed ``cuforge`` console script on
real caches filled by real NVRTC compiles.

- ``prune --compiler 12`` removed every CUDA 13.5 entry: it matched a substring of the
  raw compiler string (build ids hold "12"; ``build-id``, ``headers`` and ``|``
  matched everything) while the reason printed the description ``ls`` shows.
- ``cuforge warm`` compiled a manifest's ``arch = "sm_999"``, ``defines = ["1BAD"]``,
  ``std = "c++18"`` and failed them one by one (exit 1, ProgramOptions' words), where
  cli.md promised usage errors before anything compiles; it ignored the settings
  files' ``arch`` ("no arch"), and ``compile -o`` with two archs from a settings file
  said "-o names one output" without saying where the archs came from.
- A closed standard output under ``-o -`` or ``cache show --extract -`` was exit 2,
  "error: cannot write -: Broken pipe" -- a usage error -- where cli.md says exit 1
  and nothing on stderr (as every other command already did).
- ``cache stats --format openmetrics`` left out ``lock_timeouts``, though cli.md says
  every counter is a counter family.
- ``doctor`` said ``max size - (not set)`` for a cache carrying a recorded cap that
  ``stats`` showed, ``cache invalid (from -)`` for a cache chosen by the project's
  file whose ``secret_file`` is missing, and listed an unknown key's line twice.
- ``cuforge --cache /tmp/x cache stats`` said "argument COMMAND: invalid choice:
  '/tmp/x'": it says that --cache goes after the command now.
- Messages in Python's words on the command line: a 0777 cache directory's fix was
  "pass trust_shared=True ... open_cache(secret=)", a Redis warning said "counted in
  stats() (read_failures, write_failures)", and ``cache show`` printed a manifest's
  variants as ``headers=['scale.h'], absent_candidates=0``.
- ``CUFORGE_CACHE=off cuforge cache dir`` exited 2 "caching is off", where cli.md says
  it prints the cache the rules choose: no cache is an answer (exit 0).
- ``cache explain`` printed ``hit: entry`` with 16 hex digits where ``ls``, the
  logger and its own miss line use 12.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from _cli import EXAMPLES, SAXPY, SCRIPT, isolated_env, one_line_error, run
from reliability._figures import record


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory cache holding saxpy for sm_80 and sm_90."""
    home = tmp_path_factory.mktemp("newcomer")
    result = run(home, "compile", str(SAXPY), "--arch", "sm_80,sm_90", "--outdir",
                 str(home / "out"), "--cache", str(home / "cache"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    return home / "cache"


@pytest.fixture
def cache(filled: Path, tmp_path: Path) -> Path:
    shutil.copytree(filled, tmp_path / "cache")
    return tmp_path / "cache"


def _ids(tmp_path: Path, cache: Path) -> list[str]:
    listed = run(tmp_path, "cache", "ls", "--json", "--cache", str(cache))
    assert listed.returncode == 0, listed.stderr
    return sorted(e["id"] for e in json.loads(listed.stdout))


# -- prune --compiler ----------------------------------------------------------------------
def test_prune_compiler_matches_the_description_ls_prints_not_the_raw_string(tmp_path, cache):
    """``--compiler 12`` selected every CUDA 13.5 entry (a build id holds "12"), and so
    did ``3``, ``build-id``, ``headers`` and ``|``: a substring of the raw string."""
    c = ("--cache", str(cache))
    listed = run(tmp_path, "cache", "ls", *c)
    described = {line.split("\t")[-1] for line in listed.stdout.splitlines()}
    assert len(described) == 1, listed.stdout  # both entries: one compiler
    (description,) = described
    name, version, build = description.split()  # "nvrtc 13.5 feebac3b", as ls prints it
    major = version.split(".")[0]
    before = _ids(tmp_path, cache)
    assert len(before) == 2

    other = "12" if major != "12" else "11"
    for wanted in (other, major[-1], f"{major}.{int(version.split('.')[1]) + 1}", "nvvm",
                   f"{other}.{version.split('.')[1]}", f"nvjitlink {version}"):  # fmt: skip
        pruned = run(tmp_path, "cache", "prune", "--compiler", wanted, "--json", *c)
        assert pruned.returncode == 0, (wanted, pruned.stderr)
        assert json.loads(pruned.stdout)["removed"] == [], wanted
        assert _ids(tmp_path, cache) == before, wanted
    for raw_part in ("build-id", "headers", "|", "build-id:", build[:4]):
        refused = run(tmp_path, "cache", "prune", "--compiler", raw_part, *c)
        line = one_line_error(refused, "cuforge cache prune")
        assert f"--compiler {raw_part!r}" in line and "a version (13, 13.5)" in line, line
        assert _ids(tmp_path, cache) == before, raw_part
    for wanted in (major, version, name, build, build[:6], f"{name} {version}", description,
                   f"{name}:{version}"):  # fmt: skip
        dry = run(tmp_path, "cache", "prune", "--compiler", wanted, "--dry-run", "--json", *c)
        assert dry.returncode == 0, (wanted, dry.stderr)
        reasons = {e["reason"] for e in json.loads(dry.stdout)["removed"]}
        assert reasons == {f"made by compiler {description}"}, (wanted, reasons)
        assert len(json.loads(dry.stdout)["removed"]) == 2, wanted
    assert _ids(tmp_path, cache) == before
    shown = run(tmp_path, "cache", "show", before[0][:12], *c).stdout
    (line,) = [ln for ln in shown.splitlines() if ln.startswith("compiler ")]
    assert line.split(None, 1)[1].startswith(f"{description} ("), line
    raw = json.loads(run(tmp_path, "cache", "ls", "--json", *c).stdout)[0]["compiler"]
    was = " and ".join(w for w in (other, major[-1]) if w in raw) + (
        " were" if other in raw else " was"
    )
    record(
        "inputs", "cli", f"cache prune --compiler on {description} entries: 6 other compilers "
        f"({other}, {major[-1]}, nvvm, ...), 5 parts of the raw string (build-id, headers, "
        "the bar, ...)", 11,
        f"0 entries removed (before: {was} substrings of the raw compiler string, removed "
        "both); the raw parts: exit 2, one line naming --compiler (before: "
        "each removed both); the description's words (13, 13.5, nvrtc, a build id prefix, "
        "the whole line) select exactly its entries", scale="all",
    )  # fmt: skip


# -- warm manifests and the settings files' arch -------------------------------------------
def _project(tmp_path: Path, settings: str = "") -> tuple[Path, dict[str, str]]:
    """A folder with saxpy.cu (and cuforge.toml holding ``settings``), and an
    environment whose user settings file is absent."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(SAXPY, project / "saxpy.cu")
    if settings:
        (project / "cuforge.toml").write_text(settings)
    return project, isolated_env(tmp_path, XDG_CONFIG_HOME=str(tmp_path / "no-config"))


BAD_MANIFESTS = [
    ('arch = "sm_999"', "kernel 1: arch 'sm_999' is not one NVRTC", "(it compiles for sm_"),
    ('arch = "sm_90"\ndefines = ["1BAD"]', "kernel 1: defines 1BAD has an invalid macro name", ""),
    ('arch = "sm_90"\nstd = "c++18"', "kernel 1: std must be one of", "got 'c++18'"),
    ('arch = "sm90"', "kernel 1: arch must look like 'sm_90'", "got 'sm90'"),
    ('arch = "sm_90"\nvariants = [{defines = ["OK"]}, {defines = ["1BAD"]}]',
     "kernel 1 variant 2: defines 1BAD has an invalid macro name", ""),
    ('arch = "sm_90"\nvariants = [{defines = ["A"]}, {std = "c++18"}]',
     "kernel 1 variant 2: std must be one of", ""),
    ('arch = ["sm_90", "sm_999"]\nvariants = [{defines = ["A"]}]',
     "kernel 1 variant 1: arch 'sm_999' (from m.toml kernel 1) is not one NVRTC", ""),
]  # fmt: skip


def test_warm_refuses_what_the_compiler_would_before_anything_compiles(tmp_path):
    """Each was compiled and failed (exit 1, ``ProgramOptions.define_macro[0] ...``),
    or (``sm90``) named ProgramOptions, not the manifest's key."""
    project, env = _project(tmp_path)
    for n, (kernel, said, also) in enumerate(BAD_MANIFESTS):
        (project / "m.toml").write_text(f'[[kernel]]\nsource = "saxpy.cu"\n{kernel}\n')
        cache = tmp_path / f"c{n}"
        result = run(tmp_path, "warm", "m.toml", "--cache", str(cache), cwd=project, env=env)
        line = one_line_error(result, "cuforge warm")
        assert line.startswith(f"cuforge warm: error: m.toml {said}"), line
        assert also in line and "ProgramOptions" not in line, line
        assert result.stdout == "" and not cache.exists()  # nothing compiled, nothing opened
    record(
        "inputs", "cli", "warm manifests the compile options or NVRTC refuse: arch sm_999 (a "
        "kernel's, a variant's), sm90, defines 1BAD, std c++18 (a kernel's, a variant's)",
        len(BAD_MANIFESTS),
        "every one: exit 2 before anything compiles or the cache is opened, one line naming "
        "the manifest, kernel, variant and key in its words (before: 6 compiled and failed, "
        "exit 1; sm90 named ProgramOptions.arch); sm_999 checked against "
        "nvrtcGetSupportedArchs", scale="all",
    )  # fmt: skip


def test_warm_takes_the_settings_files_arch_as_compile_does(tmp_path):
    """A manifest without arch was "kernel 1 variant 1: no arch" while ``compile``
    without ``--arch`` used the settings file's."""
    project, env = _project(tmp_path, 'arch = ["sm_80", "sm_90"]\n')
    (project / "m.toml").write_text('[[kernel]]\nsource = "saxpy.cu"\n')
    cache = str(tmp_path / "c")
    warmed = run(tmp_path, "warm", "m.toml", "--cache", cache, "--json", "--jobs", "1",
                 cwd=project, env=env)  # fmt: skip
    assert warmed.returncode == 0, warmed.stderr
    report = json.loads(warmed.stdout)
    assert sorted(r["arch"] for r in report["results"]) == ["sm_80", "sm_90"]
    assert report["compiled"] == 2
    built = run(tmp_path, "compile", "saxpy.cu", "--outdir", "out", "--cache", cache, "--json",
                cwd=project, env=env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert [r["cache"] for r in json.loads(built.stdout)] == ["hit", "hit"]
    (project / "cuforge.toml").unlink()  # no arch anywhere: said, with where to set one
    bare = run(tmp_path, "warm", "m.toml", "--cache", cache, cwd=project, env=env)
    line = one_line_error(bare, "cuforge warm")
    assert line.endswith("m.toml kernel 1: no arch (set arch in [defaults], the kernel, or a "
                         "settings file: cuforge.toml)"), line  # fmt: skip
    record(
        "inputs", "cli", "cuforge.toml arch = [sm_80, sm_90]: a warm manifest naming no arch, "
        "then compile --outdir; the same manifest with no settings file", 3,
        "warm compiled both archs (before: exit 2, 'no arch') and compile hit both; with no "
        "arch anywhere, exit 2 naming the kernel and the three places to set one", scale="all",
    )  # fmt: skip


def test_o_with_two_archs_from_a_settings_file_names_the_file(tmp_path):
    """It said "-o names one output; use --outdir DIR for several files or archs" though
    the command named one file and no arch."""
    project, env = _project(tmp_path, 'arch = ["sm_80", "sm_90"]\n')
    result = run(tmp_path, "compile", "saxpy.cu", "-o", "x.cubin", "--cache",
                 str(tmp_path / "c"), cwd=project, env=env)  # fmt: skip
    line = one_line_error(result, "cuforge compile")
    settings = project / "cuforge.toml"
    assert f"arch in project config {settings} names 2 archs (sm_80, sm_90)" in line, line
    assert "--arch" in line and "--outdir" in line, line
    assert not (project / "x.cubin").exists()
    one = run(tmp_path, "compile", "saxpy.cu", "-o", "x.cubin", "--arch", "sm_90", "--cache",
              str(tmp_path / "c"), cwd=project, env=env)  # fmt: skip
    assert one.returncode == 0, one.stderr
    record(
        "inputs", "cli", "compile saxpy.cu -o x.cubin with arch = [sm_80, sm_90] in cuforge.toml",
        1, "exit 2, one line naming the file and its two archs and the ways out (--arch, "
        "--outdir, -o NAME.fatbin); before: '-o names one output' without the file; nothing "
        "written", scale="all",
    )  # fmt: skip


# -- a closed standard output --------------------------------------------------------------
def _to_a_closed_pipe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``cuforge ARGS | head -c0``, with the reader gone before anything is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([str(SCRIPT), *args], stdout=write, stderr=subprocess.PIPE,
                              text=True, env=isolated_env(tmp_path), timeout=240)  # fmt: skip
    finally:
        os.close(write)


def test_a_closed_stdout_is_exit_1_and_no_error_line_for_binary_outputs(tmp_path, cache):
    """``-o -`` and ``cache show --extract -`` said "error: cannot write -: Broken
    pipe" and exited 2, a usage error."""
    c = ("--cache", str(cache))
    for attempt in ("miss", "hit"):  # -o - leaves no fast-path record: the full path twice
        args = ("compile", str(SAXPY), "--arch", "sm_75", "-o", "-", *c)
        done = _to_a_closed_pipe(tmp_path, *args)
        assert (done.returncode, done.stderr) == (1, ""), (attempt, done.stderr)
    built = run(tmp_path, "cache", "ls", "--arch", "sm_75", "--json", *c)
    (entry,) = json.loads(built.stdout)  # the miss was compiled and stored all the same
    shown = _to_a_closed_pipe(tmp_path, "cache", "show", entry["id"][:12], "--extract", "-", *c)
    assert shown.returncode == 1, shown.stderr
    assert shown.stderr.startswith("id ")  # the details, which go to stderr with --extract
    assert "error" not in shown.stderr and "Traceback" not in shown.stderr, shown.stderr
    assert "Exception ignored" not in shown.stderr and "wrote " not in shown.stderr
    record(
        "inputs", "cli", "a closed standard output under compile -o - (a miss, a hit) and "
        "cache show --extract -", 3,
        "each: exit 1, no error line on stderr (before: exit 2, 'error: cannot write -: "
        "Broken pipe', a usage error); the miss was stored", scale="all",
    )  # fmt: skip


# -- openmetrics ---------------------------------------------------------------------------
def test_openmetrics_has_a_counter_family_for_every_counter(tmp_path, cache):
    """``lock_timeouts`` was missing: a counter ``stats`` shows, absent from the scrape."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from cuforge.storage.stats import CacheStats

    c = ("--cache", str(cache))
    as_json = json.loads(run(tmp_path, "cache", "stats", "--json", *c).stdout)
    result = run(tmp_path, "cache", "stats", "--format", "openmetrics", *c)
    assert result.returncode == 0, result.stderr
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    renamed = {"bytes_read": "read_bytes", "bytes_written": "written_bytes"}
    counters = list(CacheStats().as_dict())
    assert "lock_timeouts" in counters
    for field in counters:
        family = families.get(f"cuforge_cache_{renamed.get(field, field)}")
        assert family is not None and family.type == "counter", field
        ((sample,),) = [family.samples]
        assert sample.name.endswith("_total") and sample.value == as_json[field], field
    record(
        "use", "cli", "cache stats --format openmetrics: every CacheStats counter "
        f"({len(counters)})", len(counters),
        "each a counter family with its _total sample equal to --json's (before: "
        "lock_timeouts was missing), parsed by prometheus_client's strict parser",
        scale="all",
    )  # fmt: skip


# -- doctor --------------------------------------------------------------------------------
def _doctor(tmp_path: Path, project: Path, env: dict[str, str]) -> tuple[dict, str]:
    report = run(tmp_path, "doctor", "--json", cwd=project, env=env)
    text = run(tmp_path, "doctor", cwd=project, env=env)
    assert report.returncode == text.returncode, (report.stderr, text.stderr)
    return json.loads(report.stdout), text.stdout


def test_doctor_shows_the_cap_a_cache_carries_as_stats_does(tmp_path):
    project, env = _project(tmp_path, 'cache = "c"\n')
    made = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "--max-size", "10M",
               "-o", "x.cubin", cwd=project, env=env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", cwd=project, env=env).stdout)
    assert stats["max_size_bytes"] == 10 << 20
    report, text = _doctor(tmp_path, project, env)
    shown = report["settings"]["max_size"]
    assert shown["value"] == "10.0 MiB", shown  # it said "-" (not set)
    assert shown["from"].startswith("the cache's cap file"), shown
    assert "max size          10.0 MiB  (from the cache's cap file" in text
    url = f"file://{project / 'c'}?max_size=3M"  # the URL's own cap ranks first
    env_url = {**env, "CUFORGE_CACHE": url}
    report, _ = _doctor(tmp_path, project, env_url)
    assert report["settings"]["max_size"] == {
        "value": "3M",
        "from": "the cache URL ($CUFORGE_CACHE)",
    }
    record(
        "use", "cli", "doctor on a directory cache capped by an earlier --max-size 10M; with "
        "?max_size=3M in $CUFORGE_CACHE", 2,
        "max size 10.0 MiB from the cache's cap file, as cache stats shows (before: '- (not "
        "set)'); 3M from the cache URL", scale="all",
    )  # fmt: skip


def test_doctor_names_where_a_cache_that_cannot_be_used_came_from_and_says_each_problem_once(
    tmp_path,
):
    project, env = _project(tmp_path, 'cache = "c"\nsecret_file = "nope"\n')
    settings = project / "cuforge.toml"
    report, text = _doctor(tmp_path, project, env)
    assert report["origin"] == f"project config {settings}", report["origin"]  # it was "-"
    (line,) = [ln for ln in text.splitlines() if ln.startswith("cache ")]
    assert line.endswith(f"(from project config {settings})"), line
    (problem,) = report["problems"]
    assert "secret_file" in problem and "nope" in problem, problem
    settings.write_text('cache = "c"\nbogus = 1\n')
    report, text = _doctor(tmp_path, project, env)
    assert len(report["problems"]) == 1, report["problems"]  # it was listed twice
    assert report["problems"][0] == f"{settings}: unknown key 'bogus' (known: cache, " \
        "max_size, secret_file, arch, mirror)"  # fmt: skip
    assert sum(ln.startswith("problem") for ln in text.splitlines()) == 1, text
    record(
        "inputs", "cli", "doctor with cuforge.toml naming a cache and a missing secret_file; "
        "with an unknown key", 2,
        "the cache line names the project file that chose it (before: 'invalid (from -)'); "
        "the unknown key is one problem line (before: two, the same)", scale="all",
    )  # fmt: skip


# -- options before the command ------------------------------------------------------------
def test_a_command_option_before_the_command_says_where_it_goes(tmp_path, cache):
    """``cuforge --cache DIR cache stats`` said "argument COMMAND: invalid choice: DIR";
    ``cuforge --json cache stats`` "unrecognized arguments: --json"."""
    where = str(cache)
    for args, fixed in (
        (("--cache", where, "cache", "stats"), f"cuforge cache stats --cache {where}"),
        ((f"--cache={where}", "cache", "ls"), f"cuforge cache ls --cache={where}"),
        (("--json", "cache", "dir"), "cuforge cache dir --json"),
        (("--arch", "sm_90", "compile", "k.cu"), "cuforge compile k.cu --arch sm_90"),
    ):
        result = run(tmp_path, *args)
        line = one_line_error(result, "cuforge")
        name = args[0].split("=")[0]
        assert line == f"cuforge: error: {name} is an option of the command, so it goes " \
            f"after it: {fixed}", line  # fmt: skip
        assert result.stdout == ""
        if "compile" not in fixed:  # the command as shown runs (k.cu does not exist)
            assert run(tmp_path, *fixed.split()[1:]).returncode == 0, fixed
    for args in (("--bogus", "cache", "stats"), ("--fix", "cache", "stats")):  # no such option
        line = one_line_error(run(tmp_path, *args), "cuforge")
        assert line.startswith(f"cuforge: error: unrecognized arguments: {args[0]}"), line
    record(
        "inputs", "cli", "a command's option before the command: --cache DIR, --cache=DIR, "
        "--json, --arch sm_90", 4,
        "each: exit 2, one line saying it goes after the command and showing the command as "
        "it should read (before: 'argument COMMAND: invalid choice' or 'unrecognized "
        "arguments'); an option no command has is still 'unrecognized'", scale="all",
    )  # fmt: skip


# -- the command line's words --------------------------------------------------------------
def test_an_unsafe_cache_directory_names_the_command_lines_ways_out(tmp_path):
    """It said "pass trust_shared=True ... sign entries (CUFORGE_CACHE_SECRET /
    open_cache(secret=))", and "open it with mode=0o2770": Python's words."""
    shared, group = tmp_path / "shared", tmp_path / "group"
    for folder, mode in ((shared, 0o777), (group, 0o770)):
        folder.mkdir()
        folder.chmod(mode)
    out = str(tmp_path / "x.cubin")
    lines = []
    for folder, way in ((shared, "?trust=shared"), (group, "?mode=2770")):
        refused = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", out,
                      "--cache", str(folder))  # fmt: skip
        line = one_line_error(refused, "cuforge compile")
        for python in ("trust_shared=True", "open_cache(", "mode=0o2770", "group mode=;"):
            assert python not in line, line
        assert f"add {way} to the cache URL" in line, line
        assert "CUFORGE_CACHE_SECRET, or secret_file in a settings file" in line, line
        lines.append(line)
        taken = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", out, "--cache",
                    f"{folder}{way}")  # fmt: skip
        assert taken.returncode == 0, taken.stderr  # the way out it names works
    assert "but the cache URL sets no group ?mode=" in lines[1], lines[1]
    from cuforge.utils import FileStreamProgramCache, UnsafeCacheError

    other = tmp_path / "api"
    other.mkdir()
    other.chmod(0o777)
    with pytest.raises(UnsafeCacheError, match=r"trust_shared=True"):  # Python keeps its own
        FileStreamProgramCache(other)
    record(
        "inputs", "cli", "compile --cache into a 0777 and a 0770 directory", 2,
        "each: exit 2, the fix in the command line's words (?trust=shared, ?mode=2770, "
        "secret_file; before: trust_shared=True, open_cache(secret=), mode=0o2770), and the "
        "URL it names compiles; the Python API keeps its words", scale="all",
    )  # fmt: skip


def test_a_backend_warning_names_the_counters_as_cache_stats_shows_them(tmp_path):
    """A Redis cache that cannot be reached warned "counted in stats() (read_failures,
    write_failures)": a Python method, on the command line."""
    with socket.socket() as bound:  # bound, never listening: every connect is refused
        bound.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{bound.getsockname()[1]}/0"
        done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                   str(tmp_path / "x.cubin"), "--cache", url)  # fmt: skip
    assert done.returncode == 0, done.stderr  # a cache fault never fails a compile
    (warning,) = [ln for ln in done.stderr.splitlines() if ln.startswith("cuforge: warning:")]
    assert "counted in cuforge cache stats (read failures, write failures)" in warning, warning
    assert "stats()" not in warning and "_failures" not in warning, warning


def test_cache_show_prints_a_header_manifest_for_people(tmp_path):
    """A manifest's variants were ``entry=<64 hex>, headers=['scale.h'],
    absent_candidates=0``: a Python dict's repr."""
    for name in ("scale.cu", "scale.h"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    cache = str(tmp_path / "c")
    made = run(tmp_path, "compile", "scale.cu", "--arch", "sm_90", "-o", "s.cubin", "--cache",
               cache, cwd=tmp_path)  # fmt: skip
    assert made.returncode == 0, made.stderr
    listed = json.loads(run(tmp_path, "cache", "ls", "--json", "--cache", cache).stdout)
    manifest = next(e["id"] for e in listed if e["kind"] == "manifest")
    program = next(e["id"] for e in listed if e["kind"] == "program")
    shown = run(tmp_path, "cache", "show", manifest[:12], "--cache", cache).stdout.splitlines()
    at = shown.index("variants:")
    assert shown[at + 1] == f"  entry {program[:12]}: headers scale.h", shown[at:]
    as_json = json.loads(run(tmp_path, "cache", "show", manifest[:12], "--json", "--cache",
                             cache).stdout)  # fmt: skip
    assert as_json["variants"] == [
        {"entry": program, "headers": ["scale.h"], "absent_candidates": 0}
    ]  # fmt: skip


# -- cache dir with caching off ------------------------------------------------------------
def test_cache_dir_answers_that_caching_is_off(tmp_path):
    """It was a usage error (exit 2): the rules chose "no cache", which is an answer."""
    project, env = _project(tmp_path, 'cache = "off"\n')
    settings = project / "cuforge.toml"
    for extra, args, said in (
        ({"CUFORGE_CACHE": "off"}, (), "$CUFORGE_CACHE=off"),
        ({}, ("--cache", "off"), "--cache off"),
        ({}, (), f"cache = 'off' in project config {settings}"),
    ):
        done = run(tmp_path, "cache", "dir", *args, cwd=project, env={**env, **extra})
        assert (done.returncode, done.stdout, done.stderr) == (
            0, f"caching is off ({said})\n", ""
        ), done  # fmt: skip
        as_json = run(tmp_path, "cache", "dir", "--json", *args, cwd=project,
                      env={**env, **extra})  # fmt: skip
        assert as_json.returncode == 0, as_json.stderr
        assert json.loads(as_json.stdout)["cache"] is None
    default = run(tmp_path, "cache", "dir", "--default", cwd=project, env=env)
    assert default.stdout == str(tmp_path / "xdg" / "cuforge" / "program-cache") + "\n"
    record(
        "inputs", "cli", "cache dir with caching off by $CUFORGE_CACHE, --cache and a "
        "settings file, plain and --json", 6,
        "each: exit 0, 'caching is off (what said so)' or \"cache\": null (before: exit 2, "
        "a usage error); --default still the user cache directory", scale="all",
    )  # fmt: skip


# -- entry ids -----------------------------------------------------------------------------
def test_entry_ids_are_12_hex_digits_everywhere_and_show_takes_any_unique_prefix(tmp_path, cache):
    """``explain`` said ``hit: entry 24e09dfa0c8218e8`` (16), ``ls`` and the logger
    ``24e09dfa0c82`` (12): one entry, two names."""
    c = ("--cache", str(cache))
    listed = json.loads(run(tmp_path, "cache", "ls", "--json", "--arch", "sm_90", *c).stdout)
    (full,) = [e["id"] for e in listed]
    short = full[:12]
    assert run(tmp_path, "cache", "ls", "--arch", "sm_90", *c).stdout.split("\t")[0] == short
    hit = run(tmp_path, "cache", "explain", str(SAXPY), "--arch", "sm_90", *c)
    assert hit.stdout == f"hit: entry {short} would be served\n", hit.stdout
    miss = run(tmp_path, "cache", "explain", str(SAXPY), "--arch", "sm_90", "-D", "X=1", *c)
    assert miss.stdout.splitlines()[-1] == f"(compared with entry {short})", miss.stdout
    logged = run(tmp_path, "-v", "compile", str(SAXPY), "--arch", "sm_90", "-o",
                 str(tmp_path / "x.cubin"), *c)  # fmt: skip
    assert f"hit {short} saxpy.cu" in logged.stderr and full[:13] not in logged.stderr
    others = [e for e in _ids(tmp_path, cache) if e != full]
    shared = max(next(i for i, (a, b) in enumerate(zip(full, o, strict=True)) if a != b)
                 for o in others)  # fmt: skip
    for n in sorted({shared + 1, 6, 12, 40, 64}):
        if n <= shared:  # not unique yet: another entry starts the same
            continue
        shown = run(tmp_path, "cache", "show", full[:n], "--json", *c)
        assert shown.returncode == 0 and json.loads(shown.stdout)["id"] == full, (n, shown.stderr)
    record(
        "use", "cli", "one entry's id in cache ls, explain (hit and miss), the -v log; show "
        "by prefixes of 6 to 64 digits", 5,
        "12 hex digits in every one (before: explain's hit line showed 16); show finds the "
        "entry by any unique prefix", scale="all",
    )  # fmt: skip
