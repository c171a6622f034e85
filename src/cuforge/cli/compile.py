"""``cuforge compile FILE... [--arch A ...]``: compile sources through the cache.

Every FILE is compiled for every ``--arch`` (repeated or comma-separated), in
parallel worker processes when there are several (see ``_pool``). ``-o NAME.fatbin``
packs one FILE's archs into one fatbin (a cubin per ``sm_XY``, PTX per
``compute_XY``; each compiled and cached on its own). Outputs: ``-o OUT`` for a single output
(``-o -``: standard output, as ``cache show --extract -``; the report then goes to
stderr); ``--outdir DIR`` for any number (``DIR/<stem>.<target>``, or
``DIR/<stem>.<arch>.<target>`` with several archs); otherwise beside each source,
named the same way. An empty ``-o`` or ``--outdir`` is a usage error, never "beside
the source". One line per output says where it went, its size, the time and whether
the cache served it (``--json``: one JSON array). Caching is on by default (see
``_select`` for which cache); ``--no-cache`` compiles without one.

Before anything compiles, ``plan`` refuses (usage errors): a target the source's
code type does not compile to (``_programs.check_target``: the compile layer's own
rule, so the cached and the uncached path refuse alike and nothing is stored under
it), an output that is the same file as an input (a FILE, ``-include FILE`` or,
when the output already exists, a header the compile reads, as the header tracking
resolves it: same path, symbolic or hard link, an ``--outdir`` or default name
landing on one), and an output that cannot be written (``_check_writable``: tried,
not guessed from permission bits); each output is checked again on its opened
descriptor when written. The plan changes nothing on disk: ``--outdir`` is made
only once outputs are written, so a refused command leaves no folder behind.

Exit status: 0 all compiled; 1 a compiler rejected a source (its log goes to stderr,
other outputs are still written), or the cache refused one (an include it cannot
track: nothing compiled for it, why on stderr, the others still compiled and written
-- so a failure found while running, not a usage error); 2 usage errors (bad option
values, unreadable input, an unsupported target, an output that cannot be written or
is an input, a cache that cannot be opened).

A repeated command is normally answered by ``_direct`` before this module is even
imported; this is the full path, which also leaves the record ``_direct`` uses --
only when the command names its arch (``--arch`` or a settings file's ``arch``): an
arch taken from device 0 is not in the request ``_direct`` is keyed by, so give
``--arch`` to get the fast hit path.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
import time

from cuforge._names import printed
from cuforge.cli import _config, _direct, _kept, _pool, _programs, _select
from cuforge.cli._args import UsageError, size_arg
from cuforge.cli._report import render, store_fields

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.cli._args import Subparsers

__all__ = ["register", "run"]

STDOUT = "-"  # -o -: the output goes to standard output


def register(subparsers: Subparsers) -> None:
    """Add ``compile``."""
    p = subparsers.add_parser(
        "compile",
        help="compile .cu/.ptx/.ll/.bc/.nvvm files to cubin, PTX or LTO-IR through the cache",
        description="Compile each FILE (CUDA C++; PTX by .ptx; NVVM IR by .ll, .bc or .nvvm) "
        "for each --arch.",
    )
    p.add_argument(
        "files", nargs="+", metavar="FILE",
        help="source files: CUDA C++ (.cu, ...), PTX (.ptx), NVVM IR (.ll, .bc, .nvvm)",
    )  # fmt: skip
    _programs.add_compile_options(p)
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "-o", dest="output", metavar="OUT",
        help="output path, for one output (never an input; -: standard output); "
        "NAME.fatbin packs every --arch of one FILE into one fatbin",
    )  # fmt: skip
    out.add_argument(
        "--outdir", metavar="DIR", help="directory for the outputs (made once they are written)"
    )
    _select.add_cache_option(p, can_disable=True)
    p.add_argument(
        "--max-size",
        type=size_arg,
        metavar="SIZE",
        help="cap a directory, sqlite:// or memory:// cache (2G)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON array of results")
    p.set_defaults(handler=run, own_options=frozenset(p._option_string_actions))


def _check_options_as_files(args: argparse.Namespace) -> None:
    """UsageError when a FILE is one of compile's own options and no such file exists:
    after ``--`` every word is a file name (``-- -weird.cu --arch sm_90``), so the
    option was never applied -- said before its absence shows as another error (no
    device to take the arch from, ``cannot read --arch``)."""
    own: frozenset[str] = getattr(args, "own_options", frozenset())
    for word in args.files:
        name = word.split("=", 1)[0] if word.startswith("--") else word
        if name in own and not os.path.lexists(word):
            raise UsageError(
                f"{word!r} after '--' is read as a file name (there is no such file); "
                "put options before '--'"
            )


class Job:
    """One source compiled for one arch into one output file."""

    __slots__ = ("arch", "output", "program", "result", "source", "spec")

    def __init__(self, source: _programs.SourceFile, spec: _pool.Spec, output: str) -> None:
        self.source, self.spec, self.output = source, spec, output
        self.arch = spec.arch
        self.program: Any = None
        self.result: dict[str, Any] = {}


def _output_for(args: argparse.Namespace, path: str, arch: str | None, several_archs: bool) -> str:
    if args.output is not None:
        output: str = args.output
        return output
    stem = os.path.splitext(os.path.basename(path))[0]
    name = f"{stem}.{arch}.{args.target}" if several_archs and arch else f"{stem}.{args.target}"
    folder = args.outdir if args.outdir is not None else os.path.dirname(path)
    return os.path.join(folder, name)


def _check_output(output: str) -> None:
    """UsageError, before anything compiles, when ``-o OUTPUT`` cannot be written: its
    folder is missing or not a directory, or the path is a directory."""
    if output == STDOUT:
        return
    folder = os.path.dirname(output) or "."
    if not os.path.isdir(folder):
        raise UsageError(f"-o {output}: the directory {folder} does not exist")
    if os.path.isdir(output):
        raise UsageError(f"-o {output}: is a directory; name a file (or use --outdir)")


def _identity(path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file ``path`` names, through links; None if none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _input_files(args: argparse.Namespace) -> dict[tuple[int, int], str]:
    """Identity -> what it is (``input PATH``) of every file the command reads by
    name (each FILE, each ``-include FILE``)."""
    found: dict[tuple[int, int], str] = {}
    for path in [*args.files, *args.pre_include]:
        ident = _identity(path)
        if ident is not None:
            found.setdefault(ident, f"input {path}")
    return found


def _header_files(jobs: list[Job]) -> dict[tuple[int, int], str]:
    """Identity -> what it is (``header PATH that SOURCE reads``) of every user file
    the jobs' compiles read beyond their sources: the header tracking's resolution
    (``compile.cache.read_files``: every header and ``-include`` file, through every
    ``#if`` branch), which is all a cached compile can read and what NVRTC reads
    without a cache. Resolved once per source and options; a program whose includes
    cannot be tracked (refused by a cached compile) adds none."""
    from cuforge.compile.cache import read_files

    found: dict[tuple[int, int], str] = {}
    done: set[object] = set()
    for job in jobs:
        program = job.program
        if job.source.code_type != "c++" or program is None:
            continue
        options = program.options
        seen = (job.source.path, options.include_path, options.pre_include, options.define_macro)
        if seen in done:  # another arch of the same source: the same headers
            continue
        done.add(seen)
        try:
            paths = read_files(program)
        except ValueError:  # UntrackableInclude: a cached compile refuses it
            continue
        for path in paths:
            ident = _identity(path)
            if ident is not None:
                shown = os.path.relpath(path)  # as the user would name it here
                shown = path if shown.startswith(os.pardir) else shown
                found.setdefault(ident, f"header {shown} that {job.source.path} reads")
    return found


def _check_not_an_input(
    args: argparse.Namespace, jobs: list[Job], inputs: dict[tuple[int, int], str]
) -> None:
    """UsageError, before anything compiles, when an output is the same file as an
    input (``inputs``: identity -> ``input PATH`` or ``header PATH that SOURCE
    reads``): the same path, a symbolic or a hard link to it (``-o saxpy.cu``
    replaced the source with a cubin, ``-o scale.h`` the header it includes), or an
    ``--outdir``/default name that lands on one."""
    for job in jobs:
        if job.output == STDOUT:
            continue  # standard output (-o -): written, never read as an input
        ident = _identity(job.output)
        what = None if ident is None else inputs.get(ident)
        if what is None:
            continue
        if args.output:
            raise UsageError(f"-o {job.output} is the {what} (the same file): name another output")
        where = f"--outdir {args.outdir}: " if args.outdir else ""
        fix = "" if args.outdir else ": name it with -o OUT or --outdir DIR"
        raise UsageError(
            f"{where}the output {job.output} of {job.source.path} would overwrite the {what}{fix}"
        )


def _existing(jobs: list[Job]) -> bool:
    """Whether an output is already there (only a file that exists can be a header)."""
    return any(job.output != STDOUT and os.path.lexists(job.output) for job in jobs)


def _check_writable(args: argparse.Namespace, jobs: list[Job]) -> None:
    """UsageError, before anything compiles, with the line :func:`_write` would give
    when an output cannot be written (``-o: cannot write /proc/x.cubin: No such file
    or directory``): an existing file or directory is opened for writing (nothing is
    written, so nothing changes); for a new file, a temporary file is created in the
    folder it would go into -- the folder its path leads to, through links -- and
    removed (permission bits alone do not say: root writes anyway, and a read-only
    mount or ``/proc`` refuses everyone). Devices, FIFOs and sockets are left to the
    write, where opening one cannot block or act."""
    import stat

    flag = _named_by(args)
    probed: dict[str, OSError | None] = {}
    if args.outdir and not os.path.isdir(args.outdir):  # to be made: _check_outdir tried it
        probed[os.path.realpath(args.outdir)] = None
    for job in jobs:
        output = job.output
        if output == STDOUT:
            continue
        try:
            try:
                mode = os.stat(output).st_mode
            except FileNotFoundError:
                folder = os.path.dirname(os.path.realpath(output))
                if folder not in probed:
                    probed[folder] = _creates_in(folder)
                problem = probed[folder]
            else:
                if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                    os.close(os.open(output, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)))
                problem = None
        except OSError as exc:
            problem = exc
        if problem is not None:
            where = f"{flag}: " if flag else ""
            raise UsageError(f"{where}cannot write {output}: {problem.strerror or problem}")


def _check_outdir(outdir: str) -> None:
    """UsageError when ``--outdir`` does not exist and cannot be made: its nearest
    existing ancestor is not a directory, or a file cannot be created in it (tried,
    as :func:`_check_writable` does). Nothing is made: a refused command leaves no
    folder behind (:func:`make_outdir` makes it once outputs are written)."""
    if os.path.isdir(outdir):
        return
    ancestor = os.path.dirname(os.path.abspath(outdir))
    while not os.path.lexists(ancestor) and os.path.dirname(ancestor) != ancestor:
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UsageError(f"--outdir {outdir}: {os.strerror(errno.ENOTDIR)}")
    problem = _creates_in(ancestor)
    if problem is not None:
        raise UsageError(f"--outdir {outdir}: {problem.strerror or problem}")


def make_outdir(outdir: str) -> None:
    """Make ``--outdir`` (and its missing parents), just before the first output is
    written into it; UsageError when that fails now (checked by the plan)."""
    try:
        os.makedirs(outdir, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--outdir {outdir}: {exc.strerror or exc}") from None


def _creates_in(folder: str) -> OSError | None:
    """Why a new file cannot be created in ``folder``, or None: found by creating one
    (exclusively, under a random name no one else uses) and removing it."""
    probe = os.path.join(folder, f".cuforge-probe-{os.getpid()}-{os.urandom(6).hex()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        return exc
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def _write(output: str, data: bytes, inputs: dict[tuple[int, int], str], flag: str = "") -> None:
    """Write ``output``, never over an input (checked on the opened file: a link
    swapped in after the plan's check is refused too); ``-``: standard output.
    ``flag``: the option that named it (``-o``, ``--outdir DIR``), said in the error
    when it cannot be written."""
    try:
        if output == STDOUT:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            return
        written = _direct.write_output(output, data, inputs)
    except BrokenPipeError:  # -o - read by a reader that went away: exit 1, as main says
        raise
    except OSError as exc:
        where = f"{flag}: " if flag else ""
        raise UsageError(f"{where}cannot write {output}: {exc.strerror or exc}") from None
    if not written:
        raise UsageError(f"cannot write {output}: it is now one of the inputs (the same file)")


def _named_by(args: argparse.Namespace) -> str:
    """The option that named the outputs, for an error: ``-o``, ``--outdir DIR``, or ""
    (beside each source)."""
    if args.output:
        return "-o"
    return f"--outdir {args.outdir}" if args.outdir else ""


def _pack(jobs: list[Job], output: str, inputs: dict[tuple[int, int], str]) -> dict[str, Any]:
    """Pack the jobs' cubins (and PTX) into the fatbin ``output``; its report line."""
    from cuforge.compile.errors import ToolkitNotFoundError
    from cuforge.compile.fatbin import pack_fatbin
    from cuforge.compile.object_code import ObjectCode

    start = time.perf_counter()
    name = jobs[0].source.name
    parts = [(ObjectCode(j.result["code"], j.spec.target, name=name), j.arch or "") for j in jobs]
    try:
        packed = pack_fatbin(parts, name)
    except ToolkitNotFoundError as exc:
        raise UsageError(str(exc)) from None
    _write(output, packed.code, inputs, "-o")
    return {"source": jobs[0].source.path, "arch": ",".join(j.arch or "" for j in jobs),
            "target": "fatbin", "output": output, "bytes": len(packed.code),
            "ms": round((time.perf_counter() - start) * 1000, 3), "cache": "packed",
            "parts": len(jobs)}  # fmt: skip


def is_fatbin(args: argparse.Namespace) -> bool:
    """Whether the command builds one fatbin (``-o NAME.fatbin``)."""
    return bool(args.output) and str(args.output).lower().endswith(".fatbin")


def _check_fatbin(args: argparse.Namespace, archs: list[str | None]) -> None:
    if len(args.files) != 1:
        raise UsageError("-o NAME.fatbin packs one source; give one FILE")
    if archs == [None]:
        raise UsageError("-o NAME.fatbin needs the archs to pack: --arch sm_80,sm_90,...")
    if args.target != "cubin":
        raise UsageError(
            "-o NAME.fatbin packs cubins (and PTX for compute_XY archs): leave --target out"
        )


def requested_archs(args: argparse.Namespace) -> list[str | None]:
    """The archs the command names: ``--arch``, else the settings files' ``arch``;
    ``[None]`` when neither does (then each Program takes device 0's)."""
    given = _programs.given_archs(args.arch)
    for arch in given:
        _programs.check_arch("--arch", arch)
    if not given:  # the project's or user's settings file, else this GPU's
        given = [a.value for a in _config.default_archs()]
    return list(dict.fromkeys(given)) if given else [None]


def arch_words(args: argparse.Namespace, arch: str) -> str:
    """``arch`` as the user gave it, for a message: ``--arch sm_999``, or ``arch
    'sm_999' in project config PATH`` when a settings file named it."""
    if args.arch:
        return f"--arch {arch}"
    return f"arch {arch!r} in {_config.default_archs()[0].origin}"


def check_cpp_inputs(args: argparse.Namespace, archs: list[str | None]) -> None:
    """UsageError, before anything compiles, for what a CUDA C++ compile would refuse
    that the options' own checks do not see: an arch NVRTC does not compile for (its
    ``nvrtcGetSupportedArchs``), an ``-include`` file that is not where NVRTC looks,
    a ``CUFORGE_TOOLKIT_HEADERS`` without a toolkit (each a compile failure, exit 1,
    before). Run after the plan's own checks (an output that is an input is refused
    before NVRTC is asked anything, which may record what it said)."""
    _programs.check_environment()
    for arch in archs:
        if arch is not None:
            _programs.check_supported_arch(arch, arch_words(args, arch))
    _programs.check_pre_includes(list(args.pre_include), list(args.includes))


def _several_outputs(args: argparse.Namespace, archs: list[str | None]) -> str:
    """Why ``-o`` cannot name the outputs: several files, or several archs -- saying
    which settings file named them when ``--arch`` did not."""
    if len(archs) > 1 and not args.arch:
        origin = _config.default_archs()[0].origin
        return (
            f"-o names one output, and arch in {origin} names {len(archs)} archs "
            f"({', '.join(a or '' for a in archs)}): pick one with --arch, or use --outdir "
            "DIR (or -o NAME.fatbin to pack them)"
        )
    if len(args.files) > 1:
        return "-o names one output; use --outdir DIR for several files"
    return "-o names one output; use --outdir DIR for several archs, or -o NAME.fatbin to pack them"


def plan(args: argparse.Namespace) -> tuple[list[Job], dict[tuple[int, int], str]]:
    """Read every source, build every Program (validating all options and targets
    before any compile starts) and name every output, none of them an input; the
    jobs, and the inputs' identities (each FILE, ``-include`` file and, when an
    output already exists, header: ``_check_not_an_input``) for the writes to check
    again. Changes nothing on disk (``--outdir`` is made by :func:`run`). Raises
    UsageError."""
    _check_options_as_files(args)
    _programs.check_warm_setting()
    if args.output == "":
        raise UsageError("-o needs a file name (it was given an empty one); - is standard output")
    if args.outdir == "":
        raise UsageError("--outdir needs a directory name (it was given an empty one)")
    archs = requested_archs(args)
    fatbin = is_fatbin(args)
    if fatbin:
        _check_fatbin(args, archs)
    elif args.output and len(args.files) * len(archs) > 1:
        raise UsageError(_several_outputs(args, archs))
    if args.outdir:
        if os.path.exists(args.outdir) and not os.path.isdir(args.outdir):
            raise UsageError(f"--outdir {args.outdir}: exists and is not a directory")
        _check_outdir(args.outdir)  # made only once the outputs are written (make_outdir)
    if args.output:
        _check_output(args.output)
    jobs: list[Job] = []
    seen: dict[str, str] = {}
    for path in args.files:
        source = _programs.read_source(path)
        for arch in archs:
            fields = _programs.option_fields(
                source, arch, args.defines, args.includes, args.std, args.pre_include
            )
            program = _programs.make_program(source, fields)
            target = args.target
            if fatbin:  # a virtual arch goes in as PTX, a real one as its cubin
                target = "ptx" if (arch or "").startswith("compute_") else "cubin"
            if arch is not None:  # then check_cpp_inputs: together, _programs.check_arch_for
                _programs.check_virtual_arch(arch, target, arch_words(args, arch))
            part = args.output if fatbin else ""
            _programs.check_target(path, program.code_type, program.options, target, part)
            spec = _pool.Spec(
                source=path, arch=program.options.arch, target=target, std=args.std,
                defines=args.defines, includes=args.includes, pre_include=args.pre_include,
            )  # fmt: skip
            job = Job(source, spec, _output_for(args, path, arch, len(archs) > 1))
            job.program = program
            other = seen.setdefault(os.path.abspath(job.output) + (arch or ""), path)
            if other is not path:
                raise UsageError(f"{other} and {path} would both be written to {job.output}")
            jobs.append(job)
    inputs = _input_files(args)
    _check_not_an_input(args, jobs, inputs)
    # The headers, resolved only when an output is already there: a header the
    # compile reads exists, so a new output cannot be one (a first build pays nothing).
    if _existing(jobs):
        headers = _header_files(jobs)
        _check_not_an_input(args, jobs, headers)
        for ident, what in headers.items():
            inputs.setdefault(ident, what)
    _check_writable(args, jobs)
    if any(j.source.code_type == "c++" for j in jobs):  # last: these may ask NVRTC or
        check_cpp_inputs(args, archs)  # locate the CUDA headers (state records)
    return jobs, inputs


def run(args: argparse.Namespace) -> int:
    """Compile every job; see the module docstring for exit statuses."""
    choice = _select.choose(args, args.max_size)  # --max-size, else a settings file's cap
    jobs, inputs = plan(args)
    cache = _select.open_choice(choice) if choice.url is not None else None
    url = choice.target() if cache is not None else None  # what worker processes open
    shown = _select.level_names(choice)  # how the report names the levels a miss went to

    def done(i: int, result: dict[str, Any]) -> None:
        jobs[i].result = result
        if result.get("warnings"):
            said = f"{printed(jobs[i].source.path)} ({jobs[i].arch})"
            sys.stderr.write(f"{said}: {result['warnings']}\n")

    fatbin = is_fatbin(args)
    stored: list[tuple[dict[str, Any], list[str]]] = []  # reports of lasting stores, keys
    with cache if cache is not None else contextlib.nullcontext():
        workers = _pool.run_specs(
            [j.spec for j in jobs], os.cpu_count() or 1, cache, (url, choice.secret), done, True
        )
        results = []
        if args.outdir and any(job.result["status"] != "failed" for job in jobs):
            make_outdir(args.outdir)  # only now: a refused command leaves no folder
        for job in jobs:
            r = job.result
            if r["status"] == "failed":
                sys.stderr.write(f"{printed(job.source.path)} ({job.arch}): {r['log']}\n")
                results.append(
                    {"source": job.source.path, "arch": job.arch, "target": job.spec.target,
                     "error": r["log"]}
                )  # fmt: skip
                if r.get("refused"):
                    results[-1]["refused"] = True
                continue
            if not fatbin:  # a fatbin's parts are packed below, not written one by one
                _write(job.output, r["code"], inputs, _named_by(args))
            status = "off" if cache is None else ("miss" if r["status"] == "compiled" else "hit")
            results.append(
                {"source": job.source.path, "arch": job.arch, "target": job.spec.target,
                 "output": job.output, "bytes": r["bytes"], "ms": round(r["seconds"] * 1000, 3),
                 "cache": status}
            )  # fmt: skip
            if status == "miss":
                results[-1].update(store_fields(r, shown))
                if results[-1].get("outlives_process"):
                    stored.append((results[-1], r.get("keys") or []))
        failed = any(job.result["status"] == "failed" for job in jobs)
        # A compile that printed warnings is answered by the full path, which replays
        # them from the entry: the fast path prints no compiler log.
        warned = any(job.result.get("warnings") for job in jobs)
        # Nothing to serve next time: not stored, or stored in memory:// only.
        unstored = any(r.get("not_stored") or r.get("outlives_process") is False for r in results)
        digest = getattr(args, "request_digest", None)
        if fatbin and not failed:
            results.append(_pack(jobs, args.output, inputs))
        # An arch taken from device 0 is not part of the request digest, and the fast
        # path never asks the driver (cuInit costs 100s of ms): a record would answer
        # the same command on another GPU with this one's binary. Only a named arch
        # (--arch, or a settings file's, which the digest covers) leaves a record.
        named = requested_archs(args) != [None]
        piped = args.output == STDOUT  # the hit path writes files only
        unrecorded = failed or warned or unstored or fatbin or piped
        if not unrecorded and named and cache is not None and digest:
            made = [(j.source, j.program, args.target, j.output, j.result["code"]) for j in jobs]
            mode = "json" if args.json else "text"
            _direct.remember(digest, cache, mode, made, url)
    if stored:  # every handle closed: a store a cap undid since is not reported stored
        _kept.recheck(stored, choice, cache, workers)
    # With -o -, standard output holds the binary alone: the report goes to stderr.
    print(render(results, args.json), file=sys.stderr if args.output == STDOUT else sys.stdout)
    return 1 if failed else 0
