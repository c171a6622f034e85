"""``cuforge run`` with the directory-only JITs, for real: Warp's CPU kernels and
Numba's ``cache=True`` in a job wrapped by the real console script, a second job
with EMPTY directories (a fresh ``HOME``, ``XDG_CACHE_HOME``, ``NUMBA_CACHE_DIR``,
``WARP_CACHE_PATH``) hitting through the mirror -- by the JITs' own evidence: Warp
prints ``(cached)``, Numba's cache counters -- and a job killed (SIGKILL to the run
and the job) after a periodic publish losing nothing that publish stored.

Needs warp-lang and numba (``make test-jit``); skipped where they are not installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from _cli import SCRIPT, isolated_env

pytest.importorskip("warp")
pytest.importorskip("numba")

CHILD = Path(__file__).with_name("_jit_child.py")
JOB = """
import json, os, pathlib, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _jit_child
out = {jit: getattr(_jit_child, jit)() for jit in ("warp", "numba")}
sys.stdout.flush()
print(json.dumps(out), flush=True)
if len(sys.argv) > 1:  # the job that is killed: say it is done, then run on
    pathlib.Path(sys.argv[1]).write_text("compiled")
    time.sleep(600)
"""


def _job(tmp_path: Path) -> Path:
    """The job and the JIT module it imports, at one path every "host" uses (Numba
    names a source directory's cache folder by its absolute path)."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "_jit_child.py").write_text(CHILD.read_text())
    job = src / "job.py"
    job.write_text(textwrap.dedent(JOB))
    return job


def _host(tmp_path: Path, name: str, warp_dir: bool) -> dict[str, str]:
    """A fresh host's environment: empty home, XDG cache, Numba and Warp directories
    (Warp's own default under ``$XDG_CACHE_HOME`` when ``warp_dir`` is False)."""
    home = tmp_path / name
    home.mkdir()
    env = isolated_env(home, HOME=str(home), NUMBA_CACHE_DIR=str(home / "numba"))
    env = {k: v for k, v in env.items() if not k.startswith(("WARP_", "CUFORGE_MIRROR"))}
    if warp_dir:
        env["WARP_CACHE_PATH"] = str(home / "warp")
    return env


def _run(url: str, job: Path, env: dict[str, str]) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [str(SCRIPT), "run", "--cache", url, "--", sys.executable, str(job)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "file":
        return f"file://{tmp_path / 'shared'}"
    redis = request.getfixturevalue("redis_server").url
    return f"file://{tmp_path / 'local-of-the-run'},{redis}"  # a fresh host's empty local level


@pytest.mark.parametrize(("kind", "warp_dir"), [("file", True), ("tier", False)])
def test_a_second_run_with_empty_directories_hits_warp_and_numba(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str, warp_dir: bool
) -> None:
    job = _job(tmp_path)
    url = _url(kind, tmp_path, request)
    first, stdout = _run(url, job, _host(tmp_path, "host1", warp_dir))
    assert "(compiled)" in stdout and first["warp"]["result"] == [2.0, 4.0, 6.0]
    assert (first["numba"]["hits"], first["numba"]["misses"]) == (0, 1)
    if kind == "tier":  # the second host's local level is empty too
        url = url.replace("local-of-the-run", "local-of-host2")
    second, stdout = _run(url, job, _host(tmp_path, "host2", warp_dir))
    assert "(cached)" in stdout and "(compiled)" not in stdout  # Warp's own word
    assert second["warp"]["result"] == [2.0, 4.0, 6.0]
    assert (second["numba"]["hits"], second["numba"]["misses"]) == (1, 0)  # Numba's counters
    assert second["numba"]["result"] == 22.5


def _hydrated(url: str, env: dict[str, str], scratch: Path) -> int:
    """How many files a fresh directory would get from the cache now (Warp's and
    Numba's), by the mirror's own hydrate."""
    from cuforge.integrations.mirror import PROFILES, Mirror
    from cuforge.storage.urls import open_cache

    with open_cache(url) as cache:
        total = 0
        for name in ("warp", "numba"):
            where = scratch / f"{name}-{time.monotonic_ns()}"
            total += Mirror(PROFILES[name], cache, where, env=env).hydrate().written
        return total


def test_a_killed_run_keeps_what_its_periodic_publish_stored(tmp_path: Path) -> None:
    job = _job(tmp_path)
    url = f"file://{tmp_path / 'shared'}"
    ready = tmp_path / "ready"
    env = _host(tmp_path, "host1", warp_dir=True)
    proc = subprocess.Popen(
        [str(SCRIPT), "run", "--cache", url, "--publish-every", "200ms", "--",
         sys.executable, str(job), str(ready)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240  # a bound on waiting, not a timing assertion
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        # Warp's module (.meta, .o, .cpp) and Numba's index and data (.nbi, .nbc).
        while _hydrated(url, env, tmp_path / "scratch") < 5:
            assert proc.poll() is None and time.monotonic() < deadline, "never published"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the run and its job: no last publish
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    second, stdout = _run(url, job, _host(tmp_path, "host2", warp_dir=True))
    assert "(cached)" in stdout and "(compiled)" not in stdout
    assert (second["numba"]["hits"], second["numba"]["misses"]) == (1, 0)


def _mirror_keys(url: str) -> set[bytes]:
    """The cache keys of every mirrored file and index in the cache (their records
    name them)."""
    from cuforge.integrations._cache import ForeignEntries
    from cuforge.storage.record import decode_record
    from cuforge.storage.urls import open_cache

    keys: set[bytes] = set()
    with open_cache(url) as cache:
        for info in cache.iter_entries():
            for kind in ("mirror", "mirror-index"):
                record = decode_record(info.meta or b"", kind)
                if record is not None:
                    keys.add(ForeignEntries(cache, kind).key(str(record["key"])))
    return keys


def test_the_warm_set_lists_the_mirrored_files_and_a_fresh_host_prefetches_them(
    tmp_path: Path, redis_server: Any
) -> None:
    """``cuforge run --warm-set``: Warp's and Numba's mirrored files (and the indexes)
    join the set, so a fresh host's prefetch brings them into its local level before
    the mirror hydrates from it."""
    from cuforge.integrations import warmsets
    from cuforge.storage.urls import open_cache

    job = _job(tmp_path)
    shared = f"{redis_server.url}?prefix=ws:"
    url = f"file://{tmp_path / 'local-1'},{shared}"
    proc = subprocess.run(
        [str(SCRIPT), "run", "--cache", url, "--warm-set", "job", "--",
         sys.executable, str(job)],
        env=_host(tmp_path, "host1", warp_dir=True), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    mirrored = _mirror_keys(shared)
    # Warp's module files, Numba's bundle (its index and data file: one entry), two indexes.
    assert len(mirrored) >= 6
    numba = [k for k in mirrored if k.startswith(b"cuforge-foreign\0mirror\0numba:")]
    assert len(numba) == 1 and numba[0].endswith(b".py%d%d/" % sys.version_info[:2]), numba
    with open_cache(shared) as cache:
        listed = set(warmsets.load(cache, "job") or [])
    assert mirrored <= listed, mirrored - listed
    with open_cache(f"file://{tmp_path / 'local-2'},{shared}") as cache:
        tier = warmsets.local_tier(cache)
        assert tier is not None
        done = warmsets.prefetch(tier, sorted(listed))
    assert done.missing == 0
    with open_cache(f"file://{tmp_path / 'local-2'}") as local:  # now in the local level
        assert all(local.get_entry(k) is not None for k in mirrored)
