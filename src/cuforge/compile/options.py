"""``ProgramOptions``: compile options, validated once, translated per backend.

Guarantees:
- Construction validates every field (TypeError for a wrong type, ValueError for a
  wrong value, both naming the field) and stores a canonical, hashable value
  (sequences become tuples, paths become str). Instances are frozen, so what was
  validated is what compiles -- and a fingerprint taken once stays true.
- ``as_nvrtc_options``/``as_nvjitlink_options``/``as_nvvm_options``/
  ``as_driver_linker_options`` are deterministic: equal options give byte-equal
  lists, in field-declaration order. They are exactly what the backend receives,
  except for what ``Program`` appends: the one flag a target implies and, for C++,
  the toolkit's include directories (see ``_toolkit``).
- No option is silently dropped: a set field that a backend cannot honour raises
  ValueError naming it when that backend's list is asked for.
- ``arch=None`` resolves to the current device's ``sm_XY`` when a driver and device
  exist; otherwise construction raises ValueError asking for ``arch=``.
"""

from __future__ import annotations

import os

from cuforge.compile import _validate as v

TYPE_CHECKING = False  # typing and dataclasses cost a cold process ~10 ms: not at run time
if TYPE_CHECKING:
    from collections.abc import Callable
    from dataclasses import dataclass, field
    from typing import Any, TypeAlias

    # Per backend, a field maps to a flag (formatted by the field's kind) or to a
    # function value -> [flags].
    Emit: TypeAlias = str | Callable[[Any], list[str]]
else:  # the same class, made without importing dataclasses (cuforge._fields)
    from cuforge._fields import dataclass, field

# A path field accepts str or os.PathLike and is stored as str once validated. Defined at
# run time (os is loaded by every interpreter's start-up; the union costs no import) so
# the API docs can expand it.
_Path = str | os.PathLike[str]
# The fields typed Any below accept several forms and hold one normalised form after
# __post_init__, which the compile code reads: define_macro "N", "N=V", ("N", "V") or a
# list/tuple of those -> tuple[str, ...]; include_path / pre_include a path or a
# list/tuple of paths -> tuple[str, ...]; extra_sources a list/tuple of (name, str or
# bytes-like NVVM IR) -> tuple[tuple[str, bytes], ...].

_STDS = ("c++03", "c++11", "c++14", "c++17", "c++20", "c++23")

_BACKEND_NAMES = {
    "nvrtc": "NVRTC",
    "nvjitlink": "nvJitLink",
    "nvvm": "libNVVM",
    "driver": "driver linker",
}


def _opt(check: v.Checker, kind: str, **backends: Emit) -> dict[str, Any]:
    """Field metadata: how to check the value and what each backend emits for it."""
    return {"check": check, "kind": kind, "emit": backends}


def _switch(**backends: Emit) -> dict[str, Any]:
    return _opt(v.check_bool, "switch", **backends)


def _tristate(**backends: Emit) -> dict[str, Any]:
    return _opt(v.check_bool, "tristate", **backends)


def _nvvm_arch(arch: str) -> list[str]:
    return [f"-arch=compute_{v.arch_number(arch)}"]


def _nvvm_opt(on: bool) -> list[str]:
    return ["-opt=3" if on else "-opt=0"]


def _nvrtc_dopt(on: bool) -> list[str]:
    # NVRTC accepts only "on"; leaving it out is how optimization stays default.
    return ["--dopt=on"] if on else []


def _driver_arch(arch: str) -> list[str]:
    return [f"target={v.arch_number(arch)}"]


@dataclass(frozen=True)
class ProgramOptions:
    """Options for ``Program``; field names and meanings follow cuda.core's.

    ``None`` (the default for every field but ``name``) means "leave the backend's
    default". See the module docstring for the guarantees.

    Raises:
        TypeError: a field has the wrong type (the message names the field).
        ValueError: a field has an invalid value, or ``arch`` is None and no CUDA
            device can be probed.
    """

    name: str | None = field(
        default="<default program>", metadata={"check": v.check_str, "kind": "name", "emit": {}}
    )
    arch: str | None = field(
        default=None,
        metadata=_opt(
            v.check_arch,
            "arch",
            nvrtc="--gpu-architecture",
            nvjitlink="-arch",
            nvvm=_nvvm_arch,
            driver=_driver_arch,
        ),
    )
    relocatable_device_code: bool | None = field(
        default=None, metadata=_tristate(nvrtc="--relocatable-device-code")
    )
    extensible_whole_program: bool | None = field(
        default=None, metadata=_switch(nvrtc="--extensible-whole-program")
    )
    debug: bool | None = field(
        default=None,
        metadata=_switch(
            nvrtc="--device-debug", nvjitlink="-g", nvvm="-g", driver="generate_debug_info=1"
        ),
    )
    lineinfo: bool | None = field(
        default=None,
        metadata=_switch(
            nvrtc="--generate-line-info", nvjitlink="-lineinfo", driver="generate_line_info=1"
        ),
    )
    device_code_optimize: bool | None = field(
        default=None, metadata=_opt(v.check_bool, "custom", nvrtc=_nvrtc_dopt, nvvm=_nvvm_opt)
    )
    ptxas_options: str | list[str] | tuple[str, ...] | None = field(
        default=None,
        metadata=_opt(v.check_strs, "each", nvrtc="--ptxas-options", nvjitlink="-Xptxas"),
    )
    max_register_count: int | None = field(
        default=None,
        metadata=_opt(
            v.int_checker(1),
            "value",
            nvrtc="--maxrregcount",
            nvjitlink="-maxrregcount",
            driver="max_registers",
        ),
    )
    ftz: bool | None = field(
        default=None, metadata=_tristate(nvrtc="--ftz", nvjitlink="-ftz", nvvm="-ftz")
    )
    prec_sqrt: bool | None = field(
        default=None,
        metadata=_tristate(nvrtc="--prec-sqrt", nvjitlink="-prec-sqrt", nvvm="-prec-sqrt"),
    )
    prec_div: bool | None = field(
        default=None,
        metadata=_tristate(nvrtc="--prec-div", nvjitlink="-prec-div", nvvm="-prec-div"),
    )
    fma: bool | None = field(
        default=None, metadata=_tristate(nvrtc="--fmad", nvjitlink="-fma", nvvm="-fma")
    )
    use_fast_math: bool | None = field(default=None, metadata=_switch(nvrtc="--use_fast_math"))
    extra_device_vectorization: bool | None = field(
        default=None, metadata=_switch(nvrtc="--extra-device-vectorization")
    )
    link_time_optimization: bool | None = field(
        default=None, metadata=_switch(nvrtc="--dlink-time-opt", nvvm="-gen-lto")
    )
    gen_opt_lto: bool | None = field(default=None, metadata=_switch(nvrtc="--gen-opt-lto"))
    define_macro: Any = field(
        default=None, metadata=_opt(v.check_macros, "each", nvrtc="--define-macro")
    )
    undefine_macro: str | list[str] | tuple[str, ...] | None = field(
        default=None, metadata=_opt(v.check_strs, "each", nvrtc="--undefine-macro")
    )
    include_path: Any = field(
        default=None, metadata=_opt(v.check_paths, "each", nvrtc="--include-path")
    )
    pre_include: Any = field(
        default=None, metadata=_opt(v.check_paths, "each", nvrtc="--pre-include")
    )
    no_source_include: bool | None = field(
        default=None, metadata=_switch(nvrtc="--no-source-include")
    )
    std: str | None = field(
        default=None, metadata=_opt(v.choice_checker(_STDS), "value", nvrtc="--std")
    )
    builtin_move_forward: bool | None = field(
        default=None, metadata=_tristate(nvrtc="--builtin-move-forward")
    )
    builtin_initializer_list: bool | None = field(
        default=None, metadata=_tristate(nvrtc="--builtin-initializer-list")
    )
    disable_warnings: bool | None = field(
        default=None, metadata=_switch(nvrtc="--disable-warnings")
    )
    restrict: bool | None = field(default=None, metadata=_switch(nvrtc="--restrict"))
    device_as_default_execution_space: bool | None = field(
        default=None, metadata=_switch(nvrtc="--device-as-default-execution-space")
    )
    device_int128: bool | None = field(default=None, metadata=_switch(nvrtc="--device-int128"))
    device_float128: bool | None = field(default=None, metadata=_switch(nvrtc="--device-float128"))
    optimization_info: str | None = field(
        default=None,
        metadata=_opt(v.choice_checker(("inline",)), "value", nvrtc="--optimization-info"),
    )
    no_display_error_number: bool | None = field(
        default=None, metadata=_switch(nvrtc="--no-display-error-number")
    )
    diag_error: int | list[int] | tuple[int, ...] | None = field(
        default=None, metadata=_opt(v.check_ints, "joined", nvrtc="--diag-error")
    )
    diag_suppress: int | list[int] | tuple[int, ...] | None = field(
        default=None, metadata=_opt(v.check_ints, "joined", nvrtc="--diag-suppress")
    )
    diag_warn: int | list[int] | tuple[int, ...] | None = field(
        default=None, metadata=_opt(v.check_ints, "joined", nvrtc="--diag-warn")
    )
    brief_diagnostics: bool | None = field(
        default=None, metadata=_tristate(nvrtc="--brief-diagnostics")
    )
    time: _Path | None = field(default=None, metadata=_opt(v.check_path, "value", nvrtc="--time"))
    split_compile: int | None = field(
        default=None,
        metadata=_opt(
            v.int_checker(0), "value", nvrtc="--split-compile", nvjitlink="-split-compile"
        ),
    )
    fdevice_syntax_only: bool | None = field(
        default=None, metadata=_switch(nvrtc="--fdevice-syntax-only")
    )
    minimal: bool | None = field(default=None, metadata=_switch(nvrtc="--minimal"))
    no_cache: bool | None = field(
        default=None, metadata=_switch(nvrtc="--no-cache", nvjitlink="-no-cache")
    )
    fdevice_time_trace: _Path | None = field(
        default=None, metadata=_opt(v.check_path, "value", nvrtc="--fdevice-time-trace")
    )
    frandom_seed: str | None = field(
        default=None, metadata=_opt(v.check_str, "value", nvrtc="--frandom-seed")
    )
    ofast_compile: str | None = field(
        default=None,
        metadata=_opt(
            v.choice_checker(("0", "min", "mid", "max")), "value", nvrtc="--Ofast-compile"
        ),
    )
    pch: bool | None = field(default=None, metadata=_switch(nvrtc="--pch"))
    create_pch: _Path | None = field(
        default=None, metadata=_opt(v.check_path, "value", nvrtc="--create-pch")
    )
    use_pch: _Path | None = field(
        default=None, metadata=_opt(v.check_path, "value", nvrtc="--use-pch")
    )
    pch_dir: _Path | None = field(
        default=None, metadata=_opt(v.check_path, "value", nvrtc="--pch-dir")
    )
    pch_verbose: bool | None = field(default=None, metadata=_tristate(nvrtc="--pch-verbose"))
    pch_messages: bool | None = field(default=None, metadata=_tristate(nvrtc="--pch-messages"))
    instantiate_templates_in_pch: bool | None = field(
        default=None, metadata=_tristate(nvrtc="--instantiate-templates-in-pch")
    )
    numba_debug: bool | None = field(default=None, metadata=_switch(nvrtc="-numba-debug"))
    # NVVM only: consumed by Program, not as flags (libdevice is a module it adds).
    use_libdevice: bool | None = field(
        default=None, metadata=_opt(v.check_bool, "switch", nvvm=lambda on: [])
    )
    extra_sources: Any = field(
        default=None, metadata=_opt(v.check_sources, "custom", nvvm=lambda sources: [])
    )

    def __post_init__(self) -> None:
        values = self.__dict__
        for name, check, _kind, _emit in _SPECS:
            values[name] = check(f"ProgramOptions.{name}", values[name])
        if self.arch is None:
            from cuforge.compile._versions import current_device_arch

            arch = current_device_arch()
            if arch is None:
                raise ValueError(
                    "ProgramOptions.arch is required here: no CUDA driver/device was found "
                    "to take it from. Pass arch='sm_90' (or the target GPU's sm_XY)."
                )
            object.__setattr__(self, "arch", arch)

    def _flags(self, backend: str, truth: tuple[str, str], code_type: str) -> list[bytes]:
        """The backend's flags, computed once per instance (options are frozen).

        A fresh list each call, so callers may append target flags to it."""
        memo = self.__dict__.setdefault("_cuforge_flags", {})
        flags = memo.get(backend)
        if flags is None:
            # A path (-I DIR, -include FILE) may hold bytes that are not UTF-8 (a str
            # from os.fsdecode): they go to the compiler as the same bytes.
            flags = memo[backend] = tuple(
                f.encode("utf-8", "surrogateescape")
                for f in self._compute_flags(backend, truth, code_type)
            )
        return list(flags)

    def _compute_flags(self, backend: str, truth: tuple[str, str], code_type: str) -> list[str]:
        out: list[str] = []
        values = self.__dict__
        for name, _check, kind, emits in _SPECS:
            value = values[name]
            if value is None or kind == "name":
                continue
            emit = emits.get(backend)
            if emit is None:
                # False switches and empty lists ask for nothing, so they are honoured.
                if value is False or value == ():
                    continue
                raise ValueError(
                    f"ProgramOptions.{name} is not supported for code_type {code_type!r} "
                    f"({_BACKEND_NAMES[backend]}); unset it for this program"
                )
            if callable(emit):
                out.extend(emit(value))
            elif kind == "switch":
                if value:
                    out.append(emit)
            elif kind == "tristate":
                out.append(f"{emit}={truth[0] if value else truth[1]}")
            elif kind == "each":
                out.extend(f"{emit}={item}" for item in value)
            elif kind == "joined":
                if value:
                    out.append(f"{emit}={','.join(map(str, value))}")
            else:  # "value", "arch"
                out.append(f"{emit}={value}")
        return out

    def as_nvrtc_options(self) -> list[bytes]:
        """The NVRTC flag list (code_type "c++"). ValueError for NVVM-only fields."""
        return self._flags("nvrtc", ("true", "false"), "c++")

    def as_nvjitlink_options(self) -> list[bytes]:
        """The nvJitLink flag list for code_type "ptx". ValueError for fields
        nvJitLink cannot apply to PTX input (C++ front-end options, LTO)."""
        return self._flags("nvjitlink", ("1", "0"), "ptx")

    def as_driver_linker_options(self) -> list[bytes]:
        """A canonical ``name=value`` list of the driver JIT options used when PTX
        falls back to the driver linker (``cuLink*``). Only arch, max_register_count,
        debug and lineinfo are honoured there; other set fields raise ValueError."""
        return self._flags("driver", ("1", "0"), "ptx")

    def as_nvvm_options(self) -> list[bytes]:
        """The libNVVM flag list (code_type "nvvm"); ``use_libdevice`` and
        ``extra_sources`` add modules rather than flags."""
        return self._flags("nvvm", ("1", "0"), "nvvm")


def _specs() -> tuple[tuple[str, v.Checker, str, dict[str, Emit]], ...]:
    """(name, check, kind, emit per backend) of each field, in declaration order."""
    from cuforge._fields import fields

    return tuple(
        (f.name, f.metadata["check"], f.metadata["kind"], f.metadata["emit"])
        for f in fields(ProgramOptions)
    )


_SPECS = _specs()

__all__ = ["ProgramOptions"]
