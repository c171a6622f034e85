"""Triton's kernel cache on a cuforge cache.

Enable with one environment variable, nothing else to change::

    TRITON_CACHE_MANAGER=cuforge.integrations.triton:CuforgeCacheManager

or, for setups already on Triton's remote cache,
``TRITON_REMOTE_CACHE_BACKEND=cuforge.integrations.triton:CuforgeRemoteCacheBackend``.

The cache: ``$CUFORGE_TRITON_CACHE`` (a cache URL, or ``off``), else cuforge's
default (``$CUFORGE_CACHE``); ``$CUFORGE_CACHE_SECRET`` signs as everywhere. A
compiled kernel (its IRs, cubin, metadata JSON: the files its group lists) is one
cuforge entry, its *pack* (``_tritonpack``), named ``__kernel__`` and the group file:
one store when it is compiled, one lookup on a hit. A file Triton stores outside a
kernel's group (a launcher ``.so``, autotune results) is an entry of its own. Each
entry's metadata record says ``kind=triton``, Triton's key and the name, so ``cuforge
cache ls/stats/verify/prune`` list and manage them. What Triton needs as a path is
written under ``TRITON_CACHE_DIR`` from bytes the cache just verified: a local copy that
differs (tampered, truncated) is replaced, never used; an object there that is not a
regular file (a link, a FIFO, a directory) is left alone and the bytes are served from a
private directory beside it. A damaged, unsigned or foreign-signed entry is a miss, so
Triton compiles again; a cache that cannot be opened is one warning, and Triton's own
cache serves.
A group miss takes the cache's per-key lock until the pack is stored (or, when the
compile fails -- its files are then not stored -- until the manager is collected), so
N processes missing one kernel compile it once; a native module (``.so``) Triton is
about to build is locked the same way until it is stored. ``put`` writes the local
copy Triton reads and returns; a kernel's files wait in the manager (read back by
``get_file`` meanwhile) until ``put_group`` stores the pack; stores go through
``_behind`` (made at once, or written behind when the cache has a level on a
server), and the kernel's lock is let go only after its pack has
landed; this process reads its own queued stores back, and the queue is flushed at
exit (``cuforge.integrations.flush`` waits for it). A cache fault never fails a
compile: a lookup that raises is a miss and a store that raises is dropped (both
warn).
Triton's dump and override modes are Triton's own: they go to its file manager.
The local copies are written by ``_tritonlocal`` (what stands at a file's place
decides: see there).

Importing this module imports triton; ``RuntimeError`` (one line) when the installed
triton's extension points differ from the ones this module implements.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sysconfig
import threading
import warnings
import weakref
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from cuforge import _warm
from cuforge._stack import outside_level
from cuforge.storage.base import CacheReadWarning, CacheWriteWarning, ProgramCacheResource

from . import _behind
from ._cache import caching_off, select_cache
from ._tritonlocal import counters
from ._tritonlocal import materialize as _materialize
from ._tritonlocal import put_local as _put_local
from ._tritonpack import pack as _pack
from ._tritonpack import unpack as _unpack
from ._wiring import triton_override

try:
    import triton
    from triton.runtime.cache import CacheManager, FileCacheManager, RemoteCacheBackend
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"cuforge.integrations.triton needs triton installed ({exc}); pip install triton"
    ) from None

__all__ = ["CuforgeCacheManager", "CuforgeRemoteCacheBackend", "counters", "triton_cache"]

KIND = "triton"
ENV_CACHE = "CUFORGE_TRITON_CACHE"
#: The suffix of the native modules Triton builds (launchers, driver utilities).
_EXT_SUFFIX = str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")
_GROUP = "__grp__"
#: The entry name of a kernel's pack (``_tritonpack``): its group file's name after it.
_PACK = "__kernel__"
#: What this module implements; another set means another extension point.
_MANAGER_API = frozenset({"get_file", "put", "get_group", "put_group"})
_REMOTE_API = frozenset({"get", "put"})


class _Held:
    """A kernel's single-flight lock as a manager holds it -- and then the stores that
    will let it go once they land (``_behind``). ``close`` lets go once, from any
    thread; ``disown`` (a forked child) forgets the parent's lock without letting go."""

    __slots__ = ("_guard", "_stack")

    def __init__(self, stack: contextlib.ExitStack) -> None:
        self._stack: contextlib.ExitStack | None = stack
        self._guard = threading.Lock()

    def close(self) -> None:
        with self._guard:
            stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def disown(self) -> None:
        stack, self._stack = self._stack, None  # the child runs alone: no guard needed
        if stack is not None:
            _behind.orphans.append(stack)  # its finalizers would unlock the parent's lock


#: (cache, lock key) -> (thread, lock) of a manager holding that kernel's single-flight
#: lock in this process, or of its stores still queued; see ``_take_lock``.
_holders: dict[tuple[int, bytes], tuple[int, _Held]] = {}
_holders_guard = threading.Lock()


def _forget_holders_in_child() -> None:
    """A forked child holds none of its parent's kernel locks: never let them go."""
    global _holders_guard
    _holders_guard = threading.Lock()
    for _, held in _holders.values():
        held.disown()
    _holders.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_holders_in_child)


def _check_version() -> None:
    """One clear line when triton's cache extension points are not the known ones."""
    manager = {n for n in getattr(CacheManager, "__abstractmethods__", ()) if not n.startswith("_")}
    remote = {n for n in _REMOTE_API if callable(getattr(RemoteCacheBackend, n, None))}
    if manager != _MANAGER_API or remote != _REMOTE_API:
        raise RuntimeError(
            f"cuforge.integrations.triton: triton {triton.__version__} has another cache "
            f"extension point (CacheManager methods {sorted(manager)}, expected "
            f"{sorted(_MANAGER_API)}); tested with triton 3.6 and 3.9"
        )


_check_version()
_VERSION = _json_str(triton.__version__).encode()


def triton_cache() -> ProgramCacheResource | None:
    """The cache Triton's files go to: ``$CUFORGE_TRITON_CACHE`` (a URL, or ``off``),
    else the cache ``cache=True`` uses (docs/cache.md, "Which cache"); one handle per
    process and secret. None means off, or that the cache cannot be opened (a bad URL,
    an unsafe or impossible directory, a secret too short: one warning per process
    naming where it came from): Triton's own file cache serves. Never raises. Inside
    ``cuforge run`` or an active ``cuforge.integrations.session`` the session's cache
    is used instead.
    """
    wired = triton_override()
    if wired is not None:
        return wired
    return select_cache(None, ENV_CACHE)


def _entry_key(key: str, filename: str) -> bytes:
    return b"cuforge-triton\0" + key.encode() + b"\0" + filename.encode("utf-8")


def _record(key: str, filename: str) -> bytes:
    """The metadata record of Triton's ``filename`` under ``key``: exactly what
    ``encode_record("triton", {...})`` makes (compact, sorted, ASCII JSON), built
    without the JSON encoder because every hit compares it with each file's record."""
    return b'{"file":%s,"key":%s,"kind":"triton","name":%s,"triton":%s,"v":1}' % (
        _json_str(filename).encode(),
        _json_str(key).encode(),
        _json_str(filename).encode(),
        _VERSION,
    )


def _as_bytes(data: Any) -> bytes:
    return data if isinstance(data, bytes) else str(data).encode("utf-8")


class _Files:
    """Triton's files of one key in a cuforge cache: verified reads, recorded stores."""

    __slots__ = ("cache", "key")

    def __init__(self, cache: ProgramCacheResource, key: str) -> None:
        self.cache = cache
        self.key = key

    def load_many(self, filenames: list[str]) -> list[bytes | None]:
        """The verified bytes of each file (None: absent, damaged, foreign, or a fault);
        a file this process stored whose store has not landed yet is read back from the
        write-behind queue (read your writes)."""
        keys = [_entry_key(self.key, f) for f in filenames]
        queued = [_behind.pending(self.cache, k) for k in keys] if _behind.queued else None
        entries: list[Any]
        if queued is not None and None not in queued:
            entries = queued
        else:
            try:
                entries = self.cache.get_entries(keys)
            except Exception as exc:  # a cache fault is a miss, never Triton's failure
                _warn(CacheReadWarning, f"lookup failed ({type(exc).__name__}: {exc})")
                entries = [None] * len(keys)
            if queued is not None:
                entries = [e if q is None else q for e, q in zip(entries, queued, strict=True)]
        out: list[bytes | None] = []
        for name, entry in zip(filenames, entries, strict=True):
            ok = entry is not None and entry[1] == _record(self.key, name)
            out.append(entry[0] if ok else None)
        return out

    def store(self, filename: str, data: bytes, after: Any = None) -> None:
        """Store in the background (``_behind``); ``after`` runs once it landed."""
        _behind.submit(
            self.cache, _entry_key(self.key, filename), data, _record(self.key, filename),
            _store_failed, after,
        )  # fmt: skip


def _store_failed(exc: Exception) -> None:
    _warn(CacheWriteWarning, f"store failed ({type(exc).__name__}: {exc})")


def _warn(category: type[Warning], what: str) -> None:
    warnings.warn(
        f"cuforge triton cache: {what}; Triton compiles as without a cache",
        category,
        stacklevel=outside_level(),
    )


class CuforgeCacheManager(CacheManager):  # type: ignore[misc]
    """A Triton ``CacheManager`` on a cuforge cache (see the module docstring).

    ``key`` is Triton's (base32) cache key; ``override``/``dump`` select Triton's own
    modes, served by its file manager unchanged.
    """

    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        self.key = key
        self._local = FileCacheManager(key, override=override, dump=dump)
        cache = None if (override or dump) else triton_cache()
        self._files = None if cache is None else _Files(cache, key)
        self._held: _Held | None = None
        self._held_name: str | None = None  # the entry whose lock is held
        self._release: weakref.finalize | None = None  # type: ignore[type-arg]
        # A manager asked for a kernel's group compiles that kernel: its files wait
        # here, unstored, for put_group to store them as the kernel's one pack.
        self._asked = False
        self._unstored: dict[str, bytes] = {}

    @property
    def cache_dir(self) -> str:
        """Where the files Triton reads by path are written."""
        return str(self._local.cache_dir)

    # -- single files -------------------------------------------------------------------
    def get_file(self, filename: str) -> str | None:
        files = self._files
        if files is None:
            return self._local.get_file(filename)  # type: ignore[no-any-return]
        unstored = self._unstored.get(filename)
        if unstored is not None:  # put by this kernel's compile, not stored yet
            return _materialize(self.cache_dir, filename, unstored)
        (data,) = files.load_many([filename])
        if data is None and filename.endswith(_EXT_SUFFIX) and self._held is None:
            # A native module Triton is about to build: single-flight, as for a kernel
            # (held until put() stores it, or until this manager is collected).
            held = self._take_lock(files, filename)
            (data,) = files.load_many([filename])
            if data is not None:
                self._unlock()
            elif not held:
                counters["unlocked"] += 1
        return None if data is None else _materialize(self.cache_dir, filename, data)

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        files = self._files
        if files is None:
            return self._local.put(data, filename, binary=binary)  # type: ignore[no-any-return]
        raw = _as_bytes(data)
        if self._asked:  # a kernel's file: stored with its group, as one pack
            self._unstored[filename] = raw
        else:  # a file of its own (a native module, autotune results)
            # A native module whose lock this manager holds: let go once it has landed.
            files.store(filename, raw, self._hand_over() if self._held_name == filename else None)
        return _put_local(self.cache_dir, filename, raw)

    # -- groups (one compiled kernel) ---------------------------------------------------
    def get_group(self, filename: str) -> dict[str, str] | None:
        files = self._files
        if files is None:
            return self._local.get_group(filename)  # type: ignore[no-any-return]
        self._asked = True
        found = self._load_group(files, filename)
        if found is None and self._held is None:
            # Single-flight: wait for a peer compiling this kernel, then look again.
            held = self._take_lock(files, _GROUP + filename)
            found = self._load_group(files, filename)
            if found is None and not held:
                counters["unlocked"] += 1  # compiles without the lock: maybe twice
            if found is not None:
                counters["waited"] += 1  # a peer (process or thread) compiled it meanwhile
                self._unlock()
        counters["hits" if found is not None else "misses"] += 1
        if found is None and _warm._state["warm"]:  # Triton compiles the kernel now
            _warm.note_compile("triton", filename.removesuffix(".json"), files.cache)
        return found

    def _take_lock(self, files: _Files, entry: str) -> bool:
        """Hold the lock of ``entry`` (a kernel's group file, or a native module) until
        it is stored (or until this manager is collected); False when it is not held
        (timed out, a fault, or the holder stored it).

        Closes the race of a retried compile: Triton's compile that fails leaves its
        manager (and lock) alive as long as the exception's traceback, so a retry of
        the same kernel in an ``except`` block waited for its own process's lock until
        the timeout (120 s). A manager of this thread still holding the lock belongs to
        a compile that has ended (Triton does not nest compiles of one kernel), so its
        lock is released first; another thread's holder is waited for like a peer's.
        """
        lock_key = _entry_key(self.key, entry)
        slot = (id(files.cache), lock_key)
        me = threading.get_ident()
        with _holders_guard:
            prev = _holders.get(slot)
        if prev is not None and prev[0] == me:
            _let_go(prev[1], slot)
        stack = contextlib.ExitStack()
        held = False
        try:
            held = bool(stack.enter_context(files.cache.lock(lock_key)))
        except Exception as exc:  # a lock fault costs a duplicate compile, no more
            _warn(CacheReadWarning, f"lock failed ({type(exc).__name__}: {exc})")
        holder = _Held(stack)
        with _holders_guard:
            _holders[slot] = (me, holder)
        self._held, self._held_name = holder, entry
        self._release = weakref.finalize(self, _let_go, holder, slot)
        return held

    def _load_group(self, files: _Files, filename: str) -> dict[str, str] | None:
        """The kernel's files from its pack, verified and written locally with their
        group file, or None (a miss: no pack, or one that does not verify or unpack)."""
        (raw,) = files.load_many([_PACK + filename])
        items = _unpack(raw)
        if items is None:
            return None
        found = {name: _materialize(self.cache_dir, name, data) for name, data in items}
        # The group file too, as Triton's own manager writes it: a process without this
        # manager on the same directory hits it (put_group writes it after a compile).
        _materialize(self.cache_dir, _GROUP + filename, _group_file(found))
        return found

    def put_group(self, filename: str, group: dict[str, str]) -> str:
        files = self._files
        if files is None:
            return self._local.put_group(filename, group)  # type: ignore[no-any-return]
        release = self._hand_over()
        unstored, self._unstored = self._unstored, {}
        try:
            # The local group file as Triton's own manager writes it (name -> path), so
            # a process with Triton's manager hits this directory rather than failing.
            raw = _group_file(group)
            packed = _packed(filename, unstored, group)
        except BaseException:
            if release is not None:
                release()
            raise
        if packed is None:  # warned: nothing stored, the lock goes now
            if release is not None:
                release()
        else:
            for name in unstored.keys() - group.keys():  # put, but not one of the kernel's
                files.store(name, unstored[name])
            # The kernel's lock goes once its pack has landed.
            files.store(_PACK + filename, packed, release)
            counters["stored"] += 1
        return _put_local(self.cache_dir, _GROUP + filename, raw)

    def _hand_over(self) -> Any:
        """The release of the lock this manager holds, taken from it (None: none held):
        whoever calls it lets go, once; the manager's collection no longer does."""
        release, self._release, self._held, self._held_name = self._release, None, None, None
        detached = None if release is None else release.detach()
        return None if detached is None else functools.partial(detached[1], *detached[2])

    def _unlock(self) -> None:
        release = self._hand_over()
        if release is not None:
            release()


def _let_go(holder: _Held, slot: tuple[int, bytes]) -> None:
    """Let go of a kernel's lock and forget its holder (unless another took its place)."""
    with _holders_guard:
        current = _holders.get(slot)
        if current is not None and current[1] is holder:
            del _holders[slot]
    holder.close()


def _group_file(paths: dict[str, str]) -> bytes:
    """A kernel's local group file as Triton's own manager reads it (file name -> path),
    the same bytes after a compile and after a hit."""
    return json.dumps({"child_paths": paths}, sort_keys=True).encode()


def _packed(filename: str, unstored: dict[str, bytes], group: dict[str, str]) -> bytes | None:
    """The pack of the kernel whose group is ``group``: each file as this manager's
    ``put`` was given it, else read from the path the group names (a file it did not
    put here). None, warned, when a file cannot be read or the names are no file names."""
    try:
        return _pack([(n, _child_bytes(unstored, n, group[n])) for n in sorted(group)])
    except (OSError, ValueError) as exc:
        _warn(CacheWriteWarning, f"kernel {filename} not stored ({exc})")
        return None


def _child_bytes(unstored: dict[str, bytes], name: str, path: str) -> bytes:
    """A kernel file's bytes for its pack: as this manager's ``put`` was given them,
    else read from the path Triton's group names (a file it did not put here)."""
    data = unstored.get(name)
    if data is not None:
        return data
    with open(path, "rb") as f:
        return f.read()


class CuforgeRemoteCacheBackend(RemoteCacheBackend):  # type: ignore[misc]
    """A Triton ``RemoteCacheBackend`` on a cuforge cache: ``get`` answers only entries
    that verify (integrity, and the signature when the cache signs), in one batched
    read; ``put`` stores each file Triton's remote manager gives it (its protocol has
    no kernel-level store) with the records :class:`CuforgeCacheManager` uses. It
    also reads a kernel the manager stored (its pack: the group file, then the files
    from the same read); the manager reads packs only, so a kernel stored through
    this backend is compiled once more through the manager. Raises RuntimeError when
    caching is off (``off`` at any level of the choice, docs/cache.md): Triton's remote
    manager has no fallback of its own. A cache that cannot be opened is one warning,
    then every ``get`` a miss and every ``put`` dropped, so Triton compiles as without a
    cache.
    """

    def __init__(self, key: str) -> None:
        cache = triton_cache()
        off = caching_off(ENV_CACHE) if cache is None else ""
        if off:
            raise RuntimeError(
                f"CuforgeRemoteCacheBackend: caching is off ({off}); unset "
                "TRITON_REMOTE_CACHE_BACKEND to run without"
            )
        # A cache that cannot be opened (warned): every file a miss, every store dropped.
        self._files = None if cache is None else _Files(cache, key)
        self._unpacked: dict[str, bytes] = {}  # the files of the last pack read

    def get(self, filenames: list[str]) -> dict[str, bytes]:
        """Every file of ``filenames`` that verifies -- or none when one does not:
        Triton asks for several files only for a kernel's group, and triton 3.6 takes a
        partial group for a hit (a kernel without its cubin), so a damaged child must
        make the whole group a miss."""
        if self._files is None:
            return {}
        names = list(filenames)
        unpacked, self._unpacked = self._unpacked, {}
        if names and all(n in unpacked for n in names):  # the children of a pack just read
            return {n: unpacked[n] for n in names}
        datas = self._files.load_many(names)
        if len(names) == 1 and datas[0] is None and names[0].startswith(_GROUP):
            return self._from_pack(names[0])
        if any(d is None for d in datas):
            return {}
        return {n: d for n, d in zip(names, datas, strict=True) if d is not None}

    def _from_pack(self, group_file: str) -> dict[str, bytes]:
        """A kernel :class:`CuforgeCacheManager` stored (one pack): its group file as
        Triton's remote manager writes one, its files kept for the ``get`` that follows."""
        assert self._files is not None
        (raw,) = self._files.load_many([_PACK + group_file.removeprefix(_GROUP)])
        items = _unpack(raw)
        if items is None:
            return {}
        self._unpacked = dict(items)
        return {group_file: json.dumps({"child_paths": [n for n, _ in items]}).encode()}

    def put(self, filename: str, data: bytes) -> None:
        """Store ``data`` (in the background: ``_behind``)."""
        if self._files is not None:
            self._files.store(filename, _as_bytes(data))
