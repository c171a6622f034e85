"""``cuforge doctor``: what this machine gives cuforge, in one screen.

Versions of cuforge, Python and cuda-bindings; each compiler (NVRTC, nvJitLink,
libNVVM) with its version, build id and the library file; the CUDA header sets C++
programs get; the driver and its devices, if any; the cache the command line would
use, its backend and whether it can be written; the state directory (identity
records, hit records). Each probe that fails says why in its line: doctor reports,
it never stops at the first problem. It creates, sweeps and deletes nothing: a
directory is looked at, any other cache opened read-only.

Exit status: 0 when nothing is wrong (no GPU is not a problem: compiling and
caching work without one); 1 when a problem was found -- the cache cannot be chosen
or opened (or is a directory that is not a cuforge cache), NVRTC is not available,
the CUDA headers cannot be found -- each listed
under ``problems`` (so CI can run it); 2 usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cuforge.cli import _select, _term

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


def _cache(args: argparse.Namespace) -> dict[str, Any]:
    from cuforge.cli._args import UsageError

    try:
        choice = _select.choose(args)
    except UsageError as exc:
        return {"cache": f"invalid ({exc})"}
    if choice.url is None:
        return {"cache": "off", "origin": choice.origin}
    info: dict[str, Any] = {"cache": choice.shown(), "origin": choice.origin}
    directory = _plain_directory(choice.url)
    if directory is not None:  # looked at, then opened read-only: doctor creates nothing
        info["backend"] = "FileStreamProgramCache"
        probe = directory
        while not os.path.exists(probe) and os.path.dirname(probe) != probe:
            probe = os.path.dirname(probe)
        exists = os.path.isdir(directory)
        info["exists"] = exists
        target = os.path.join(directory, "entries") if exists else probe
        info["writable"] = os.path.isdir(target) and os.access(target, os.W_OK | os.X_OK)
        if not exists:
            return info
    try:  # read-only: a directory that is not a cuforge cache (or unsafe) is refused
        cache = _select.open_choice(choice, read_only=True)
    except UsageError as exc:
        info["backend"] = f"cannot be opened ({exc})"
        return info
    with cache:
        if directory is None:
            info["backend"] = type(cache).__name__
            path = getattr(cache, "path", None)
            if path is not None:
                info["writable"] = os.access(os.path.join(path, "entries"), os.W_OK)
    return info


def _plain_directory(url: str) -> str | None:
    """The directory of a single-level file cache URL, else None."""
    from cuforge.storage.urls import parse_cache_url

    try:
        specs = parse_cache_url(url)
    except ValueError:
        return None
    if len(specs) != 1 or specs[0].scheme != "file" or specs[0].read_only:
        return None
    return os.path.abspath(os.path.expanduser(specs[0].location))


def _doctor(args: argparse.Namespace) -> int:
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
    except ValueError as exc:
        report["cuda_headers"] = f"error: {exc}"
    report.update(_devices())
    report.update(_cache(args))
    state = toolchain.state_dir()
    report["state_dir"] = state or f"off (${toolchain.STATE_ENV_VAR})"
    report["settings"] = _settings(report)
    report["problems"] = _problems(report)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print(report)
    return 1 if report["problems"] else 0


def _settings(report: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each setting's value and the level that set it (flag > env > project > user)."""
    from cuforge.cli import _config
    from cuforge.cli._args import UsageError

    try:
        files = _config.settings()
    except UsageError as exc:
        return {"error": {"value": str(exc), "from": "settings file"}}
    shown = {"cache": {"value": str(report["cache"]), "from": str(report.get("origin", "-"))}}
    for key in ("max_size", "secret_file", "arch"):
        found = files.get(key)
        if found is not None:
            shown[key] = {"value": found.value, "from": found.origin}
    if os.environ.get(_config.ENV_SECRET) and not _config.applied:
        shown["secret_file"] = {"value": "(a secret)", "from": f"${_config.ENV_SECRET}"}
    for key in ("max_size", "secret_file", "arch"):
        shown.setdefault(key, {"value": "-", "from": "not set"})
    user = _config.user_file()
    used = sorted({f.path for f in files.values()})
    shown["files"] = {"value": ", ".join(used) or f"none (user file: {user})", "from": "-"}
    return shown


def _problems(report: dict[str, Any]) -> list[str]:
    """One line per thing that stops cuforge compiling or caching here."""
    found = []
    nvrtc = report["compilers"][0]
    if "status" in nvrtc:
        found.append(f"NVRTC is {nvrtc['status']}")
    if isinstance(report["cuda_headers"], str):
        found.append(f"CUDA headers: {report['cuda_headers']}")
    if str(report["cache"]).startswith("invalid"):
        found.append(f"cache {report['cache']}")
    if str(report.get("backend", "")).startswith("cannot be opened"):
        found.append(f"cache {report['cache']} {report['backend']}")
    if "error" in report["settings"]:
        found.append(report["settings"]["error"]["value"])
    return found


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
    line("driver", report["driver"])
    for d in report["devices"]:
        line(f"device {d['index']}", f"{d['name']} ({d['arch']})")
    if not report["devices"]:
        line("devices", "none (compiling and caching work without; pass --arch)")
    line("cache", f"{report['cache']}  (from {report.get('origin', '-')})")
    if "backend" in report:
        line("backend", report["backend"])
    if report.get("exists") is False:
        line("exists", "not yet (created by the first compile)")
    if "writable" in report:
        ok = report["writable"]
        line("writable", _term.paint("yes", "green") if ok else _term.paint("no", "red"))
    line("state dir", report["state_dir"])
    for key, item in report["settings"].items():
        if key == "files":
            line("settings files", item["value"])
        elif key not in ("cache", "error"):
            line(key.replace("_", " "), f"{item['value']}  (from {item['from']})")
    for problem in report["problems"]:
        line("problem", _term.paint(problem, "red"))
