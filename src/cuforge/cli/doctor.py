"""``cuforge doctor``: what this machine gives cuforge, in one screen.

Versions of cuforge, Python and cuda-bindings; each compiler (NVRTC, nvJitLink,
libNVVM) with its version, build id and the library file; the CUDA header sets C++
programs get (or that ``$CUFORGE_TOOLKIT_HEADERS`` turned them off); the driver and
its devices, if any; the cache the commands would use (where the choice came from,
its backend, whether it exists and can be written) and each setting with the level
that set it; the state directory (identity records, hit records). Each probe that
fails says why in its line: doctor reports, it never stops at the first problem.

The cache and the settings are checked by the functions the commands run
(``_select.choose``, ``_select.open_choice``, ``_config.default_archs``,
``_programs.check_arch_for``, ``mirror.configured_profiles``), so doctor lists as
a problem exactly the line ``cuforge compile`` (or, for a mirror profile, ``cuforge
run``) would exit 2 with, and nothing else. It changes nothing: no identity record
is written (``toolchain.reading_only``), an existing cache is opened read-only; for
one that does not exist yet -- which compile would create -- an empty directory of
a unique name is made and removed in its nearest existing parent, because only
trying tells whether creating works there (``/proc``, a read-only mount, root's
rights); for a directory cache that exists, a file of a unique name is made in its
own ``tmp/``, one byte written and removed, as a store's first step (``_writeprobe``:
a full disk or an immutable directory passes the permission bits). A Redis or S3
level's server is asked within the cache's own timeouts, with requests that change
nothing there
(``RemoteCache.check_server``): one that cannot be reached is a problem in the words
``cuforge cache stats`` would fail with, and ``writable`` says whether it takes
stores.

Exit status: 0 when nothing is wrong (no GPU is not a problem: compiling and
caching work without one); 1 when a problem was found -- the cache or a setting
(a mirror profile included) that a command would refuse, NVRTC not available, the
CUDA headers not found, a state directory that cannot keep records
(``$CUFORGE_STATE_DIR=/etc/passwd``) -- each listed under ``problems`` (so CI can run
it); 2 usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cuforge.cli import _doctorsettings, _select, _term

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.cli._args import Subparsers

__all__ = ["register"]


def register(subparsers: Subparsers) -> None:
    p = subparsers.add_parser("doctor", help="versions, compilers, devices, cache location")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_doctor)
    _select.add_cache_option(p, can_disable=False)


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _compiler(name: str, library: str, probe: Any) -> dict[str, Any]:
    identity = probe().decode("utf-8", "replace")
    if identity.startswith("unavailable:"):
        return {"name": name, "status": f"not available ({identity.split(':', 1)[1]})"}
    parts = identity.split("|")
    version = parts[0].split(":", 1)[1] if ":" in parts[0] else parts[0]
    if ":ir:" in version:  # libNVVM: "2.0:ir:2.0.3.2"
        version = "{} (NVVM IR {})".format(*version.split(":ir:", 1))
    builds = [p.split(":", 1)[1] for p in parts if p.startswith("build-id:")]
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib(library).abs_path
    except Exception as exc:
        path = f"? ({type(exc).__name__})"
    return {"name": name, "version": version, "build_ids": builds, "library": path}


def _devices() -> dict[str, Any]:
    try:
        from cuda.bindings import driver
    except Exception as exc:
        return {"driver": f"cuda-bindings cannot be imported ({exc})", "devices": []}
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:
        reason = "libcuda not found" if "NotFound" in type(exc).__name__ else type(exc).__name__
        return {"driver": f"none ({reason})", "devices": []}
    if err != driver.CUresult.CUDA_SUCCESS:
        return {"driver": f"cuInit failed ({err.name})", "devices": []}
    _, version = driver.cuDriverGetVersion()
    _, count = driver.cuDeviceGetCount()
    devices = []
    attr = driver.CUdevice_attribute
    for i in range(count):
        _, dev = driver.cuDeviceGet(i)
        _, raw = driver.cuDeviceGetName(64, dev)
        _, major = driver.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev
        )
        _, minor = driver.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev
        )
        name = raw.split(b"\0", 1)[0].decode(errors="replace")
        devices.append({"index": i, "name": name, "arch": f"sm_{major}{minor}"})
    return {"driver": f"{version // 1000}.{version % 1000 // 10} ({version})", "devices": devices}


#: Why a ``?ro`` directory or database level not there yet stays so (``exists``).
_RO_ABSENT = "?ro: opened read-only, so no command creates it"


def _cache(args: argparse.Namespace) -> tuple[_select.Choice | None, dict[str, Any]]:
    """The cache the commands would use and what doctor found, chosen and checked by
    the functions the commands run (``_select.choose``, ``_select.open_choice``
    read-only); ``problem`` is the line a command would fail with (a refusal that
    depends on writing, such as a directory that is not a cuforge cache, in the words
    of ``compile``, which writes: ``open_choice(..., as_compile=True)``)."""
    from cuforge.cli._args import UsageError

    try:
        choice = _select.choose(args)
    except UsageError as exc:
        # The rule that was choosing, as a cache's origin reads ("project config
        # PATH", "$CUFORGE_CACHE"); a settings file that could not be read while its
        # rule was choosing is that file; "-" when none was named yet.
        where = getattr(exc, "chosen_where", "") or "-"
        origin = where.removeprefix("cache in ")
        return None, {"cache": "invalid", "origin": origin, "problem": str(exc)}
    if choice.url is None:
        return choice, {"cache": "off", "origin": choice.origin}
    info: dict[str, Any] = {"cache": choice.shown(), "origin": choice.origin}
    absent = _select.missing(choice)
    kept_absent = _absent_read_only(choice, absent)
    if absent is not None:
        info["exists"] = False
        if kept_absent:  # compile opens it read-only: an empty view, never created
            info["exists_reason"] = _RO_ABSENT
    try:
        if absent is not None and not kept_absent:  # compile would create it: could it?
            try:
                absent.check_creatable()
            except OSError:
                info["creatable"] = False  # creating is what fails
                raise
        if absent is None or not _sqlite_level(choice):  # opening such a level creates it
            # each level is opened and reported by _levels below
            cache = _select.open_choice(choice, read_only=True, as_compile=True, levels=False)
            with cache:
                info["backend"] = type(cache).__name__
                # the cap it is used with: the URL's, a setting's, or (a directory
                # cache) the one recorded in it by an earlier --max-size
                info["max_size_bytes"] = getattr(cache, "max_size_bytes", None)
    except UsageError as exc:
        info["problem"] = str(exc)
        return choice, info
    except OSError as exc:
        info["problem"] = _select.explain(choice, exc)
        return choice, info
    levels, unreachable = _levels(choice)
    if unreachable is not None:
        info["unreachable"] = unreachable
    if absent is None:
        info["exists"] = True if unreachable is None else None
    info["levels"] = levels
    if len(levels) == 1:  # one level: the cache's own lines, as before
        if levels[0]["writable"] is not None:
            info["writable"] = levels[0]["writable"]
            if "writable_reason" in levels[0]:
                info["writable_reason"] = levels[0]["writable_reason"]
    else:  # takes stores when any level does (compile stores in every one that can)
        states = [level["writable"] for level in levels]
        info["writable"] = True if True in states else (None if None in states else False)
        if info["writable"] is None:
            del info["writable"]
    return choice, info


def _absent_read_only(choice: _select.Choice, absent: Any) -> bool:
    """Whether ``absent`` (the first level not there yet) is a ``?ro`` level: compile
    opens it as an empty cache and never creates it."""
    from cuforge.storage.urls import parse_cache_url

    if absent is None:
        return False
    for spec in parse_cache_url(choice.url or ""):
        if spec.scheme == absent.scheme and spec.location == absent.location:
            return bool(spec.read_only)
    return False


def _levels(choice: _select.Choice) -> tuple[list[dict[str, Any]], str | None]:
    """Each level of ``choice`` (its name as reports give it, ``level_names``) and
    whether a compile could store in it -- ``?ro``: no; ``memory://``: yes; a
    directory or database: as this process's user (one not there yet: yes, created by
    the first compile; an existing directory by trying a file in its ``tmp/``, with
    the reason in ``writable_reason``); a Redis or S3 server: asked within its own timeouts with
    requests that change nothing there (``RemoteCache.check_server``), None when it
    cannot be reached -- and the line ``cuforge cache stats`` would fail with for the
    first server that cannot be reached or refuses reads (else None)."""
    from cuforge.storage.urls import LOCAL_SCHEMES, open_level, parse_cache_url

    specs = parse_cache_url(choice.url or "")
    names = _select.level_names(choice)
    levels: list[dict[str, Any]] = []
    unreachable: str | None = None
    for i, (spec, (name, _)) in enumerate(zip(specs, names, strict=True)):
        level: dict[str, Any] = {"level": name}
        levels.append(level)
        if spec.scheme in ("file", "sqlite"):
            level["exists"] = os.path.lexists(spec.location)
            if not level["exists"] and spec.read_only:
                level["exists_reason"] = _RO_ABSENT
        if spec.scheme in LOCAL_SCHEMES:
            # the first was opened above
            failed = _open_failure(choice, i, spec) if i > 0 else None
            if failed is not None:
                level["writable"] = False
                level["writable_reason"] = "cannot be opened: see the problem below"
                if unreachable is None:
                    unreachable = failed
            elif spec.read_only:
                level["writable"] = False
                level["writable_reason"] = "?ro: opened read-only"
            elif spec.scheme == "memory":
                level["writable"] = True
            elif not os.path.lexists(spec.location):
                level["writable"] = True  # the first compile creates it (checked above)
            else:
                level["writable"], why = _writable(spec)
                if why is not None:
                    level["writable_reason"] = why
            continue
        level["writable"] = None
        try:
            handle = open_level(spec.as_read_only())
        except (ValueError, TypeError, ImportError, OSError):
            continue  # the open above said it, if it got this far
        with handle:
            check = getattr(handle, "check_server", None)
            if check is None:
                continue
            try:
                refused = check(writes=not spec.read_only)
            except ConnectionError as exc:
                if unreachable is None:
                    unreachable = str(exc)
                continue
        level["writable"] = refused is None and not spec.read_only
        if spec.read_only:
            level["writable_reason"] = "?ro: opened read-only"
        elif refused is not None:
            level["writable_reason"] = f"the server refuses writes: {refused}"
    return levels, unreachable


def _open_failure(choice: _select.Choice, i: int, spec: Any) -> str | None:
    """The line a command exits with (status 2) when the existing directory or
    database level ``i`` of ``choice``, behind the first, cannot be opened (unsafe,
    not a cuforge cache, another program's SQLite file, a file where a directory
    should be): ``_select.level_refusal`` in compile's words, as ``open_choice``
    says it; None when it opens. Opened read-only: nothing is created or changed."""
    from cuforge.storage.urls import open_level

    if spec.scheme == "memory" or not os.path.lexists(spec.location):
        return None
    try:
        open_level(spec.as_read_only()).close()
    except (ValueError, TypeError, ImportError, OSError) as exc:
        return _select.level_refusal(choice, i, exc, as_compile=True)
    return None


def _sqlite_level(choice: _select.Choice) -> bool:
    from cuforge.storage.urls import parse_cache_url

    return any(s.scheme == "sqlite" for s in parse_cache_url(choice.url or ""))


def _writable(spec: Any) -> tuple[bool, str | None]:
    """Whether a compile could store in the existing level ``spec`` (not ``?ro``),
    and why not (``_writeprobe``: found by trying, not from permission bits)."""
    from cuforge.cli import _writeprobe

    return _writeprobe.writable(spec.scheme, spec.location)


def _doctor(args: argparse.Namespace) -> int:
    from cuforge.compile import toolchain

    with toolchain.reading_only():  # doctor looks: no identity record is written
        return _report(args)


def _report(args: argparse.Namespace) -> int:
    import platform

    import cuforge
    from cuforge.compile import toolchain

    report: dict[str, Any] = {
        "cuforge": cuforge.__version__,
        "python": f"{platform.python_version()} ({sys.executable})",
        "cuda-bindings": _package_version("cuda-bindings"),
        "cuda-pathfinder": _package_version("cuda-pathfinder"),
        "compilers": [
            _compiler("NVRTC", "nvrtc", toolchain.nvrtc_identity),
            _compiler("nvJitLink", "nvJitLink", toolchain.nvjitlink_identity),
            _compiler("libNVVM", "nvvm", toolchain.nvvm_identity),
        ],
    }
    try:
        headers = toolchain.toolkit_headers()
        report["cuda_headers"] = [
            {"set": s.name, "version": s.version, "from": s.package or s.source,
             "directory": s.directory}
            for s in headers.sets
        ] + [{"set": m, "version": None, "from": "not found"} for m in headers.missing]  # fmt: skip
        if headers.mode == "off":  # no sets, by choice: the line says so and who chose it
            report["cuda_headers_off"] = f"$CUFORGE_TOOLKIT_HEADERS={headers.setting}"
    except ValueError as exc:
        report["cuda_headers"] = f"error: {exc}"
    report.update(_devices())
    choice, cache = _cache(args)
    report.update(cache)
    state = toolchain.state_dir()
    report["state_dir"] = state or f"off (${toolchain.STATE_ENV_VAR})"
    unusable = None if state is None else _state_problem(state)
    if unusable is not None:
        report["state_dir_problem"] = (
            f"state dir {unusable}, so no identity or hit records are kept (every "
            f"command works, slower); set ${toolchain.STATE_ENV_VAR} to a directory, or off"
        )
    report["settings"] = _doctorsettings.settings(report, choice)
    report["problems"] = _problems(report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 1 if report["problems"] else 0


def _state_problem(path: str) -> str | None:
    """Why the state directory ``path`` cannot keep records (``/etc/passwd is not a
    directory``; not made yet: why it cannot be, from its nearest existing parent), or
    None. As the process's user: what it cannot write, it cannot keep records in."""
    found = path
    while not os.path.lexists(found):
        parent = os.path.dirname(found)
        if parent == found:
            return None
        found = parent
    made = "" if found == path else f"{path} cannot be made: "
    if not os.path.isdir(found):
        return f"{made}{found} is not a directory"
    if not os.access(found, os.W_OK | os.X_OK):
        return f"{made}{found} is not writable"
    return None


#: The settings' entries that are refusals (each a problem line, not a setting's line).
_ERROR_KEYS = ("error", "arch_error", "mirror_error", "warm_error")


def _problems(report: dict[str, Any]) -> list[str]:
    """One line per thing that stops cuforge compiling or caching here: for the
    cache and the settings, the line the commands would exit 2 with."""
    found = []
    nvrtc = report["compilers"][0]
    if "status" in nvrtc:
        found.append(f"NVRTC is {nvrtc['status']}")
    if isinstance(report["cuda_headers"], str):
        found.append(f"CUDA headers: {report['cuda_headers']}")
    if "state_dir_problem" in report:
        found.append(report["state_dir_problem"])
    settings = [report["settings"][k]["value"] for k in _ERROR_KEYS
                if k in report["settings"]]  # fmt: skip
    # A bad settings file fails the cache's choice too: listed once, as the file's. The
    # line as the command exits 2 with it (a prefix would misname a settings value's
    # error, or a secret's, as the cache's): the cache line says it cannot be used.
    if "problem" in report and report["problem"] not in settings:
        found.append(report["problem"])
    if "unreachable" in report:  # the line cuforge cache stats would fail with
        found.append(report["unreachable"])
    return found + list(dict.fromkeys(settings))


def _print(report: dict[str, Any]) -> None:
    def line(label: str, value: object) -> None:
        print(f"{label:<18}{value}")

    for key in ("cuforge", "python", "cuda-bindings", "cuda-pathfinder"):
        line(key, report[key])
    for c in report["compilers"]:
        if "status" in c:
            line(c["name"], _term.paint(c["status"], "yellow"))
            continue
        builds = ", ".join(b[:16] for b in c["build_ids"]) or "-"
        line(c["name"], f"{c['version']}  build {builds}")
        line("", c["library"])
    headers = report["cuda_headers"]
    if isinstance(headers, str):
        line("CUDA headers", _term.paint(headers, "red"))
    else:
        for h in headers:
            line(f"headers {h['set']}", f"{h['version'] or '-'}  {h['from']}")
        if "cuda_headers_off" in report:
            why = "C++ programs see only their own include paths"
            line("headers", f"off ({report['cuda_headers_off']}: {why})")
    line("driver", report["driver"])
    for d in report["devices"]:
        line(f"device {d['index']}", f"{d['name']} ({d['arch']})")
    if not report["devices"]:
        arch = report["settings"].get("arch") or {}
        if "arch_error" in report["settings"]:
            got = "the arch setting is refused: see the problem below"
        elif arch.get("value", "-") != "-":
            got = f"arch {arch['value']} from {arch['from']}"
        else:
            got = "pass --arch"
        line("devices", f"none (compiling and caching work without; {got})")
    if report["cache"] == "invalid":  # what is wrong is the problem line's
        chosen = "" if report["origin"] == "-" else f"  (from {report['origin']})"
        line("cache", f"cannot be used (see the problem below){chosen}")
    else:
        line("cache", f"{report['cache']}  (from {report['origin']})")
    if "backend" in report:
        line("backend", report["backend"])
    tier = report.get("levels", [])
    if len(tier) > 1 and "exists" in report:  # each directory or database level's own
        for level in tier:
            if "exists" in level:
                said = (
                    "yes" if level["exists"]
                    else f"no ({level['exists_reason']})" if "exists_reason" in level
                    else "not yet (created by the first compile)"
                )  # fmt: skip
                line("exists", f"{level['level']}  {said}")
    elif "exists" in report:
        exists = report["exists"]
        if exists is None:
            said = "unknown (see the problem below)"
        elif exists:
            said = "yes"
        elif "exists_reason" in report:
            said = f"no ({report['exists_reason']})"
        elif report.get("creatable") is False:
            said = "no, and it cannot be created (see the problem below)"
        else:
            said = "not yet (created by the first compile)"
        line("exists", said)
    levels = report.get("levels", [])
    for i, level in enumerate(levels):
        ok = level["writable"]
        why = f" ({level['writable_reason']})" if "writable_reason" in level else ""
        if ok is None:
            said = "unknown (see the problem below)"
        else:
            said = _term.paint("yes", "green") if ok else _term.paint("no", "red") + why
        if len(levels) > 1:
            said = f"{level['level']}  {said}"
        line("writable" if i == 0 else "", said)
    line("state dir", report["state_dir"])
    for key, item in report["settings"].items():
        if key == "files":
            line("settings files", item["value"])
        elif key != "cache" and key not in _ERROR_KEYS:
            source = "not set" if item is _doctorsettings.NOT_SET else f"from {item['from']}"
            line(key.replace("_", " "), f"{item['value']}  ({source})")
    for problem in report["problems"]:
        line("problem", _term.paint(problem, "red"))
