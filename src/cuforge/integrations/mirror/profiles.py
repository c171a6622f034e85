"""Profiles: what the directory mirror needs to know about one JIT, as data.

A :class:`Profile` names the variables that point the JIT at its directory, the
JIT's own default when none is set, how to read the JIT's version (distributions
whose installed versions key the entries, or a ``module:attribute``), which files
in the directory are never published (temp names, locks, build directories in
progress), whether the files depend on the GPU, and which files are valid only
together (``bundle``). :data:`PROFILES` holds the
built-in ones; :func:`load_profiles` parses ``[mirror.<name>]`` tables onto them (a
bad table is a ``ValueError`` naming the table and the key), and
:func:`configured_profiles` -- the one profile set ``cuforge run``,
``integrations.session`` and :func:`active_profiles` use -- applies the settings
files' tables with it (the user's, then the project's; an error also names the
file). Nothing here imports the JIT: a version comes from the installed
distribution's metadata unless a profile asks for ``version_from``.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping, Sequence

from . import _bundles
from ._host import gpu_identity, host_identity
from ._paths import bare_version, dist_version, expand_path, fill, placeholders, unset_variables

__all__ = [
    "ALWAYS_SKIP",
    "PROFILES",
    "Profile",
    "active_profiles",
    "configured_profiles",
    "dist_version",
    "gpu_identity",
    "host_identity",
    "load_profiles",
]

#: Names never published from any directory: temp and partial files, locks, editor
#: and NFS leftovers, and the mirror's own temp and state files.
ALWAYS_SKIP: tuple[str, ...] = (
    "*.tmp",
    "*.tmp.*",
    "*.temp",
    "*.part",
    "*.partial",
    "*.lock",
    "*.swp",
    "*~",
    ".#*",
    ".nfs*",
    ".cuforge-mirror*",
)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: The placeholders each formatted key fills (``_paths.fill``; ``subdir``: the version).
_PLACEHOLDERS: dict[str, tuple[str, ...]] = {
    "default": ("version", "tmpdir", "user"),
    "subdir": ("version",),
}


class Profile:
    """One JIT's directory, as the mirror sees it.

    - ``name``: the profile's name (letters, digits, ``_.-``), part of every key.
    - ``env``: variables naming the directory; the first one set wins.
    - ``subdir``: appended to that variable's directory (``{version}`` allowed), for
      JITs that keep a directory per version under the one named (Warp).
    - ``default``: the JIT's own directory when no variable is set (``~``,
      ``$VARS`` and ``{version}`` expand); None when the JIT has no single default
      directory (the profile then mirrors only when a variable is set).
    - ``dists``: distributions whose installed versions, all together, are the
      JIT's version; the JIT counts as installed when the first one is.
    - ``version_from``: ``module:attribute`` (a string, or a callable returning one)
      read when no distribution is installed; importing the module costs its import.
    - ``skip``: globs (fnmatch) matched against every component of a file's
      relative path: a match is never published nor hydrated (added to
      :data:`ALWAYS_SKIP`).
    - ``gpu_dependent``: whether the files are valid only on the GPU that made them
      (then the key names the GPU, and without one the mirror stays off).
    - ``only``: globs (fnmatch) a file's *name* must match to be mirrored (empty:
      every file not skipped), for a directory that holds more than what is worth
      sharing.
    - ``busy_while``: names, beside a file (``{stem}``: the file's name without its
      last suffix), whose presence means the file is still being built in place (a
      compiler writing its output directly): such a file is not published. A build
      that was killed leaves its marker, so its file is never published.
    - ``host_dependent``: whether the files are native code built for this host
      (``-march=native``, its C++ compiler and C library): then the key names
      :func:`host_identity`, and without one the mirror stays off.
    - ``new_only``: publish only files written after the mirror started (their
      change time is later), for a directory other installs share (Inductor's
      precompiled headers in ``$TMPDIR``: another torch's would be published under
      this one's version, ~150 MB each, for no host to use).
    - ``bundle``: a regular expression matched against a file's *name*, with a group
      ``key`` (and optionally ``head``): the files of one folder with the same key are
      valid only together (an index and the data files it names by a number each host
      picks) and travel as one entry, hydrated all or nothing, the ``head`` last
      (``_bundles``). None: every file is its own entry.
    - ``notes``: what invalidates the directory, what keys it, what was tested.
    """

    __slots__ = (
        "_bundle",
        "_globs",
        "bundle",
        "busy_while",
        "default",
        "dists",
        "env",
        "gpu_dependent",
        "host_dependent",
        "name",
        "new_only",
        "notes",
        "only",
        "skip",
        "subdir",
        "version_from",
    )

    def __init__(
        self,
        name: str,
        env: tuple[str, ...],
        subdir: str = "",
        default: str | None = None,
        dists: tuple[str, ...] = (),
        version_from: str | None = None,
        skip: tuple[str, ...] = (),
        gpu_dependent: bool = True,
        notes: str = "",
        only: tuple[str, ...] = (),
        busy_while: tuple[str, ...] = (),
        host_dependent: bool = False,
        new_only: bool = False,
        bundle: str | None = None,
    ) -> None:
        self.name = name
        self.bundle = bundle or None
        self._bundle = _bundles.pattern(bundle, f"mirror.{name}.bundle") if bundle else None
        self.new_only = new_only
        self.env = tuple(env)
        self.subdir = subdir
        self.default = default
        self.dists = tuple(dists)
        self.version_from = version_from
        self.skip = tuple(skip)
        self.gpu_dependent = gpu_dependent
        self.notes = notes
        self.only = tuple(only)
        self.busy_while = tuple(busy_while)
        self.host_dependent = host_dependent
        self._globs = ALWAYS_SKIP + self.skip

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, k) for k in ("name", *_KEYS))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Profile) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return f"Profile(name={self.name!r}, env={self.env!r}, dists={self.dists!r})"

    def skipped(self, relpath: str) -> bool:
        """Whether ``relpath`` (``/``-separated) is never mirrored: one of its
        components matches a skip glob."""
        for part in relpath.split("/"):
            for glob in self._globs:
                if fnmatch.fnmatchcase(part, glob):
                    return True
        return False

    def included(self, relpath: str) -> bool:
        """Whether the file ``relpath`` is of the kinds mirrored: its name matches one
        of ``only`` (always, when ``only`` is empty). Skip globs are separate."""
        if not self.only:
            return True
        name = relpath.rpartition("/")[2]
        return any(fnmatch.fnmatchcase(name, glob) for glob in self.only)

    def bundle_of(self, name: str) -> tuple[str, bool] | None:
        """``(key, head)`` of the bundle the file ``name`` (no folder) belongs to, or
        None when it is a file of its own."""
        found = self._bundle.fullmatch(name) if self._bundle is not None else None
        if found is None or not found.group("key"):
            return None
        return found.group("key"), found.groupdict().get("head") is not None

    def markers(self, relpath: str) -> list[str]:
        """The paths (beside ``relpath``) whose presence says it is still being built."""
        folder, _, name = relpath.rpartition("/")
        stem = name.rpartition(".")[0] or name
        names = [m.format(stem=stem) for m in self.busy_while]
        return [f"{folder}/{n}" if folder else n for n in names]

    def version(
        self, path: Sequence[str] | None = None, imported: Mapping[str, str | None] | None = None
    ) -> str | None:
        """The JIT's version as it keys entries (``dist==version`` of each installed
        distribution, ``+``-joined), or None when the JIT is not installed. ``path``:
        the job's Python's ``sys.path`` (``cuforge run`` asks it: ``cli._jobpython``);
        a ``version_from`` is then taken from ``imported`` (``{version_from:
        "module==value" or None}``, read by importing the module in the job's Python),
        never imported here -- without it, no version. Without ``path`` (the job is
        this process: ``session()``), ``version_from`` is imported in this Python."""
        found: list[str] = []
        for i, dist in enumerate(self.dists):
            ver = dist_version(dist, path)
            if ver is None and i == 0:
                break
            if ver is not None:
                found.append(f"{dist}=={ver}")
        if found:
            return "+".join(found)
        if self.version_from is None:
            return None
        if path is not None:
            return (imported or {}).get(self.version_from)
        return import_version(self.version_from)

    def installed(self, path: Sequence[str] | None = None) -> bool:
        """Whether the JIT's first distribution is installed (no import) -- on
        ``path``, another interpreter's ``sys.path``, when given."""
        return bool(self.dists) and dist_version(self.dists[0], path) is not None

    def directory(
        self, env: Mapping[str, str] | None = None, version: str | None = None
    ) -> str | None:
        """The JIT's directory: the first of ``env``'s variables that is set (plus
        ``subdir``), else the expanded ``default``; None when neither applies, or when
        the path names a ``$VAR`` that is unset (:meth:`unset_variable` says which:
        the directory is then unknown, never the path without it). ``version`` fills
        ``{version}`` (the JIT's own version string, the part after ``==`` of the first
        distribution)."""
        raw = self._raw(os.environ if env is None else env, version)
        return None if raw is None else expand_path(raw, os.environ if env is None else env)

    def unset_variable(self, env: Mapping[str, str] | None = None) -> str | None:
        """The first ``$VAR`` the directory's path names that ``env`` leaves unset
        (why :meth:`directory` is None), or None."""
        env = os.environ if env is None else env
        raw = self._raw(env, None)
        missing = unset_variables(raw, env) if raw is not None else []
        return missing[0] if missing else None

    def _raw(self, env: Mapping[str, str], version: str | None) -> str | None:
        """The directory's path before ``~`` and ``$VARS`` expand."""
        ver = bare_version(version) if version else ""
        for var in self.env:
            value = (env.get(var) or "").strip()
            if value:
                return (
                    os.path.join(value, self.subdir.format(version=ver)) if self.subdir else value
                )
        if self.default is None:
            return None
        return self.default.format_map(fill(env, version=ver))


def import_version(spec: str) -> str | None:
    """``module==value`` of ``module:attribute`` (called when callable), imported in
    this Python; None when it fails to import or is no non-empty string."""
    import importlib

    module, _, attr = spec.partition(":")
    try:
        value: object = getattr(importlib.import_module(module), attr)
        if callable(value):
            value = value()
    except Exception:  # not installed, or it fails to import: no version, no mirror
        return None
    return f"{module}=={value}" if isinstance(value, str) and value else None


#: Build directories Warp renames into place when a module is complete.
_WARP_BUILD = "*_p[0-9]*_t[0-9]*"
#: A numba function's index (``<f>.nbi``, the head) and its data files (``<f>.<n>.nbc``).
_NUMBA_BUNDLE = r"(?P<key>.+)\.(?:(?P<head>nbi)|[0-9]+\.nbc)"

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="warp",
            env=("WARP_CACHE_PATH",),
            subdir="{version}",
            default="$XDG_CACHE_HOME/warp/{version}",
            dists=("warp-lang",),
            skip=(_WARP_BUILD,),
            gpu_dependent=False,
            notes=(
                "A directory per Warp version (WARP_CACHE_PATH/<version>, or "
                "wp.config.kernel_cache_dir set before wp.init(): pass it as the directory). "
                "A module is built in <module>_p<pid>_t<tid> and renamed into place, so a "
                "published module is complete; its file names carry the target "
                "(.cpu<hash>.o, .sm<arch>.cubin), so entries do not name the GPU. "
                "Tested here (CPU kernels)."
            ),
        ),
        Profile(
            name="numba",
            env=("NUMBA_CACHE_DIR",),
            dists=("numba", "numba-cuda"),
            gpu_dependent=False,
            bundle=_NUMBA_BUNDLE,
            notes=(
                "cache=True functions, in NUMBA_CACHE_DIR (without it numba writes "
                "__pycache__ beside each source file, which no single directory covers). "
                "Each source directory gets <dir name>_<sha1 of its absolute path>, so only "
                "a checkout at the same absolute path hits. The index (.nbi) holds numba's "
                "version and the source stamp: numba 0.68 stamps with the sha256 of the "
                "source's content, so a new host's checkout (another mtime) hits; older "
                "numba stamps (mtime, size), which a fresh checkout changes, and then "
                "misses (never a wrong hit: numba rejects the index); so does numba-cuda "
                "0.30.4 for @cuda.jit(cache=True) kernels (its own copy of the cache code), "
                "which hit only where the source keeps its mtime (one image). Overloads "
                "are keyed by signature and the target's CPU name and features (numba-cuda: "
                "the compute capability, the CUDA runtime's and numba-cuda's versions), so "
                "entries do not name the GPU. Index and data are written to "
                "<name>.tmp.<uuid> and renamed. The index maps each overload to "
                "<f>.<n>.nbc, n the first number free in that host's index, and a data file "
                "does not name its overload: a function's index and data files are one "
                "bundle (one entry, hydrated all or nothing), so no host pairs one host's "
                "index with another's data. Tested here (CPU); numba-cuda (the same file "
                "names): benchmarks/bench_run.py --jit numba-cuda on a GPU, its bundles "
                "untested here."
            ),
        ),
        Profile(
            name="torchinductor",
            env=("TORCHINDUCTOR_CACHE_DIR",),
            default="{tmpdir}/torchinductor_{user}",
            dists=("torch",),
            only=("*.so", "*.o"),
            skip=("fxgraph", "aotautograd", "triton", "locks", "gcc", "*_CxxBuild"),
            busy_while=("{stem}_CxxBuild",),
            gpu_dependent=False,
            host_dependent=True,
            notes=(
                "PyTorch Inductor's C++ code cache: the kernels and wrappers it builds with "
                "the host compiler (<2 chars>/c<hash>[.main].so and .o), named by a hash "
                "of their source and compile command, rebuilt only when absent. Only .so "
                "and .o files are mirrored; the FX-graph and AOT-autograd caches go "
                "through cuforge's remote-cache integration (signed, keyed by Inductor), "
                "Triton's directory through its own. The compiler writes a library in "
                "place while <stem>_CxxBuild exists beside it: such a file is not "
                "published (a killed build's never is). Built with -march=native by "
                "the C++ compiler $CXX (else g++), which the file name does not say: "
                "entries name the host (host_identity: CPU model and features, C "
                "library, compiler version, GPUs). Tested here (torch 2.13, CPU)."
            ),
        ),
        Profile(
            name="torchinductor-pch",
            env=(),
            default="{tmpdir}/torchinductor_{user}/precompiled_headers",
            dists=("torch",),
            only=("*.gch",),
            skip=("locks", "*_CxxBuild"),
            busy_while=("{stem}_CxxBuild",),
            gpu_dependent=False,
            host_dependent=True,
            new_only=True,
            notes=(
                "PyTorch Inductor's precompiled C++ header (c<hash>.h.gch, ~150 MB), which "
                "it keeps in $TMPDIR/torchinductor_<user>/precompiled_headers whatever "
                "TORCHINDUCTOR_CACHE_DIR says, and builds on a fresh host before it loads "
                "any library -- even one the torchinductor profile hydrated. The name is a "
                "hash of the header, its preprocessed text (the torch install's paths), the "
                "compile command and the compiler's version; entries also name the host "
                "(host_identity), and GCC checks a header against the compiler and flags "
                "itself (one it cannot use is ignored, and the header parsed instead). GCC "
                "writes it in place while <name>_CxxBuild exists beside it: such a file is "
                "not published, nor a killed build's. Hydrated files are verified whole "
                "before they are linked into place: a truncated one would fail every "
                "compile that includes it. The directory is shared by every torch the "
                "user runs, so only headers made during the job are published. Tested "
                "here (torch 2.13, CPU)."
            ),
        ),
        Profile(
            name="deepgemm",
            env=("DG_JIT_CACHE_DIR",),
            default="~/.deep_gemm",
            dists=("deep_gemm",),
            skip=("tmp",),
            notes="Kernels built by NVCC/NVRTC for the GPU it runs on. Untested here.",
        ),
        Profile(
            name="flashinfer",
            env=("FLASHINFER_WORKSPACE_BASE",),
            subdir=".cache/flashinfer",
            default="~/.cache/flashinfer",
            dists=("flashinfer-python",),
            skip=(".ninja_*", "*.ninja"),
            notes=(
                "JIT modules under <version>/<arch>/; ninja's build logs are skipped. "
                "Untested here."
            ),
        ),
        Profile(
            name="cute-dsl",
            env=("CUTE_DSL_CACHE_DIR",),
            dists=("nvidia-cutlass-dsl",),
            notes="CuTe DSL's compiled kernels; mirrored when the variable is set. Untested here.",
        ),
        Profile(
            name="cutile",
            env=("CUDA_TILE_CACHE_DIR",),
            dists=("cuda-tile",),
            notes="cuTile's compiled kernels; mirrored when the variable is set. Untested here.",
        ),
        Profile(
            name="tilelang",
            env=("TILELANG_CACHE_DIR",),
            default="~/.tilelang/cache",
            dists=("tilelang",),
            notes="TileLang's kernel cache. Untested here.",
        ),
        Profile(
            name="vllm",
            env=("VLLM_CACHE_ROOT",),
            subdir="torch_compile_cache",
            default="$XDG_CACHE_HOME/vllm/torch_compile_cache",
            dists=("vllm", "torch"),
            notes=(
                "vLLM's torch.compile cache (a directory per config hash and rank); "
                "Inductor's and Triton's own caches have cuforge integrations of their "
                "own. Untested here."
            ),
        ),
    )
}

#: The keys a ``[mirror.<name>]`` table may hold, and the type of each.
_KEYS: dict[str, type] = {
    "env": list,
    "subdir": str,
    "default": str,
    "dists": list,
    "version_from": str,
    "skip": list,
    "gpu_dependent": bool,
    "notes": str,
    "only": list,
    "busy_while": list,
    "host_dependent": bool,
    "new_only": bool,
    "bundle": str,
}


def load_profiles(
    extra: Mapping[str, Mapping[str, object]] | None = None,
    base: Mapping[str, Profile] | None = None,
) -> dict[str, Profile]:
    """``base`` (default: the built-in profiles) plus ``extra``: ``[mirror.<name>]``
    tables, already parsed (``{name: {key: value}}``). A table with the name of a
    profile in ``base`` overrides it: it changes only the keys it sets; a new name
    needs ``env`` and ``dists`` or ``version_from``. Keys: ``env``, ``dists``,
    ``skip``, ``only``, ``busy_while`` (lists of strings), ``subdir``, ``default``,
    ``version_from``, ``notes``, ``bundle`` (strings), ``gpu_dependent`` (bool;
    default true), ``host_dependent``, ``new_only`` (bools; default false). ``env``
    may also be one string. ``base`` itself is not changed.

    Raises ValueError (``mirror.<name>.<key>: ...``, one line) for an unknown key, a
    value of the wrong type, a bad name or variable, a ``version_from`` without
    ``:``, a ``bundle`` that is no regular expression with a ``key`` group, or a
    ``default`` or ``subdir`` with a placeholder it does not fill (``default``:
    ``{version}``, ``{tmpdir}``, ``{user}``; ``subdir``: ``{version}``) or an
    unmatched brace.
    """
    out = dict(PROFILES if base is None else base)
    for name, table in (extra or {}).items():
        where = f"mirror.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"{where}: a profile name is letters, digits, '_', '.', '-'")
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: expected a table, got {type(table).__name__}")
        fields: dict[str, object] = {}
        for key, value in table.items():
            kind = _KEYS.get(key)
            if kind is None:
                raise ValueError(f"{where}.{key}: unknown key (known: {', '.join(sorted(_KEYS))})")
            if key == "env" and isinstance(value, str):
                value = [value]
            if not isinstance(value, kind) or (
                kind is list and not all(isinstance(v, str) and v for v in value)  # type: ignore[attr-defined]
            ):
                what = "a list of strings" if kind is list else kind.__name__
                raise ValueError(f"{where}.{key}: expected {what}, got {value!r}")
            fields[key] = tuple(value) if kind is list else value  # type: ignore[arg-type]
        for var in fields.get("env", ()):  # type: ignore[attr-defined]
            if not _ENV.match(var):
                raise ValueError(f"{where}.env: {var!r} is not a variable name")
        for key, known_fields in _PLACEHOLDERS.items():
            text = fields.get(key)
            if isinstance(text, str):
                _check_placeholders(f"{where}.{key}", text, known_fields)
        spec = fields.get("version_from")
        if isinstance(spec, str) and (":" not in spec or not all(spec.partition(":")[::2])):
            raise ValueError(f"{where}.version_from: expected 'module:attribute', got {spec!r}")
        known = out.get(name)
        if known is None:
            if not fields.get("env"):
                raise ValueError(
                    f"{where}.env: a new profile needs the variable naming its directory"
                )
            if not fields.get("dists") and not fields.get("version_from"):
                raise ValueError(
                    f"{where}.dists: a new profile needs dists or version_from (its version)"
                )
            out[name] = Profile(name=name, **fields)  # type: ignore[arg-type]
        else:
            merged = {k: getattr(known, k) for k in _KEYS} | fields
            out[name] = Profile(name=name, **merged)
    return out


def _check_placeholders(where: str, text: str, known: tuple[str, ...]) -> None:
    """ValueError (``WHERE: unknown placeholder {x} (known: ...)``) for a field of
    ``text`` that is not one of ``known``, or for text with an unmatched brace."""
    names = ", ".join(f"{{{k}}}" for k in known)
    try:
        found = placeholders(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc} in {text!r} (placeholders: {names})") from None
    for field in found:
        if field not in known:
            raise ValueError(f"{where}: unknown placeholder {{{field}}} (known: {names})")


def configured_profiles() -> dict[str, Profile]:
    """The profile set every entry point uses: the built-in profiles, then the user's
    settings file's ``[mirror.<name>]`` tables, then the project's
    (``storage.settings``: ``config.toml``, ``cuforge.toml`` or ``pyproject.toml``'s
    ``[tool.cuforge.mirror.<name>]``), each applied by :func:`load_profiles` -- a
    table changes only the keys it sets, so the project's overrides the user's, which
    overrides the built-in of that name.

    Raises ValueError, one line naming the file, for a file that cannot be read or
    is not TOML, a ``mirror`` that is not tables, and every table
    :func:`load_profiles` refuses (``PATH: mirror.<name>.<key>: ...``).
    """
    from cuforge.storage import settings

    out = dict(PROFILES)
    for _, where, tables in settings.tables("mirror"):
        if not isinstance(tables, Mapping):
            raise ValueError(f"{where}: mirror: expected [mirror.<name>] tables, got {tables!r}")
        try:
            out = load_profiles(tables, base=out)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return out


def active_profiles(
    env: Mapping[str, str] | None = None,
    profiles: Mapping[str, Profile] | None = None,
    path: Sequence[str] | None = None,
) -> list[Profile]:
    """The profiles (of ``profiles``, default :func:`configured_profiles`: the
    built-in ones and the settings files') whose JIT is installed (on ``path``:
    another interpreter's ``sys.path``; default this one's) or whose variable is set
    in ``env`` (default ``os.environ``), in name order. Reads distribution metadata
    only; imports no JIT. ValueError (from :func:`configured_profiles`) for a bad
    settings file when ``profiles`` is not given."""
    env = os.environ if env is None else env
    chosen = []
    for profile in (configured_profiles() if profiles is None else profiles).values():
        if any((env.get(v) or "").strip() for v in profile.env) or profile.installed(path):
            chosen.append(profile)
    return sorted(chosen, key=lambda p: p.name)
