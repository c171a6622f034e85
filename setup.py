"""Build hook for cuforge's C helpers.

Every ``src/cuforge/_native/<name>.c`` becomes the extension module
``cuforge._native._<name>`` -- adding a helper is adding one file.  The helpers
include no CUDA headers, so the package builds on machines without a toolkit.
"""

from pathlib import Path

from setuptools import Extension, setup

_NATIVE = Path("src/cuforge/_native")

ext_modules = [
    Extension(f"cuforge._native._{src.stem}", sources=[str(src)], extra_compile_args=["-O2"])
    for src in sorted(_NATIVE.glob("*.c"))
]

setup(ext_modules=ext_modules)
