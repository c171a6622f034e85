"""The SQLite cache's size cap keeps what it says it keeps: its floor (the empty
database, the WAL's allowance and its index), eviction that never takes the newest
entry when it fits alone, evictions counted where ``total_stats`` sees them, and a
command line that reports stored only what the cache still holds when it ends."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from _cli import EXAMPLES, one_line_error, run
from cuforge.storage.sqlite import SQLiteProgramCache
from cuforge.storage.sqlite._floor import EMPTY_PAGES, SMALLEST_CAP


def _pages(db: Path) -> tuple[int, int]:
    """(pages, free pages) of ``db``, read through a connection of its own."""
    conn = sqlite3.connect(db)
    try:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        return pages, conn.execute("PRAGMA freelist_count").fetchone()[0]
    finally:
        conn.close()


def _disk(db: Path) -> int:
    """Bytes of the database, its WAL and its WAL index."""
    files = [f"{db}{suffix}" for suffix in ("", "-wal", "-shm")]
    return sum(os.path.getsize(f) for f in files if os.path.exists(f))


# -- the floor ------------------------------------------------------------------------------


def test_an_empty_cache_database_takes_the_pages_the_floor_counts(tmp_path: Path) -> None:
    # _floor's EMPTY_PAGES is what the smallest cap and every entry's room are made
    # of: measured here, so a schema change that adds a page cannot leave it stale.
    db = tmp_path / "k.db"
    with SQLiteProgramCache(db) as c:
        c["k"] = b"v"
        del c["k"]
    pages, free = _pages(db)
    assert pages - free == EMPTY_PAGES == 5


@pytest.mark.parametrize("cap", [1, 4096, 64 * 1024, SMALLEST_CAP - 1])
def test_a_cap_below_the_floor_is_refused_at_open(tmp_path: Path, cap: int) -> None:
    """A cap under the floor was accepted: every entry was stored, reported stored,
    and evicted when the handle closed (64 KiB: "stored", then a miss every time)."""
    db = tmp_path / "k.db"
    with pytest.raises(ValueError) as refused:
        SQLiteProgramCache(db, max_size_bytes=cap)
    text = str(refused.value)
    assert text.startswith("max_size_bytes: ") and "smallest cap of a SQLite cache, 72 KiB" in text
    assert "\n" not in text
    assert not os.listdir(tmp_path)  # nothing created: no database, no lock file
    SQLiteProgramCache(db, max_size_bytes=SMALLEST_CAP).close()  # the floor itself opens


# -- eviction -------------------------------------------------------------------------------


def test_the_newest_entry_that_fits_alone_is_never_evicted(tmp_path: Path) -> None:
    """Five small entries and two of 130,000 bytes under a 200 KiB cap: the cache was
    left holding nothing -- close() evicted even the newest, which fits alone -- and
    the evictions were counted in the handle only. The newest stays now, and the
    evictions are in the persistent counters."""
    db = tmp_path / "k.db"
    cap = 200 * 1024
    c = SQLiteProgramCache(db, max_size_bytes=cap)
    for i in range(5):
        c[f"k{i}"] = os.urandom(4000)
    c["b1"] = os.urandom(130_000)
    newest = os.urandom(130_000)
    c["b2"] = newest
    c.close()
    evicted = c.stats().evictions
    assert evicted == 6, c.stats()  # everything older: b2 leaves no room beside it
    assert _disk(db) <= cap
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        assert len(c) == 1 and c.get("b2") == newest
        assert c.total_stats().evictions == evicted


def test_eviction_down_to_the_low_water_mark_spares_the_newest_entry(tmp_path: Path) -> None:
    """Over the cap (here: a handle with a smaller cap than the one that stored), close()
    evicts toward ~90 % of the entries' room, oldest first. An entry that fits the
    share alone but not that mark went too, once it was the last one: the cache
    was left empty, so eviction took more than the cap required."""
    db = tmp_path / "k.db"
    with SQLiteProgramCache(db) as c:
        for i in range(10):
            c[f"k{i}"] = os.urandom(4000)
        newest = os.urandom(130_000)  # alone: within the 200 KiB cap's share, over its mark
        c["newest"] = newest
    c = SQLiteProgramCache(db, max_size_bytes=200 * 1024)
    budget = c._driver._w.space.budget
    c.close()
    assert c.stats().evictions == 10
    pages, free = _pages(db)
    assert budget.room(32768, SQLiteProgramCache.EVICT_LOW_WATER) < (pages - free) * 4096
    assert (pages - free) * 4096 <= budget.share
    with SQLiteProgramCache(db, max_size_bytes=200 * 1024) as c:
        assert len(c) == 1 and c.get("newest") == newest


def test_a_value_that_fits_only_without_the_empty_database_is_refused(tmp_path: Path) -> None:
    """150,000 bytes under a 200 KiB cap: less than the database's share (152 KiB),
    more than the share leaves beside the empty database's own pages. It was stored,
    evicting everything else, and the cache stayed over its cap until close()
    evicted it too. It is refused now, as too large, and evicts nothing."""
    from cuforge.storage import events

    db = tmp_path / "k.db"
    cap = 200 * 1024
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        c["small"] = os.urandom(4000)
        outcome = c.set_entry("big", os.urandom(150_000))
        assert outcome.reason == events.TOO_LARGE, outcome
        assert c.get("small") is not None and c.get("big") is None
        assert (c.stats().write_failures, c.stats().evictions) == (1, 0)
    assert _disk(db) <= cap
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        assert len(c) == 1 and c.total_stats().evictions == 0


def test_close_evicts_oldest_first_only_what_the_cap_requires(tmp_path: Path) -> None:
    """A database filled under no cap, then opened with one and closed: close()
    evicts oldest first, keeping the newest entries, down to ~90 % of what the share
    leaves for entries and no further -- the mark was 90 % of the whole cap less the
    WAL's allowance, which under a small cap kept far less (here 4 of these rows,
    where the share holds 7). And its evictions reach ``total_stats()``: they
    came after the handle's last write-back of its counters, so they stayed in its
    own stats only."""
    db = tmp_path / "k.db"
    values = {f"k{i:02}": os.urandom(4000) for i in range(40)}  # a page each
    with SQLiteProgramCache(db) as c:
        for key, value in values.items():  # stored in this order: k00 is the oldest
            c[key] = value
    cap = 96 * 1024
    c = SQLiteProgramCache(db, max_size_bytes=cap)
    share = c._driver._w.space.budget.share  # the cap less the WAL's 16 KiB and index's 32
    c.close()
    evicted = c.stats().evictions
    assert 0 < evicted < 40
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        kept = [key for key in values if c.get(key) is not None]
        assert kept == list(values)[evicted:]  # the newest, in one piece
        assert c.total_stats().evictions == evicted
    assert _disk(db) <= cap
    pages, free = _pages(db)
    mark = EMPTY_PAGES * 4096 + 0.9 * (share - EMPTY_PAGES * 4096)
    assert (pages - free) * 4096 <= mark < (pages - free + 2) * 4096, (pages, free, mark)


def test_a_store_makes_room_for_itself_before_it_is_written(tmp_path: Path) -> None:
    """The cap was judged by the database file alone, while a store's pages sit in the
    WAL until it is folded in: the next store did not see them, and the pages in use
    reached 1.7x the database's share. Now a store evicts for the pages in use, the
    WAL's included, and its own, first."""
    db = tmp_path / "k.db"
    cap = 200 * 1024
    with SQLiteProgramCache(db, max_size_bytes=cap) as c:
        share = c._driver._w.space.budget.share
        for i in range(8):
            c[f"b{i}"] = os.urandom(60_000)
            conn = c._driver._conns.get()
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            assert (pages - free) * 4096 <= share, (i, pages, free)
            assert c.get(f"b{i}") is not None  # the store just made is there
        assert c.stats().evictions > 0


# -- the command line -----------------------------------------------------------------------


def _compile(tmp_path: Path, *args: str, env: dict[str, str] | None = None, cwd: Path = EXAMPLES):
    return run(tmp_path, "compile", *args, "--arch", "sm_90", cwd=cwd, env=env)


def test_the_command_line_refuses_a_cap_below_the_floor_naming_where_it_came_from(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c" / "k.db"
    out = str(tmp_path / "a.cubin")
    url = f"sqlite://{db}?max_size=64K"
    compiled = _compile(tmp_path, "saxpy.cu", "-o", out, "--cache", url)
    line = one_line_error(compiled, "cuforge compile")
    assert f"cache URL '{url}': max_size=64K: 64 KiB is below the smallest cap" in line, line

    plain = f"sqlite://{db}"
    line = one_line_error(
        _compile(tmp_path, "saxpy.cu", "-o", out, "--cache", plain, "--max-size", "64K"),
        "cuforge compile",
    )
    assert line.startswith("cuforge compile: error: --max-size: 64 KiB is below"), line

    project = tmp_path / "project"
    project.mkdir()
    (project / "saxpy.cu").write_text((EXAMPLES / "saxpy.cu").read_text())
    (project / "cuforge.toml").write_text('max_size = "64K"\n')
    line = one_line_error(
        _compile(tmp_path, "saxpy.cu", "-o", out, "--cache", plain, cwd=project), "cuforge compile"
    )
    assert f"max_size in project config {project / 'cuforge.toml'}: 64 KiB is below" in line, line
    assert "smallest cap of a SQLite cache, 72 KiB" in line
    # cache stats refuses it the same way; nothing was created by any of them
    stats = run(tmp_path, "cache", "stats", "--cache", url)
    assert "max_size=64K: 64 KiB is below" in one_line_error(stats, "cuforge cache stats")
    assert not db.parent.exists()


def test_compile_reports_stored_only_what_the_cache_still_holds(tmp_path: Path) -> None:
    """Outputs stored under a small cap evict each other (and under the old floor the
    handle evicted its one entry at close): "stored in" was said all the same. What
    the command reports stored is a hit the next time; what it evicted again is
    reported not stored, why ``evicted``; a cubin that cannot fit is too large."""
    sources = ["saxpy.cu", "kernels/vector_add.cu", "kernels/scale.cu", "kernels/relu.cu",
               "kernels/transpose.cu"]  # fmt: skip
    for cap in ("72K", "80K", "128K"):
        db = tmp_path / f"k{cap}.db"
        url = f"sqlite://{db}?max_size={cap}"
        outdir = str(tmp_path / f"out{cap}")
        first = _compile(tmp_path, *sources, "--outdir", outdir, "--cache", url, "--json")
        assert first.returncode == 0, first.stderr
        reports = json.loads(first.stdout)
        assert [r["cache"] for r in reports] == ["miss"] * len(sources), reports
        for r in reports:
            if r["stored"]:
                assert r["stored_in"] == [f"sqlite://{db}"], r
            else:
                assert r["not_stored"] in ("evicted", "too-large"), r
        why = {r["not_stored"] for r in reports if not r["stored"]}
        if cap == "72K":  # one page for entries: most of these cubins do not fit
            assert "too-large" in why, reports
            too_large = next(
                s for s, r in zip(sources, reports, strict=True)
                if r.get("not_stored") == "too-large"
            )  # fmt: skip
        if cap == "80K":  # room for two or three: later stores evicted the first ones
            assert why == {"evicted"} and any(r["stored"] for r in reports), reports
        # Only those said stored, so that no store of this run evicts one of them.
        kept = [s for s, r in zip(sources, reports, strict=True) if r["stored"]]
        if kept:
            again = _compile(tmp_path, *kept, "--outdir", outdir, "--cache", url, "--json")
            assert again.returncode == 0, again.stderr
            assert [r["cache"] for r in json.loads(again.stdout)] == ["hit"] * len(kept), cap
    # one that did not fit (which ones depends on the compiler's cubin sizes), alone
    text = _compile(tmp_path, too_large, "-o", str(tmp_path / "s.cubin"), "--cache",
                    f"sqlite://{tmp_path / 'k72K.db'}?max_size=72K")  # fmt: skip
    assert "cache miss (compiled; not stored: larger than the cache's size cap)" in text.stdout


def test_warm_in_one_process_reports_what_its_own_stores_evicted(tmp_path: Path) -> None:
    """``warm --jobs 1`` (one handle, in this process) under a cap the manifest does
    not fit: it reported every compile stored while its later stores evicted the
    earlier ones -- and the next run compiled them all again."""
    db = tmp_path / "k.db"
    url = f"sqlite://{db}?max_size=200K"
    manifest = str(EXAMPLES / "warm.toml")
    first = run(tmp_path, "warm", manifest, "--cache", url, "--jobs", "1")
    assert first.returncode == 0, first.stderr
    evicted = [ln for ln in first.stdout.splitlines() if "not stored: evicted again" in ln]
    assert len(evicted) == 1 and evicted[0].endswith(
        "compiled but not stored: evicted again before the command ended, to keep the cache "
        "within its size cap"
    ), first.stdout
    unstored = int(evicted[0].split()[0])
    done = json.loads(run(tmp_path, "cache", "stats", "--cache", url, "--json").stdout)
    assert done["entries"] == 18 - unstored > 0, (done, unstored)
    assert done["evictions"] == unstored  # counted where cache stats reads them
