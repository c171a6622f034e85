"""The ownership gate (storage.ownership): tags, legacy roots, SQLite ids, delete_owned."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest

from cuforge.storage import ownership


def test_tag_root_writes_a_cachedir_tag_with_the_mark(tmp_path):
    ownership.tag_root(str(tmp_path))
    text = (tmp_path / "CACHEDIR.TAG").read_bytes()
    assert text.startswith(b"Signature: 8a477f597d28d172789f06886806bc55")
    assert ownership.TAG_MARK in text
    assert ownership.is_tagged(str(tmp_path))
    assert stat.S_IMODE(os.stat(tmp_path / "CACHEDIR.TAG").st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["CACHEDIR.TAG"]  # no temp left


def test_is_tagged_through_a_descriptor(tmp_path):
    ownership.tag_root(str(tmp_path))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert ownership.is_tagged("shown-in-messages-only", dir_fd=fd)
    finally:
        os.close(fd)


def test_another_programs_tag_is_not_ours_and_is_never_replaced(tmp_path):
    other = ownership.TAG_SIGNATURE + b"\n# made by some other tool\n"
    (tmp_path / "CACHEDIR.TAG").write_bytes(other)
    assert not ownership.is_tagged(str(tmp_path))
    ownership.tag_root(str(tmp_path))
    assert (tmp_path / "CACHEDIR.TAG").read_bytes() == other


@pytest.mark.parametrize(
    "content",
    [b"", b"# cuforge program cache\n", b"Signature: 8a477f597d28d172789f06886806bc55\n"],
)
def test_partial_tags_prove_nothing(tmp_path, content):
    (tmp_path / "CACHEDIR.TAG").write_bytes(content)
    assert not ownership.is_tagged(str(tmp_path))


def test_a_tag_that_is_a_link_or_a_fifo_proves_nothing(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    ownership.tag_root(str(real))
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(real / "CACHEDIR.TAG", linked / "CACHEDIR.TAG")
    assert not ownership.is_tagged(str(linked))
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "CACHEDIR.TAG")
    assert not ownership.is_tagged(str(fifo))  # and returns at once: no blocking open


def test_legacy_root_needs_the_ledger_magic(tmp_path):
    assert not ownership.legacy_root(str(tmp_path))
    (tmp_path / "size.ledger").write_bytes(b"not ours at all")
    assert not ownership.legacy_root(str(tmp_path))
    (tmp_path / "size.ledger").write_bytes(b"CFLEDG02" + bytes(16))
    assert ownership.legacy_root(str(tmp_path))


def test_sqlite_application_id(tmp_path):
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).execute("create table t (x)").connection.commit()
    assert ownership.sqlite_application_id(str(plain)) == 0
    marked = tmp_path / "marked.db"
    con = sqlite3.connect(marked)
    con.execute(f"pragma application_id = {ownership.SQLITE_APPLICATION_ID}")
    con.execute("create table t (x)")
    con.commit()
    con.close()
    assert ownership.sqlite_application_id(str(marked)) == ownership.SQLITE_APPLICATION_ID
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    assert ownership.sqlite_application_id(str(tmp_path / "data.csv")) is None
    assert ownership.sqlite_application_id(str(tmp_path / "missing")) is None


def test_delete_owned_removes_only_what_the_proof_accepts():
    removed: list[list[str]] = []

    def remove(names: list[str]) -> int:
        removed.append(names)
        return len(names)

    result = ownership.delete_owned(
        ["e/ab", "datasets/x.parquet", "e/cd"], lambda n: n.startswith("e/"), remove
    )
    assert removed == [["e/ab", "e/cd"]]
    assert (result.removed, result.refused) == (2, 1)


def test_delete_owned_calls_nothing_when_nothing_is_proven():
    def remove(names: list[str]) -> int:
        raise AssertionError("remove called with nothing proven")

    result = ownership.delete_owned(["a", "b"], lambda n: False, remove)
    assert (result.removed, result.refused) == (0, 2)


def test_threads_tagging_one_root_at_once_all_succeed(tmp_path):
    import threading

    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def tag() -> None:
        start.wait()
        try:
            ownership.tag_root(str(tmp_path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=tag) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert ownership.is_tagged(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["CACHEDIR.TAG"]


def test_a_crashed_taggers_leftover_temp_does_not_block_tagging(tmp_path):
    (tmp_path / f".CACHEDIR.TAG.{os.getpid()}.tmp").write_bytes(b"half")
    ownership.tag_root(str(tmp_path))
    assert ownership.is_tagged(str(tmp_path))
