"""Build hook for cuforge's C helpers.

Every ``src/cuforge/_native/<name>.c`` becomes the extension module
``cuforge._native._<name>`` -- adding a helper is adding one file.  The helpers
include no CUDA headers, so the package builds on machines without a toolkit.
"""

import platform
import sys
from pathlib import Path

from setuptools import Extension, setup

_NATIVE = Path("src/cuforge/_native")
_COMPAT = _NATIVE / "glibc_compat.h"

compile_args = ["-O2"]
link_args: list[str] = []
if sys.platform == "linux" and platform.machine() == "x86_64" and platform.libc_ver()[0] == "glibc":
    # Old symbol versions for the pthread calls: the wheel loads on any glibc >= 2.17
    # (see glibc_compat.h); -pthread finds them where glibc < 2.34 keeps them.
    compile_args += ["-include", str(_COMPAT)]
    link_args += ["-pthread"]

ext_modules = [
    Extension(
        f"cuforge._native._{src.stem}",
        sources=[str(src)],
        depends=[str(_COMPAT)],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    for src in sorted(_NATIVE.glob("*.c"))
]

setup(ext_modules=ext_modules)
