"""The C deferred-release queue, without CUDA.

The destructor is called from fresh pthreads (as CUDA's internal thread would) and
the tests check that the release then happens on the main thread, exactly once per
token, and that shutdown makes the destructor a no-op. Runs everywhere (CI too).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest

from cuforge._native import _release as native

BASE = 1 << 40  # far from the ids the graph registry hands out


@pytest.fixture
def callback():
    """Install a recording release callback; restore the graph's one afterwards."""
    calls: list[tuple[int, list[int]]] = []

    def record(tokens: list[int]) -> None:
        calls.append((threading.get_ident(), list(tokens)))

    native.drain()
    native.set_release_callback(record)
    yield calls
    native.set_release_callback(None)
    native.drain()
    owners = sys.modules.get("cuforge.graph._owners")
    native.set_release_callback(owners._release if owners else None)


def _wait(pred, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)  # pending calls run between bytecodes of the main thread
    return True


def _tokens(calls) -> list[int]:
    return [t for _, batch in calls for t in batch]


def test_destructor_address_is_a_c_function() -> None:
    assert isinstance(native.destructor_address(), int)
    assert native.destructor_address() != 0
    assert native.host_trampoline_address() not in (0, native.destructor_address())


def test_release_from_foreign_thread_runs_on_main_thread(callback) -> None:
    native._test_release_from_thread(BASE + 7)
    assert _wait(lambda: _tokens(callback) == [BASE + 7])
    assert {tid for tid, _ in callback} == {threading.main_thread().ident}
    assert native.queued() == 0


def test_many_threads_every_token_exactly_once(callback) -> None:
    threads, per_thread = 8, 5000
    native._test_release_from_thread(BASE, per_thread, threads)
    want = set(range(BASE, BASE + threads * per_thread))
    assert _wait(lambda: len(_tokens(callback)) >= len(want))
    got = _tokens(callback)
    assert len(got) == len(want) and set(got) == want
    assert {tid for tid, _ in callback} == {threading.main_thread().ident}


def test_without_callback_tokens_wait_for_explicit_drain(callback) -> None:
    native.set_release_callback(None)
    native._test_release_from_thread(BASE + 100, 3)
    time.sleep(0.01)
    assert native.queued() == 3
    assert sorted(native.drain()) == [BASE + 100, BASE + 101, BASE + 102]
    assert native.queued() == 0 and native.drain() == []


def test_callback_error_is_unraisable_not_raised(callback, monkeypatch) -> None:
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))

    def boom(tokens):
        raise RuntimeError("boom")

    native.set_release_callback(boom)
    native._test_release_from_thread(BASE + 200)
    assert _wait(lambda: bool(seen))
    assert isinstance(seen[0], RuntimeError)


def test_set_release_callback_rejects_non_callable() -> None:
    with pytest.raises(TypeError):
        native.set_release_callback(42)


def test_host_trampoline_calls_python_from_foreign_thread(monkeypatch) -> None:
    seen: list[int] = []
    native._test_host_call_from_thread(lambda: seen.append(threading.get_ident()))
    assert len(seen) == 1 and seen[0] != threading.main_thread().ident

    errors = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: errors.append(u.exc_value))
    native._test_host_call_from_thread(lambda: 1 / 0)
    assert isinstance(errors[0], ZeroDivisionError)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_shutdown_makes_destructor_a_noop() -> None:
    proc = _run(
        """
        from cuforge._native import _release as n
        got = []
        n.set_release_callback(got.extend)
        n.shutdown()
        assert n.is_shut_down()
        n._test_release_from_thread(5, 10)
        assert n.queued() == 0 and n.drain() == [] and got == []
        n._test_host_call_from_thread(lambda: got.append(1))
        assert got == []
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_destructor_storm_during_interpreter_exit_neither_crashes_nor_hangs() -> None:
    proc = _run(
        """
        import atexit, threading
        from cuforge._native import _release as n
        n.set_release_callback(lambda tokens: None)
        atexit.register(n.shutdown)
        def storm():
            while True:
                n._test_release_from_thread(1, 1000, 4)
        for _ in range(2):
            threading.Thread(target=storm, daemon=True).start()
        print("exiting")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "exiting" in proc.stdout


def test_a_refused_drain_request_leaves_the_release_for_the_next_drain() -> None:
    """The interpreter's pending-call queue is full when the destructor runs: the
    release waits, queued, and the next drain runs it -- on the main thread."""
    proc = _run(
        """
        import ctypes
        import threading
        import time

        from cuforge._native import _release as n
        from cuforge.graph import _owners, drain_released

        finished = []

        class Owner:
            def __del__(self):
                finished.append(threading.get_ident())

        token = _owners.register((Owner(),))
        PENDING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes = [PENDING, ctypes.c_void_p]
        add.restype = ctypes.c_int
        run = ctypes.pythonapi.Py_MakePendingCalls
        run.argtypes = []
        run.restype = ctypes.c_int
        noop = PENDING(lambda _: 0)
        before = n.pending_call_failures()
        report = {}

        ready, gate = threading.Event(), threading.Lock()
        gate.acquire()

        def fill_then_release():
            # The main thread runs pending calls between bytecodes: wait until it is
            # blocked in gate.acquire() (C, no bytecode) before filling its queue.
            ready.wait()
            time.sleep(0.05)
            added = 0
            while add(noop, None) == 0:
                added += 1
                assert added < 1_000_000, "the pending-call queue never filled"
            n._test_release_from_thread(token)  # a foreign pthread, as CUDA's would be
            report["queued"] = n.queued()
            report["refused"] = n.pending_call_failures() - before
            gate.release()

        t = threading.Thread(target=fill_then_release)
        t.start()
        ready.set()
        gate.acquire()
        t.join()
        assert report == {"queued": 1, "refused": 1}, report
        assert run() == 0  # room again, and no drain request among the calls run
        assert finished == [] and _owners.is_live(token) and n.queued() == 1
        drain_released()
        assert finished == [threading.main_thread().ident], finished
        assert not _owners.is_live(token) and n.queued() == 0
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
