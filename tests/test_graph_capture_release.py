"""No release ever breaks a stream capture (issue 11, section 1).

Each case drops the last reference to something cuforge must free or destroy while
a stream capture is in progress and runs ``gc.collect()``, then checks that the
capture still ends cleanly, that the captured graph runs, that the release waited
while the capture forbade it, and that it really happened afterwards (memory back in
the pool, pinned memory unmapped, owners released) -- deferred, never leaked.
Covered: captures cuforge begins in every mode, a capture on another thread,
captures begun by another library (cuda.bindings directly, and PyTorch when
installed), and releases that arrive through graph owner bundles.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    cfg,
    kernels,
    no_leftover_bundles,
    released,
    setup_device,
)

pytestmark = pytest.mark.gpu

MODES = ("global", "thread_local", "relaxed")
BIG = 32 << 20  # big enough to see in the pool's used-memory counter


@pytest.fixture
def dev():
    return setup_device()


def _ok(res):
    from cuda.bindings import driver

    assert res[0] == driver.CUresult.CUDA_SUCCESS, res[0]
    return res[1] if len(res) == 2 else res[1:]


def pool_used(dev) -> int:
    """Bytes of the device's default pool in use by the application (stream-synced)."""
    from cuda.bindings import driver

    _ok(driver.cuCtxSynchronize())
    pool = _ok(driver.cuDeviceGetMemPool(dev.device_id))
    attr = driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_CURRENT
    return int(_ok(driver.cuMemPoolGetAttribute(pool, attr)))


def pinned_alive(ptr: int) -> bool:
    from cuda.bindings import driver

    return driver.cuMemHostGetFlags(ptr)[0] == driver.CUresult.CUDA_SUCCESS


def deferred_now() -> int | None:
    """Releases waiting in the capture guard (None where cuforge has no guard)."""
    try:
        from cuforge.runtime import capture_guard
    except ImportError:
        return None
    return capture_guard.pending()


class Victim:
    """Something whose last reference goes during the capture, and how to see it freed."""

    def __init__(self, dev, kind: str, builder_stream) -> None:
        from cuforge import PinnedMemoryResource
        from cuforge.graph import GraphDefinition

        self.kind = kind
        self.objs: list = []
        self.check_gone = lambda: True
        self.used_before = None
        s = dev.create_stream()
        if kind == "pool_buffer_on_stream":
            self.objs.append(dev.allocate(BIG, stream=s))
            self.objs.append(s)
        elif kind == "pool_buffer_default_stream":
            self.objs.append(dev.allocate(BIG))
        elif kind == "pool_buffer_freed_on_capturing_stream":
            # Its free is ordered on the stream being captured: running it there would
            # record the free into the graph.
            self.objs.append(dev.allocate(BIG, stream=builder_stream))
        elif kind == "pool_buffer_free_stream_closed":
            b = dev.allocate(BIG, stream=s)
            alloc = b.allocation  # what really owns the memory
            b.close(stream=s)
            s.close()  # the free then needs a context synchronisation
            self.objs.append(alloc)
        elif kind == "pinned_buffer":
            b = PinnedMemoryResource(dev).allocate(4096, stream=s)
            self.objs += [b, s]
            ptr = b.handle
            self.check_gone = lambda: not pinned_alive(ptr)
        elif kind in ("graph_with_buffer_owner", "exec_with_buffer_owner"):
            buf = dev.allocate(BIG, stream=s)
            s.sync()
            g = GraphDefinition()
            g.launch(cfg(), kernels()["add_one"], buf, 1)
            exe = g.instantiate()
            buf.close()
            if kind == "graph_with_buffer_owner":
                exe.close()
                self.objs.append(g)  # only the definition holds the buffer now
            else:
                g.close()
                self.objs.append(exe)  # only the executable graph holds it now
        elif kind == "event":
            self.objs.append(dev.create_event())
        elif kind == "stream":
            self.objs.append(s)
        elif kind == "loaded_library":
            from cuforge import Program, ProgramOptions

            src = 'extern "C" __global__ void lone() {}'
            code = Program(src, "c++", ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin")
            k = code.get_kernel("lone")
            lib = weakref.ref(k._lib) if hasattr(k, "_lib") else None
            self.objs += [code, k]
            if lib is not None:
                self.check_gone = lambda: lib() is None
        else:
            raise AssertionError(kind)
        if "pool_buffer" in kind or "buffer_owner" in kind:
            self.used_before = pool_used(dev)

    def drop(self) -> None:
        self.objs.clear()
        gc.collect()

    def gone(self, dev) -> bool:
        if self.used_before is not None and pool_used(dev) > self.used_before - BIG:
            return False
        return self.check_gone()


KINDS = (
    "pool_buffer_on_stream",
    "pool_buffer_default_stream",
    "pool_buffer_freed_on_capturing_stream",
    "pool_buffer_free_stream_closed",
    "pinned_buffer",
    "graph_with_buffer_owner",
    "exec_with_buffer_owner",
    "event",
    "stream",
    "loaded_library",
)
# Releases a capture in this mode makes cuforge hold back (the others run at once).
DEFERRED_IN_ANY_MODE = {"pool_buffer_freed_on_capturing_stream", "pool_buffer_free_stream_closed"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_release_during_own_capture_is_deferred_not_breaking(dev, mode, kind) -> None:
    from cuforge.graph import drain_released

    hits: list[int] = []
    builder = dev.create_graph_builder()
    victim = Victim(dev, kind, builder.stream)
    builder.begin_building(mode)
    builder.callback(lambda: hits.append(1))
    victim.drop()
    waiting = deferred_now()
    builder.end_building()  # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED if a release broke it
    graph = builder.complete()
    s = dev.create_stream()
    graph.launch(s)
    s.sync()
    assert hits == [1]
    if mode != "relaxed" or kind in DEFERRED_IN_ANY_MODE:
        assert waiting is not None and waiting >= 1, "the release ran inside the capture"
    assert deferred_now() == 0, "ending the capture must run what it deferred"
    drain_released()
    assert released(lambda: victim.gone(dev)), f"{kind} was never released"
    graph.close()
    builder.close()


@pytest.mark.parametrize("mode", MODES)
def test_capture_on_another_thread(dev, mode) -> None:
    """A global capture on any thread holds back this thread's releases; a
    thread-local or relaxed one on another thread does not concern this thread."""
    from cuforge.graph import GraphDefinition

    builder = dev.create_graph_builder()
    begun, release_done, failure = threading.Event(), threading.Event(), []

    def capture() -> None:
        try:
            dev.set_current()
            builder.begin_building(mode)
            builder.callback(lambda: None)
            begun.set()
            release_done.wait(30)
            builder.end_building()
        except BaseException as exc:  # reported below, on the main thread
            failure.append(exc)
            begun.set()

    # Everything the main thread needs is made first: a global capture on the other
    # thread forbids this thread's allocations and synchronisations too.
    s = dev.create_stream()
    buf = dev.allocate(BIG, stream=s)
    g = GraphDefinition()
    g.launch(cfg(), kernels()["add_one"], buf, 1)
    used = pool_used(dev)
    t = threading.Thread(target=capture)
    t.start()
    assert begun.wait(30)
    del buf, g
    gc.collect()
    waiting = deferred_now()
    release_done.set()
    t.join(30)
    assert not failure, f"the capture on the other thread broke: {failure[0]!r}"
    if mode == "global":
        assert waiting is not None and waiting >= 1
    else:
        assert waiting == 0  # nothing to wait for: the release ran at once
    assert released(lambda: pool_used(dev) <= used - BIG)
    builder.close()


@pytest.mark.parametrize("mode", ("global", "thread_local"))
def test_capture_begun_through_cuda_bindings(dev, mode) -> None:
    """A capture cuforge did not begin (another library's) is not broken by cuforge's
    releases: they run in relaxed interaction mode, and a free ordered on the
    capturing stream itself waits until the next drain after the capture."""
    from cuda.bindings import driver

    from cuforge import Stream, launch
    from cuforge.graph import GraphDefinition, drain_released

    raw = _ok(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
    foreign = Stream.from_handle(int(raw))
    s = dev.create_stream()
    on_foreign = dev.allocate(BIG, stream=foreign)
    others = [dev.allocate(BIG, stream=s), dev.allocate(BIG)]
    g = GraphDefinition()
    g.launch(cfg(), kernels()["add_one"], others[0], 1)
    exe = g.instantiate()
    used = pool_used(dev)
    m = getattr(driver.CUstreamCaptureMode, f"CU_STREAM_CAPTURE_MODE_{mode.upper()}")
    _ok(driver.cuStreamBeginCapture(raw, m))
    try:
        launch(foreign, cfg(), kernels()["noop"])
        del on_foreign, others, g, exe
        gc.collect()
        waiting = deferred_now()
    finally:  # a capture left open would break every later test
        err, graph = driver.cuStreamEndCapture(raw)
    assert err == driver.CUresult.CUDA_SUCCESS, err  # a release broke the capture
    _ok(driver.cuGraphDestroy(graph))
    assert waiting == 1  # only the free ordered on the capturing stream waited
    drain_released()
    assert released(lambda: pool_used(dev) <= used - 3 * BIG)
    _ok(driver.cuStreamDestroy(raw))


def test_torch_capture_is_not_broken_by_cuforge_releases(dev) -> None:
    torch = pytest.importorskip("torch")
    from cuforge.graph import GraphDefinition

    x = torch.zeros(16, device=f"cuda:{dev.device_id}")
    s = dev.create_stream()
    buf = dev.allocate(BIG, stream=s)
    g = GraphDefinition()
    g.launch(cfg(), kernels()["add_one"], buf, 1)
    exe = g.instantiate()
    used = pool_used(dev)
    tg = torch.cuda.CUDAGraph()
    with torch.cuda.graph(tg):  # global capture mode, torch's default
        y = x + 1
        del buf, g, exe
        gc.collect()
    tg.replay()
    torch.cuda.synchronize()
    assert float(y.sum()) == 16.0
    assert released(lambda: pool_used(dev) <= used - BIG)
    del x, y, tg  # torch's cached blocks back to the driver (memcheck's leak check)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def test_deferred_release_is_run_at_exit(tmp_path) -> None:
    """A release still queued when the program ends runs at exit (a free ordered on a
    stream whose foreign capture ended without cuforge seeing it)."""
    script = textwrap.dedent(
        """
        import atexit, gc, os
        from cuda.bindings import driver

        def report():  # registered first, so it runs after cuforge's own exit hook
            from cuforge.runtime import capture_guard
            pool = driver.cuDeviceGetMemPool(dev.device_id)[1]
            attr = driver.CUmemPool_attribute.CU_MEMPOOL_ATTR_USED_MEM_CURRENT
            driver.cuCtxSynchronize()
            used = int(driver.cuMemPoolGetAttribute(pool, attr)[1])
            print("pending", capture_guard.pending(), "used", used)

        atexit.register(report)
        from cuforge import Device, Stream
        dev = Device(int(os.environ.get("CUFORGE_TEST_DEVICE", "0"))); dev.set_current()
        raw = driver.cuStreamCreate(1)[1]
        buf = dev.allocate(64 << 20, stream=Stream.from_handle(int(raw)))
        driver.cuStreamBeginCapture(raw, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL)
        del buf; gc.collect()
        from cuforge.runtime import capture_guard
        print("queued", capture_guard.pending())
        driver.cuGraphDestroy(driver.cuStreamEndCapture(raw)[1])
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[:2] == ["queued", "1"], out.stdout
    assert lines[2:4] == ["pending", "0"], out.stdout
    assert int(lines[5]) == 0, out.stdout  # the 64 MiB went back to the pool at exit
