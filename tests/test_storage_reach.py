"""``storage.tiered.reach.reaches_server``: read from what a cache is, opening nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuforge.storage import InMemoryProgramCache
from cuforge.storage.tiered.reach import reaches_server
from cuforge.storage.urls import open_cache

SECRET = "reach-test-secret-0123456789abcdef"


@pytest.mark.parametrize("signed", [False, True])
def test_caches_on_this_host_do_not_and_a_server_level_does(
    redis_server, tmp_path: Path, signed: bool
) -> None:
    secret = SECRET if signed else None
    assert not reaches_server(open_cache(f"file://{tmp_path / 'fs'}", secret=secret))
    assert not reaches_server(open_cache(f"sqlite://{tmp_path / 'c.db'}", secret=secret))
    assert not reaches_server(
        open_cache(f"memory://,file://{tmp_path / 'a'},file://{tmp_path / 'b'}", secret=secret)
    )
    assert reaches_server(open_cache(redis_server.url, secret=secret))
    tier = open_cache(f"file://{tmp_path / 'host'},{redis_server.url}", secret=secret)
    assert reaches_server(tier)
    assert tier._levels[-1].opened is None  # answered without opening the server's level


def test_a_server_level_is_known_before_it_is_opened(tmp_path: Path) -> None:
    # Nothing listens on port 1: the answer cannot come from connecting.
    tier = open_cache(f"file://{tmp_path / 'host'},redis://127.0.0.1:1/0")
    assert reaches_server(tier) and tier._levels[-1].opened is None
    assert not reaches_server(InMemoryProgramCache())
    assert not reaches_server({})  # a user's mapping
