"""What ``cuforge doctor`` shows of the settings: each setting's value and the level
that set it (docs/cache.md, "Which cache"), checked by the functions the commands run
(``_config.default_archs``, ``_programs.check_arch_for``, ``mirror.configured_profiles``),
so a setting a command would refuse is listed with the line it would exit 2 with; and
every settings file read, in precedence order. Reads only.
"""

from __future__ import annotations

import os

from cuforge.cli import _select

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["NOT_SET", "settings"]

NOT_SET = {"value": "-", "from": "not set"}


def settings(report: dict[str, Any], choice: _select.Choice | None) -> dict[str, dict[str, str]]:
    """Each setting's value and the level that set it (docs/cache.md, "Which cache");
    ``arch`` checked as ``compile`` checks it."""
    from cuforge.cli import _config, _programs
    from cuforge.cli._args import UsageError

    try:
        files = _config.settings()
    except UsageError as exc:
        refused = {"error": {"value": str(exc), "from": "settings file"}}
        if getattr(exc, "key", "") == "arch":  # the devices line says so (one problem)
            refused["arch_error"] = {"value": str(exc), "from": "-"}
        return refused
    shown = {"cache": {"value": str(report["cache"]), "from": str(report["origin"])}}
    shown["max_size"] = _max_size(files.get("max_size"), choice, report.get("max_size_bytes"))
    shown.update(_secret(files))
    try:
        archs = _config.default_archs()
        for found in archs:  # as compile and explain check it: a CUDA C++ source's cubin
            said = f"arch {found.value!r} in {found.origin}"
            _programs.check_arch_for(found.value, "cubin", said)
    except UsageError as exc:
        shown["arch"] = {"value": files["arch"].value, "from": files["arch"].origin}
        shown["arch_error"] = {"value": str(exc), "from": "-"}
    else:
        value = ",".join(a.value for a in archs)
        shown["arch"] = {"value": value, "from": archs[0].origin} if archs else NOT_SET
    shown.update(_mirror_profiles())
    try:  # the environment's switches, as compile and run check them
        _programs.check_warm_setting()
    except UsageError as exc:
        shown["warm_error"] = {"value": str(exc), "from": "-"}
    shown["files"] = {"value": _files_read(), "from": "-"}
    return shown


def _files_read() -> str:
    """Every settings file read, in precedence order (the project's, then the user's),
    each with the keys it sets: those a file read before it sets too are named as
    overridden (``/p/cuforge.toml (project: cache), /u/config.toml (user: arch; cache
    overridden by the project's)``). ``none (user file: PATH)`` when none is read."""
    from cuforge.cli import _config
    from cuforge.storage.settings import TABLES

    read = _config.read_files()
    if not read:
        return f"none (user file: {_config.user_file()})"
    said: list[str] = []
    before: set[str] = set()
    first = ""
    for level, where, keys in read:
        used = [f"[{k}.<name>]" if k in TABLES else k for k in keys
                if k in TABLES or k not in before]  # fmt: skip
        lost = [k for k in keys if k not in TABLES and k in before]
        parts = [", ".join(used)] if used else []
        if lost:
            parts.append(f"{', '.join(lost)} overridden by the {first}'s")
        said.append(f"{where} ({level}: {'; '.join(parts) or 'sets nothing'})")
        before.update(keys)
        first = first or level
    return ", ".join(said)


def _mirror_profiles() -> dict[str, dict[str, str]]:
    """The settings files' mirror profiles (new or changing a built-in), read by the
    function ``cuforge run`` reads them with; its refusal as ``mirror_error``."""
    from cuforge.cli import _config
    from cuforge.integrations.mirror import PROFILES, configured_profiles

    try:
        found = configured_profiles()
    except ValueError as exc:
        return {"mirror_error": {"value": str(exc), "from": "-"}}
    names = [name for name, profile in found.items() if PROFILES.get(name) != profile]
    if not names:
        return {"mirror_profiles": NOT_SET}
    where = ", ".join(w for _, w, _ in _config.mirror_tables())
    return {"mirror_profiles": {"value": ", ".join(sorted(names)), "from": where}}


def _secret(files: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The signing secret's lines, named by its source as ``storage.config`` ranks
    them: ``secret`` for one the environment gives -- ``$CUFORGE_CACHE_SECRET`` (its
    value never shown), else the file ``$CUFORGE_CACHE_SECRET_FILE`` names -- and
    ``secret file`` for the settings files' ``secret_file``, listed as not used when a
    variable comes first. Each is read by the function the commands read it with
    (``secret_from_env``, ``secret_from_file``): a file that fails, named by either,
    reads ``not read from PATH (see the problem below)``, never ``read from``."""
    from cuforge.storage.config import (
        ENV_SECRET,
        ENV_SECRET_FILE,
        secret_file_from_env,
        secret_from_env,
        secret_from_file,
    )

    shown: dict[str, dict[str, str]] = {}
    path = secret_file_from_env()
    if os.environ.get(ENV_SECRET) or path is not None:  # what the selection takes first
        try:
            secret_from_env()
        except ValueError:
            failed = True
        else:
            failed = False
        if path is None:
            said = "set, but refused (see the problem below)" if failed else "set (not shown)"
            shown["secret"] = {"value": said, "from": f"${ENV_SECRET}"}
        else:
            said = (
                f"not read from {path} (see the problem below)" if failed else f"read from {path}"
            )
            shown["secret"] = {"value": said, "from": f"${ENV_SECRET_FILE}"}
    if "secret_file" in files:
        found = files["secret_file"]
        ahead = shown["secret"]["from"] if shown else ""
        if ahead:
            value = f"{found.value} (not used: {ahead} comes first)"
        else:
            try:
                secret_from_file(found.value, "secret_file")
                value = found.value
            except ValueError:  # in the words of a variable's file that failed
                value = f"not read from {found.value} (see the problem below)"
        shown["secret_file"] = {"value": value, "from": found.origin}
    elif not shown:
        shown["secret_file"] = NOT_SET
    return shown


def _max_size(found: Any, choice: _select.Choice | None, cap: int | None) -> dict[str, str]:
    """The cap the cache is used with, and what set it, ranked as ``storage.config``
    ranks them: the cache URL's ``?max_size=``, else the settings files' (where the
    cache takes a cap), else the cap recorded in a directory cache (its ``cap`` file,
    written by whatever opened it with a cap, a settings file's ``max_size`` included,
    and kept after that setting is gone), which a handle opened without one obeys."""
    from cuforge.storage.units import format_size
    from cuforge.storage.urls import parse_cache_url

    if choice is None or choice.url is None:
        return {"value": found.value, "from": found.origin} if found is not None else NOT_SET
    specs = parse_cache_url(choice.url)
    last = specs[-1]
    if "max_size" in last.params:
        return {"value": last.params["max_size"], "from": f"the cache URL ({choice.origin})"}
    if found is not None:
        if last.scheme not in ("file", "sqlite", "memory"):
            note = f" (not applied: {last.scheme}:// caches take no size cap)"
            if len(specs) > 1:  # as storage.config applies it: to the last level
                note = (
                    f" (not applied: a tier's cap goes to its last level, and {last.scheme}:// "
                    "caches take no size cap)"
                )
            return {"value": found.value + note, "from": found.origin}
        return {"value": found.value, "from": found.origin}
    if cap:
        # whatever opened the cache with a cap wrote it: the CLI, a URL, a settings
        # file or Python's API; it stays after that cap is gone (docs/cache.md)
        origin = (
            "the cache's cap file, set when the cache was opened with a cap: --max-size, "
            "?max_size=, max_size in a settings file or max_size_bytes=; it stays until a "
            f"cap given again replaces it, or {os.path.join(last.location, 'cap')} is removed"
        )
        return {"value": format_size(cap), "from": origin}
    return NOT_SET
