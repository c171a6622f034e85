"""Program cache keys: one 32-byte digest per distinct compile.

Guarantee: two calls return the same key only when everything that can change the
compiler's output is the same -- the schema version, code and target types, the
source, the exact flag list the consuming backend receives (less the toolkit's
include directories), the backend's exact build (see ``_identity``) and, for C++,
the CUDA header sets NVRTC gets (see ``_toolkit``), name expressions, NVVM
extras, ``options.name``, the working directory when debug or line info embeds
it, the content of every user header the compile can read, and the caller's
``extra_digest``. Each field is labelled and length-prefixed, in a fixed order,
so no two different inputs frame to the same bytes.

Headers: without ``extra_digest``, a C++ source that can read files (``#include``
of anything outside the compiler's own headers, ``include_path``,
``pre_include``) has its dependencies resolved (see ``_includes``): every file
found is in the key by search position, relative name and content digest, and
every candidate searched before it by its absence. With ``extra_digest`` the
caller fingerprints the content instead (``fingerprint_headers`` helps).
``Program.compile(cache=)`` does better than re-reading every header per lookup:
see ``cached.py`` and ``_manifest.py``.

Inputs whose effect the key cannot observe are refused with a ValueError that says
what to do: options with compile-time side effects (a hit would skip them),
precompiled headers and libdevice (unless ``extra_digest`` fingerprints them; so
always by ``compile(cache=)``, which takes no digest), and includes no scan can
resolve (``_includes.UntrackableInclude``).

Cost: the per-(options, code_type, target_type) part of the digest is prepared
once and reused (see ``ProgramOptions`` fingerprint caching); a key for a 1 KB
source then costs one hash copy and a few updates.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from cuforge._hashing import blake2b
from cuforge.compile import _inputs
from cuforge.compile.cache import _identity, _includes, _toolkit
from cuforge.compile.options import ProgramOptions
from cuforge.compile.targets import SUPPORTED_TARGETS, normalize_code_type, normalize_target

TYPE_CHECKING = False  # typing is not imported at run time: a first compile(cache=) paid ~4 ms
if TYPE_CHECKING:
    from typing import Any

#: Bumped whenever the framing or a field's meaning changes; old entries then miss.
KEY_SCHEMA_VERSION = 2

_SIDE_EFFECT_OPTIONS = ("create_pch", "time", "fdevice_time_trace")
_NVRTC_EXTERNAL_OPTIONS = ("pch", "use_pch", "pch_dir")
_INCLUDE_FLAG = b"--include-path="
_NO_SOURCE_INCLUDE = b"--no-source-include"


def _frame(label: bytes, value: bytes) -> bytes:
    return label + len(value).to_bytes(8, "little") + value


def _is_set(value: Any) -> bool:
    return value is not None and value is not False and value != () and value != []


class _Backend:
    """How one code_type validates, fingerprints and pins its compiler."""

    code_type: str

    def validate(self, options: ProgramOptions, has_extra_digest: bool) -> None:
        for field in _SIDE_EFFECT_OPTIONS:
            if _is_set(getattr(options, field, None)):
                raise ValueError(
                    f"options.{field} has a compile-time side effect that a cache hit would "
                    f"skip; compile without cache= or unset {field}"
                )

    def identity(self) -> bytes:
        raise NotImplementedError

    def describe(self) -> str:
        """The identity for people (records, ``cuforge cache ls``, ``explain``)."""
        return self.identity().decode("utf-8", "replace")

    def option_fingerprint(self, options: ProgramOptions, closed: bool = False) -> bytes:
        raise NotImplementedError

    def extra_fields(self, options: ProgramOptions) -> Iterable[bytes]:
        return ()


def _need_extra_digest(what: str, content: str) -> ValueError:
    """The refusal of an input whose ``content`` (the files it names) the key cannot
    see. Raised by ``make_program_cache_key`` without ``extra_digest`` and by
    ``compile(cache=)``, which takes no digest: so it says both ways out."""
    return ValueError(
        f"{what} makes the output depend on {content}, which the cache key cannot see, "
        "and compile(cache=) takes no digest of it: compile without cache=, or key the "
        "compile yourself -- cuforge.utils.make_program_cache_key(..., extra_digest="
        f"fingerprint_headers({_FILES[content]})), then cache.get(key) and cache[key] = "
        "the result (docs/headers.md)"
    )


_PCH = "the precompiled header's content"
_LIBDEVICE = "libdevice.10.bc, the NVVM library it links"
_FILES = {_PCH: "[the .pch files]", _LIBDEVICE: '[cuda.pathfinder.find_bitcode_lib("device")]'}


class _NvrtcBackend(_Backend):
    code_type = "c++"

    def validate(self, options: ProgramOptions, has_extra_digest: bool) -> None:
        super().validate(options, has_extra_digest)
        if has_extra_digest:
            return
        for field in _NVRTC_EXTERNAL_OPTIONS:
            if _is_set(getattr(options, field, None)):
                raise _need_extra_digest(f"options.{field} (a precompiled header)", _PCH)

    _memo: tuple[bytes, bytes, bytes] = (b"", b"", b"")

    def identity(self) -> bytes:
        # The toolkit headers NVRTC gets are the compiler's too (see _toolkit): a new
        # CCCL or runtime header set is a new compiler. Both parts are computed once
        # per process; the memo returns the same bytes object, whose hash is cached,
        # so a hit pays two calls and two identity checks for them.
        nvrtc = _identity.nvrtc_identity()
        headers = _toolkit.toolkit_identity()
        memo = self._memo
        if memo[0] is nvrtc and memo[1] is headers:
            return memo[2]
        ident = _frame(b"nvrtc", nvrtc) + _frame(b"headers", headers)
        self._memo = (nvrtc, headers, ident)
        return ident

    def describe(self) -> str:
        self.identity()
        nvrtc, headers, _ = self._memo
        digest = _toolkit.identity_digest(headers)  # what toolkit_headers() prints
        return f"{nvrtc.decode('utf-8', 'replace')}|headers:{digest}"

    def option_fingerprint(self, options: ProgramOptions, closed: bool = False) -> bytes:
        # The toolkit's --include-path flags are not here: their locations do not
        # change the output, their content is pinned by identity().
        return b"\0".join(closed_flags(options) if closed else options.as_nvrtc_options())


class _LinkerBackend(_Backend):
    code_type = "ptx"

    def identity(self) -> bytes:
        from cuforge.compile.linker import linker_backend

        if linker_backend() == "nvjitlink":
            return b"nvjitlink|" + _identity.nvjitlink_identity()
        # The driver JIT-compiles PTX on this path, so its version shapes the output.
        return b"driver-linker|" + _identity.driver_identity()

    def option_fingerprint(self, options: ProgramOptions, closed: bool = False) -> bytes:
        from cuforge.compile.linker import linker_backend

        if linker_backend() == "nvjitlink":
            return b"\0".join(options.as_nvjitlink_options())
        return b"\0".join(options.as_driver_linker_options())


class _NvvmBackend(_Backend):
    code_type = "nvvm"

    def validate(self, options: ProgramOptions, has_extra_digest: bool) -> None:
        super().validate(options, has_extra_digest)
        if options.use_libdevice and not has_extra_digest:
            raise _need_extra_digest("options.use_libdevice=True", _LIBDEVICE)

    def identity(self) -> bytes:
        return _identity.nvvm_identity()

    def option_fingerprint(self, options: ProgramOptions, closed: bool = False) -> bytes:
        return b"\0".join(options.as_nvvm_options())

    def extra_fields(self, options: ProgramOptions) -> Iterable[bytes]:
        sources = options.extra_sources or ()
        yield _frame(b"extra_sources", len(sources).to_bytes(4, "little"))
        for name, code in sources:
            yield _frame(b"extra_name", name.encode() if isinstance(name, str) else bytes(name))
            yield _frame(b"extra_code", code.encode() if isinstance(code, str) else bytes(code))
        yield _frame(b"libdevice", b"1" if options.use_libdevice else b"0")


_BACKENDS: dict[str, _Backend] = {
    b.code_type: b for b in (_NvrtcBackend(), _LinkerBackend(), _NvvmBackend())
}


def closed_flags(options: ProgramOptions) -> list[bytes]:
    """The NVRTC flags of a "closed world" compile (``compile(cache=)`` with tracked
    headers): the user's include directories are not passed -- their files go to
    NVRTC in memory -- and the source directory is not searched."""
    flags = [f for f in options.as_nvrtc_options() if not f.startswith(_INCLUDE_FLAG)]
    if _NO_SOURCE_INCLUDE not in flags:
        flags.append(_NO_SOURCE_INCLUDE)
    return flags


def embeds_cwd(options: ProgramOptions) -> bool:
    """Debug and line info name source files by absolute path: the working
    directory then shapes the output."""
    return bool(options.debug or options.lineinfo)


def _encode_name_expressions(name_expressions: Sequence[str | bytes]) -> bytes:
    encoded = []
    for i, item in enumerate(name_expressions):
        if isinstance(item, str):
            encoded.append(b"s" + item.encode())
        elif isinstance(item, bytes):
            encoded.append(b"b" + item)
        else:
            raise TypeError(
                f"name_expressions[{i}] must be str or bytes, got {type(item).__name__} "
                "(bytearray is unhashable and cannot key ObjectCode.symbol_mapping)"
            )
    # Order is not significant to the compiler's output.
    encoded.sort()
    return b"".join(_frame(b"ne", e) for e in encoded)


def _prefix(
    backend: _Backend,
    code_type: str,
    target: str,
    options: ProgramOptions,
    has_extra: bool,
    closed: bool = False,
) -> blake2b:
    """The digest state over every field that depends only on options and types.

    Validation and fingerprinting run once per (options, code_type, target,
    compiler, extra_digest given?, closed world?) -- options are frozen, so the
    result stays true.
    """
    fields = options.__dict__
    cache = fields.get("_cuforge_key_prefix")
    if cache is None:  # setdefault would build a dict on every call
        cache = fields["_cuforge_key_prefix"] = {}
    ident = backend.identity()
    slot = (code_type, target, ident, has_extra, closed)
    state: blake2b | None = cache.get(slot)
    if state is None:
        if code_type != "nvvm" and _is_set(getattr(options, "extra_sources", None)):
            raise ValueError("options.extra_sources is only supported for code_type 'nvvm'")
        backend.validate(options, has_extra)
        state = blake2b(digest_size=32)
        state.update(_frame(b"schema", str(KEY_SCHEMA_VERSION).encode()))
        state.update(_frame(b"code_type", code_type.encode()))
        state.update(_frame(b"target", target.encode()))
        state.update(_frame(b"compiler", ident))
        state.update(_frame(b"options", backend.option_fingerprint(options, closed)))
        if closed:
            n_dirs = len(options.include_path or ())
            state.update(_frame(b"closed", str(n_dirs).encode()))
        for field in backend.extra_fields(options):
            state.update(field)
        state.update(_frame(b"name", (options.name or "").encode("utf-8", "surrogateescape")))
        cache[slot] = state
    return state.copy()


def _checked_pairs(options: ProgramOptions) -> dict[tuple[str, str], tuple[str, str]]:
    """The memo on ``options`` of (code_type, target_type) as given -> canonical pair,
    for pairs that passed every check depending only on them and these options."""
    memo: dict[tuple[str, str], tuple[str, str]]
    memo = options.__dict__.setdefault("_cuforge_checked_pairs", {})
    return memo


def _checked_pair(
    options: object, code_type: object, target_type: object
) -> tuple[str, str] | None:
    """The canonical (code_type, target) when ``options`` already passed the
    option checks for exactly this pair (options are frozen, and the linker backend
    the PTX checks depend on is fixed per process), else None: run the checks."""
    if type(code_type) is not str or type(target_type) is not str:
        return None
    if not isinstance(options, ProgramOptions):
        return None
    memo: dict[tuple[str, str], tuple[str, str]] = options.__dict__.get(
        "_cuforge_checked_pairs", {}
    )
    return memo.get((code_type, target_type))


def make_program_cache_key(
    *,
    code: str | bytes,
    code_type: str,
    options: ProgramOptions,
    target_type: str,
    name_expressions: Sequence[str | bytes] = (),
    extra_digest: bytes | None = None,
) -> bytes:
    """A stable 32-byte key for one compile; see the module docstring for what it pins.

    Accepts exactly what ``Program(code, code_type, options).compile(target_type,
    name_expressions, cache=...)`` accepts (the same checks, ``compile/_inputs.py``).

    Raises:
        TypeError: ``options`` is not a ProgramOptions, ``code`` or ``extra_digest``
            has the wrong type, or a name expression is not str/bytes.
        ValueError: unknown code_type/target_type or an unsupported pair; empty code;
            name expressions for a non-C++ program; a target the options contradict
            (cubin without an sm_XY arch, LTO options without 'ltoir'); options a
            backend cannot honour; options with side effects; precompiled headers or
            libdevice without ``extra_digest``; an include no scan can resolve (UntrackableInclude);
            for C++, CUFORGE_TOOLKIT_HEADERS naming a directory without a toolkit.

    Without ``extra_digest``, a C++ source that can read headers has them resolved
    and read on every call (see the module docstring); give ``extra_digest`` (e.g.
    from ``fingerprint_headers``) to fingerprint them yourself instead.
    """
    # The checks Program(code, code_type, options).compile(target_type, names) makes, in
    # its order (one module, compile/_inputs.py, so they cannot drift). Those that
    # depend on the options and the type pair alone ran once for these (frozen) options.
    known = _checked_pair(options, code_type, target_type)
    if known is None:
        code_type = normalize_code_type(code_type)
        code_bytes = _inputs.code_bytes(code, code_type)
        if not isinstance(options, ProgramOptions):
            raise TypeError(f"options must be a ProgramOptions, got {type(options).__name__}")
        _BACKENDS[code_type].option_fingerprint(options)  # options it cannot honour: ValueError
        target = normalize_target(code_type, target_type)
        name_expressions = _inputs.name_tuple(code_type, name_expressions)
        _inputs.check_target(options, target)
        _checked_pairs(options)[(code_type, target_type)] = (code_type, target)
    else:
        code_type, target = known
        code_bytes = _inputs.code_bytes(code, code_type)
        name_expressions = _inputs.name_tuple(code_type, name_expressions)
    if extra_digest is not None and not isinstance(extra_digest, bytes):
        raise TypeError(
            f"extra_digest must be bytes (a digest of the external content), got "
            f"{type(extra_digest).__name__}"
        )
    if (
        code_type == "c++"
        and extra_digest is None
        and (_is_set(options.pre_include) or _includes.may_name_files(code_bytes))
    ):
        roots = source_roots(options)
        if _includes.may_read_user_files(
            _includes.scan(code_bytes), bool(roots.user), roots.source is not None
        ) or _is_set(options.pre_include):
            deps = _includes.resolve(
                code_bytes, options.name or "<source>", roots,
                options.define_macro or (), options.pre_include or (),
            )  # fmt: skip
            return program_key(
                code_type, target, options, code_bytes, name_expressions, None, deps=deps
            )
    return program_key(code_type, target, options, code_bytes, name_expressions, extra_digest)


def source_roots(options: ProgramOptions, toolkit: tuple[str, ...] = ()) -> _includes.Roots:
    """The include search roots of a C++ compile with ``options`` here and now."""
    cwd = os.getcwd()
    name = options.name or ""
    source = None
    if not options.no_source_include:
        source = os.path.join(cwd, os.path.dirname(name)) if os.path.dirname(name) else cwd
    user = tuple(os.path.join(cwd, d) for d in options.include_path or ())
    return _includes.Roots(source, cwd, user, toolkit)


def program_key(
    code_type: str,
    target: str,
    options: ProgramOptions,
    code_bytes: bytes,
    name_expressions: Sequence[str | bytes],
    extra_digest: bytes | None,
    *,
    closed: bool = False,
    deps: _includes.DepSet | None = None,
    label: bytes = b"",
) -> bytes:
    """The key for already-normalised types and encoded code (``Program``'s fast path).

    ``deps`` folds resolved dependencies in: with ``closed`` (the closed world) the
    in-memory headers NVRTC is given, by name and content digest; otherwise every
    file found (position, relative name, digest) and every absent candidate.
    ``label`` separates keys of different roles (a manifest's key from an entry's).
    """
    state = _prefix(
        _BACKENDS[code_type], code_type, target, options, extra_digest is not None, closed
    )
    # Framed like _frame, without copying the source into a new bytes object.
    state.update(b"code" + len(code_bytes).to_bytes(8, "little"))
    state.update(code_bytes)
    if name_expressions:
        state.update(_encode_name_expressions(name_expressions))
    if extra_digest is not None:
        state.update(_frame(b"extra_digest", extra_digest))
    if code_type == "c++" and embeds_cwd(options):
        state.update(_frame(b"cwd", os.getcwd().encode("utf-8", "surrogateescape")))
    if label:
        state.update(_frame(b"role", label))
    if deps is not None:
        if closed:
            for name, digest in deps.header_digests():
                state.update(_frame(b"header", name.encode("utf-8", "surrogateescape")))
                state.update(_frame(b"digest", digest.encode()))
        else:
            for (pos, rel), dep in sorted(deps.files.items()):
                state.update(_frame(b"file", f"{pos}\0{rel}".encode("utf-8", "surrogateescape")))
                state.update(_frame(b"digest", dep.digest.encode()))
            for pos, rel in sorted(deps.absent):
                state.update(_frame(b"absent", f"{pos}\0{rel}".encode("utf-8", "surrogateescape")))
    return state.digest()


def fingerprint_headers(paths: Iterable[str | os.PathLike[str]]) -> bytes:
    """A 32-byte digest of the named files' contents, in the order given, for
    ``make_program_cache_key(extra_digest=...)`` when you track headers yourself.

    Each file contributes its content (framed, so moving bytes between files
    changes the digest); names and locations do not count.

    Raises:
        TypeError: ``paths`` is a single path rather than a collection of paths.
        OSError: a file cannot be read (the message names it).
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError("paths must be a list of paths, not a single path")
    state = blake2b(digest_size=32, person=b"cuforge-headers")
    for path in paths:
        with open(os.fspath(path), "rb") as f:
            state.update(_frame(b"file", f.read()))
    return state.digest()


__all__ = [
    "KEY_SCHEMA_VERSION",
    "SUPPORTED_TARGETS",
    "fingerprint_headers",
    "make_program_cache_key",
]
