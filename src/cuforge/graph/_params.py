"""Node parameters read back from the driver, and programmatic (PDL) edges.

The per-kind getters of graph nodes (``KernelNode.config``, ``MemsetNode.width``,
``AllocNode.bytesize``, ...) read what the driver holds now, so they answer the same
for the node object that made a node, for views from ``nodes()``/``pred``/``succ``,
and after definition-level updates.

A kernel added with ``LaunchConfig(programmatic_stream_serialization=True)`` after
kernel nodes depends on them through *programmatic* edges (the edge stream capture
makes for such a launch): it may start once those kernels triggered or finished.
Failure modes: driver refusals raise CUDAError.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuforge._cuda import driver
from cuforge.graph import _operands as ops
from cuforge.runtime.errors import check
from cuforge.runtime.launch import LaunchConfig

_KERNEL = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL
_PROGRAMMATIC = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC


def _is_kernel(node: driver.CUgraphNode) -> bool:
    return bool(check(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType") == _KERNEL)


def add_dependencies(state: Any, node: driver.CUgraphNode, deps: list[int]) -> None:
    """Make ``node`` depend on ``deps``: programmatic edges from kernel nodes,
    plain ones from the others (CUDAError if the driver refuses)."""
    froms, datas = [], []
    for d in deps:
        dep = driver.CUgraphNode(d)
        data = driver.CUgraphEdgeData()
        if _is_kernel(dep):
            data.type = _PROGRAMMATIC
            data.from_port = driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
        froms.append(dep)
        datas.append(data)
    check(
        driver.cuGraphAddDependencies(state.handle, froms, [node] * len(froms), datas, len(froms)),
        "cuGraphAddDependencies(programmatic)",
    )


def programmatic_in(node: driver.CUgraphNode) -> bool | None:
    """Whether ``node`` depends programmatically on its kernel predecessors: None when
    it has none (then the flag has nothing to act on)."""
    count = check(driver.cuGraphNodeGetDependencies(node, 0), "cuGraphNodeGetDependencies")[-1]
    if not count:
        return None
    res = check(driver.cuGraphNodeGetDependencies(node, count), "cuGraphNodeGetDependencies")
    deps, edges = list(res[0])[:count], list(res[1])[:count]
    kernels = [e for d, e in zip(deps, edges, strict=True) if _is_kernel(d)]
    if not kernels:
        return None
    return any(e.type == _PROGRAMMATIC for e in kernels)


def require_same_programmatic(node: driver.CUgraphNode, config: Any, what: str) -> None:
    """ValueError if ``config``'s programmatic flag contradicts ``node``'s edges, which
    an update cannot change."""
    have = programmatic_in(node)
    want = bool(getattr(config, "programmatic_stream_serialization", False))
    if have is not None and have != want:
        raise ValueError(
            f"{what}: the node's kernel predecessors are {'' if have else 'not '}programmatic "
            "dependencies (its incoming edges, made when it was added), and an update cannot "
            "change edges: add a new node with the config instead"
        )


def kernel_config(node: driver.CUgraphNode) -> LaunchConfig:
    """The node's launch configuration as the driver holds it (grid in clusters when
    the node has cluster dims)."""
    p = check(driver.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
    blocks = (int(p.gridDimX), int(p.gridDimY), int(p.gridDimZ))
    block = (int(p.blockDimX), int(p.blockDimY), int(p.blockDimZ))
    cluster, coop = ops.node_launch_attributes(node)
    if cluster == (0, 0, 0):
        grid, dims = blocks, None
    else:
        grid = (blocks[0] // cluster[0], blocks[1] // cluster[1], blocks[2] // cluster[2])
        dims = cluster
    return LaunchConfig(grid, block, int(p.sharedMemBytes), dims, coop, bool(programmatic_in(node)))


def field(read: Callable[[driver.CUgraphNode], tuple[Any, ...]], index: int, doc: str) -> Any:
    """A node property answering ``read(node)[index]`` (ValueError once the node was
    destroyed or its graph closed)."""

    def get(self: Any) -> Any:
        self._check_live()
        return read(self._handle)[index]

    return property(get, doc=doc)


def memset_fields(node: driver.CUgraphNode) -> tuple[int, ...]:
    """(dptr, value, element_size, width in elements, height, pitch in bytes)."""
    p = check(driver.cuGraphMemsetNodeGetParams(node), "cuGraphMemsetNodeGetParams")
    return (
        int(p.dst), int(p.value), int(p.elementSize), int(p.width), int(p.height), int(p.pitch)
    )  # fmt: skip


def memcpy_fields(node: driver.CUgraphNode) -> tuple[int, int, int]:
    """(dst, src, size) of a 1-D copy."""
    p = check(driver.cuGraphMemcpyNodeGetParams(node), "cuGraphMemcpyNodeGetParams")
    return int(p.dstDevice), int(p.srcDevice), int(p.WidthInBytes)


def alloc_fields(node: driver.CUgraphNode) -> tuple[int, int, int]:
    """(dptr, bytesize, device ordinal) of a graph allocation."""
    p = check(driver.cuGraphMemAllocNodeGetParams(node), "cuGraphMemAllocNodeGetParams")
    return int(p.dptr), int(p.bytesize), int(p.poolProps.location.id)


def free_fields(node: driver.CUgraphNode) -> tuple[int]:
    """(dptr,) of a graph free."""
    return (int(check(driver.cuGraphMemFreeNodeGetParams(node), "cuGraphMemFreeNodeGetParams")),)


def launch_fields(node: driver.CUgraphNode) -> tuple[Any, ...]:
    """(grid, block, shmem_size) of the node's config."""
    c = kernel_config(node)
    return c.grid, c.block, c.shmem_size


def child_graph(node: driver.CUgraphNode) -> int:
    """The address of the graph a child node embeds (owned by the node)."""
    g = check(driver.cuGraphChildGraphNodeGetGraph(node), "cuGraphChildGraphNodeGetGraph")
    return int(g)
