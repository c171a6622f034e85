"""``cuforge cache ...`` end to end: the console script against real file caches
filled by real compiles (small kernels, compiled once per module and copied)."""

from __future__ import annotations

import json
import os
import pty
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from _cli import SAXPY, SCRIPT, isolated_env, one_line_error, run

DAY = 86400


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache holding saxpy for sm_80 and sm_90 (program entries) and a header-tracked
    source (its entry plus a header manifest); the outputs beside it."""
    home = tmp_path_factory.mktemp("filled")
    (home / "v.h").write_text("#define V 1\n")
    (home / "h.cu").write_text('#include "v.h"\nextern "C" __global__ void k(int* p) { *p = V; }\n')
    cache = home / "cache"
    for args in (
        (str(SAXPY), "--arch", "sm_80", "--arch", "sm_90", "--outdir", str(home / "out")),
        ("h.cu", "--arch", "sm_90"),
    ):
        result = run(home, "compile", *args, "--cache", str(cache), cwd=home)
        assert result.returncode == 0, result.stderr
    return home


@pytest.fixture
def cache(filled, tmp_path):
    """A private copy of the filled cache (tests may damage or prune it)."""
    shutil.copytree(filled / "cache", tmp_path / "cache")
    return tmp_path / "cache"


def cli(tmp_path, *args, **kwargs):
    return run(tmp_path, *args, **kwargs)


def _ls(tmp_path, cache, *extra):
    result = cli(tmp_path, "cache", "ls", "--cache", str(cache), "--json", *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _payload(cache, entry_id):
    return cache / "entries" / entry_id[:2] / entry_id[2:]


# -- stats and zero-stats ------------------------------------------------------------
def test_stats_reports_entries_kinds_counters_and_ages(tmp_path, cache):
    result = cli(tmp_path, "cache", "stats", "--cache", str(cache))
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "FileStreamProgramCache" in text
    assert "4 (1 manifest, 3 program)" in text
    assert "(no cap set)" in text
    assert "0.0 % (0 hits / 3 lookups)" in text  # one miss per compile
    for label in ("stores", "evictions", "integrity failures", "write failures", "oldest entry"):
        assert label in text
    report = json.loads(cli(tmp_path, "cache", "stats", "--cache", str(cache), "--json").stdout)
    assert report["entries"] == 4 and report["kinds"] == {"program": 3, "manifest": 1}
    assert report["misses"] == 3 and report["stores"] == 4  # the manifest is a store too
    assert report["oldest_ns"] <= report["newest_ns"] <= time.time_ns()


def test_zero_stats_restarts_the_counters(tmp_path, cache):
    assert cli(tmp_path, "cache", "zero-stats", "--cache", str(cache)).returncode == 0
    report = json.loads(cli(tmp_path, "cache", "stats", "--cache", str(cache), "--json").stdout)
    assert (report["hits"], report["misses"], report["stores"]) == (0, 0, 0)
    assert report["entries"] == 4  # the entries stay
    hit = cli(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "x"),
              "--cache", str(cache))  # fmt: skip
    assert "cache hit" in hit.stdout, hit.stderr
    report = json.loads(cli(tmp_path, "cache", "stats", "--cache", str(cache), "--json").stdout)
    assert (report["hits"], report["misses"]) == (1, 0)


# -- ls and show ---------------------------------------------------------------------
def test_ls_lists_every_entry_with_its_metadata(tmp_path, cache):
    result = cli(tmp_path, "cache", "ls", "--cache", str(cache))
    assert result.returncode == 0, result.stderr
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert len(rows) == 4 and all(len(r) == 9 for r in rows)  # no header off a terminal
    by_name = {(r[1], r[7], r[3]) for r in rows}
    assert by_name == {
        ("program", "saxpy.cu", "sm_80"), ("program", "saxpy.cu", "sm_90"),
        ("program", "h.cu", "sm_90"), ("manifest", "h.cu", "sm_90"),
    }  # fmt: skip
    for r in rows:
        assert len(r[0]) == 12 and r[4].endswith(("B", "KiB"))
        assert r[8].startswith("nvrtc ") if r[1] == "program" else r[8] == "-"
    listed = _ls(tmp_path, cache, "--sort", "size")
    assert [e["size"] for e in listed] == sorted((e["size"] for e in listed), reverse=True)
    assert len(_ls(tmp_path, cache, "--limit", "2")) == 2
    assert {e["kind"] for e in listed} == {"program", "manifest"}
    assert all(len(e["id"]) == 64 for e in listed)


def test_show_prints_metadata_and_extracts_the_raw_binary(tmp_path, cache, filled):
    (saxpy90,) = [e for e in _ls(tmp_path, cache) if e["name"] == "saxpy.cu" and
                  e["arch"] == "sm_90"]  # fmt: skip
    out = tmp_path / "x.cubin"
    result = cli(tmp_path, "cache", "show", saxpy90["id"][:10], "--cache", str(cache),
                 "--extract", str(out))  # fmt: skip
    assert result.returncode == 0, result.stderr
    # with --extract the details go to stderr: stdout is the payload's alone
    assert "verifies        yes" in result.stderr and "--gpu-architecture=sm_90" in result.stderr
    assert result.stdout == ""
    assert out.read_bytes() == (filled / "out" / "saxpy.sm_90.cubin").read_bytes()
    piped = subprocess.run([str(SCRIPT), "cache", "show", saxpy90["id"][:10], "--cache",
                            str(cache), "--extract", "-"], capture_output=True,
                           env=isolated_env(tmp_path), timeout=60)  # fmt: skip
    assert piped.returncode == 0 and piped.stdout == out.read_bytes(), piped.stderr
    text = cli(tmp_path, "cache", "show", saxpy90["id"][:10], "--cache", str(cache)).stdout
    (created,) = [ln for ln in text.splitlines() if ln.startswith("created")]
    assert re.fullmatch(r"created +\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(.* ago\)", created), created
    (manifest,) = [e for e in _ls(tmp_path, cache) if e["kind"] == "manifest"]
    shown = json.loads(cli(tmp_path, "cache", "show", manifest["id"][:8], "--cache", str(cache),
                           "--json").stdout)  # fmt: skip
    assert shown["kind"] == "manifest" and shown["variants"][0]["headers"] == ["v.h"]
    (program,) = [e for e in _ls(tmp_path, cache) if e["name"] == "h.cu" and e["kind"] == "program"]
    assert shown["variants"][0]["entry"] == program["id"]


def test_show_needs_one_matching_entry(tmp_path, cache):
    assert "no entry" in one_line_error(
        cli(tmp_path, "cache", "show", "ffffffffff", "--cache", str(cache)), "cuforge cache show"
    )
    assert "hex digits" in one_line_error(
        cli(tmp_path, "cache", "show", "xyz", "--cache", str(cache)), "cuforge cache show"
    )
    # a raw entry (stored by other code, no record) whose id shares two digits with one
    from cuforge.storage import FileStreamProgramCache, entry_id

    first = _ls(tmp_path, cache)[0]["id"]
    key = next(k for k in (b"raw%d" % i for i in range(100000)) if entry_id(k)[:2] == first[:2])
    with FileStreamProgramCache(cache) as handle:
        handle[key] = b"raw payload"
    ambiguous = cli(tmp_path, "cache", "show", first[:2], "--cache", str(cache))
    assert "matches 2 entries" in one_line_error(ambiguous, "cuforge cache show")
    raw = cli(tmp_path, "cache", "show", entry_id(key)[:12], "--cache", str(cache))
    assert raw.returncode == 0 and "kind            raw" in raw.stdout


def test_show_extract_of_a_damaged_entry_fails(tmp_path, cache):
    entry = _ls(tmp_path, cache)[0]
    payload = _payload(cache, entry["id"])
    data = payload.read_bytes()
    payload.write_bytes(data[:-1] + bytes([data[-1] ^ 0x01]))  # always a different byte
    result = cli(tmp_path, "cache", "show", entry["id"], "--cache", str(cache), "--extract",
                 str(tmp_path / "x"))  # fmt: skip
    assert result.returncode == 1
    assert "verifies        NO" in result.stderr and "damaged or gone" in result.stderr
    assert not (tmp_path / "x").exists()


# -- verify ------------------------------------------------------------------------------
def test_verify_finds_corruption_fix_removes_it_then_healthy(tmp_path, cache):
    healthy = cli(tmp_path, "cache", "verify", "--cache", str(cache))
    assert healthy.returncode == 0 and "checked 4 entries: all verify" in healthy.stdout
    entries = _ls(tmp_path, cache)
    flipped, truncated = (e for e in entries if e["kind"] == "program" and e["name"] == "saxpy.cu")
    data = bytearray(_payload(cache, flipped["id"]).read_bytes())
    data[len(data) // 2] ^= 0x40
    _payload(cache, flipped["id"]).write_bytes(bytes(data))
    path = _payload(cache, truncated["id"])
    path.write_bytes(path.read_bytes()[:100])

    found = cli(tmp_path, "cache", "verify", "--cache", str(cache))
    assert found.returncode == 1
    assert "checked 4 entries: 2 bad" in found.stdout
    assert "checksum mismatch" in found.stdout and "sidecar says" in found.stdout
    assert flipped["id"][:12] in found.stdout and truncated["id"][:12] in found.stdout
    assert _payload(cache, flipped["id"]).exists()  # without --fix nothing is removed

    fixed = cli(tmp_path, "cache", "verify", "--cache", str(cache), "--fix", "--json")
    assert fixed.returncode == 1  # bad entries were found (and removed), like fsck
    report = json.loads(fixed.stdout)
    assert report["removed"] == 2 and {b["id"] for b in report["bad"]} == {
        flipped["id"],
        truncated["id"],
    }
    assert not _payload(cache, flipped["id"]).exists()
    again = cli(tmp_path, "cache", "verify", "--cache", str(cache))
    assert again.returncode == 0 and "checked 2 entries: all verify" in again.stdout


def test_verify_sees_and_fixes_every_foreign_object(tmp_path, cache):
    """A FIFO or a directory in place of an entry file, and a file in place of a shard,
    were invisible ("checked 0 entries: all verify") and made their keys unstorable."""
    entries = _ls(tmp_path, cache)
    fifo_at, dir_at = entries[0]["id"], entries[1]["id"]
    fifo = Path(str(_payload(cache, fifo_at)) + ".cfsum")
    fifo.unlink()
    os.mkfifo(fifo)
    folder = _payload(cache, dir_at)
    folder.unlink()
    folder.mkdir()
    (folder / "inside").write_bytes(b"x")
    used = {e["id"][:2] for e in entries}
    free = next(f"{i:02x}" for i in range(256) if f"{i:02x}" not in used)
    (cache / "entries" / free).write_bytes(b"a file where a shard belongs")

    found = cli(tmp_path, "cache", "verify", "--cache", str(cache))  # never opens the FIFO
    assert found.returncode == 1, found.stdout + found.stderr
    assert "3 foreign objects" in found.stdout
    assert "a FIFO where" in found.stdout and "a directory where" in found.stdout
    assert f"entries/{free}: a file where" in found.stdout
    fixed = cli(tmp_path, "cache", "verify", "--cache", str(cache), "--fix", "--json")
    assert fixed.returncode == 1 and json.loads(fixed.stdout)["removed"] == 3
    assert not fifo.exists() and not folder.exists() and not (cache / "entries" / free).exists()
    again = cli(tmp_path, "cache", "verify", "--cache", str(cache))
    assert again.returncode == 0 and "checked 2 entries: all verify" in again.stdout


@pytest.mark.parametrize(
    "action",
    [["stats"], ["zero-stats"], ["ls"], ["show", "ab"], ["verify"], ["verify", "--fix"],
     ["prune", "--older-than", "1d"], ["clear", "--yes"]],
)  # fmt: skip
@pytest.mark.parametrize("kind", ["dir", "sqlite"])
def test_inspection_and_maintenance_never_create_a_cache(tmp_path, action, kind):
    """A mistyped path: `stats` exited 0 and created the whole tree, `clear --yes` said
    "cleared", and clear on a sqlite:// path created a database."""
    where = tmp_path / "typo" / ("cache" if kind == "dir" else "cache.db")
    url = str(where) if kind == "dir" else f"sqlite://{where}"
    result = cli(tmp_path, "cache", *action, "--cache", url)
    line = one_line_error(result, "cuforge cache " + action[0])
    assert f"there is no cache at {where}" in line
    assert not (tmp_path / "typo").exists()


def test_prune_and_clear_on_a_read_only_cache_say_what_they_could_not_do(tmp_path, cache):
    """Through a read-only mount, prune claimed "removed 4 entries" (exit 0) while
    every entry was still there; clear must not claim it either."""
    view = tmp_path / "ro"
    view.mkdir()
    bound = subprocess.run(["mount", "--bind", str(cache), str(view)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        pruned = cli(tmp_path, "cache", "prune", "--max-size", "1B", "--cache", str(view))
        cleared = cli(tmp_path, "cache", "clear", "--yes", "--cache", str(view))
        listed = len(_ls(tmp_path, view))
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)
    assert pruned.returncode == 1, pruned.stdout + pruned.stderr
    assert "removed 0 entries" in pruned.stdout and "4 entries" in pruned.stdout
    assert "could not remove 4 of 4 entries" in pruned.stderr
    assert cleared.returncode == 1 and "cleared" not in cleared.stdout
    assert "Read-only" in cleared.stderr or "could not remove 4 of 4" in cleared.stderr
    assert listed == 4


# -- prune -------------------------------------------------------------------------------
def _age(cache, entry_id, stored_days, used_days):
    now = time.time()
    os.utime(_payload(cache, entry_id), (now - used_days * DAY, now - stored_days * DAY))


def test_prune_by_age_use_compiler_and_size(tmp_path, cache):
    entries = {(e["name"], e["arch"], e["kind"]): e for e in _ls(tmp_path, cache)}
    old_but_used = entries[("saxpy.cu", "sm_80", "program")]["id"]
    old_and_unused = entries[("saxpy.cu", "sm_90", "program")]["id"]
    _age(cache, old_but_used, stored_days=10, used_days=0)
    _age(cache, old_and_unused, stored_days=10, used_days=10)

    dry = cli(tmp_path, "cache", "prune", "--cache", str(cache), "--unused-for", "5d", "--dry-run")
    assert dry.returncode == 0 and "would remove 1 entry" in dry.stdout
    assert _payload(cache, old_and_unused).exists()

    unused = cli(tmp_path, "cache", "prune", "--cache", str(cache), "--unused-for", "5d")
    assert "removed 1 entry" in unused.stdout and "3 entries" in unused.stdout
    assert not _payload(cache, old_and_unused).exists() and _payload(cache, old_but_used).exists()

    older = cli(tmp_path, "cache", "prune", "--cache", str(cache), "--older-than", "1w")
    assert "removed 1 entry" in older.stdout and not _payload(cache, old_but_used).exists()

    other = cli(tmp_path, "cache", "prune", "--cache", str(cache), "--compiler", "nvrtc:12.0")
    assert "removed 0 entries" in other.stdout
    build = _ls(tmp_path, cache)
    (program,) = [e for e in build if e["kind"] == "program"]
    short = program["compiler"].split("build-id:")[1][:8]
    by_build = cli(tmp_path, "cache", "prune", "--cache", str(cache), "--compiler", short)
    # the program goes, and the header manifest that named only it goes with it
    assert "removed 2 entries" in by_build.stdout and "0 entries" in by_build.stdout
    assert _ls(tmp_path, cache) == []


def test_prune_max_size_evicts_least_recently_used_first(tmp_path, cache):
    entries = {(e["name"], e["arch"], e["kind"]): e for e in _ls(tmp_path, cache)}
    for n, key in enumerate(sorted(entries)):  # distinct last-use times, oldest first
        _age(cache, entries[key]["id"], stored_days=1, used_days=4 - n)
    total = sum(e["size"] for e in entries.values())
    newest = entries[sorted(entries)[-1]]
    result = cli(tmp_path, "cache", "prune", "--cache", str(cache), "--max-size",
                 f"{newest['size'] + 1}B")  # fmt: skip
    assert result.returncode == 0, result.stderr
    left = _ls(tmp_path, cache)
    assert [e["id"] for e in left] == [newest["id"]]
    assert sum(e["size"] for e in left) < total


def test_prune_needs_a_rule_and_valid_values(tmp_path, cache):
    prog = "cuforge cache prune"
    assert "at least one" in one_line_error(
        cli(tmp_path, "cache", "prune", "--cache", str(cache)), prog
    )
    for option, value, message in (
        ("--older-than", "3 fortnights", "not a duration"),
        ("--unused-for", "1 fortnight", "not a duration"),
        ("--max-size", "10 parsecs", "not a size"),
        ("--max-size", "0", "size must be > 0"),
    ):
        result = cli(tmp_path, "cache", "prune", "--cache", str(cache), option, value)
        assert message in one_line_error(result, prog)
    assert len(_ls(tmp_path, cache)) == 4


# -- clear ---------------------------------------------------------------------------------
def test_clear_refuses_without_a_terminal_or_yes(tmp_path, cache):
    refused = cli(tmp_path, "cache", "clear", "--cache", str(cache))
    assert "without --yes" in one_line_error(refused, "cuforge cache clear")
    assert len(_ls(tmp_path, cache)) == 4
    done = cli(tmp_path, "cache", "clear", "--cache", str(cache), "--yes")
    assert done.returncode == 0 and "removed 4 entries" in done.stdout
    assert done.stdout.endswith(f" from {cache}\n"), done.stdout
    assert _ls(tmp_path, cache) == []


def _on_terminal(tmp_path, args, answer):
    """Run with stdin/stdout/stderr on a pseudo-terminal, type ``answer``."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [str(SCRIPT), *args], stdin=follower, stdout=follower, stderr=follower,
        env=isolated_env(tmp_path), close_fds=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    while b"[y/N]" not in seen and time.monotonic() < deadline:
        seen += os.read(leader, 4096)
    os.write(leader, answer.encode() + b"\n")
    code = proc.wait(timeout=60)
    try:
        while chunk := os.read(leader, 4096):
            seen += chunk
    except OSError:
        pass
    os.close(leader)
    return code, seen.decode(errors="replace")


def test_clear_asks_on_a_terminal(tmp_path, cache):
    code, text = _on_terminal(tmp_path, ["cache", "clear", "--cache", str(cache)], "n")
    assert code == 1 and "Remove all 4 entries" in text and "not cleared" in text
    assert len(_ls(tmp_path, cache)) == 4
    code, text = _on_terminal(tmp_path, ["cache", "clear", "--cache", str(cache)], "y")
    assert code == 0 and "removed 4 entries" in text
    assert _ls(tmp_path, cache) == []


# -- explain -------------------------------------------------------------------------------
def test_explain_names_the_changed_option_and_the_changed_header(tmp_path, cache, filled):
    work = tmp_path / "work"
    shutil.copytree(filled, work, ignore=shutil.ignore_patterns("cache", "out", "xdg", "state"))
    base = ("cache", "explain", "h.cu", "--arch", "sm_90", "--cache", str(cache))
    hit = cli(tmp_path, *base, cwd=work)
    assert hit.returncode == 0 and hit.stdout.startswith("hit: entry"), hit.stderr

    option = cli(tmp_path, *base, "--std", "c++17", cwd=work)
    assert option.returncode == 1
    assert "miss: option --std=c++17 added" in option.stdout

    (work / "v.h").write_text("#define V 2\n")
    header = cli(tmp_path, *base, cwd=work)
    assert header.returncode == 1 and f"header {work / 'v.h'} edited" in header.stdout
    saxpy = cli(tmp_path, "cache", "explain", str(SAXPY), "--arch", "sm_90", "-D", "X=1",
                "--cache", str(cache), "--json")  # fmt: skip
    answer = json.loads(saxpy.stdout)
    assert answer["hit"] is False and answer["reasons"] == ["option --define-macro=X=1 added"]
    # explain neither compiles nor counts lookups
    report = json.loads(cli(tmp_path, "cache", "stats", "--cache", str(cache), "--json").stdout)
    assert (report["hits"], report["misses"], report["entries"]) == (0, 3, 4)


def test_every_cache_action_rejects_bad_caches_with_one_line(tmp_path):
    (tmp_path / "plain-file").write_text("x")
    for action in ("stats", "zero-stats", "ls", "verify", "clear", "dir"):
        if action == "dir":
            assert cli(tmp_path, "cache", "dir").stdout.strip().endswith("program-cache")
            continue
        prog = f"cuforge cache {action}"
        for where, message in (
            ("/proc/nope", "there is no cache at /proc/nope"),  # and none is created
            (str(tmp_path / "plain-file"), "is not a directory"),
            ("redis+nothing://h", "unknown scheme"),
            ("file:///tmp/x?max_size=12 eggs", "not a size"),
            ("memory://?colour=blue", "unknown parameter 'colour'"),
        ):
            result = cli(tmp_path, "cache", action, "--cache", where)
            assert message in one_line_error(result, prog), (action, where)
    off = cli(tmp_path, "cache", "stats", env=isolated_env(tmp_path, CUFORGE_CACHE="off"))
    assert "caching is off" in one_line_error(off, "cuforge cache stats")
    assert "an action is required" in one_line_error(cli(tmp_path, "cache"), "cuforge cache")


# -- the same commands on Redis and SQLite caches (every command goes through the storage API)
def _every_command(tmp_path, url, damage):
    out = str(tmp_path / "out")
    build = ("compile", str(SAXPY), "--arch", "sm_80", "--arch", "sm_90", "--outdir", out,
             "--cache", url, "--json")  # fmt: skip
    assert [r["cache"] for r in json.loads(cli(tmp_path, *build).stdout)] == ["miss", "miss"]
    assert [r["cache"] for r in json.loads(cli(tmp_path, *build).stdout)] == ["hit", "hit"]
    stats = json.loads(cli(tmp_path, "cache", "stats", "--cache", url, "--json").stdout)
    assert stats["path"] == url
    assert (stats["entries"], stats["hits"], stats["misses"], stats["stores"]) == (2, 2, 2, 2)

    listed = _ls(tmp_path, url)
    assert sorted(e["arch"] for e in listed) == ["sm_80", "sm_90"]
    (sm90,) = [e for e in listed if e["arch"] == "sm_90"]
    extracted = tmp_path / "x.cubin"
    shown = cli(tmp_path, "cache", "show", sm90["id"][:10], "--cache", url, "--extract",
                str(extracted))  # fmt: skip
    assert shown.returncode == 0 and "verifies        yes" in shown.stderr
    assert extracted.read_bytes() == (tmp_path / "out" / "saxpy.sm_90.cubin").read_bytes()

    hit = cli(tmp_path, "cache", "explain", str(SAXPY), "--arch", "sm_90", "--cache", url)
    assert hit.returncode == 0 and hit.stdout.startswith("hit")
    miss = cli(tmp_path, "cache", "explain", str(SAXPY), "--arch", "sm_90", "-D", "Z=1",
               "--cache", url)  # fmt: skip
    assert miss.returncode == 1 and "option --define-macro=Z=1 added" in miss.stdout

    damage(sm90["id"])
    bad = cli(tmp_path, "cache", "verify", "--cache", url)
    assert bad.returncode == 1 and "1 bad" in bad.stdout and sm90["id"][:12] in bad.stdout
    assert cli(tmp_path, "cache", "verify", "--cache", url, "--fix").returncode == 1
    assert cli(tmp_path, "cache", "verify", "--cache", url).returncode == 0
    assert len(_ls(tmp_path, url)) == 1

    assert "removed 1 entry" in cli(tmp_path, "cache", "prune", "--cache", url,
                                      "--max-size", "1K").stdout  # fmt: skip
    assert _ls(tmp_path, url) == []
    cli(tmp_path, *build)
    assert cli(tmp_path, "cache", "clear", "--cache", url, "--yes").returncode == 0
    assert _ls(tmp_path, url) == []
    return stats["backend"]


def test_every_command_on_a_redis_cache(tmp_path, redis_server):
    raw = redis_server.client()

    def damage(entry_id):
        name = f"cli:{{{entry_id}}}".encode()
        value = bytearray(raw.get(name))
        value[-1] ^= 0x10
        raw.set(name, bytes(value))

    url = f"{redis_server.url}?prefix=cli:"
    assert _every_command(tmp_path, url, damage) == "RedisProgramCache"
    assert raw.hget(b"cli:stats", b"hits") == b"2"  # the fleet hash
    zero = cli(tmp_path, "cache", "zero-stats", "--cache", url)
    assert zero.returncode == 0 and "restart from zero" in zero.stdout, zero.stderr
    assert not raw.exists(b"cli:stats")
    report = json.loads(cli(tmp_path, "cache", "stats", "--cache", url, "--json").stdout)
    assert all(report[k] == 0 for k in ("hits", "misses", "stores", "bytes_written")), report


def _counts(tmp_path, url, **env):
    result = cli(tmp_path, "cache", "stats", "--cache", url, "--json", **env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    return report["hits"], report["misses"], report["stores"], report["signature_failures"]


def test_zero_stats_on_tiered_and_signed_caches(tmp_path, redis_server):
    local, redis = tmp_path / "local", f"{redis_server.url}?prefix=z:"
    tier = f"{local},{redis}"
    build = ("compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "x.cubin"),
             "--cache", tier, "--json")  # fmt: skip
    assert [json.loads(cli(tmp_path, *build).stdout)[0]["cache"] for _ in "12"] == ["miss", "hit"]
    assert _counts(tmp_path, tier) == (0, 1, 1, 0)  # the widest level's totals: Redis's
    assert _counts(tmp_path, str(local)) == (1, 1, 1, 0)
    zero = cli(tmp_path, "cache", "zero-stats", "--cache", tier)
    said = f"statistics of level 0 ({local}), level 1 ({redis_server.url}) restart from zero"
    assert zero.returncode == 0 and zero.stdout.strip() == said, (zero.stdout, zero.stderr)
    assert _counts(tmp_path, tier) == _counts(tmp_path, str(local)) == (0, 0, 0, 0)
    assert json.loads(cli(tmp_path, *build).stdout)[0]["cache"] == "hit"  # entries stay
    assert _counts(tmp_path, str(local)) == (1, 0, 0, 0)

    # a read-only level whose counters stats would show is not this command's to reset
    ro = f"{local},{redis}&ro"
    refused = cli(tmp_path, "cache", "zero-stats", "--cache", ro)
    assert f"{redis_server.url} is opened read-only (?ro)" in one_line_error(
        refused, "cuforge cache zero-stats"
    )
    assert _counts(tmp_path, str(local)) == (1, 0, 0, 0)  # nothing reset
    alone = cli(tmp_path, "cache", "zero-stats", "--cache", f"{redis}&ro")
    assert f"{redis_server.url} is opened read-only (?ro)" in one_line_error(
        alone, "cuforge cache zero-stats"
    )

    # signed (CUFORGE_CACHE_SECRET): the wrapper's counters are the inner cache's
    signed = isolated_env(tmp_path, CUFORGE_CACHE_SECRET="k" * 32)
    planted = cli(tmp_path, *build, env=signed)  # the entries were stored unsigned
    assert json.loads(planted.stdout)[0]["cache"] == "miss", planted.stderr
    # Each level refused the unsigned entry once for the one request: the request's
    # first lookup leaves its miss to the look-again under the lock (count_miss), and a
    # tier asks every level as it is asked, whichever level's lock it takes.
    assert _counts(tmp_path, redis, env=signed)[3] == 1
    assert _counts(tmp_path, str(local))[3] == 1
    assert cli(tmp_path, "cache", "zero-stats", "--cache", tier, env=signed).returncode == 0
    assert _counts(tmp_path, str(local), env=signed) == (0, 0, 0, 0)
    assert _counts(tmp_path, redis, env=signed) == (0, 0, 0, 0)


def test_every_command_on_a_sqlite_cache(tmp_path):
    import sqlite3

    db = tmp_path / "cache.db"

    def damage(entry_id):
        with sqlite3.connect(db) as conn:
            (data,) = conn.execute(
                "SELECT data FROM cuforge_entries WHERE digest = ?", (bytes.fromhex(entry_id),)
            ).fetchone()
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 0x01
            conn.execute(
                "UPDATE cuforge_entries SET data = ? WHERE digest = ?",
                (bytes(flipped), bytes.fromhex(entry_id)),
            )

    url = f"sqlite://{db}"
    assert _every_command(tmp_path, url, damage) == "SQLiteProgramCache"
    zero = cli(tmp_path, "cache", "zero-stats", "--cache", url)
    assert zero.returncode == 0 and "restart from zero" in zero.stdout, zero.stderr
    stats = json.loads(cli(tmp_path, "cache", "stats", "--cache", url, "--json").stdout)
    assert (stats["hits"], stats["misses"], stats["stores"], stats["evictions"]) == (0, 0, 0, 0)
    one = ("compile", str(SAXPY), "--arch", "sm_80", "-o", str(tmp_path / "x"), "--cache", url)
    assert "cache miss" in cli(tmp_path, *one).stdout  # the cache was cleared above
    assert "cache hit" in cli(tmp_path, *one).stdout
    stats = json.loads(cli(tmp_path, "cache", "stats", "--cache", url, "--json").stdout)
    assert (stats["hits"], stats["misses"], stats["stores"]) == (1, 1, 1)


def test_zero_stats_on_an_unreachable_server_is_one_line_exit_1(tmp_path):
    from _redis import free_port

    url = f"redis://127.0.0.1:{free_port()}/0?connect_timeout=100ms"
    result = cli(tmp_path, "cache", "zero-stats", "--cache", url)
    assert result.returncode == 1, (result.stdout, result.stderr)
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("cuforge cache zero-stats: error: Redis cache 127.0.0.1:"), line
    assert "could not reset statistics" in line


# -- stats --format openmetrics ---------------------------------------------------------
def _scrape(tmp_path, url):
    """``cache stats --format openmetrics`` parsed by Prometheus's own strict parser:
    {sample name: [(labels, value)]}, with the families' types and units."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    result = cli(tmp_path, "cache", "stats", "--cache", url, "--format", "openmetrics")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    samples: dict[str, list[tuple[dict, float]]] = {}
    kinds = {}
    for family in text_string_to_metric_families(text):  # raises on any format error
        kinds[family.name] = (family.type, family.unit)
        assert family.documentation
        for s in family.samples:
            samples.setdefault(s.name, []).append((s.labels, s.value))
    for fam, (kind, _) in kinds.items():
        assert kind in ("counter", "gauge"), fam
    return samples, kinds, result


def test_stats_openmetrics_parses_strictly_and_matches_json(tmp_path, cache):
    samples, kinds, _ = _scrape(tmp_path, str(cache))
    as_json = json.loads(cli(tmp_path, "cache", "stats", "--cache", str(cache), "--json").stdout)
    labels = {"cache": as_json["path"], "backend": "FileStreamProgramCache"}
    for field, name in (
        ("hits", "hits"),
        ("misses", "misses"),
        ("stores", "stores"),
        ("bytes_written", "written_bytes"),
        ("read_failures", "read_failures"),
    ):
        assert kinds[f"cuforge_cache_{name}"][0] == "counter"
        assert samples[f"cuforge_cache_{name}_total"] == [(labels, as_json[field])]
    assert kinds["cuforge_cache_written_bytes"] == ("counter", "bytes")
    assert samples["cuforge_cache_entries"] == [(labels, as_json["entries"])] == [(labels, 4)]
    assert samples["cuforge_cache_size_bytes"] == [(labels, as_json["size_bytes"])]
    per_kind = {s[0]["kind"]: s[1] for s in samples["cuforge_cache_kind_entries"]}
    assert per_kind == as_json["kinds"] and sum(per_kind.values()) == 4


def test_stats_openmetrics_on_redis_and_a_tier_hides_passwords_and_escapes(tmp_path, redis_server):
    redis_server.client().config_set("requirepass", "sekrit")
    url = redis_server.url.replace("redis://", "redis://:sekrit@") + "?prefix=om:"
    run(tmp_path, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(tmp_path / "s.cubin"),
        "--cache", url)  # fmt: skip
    samples, _, result = _scrape(tmp_path, url)
    assert "sekrit" not in result.stdout
    ((labels, stores),) = samples["cuforge_cache_stores_total"]
    assert labels["backend"] == "RedisProgramCache" and stores == 1  # the fleet's counters
    odd = tmp_path / 'a "quoted" \\ dir'  # label values need escaping
    odd.mkdir()  # stats opens caches that exist; it creates none
    tier = f"file://{odd},{url}"
    samples, _, result = _scrape(tmp_path, tier)
    ((labels, _),) = samples["cuforge_cache_hits_total"]
    assert labels["backend"] == "TieredProgramCache" and str(odd) in labels["cache"]
    assert "sekrit" not in result.stdout


def test_stats_json_and_format_must_agree(tmp_path, cache):
    result = cli(tmp_path, "cache", "stats", "--cache", str(cache), "--json", "--format", "text")
    assert result.returncode == 2 and "--json and --format text" in result.stderr
    assert "Traceback" not in result.stderr


def test_cache_dir_prints_the_cache_in_use_and_the_default_when_asked(tmp_path):
    """``cuforge cache dir`` printed the default directory even when the environment
    chose another cache."""
    default = str(tmp_path / "xdg" / "cuforge" / "program-cache")
    assert run(tmp_path, "cache", "dir").stdout == default + "\n"
    for name, value, shown in (
        ("CUFORGE_CACHE_DIR", "rel/d1", str(tmp_path / "rel" / "d1")),
        ("CUFORGE_CACHE", f"file://{tmp_path}/d2", str(tmp_path / "d2")),  # its directory
        ("CUFORGE_CACHE", "redis://:secret@127.0.0.1:1/0", "redis://:***@127.0.0.1:1/0"),
    ):
        env = isolated_env(tmp_path, **{name: value})
        result = run(tmp_path, "cache", "dir", env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (0, shown + "\n"), result.stderr
        again = run(tmp_path, "cache", "dir", "--default", env=env, cwd=tmp_path)
        assert again.stdout == default + "\n"
    given = run(tmp_path, "cache", "dir", "--cache", "sqlite:///x/k.db")
    assert given.stdout == "sqlite:///x/k.db\n"
    off = run(tmp_path, "cache", "dir", env=isolated_env(tmp_path, CUFORGE_CACHE="off"))
    # the answer, not an error (issue 36, newcomer item 16; tests/test_cli_newcomer.py)
    assert (off.returncode, off.stdout, off.stderr) == (
        0, "caching is off ($CUFORGE_CACHE=off)\n", ""
    )  # fmt: skip


def test_ls_filters_by_name_arch_and_kind(tmp_path, cache):
    def picked(*filters):
        return sorted((e["kind"], e["name"], e["arch"]) for e in _ls(tmp_path, cache, *filters))

    assert picked("--name", "saxpy.cu") == [("program", "saxpy.cu", "sm_80"),
                                            ("program", "saxpy.cu", "sm_90")]  # fmt: skip
    assert picked("--name", "h*") == [("manifest", "h.cu", "sm_90"), ("program", "h.cu", "sm_90")]
    assert picked("--arch", "sm_80") == [("program", "saxpy.cu", "sm_80")]
    assert picked("--kind", "manifest") == [("manifest", "h.cu", "sm_90")]
    assert picked("--kind", "program", "--arch", "sm_90", "--name", "h.cu") == [
        ("program", "h.cu", "sm_90")
    ]
    assert picked("--name", "nothing*") == []
    bad = cli(tmp_path, "cache", "ls", "--cache", str(cache), "--kind", "cubin")
    assert "invalid choice" in one_line_error(bad, "cuforge cache ls")


def test_ls_kind_knows_every_kind_cuforge_writes(tmp_path):
    """The integrations' entries (JAX's executables, warm sets, the directory mirror's
    files and indexes) are listed by ``--kind`` like the compile layer's: each kind a
    writer in src/cuforge uses is one ``cache ls --kind`` accepts."""
    import cuforge.integrations.cupy as cupy_adapter
    import cuforge.integrations.inductor as inductor_adapter
    import cuforge.integrations.jax as jax_adapter
    from cuforge.integrations import warmpacks, warmsets
    from cuforge.integrations._cache import ForeignEntries
    from cuforge.integrations.mirror import Mirror, Profile
    from cuforge.integrations.mirror.engine import FILE_KIND, INDEX_KIND
    from cuforge.storage.record import KINDS
    from cuforge.storage.urls import open_cache

    written = {jax_adapter._KIND, inductor_adapter._KIND, cupy_adapter._KIND, warmsets.KIND,
               warmpacks.KIND, FILE_KIND, INDEX_KIND, "triton", "program", "manifest"}  # fmt: skip
    assert written == set(KINDS)
    url = f"file://{tmp_path / 'c'}"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "k.o").write_bytes(b"object code")
    profile = Profile(name="plain", env=("PLAIN_DIR",), gpu_dependent=False)
    with open_cache(url) as cache:
        ForeignEntries(cache, jax_adapter._KIND).store("jit_f-0123", b"executable", {})
        warmsets.store(cache, "job", [b"k1"])
        assert Mirror(profile, cache, tmp_path / "d", version="p==1", settle_s=0).publish().stored
    for kind, count in (("jax", 1), ("warm-set", 1), ("mirror", 1), ("mirror-index", 1)):
        rows = _ls(tmp_path, url, "--kind", kind)
        assert [r["kind"] for r in rows] == [kind] * count, (kind, rows)
    assert _ls(tmp_path, url, "--kind", "program") == []
