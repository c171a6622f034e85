"""Settings files for the command line: ``storage.settings`` read, in the command
line's words.

The files (the project's ``cuforge.toml`` or ``pyproject.toml [tool.cuforge]``, the
user's ``config.toml``) and their keys are ``storage.settings``'; which cache, its
cap and its secret are chosen by ``storage.config`` (through ``_select``), the same
function the Python API and the integrations use. This module adds what only the
command line reads -- ``arch``, the default ``--arch`` -- and turns a bad file into a
:class:`UsageError` naming it. The files' ``[mirror.<name>]`` tables are parsed by
``integrations.mirror.configured_profiles`` (``run``, ``doctor``). :func:`fingerprint`
identifies the files' state for the fast hit path (``_direct``), so it never answers
with a record made under other settings.
"""

from __future__ import annotations

from cuforge.storage.settings import KEYS, Setting, fingerprint, user_file

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cuforge.cli._args import UsageError

__all__ = [
    "KEYS",
    "Setting",
    "default_archs",
    "fingerprint",
    "mirror_tables",
    "read_files",
    "settings",
    "user_file",
]


def _usage(message: str, refused: ValueError | None = None) -> UsageError:
    """UsageError ``message``; ``key``: the key whose value ``refused`` (a
    ``SettingsFileError``) names, "" for a file refused as a whole (doctor)."""
    # imported here: _args imports argparse, which the fast hit path never loads
    from cuforge.cli._args import UsageError

    error = UsageError(message)
    error.key = getattr(refused, "key", "")  # type: ignore[attr-defined]
    return error


def settings() -> dict[str, Setting]:
    """Every key the files set, the project's over the user's; UsageError naming a
    bad file."""
    from cuforge.storage import settings as files

    try:
        return files.settings()
    except ValueError as exc:
        raise _usage(str(exc), exc) from None


def read_files() -> list[tuple[str, str, tuple[str, ...]]]:
    """``(level, where, keys)`` of every settings file read, the project's (whose keys
    win) first; UsageError naming a bad file."""
    from cuforge.storage import settings as files

    try:
        return files.read_files()
    except ValueError as exc:
        raise _usage(str(exc)) from None


def mirror_tables() -> list[tuple[str, str, object]]:
    """``(path, where, tables)`` of each file setting ``mirror`` (the user's, then the
    project's), unparsed; UsageError naming a bad file."""
    from cuforge.storage import settings as files

    try:
        return files.tables("mirror")
    except ValueError as exc:
        raise _usage(str(exc)) from None


def default_archs() -> list[Setting]:
    """The configured ``arch``, one Setting per architecture (empty: none configured).
    UsageError naming the file for one that does not look like an architecture -- the
    compile layer's own check (``ProgramOptions.arch``), so ``doctor`` and ``compile``
    refuse the same values."""
    found = settings().get("arch")
    if found is None:
        return []
    from cuforge.cli._programs import check_arch  # the compile layer: only when set

    archs = []
    for arch in (a.strip() for a in found.value.split(",")):
        if arch:
            check_arch(f"arch in {found.origin}", arch)
            archs.append(Setting(arch, found.origin, found.path))
    return archs
