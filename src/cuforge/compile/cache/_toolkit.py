"""The CUDA headers every C++ compile can include: the one place that decides them.

Three header sets go on NVRTC's search path, after each program's own
``include_path`` (NVRTC searches ``-I`` directories in order, so a user's header of
the same name wins): the CUDA runtime headers (``cuda_fp16.h``, ``cuda_bf16.h``,
``cuda_runtime.h``, ...), ``crt/`` and CCCL (``cub/``, ``thrust/``, ``cuda/std/``).

Where they come from (``CUFORGE_TOOLKIT_HEADERS``, read once per process):

- unset, ``""``, ``1``, ``auto``: each set is taken from the first of
  1. the header wheel of the installed cuda-bindings' CUDA major (13:
     ``nvidia-cuda-runtime``, ``nvidia-cuda-crt``, ``nvidia-cuda-cccl``; 12: their
     ``-cu12`` twins, with ``crt/`` from ``nvidia-cuda-nvcc-cu12``; layouts in
     ``cuforge._cuda``) in the first ``sys.path`` entry that has it -- the wheels
     ``cuforge[cu12]`` / ``[cu13]`` install beside the NVRTC wheel;
  2. ``cuda.pathfinder``'s search: pip wheels of other layouts, ``$CONDA_PREFIX``,
     ``$CUDA_PATH``/``$CUDA_HOME``, then system install directories.
- ``0``, ``off``, ``no``, ``false``, ``none``: no directories.
- any other value: the root of a CUDA toolkit (``<root>/include``,
  ``<root>/include/cccl``), and nothing else. A root without ``cuda_runtime.h``
  is a ValueError at the first C++ compile or key.

Identity: each set found contributes how it was found (wheel or directory) and a
digest of its content -- for a wheel, its name, version and the RECORD hashes of
its header files; for a directory, its version headers (``CUDART_VERSION``,
``CCCL_VERSION``), the headers kernels include most, the size of each file at the
top of the set and the toolkit's ``version.json``. So upgrading CCCL or the runtime
headers changes every C++ cache key, while a hit only reads the identity computed
at the first call (no file is looked at again). Locations are not part of it: a
cache filled from one virtual environment serves another with the same headers.

Not noticed: a header edited in place after its wheel or toolkit was installed
(put headers you edit on ``include_path``, where the key tracks them).

Across processes: the identity and the include directories are kept by
``_identity_store`` with the directories and files this module reads as witnesses,
so a later process does not search and digest again unless one of them changed.
A set not found in auto mode is kept too, with every place the search looked for it
as a witness (``_search_witnesses``: its wheel's paths, cuda.pathfinder's
site-packages, conda, ``$CUDA_PATH``/``$CUDA_HOME`` and system-loader searches), so
installing it anywhere it would be found is a change; where those places cannot all
be listed (not Linux, another cuda.pathfinder, a loader that does not report its
search) such an answer is not kept and every process searches again.
What a compile is given (``toolkit_include_flags``) is always located afresh, and a
compile through a cache is stored only when that agrees with what its key named.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections import namedtuple

from cuforge import _cuda
from cuforge._hashing import blake2b
from cuforge.compile.cache import _identity_store

TYPE_CHECKING = False  # typing is not imported at run time: a first compile(cache=) paid ~4 ms
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: The environment variable that turns the headers off or points to a toolkit.
ENV_VAR = "CUFORGE_TOOLKIT_HEADERS"

_OFF = frozenset({"0", "off", "no", "false", "none"})
_AUTO = frozenset({"", "1", "auto", "on", "yes", "true"})
_FORMAT = b"toolkit-headers/1"
_NONE = b"toolkit-headers:none"


class _Spec(
    namedtuple("_Spec", ["name", "marker", "pathfinder", "toolkit_dirs", "version_files", "listed"])
):
    """One header set: how to recognise it, find it and fingerprint it."""

    __slots__ = ()

    name: str
    marker: str  # a file every copy of the set has, relative to its directory
    pathfinder: str  # cuda.pathfinder's name for the directory that holds it
    toolkit_dirs: tuple[str, ...]  # candidates below a toolkit root, in order
    version_files: tuple[str, ...]  # digested whole when found in a directory
    listed: tuple[str, ...]  # subdirectories whose file names and sizes are digested


_SPECS = (
    _Spec(
        "runtime",
        "cuda_runtime.h",
        "cudart",
        ("include", "."),
        (
            "cuda_runtime_api.h",
            "cuda_runtime.h",
            "cuda_fp16.h",
            "cuda_fp16.hpp",
            "cuda_bf16.h",
            "cuda_bf16.hpp",
        ),
        (".",),
    ),
    _Spec(
        "crt",
        "crt/host_config.h",
        "cudart",
        ("include", "."),
        ("crt/host_config.h", "crt/host_defines.h"),
        ("crt",),
    ),
    _Spec(
        "cccl",
        "cuda/std/version",
        "cccl",
        ("include/cccl", "include", "cccl", "."),
        ("cuda/std/__cccl/version.h", "cuda/std/version", "cub/version.cuh", "thrust/version.h"),
        ("cub", "thrust", "cuda/std"),
    ),
)


class HeaderSet(
    namedtuple("HeaderSet", ["name", "directory", "source", "package", "version", "digest"])
):
    """One header set in use: where it is, where it came from, what version."""

    __slots__ = ()

    name: str  #: "runtime", "crt" or "cccl"
    directory: str  #: absolute include directory handed to NVRTC
    source: str  #: "wheel", "CUFORGE_TOOLKIT_HEADERS", or cuda.pathfinder's found_via
    package: str  #: "nvidia-cuda-cccl 13.3.5.0.6" for a wheel, else ""
    version: str  #: parsed from the headers ("13.5", "3.5.0"), "" when unknown
    digest: str  #: hex digest of the set's content (see the module docstring)


class ToolkitHeaders(
    namedtuple("ToolkitHeaders", ["setting", "mode", "sets", "missing", "include_dirs", "identity"])
):
    """What ``cuforge.utils.toolkit_headers()`` reports; ``str()`` renders a table."""

    __slots__ = ()

    setting: str  #: the value of CUFORGE_TOOLKIT_HEADERS ("" when unset)
    mode: str  #: "auto", "off" or "toolkit"
    sets: tuple[HeaderSet, ...]  #: the sets found, in search-path order
    missing: tuple[str, ...]  #: names of the sets not found
    include_dirs: tuple[str, ...]  #: the directories appended to NVRTC's flags
    identity: bytes  #: what the cache key pins

    @property
    def identity_digest(self) -> str:
        """The identity's short digest (:func:`identity_digest`): what ``cuforge cache
        show`` prints after ``headers:`` for an entry these headers compiled."""
        return identity_digest(self.identity)

    def __str__(self) -> str:
        shown = f"{ENV_VAR}={self.setting!r}" if self.setting else f"{ENV_VAR} unset"
        lines = [f"CUDA headers for C++ programs ({shown}: {self.mode})"]
        rows = [(s.name, s.version or "?", s.package or s.source, s.directory) for s in self.sets]
        rows += [(name, "-", "not found", "") for name in self.missing]
        widths = [max(len(r[i]) for r in rows) for i in range(3)] if rows else []
        for row in rows:
            cells = [row[i].ljust(widths[i]) for i in range(3)]
            lines.append("  " + "  ".join([*cells, row[3]]).rstrip())
        if not rows:
            lines.append("  (none: programs see only their own include_path)")
        lines.append(f"  identity {self.identity_digest}")
        return "\n".join(lines)


def identity_digest(identity: bytes) -> str:
    """The short digest of a header-set identity (12 hex digits) that a user sees: in
    ``str(toolkit_headers())`` and in each entry's recorded compiler (``...|headers:``).
    Display only -- the cache key pins the identity's bytes, not this -- and the form
    entries already stored record, so it cannot change without them disagreeing."""
    return blake2b(identity, digest_size=6).hexdigest()


def _digest_files(directory: str, spec: _Spec) -> str:
    h = blake2b(digest_size=16)
    for rel in spec.version_files:
        try:
            with open(os.path.join(directory, rel), "rb") as f:
                data = f.read()
        except OSError:
            continue
        h.update(b"file\0" + rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    for sub in spec.listed:
        try:
            entries = sorted(os.scandir(os.path.join(directory, sub)), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            try:
                size = entry.stat().st_size if entry.is_file() else -1
            except OSError:
                continue
            h.update(f"list\0{sub}/{entry.name}\0{size}\n".encode())
    if spec.name == "runtime":
        # A toolkit records its components' exact versions beside include/ (or
        # three levels up, for the targets/<arch>/include layout).
        for up in ("..", "../../.."):
            try:
                with open(os.path.join(directory, up, "version.json"), "rb") as f:
                    h.update(b"version.json\0" + f.read())
                break
            except OSError:
                continue
    return h.hexdigest()


def _digest_wheel(dist_info: str, prefix: str) -> str | None:
    """The wheel's own hashes of its files under ``prefix``, or None without a RECORD.

    RECORD hashes are the wheel's, not the installer's: equal wheels installed by
    pip or uv, anywhere, digest equal."""
    try:
        with open(os.path.join(dist_info, "RECORD"), encoding="utf-8") as f:
            record = f.read()
    except OSError:
        return None
    lines = sorted(line for line in record.splitlines() if line.startswith(prefix + "/"))
    if not lines:
        return None
    return blake2b("\n".join(lines).encode(), digest_size=16).hexdigest()


def _find_wheel(name: str, listings: dict[str, list[str]]) -> tuple[str, str, str] | None:
    """(site directory, version, dist-info path) of ``name`` in the first ``sys.path``
    entry that has it -- the copy ``import`` would see.

    Read straight from the ``<name>-<version>.dist-info`` directory names:
    importlib.metadata would cost ~25 ms of imports on a cache-hit process."""
    prefix = name.replace("-", "_").lower() + "-"
    for entry in sys.path:
        entry = entry or os.getcwd()
        names = listings.get(entry)
        if names is None:
            try:
                names = listings[entry] = sorted(os.listdir(entry))
            except OSError:
                names = listings[entry] = []
        for item in names:
            low = item.lower()
            if low.startswith(prefix) and low.endswith(".dist-info"):
                version = item[len(prefix) : -len(".dist-info")]
                return entry, version, os.path.join(entry, item)
    return None


_DEFINE = r"#\s*define\s+{}\s+\(?\s*(\d+)"


def _version(directory: str, name: str) -> str:
    """A readable version of the set in ``directory``, or ""."""
    try:
        if name == "runtime":
            with open(os.path.join(directory, "cuda_runtime_api.h"), encoding="latin-1") as f:
                m = re.search(_DEFINE.format("CUDART_VERSION"), f.read())
            if m:
                v = int(m.group(1))
                return f"{v // 1000}.{v % 1000 // 10}"
        elif name == "cccl":
            with open(
                os.path.join(directory, "cuda/std/__cccl/version.h"), encoding="latin-1"
            ) as f:
                m = re.search(_DEFINE.format("CCCL_VERSION"), f.read())
            if m:
                v = int(m.group(1))
                return f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}"
    except OSError:
        pass
    return ""


def _from_wheel(spec: _Spec, listings: dict[str, list[str]], major: int) -> HeaderSet | None:
    wheel = _cuda.header_wheel(spec.name, major)
    if wheel is None:
        return None
    found = _find_wheel(wheel.dist, listings)
    if found is None:
        return None
    site, version, dist_info = found
    for rel in wheel.include_dirs:
        directory = os.path.abspath(os.path.join(site, rel))
        if os.path.isfile(os.path.join(directory, spec.marker)):
            break
    else:
        return None
    # All of the wheel's headers (nvidia/<dir>/include): CCCL's wheel also puts nv/
    # beside the runtime's.
    tree = "/".join(rel.split("/")[:3])
    digest = _digest_wheel(dist_info, tree) or _digest_files(directory, spec)
    shown = _version(directory, spec.name) or version
    return HeaderSet(spec.name, directory, "wheel", f"{wheel.dist} {version}", shown, digest)


def _from_pathfinder(spec: _Spec) -> HeaderSet | None:
    try:
        import cuda.pathfinder as pf

        locate = getattr(pf, "locate_nvidia_header_directory", None)
        if locate is not None:
            found = locate(spec.pathfinder)
            directory, source = (found.abs_path, found.found_via) if found else (None, "")
        else:  # cuda-pathfinder before 1.4 reports only the directory
            directory, source = pf.find_nvidia_header_directory(spec.pathfinder), "pathfinder"
    except Exception:  # an unknown name or a broken search finds nothing
        return None
    if not directory:
        return None
    return _from_directory(spec, directory, source)


def _from_directory(spec: _Spec, directory: str, source: str) -> HeaderSet | None:
    directory = os.path.abspath(directory)
    if not os.path.isfile(os.path.join(directory, spec.marker)):
        return None
    version = _version(directory, spec.name)
    return HeaderSet(spec.name, directory, source, "", version, _digest_files(directory, spec))


def _from_toolkit(spec: _Spec, root: str) -> HeaderSet | None:
    for rel in spec.toolkit_dirs:
        found = _from_directory(spec, os.path.join(root, rel), ENV_VAR)
        if found is not None:
            return found
    return None


def _locate(setting: str) -> ToolkitHeaders:
    value = setting.strip()
    if value.lower() in _OFF:
        return _report(setting, "off", [], [])
    sets: list[HeaderSet] = []
    missing: list[str] = []
    if value.lower() in _AUTO:
        mode = "auto"
        listings: dict[str, list[str]] = {}
        major = _cuda.cuda_major() or 0
        for spec in _SPECS:
            found = _from_wheel(spec, listings, major) or _from_pathfinder(spec)
            if found is None:
                missing.append(spec.name)
            else:
                sets.append(found)
    else:
        mode = "toolkit"
        root = os.path.abspath(os.path.expanduser(value))
        for spec in _SPECS:
            found = _from_toolkit(spec, root)
            if found is None:
                missing.append(spec.name)
            else:
                sets.append(found)
        if "runtime" in missing:
            raise _no_toolkit(setting, root)
    return _report(setting, mode, sets, missing)


def _no_toolkit(setting: str, root: str) -> ValueError:
    return ValueError(
        f"{ENV_VAR}={setting!r}: no cuda_runtime.h under {root}/include; set it to "
        "a CUDA toolkit root, to 0 for no CUDA headers, or unset it"
    )


def check_setting() -> None:
    """ValueError -- the one the first C++ compile or key would raise -- when
    ``CUFORGE_TOOLKIT_HEADERS`` names a directory that holds no toolkit; a few
    ``stat`` calls, nothing located or digested (for a command line that says so
    before it compiles anything). Unset, ``auto`` or ``off``: nothing to check."""
    setting = os.environ.get(ENV_VAR, "")
    value = setting.strip()
    if value.lower() in _OFF or value.lower() in _AUTO:
        return
    root = os.path.abspath(os.path.expanduser(value))
    runtime = _SPECS[0]  # the set a toolkit root must hold (as _locate requires)
    if not any(os.path.isfile(os.path.join(root, d, runtime.marker)) for d in runtime.toolkit_dirs):
        raise _no_toolkit(setting, root)


def _report(setting: str, mode: str, sets: list[HeaderSet], missing: list[str]) -> ToolkitHeaders:
    dirs: list[str] = []
    for s in sets:
        if s.directory not in dirs:
            dirs.append(s.directory)
    if sets:
        parts = [_FORMAT]
        for s in sets:
            kind = "wheel" if s.source == "wheel" else "dir"
            fields = (s.name, kind, s.package, s.digest, str(dirs.index(s.directory)))
            parts.extend(len(f).to_bytes(4, "little") + f.encode() for f in fields)
        identity = b"".join(parts)
    else:
        identity = _NONE
    return ToolkitHeaders(setting, mode, tuple(sets), tuple(missing), tuple(dirs), identity)


_lock = threading.Lock()
_state: tuple[ToolkitHeaders, tuple[bytes, ...]] | None = None
_kept: tuple[bytes, tuple[str, ...]] | None = None  # (identity, include dirs) from disk
_FACT = "toolkit-headers"


def _resolved() -> tuple[ToolkitHeaders, tuple[bytes, ...]]:
    """The process's one answer. Never recomputed once given, so the headers a
    compile gets are always the ones its cache key named."""
    global _state
    state = _state
    if state is None:
        with _lock:
            state = _state
            if state is None:
                report = _locate(os.environ.get(ENV_VAR, ""))
                flags = tuple(f"--include-path={d}".encode() for d in report.include_dirs)
                state = _state = (report, flags)
    return state


def _reset() -> None:
    """Forget the answer (tests only: a compile racing this could mismatch its key)."""
    global _state, _kept
    with _lock:
        _state = _kept = None
    _identity_store.forget(_FACT)


def _witnesses(report: ToolkitHeaders) -> list[str]:
    """Every path whose change could change ``report``: in auto mode, the names of
    the header wheels' ``.dist-info`` in each import path entry (what ``_find_wheel``
    lists there: a listing witness, so a working directory that gains other files
    keeps the record), and the ``RECORD`` of each wheel found; the site-packages
    directories; each set's directory, marker, version files, listed subdirectories
    and version.json; in auto mode, for each set not found, every place the search
    looked for it (``_search_witnesses``). Empty (never kept on disk) when those
    places cannot all be listed, or when no set was found at all. (With a set
    missing, each import path entry is a witness whole, as before listings: an
    install there of what finds the set is a change.)"""
    if not report.sets:
        return []
    paths: list[str] = []
    if report.mode == "auto":
        major = _cuda.cuda_major() or 0
        wheels = [w for w in (_cuda.header_wheel(s.name, major) for s in _SPECS) if w]
        prefixes = sorted({w.dist.replace("-", "_").lower() + "-" for w in wheels})
        for entry in sys.path:
            for prefix in prefixes:
                paths.append(_identity_store.listing(entry or os.curdir, prefix, ".dist-info"))
        if report.missing:  # whatever an entry gains could be the package that finds it
            paths += [os.path.abspath(p or os.curdir) for p in sys.path]
        listings: dict[str, list[str]] = {}
        for w in wheels:
            found_wheel = _find_wheel(w.dist, listings)
            if found_wheel is not None:
                paths.append(os.path.join(found_wheel[2], "RECORD"))
    paths += _identity_store.site_witnesses()
    specs = {s.name: s for s in _SPECS}
    for found in report.sets:
        spec, d = specs[found.name], found.directory
        paths += [d, os.path.join(d, spec.marker)]
        paths += [os.path.join(d, rel) for rel in (*spec.version_files, *spec.listed)]
        if spec.name == "runtime":
            paths += [os.path.join(d, up, "version.json") for up in ("..", "../../..")]
    if report.mode == "toolkit":
        root = os.path.abspath(os.path.expanduser(report.setting.strip()))
        for spec in _SPECS:
            paths += [os.path.join(root, rel, spec.marker) for rel in spec.toolkit_dirs]
    elif report.missing:
        from cuforge.compile.cache import _search_witnesses  # the rare case: import it then

        major = _cuda.cuda_major() or 0
        for name in report.missing:
            spec = specs[name]
            wheel = _cuda.header_wheel(name, major)
            searched = _search_witnesses.missing_set(spec.marker, spec.pathfinder, wheel)
            if searched is None:
                return []
            paths += searched
    return paths


def _probe() -> tuple[tuple[bytes, ...], Callable[[], list[str]]]:
    report = _resolved()[0]
    values = (report.identity, *(os.fsencode(d) for d in report.include_dirs))
    return values, lambda: _witnesses(report)  # listed only when a record is written


def _identity_and_dirs() -> tuple[bytes, tuple[str, ...]]:
    """(identity, include dirs): this process's located answer once there is one,
    else the one kept on disk while its witnesses hold, else located now."""
    global _kept
    state = _state
    if state is not None:
        return state[0].identity, state[0].include_dirs
    kept = _kept
    if kept is None:
        values = _identity_store.remembered(_FACT, _probe)
        kept = _kept = (values[0], tuple(os.fsdecode(d) for d in values[1:]))
    return kept


def toolkit_include_dirs() -> tuple[str, ...]:
    """The absolute include directories cuforge appends for NVRTC, in order
    (runtime, crt, CCCL; duplicates dropped); empty when turned off or none found.

    Located once per process. Raises ValueError when CUFORGE_TOOLKIT_HEADERS names
    a directory that holds no toolkit."""
    return _identity_and_dirs()[1]


def toolkit_include_flags() -> tuple[bytes, ...]:
    """``--include-path=DIR`` for each of ``toolkit_include_dirs()``, as NVRTC takes them."""
    return _resolved()[1]


def toolkit_identity() -> bytes:
    """Stable bytes naming the header sets in use (see the module docstring);
    ``b"toolkit-headers:none"`` when there are none. Computed once per process (or
    taken from ``_identity_store`` while nothing it depends on changed)."""
    return _identity_and_dirs()[0]


def toolkit_headers() -> ToolkitHeaders:
    """The CUDA header sets C++ programs compile with: where each came from, its
    version and directory, the sets not found, and the identity the cache key pins.

    ``print(toolkit_headers())`` shows a table. The answer is the process's first
    (CUFORGE_TOOLKIT_HEADERS is read once). Raises ValueError when that variable
    names a directory that holds no toolkit.
    """
    return _resolved()[0]


def __getattr__(name: str) -> Any:
    if name == "CUDA_MAJOR":  # the header wheels' major follows the bindings'
        return _cuda.cuda_major()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENV_VAR",
    "HeaderSet",
    "ToolkitHeaders",
    "check_setting",
    "identity_digest",
    "toolkit_headers",
    "toolkit_identity",
    "toolkit_include_dirs",
    "toolkit_include_flags",
]
