"""Settings files: the project's and the user's, read by every place that chooses a cache.

Two optional TOML files, the project's over the user's:

- the project's: the nearest ``cuforge.toml``, or ``pyproject.toml`` with a
  ``[tool.cuforge]`` table (or a ``[tool.cuforge.<...>]`` one), in the working
  directory or a parent (the first directory holding either; ``cuforge.toml`` wins
  there);
- the user's: ``$XDG_CONFIG_HOME/cuforge/config.toml`` (``~/.config/cuforge/...``).

Keys (all optional)::

    cache = "~/.cache/cuforge-team"    # a cache URL or directory, or "off"
    max_size = "20G"                   # the cap of a directory, SQLite or memory cache
    secret_file = "cache-secret"       # the signing secret, read from this file
    arch = "sm_90"                     # the command line's default --arch

    [mirror.myjit]                     # a directory-mirror profile (tables, below)
    env = ["MYJIT_CACHE_DIR"]

Tables (:data:`TABLES`: ``mirror``) are kept as the file writes them, each file's
apart (:func:`tables`): the layer that uses one parses and checks it
(``integrations.mirror.profiles.configured_profiles``), so a bad one fails only what
uses it. Relative paths (``cache``, ``secret_file``) are relative to the file's directory.
Where these rank against flags, variables and arguments is ``storage.config``'s
(docs/cache.md, "Which cache"). An unknown key, a value of the wrong type, an ``arch``
that does not look like one (``_archname``) or a file that is not TOML is a
:class:`SettingsFileError` naming the file (and the key), whichever key the reader
wanted; other values are checked where they are used (``cache``, ``max_size`` and
``secret_file`` by ``storage.config``, whether NVRTC takes an ``arch`` by the command
line). Files are read with ``tomllib`` (``tomli`` on Python 3.10) only
when one exists; finding them costs a few ``stat`` calls, which is also what
:func:`fingerprint` hashes. Imports only ``os`` and ``sys``: the command line's fast
hit path reads the fingerprint.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "KEYS",
    "TABLES",
    "Setting",
    "SettingsFileError",
    "fingerprint",
    "read_files",
    "setting",
    "settings",
    "tables",
    "user_file",
]

#: key -> what it holds (for messages and ``cuforge doctor``)
KEYS = {
    "cache": "a cache URL or directory, or 'off'",
    "max_size": "a size such as '20G'",
    "secret_file": "a file holding the signing secret",
    "arch": 'an architecture such as "sm_90", or a list such as ["sm_80", "sm_90"]',
}
#: keys holding tables, kept as written for the layer that reads them (:func:`tables`)
TABLES = {
    "mirror": "[mirror.<name>] tables, directory-mirror profiles (docs/integrations.md)",
}
_PROJECT_NAMES = ("cuforge.toml", "pyproject.toml")


class SettingsFileError(ValueError):
    """A settings file that cannot be used: ``str()`` names the file (and the key);
    ``origin`` is the file as a :class:`Setting`'s (``project config PATH``), so a
    message about the cache being chosen can say whose rule was choosing; ``key`` the
    key whose value is refused ("" for the file as a whole: not TOML, an unknown key)."""

    def __init__(self, message: str, origin: str, key: str = "") -> None:
        super().__init__(message)
        self.origin, self.key = origin, key


class Setting:
    """A value and where it came from: ``origin`` is ``project config PATH`` or
    ``user config PATH`` (``path`` the file)."""

    __slots__ = ("origin", "path", "value")

    def __init__(self, value: str, origin: str, path: str) -> None:
        self.value, self.origin, self.path = value, origin, path

    def __repr__(self) -> str:
        return f"Setting({self.value!r}, {self.origin!r})"


def user_file() -> str:
    """Where the user's settings file is (whether or not it exists):
    ``$XDG_CONFIG_HOME/cuforge/config.toml``, else ``~/.config/...``. A relative
    ``$XDG_CONFIG_HOME`` is ignored, as the XDG spec says (and as a relative
    ``$XDG_CACHE_HOME`` is for the user cache directory)."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "cuforge", "config.toml")


def project_file() -> str | None:
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
    """Whether ``pyproject`` has a ``[tool.cuforge]`` table or one under it
    (``[tool.cuforge.mirror.<name>]`` alone is one too). One that names
    ``tool.cuforge`` otherwise (``[tool.cuforge`` with a typo, ``tool.cuforge.arch =``)
    counts when it is not valid TOML (or sets the table by dotted keys), so reading
    it is the error naming the file -- not skipped silently for a parent's settings;
    it is parsed only then."""
    try:
        with open(pyproject, "rb") as f:
            data = f.read()
    except OSError:
        return False
    if b"[tool.cuforge]" in data or b"[tool.cuforge." in data:
        return True
    if b"tool.cuforge" not in data:
        return False
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        parsed = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return True
    tool = parsed.get("tool")
    return isinstance(tool, dict) and "cuforge" in tool  # a dotted key: tool.cuforge.x


def fingerprint() -> bytes:
    """What identifies the settings files now (paths, inode, size, mtime)."""
    parts = []
    for path in (project_file(), user_file()):
        if path is None:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        parts.append(f"{path}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}")
    return "\0".join(parts).encode("utf-8", "surrogateescape")


#: One file read: its path, its name in messages (``PATH`` or ``PATH [tool.cuforge]``),
#: its tables (unchecked) and the keys it sets, tables included, in its order.
_Read = tuple[str, str, dict[str, object], tuple[str, ...]]
#: Per state of the files: every key's Setting, and each file read (the user's first).
_memo: dict[bytes, tuple[dict[str, Setting], list[_Read]]] = {}


def _files() -> tuple[dict[str, Setting], list[_Read]]:
    key = fingerprint()
    found = _memo.get(key)
    if found is None:
        values: dict[str, Setting] = {}
        files: list[_Read] = []
        project = project_file()
        for level, path in (("user", user_file()), ("project", project)):
            if path is not None and os.path.isfile(path):
                origin = f"{level} config {path}"
                try:
                    read, where, held = _read(path, origin)
                except SettingsFileError:
                    raise
                except ValueError as exc:
                    raise SettingsFileError(str(exc), origin) from None
                values.update(read)
                files.append((path, where, held, (*read, *held)))
        found = (values, files)
        _memo.clear()
        _memo[key] = found
    return found


def read_files() -> list[tuple[str, str, tuple[str, ...]]]:
    """Every settings file read, in precedence order -- the project's, whose keys win,
    then the user's: ``(level, where, keys)``, ``level`` ``project`` or ``user``,
    ``where`` the file as messages name it, ``keys`` those it sets (tables included),
    in its order. A file that sets nothing is read too. ValueError naming a bad file."""
    files = _files()[1]
    project = project_file()
    return [
        ("project" if path == project else "user", where, keys)
        for path, where, _, keys in reversed(files)
    ]


def settings() -> dict[str, Setting]:
    """Every key either file sets, the project's over the user's (read once per
    state of the files: :func:`fingerprint`). ValueError naming a bad file."""
    return _files()[0]


def tables(name: str) -> list[tuple[str, str, object]]:
    """``(path, where, value)`` for each file that sets the table key ``name`` (of
    :data:`TABLES`), the user's first, then the project's: the value as the file
    writes it (unchecked), ``where`` the file as messages name it (``PATH``, or
    ``PATH [tool.cuforge]``). ValueError naming a bad file."""
    return [(path, where, held[name]) for path, where, held, _ in _files()[1] if name in held]


def setting(name: str) -> Setting | None:
    """The file-level value of ``name`` (flags, arguments and the environment are
    ``storage.config``'s and the command line's). ValueError naming a bad file."""
    return settings().get(name)


def _read(path: str, origin: str) -> tuple[dict[str, Setting], str, dict[str, object]]:
    """The file's settings, its name for messages, and its tables (unchecked)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = tomllib.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path} is not valid TOML: {exc}") from None
    if os.path.basename(path) == "pyproject.toml":
        data = data.get("tool", {}).get("cuforge", {})
        where = f"{path} [tool.cuforge]"
    else:
        where = path
    folder = os.path.dirname(os.path.abspath(path))
    out: dict[str, Setting] = {}
    held: dict[str, object] = {}
    for key, value in data.items():
        if key in TABLES:
            held[key] = value
            continue
        if key not in KEYS:
            known = ", ".join([*KEYS, *TABLES])
            raise ValueError(f"{where}: unknown key {key!r} (known: {known})")
        if key == "max_size" and isinstance(value, int) and not isinstance(value, bool):
            n = value  # a TOML number: the unit and the quotes a size needs, as TOML writes them
            raise ValueError(
                f'{where}: max_size = {n} has no unit: write max_size = "{n}B" for bytes, '
                f'or "{n}K", "{n}M", "{n}G" (a size is a string, in quotes)'
            )
        written = value
        if (
            key == "arch"
            and isinstance(value, list)
            and all(isinstance(v, str) and v.strip() and "," not in v for v in value)
        ):
            value = ",".join(value)
        if not isinstance(value, str) or not value.strip():
            said = f"{where}: {key} must be {KEYS[key]}, got {_as_written(written)}"
            raise SettingsFileError(said, origin, key)
        value = value.strip()
        if key == "arch":  # its form, as a compile checks it; what NVRTC takes: the CLI's
            from cuforge._archname import arch_ok

            for arch in (a.strip() for a in value.split(",")):
                if arch and not arch_ok(arch):
                    said = (
                        f"arch in {origin} must look like 'sm_90' (or 'compute_90', with an "
                        f"optional 'a'/'f' suffix), got {arch!r}"
                    )
                    raise SettingsFileError(said, origin, key)
        if key == "secret_file":
            value = os.path.normpath(os.path.join(folder, os.path.expanduser(value)))
        elif key == "cache" and value.lower() != "off":  # its directories: from this file's
            from .urls import absolute_paths

            value = absolute_paths(value, folder)
        out[key] = Setting(value, origin, path)
    return out, where, held


def _as_written(value: Any) -> str:
    """``value`` as TOML writes it (``[]``, ``"sm_90"``, ``["sm_80", ""]``, ``20``), so a
    message quotes what the file says, not Python's repr of it."""
    import json  # only for a message

    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # a TOML date or time
        return str(value)
