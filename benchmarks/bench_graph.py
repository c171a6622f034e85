"""Build + instantiate + launch(+sync) of a 1,000-kernel-node graph: cuforge vs cuda.core.

Run on a GPU machine: ``python benchmarks/bench_graph.py [--nodes 1000] [--reps 20]``.
Prints the median of each phase for both libraries and cuforge's time as a ratio of
cuda.core's (<= 1.0x is the target). The cuda.core column is skipped, with a note,
when cuda.core (or its explicit graph API) cannot be imported.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

SRC = r"""
extern "C" __global__ void add_one(int *a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) a[i] += 1;
}
"""


def _time(fn: Callable[[], Any], reps: int) -> tuple[float, Any]:
    samples, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3, out


def _phases(mod: Any, gdef_cls: Any, dev: Any, n: int, reps: int) -> dict[str, float]:
    arch = "sm_" + "".join(str(x) for x in dev.compute_capability)
    code = mod.Program(SRC, "c++", mod.ProgramOptions(arch=arch)).compile("cubin")
    kernel = code.get_kernel("add_one")
    stream = dev.create_stream()
    buf = dev.allocate(4, stream=stream)
    stream.sync()
    config = mod.LaunchConfig(grid=1, block=1)

    def build() -> Any:
        g = gdef_cls()
        node = g.launch(config, kernel, buf, 1)
        for _ in range(n - 1):
            node = node.launch(config, kernel, buf, 1)
        return g

    build()  # warm caches (argument plans, kernel handles)
    t_build, g = _time(build, reps)
    t_inst, exe = _time(g.instantiate, reps)
    exe.launch(stream)
    stream.sync()

    def run() -> None:
        exe.launch(stream)
        stream.sync()

    t_launch, _ = _time(run, reps)
    return {"build": t_build, "instantiate": t_inst, "launch+sync": t_launch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()

    import cuforge
    from cuforge.graph import GraphDefinition

    dev = cuforge.Device(0)
    dev.set_current()
    ours = _phases(cuforge, GraphDefinition, dev, args.nodes, args.reps)
    theirs: dict[str, float] | None = None
    note = ""
    try:
        import cuda.core as cc
        from cuda.core.graph import GraphDefinition as CCGraphDefinition

        cdev = cc.Device(0)
        cdev.set_current()
        theirs = _phases(cc, CCGraphDefinition, cdev, args.nodes, args.reps)
        note = f"cuda.core {getattr(cc, '__version__', '?')}"
    except Exception as exc:  # the peer is optional: report why its column is empty
        note = f"cuda.core column skipped: {type(exc).__name__}: {exc}"

    print(f"{args.nodes}-kernel-node graph, median of {args.reps} (ms); {note}")
    print(f"{'phase':<14}{'cuforge':>10}{'cuda.core':>12}{'ratio':>8}")
    for phase, ms in ours.items():
        if theirs:
            print(f"{phase:<14}{ms:>10.3f}{theirs[phase]:>12.3f}{ms / theirs[phase]:>7.2f}x")
        else:
            print(f"{phase:<14}{ms:>10.3f}{'-':>12}{'-':>8}")


if __name__ == "__main__":
    main()
