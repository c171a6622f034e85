"""Compiler identity: the exact build of each compiler a cache key pins.

Guarantee: two processes get the same identity bytes exactly when they load the
same build of the library -- same version and same GNU build id (read from the
shared object's ELF notes), not merely the same major.minor. The identity does
not depend on where the library is installed, so a cache filled on a CPU-only CI
box is shared by a GPU fleet with the same toolkit build.

Probes run once per process (``functools.cache``), and their results are kept on
disk between processes by ``_identity_store``: a later process takes them from there
after checking that none of the libraries (or the places they are searched) changed,
which saves it loading cuda.pathfinder and the libraries. A probe that fails yields a
distinct but stable identity (``b"unavailable:<ExceptionType>"``): keys fail
closed -- they never collide with a working compiler's keys -- and stay
deterministic, so the failure is visible as a miss rather than as a wrong hit.
"""

from __future__ import annotations

import functools
import os
import struct
import threading
from collections.abc import Callable

from cuforge._hashing import blake2b
from cuforge.compile.cache import _identity_store

_PT_NOTE = 4
_NT_GNU_BUILD_ID = 3
_SAMPLE = 1 << 20


def _elf_build_id(path: str) -> bytes | None:
    """The NT_GNU_BUILD_ID of a 64-bit little-endian ELF file, or None."""
    with open(path, "rb") as f:
        header = f.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return None
        (phoff,) = struct.unpack_from("<Q", header, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
        for i in range(phnum):
            (p_type,) = struct.unpack_from("<I", table, i * phentsize)
            if p_type != _PT_NOTE:
                continue
            (offset,) = struct.unpack_from("<Q", table, i * phentsize + 8)
            (size,) = struct.unpack_from("<Q", table, i * phentsize + 32)
            f.seek(offset)
            notes = f.read(size)
            pos = 0
            while pos + 12 <= len(notes):
                namesz, descsz, ntype = struct.unpack_from("<III", notes, pos)
                pos += 12
                name = notes[pos : pos + namesz]
                pos += (namesz + 3) & ~3
                desc = notes[pos : pos + descsz]
                pos += (descsz + 3) & ~3
                if ntype == _NT_GNU_BUILD_ID and name.rstrip(b"\0") == b"GNU":
                    return desc
    return None


def library_fingerprint(path: str) -> bytes:
    """A path-independent fingerprint of one shared library build.

    The GNU build id where the file has one; otherwise (Windows DLLs, stripped
    notes) the file size and a digest of its first MiB.
    """
    paths = getattr(_probing, "paths", None)
    if paths is not None:
        paths.append(path)
    build_id = _elf_build_id(path)
    if build_id:
        return b"build-id:" + build_id.hex().encode()
    size = os.stat(path).st_size
    with open(path, "rb") as f:
        head = blake2b(f.read(_SAMPLE), digest_size=16).hexdigest()
    return f"size:{size}:head:{head}".encode()


# The libraries a probe on this thread loaded: the identity store's witnesses.
_probing = threading.local()


def _loaded_library(name: str) -> str:
    # cuda-bindings loads its libraries through this same (cached) pathfinder call,
    # so the file fingerprinted here is the one that compiles.
    from cuda.pathfinder import load_nvidia_dynamic_lib

    path: str = load_nvidia_dynamic_lib(name).abs_path
    paths = getattr(_probing, "paths", None)
    if paths is not None:
        paths.append(path)
    return path


def _call_version(path: str, symbol: str, count: int) -> tuple[int, ...]:
    """Call ``int symbol(int*, ...)`` of an already-loaded library.

    ctypes instead of cuda.bindings: importing the bindings costs ~80 ms, which a
    process whose first compile is a cache hit need not pay.
    """
    import ctypes  # on use: a hit served from the identity store never loads it

    outs = [ctypes.c_int() for _ in range(count)]
    status = getattr(ctypes.CDLL(path), symbol)(*(ctypes.byref(o) for o in outs))
    if status != 0:
        raise RuntimeError(f"{symbol} failed with status {status}")
    return tuple(o.value for o in outs)


def _fail_closed(probe: Callable[[], bytes], persist: bool = True) -> Callable[[], bytes]:
    def measured() -> tuple[tuple[bytes, ...], list[str]]:
        _probing.paths = []
        try:
            identity = probe()
            paths = _probing.paths
        finally:
            _probing.paths = None
        return (identity,), [w for p in paths for w in _identity_store.library_witnesses(p)]

    @functools.cache
    def wrapper() -> bytes:
        try:
            if not persist:
                return probe()
            return _identity_store.remembered(probe.__name__, measured)[0]
        except Exception as exc:
            return b"unavailable:" + type(exc).__name__.encode()

    wrapper.__doc__ = probe.__doc__
    wrapper.__name__ = probe.__name__
    return wrapper


@_fail_closed
def nvrtc_identity() -> bytes:
    """NVRTC version plus the build of libnvrtc and its builtins library."""
    path = _loaded_library("nvrtc")
    major, minor = _call_version(path, "nvrtcVersion", 2)
    parts = [f"nvrtc:{major}.{minor}".encode(), library_fingerprint(path)]
    # libnvrtc loads its builtins from beside itself; a mismatched pair changes output.
    directory = os.path.dirname(path)
    for entry in sorted(os.listdir(directory)):
        if "nvrtc-builtins" in entry and not entry.endswith(".alt.so"):
            parts.append(library_fingerprint(os.path.join(directory, entry)))
            break
    return b"|".join(parts)


@_fail_closed
def nvrtc_supported_archs() -> bytes:
    """NVRTC's version and the compute capabilities it compiles for
    (``nvrtcGetSupportedArchs``), as ``b"13.5:75,80,...,121"``: kept like the identity,
    so a command that checks an arch before compiling pays a record read, not the
    ~80 ms of importing the bindings."""
    import ctypes  # on use, as _call_version

    path = _loaded_library("nvrtc")
    major, minor = _call_version(path, "nvrtcVersion", 2)
    (count,) = _call_version(path, "nvrtcGetNumSupportedArchs", 1)
    archs = (ctypes.c_int * count)()
    status = ctypes.CDLL(path).nvrtcGetSupportedArchs(archs)
    if status != 0:
        raise RuntimeError(f"nvrtcGetSupportedArchs failed with status {status}")
    return f"{major}.{minor}:{','.join(str(a) for a in archs)}".encode()


@_fail_closed
def nvjitlink_identity() -> bytes:
    """nvJitLink version plus the build of libnvJitLink."""
    path = _loaded_library("nvJitLink")
    major, minor = _call_version(path, "nvJitLinkVersion", 2)
    return b"|".join([f"nvjitlink:{major}.{minor}".encode(), library_fingerprint(path)])


@_fail_closed
def nvvm_identity() -> bytes:
    """libNVVM version, NVVM IR version, and the build of libnvvm."""
    path = _loaded_library("nvvm")
    version = ".".join(map(str, _call_version(path, "nvvmVersion", 2)))
    ir = ".".join(map(str, _call_version(path, "nvvmIRVersion", 4)))
    return b"|".join([f"nvvm:{version}:ir:{ir}".encode(), library_fingerprint(path)])


@functools.partial(_fail_closed, persist=False)  # the driver is not a file we can witness
def driver_identity() -> bytes:
    """The CUDA driver version (only the driver-linker path depends on it)."""
    from cuda.bindings import driver

    err, version = driver.cuDriverGetVersion()
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDriverGetVersion failed: {err}")
    return f"driver:{version}".encode()
