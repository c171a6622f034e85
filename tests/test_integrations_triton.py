"""Triton's cache on cuforge, with the real triton wheel and real processes.

Each process compiles a kernel for ``GPUTarget("cuda", 90, 32)`` on the CPU (Triton's
bundled ptxas makes the cubin) or builds a C extension through ``triton.runtime.build``
(the way Triton's launcher ``.so`` goes through the cache); see ``_triton_child.py``.
Skipped where triton is not installed (``make test-integrations`` installs it).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton")

CHILD = str(Path(__file__).with_name("_triton_child.py"))
MANAGER = "cuforge.integrations.triton:CuforgeCacheManager"
SECRET = "triton-test-secret-0123456789abcdef"


def child(
    mode: str, triton_dir: Path, cache_url: str | None, barrier: Path | None = None, **env: str
) -> subprocess.Popen[str]:
    base = dict(os.environ)
    base.pop("CUFORGE_CACHE_SECRET", None)
    full = {
        **base,
        "TRITON_CACHE_DIR": str(triton_dir),
        "TRITON_DEFAULT_FP_FUSION": "1",
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        **env,
    }
    if cache_url is not None:
        full["TRITON_CACHE_MANAGER"] = MANAGER
        full["CUFORGE_TRITON_CACHE"] = cache_url
    args = [sys.executable, CHILD, mode] + ([str(barrier)] if barrier else [])
    return subprocess.Popen(
        args, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def wait_ready(barrier: Path, n: int) -> None:
    """Until ``n`` children have imported triton and wait at ``barrier``."""
    deadline = time.monotonic() + 240
    while len(list(barrier.parent.glob(barrier.name + ".ready.*"))) < n:
        assert time.monotonic() < deadline, "children did not start"
        time.sleep(0.05)


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run(mode: str, triton_dir: Path, cache_url: str | None, **env: str) -> dict[str, Any]:
    return result(child(mode, triton_dir, cache_url, **env))


@pytest.fixture(params=["file", "sqlite", "redis", "tier"])
def cache_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'fs'}"
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'c.db'}"
    server = request.getfixturevalue("redis_server")
    if request.param == "redis":
        return f"{server.url}?prefix=tr:"
    return f"file://{tmp_path / 'tier-fs'},{server.url}?prefix=tr:"


def test_a_second_process_with_an_empty_triton_dir_hits(cache_url: str, tmp_path: Path) -> None:
    first = run("kernel", tmp_path / "t1", cache_url)
    second = run("kernel", tmp_path / "t2", cache_url)
    assert first["hits"] == [False] and first["counters"]["stored"] == 1
    assert second["hits"] == [True] and second["counters"]["misses"] == 0
    assert second["cubin"] == first["cubin"] > 0
    assert second["stats"]["hits"] == 1  # the kernel's one pack: one lookup, no compile
    files = {p.name for p in (tmp_path / "t2").rglob("*") if p.is_file()}
    assert {"add_kernel.cubin", "add_kernel.json"} <= files


def test_entries_are_listed_as_triton_by_the_cli(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'fs'}"
    run("kernel", tmp_path / "t1", url)
    ls = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "ls", "--cache", url, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = json.loads(ls.stdout)
    rows = rows["entries"] if isinstance(rows, dict) else rows
    names = {r["name"] for r in rows if r["kind"] == "triton"}
    # The kernel is one entry (its pack), not one per file.
    assert "__kernel__add_kernel.json" in names
    assert not names & {"add_kernel.cubin", "add_kernel.json", "__grp__add_kernel.json"}
    verify = subprocess.run(
        [sys.executable, "-m", "cuforge", "cache", "verify", "--cache", url],
        capture_output=True,
        text=True,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_eight_cold_processes_compile_once_where_stock_triton_compiles_each(
    tmp_path: Path,
) -> None:
    def cold_start(cache_url: str | None, name: str) -> list[dict[str, Any]]:
        barrier = tmp_path / f"{name}.go"
        procs = [
            child("kernel", tmp_path / f"{name}-t{i}", cache_url, barrier=barrier)
            if cache_url is not None
            else child("kernel", tmp_path / f"{name}-shared", None, barrier=barrier)
            for i in range(8)
        ]
        wait_ready(barrier, len(procs))
        barrier.touch()
        return [result(p) for p in procs]

    ours = cold_start(f"file://{tmp_path / 'fs'}", "cuforge")
    stock = cold_start(None, "stock")  # one shared TRITON_CACHE_DIR, Triton's own manager
    ours_compiles = sum(r["hits"] == [False] for r in ours)
    stock_compiles = sum(r["hits"] == [False] for r in stock)
    print(f"8 cold processes: cuforge compiled {ours_compiles}, stock Triton {stock_compiles}")
    assert ours_compiles == 1
    assert sum(r["counters"]["stored"] for r in ours) == 1
    assert stock_compiles > 1  # the comparison is real: stock Triton duplicates the work


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_eight_cold_processes_compile_once_through_a_shared_backend(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "sqlite":
        url = f"sqlite://{tmp_path / 'c.db'}"
    else:
        url = f"{request.getfixturevalue('redis_server').url}?prefix=cold:"
    barrier = tmp_path / "go"
    procs = [child("kernel", tmp_path / f"t{i}", url, barrier=barrier) for i in range(8)]
    wait_ready(barrier, len(procs))
    barrier.touch()
    out = [result(p) for p in procs]
    assert sum(r["hits"] == [False] for r in out) == 1  # the others waited, then hit
    assert sum(r["counters"]["stored"] for r in out) == 1
    assert sum(r["counters"]["unlocked"] for r in out) == 0
    # Released together, the others met the holder's lock: their hits were waited for.
    assert 1 <= sum(r["counters"]["waited"] for r in out) <= 7
    assert all(r["counters"]["waited"] == 0 for r in out if r["hits"] == [False])


def test_eight_cold_processes_build_a_native_module_once(tmp_path: Path) -> None:
    # Triton's launcher and driver .so files go through get_file/put like this one.
    url = f"sqlite://{tmp_path / 'c.db'}"
    barrier = tmp_path / "go"
    procs = [child("so", tmp_path / f"t{i}", url, barrier=barrier) for i in range(8)]
    wait_ready(barrier, len(procs))
    barrier.touch()
    out = [result(p) for p in procs]
    assert [r["answer"] for r in out] == [4242] * 8
    assert sum(r["stats"]["stores"] for r in out) == 1  # built once, the others hit
    assert sum(r["counters"]["unlocked"] for r in out) == 0


def _flip_stored(db: Path, file_name: str, member: str | None = None) -> None:
    """Flip one byte of the stored payload of Triton's ``file_name`` in the SQLite cache
    (with ``member``: in the middle of that file's bytes inside the kernel's pack)."""
    from cuforge.integrations._tritonpack import MAGIC, unpack

    con = sqlite3.connect(db)
    rows = con.execute("SELECT rid, meta, data FROM cuforge_entries").fetchall()
    (rid, data) = next(
        (rid, data) for rid, meta, data in rows if f'"file":"{file_name}"'.encode() in meta
    )
    at = len(data) // 2
    if member is not None:
        items = unpack(data)
        assert items is not None and member in dict(items)
        at = data.index(b"\n", len(MAGIC)) + 1
        for name, body in items:
            if name == member:
                at += len(body) // 2
                break
            at += len(body)
    damaged = bytearray(data)
    damaged[at] ^= 0x40
    con.execute("UPDATE cuforge_entries SET data = ? WHERE rid = ?", (bytes(damaged), rid))
    con.commit()
    con.close()


def test_a_flipped_byte_in_a_stored_cubin_is_a_miss_and_a_recompile(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    url = f"sqlite://{db}"
    run("kernel", tmp_path / "t1", url)
    _flip_stored(db, "__kernel__add_kernel.json", member="add_kernel.cubin")
    second = run("kernel", tmp_path / "t2", url)
    assert second["hits"] == [False]
    assert second["stats"]["integrity_failures"] == 1
    assert second["counters"] == {
        "hits": 0,
        "misses": 1,
        "stored": 1,
        "replaced": 0,
        "unlocked": 0,
        "waited": 0,
    }
    third = run("kernel", tmp_path / "t3", url)  # the recompiled kernel was stored again
    assert third["hits"] == [True] and third["stats"]["integrity_failures"] == 0


def test_a_flipped_byte_in_a_stored_launcher_so_is_a_miss_and_a_rebuild(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    url = f"sqlite://{db}"
    first = run("so", tmp_path / "t1", url)
    assert first["answer"] == 4242 and first["stats"]["stores"] == 1
    clean = run("so", tmp_path / "t2", url)
    assert clean["stats"]["hits"] == 1 and clean["stats"]["stores"] == 0
    so_name = next(p.name for p in (tmp_path / "t1").rglob("cuforge_probe*.so"))
    _flip_stored(db, so_name)
    rebuilt = run("so", tmp_path / "t3", url)
    assert rebuilt["answer"] == 4242
    assert rebuilt["stats"]["integrity_failures"] == 1
    assert rebuilt["stats"]["stores"] == 1  # built again and stored


def test_a_failed_compile_releases_the_kernels_lock_while_the_process_lives_on(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path / 'fs'}"
    done = tmp_path / "done"
    first = child("broken", tmp_path / "t1", url, DONE=str(done))
    assert first.stdout is not None
    assert json.loads(first.stdout.readline()) == {"failed": True}  # alive, compile failed
    t0 = time.monotonic()
    done2 = tmp_path / "done2"
    done2.touch()
    second = result(child("broken", tmp_path / "t2", url, DONE=str(done2)))
    waited = time.monotonic() - t0
    done.touch()
    assert result(first)["error"] == second["error"] == "CompilationError"
    # The lock's timeout is 120 s: a lock left held by the failed compile would stall
    # the second process that long before it compiled anyway.
    assert waited < 60, f"the second process waited {waited:.0f} s for the kernel's lock"
    assert second["counters"]["misses"] == 1


def test_a_tampered_local_copy_is_replaced_from_verified_bytes(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'fs'}"
    run("kernel", tmp_path / "t", url)
    cubin = next((tmp_path / "t").rglob("add_kernel.cubin"))
    good = cubin.read_bytes()
    cubin.write_bytes(good[:100] + bytes([good[100] ^ 1]) + good[101:])
    again = run("kernel", tmp_path / "t", url)
    assert again["hits"] == [True] and again["counters"]["replaced"] == 1
    assert cubin.read_bytes() == good


def test_an_entry_signed_with_another_secret_is_never_used(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'fs'}"
    run("kernel", tmp_path / "t1", url, CUFORGE_CACHE_SECRET="another-secret-0123456789abcdef")
    ours = run("kernel", tmp_path / "t2", url, CUFORGE_CACHE_SECRET=SECRET)
    assert ours["hits"] == [False]
    assert ours["stats"]["signature_failures"] >= 1
    assert ours["stats"]["hits"] == 0
    again = run("kernel", tmp_path / "t3", url, CUFORGE_CACHE_SECRET=SECRET)
    assert again["hits"] == [True]


def test_redis_killed_mid_run_compiles_still_succeed(redis_server, tmp_path: Path) -> None:
    url = f"{redis_server.url}?prefix=tk:"
    first = run("kernel", tmp_path / "t1", url)
    assert first["hits"] == [False]
    redis_server.kill()
    second = run("kernel", tmp_path / "t2", url)
    assert second["hits"] == [False] and second["cubin"] == first["cubin"]
    assert second["stats"]["read_failures"] >= 1


def test_redis_killed_inside_a_running_process_its_next_compiles_succeed(
    redis_server, tmp_path: Path
) -> None:
    url = f"{redis_server.url}?prefix=tm:"
    run("kernel", tmp_path / "warm", url)  # the 1024-block kernel is in Redis
    pause = tmp_path / "pause"
    proc = child("pause", tmp_path / "t", url, PAUSE=str(pause))
    deadline = time.monotonic() + 240
    while not Path(f"{pause}.reached").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    redis_server.kill()  # the process has served a hit from Redis and keeps running
    pause.touch()
    out = result(proc)
    # a hit, then (Redis gone) the same kernel and a new one compiled, not failed
    assert out["hits"] == [True, False, False]
    assert out["cubins"][0] == out["cubins"][1] > 0 and out["cubins"][2] > 0
    assert out["counters"]["hits"] == 1 and out["counters"]["misses"] == 2
    assert out["stats"]["read_failures"] >= 1


def test_a_retried_failing_compile_takes_the_lock_without_waiting_for_itself(
    tmp_path: Path,
) -> None:
    # The failed compile's manager lives on in the traceback; its lock used to make the
    # retry wait out the lock timeout (120 s) and then compile unlocked.
    out = run("retry", tmp_path / "t", f"file://{tmp_path / 'fs'}")
    assert out["errors"] == ["CompileTimeAssertionFailure"] * 2
    assert out["counters"]["misses"] == 2 and out["counters"]["unlocked"] == 0


def test_remote_cache_backend_serves_a_second_process(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    url = f"sqlite://{db}"
    env = {
        "TRITON_CACHE_MANAGER": "triton.runtime.cache:RemoteCacheManager",
        "TRITON_REMOTE_CACHE_BACKEND": "cuforge.integrations.triton:CuforgeRemoteCacheBackend",
        "CUFORGE_TRITON_CACHE": url,
    }
    first = run("kernel", tmp_path / "t1", None, **env)
    second = run("kernel", tmp_path / "t2", None, **env)
    assert first["hits"] == [False] and second["hits"] == [True]
    # A damaged cubin makes the whole group a miss (triton 3.6 would take a group
    # without its cubin for a hit): the kernel is compiled again and works.
    _flip_stored(db, "add_kernel.cubin")
    third = run("kernel", tmp_path / "t3", None, **env)
    assert third["hits"] == [False] and third["cubin"] == first["cubin"]
    assert third["stats"]["integrity_failures"] == 1


def test_dump_mode_keeps_tritons_behaviour(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    out = run(
        "kernel",
        tmp_path / "t",
        f"file://{tmp_path / 'fs'}",
        TRITON_KERNEL_DUMP="1",
        TRITON_DUMP_DIR=str(dump),
    )
    assert out["cubin"] > 0
    assert any(p.name == "add_kernel.ptx" for p in dump.rglob("*"))


def test_cuforge_and_its_integrations_package_do_not_import_triton() -> None:
    code = (
        "import sys, cuforge, cuforge.integrations; "
        "print(sorted(m for m in ('triton', 'torch', 'cupy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def bounded(proc: subprocess.Popen[str], seconds: float = 180) -> tuple[dict[str, Any], str]:
    """The child's report and stderr; a child still running after ``seconds`` (a hang:
    a compile is a few seconds) is killed and fails the test instead of stalling it."""
    try:
        out, err = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"the Triton process hung (killed after {seconds:.0f} s)")
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1]), err


def _unopenable_url(kind: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A cache URL that cannot be opened, and the environment that goes with it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    return {
        "proc": ("/proc/nope", {}),
        "world-writable": (str(shared), {}),
        "bare-sqlite": ("sqlite://", {}),
        "unknown-scheme": ("nosuch://x", {}),
        "short-secret": (f"file://{tmp_path / 'fs'}", {"CUFORGE_CACHE_SECRET": "short"}),
    }[kind]


@pytest.mark.parametrize(
    "kind", ["proc", "world-writable", "bare-sqlite", "unknown-scheme", "short-secret"]
)
def test_a_triton_cache_that_cannot_be_opened_is_one_warning_and_triton_compiles(
    kind: str, tmp_path: Path
) -> None:
    # Each made every triton.compile raise (the cache is chosen per compile).
    url, env = _unopenable_url(kind, tmp_path)
    out, err = bounded(child("kernel", tmp_path / "t", url, **env))
    assert out["hits"] == [False] and out["cubin"] > 0  # Triton's own cache served
    assert out["stats"] is None and out["counters"]["misses"] == 0
    warned = [line for line in err.splitlines() if "the cache cannot be opened" in line]
    assert len(warned) == 1, err[-3000:]
    assert f"cuforge: $CUFORGE_TRITON_CACHE={url!r}" in warned[0]
    again, _ = bounded(child("kernel", tmp_path / "t", url, **env))
    assert again["hits"] == [True]  # from Triton's own directory


@pytest.mark.parametrize("kind", ["bare-sqlite", "short-secret"])
def test_cuforge_cache_that_cannot_be_opened_is_one_warning_and_triton_compiles(
    kind: str, tmp_path: Path
) -> None:
    # $CUFORGE_TRITON_CACHE unset: $CUFORGE_CACHE selects; its ValueErrors raised.
    url, env = _unopenable_url(kind, tmp_path)
    env = {**env, "TRITON_CACHE_MANAGER": MANAGER, "CUFORGE_CACHE": url}
    out, err = bounded(child("kernel", tmp_path / "t", None, **env))
    assert out["hits"] == [False] and out["cubin"] > 0
    assert out["stats"] is None
    warned = [line for line in err.splitlines() if "the cache cannot be opened" in line]
    assert len(warned) == 1 and "$CUFORGE_CACHE" in warned[0], err[-3000:]


def test_the_remote_backend_on_a_cache_that_cannot_be_opened_compiles(tmp_path: Path) -> None:
    # Its constructor raised (the remote manager is made per compile): now every file
    # is a miss and every store dropped, after one warning. 'off' still refuses (below).
    env = {
        "TRITON_CACHE_MANAGER": "triton.runtime.cache:RemoteCacheManager",
        "TRITON_REMOTE_CACHE_BACKEND": "cuforge.integrations.triton:CuforgeRemoteCacheBackend",
        "CUFORGE_TRITON_CACHE": "/proc/nope",
    }
    out, err = bounded(child("kernel", tmp_path / "t", None, **env))
    assert out["hits"] == [False] and out["cubin"] > 0
    assert err.count("the cache cannot be opened") == 1, err[-3000:]
    off = subprocess.run(
        [sys.executable, CHILD, "kernel"],
        env={**os.environ, **env, "CUFORGE_TRITON_CACHE": "off", "TRITON_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert off.returncode != 0 and "caching is off" in off.stderr


def _plant(kind: str, path: Path) -> Any:
    """Put an object that is not a regular file at ``path``; returns a check that it
    is still there, unchanged (the test's own process holds a socket's listener)."""
    if kind == "fifo":
        os.mkfifo(path)
        return lambda: stat.S_ISFIFO(os.lstat(path).st_mode)
    if kind == "fed-fifo":  # a FIFO someone writes to: its bytes are not taken
        os.mkfifo(path)
        reader = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        writer = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(writer, b"the user's")

        def still_fed() -> bool:
            try:
                return (
                    stat.S_ISFIFO(os.lstat(path).st_mode) and os.read(reader, 64) == b"the user's"
                )
            finally:
                os.close(reader)
                os.close(writer)

        return still_fed
    if kind == "directory":
        path.mkdir()
        (path / "keep.txt").write_bytes(b"the user's")
        return lambda: path.is_dir() and (path / "keep.txt").read_bytes() == b"the user's"
    if kind == "symlink":
        target = path.parent.parent / "outside.txt"
        target.write_bytes(b"the user's")
        path.symlink_to(target)
        return lambda: os.readlink(path) == str(target) and target.read_bytes() == b"the user's"
    if kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(path.parent)  # a socket's path is limited to ~100 bytes
        try:
            sock.bind(path.name)
        finally:
            os.chdir(cwd)
        return lambda: stat.S_ISSOCK(os.lstat(path).st_mode) and sock.fileno() >= 0
    assert kind == "device"
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("making a device node needs privileges this process lacks")
    return lambda: stat.S_ISCHR(os.lstat(path).st_mode)


@pytest.mark.timeout(60)  # the FIFO hung the open for ever: a regression fails, not hangs
@pytest.mark.parametrize("data", [b"\x7fELF verified bytes", b""], ids=["bytes", "empty"])
@pytest.mark.parametrize("kind", ["fifo", "fed-fifo", "directory", "symlink", "socket", "device"])
def test_an_object_not_a_file_where_a_file_goes_is_left_alone_and_never_blocks(
    kind: str, data: bytes, tmp_path: Path
) -> None:
    import warnings

    from cuforge.integrations.triton import _materialize, counters
    from cuforge.storage.base import CacheWriteWarning

    key_dir = tmp_path / "triton" / "KEY"
    key_dir.mkdir(parents=True)
    where = key_dir / "k.cubin"
    unchanged = _plant(kind, where)  # (an empty FIFO reads back as empty bytes)
    replaced = counters["replaced"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        served = Path(_materialize(str(key_dir), "k.cubin", data))
        again = Path(_materialize(str(key_dir), "k.cubin", data))
    assert unchanged()  # never removed, replaced, followed or written through
    assert served != where and served.name == "k.cubin" and served.parent.parent == key_dir
    assert stat.S_ISREG(os.lstat(served).st_mode) and served.read_bytes() == data
    assert again == served and counters["replaced"] == replaced
    assert [w.category for w in caught] == [CacheWriteWarning]  # once per object
    assert str(where) in str(caught[0].message)
    assert str(caught[0].message).count("\n") == 0


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_kernel_file_whose_place_holds_a_fifo_or_a_directory_is_served_beside_it(
    kind: str, tmp_path: Path
) -> None:
    # A FIFO at <TRITON_CACHE_DIR>/<key>/add_kernel.cubin hung the compile for ever
    # (hit and miss alike); a directory there made it raise.
    url = f"file://{tmp_path / 'fs'}"
    first = run("kernel", tmp_path / "t", url)
    cubin = next((tmp_path / "t").rglob("add_kernel.cubin"))
    cubin.unlink()
    unchanged = _plant(kind, cubin)
    hit, hit_err = bounded(child("kernel", tmp_path / "t", url), seconds=120)
    # An empty cuforge cache: Triton compiles and puts the cubin, which goes beside it.
    miss, _ = bounded(child("kernel", tmp_path / "t", f"file://{tmp_path / 'fs2'}"), seconds=120)
    assert hit["hits"] == [True] and hit["cubin"] == first["cubin"]
    assert miss["hits"] == [False] and miss["cubin"] == first["cubin"]
    assert miss["counters"]["stored"] == 1
    assert unchanged()
    assert f"{cubin} is a {'FIFO' if kind == 'fifo' else 'directory'}" in hit_err


def test_a_triton_with_another_extension_point_is_refused_in_one_line() -> None:
    # The installed triton, its CacheManager given one more abstract method before the
    # import: what a triton whose cache interface grew would look like to this module.
    code = (
        "import triton.runtime.cache as c\n"
        "c.CacheManager.__abstractmethods__ = c.CacheManager.__abstractmethods__ | {'put_many'}\n"
        "import cuforge.integrations.triton\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: cuforge.integrations.triton: triton ")
    assert "put_many" in last and "tested with triton 3.6 and 3.9" in last


@pytest.mark.gpu
def test_a_kernel_runs_correctly_from_a_cache_another_process_filled(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'fs'}"
    first = run("run", tmp_path / "t1", url)
    second = run("run", tmp_path / "t2", url)  # a fresh TRITON_CACHE_DIR
    assert first["max_error"] <= 1e-6 and second["max_error"] <= 1e-6
    assert first["counters"]["stored"] >= 1
    assert second["counters"]["misses"] == 0 and second["counters"]["hits"] >= 1
    assert second["counters"]["stored"] == 0  # nothing compiled: the kernel came from cuforge


@pytest.mark.parametrize("name", ["add_kernel.cubin", "__grp__k.json", 'odd "name"\u00e9.so'])
def test_the_record_is_the_one_encode_record_makes(name: str) -> None:
    import triton

    from cuforge.integrations.triton import _record
    from cuforge.storage.record import decode_record, encode_record

    fields = {"key": "KEY123", "file": name, "name": name, "triton": triton.__version__}
    assert _record("KEY123", name) == encode_record("triton", fields)
    assert decode_record(_record("KEY123", name), "triton") == {"v": 1, "kind": "triton", **fields}


def test_the_remote_backend_answers_a_group_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cuforge.integrations import flush
    from cuforge.integrations.triton import CuforgeRemoteCacheBackend

    db = tmp_path / "c.db"
    monkeypatch.setenv("CUFORGE_TRITON_CACHE", f"sqlite://{db}")
    monkeypatch.delenv("CUFORGE_CACHE_SECRET", raising=False)
    backend = CuforgeRemoteCacheBackend("KEYA")
    backend.put("k.cubin", b"\x7fELF" + b"c" * 200)
    backend.put("k.json", b'{"name": "k"}')
    assert backend.get(["k.cubin", "k.json"]) == {
        "k.cubin": b"\x7fELF" + b"c" * 200,
        "k.json": b'{"name": "k"}',
    }
    assert CuforgeRemoteCacheBackend("KEYB").get(["k.json"]) == {}  # another key's files
    flush()  # the stores land behind: then they are in the database
    _flip_stored(db, "k.cubin")
    # triton 3.6 takes a partial group for a hit: one bad file makes it all a miss.
    assert backend.get(["k.cubin", "k.json"]) == {}
    assert backend.get(["k.json"]) == {"k.json": b'{"name": "k"}'}


def _triton_env(monkeypatch: pytest.MonkeyPatch, url: str, triton_dir: Path) -> None:
    """This process's Triton managers on ``url``, their local copies in ``triton_dir``."""
    monkeypatch.setenv("CUFORGE_TRITON_CACHE", url)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton_dir))
    monkeypatch.delenv("CUFORGE_CACHE_SECRET", raising=False)


def _compile_kernel(manager: Any, files: dict[str, bytes], group: str = "k.json") -> None:
    """What Triton's compile does with its manager: the group asked for (a miss), each
    file put, then the group."""
    assert manager.get_group(group) is None
    manager.put_group(group, {n: manager.put(d, n) for n, d in files.items()})


def test_a_kernel_is_one_entry_stored_once_and_read_in_one_request(
    redis_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cuforge.integrations import flush
    from cuforge.integrations.triton import CuforgeCacheManager, triton_cache

    _triton_env(monkeypatch, f"{redis_server.url}?prefix=g:", tmp_path / "t")

    def triton_cache_stats() -> Any:
        cache = triton_cache()
        assert cache is not None
        return cache.stats()

    admin = redis_server.client()
    admin.config_resetstat()
    # Triton's compile: the group asked for (a miss), its files put, then the group.
    writer = CuforgeCacheManager("GROUPKEY")
    assert writer.get_group("k.json") is None
    paths = {n: writer.put(b"data of " + n.encode(), n) for n in ("k.cubin", "k.ptx", "k.json")}
    assert writer.get_file("k.ptx") == paths["k.ptx"]  # read back before the group is put
    writer.put_group("k.json", paths)
    flush()  # landed: the reads below go to Redis, not to this process's queue
    assert triton_cache_stats().stores == 1  # one entry for the kernel's three files
    admin.config_resetstat()
    got = CuforgeCacheManager("GROUPKEY").get_group("k.json")
    reads = admin.info("commandstats")
    assert got is not None and sorted(got) == ["k.cubin", "k.json", "k.ptx"]
    assert {n: Path(p).read_bytes() for n, p in got.items()} == {
        n: b"data of " + n.encode() for n in ("k.cubin", "k.ptx", "k.json")
    }
    assert sum(v["calls"] for k, v in reads.items() if k in ("cmdstat_get", "cmdstat_mget")) == 1


def test_a_file_put_outside_the_group_is_stored_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cuforge.integrations import flush
    from cuforge.integrations.triton import CuforgeCacheManager

    _triton_env(monkeypatch, f"sqlite://{tmp_path / 'c.db'}", tmp_path / "t")
    # A manager never asked for a group (Triton's autotuner, a native module): each put
    # is stored at once.
    single = CuforgeCacheManager("SINGLE")
    single.put(b'{"best": 1}', "best.autotune.json")
    # A kernel's compile that also put a file its group does not list.
    kernel = CuforgeCacheManager("KERNEL")
    assert kernel.get_group("k.json") is None
    kernel.put(b"extra", "k.extra")  # put during the kernel's compile, not in its group
    kernel.put_group("k.json", {n: kernel.put(n.encode(), n) for n in ("k.cubin", "k.json")})
    flush()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "t2"))  # another host's dirs
    best = CuforgeCacheManager("SINGLE").get_file("best.autotune.json")
    assert best is not None and Path(best).read_bytes() == b'{"best": 1}'
    extra = CuforgeCacheManager("KERNEL").get_file("k.extra")
    assert extra is not None and Path(extra).read_bytes() == b"extra"
    group = CuforgeCacheManager("KERNEL").get_group("k.json")
    assert group is not None and sorted(group) == ["k.cubin", "k.json"]


def test_the_remote_backend_reads_a_kernel_the_manager_packed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cuforge.integrations import flush
    from cuforge.integrations.triton import CuforgeCacheManager, CuforgeRemoteCacheBackend

    _triton_env(monkeypatch, f"sqlite://{tmp_path / 'c.db'}", tmp_path / "t")
    _compile_kernel(
        CuforgeCacheManager("SHARED"), {n: n.encode() * 3 for n in ("k.cubin", "k.json")}
    )
    flush()
    backend = CuforgeRemoteCacheBackend("SHARED")
    # Triton's remote manager: the group file, then the files it lists.
    grp = backend.get(["__grp__k.json"])
    listed = json.loads(grp["__grp__k.json"])["child_paths"]
    assert sorted(listed) == ["k.cubin", "k.json"]
    assert backend.get(listed) == {n: n.encode() * 3 for n in listed}
    assert CuforgeRemoteCacheBackend("OTHER").get(["__grp__k.json"]) == {}


def test_stock_triton_reads_the_directory_the_manager_filled(tmp_path: Path) -> None:
    # TRITON_CACHE_DIR stays Triton's own: a process without cuforge's manager (a
    # subprocess with another environment, or cuforge turned off) hits it and does
    # not fail on the group file the manager wrote.
    first = run("kernel", tmp_path / "t", f"file://{tmp_path / 'fs'}")
    stock = run("kernel", tmp_path / "t", None)
    assert first["hits"] == [False] and stock["hits"] == [True]
    assert stock["cubin"] == first["cubin"] > 0
    # A directory a hit filled (another host's: the kernel came from the cache) too.
    hit = run("kernel", tmp_path / "t2", f"file://{tmp_path / 'fs'}")
    stock_there = run("kernel", tmp_path / "t2", None)
    assert hit["hits"] == [True] and stock_there["hits"] == [True]
    assert stock_there["cubin"] == first["cubin"]
