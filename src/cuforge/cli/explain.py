"""``cuforge cache explain FILE [compile options]``: would this compile hit, and if not,
what differs from the nearest entry?

A thin wrapper around ``cuforge.utils.explain``: the program is built exactly as
``cuforge compile`` builds it (``_programs``), nothing is compiled and the cache's
statistics are untouched. It names the option, header, source or compiler build
that differs from the nearest entry with the same source name.

Exit status: 0 it would hit; 1 it would miss; 2 usage errors -- also what ``cuforge
compile`` refuses before compiling (an arch NVRTC does not compile for, a missing
``-include`` file, a ``CUFORGE_TOOLKIT_HEADERS`` without a toolkit).
"""

from __future__ import annotations

import argparse
import json

from cuforge.cli import _entries, _programs, _select
from cuforge.cli.cache import opened

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cuforge.cli._args import Subparsers

__all__ = ["register"]


def register(actions: Subparsers) -> None:
    """Add ``explain`` to the ``cache`` group."""
    p = actions.add_parser(
        "explain",
        help="would compiling FILE hit? if not, which input differs",
        description="Say whether `cuforge compile FILE [options]` would be served by the "
        "cache, and otherwise which input differs from the nearest entry.",
    )
    p.add_argument("file", metavar="FILE", help="source file, as you would compile it")
    _programs.add_compile_options(p, several_archs=False)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=_explain)
    _select.add_cache_option(p, can_disable=False)


def _explain(args: argparse.Namespace) -> int:
    from cuforge.cli import _config
    from cuforge.compile.explain import explain

    source = _programs.read_source(args.file)
    if args.arch:
        _programs.check_arch("--arch", args.arch)
    configured = None if args.arch else next(iter(_config.default_archs()), None)
    arch = args.arch or (configured.value if configured is not None else None)
    origin = None if configured is None else configured.origin
    said = f"--arch {arch}" if origin is None else f"arch {arch!r} in {origin}"
    if arch is not None:  # what a compile would refuse, refused as compile does
        _programs.check_arch_for(arch, args.target, said, source.code_type)
    if source.code_type == "c++":
        _programs.check_environment()
        _programs.check_pre_includes(list(args.pre_include), list(args.includes), [args.file])
    fields = _programs.option_fields(
        source, arch, args.defines, args.includes, args.std, args.pre_include
    )
    program = _programs.make_program(source, fields)
    with opened(args, read_only=True) as cache:
        try:
            answer = explain(program, args.target, cache)
        except (TypeError, ValueError) as exc:
            from cuforge.cli._args import UsageError

            raise UsageError(str(exc)) from None
    if args.json:
        print(
            json.dumps(
                {"hit": answer.hit, "key": answer.key, "reasons": answer.reasons,
                 "nearest": answer.nearest},
                indent=2,
            )
        )  # fmt: skip
    else:
        print(str(answer))
        if answer.nearest:
            print(f"(compared with entry {answer.nearest[: _entries.SHORT]})")
    return 0 if answer.hit else 1
