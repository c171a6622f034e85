"""CUDA graphs whose nodes keep what they use alive (names follow ``cuda.core.graph``).

- :class:`GraphDefinition`: explicit construction; every node retains its kernel,
  arguments (and their allocations), callables, user data copies, Buffer operands
  and events, per parameter version, for as long as CUDA may use them.
- :class:`GraphBuilder`: stream capture; captured work is caller-owned except host
  callbacks, which are retained.
- :class:`Graph`: the executable graph; ``graph[node]`` updates nodes in place.

Owners are released off CUDA's thread by :mod:`cuforge._native._release`; see
``docs/graphs.md`` for the design.
"""

from __future__ import annotations

from cuforge.graph._builder import GraphBuilder
from cuforge.graph._definition import (
    Condition,
    GraphCompleteOptions,
    GraphDebugPrintOptions,
    GraphDefinition,
)
from cuforge.graph._exec import (
    ExecChildGraphNode,
    ExecEventRecordNode,
    ExecEventWaitNode,
    ExecHostCallbackNode,
    ExecKernelNode,
    ExecMemcpyNode,
    ExecMemsetNode,
    ExecNode,
    Graph,
)
from cuforge.graph._listing import OtherNode
from cuforge.graph._nested import ChildGraphNode, ConditionalNode
from cuforge.graph._nodes import (
    AllocNode,
    EmptyNode,
    EventRecordNode,
    EventWaitNode,
    FreeNode,
    GraphNode,
    HostCallbackNode,
    KernelNode,
    MemcpyNode,
    MemsetNode,
)
from cuforge.graph._owners import drain as drain_released
from cuforge.graph._owners import live_bundles

__all__ = [
    "AllocNode",
    "ChildGraphNode",
    "Condition",
    "ConditionalNode",
    "EmptyNode",
    "EventRecordNode",
    "EventWaitNode",
    "ExecChildGraphNode",
    "ExecEventRecordNode",
    "ExecEventWaitNode",
    "ExecHostCallbackNode",
    "ExecKernelNode",
    "ExecMemcpyNode",
    "ExecMemsetNode",
    "ExecNode",
    "FreeNode",
    "Graph",
    "GraphBuilder",
    "GraphCompleteOptions",
    "GraphDebugPrintOptions",
    "GraphDefinition",
    "GraphNode",
    "HostCallbackNode",
    "KernelNode",
    "MemcpyNode",
    "MemsetNode",
    "OtherNode",
    "drain_released",
    "live_bundles",
]
