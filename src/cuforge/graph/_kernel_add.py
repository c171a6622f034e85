"""Adding kernel nodes: the C fast path and the general one.

``add_kernel_node`` adds a kernel node after one dependency and records its owners
(the kernel, the arguments and their allocations) and its metadata; it returns the
node's address. The common case (a plain LaunchConfig and a cuforge Kernel) packs
the arguments and adds the node in one C call (arrays and other values C cannot
pack are packed into the graph's scratch memory first); everything else goes
through cuda.bindings, including programmatic configs, whose edges from kernel
predecessors are made programmatic (``_params.add_dependencies``).

Failure modes: wrong argument counts or types raise TypeError before the driver is
called; driver refusals raise CUDAError and then no node is added.
"""

from __future__ import annotations

import struct
from typing import Any

from cuforge._cuda import driver
from cuforge._native._launch import add_kernel_node as _c_add
from cuforge._native._launch import add_kernel_node_args as _c_add_args
from cuforge.graph import _operands as ops
from cuforge.graph import _params
from cuforge.graph._state import GraphState
from cuforge.runtime.args import plan_for
from cuforge.runtime.errors import check, error_for
from cuforge.runtime.launch import LaunchConfig, driver_entry, validate_plan
from cuforge.runtime.module import Kernel


def commit(state: GraphState, node: driver.CUgraphNode, owners: tuple[Any, ...]) -> None:
    """Record ``owners`` for a node just added; the node is removed if that fails."""
    try:
        state.add_bundle(owners)
    except BaseException:
        driver.cuGraphDestroyNode(node)
        raise


_add_entry: int | None = None  # cuGraphAddKernelNode's address; 0 when unavailable


def _resolve_add_entry() -> int:
    global _add_entry
    _add_entry = driver_entry(b"cuGraphAddKernelNode")
    return _add_entry


def add_kernel_node(
    state: GraphState, dep: int, config: Any, kernel: Any, args: tuple[Any, ...]
) -> int:
    """Add a kernel node after node address ``dep`` (0: none); its address.

    Like every CUgraph, a definition must not be modified from two threads at once
    (the scratch memory relies on that too).
    """
    if type(config) is not LaunchConfig or type(kernel) is not Kernel:
        return add_kernel_node_generic(state, [dep] if dep else [], config, kernel, args)
    plain = config._plain
    entry = _add_entry if _add_entry is not None else _resolve_add_entry()
    if plain is None or not entry:
        return add_kernel_node_generic(state, [dep] if dep else [], config, kernel, args)
    res: Any = -1
    last = kernel._last
    if last is not None:  # the types last validated for this kernel (C checks them)
        res = _c_add_args(entry, state.handle_int, dep, kernel._function_int, state.ctx_int,
                          plain, last[0], last[1], args)  # fmt: skip
    if type(res) is tuple:
        pass  # added
    elif args:
        plan = plan_for(args)
        if plan not in kernel._checked:
            validate_plan(kernel, plan, len(args))
        codes = plan.ccodes
        if codes is not None:  # -1: a value C leaves to Python (closed Buffer, range)
            kernel._last = (codes, plan.types)
            res = _c_add_args(entry, state.handle_int, dep, kernel._function_int,
                              state.ctx_int, plain, codes, None, args)  # fmt: skip
        if type(res) is not tuple:
            if plan.nbytes > state.scratch_size:
                state.grow_scratch(plan.nbytes)
            try:
                held = plan.fill(args, state.scratch, state.scratch_addr)
            except struct.error:  # unsigned 64-bit values and overflow: pack_args sorts them
                return add_kernel_node_generic(state, [dep] if dep else [], config, kernel, args)
            param_addr = state.scratch_addr
    else:
        if None not in kernel._checked:
            validate_plan(kernel, None, 0)
        kernel._last = (b"", ())
        held, param_addr = (), 0
    if type(res) is tuple:
        err, node, held = res
    else:
        err, node = _c_add(entry, state.handle_int, dep, kernel._function_int, state.ctx_int,
                           plain, param_addr)  # fmt: skip
    if err:
        raise error_for(driver.CUresult(err), "cuGraphAddKernelNode")
    # held: the allocations of Buffer arguments and the arrays passed by pointer
    # (a Buffer's close() must not free them); args: everything else passed.
    owners = (kernel, args, held)
    lst = state.pending
    if lst is not None:
        lst.append(owners)
    else:  # a body graph, or no open bundle list yet
        commit(state, driver.CUgraphNode(node), owners)
    state.meta[node] = kernel
    if state.destroyed:  # the driver reuses node addresses: this one lives again
        state.destroyed.discard(node)
    return int(node)


def add_kernel_node_generic(
    state: GraphState, deps: list[int], config: Any, kernel: Any, args: tuple[Any, ...]
) -> int:
    """Add a kernel node after ``deps`` through cuda.bindings; its address."""
    p, owners = ops.kernel_params(config, kernel, args)
    if int(p.kern):
        p.ctx = state.ctx  # run in the graph's context whatever is current
    # A programmatic config depends on kernel predecessors through programmatic edges,
    # added once the node exists (see _params).
    programmatic = bool(deps) and getattr(config, "programmatic_stream_serialization", False)
    dep_objs = [] if programmatic else [driver.CUgraphNode(d) for d in deps]
    node = check(driver.cuGraphAddKernelNode(state.handle, dep_objs, len(dep_objs), p),
                 "cuGraphAddKernelNode")  # fmt: skip
    try:
        ops.set_kernel_node_attributes(node, config)
        if programmatic:
            _params.add_dependencies(state, node, deps)
    except BaseException:
        driver.cuGraphDestroyNode(node)
        raise
    commit(state, node, owners)
    h = int(node)
    state.meta[h] = kernel
    if state.destroyed:
        state.destroyed.discard(h)
    return h
