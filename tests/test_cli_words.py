"""The first hour with the command line: every message true, one meaning for every
word (issue 36). Each test runs the installed ``cuforge`` console script on real
caches filled by real NVRTC compiles.

- Durations and sizes need their unit: ``prune --older-than 30`` removed entries 30
  seconds old and ``--max-size 2`` meant 2 bytes.
- Counts and labels: one signed lookup of an unsigned entry counted two signature
  failures; a SQLite cache's size was shown against its cap as the entries' bytes,
  while the cap bounds the files on disk; a fatbin said ``"cache": "off"`` with the
  cache on; ``--json`` was refused by four commands.
- Papercuts: ``-o -`` made a file named ``-``; ``-o ''`` wrote beside the source; an
  arch typo in ``ls --arch`` listed nothing and exited 0; ``--compiler ""`` was
  "give at least one"; ``1 entries``; ``compile --help`` left out fatbins and
  ``.nvvm``; a ``.ltoir`` input was "not UTF-8 text"; ``cli-hits/`` was 0755.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from _cli import SAXPY, SCRIPT, isolated_env, one_line_error, run
from cuforge.storage.units import format_size
from reliability._figures import record

SECRET = "0123456789abcdef0123456789abcdef"
MINUTE = 60


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory cache holding saxpy for sm_80 and sm_90."""
    home = tmp_path_factory.mktemp("words")
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


def _age_all(cache: Path, seconds: float) -> None:
    then = time.time() - seconds
    for shard in (cache / "entries").iterdir():
        for f in shard.iterdir():
            os.utime(f, (then, then))


# -- durations and sizes ------------------------------------------------------------------
def test_a_duration_or_size_without_a_unit_is_refused(tmp_path, cache):
    _age_all(cache, 5 * MINUTE)  # --older-than 30 (seconds) removed these
    before = _ids(tmp_path, cache)
    refused = 0
    for flag, value, words in (
        ("--older-than", "30", "'30' has no unit: write 30s, 30m, 30h or 30d"),
        ("--unused-for", "7", "'7' has no unit: write 7s, 7m, 7h or 7d"),
        ("--max-size", "2", "'2' has no unit: write 2B for bytes, or 2K, 2M, 2G"),
    ):
        result = run(tmp_path, "cache", "prune", flag, value, "--cache", str(cache))
        line = one_line_error(result, "cuforge cache prune")
        assert f"argument {flag}: {words}" in line
        assert _ids(tmp_path, cache) == before and len(before) == 2
        refused += 1
    work = tmp_path / "w"
    work.mkdir()
    shutil.copy(SAXPY, work / "saxpy.cu")
    flag = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "--max-size", "20",
               "--cache", str(tmp_path / "c"), cwd=work)  # fmt: skip
    assert "argument --max-size: '20' has no unit" in one_line_error(flag, "cuforge compile")
    (work / "cuforge.toml").write_text('max_size = "20"\n')
    settings = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90",
                   "--cache", str(tmp_path / "c"), cwd=work)  # fmt: skip
    line = one_line_error(settings, "cuforge compile")
    assert "max_size" in line and "cuforge.toml" in line and "'20' has no unit" in line
    assert not (tmp_path / "c").exists() and not (work / "saxpy.cubin").exists()
    refused += 2
    # a cache URL keeps plain bytes: programs write those (so does cuforge itself)
    (work / "cuforge.toml").unlink()
    url = f"file://{tmp_path / 'c'}?max_size=1048576"
    ok = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", "--cache", url, cwd=work)
    assert ok.returncode == 0, ok.stderr
    stats = run(tmp_path, "cache", "stats", "--json", "--cache", url)
    assert json.loads(stats.stdout)["max_size_bytes"] == 1 << 20
    record(
        "inputs", "cli",
        "a duration or size without a unit: prune --older-than 30, --unused-for 7 and "
        "--max-size 2 on entries 5 minutes old, compile --max-size 20, a settings file's "
        'max_size = "20"', refused,
        "every one: exit 2, one line naming the flag or file and the units to write "
        "(30s, 2B); no entry removed, nothing compiled; a cache URL's ?max_size=1048576 "
        "is still bytes", scale="all",
    )  # fmt: skip


def test_units_mean_what_they_say(tmp_path, cache):
    _age_all(cache, 5 * MINUTE)
    kept = run(tmp_path, "cache", "prune", "--older-than", "30m", "--cache", str(cache))
    assert kept.returncode == 0 and "removed 0 entries" in kept.stdout, kept.stderr
    sizes = run(tmp_path, "cache", "prune", "--max-size", "2B", "--dry-run", "--json",
                "--cache", str(cache))  # fmt: skip
    assert sizes.returncode == 0, sizes.stderr
    assert json.loads(sizes.stdout)["remaining"] == 0  # 2 bytes hold no entry
    gone = run(tmp_path, "cache", "prune", "--older-than", "1m", "--cache", str(cache))
    assert gone.returncode == 0 and "removed 2 entries" in gone.stdout, gone.stderr


# -- counts and labels ---------------------------------------------------------------------
def test_one_signed_lookup_of_an_unsigned_entry_counts_one_signature_failure(tmp_path):
    cache = str(tmp_path / "c")
    args = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "k.cubin"))
    assert run(tmp_path, *args, "--cache", cache).returncode == 0  # stored unsigned
    signed = isolated_env(tmp_path, CUFORGE_CACHE_SECRET=SECRET)
    again = run(tmp_path, *args, "--cache", cache, env=signed)
    assert again.returncode == 0 and "cache miss" in again.stdout, again.stderr
    stats = run(tmp_path, "cache", "stats", "--json", "--cache", cache, env=signed)
    report = json.loads(stats.stdout)
    assert (report["signature_failures"], report["misses"], report["hits"]) == (1, 2, 0)
    hit = run(tmp_path, *args, "--cache", cache, env=signed)  # now signed: a plain hit
    assert "cache hit" in hit.stdout, hit.stderr
    report = json.loads(run(tmp_path, "cache", "stats", "--json", "--cache", cache,
                            env=signed).stdout)  # fmt: skip
    assert (report["signature_failures"], report["hits"]) == (1, 1)
    record(
        "security", "signed-filestream",
        "cuforge compile through a signed cache over an unsigned entry (a look-again under "
        "the fill's lock), then a hit", 2,
        "cache stats: 1 signature failure, 2 misses, then 1 hit (it counted 2 failures for "
        "the one lookup)", scale="all",
    )  # fmt: skip


def test_sqlite_stats_show_the_disk_use_the_cap_bounds(tmp_path):
    db = tmp_path / "cache.db"
    url = f"sqlite://{db}?max_size=1M"
    for arch in ("sm_80", "sm_90"):
        made = run(tmp_path, "compile", str(SAXPY), "--arch", arch, "-o",
                   str(tmp_path / f"{arch}.cubin"), "--cache", url)  # fmt: skip
        assert made.returncode == 0, made.stderr
    result = run(tmp_path, "cache", "stats", "--json", "--cache", url)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    files = [Path(f"{db}{end}") for end in ("", "-wal", "-shm")]
    on_disk = sum(f.stat().st_size for f in files if f.exists())
    assert report["disk_bytes"] == on_disk > report["size_bytes"] > 0
    assert report["max_size_bytes"] == 1 << 20
    text = run(tmp_path, "cache", "stats", "--cache", url).stdout
    (size,) = [line for line in text.splitlines() if line.startswith("size ")]
    shown = f"{format_size(on_disk)} on disk (entries {format_size(report['size_bytes'])})"
    assert size.split(None, 1)[1] == f"{shown} of 1.0 MiB cap"
    metrics = run(tmp_path, "cache", "stats", "--format", "openmetrics", "--cache", url).stdout
    sample = f'cuforge_cache_disk_bytes{{cache="{url}",backend="SQLiteProgramCache"}} {on_disk}'
    assert sample in metrics.splitlines()
    record(
        "use", "sqlite",
        "cuforge cache stats (text, --json, openmetrics) on a SQLite cache capped at 1 MiB", 3,
        "the size against the cap is the database + WAL + WAL index on disk (what the cap "
        "bounds; disk_bytes), the entries' bytes beside it", scale="all",
    )  # fmt: skip


def test_every_command_that_reports_takes_json(tmp_path, cache):
    """The README promises ``--json`` everywhere; prune, clear, dir and zero-stats
    refused it. (``run`` reports nothing of its own: what it prints is the job's.)"""
    from cuforge.cli import build_parser

    parser = build_parser()
    missing = []
    for command, sub in _subparsers(parser):
        actions = list(_subparsers(sub))
        for name, p in actions or [(command, sub)]:
            if "--json" not in p._option_string_actions:
                missing.append(name)
    assert missing == ["run"]

    c = ("--cache", str(cache))
    where = run(tmp_path, "cache", "dir", "--json", *c)
    assert json.loads(where.stdout) == {"cache": str(cache), "origin": "--cache"}
    zeroed = run(tmp_path, "cache", "zero-stats", "--json", *c)
    assert json.loads(zeroed.stdout) == {"cache": str(cache), "zeroed": True}
    _age_all(cache, 2 * 86400)
    pruned = json.loads(run(tmp_path, "cache", "prune", "--older-than", "1d", "--json", *c).stdout)
    assert pruned["dry_run"] is False and pruned["remaining"] == 0 and pruned["not_removed"] == 0
    assert sorted(e["reason"] for e in pruned["removed"]) == ["stored before --older-than"] * 2
    assert pruned["removed_bytes"] == sum(e["size"] for e in pruned["removed"]) > 0
    cleared = run(tmp_path, "cache", "clear", "--yes", "--json", *c)
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout) == {
        "cache": str(cache), "cleared": True, "removed": 0, "removed_bytes": 0,
        "not_removed": 0,
    }  # fmt: skip
    record(
        "inputs", "cli",
        "--json on every command and cache action, prune, clear, dir and zero-stats "
        "included (before: those four refused it)", 4,
        "every parser takes --json; the four print one JSON document each", scale="all",
    )  # fmt: skip


def _subparsers(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


# -- papercuts -----------------------------------------------------------------------------
def test_o_dash_writes_the_binary_to_stdout_and_the_report_to_stderr(tmp_path):
    """As ``cache show --extract -``: stdout holds the binary alone."""
    cache = str(tmp_path / "c")
    args = ("compile", str(SAXPY), "--arch", "sm_90", "--cache", cache)
    for attempt in ("miss", "hit", "hit"):  # -o - leaves no record for the fast path
        result = subprocess.run(
            [str(SCRIPT), *args, "-o", "-", "--json"], capture_output=True, cwd=tmp_path,
            env=isolated_env(tmp_path), timeout=240,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        (report,) = json.loads(result.stderr)
        assert (report["output"], report["cache"]) == ("-", attempt)
        assert result.stdout[:4] == b"\x7fELF" and report["bytes"] == len(result.stdout)
        assert not (tmp_path / "-").exists()
    to_file = run(tmp_path, *args, "-o", str(tmp_path / "k.cubin"))
    assert to_file.returncode == 0, to_file.stderr
    assert (tmp_path / "k.cubin").read_bytes() == result.stdout
    record(
        "inputs", "cli", "compile -o - (as cache show --extract -): a miss, then two hits", 3,
        "the cubin alone on stdout (byte-equal to -o FILE's), the report on stderr, no "
        "file named - (one was made)", scale="all",
    )  # fmt: skip


def test_an_empty_output_name_is_refused_not_beside_the_source(tmp_path):
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    for flag in ("-o", "--outdir"):
        result = run(tmp_path, "compile", "saxpy.cu", "--arch", "sm_90", flag, "", cwd=tmp_path)
        line = one_line_error(result, "cuforge compile")
        assert f"{flag} needs a" in line and "empty" in line
    assert [p.name for p in tmp_path.iterdir()] == ["saxpy.cu"]  # no saxpy.cubin beside it
    record(
        "inputs", "cli", "compile -o '' and --outdir ''", 2,
        "each: exit 2, one line naming the flag; nothing written (the cubin went beside the "
        "source)", scale="all",
    )  # fmt: skip


def test_a_filter_that_matches_nothing_or_everything_is_refused(tmp_path, cache):
    """``ls --arch sm90`` (a typo) listed nothing, exit 0; ``prune --compiler ""`` said
    "give at least one of" (an empty build is in every compiler's description)."""
    result = run(tmp_path, "cache", "ls", "--arch", "sm90", "--cache", str(cache))
    line = one_line_error(result, "cuforge cache ls")
    assert "argument --arch: 'sm90' is not an architecture (expected e.g. sm_90" in line
    found = run(tmp_path, "cache", "ls", "--arch", "sm_90", "--json", "--cache", str(cache))
    assert [e["arch"] for e in json.loads(found.stdout)] == ["sm_90"]
    result = run(tmp_path, "cache", "prune", "--compiler", "", "--cache", str(cache))
    assert "--compiler needs a build to match" in one_line_error(result, "cuforge cache prune")
    assert len(_ids(tmp_path, cache)) == 2
    record(
        "inputs", "cli", "cache ls --arch sm90 (a typo), cache prune --compiler ''", 2,
        "each: exit 2, one line naming the flag; nothing removed", scale="all",
    )  # fmt: skip


def test_counts_are_singular_for_one(tmp_path, cache):
    one = run(tmp_path, "cache", "verify", "--cache", str(cache))
    assert "checked 2 entries: all verify" in one.stdout
    _age_all(cache, 2 * 86400)
    (first, _) = _ids(tmp_path, cache)
    now = time.time()
    for f in (cache / "entries" / first[:2]).iterdir():
        if f.name.startswith(first[2:]):
            os.utime(f, (now, now))
    dry = run(tmp_path, "cache", "prune", "--older-than", "1d", "--dry-run", "--cache", str(cache))
    assert "would remove 1 entry (" in dry.stdout and "; 1 entry (" in dry.stdout, dry.stdout
    assert "entries" not in dry.stdout.splitlines()[-1]


def test_compile_help_names_fatbins_nvvm_and_stdout(tmp_path):
    result = run(tmp_path, "compile", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for words in ("NAME.fatbin", ".nvvm", "-: standard output"):
        assert words in text, words


def test_compiled_code_as_input_is_named_not_called_non_utf8(tmp_path):
    made = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "--target", "ltoir", "-o",
               str(tmp_path / "saxpy.ltoir"), "--no-cache")  # fmt: skip
    assert made.returncode == 0, made.stderr
    shutil.copy(tmp_path / "saxpy.ltoir", tmp_path / "saxpy.cubin")
    for name, kind in (("saxpy.ltoir", "LTO-IR"), ("saxpy.cubin", "a cubin")):
        result = run(tmp_path, "compile", name, "--arch", "sm_90", "--outdir", "out",
                     cwd=tmp_path)  # fmt: skip
        line = one_line_error(result, "cuforge compile")
        said = f"{name} is {kind}, the output of a compile, not a source; cuforge compile takes"
        assert said in line and "UTF-8" not in line
    (tmp_path / "latin1.cu").write_bytes(b"// caf\xe9\n")
    line = one_line_error(run(tmp_path, "compile", "latin1.cu", "--arch", "sm_90",
                              cwd=tmp_path), "cuforge compile")  # fmt: skip
    assert "latin1.cu is not UTF-8 text, so not CUDA C++" in line
    record(
        "inputs", "cli", "compiled code as a source: saxpy.ltoir, saxpy.cubin; a Latin-1 .cu", 3,
        "each: exit 2, one line saying what the file is (LTO-IR: link it) or that it is not "
        "UTF-8 CUDA C++ (.ltoir was 'not UTF-8 text')", scale="all",
    )  # fmt: skip


def test_the_hit_records_are_private_to_the_user(tmp_path):
    state = tmp_path / "state"
    (state / "cli-hits").mkdir(parents=True, mode=0o755)
    os.chmod(state / "cli-hits", 0o755)  # as an older cuforge left it
    result = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o",
                 str(tmp_path / "k.cubin"), "--cache", str(tmp_path / "c"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE((state / "cli-hits").stat().st_mode) == 0o700
    shards = list((state / "cli-hits").iterdir())
    assert shards and all(stat.S_IMODE(s.stat().st_mode) == 0o700 for s in shards)
    shutil.rmtree(state / "cli-hits")
    again = run(tmp_path, "compile", str(SAXPY), "--arch", "sm_80", "-o",
                str(tmp_path / "k.cubin"), "--cache", str(tmp_path / "c"))  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert stat.S_IMODE((state / "cli-hits").stat().st_mode) == 0o700
    record(
        "security", "cli", "the hit records' folder (cli-hits/): made new, and left 0755 by "
        "an older cuforge", 2,
        "0700 both times, its shards 0700 (makedirs gave it the umask's 0755)", scale="all",
    )  # fmt: skip
