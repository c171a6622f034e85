"""Compiler facts a process would recompute, kept on disk and never trusted past a change.

Every process needs the compiler identity (the NVRTC build, the CUDA header sets)
before it can name a cache key. Computing it costs a fresh process ~30 ms (loading
cuda.pathfinder and libnvrtc, reading ELF notes, digesting header wheels) -- more
than the whole cache hit. This module keeps each computed fact in a small file and
serves it to later processes.

A record is served only when

- its file name matches this process's *context*: the record format, the cuforge
  version, the fact, ``sys.executable``, ``sys.prefix``, ``sys.path``, the host
  name, and every environment variable that steers where libraries and headers are
  found (``LD_LIBRARY_PATH``, ``LD_PRELOAD``, ``CUFORGE_TOOLKIT_HEADERS``, and every
  ``CUDA*``, ``CONDA*`` and ``NVIDIA*`` variable); and
- every *witness* it lists still stats the same -- device, inode, size, mtime and
  ctime of each file or directory the computation read or searched (the libraries,
  their directory, the site-packages directories, the header directories ...), and
  absence for each that was absent; or, for a *listing* witness (:func:`listing`),
  the names in one directory that a search matches (a prefix and a suffix), so a
  directory a search only lists -- an import path entry, the working directory --
  may gain other files without costing the record. Installing, removing or replacing
  a package or a library changes a witness (a new file has a new inode and ctime;
  adding or removing a directory entry changes the directory's mtime and ctime, and
  a matching name its listing).

A fact is recorded only when all its witnesses are older than ``RACY_NS`` (a change
within a file system's timestamp granularity could otherwise leave a stat
unchanged). A value served from disk is *confirmed* by :func:`confirm` -- a fresh
computation -- before anything compiled with it is stored, so even a change that
lands between the check and a compile costs a store, never a wrong entry.

Where: ``<state>/identity/``, ``<state>`` being ``$CUFORGE_STATE_DIR`` (``0``/``off``:
nothing is kept), else ``$XDG_CACHE_HOME/cuforge`` or ``~/.cache/cuforge`` (the
user cache directory elsewhere), private to the user (0700, files 0600). An unreadable,
damaged or foreign record is ignored and rewritten; a store that cannot be written
costs speed only.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

from cuforge._hashing import blake2b

TYPE_CHECKING = False  # typing is not imported at run time: it costs a cold process ~5 ms
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    #: The paths a fact's values depend on: a list, or a callable that lists them
    #: (called only when a record is written: listing can cost a child process).
    Witnesses = list[str] | Callable[[], list[str]]
    #: A fact's values and the paths whose state they depend on.
    Probe = Callable[[], tuple[tuple[bytes, ...], Witnesses]]

__all__ = [
    "ENV_VAR",
    "RACY_NS",
    "confirm",
    "directory",
    "forget",
    "library_witnesses",
    "listing",
    "lookup",
    "reading_only",
    "remembered",
    "site_witnesses",
    "state_dir",
]

ENV_VAR = "CUFORGE_STATE_DIR"
RACY_NS = 2_000_000_000
_FORMAT = b"cuforge-identity-2"  # 2: listing witnesses
_OFF = frozenset({"0", "off", "no", "false", "none"})
_ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "CUFORGE_TOOLKIT_HEADERS")
_ENV_PREFIXES = ("CUDA", "CONDA", "NVIDIA")
_MAX_RECORDS = 512  # per directory; the oldest half goes when passed

_lock = threading.Lock()
# Both by record name (fact and context): a value is only ever compared with one
# computed in the same context.
_served: dict[str, tuple[str, tuple[bytes, ...], Probe]] = {}  # from disk, unconfirmed
_fresh: dict[str, tuple[bytes, ...]] = {}  # computed in this process


def state_dir() -> str | None:
    """cuforge's per-user state directory (identity records, the command line's hit
    records), or None when ``$CUFORGE_STATE_DIR`` turns it off."""
    chosen = os.environ.get(ENV_VAR, "").strip()
    if chosen.lower() in _OFF:
        return None
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen))
    return os.path.join(user_cache_root(), "cuforge")


def directory() -> str | None:
    """The directory identity records live in, or None when the store is turned off."""
    root = state_dir()
    return None if root is None else os.path.join(root, "identity")


def user_cache_root() -> str:
    """``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux and other Unixes; the platform's
    user cache directory elsewhere. Cheap: platformdirs costs ~14 ms to import."""
    if sys.platform.startswith(("win", "darwin")) or hasattr(sys, "getandroidapilevel"):
        from platformdirs import user_cache_dir

        return user_cache_dir()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache")


# -- context and witnesses -----------------------------------------------------------------
def _search_path() -> list[str]:
    return [os.path.abspath(p or os.curdir) for p in sys.path]


def _context(fact: str) -> str:
    """The record file name for ``fact`` in this process's context."""
    from cuforge import __version__

    env = sorted(
        (k, v)
        for k, v in os.environ.items()
        if k in _ENV_NAMES or k.startswith(_ENV_PREFIXES) or (os.name == "nt" and k == "PATH")
    )
    nodename = os.uname().nodename if hasattr(os, "uname") else os.environ.get("COMPUTERNAME", "")
    parts = [
        _FORMAT,
        __version__.encode(),
        fact.encode(),
        sys.executable.encode("utf-8", "surrogateescape"),
        sys.prefix.encode("utf-8", "surrogateescape"),
        nodename.encode("utf-8", "surrogateescape"),
        *(p.encode("utf-8", "surrogateescape") for p in _search_path()),
        *(f"{k}={v}".encode("utf-8", "surrogateescape") for k, v in env),
    ]
    h = blake2b(digest_size=16, person=b"cuforge-ident")
    for part in parts:
        h.update(len(part).to_bytes(4, "little") + part)
    return f"{fact}-{h.hexdigest()}"


#: The stamp of a path whose state cannot be read (a link loop, no permission): no
#: record that names it holds, and none is written (its change could not be seen).
_UNKNOWN = (-1, -1, -1, -1, -1)


#: Marks a listing witness (a character no path this module is given holds).
_LISTING = "\x01"


def listing(directory: str, prefix: str, suffix: str) -> str:
    """A witness of the names in ``directory`` that start with ``prefix`` and end
    with ``suffix`` (compared in lower case): it holds while those names stay the
    same, whatever else the directory gains or loses. For a search that only lists
    ``directory`` for such names (a wheel's ``.dist-info`` in an import path entry)."""
    where = os.path.abspath(directory)
    return f"{_LISTING}{prefix.lower()}{_LISTING}{suffix.lower()}{_LISTING}{where}"


def _listed(witness: str) -> tuple[int, ...] | None:
    """A listing witness's stamp: how many names match and their digest (None: the
    directory is absent or not one; ``_UNKNOWN``: it cannot be listed)."""
    prefix, suffix, directory = witness[1:].split(_LISTING, 2)
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return _UNKNOWN
    matched = sorted(
        n for n in names if n.lower().startswith(prefix) and n.lower().endswith(suffix)
    )
    h = blake2b(digest_size=16, person=b"cuforge-listing")
    for name in matched:
        h.update(os.fsencode(name) + b"\0")
    digest = h.digest()
    # no times: a listing is compared exactly, never racy (its directory's stat is
    # checked for that when the record is written, see _write)
    return (
        len(matched),
        int.from_bytes(digest[:8], "little"),
        int.from_bytes(digest[8:], "little"),
        0,
        0,
    )


def _stamp(path: str) -> tuple[int, ...] | None:
    """What identifies the current state of ``path`` (None: absent; ``_UNKNOWN``)."""
    if path.startswith(_LISTING):
        return _listed(path)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError):
        return _UNKNOWN
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def site_witnesses() -> list[str]:
    """The site-packages directories (where wheels of libraries and headers are
    searched): installing or removing a package changes one of them."""
    try:
        import site

        dirs = list(site.getsitepackages())
        if site.ENABLE_USER_SITE:
            dirs.append(site.getusersitepackages())
    except Exception:  # a stripped site module: fall back to the import path
        dirs = []
    return dirs


def library_witnesses(path: str) -> list[str]:
    """Everything whose change could make a library search find another file than
    ``path`` (or change ``path``): the file, its directory, the site-packages
    directories, the loader cache and ``LD_LIBRARY_PATH`` directories."""
    found = [path, os.path.dirname(path), *site_witnesses(), "/etc/ld.so.cache"]
    found += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    return found


# -- records -----------------------------------------------------------------------------
def _encode(
    values: tuple[bytes, ...], stamps: Iterable[tuple[str, tuple[int, ...] | None]]
) -> bytes:
    fields = [_FORMAT, str(len(values)).encode(), *(v.hex().encode() for v in values)]
    for path, stamp in stamps:
        fields.append(os.fsencode(path))
        fields.append(b"-" if stamp is None else ":".join(map(str, stamp)).encode())
    return b"\0".join(fields)


def _decode_if_current(data: bytes) -> tuple[bytes, ...] | None:
    """The values of a record whose witnesses all still hold, else None."""
    fields = data.split(b"\0")
    try:
        if fields[0] != _FORMAT:
            return None
        n = int(fields[1])
        values = tuple(bytes.fromhex(f.decode("ascii")) for f in fields[2 : 2 + n])
        rest = fields[2 + n :]
        if len(values) != n or len(rest) % 2:
            return None
        for i in range(0, len(rest), 2):
            recorded = rest[i + 1]
            stamp = _stamp(os.fsdecode(rest[i]))
            now = b"-" if stamp is None else ":".join(map(str, stamp)).encode()
            if now != recorded or stamp is _UNKNOWN:
                return None
    except (ValueError, IndexError, UnicodeDecodeError):
        return None
    return values


def _read(path: str) -> tuple[bytes, ...] | None:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError:
        return None
    return _decode_if_current(data)


#: How many :func:`reading_only` blocks are open: while any is, nothing is written.
_read_only = [0]


@contextlib.contextmanager
def reading_only() -> Iterator[None]:
    """Records are read but never written (nor the directory made) inside this block:
    for ``cuforge doctor``, which looks and changes nothing."""
    with _lock:
        _read_only[0] += 1
    try:
        yield
    finally:
        with _lock:
            _read_only[0] -= 1


def _write(path: str, values: tuple[bytes, ...], witnesses: Witnesses) -> None:
    """Record ``values`` if every witness is settled; best effort, never raises."""
    if _read_only[0]:
        return  # looking only
    if callable(witnesses):
        try:
            witnesses = witnesses()
        except Exception:
            return
    if not witnesses:
        return  # nothing to check it against: never served from disk
    cutoff = time.time_ns() - RACY_NS
    stamps = []
    for w in dict.fromkeys(w if w.startswith(_LISTING) else os.path.abspath(w) for w in witnesses):
        stamp = _stamp(w)
        if stamp is _UNKNOWN:
            return  # a witness whose changes cannot be seen: never kept on disk
        # A listing is settled when its directory is: a name that appeared a moment
        # ago, after the search listed it, could otherwise be in the stamp and not
        # in the values (closes that race as the racy window does for a stat).
        settled = _stamp(w[1:].split(_LISTING, 2)[2]) if w.startswith(_LISTING) else stamp
        if settled is _UNKNOWN:
            return
        if settled is not None and (settled[3] > cutoff or settled[4] > cutoff):
            return  # changed a moment ago: a later process records it
        stamps.append((w, stamp))
    data = _encode(values, stamps)
    folder = os.path.dirname(path)
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _trim(folder)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _trim(folder: str) -> None:
    """Keep the directory small: past ``_MAX_RECORDS`` files, drop the older half."""
    try:
        names = os.listdir(folder)
        if len(names) <= _MAX_RECORDS:
            return
        aged = []
        for name in names:
            try:
                aged.append((os.stat(os.path.join(folder, name)).st_mtime_ns, name))
            except OSError:
                continue
        aged.sort()
        for _, name in aged[: len(aged) // 2]:
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                continue
    except OSError:
        return


# -- the API the compile layer uses ---------------------------------------------------
def lookup(fact: str) -> tuple[bytes, ...] | None:
    """The recorded values of ``fact`` if its record holds here and now, else None.
    Computes nothing (the command line's fast path asks this)."""
    folder = directory()
    if folder is None:
        return None
    return _read(os.path.join(folder, _context(fact)))


def remembered(fact: str, probe: Probe) -> tuple[bytes, ...]:
    """``fact``'s values: from its record when that holds, else from ``probe()``
    (then recorded). Exceptions from ``probe`` propagate and nothing is recorded."""
    folder = directory()
    name = _context(fact)
    path = None if folder is None else os.path.join(folder, name)
    if path is not None:
        values = _read(path)
        if values is not None:
            with _lock:
                _served[name] = (fact, values, probe)
            return values
    values, witnesses = probe()
    with _lock:
        _fresh[name] = values
    if path is not None:
        _write(path, values, witnesses)
    return values


def confirm() -> bool:
    """Whether every fact this process took from disk equals a fresh computation.

    Call before storing anything derived from the facts (a compiled entry under a
    key that names them). A fact that differs has its record rewritten; the caller
    must not store. A fact confirmed once is not computed again.
    """
    if not _served:
        return True
    ok = True
    with _lock:
        pending = list(_served.items())
    for name, (fact, values, probe) in pending:
        if _context(fact) != name:
            continue  # served in another context (the environment changed): not in use
        fresh = _fresh.get(name)
        if fresh is None:
            try:
                fresh, witnesses = probe()
            except Exception:
                ok = False
                continue
            with _lock:
                _fresh[name] = fresh
            folder = directory()
            if folder is not None and fresh != values:
                _write(os.path.join(folder, name), fresh, witnesses)
        if fresh == values:
            with _lock:
                _served.pop(name, None)
        else:
            ok = False
    return ok


def forget(fact: str | None = None) -> None:
    """Drop what this process knows about ``fact`` (every fact: None), as a new
    process would not know it (for code that recomputes a fact on purpose)."""
    with _lock:
        for table in (_served, _fresh):
            for name in [n for n in table if fact is None or n.startswith(f"{fact}-")]:
                del table[name]
