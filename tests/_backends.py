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

from cuforge.storage import FileStreamProgramCache, InMemoryProgramCache, SQLiteProgramCache

Factory = Callable[[Path, pytest.FixtureRequest], Any]

FACTORIES: dict[str, Factory] = {
    "memory": lambda tmp, request: InMemoryProgramCache(),
    "filestream": lambda tmp, request: FileStreamProgramCache(tmp / "fs"),
    "sqlite": lambda tmp, request: SQLiteProgramCache(tmp / "cache.db"),
}

#: Backends whose entries survive closing the handle (reopen tests use these).
PERSISTENT: dict[str, Factory] = {
    "filestream": FACTORIES["filestream"],
    "sqlite": FACTORIES["sqlite"],
}
