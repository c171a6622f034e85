"""``cuforge cache explain FILE [compile options]``: would this compile hit, and if not,
what differs from the nearest entry?

A thin wrapper around ``cuforge.utils.explain``: the program is built exactly as
``cuforge compile`` builds it (``_programs``), nothing is compiled and the cache's
statistics are untouched. It names the option, header, source or compiler build
that differs from the nearest entry with the same source name.

It answers for one compile, so one arch: ``--arch sm_80,sm_90`` (or ``--arch`` twice)
is a usage error saying so. A compile command pasted after it works as it is:
compile's output options (``-o``, ``--outdir``, ``--max-size``) are accepted and
ignored, since they do not change the key; ``--no-cache`` is a usage error.

Exit status: 0 it would hit; 1 it would miss, or compile would refuse it through the
cache (``#include MACRO`` it cannot resolve, ``#include_next``: one line on stderr
saying what compile says, in the same words, with compile's status for it: 1); 2
usage errors -- also what ``cuforge compile`` refuses before compiling (an arch NVRTC
does not compile for, a missing ``-include`` file, a ``CUFORGE_TOOLKIT_HEADERS``
without a toolkit).
"""

from __future__ import annotations

import argparse
import json
import sys

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
    # A compile command pasted after `cache explain`: its output options name where
    # the result goes, never what the key is made of, so they are taken and ignored.
    ignored = p.add_argument_group(
        "compile's output options", "accepted and ignored: they do not change the cache key"
    )
    ignored.add_argument("-o", dest="output", metavar="OUT", help="as compile's (ignored)")
    ignored.add_argument("--outdir", metavar="DIR", help="as compile's (ignored)")
    ignored.add_argument("--max-size", metavar="SIZE", help="as compile's (ignored)")
    p.add_argument("--no-cache", action="store_true", help=argparse.SUPPRESS)


def _explain(args: argparse.Namespace) -> int:
    from cuforge.compile import toolchain

    with toolchain.reading_only():  # it looks: no identity record is written either
        return _explain_one(args)


def _explain_one(args: argparse.Namespace) -> int:
    from cuforge.cli import _config
    from cuforge.cli._args import UsageError
    from cuforge.compile.explain import explain

    if args.no_cache:
        raise UsageError(
            "--no-cache: explain says whether the cache would serve this compile; leave "
            "--no-cache out (--cache URL|DIR names the cache to ask)"
        )
    given = _programs.given_archs(args.arch)
    if len(set(given)) > 1:  # compile takes several; an answer is for one compile
        raise UsageError(
            f"cache explain takes one --arch (it explains one compile), got "
            f"{', '.join(dict.fromkeys(given))}: run it once for each"
        )
    source = _programs.read_source(args.file)
    if given:
        _programs.check_arch("--arch", given[0])
    archs = [] if given else _config.default_archs()
    for found in archs[1:]:  # compile refuses the whole list for one bad arch: so here
        words = f"arch {found.value!r} in {found.origin}"
        _programs.check_arch_for(found.value, args.target, words, source.code_type)
    configured = next(iter(archs), None)
    arch = given[0] if given else (configured.value if configured is not None else None)
    origin = None if configured is None else configured.origin
    said = f"--arch {arch}" if origin is None else f"arch {arch!r} in {origin}"
    if arch is not None:  # what a compile would refuse, refused as compile does
        _programs.check_arch_for(arch, args.target, said, source.code_type)
    if source.code_type == "c++":
        _programs.check_environment()
        _programs.check_pre_includes(list(args.pre_include), list(args.includes))
    fields = _programs.option_fields(
        source, arch, args.defines, args.includes, args.std, args.pre_include
    )
    program = _programs.make_program(source, fields)
    with opened(args, read_only=True) as cache:
        try:
            answer = explain(program, args.target, cache)
        except (TypeError, ValueError) as exc:
            if not getattr(exc, "way", ""):
                raise UsageError(str(exc)) from None
            # An include compile would refuse, not a miss: compile's status for it (1,
            # found while compiling, the other files still compiled), compile's words.
            message = _programs.refusal_in_words(exc)
            print(
                f"cuforge cache explain: error: cuforge compile would refuse it: {message}",
                file=sys.stderr,
            )
            return 1
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
