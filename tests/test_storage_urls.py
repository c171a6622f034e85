"""Cache URLs and the size/duration parsers behind them."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache
from cuforge.storage.units import format_size, parse_duration, parse_size
from cuforge.storage.urls import open_cache, parse_cache_url


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1B", 1), ("500M", 500 << 20), ("2G", 2 << 30), ("64KiB", 64 << 10), ("1.5k", 1536),
     ("3 MB", 3 << 20), ("1t", 1 << 40), ("10b", 10)],
)  # fmt: skip
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected
    assert parse_size(text, bare=True) == expected


def test_a_number_without_a_unit_is_refused_except_in_urls() -> None:
    """``--max-size 2`` meant 2 bytes and ``--older-than 30`` 30 seconds: a unit is
    required, naming what to write; a cache URL (``bare``) keeps bytes and seconds."""
    with pytest.raises(ValueError, match=r"'2' has no unit: write 2B for bytes, or 2K"):
        parse_size("2")
    with pytest.raises(ValueError, match=r"'30' has no unit: write 30s, 30m, 30h or 30d"):
        parse_duration("30")
    assert parse_size("2", bare=True) == 2 and parse_duration("30", bare=True) == 30
    with open_cache("memory://?max_size=4096") as m:
        assert m.max_size_bytes == 4096


@pytest.mark.parametrize("bad", ["", "M", "0", "-1M", "12Q", "1iB", "2 G B", "1e3", "nan"])
def test_bad_sizes_name_the_text(bad: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("1w", 604800),
     ("0.5h", 1800), ("250ms", 0.25)],
)  # fmt: skip
def test_durations(text: str, expected: float) -> None:
    assert parse_duration(text) == expected
    assert parse_duration(text, bare=True) == expected


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
        ("s3://b?region=", "region= has no value"),
        ("s3://b?endpoint=", "endpoint= has no value"),
        ("rediss://h?ssl_ca_certs=", "ssl_ca_certs= has no value"),
        ("", "empty"),
    ],
)
def test_bad_urls_raise_valueerror_naming_the_bad_part(url: str, names: str) -> None:
    with pytest.raises(ValueError, match=names.replace("?", r"\?")):
        open_cache(url)


def test_url_must_be_a_string() -> None:
    with pytest.raises(TypeError, match="str"):
        open_cache(b"memory://")  # type: ignore[arg-type]


def test_milliseconds() -> None:
    assert parse_duration("500ms") == 0.5 and parse_duration("5m") == 300


def test_redis_urls_carry_their_options_without_connecting() -> None:
    from cuforge.storage.redis import RedisProgramCache

    url = "redis://:pw@127.0.0.1:1/3?prefix=team:&ttl=7d&timeout=250ms&connect_timeout=50ms"
    with open_cache(url, secret=None) as c:  # nothing listens on port 1: opening is lazy
        assert isinstance(c, RedisProgramCache)
        assert (c.prefix, c.ttl, c.cluster) == ("team:", 7 * 86400, False)
        assert (c._timeout, c._connect_timeout) == (0.25, 0.05)
        assert "pw" not in repr(c)
    for cluster_url in ("redis+cluster://h:7000", "redis://h:7000?cluster=1", "rediss+cluster://h"):
        with open_cache(cluster_url, secret=None) as c:
            assert c.cluster


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("redis://host:port", "port 'port' is not a number"),
        ("redis://", "needs a host"),
        ("redis://h/db1", "database 'db1'"),
        ("redis+cluster://h/2", "only database 0"),
        ("redis://h?cluster=1&prefix=a", None),
        ("redis://h?ssl_ca_certs=/ca.pem", "needs TLS: use rediss://"),
        ("redis://h?ttl=forever", "ttl"),
        ("redis://h?timeout=0s", "timeout"),
        ("redis://h?prefix=a{b}", "braces"),
        ("redis://h?prefix=", "prefix"),
        ("redis://h?db=2", "unknown parameter 'db'"),
    ],
)
def test_bad_redis_urls_name_the_bad_part(url: str, names: str | None) -> None:
    if names is None:
        open_cache(url, secret=None).close()
        return
    with pytest.raises(ValueError, match=names.replace("?", r"\?")) as info:
        open_cache(url, secret=None)
    assert url.split("?")[0] in str(info.value)


def test_every_scheme_in_the_table_names_an_opener() -> None:
    """SCHEMES names each backend's opener as "module:function"; a typo there would
    surface only when someone first opened that scheme."""
    import importlib

    from cuforge.storage.urls import SCHEMES

    assert {"file", "sqlite", "redis", "rediss"} <= set(SCHEMES)
    for scheme, (target, params) in SCHEMES.items():
        module, sep, function = target.partition(":")
        assert sep and module.startswith("cuforge.storage."), (scheme, target)
        assert callable(getattr(importlib.import_module(module), function)), (scheme, target)
        assert "ro" not in params, scheme  # every scheme accepts it; the table lists the rest


def test_parsing_a_url_imports_no_backend() -> None:
    """The URL module and the backends do not import each other: parsing (and its
    errors) reads the scheme table; only opening imports the backend."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from cuforge.storage.urls import parse_cache_url\n"
        "specs = parse_cache_url('memory://,sqlite:///tmp/x.db?ro,redis://h:1/0?ttl=1d,/tmp/d')\n"
        "assert [s.scheme for s in specs] == ['memory', 'sqlite', 'redis', 'file'], specs\n"
        "try:\n"
        "    parse_cache_url('redis://h/0?bogus=1')\n"
        "except ValueError as exc:\n"
        "    assert 'bogus' in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('bogus parameter accepted')\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('cuforge.storage.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.split()
    assert "cuforge.storage.urls" in loaded
    backends = {"filestream", "sqlite", "redis"}
    assert not [m for m in loaded if m.split(".")[2] in backends], loaded


@pytest.mark.parametrize("scheme", ["file", "sqlite"])
def test_a_path_url_with_a_host_is_refused_naming_the_three_slash_form(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite://cache/k.db`` (host "cache") created ./cache/k.db under the working
    directory; a host other than localhost is refused with the form that was meant."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as info:
        open_cache(f"{scheme}://cache/k.db", secret=None)
    message = str(info.value)
    assert "no host ('cache')" in message and f"{scheme}://{tmp_path}/cache/k.db" in message
    assert list(tmp_path.iterdir()) == []  # nothing created
    (level,) = parse_cache_url(f"{scheme}://localhost{tmp_path}/k.db?ro")
    assert level.location == f"{tmp_path}/k.db" and level.read_only
