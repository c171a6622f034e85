"""The cache backends that every storage contract test runs against.

Each factory takes ``(tmp_path, request)`` and returns an open, empty cache; a
backend that needs a server takes it from a fixture through ``request``. A new
backend joins every contract test by adding one line to ``FACTORIES``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cuforge.storage import (
    FileStreamProgramCache,
    InMemoryProgramCache,
    SignedProgramCache,
    SQLiteProgramCache,
    TieredProgramCache,
)

Factory = Callable[[Path, pytest.FixtureRequest], Any]

SECRET = b"contract-test-secret-0123456789"


def _redis(tmp: Path, request: pytest.FixtureRequest) -> Any:
    from cuforge.storage.redis import RedisProgramCache

    server = request.getfixturevalue("redis_server")
    return RedisProgramCache(server.url, prefix="t:")


def _tiered(tmp: Path, request: pytest.FixtureRequest) -> Any:
    """memory -> FileStream -> Redis, opened from a URL: the Redis level is lazy."""
    from cuforge.storage import open_cache

    server = request.getfixturevalue("redis_server")
    url = f"memory://,file://{tmp / 'tier-fs'},{server.url}?prefix=t:"
    tier = open_cache(url, secret=None)
    assert isinstance(tier, TieredProgramCache)
    return tier


def _s3(tmp: Path, request: pytest.FixtureRequest) -> Any:
    """A fresh prefix on the session's SeaweedFS server (tests/_s3.py)."""
    from cuforge.storage import open_cache

    return open_cache(request.getfixturevalue("s3_url"), secret=None)


def _example(tmp: Path, request: pytest.FixtureRequest) -> Any:
    """The in-tree example driver (``storage/example.py``): a backend that is a
    driver only, under the storage core."""
    from cuforge.storage.example import DirectoryCache

    return DirectoryCache(tmp / "example")


FACTORIES: dict[str, Factory] = {
    "memory": lambda tmp, request: InMemoryProgramCache(),
    "example": _example,
    "filestream": lambda tmp, request: FileStreamProgramCache(tmp / "fs"),
    "redis": _redis,
    "tiered": _tiered,
    "signed-filestream": lambda tmp, request: SignedProgramCache(
        FileStreamProgramCache(tmp / "signed-fs"), SECRET
    ),
    "sqlite": lambda tmp, request: SQLiteProgramCache(tmp / "cache.db"),
    "s3": _s3,
}

#: Backends whose entries survive closing the handle (reopen tests use these).
PERSISTENT: dict[str, Factory] = {
    "filestream": FACTORIES["filestream"],
    "redis": _redis,
    "sqlite": FACTORIES["sqlite"],
}

#: Composites of the backends above (not backends of their own).
COMPOSITE = ("tiered", "signed-filestream")

#: Single backends: the signing layer is tested on each (a new backend joins by itself).
PLAIN = tuple(name for name in FACTORIES if name not in COMPOSITE)
