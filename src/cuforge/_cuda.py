"""The CUDA major cuforge runs on, and every difference between CUDA 12 and 13.

cuforge runs on cuda-bindings 12.x (>= 12.8) or 13.x from one code base. The major
is the installed cuda-bindings' own; ``pip install cuforge[cu12]`` or ``[cu13]``
picks it together with the NVRTC, nvJitLink, libNVVM and header wheels of that
major. What differs between the two lives here and nowhere else, so the rest of
cuforge is written against CUDA 13:

- ``driver``: ``cuda.bindings.driver`` itself on 13. On 12, the same names with the
  calls in ``RENAMED_ON_12`` bound to the 12.x functions that have the CUDA 13
  signature (``cuGraphAddNode`` takes edge data on 13; on 12 that is
  ``cuGraphAddNode_v2``). Code that calls one of those gets ``driver`` from here
  (``tests/test_cuda_versions.py`` checks that statically).
- ``header_wheel(name, major)``: the pip wheel of a CUDA header set and where its
  include directory lies: one ``nvidia/cu13/include`` for every 13 wheel;
  ``nvidia/cu12/include`` or, in the 12.x wheels published so far, one directory
  per component (``nvidia/cuda_runtime/include``, ``nvidia/cuda_nvcc/include`` for
  ``crt/``, ``nvidia/cuda_cccl/include``).
- ``require(library)``: at the first compile, that NVRTC / nvJitLink / libNVVM can
  be loaded and is of the bindings' major; otherwise ``ToolkitNotFoundError``
  naming the extra to install. Library names are cuda.pathfinder's ("nvrtc",
  "nvJitLink", "nvvm"); it knows the sonames of both majors (``libnvrtc.so.12`` /
  ``.13``; libNVVM is ``libnvvm.so`` in the 12.x nvcc wheel).

Guarantee: importing this module imports no CUDA module and loads no library, and
no ``typing``, ``re``, ``functools`` or ``importlib`` either: every runtime module
imports it, and ``from cuforge import Device, launch`` costs a cold process only
what it needs. ``cuda_major()`` reads the bindings' version file without importing
them (the CLI's hit path pays a file read, not ~10 ms of imports).
"""

from __future__ import annotations

import os
import sys
import threading

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any

#: The majors cuforge supports, and the extra that installs each.
SUPPORTED_MAJORS = (12, 13)
EXTRAS = {12: "cuforge[cu12]", 13: "cuforge[cu13]"}

#: CUDA 13 names whose signature is a ``_v2``/``_v3`` function in cuda-bindings 12.
RENAMED_ON_12 = {
    "cuGraphAddNode": "cuGraphAddNode_v2",
    "cuGraphAddDependencies": "cuGraphAddDependencies_v2",
    "cuGraphRemoveDependencies": "cuGraphRemoveDependencies_v2",
    "cuGraphGetEdges": "cuGraphGetEdges_v2",
    "cuGraphNodeGetDependencies": "cuGraphNodeGetDependencies_v2",
    "cuGraphNodeGetDependentNodes": "cuGraphNodeGetDependentNodes_v2",
    "cuStreamGetCaptureInfo": "cuStreamGetCaptureInfo_v3",
    "cuStreamUpdateCaptureDependencies": "cuStreamUpdateCaptureDependencies_v2",
}

#: Of those, the calls that take edge data, and its position: CUDA 13 takes None for
#: "no edge data", 12.x's ``_v2`` may insist on a list as long as the dependencies
#: (cuGraphAddNode_v2 does), so None goes to the 12.x function without the argument.
_EDGE_DATA_ARG = {
    "cuGraphAddNode": 2,
    "cuGraphAddDependencies": 3,
    "cuGraphRemoveDependencies": 3,
    "cuStreamUpdateCaptureDependencies": 2,
}

_VERSION = r"(\d+)\.(\d+)(?:\.(\d+))?"
_VERSION_FILE = r"""__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]"""


class ToolkitNotFoundError(RuntimeError):
    """No usable CUDA compiler library (NVRTC, nvJitLink or libNVVM) for this
    cuda-bindings: the message names the library, what was found and the
    ``pip install`` that fixes it."""


def _parse(text: str) -> tuple[int, int, int] | None:
    import re

    match = re.match(_VERSION, text.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


_UNREAD: Any = object()
_bindings_version: Any = _UNREAD


def bindings_version() -> tuple[int, int, int] | None:
    """The installed cuda-bindings' (major, minor, patch), or None without it.

    Read from ``cuda/bindings/_version.py`` as ``import`` would find it, without
    importing the bindings (an already imported copy answers directly). Read once
    per process (the bindings a process runs on do not change under it)."""
    global _bindings_version
    if _bindings_version is _UNREAD:
        _bindings_version = _read_bindings_version()
    found: tuple[int, int, int] | None = _bindings_version
    return found


def _read_bindings_version() -> tuple[int, int, int] | None:
    loaded = sys.modules.get("cuda.bindings")
    if loaded is not None:
        return _parse(str(loaded.__version__))
    import importlib.util
    import re

    try:
        spec = importlib.util.find_spec("cuda.bindings")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or ():
        try:
            with open(os.path.join(location, "_version.py"), encoding="utf-8") as f:
                match = re.search(_VERSION_FILE, f.read())
        except OSError:
            continue
        if match is not None:
            return _parse(match.group(1))
    import cuda.bindings  # an unknown layout: ask the package itself

    return _parse(str(cuda.bindings.__version__))


def cuda_major() -> int | None:
    """The CUDA major cuforge runs on (the installed cuda-bindings'), or None
    when cuda-bindings is not installed."""
    version = bindings_version()
    return None if version is None else version[0]


# -- header wheels ---------------------------------------------------------------------


class HeaderWheel:
    """Where one CUDA header set lies in the pip wheel that ships it: ``dist``, the
    distribution name ("nvidia-cuda-cccl-cu12"); ``include_dirs``, candidate include
    directories, site-relative, in order; ``record_prefix``, the wheel's header tree,
    for digesting its RECORD. (A slotted class, not a NamedTuple: ``typing`` costs a
    cold process ~5 ms.)"""

    __slots__ = ("dist", "include_dirs", "record_prefix")

    def __init__(self, dist: str, include_dirs: tuple[str, ...], record_prefix: str) -> None:
        self.dist = dist
        self.include_dirs = include_dirs
        self.record_prefix = record_prefix

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HeaderWheel):
            return NotImplemented
        return (self.dist, self.include_dirs, self.record_prefix) == (
            other.dist, other.include_dirs, other.record_prefix
        )  # fmt: skip

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"HeaderWheel({self.dist!r}, {self.include_dirs!r}, {self.record_prefix!r})"


_CU13 = "nvidia/cu13/include"
_CU12 = "nvidia/cu12/include"
_HEADER_WHEELS: dict[int, dict[str, HeaderWheel]] = {
    13: {
        "runtime": HeaderWheel("nvidia-cuda-runtime", (_CU13,), _CU13),
        "crt": HeaderWheel("nvidia-cuda-crt", (_CU13,), _CU13),
        "cccl": HeaderWheel("nvidia-cuda-cccl", (_CU13 + "/cccl",), _CU13),
    },
    12: {
        "runtime": HeaderWheel(
            "nvidia-cuda-runtime-cu12", (_CU12, "nvidia/cuda_runtime/include"), ""
        ),
        # 12.x ships crt/ with nvcc (beside libNVVM), not in a wheel of its own.
        "crt": HeaderWheel("nvidia-cuda-nvcc-cu12", (_CU12, "nvidia/cuda_nvcc/include"), ""),
        "cccl": HeaderWheel(
            "nvidia-cuda-cccl-cu12", (_CU12 + "/cccl", "nvidia/cuda_cccl/include"), ""
        ),
    },
}


def header_wheel(name: str, major: int | None) -> HeaderWheel | None:
    """The wheel of header set ``name`` ("runtime", "crt", "cccl") for CUDA ``major``;
    None for an unsupported major. An empty ``record_prefix`` means: the include
    directory found."""
    return _HEADER_WHEELS.get(major or 0, {}).get(name)


# -- the driver ------------------------------------------------------------------------

_driver_lock = threading.Lock()
_driver: ModuleType | None = None


def _driver_namespace() -> ModuleType:
    global _driver
    with _driver_lock:
        if _driver is None:
            from cuda.bindings import driver as real

            if cuda_major() == 12:
                ns = type(sys)(real.__name__, real.__doc__)  # a module (types.ModuleType)
                ns.__dict__.update(real.__dict__)
                for name, v2 in RENAMED_ON_12.items():
                    fn = getattr(real, v2)
                    if name in _EDGE_DATA_ARG:
                        fn = _edge_data_optional(getattr(real, name), fn, _EDGE_DATA_ARG[name])
                    setattr(ns, name, fn)
                _driver = ns
            else:
                _driver = real
        return _driver


class _LazyBindingsDriver:
    """``cuda.bindings.driver``, imported on the first attribute read (~50 ms of
    imports a script that only compiles never pays). Each name read is then kept on
    this object, so later reads cost what a module attribute costs. Runtime modules
    bind it as ``driver`` (type checkers see the real module)."""

    def __getattr__(self, name: str) -> Any:
        from cuda.bindings import driver as real

        value = getattr(real, name)
        self.__dict__[name] = value
        return value


#: ``cuda.bindings.driver`` on first use (see ``_LazyBindingsDriver``).
bindings_driver: Any = _LazyBindingsDriver()


def _edge_data_optional(v1: Any, v2: Any, index: int) -> Any:
    """``v2`` with CUDA 13's meaning of None edge data: ``v1`` without the argument."""

    def call(*args: Any) -> Any:
        if args[index] is None:
            return v1(*args[:index], *args[index + 1 :])
        return v2(*args)

    call.__name__ = v2.__name__
    call.__doc__ = v2.__doc__
    return call


def __getattr__(name: str) -> Any:
    # ``from cuforge._cuda import driver`` resolves here, so importing this module
    # alone loads nothing.
    if name == "driver":
        return _driver_namespace()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- the compiler libraries ------------------------------------------------------------

_LIBRARIES = {
    "nvrtc": "NVRTC",
    "nvJitLink": "nvJitLink",
    "nvvm": "libNVVM",
    "nvfatbin": "nvFatbin",
}
_VERSION_CALL = {"nvrtc": "nvrtcVersion", "nvJitLink": "nvJitLinkVersion"}
_ready: set[str] = set()


def _install_hint(major: int | None) -> str:
    if major in EXTRAS:
        other = 12 if major == 13 else 13
        return (
            f"install the CUDA {major} compiler wheels with pip install '{EXTRAS[major]}' "
            f"(or '{EXTRAS[other]}' to run on CUDA {other}), or set CUDA_HOME to a CUDA "
            f"{major} toolkit"
        )
    return "pip install 'cuforge[cu13]' (CUDA 13) or 'cuforge[cu12]' (CUDA 12)"


def require(library: str) -> None:
    """Check, once per process, that ``library`` ("nvrtc", "nvJitLink", "nvvm",
    "nvfatbin") is
    there for this cuda-bindings: its Python module imports, cuda.pathfinder loads
    the library, and (NVRTC, nvJitLink) its major is the bindings' major.

    Raises:
        ToolkitNotFoundError: with what was found and what to install.
    """
    if library in _ready:
        return
    what = _LIBRARIES[library]
    version = bindings_version()
    if version is None:
        raise ToolkitNotFoundError(
            f"cuforge needs cuda-bindings to compile with {what}: {_install_hint(None)}"
        )
    major = version[0]
    shown = ".".join(map(str, version))
    module = library.lower()
    import importlib.util

    if importlib.util.find_spec(f"cuda.bindings.{module}") is None:
        raise ToolkitNotFoundError(
            f"cuda-bindings {shown} has no cuda.bindings.{module}: {what} needs "
            f"cuda-bindings 12.9 or newer (pip install '{EXTRAS.get(major, EXTRAS[13])}')"
        )
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        path = load_nvidia_dynamic_lib(library).abs_path
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ToolkitNotFoundError(
            f"cuforge found no {what} library for cuda-bindings {shown} (CUDA {major}): "
            f"{_install_hint(major)}. (cuda.pathfinder: {reason})"
        ) from None
    symbol = _VERSION_CALL.get(library)
    if symbol is not None and path:
        found = _library_major(path, symbol)
        if found is not None and found != major:
            raise ToolkitNotFoundError(
                f"{what} at {path} is CUDA {found} but cuda-bindings is {shown}: the "
                f"two must be of one major; {_install_hint(major)}."
            )
    _ready.add(library)


def _library_major(path: str, symbol: str) -> int | None:
    import ctypes

    try:
        major, minor = ctypes.c_int(), ctypes.c_int()
        status = getattr(ctypes.CDLL(path), symbol)(ctypes.byref(major), ctypes.byref(minor))
    except (OSError, AttributeError):
        return None
    return int(major.value) if status == 0 else None


__all__ = [
    "EXTRAS",
    "RENAMED_ON_12",
    "SUPPORTED_MAJORS",
    "HeaderWheel",
    "ToolkitNotFoundError",
    "bindings_version",
    "cuda_major",
    "header_wheel",
    "require",
]
