"""Repeat hits served from a handle's memo of verified bytes: fast, never stale.

A memo hit is allowed only while the very file that was verified still stands at
the entry's path; every way another handle can change that (replace, delete,
clear, corrupt) must send the next read down the full, verifying path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cuforge.storage import FileStreamProgramCache


def _payload(cache: FileStreamProgramCache, key: bytes) -> Path:
    return Path(cache._loc(key).payload)


@pytest.fixture
def pair(tmp_path: Path):
    reader = FileStreamProgramCache(tmp_path)
    writer = FileStreamProgramCache(tmp_path)
    yield reader, writer
    reader.close()
    writer.close()


def test_repeat_hit_is_served_without_reading_the_files(pair, monkeypatch) -> None:
    reader, writer = pair
    writer[b"k"] = b"A" * 4096
    assert reader.get(b"k") == b"A" * 4096  # verified through the files
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **kw: opened.append(a[0]) or real_open(*a, **kw))
    assert reader.get(b"k") == b"A" * 4096
    assert opened == []  # one stat, no open
    assert reader.stats().hits == 2


def test_entry_replaced_by_another_handle_is_reread(pair) -> None:
    reader, writer = pair
    writer[b"k"] = b"old" * 100
    assert reader.get(b"k") == b"old" * 100
    writer[b"k"] = b"new" * 100  # a new file (new inode) at the same path
    assert reader.get(b"k") == b"new" * 100


def test_entry_deleted_or_cleared_by_another_handle_is_a_miss(pair) -> None:
    reader, writer = pair
    writer[b"a"] = b"1" * 64
    writer[b"b"] = b"2" * 64
    assert reader.get(b"a") and reader.get(b"b")
    del writer[b"a"]
    assert reader.get(b"a") is None
    writer.clear()
    assert reader.get(b"b") is None


@pytest.mark.parametrize("damage", ["truncate", "append", "empty"])
def test_entry_damaged_in_place_is_reverified_and_dropped(pair, damage) -> None:
    reader, writer = pair
    writer[b"k"] = b"X" * 1000
    assert reader.get(b"k") == b"X" * 1000
    path = _payload(reader, b"k")
    with open(path, "r+b") as f:
        if damage == "truncate":
            f.truncate(500)
        elif damage == "append":
            f.seek(0, os.SEEK_END)
            f.write(b"junk")
        else:
            f.truncate(0)
    assert reader.get(b"k") is None
    assert reader.stats().integrity_failures == 1
    assert not path.exists()


def test_full_check_reruns_once_the_bump_interval_passes(pair, monkeypatch) -> None:
    reader, writer = pair
    writer[b"k"] = b"Y" * 1000
    assert reader.get(b"k") == b"Y" * 1000
    path = _payload(reader, b"k")
    st = os.stat(path)
    # Flip a byte in place and restore the timestamps: the stat identity is unchanged,
    # so only the periodic full check can notice.
    with open(path, "r+b") as f:
        f.write(b"Z")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert reader.get(b"k") == b"Y" * 1000  # the verified bytes, still right for the key
    monkeypatch.setattr(reader._driver._memo, "interval_ns", 0)  # the bump (full check) is due
    assert reader.get(b"k") is None  # reverified: the flipped file is found and dropped
    assert reader.stats().integrity_failures == 1
