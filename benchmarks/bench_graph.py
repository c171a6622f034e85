"""Build, instantiate, launch(+sync) and destroy kernel-node graphs: cuforge vs cuda.core.

Run on a GPU machine: ``python benchmarks/bench_graph.py [--nodes 1,10,1000] [--rounds 40]``.
For each graph size, each round times every phase once for each library; the library
that goes first alternates from round to round, so drift in clocks or host load and
any advantage of going first or second hit both alike. Objects made in a round are
kept until its timings are taken, so no phase pays for destroying the previous
round's graph (that cost is the separate ``destroy`` phase). Prints medians and
cuforge's time as a ratio of cuda.core's (<= 1.0x is the target). The cuda.core
column is skipped, with a note, when it cannot run. ``--rounds`` is for the largest
size; smaller graphs get proportionally more rounds (up to 10x), as their phases
are short and noisier.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

SRC = r"""
extern "C" __global__ void add_one(int *a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) a[i] += 1;
}
"""
PHASES = ("build", "instantiate", "launch+sync", "destroy")


class Subject:
    """One library's graph workload, timed one phase at a time."""

    def __init__(self, mod: Any, gdef_cls: Any, dev: Any, n: int) -> None:
        dev.set_current()
        self.dev = dev
        arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
        code = mod.Program(SRC, "c++", mod.ProgramOptions(arch=arch)).compile("cubin")
        self.kernel = code.get_kernel("add_one")
        self.stream = dev.create_stream()
        self.buf = dev.allocate(4, stream=self.stream)
        self.stream.sync()
        self.config = mod.LaunchConfig(grid=1, block=1)
        self.gdef_cls = gdef_cls
        self.n = n
        self.samples: dict[str, list[float]] = {p: [] for p in PHASES}
        self._close(*self._round())  # warm-up: argument plans, kernel handles, pools

    def _build(self) -> Any:
        g = self.gdef_cls()
        config, kernel, buf = self.config, self.kernel, self.buf
        node = g.launch(config, kernel, buf, 1)
        for _ in range(self.n - 1):
            node = node.launch(config, kernel, buf, 1)
        return g

    def _round(self) -> tuple[list[Any], dict[str, float]]:
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        g = self._build()
        t1 = time.perf_counter()
        exe = g.instantiate()
        t2 = time.perf_counter()
        exe.launch(self.stream)  # first launch uploads; time the steady state
        self.stream.sync()
        t3 = time.perf_counter()
        exe.launch(self.stream)
        self.stream.sync()
        t4 = time.perf_counter()
        t["build"], t["instantiate"], t["launch+sync"] = t1 - t0, t2 - t1, t4 - t3
        return [g, exe], t

    def _close(self, objs: list[Any], t: dict[str, float]) -> float:
        """Destroy the round's exec and definition; ``objs`` holds the only references,
        so both libraries' objects die inside the timed region."""
        t0 = time.perf_counter()
        g, exe = objs
        exe.close()
        # cuda.core's GraphDefinition has no close(): dropping it destroys the graph.
        getattr(g, "close", lambda: None)()
        del g, exe
        objs.clear()
        return time.perf_counter() - t0

    def run_round(self, collect: bool = True) -> None:
        self.dev.set_current()
        if collect:
            gc.collect()
        objs, t = self._round()
        t["destroy"] = self._close(objs, t)
        for phase, seconds in t.items():
            self.samples[phase].append(seconds * 1e3)

    def medians(self) -> dict[str, float]:
        return {p: statistics.median(v) for p, v in self.samples.items()}


def compare(nodes: int, rounds: int, collect: bool = True) -> None:
    """Time both libraries on ``nodes``-node graphs and print one table."""
    import cuforge
    from cuforge.graph import GraphDefinition

    subjects = {"cuforge": Subject(cuforge, GraphDefinition, cuforge.Device(0), nodes)}
    note = ""
    try:
        import cuda.core as cc
        from cuda.core.graph import GraphDefinition as CCGraphDefinition

        subjects["cuda.core"] = Subject(cc, CCGraphDefinition, cc.Device(0), nodes)
        note = f"cuda.core {getattr(cc, '__version__', '?')}"
    except Exception as exc:  # the peer is optional: report why its column is empty
        note = f"cuda.core column skipped: {type(exc).__name__}: {exc}"

    order = list(subjects.values())
    if not collect:
        gc.collect()
        gc.disable()
    try:
        for _ in range(rounds):
            for s in order:
                s.run_round(collect)
            order.reverse()
    finally:
        gc.enable()

    ours = subjects["cuforge"].medians()
    theirs = subjects["cuda.core"].medians() if "cuda.core" in subjects else None
    how = "gc.collect() before each round" if collect else "no collection between rounds"
    print(f"{nodes}-kernel-node graph, median of {rounds} rounds (us), {how}; {note}")
    print(f"{'phase':<14}{'cuforge':>10}{'cuda.core':>12}{'ratio':>8}")
    for phase, ms in ours.items():
        us = ms * 1e3
        if theirs:
            them = theirs[phase] * 1e3
            print(f"{phase:<14}{us:>10.1f}{them:>12.1f}{ms / theirs[phase]:>7.2f}x")
        else:
            print(f"{phase:<14}{us:>10.1f}{'-':>12}{'-':>8}")
    print(flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", default="1,10,1000", help="comma-separated graph sizes")
    ap.add_argument("--rounds", type=int, default=40, help="rounds for the largest size")
    ap.add_argument(
        "--no-collect",
        action="store_true",
        help="no gc.collect() before each round (garbage collection off while timing): "
        "warm caches, unlike the default, where every round starts after a full collection",
    )
    args = ap.parse_args()
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    largest = max(sizes)
    for n in sizes:
        rounds = args.rounds * min(10, max(1, largest // max(n, 1) // 10 or 1))
        compare(n, rounds, collect=not args.no_collect)


if __name__ == "__main__":
    main()
