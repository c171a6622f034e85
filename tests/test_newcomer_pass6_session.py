"""The sixth newcomer pass, ``session()`` and warm sets: each test runs real processes
on real caches (real NVRTC compiles, a real redis-server), and fails on the main it
was written against.

- 1. ``compile(cache=True)`` inside ``session(cache=...)`` went to the default cache
  (``~/.cache/cuforge``), not the session's, and was not recorded in its warm set.
- 2. ``session(warm_set=...)`` recording nothing gave no warning (``cuforge run`` does).
- 3. ``session()`` left its Redis connection open after exit (ResourceWarning).
- 4. ``cuforge warm --set nosuch --cache file:///absent,redis://...``: "there is no
  cache at /absent" -- though the Redis level was searched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from _cli import SAXPY, isolated_env, run
from _redis import RedisServer
from cuforge.integrations import warmsets
from cuforge.storage.urls import open_cache
from reliability._figures import record

#: A job: compile(cache=True) in a session, then outside it; says where entries went.
_JOB = """
import json, sys, warnings
from pathlib import Path
import cuforge
from cuforge.integrations import session
from cuforge.storage import config

src = Path(sys.argv[2]).read_text()
def compile_once(name):
    opts = cuforge.ProgramOptions(arch="sm_80", name=name)
    return cuforge.Program(src, "c++", opts).compile("cubin", cache=True)

before = config.default_cache()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with session(cache=sys.argv[1], warm_set="sess1", systems=(), mirrors=False) as s:
        compile_once("in-session.cu")
        seen = s.recorder.keys()
after = config.default_cache()
compile_once("after.cu")
print(json.dumps({
    "recorded": len(seen),
    "restored": after is before,
    "warnings": [str(w.message) for w in caught],
}))
"""


def _host(server: RedisServer) -> str:
    """``redis://127.0.0.1:PORT``: the server's URL without its database."""
    return server.url.rsplit("/", 1)[0]


def _entries(root: Path) -> int:
    """How many entries the directory cache at ``root`` holds (0 when it is not there)."""
    if not root.exists():
        return 0
    with open_cache(f"file://{root}", secret=None) as cache:
        return sum(1 for _ in cache.iter_entries())


# -- 1. compile(cache=True) in a session uses the session's cache and joins its set -----
def test_compile_cache_true_in_a_session_uses_the_sessions_cache_and_warm_set(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    local = tmp_path / "S1"
    url = f"file://{local},{_host(redis_server)}/1"
    job = subprocess.run(
        [sys.executable, "-c", _JOB, url, str(SAXPY)],
        capture_output=True, text=True, env=isolated_env(tmp_path), timeout=240,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr
    said = json.loads(job.stdout)
    default = tmp_path / "xdg" / "cuforge" / "program-cache"
    assert _entries(local) == 2  # the session's compile and its warm set, stored there
    assert _entries(default) == 1  # only the compile after the session went there
    assert said["recorded"] == 1 and said["restored"] is True, said
    assert not [w for w in said["warnings"] if "nothing was recorded" in w], said
    with open_cache(f"{_host(redis_server)}/1", secret=None) as shared:
        listed = warmsets.load(shared, "sess1")
    assert listed is not None and len(listed) == 1
    record(
        "use",
        "integrations",
        "compile(cache=True) inside session(cache='file:///S1,redis://.../1', "
        "warm_set='sess1'), then after it",
        2,
        "the session's compile stored in its cache and listed in its warm set; the one "
        "after went to the default cache again, the default handle put back (before: both "
        "in ~/.cache/cuforge, the set recorded nothing)",
        scale="all",
    )


# -- 2. a session whose warm set recorded nothing says so, once --------------------------
def test_a_session_that_recorded_nothing_warns_once(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    script = (
        "import sys, warnings\n"
        "from cuforge.integrations import session\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    with session(cache=sys.argv[1], warm_set='idle', systems=(), mirrors=False):\n"
        "        pass\n"
        "for w in caught:\n"
        "    print(w.category.__name__, w.message)\n"
    )
    url = f"file://{tmp_path / 'L'},{_host(redis_server)}/2"
    job = subprocess.run(
        [sys.executable, "-c", script, url],
        capture_output=True, text=True, env=isolated_env(tmp_path), timeout=240,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr
    assert job.stdout.splitlines() == [
        "CacheWriteWarning cuforge: warm set 'idle': the job read or stored nothing "
        "through the cache, so nothing was recorded (a set stored before is left as it was)"
    ], job.stdout
    record(
        "use",
        "integrations",
        "session(warm_set='idle') whose block reads or stores nothing",
        1,
        "one CacheWriteWarning, cuforge run's words: 'warm set 'idle': the job read or "
        "stored nothing through the cache, so nothing was recorded (...)' (before: silent)",
        scale="all",
    )


# -- 3. the session's Redis connection is closed at its end ------------------------------
def test_a_session_closes_the_redis_connection_it_opened(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    script = (
        "import sys, warnings, gc\n"
        "warnings.simplefilter('always', ResourceWarning)\n"
        "from cuforge.integrations import session\n"
        "with session(cache=sys.argv[1], warm_set='w', systems=(), mirrors=False) as s:\n"
        "    s.cache.get_entry(b'k' * 32)\n"  # connects
        "print(s.cache is not None)\n"
        "print(sys.stdin.readline().strip())\n"  # the test counts connections meanwhile
    )
    url = f"file://{tmp_path / 'L'},{_host(redis_server)}/3"
    with redis_server.client() as admin:
        base = len(admin.client_list())
        with subprocess.Popen(
            [sys.executable, "-X", "dev", "-c", script, url],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=isolated_env(tmp_path),
        ) as job:  # fmt: skip
            assert job.stdout is not None and job.stdin is not None
            assert job.stdout.readline().strip() == "True"  # the session has ended
            open_after = len(admin.client_list()) - base  # the job still runs
            job.stdin.write("done\n")
            job.stdin.flush()
            _, err = job.communicate(timeout=60)
    assert open_after == 0, "the session's Redis connection is still open"
    assert "ResourceWarning" not in err, err
    record(
        "use",
        "integrations",
        "session(cache='file:///L,redis://...') ended, the process still running (python -X dev)",
        1,
        "no connection of the session's left on the Redis server, no ResourceWarning "
        "(before: its socket open until the process ended)",
        scale="all",
    )


# -- 4. warm --set names the levels searched, not a missing local level ------------------
def test_warm_set_not_in_any_level_says_so_not_that_the_local_level_is_missing(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    local = tmp_path / "L3"
    url = f"file://{local},{_host(redis_server)}/0"
    done = run(tmp_path, "warm", "--set", "nosuch", "--cache", url)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == (
        f"cuforge warm: no warm set 'nosuch' is stored in any level of {url} (searched: "
        f"{_host(redis_server)}/0; {local} does not exist and was not created; cuforge run "
        "--warm-set nosuch records one from a job that reads or stores entries through "
        "this cache)\n"
    ), done.stderr
    assert not local.exists()
    # A set stored there is fetched into a fresh local level: the level was searched.
    with open_cache(f"{_host(redis_server)}/0", secret=None) as shared:
        assert warmsets.store(shared, "there", [b"\0" * 32])
    found = run(tmp_path, "warm", "--set", "there", "--cache", url)
    assert found.returncode == 0, found.stderr
    assert local.exists()
    record(
        "use",
        "cli",
        "warm --set nosuch --cache file:///L3,redis://... (L3 absent, Redis up); then a set"
        " that is there",
        2,
        "exit 1 'no warm set 'nosuch' is stored in any level of URL (searched: redis://...;"
        " L3 does not exist and was not created; ...)' (before: 'there is no cache at L3', "
        "though Redis was searched); the stored set fetched into a fresh L3",
        scale="all",
    )


# -- 1b. under cuforge run --warm-set, a session's compile(cache=True) joins both sets ---
def test_a_sessions_compile_under_cuforge_run_joins_the_runs_warm_set_too(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    url = f"file://{tmp_path / 'R'},{_host(redis_server)}/4"
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "import cuforge\n"
        "from cuforge.integrations import session\n"
        "with session(warm_set='inner', systems=(), mirrors=False):\n"
        "    opts = cuforge.ProgramOptions(arch='sm_80', name='nested.cu')\n"
        "    cuforge.Program(Path(sys.argv[1]).read_text(), 'c++', opts).compile(\n"
        "        'cubin', cache=True)\n"
    )
    done = run(tmp_path, "run", "--cache", url, "--warm-set", "outer", "--",
               sys.executable, "-c", script, str(SAXPY))  # fmt: skip
    assert done.returncode == 0, done.stderr
    with open_cache(f"{_host(redis_server)}/4", secret=None) as shared:
        outer, inner = warmsets.load(shared, "outer"), warmsets.load(shared, "inner")
    assert inner is not None and len(inner) == 1
    assert outer == inner  # the run's journal recorded the session's compile too
    record(
        "use",
        "integrations",
        "cuforge run --warm-set outer -- python: compile(cache=True) inside "
        "session(warm_set='inner')",
        1,
        "both sets list the program's entry (the run's journal wraps the session's default)",
        scale="all",
    )
