"""The identity store (``cuforge.compile.cache._identity_store``): facts are served from disk
only while every witness holds, never recorded while racy, kept apart per context,
and confirmed before anything compiled under them is stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from _cli import isolated_env, run
from cuforge.compile.cache import _identity_store, _toolkit

SETTLE_NS = 200_000_000  # the racy window in these tests (ctime cannot be set back)


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("CUFORGE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(_identity_store, "RACY_NS", SETTLE_NS)
    _identity_store.forget()
    yield tmp_path
    _identity_store.forget()


def _settled(path, text="x"):
    """A file older than the racy window (as every installed library is)."""
    path.write_text(text)
    old = time.time() - 60
    os.utime(path, (old, old))
    _settle()
    return str(path)


def _settle():
    time.sleep(SETTLE_NS / 1e9 * 1.5)


class Probe:
    def __init__(self, witnesses, value=b"v1"):
        self.calls = 0
        self.value = value
        self.witnesses = witnesses

    def __call__(self):
        self.calls += 1
        return (self.value, b"second"), list(self.witnesses)


def test_served_only_while_witnesses_hold(store):
    lib = _settled(store / "libfake.so")
    absent = str(store / "not-there-yet.so")
    (store / "libdir").mkdir()
    _settle()
    probe = Probe([lib, absent, str(store / "libdir")])
    assert _identity_store.remembered("fake", probe) == (b"v1", b"second")
    assert probe.calls == 1
    _identity_store.forget()  # a new process
    assert _identity_store.remembered("fake", probe) == (b"v1", b"second")
    assert probe.calls == 1 and _identity_store.lookup("fake") == (b"v1", b"second")

    (store / "libfake.so").write_text("rebuilt")  # same size, new mtime/ctime
    assert _identity_store.lookup("fake") is None
    probe.value = b"v2"
    _identity_store.forget()
    assert _identity_store.remembered("fake", probe)[0] == b"v2" and probe.calls == 2


@pytest.mark.parametrize("how", ["replaced", "appeared", "dir-entry", "removed"])
def test_every_kind_of_change_invalidates(store, how):
    lib = _settled(store / "lib.so", "abc")
    folder = store / "lib"
    folder.mkdir()
    old = time.time() - 60
    os.utime(folder, (old, old))
    _settle()
    absent = store / "shadow.so"
    probe = Probe([lib, str(absent), str(folder)])
    _identity_store.remembered("fake", probe)
    assert _identity_store.lookup("fake") is not None
    if how == "replaced":  # same size and times, another file: inode and ctime differ
        new = store / "new.so"
        _settled(new, "xyz")
        os.replace(new, lib)
        os.utime(lib, (old, old))
    elif how == "appeared":
        absent.write_text("earlier in the search path")
    elif how == "dir-entry":
        (folder / "libnvrtc-builtins.so").write_text("new neighbour")
    else:
        os.unlink(lib)
    assert _identity_store.lookup("fake") is None


def test_racy_witnesses_are_not_recorded(store, monkeypatch):
    monkeypatch.setattr(_identity_store, "RACY_NS", 60_000_000_000)
    fresh = store / "just-written.so"
    fresh.write_text("now")
    probe = Probe([str(fresh)])
    assert _identity_store.remembered("fake", probe) == (b"v1", b"second")
    assert _identity_store.lookup("fake") is None  # changed < 2 s ago: not trusted yet
    assert not (store / "state" / "identity").exists() or not os.listdir(
        store / "state" / "identity"
    )


def test_a_witness_that_cannot_be_read_is_a_record_that_does_not_hold(store):
    lib = _settled(store / "lib.so")
    folder = store / "on-the-path"
    folder.mkdir()
    old = time.time() - 60
    os.utime(folder, (old, old))
    _settle()
    probe = Probe([lib, str(folder)])
    _identity_store.remembered("fake", probe)
    assert _identity_store.lookup("fake") == (b"v1", b"second")
    folder.rmdir()  # now a link loop: os.stat raises ELOOP, not FileNotFoundError
    os.symlink(store / "loop-b", folder)
    os.symlink(folder, store / "loop-b")
    assert _identity_store.lookup("fake") is None  # not an exception
    _identity_store.forget()  # a new process: probes, and keeps nothing it cannot check
    assert _identity_store.remembered("fake", probe) == (b"v1", b"second")
    assert probe.calls == 2 and _identity_store.lookup("fake") is None
    _identity_store.forget()
    _identity_store.remembered("fake", probe)
    assert probe.calls == 3


def test_no_witnesses_no_record(store):
    _identity_store.remembered("fake", Probe([]))
    assert _identity_store.lookup("fake") is None


def test_contexts_are_kept_apart(store, monkeypatch):
    probe = Probe([_settled(store / "lib.so")])
    _identity_store.remembered("fake", probe)
    assert _identity_store.lookup("fake") is not None
    monkeypatch.setenv("CUDA_HOME", "/opt/another-toolkit")
    assert _identity_store.lookup("fake") is None
    monkeypatch.setenv("LD_LIBRARY_PATH", "/somewhere/else")
    monkeypatch.delenv("CUDA_HOME")
    assert _identity_store.lookup("fake") is None
    monkeypatch.delenv("LD_LIBRARY_PATH")
    if "LD_LIBRARY_PATH" not in os.environ:
        assert _identity_store.lookup("fake") is not None


def test_confirm_catches_a_fact_that_changed_after_it_was_served(store):
    probe = Probe([_settled(store / "lib.so")])
    _identity_store.remembered("fake", probe)
    _identity_store.forget()
    assert _identity_store.remembered("fake", probe)[0] == b"v1"  # served from disk
    assert _identity_store.confirm() is True  # a fresh probe agrees
    assert probe.calls == 2
    _identity_store.forget()
    _identity_store.remembered("fake", probe)  # served again
    probe.value = b"v2"  # ... but the truth moved on
    assert _identity_store.confirm() is False
    _identity_store.forget()
    assert _identity_store.lookup("fake")[0] == b"v2"  # the record was corrected


def test_off_keeps_nothing(store, monkeypatch):
    monkeypatch.setenv("CUFORGE_STATE_DIR", "off")
    probe = Probe([_settled(store / "lib.so")])
    _identity_store.remembered("fake", probe)
    _identity_store.remembered("fake", probe)
    assert probe.calls == 2 and _identity_store.lookup("fake") is None
    assert _identity_store.state_dir() is None


def _fake_toolkit(root):
    (root / "include" / "crt").mkdir(parents=True)
    (root / "include" / "cccl" / "cuda" / "std").mkdir(parents=True)
    (root / "include" / "cuda_runtime.h").write_text("// runtime\n")
    (root / "include" / "cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    (root / "include" / "crt" / "host_config.h").write_text("// crt\n")
    (root / "include" / "cccl" / "cuda" / "std" / "version").write_text("// cccl\n")
    old = time.time() - 60
    for path in [root, *root.rglob("*")]:
        os.utime(path, (old, old))
    _settle()


def test_toolkit_headers_are_kept_and_any_header_change_is_seen(store, monkeypatch):
    root = store / "toolkit"
    _fake_toolkit(root)
    monkeypatch.setenv("CUFORGE_TOOLKIT_HEADERS", str(root))
    _toolkit._reset()
    first = _toolkit.toolkit_identity()
    assert _toolkit.toolkit_include_dirs()[0] == str(root / "include")
    _toolkit._reset()  # a new process: served from disk, nothing located

    def no_locate(setting):
        raise AssertionError("located again although nothing changed")

    monkeypatch.setattr(_toolkit, "_locate", no_locate)
    assert _toolkit.toolkit_identity() == first
    assert _toolkit._state is None
    monkeypatch.undo()
    monkeypatch.setenv("CUDA_HOME", os.environ.get("CUDA_HOME", ""))  # keep the context
    monkeypatch.setenv("CUFORGE_STATE_DIR", str(store / "state"))
    monkeypatch.setenv("CUFORGE_TOOLKIT_HEADERS", str(root))
    monkeypatch.setattr(_identity_store, "RACY_NS", SETTLE_NS)
    (root / "include" / "cuda_fp16.h").write_text("// a header set grew a file\n")
    _toolkit._reset()
    assert _toolkit.toolkit_identity() != first
    _toolkit._reset()


def test_a_wrong_identity_record_never_makes_a_wrong_entry(tmp_path):
    """A record whose witnesses hold but whose value is wrong (what a change between
    check and compile amounts to): the compile is correct and is not stored under
    the wrong key; the record is corrected for the next process."""
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { *p = 4; }\n')
    env = isolated_env(tmp_path)
    args = ("compile", "k.cu", "--arch", "sm_90", "--cache", str(tmp_path / "c"))
    assert run(tmp_path, *args, cwd=tmp_path, env=env).returncode == 0
    records = list((tmp_path / "state" / "identity").glob("nvrtc_identity-*"))
    if not records:
        pytest.skip("the NVRTC files changed less than 2 s ago: nothing recorded yet")
    (record,) = records
    fields = record.read_bytes().split(b"\0")
    real = bytes.fromhex(fields[2].decode())
    fields[2] = b"nvrtc:0.0|build-id:0000".hex().encode()
    record.write_bytes(b"\0".join(fields))
    (tmp_path / "k.cu").write_text('extern "C" __global__ void k(int* p) { *p = 5; }\n')

    fooled = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert fooled.returncode == 0, fooled.stderr
    assert "cache miss" in fooled.stdout
    assert "changed while this process ran" in fooled.stderr
    stats = json.loads(run(tmp_path, "cache", "stats", "--cache", str(tmp_path / "c"),
                           "--json", env=env).stdout)  # fmt: skip
    assert (stats["stores"], stats["write_failures"], stats["entries"]) == (1, 1, 1)
    assert bytes.fromhex(record.read_bytes().split(b"\0")[2].decode()) == real

    honest = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert "cache miss" in honest.stdout and "changed" not in honest.stderr
    again = run(tmp_path, *args, cwd=tmp_path, env=env)
    assert "cache hit" in again.stdout


def _settled_dir(path):
    path.mkdir()
    old = time.time() - 60
    os.utime(path, (old, old))
    _settle()
    return path


def test_a_listing_witness_holds_while_its_matching_names_do(store):
    """An import path entry is searched only for a wheel's ``.dist-info`` names: a
    directory that gains or loses other files keeps the record; a matching name that
    appears, goes or changes does not."""
    entry = _settled_dir(store / "entry")
    (entry / "nvidia_cuda_runtime-13.0.dist-info").mkdir()
    old = time.time() - 60
    os.utime(entry, (old, old))
    _settle()
    seen = _identity_store.listing(str(entry), "nvidia_cuda_runtime-", ".dist-info")
    probe = Probe([seen])
    _identity_store.remembered("fake", probe)
    assert _identity_store.lookup("fake") == (b"v1", b"second")
    (entry / "train.log").write_text("a script's output beside it")
    (entry / "nvidia_cuda_runtime-notes.txt").write_text("a prefix without the suffix")
    (entry / "nvidia_cuda_crt-13.0.dist-info").mkdir()  # another wheel's name
    assert _identity_store.lookup("fake") == (b"v1", b"second")  # still holds
    (entry / "NVIDIA_CUDA_RUNTIME-12.9.dist-info").mkdir()  # a second copy: matches
    assert _identity_store.lookup("fake") is None
    (entry / "NVIDIA_CUDA_RUNTIME-12.9.dist-info").rmdir()
    assert _identity_store.lookup("fake") == (b"v1", b"second")  # the names are back
    os.rename(entry / "nvidia_cuda_runtime-13.0.dist-info",
              entry / "nvidia_cuda_runtime-13.1.dist-info")  # fmt: skip
    assert _identity_store.lookup("fake") is None


def test_a_listing_of_a_directory_that_changed_a_moment_ago_is_not_recorded(store, monkeypatch):
    """The search may have listed the directory before a name appeared that the
    record's listing would then include: a directory changed within the racy window
    is not recorded (as a stat witness is not)."""
    monkeypatch.setattr(_identity_store, "RACY_NS", 60_000_000_000)
    entry = store / "busy"
    entry.mkdir()
    probe = Probe([_identity_store.listing(str(entry), "nvidia_cuda_runtime-", ".dist-info")])
    _identity_store.remembered("fake", probe)
    assert _identity_store.lookup("fake") is None
    absent = _identity_store.listing(str(store / "none"), "x-", ".dist-info")
    _identity_store.forget()
    monkeypatch.setattr(_identity_store, "RACY_NS", SETTLE_NS)
    _identity_store.remembered("fake2", Probe([absent, _settled(store / "lib.so")]))
    assert _identity_store.lookup("fake2") == (b"v1", b"second")  # absent holds
    (store / "none").mkdir()  # an entry that appears is a change (erring on the safe side)
    assert _identity_store.lookup("fake2") is None


TOOLKIT_PROBE = (
    "from cuforge.compile.cache import _toolkit\n"
    "ident = _toolkit.toolkit_identity()\n"
    "print('served' if _toolkit._state is None else 'located', ident.hex()[:16])\n"
)


def test_the_toolkit_record_survives_new_files_in_the_working_directory(tmp_path):
    """``python -c`` searches the working directory first (``sys.path[0] == ''``):
    its whole directory was a witness, so a script run where files come and go (its
    own outputs, /tmp) located the headers again in every process. Only a header
    wheel's ``.dist-info`` there changes the answer now."""
    report = _toolkit.toolkit_headers()
    if report.mode != "auto" or not report.sets or report.missing:
        pytest.skip("needs every header set found in auto mode (the header wheels)")
    from cuforge import _cuda

    dist = _cuda.header_wheel("runtime", _cuda.cuda_major()).dist.replace("-", "_")
    cwd = tmp_path / "work"
    cwd.mkdir()
    old = time.time() - 60
    os.utime(cwd, (old, old))
    time.sleep(2.2)  # past the 2 s racy window of the directory's ctime
    env = isolated_env(tmp_path)

    def probe():
        done = subprocess.run([sys.executable, "-c", TOOLKIT_PROBE], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    first = probe()
    assert first[0] == "located"
    assert probe() == ["served", first[1]]
    (cwd / "out.txt").write_text("a new file where the script runs")
    assert probe() == ["served", first[1]]  # the directory changed, its wheels did not
    (cwd / f"{dist}-99.0.dist-info").mkdir()  # a wheel earlier on the import path
    again = probe()
    assert again[0] == "located"
