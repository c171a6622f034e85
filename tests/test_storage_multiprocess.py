"""FileStreamProgramCache shared by real processes (multiprocessing, spawn)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
from pathlib import Path

import pytest

from cuforge.storage import FileStreamProgramCache
from cuforge.storage._integrity import SIDECAR_SUFFIX

CTX = mp.get_context("spawn")
pytestmark = pytest.mark.skipif(os.name == "nt", reason="POSIX process tools")


def _run(target, args_list, timeout: float = 60) -> list[int]:
    procs = [CTX.Process(target=target, args=args) for args in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


def _writer(root: str, idx: int, n: int, cap: int | None, size: int, err_dir: str) -> None:
    try:
        c = FileStreamProgramCache(root, max_size_bytes=cap)
        payload = bytes([idx]) * size
        for i in range(n):
            c[f"{idx}-{i}"] = payload
            got = c.get(f"{idx}-{i % 7}")
            assert got is None or got == payload
        c.close()
    except BaseException:
        Path(err_dir, f"writer{idx}").write_text(traceback.format_exc())
        raise


def _clearer(root: str, rounds: int, err_dir: str) -> None:
    try:
        c = FileStreamProgramCache(root)
        for _ in range(rounds):
            c.clear()
            len(c)
        c.close()
    except BaseException:
        Path(err_dir, "clearer").write_text(traceback.format_exc())
        raise


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "entries").rglob("*") if p.is_file())


def test_clear_racing_writers_raises_nowhere(tmp_path: Path) -> None:
    root, errs = tmp_path / "c", tmp_path / "errs"
    errs.mkdir()
    FileStreamProgramCache(root).close()
    args = [(str(root), i, 150, None, 800, str(errs)) for i in range(4)]
    procs = [CTX.Process(target=_writer, args=a) for a in args]
    procs.append(CTX.Process(target=_clearer, args=(str(root), 40, str(errs))))
    procs.append(CTX.Process(target=_clearer, args=(str(root), 40, str(errs))))
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    codes = [p.exitcode for p in procs]
    assert codes == [0] * 6, {f.name: f.read_text() for f in errs.iterdir()}
    with FileStreamProgramCache(root) as c:
        for i in range(4):
            for j in range(150):
                got = c.get(f"{i}-{j}")
                assert got is None or got == bytes([i]) * 800
        assert c.stats().integrity_failures == 0


def test_cap_under_four_concurrent_writers(tmp_path: Path) -> None:
    root, errs = tmp_path / "c", tmp_path / "errs"
    errs.mkdir()
    cap = 200_000
    args = [(str(root), i, 400, cap, 1024, str(errs)) for i in range(4)]
    codes = _run(_writer, args)
    assert codes == [0] * 4, {f.name: f.read_text() for f in errs.iterdir()}
    on_disk = _disk_bytes(root)
    assert on_disk <= 1.1 * cap, on_disk
    assert on_disk >= 0.5 * cap  # it evicted down to ~90%, not everything
    with FileStreamProgramCache(root) as c:
        assert abs(c.size_bytes - on_disk) <= 0.1 * cap


def _contender(root: str, counter: str, log: str, hold_s: float) -> None:
    c = FileStreamProgramCache(root)
    with c.lock("hot-key", timeout=30) as held:
        assert held
        with open(log, "a") as f:
            f.write(f"enter {os.getpid()} {time.monotonic()}\n")
        n = int(Path(counter).read_text() or "0") if Path(counter).exists() else 0
        time.sleep(hold_s)  # a lost update below would show overlap
        Path(counter).write_text(str(n + 1))
        with open(log, "a") as f:
            f.write(f"exit {os.getpid()} {time.monotonic()}\n")
    c.close()


def test_lock_four_processes_one_at_a_time(tmp_path: Path) -> None:
    root = tmp_path / "c"
    FileStreamProgramCache(root).close()
    counter, log = tmp_path / "counter", tmp_path / "log"
    codes = _run(_contender, [(str(root), str(counter), str(log), 0.1)] * 4)
    assert codes == [0] * 4
    assert counter.read_text() == "4"
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert events == ["enter", "exit"] * 4  # never two inside at once
    assert list((root / "locks").iterdir()) == []  # lock files cleaned up


def _holder_forever(root: str, ready: str) -> None:
    c = FileStreamProgramCache(root)
    with c.lock("hot-key", timeout=5):
        Path(ready).write_text("held")
        time.sleep(600)


def _waiter(root: str, out: str) -> None:
    c = FileStreamProgramCache(root)
    t0 = time.monotonic()
    with c.lock("hot-key", timeout=20) as held:
        Path(out).write_text(f"{held} {time.monotonic() - t0}")


def test_killed_holder_does_not_block_waiters(tmp_path: Path) -> None:
    root = tmp_path / "c"
    FileStreamProgramCache(root).close()
    ready = tmp_path / "ready"
    holder = CTX.Process(target=_holder_forever, args=(str(root), str(ready)))
    holder.start()
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists()
    outs = [tmp_path / f"w{i}" for i in range(3)]
    waiters = [CTX.Process(target=_waiter, args=(str(root), str(o))) for o in outs]
    for w in waiters:
        w.start()
    time.sleep(1.0)
    assert not any(o.exists() for o in outs)  # really blocked by the live holder
    os.kill(holder.pid, signal.SIGKILL)
    for w in waiters:
        w.join(30)
    holder.join(5)
    for o in outs:
        held, waited = o.read_text().split()
        assert held == "True" and float(waited) < 15  # well before the 20 s timeout


def test_lock_timeout_falls_through_with_live_holder(tmp_path: Path) -> None:
    root = tmp_path / "c"
    FileStreamProgramCache(root).close()
    ready = tmp_path / "ready"
    holder = CTX.Process(target=_holder_forever, args=(str(root), str(ready)))
    holder.start()
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        with FileStreamProgramCache(root) as c:
            t0 = time.monotonic()
            with c.lock("hot-key", timeout=0.3) as held:
                assert held is False
            assert 0.25 < time.monotonic() - t0 < 5
    finally:
        holder.kill()
        holder.join(5)


def test_a_forked_child_takes_a_key_its_parents_thread_held_at_the_fork(tmp_path: Path) -> None:
    # A thread of the parent holds the key at the fork. The child must wait only for
    # the cross-process lock, never for that thread's in-process hold: the thread does
    # not exist in the child, so the child waited out its whole timeout and compiled
    # unlocked. The write-behind holds a kernel's lock until its stores land, which
    # makes a fork meanwhile likely.
    c = FileStreamProgramCache(tmp_path / "c")
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with c.lock("hot-key", timeout=5) as got:
            assert got
            held.set()
            release.wait(60)

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(60)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait until the parent let go, then take the key
        os.close(w)
        os.read(r, 1)
        with c.lock("hot-key", timeout=10) as got:
            os._exit(0 if got else 1)
    os.close(r)
    release.set()
    thread.join()
    os.write(w, b"x")
    os.close(w)
    _, status = os.waitpid(pid, 0)
    c.close()
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_group_member_can_use_cache_created_with_mode() -> None:
    group = 54321  # any gid works; the other user only needs it as a supplementary group
    base = Path(tempfile.mkdtemp(prefix="cuforge-shared-"))
    try:
        base.chmod(0o755)
        root = base / "cache"
        with FileStreamProgramCache(root, mode=0o2770) as c:
            c["from-owner"] = b"owner"
        os.chown(root, -1, group)
        for d in root.rglob("*"):
            os.chown(d, -1, group)
        code = textwrap.dedent(
            f"""
            import os
            from cuforge.storage import FileStreamProgramCache  # before losing access to it
            os.setgroups([{group}]); os.setgid(65534); os.setuid(65534)
            with FileStreamProgramCache({str(root)!r}, mode=0o2770) as c:
                assert c.get("from-owner") == b"owner"
                c["from-member"] = b"member"
                assert c.get("from-member") == b"member"
                assert c.stats().write_failures == 0, c.stats()
                with c.lock("k") as held:
                    assert held
            print("ok")
            """
        )
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert out.returncode == 0, out.stderr
        with FileStreamProgramCache(root, mode=0o2770) as c:  # a group cache: say so
            assert c.get("from-member") == b"member"
        member_files = [p for p in (root / "entries").rglob("*") if p.is_file()]
        for p in member_files:
            assert stat.S_IMODE(p.stat().st_mode) == 0o660
            assert p.stat().st_gid == group
        assert any(p.name.endswith(SIDECAR_SUFFIX) for p in member_files)
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
