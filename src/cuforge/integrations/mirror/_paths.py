"""Where a JIT's directory is and which version it is, without importing the JIT: a
distribution's version from its ``dist-info`` name, ``~`` and ``$VARS`` expanded as
the JIT itself does, and the ``{tmpdir}``/``{user}`` fields of a profile's default
directory filled by Python's and torch's rules.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence

__all__ = ["bare_version", "dist_version", "expand_path", "fill", "placeholders", "unset_variables"]

_listings: dict[str, list[str]] = {}


def dist_version(dist: str, path: Sequence[str] | None = None) -> str | None:
    """The installed version of distribution ``dist``, from the name of its
    ``<name>-<version>.dist-info`` (or ``.egg-info``) directory on ``path`` (default
    ``sys.path``): the first one found, as the import system finds its package. One
    directory listing per path entry and process (``importlib.metadata`` costs ~10
    ms a name)."""
    want = re.sub(r"[-_.]+", "_", dist).lower()
    for entry in sys.path if path is None else path:
        names = _listings.get(entry)
        if names is None:
            try:
                names = [
                    n for n in os.listdir(entry or ".") if n.endswith((".dist-info", ".egg-info"))
                ]
            except OSError:
                names = []
            _listings[entry] = names
        for name in names:
            project, sep, version = name.rsplit(".", 1)[0].partition("-")
            if sep and re.sub(r"[-_.]+", "_", project).lower() == want:
                return version.split("-", 1)[0] or None
    return None


class _Fill(dict[str, str]):
    """``{version}``, and on use ``{tmpdir}`` (Python's temporary directory as
    ``tempfile`` finds it from ``env``) and ``{user}`` (the user name as
    ``getpass.getuser()`` finds it, with ``\\/:*?"<>|`` made ``_``: torch's rule)."""

    def __init__(self, env: Mapping[str, str], **given: str) -> None:
        super().__init__(given)
        self.env = env

    def __missing__(self, key: str) -> str:
        if key == "tmpdir":
            return _tmpdir(self.env)
        if key == "user":
            return re.sub(r'[\\/:*?"<>|]', "_", _user(self.env))
        raise KeyError(key)


def _tmpdir(env: Mapping[str, str]) -> str:
    for var in ("TMPDIR", "TEMP", "TMP"):
        value = env.get(var) or ""
        if value and os.path.isdir(value) and os.access(value, os.W_OK | os.X_OK):
            return value
    return "/tmp" if os.path.isdir("/tmp") else os.getcwd()


def _user(env: Mapping[str, str]) -> str:
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if env.get(var):
            return env[var]
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError, OSError, AttributeError):
        getuid = getattr(os, "getuid", None)
        return f"uid_{getuid()}" if callable(getuid) else "unknown_user"


def bare_version(version: str) -> str:
    """``1.19.0`` from ``warp-lang==1.19.0`` (the first distribution's version)."""
    return version.split("+", 1)[0].partition("==")[2] or version


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _value(name: str, env: Mapping[str, str]) -> str:
    value = env.get(name) or ""
    if not value and name == "XDG_CACHE_HOME":  # the XDG rule's default
        value = "~/.cache"
    return value


def unset_variables(path: str, env: Mapping[str, str]) -> list[str]:
    """The ``$VAR``/``${VAR}`` names in ``path`` that are unset (or empty) in ``env``,
    in order (``$XDG_CACHE_HOME`` never: it has a default)."""
    names = [m.group(1) or m.group(2) for m in _VAR.finditer(path)]
    return [n for n in dict.fromkeys(names) if not _value(n, env)]


def expand_path(path: str, env: Mapping[str, str]) -> str | None:
    """``~`` and ``$VAR``/``${VAR}`` expanded from ``env`` (``$XDG_CACHE_HOME``
    defaults to ``~/.cache`` as the XDG rule says), made absolute; None when a
    variable it names is unset or empty (:func:`unset_variables`): the directory is
    then unknown -- never the path with that part left out (``$NOPE/x`` is not
    ``/x``)."""
    if unset_variables(path, env):
        return None
    out = _VAR.sub(lambda m: _value(m.group(1) or m.group(2), env), path)
    if out.startswith("~"):
        home = env.get("HOME") or os.path.expanduser("~")
        out = home + out[1:]
    return os.path.abspath(out)


def placeholders(text: str) -> list[str]:
    """The ``{name}`` fields of ``text`` (``str.format`` syntax: ``{{`` is a brace);
    ValueError for text that is not a format string (an unmatched brace)."""
    import string

    return [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]


def fill(env: Mapping[str, str], **given: str) -> dict[str, str]:
    """The fields a profile's ``default`` is formatted with (``format_map``):
    ``given`` ones, and ``{tmpdir}``/``{user}`` from ``env`` on use."""
    return _Fill(env, **given)
