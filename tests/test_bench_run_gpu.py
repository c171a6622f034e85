"""bench_run.py's GPU modes (benchmarks/_run_gpu.py), as far as they go without a GPU:
each configuration's host (its empty directories and environment), its command, the
numpy refusal for numba-cuda, the checks that keep a figure from measuring the wrong
thing, and the command line (``--dry-run``, flags the CPU modes refuse).

The timings themselves are measured on the GPU machine (scripts/gpu-test --bench run),
never asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import _run_gpu  # noqa: E402


@pytest.fixture
def inherited(monkeypatch):
    """Variables a fresh host must not inherit, set in this process."""
    for name, value in {
        "CUFORGE_CACHE": "file:///elsewhere",
        "NUMBA_CACHE_DIR": "/elsewhere/numba",
        "TORCHINDUCTOR_CACHE_DIR": "/elsewhere/inductor",
        "TRITON_CACHE_DIR": "/elsewhere/triton",
        "CUDA_CACHE_PATH": "/elsewhere/nv",
        "PYTHONDONTWRITEBYTECODE": "1",
    }.items():
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize(
    ("jit", "dirs"),
    [
        ("numba-cuda", ("HOME", "TMPDIR", "NUMBA_CACHE_DIR")),
        ("torch-cuda", ("HOME", "TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")),
    ],
)
def test_each_host_has_its_own_empty_directories_and_inherits_no_cache(
    tmp_path, inherited, jit, dirs
):
    bench = _run_gpu.Bench(jit, tmp_path)
    env = bench.host("fresh")
    for name in dirs:
        path = env[name]
        assert path.startswith(str(tmp_path / "fresh") + os.sep), (name, path)
        assert os.path.isdir(path) and not os.listdir(path), name
    assert env["XDG_CACHE_HOME"] == os.path.join(env["HOME"], ".cache")
    for name in ("CUFORGE_CACHE", "CUDA_CACHE_PATH", "PYTHONDONTWRITEBYTECODE"):
        assert name not in env, name
    unused = {"NUMBA_CACHE_DIR"} if jit == "torch-cuda" else {"TORCHINDUCTOR_CACHE_DIR"}
    assert not unused & set(env)
    assert bench.host("fresh") == env, "warm-local's processes share one host's directories"
    other = bench.host("other")
    assert all(not other[n].startswith(str(tmp_path / "fresh")) for n in dirs)


def test_the_cuforge_run_is_a_tier_of_its_own_empty_level_before_the_shared_directory(tmp_path):
    bench = _run_gpu.Bench("numba-cuda", tmp_path)
    assert (tmp_path / "bench_cuda_kernels.py").read_text() == _run_gpu.KERNELS
    cmd = bench.command("cuforge run, fresh host", "cuforge-0")
    local, shared = tmp_path / "cuforge-0" / "cuforge", tmp_path / "shared"
    job = [sys.executable, str(bench.job)]
    assert cmd == [sys.executable, "-m", "cuforge", "run", "--cache",
                   f"file://{local},file://{shared}", "--", *job]  # fmt: skip
    assert bench.command("stock warm-local", "stock-warm") == job
    assert _run_gpu.host_name("stock warm-local", 2) == _run_gpu.FILLS[0][2]
    assert _run_gpu.host_name("stock cold", 2) != _run_gpu.host_name("stock cold", 1)


def test_numba_cuda_is_refused_a_numpy_it_cannot_compile_with(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    bench = _run_gpu.Bench("numba-cuda", tmp_path / "work")
    assert _run_gpu.check_numpy(bench) is None  # this venv's numpy is below 2.5
    fake = tmp_path / "fake" / "numpy"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "2.5.2"\n')
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    refused = _run_gpu.check_numpy(bench)
    assert refused is not None and "numpy 2.5.2" in refused and "numpy < 2.5" in refused


def _numba(hits: int, misses: int) -> dict[str, object]:
    kernels = {k: {"hits": hits, "misses": misses} for k in ("saxpy", "smooth")}
    return {"correct": True, "kernels": kernels}


def _torch(hit: int, miss: int, wired: bool = True) -> dict[str, object]:
    fx = {"fxgraph_cache_hit": hit, "fxgraph_cache_miss": miss}
    return {"correct": True, "fxgraph": fx, "wired": wired}


def test_a_process_that_is_not_what_its_kind_says_is_a_problem(tmp_path):
    numba = _run_gpu.Bench("numba-cuda", tmp_path)
    assert numba.problems("stock cold", _numba(0, 1)) == []
    assert numba.problems("cuforge run, fresh host", _numba(1, 0)) == []
    assert numba.problems("cuforge run, fresh host", _numba(0, 1))  # compiled
    assert numba.problems("stock warm-local", _numba(1, 1))
    assert numba.problems("stock cold", _numba(1, 0))  # not cold
    assert numba.problems("stock cold", {**_numba(0, 1), "correct": False})
    no_stats = {"correct": True, "kernels": {"saxpy": None}}
    assert numba.problems("stock warm-local", no_stats)
    torch = _run_gpu.Bench("torch-cuda", tmp_path)
    assert torch.problems("cuforge run, fresh host", _torch(1, 0)) == []
    assert torch.problems("cuforge run, cold", _torch(0, 1)) == []
    assert torch.problems("cuforge run, fresh host", _torch(0, 1))
    assert torch.problems("cuforge run, fresh host", _torch(1, 0, wired=False))
    assert torch.problems("stock cold", _torch(1, 0))
    assert torch.problems("stock warm-local", _torch(1, 0, wired=True))
    assert torch.problems("stock warm-local", _torch(1, 0, wired=False)) == []


def _bench_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_run.py"), *args],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


def test_dry_run_prints_every_configuration_and_starts_none():
    done = _bench_run("--jit", "torch-cuda", "--dry-run")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for label, _, _ in _run_gpu.FILLS:
        assert label in out
    for kind in _run_gpu.KINDS:
        assert f"round 0, {kind}" in out
    assert out.count(" -m cuforge run --cache file://") == 2  # the fill and the fresh host
    assert "TORCHINDUCTOR_CACHE_DIR=" in out and "TRITON_CACHE_DIR=" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--json", "x.json"), "--json: only with --jit numba-cuda or torch-cuda"),
        (("--jit", "torch", "--dry-run"), "--dry-run: only with --jit"),
        (("--jit", "numba-cuda", "--device", "cpu"), "--device cpu: only --jit torch-cuda"),
        (("--rounds", "0"), "--rounds: expected 1 or more, got 0"),
    ],
)
def test_a_flag_a_mode_cannot_use_is_one_line_and_exit_2(args, message):
    done = _bench_run(*args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr
