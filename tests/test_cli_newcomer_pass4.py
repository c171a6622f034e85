"""The fourth newcomer pass over the README and docs (issue 36: every message true, one
meaning for every word): each test runs the installed ``cuforge`` console script in a
subprocess, on real caches (real NVRTC compiles, a real redis-server, a real SeaweedFS
S3), and fails on the main it was written against.

- A. ``doctor --cache redis://127.0.0.1:PORT/0`` with nothing listening said ``exists
  yes``, no problem, exit 0 (``cache stats`` then exit 1); a ``?ro`` server cache had
  no ``writable`` line. S3 the same.
- B. ``arch = "compute_90"`` in cuforge.toml: doctor saw no problem, compile and
  explain exit 2.
- C. ``doctor --cache /ro-mount/new``: ``exists  not yet (created by the first
  compile)`` above ``problem ... cannot be created``.
- D. doctor, listed as writing nothing, wrote identity records (and made
  ``$CUFORGE_STATE_DIR``, a relative one in the working directory).
- E. a secret from ``$CUFORGE_CACHE_SECRET`` was labelled ``secret file``.
- F. ``cuforge: warning: cuforge: cuforge compiles ...``, ``cuforge: warning: cuforge
  Redis cache ...``.
- G. ``zero-stats`` on a ``?ro`` URL said ``level 0 (RedisProgramCache) ...
  total_stats() ...``.
- H. ``cache explain --arch sm_80,sm_90`` said ``--arch must look like 'sm_90'``; a
  pasted compile command's ``-o`` was ``unrecognized arguments``.
- I. explain said an arch change three times (the arch, a flag added, a flag removed).
- J. a bare ``cuforge`` printed the whole help; ``cuforge cache`` says one line.
- K. ``sqlite://tmp/k.db`` suggested the working directory's path; an SQLite file as a
  plain path was "not a directory ... (or a path to create)", to every command.
- L. ``CUFORGE_TOOLKIT_HEADERS=yes`` undocumented, ``CUFORGE_WARM=banana`` silently
  not warm, ``--older-than 30M`` 30 minutes, a relative ``XDG_CONFIG_HOME`` used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from _cli import SAXPY, isolated_env, one_line_error, read_only_run, run
from _redis import RedisServer, free_port
from reliability._figures import record


def _doctor(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
    result = run(tmp_path, "doctor", "--json", *args, env=env)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def _doctor_text(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    return run(tmp_path, "doctor", *args, env=env).stdout.splitlines()


# -- A. doctor reaches the server, and says whether it takes stores ----------------------
def test_doctor_reaches_a_redis_server_and_says_whether_it_takes_stores(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Nothing listening: ``exists yes``, no problem, exit 0, while ``cache stats`` exit
    1; ``?ro``: no ``writable`` line."""
    down = f"redis://127.0.0.1:{free_port()}/0"
    stats = run(tmp_path, "cache", "stats", "--cache", down)
    assert stats.returncode == 1 and "Connection refused" in stats.stderr, stats.stderr
    for url in (down, down + "?ro"):
        code, report = _doctor(tmp_path, "--cache", url)
        assert code == 1, report
        (problem,) = report["problems"]
        assert problem.startswith(f"Redis cache {down[8:]}: could not read from the server ("), (
            problem
        )
        assert "Connection refused" in problem
        assert report["exists"] is None and "writable" not in report
        lines = _doctor_text(tmp_path, "--cache", url)
        assert "exists            unknown (see the problem below)" in lines
        assert f"problem           {problem}" in lines
    # one level behind another: the same line (cache stats reads the server's totals)
    code, report = _doctor(tmp_path, "--cache", f"memory://,{down}")
    assert code == 1 and report["problems"] == [problem], report["problems"]

    raw = redis_server.client()
    raw.set("someone-else", "x")
    before = sorted(raw.keys("*"))
    code, report = _doctor(tmp_path, "--cache", redis_server.url)
    assert (code, report["problems"], report["exists"], report["writable"]) == (0, [], True, True)
    code, report = _doctor(tmp_path, "--cache", redis_server.url + "?ro")
    assert (code, report["exists"], report["writable"]) == (0, True, False), report
    assert report["writable_reason"] == "?ro: opened read-only"
    lines = _doctor_text(tmp_path, "--cache", redis_server.url + "?ro")
    assert "writable          no (?ro: opened read-only)" in lines
    assert sorted(raw.keys("*")) == before  # doctor wrote nothing there

    # A user the server lets read but not write: doctor says no, as compile finds.
    reader = RedisServer(tmp_path / "acl", "--user", "reader", "on", ">readerpass", "~*", "&*",
                         "+@all", "-@write")  # fmt: skip
    try:
        url = f"redis://reader:readerpass@127.0.0.1:{reader.port}/0"
        code, report = _doctor(tmp_path, "--cache", url)
        assert (code, report["exists"], report["writable"]) == (0, True, False), report
        assert report["writable_reason"].startswith("the server refuses writes: NoPermission")
        built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                    str(tmp_path / "k.cubin"), "--cache", url)  # fmt: skip
        assert built.returncode == 0 and "not stored" in built.stdout, built.stdout
        wrong = url.replace("readerpass", "wrong")
        code, report = _doctor(tmp_path, "--cache", wrong)
        assert (
            code == 1
            and "could not read from the server (AuthenticationError" in (report["problems"][0])
        ), report["problems"]
        assert reader.client().dbsize() == 0
    finally:
        reader.stop()
    record(
        "use", "cli", "doctor on Redis: nothing listening (plain, ?ro, behind memory://), a "
        "server, ?ro, a read-only ACL user, a wrong password", 7,
        "unreachable: exit 1, 'Redis cache H:P/0: could not read from the server (... "
        "Connection refused.)', exists unknown; writable yes / no (?ro) / no (NoPermission: "
        "compile stored nothing there either); not one key written (before: 'exists yes', "
        "no problem, exit 0, and no writable line for ?ro)", scale="all",
    )  # fmt: skip


def test_doctor_reaches_an_s3_bucket_and_says_whether_it_takes_stores(
    tmp_path: Path, s3_url: str, s3_server: Any
) -> None:
    """S3 the same: an endpoint nobody serves, a bucket that does not exist, ``?ro``."""
    import obstore

    code, report = _doctor(tmp_path, "--cache", s3_url)
    assert (code, report["problems"], report["exists"], report["writable"]) == (0, [], True, True)
    code, report = _doctor(tmp_path, "--cache", s3_url + "&ro")
    assert (code, report["writable"], report["writable_reason"]) == (
        0, False, "?ro: opened read-only"
    ), report  # fmt: skip
    prefix = s3_url.split("?")[0].split("/", 3)[3]
    listed = [m["path"] for page in obstore.list(s3_server.raw(), prefix) for m in page]
    assert listed == []  # doctor wrote nothing
    down = s3_url.replace(s3_server.endpoint, f"http://127.0.0.1:{free_port()}")
    code, report = _doctor(tmp_path, "--cache", down)
    assert code == 1 and report["exists"] is None and "writable" not in report, report
    (problem,) = report["problems"]
    assert problem.startswith("S3 cache ") and "could not read from the server (" in problem
    nobucket = s3_url.replace("s3://cuforge-test/", "s3://no-such-bucket-np4/")
    code, report = _doctor(tmp_path, "--cache", nobucket)
    assert code == 1 and report["problems"][0].endswith(
        "could not read from the server (the bucket does not exist)"
    ), report["problems"]
    try:  # read first: a server that makes buckets on a first PUT made none
        obstore.get(s3_server.raw("no-such-bucket-np4"), "x")
    except FileNotFoundError as exc:
        assert "NoSuchBucket" in str(exc)
    record(
        "use", "cli", "doctor on S3: a bucket, ?ro, an endpoint nobody serves, a bucket that "
        "does not exist", 4,
        "writable yes / no (?ro), no object written; the others exit 1 with 'S3 cache ...: "
        "could not read from the server (...)' (before: 'exists yes', no problem, exit 0)",
        scale="all",
    )  # fmt: skip


# -- B. doctor checks the settings' arch with compile's own function ---------------------
def test_doctor_lists_a_virtual_arch_in_the_settings_as_compile_refuses_it(
    tmp_path: Path,
) -> None:
    """``arch = "compute_90"``: doctor exit 0, no problem; compile and explain exit 2."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "cuforge.toml").write_text('arch = "compute_90"\n')
    env = isolated_env(tmp_path)
    compiled = run(tmp_path, "compile", str(SAXPY), "-o", str(tmp_path / "k.cubin"),
                   cwd=project, env=env)  # fmt: skip
    said = one_line_error(compiled, "cuforge compile").removeprefix("cuforge compile: error: ")
    assert said.startswith("arch 'compute_90' in project config ") and "virtual" in said
    explained = run(tmp_path, "cache", "explain", str(SAXPY), cwd=project, env=env)
    assert one_line_error(explained, "cuforge cache explain").endswith(said)
    result = run(tmp_path, "doctor", "--json", cwd=project, env=env)
    assert result.returncode == 1, result.stdout
    assert json.loads(result.stdout)["problems"] == [said]
    text = run(tmp_path, "doctor", cwd=project, env=env).stdout.splitlines()
    assert f"problem           {said}" in text
    record(
        "inputs", "cli", 'arch = "compute_90" in cuforge.toml: compile, cache explain, doctor', 3,
        "compile and explain exit 2 with 'arch 'compute_90' in project config ... is a virtual "
        "architecture and has no cubin ...'; doctor lists that very line as its one problem, "
        "exit 1 (before: doctor exit 0, no problem)", scale="all",
    )  # fmt: skip


# -- C. a cache that cannot be created is not "not yet (created by the first compile)" ---
def test_doctor_says_a_cache_that_cannot_be_created_will_not_be(tmp_path: Path) -> None:
    """``exists  not yet (created by the first compile)`` above ``problem ... cannot be
    created: Read-only file system``: the two lines contradicted each other."""
    ro = tmp_path / "ro"
    ro.mkdir()
    result = read_only_run(ro, "doctor", "--cache", str(ro / "new"))
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "exists            no, and it cannot be created (see the problem below)" in lines
    assert "created by the first compile" not in result.stdout
    (problem,) = [ln for ln in lines if ln.startswith("problem")]
    assert "cannot be created: Read-only file system" in problem, problem
    as_json = json.loads(read_only_run(ro, "doctor", "--json", "--cache", str(ro / "new")).stdout)
    assert (as_json["exists"], as_json["creatable"]) == (False, False)
    assert "writable" not in as_json
    code, report = _doctor(tmp_path, "--cache", "/proc/cuforge-np4")
    assert (code, report["exists"], report["creatable"]) == (1, False, False), report
    code, report = _doctor(tmp_path, "--cache", str(tmp_path / "fine" / "new"))
    assert (code, report["exists"], report["writable"]) == (0, False, True), report
    assert "creatable" not in report and not (tmp_path / "fine").exists()
    record(
        "inputs", "cli", "doctor --cache under a read-only bind mount (text, --json), under "
        "/proc, and under a writable folder", 4,
        "read-only and /proc: 'exists  no, and it cannot be created (see the problem below)', "
        "creatable false, the problem 'cannot be created: ...'; a writable folder: 'not yet "
        "(created by the first compile)', nothing made (before: 'not yet (created by the first "
        "compile)' above the problem saying it cannot be)", scale="all",
    )  # fmt: skip


# -- D. doctor writes nothing, the state directory included ------------------------------
def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}  # fmt: skip


def test_doctor_writes_no_identity_record(tmp_path: Path) -> None:
    """cache.md lists doctor among the commands that create, write and delete nothing,
    yet it wrote identity records, creating ``$CUFORGE_STATE_DIR`` -- a relative one in
    the working directory."""
    here = tmp_path / "here"
    here.mkdir()
    for state in ("relstate", str(tmp_path / "state-abs")):
        env = isolated_env(tmp_path, CUFORGE_STATE_DIR=state)
        result = run(tmp_path, "doctor", cwd=here, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"state dir         {here / state}" in result.stdout.splitlines()
        assert list(here.iterdir()) == [] and not (tmp_path / "state-abs").exists()
    assert not (tmp_path / "xdg").exists()  # the default cache: probed, not made
    # With records there (a compile wrote them), doctor reads and leaves them as they are.
    env = isolated_env(tmp_path, CUFORGE_STATE_DIR=str(tmp_path / "state"))
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(here / "k.cubin"),
                "--cache", str(tmp_path / "cache"), env=env)  # fmt: skip
    assert built.returncode == 0, built.stderr
    before = _tree(tmp_path / "state"), _tree(tmp_path / "cache")
    assert run(tmp_path, "doctor", "--cache", str(tmp_path / "cache"), env=env).returncode == 0
    assert (_tree(tmp_path / "state"), _tree(tmp_path / "cache")) == before
    record(
        "use", "cli", "doctor with CUFORGE_STATE_DIR relative, absolute (neither there yet), and "
        "after a compile wrote records", 3,
        "no state directory made (nothing in the working directory), no record written or "
        "changed, the default cache not made (before: the identity records written, a "
        "relative state directory created in the working directory)", scale="all",
    )  # fmt: skip


# -- E. the secret's line names where the secret came from -------------------------------
def test_doctor_names_the_secrets_real_source(tmp_path: Path) -> None:
    """A secret from ``$CUFORGE_CACHE_SECRET`` was listed as ``secret file  (a secret)
    (from $CUFORGE_CACHE_SECRET)``: no file was involved."""
    project = tmp_path / "project"
    project.mkdir()
    secret = "a-team-secret-of-at-least-32-bytes!!"
    env = isolated_env(tmp_path, CUFORGE_CACHE_SECRET=secret)
    text = run(tmp_path, "doctor", cwd=project, env=env).stdout
    lines = text.splitlines()
    assert "secret            set (not shown)  (from $CUFORGE_CACHE_SECRET)" in lines, text
    assert not any(ln.startswith("secret file") for ln in lines) and secret not in text
    (project / "key").write_text("another-secret-of-at-least-32-bytes!!\n")
    (project / "cuforge.toml").write_text('secret_file = "key"\n')
    toml = project / "cuforge.toml"
    report = json.loads(run(tmp_path, "doctor", "--json", cwd=project, env=env).stdout)
    assert report["settings"]["secret"] == {"value": "set (not shown)",
                                            "from": "$CUFORGE_CACHE_SECRET"}  # fmt: skip
    assert report["settings"]["secret_file"] == {
        "value": f"{project / 'key'} (not used: $CUFORGE_CACHE_SECRET comes first)",
        "from": f"project config {toml}",
    }
    (tmp_path / "envkey").write_text("third-secret-of-at-least-32-bytes!!!!\n")
    by_file = isolated_env(tmp_path, CUFORGE_CACHE_SECRET_FILE=str(tmp_path / "envkey"))
    lines = run(tmp_path, "doctor", cwd=project, env=by_file).stdout.splitlines()
    assert (f"secret            read from {tmp_path / 'envkey'}  (from $CUFORGE_CACHE_SECRET_FILE)"
            in lines), lines  # fmt: skip
    assert (f"secret file       {project / 'key'} (not used: $CUFORGE_CACHE_SECRET_FILE comes "
            f"first)  (from project config {toml})") in lines, lines  # fmt: skip
    plain = run(tmp_path, "doctor", cwd=project, env=isolated_env(tmp_path)).stdout.splitlines()
    assert f"secret file       {project / 'key'}  (from project config {toml})" in plain
    assert not any(ln.startswith("secret ") and "file" not in ln for ln in plain)
    record(
        "inputs", "cli", "doctor with $CUFORGE_CACHE_SECRET; with it and a secret_file in "
        "cuforge.toml; with $CUFORGE_CACHE_SECRET_FILE and that file; with the file alone", 4,
        "'secret  set (not shown)  (from $CUFORGE_CACHE_SECRET)', the file then 'not used: "
        "$CUFORGE_CACHE_SECRET comes first'; the file alone 'secret file  PATH  (from project "
        "config ...)' (before: 'secret file  (a secret)  (from $CUFORGE_CACHE_SECRET)')",
        scale="all",
    )  # fmt: skip


# -- F. one "cuforge:" in a warning line ---------------------------------------------------
def test_a_warning_says_cuforge_once(tmp_path: Path) -> None:
    """``cuforge: warning: cuforge: cuforge compiles saxpy.cu after the process was
    marked warm``; a backend's ``cuforge: warning: cuforge Redis cache ...``."""
    out = ("-o", str(tmp_path / "k.cubin"))
    env = isolated_env(tmp_path, CUFORGE_WARM="1")
    warm = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", *out, "--cache",
               str(tmp_path / "c"), env=env)  # fmt: skip
    assert warm.returncode == 0, warm.stderr
    assert warm.stderr == (
        "cuforge: warning: cuforge compiles saxpy.cu after the process was marked warm "
        "(counted in cuforge cache stats (warm compiles))\n"
    ), warm.stderr
    stats = run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "c")).stdout
    assert "warm compiles       1" in stats.splitlines(), stats  # the line it names
    down = f"redis://127.0.0.1:{free_port()}/0"
    remote = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", *out, "--cache", down)
    (line,) = remote.stderr.splitlines()
    assert line.startswith(f"cuforge: warning: Redis cache {down[8:]}: lookup failed ("), line
    lines = [warm.stderr.strip(), line]
    assert all(ln.count("cuforge:") == 1 for ln in lines), lines
    api = subprocess.run(  # the Python warning keeps its own words for API users
        [sys.executable, "-W", "always", "-c", "from cuforge import _warm; "
         "_warm.mark_warm(); _warm.note_compile('cuforge', 'k.cu')"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert "cuforge: cuforge compiles k.cu after the process was marked warm" in api.stderr, (
        api.stderr
    )
    record(
        "use", "cli", "compile with CUFORGE_WARM=1 (a warm compile's warning); through a Redis "
        "cache nobody serves (the backend's warning)", 2,
        "each warning line says 'cuforge:' once ('cuforge: warning: cuforge compiles saxpy.cu "
        "... (counted in cuforge cache stats (warm compiles))', 'cuforge: warning: Redis cache "
        "H:P/0: lookup failed ...'); the Python warnings keep their text (before: 'cuforge: "
        "warning: cuforge: cuforge compiles ...', 'cuforge: warning: cuforge Redis cache ...')",
        scale="all",
    )  # fmt: skip


# -- G. zero-stats on a ?ro cache says it in the command line's words ---------------------
def test_zero_stats_on_a_read_only_url_names_the_url(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """``level 0 (RedisProgramCache) is read-only: its shared counters, which
    total_stats() reports, are its writers' to reset``: a level the user never wrote,
    and an API name."""
    cache = tmp_path / "c"
    run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin"),
        "--cache", str(cache))  # fmt: skip
    prog = "cuforge cache zero-stats"
    said = ("is opened read-only (?ro), so its shared counters (what cuforge cache stats "
            "shows) stay as they are; leave ?ro out to reset them")  # fmt: skip
    cases = {
        redis_server.url + "?ro": redis_server.url,
        f"file://{cache}?ro": f"file://{cache}",
        f"memory://,file://{cache}?ro": f"file://{cache}",
    }
    for url, named in cases.items():
        line = one_line_error(run(tmp_path, "cache", "zero-stats", "--cache", url), prog)
        assert line == f"{prog}: error: cannot reset the statistics: {named} {said}", line
        assert "level" not in line and "total_stats" not in line
    stats = json.loads(run(tmp_path, "cache", "stats", "--json", "--cache", str(cache)).stdout)
    assert stats["stores"] == 1  # nothing was reset
    record(
        "inputs", "cli", "cache zero-stats on redis://...?ro, file://...?ro and memory://,file:"
        "//...?ro", 3,
        "exit 2, one line naming the ?ro URL: 'cannot reset the statistics: URL is opened "
        "read-only (?ro), so its shared counters (what cuforge cache stats shows) stay as they "
        "are; leave ?ro out to reset them'; nothing reset (before: 'level 0 "
        "(RedisProgramCache) is read-only: its shared counters, which total_stats() reports, "
        "are its writers' to reset')", scale="all",
    )  # fmt: skip


# -- H. explain takes one arch, and a pasted compile command -------------------------------
def test_explain_says_it_takes_one_arch_and_takes_a_pasted_compile_command(
    tmp_path: Path,
) -> None:
    """``--arch sm_80,sm_90`` said ``--arch must look like 'sm_90' ... got
    'sm_80,sm_90'``; a compile command's ``-o x.cubin`` was ``unrecognized arguments``."""
    cache = tmp_path / "c"
    built = ("compile", str(SAXPY), "--arch", "sm_80", "-o", str(tmp_path / "x.cubin"),
             "--cache", str(cache))  # fmt: skip
    assert run(tmp_path, *built).returncode == 0
    prog = "cuforge cache explain"
    said = (f"{prog}: error: cache explain takes one --arch (it explains one compile), got "
            "sm_80, sm_90: run it once for each")  # fmt: skip
    for archs in (("--arch", "sm_80,sm_90"), ("--arch", "sm_80", "--arch", "sm_90")):
        line = one_line_error(run(tmp_path, "cache", "explain", str(SAXPY), *archs, "--cache",
                                  str(cache)), prog)  # fmt: skip
        assert line == said, line
    # the compile command, pasted: the same answer as without its output options
    pasted = run(tmp_path, "cache", "explain", *built[1:], "--max-size", "2G")
    plain = run(tmp_path, "cache", "explain", str(SAXPY), "--arch", "sm_80", "--cache", str(cache))
    assert pasted.returncode == plain.returncode == 0, pasted.stderr
    assert pasted.stdout == plain.stdout and pasted.stdout.startswith("hit: entry ")
    outdir = run(tmp_path, "cache", "explain", str(SAXPY), "--arch", "sm_80", "--outdir",
                 str(tmp_path / "nowhere"), "--cache", str(cache))  # fmt: skip
    assert outdir.stdout == plain.stdout and not (tmp_path / "nowhere").exists()
    nocache = one_line_error(run(tmp_path, "cache", "explain", str(SAXPY), "--no-cache"), prog)
    assert nocache.startswith(f"{prog}: error: --no-cache: explain says whether the cache")
    record(
        "inputs", "cli", "cache explain with --arch sm_80,sm_90, --arch twice, a pasted compile "
        "command (-o, --max-size), --outdir, --no-cache", 5,
        "two archs: exit 2 'cache explain takes one --arch (it explains one compile), got "
        "sm_80, sm_90: run it once for each'; -o/--outdir/--max-size ignored, the same answer as "
        "without them, nothing made; --no-cache one line naming it (before: 'must look like "
        "sm_90 ... got sm_80,sm_90', 'unrecognized arguments: -o x.cubin', and --arch twice "
        "kept the last silently)", scale="all",
    )  # fmt: skip


# -- I. explain reports one change once --------------------------------------------------
def test_explain_reports_an_arch_change_once(tmp_path: Path) -> None:
    """``arch sm_80 -> sm_75``, then ``option --gpu-architecture=sm_75 added`` and
    ``option --gpu-architecture=sm_80 removed``: one change, said three times."""
    cache = tmp_path / "c"
    built = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80", "-o",
                str(tmp_path / "x.cubin"), "--cache", str(cache))  # fmt: skip
    assert built.returncode == 0, built.stderr
    ask = ("cache", "explain", str(SAXPY), "--arch", "sm_75", "--cache", str(cache))
    result = run(tmp_path, *ask)
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[:-1] == ["miss: arch sm_80 -> sm_75"], result.stdout
    with_define = json.loads(run(tmp_path, *ask, "-D", "BLOCK=256", "--json").stdout)
    assert with_define["reasons"] == ["arch sm_80 -> sm_75",
                                      "option --define-macro=BLOCK=256 added"]  # fmt: skip
    record(
        "use", "cli", "cache explain --arch sm_75 after an sm_80 compile; with -D BLOCK=256 too", 2,
        "'miss: arch sm_80 -> sm_75' alone; with the define, that and 'option "
        "--define-macro=BLOCK=256 added' (before: the arch change also as '--gpu-architecture"
        "=sm_75 added' and '--gpu-architecture=sm_80 removed')", scale="all",
    )  # fmt: skip


# -- J. bare `cuforge` is one line, as bare `cuforge cache` is --------------------------
def test_bare_cuforge_is_one_line(tmp_path: Path) -> None:
    """``cuforge`` printed the whole 17-line help to stderr (exit 2) where ``cuforge
    cache`` says one line."""
    said = ("cuforge: error: a command is required: compile, cache, warm, run, doctor "
            "(see cuforge --help)")  # fmt: skip
    for args in ((), ("-v",), ("-q",)):
        result = run(tmp_path, *args)
        assert one_line_error(result, "cuforge") == said, result.stderr
        assert result.stdout == ""
    assert "an action is required" in one_line_error(run(tmp_path, "cache"), "cuforge cache")
    shown = run(tmp_path, "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: cuforge")
    for command in ("compile", "cache", "warm", "run", "doctor"):
        assert f"    {command} " in shown.stdout  # the line names what the help lists
    record(
        "inputs", "cli", "cuforge with no command (alone, -v, -q); cuforge cache alone; --help", 5,
        "each without a command: exit 2, one line 'a command is required: compile, cache, warm, "
        "run, doctor (see cuforge --help)', as cuforge cache says one line; --help still prints "
        "the full help (before: the 17-line help on stderr)", scale="all",
    )  # fmt: skip


# -- K. the fix a path error suggests is the obvious one ----------------------------------
def test_a_sqlite_path_is_named_as_meant(tmp_path: Path) -> None:
    """``sqlite://tmp/np4/s.db`` suggested ``sqlite:///<cwd>/tmp/np4/s.db``; an SQLite file
    given as a plain path was told to be a directory (``or a path to create``, also to
    commands that create nothing)."""
    import sqlite3

    folder = tmp_path / "np4"
    folder.mkdir()
    db = folder / "s.db"
    with sqlite3.connect(db) as conn:
        conn.execute("create table t (x)")
    work = tmp_path / "w"
    (work / "cache").mkdir(parents=True)
    env = isolated_env(tmp_path)
    stats = "cuforge cache stats"
    url = f"sqlite:/{db}"  # two slashes: the host is the path's first folder
    line = one_line_error(run(tmp_path, "cache", "stats", "--cache", url, cwd=work, env=env),
                          stats)  # fmt: skip
    assert line.endswith(f"an absolute path takes three slashes: 'sqlite://{db}'"), line
    # the working directory's reading where only it exists (the documented example)
    line = one_line_error(run(tmp_path, "cache", "stats", "--cache", "sqlite://cache/k.db",
                              cwd=work, env=env), stats)  # fmt: skip
    assert line.endswith(f"'sqlite://{work / 'cache' / 'k.db'}'"), line
    hint = f"is an SQLite database file, not a directory; fix: open it as sqlite://{db}"
    for command in (("cache", "stats"), ("cache", "ls"), ("compile", str(SAXPY), "--arch",
                    "sm_90", "-o", str(tmp_path / "k.cubin"))):  # fmt: skip
        prog = "cuforge " + " ".join(command[:2] if command[0] == "cache" else command[:1])
        line = one_line_error(run(tmp_path, *command, "--cache", str(db), env=env), prog)
        assert line == f"{prog}: error: --cache: cache directory {db}: {hint}", line
    plain = tmp_path / "notes.txt"
    plain.write_text("not a cache\n")
    for command in (("cache", "stats"), ("compile", str(SAXPY), "--arch", "sm_90")):
        prog = "cuforge " + " ".join(command[:2] if command[0] == "cache" else command[:1])
        line = one_line_error(run(tmp_path, *command, "--cache", str(plain), env=env), prog)
        assert line.endswith(f"{plain}: exists and is not a directory; fix: name a directory")
        assert "a path to create" not in line
    with sqlite3.connect(db) as conn:  # the database was only read
        assert conn.execute("select name from sqlite_master").fetchall() == [("t",)]
    record(
        "inputs", "cli", "sqlite:/<abs path> (two slashes) and sqlite://cache/k.db; an SQLite "
        "file as a plain path to stats, ls, compile; a text file to stats and compile", 7,
        "the hint is 'sqlite:///<the path with its slash>' (the working directory's reading "
        "only where just that folder exists); an SQLite file: 'is an SQLite database file, not "
        "a directory; fix: open it as sqlite:///...'; a text file: 'fix: name a directory', "
        "no 'or a path to create' (before: the working directory prepended, and 'name a "
        "directory (or a path to create)' to every command)", scale="all",
    )  # fmt: skip


# -- L. lenient values: documented, or refused in one line -------------------------------
def test_toolkit_headers_values_are_all_documented() -> None:
    """``CUFORGE_TOOLKIT_HEADERS=yes|on|true`` meant auto, while compile.md listed only
    unset, ``""``, ``1`` and ``auto``."""
    from cuforge.compile.cache import _toolkit

    doc = (Path(__file__).resolve().parents[1] / "docs" / "compile.md").read_text()
    rows = [ln for ln in doc.splitlines() if ln.startswith("| ") and "header sets" not in ln]
    (auto,) = [ln for ln in rows if ln.startswith("| unset,")]
    (off,) = [ln for ln in rows if ln.startswith("| `0`")]
    for value in _toolkit._AUTO - {""}:
        assert f"`{value}`" in auto.split("|")[1], (value, auto)
    for value in _toolkit._OFF:
        assert f"`{value}`" in off.split("|")[1], (value, off)


def test_a_warm_switch_that_is_no_switch_is_refused(tmp_path: Path) -> None:
    """``CUFORGE_WARM=banana`` was silently "not warm"."""
    out = ("-o", str(tmp_path / "k.cubin"), "--cache", str(tmp_path / "c"))
    said = ("$CUFORGE_WARM='banana' is not a switch: 1 (or true, yes, on) marks the process "
            "warm; 0 (or false, no, off), empty or unset does not")  # fmt: skip
    env = isolated_env(tmp_path, CUFORGE_WARM="banana")
    for args, prog in (
        (("compile", str(SAXPY), "--arch", "sm_90", *out), "cuforge compile"),
        (("warm", "--set", "job1", "--cache", str(tmp_path / "c")), "cuforge warm"),
    ):
        line = one_line_error(run(tmp_path, *args, env=env), prog)
        assert line == f"{prog}: error: {said}", line
    assert not (tmp_path / "k.cubin").exists()
    for i, (value, warm) in enumerate((("off", False), ("No", False), ("", False),
                                       ("yes", True), ("ON", True))):  # fmt: skip
        done = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                   str(tmp_path / "k.cubin"), "--cache", str(tmp_path / f"fresh{i}"),
                   env=isolated_env(tmp_path, CUFORGE_WARM=value))  # fmt: skip
        assert done.returncode == 0 and "cache miss" in done.stdout, (value, done.stderr)
        assert ("marked warm" in done.stderr) is warm, (value, done.stderr)


def test_a_duration_in_capital_m_is_refused(tmp_path: Path, redis_server: RedisServer) -> None:
    """``--older-than 30M`` was 30 minutes, though cli.md lists only lowercase units
    and ``M`` reads as months as easily."""
    cache = tmp_path / "c"
    run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin"),
        "--cache", str(cache))  # fmt: skip
    prog = "cuforge cache prune"
    said = ("'30M': M is not a duration unit (minutes or months?): write 30m for minutes; "
            "months are no unit (write days or weeks: 90d, 13w)")  # fmt: skip
    for flag in ("--older-than", "--unused-for"):
        line = one_line_error(run(tmp_path, "cache", "prune", flag, "30M", "--dry-run",
                                  "--cache", str(cache)), prog)  # fmt: skip
        assert line == f"{prog}: error: argument {flag}: {said} (see {prog} --help)", line
        for fine in ("30m", "2H", "1D"):
            done = run(tmp_path, "cache", "prune", flag, fine, "--dry-run", "--cache", str(cache))
            assert done.returncode == 0, (fine, done.stderr)
    url = f"{redis_server.url}?ttl=30M"
    line = one_line_error(run(tmp_path, "cache", "dir", "--cache", url), "cuforge cache dir")
    assert line.endswith(f"ttl: {said}"), line


def test_a_relative_xdg_config_home_is_ignored_like_a_relative_xdg_cache_home(
    tmp_path: Path,
) -> None:
    """A relative ``XDG_CONFIG_HOME`` was used (relative to the working directory) while
    a relative ``XDG_CACHE_HOME`` was ignored; the XDG spec says both are invalid."""
    home, here = tmp_path / "home", tmp_path / "here"
    (here / "rel" / "cuforge").mkdir(parents=True)
    (here / "rel" / "cuforge" / "config.toml").write_text('arch = "sm_80"\n')
    (here / "relcache").mkdir()
    (home / ".config" / "cuforge").mkdir(parents=True)
    env = isolated_env(tmp_path, HOME=str(home), XDG_CONFIG_HOME="rel", XDG_CACHE_HOME="relcache")
    report = json.loads(run(tmp_path, "doctor", "--json", cwd=here, env=env).stdout)
    user = home / ".config" / "cuforge" / "config.toml"
    assert report["settings"]["files"]["value"] == f"none (user file: {user})", report["settings"]
    assert report["settings"]["arch"]["from"] == "not set"
    assert report["cache"] == str(home / ".cache" / "cuforge" / "program-cache")
    user.write_text('arch = "sm_90"\n')  # the file the relative value is ignored for
    report = json.loads(run(tmp_path, "doctor", "--json", cwd=here, env=env).stdout)
    assert report["settings"]["arch"] == {"value": "sm_90", "from": f"user config {user}"}
    record(
        "inputs", "cli", "CUFORGE_WARM=banana (compile, warm) and off/No/''/yes/ON; --older-than "
        "and --unused-for 30M, and 30m/2H/1D; ?ttl=30M; a relative XDG_CONFIG_HOME; the "
        "CUFORGE_TOOLKIT_HEADERS values against compile.md", 18,
        "banana: exit 2 naming $CUFORGE_WARM and its values, nothing compiled; the switches "
        "work; 30M: exit 2 ''30M': M is not a duration unit (minutes or months?) ...' (the "
        "URL's ttl too), other units in any case accepted; the relative XDG_CONFIG_HOME "
        "ignored (~/.config used), as a relative XDG_CACHE_HOME is; every auto and off value of "
        "CUFORGE_TOOLKIT_HEADERS listed in compile.md (before: banana silently not warm, 30M "
        "30 minutes, the relative config directory read, on/yes/true undocumented)",
        scale="all",
    )  # fmt: skip


def test_doctor_on_a_redis_replica_and_beside_the_fleet_counters(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The write doctor sends sets nothing: with the fleet's counters there (a hash, so
    the server answers WRONGTYPE after granting the write) it is ``writable yes`` and
    the counters stay; a replica refuses it (READONLY), as it refuses a store."""
    raw = redis_server.client()
    raw.hset("cuforge:stats", mapping={"hits": 3, "misses": 1})
    code, report = _doctor(tmp_path, "--cache", redis_server.url)
    assert (code, report["writable"], report["problems"]) == (0, True, []), report
    assert raw.hgetall("cuforge:stats") == {b"hits": b"3", b"misses": b"1"}
    assert raw.dbsize() == 1
    replica = RedisServer(tmp_path / "replica", "--replicaof", "127.0.0.1", str(redis_server.port))
    try:
        code, report = _doctor(tmp_path, "--cache", replica.url)
        assert (code, report["exists"], report["writable"]) == (0, True, False), report
        assert report["writable_reason"].startswith("the server refuses writes: ReadOnlyError"), (
            report["writable_reason"]
        )
    finally:
        replica.stop()
    record(
        "use", "cli", "doctor on Redis with the fleet's counters there; on a replica", 2,
        "writable yes and the counters hash unchanged (the probe sets nothing); the replica: "
        "'writable no (the server refuses writes: ReadOnlyError ...)', exit 0", scale="all",
    )  # fmt: skip
