"""Warm manifests: which kernels, for which archs, with which option sets (TOML).

::

    [defaults]                    # optional; every kernel starts from these
    arch = ["sm_80", "sm_90"]     # a string or a list
    target = "cubin"              # cubin (default), ptx or ltoir
    std = "c++17"
    defines = ["NDEBUG"]          # -D
    includes = ["include"]        # -I, relative to the manifest's directory
    pre_include = []              # -include

    [[kernel]]
    source = "saxpy.cu"           # relative to the manifest's directory

    [[kernel]]
    sources = ["a.cu", "b.cu"]    # several sources with the same settings
    arch = "sm_90"                # replaces the default
    variants = [                  # option sets: each adds to the kernel's settings
      { defines = ["BLOCK=128"] },
      { defines = ["BLOCK=256"], std = "c++20" },
    ]

Every kernel is compiled for every arch and every variant (one variant, the
kernel's own settings, when none are listed), exactly as ``cuforge compile SOURCE
...`` run from the manifest's directory would compile it, so those commands hit
what ``cuforge warm`` stored. Lists (``defines``, ``includes``, ``pre_include``)
in a variant are appended; ``arch``, ``target`` and ``std`` replace. Unknown keys,
wrong types, missing sources, an arch the compiler refuses and a target a source's
code type does not compile to (NVVM IR to cubin, PTX to PTX) are UsageErrors naming
the kernel and key, before anything compiles or is stored.
"""

from __future__ import annotations

import os
import sys

from cuforge.cli._args import UsageError
from cuforge.cli._pool import Spec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Spec", "load"]

_LISTS = ("defines", "includes", "pre_include")
_SCALARS = ("target", "std")
_KERNEL_KEYS = {"source", "sources", "arch", "variants", *_LISTS, *_SCALARS}
_DEFAULT_KEYS = {"arch", *_LISTS, *_SCALARS}
_VARIANT_KEYS = {"arch", *_LISTS, *_SCALARS}


def _toml(path: str) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            data: dict[str, Any] = tomllib.load(f)
            return data
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None


def _strings(value: Any, where: str, key: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: {key} must be a string or a list of strings")
    return list(value)


def _check_keys(table: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise UsageError(f"{where} must be a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise UsageError(
            f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(allowed))})"
        )
    return table


def _merge(base: dict[str, Any], layer: dict[str, Any], where: str) -> dict[str, Any]:
    out = dict(base)
    for key, value in layer.items():
        if key in _LISTS:
            out[key] = [*out.get(key, []), *_strings(value, where, key)]
        elif key == "arch":
            out["arch"] = _strings(value, where, key)
        elif key in _SCALARS:
            if not isinstance(value, str):
                raise UsageError(f"{where}: {key} must be a string")
            out[key] = value
    return out


def _check_target(source: str, arch: str, target: str, where: str) -> None:
    """UsageError, before anything compiles, for an arch the compiler refuses or a
    target ``source`` (by its suffix, as ``cuforge compile`` reads it) does not
    compile to: the rule ``cuforge compile`` applies (``_programs.check_target``)."""
    from cuforge.cli._programs import CODE_TYPES, check_target
    from cuforge.compile.options import ProgramOptions

    try:
        options = ProgramOptions(arch=arch)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: {exc}") from None
    code_type = CODE_TYPES.get(os.path.splitext(source)[1].lower(), "c++")
    check_target(source, code_type, options, target, where=where)


def load(path: str) -> tuple[str, list[Spec]]:
    """(the manifest's directory, the compiles it asks for, duplicates dropped)."""
    data = _toml(path)
    _check_keys(data, {"defaults", "kernel"}, path)
    defaults = _merge(
        {"arch": [], "target": "cubin", "std": None, **{k: [] for k in _LISTS}},
        _check_keys(data.get("defaults", {}), _DEFAULT_KEYS, f"{path} [defaults]"),
        f"{path} [defaults]",
    )
    kernels = data.get("kernel", [])
    if not isinstance(kernels, list) or not kernels:
        raise UsageError(f"{path}: no [[kernel]] tables (each names a source)")
    folder = os.path.dirname(os.path.abspath(path))
    specs: dict[tuple[object, ...], Spec] = {}
    for i, kernel in enumerate(kernels, 1):
        where = f"{path} kernel {i}"
        _check_keys(kernel, _KERNEL_KEYS, where)
        sources = _strings(kernel.get("sources", kernel.get("source", [])), where, "source")
        if not sources:
            raise UsageError(f'{where}: needs source = "FILE" (or sources = [...])')
        base = _merge(defaults, {k: v for k, v in kernel.items() if k in _DEFAULT_KEYS}, where)
        variants = kernel.get("variants", [{}])
        if not isinstance(variants, list) or not variants:
            raise UsageError(f"{where}: variants must be a non-empty list of tables")
        for j, variant in enumerate(variants, 1):
            vwhere = f"{where} variant {j}"
            settings = _merge(base, _check_keys(variant, _VARIANT_KEYS, vwhere), vwhere)
            if settings["target"] not in ("cubin", "ptx", "ltoir"):
                raise UsageError(f"{vwhere}: target must be cubin, ptx or ltoir")
            if not settings["arch"]:
                raise UsageError(f"{vwhere}: no arch (set arch in [defaults] or the kernel)")
            for source in sources:
                if not os.path.isfile(os.path.join(folder, source)):
                    raise UsageError(f"{where}: source {source} not found in {folder}")
                for arch in settings["arch"]:
                    _check_target(source, arch, settings["target"], vwhere)
                    spec = Spec(
                        source=source,
                        arch=arch,
                        target=settings["target"],
                        std=settings["std"],
                        defines=settings["defines"],
                        includes=settings["includes"],
                        pre_include=settings["pre_include"],
                        label=" ".join(settings["defines"]) if len(variants) > 1 else "",
                    )
                    specs.setdefault(spec.key(), spec)
    return folder, list(specs.values())
