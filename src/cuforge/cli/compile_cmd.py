"""``cuforge compile FILE``: compile one source file and report where and how fast.

Exit status: 0 on success, 1 when the compiler rejects the source (its log goes to
stderr), 2 for usage errors (bad option values, unreadable input, no arch).

Extension point: a ``cache_factory`` default on the parsed args (a function
``args -> context manager yielding a cache or None``) is used for ``cache=``; the
cache command module sets it together with its ``--cache DIR`` option.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from typing import Any

# A quoted #include makes NVRTC read files next to the source (found via the name).
_QUOTED_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"', re.MULTILINE)

# File suffix -> code_type; anything else is treated as CUDA C++.
_CODE_TYPES = {".ptx": "ptx", ".ll": "nvvm", ".bc": "nvvm", ".nvvm": "nvvm"}


def register(subparsers: Any, parsers: dict[str, argparse.ArgumentParser]) -> None:
    """Add the ``compile`` command."""
    p = subparsers.add_parser(
        "compile",
        help="compile a .cu/.ptx/.ll file to cubin, PTX or LTO-IR",
        description="Compile FILE (CUDA C++, or PTX/NVVM IR by suffix) and write the result.",
    )
    p.add_argument("file", metavar="FILE", help="source file (.cu, .ptx, .ll, .bc)")
    p.add_argument("--arch", help="target architecture, e.g. sm_90 (default: this GPU's)")
    p.add_argument(
        "--target",
        default="cubin",
        type=str.lower,
        choices=("cubin", "ptx", "ltoir"),
        help="output kind (default: cubin)",
    )
    p.add_argument(
        "-D", dest="defines", action="append", default=[], metavar="NAME[=V]", help="define a macro"
    )
    p.add_argument(
        "-I", dest="includes", action="append", default=[], metavar="DIR", help="add include dir"
    )
    p.add_argument("--std", help="C++ dialect, e.g. c++17")
    p.add_argument("-o", dest="output", metavar="OUT", help="output path (default: FILE.<target>)")
    p.set_defaults(handler=run, cache_factory=None)
    parsers["compile"] = p


def _error(message: str) -> int:
    print(f"cuforge compile: error: {message}", file=sys.stderr)
    return 2


def _was_hit(cache: Any) -> bool:
    return cache is not None and cache.stats().hits > 0


def run(args: argparse.Namespace) -> int:
    """Compile ``args.file``; see the module docstring for exit statuses."""
    from cuforge.compile import CompileError, Program, ProgramOptions

    path = args.file
    code_type = _CODE_TYPES.get(os.path.splitext(path)[1].lower(), "c++")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        return _error(f"cannot read {path}: {exc.strerror or exc}")
    # The program is named by its basename unless quoted includes must resolve next
    # to the file: a directory in the name is something the cache key cannot see.
    name = path if _QUOTED_INCLUDE.search(raw) else os.path.basename(path)
    fields: dict[str, Any] = {"name": name, "arch": args.arch}
    if code_type == "c++":
        fields.update(define_macro=args.defines or None, include_path=args.includes or None)
        fields["std"] = args.std
    elif args.defines or args.includes or args.std:
        return _error(f"-D, -I and --std apply to CUDA C++ only, not {code_type}")
    output = args.output or os.path.splitext(path)[0] + "." + args.target
    try:
        code: str | bytes = raw if path.endswith(".bc") else raw.decode()
        options = ProgramOptions(**fields)
        factory = args.cache_factory
        start = time.perf_counter()
        with factory(args) if factory else contextlib.nullcontext() as cache:
            obj = Program(code, code_type, options).compile(
                args.target, logs=sys.stderr, cache=cache
            )
        elapsed = time.perf_counter() - start
    except CompileError as exc:
        print(exc, file=sys.stderr)
        return 1
    except UnicodeDecodeError:
        return _error(f"{path} is not UTF-8 text")
    except (TypeError, ValueError) as exc:
        if args.arch is None and "ProgramOptions.arch" in str(exc):
            return _error("no CUDA device here to take the architecture from; pass --arch sm_XY")
        return _error(str(exc))
    try:
        with open(output, "wb") as f:
            f.write(obj.code)
    except OSError as exc:
        return _error(f"cannot write {output}: {exc.strerror or exc}")
    outcome = ""
    if getattr(args, "cache", None) is not None:
        outcome = ", cache hit" if _was_hit(cache) else ", cache miss (compiled and stored)"
    print(
        f"{path} -> {output} ({args.target}, {options.arch}, {len(obj.code)} bytes) "
        f"in {elapsed * 1000:.1f} ms{outcome}"
    )
    return 0
