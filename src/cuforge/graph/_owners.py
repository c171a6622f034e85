"""Owner bundles: what graph nodes keep alive, owned by CUDA user objects.

A bundle is an immutable tuple of Python objects (allocations, kernels, callables,
private copies of user data, ...) registered under an integer id. The id is the
``ptr`` of a CUDA user object whose destructor is the C function
``cuforge_release`` (:mod:`cuforge._native._release`). The user object is retained
on a ``CUgraph`` with ``CU_GRAPH_USER_OBJECT_MOVE``, so from then on CUDA alone
decides when the bundle may go: it carries the reference through clones,
instantiation, child-graph embedding, whole-graph exec updates and in-flight
launches, and runs the destructor when the last of those is gone. The destructor
only queues the id; the owners are dropped here, on the main thread, by the
interpreter's pending call or by :func:`drain`.

Guarantees: a registered bundle is never dropped before CUDA released its user
object; after interpreter shutdown starts, bundles are leaked on purpose.
Failure modes: driver errors raise :class:`~cuforge.runtime.errors.CUDAError`;
the bundle is then dropped at once (nothing in CUDA references it yet).
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from cuda.bindings import driver

from cuforge._log import get_logger
from cuforge._native import _release as _native
from cuforge.runtime import capture_guard
from cuforge.runtime.errors import check, error_for
from cuforge.runtime.init import driver_entry

_log = get_logger("cuforge.graph")  # with the cuforge NullHandler in place (cuforge._log)
_DEBUG = 10  # logging.DEBUG
_registry: dict[int, Any] = {}
_ids = itertools.count(1)
_lock = threading.Lock()
_DESTRUCTOR = driver.CUhostFn(_native.destructor_address())
_NO_SYNC = driver.CUuserObject_flags.CU_USER_OBJECT_NO_DESTRUCTOR_SYNC
_MOVE = driver.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE


def _release(tokens: Iterable[int]) -> None:
    # Popping under the lock and dropping outside it: owners' finalizers may run
    # arbitrary code (even graph code that registers new bundles).
    dropped = []
    with _lock:
        for token in tokens:
            dropped.append(_registry.pop(token, None))
        live = len(_registry)
    released = len(dropped)
    dropped.clear()
    if _log.isEnabledFor(_DEBUG):
        _log.debug("released %d owner bundles (%d still held by CUDA)", released, live)


_native.set_release_callback(_release)
atexit.register(_native.shutdown)


def register(owners: Any) -> int:
    """Register ``owners`` and return its id (not yet owned by CUDA)."""
    token = next(_ids)
    with _lock:
        _registry[token] = owners
    return token


def create_user_object(owners: Any) -> tuple[int, driver.CUuserObject]:
    """A new user object (refcount 1, owned by the caller) owning ``owners``."""
    token = register(owners)
    err, uobj = driver.cuUserObjectCreate(token, _DESTRUCTOR, 1, _NO_SYNC)
    if err != driver.CUresult.CUDA_SUCCESS:
        unregister(token)
        check((err,), "cuUserObjectCreate")
    return token, uobj


def unregister(token: int) -> None:
    """Forget a bundle that CUDA never took (used on failure paths)."""
    with _lock:
        _registry.pop(token, None)


def attach(graph: int, owners: Any) -> int:
    """Retain a new bundle holding ``owners`` on the CUgraph at address ``graph``;
    returns its id. On failure nothing references the bundle and CUDAError is raised.
    """
    c = native_graph()
    if c:
        token = register(owners)
        err = c.commit(graph, token)
        if err:
            unregister(token)
            raise error_for(driver.CUresult(err), "cuGraphRetainUserObject")
        return token
    token, uobj = create_user_object(owners)
    err = driver.cuGraphRetainUserObject(driver.CUgraph(graph), uobj, 1, _MOVE)[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        # Our reference is still ours: releasing it runs the destructor (queued).
        driver.cuUserObjectRelease(uobj, 1)
        check((err,), "cuGraphRetainUserObject")
    return token


_c_graph: Any = None  # cuforge._native._graph with its entries set; False: unavailable


def native_graph() -> Any:
    """The C helper for graph creation, commits and instantiation, or False (then
    cuda.bindings is used)."""
    global _c_graph
    if _c_graph is None:
        try:
            from cuforge._native import _graph
        except ImportError:  # no C helpers built
            _c_graph = False
            return _c_graph
        names = (
            b"cuCtxGetCurrent", b"cuGraphCreate", b"cuUserObjectCreate", b"cuUserObjectRelease",
            b"cuGraphRetainUserObject", b"cuGraphInstantiateWithFlags", b"cuLaunchHostFunc",
            b"cuStreamWaitEvent",
        )  # fmt: skip
        addrs = [driver_entry(n) for n in names]
        if all(addrs):
            _graph.set_entries(*addrs, _native.destructor_address())
            _c_graph = _graph
        else:
            _c_graph = False
    return _c_graph


def drain() -> int:
    """Drop every bundle whose user object CUDA has destroyed; returns how many.

    Runs the releases a stream capture had deferred first (``capture_guard``), when
    no capture forbids them any more.
    """
    if capture_guard.pending():
        capture_guard.drain()
    tokens = _native.drain()
    if tokens:
        _release(tokens)
    return len(tokens)


def live_bundles() -> int:
    """Number of bundles still registered (CUDA may still use them)."""
    return len(_registry)


def is_live(token: int) -> bool:
    """Whether the bundle ``token`` is still registered."""
    return token in _registry


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Drain repeatedly until ``predicate()`` holds or ``timeout`` seconds pass.

    CUDA destroys user objects asynchronously (after in-flight launches finish), so
    callers that want to observe a release poll; this is bounded, never a hang.
    """
    deadline = time.monotonic() + timeout
    while True:
        drain()
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
