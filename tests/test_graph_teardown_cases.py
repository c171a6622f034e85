"""Tearing graph parts down: what goes, what stays, and on which thread.

Behaviours cuda.core's lifetime, mutation and node-update suites check (see
``tests/graph_coverage.md``; no upstream code or text), tested on cuforge: a
destroyed conditional node closes its bodies and releases their owners, a destroyed
child node releases the owners of every copy nested in it, a destroy the driver
refuses changes nothing, an executable-graph child update keeps the new child's
owners in the executable, and a release whose pending call the interpreter refused
is not stranded.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest

from conftest import device_ordinal
from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    cfg,
    expect_raises,
    kernels,
    no_leftover_bundles,
    read_ints,
    released,
    setup_device,
    write_ints,
)

pytestmark = pytest.mark.gpu


@pytest.fixture
def dev():
    return setup_device()


class Owner:
    """Something a node names as an owner, observable through a weak reference."""


def _conditional(g, kind):
    cond = g.create_condition(0)
    if kind == "if":
        return g.if_then(cond)
    if kind == "if_else":
        return g.if_else(cond)
    if kind == "while":
        return g.while_loop(cond)
    return g.switch(cond, 4)


@pytest.mark.parametrize("kind", ["if", "if_else", "while", "switch"])
def test_destroying_a_conditional_node_closes_its_bodies_and_releases_their_owners(
    dev, kind
) -> None:
    from cuforge.graph import ConditionalNode, GraphDefinition

    s = dev.create_stream()
    buf = dev.allocate(64)
    write_ints(buf, [5] * 16)
    g = GraphDefinition()
    node = _conditional(g, kind)
    bodies = node.branches
    refs, body_nodes = [], []
    for i, body in enumerate(bodies):
        owner = Owner()
        refs.append(weakref.ref(owner))
        body_nodes.append(body.memset(buf.handle + 4 * i, i + 1, 4, dst_owner=owner))
    del owner
    exe = g.instantiate()  # holds its own copy of the bodies and their owners
    gc.collect()
    assert all(r() is not None for r in refs)

    (listed,) = [n for n in g.nodes() if isinstance(n, ConditionalNode)]
    listed.destroy()  # through a view listed from the driver, not the creating object
    assert not node.is_valid
    assert all(b.is_closed for b in bodies)
    assert not any(n.is_valid for n in body_nodes)
    expect_raises(ValueError, bodies[0].nodes)
    expect_raises(ValueError, getattr, bodies[-1], "handle")
    expect_raises(ValueError, bodies[0].launch, cfg(), kernels()["noop"])
    expect_raises(ValueError, body_nodes[0].memset, buf, 0, 4)
    gc.collect()
    assert all(r() is not None for r in refs)  # the executable still runs them

    exe.launch(s)  # condition 0: IF/WHILE run nothing, IF/ELSE its else, SWITCH branch 0
    s.sync()
    ran = {"if": None, "while": None, "if_else": 1, "switch": 0}[kind]
    want = [5] * 16
    if ran is not None:
        want[ran] = int.from_bytes(bytes([ran + 1] * 4), "little")
    assert list(read_ints(buf, 16)) == want
    exe.close()
    assert released(lambda: all(r() is None for r in refs))  # the definition lives on
    assert g.nodes() == ()
    g.close()


def test_destroying_a_child_node_releases_owners_of_every_nested_copy(dev) -> None:
    from cuforge.graph import GraphDefinition

    class Callback:
        def __call__(self) -> None:
            pass

    fn = Callback()
    w = weakref.ref(fn)
    inner = GraphDefinition()
    inner.callback(fn)
    middle = GraphDefinition()
    middle.embed(inner)
    outer = GraphDefinition()
    node = outer.embed(middle)
    del fn
    inner.close()
    middle.close()
    gc.collect()
    assert w() is not None  # the copy of a copy inside ``outer`` holds it
    node.destroy()
    assert released(lambda: w() is None)  # while ``outer`` itself lives on
    assert outer.nodes() == ()
    outer.close()


def test_a_refused_destroy_leaves_node_edges_and_owners(dev) -> None:
    """CUDA keeps every node of a graph that holds memory nodes: the refusal must not
    mark the node destroyed or drop anything it owns."""
    from cuforge import CUDAError
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    calls: list[int] = []

    class Callback:
        def __call__(self) -> None:
            calls.append(1)

    fn = Callback()
    w = weakref.ref(fn)
    g = GraphDefinition()
    alloc = g.allocate(4)
    node = alloc.callback(fn)
    node.deallocate(alloc)
    del fn
    gc.collect()
    expect_raises(CUDAError, node.destroy)
    assert node.is_valid and node in g.nodes()
    assert (alloc, node) in g.edges()
    assert node.fn is w() is not None
    exe = g.instantiate()
    exe.launch(s)
    s.sync()
    assert calls == [1]
    exe.close()
    g.close()
    assert released(lambda: w() is None)


def test_an_executable_child_update_moves_the_new_childs_owners_into_the_executable(
    dev,
) -> None:
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    called: list[str] = []

    class Callback:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self) -> None:
            called.append(self.name)

    original, replacement = Callback("original"), Callback("replacement")
    w_original, w_replacement = weakref.ref(original), weakref.ref(replacement)
    first = GraphDefinition()
    first.callback(original)
    source = GraphDefinition()
    node = source.embed(first)
    first.close()
    exe = source.instantiate()
    second = GraphDefinition()
    second.callback(replacement)
    exe[node].update(second)
    second.close()  # the only cuforge object that named the replacement's owners
    del original, replacement
    gc.collect()
    assert w_replacement() is not None  # CUDA copied the reference into the executable

    exe.launch(s)
    s.sync()
    assert called == ["replacement"]
    source.close()
    # The executable dropped the replaced child's references at the update, and the
    # definition's copy went with the definition; the replacement stays.
    assert released(lambda: w_original() is None)
    assert w_replacement() is not None
    exe.launch(s)
    s.sync()
    assert called == ["replacement", "replacement"]
    exe.close()
    assert released(lambda: w_replacement() is None)


_STRANDED = r"""
import ctypes
import sys
import threading
import time

from cuforge import Device
from cuforge._native import _release
from cuforge.graph import GraphDefinition

dev = Device(int(sys.argv[1]))
dev.set_current()
finished = []


class Owner:
    def __call__(self):
        pass

    def __del__(self):
        finished.append(threading.get_ident())


PENDING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
add_pending = ctypes.pythonapi.Py_AddPendingCall
add_pending.argtypes = [PENDING, ctypes.c_void_p]
add_pending.restype = ctypes.c_int
run_pending = ctypes.pythonapi.Py_MakePendingCalls
run_pending.argtypes = []
run_pending.restype = ctypes.c_int
noop = PENDING(lambda _: 0)

g = GraphDefinition()
g.callback(Owner())
holder = [g]
del g
refused_before = _release.pending_call_failures()
report = {}


ready, gate = threading.Event(), threading.Lock()
gate.acquire()


def fill_then_drop():
    # The main thread runs pending calls between bytecodes: wait until it is blocked
    # in gate.acquire() (C, no bytecode) before filling the interpreter's queue.
    dev.set_current()
    ready.wait()
    time.sleep(0.05)
    added = 0
    while add_pending(noop, None) == 0:
        added += 1
        if added > 1_000_000:
            report["unbounded"] = True
            break
    report["added"] = added
    holder.clear()  # the graph goes: CUDA runs the destructor while the queue is full
    # The destructor queues the token, then asks for a drain and counts the refusal:
    # wait for that last step.
    deadline = time.monotonic() + 30
    while _release.pending_call_failures() == refused_before and time.monotonic() < deadline:
        dev.sync()
        time.sleep(0.001)
    report["queued"] = _release.queued()
    report["refused"] = _release.pending_call_failures() - refused_before
    gate.release()


t = threading.Thread(target=fill_then_drop)
t.start()
ready.set()
gate.acquire()
t.join()
assert report.get("added", 0) > 0 and "unbounded" not in report, report
assert report["queued"] == 1 and report["refused"] >= 1, report
assert run_pending() == 0  # the queue has room again; no drain request is in it
assert finished == [] and _release.queued() == 1, (finished, _release.queued())
GraphDefinition().close()  # a cuforge entry point drains what was left queued
assert finished == [threading.get_ident()], finished
assert threading.get_ident() == threading.main_thread().ident
assert _release.queued() == 0
print("stranded release ran on the main thread", report)
"""


def test_a_refused_drain_request_strands_no_release(dev, tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _STRANDED, str(device_ordinal())],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "stranded release ran on the main thread" in proc.stdout
