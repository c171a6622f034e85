"""The directory mirror (cuforge.integrations.mirror): profiles as data, the engine on
plain files (what is published, what is hydrated, what is never served), and the real
JITs -- Warp's CPU kernels and Numba's ``cache=True`` -- in fresh processes with empty
directories on a shared cache (FileStream, SQLite, Redis).

The JIT tests skip where warp-lang or numba is not installed (``make test-jit``
installs them). Each JIT runs in a child process (``_jit_child.py``); the test
process plays ``cuforge run``: hydrate before, publish after.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from cuforge.integrations._cache import ForeignEntries
from cuforge.integrations.mirror import (
    PROFILES,
    HydrateResult,
    Mirror,
    Profile,
    active_profiles,
    load_profiles,
)
from cuforge.storage.base import CacheReadWarning, CacheWriteWarning, ProgramCacheResource
from cuforge.storage.memory import InMemoryProgramCache
from cuforge.storage.urls import open_cache

SECRET = "mirror-test-secret-0123456789abcdef"
CHILD = str(Path(__file__).with_name("_jit_child.py"))
#: A profile of plain files: keys name no GPU, and its version is given.
PLAIN = Profile(name="plain", env=("PLAIN_DIR",), skip=("build_*",), gpu_dependent=False)


def mirror(cache: ProgramCacheResource, directory: Path, **kw: Any) -> Mirror:
    kw.setdefault("version", "plain==1")
    kw.setdefault("settle_s", 0.05)
    return Mirror(kw.pop("profile", PLAIN), cache, directory, **kw)


def files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and not p.name.startswith(".cuforge-mirror")
    }


@pytest.fixture(params=["file", "sqlite", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "file":
        return f"file://{tmp_path / 'fs'}"
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'c.db'}"
    return f"{request.getfixturevalue('redis_server').url}?prefix=mirror:"


# -- profiles ---------------------------------------------------------------------------
def test_every_builtin_profile_is_data_with_the_jits_variable() -> None:
    variables = {
        "warp": "WARP_CACHE_PATH",
        "numba": "NUMBA_CACHE_DIR",
        "deepgemm": "DG_JIT_CACHE_DIR",
        "flashinfer": "FLASHINFER_WORKSPACE_BASE",
        "cute-dsl": "CUTE_DSL_CACHE_DIR",
        "cutile": "CUDA_TILE_CACHE_DIR",
        "tilelang": "TILELANG_CACHE_DIR",
        "vllm": "VLLM_CACHE_ROOT",
        "torchinductor": "TORCHINDUCTOR_CACHE_DIR",
    }
    # Inductor's precompiled header lives where $TMPDIR says, whatever its variable.
    assert {n: p.env[0] for n, p in PROFILES.items() if p.env} == variables
    assert [n for n, p in PROFILES.items() if not p.env] == ["torchinductor-pch"]
    for name, profile in PROFILES.items():
        assert profile.name == name and profile.dists and profile.notes
        assert profile.skipped("x.tmp") and profile.skipped("a/b.lock")
        assert profile.skipped(".nfs000123") and not profile.skipped("kernel.o")
        tested = name in ("warp", "numba", "torchinductor", "torchinductor-pch")
        assert ("Tested here" in profile.notes) == tested, name
        assert ("Untested here" in profile.notes) != tested, name
    assert not PROFILES["warp"].gpu_dependent and not PROFILES["numba"].gpu_dependent
    assert PROFILES["deepgemm"].gpu_dependent


def test_directories_follow_each_jits_own_rule(tmp_path: Path) -> None:
    warp, numba = PROFILES["warp"], PROFILES["numba"]
    env = {"WARP_CACHE_PATH": str(tmp_path / "w"), "HOME": str(tmp_path / "home")}
    assert warp.directory(env, "warp-lang==1.19.0") == str(tmp_path / "w" / "1.19.0")
    home = {"HOME": str(tmp_path / "home")}
    assert warp.directory(home, "warp-lang==1.2") == str(tmp_path / "home/.cache/warp/1.2")
    xdg = {**home, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    assert warp.directory(xdg, "warp-lang==1.2") == str(tmp_path / "xdg/warp/1.2")
    assert numba.directory(home) is None  # __pycache__ beside each source: no one directory
    assert numba.directory({"NUMBA_CACHE_DIR": str(tmp_path / "n")}) == str(tmp_path / "n")
    assert PROFILES["vllm"].directory({"VLLM_CACHE_ROOT": "/v"}) == "/v/torch_compile_cache"
    # Warp's build directories (renamed into place when complete) are never mirrored.
    assert warp.skipped("wp_mod_abc_p1234_t5678/wp_mod_abc.o")
    assert not warp.skipped("wp_mod_abc/wp_mod_abc.cpu115a1a1f.o")
    assert numba.skipped("d/f-4.py311.nbi.tmp.0123abcd")


def test_user_profiles_from_config_tables() -> None:
    got = load_profiles(
        {
            "myjit": {"env": "MYJIT_DIR", "dists": ["myjit"], "skip": ["*.wip"]},
            "warp": {"gpu_dependent": True},
        }
    )
    assert got["myjit"].env == ("MYJIT_DIR",) and got["myjit"].skipped("k.wip")
    assert got["myjit"].gpu_dependent  # the safe default
    assert got["warp"].gpu_dependent and got["warp"].env == ("WARP_CACHE_PATH",)
    assert not PROFILES["warp"].gpu_dependent  # the built-in is unchanged
    bad: list[tuple[dict[str, dict[str, object]], str]] = [
        (
            {"x": {"env": ["X"], "dists": ["x"], "colour": "red"}},
            r"^mirror\.x\.colour: unknown key",
        ),
        ({"x": {"env": ["X"], "dists": "x"}}, r"^mirror\.x\.dists: expected a list of strings"),
        ({"x": {"env": ["1X"], "dists": ["x"]}}, r"^mirror\.x\.env: '1X' is not a variable"),
        ({"x": {"env": ["X"], "version_from": "mod"}}, r"^mirror\.x\.version_from: expected"),
        ({"x": {"dists": ["x"]}}, r"^mirror\.x\.env: a new profile needs"),
        ({"x": {"env": ["X"]}}, r"^mirror\.x\.dists: a new profile needs"),
        ({"a/b": {"env": ["X"], "dists": ["x"]}}, r"^mirror\.a/b: a profile name"),
        (
            {"x": {"env": ["X"], "dists": ["x"], "gpu_dependent": "no"}},
            r"gpu_dependent: expected bool",
        ),
    ]
    for tables, message in bad:
        with pytest.raises(ValueError, match=message) as err:
            load_profiles(tables)
        assert "\n" not in str(err.value)


def test_active_profiles_are_the_installed_or_configured() -> None:
    absent = Profile(name="absent", env=("ABSENT_JIT_DIR",), dists=("no-such-dist-xyz",))
    assert active_profiles({}, {"absent": absent}) == []
    assert active_profiles({"ABSENT_JIT_DIR": "/x"}, {"absent": absent}) == [absent]
    assert absent.version() is None
    mirror_off = Mirror(absent, InMemoryProgramCache(), "/nonexistent-dir")
    assert not mirror_off.active and "not installed" in mirror_off.reason
    assert mirror_off.hydrate().active is False and mirror_off.publish().active is False


def test_a_gpu_dependent_profile_keys_the_gpu_and_is_off_without_one(tmp_path: Path) -> None:
    gpu_profile = Profile(name="g", env=("G_DIR",), gpu_dependent=True)
    cache = InMemoryProgramCache()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "k.cubin").write_bytes(b"sm90 code")
    a = mirror(cache, tmp_path / "a", profile=gpu_profile, gpu="NVIDIA H100 80GB HBM3")
    assert a.publish().stored == 1
    other = mirror(cache, tmp_path / "b", profile=gpu_profile, gpu="NVIDIA A100-SXM4-80GB")
    assert other.hydrate().written == 0 and not (tmp_path / "b" / "k.cubin").exists()
    same = mirror(cache, tmp_path / "c", profile=gpu_profile, gpu="NVIDIA H100 80GB HBM3")
    assert same.hydrate().written == 1
    if not Path("/proc/driver/nvidia/gpus").is_dir():
        unknown = mirror(cache, tmp_path / "d", profile=gpu_profile)
        assert not unknown.active and "GPU" in unknown.reason


def _fake_cpuinfo(path: Path, flags: str) -> str:
    path.write_text(
        f"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
        f"model name\t: Intel(R) Xeon(R) Platinum 8480+\ncpu MHz\t\t: 2000.0\nflags\t\t: {flags}\n"
        f"\nprocessor\t: 1\nflags\t\t: other\n"
    )
    return str(path)


def _compiler(tmp_path: Path, name: str, version: str) -> str:
    """A compiler executable whose ``--version`` says ``version`` (a real program)."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{version}'\necho 'Copyright'\n")
    path.chmod(0o755)
    return str(path)


def test_the_host_identity_names_cpu_compiler_and_gpus(tmp_path: Path) -> None:
    from cuforge.integrations.mirror import host_identity

    avx = _fake_cpuinfo(tmp_path / "a", "fpu sse avx512f avx2")
    same = _fake_cpuinfo(tmp_path / "b", "avx2 avx512f fpu sse")  # the order has no meaning
    older = _fake_cpuinfo(tmp_path / "c", "fpu sse avx2")  # -march=native: other code
    gcc12 = _compiler(tmp_path, "g12", "g++ (Debian 12.2.0-14) 12.2.0")
    gcc13 = _compiler(tmp_path, "g13", "g++ (GCC) 13.1.0")
    base = host_identity(gcc12, avx, gpus="none")
    assert base is not None and base.startswith("host-") and len(base) == 21
    assert host_identity(gcc12, same, gpus="none") == base
    assert host_identity(gcc12, older, gpus="none") != base
    assert host_identity(gcc13, avx, gpus="none") != base
    assert host_identity(gcc12, avx, gpus="NVIDIA H100 80GB HBM3") != base
    assert host_identity(str(tmp_path / "no-such-cxx"), avx, gpus="none") not in (None, base)
    assert host_identity(gcc12, str(tmp_path / "no-cpuinfo"), gpus="none") is None


def test_a_host_dependent_profile_keys_the_host_and_is_off_without_one(tmp_path: Path) -> None:
    native = Profile(name="n", env=("N_DIR",), gpu_dependent=False, host_dependent=True)
    cache = InMemoryProgramCache()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "k.so").write_bytes(b"built with -march=native")
    assert mirror(cache, tmp_path / "a", profile=native, host="host-1").publish().stored == 1
    other = mirror(cache, tmp_path / "b", profile=native, host="host-2")
    assert other.hydrate().written == 0 and not (tmp_path / "b" / "k.so").exists()
    assert mirror(cache, tmp_path / "c", profile=native, host="host-1").hydrate().written == 1
    plain = mirror(cache, tmp_path / "d")  # a profile that is not host-dependent: unchanged
    assert plain.host is None and "host-" not in plain.prefix
    # Without a host identity (host_identity() is None where the CPU cannot be read:
    # see the test above) the mirror stays off.
    off = mirror(cache, tmp_path / "e", profile=native, host="")
    assert not off.active and "host cannot be identified" in off.reason
    assert off.hydrate().active is False and off.publish().active is False


def test_only_the_kinds_a_profile_names_are_mirrored(tmp_path: Path) -> None:
    picky = Profile(name="p", env=("P_DIR",), gpu_dependent=False, only=("*.so", "*.o"))
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    (a / "ab").mkdir(parents=True)
    (a / "ab" / "k.so").write_bytes(b"library")
    (a / "ab" / "k.o").write_bytes(b"object")
    (a / "ab" / "k.cpp").write_bytes(b"source the JIT writes itself")
    (a / "ab" / "graph").write_bytes(b"a pickle")
    m = mirror(cache, a, profile=picky)
    result = m.publish()
    assert (result.stored, result.pending) == (2, 0)
    assert files_of_profile(cache, tmp_path / "b", picky) == {
        "ab/k.so": b"library",
        "ab/k.o": b"object",
    }
    # An index listing another kind (planted, or from a profile that mirrored more)
    # is refused for it.
    listed = {"ab/x.py": [hashlib.sha256(b"x").hexdigest(), 1]}
    ForeignEntries(cache, "mirror").store(f"{m.prefix}:ab/x.py", b"x", {})
    ForeignEntries(cache, "mirror-index").store(
        m.prefix, json.dumps({"files": listed}).encode(), {}
    )
    got = mirror(cache, tmp_path / "c", profile=picky).hydrate()
    assert (got.refused, got.written) == (1, 0)


def files_of_profile(
    cache: ProgramCacheResource, where: Path, profile: Profile
) -> dict[str, bytes]:
    mirror(cache, where, profile=profile).hydrate()
    return files(where)


def test_a_file_is_not_published_while_its_build_marker_is_there(tmp_path: Path) -> None:
    """Inductor's compiler writes a library in place while ``<stem>_CxxBuild`` exists
    beside it; a killed build leaves both. Neither is published until the marker goes."""
    built = Profile(name="b", env=("B_DIR",), gpu_dependent=False, busy_while=("{stem}_CxxBuild",))
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    (a / "or").mkdir(parents=True)
    (a / "or" / "c1.main.so").write_bytes(b"half a libr")  # being written, or killed
    (a / "or" / "c1.main_CxxBuild").mkdir()
    (a / "or" / "c2.so").write_bytes(b"a whole library")
    m = mirror(cache, a, profile=built)
    first = m.publish()
    assert (first.stored, first.pending) == (1, 1)
    assert files_of_profile(cache, tmp_path / "b", built) == {"or/c2.so": b"a whole library"}
    (a / "or" / "c1.main.so").write_bytes(b"half a library, done")
    (a / "or" / "c1.main_CxxBuild").rmdir()  # the build finished
    again = m.publish()
    assert (again.stored, again.pending) == (1, 0)
    assert files_of_profile(cache, tmp_path / "c", built)["or/c1.main.so"] == (
        b"half a library, done"
    )


def test_the_torchinductor_profile_finds_inductors_directory(tmp_path: Path) -> None:
    inductor = PROFILES["torchinductor"]
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")}
    assert inductor.directory(env, "torch==2.13.0") == str(tmp_path / "ind")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    assert inductor.directory({"TMPDIR": str(tmp), "USER": "ann"}) == f"{tmp}/torchinductor_ann"
    assert inductor.directory({"LOGNAME": "a/b", "USER": "x"}) == "/tmp/torchinductor_a_b"
    assert inductor.host_dependent and not inductor.gpu_dependent
    assert inductor.included("or/c1.main.so") and inductor.included("or/c1.o")
    assert not inductor.included("or/c1.cpp") and not inductor.included("iq/c1.py")
    for rel in ("fxgraph/wt/f1/m2", "aotautograd/a/b", "triton/0/k/cuda_utils.so",
                "locks/k.lock", "or/c1_CxxBuild/c1.o", "gcc/bin/g++"):  # fmt: skip
        assert inductor.skipped(rel), rel
    assert inductor.markers("or/c1.main.so") == ["or/c1.main_CxxBuild"]


def test_the_torchinductor_pch_profile_finds_the_precompiled_header(tmp_path: Path) -> None:
    pch = PROFILES["torchinductor-pch"]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    where = f"{tmp}/torchinductor_ann/precompiled_headers"
    assert pch.directory({"TMPDIR": str(tmp), "USER": "ann"}) == where
    # Inductor's own directory elsewhere does not move the header.
    assert pch.directory({"TMPDIR": str(tmp), "USER": "ann", "TORCHINDUCTOR_CACHE_DIR": "/x"}) == (
        where
    )
    assert pch.host_dependent and not pch.gpu_dependent
    assert pch.included("ck42h4.h.gch") and not pch.included("ck42h4.h")
    assert pch.skipped("locks/ck42h4.lock") and pch.skipped("ck42h4.h_CxxBuild/x")
    assert pch.markers("ck42h4.h.gch") == ["ck42h4.h_CxxBuild"]  # GCC writes it in place


def test_a_new_only_profile_publishes_only_what_was_written_after_it_started(
    tmp_path: Path,
) -> None:
    """A directory other installs share ($TMPDIR's precompiled headers): files there
    before the mirror started are another torch's, never published; the job's are."""
    shared = Profile(name="shared", env=("SHARED_DIR",), gpu_dependent=False, new_only=True)
    a = tmp_path / "a"
    a.mkdir()
    (a / "old.gch").write_bytes(b"another install's header")
    time.sleep(0.05)
    m = mirror(InMemoryProgramCache(), a, profile=shared)
    time.sleep(0.05)
    (a / "new.gch").write_bytes(b"this job's header")
    result = m.publish()
    assert result.stored == 1
    assert "new.gch" in m._load_index() and "old.gch" not in m._load_index()
    assert load_profiles({"shared": {"env": "S", "dists": ["x"], "new_only": True}})[
        "shared"
    ].new_only


# -- the engine on plain files ------------------------------------------------------------
def test_published_files_hydrate_an_empty_directory(url: str, tmp_path: Path) -> None:
    cache = open_cache(url, secret=None)
    a, b = tmp_path / "a", tmp_path / "b"
    (a / "mod").mkdir(parents=True)
    (a / "mod" / "k.o").write_bytes(b"\x7fELF object")
    (a / "mod" / "k.meta").write_text("{}")
    (a / "top.bin").write_bytes(os.urandom(300_000))
    (a / "mod" / "k.o.tmp").write_bytes(b"half")  # temp names are never published
    (a / "x.lock").write_bytes(b"")
    (a / "build_1").mkdir()
    (a / "build_1" / "k.o").write_bytes(b"in progress")  # the profile's skip glob
    first = mirror(cache, a).publish()
    assert (first.stored, first.pending, first.dropped) == (3, 0, 0)
    got = mirror(cache, b).hydrate()
    assert (got.written, got.verified_failures, got.missing) == (3, 0, 0)
    assert files(b) == {
        k: v for k, v in files(a).items() if k in ("mod/k.o", "mod/k.meta", "top.bin")
    }
    again = mirror(cache, a).publish()  # a new process: nothing is stored twice
    assert (again.stored, again.unchanged) == (0, 3)
    hydrated_again = mirror(cache, b).hydrate()
    assert (hydrated_again.written, hydrated_again.present) == (0, 3)
    assert mirror(cache, b).publish().stored == 0  # hydrated files are not published back


def test_a_file_is_published_only_once_it_stops_changing(tmp_path: Path) -> None:
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    a.mkdir()
    m = mirror(cache, a)
    (a / "k.o").write_bytes(b"part one")
    assert m.publish(wait=False).pending == 1  # first look
    with open(a / "k.o", "ab") as f:
        f.write(b", part two")  # still being written
    assert m.publish(wait=False).pending == 1
    done = m.publish(wait=False)  # unchanged since the previous look
    assert (done.stored, done.pending) == (1, 0)
    assert files_of(cache, tmp_path / "b") == {"k.o": b"part one, part two"}


def files_of(cache: ProgramCacheResource, where: Path) -> dict[str, bytes]:
    mirror(cache, where).hydrate()
    return files(where)


def test_periodic_publishing_and_stop(tmp_path: Path) -> None:
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    a.mkdir()
    m = mirror(cache, a)
    (a / "k.o").write_bytes(b"kernel")
    m.start_periodic(0.01)
    deadline = time.monotonic() + 60  # a bound on waiting, not a timing assertion
    while not files_of(cache, tmp_path / "b") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert files(tmp_path / "b") == {"k.o": b"kernel"}  # published by the thread
    final = m.stop()
    assert (final.stored, final.unchanged) == (0, 1)


def test_hydrate_never_writes_over_a_local_file_the_mirror_did_not_write(tmp_path: Path) -> None:
    cache, a, b = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "k.o").write_bytes(b"published")
    mirror(cache, a).publish()
    (b / "k.o").write_bytes(b"the JIT's own, newer")
    got = mirror(cache, b).hydrate()
    assert (got.written, got.skipped_newer) == (0, 1)
    assert (b / "k.o").read_bytes() == b"the JIT's own, newer"


def test_hydrate_updates_only_its_own_unchanged_copy(tmp_path: Path) -> None:
    cache, a, b = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "k.nbi").write_bytes(b"index v1")
    (a / "j.nbi").write_bytes(b"index v1")
    mirror(cache, a).publish()
    assert mirror(cache, b).hydrate().written == 2
    # A newer version of both is published (the JIT replaces files by rename).
    for name in ("k.nbi", "j.nbi"):
        (a / "new").write_bytes(b"index v2")
        os.replace(a / "new", a / name)
    assert mirror(cache, a).publish().stored == 2
    # On b the JIT rewrote j.nbi itself since the mirror wrote it: that one is kept.
    (b / "tmp").write_bytes(b"b's own")
    os.replace(b / "tmp", b / "j.nbi")
    got = mirror(cache, b).hydrate()
    assert (got.written, got.replaced, got.skipped_newer) == (1, 1, 1)
    assert (b / "k.nbi").read_bytes() == b"index v2" and (b / "j.nbi").read_bytes() == b"b's own"
    assert sorted(p.name for p in b.iterdir()) == [".cuforge-mirror-plain.json", "j.nbi", "k.nbi"]


def test_a_file_changed_in_place_after_publish_is_never_served(tmp_path: Path) -> None:
    cache, a = InMemoryProgramCache(), tmp_path / "a"
    a.mkdir()
    (a / "k.so").write_bytes(b"genuine native code")
    assert mirror(cache, a).publish().stored == 1
    with open(a / "k.so", "r+b") as f:  # the same inode, rewritten: not the JIT's way
        f.write(b"PLANTED")
    later = mirror(cache, a).publish()
    assert (later.tampered, later.stored) == (1, 0)
    assert files_of(cache, tmp_path / "b") == {"k.so": b"genuine native code"}


def test_a_hydrated_file_changed_in_place_is_never_published(tmp_path: Path) -> None:
    cache, a, b = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "k.so").write_bytes(b"genuine")
    mirror(cache, a).publish()
    mirror(cache, b).hydrate()
    with open(b / "k.so", "r+b") as f:
        f.write(b"PLANTED")
    assert mirror(cache, b).publish().tampered == 1
    assert files_of(cache, tmp_path / "c") == {"k.so": b"genuine"}


def test_entries_tampered_in_the_cache_are_never_written(tmp_path: Path) -> None:
    cache, a, b = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "k.so").write_bytes(b"genuine")
    (a / "j.so").write_bytes(b"genuine too")
    (a / "h.so").write_bytes(b"genuine three")
    m = mirror(cache, a)
    m.publish()
    entries = ForeignEntries(cache, "mirror")
    # A consistent entry with other bytes (what anyone who can write the cache can
    # make without a secret): the index's sha256 no longer matches.
    name = f"{m.prefix}:k.so"
    evil = b"PLANTED"
    entries.store(name, evil, {"sha256": hashlib.sha256(evil).hexdigest(), "size": len(evil)})
    # The right bytes under a record naming another path.
    good = cache.get_entry(entries.key(f"{m.prefix}:j.so"))
    assert good is not None
    cache.set_entry(entries.key(f"{m.prefix}:j.so"), good.data, good.meta.replace(b"j.so", b"x.so"))
    # Other bytes under the genuine record (a payload rewritten in place).
    genuine = cache.get_entry(entries.key(f"{m.prefix}:h.so"))
    assert genuine is not None
    cache.set_entry(entries.key(f"{m.prefix}:h.so"), b"PLANTED", genuine.meta)
    got = mirror(cache, b).hydrate()
    assert (got.written, got.verified_failures) == (0, 3) and files(b) == {}


def test_a_damaged_filestream_entry_is_a_miss(tmp_path: Path) -> None:
    cache = open_cache(f"file://{tmp_path / 'fs'}", secret=None)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "k.so").write_bytes(b"genuine native code " * 100)
    mirror(cache, a).publish()
    hits = 0
    for path in (tmp_path / "fs").rglob("*"):
        if path.is_file() and b"genuine native code" in path.read_bytes():
            raw = path.read_bytes()
            path.write_bytes(raw.replace(b"genuine", b"PLANTED"))
            hits += 1
    assert hits == 1
    got = mirror(open_cache(f"file://{tmp_path / 'fs'}", secret=None), b).hydrate()
    assert got.written == 0 and files(b) == {}


def test_with_a_secret_unsigned_and_foreign_signed_entries_are_misses(
    url: str, tmp_path: Path
) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "k.so").write_bytes(b"native code")
    mirror(open_cache(url, secret=None), a).publish()  # unsigned
    signed = open_cache(url, secret=SECRET)
    got = mirror(signed, tmp_path / "b").hydrate()
    assert got.written == 0 and files(tmp_path / "b") == {}
    mirror(open_cache(url, secret="another-secret-0123456789abcdef"), a, settle_s=0).publish()
    assert mirror(signed, tmp_path / "c").hydrate().written == 0
    assert files(tmp_path / "c") == {}
    # Published under the fleet's secret, it is served.
    fresh = tmp_path / "a2"
    fresh.mkdir()
    (fresh / "k.so").write_bytes(b"native code")
    assert mirror(signed, fresh).publish().stored == 1
    assert mirror(signed, tmp_path / "d").hydrate().written == 1


def test_links_are_never_followed(tmp_path: Path) -> None:
    cache, a, b = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b"
    secret_file, outside = tmp_path / "secret.txt", tmp_path / "outside"
    secret_file.write_bytes(b"private")
    outside.mkdir()
    a.mkdir()
    (a / "mod").mkdir()
    (a / "mod" / "k.o").write_bytes(b"code")
    (a / "link.o").symlink_to(secret_file)  # a file link: not published
    (a / "linked_dir").symlink_to(outside)  # a directory link: not entered
    (outside / "x.o").write_bytes(b"outside")
    result = mirror(cache, a).publish()
    assert (result.stored, result.foreign) == (1, 2)
    # On the hydrating side, a link where a directory goes is not written through.
    b.mkdir()
    (b / "mod").symlink_to(outside)
    got = mirror(cache, b).hydrate()
    assert (got.written, got.skipped_other) == (0, 1)
    assert sorted(p.name for p in outside.iterdir()) == ["x.o"]


def test_paths_leaving_the_directory_are_refused(tmp_path: Path) -> None:
    cache = InMemoryProgramCache()
    m = mirror(cache, tmp_path / "b")
    entries = ForeignEntries(cache, "mirror")
    listed = {}
    for rel in ("../escape.o", "/abs.o", "a//b.o", "ok/./x.o", "k.o.tmp"):
        entries.store(f"{m.prefix}:{rel}", b"x", {"sha256": hashlib.sha256(b"x").hexdigest()})
        listed[rel] = [hashlib.sha256(b"x").hexdigest(), 1]
    ForeignEntries(cache, "mirror-index").store(
        m.prefix, json.dumps({"files": listed}).encode(), {}
    )
    got = m.hydrate()
    assert (got.refused, got.written) == (5, 0)
    assert not (tmp_path / "escape.o").exists() and files(tmp_path / "b") == {}


def test_a_directory_every_user_can_write_publishes_nothing(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "k.o").write_bytes(b"code")
    a.chmod(0o777)
    with pytest.warns(CacheWriteWarning, match="writable by every user"):
        result = mirror(InMemoryProgramCache(), a).publish()
    assert result.stored == 0 and "writable by every user" in result.reason


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_another_users_files_are_never_published(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "mine.o").write_bytes(b"mine")
    (a / "theirs.o").write_bytes(b"planted")
    os.chown(a / "theirs.o", 65534, 65534)
    result = mirror(InMemoryProgramCache(), a).publish()
    assert (result.stored, result.foreign) == (1, 1)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_hydrate_refuses_a_directory_owned_by_another_user(tmp_path: Path) -> None:
    """A directory of another user is never written: one line, nothing in it (no file,
    no state file, no folder), the cached files left for its owner's own run."""
    cache, a, b = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b"
    (a / "mod").mkdir(parents=True)
    (a / "mod" / "k.o").write_bytes(b"code")
    assert mirror(cache, a).publish().stored == 1
    b.mkdir()
    os.chown(b, 65534, 65534)
    before = os.stat(b)
    with pytest.warns(CacheReadWarning, match="belongs to another user") as caught:
        got = mirror(cache, b).hydrate()
    assert (got.written, got.errors) == (0, 0)
    assert "uid 65534" in got.reason and "\n" not in str(caught[0].message)
    assert os.listdir(b) == [] and os.stat(b).st_mtime_ns == before.st_mtime_ns
    os.chown(b, os.geteuid(), os.getegid())  # its owner's own run hydrates it
    assert mirror(cache, b).hydrate().written == 1


def test_the_mirrors_entries_join_a_recorded_warm_set(tmp_path: Path) -> None:
    """Through a warm set's recorder (``cuforge run --warm-set``), every entry a mirror
    publishes, hydrates, or finds already in place is noted -- with the index -- so a
    fresh host's prefetch fetches them before hydrating."""
    from cuforge.integrations.warmsets import Recorder

    cache, a, b = InMemoryProgramCache(), tmp_path / "a", tmp_path / "b"
    (a / "mod").mkdir(parents=True)
    (a / "mod" / "k.o").write_bytes(b"code")
    (a / "top.bin").write_bytes(b"data")
    names = [f"{mirror(cache, a).prefix}:{rel}" for rel in ("mod/k.o", "top.bin")]
    entries = ForeignEntries(cache, "mirror")
    wanted = {entries.key(n) for n in names}
    index = ForeignEntries(cache, "mirror-index").key(mirror(cache, a).prefix)
    published = Recorder(cache)
    assert mirror(published, a).publish().stored == 2
    assert wanted | {index} <= published.keys()
    hydrated = Recorder(cache)
    assert mirror(hydrated, b).hydrate().written == 2
    assert wanted | {index} <= hydrated.keys()
    in_place = Recorder(cache)  # a later run: the files are there, nothing is read
    got = mirror(in_place, b).hydrate()
    assert (got.written, got.present) == (0, 2)
    assert wanted <= in_place.keys()
    unchanged = Recorder(cache)  # a later publish: nothing stored again
    assert mirror(unchanged, a).publish().unchanged == 2
    assert wanted <= unchanged.keys()


def test_mirrors_read_the_jobs_python_for_installed_jits_and_versions(tmp_path: Path) -> None:
    """``cuforge run -- /other/venv/bin/python``: the mirrors see the JITs installed in
    that Python's ``sys.path`` and key their versions -- never this Python's."""
    from cuforge.integrations.sessions import open_mirrors

    site = tmp_path / "other-site-packages"
    (site / "warp_lang-9.8.7.dist-info").mkdir(parents=True)
    (site / "warp_lang-9.8.7.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: warp-lang\nVersion: 9.8.7\n"
    )
    env = {"WARP_CACHE_PATH": str(tmp_path / "w"), "NUMBA_CACHE_DIR": str(tmp_path / "n")}
    mirrors = open_mirrors(InMemoryProgramCache(), env, path=[str(site)])
    assert [m.profile.name for m in mirrors] == ["warp"]  # numba: set, but not installed there
    (warp,) = mirrors
    assert warp.version == "warp-lang==9.8.7" and warp.active
    assert warp.directory == str(tmp_path / "w" / "9.8.7")  # the job's variable, its version
    assert "warp-lang==9.8.7" in warp.prefix
    assert open_mirrors(InMemoryProgramCache(), env, path=[]) == []  # a Python with no JIT


class _Broken(InMemoryProgramCache):
    def get_entries(self, keys: Any) -> Any:
        raise ConnectionError("cache down")

    def get_entry(self, key: Any) -> Any:
        raise ConnectionError("cache down")

    def set_entry(self, key: Any, value: Any, meta: bytes = b"") -> None:
        raise ConnectionError("cache down")


def test_a_cache_fault_is_a_warning_never_an_exception(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    (a / "k.o").write_bytes(b"code")
    m = mirror(_Broken(), a)
    with pytest.warns(CacheReadWarning, match="cache down"):
        got = m.hydrate()
    assert isinstance(got, HydrateResult) and got.written == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = m.publish()
    assert result.dropped == 1 and result.stored == 0
    assert any(issubclass(w.category, CacheWriteWarning) for w in caught)
    m.start_periodic(0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m.stop()  # the thread's faults never escape it


# -- the real JITs ----------------------------------------------------------------------
def run_child(jit: str, env: dict[str, str], script: str = CHILD) -> tuple[dict[str, Any], str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WARP_", "NUMBA_"))}
    proc = subprocess.run(
        [sys.executable, script, jit],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


def jit_job(
    jit: str, cache: ProgramCacheResource, env: dict[str, str], script: str = CHILD
) -> tuple[HydrateResult, dict[str, Any], str]:
    """What ``cuforge run`` does around one job: hydrate, run, publish."""
    m = Mirror(PROFILES[jit], cache, env=env, settle_s=0.2)
    assert m.active, m.reason
    hydrated = m.hydrate()
    out, stdout = run_child(jit, env, script)
    assert m.publish().errors == 0
    return hydrated, out, stdout


def test_warp_second_process_with_an_empty_cache_dir_loads_the_mirrored_module(
    url: str, tmp_path: Path
) -> None:
    pytest.importorskip("warp")
    cache = open_cache(url, secret=SECRET)
    first_env = {"WARP_CACHE_PATH": str(tmp_path / "w1")}
    hydrated, out, stdout = jit_job("warp", cache, first_env)
    assert hydrated.written == 0 and "(compiled)" in stdout and out["result"] == [2.0, 4.0, 6.0]
    second_env = {"WARP_CACHE_PATH": str(tmp_path / "w2")}
    hydrated, out, stdout = jit_job("warp", open_cache(url, secret=SECRET), second_env)
    assert hydrated.written >= 2 and hydrated.verified_failures == 0
    assert "(cached)" in stdout and "(compiled)" not in stdout  # Warp's own word
    assert out["result"] == [2.0, 4.0, 6.0]
    # The module directory came from the cache; Warp made no build directory.
    assert not [p for p in (tmp_path / "w2").rglob("*_p*_t*") if p.is_dir()]
    # Another fleet's secret: the entries are misses, Warp compiles.
    third_env = {"WARP_CACHE_PATH": str(tmp_path / "w3")}
    other = open_cache(url, secret="another-secret-0123456789abcdef")
    hydrated, _, stdout = jit_job("warp", other, third_env)
    assert hydrated.written == 0 and "(compiled)" in stdout


def numba_source(tmp_path: Path) -> str:
    """The child script copied to one path both "hosts" use (numba names a source
    directory's cache folder by a hash of its absolute path)."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    script = src / "_jit_child.py"
    script.write_text(Path(CHILD).read_text())
    return str(script)


def test_numba_second_process_with_an_empty_cache_dir_hits(url: str, tmp_path: Path) -> None:
    pytest.importorskip("numba")
    script = numba_source(tmp_path)
    cache = open_cache(url, secret=None)
    hydrated, out, _ = jit_job("numba", cache, {"NUMBA_CACHE_DIR": str(tmp_path / "n1")}, script)
    assert (hydrated.written, out["hits"], out["misses"], out["result"]) == (0, 0, 1, 22.5)
    # A new host's checkout of the same source: same path and content, another mtime.
    os.utime(script, (1_000_000_000, 1_000_000_000))
    second = {"NUMBA_CACHE_DIR": str(tmp_path / "n2")}
    hydrated, out, _ = jit_job("numba", open_cache(url, secret=None), second, script)
    assert hydrated.written == 2 and hydrated.verified_failures == 0
    assert (out["hits"], out["misses"], out["result"]) == (1, 0, 22.5)  # numba's counters


def test_numba_rejects_a_mirrored_index_for_changed_source(tmp_path: Path) -> None:
    pytest.importorskip("numba")
    script = numba_source(tmp_path)
    cache = open_cache(f"file://{tmp_path / 'fs'}", secret=None)
    jit_job("numba", cache, {"NUMBA_CACHE_DIR": str(tmp_path / "n1")}, script)
    Path(script).write_text(Path(script).read_text() + "\n# edited\n")
    hydrated, out, _ = jit_job("numba", cache, {"NUMBA_CACHE_DIR": str(tmp_path / "n2")}, script)
    assert hydrated.written == 2  # the files are mirrored, and numba itself refuses them
    assert (out["hits"], out["misses"]) == (0, 1)


def test_a_write_never_replaces_a_file_that_appeared_meanwhile(tmp_path: Path) -> None:
    # The race hydrate closes: the JIT writes the file between the mirror's look and
    # its write. The mirror's write is a link, which fails on an existing name.
    from cuforge.integrations.mirror import _files

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "k.o").write_bytes(b"the JIT's, just written")
    root = _files.open_root(str(tmp_path))
    try:
        assert _files.write_new(root, "d/k.o", b"from the cache") is None
        assert _files.write_new(root, "d/new.o", b"from the cache") is not None
    finally:
        os.close(root)
    assert (tmp_path / "d" / "k.o").read_bytes() == b"the JIT's, just written"
    assert (tmp_path / "d" / "new.o").read_bytes() == b"from the cache"
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["k.o", "new.o"]


def test_replacing_the_mirrors_copy_keeps_a_file_the_jit_wrote_meanwhile(tmp_path: Path) -> None:
    # The race of a replacement: the mirror recorded its own copy, then the JIT
    # replaced it just before the mirror moves it aside. The JIT's file is put back.
    from cuforge.integrations.mirror import _files

    root = _files.open_root(str(tmp_path))
    try:
        mine = _files.write_new(root, "k.nbi", b"the mirror's v1")
        assert mine is not None
        (tmp_path / "tmp").write_bytes(b"the JIT's v2")
        os.replace(tmp_path / "tmp", tmp_path / "k.nbi")
        assert _files.take_aside(root, "k.nbi", mine) is None
    finally:
        os.close(root)
    assert (tmp_path / "k.nbi").read_bytes() == b"the JIT's v2"
    assert [p.name for p in tmp_path.iterdir()] == ["k.nbi"]


def test_entries_are_listed_and_verified_by_the_cli(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'fs'}"
    a = tmp_path / "a"
    (a / "wp_mod").mkdir(parents=True)
    (a / "wp_mod" / "wp_mod.cpu0123.o").write_bytes(b"code")
    m = mirror(open_cache(url, secret=None), a)
    m.publish()

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "cuforge", "cache", *args, "--cache", url]
        return subprocess.run(cmd, capture_output=True, text=True)

    ls = cli("ls", "--json")
    assert ls.returncode == 0, ls.stderr
    rows = json.loads(ls.stdout)
    rows = rows["entries"] if isinstance(rows, dict) else rows
    assert {(r["kind"], r["name"]) for r in rows} == {
        ("mirror", "plain:wp_mod/wp_mod.cpu0123.o"),
        ("mirror-index", m.prefix),  # profile:version:platform:gpu
    }
    verify = cli("verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
