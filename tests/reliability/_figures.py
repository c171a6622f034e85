"""Scales and figures for the reliability tests.

Every reliability test runs at two scales: ``ci`` (every ``make test``, seconds) and
``full`` (marked ``soak``; ``make test-all``, minutes). Each records what it injected,
how many times, and what held, through :func:`record`; with ``CUFORGE_FIGURES=<file>``
set, every figure is appended there as one JSON line, and
``scripts/reliability-table <file>`` turns the lines into docs/reliability.md's table.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest

#: ``@SCALES`` on a test gives it a ``scale`` argument: "ci", or "full" (soak-marked).
SCALES = pytest.mark.parametrize(
    "scale", [pytest.param("ci"), pytest.param("full", marks=pytest.mark.soak)]
)


def pick(scale: str, ci: Any, full: Any) -> Any:
    return full if scale == "full" else ci


def record(
    area: str,
    backend: str,
    injected: str,
    times: int,
    held: str,
    *,
    scale: str,
    lost: int = 0,
    **numbers: Any,
) -> None:
    """One figure: ``times`` injections of ``injected`` on ``backend``, what ``held``,
    and how many entries were lost (stored, intact, yet not returned). ``scale``:
    "ci", "full", or "all" for a test that runs the same at both."""
    line = {
        "area": area,
        "backend": backend,
        "injected": injected,
        "times": times,
        "held": held,
        "lost": lost,
        "scale": scale,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        **numbers,
    }
    print("FIGURE", json.dumps(line))
    target = os.environ.get("CUFORGE_FIGURES")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
