"""Benchmark results as JSON (``--json``) and the plots drawn from them (``plot.py``).

A bench run in a real process writes a result file that ``plot.py`` reads; a file
that is not a result, or results that lack a plot's numbers, stop ``plot.py`` with
one line naming the file or what is missing; with matplotlib installed (the ``docs``
extra), the committed results draw every plot, with their numbers in the SVG text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import plot  # noqa: E402


def _plot(results: str, out: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, "plot.py"), "--results", results, "--out", out],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_bench_run_writes_a_result_plot_py_reads(tmp_path):
    path = tmp_path / "storage.json"
    done = subprocess.run(
        [sys.executable, os.path.join(BENCH, "bench_storage.py"), "--quick", "--writes", "200",
         "--json", str(path), "--note", "a test run"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("measurement"), "the printed table comes first, unchanged"
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["bench"] == "bench_storage"
    assert doc["note"] == "a test run"
    assert "--writes 200" in doc["command"] and doc["command"].startswith("python ")
    assert doc["machine"]["cpus"] == os.cpu_count()
    assert doc["versions"]["cuforge"]
    r = doc["results"]
    assert r["writes"] == 200
    assert 0 < r["filestream_get_4kib"]["median_us"] < 1e5
    assert r["capped_writes_1kib_2mb_cap"]["total_s"] > 0
    assert r["capped_writes_1kib_2mb_cap"]["disk_bytes"] >= 200 * 1024  # under the cap: all kept
    loaded = plot.Result(str(path))
    assert loaded.bench == "bench_storage" and loaded.results == r


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not readable JSON"),
        ("[1, 2]", "a JSON object expected"),
        ('{"schema": 1, "bench": "run", "date": "2026-01-01", "command": "x"}', "no 'results'"),
        (
            '{"schema": 2, "bench": "run", "date": "d", "command": "x", "results": {}}',
            "schema 2",
        ),
    ],
)
def test_a_file_that_is_not_a_result_stops_plot_py_naming_it(tmp_path, content, message):
    results = tmp_path / "results"
    results.mkdir()
    (results / "broken.json").write_text(content)
    done = _plot(str(results), str(tmp_path / "out"))
    assert done.returncode == 1
    line = done.stderr.strip()
    assert "\n" not in line and "broken.json" in line and message in line, line
    assert not (tmp_path / "out").exists()


def test_missing_numbers_name_what_is_missing(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "empty.json").write_text(json.dumps(
        {"schema": 1, "bench": "bench_storage", "date": "2026-01-01", "command": "x",
         "results": {}}
    ))  # fmt: skip
    done = _plot(str(results), str(tmp_path / "out"))
    assert done.returncode == 1
    assert "no result file holds cache hit latencies" in done.stderr


def test_the_newest_result_with_the_numbers_wins(tmp_path):
    def write(name: str, date: str, process_ms: dict | None) -> None:
        results = {"process_ms": process_ms} if process_ms is not None else {}
        (tmp_path / name).write_text(json.dumps(
            {"schema": 1, "bench": "bench_cli", "date": date, "command": "x",
             "results": results}
        ))  # fmt: skip

    write("a.json", "2026-01-01T00:00:00Z", {"python -c pass": {"median": 1.0}})
    write("b.json", "2026-03-01T00:00:00Z", {"python -c pass": {"median": 2.0}})
    write("c.json", "2026-05-01T00:00:00Z", None)  # newer, but without the numbers
    found, numbers = plot.newest(plot.load(str(tmp_path)), "cli", plot.PLOTS["cli-cold"][1])
    assert found.path.endswith("b.json") and numbers["python -c pass"]["median"] == 2.0


def _newest_run(bench: str) -> dict:
    """The committed result of ``bench`` with the latest date."""
    folder = os.path.join(BENCH, "results")
    runs = []
    for name in os.listdir(folder):
        if name.endswith(".json"):
            with open(os.path.join(folder, name)) as f:
                run = json.load(f)
            if run.get("bench") == bench:
                runs.append(run)
    assert runs, f"no committed {bench} result"
    return max(runs, key=lambda r: r["date"])


def test_the_committed_results_draw_every_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib comes with the docs extra")
    out = tmp_path / "plots"
    done = _plot(os.path.join(BENCH, "results"), str(out))
    assert done.returncode == 0, done.stderr
    for name in plot.PLOTS:
        svg = (out / f"{name}.svg").read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg
        caption = (out / f"{name}.md").read_text()
        assert "Source: `benchmarks/results/" in caption and "command `" in caption
    # The newest recorded GPU run's numbers (read here from the JSON files, not through
    # plot.py) appear as text in the drawings.
    graph = _newest_run("bench_graph")["results"]["nodes"]["1000"]
    build = graph["cuforge_us"]["build"] / graph["cuda.core_us"]["build"]
    assert f"{build:.2f}x" in (out / "graph-phases.svg").read_text()  # 1,000-node build
    launch = _newest_run("bench_launch")["results"]["per_launch_us"]["cuforge empty"]
    assert f"{launch['median']:.2f} µs" in (out / "launch.svg").read_text()
    # Same results, same files: nothing in the SVG depends on when it was drawn.
    again = tmp_path / "again"
    assert _plot(os.path.join(BENCH, "results"), str(again)).returncode == 0
    for name in plot.PLOTS:
        assert (out / f"{name}.svg").read_bytes() == (again / f"{name}.svg").read_bytes()
