"""What logging costs a cache hit: nothing measurable while DEBUG is off.

One hit -- ``Program(src).compile("cubin", cache=FileStream)`` of a 1 KB source, as
``bench_compile.bench_hit`` -- timed in three settings, interleaved in rounds so
drift hits them alike:

- ``off``: the library as shipped (a NullHandler on ``cuforge``, no level set, so
  DEBUG is off): the hit path pays its level checks;
- ``stripped``: those checks made free -- the hit path's ``debug_enabled`` (in
  ``compile.cache._steps`` and ``compile.cache._tracking``) swapped for a C builtin that says
  no: the hit as if it had no logging code;
- ``debug``: DEBUG on, each record made and handed to a handler that drops it.

``off - stripped`` is what logging costs a hit when nobody listens.
Run alone: ``python benchmarks/bench_logging.py [--quick]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
from typing import Any

from bench_compile import SOURCE_1KB
from bench_storage import _timed_calls

#: ``debug_enabled`` for the hit path that never logs, at builtin speed.
_NEVER = frozenset().__contains__


def bench_hit_logging(n: int = 5000, rounds: int = 7) -> dict[str, float]:
    """Median microseconds of a cache hit in each setting (see the module doc)."""
    from cuforge import Program, ProgramOptions
    from cuforge.compile.cache import _steps, _tracking
    from cuforge.storage import FileStreamProgramCache

    logger = logging.getLogger("cuforge")
    real = _steps.debug_enabled
    opts = ProgramOptions(arch="sm_90")
    samples: dict[str, list[float]] = {"off": [], "stripped": [], "debug": []}
    drop = logging.NullHandler()
    with FileStreamProgramCache(tempfile.mkdtemp(prefix="bench-log-")) as cache:
        Program(SOURCE_1KB, "c++", options=opts).compile("cubin", cache=cache)

        def hit() -> Any:
            return Program(SOURCE_1KB, "c++", options=opts).compile("cubin", cache=cache)

        _timed_calls(hit, 1000)
        try:
            for _ in range(rounds):
                for setting in samples:
                    if setting == "stripped":
                        _steps.debug_enabled = _tracking.debug_enabled = _NEVER
                    elif setting == "debug":
                        logger.setLevel(logging.DEBUG)
                        logger.addHandler(drop)
                    try:
                        samples[setting] += _timed_calls(hit, n)
                    finally:
                        _steps.debug_enabled = _tracking.debug_enabled = real
                        logger.setLevel(logging.NOTSET)
                        logger.removeHandler(drop)
        finally:
            _steps.debug_enabled = _tracking.debug_enabled = real
    return {k: statistics.median(v) * 1e6 for k, v in samples.items()}


def level_check_ns(n: int = 1_000_000) -> float:
    """Nanoseconds of one ``isEnabledFor(DEBUG)`` on a cuforge logger with DEBUG off."""
    import timeit

    check = logging.getLogger("cuforge.cache").isEnabledFor
    return min(timeit.repeat(lambda: check(logging.DEBUG), number=n, repeat=5)) / n * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    got = bench_hit_logging(*((1000, 3) if args.quick else (5000, 7)))
    cost = got["off"] - got["stripped"]
    print(f"hit, logging as shipped (DEBUG off)   {got['off']:.2f} us")
    print(f"hit, no logging code (checks removed) {got['stripped']:.2f} us")
    print(f"  difference                          {cost * 1e3:+.0f} ns ({cost / got['off']:+.1%})")
    print(f"hit, DEBUG on (records dropped)       {got['debug']:.2f} us")
    print(f"one level check                       {level_check_ns():.0f} ns")


if __name__ == "__main__":
    main()
