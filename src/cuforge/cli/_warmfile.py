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
    sources = ["a.cu", "b.cu"]    # several sources with the same settings (not with source)
    arch = "sm_90"                # replaces the default
    variants = [                  # option sets: each adds to the kernel's settings
      { defines = ["BLOCK=128"] },
      { defines = ["BLOCK=256"], std = "c++20" },
    ]

Every kernel is compiled for every arch and every variant (one variant, the
kernel's own settings, when none are listed), exactly as ``cuforge compile SOURCE
...`` run from the manifest's directory would compile it, so those commands hit
what ``cuforge warm`` stored. Lists (``defines``, ``includes``, ``pre_include``)
in a variant are appended; ``arch``, ``target`` and ``std`` replace. A kernel with
no arch in the manifest gets the settings files' ``arch`` (read where warm runs,
as the cache is chosen), as ``cuforge compile`` without ``--arch`` would.

Before anything compiles or is stored, a UsageError naming the file, the kernel
(and variant) and the key, in the manifest's words: unknown keys, wrong types,
missing sources, both ``source`` and ``sources``, no arch, a virtual arch
(``compute_90``) for a cubin, a value ``ProgramOptions`` refuses (``arch = "sm90"``,
``defines = ["1BAD"]``, ``std = "c++18"``), an arch NVRTC does not compile for
(its ``nvrtcGetSupportedArchs``: ``sm_999``; for CUDA C++ sources -- PTX and NVVM
IR archs are checked for their form only), C++ options on another code type, a
``pre_include`` file that is not there, a ``CUFORGE_TOOLKIT_HEADERS`` without a
toolkit, and a target a source's code type does not compile to (NVVM IR to cubin,
PTX to PTX).
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


def _a_toml(value: Any) -> str:
    """What ``value`` is in TOML's words, with the value as TOML writes it: ``an
    integer (5)``, ``a string ("x")``, ``a table ([kernel])``."""
    import json  # only for a message

    kinds = ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
             (list, "an array"), (dict, "a table"))  # fmt: skip
    kind = next((word for t, word in kinds if isinstance(value, t)), "a date or time")
    if isinstance(value, dict):
        return kind
    try:
        shown = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # a TOML date or time
        shown = str(value)
    return f"{kind} ({shown if len(shown) <= 40 else shown[:37] + '...'})"


def _check_keys(table: Any, allowed: set[str], where: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise UsageError(f"{where} must be a table, got {_a_toml(table)}")
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
            out["arch_from"] = where
        elif key in _SCALARS:
            if not isinstance(value, str):
                raise UsageError(f"{where}: {key} must be a string")
            out[key] = value
    return out


# Any architecture: checking a layer's other options needs one, and arch is checked alone.
_ANY_ARCH = "sm_90"


def _check_layer(layer: dict[str, Any], where: str) -> None:
    """UsageError naming ``where`` and the key, in the manifest's words, for an option
    value the compile layer refuses (``ProgramOptions``' own checks): an arch that does
    not look like one, a macro name that is not an identifier, an unknown ``std``.
    Checked where the value is written ([defaults], a kernel, a variant), so the line
    names that place, before anything compiles."""
    from cuforge.cli._programs import MANIFEST_KEYS, in_words
    from cuforge.compile.options import ProgramOptions

    fields = {f: layer[k] for f, k in MANIFEST_KEYS.items() if k in layer and k != "arch"}
    fields = {f: [v] if isinstance(v, str) and f != "std" else v for f, v in fields.items()}
    try:
        for arch in _strings(layer.get("arch", []), where, "arch"):
            ProgramOptions(arch=arch)
        ProgramOptions(arch=_ANY_ARCH, **fields)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: {in_words(str(exc), fields, MANIFEST_KEYS)}") from None


def _check_arch(arch: str, code_type: str, where: str, origin: str) -> None:
    """UsageError for an arch NVRTC does not compile for (``nvrtcGetSupportedArchs``),
    for a CUDA C++ source; for PTX and NVVM IR only the arch's form is checked (no
    library lists what it takes). Skipped when NVRTC cannot be loaded: the compile
    then says that. The rule ``cuforge compile`` applies (``_programs``)."""
    if code_type != "c++":
        return
    from cuforge.cli._programs import check_supported_arch

    said = f" (from {origin})" if origin != where else ""
    check_supported_arch(arch, f"{where}: arch {arch!r}{said}")


def _check_target(source: str, arch: str, target: str, where: str, origin: str = "") -> None:
    """UsageError, before anything compiles, for a target ``source`` (by its suffix, as
    ``cuforge compile`` reads it) does not compile to: the rule ``cuforge compile``
    applies (``_programs.check_target``). A virtual arch (``compute_90``) for a cubin
    is said in the manifest's keys, as ``compile --arch compute_90`` says it in flags."""
    from cuforge.cli._programs import CODE_TYPES, check_target
    from cuforge.compile.options import ProgramOptions

    if target == "cubin" and arch.startswith("compute_"):
        said = f" (from {origin})" if origin and origin != where else ""
        real = "sm_" + arch[len("compute_") :]
        raise UsageError(
            f"{where}: {source}: arch {arch!r}{said} is a virtual architecture and has "
            f'no cubin: set arch = "{real}", or target = "ptx"'
        )
    options = ProgramOptions(arch=arch)  # checked by _check_layer or the settings file
    code_type = CODE_TYPES.get(os.path.splitext(source)[1].lower(), "c++")
    check_target(source, code_type, options, target, where=where)


def _label(variant: dict[str, Any]) -> str:
    """A variant in its own words, for the result lines: its defines, then its other
    keys (``BLOCK=256 std=c++20``); ``arch`` has a column of its own."""
    words = _strings(variant.get("defines", []), "", "defines")
    for key in ("std", "target", "includes", "pre_include"):
        if key in variant:
            value = variant[key]
            words.append(f"{key}={value if isinstance(value, str) else ','.join(value)}")
    return " ".join(words)


def _settings_archs(where: str) -> tuple[list[str], str]:
    """The settings files' ``arch`` (what ``cuforge compile`` without ``--arch`` uses),
    and where it came from; UsageError naming ``where`` when none is set."""
    from cuforge.cli import _config

    found = _config.default_archs()  # UsageError naming the file for a bad one
    if not found:
        raise UsageError(
            f"{where}: no arch (set arch in [defaults], the kernel, or a settings file: "
            "cuforge.toml)"
        )
    return [a.value for a in found], f"arch in {found[0].origin}"


def load(path: str) -> tuple[str, list[Spec]]:
    """(the manifest's directory, the compiles it asks for, duplicates dropped).
    UsageError, before anything compiles, for anything a compile would refuse."""
    data = _toml(path)
    _check_keys(data, {"defaults", "kernel"}, path)
    where = f"{path} [defaults]"
    layer = _check_keys(data.get("defaults", {}), _DEFAULT_KEYS, where)
    defaults = _merge(  # the types first: "includes must be a string or a list of strings"
        {"arch": [], "arch_from": "", "target": "cubin", "std": None, **{k: [] for k in _LISTS}},
        layer,
        where,
    )
    _check_layer(layer, where)
    kernels = data.get("kernel", [])
    if not isinstance(kernels, list):  # kernel = 5, or one [kernel] table
        got = _a_toml(kernels)
        if isinstance(kernels, dict):
            got += " ([kernel]: write [[kernel]])"
        raise UsageError(
            f"{path}: kernel must be an array of tables, each a [[kernel]] naming a source; "
            f"got {got}"
        )
    if not kernels:
        raise UsageError(f"{path}: no [[kernel]] tables (each names a source)")
    folder = os.path.dirname(os.path.abspath(path))
    specs: dict[tuple[object, ...], Spec] = {}
    fallback: tuple[list[str], str] | None = None  # the settings files' arch, read once
    checked_environment = False
    for i, kernel in enumerate(kernels, 1):
        where = f"{path} kernel {i}"
        _check_keys(kernel, _KERNEL_KEYS, where)
        if "source" in kernel and "sources" in kernel:  # one would be dropped unsaid
            raise UsageError(
                f'{where}: give source = "FILE" or sources = [...], not both '
                "(list every file in sources)"
            )
        sources = _strings(kernel.get("sources", kernel.get("source", [])), where, "source")
        if not sources:
            raise UsageError(f'{where}: needs source = "FILE" (or sources = [...])')
        for source in sources:
            if not os.path.isfile(os.path.join(folder, source)):
                raise UsageError(f"{where}: source {source} not found in {folder}")
        layer = {k: v for k, v in kernel.items() if k in _DEFAULT_KEYS}
        base = _merge(defaults, layer, where)
        _check_layer(layer, where)
        listed = "variants" in kernel
        variants = kernel.get("variants", [{}])
        if not isinstance(variants, list) or not variants:
            raise UsageError(f"{where}: variants must be a non-empty list of tables")
        for j, variant in enumerate(variants, 1):
            vwhere = f"{where} variant {j}" if listed else where
            layer = _check_keys(variant, _VARIANT_KEYS, vwhere)
            settings = _merge(base, layer, vwhere)
            _check_layer(layer, vwhere)
            if settings["target"] not in ("cubin", "ptx", "ltoir"):
                raise UsageError(f"{vwhere}: target must be cubin, ptx or ltoir")
            archs, origin = settings["arch"], settings["arch_from"]
            if not archs:
                fallback = fallback or _settings_archs(vwhere)
                archs, origin = fallback
            cpp = [source for source in sources if _code_type(source) == "c++"]
            if cpp and not checked_environment:
                from cuforge.cli._programs import check_environment

                check_environment()  # CUFORGE_TOOLKIT_HEADERS, once
                checked_environment = True
            if cpp and settings["pre_include"]:
                from cuforge.cli._programs import check_pre_includes

                check_pre_includes(settings["pre_include"], settings["includes"], folder,
                                   f"{vwhere}: pre_include")  # fmt: skip
            for source in sources:
                code_type = _code_type(source)
                if code_type != "c++" and any(settings[k] for k in (*_LISTS, "std")):
                    raise UsageError(
                        f"{vwhere}: defines, includes, pre_include and std apply to CUDA C++ "
                        f"only, not {source}"
                    )
                for arch in archs:
                    _check_arch(arch, code_type, vwhere, origin)
                    _check_target(source, arch, settings["target"], vwhere, origin)
                    spec = Spec(
                        source=source,
                        arch=arch,
                        target=settings["target"],
                        std=settings["std"],
                        defines=settings["defines"],
                        includes=settings["includes"],
                        pre_include=settings["pre_include"],
                        label=(_label(variant) or f"variant {j}") if listed else "",
                    )
                    specs.setdefault(spec.key(), spec)
    return folder, list(specs.values())


def _code_type(source: str) -> str:
    from cuforge.cli._programs import CODE_TYPES

    return CODE_TYPES.get(os.path.splitext(source)[1].lower(), "c++")
