"""Every place the header search looked for a set it did not find (for ``_toolkit``).

A header set missing in auto mode is an answer that a later install could change:
the identity store keeps it only with a witness for each place the search would
find the set once it is there. This module lists them, for one set, exactly as
``_toolkit._locate`` and the installed ``cuda.pathfinder`` search (candidate paths
that are absent are witnesses too: the record holds only while they stay absent):

1. the header wheel: ``<entry>/<include dir>/<marker>`` in every ``sys.path``
   entry (the ``.dist-info`` names each entry lists, and the site-packages
   directories, are the caller's witnesses);
2. cuda.pathfinder's site-packages step: ``<site dir>/<wheel dir>/<header>`` for
   every site-packages directory (user site included) and wheel layout it knows;
3. ``$CONDA_PREFIX``: ``targets/`` (its listing decides the anchor), each
   ``targets/*/include`` and the include layout below the anchor;
4. ``$CUDA_PATH`` / ``$CUDA_HOME``: the include layout below it;
5. the CTK-root canary (pathfinder loads ``libcudart`` with the system loader in a
   child process and looks beside it): every file the dynamic loader tries for
   those names, as the loader itself reports them (``LD_DEBUG=libs`` in a child
   of the same interpreter and environment), ``/etc/ld.so.cache`` and
   ``/etc/ld.so.preload``, and the include layout below the toolkit root of the
   file it loads.

The environment variables these read (``CONDA_PREFIX``, ``CUDA_PATH``,
``CUDA_HOME``, ``LD_LIBRARY_PATH``, ``LD_PRELOAD``) are part of the record's context.

None -- the answer is never kept on disk, every process searches again -- wherever a
search location cannot be enumerated: not Linux (the Windows DLL search), a
cuda.pathfinder whose search steps or descriptors are not the ones listed above
(older than 1.4 included), a set it searches through product variables or system
directory patterns, a loader that does not report its search (not glibc, a setuid
interpreter), a relative ``LD_LIBRARY_PATH`` entry, or a loader child that fails.
"""

from __future__ import annotations

import os
import sys

from cuforge.compile.cache._identity_store import site_witnesses

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from cuforge._cuda import HeaderWheel

#: cuda.pathfinder's header search, step by step, as this module enumerates it.
_KNOWN_STEPS = (
    "find_in_site_packages",
    "find_in_conda",
    "find_in_product_roots",
    "find_in_cuda_path",
    "find_via_ctk_root_canary",
    "find_in_system_install_dirs",
)

#: Loads each name in turn, stopping at the first that loads (as pathfinder's canary).
_LOAD = (
    "import ctypes, os, sys\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        ctypes.CDLL(name, os.RTLD_NOW | os.RTLD_GLOBAL)\n"
    "    except OSError:\n"
    "        continue\n"
    "    break\n"
)


def missing_set(marker: str, pathfinder_name: str, wheel: HeaderWheel | None) -> list[str] | None:
    """The paths whose change could make a search find the set with ``marker``
    (cuforge's file) that ``pathfinder_name`` names; None when they cannot all be
    listed (see the module docstring)."""
    found: list[str] = []
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    if wheel is not None:
        found += [os.path.join(e, rel, marker) for e in entries for rel in wheel.include_dirs]
    try:
        import cuda.pathfinder  # noqa: F401  (a broken or absent package: below)
    except Exception:
        # Not importable: only the wheel step ran. Installing the package changes
        # an import path entry or a site-packages directory (the caller's witnesses).
        return found
    pathfinder = _pathfinder_search(marker, pathfinder_name)
    return None if pathfinder is None else found + pathfinder


def _pathfinder_search(marker: str, name: str) -> list[str] | None:
    if sys.platform != "linux":
        return None
    try:
        from cuda.pathfinder._dynamic_libs.lib_descriptor import LIB_DESCRIPTORS
        from cuda.pathfinder._dynamic_libs.search_steps import derive_ctk_root
        from cuda.pathfinder._dynamic_libs.subprocess_protocol import DYNAMIC_LIB_SUBPROCESS_CWD
        from cuda.pathfinder._headers import find_nvidia_headers as finder
        from cuda.pathfinder._headers.header_descriptor import (
            HEADER_DESCRIPTORS,
            platform_include_subdirs,
            system_install_dir_patterns,
        )
        from cuda.pathfinder._utils.ctk_root_canary import CTK_ROOT_CANARY_ANCHOR_LIBNAMES
        from cuda.pathfinder._utils.env_vars import get_cuda_path_or_home

        steps = tuple(step.__name__ for step in finder.FIND_STEPS)
        desc = HEADER_DESCRIPTORS[name]
        if steps != _KNOWN_STEPS or desc.product_root_env_vars:
            return None
        if system_install_dir_patterns(desc):
            return None
        header = str(desc.header_basename)
        subdirs = tuple(platform_include_subdirs(desc))
        rel_dirs = tuple(desc.anchor_include_rel_dirs)
        layouts = tuple(desc.site_packages_dirs)
        conda_targets = bool(desc.conda_targets_layout)
        canary = bool(desc.use_ctk_root_canary)
        sonames: tuple[str, ...] = ()
        if canary:
            sonames = tuple(LIB_DESCRIPTORS[CTK_ROOT_CANARY_ANCHOR_LIBNAMES[0]].linux_sonames)
        cuda_home = get_cuda_path_or_home()
    except Exception:  # another cuda.pathfinder than the one this module reads
        return None
    if any("*" in layout for layout in layouts):
        return None

    def layout_under(anchor: str) -> list[str]:
        paths = []
        for rel in rel_dirs:
            include = os.path.join(anchor, rel)
            for d in (*(os.path.join(include, s) for s in subdirs), include):
                paths += [os.path.join(d, header), os.path.join(d, marker)]
        return paths

    found = [os.path.join(s, layout, n) for s in site_witnesses() for layout in layouts
             for n in (header, marker)]  # fmt: skip
    conda = os.environ.get("CONDA_PREFIX")
    if conda:
        found += _conda(conda, conda_targets, layout_under)
    if cuda_home:
        found += layout_under(cuda_home)
    if canary:
        loaded = _loader_search(sonames, str(DYNAMIC_LIB_SUBPROCESS_CWD))
        if loaded is None:
            return None
        tried, library = loaded
        found += tried
        if library is not None:
            for path in dict.fromkeys((library, os.path.realpath(library))):
                try:
                    root = derive_ctk_root(path)
                except Exception:
                    return None
                if root:
                    found += layout_under(root)
    return found


def _conda(
    prefix: str, targets_layout: bool, layout_under: Callable[[str], list[str]]
) -> list[str]:
    if not targets_layout:
        return layout_under(prefix)
    targets = os.path.join(prefix, "targets")
    found = [targets]  # its listing decides which targets/*/include there are
    try:
        names = sorted(os.listdir(targets))
    except OSError:
        names = []
    includes = [os.path.join(targets, n, "include") for n in names]
    found += includes
    for include in includes:  # the anchor when it is the only one
        found += layout_under(os.path.dirname(include))
    return found


def _loader_search(sonames: tuple[str, ...], cwd: str) -> tuple[list[str], str | None] | None:
    """(every file the system loader tried for ``sonames`` and the libraries they
    pulled in, the library it loaded or None), as glibc reports them; None when it
    does not (no ``LD_DEBUG``), the child failed, or a tried path is relative."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("LD_DEBUG")}
    env["LD_DEBUG"] = "libs"
    try:
        child = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _LOAD, *sonames],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            errors="surrogateescape",
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if child.returncode != 0:
        return None
    tried: list[str] = ["/etc/ld.so.cache", "/etc/ld.so.preload"]
    started = False
    inits: set[str] = set()
    library = None
    for raw in child.stderr.splitlines():
        line = raw.split(":", 1)[-1].strip()
        if line.startswith("find library="):
            name = line[len("find library=") :].split(" ", 1)[0]
            started = started or name in sonames
        elif started and line.startswith("trying file="):
            path = line[len("trying file=") :]
            if not os.path.isabs(path):
                return None
            tried.append(path)
            if os.path.basename(path) in sonames:
                library = path
        elif started and line.startswith("search cache="):
            tried.append(line[len("search cache=") :])
        elif line.startswith("calling init: "):
            inits.add(line[len("calling init: ") :])
    if not started:
        return None
    return tried, (library if library in inits else None)
