"""JAX's persistent compilation cache through cuforge (cuforge.integrations.jax), on
the CPU with the real jax (``make test-jit``: .venv-jit has jax 0.10). Every check
runs fresh Python processes: what one stores, the next one loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

pytest.importorskip("jax", reason="jax is not installed (make test-jit)")

from cuforge.integrations import warmsets
from cuforge.storage.urls import open_cache

JOB = """
import json, os, sys, warnings
import jax, jax.numpy as jnp
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
from cuforge.integrations import jax as cj
if os.environ.get("INSTALL"):
    cj.install(os.environ["INSTALL"])
if os.environ.get("WARM"):
    import cuforge; cuforge.mark_warm()
barrier = os.environ.get("BARRIER")
if barrier:
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    import time
    while len(os.listdir(barrier)) < int(os.environ["PEERS"]):
        time.sleep(0.01)
@jax.jit
def f(x):
    for i in range(12):
        x = jnp.sin(x) @ x.T + i
    return x
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    r = f(jnp.ones((16, 16), dtype=jnp.float32)).block_until_ready()
import cuforge
print(json.dumps({"sum": float(r.sum()), "counters": cj.counters,
                  "installed": cj.installed() is not None,
                  "warm_warnings": [str(w.message) for w in seen
                                    if type(w.message).__name__ == "CompileAfterWarmWarning"],
                  "after_warm": cuforge.compiles_after_warm()}))
"""


def _job(tmp_path, env: dict[str, str], cwd=None, prefix: list[str] | None = None) -> dict:
    script = tmp_path / "jaxjob.py"
    script.write_text(JOB)
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CUFORGE_", "JAX_"))}
    full.update(env)
    out = subprocess.run(
        [*(prefix or []), sys.executable, str(script)],
        env=full, capture_output=True, text=True, cwd=cwd or tmp_path, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_fresh_process_hits_what_another_stored(tmp_path) -> None:
    url = str(tmp_path / "cache")
    first = _job(tmp_path, {"INSTALL": url})
    assert first["installed"] and first["counters"]["stored"] >= 1
    assert first["counters"]["hits"] == 0
    second = _job(tmp_path, {"INSTALL": url})
    assert second["counters"]["hits"] == first["counters"]["stored"]
    assert second["counters"]["stored"] == 0 and second["sum"] == first["sum"]
    with open_cache(url) as cache:
        kinds = {json.loads(i.meta)["kind"] for i in cache.iter_entries()}
    assert kinds == {"jax"}


def test_keys_do_not_depend_on_where_the_process_runs(tmp_path) -> None:
    """Stock JAX folds its cache directory's path into every key (the XLA autotune
    directory under it is a compile option): a copy of the directory at another path
    misses. Through cuforge there is no directory in the key: another host's process,
    with another home, temporary and working directory, hits."""
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    stock = _job(tmp_path, {"JAX_COMPILATION_CACHE_DIR": str(one / "jaxcache")})
    assert stock["counters"]["stored"] == 0  # JAX's own cache, not cuforge
    shutil.copytree(one / "jaxcache", two / "jaxcache")
    jax_files = sorted(p.name for p in (one / "jaxcache").iterdir() if p.is_file())
    assert jax_files
    # the same files at another path: stock JAX writes new entries (it missed)
    _job(tmp_path, {"JAX_COMPILATION_CACHE_DIR": str(two / "jaxcache")})
    moved = sorted(p.name for p in (two / "jaxcache").iterdir() if p.is_file())
    assert set(moved) - set(jax_files), "stock JAX hit a directory at another path"
    url = str(tmp_path / "shared")
    _job(tmp_path, {"INSTALL": url, "HOME": str(one), "TMPDIR": str(one)}, cwd=one)
    there = _job(tmp_path, {"INSTALL": url, "HOME": str(two), "TMPDIR": str(two)}, cwd=two)
    assert there["counters"]["hits"] >= 1 and there["counters"]["stored"] == 0


def test_a_tampered_or_foreign_executable_is_a_miss(tmp_path) -> None:
    url = str(tmp_path / "cache")
    secret = {"CUFORGE_CACHE_SECRET": "s" * 32}
    stored = _job(tmp_path, {"INSTALL": url, **secret})["counters"]["stored"]
    # another secret: nothing it signed is used
    other = _job(tmp_path, {"INSTALL": url, "CUFORGE_CACHE_SECRET": "t" * 32})
    assert other["counters"]["hits"] == 0 and other["counters"]["stored"] == stored
    # a flipped byte in every stored payload: a miss and a compile, never a wrong load
    flipped = 0
    for root, _, files in os.walk(url):
        for name in files:
            path = os.path.join(root, name)
            if len(name) >= 62 and "." not in name and os.path.getsize(path) > 1000:
                with open(path, "r+b") as f:
                    data = bytearray(f.read())
                    data[len(data) // 2] ^= 0xFF
                    f.seek(0)
                    f.write(bytes(data))
                flipped += 1
    assert flipped >= 1
    again = _job(tmp_path, {"INSTALL": url, **secret})
    assert again["counters"]["hits"] < stored and again["sum"] == other["sum"]


def test_concurrent_misses_compile_once(tmp_path, redis_server) -> None:
    # Redis: a directory cache may skip a store when its size ledger is busy under
    # load (counted in lock_timeouts), and a waiter then rightly compiles again.
    url = redis_server.url
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    script = tmp_path / "jaxjob.py"
    script.write_text(JOB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUFORGE_", "JAX_"))}
    env.update(INSTALL=url, BARRIER=str(barrier), PEERS="3")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    results = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    # each module is compiled and stored once, by whichever process took its lock
    # first (a second compile of it would store it a second time)
    with open_cache(url) as cache:
        modules = sum(b'"kind":"jax"' in (i.meta or b"") for i in cache.iter_entries())
    assert modules >= 1
    assert sum(r["counters"]["stored"] for r in results) == modules, results
    assert sum(r["counters"]["waited"] for r in results) >= 1


def test_a_compile_after_mark_warm_is_warned_once_and_counted(tmp_path) -> None:
    url = str(tmp_path / "cache")
    out = _job(tmp_path, {"INSTALL": url, "WARM": "1"})
    assert out["after_warm"] == out["counters"]["stored"] >= 1
    names = [w.split(" compiles ")[1].split(" ")[0] for w in out["warm_warnings"]]
    # one warning per module name (a name compiled twice, for two dtypes, is counted twice)
    assert len(names) == len(set(names)) >= 1
    assert any(n.startswith("jit_f") for n in names), names
    with open_cache(url) as cache:
        assert cache.total_stats().warm_compiles == out["after_warm"]  # type: ignore[attr-defined]
    # the next process loads them: no compile, no warning
    again = _job(tmp_path, {"INSTALL": url, "WARM": "1"})
    assert again["after_warm"] == 0 and again["warm_warnings"] == []


def test_cuforge_run_wires_jax_with_no_code_change_and_records_a_warm_set(
    tmp_path, redis_server
) -> None:
    cli = [os.path.join(os.path.dirname(sys.executable), "cuforge"), "run"]
    shared = redis_server.url
    first = _job(tmp_path, {}, prefix=[*cli, "--cache", shared, "--warm-set", "jx", "--"])
    assert first["installed"] and first["counters"]["stored"] >= 1
    with open_cache(shared) as cache:
        listed = warmsets.load(cache, "jx")
    assert listed is not None and len(listed) == first["counters"]["stored"]
    # a fresh host: an empty local level in front, the warm set prefetched into it
    local = tmp_path / "fresh-local"
    url = f"file://{local},{shared}"
    started = time.monotonic()
    second = _job(tmp_path, {}, prefix=[*cli, "--cache", url, "--warm-set", "jx", "--"])
    assert time.monotonic() - started < 300
    assert second["counters"]["hits"] == first["counters"]["stored"]
    assert second["counters"]["stored"] == 0 and second["sum"] == first["sum"]
    with open_cache(str(local), read_only=True) as alone:
        assert sum(e is not None for e in alone.get_entries(listed)) == len(listed)
