"""Programmatic dependent launch (PDL) in launches and graphs, and graphs launched
from the device, tested on the GPU (sm_90+).

Behaviours cuda.core's builder and device-launch suites check (see
``tests/graph_coverage.md``; no upstream code or text): a captured PDL launch is a
programmatic graph edge and computes the right result; a PDL secondary really
starts while its primary still runs (on a stream, captured, and as explicit kernel
nodes) and never does without the flag; a kernel linked with libcudadevrt launches
a device-launchable graph, once and repeatedly.
"""

from __future__ import annotations

import os

import pytest

from test_graph_common import (  # noqa: F401 - no_leftover_bundles is an autouse fixture
    cfg,
    expect_raises,
    kernels,
    no_leftover_bundles,
    read_ints,
    setup_device,
    write_ints,
)

pytestmark = pytest.mark.gpu

PDL_KERNELS = r"""
// flags[0]: the secondary has started; flags[1]: the primary saw that while running.
extern "C" __global__ void pdl_primary(int *flags, long long wait_ns) {
    asm volatile("griddepcontrol.launch_dependents;");
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        unsigned long long t0, t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
        do {
            if (atomicAdd(&flags[0], 0) != 0) {
                atomicExch(&flags[1], 1);
                return;
            }
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        } while (t - t0 < (unsigned long long)wait_ns);
    }
}

extern "C" __global__ void pdl_secondary(int *flags) {
    if (threadIdx.x == 0 && blockIdx.x == 0) atomicExch(&flags[0], 1);
}

// Waits for the kernel it depends on programmatically before reading its result.
extern "C" __global__ void pdl_add_one(int *a) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0 && blockIdx.x == 0) a[0] += 1;
}
"""

LAUNCHER = r"""
extern "C" __global__ void launch_graph(cudaGraphExec_t graph) {
    if (threadIdx.x == 0 && blockIdx.x == 0) cudaGraphLaunch(graph, cudaStreamGraphTailLaunch);
}
"""

WAIT_NS = 50_000_000  # how long a primary looks for its secondary


@pytest.fixture
def dev():
    d = setup_device()
    if d.compute_capability < (9, 0):
        pytest.skip("programmatic dependent launch and these device launches need sm_90+")
    return d


@pytest.fixture
def pdl(dev):
    from cuforge import Program, ProgramOptions

    code = Program(PDL_KERNELS, "c++", ProgramOptions(arch=f"sm_{dev.arch}")).compile("cubin")
    return {n: code.get_kernel(n) for n in ("pdl_primary", "pdl_secondary", "pdl_add_one")}


def _pdl_config():
    from cuforge import LaunchConfig

    return LaunchConfig(grid=1, block=32, programmatic_stream_serialization=True)


def _edges_with_data(handle):
    """(from, to, edge data) of every edge of a graph, from the driver."""
    from cuforge._cuda import driver
    from cuforge.runtime.errors import check

    count = check(driver.cuGraphGetEdges(handle, 0))[-1]
    src, dst, data, count = check(driver.cuGraphGetEdges(handle, count))
    return list(zip(list(src)[:count], list(dst)[:count], list(data)[:count], strict=True))


def _is_programmatic(edge_data) -> bool:
    from cuforge._cuda import driver

    return (
        edge_data.type == driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        and edge_data.from_port == driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
    )


def test_captured_pdl_launch_is_a_programmatic_edge_and_computes_right(dev, pdl) -> None:
    from cuforge import launch
    from cuforge.graph import KernelNode

    s = dev.create_stream()
    c = dev.allocate(4)
    write_ints(c, [0])
    gb = s.create_graph_builder().begin_building()
    launch(gb, cfg(), kernels()["add_one"], c, 1)
    launch(gb, _pdl_config(), pdl["pdl_add_one"], c)
    gb.end_building()
    d = gb.graph_definition
    ((_, _, data),) = _edges_with_data(d.handle)
    assert _is_programmatic(data)
    ((first, second),) = d.edges()  # cuforge's own queries read such edges too
    assert isinstance(second, KernelNode) and second.pred == (first,)
    assert second.config.programmatic_stream_serialization is True
    assert first.config.programmatic_stream_serialization is False
    exe = gb.complete()
    for _ in range(3):
        exe.launch(s)
    s.sync()
    assert read_ints(c, 1)[0] == 6
    exe.close()
    gb.close()


def test_pdl_kernel_nodes_depend_programmatically_on_kernels_only(dev, pdl) -> None:
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    c = dev.allocate(4)
    write_ints(c, [0])
    g = GraphDefinition()
    producer = g.memset(c, 0, 4).launch(cfg(), kernels()["add_one"], c, 1)
    consumer = producer.launch(_pdl_config(), pdl["pdl_add_one"], c)
    other = dev.allocate(4)
    after_memset = g.memset(other, 0, 4).launch(_pdl_config(), pdl["pdl_add_one"], other)
    root = g.launch(_pdl_config(), pdl["pdl_add_one"], dev.allocate(4))
    kinds = {(int(a), int(b)): _is_programmatic(e) for a, b, e in _edges_with_data(g.handle)}
    assert kinds[(producer._h, consumer._h)] is True
    assert sum(kinds.values()) == 1  # memset -> kernel edges stay ordinary
    assert consumer.config == _pdl_config()
    # Where there is no kernel before it, the flag has nothing to act on.
    assert after_memset.config.programmatic_stream_serialization is False
    assert root.config.programmatic_stream_serialization is False

    # Updates keep edges: a config contradicting them is refused, a matching one taken.
    expect_raises(ValueError, consumer.update, cfg(grid=1, block=32), pdl["pdl_add_one"], c)
    consumer.update(_pdl_config(), pdl["pdl_add_one"], c)
    exe = g.instantiate()
    expect_raises(ValueError, exe[consumer].update, cfg(grid=1, block=32), pdl["pdl_add_one"], c)
    exe[consumer].update(_pdl_config(), pdl["pdl_add_one"], c)
    exe.launch(s)
    s.sync()
    assert read_ints(c, 1)[0] == 2  # add_one, then the PDL kernel after it
    assert read_ints(other, 1)[0] == 1
    exe.close()
    g.close()


def _run_pair(dev, pdl, how: str, programmatic: bool) -> int:
    """Primary then secondary on one stream, ``how``: "stream", "capture" or "nodes";
    1 if the primary saw the secondary start while it was still running."""
    from cuforge import LaunchConfig, launch
    from cuforge.graph import GraphDefinition

    s = dev.create_stream()
    flags = dev.allocate(8)
    write_ints(flags, [0, 0])
    first = LaunchConfig(grid=1, block=32)
    second = _pdl_config() if programmatic else LaunchConfig(grid=1, block=32)
    p, q = pdl["pdl_primary"], pdl["pdl_secondary"]
    if how == "stream":
        launch(s, first, p, flags, WAIT_NS)
        launch(s, second, q, flags)
        s.sync()
    else:
        if how == "capture":
            gb = s.create_graph_builder().begin_building()
            launch(gb, first, p, flags, WAIT_NS)
            launch(gb, second, q, flags)
            exe = gb.end_building().complete()
            gb.close()
        else:
            g = GraphDefinition()
            g.launch(first, p, flags, WAIT_NS).launch(second, q, flags)
            exe = g.instantiate()
            g.close()
        exe.launch(s)
        s.sync()
        exe.close()
    started, overlapped = read_ints(flags, 2)
    assert started == 1
    flags.close()
    s.close()
    return int(overlapped)


@pytest.mark.parametrize("how", ["stream", "capture", "nodes"])
def test_pdl_secondary_starts_while_its_primary_runs(dev, pdl, how) -> None:
    if os.environ.get("CUFORGE_SANITIZE") == "1":  # set by SANITIZE=1 scripts/gpu-test
        pytest.skip("compute-sanitizer memcheck runs kernels one at a time: no overlap to see")
    assert _run_pair(dev, pdl, how, programmatic=False) == 0
    # The driver does not promise to overlap: on an idle GPU it does at once; a few
    # tries tolerate a busy one.
    assert any(_run_pair(dev, pdl, how, programmatic=True) for _ in range(5))


def _find_cudadevrt() -> str | None:
    """libcudadevrt.a: through cuda.pathfinder where it can, else the usual places."""
    import glob
    import os
    import site

    try:
        from cuda import pathfinder

        return pathfinder.find_static_lib("cudadevrt")
    except Exception:  # an older pathfinder without static libraries, or not found
        pass
    roots = [os.path.join(p, "nvidia") for p in site.getsitepackages()]
    roots += [os.environ.get("CUDA_HOME", "/usr/local/cuda")]
    for root in roots:
        found = sorted(glob.glob(os.path.join(root, "**", "libcudadevrt.a"), recursive=True))
        if found:
            return found[0]
    return None


@pytest.fixture
def launcher(dev):
    """A kernel that tail-launches a graph from the device, linked with libcudadevrt."""
    from cuforge import Linker, LinkerOptions, ObjectCode, Program, ProgramOptions
    from cuforge.compile import ToolkitNotFoundError

    devrt = _find_cudadevrt()
    if devrt is None:
        pytest.skip("libcudadevrt.a not found (cuda.pathfinder, the nvidia wheels, CUDA_HOME)")
    arch = f"sm_{dev.arch}"
    opts = ProgramOptions(arch=arch, relocatable_device_code=True)
    ptx = Program(LAUNCHER, "c++", opts).compile("ptx")
    try:
        linker = Linker(ptx, ObjectCode.from_library(devrt), options=LinkerOptions(arch=arch))
        cubin = linker.link("cubin")
    except ToolkitNotFoundError as exc:  # e.g. gpu-test --cu12 carries no nvJitLink 12
        pytest.skip(f"no nvJitLink of the bindings' major to link libcudadevrt: {exc}")
    return cubin.get_kernel("launch_graph")


@pytest.mark.parametrize("launches", [1, 5])
def test_a_kernel_launches_a_device_graph(dev, launcher, launches) -> None:
    from cuforge import launch
    from cuforge.graph import GraphCompleteOptions, GraphDefinition

    s = dev.create_stream()
    c = dev.allocate(4)
    write_ints(c, [0])
    gb = dev.create_graph_builder().begin_building()
    launch(gb, cfg(), kernels()["add_one"], c, 1)
    inner = gb.end_building().complete(GraphCompleteOptions(device_launch=True, upload_stream=s))
    gb.close()
    s.sync()
    outer_def = GraphDefinition()
    outer_def.launch(cfg(), launcher, int(inner.handle))
    outer = outer_def.instantiate()
    outer_def.close()
    for _ in range(launches):
        outer.launch(s)
    s.sync()
    assert read_ints(c, 1)[0] == launches
    outer.close()  # before the graph it launches: the kernel holds only its handle
    inner.close()
