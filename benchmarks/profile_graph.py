"""Where the time of a small graph goes: driver floors, cuforge step by step, cProfile.

Run on a GPU machine: ``python benchmarks/profile_graph.py [--nodes 1,10] [--reps 300]``.

1. *Driver floor*: the driver calls each phase needs, made through cuda.bindings
   (median microseconds per call), so a phase's time can be split into driver work
   and cuforge's own Python work; then the same graph with and without the one user
   object that keeps its owners alive (the driver's cost of the lifetime guarantee).
2. *Steps*: cuforge's phases cut into their steps, each timed on its own (medians).
3. *cProfile*: the top functions by own time for each phase of cuforge, over many
   repetitions (profiling inflates Python time; read it for proportions).
Launch breakdown: the steps of ``cuforge.launch`` for the 4-argument kernel.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import itertools
import pstats
import statistics
import time
from collections.abc import Callable
from typing import Any

SRC = r"""
extern "C" __global__ void add_one(int *a, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) a[i] += 1;
}
extern "C" __global__ void four(const float* x, float* y, int n, float a) {}
"""


def med_us(fn: Callable[[], Any], reps: int, setup: Callable[[], Any] | None = None) -> float:
    """Median microseconds of ``fn(setup())`` (or ``fn()``) over ``reps`` runs."""
    out = []
    for _ in range(reps):
        arg = setup() if setup is not None else None
        t0 = time.perf_counter_ns()
        fn(arg) if setup is not None else fn()
        out.append(time.perf_counter_ns() - t0)
    return statistics.median(out) / 1e3


def driver_floor(kernel: Any, buf: Any, stream: Any, reps: int) -> None:
    from cuda.bindings import driver

    from cuforge.graph import _owners
    from cuforge.runtime.args import pack_args

    ok = driver.CUresult.CUDA_SUCCESS
    ctx = driver.cuCtxGetCurrent()[1]
    packed = pack_args((buf, 1))
    func = kernel.function()

    def params(use_kernel: bool) -> Any:
        p = driver.CUDA_KERNEL_NODE_PARAMS()
        p.gridDimX = p.gridDimY = p.gridDimZ = 1
        p.blockDimX = p.blockDimY = p.blockDimZ = 1
        p.kernelParams = packed.params
        if use_kernel:
            p.kern = kernel.handle
            p.ctx = ctx
        else:
            p.func = func
        return p

    pk, pf = params(True), params(False)
    rows: list[tuple[str, float]] = []
    rows.append(
        (
            "cuGraphCreate+Destroy",
            med_us(lambda: driver.cuGraphDestroy(driver.cuGraphCreate(0)[1]), reps),
        )
    )

    def add_node(p: Any) -> Callable[[Any], Any]:
        return lambda g: driver.cuGraphAddKernelNode(g, None, 0, p)

    graphs: list[Any] = []

    def new_graph() -> Any:
        g = driver.cuGraphCreate(0)[1]
        graphs.append(g)
        return g

    rows.append(
        ("cuGraphAddKernelNode (CUkernel+ctx), 1st in graph", med_us(add_node(pk), reps, new_graph))
    )
    rows.append(
        ("cuGraphAddKernelNode (CUfunction), 1st in graph", med_us(add_node(pf), reps, new_graph))
    )
    g = new_graph()
    rows.append(
        (
            "cuGraphAddKernelNode (CUkernel+ctx), later",
            med_us(lambda: driver.cuGraphAddKernelNode(g, None, 0, pk), reps),
        )
    )
    rows.append(
        (
            "cuGraphAddKernelNode (CUfunction), later",
            med_us(lambda: driver.cuGraphAddKernelNode(g, None, 0, pf), reps),
        )
    )
    for x in graphs:
        driver.cuGraphDestroy(x)
    graphs.clear()

    def one_node_graph(p: Any) -> Any:
        g = new_graph()
        assert driver.cuGraphAddKernelNode(g, None, 0, p)[0] == ok
        return g

    execs: list[Any] = []

    def inst(g: Any) -> None:
        execs.append(driver.cuGraphInstantiate(g, 0)[1])

    rows.append(
        ("cuGraphInstantiate 1 node (CUkernel)", med_us(inst, reps, lambda: one_node_graph(pk)))
    )
    rows.append(
        ("cuGraphInstantiate 1 node (CUfunction)", med_us(inst, reps, lambda: one_node_graph(pf)))
    )
    e = execs[-1]
    rows.append(
        (
            "cuGraphLaunch+cuStreamSynchronize",
            med_us(
                lambda: (
                    driver.cuGraphLaunch(e, stream.handle),
                    driver.cuStreamSynchronize(stream.handle),
                ),
                reps,
            ),
        )
    )
    it = iter(execs)
    rows.append(
        (
            "cuGraphExecDestroy 1 node",
            med_us(lambda _x: driver.cuGraphExecDestroy(next(it)), len(execs) // 2, lambda: None),
        )
    )
    it2 = iter(graphs)
    rows.append(
        (
            "cuGraphDestroy 1 node",
            med_us(lambda _x: driver.cuGraphDestroy(next(it2)), len(graphs) // 2, lambda: None),
        )
    )
    for x in execs[len(execs) // 2 :]:
        driver.cuGraphExecDestroy(x)
    for x in graphs[len(graphs) // 2 :]:
        driver.cuGraphDestroy(x)

    # User objects: what cuforge adds per graph.
    uo_graphs = [driver.cuGraphCreate(0)[1] for _ in range(reps)]
    made: list[Any] = []
    rows.append(
        (
            "cuUserObjectCreate (cuforge destructor)",
            med_us(lambda: made.append(_owners.create_user_object(())[1]), reps),
        )
    )
    itg, itu = iter(uo_graphs), iter(made)
    move = driver.CUuserObjectRetain_flags.CU_GRAPH_USER_OBJECT_MOVE
    rows.append(
        (
            "cuGraphRetainUserObject (MOVE)",
            med_us(lambda: driver.cuGraphRetainUserObject(next(itg), next(itu), 1, move), reps),
        )
    )
    t0 = time.perf_counter_ns()
    for x in uo_graphs:
        driver.cuGraphDestroy(x)
    rows.append(("cuGraphDestroy with 1 user object", (time.perf_counter_ns() - t0) / 1e3 / reps))
    _owners.wait_until(lambda: False, 0.2)
    print("== driver floor through cuda.bindings (median us per call)")
    for name, us in rows:
        print(f"  {name:<52}{us:8.2f}")


def user_object_cost(kernel: Any, buf: Any, stream: Any, nodes: list[int], reps: int) -> None:
    """The driver's price of the one user object a lifetime-safe graph holds.

    The same chain of ``n`` kernel nodes is built through cuda.bindings with and
    without cuforge's owner bundle attached (``_owners.attach``), then instantiated,
    launched twice (the second launch+sync is timed) and its exec destroyed while
    warm. The difference between the two rows is driver work cuforge cannot skip
    without giving up the guarantee that owners outlive in-flight launches.
    """
    from cuda.bindings import driver

    from cuforge.graph import _owners
    from cuforge.runtime.args import pack_args

    p = driver.CUDA_KERNEL_NODE_PARAMS()
    p.gridDimX = p.gridDimY = p.gridDimZ = 1
    p.blockDimX = p.blockDimY = p.blockDimZ = 1
    packed = pack_args((buf, 1))  # kept alive: the nodes copy params from its buffer
    p.kernelParams = packed.params
    p.func = kernel.function()
    h = stream.handle

    def timed(fn: Callable[[], Any]) -> tuple[Any, int]:
        t0 = time.perf_counter_ns()
        out = fn()
        return out, time.perf_counter_ns() - t0

    print("== a user object's driver cost (median us; cuda.bindings calls)")
    print(
        "  "
        + " ".join(
            f"{c:>12}"
            for c in ("nodes", "user object", "instantiate", "launch+sync", "exec destroy")
        )
    )
    for n in nodes:
        for with_uo in (False, True):
            inst: list[int] = []
            run: list[int] = []
            dest: list[int] = []
            for _ in range(reps):
                g = driver.cuGraphCreate(0)[1]
                prev: list[Any] = []
                for _ in range(n):
                    prev = [driver.cuGraphAddKernelNode(g, prev, len(prev), p)[1]]
                if with_uo:
                    _owners.attach(int(g), (buf,))
                x, t = timed(lambda g=g: driver.cuGraphInstantiate(g, 0)[1])
                inst.append(t)
                driver.cuGraphLaunch(x, h)
                driver.cuStreamSynchronize(h)
                _, t = timed(
                    lambda x=x: (driver.cuGraphLaunch(x, h), driver.cuStreamSynchronize(h))
                )
                run.append(t)
                _, t = timed(lambda x=x: driver.cuGraphExecDestroy(x))
                dest.append(t)
                driver.cuGraphDestroy(g)
            _owners.wait_until(lambda: _owners.live_bundles() == 0, 2.0)
            cells = (statistics.median(v) / 1e3 for v in (inst, run, dest))
            print(
                f"  {n:>12} {'yes' if with_uo else 'no':>12} "
                + " ".join(f"{c:12.2f}" for c in cells)
            )


def steps(kernel: Any, buf: Any, stream: Any, n: int, reps: int) -> None:
    import cuforge
    from cuforge.graph import GraphDefinition, _owners
    from cuforge.graph._exec import Graph

    config = cuforge.LaunchConfig(grid=1, block=1)

    def build() -> Any:
        g = GraphDefinition()
        node = g.launch(config, kernel, buf, 1)
        for _ in range(n - 1):
            node = node.launch(config, kernel, buf, 1)
        return g

    keep: list[Any] = []
    rows = [
        ("GraphDefinition()", med_us(lambda: keep.append(GraphDefinition()), reps)),
        (f"build {n} node(s)", med_us(lambda: keep.append(build()), reps)),
    ]
    rows.append(
        (
            "state.flush() (bundles -> 1 user object)",
            med_us(lambda g: g._state.flush(), reps, build),
        )
    )
    rows.append(("instantiate", med_us(lambda g: keep.append(g.instantiate()), reps, build)))
    rows.append(
        (
            "Graph._instantiate minus flush",
            med_us(
                lambda g: keep.append(Graph._instantiate(g._state, None)),
                reps,
                lambda: (lambda g: (g._state.flush(), g)[1])(build()),
            ),
        )
    )
    pairs = [(g, g.instantiate()) for g in (build() for _ in range(reps))]
    for _g, e in pairs:
        e.launch(stream)
    stream.sync()
    e = pairs[0][1]
    rows.append(("launch+sync", med_us(lambda: (e.launch(stream), stream.sync()), reps)))
    it = iter(pairs)
    rows.append(("exec close", med_us(lambda _x: next(it)[1].close(), reps, lambda: None)))
    it = iter(pairs)
    rows.append(("definition close", med_us(lambda _x: next(it)[0].close(), reps, lambda: None)))
    keep.clear()
    pairs.clear()
    gc.collect()
    rows.append(("drain of released bundles", med_us(_owners.drain, 50)))
    _owners.wait_until(lambda: False, 0.2)
    print(f"== cuforge steps, {n}-node graph (median us)")
    for name, us in rows:
        print(f"  {name:<52}{us:8.2f}")


def profile_phases(kernel: Any, buf: Any, stream: Any, n: int, reps: int) -> None:
    import cuforge
    from cuforge.graph import GraphDefinition

    config = cuforge.LaunchConfig(grid=1, block=1)
    profs = {p: cProfile.Profile() for p in ("build", "instantiate", "launch", "destroy")}
    for _ in range(reps):
        pr = profs["build"]
        pr.enable()
        g = GraphDefinition()
        node = g.launch(config, kernel, buf, 1)
        for _ in range(n - 1):
            node = node.launch(config, kernel, buf, 1)
        pr.disable()
        profs["instantiate"].enable()
        e = g.instantiate()
        profs["instantiate"].disable()
        e.launch(stream)
        stream.sync()
        profs["launch"].enable()
        e.launch(stream)
        stream.sync()
        profs["launch"].disable()
        profs["destroy"].enable()
        e.close()
        g.close()
        del e, g, node
        profs["destroy"].disable()
    for phase, pr in profs.items():
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
        body = [ln for ln in s.getvalue().splitlines() if ln.strip()]
        print(f"== cProfile {phase}, {n}-node graph, {reps} reps (top by own time)")
        for ln in body[2:16]:
            print("  " + ln[:150])


def cold_steps(n: int, reps: int) -> None:
    """Each step of a round run right after gc.collect() (as bench_graph does), for
    both libraries: where the cold-cache time goes."""
    import cuforge
    from cuforge.graph import GraphDefinition

    libs: dict[str, tuple[Any, Any, Any]] = {"cuforge": (cuforge, GraphDefinition, None)}
    try:
        import cuda.core as cc
        from cuda.core.graph import GraphDefinition as CCG

        libs["cuda.core"] = (cc, CCG, None)
    except Exception as exc:
        print(f"cuda.core skipped: {exc}")
    setups = {}
    for name, (mod, gcls, _) in libs.items():
        dev = mod.Device(0)
        dev.set_current()
        code = mod.Program(SRC, "c++", mod.ProgramOptions(arch="sm_" + "".join(
            str(x) for x in dev.compute_capability))).compile("cubin")  # fmt: skip
        k = code.get_kernel("add_one")
        s = dev.create_stream()
        buf = dev.allocate(4, stream=s)
        s.sync()
        setups[name] = (dev, gcls, k, s, buf, mod.LaunchConfig(grid=1, block=1))
    labels = ("create", "1st node", "other nodes", "instantiate", "launch+sync", "exec close",
              "def close", "next bytecodes")  # fmt: skip
    samples: dict[str, list[list[int]]] = {name: [] for name in setups}
    order = list(setups)
    for _ in range(reps):
        for name in order:
            dev, gcls, k, s, buf, cfg = setups[name]
            dev.set_current()
            gc.collect()
            t = [time.perf_counter_ns()]
            g = gcls()
            t.append(time.perf_counter_ns())
            node = g.launch(cfg, k, buf, 1)
            t.append(time.perf_counter_ns())
            for _ in range(n - 1):
                node = node.launch(cfg, k, buf, 1)
            t.append(time.perf_counter_ns())
            e = g.instantiate()
            t.append(time.perf_counter_ns())
            e.launch(s)
            s.sync()
            t0 = time.perf_counter_ns()
            e.launch(s)
            s.sync()
            t.append(t[-1] + time.perf_counter_ns() - t0)
            e.close()
            t.append(time.perf_counter_ns())
            getattr(g, "close", lambda: None)()
            del g, node, e
            t.append(time.perf_counter_ns())
            sum(range(10))  # pending calls (bundle releases) run at bytecode boundaries
            t.append(time.perf_counter_ns())
            samples[name].append([b - a for a, b in itertools.pairwise(t)])
        order.reverse()
    print(f"== cold steps after gc.collect(), {n}-node graph, median us of {reps}")
    print("  " + f"{'step':<16}" + "".join(f"{name:>12}" for name in samples))
    for i, label in enumerate(labels):
        row = [statistics.median(x[i] for x in samples[name]) / 1e3 for name in samples]
        print("  " + f"{label:<16}" + "".join(f"{v:12.2f}" for v in row))


def launch_breakdown(reps: int) -> None:
    import importlib

    import numpy as np

    import cuforge

    L = importlib.import_module("cuforge.runtime.launch")
    from cuforge.runtime.args import plan_for

    dev = cuforge.Device(0)
    arch = "sm_" + dev.arch
    code = cuforge.Program(SRC, "c++", cuforge.ProgramOptions(arch=arch)).compile("cubin")
    k4 = code.get_kernel("four")
    s = dev.create_stream()
    buf = dev.allocate(1024, s)
    cfg = cuforge.LaunchConfig(1, 1)
    args = (buf, buf, 256, np.float32(2.0))
    for _ in range(2000):
        cuforge.launch(s, cfg, k4, *args)
    s.sync()
    plan = plan_for(args)
    params, keep = plan.raw(args)
    entry = L._entry
    n = 20000

    def loop(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = (time.perf_counter() - t0) / n * 1e6
        s.sync()
        return dt

    rows = [
        ("cuforge.launch 4 args", loop(lambda: cuforge.launch(s, cfg, k4, *args))),
        ("plan_for(args)", loop(lambda: plan_for(args))),
        ("plan.raw(args)", loop(lambda: plan.raw(args))),
        (
            "C launch, params prepacked",
            loop(lambda: L._c_launch(entry, k4._function_int, *cfg._plain, s._handle_int, params)),
        ),
    ]
    del keep
    print("== launch breakdown (us per call)")
    for name, us in rows:
        print(f"  {name:<52}{us:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,10")
    ap.add_argument("--reps", type=int, default=300)
    a = ap.parse_args()

    import cuforge

    dev = cuforge.Device(0)
    dev.set_current()
    code = cuforge.Program(SRC, "c++", cuforge.ProgramOptions(arch="sm_" + dev.arch)).compile(
        "cubin"
    )
    kernel = code.get_kernel("add_one")
    stream = dev.create_stream()
    buf = dev.allocate(4, stream)
    stream.sync()
    driver_floor(kernel, buf, stream, a.reps)
    user_object_cost(kernel, buf, stream, [int(x) for x in a.nodes.split(",")], a.reps)
    for n in (int(x) for x in a.nodes.split(",")):
        cold_steps(n, a.reps)
        dev.set_current()
        steps(kernel, buf, stream, n, a.reps)
        profile_phases(kernel, buf, stream, n, a.reps)
    launch_breakdown(a.reps)


if __name__ == "__main__":
    main()
