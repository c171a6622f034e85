"""A miss says where it was stored (issue 36, item 5), through the real ``cuforge``.

``CUFORGE_CACHE=memory://`` printed "compiled and stored" for an entry that died with
the command; a ``memory://,file://…,redis://…`` tier with Redis down said the same
when only the file level held the entry. Now the line names the levels that took
it and those that dropped it, ``--json`` carries what each level did, and ``warm``
says the same in its summary. A real redis-server, stopped for the down case.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from _cli import SAXPY, isolated_env, run
from reliability._figures import record

MEMORY_ONLY = "compiled; stored in memory only: gone when this command exits"


def _compile(home: Path, *args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return run(home, "compile", str(SAXPY), "--arch", "sm_90", "-o", str(home / "k.cubin"),
               *args, env=env)  # fmt: skip


def test_a_memory_only_cache_says_the_entry_is_gone_when_the_command_exits(tmp_path: Path) -> None:
    env = isolated_env(tmp_path, CUFORGE_CACHE="memory://")
    first = _compile(tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.rstrip().endswith(f"cache miss ({MEMORY_ONLY})"), first.stdout
    assert "compiled and stored" not in first.stdout
    again = _compile(tmp_path, "--json", env=env)
    (report,) = json.loads(again.stdout)
    assert report["cache"] == "miss"  # it really was gone
    assert report["stored"] is True and report["outlives_process"] is False
    assert report["stored_in"] == ["memory://"]
    assert report["levels"] == [
        {"level": "memory://", "stored": True, "reason": "stored", "detail": "",
         "outlives_process": False},
    ]  # fmt: skip
    record(
        "use", "cli", "compile with CUFORGE_CACHE=memory:// (text and --json), twice", 2,
        "each: 'compiled; stored in memory only: gone when this command exits', --json "
        "outlives_process false, and the second run missed again (before: 'compiled and "
        "stored' for an entry that died with the process)", scale="all",
    )  # fmt: skip


def test_a_tier_names_the_levels_that_stored_and_the_redis_that_was_down(
    redis_server, tmp_path: Path
) -> None:
    files = tmp_path / "c"
    redis = f"redis://127.0.0.1:{redis_server.port}/0"
    url = f"memory://,file://{files},{redis}?timeout=200ms"
    up = _compile(tmp_path, "--cache", url)
    assert up.returncode == 0, up.stderr
    both = f"cache miss (compiled and stored in file://{files}, {redis})"
    assert up.stdout.rstrip().endswith(both), up.stdout
    assert len(redis_server.client().keys("cuforge:{*}")) == 1  # stored there indeed

    redis_server.stop()  # down: the next miss is stored in the file level only
    shutil.rmtree(files)
    down = _compile(tmp_path, "--cache", url)
    assert down.returncode == 0, down.stderr
    words = f"compiled and stored in file://{files} ({redis} unreachable: not stored there)"
    assert down.stdout.rstrip().endswith(f"cache miss ({words})"), down.stdout
    shutil.rmtree(files)
    as_json = _compile(tmp_path, "--cache", url, "--json")
    (report,) = json.loads(as_json.stdout)
    assert report["stored"] is True and report["outlives_process"] is True
    assert report["stored_in"] == ["memory://", f"file://{files}"]
    levels = [(lv["level"], lv["stored"], lv["reason"]) for lv in report["levels"]]
    assert levels == [
        ("memory://", True, "stored"), (f"file://{files}", True, "stored"),
        (redis, False, "unreachable"),
    ]  # fmt: skip
    assert str(redis_server.port) in report["levels"][2]["detail"]
    hit = _compile(tmp_path, "--cache", f"file://{files}")  # the file level holds it
    assert hit.returncode == 0 and hit.stdout.rstrip().endswith("cache hit"), hit.stdout
    record(
        "use", "cli", "compile through memory://,file://DIR,redis://... with the redis-server "
        "up, then stopped (text and --json)", 3,
        "up: 'compiled and stored in file://DIR, redis://...' and the key in Redis; down: "
        "'compiled and stored in file://DIR (redis://... unreachable: not stored there)', "
        "--json levels stored/stored/unreachable, and the file level hits (before: "
        "'compiled and stored' both times)", scale="all",
    )  # fmt: skip


def test_a_password_in_a_level_is_not_shown(redis_server, tmp_path: Path) -> None:
    redis_server.stop()
    url = f"file://{tmp_path / 'c'},redis://u:hunter2@127.0.0.1:{redis_server.port}/0?timeout=200ms"
    done = _compile(tmp_path, "--cache", url, "--json")
    assert "hunter2" not in done.stdout
    (report,) = json.loads(done.stdout)
    assert report["levels"][1]["level"] == f"redis://u:***@127.0.0.1:{redis_server.port}/0"


def test_warm_says_what_only_memory_holds_and_where_a_level_dropped_it(
    redis_server, tmp_path: Path
) -> None:
    shutil.copy(SAXPY, tmp_path / "saxpy.cu")
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { *p = 1; }\n')
    manifest = tmp_path / "m.toml"
    manifest.write_text('[defaults]\narch = "sm_90"\n[[kernel]]\nsources = ["saxpy.cu", "k.cu"]\n')
    memory = run(tmp_path, "warm", str(manifest), "--cache", "memory://", "--jobs", "1")
    assert memory.returncode == 0, memory.stderr
    assert f"2 {MEMORY_ONLY.replace('compiled;', 'compiled and')}" in memory.stdout
    redis_server.stop()
    redis = f"redis://127.0.0.1:{redis_server.port}/0"
    tier = run(tmp_path, "warm", str(manifest), "--cache",
               f"{tmp_path / 'c'},{redis}?timeout=200ms", "--jobs", "1", "--json")  # fmt: skip
    assert tier.returncode == 0, tier.stderr
    report = json.loads(tier.stdout)
    assert [r["stored_in"] for r in report["results"]] == [[str(tmp_path / "c")]] * 2
    text = run(tmp_path, "warm", str(manifest), "--cache",
               f"{tmp_path / 'd'},{redis}?timeout=200ms", "--jobs", "1")  # fmt: skip
    assert f"2 not stored in {redis}: unreachable" in text.stdout, text.stdout
    assert MEMORY_ONLY not in text.stdout
