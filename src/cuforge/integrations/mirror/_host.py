"""What native files a JIT built depend on, about this host: its GPUs, its OS and
machine, and -- for code built with ``-march=native`` by the host's compiler -- its
CPU, C library and C++ compiler. Read from files and one compiler call, never from a
GPU driver; each answer is a short string a mirror's keys name, so hosts that differ
in any of these never share such files.
"""

from __future__ import annotations

import os
import sys

__all__ = ["gpu_identity", "host_identity", "platform_tag"]


def gpu_identity(root: str = "/proc/driver/nvidia/gpus") -> str | None:
    """The GPUs of this host, without the driver: the sorted distinct ``Model:``
    names the NVIDIA kernel module lists under ``root`` (``+``-joined), or None when
    there are none (no NVIDIA driver loaded, not Linux). A few small file reads;
    ``CUDA_VISIBLE_DEVICES`` is not identity and is ignored (every GPU of the host
    counts, so a host with mixed GPUs shares only with hosts of the same mix)."""
    models: set[str] = set()
    try:
        names = os.listdir(root)
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(root, name, "information"), encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key.strip() == "Model" and value.strip():
                        models.add(value.strip())
        except OSError:
            continue
    return "+".join(sorted(models)) or None


_hosts: dict[str, str | None] = {}


def host_identity(
    cxx: str | None = None, cpuinfo: str = "/proc/cpuinfo", gpus: str | None = None
) -> str | None:
    """This host as native code built here depends on it: ``host-<16 hex>``, a digest
    of the CPU (model and feature flags from ``cpuinfo``: what ``-march=native``
    targets), the C library's version, the C++ compiler ``cxx`` (default ``g++``) as
    its ``--version`` first line says, and the GPUs (:func:`gpu_identity`, or none:
    ``gpus`` overrides it). None when the CPU cannot be read (not Linux): a
    host-dependent mirror then stays off. Once per process and compiler (the
    compiler is run once, 10 s at most; one that cannot be run counts as none)."""
    cxx = cxx or "g++"
    memo = f"{cxx}\0{cpuinfo}\0{gpus}"
    if memo in _hosts:
        return _hosts[memo]
    cpu = _cpu(cpuinfo)
    identity = None
    if cpu is not None:
        try:
            libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
        except (AttributeError, ValueError, OSError):  # not glibc, or not POSIX
            libc = ""
        parts = [cpu, f"libc={libc}", f"cxx={_compiler(cxx)}", f"gpus={gpus or gpu_identity()}"]
        import hashlib

        identity = "host-" + hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    _hosts[memo] = identity
    return identity


def _cpu(path: str) -> str | None:
    """The first processor's model and features from ``/proc/cpuinfo`` (x86: vendor,
    family, model, model name, flags; Arm: implementer, part, features)."""
    keys = ("vendor_id", "cpu family", "model", "model name", "flags", "cpu implementer",
            "cpu architecture", "cpu part", "features", "isa", "cpu")  # fmt: skip
    found: list[str] = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if found:
                        break  # one processor is enough: a host's CPUs are alike
                    continue
                key, sep, value = line.partition(":")
                key = key.strip().lower()
                if sep and key in keys:
                    listed = key in ("flags", "features", "isa")
                    found.append(
                        f"{key}={' '.join(sorted(value.split())) if listed else value.strip()}"
                    )
    except OSError:
        return None
    return "\n".join(found) or None


def _compiler(cxx: str) -> str:
    import subprocess

    try:
        out = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=10.0, check=False
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return "none"
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else "none"


def platform_tag() -> str:
    """The host's OS and machine (``linux-x86_64``): native files are valid on these
    only, so every key names them."""
    return f"{sys.platform}-{os.uname().machine if hasattr(os, 'uname') else 'unknown'}"
