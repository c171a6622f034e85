"""From a source file and compile options to a ``Program``: the one rule every command
(compile, cache explain, warm) uses, so they name the same cache entries.

- The code type follows the suffix: ``.ptx`` PTX, ``.ll``/``.bc``/``.nvvm`` NVVM IR,
  anything else CUDA C++. A binary ``.ltoir``, ``.cubin`` or ``.fatbin`` is compiled
  code: a usage error saying so (not "not UTF-8 text").
- The program is named by the file's basename, unless a quoted ``#include`` must
  resolve next to the file: then by the path as given (relative to the working
  directory), because the source directory is then an input.
- ``-D``/``-I``/``--std``/``-include`` apply to CUDA C++ only.

Bad values (an unknown arch, a macro that is not an identifier) are UsageErrors
carrying ProgramOptions' own message, naming the flag and the value given
(``-D 1BAD has an invalid macro name '1BAD'``), the settings file for its ``arch``,
or a warm manifest's key (``defines 1BAD has ...``; :data:`MANIFEST_KEYS`).
"""

from __future__ import annotations

import argparse
import os
import re

from cuforge.cli._args import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cuforge.compile.program import Program
    from cuforge.storage.protocol import ProgramCache

__all__ = [
    "CODE_TYPES",
    "FLAGS",
    "MANIFEST_KEYS",
    "SourceFile",
    "add_compile_options",
    "check_arch",
    "check_arch_for",
    "check_environment",
    "check_pre_includes",
    "check_supported_arch",
    "check_target",
    "check_virtual_arch",
    "check_warm_setting",
    "compile_through",
    "given_archs",
    "in_words",
    "make_program",
    "option_fields",
    "read_source",
    "refusal_in_words",
]

# A quoted #include makes NVRTC read files next to the source (found via the name).
_QUOTED_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"', re.MULTILINE)

#: File suffix -> code_type; anything else is CUDA C++.
CODE_TYPES = {".ptx": "ptx", ".ll": "nvvm", ".bc": "nvvm", ".nvvm": "nvvm"}
_KINDS = {"c++": "CUDA C++", "ptx": "PTX", "nvvm": "NVVM IR"}
#: Suffixes of compiled code (what a compile outputs), named when such a file is given.
_COMPILED = {".ltoir": "LTO-IR", ".cubin": "a cubin", ".fatbin": "a fatbin"}
TARGETS = ("cubin", "ptx", "ltoir")


def add_compile_options(parser: argparse.ArgumentParser, several_archs: bool = True) -> None:
    """``--arch``, ``--target``, ``-D``, ``-I``, ``--std``, ``-include``. ``--arch`` is
    a list either way (``several_archs=False``: the command refuses more than one, as
    ``cache explain`` does, rather than keep the last one given)."""
    parser.add_argument(
        "--arch",
        action="append",
        metavar="ARCH",
        help="target architecture, e.g. sm_90"
        + (" (repeat, or separate with commas, for several)" if several_archs else " (one)")
        + f" (default: {'' if several_archs else 'the first '}arch in the settings files"
        " -- cuforge.toml, then your config.toml -- else this GPU's"
        + (
            "; only a named arch lets a repeated command take the fast hit path)"
            if several_archs
            else ")"
        ),
    )
    parser.add_argument(
        "--target",
        default="cubin",
        type=str.lower,
        choices=TARGETS,
        help="output kind (default: cubin; .ptx input: cubin only; NVVM IR: ptx or ltoir)",
    )
    parser.add_argument(
        "-D", dest="defines", action="append", default=[], metavar="NAME[=V]", help="define a macro"
    )
    parser.add_argument(
        "-I", dest="includes", action="append", default=[], metavar="DIR", help="add include dir"
    )
    parser.add_argument("--std", help="C++ dialect, e.g. c++17")
    parser.add_argument(
        "-include",
        dest="pre_include",
        action="append",
        default=[],
        metavar="FILE",
        help="include FILE before the source",
    )


class SourceFile:
    """A source read from disk: path as given, code, code type and program name."""

    __slots__ = ("code", "code_type", "name", "path", "raw")

    def __init__(self, path: str, raw: bytes, code: str | bytes, code_type: str, name: str):
        self.path = path
        self.raw = raw
        self.code = code
        self.code_type = code_type
        self.name = name


def read_source(path: str) -> SourceFile:
    """Read ``path``; UsageError when it cannot be read, is empty (or blank: named
    here, the compile layer's "code must not be empty" names no file) or is not UTF-8
    text -- saying what it is when its suffix names compiled code (``.ltoir``,
    ``.cubin``, ``.fatbin``: what a compile outputs, never a source)."""
    suffix = os.path.splitext(path)[1].lower()
    code_type = CODE_TYPES.get(suffix, "c++")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not raw or raw.isspace():
        blank = " (only blanks)" if raw else ""
        raise UsageError(f"{path} is empty{blank}: nothing to compile")
    name = path if _QUOTED_INCLUDE.search(raw) else os.path.basename(path)
    if suffix == ".bc":
        return SourceFile(path, raw, raw, code_type, name)
    try:
        return SourceFile(path, raw, raw.decode(), code_type, name)
    except UnicodeDecodeError:
        made = _COMPILED.get(suffix)
        if made is not None:
            raise UsageError(
                f"{path} is {made}, the output of a compile, not a source; cuforge compile "
                "takes sources: "
                "CUDA C++ (.cu, ...), PTX (.ptx), NVVM IR (.ll, .bc, .nvvm)"
                + (" -- link LTO-IR with cuforge.compile.Linker" if suffix == ".ltoir" else "")
            ) from None
        raise UsageError(
            f"{path} is not UTF-8 text, so not {_KINDS[code_type]} (by its suffix); NVVM "
            "IR bitcode is read from a .bc file"
        ) from None


def option_fields(
    source: SourceFile,
    arch: str | None,
    defines: list[str],
    includes: list[str],
    std: str | None,
    pre_include: list[str],
) -> dict[str, Any]:
    """The ProgramOptions fields for ``source`` (UsageError for C++-only options on
    other code types)."""
    fields: dict[str, Any] = {"name": source.name, "arch": arch}
    if source.code_type == "c++":
        fields.update(
            define_macro=list(defines) or None,
            include_path=list(includes) or None,
            pre_include=list(pre_include) or None,
            std=std,
        )
    elif defines or includes or std or pre_include:
        raise UsageError(f"-D, -I, --std and -include apply to CUDA C++ only, not {source.path}")
    return fields


#: The ProgramOptions fields command-line flags set, and those flags.
FLAGS = {
    "arch": "--arch",
    "define_macro": "-D",
    "include_path": "-I",
    "pre_include": "-include",
    "std": "--std",
}
_FIELD = re.compile(r"ProgramOptions\.(\w+)(?:\[(\d+)\])?")


def given_archs(values: list[str] | None) -> list[str]:
    """The archs ``--arch`` names: each value split at its commas, stripped, in order
    (repeats kept). UsageError naming ``--arch`` for an empty value (``--arch ''``) or
    an empty item (``--arch sm_90,,``): dropped, the settings file's or the device's
    arch compiled in its place, unsaid."""
    archs: list[str] = []
    for value in values or ():
        if not value.strip():
            raise UsageError(
                "--arch needs an architecture (it was given an empty one); leave --arch "
                "out for the default (arch in the settings files, else this GPU's)"
            )
        items = [a.strip() for a in value.split(",")]
        if "" in items:
            raise UsageError(
                f"--arch {value!r} has an empty item: separate the archs with single "
                "commas (--arch sm_80,sm_90)"
            )
        archs += items
    return archs


def check_arch(where: str, arch: str) -> None:
    """UsageError when ``arch`` does not look like an architecture: the compile
    layer's own check (``ProgramOptions.arch``), naming ``where`` it came from."""
    from cuforge.compile.options import ProgramOptions

    try:
        ProgramOptions(arch=arch)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc).replace("ProgramOptions.arch", where, 1)) from None


def check_supported_arch(arch: str, subject: str) -> None:
    """UsageError ``SUBJECT is not one NVRTC 13.5 compiles for (it compiles for sm_75,
    ...)`` when NVRTC's own list (``nvrtcGetSupportedArchs``) lacks ``arch``'s compute
    capability -- for CUDA C++ (the caller checks the code type: a PTX or NVVM IR arch
    is checked for its form only). ``subject`` names the value as the user gave it
    (``--arch sm_999``, ``arch 'sm_999' in project config PATH``, a manifest's kernel).
    Skipped when NVRTC cannot be loaded: the compile then says that."""
    from cuforge.compile.toolchain import nvrtc_supported_archs

    number = re.search(r"[0-9]+", arch)
    if number is None:
        return
    known = nvrtc_supported_archs()
    if known is None or int(number.group()) in known[1]:
        return
    (major, minor), supported = known
    raise UsageError(
        f"{subject} is not one NVRTC {major}.{minor} compiles for "
        f"(it compiles for {', '.join(f'sm_{n}' for n in supported)})"
    )


def check_virtual_arch(arch: str, target: str, said: str) -> None:
    """UsageError for a virtual architecture (``compute_XY``) asked for a cubin: only a
    real one (``sm_XY``) has machine code; PTX is what a virtual one makes. ``said``
    names the value as the user gave it (``--arch compute_90``, or ``arch
    'compute_90' in project config PATH``: then the file is the setting to change)."""
    if target == "cubin" and arch.startswith("compute_"):
        real = "sm_" + arch[len("compute_") :]
        fix = f"use --arch {real}"
        if not said.startswith("--arch"):  # a settings file's: change it, or override it
            fix = f'set arch = "{real}" there, pass --arch {real}'
        raise UsageError(
            f"{said} is a virtual architecture and has no cubin: {fix}, or --target ptx"
        )


def check_arch_for(arch: str, target: str, said: str, code_type: str = "c++") -> None:
    """What ``compile``, ``cache explain`` and ``doctor`` refuse of an arch before
    anything compiles: a virtual one asked for a cubin (:func:`check_virtual_arch`)
    and, for CUDA C++, one NVRTC does not compile for (:func:`check_supported_arch`).
    ``explain`` and ``doctor`` run this; ``compile`` runs the same two functions, the
    second after its plan's own checks (``compile.check_cpp_inputs``). ``said`` names
    the value as the user gave it."""
    check_virtual_arch(arch, target, said)
    if code_type == "c++":
        check_supported_arch(arch, said)


def check_environment() -> None:
    """UsageError, before anything compiles, for an environment value a CUDA C++
    compile would refuse: ``CUFORGE_TOOLKIT_HEADERS`` naming a directory that holds no
    toolkit (the line names the variable; a compile failure, exit 1, before)."""
    from cuforge.compile.toolchain import check_toolkit_setting

    try:
        check_toolkit_setting()
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def check_warm_setting() -> None:
    """UsageError, before anything compiles, for a ``$CUFORGE_WARM`` that is neither on
    nor off (``banana`` read as "not warm", silently, before): the line names the
    variable and its values (``_warm.env_problem``)."""
    from cuforge import _warm

    problem = _warm.env_problem()
    if problem is not None:
        raise UsageError(problem)


def check_pre_includes(
    names: list[str], includes: list[str], folder: str = "", key: str = ""
) -> None:
    """UsageError naming ``-include FILE`` (or a warm manifest's ``pre_include``,
    ``key`` its words) for a file no compile could find -- a file the user named is
    a usage error, as a missing source is, not a compiler failure. Looked for exactly
    where NVRTC looks for ``--pre-include`` (and the cache's header tracking, which
    hands it the file, with it): an absolute path; else the working directory
    (``folder``: the manifest's, where warm compiles), each ``-I`` directory, then the
    CUDA header directories (located only when nothing else has it) -- never the
    sources' directories, which NVRTC does not search for it (a file found only there
    was accepted here, then the compile failed: ``cannot open source file``)."""
    base = folder or os.curdir
    dirs = [base, *(os.path.join(base, d) for d in includes)]
    toolkit: tuple[str, ...] | None = None
    for name in names:
        if os.path.isabs(name):
            if os.path.isfile(name):
                continue
        elif any(os.path.isfile(os.path.join(d, name)) for d in dirs):
            continue
        else:
            if toolkit is None:
                from cuforge.compile.toolchain import toolkit_include_dirs

                try:
                    toolkit = toolkit_include_dirs()
                except ValueError:  # said by check_environment
                    toolkit = ()
            if any(os.path.isfile(os.path.join(d, name)) for d in toolkit):
                continue
        said, dirs_word = (f"{key} {name}", "includes") if key else (f"-include {name}", "-I")
        if os.path.isabs(name):
            raise UsageError(f"{said}: no such file")
        place = "the manifest's" if folder else "the working"
        raise UsageError(
            f"{said}: no such file (looked in {place} directory, the {dirs_word} directories "
            "and the CUDA headers)"
        )


#: The ProgramOptions fields a warm manifest sets, and its keys for them.
MANIFEST_KEYS = {
    "arch": "arch",
    "define_macro": "defines",
    "include_path": "includes",
    "pre_include": "pre_include",
    "std": "std",
}


def in_words(message: str, fields: dict[str, Any], words: dict[str, str] = FLAGS) -> str:
    """ProgramOptions' ``message`` with the fields named as the user wrote them --
    ``words`` maps a field to its flag (``-D 1BAD has an invalid macro name '1BAD'``,
    not ``ProgramOptions.define_macro[0] ...``) or to a manifest's key
    (:data:`MANIFEST_KEYS`: ``defines 1BAD has ...``)."""

    def word(found: re.Match[str]) -> str:
        name, index = found.group(1), found.group(2)
        if name not in words:
            return found.group(0)
        value = fields.get(name)
        if isinstance(value, list) and index is not None and int(index) < len(value):
            return f"{words[name]} {value[int(index)]}"
        return words[name]

    return _FIELD.sub(word, message)


def refusal_in_words(exc: BaseException, manifest: bool = False) -> str:
    """A refusal of a compile through the cache (``UntrackableInclude``: an include
    cuforge cannot track) with its ways out in the command line's words -- ``-D
    HDR='"name.h"'`` and ``--no-cache``, not ``ProgramOptions.define_macro``, ``cache=``
    or ``extra_digest=`` -- or a warm manifest's (``manifest``: its ``defines`` key;
    warm compiles only into a cache, so no ``--no-cache``). Any other error: its own
    message."""
    way, why, macro = getattr(exc, "way", ""), getattr(exc, "why", ""), getattr(exc, "macro", None)
    if not way:
        return str(exc)
    uncached = "" if manifest else ", or compile with --no-cache"
    if way == "macro":
        if macro is None:  # a name no macro makes: nothing to define
            return f"{why}Spell the name out{uncached}"
        value = macro + '="name.h"'
        define = f"in defines = [{value!r}]" if manifest else f"with -D {macro}='\"name.h\"'"
        ways = ["Spell the name out", f"define the macro in the source or {define}"]
        if not manifest:
            ways.append("compile with --no-cache")
        return why + ", ".join(ways[:-1]) + ", or " + ways[-1]
    if way == "next":
        return f"{why}include the header by a path of its own{uncached}"
    return f"{why}Give one of the headers another name or path{uncached}"


def make_program(
    source: SourceFile, fields: dict[str, Any], words: dict[str, str] | None = FLAGS
) -> Program:
    """``Program(source, options)``; UsageError with ProgramOptions' message for bad
    values, naming the fields by ``words`` (:func:`in_words`: the flags, or a warm
    manifest's keys; None: ProgramOptions' own names)."""
    from cuforge.compile.options import ProgramOptions
    from cuforge.compile.program import Program

    try:
        return Program(source.code, source.code_type, ProgramOptions(**fields))
    except (TypeError, ValueError) as exc:
        if fields.get("arch") is None and "ProgramOptions.arch" in str(exc):
            raise UsageError(
                "no CUDA device here to take the architecture from; pass --arch sm_XY"
            ) from None
        message = str(exc) if words is None else in_words(str(exc), fields, words)
        raise UsageError(message) from None


def check_target(
    path: str, code_type: str, options: Any, target: str, part: str = "", where: str = ""
) -> None:
    """UsageError when ``path`` (of ``code_type``) cannot be compiled to ``target`` under
    ``options``: the compile layer's own rule (``targets.compile_target``, which the
    cached and the uncached compile both run), worded for the command line.
    ``part``: the ``-o NAME.fatbin`` this target is a part of; ``where``: the warm
    manifest's kernel and variant (its ``target`` key is then the setting to change).

    Run by every command before anything is compiled, looked up or stored: a refused
    target is a usage error (exit 2), never a compile failure or a cache entry.
    """
    from cuforge.compile.targets import SUPPORTED_TARGETS, compile_target

    try:
        compile_target(code_type, options, target)
    except ValueError as exc:
        prefix = f"{where}: " if where else ""
        valid = SUPPORTED_TARGETS[code_type]
        if target in valid:  # what the options contradict: the compile layer's words
            raise UsageError(f"{prefix}{path}: {exc}") from None
        kind = f"{path} is {_KINDS[code_type]}, which compiles to {' or '.join(valid)} only"
        if part:
            raise UsageError(f"-o {part} packs a {target} for {options.arch}; {kind}") from None
        if where:
            fix = "set target = " + " or ".join(f'"{t}"' for t in valid)
        elif valid == ("cubin",):
            fix = "leave --target out"
        else:
            fix = "pass " + " or ".join(f"--target {t}" for t in valid)
        raise UsageError(f"{prefix}{kind}, not {target}: {fix}") from None


def compile_through(
    program: Program, target: str, logs: Any, cache: ProgramCache | None
) -> tuple[Any, bool, Any, tuple[bytes, ...]]:
    """``program.compile(target, logs=logs, cache=cache)``, whether a compiler ran
    (False: the cache served it), what the store step did (a ``StoreOutcome``:
    stored, or not stored and why; None when nothing was stored or no cache) and the
    keys it stored under (``Compiled.keys``).

    The pipeline says both itself (``compile.cache.Compiled``), for this one call,
    so it stays right with many compiles sharing one cache handle across threads.
    """
    if cache is None:
        return program.compile(target, logs=logs), True, None, ()
    from cuforge import _warm
    from cuforge.compile.cache import compile_through_cache

    if not _warm.is_warm():
        done = compile_through_cache(program, target, (), logs, cache)
    else:  # a miss's compile counts in this cache's warm_compiles
        done = _warm.through(cache, lambda: compile_through_cache(program, target, (), logs, cache))
    if not done.ran:
        return done.obj, False, None, ()
    return done.obj, True, done.store, done.keys
