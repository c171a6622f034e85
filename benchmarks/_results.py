"""Benchmark results as JSON: what ``--json PATH`` writes and ``plot.py`` reads.

One file per run::

    {"schema": 1, "bench": "bench_cli", "date": "2026-11-24T10:02:03Z",
     "command": "python benchmarks/bench_cli.py --json ...",
     "machine": {"cpus": 2, "cpu": "...", "platform": "...", "python": "3.11.7",
                 "loadavg": {"start": [...], "end": [...]}},
     "versions": {"cuforge": "0.1.0", "cuda-bindings": "13.3.1", "cuda-core": "1.2.2"},
     "note": "free text, e.g. shared machine",
     "results": {...}}

``results`` is the bench's own raw numbers (unformatted, units in the key names).
Files recorded by hand from numbers measured elsewhere (GPU runs) carry the same
fields plus ``recorded_from``: where the numbers were first written down.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
from importlib import metadata
from typing import Any

SCHEMA = 1
_START_LOAD = os.getloadavg() if hasattr(os, "getloadavg") else None


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """``--json PATH`` and ``--note TEXT`` for a bench's argument parser."""
    ap.add_argument(
        "--json", metavar="PATH", help="also write the results as JSON to PATH (benchmarks/plot.py)"
    )
    ap.add_argument(
        "--note", default="", help="free text kept with the JSON results (e.g. machine load)"
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    """What the numbers depend on: CPU, cores, OS, Python, load during the run."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cpus": os.cpu_count(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg": {"start": _START_LOAD, "end": load},
    }


def versions() -> dict[str, str | None]:
    return {d: _version(d) for d in ("cuforge", "cuda-bindings", "cuda-core", "redis")}


def write(path: str | None, bench: str, results: dict[str, Any], note: str = "") -> None:
    """Write ``results`` of ``bench`` to ``path`` (nothing when ``path`` is None)."""
    if not path:
        return
    script = os.path.relpath(os.path.abspath(sys.argv[0]))
    doc = {
        "schema": SCHEMA,
        "bench": bench,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": shlex.join(["python", script, *sys.argv[1:]]),
        "machine": machine(),
        "versions": versions(),
        "note": note,
        "results": results,
    }
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    print(f"results written to {path}", file=sys.stderr)
