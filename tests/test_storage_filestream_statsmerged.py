"""A directory cache's counters when a handle cannot make its own record (a full disk,
a ``tmp/`` that cannot be written): added into ``stats/merged`` in place, each count
once, with what other handles fold there; and said lost only when that fails too."""

from __future__ import annotations

import os
from pathlib import Path

from cuforge.storage.filestream._statsfile import StatsStore, read_totals
from cuforge.storage.stats import CacheStats


def _dirs(tmp_path: Path) -> tuple[str, str]:
    stats = tmp_path / "stats"
    stats.mkdir()
    return str(stats), str(tmp_path / "no-tmp")  # staging there fails: ENOENT


def test_counts_go_into_merged_in_place_once_each(tmp_path: Path) -> None:
    stats_dir, tmp = _dirs(tmp_path)
    (Path(stats_dir) / "merged").write_bytes(CacheStats(hits=5, stores=1).to_record())
    inode = os.stat(Path(stats_dir) / "merged").st_ino
    store = StatsStore(stats_dir, tmp, None, None, owned=True)
    store.flush(CacheStats(misses=2, write_failures=1))
    assert read_totals(stats_dir) == CacheStats(hits=5, stores=1, misses=2, write_failures=1)
    store.flush(CacheStats(misses=2, write_failures=1))  # nothing new: nothing added
    store.flush(CacheStats(misses=4, write_failures=3))
    assert store.lost is None
    # Another handle closed meanwhile: its record folded into merged by compaction.
    (tmp_path / "tmp").mkdir()
    other = StatsStore(stats_dir, str(tmp_path / "tmp"), None, None, owned=True)
    other.flush(CacheStats(hits=7))
    other.close()
    store.flush(CacheStats(misses=5, write_failures=3))
    store.close()
    assert read_totals(stats_dir) == CacheStats(hits=12, stores=1, misses=5, write_failures=3)
    assert os.stat(Path(stats_dir) / "merged").st_ino == inode  # rewritten in place
    assert sorted(os.listdir(stats_dir)) == ["merge.lock", "merged"]


def test_a_merged_file_that_is_no_record_is_never_overwritten(tmp_path: Path) -> None:
    stats_dir, tmp = _dirs(tmp_path)
    (Path(stats_dir) / "merged").write_bytes(b"not a record")
    store = StatsStore(stats_dir, tmp, None, None, owned=True)
    store.flush(CacheStats(misses=1))
    assert store.lost == "stats/merged is not a counter record"
    assert (Path(stats_dir) / "merged").read_bytes() == b"not a record"
    store.flush(CacheStats(misses=2))  # given up: still nothing written
    assert (Path(stats_dir) / "merged").read_bytes() == b"not a record"
