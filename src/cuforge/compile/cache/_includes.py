"""Which files a CUDA C++ compile can read, found the way NVRTC finds them.

NVRTC has no ``-M``: it cannot say which files it opened. So cuforge finds them
itself, as a safe superset, and (for ``compile(cache=)``) hands NVRTC exactly those
files as in-memory headers, so the compiler reads nothing else from the user's
directories (see ``cached.py``: the "closed world").

Search order (checked against NVRTC 13.x; see docs/architecture.md):

- ``#include "x"`` in a file F: F's own directory, then each ``include_path`` entry
  in order. For the main source F's directory is the source directory (the
  directory part of ``options.name``, else the working directory) unless
  ``no_source_include`` is set.
- ``#include <x>``: each ``include_path`` entry in order.
- ``--pre-include=x``: the working directory, then each ``include_path`` entry.
- an absolute name: that path.
- after the user's directories come the toolkit's ("the compiler's"): a name found
  there is covered by the compiler identity in the key and is not read or tracked.

Completeness: every ``#include``/``#import`` and ``__has_include`` operand in every
user file is resolved, whatever ``#if`` branch it sits in (a superset can only
cause extra misses). A name found in a user directory is a dependency (position,
relative path, content digest); every user-directory candidate searched before it,
and every candidate of a name found nowhere, is recorded as absent, so a file
created there later (which would shadow or newly satisfy the include) is noticed.
``#include MACRO`` is resolved through every object-like definition of the macro
in the scanned files and ``-D`` options. Where that is not possible, or where the
in-memory mechanism cannot express the search (``#include_next``; one name meaning
different files in one compile), :class:`UntrackableInclude` says what to do.
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
import threading
import time
from collections import OrderedDict, namedtuple
from collections.abc import Iterable

from cuforge._hashing import blake2b

TYPE_CHECKING = False  # dataclasses imports inspect (ast, dis, tokenize): ~5 ms of a
if TYPE_CHECKING:  # process's first compile(cache=); cuforge._fields makes Roots
    from dataclasses import dataclass
else:
    from cuforge._fields import dataclass

__all__ = [
    "ABSOLUTE",
    "CWD",
    "SOURCE",
    "Analysis",
    "DepSet",
    "Directive",
    "FileDep",
    "Roots",
    "UntrackableInclude",
    "analyse",
    "file_digest",
    "may_name_files",
    "may_read_user_files",
    "resolve",
    "scan",
]

#: Search-root positions as they appear in manifests ("0", "1", ... are include_path).
SOURCE, CWD, ABSOLUTE = "S", "C", "A"

# A directive starts with "#" or its digraph "%:" (or, below C++17, the trigraph "??="),
# and blanks or block comments may stand between it and the directive's name.
_HASH = rb"(?:#|%:|\?\?=)"
_GAP = rb"(?:[ \t]|/\*(?:[^*]|\*(?!/))*\*/)*"
_MAX_MACRO_DEPTH = 32


class _Patterns:
    """The patterns of the scan, compiled when a first file is scanned: a process
    whose programs can read no file (``may_name_files``: most) never compiles them
    (~1 ms of its first compile(cache=), paid by every rank of a job at once)."""

    __slots__ = ("comment", "define", "directive", "has_include", "line_start", "macro_body",
                 "operand")  # fmt: skip

    def __init__(self) -> None:
        self.operand = re.compile(_GAP + rb'(?:"([^"\n]*)"|<([^>\n]*)>|([A-Za-z_]\w*)?)')
        self.directive = re.compile(_HASH + _GAP + rb"(include_next|include|import)\b")
        self.has_include = re.compile(rb"__has_include(_next)?" + _GAP + rb"\(")
        self.line_start = re.compile(rb"(?:^|\n)[ \t]*(?:/\*.*?\*/[ \t]*)*$", re.DOTALL)
        self.define = re.compile(
            rb"^[ \t]*" + _HASH + _GAP + rb"define[ \t]+([A-Za-z_]\w*)(\(?)(.*)$", re.MULTILINE
        )
        self.comment = re.compile(rb"/\*.*?\*/|//.*")
        self.macro_body = re.compile(rb'"([^"]*)"|<([^>]*)>|([A-Za-z_]\w*)')


_compiled: list[_Patterns] = []  # the one _Patterns, once made


def _patterns() -> _Patterns:
    """The scan's patterns (compiled on the first call; two threads racing to it
    compile twice, harmlessly)."""
    if not _compiled:
        _compiled.append(_Patterns())
    return _compiled[0]


class UntrackableInclude(ValueError):
    """cuforge cannot know every file this compile may read; the message says why
    and what to do, in the Python API's words. For a caller that says the ways out in
    its own (the command line): ``why`` is the message before them, ``way`` the case
    -- ``"macro"`` (define ``macro``, None for a name no macro makes, or spell the
    name out), ``"next"`` (include the header by a path of its own), ``"names"``
    (rename one of two headers) -- and each case may also compile without the cache."""

    def __init__(
        self, message: str, *, why: str = "", way: str = "", macro: str | None = None
    ) -> None:
        super().__init__(message)
        self.why, self.way, self.macro = why or message, way, macro


def _refusal(why: str, ways: str, way: str, macro: str | None = None) -> UntrackableInclude:
    """The refusal ``why`` + ``ways`` (the Python API's ways out) of case ``way``."""
    return UntrackableInclude(why + ways, why=why, way=way, macro=macro)


class Directive(namedtuple("Directive", ["kind", "spelling", "angle", "macro", "line", "certain"])):
    """One include-like construct found in a file."""

    __slots__ = ()

    kind: str  # "include", "include_next", "has_include", "has_include_next"
    spelling: str | None  # the name between quotes/brackets; None: computed (macro)
    angle: bool
    macro: str | None  # the macro name of a computed include, if it is one identifier
    line: int
    certain: bool  # a directive at the start of a line (not text inside a string, say)


def _line_of(text: bytes, pos: int) -> int:
    return text.count(b"\n", 0, pos) + 1


def may_name_files(text: bytes) -> bool:
    """False only when ``text`` cannot read any file: every construct that can spells
    ``include`` or ``import``, and only a line splice can split those words (digraphs
    and comments cannot). The cheap test before :func:`scan` on the hit path."""
    if b"\\" in text or b"?" in text:
        text = _joined(_joined(text, False), True)
    return b"include" in text or b"import" in text


def _joined(text: bytes, trigraphs: bool) -> bytes:
    """``text`` with its line splices removed: backslash-newline, or with
    ``trigraphs`` its spelling ``??/``-newline too (which NVRTC honours below C++17)."""
    for splice in (b"??/\r\n", b"??/\n") if trigraphs else (b"\\\r\n", b"\\\n"):
        if splice in text:
            text = text.replace(splice, b"")
    return text


def scan(text: bytes) -> list[Directive]:
    """Every include-like construct in ``text`` (a superset: ``#if`` is ignored).

    Line splices are removed first; where ``??/`` appears, the text is scanned both
    with and without trigraph splices (the language standard decides which holds),
    and the union returned. Literal operands are taken wherever they appear; a
    computed operand is ``certain`` only for a directive that starts its line (a
    ``#include X`` inside a string literal must not refuse the compile).
    """
    text = _joined(text, False)
    found = _scan_joined(text)
    if b"??/" in text:
        seen = {d[:4] for d in found}
        found += [d for d in _scan_joined(_joined(text, True)) if d[:4] not in seen]
    return found


def _scan_joined(text: bytes) -> list[Directive]:
    found: list[Directive] = []
    p = _patterns()
    for pattern in (p.directive, p.has_include):
        for m in pattern.finditer(text):
            op = p.operand.match(text, m.end())
            assert op is not None  # every group is optional
            quoted, bracket, macro = op.groups()
            if pattern is p.directive:
                kind = "include_next" if m.group(1) == b"include_next" else "include"
                start = text.rfind(b"\n", 0, m.start()) + 1
                certain = p.line_start.match(b"\n" + text[start : m.start()]) is not None
            else:
                kind = "has_include_next" if m.group(1) else "has_include"
                certain = True
            spelling = quoted if quoted is not None else bracket
            found.append(
                Directive(
                    kind,
                    None if spelling is None else spelling.decode("utf-8", "surrogateescape"),
                    bracket is not None,
                    None if macro is None else macro.decode(),
                    _line_of(text, m.start()),
                    certain,
                )
            )
    return found


class Analysis(namedtuple("Analysis", ["directives", "defines"])):
    """What resolution needs of one file: its include-like constructs and the macros
    it defines (name -> body; None for a function-like macro)."""

    __slots__ = ()

    directives: list[Directive]
    defines: list[tuple[str, bytes | None]]


def analyse(text: bytes) -> Analysis:
    """:func:`scan` ``text`` and collect its ``#define`` lines (splices joined first)."""
    text = _joined(text, False)  # scan() finds nothing left to join
    defines = [
        (m.group(1).decode(), None if m.group(2) else m.group(3))
        for m in _patterns().define.finditer(text)
    ]
    return Analysis(scan(text), defines)


# Content digest -> Analysis of a header seen before: a JIT process compiles many
# sources that include the same headers, and a miss need not run the regexes over
# them again. Keyed by content digest, so an edited file is analysed afresh. Bounded
# in entries and in the bytes its directives and macro bodies hold.
_ANALYSIS_MAX = 4096
_ANALYSIS_MAX_BYTES = 16 << 20
_analysis_lock = threading.Lock()
_analysis: OrderedDict[str, tuple[Analysis, int]] = OrderedDict()
_analysis_bytes = 0


def _size(found: Analysis) -> int:
    return 64 * len(found.directives) + sum(64 + len(b or b"") for _, b in found.defines)


def _analysed(text: bytes, digest: str) -> Analysis:
    global _analysis_bytes
    with _analysis_lock:
        known = _analysis.get(digest)
        if known is not None:
            _analysis.move_to_end(digest)
            return known[0]
    found = analyse(text)
    size = _size(found)
    with _analysis_lock:
        if digest not in _analysis:
            _analysis[digest] = (found, size)
            _analysis_bytes += size
        while _analysis and (
            len(_analysis) > _ANALYSIS_MAX or _analysis_bytes > _ANALYSIS_MAX_BYTES
        ):
            _analysis_bytes -= _analysis.popitem(last=False)[1][1]
    return found


def may_read_user_files(
    directives: Iterable[Directive], has_user_dirs: bool, source_dir_searched: bool
) -> bool:
    """Whether a source with these directives can read anything outside the
    compiler's own headers (when False, no manifest is needed)."""
    if has_user_dirs:
        return any(True for _ in directives)
    for d in directives:
        if d.spelling is None or os.path.isabs(d.spelling):
            return True
        if not d.angle and source_dir_searched:
            return True
    return False


@dataclass(frozen=True)
class Roots:
    """Where the search looks, by position. ``source`` is None with no_source_include."""

    source: str | None
    cwd: str
    user: tuple[str, ...]
    toolkit: tuple[str, ...] = ()

    def path(self, pos: str, rel: str) -> str | None:
        """The absolute path of ``rel`` under position ``pos`` (None: no such root)."""
        if pos == ABSOLUTE:
            return rel
        if pos == SOURCE:
            base = self.source
        elif pos == CWD:
            base = self.cwd
        else:
            try:
                base = self.user[int(pos)]
            except (ValueError, IndexError):
                return None
        return None if base is None else os.path.join(base, rel)


class FileDep(namedtuple("FileDep", ["pos", "rel", "digest", "stat"])):
    """A user file the compile reads: where it was found and what it held."""

    __slots__ = ()

    pos: str
    rel: str
    digest: str  # hex blake2b-128 of the content
    stat: tuple[int, int, int, int]  # (size, mtime_ns, ino, ctime_ns) when read


class DepSet:
    """The result of :func:`resolve`.

    ``headers`` maps each in-memory header name (an include spelling) to its
    content; ``files`` and ``absent`` are what a manifest records and validates.
    """

    __slots__ = ("absent", "digests", "files", "headers", "started_ns")

    def __init__(self) -> None:
        self.headers: dict[str, bytes] = {}
        self.digests: dict[str, str] = {}  # header name -> file_digest
        self.files: dict[tuple[str, str], FileDep] = {}
        self.absent: set[tuple[str, str]] = set()
        self.started_ns = time.time_ns()  # before any file was looked at

    def header_digests(self) -> list[tuple[str, str]]:
        """Sorted (name, content digest) pairs: exactly what NVRTC is given."""
        return sorted((n, self.digests.get(n) or file_digest(c)) for n, c in self.headers.items())


def file_digest(content: bytes) -> str:
    return blake2b(content, digest_size=16).hexdigest()


def _read_regular(path: str) -> tuple[bytes, os.stat_result] | None:
    """Content and stat of a regular file at ``path``; None when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode):
            return None
        data = os.read(fd, st.st_size + 1)  # one read for a file that did not grow
        if len(data) > st.st_size:
            chunks = [data]
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data, st
    finally:
        os.close(fd)


def _is_file(path: str) -> bool:
    try:
        return stat_mod.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


# What a spelling resolved to: ("user", pos, rel, digest) | ("toolkit",) | ("none",)
_Target = tuple[str, ...]
_Includer = tuple[str, str] | None


class _Resolver:
    """One resolution: files found, absent candidates, and one meaning per name."""

    def __init__(self, roots: Roots, defines: Iterable[str]) -> None:
        self.roots = roots
        self.out = DepSet()
        self.contents: dict[tuple[str, str], bytes] = {}
        self.names: dict[str, tuple[_Target, str]] = {}  # spelling -> (content id, where)
        self.macros: dict[str, set[bytes | None]] = {}  # None: function-like
        for item in defines:
            name, eq, value = item.partition("=")
            self.macros.setdefault(name, set()).add(value.encode() if eq else b"1")
        self.unscanned: list[tuple[Analysis, _Includer, str]] = []
        self.toolkit_prefixes = tuple(d.rstrip(os.sep) + os.sep for d in roots.toolkit)

    # -- candidates and lookup ------------------------------------------------------
    def _candidates(self, spelling: str, angle: bool, includer: _Includer) -> list[tuple[str, str]]:
        if os.path.isabs(spelling):
            return [(ABSOLUTE, spelling)]
        out = []
        if not angle and includer is not None:
            pos, rel = includer
            out.append((pos, os.path.join(os.path.dirname(rel), spelling)))
        out.extend((str(i), spelling) for i in range(len(self.roots.user)))
        return out

    def _lookup(self, spelling: str, angle: bool, includer: _Includer) -> _Target:
        for pos, rel in self._candidates(spelling, angle, includer):
            path = self.roots.path(pos, rel)
            if path is None:
                continue
            known = self.out.files.get((pos, rel))
            if known is not None:
                return ("user", pos, rel, known.digest)
            if (pos, rel) in self.out.absent:
                continue
            if pos != ABSOLUTE and self._in_toolkit_root(path):
                return ("toolkit",)
            found = _read_regular(path)
            if found is None:
                self.out.absent.add((pos, rel))
                continue
            content, st = found
            stat = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
            dep = FileDep(pos, rel, file_digest(content), stat)
            self.out.files[(pos, rel)] = dep
            self.contents[(pos, rel)] = content
            self.unscanned.append((_analysed(content, dep.digest), (pos, rel), path))
            return ("user", pos, rel, dep.digest)
        if not os.path.isabs(spelling) and any(
            _is_file(os.path.join(d, spelling)) for d in self.roots.toolkit
        ):
            return ("toolkit",)
        return ("none",)

    def _in_toolkit_root(self, path: str) -> bool:
        """A user include directory that is one of the toolkit's own counts as the
        compiler's (it is in the key through the toolkit identity)."""
        return bool(self.toolkit_prefixes) and path.startswith(self.toolkit_prefixes)

    def _bind(self, spelling: str, target: _Target, where: str) -> None:
        """Record what ``spelling`` means; one name must mean one content."""
        if target[0] == "user":
            content_id: _Target = ("user", target[3])
            self.out.headers[spelling] = self.contents[(target[1], target[2])]
            self.out.digests[spelling] = target[3]
        else:
            content_id = target
        seen = self.names.get(spelling)
        if seen is None:
            self.names[spelling] = (content_id, where)
        elif seen[0] != content_id:
            raise _refusal(
                f"the include name {spelling!r} means different files in one compile "
                f"({seen[1]} and {where}); NVRTC's in-memory headers have one name space, so "
                "a compile through the cache cannot hand both to the compiler. ",
                "Give one of the headers another name or path, or compile without cache=",
                "names",
            )

    # -- macros ---------------------------------------------------------------------------
    def _learn_defines(self, defines: list[tuple[str, bytes | None]]) -> None:
        """Add the object-like (and note function-like) macros a file defines."""
        for name, body in defines:
            self.macros.setdefault(name, set()).add(body)

    def _expand(self, macro: str, depth: int = 0) -> set[tuple[str, bool]] | None:
        """Every (spelling, angle) ``macro`` can expand to; None when unknown."""
        bodies = self.macros.get(macro)
        if not bodies or depth > _MAX_MACRO_DEPTH:
            return None
        out: set[tuple[str, bool]] = set()
        for body in bodies:
            if body is None:
                return None
            p = _patterns()
            text = p.comment.sub(b"", body).strip()
            op = p.macro_body.fullmatch(text)
            if op is None:
                return None
            if op.group(3) is not None:
                inner = self._expand(op.group(3).decode(), depth + 1)
                if inner is None:
                    return None
                out |= inner
            else:
                quoted = op.group(1)
                spelling = quoted if quoted is not None else op.group(2)
                out.add((spelling.decode("utf-8", "surrogateescape"), quoted is None))
        return out

    # -- directives -------------------------------------------------------------------------
    def _include(self, spelling: str, angle: bool, includer: _Includer, where: str) -> None:
        if spelling:
            self._bind(spelling, self._lookup(spelling, angle, includer), where)

    def _directive(
        self,
        d: Directive,
        includer: _Includer,
        label: str,
        computed: list[tuple[Directive, _Includer, str]],
    ) -> None:
        where = f"{label}:{d.line}"
        if d.kind in ("include_next", "has_include_next"):
            if d.certain:
                raise _refusal(
                    f"{where} uses #include_next / __has_include_next, which NVRTC's "
                    "in-memory headers cannot express; ",
                    "compile without cache=, or include the header by a path of its own",
                    "next",
                )
        elif d.spelling is not None:
            self._include(d.spelling, d.angle, includer, where)
        else:
            computed.append((d, includer, where))

    def _computed(self, d: Directive, includer: _Includer, where: str, final: bool) -> None:
        expanded = None if d.macro is None else self._expand(d.macro)
        if expanded is None:
            if final and d.certain:
                what = d.macro or "a computed name"
                raise _refusal(
                    f"{where}: cuforge cannot tell which file this include reads ({what} is "
                    'not a macro defined as "name" or <name> in the files it scanned or by '
                    "the compile's options), so a cached result could go stale. ",
                    "Spell the name out, define the macro in the source or in "
                    "ProgramOptions.define_macro, or fingerprint the headers yourself and "
                    "pass extra_digest= to make_program_cache_key",
                    "macro",
                    d.macro,
                )
            return
        for spelling, angle in sorted(expanded):
            self._include(spelling, angle, includer, where)

    def run(self, source: Analysis, source_label: str, pre_includes: Iterable[str]) -> DepSet:
        main: _Includer = None if self.roots.source is None else (SOURCE, "")
        self.unscanned.append((source, main, source_label))
        for spelling in pre_includes:
            self._include(spelling, False, (CWD, ""), f"pre_include {spelling!r}")
        computed: list[tuple[Directive, _Includer, str]] = []
        # Literal includes first; then computed ones with every definition seen so
        # far, which may find more files (and definitions): repeat to a fixpoint.
        while True:
            while self.unscanned:
                analysis, includer, label = self.unscanned.pop(0)
                self._learn_defines(analysis.defines)
                for d in analysis.directives:
                    self._directive(d, includer, label, computed)
            for d, includer, where in computed:
                self._computed(d, includer, where, final=False)
            if not self.unscanned:
                break
        for d, includer, where in computed:
            self._computed(d, includer, where, final=True)
        return self.out


def resolve(
    source: bytes,
    source_label: str,
    roots: Roots,
    defines: Iterable[str] = (),
    pre_includes: Iterable[str] = (),
    analysis: Analysis | None = None,
) -> DepSet:
    """Every user file the compile of ``source`` can read, and every absent candidate.

    ``analysis`` is ``analyse(source)`` when the caller has it already.

    Raises UntrackableInclude (a ValueError) where completeness cannot be
    guaranteed or the in-memory mechanism cannot express the search.
    """
    found = analysis if analysis is not None else analyse(source)
    return _Resolver(roots, defines).run(found, source_label, pre_includes)
