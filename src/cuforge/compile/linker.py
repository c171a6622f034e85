"""``Linker`` and ``LinkerOptions``: link ObjectCodes with nvJitLink.

Guarantees:
- ``LinkerOptions`` validates every field on construction (TypeError/ValueError
  naming the field), is frozen, and ``as_nvjitlink_options()`` is deterministic.
- ``Linker.link`` returns a new ObjectCode or raises CompileError with nvJitLink's
  log; inputs are never modified. ``linker_backend()`` says which linker a PTX
  ``Program`` uses, decided once per process.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Any

from cuforge.compile import _compilelog, _nvjitlink
from cuforge.compile import _validate as v
from cuforge.compile._versions import current_device_arch, nvjitlink_version
from cuforge.compile.object_code import ObjectCode


@functools.cache
def linker_backend() -> str:
    """``"nvjitlink"`` when libnvJitLink loads, else ``"driver"`` (the cuLink* fallback).

    Cached so that every use in one process -- compile and cache key alike -- agrees.
    """
    return "nvjitlink" if nvjitlink_version() is not None else "driver"


def _f(check: v.Checker, kind: str, flag: str) -> dict[str, Any]:
    """Field metadata: how to check the value and the nvJitLink flag it becomes."""
    return {"check": check, "kind": kind, "flag": flag}


@dataclass(frozen=True)
class LinkerOptions:
    """nvJitLink options; field names follow cuda.core's ``LinkerOptions``.

    ``None`` leaves nvJitLink's default. ``arch=None`` resolves to the current
    device's arch, or raises ValueError asking for ``arch=`` when there is none.
    """

    arch: str | None = field(default=None, metadata=_f(v.check_arch, "value", "-arch"))
    max_register_count: int | None = field(
        default=None, metadata=_f(v.int_checker(1), "value", "-maxrregcount")
    )
    time: bool | None = field(default=None, metadata=_f(v.check_bool, "switch", "-time"))
    verbose: bool | None = field(default=None, metadata=_f(v.check_bool, "switch", "-verbose"))
    link_time_optimization: bool | None = field(
        default=None, metadata=_f(v.check_bool, "switch", "-lto")
    )
    ptx: bool | None = field(default=None, metadata=_f(v.check_bool, "switch", "-ptx"))
    optimization_level: int | None = field(
        default=None, metadata=_f(v.int_checker(0, 3), "level", "-O")
    )
    debug: bool | None = field(default=None, metadata=_f(v.check_bool, "switch", "-g"))
    lineinfo: bool | None = field(default=None, metadata=_f(v.check_bool, "switch", "-lineinfo"))
    ftz: bool | None = field(default=None, metadata=_f(v.check_bool, "tristate", "-ftz"))
    prec_div: bool | None = field(default=None, metadata=_f(v.check_bool, "tristate", "-prec-div"))
    prec_sqrt: bool | None = field(
        default=None, metadata=_f(v.check_bool, "tristate", "-prec-sqrt")
    )
    fma: bool | None = field(default=None, metadata=_f(v.check_bool, "tristate", "-fma"))
    kernels_used: Any = field(default=None, metadata=_f(v.check_strs, "each", "-kernels-used"))
    variables_used: Any = field(default=None, metadata=_f(v.check_strs, "each", "-variables-used"))
    optimize_unused_variables: bool | None = field(
        default=None, metadata=_f(v.check_bool, "switch", "-optimize-unused-variables")
    )
    ptxas_options: Any = field(default=None, metadata=_f(v.check_strs, "each", "-Xptxas"))
    split_compile: int | None = field(
        default=None, metadata=_f(v.int_checker(0), "value", "-split-compile")
    )
    split_compile_extended: int | None = field(
        default=None, metadata=_f(v.int_checker(0), "value", "-split-compile-extended")
    )
    no_cache: bool | None = field(default=None, metadata=_f(v.check_bool, "switch", "-no-cache"))

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = f.metadata["check"](f"LinkerOptions.{f.name}", getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        if self.arch is None:
            arch = current_device_arch()
            if arch is None:
                raise ValueError(
                    "LinkerOptions.arch is required here: no CUDA driver/device was found "
                    "to take it from. Pass arch='sm_90' (or the target GPU's sm_XY)."
                )
            object.__setattr__(self, "arch", arch)

    def as_nvjitlink_options(self) -> list[bytes]:
        """The nvJitLink flag list, in field-declaration order."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value, kind, flag = getattr(self, f.name), f.metadata["kind"], f.metadata["flag"]
            if value is None:
                continue
            if kind == "switch":
                if value:
                    out.append(flag)
            elif kind == "tristate":
                out.append(f"{flag}={1 if value else 0}")
            elif kind == "level":
                out.append(f"{flag}{value}")
            elif kind == "each":
                out.extend(f"{flag}={item}" for item in value)
            else:
                out.append(f"{flag}={value}")
        return [o.encode() for o in out]


class Linker:
    """Links one or more ObjectCodes into a cubin (or PTX, with LTO) via nvJitLink.

    Raises (constructor):
        TypeError: an input is not an ObjectCode, or options is not LinkerOptions.
        ValueError: no inputs.
    """

    def __init__(self, *object_codes: ObjectCode, options: LinkerOptions | None = None) -> None:
        if not object_codes:
            raise ValueError("Linker needs at least one ObjectCode")
        for i, obj in enumerate(object_codes):
            if not isinstance(obj, ObjectCode):
                raise TypeError(
                    f"object_codes[{i}] must be an ObjectCode, got {type(obj).__name__}"
                )
        if options is None:
            options = LinkerOptions()
        elif not isinstance(options, LinkerOptions):
            raise TypeError(f"options must be a LinkerOptions, got {type(options).__name__}")
        self._inputs = object_codes
        self._options = options
        self._info_log = ""
        self._closed = False

    @property
    def options(self) -> LinkerOptions:
        return self._options

    @property
    def backend(self) -> str:
        """Always ``"nvJitLink"``; the driver fallback applies to PTX Programs only."""
        return "nvJitLink"

    def link(self, target_type: str) -> ObjectCode:
        """Link the inputs to ``target_type`` ("cubin", or "ptx" which needs
        ``link_time_optimization=True``), case-insensitive.

        Raises:
            ValueError: unsupported target, or "ptx" without LTO.
            RuntimeError: the Linker is closed, or nvJitLink cannot be loaded.
            CompileError: nvJitLink failed (carries its log and the flags).
        """
        if self._closed:
            raise RuntimeError("Linker is closed")
        if not isinstance(target_type, str):
            raise TypeError(f"target_type must be a str, got {type(target_type).__name__}")
        target = target_type.strip().lower()
        if target not in ("cubin", "ptx"):
            raise ValueError(
                f"unsupported target_type {target_type!r} for Linker; valid targets are "
                "'cubin', 'ptx'"
            )
        flags = self._options.as_nvjitlink_options()
        if target == "ptx":
            if not self._options.link_time_optimization:
                raise ValueError(
                    "Linker.link('ptx') needs LinkerOptions(link_time_optimization=True): "
                    "nvJitLink emits PTX only from LTO-IR inputs"
                )
            if b"-ptx" not in flags:
                flags.append(b"-ptx")
        if linker_backend() != "nvjitlink":
            raise RuntimeError("Linker needs nvJitLink, which cannot be loaded here")
        inputs = [(o.code, o.code_type, o.name) for o in self._inputs]
        debug = _compilelog.debug_enabled()
        started = time.perf_counter() if debug else 0.0
        code, self._info_log = _nvjitlink.link(inputs, flags, target, name="link")
        if debug:
            shown = f"{len(inputs)} inputs"
            _compilelog.compiled("nvJitLink", shown, target, started, len(code), flags)
        mapping: dict[str | bytes, str] = {}
        for obj in self._inputs:
            mapping.update(obj.symbol_mapping)
        return ObjectCode(code, target, name="link", symbol_mapping=mapping)

    def get_info_log(self) -> str:
        """nvJitLink's info log of the last successful ``link`` ("" before one)."""
        return self._info_log

    def close(self) -> None:
        """Release the Linker; ``link`` afterwards raises RuntimeError. Idempotent."""
        self._closed = True

    def __enter__(self) -> Linker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Linker", "LinkerOptions", "linker_backend"]
