"""One process using Triton (run by the Triton integration tests and benchmark).

``python _triton_child.py MODE [BARRIER]`` prints one JSON line:

- ``kernel``: compiles a vector-add kernel for ``GPUTarget("cuda", 90, 32)`` (no GPU
  needed: Triton's bundled ptxas makes the cubin); ``hits`` is what Triton's
  compilation listener saw (True: served from the cache).
- ``broken``: a compile that fails, then the process stays alive until ``$DONE``
  exists (a lock it took must be free by then).
- ``so``: builds a small C extension through ``triton.runtime.build`` (the path
  Triton's launcher ``.so`` takes through the cache) and calls it.
- ``retry``: compiles a kernel whose static assertion fails, and again inside the
  ``except`` block (the first compile's traceback still alive); ``errors`` names both.
- ``hits``: compiles once, then times ``$HITS`` more compiles of the same kernel
  (each a cache hit: Triton's key, the cache lookup, loading the kernel's metadata).
- ``run``: launches the kernel on the GPU and checks it against torch.
- ``pause``: compiles the kernel, writes ``$PAUSE.reached`` and waits until ``$PAUSE``
  exists (the test changes the world meanwhile, e.g. kills Redis), then compiles the
  same kernel and one with another block size; ``cubins`` lists the three sizes.

Before reporting, it waits for the stores written behind (``cuforge.integrations.flush``)
unless ``$NO_FLUSH`` is set (they then land at exit).

With BARRIER, it writes ``BARRIER.ready.PID`` once triton is imported and has
hashed itself, and waits
until BARRIER exists, so many processes reach the cache at once. The environment
selects the cache manager.
"""

from __future__ import annotations

import json
import os
import sys
import time

import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=mask) * 2 + tl.load(y + offs, mask=mask), mask=mask)


@triton.jit
def broken_kernel(x, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), tl.no_such_function(BLOCK))


SO_SOURCE = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(4242); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "cuforge_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_cuforge_probe(void) { return PyModule_Create(&mod); }
"""


@triton.jit
def failing_kernel(x, BLOCK: tl.constexpr):
    tl.static_assert(BLOCK < 8)
    tl.store(x + tl.arange(0, BLOCK), 1.0)


def compile_failing() -> object:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"x": "*fp32", "BLOCK": "constexpr"}
    src = ASTSource(fn=failing_kernel, signature=signature, constexprs={"BLOCK": 16})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


def compile_kernel(block: int = 1024) -> object:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    src = ASTSource(fn=add_kernel, signature=signature, constexprs={"BLOCK": block})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32))


def main() -> None:
    mode = sys.argv[1]
    if len(sys.argv) > 2:
        # Hash libtriton (~0.4 s, cached per process) before the barrier, so the
        # processes reach the cache together instead of in the order they hashed.
        getattr(triton.runtime.cache, "triton_key", lambda: None)()
        open(f"{sys.argv[2]}.ready.{os.getpid()}", "w").close()
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.01)
    hits: list[bool] = []
    knobs = getattr(triton, "knobs", None)  # the listener is newer than some tested versions
    if knobs is not None and hasattr(knobs.compilation, "listener"):
        knobs.compilation.listener = lambda **kw: hits.append(bool(kw["cache_hit"]))
    report: dict[str, object] = {}
    t0 = time.perf_counter()
    if mode == "kernel":
        kernel = compile_kernel()
        report["cubin"] = len(kernel.asm["cubin"])  # type: ignore[attr-defined]
    elif mode == "pause":
        pause = os.environ["PAUSE"]
        cubins = [len(compile_kernel().asm["cubin"])]  # type: ignore[attr-defined]
        open(pause + ".reached", "w").close()
        while not os.path.exists(pause):
            time.sleep(0.01)
        for block in (1024, 512):
            cubins.append(len(compile_kernel(block).asm["cubin"]))  # type: ignore[attr-defined]
        report["cubins"] = cubins
    elif mode == "retry":
        errors = []
        try:
            compile_failing()
        except Exception as first:
            errors.append(type(first).__name__)
            try:
                compile_failing()
            except Exception as second:
                errors.append(type(second).__name__)
        report["errors"] = errors
    elif mode == "hits":  # the hit path, timed after the first compile (hashing done)
        import statistics

        compile_kernel()
        times = []
        for _ in range(int(os.environ.get("HITS", "200"))):
            t = time.perf_counter()
            compile_kernel()
            times.append(time.perf_counter() - t)
        report["hit_median_s"] = statistics.median(times)
    elif mode == "broken":  # a compile that fails; then stay alive until DONE exists
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource

        src = ASTSource(
            fn=broken_kernel,
            signature={"x": "*fp32", "BLOCK": "constexpr"},
            constexprs={"BLOCK": 64},
        )
        try:
            triton.compile(src, target=GPUTarget("cuda", 90, 32))
        except Exception as exc:
            report["error"] = type(exc).__name__
        print(json.dumps({"failed": True}), flush=True)
        while not os.path.exists(os.environ["DONE"]):
            time.sleep(0.05)
    elif mode == "so":
        from triton.runtime.build import compile_module_from_src

        report["answer"] = compile_module_from_src(SO_SOURCE, "cuforge_probe").answer()
    elif mode == "run":
        import torch

        x = torch.rand(5000, device="cuda")
        y = torch.rand(5000, device="cuda")
        out = torch.empty_like(x)
        add_kernel[(5,)](x, y, out, 5000, BLOCK=1024)
        torch.cuda.synchronize()
        report["max_error"] = float((out - (x * 2 + y)).abs().max())
    report["seconds"] = time.perf_counter() - t0
    report["hits"] = hits
    if "cuforge.integrations.triton" in sys.modules and not os.environ.get("NO_FLUSH"):
        from cuforge.integrations import flush

        flush()  # the counters below then include the stores written behind
    if "cuforge.integrations.triton" in sys.modules:
        from cuforge.integrations import triton as integration

        cache = integration.triton_cache()
        report["counters"] = integration.counters
        report["stats"] = None if cache is None else cache.stats().as_dict()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
