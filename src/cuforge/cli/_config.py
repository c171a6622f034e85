"""Settings files for the command line: the user's and the project's.

Each setting comes from the first level that sets it, highest first:

1. a flag (``--cache``, ``--max-size``, ``--arch``);
2. the environment (``$CUFORGE_CACHE_DIR``, ``$CUFORGE_CACHE``, ``$CUFORGE_CACHE_SECRET``);
3. the project: the nearest ``cuforge.toml``, or ``pyproject.toml`` with a
   ``[tool.cuforge]`` table, in the working directory or a parent (the first
   directory holding either; ``cuforge.toml`` wins there);
4. the user: ``$XDG_CONFIG_HOME/cuforge/config.toml`` (``~/.config/cuforge/...``).

Keys (all optional)::

    cache = "~/.cache/cuforge-team"    # a cache URL or directory, or "off"
    max_size = "20G"                   # the cap of a directory cache
    secret_file = "cache-secret"       # the signing secret, read from this file
    arch = "sm_90"                     # default --arch (or "sm_80,sm_90")

Relative paths (``cache``, ``secret_file``) are relative to the file's directory.
An unknown key, a value of the wrong type or a file that is not TOML is a
UsageError naming the file and the key. Files are read with the standard
library's ``tomllib`` (``tomli`` on Python 3.10) only when one exists; finding them
costs a few ``stat`` calls, which is also what :func:`fingerprint` hashes so the
fast hit path (``_direct``) never answers with a record made under other settings.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.cli._args import UsageError

__all__ = ["KEYS", "Setting", "fingerprint", "setting", "settings"]

#: key -> what it holds (for messages and ``cuforge doctor``)
KEYS = {
    "cache": "a cache URL or directory, or 'off'",
    "max_size": "a size such as '20G'",
    "secret_file": "a file holding the signing secret",
    "arch": "an architecture such as 'sm_90' (or 'sm_80,sm_90')",
}
_PROJECT_NAMES = ("cuforge.toml", "pyproject.toml")
ENV_SECRET = "CUFORGE_CACHE_SECRET"  # storage's name for the signing secret


def _usage(message: str) -> UsageError:
    # imported here: _args imports argparse, which the fast hit path never loads
    from cuforge.cli._args import UsageError

    return UsageError(message)


class Setting:
    """A value and where it came from (``project config PATH`` / ``user config PATH``)."""

    __slots__ = ("origin", "path", "value")

    def __init__(self, value: str, origin: str, path: str) -> None:
        self.value, self.origin, self.path = value, origin, path


def user_file() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "cuforge", "config.toml")


def _project_file() -> str | None:
    """The nearest project settings file, or None."""
    try:
        folder = os.getcwd()
    except OSError:
        return None
    while True:
        for name in _PROJECT_NAMES:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and (name == "cuforge.toml" or _has_table(path)):
                return path
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _has_table(pyproject: str) -> bool:
    try:
        with open(pyproject, "rb") as f:
            return b"[tool.cuforge]" in f.read()
    except OSError:
        return False


def fingerprint() -> bytes:
    """What identifies the settings files now (paths, inode, size, mtime)."""
    parts = []
    for path in (_project_file(), user_file()):
        if path is None:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        parts.append(f"{path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    return "\0".join(parts).encode("utf-8", "surrogateescape")


_memo: dict[bytes, dict[str, Setting]] = {}
#: The secret_file setting :func:`apply_secret` put in the environment (doctor says so).
applied: list[Setting] = []


def settings() -> dict[str, Setting]:
    """Every key either file sets, the project's over the user's (read once per
    state of the files)."""
    key = fingerprint()
    found = _memo.get(key)
    if found is None:
        found = {}
        project = _project_file()
        for level, path in (("user", user_file()), ("project", project)):
            if path is not None and os.path.isfile(path):
                found.update(_read(path, f"{level} config {path}"))
        _memo.clear()
        _memo[key] = found
    return found


def setting(name: str) -> Setting | None:
    """The file-level value of ``name`` (flags and environment are the callers')."""
    return settings().get(name)


def _read(path: str, origin: str) -> dict[str, Setting]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = tomllib.load(f)
    except OSError as exc:
        raise _usage(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise _usage(f"{path} is not valid TOML: {exc}") from None
    if os.path.basename(path) == "pyproject.toml":
        data = data.get("tool", {}).get("cuforge", {})
        where = f"{path} [tool.cuforge]"
    else:
        where = path
    folder = os.path.dirname(os.path.abspath(path))
    out: dict[str, Setting] = {}
    for key, value in data.items():
        if key not in KEYS:
            raise _usage(f"{where}: unknown key {key!r} (known: {', '.join(KEYS)})")
        if key == "max_size" and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if key == "arch" and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if not isinstance(value, str) or not value.strip():
            raise _usage(f"{where}: {key} must be {KEYS[key]}, got {value!r}")
        value = value.strip()
        if key == "secret_file" or (key == "cache" and _is_relative_dir(value)):
            value = os.path.join(folder, os.path.expanduser(value))
        out[key] = Setting(value, origin, path)
    return out


def _is_relative_dir(value: str) -> bool:
    """A plain relative directory (not a URL, a list of levels, ``off`` or ``~/...``)."""
    plain = "://" not in value and "," not in value and "?" not in value
    return plain and value.lower() != "off" and not os.path.isabs(os.path.expanduser(value))


def read_secret(found: Setting) -> str:
    """The secret in ``secret_file`` (surrounding whitespace dropped); UsageError."""
    try:
        with open(found.value, encoding="utf-8") as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or exc
        raise _usage(f"secret_file {found.value} ({found.origin}): {why}") from None


def default_archs() -> list[str]:
    """The configured ``arch`` split at commas (empty: none configured)."""
    found = setting("arch")
    return [] if found is None else [a.strip() for a in found.value.split(",") if a.strip()]


def default_max_size() -> int | None:
    """The configured ``max_size`` in bytes, or None; UsageError for a bad size."""
    found = setting("max_size")
    if found is None:
        return None
    from cuforge.storage.units import parse_size

    try:
        return parse_size(found.value)
    except ValueError as exc:
        raise _usage(f"max_size in {found.origin}: {exc}") from None


def apply_secret() -> str | None:
    """Put the configured ``secret_file``'s secret in ``$CUFORGE_CACHE_SECRET`` when the
    environment sets none (the environment wins), for this command and the worker
    processes it starts; what :func:`restore_secret` takes to put things back ("":
    nothing was changed; None: the variable was unset)."""
    if os.environ.get(ENV_SECRET):
        return ""
    found = setting("secret_file")
    if found is None:
        return ""
    previous = os.environ.get(ENV_SECRET)
    os.environ[ENV_SECRET] = read_secret(found)
    applied.append(found)
    return previous


def restore_secret(previous: str | None) -> None:
    """Undo :func:`apply_secret` (``main()`` may be called as a function)."""
    if previous == "":
        return
    applied.clear()
    if previous is None:
        os.environ.pop(ENV_SECRET, None)
    else:
        os.environ[ENV_SECRET] = previous
