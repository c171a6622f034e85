"""Cache URLs and the size/duration parsers behind them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache
from cuforge.storage.units import format_size, parse_duration, parse_size
from cuforge.storage.urls import open_cache, parse_cache_url


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", 1), ("500M", 500 << 20), ("2G", 2 << 30), ("64KiB", 64 << 10), ("1.5k", 1536),
     ("3 MB", 3 << 20), ("1t", 1 << 40), ("10b", 10)],
)  # fmt: skip
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "M", "0", "-1M", "12Q", "1iB", "2 G B", "1e3", "nan"])
def test_bad_sizes_name_the_text(bad: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("1w", 604800),
     ("0.5h", 1800)],
)  # fmt: skip
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("bad", ["", "h", "0s", "-5m", "5y", "5 minutes"])
def test_bad_durations_name_the_text(bad: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_format_size() -> None:
    assert [format_size(n) for n in (0, 1023, 1536, 3 << 30)] == [
        "0 B", "1023 B", "1.5 KiB", "3.0 GiB",
    ]  # fmt: skip


def test_memory_and_file_urls_open_the_right_backend(tmp_path: Path) -> None:
    with open_cache("memory://?max_size=64M") as m:
        assert isinstance(m, InMemoryProgramCache) and m.max_size_bytes == 64 << 20
    with open_cache(f"file://{tmp_path / 'a'}?max_size=2G") as f:
        assert isinstance(f, FileStreamProgramCache) and f.max_size_bytes == 2 << 30
        assert f.path == str(tmp_path / "a")
    with open_cache(str(tmp_path / "plain")) as p:  # a plain path is a directory cache
        assert isinstance(p, FileStreamProgramCache) and p.path == str(tmp_path / "plain")


def test_levels_flags_and_percent_decoding() -> None:
    levels = parse_cache_url("memory://,file:///tmp/a%2Cb?ro&max_size=1G")
    assert [s.scheme for s in levels] == ["memory", "file"]
    assert levels[1].location == "/tmp/a,b" and levels[1].read_only
    assert levels[1].size("max_size") == 1 << 30 and not levels[0].read_only


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("xyz://a", "unknown scheme 'xyz'"),
        ("memory://?foo=1", "unknown parameter 'foo'"),
        ("memory://somewhere", "takes no location"),
        ("file://", "needs a directory"),
        ("file:///x?max_size=12Q", "max_size"),
        ("file:///x?mode=rwx", "mode"),
        ("memory://?ro=maybe", "ro='maybe'"),
        ("memory://?max_size=1M&max_size=2M", "given twice"),
        ("memory://,,memory://", "empty level"),
        ("", "empty"),
    ],
)
def test_bad_urls_raise_valueerror_naming_the_bad_part(url: str, names: str) -> None:
    with pytest.raises(ValueError, match=names.replace("?", r"\?")):
        open_cache(url)


def test_url_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="str"):
        open_cache(b"memory://")  # type: ignore[arg-type]
