"""S3ProgramCache against a real S3-compatible server (SeaweedFS ``weed mini``) on loopback.

One server serves the session (``s3_server``); each test has its own prefix. Tests
that kill, stop or reconfigure a server start their own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings

import pytest

from _cache_workers import ARCH, SRC
from _s3 import SeaweedServer
from cuforge.compile import Program, ProgramOptions, _nvrtc
from cuforge.storage.base import CacheReadWarning, CacheWriteWarning
from cuforge.storage.entry import entry_id
from cuforge.storage.s3 import S3ProgramCache
from cuforge.storage.s3._store import FRAME as frame
from cuforge.utils import make_program_cache_key, open_cache

WORKERS = os.path.join(os.path.dirname(__file__), "_cache_workers.py")
obstore = pytest.importorskip("obstore")  # the [s3] extra (absent on the GPU machine)

posix_only = pytest.mark.skipif(os.name == "nt", reason="POSIX signals")


def src_key() -> bytes:
    return make_program_cache_key(
        code=SRC, code_type="c++", options=ProgramOptions(arch=ARCH), target_type="cubin"
    )


def worker(command: str, **args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, WORKERS, command, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out)


def wait_for(path, proc: subprocess.Popen, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.01)
    return path.read_text()


def object_path(cache: S3ProgramCache, key: bytes) -> str:
    return f"{cache.prefix}e/{entry_id(key)}"


@pytest.fixture
def compiles(monkeypatch):
    """Counts real NVRTC compiles in this process."""
    real = _nvrtc.compile_cpp
    count = [0]

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_nvrtc, "compile_cpp", counted)
    return count


# -- entries -----------------------------------------------------------------------------
def test_an_entry_is_one_framed_object_stored_by_conditional_put(s3_url, s3_server):
    raw = s3_server.raw()
    with open_cache(s3_url, secret=None) as c:
        assert isinstance(c, S3ProgramCache)
        assert c.get(b"k") is None
        c.set_entry(b"k", b"payload", b"meta")
        body = bytes(obstore.get(raw, object_path(c, b"k")).bytes())
        assert body[:4] == b"CFS3" and body.endswith(b"metapayload")
        assert frame.unpack(bytes.fromhex(entry_id(b"k")), body) == (b"payload", b"meta")
        etag = obstore.head(raw, object_path(c, b"k"))["e_tag"]
        c.set_entry(b"k", b"payload", b"meta")  # equal: nothing is uploaded again
        assert obstore.head(raw, object_path(c, b"k"))["e_tag"] == etag
        assert c.get_entry(b"k") == (b"payload", b"meta")
        c.set_entry(b"k", b"other", b"")  # other contents replace it (If-Match)
        assert c.get_entry(b"k") == (b"other", b"")
        s = c.stats()
        assert (s.hits, s.misses, s.stores, s.write_failures) == (2, 1, 2, 0)
        assert len(c) == 1


def _damage(how: str, body: bytes, other: bytes) -> bytes:
    if how == "truncated":
        return body[:-3]
    if how == "empty":
        return b""
    if how == "bitflip":
        return body[:-1] + bytes([body[-1] ^ 0x01])
    if how == "header":
        return b"XXXX" + body[4:]
    if how == "other-key":
        return other
    return os.urandom(len(body))  # garbage


@pytest.mark.parametrize("how", ["truncated", "empty", "bitflip", "header", "other-key", "garbage"])
def test_damaged_objects_are_misses_counted_and_removed(s3_url, s3_server, how):
    raw = s3_server.raw()
    with open_cache(s3_url, secret=None) as c:
        c[b"k"] = b"x" * 1000
        c[b"j"] = b"y" * 1000
        path = object_path(c, b"k")
        body = bytes(obstore.get(raw, path).bytes())
        other = bytes(obstore.get(raw, object_path(c, b"j")).bytes())
        obstore.put(raw, path, _damage(how, body, other))
        assert c.check_entry(entry_id(b"k")) is not None  # named damaged
        assert c.get(b"k") is None
        assert c.stats().integrity_failures == 1
        with pytest.raises(FileNotFoundError):
            obstore.head(raw, path)  # removed
        c[b"k"] = b"x" * 1000  # and storable again
        assert c.get(b"k") == b"x" * 1000
        assert c.get(b"j") == b"y" * 1000


def test_signed_levels_reject_unsigned_and_foreign_entries(s3_url):
    secret = b"s3-test-secret-0123456789abcdef"
    with open_cache(s3_url, secret=None) as plain:
        plain[b"k"] = b"planted"
    with open_cache(s3_url, secret=secret) as signed:
        assert signed.get(b"k") is None
        assert signed.stats().signature_failures == 1
        signed[b"k2"] = b"real"
        assert signed.get(b"k2") == b"real"
    with open_cache(s3_url, secret=b"another-secret-0123456789abcdef") as other:
        assert other.get(b"k2") is None


# -- processes -----------------------------------------------------------------------------
def test_hits_across_processes(s3_url, tmp_path):
    counter = tmp_path / "compiles"
    first = finish(worker("compile_url", url=s3_url, counter=str(counter)))
    second = finish(worker("compile_url", url=s3_url, counter=str(counter)))
    assert len(counter.read_text().splitlines()) == 1  # the second process hit
    assert first["sha256"] == second["sha256"]
    assert second["stats"]["hits"] == 1 and second["stats"]["stores"] == 0


def test_eight_processes_on_one_cold_key_compile_once(s3_url, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    counter = tmp_path / "compiles"
    procs = [
        worker("compile_url", url=s3_url, counter=str(counter), barrier=str(barrier), parties=8)
        for _ in range(8)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert len(counter.read_text().splitlines()) == 1, [e for o, e in outs]
    results = [json.loads(o) for o, e in outs]
    assert len({r["sha256"][0] for r in results}) == 1
    with open_cache(s3_url, secret=None) as c:
        t = c.total_stats()
    assert (t.stores, t.hits) == (1, 7)


@posix_only
def test_a_killed_lease_holder_blocks_others_for_at_most_one_lease(s3_url, tmp_path):
    url = s3_url + "&lock_lease=1s"
    ready = tmp_path / "ready"
    holder = worker("url_hold", url=url, ready=str(ready))
    try:
        assert wait_for(ready, holder) == "held"
        with open_cache(url, secret=None) as c:
            t0 = time.monotonic()
            with c.lock(src_key(), timeout=2.0) as held:
                assert held is False  # two leases: the live holder kept renewing
            assert time.monotonic() - t0 >= 1.9
            holder.send_signal(signal.SIGKILL)
            holder.wait()
            t0 = time.monotonic()
            with c.lock(src_key(), timeout=10) as held:
                assert held  # the dead holder's lease ran out and was taken over
            assert time.monotonic() - t0 < 1.5
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@posix_only
def test_sigkilled_writers_leave_only_whole_entries(s3_url, tmp_path):
    procs = [
        worker("url_store_forever", url=s3_url, ready=str(tmp_path / f"ready{i}")) for i in range(3)
    ]
    try:
        for i, p in enumerate(procs):
            wait_for(tmp_path / f"ready{i}", p)
        time.sleep(0.3)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    with open_cache(s3_url, secret=None) as c:
        listed = list(c.iter_entries())
        assert len(listed) >= 3
        assert [c.check_entry(e.id) for e in listed] == [None] * len(listed)


# -- faults --------------------------------------------------------------------------------
@posix_only
def test_a_hung_then_killed_server_costs_one_bounded_stall(tmp_path, monkeypatch, compiles):
    server = SeaweedServer(tmp_path / "weed")
    try:
        for name, value in server.client_env().items():
            if name.startswith("AWS_"):
                monkeypatch.setenv(name, value)
        c = open_cache(server.url(timeout="500ms", retry_after="60s"), secret=None)
        c[b"k"] = b"v"
        assert c.get(b"k") == b"v"
        server.pause()  # SIGSTOP: connections are accepted, nothing answers
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t0 = time.monotonic()
            obj = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=c)
            stalled = time.monotonic() - t0
        assert obj.code[:4] == b"\x7fELF" and compiles[0] == 1
        assert stalled < 3.0, stalled  # one timeout, then backing off
        assert sum(issubclass(w.category, CacheReadWarning) for w in caught) == 1
        assert not any(issubclass(w.category, CacheWriteWarning) for w in caught)
        t0 = time.monotonic()
        assert c.get(b"k") is None  # skipped while backing off: no timeout paid
        assert time.monotonic() - t0 < 0.05
        server.kill()
        obj = Program(SRC, "c++", ProgramOptions(arch=ARCH)).compile("cubin", cache=c)
        assert obj.code[:4] == b"\x7fELF" and compiles[0] == 2
        s = c.stats()
        assert s.read_failures >= 2 and s.hits == 1
        c.close()
    finally:
        server.stop()


def test_a_missing_bucket_is_one_clear_line(tmp_path, monkeypatch):
    server = SeaweedServer(tmp_path / "weed", auto_create_bucket=False)
    try:
        env = server.client_env()
        for name, value in env.items():
            if name.startswith("AWS_"):
                monkeypatch.setenv(name, value)
        url = server.url(bucket="no-such-bucket")
        with (
            pytest.warns(CacheReadWarning, match="the bucket does not exist") as caught,
            open_cache(url, secret=None) as c,
        ):
            assert c.get(b"k") is None
            c[b"k"] = b"v"
            assert c.get(b"k") is None
            assert c.stats().write_failures == 1
        assert len(caught) == 1
        cli = [sys.executable, "-m", "cuforge", "cache", "stats", "--cache", url]
        done = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert "the bucket does not exist" in done.stderr

    finally:
        server.stop()


def test_wrong_credentials_are_one_clear_line(s3_url, s3_server, monkeypatch):
    env = s3_server.client_env()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with (
        pytest.warns(CacheReadWarning, match="access denied") as caught,
        open_cache(s3_url, secret=None) as c,
    ):
        assert c.get(b"k") is None
        c[b"k"] = b"v"
        assert c.stats().write_failures == 1
    assert len(caught) == 1
    bad = {**env, "AWS_SECRET_ACCESS_KEY": "wrong-secret"}
    cli = [sys.executable, "-m", "cuforge", "cache", "stats", "--cache", s3_url]
    done = subprocess.run(cli, capture_output=True, text=True, env=bad, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "access denied" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@posix_only
@pytest.mark.timeout(60)  # without the fix the child (and so this test) waits for good
def test_a_forked_child_fails_open_at_once_instead_of_hanging(s3_url):
    """obstore's I/O threads do not survive fork(): a request from a forked child (on
    the parent's handle or a new one) would wait for good. It is a counted miss."""
    with open_cache(s3_url, secret=None) as c:
        c[b"k"] = b"v"
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, never return into pytest
            code = 1
            try:
                signal.alarm(20)
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    inherited = c.get(b"k")
                    c[b"k2"] = b"v2"
                    with open_cache(s3_url, secret=None) as fresh:
                        again = fresh.get(b"k")
                # No request was tried (a hang is bounded by the alarm above): the
                # failures are the fork's, said as such, not a timeout's.
                said = [str(w.message) for w in caught]
                ok = (inherited, again) == (None, None)
                ok = ok and c.stats().read_failures == 1 and c.stats().write_failures == 1
                ok = ok and any("forked" in m for m in said)
                ok = ok and not any("timed out" in m.lower() for m in said)
                os.write(write, b"ok" if ok else repr((inherited, again, said)).encode()[:200])
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        assert status == 0
        assert os.read(read, 200) == b"ok"
        os.close(read)
        assert c.get(b"k") == b"v"  # the parent is unaffected
        assert c.get(b"k2") is None


_FORK_CHILD = """
import os, signal, sys, time, warnings
from cuforge.storage.urls import open_cache

url, raw = sys.argv[1], sys.argv[2] == "raw"
if raw:  # obstore used directly first: its runtime runs, cuforge's clients unused
    import obstore, obstore.store
    endpoint = url.split("endpoint=")[1]
    try:
        obstore.get(obstore.store.S3Store("cuforge-test", endpoint=endpoint,
            region="us-east-1", client_options={"allow_http": True}), "absent")
    except FileNotFoundError:
        pass
c = open_cache(url)  # opened, no request sent: what a command does before its workers
pid = os.fork()
if pid == 0:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        c[b"k"] = b"from the child"
        with open_cache(url) as fresh:
            seen = fresh.get(b"k")
    forked = any("forked" in str(w.message) for w in caught)
    print("child", seen, forked, flush=True)
    os._exit(0)
for _ in range(400):  # a child whose request waits for good fails the test, not hangs it
    if os.waitpid(pid, os.WNOHANG)[0]:
        break
    time.sleep(0.05)
else:  # (it shared this process's runtime, which may not answer now either)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print("the child hung", flush=True)
    os._exit(0)
print("parent", c.get(b"k"), flush=True)
c.close()
"""


@posix_only
def test_a_child_forked_before_any_request_makes_its_own_client(s3_url):
    """A process that opened an S3 cache but sent nothing forks (a command's workers,
    a pool forked at start-up): the child stores and reads through the inherited
    handle and a new one, and its parent sees what it stored. Until a request, the
    runtime whose threads a fork loses is not running (a fresh interpreter: this
    one's runs)."""
    done = subprocess.run([sys.executable, "-c", _FORK_CHILD, s3_url, "cuforge"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "child b'from the child' False",
        "parent b'from the child'",
    ], (done.stdout, done.stderr)


@posix_only
def test_a_runtime_started_outside_cuforge_is_seen_at_the_fork(s3_url):
    """obstore used directly in the process (its runtime runs) and an S3 cache opened
    without a request: the child's stores fail open with the fork warning, not hang."""
    done = subprocess.run([sys.executable, "-c", _FORK_CHILD, s3_url, "raw"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["child None True", "parent None"], (
        done.stdout, done.stderr,
    )  # fmt: skip


# -- URLs ----------------------------------------------------------------------------------
def test_urls_refuse_credentials_without_echoing_them(s3_url):
    with pytest.raises(ValueError, match="credentials do not belong in the URL") as info:
        open_cache("s3://AKIA:hunter2@bucket/p")
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValueError, match="unknown parameter 'acl'"):
        open_cache("s3://bucket/p?acl=public")
    with pytest.raises(ValueError, match="needs a bucket"):
        open_cache("s3:///p")
    with pytest.raises(ValueError, match="endpoint must start with http"):
        open_cache("s3://bucket/p?endpoint=localhost:9000")
    with pytest.raises(ValueError, match="is not a URL with a host"):
        open_cache("s3://bucket/p?endpoint=http://127.0.0.1:90x")
    with open_cache(s3_url + "&path_style=1&region=eu-west-1&connect_timeout=200ms") as c:
        assert c.prefix.startswith("t-") and c.bucket == "cuforge-test"


def test_a_read_only_level_never_writes(s3_url, s3_server):
    with open_cache(s3_url, secret=None) as w:
        w[b"k"] = b"v"
    with open_cache(s3_url + "&ro=1", secret=None) as c:
        assert c.get(b"k") == b"v"
        c[b"new"] = b"x"
        with c.lock(b"other") as held:
            assert held  # this process's threads only
    prefix = s3_url.split("?")[0].split("/")[3] + "/"
    listed = [m["path"] for page in obstore.list(s3_server.raw(), prefix=prefix) for m in page]
    assert not any("new" in p or "/locks/" in p for p in listed)
    assert len([p for p in listed if "/e/" in p]) == 1


def test_profiles_supply_credentials_and_region(s3_server, tmp_path, monkeypatch):
    from _s3 import ACCESS_KEY, SECRET_KEY

    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    (tmp_path / "credentials").write_text(
        f"[default]\naws_access_key_id = wrong\naws_secret_access_key = wrong\n"
        f"[ci]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    (tmp_path / "config").write_text("[profile ci]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_PROFILE", "ci")
    with open_cache(s3_server.url(), secret=None) as c:
        c[b"k"] = b"v"
        assert c.get(b"k") == b"v" and c.stats().write_failures == 0


def test_a_host_without_profile_files_imports_no_configparser_or_secrets(
    s3_server, s3_url, tmp_path
):
    """Opening an S3 level imported configparser to learn that ~/.aws/config is not
    there (~3 ms), and secrets for the counters' object names (~1 ms): every rank of a
    herd that waited on the fleet once paid both in the middle of it."""
    env = dict(s3_server.client_env())
    env["AWS_CONFIG_FILE"] = str(tmp_path / "no-config")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "no-credentials")
    code = (
        "import json, sys\n"
        "from cuforge.utils import open_cache\n"
        f"c = open_cache({s3_url!r}, secret=None)\n"
        "with c.lock(b'k') as held:\n"
        "    c[b'k'] = b'v'\n"
        "print(json.dumps([held, c.get(b'k').decode(), 'configparser' in sys.modules,\n"
        "                  'secrets' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == [True, "v", False, False]


# -- command line and statistics -------------------------------------------------------------
def test_cli_ls_verify_prune_and_stats_work_on_s3(s3_url, s3_server, tmp_path):
    env = s3_server.client_env()
    finish(worker("compile_url", url=s3_url))
    with open_cache(s3_url, secret=None) as c:
        for i in range(4):
            c[b"raw-%d" % i] = b"z" * 10_000
        bad = object_path(c, b"raw-0")
    raw = s3_server.raw()
    obstore.put(raw, bad, b"CFS3 damaged")

    def cli(*args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "cuforge", "cache", *args, "--cache", s3_url]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)

    ls = cli("ls", "--json")
    assert ls.returncode == 0, ls.stderr
    assert len(json.loads(ls.stdout)) == 5
    verify = cli("verify")
    assert verify.returncode == 1 and "1 bad" in verify.stdout
    assert cli("verify", "--fix").returncode == 1
    assert cli("verify").returncode == 0
    prune = cli("prune", "--max-size", "25000B")
    assert prune.returncode == 0, prune.stderr
    with open_cache(s3_url, secret=None) as c:
        assert c.size_bytes <= 25000 and len(c) == 2
    assert cli("prune", "--older-than", "1ms").returncode == 0
    with open_cache(s3_url, secret=None) as c:
        assert len(c) == 0
    stats = cli("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["stores"] >= 5


def test_fleet_stats_sum_over_processes_and_fold(s3_url):
    for _ in range(3):
        finish(worker("compile_url", url=s3_url))
    with open_cache(s3_url, secret=None) as c:
        t = c.total_stats()
        assert (t.stores, t.hits, t.misses) == (1, 2, 1)
        for _ in range(70):  # many small counter objects: total_stats folds them
            with open_cache(s3_url, secret=None) as h:
                h.get(b"absent")
        assert c.total_stats().misses == 71
        assert c.total_stats().misses == 71  # folded once, never counted twice
        c.zero_stats()
        assert c.total_stats().misses == 0


@pytest.mark.parametrize("kind", ["s3", "file,s3"])
def test_a_repeated_cli_compile_is_answered_by_its_hit_record(s3_url, tmp_path, kind):
    """``cuforge compile`` through S3, or a tier whose disk level holds the entry, is
    answered by the hit record the first run left: no compile layer; the disk of a
    tier answers without the S3 level (or its client) being loaded at all."""
    from _cli import isolated_env, run

    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(float* a) { a[0] *= 3; }\n')
    env = isolated_env(tmp_path)
    url = s3_url if kind == "s3" else f"file://{tmp_path / 'c'},{s3_url}"
    args = ("compile", "k.cu", "--arch", "sm_90", "-o", "k.cubin", "--cache", url)
    first = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert "cache miss" in first.stdout, first.stderr
    if not (tmp_path / "state" / "identity").is_dir():
        pytest.skip("compiler files changed less than 2 s ago: identity not recorded yet")
    (tmp_path / "k.cubin").unlink()
    fast = run(tmp_path, *args, cwd=tmp_path, env={**env, "PYTHONPROFILEIMPORTTIME": "1"})
    assert fast.returncode == 0 and fast.stdout.rstrip().endswith("cache hit"), fast.stderr
    assert (tmp_path / "k.cubin").read_bytes()[:4] == b"\x7fELF"
    modules = {
        line.rsplit("|", 1)[-1].strip()
        for line in fast.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "cuforge.cli._direct" in modules
    assert "cuforge.compile.program" not in modules
    assert ("obstore" in modules) == (kind == "s3")
