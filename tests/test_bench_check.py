"""The benchmark guard (benchmarks/bench_check.py): its thresholds file, its GPU check
on bench_launch / bench_graph / bench_coldstart / bench_run result files, and its
retry-before-failing rule.

The CPU figures themselves are timed by ``make bench-check``, never asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import bench_check  # noqa: E402

PHASES = ("build", "instantiate", "launch+sync", "destroy")


def _results(tmp_path, graph_scale: float = 1.0, launch_scale: float = 1.0):
    launch = {
        "cuforge empty": {"median": 5.0 * launch_scale},
        "cuforge 4 args": {"median": 5.5 * launch_scale},
        "cuda.core 1.2.0 empty": {"median": 5.2},
        "cuda.core 1.2.0 4 args": {"median": 6.0},
        "C loop empty": {"median": 4.0},
    }
    nodes = {
        str(n): {
            "cuforge_us": {p: 9.0 * graph_scale for p in PHASES},
            "cuda.core_us": {p: 10.0 for p in PHASES},
        }
        for n in (1, 10, 100, 1000)
    }
    lp, gp = tmp_path / "launch.json", tmp_path / "graph.json"
    lp.write_text(json.dumps({"results": {"per_launch_us": launch}}))
    gp.write_text(json.dumps({"results": {"nodes": nodes}}))
    runs = (_run(tmp_path, "numba-cuda", 1.1), _run(tmp_path, "torch-cuda", 1.05))
    return str(lp), str(gp), _coldstart(tmp_path), *runs


def _coldstart(tmp_path, cold: float = 1.01, modes=("autotune", "default")) -> str:
    """A bench_coldstart result file (the ratios it computed, by threshold name)."""
    figures = {}
    for mode in modes:
        figures[f"coldstart_{mode}_cold"] = cold
        figures[f"coldstart_{mode}_fresh_host"] = 1.05
    path = tmp_path / "coldstart.json"
    path.write_text(json.dumps({"bench": "bench_coldstart", "results": {"figures": figures}}))
    return str(path)


def _run(tmp_path, jit: str, ratio: float) -> str:
    """A ``bench_run.py --jit <jit>`` result file (its figure, by threshold name)."""
    figure = {"numba-cuda": "run_numbacuda_fresh_host", "torch-cuda": "run_torchcuda_fresh_host"}
    path = tmp_path / f"run-{jit}.json"
    results = {"jit": jit, "figures": {figure[jit]: ratio}}
    path.write_text(json.dumps({"bench": "bench_run", "results": results}))
    return str(path)


def test_every_threshold_has_a_limit_a_tolerance_and_a_reason():
    doc = bench_check.load_thresholds()
    assert set(doc) == {"cpu", "gpu"}
    for figures in doc.values():
        for name, t in figures.items():
            assert t["max"] > 0 and 0 <= t["tolerance"] < 1, name
            assert t["reason"].strip(), name


def test_every_gpu_threshold_names_a_figure_the_gpu_benches_produce(tmp_path):
    ratios = bench_check.gpu_ratios(*_results(tmp_path))
    assert set(bench_check.load_thresholds()["gpu"]) <= set(ratios)
    assert abs(ratios["graph_10_launch_sync"] - 0.9) < 1e-9
    assert abs(ratios["launch_empty"] - 5.0 / 5.2) < 1e-9


def _gpu_check(tmp_path, **scale):
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_check.py"), "--gpu",
         *_results(tmp_path, **scale)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_gpu_check_passes_within_the_limits_and_fails_naming_a_slow_figure(tmp_path):
    done = _gpu_check(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bench-check passed" in done.stdout
    slow = _gpu_check(tmp_path, launch_scale=1.5)
    assert slow.returncode == 1
    assert "FAILED: launch_empty, launch_4args over threshold" in slow.stdout


def test_only_the_figures_of_the_benches_given_are_checked(tmp_path):
    _, _, cp, *_ = _results(tmp_path)
    alone = subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_check.py"), "--gpu", cp],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "coldstart_autotune_cold" in alone.stdout and "launch_empty" not in alone.stdout
    slow = subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_check.py"), "--gpu",
         _coldstart(tmp_path, cold=1.2, modes=("default",))],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert slow.returncode == 1  # the mode that ran is checked, the other is not
    assert "FAILED: coldstart_default_cold over threshold" in slow.stdout
    assert "coldstart_autotune_cold" not in slow.stdout


def _check(*files: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_check.py"), "--gpu", *files],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_bench_run_result_is_checked_on_the_jits_it_ran(tmp_path):
    """scripts/gpu-test --bench run writes one file per JIT (RUN_JITS may name one):
    each is checked on its own figure, never failed for the other's absence."""
    numba = _check(_run(tmp_path, "numba-cuda", 1.15))
    assert numba.returncode == 0, numba.stdout + numba.stderr
    assert "run_numbacuda_fresh_host" in numba.stdout
    assert "run_torchcuda_fresh_host" not in numba.stdout
    slow = _check(_run(tmp_path, "torch-cuda", 1.2))
    assert slow.returncode == 1
    assert "FAILED: run_torchcuda_fresh_host over threshold" in slow.stdout
    assert "run_numbacuda_fresh_host" not in slow.stdout
    both = _check(_run(tmp_path, "numba-cuda", 1.15), _run(tmp_path, "torch-cuda", 1.05))
    assert both.returncode == 0 and "coldstart" not in both.stdout, both.stdout


def test_triton_cold_without_a_python_with_triton_fails_naming_it(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_check.py"), "--only", "triton_cold",
         "--triton-python", str(tmp_path / "no-such-python")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"triton_cold: no Python with triton ({tmp_path / 'no-such-python'})" in done.stdout
    assert "FAILED: triton_cold over threshold" in done.stdout


def test_a_figure_missing_from_the_results_fails(tmp_path):
    lp, gp, *_ = _results(tmp_path)
    with open(gp) as f:
        doc = json.load(f)
    del doc["results"]["nodes"]["1000"]["cuda.core_us"]  # the peer was skipped there
    with open(gp, "w") as f:
        json.dump(doc, f)
    ratios = bench_check.gpu_ratios(lp, gp)
    limits = bench_check.load_thresholds()["gpu"]
    assert "graph_1000_destroy" in bench_check.failures(ratios, limits)


def test_a_figure_fails_only_when_measured_over_its_limit_twice():
    limits = {"key": {"max": 0.5, "tolerance": 0.1, "reason": "r"}}
    once = iter([{"key": 0.9}, {"key": 0.5}])
    ratios, bad = bench_check.check(lambda: next(once), limits, retry=True)
    assert bad == [] and ratios["key"] == 0.5
    twice = iter([{"key": 0.9}, {"key": 0.7}])
    ratios, bad = bench_check.check(lambda: next(twice), limits, retry=True)
    assert bad == ["key"] and ratios["key"] == 0.7
    no_retry = iter([{"key": 0.9}])
    assert bench_check.check(lambda: next(no_retry), limits, retry=False)[1] == ["key"]


def test_the_import_lines_are_measured_beside_python_pass_and_have_thresholds():
    """``make bench-check`` times the README's two import lines as whole processes
    (issue 36, item 9); here only that it measures them, not how fast they are."""
    ratios = bench_check.import_ratios(processes=2)
    assert set(ratios) == set(bench_check.IMPORT_LINES) == {"import_compile", "import_runtime"}
    assert all(r > 0 for r in ratios.values())
    assert set(ratios) <= set(bench_check.load_thresholds()["cpu"])
