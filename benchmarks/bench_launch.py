"""Launch overhead: microseconds per launch, cuforge vs cuda.core, over two floors.

Both libraries launch the same cubin (compiled here with the machine's NVRTC) on
their own non-blocking stream in the same process: 10,000 launches after a warm-up,
repeated, best and median reported, for an empty kernel and for one taking four
arguments (two pointers, an int, a float). Two floors: a ``cuda.bindings``
cuLaunchKernelEx loop, and a C loop calling cuLaunchKernel (compiled here with
``cc``; skipped with a note when no compiler is found) -- what no Python library can
beat. The libraries run in alternating order, repeat by repeat. cuda.core is
measured only when importable (it is never a dependency)::

    python benchmarks/bench_launch.py [--launches 10000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import _results

SOURCE = r"""
extern "C" __global__ void empty() {}
extern "C" __global__ void four(const float* x, float* y, int n, float a) {}
"""


def cubin_for(arch: str) -> bytes:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"bench.cu", 0, [], [])
    opts = [f"-arch=sm_{arch}".encode()]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    err, size = nvrtc.nvrtcGetCUBINSize(prog)
    cubin = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    return cubin


def per_launch_us(launch_once: Callable[[], None], sync: Callable[[], None], n: int) -> float:
    """Microseconds per launch over ``n`` launches (then synchronise)."""
    t0 = time.perf_counter()
    for _ in range(n):
        launch_once()
    dt = (time.perf_counter() - t0) / n * 1e6
    sync()
    return dt


C_LOOP = r"""
#include <time.h>
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
/* n launches of f through the driver's cuLaunchKernel; returns seconds, or -err. */
double launch_loop(void *entry, void *f, void *stream, void **params, long n) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        int r = ((launch_fn)entry)(f, 1, 1, 1, 1, 1, 1, 0, stream, params, 0);
        if (r) return -(double)r;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
}
"""


def c_loop() -> Callable[..., float] | str:
    """The C launch loop as a ctypes function, or why it is unavailable."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return "no C compiler found"
    d = tempfile.mkdtemp(prefix="cuforge-bench-")
    src, lib = os.path.join(d, "loop.c"), os.path.join(d, "loop.so")
    with open(src, "w") as f:
        f.write(C_LOOP)
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", src, "-o", lib], capture_output=True)
    if r.returncode:
        return f"cc failed: {r.stderr.decode()[:200]}"
    fn = ctypes.CDLL(lib).launch_loop
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_long]
    return fn


class StandInObjectCode:
    code_type = "cubin"
    name = "bench"
    symbol_mapping: dict = {}

    def __init__(self, code: bytes) -> None:
        self.code = code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    _results.add_arguments(ap)
    a = ap.parse_args()

    import numpy as np
    from cuda.bindings import driver

    import cuforge
    from cuforge.runtime.args import pack_args
    from cuforge.runtime.init import driver_entry
    from cuforge.runtime.module import load_kernel

    dev = cuforge.Device(0)
    dev.set_current()
    cubin = cubin_for(dev.arch)
    code = StandInObjectCode(cubin)
    s = dev.create_stream()
    cfg = cuforge.LaunchConfig(1, 1)
    k0, k4 = load_kernel(code, "empty"), load_kernel(code, "four")
    buf = dev.allocate(1024, s)
    f32 = np.float32(2.0)
    # name -> (launch once, sync)
    subjects: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {}
    subjects["cuforge empty"] = (lambda: cuforge.launch(s, cfg, k0), s.sync)
    subjects["cuforge 4 args"] = (lambda: cuforge.launch(s, cfg, k4, buf, buf, 256, f32), s.sync)

    raw_cfg = cfg._native_for(s)
    raw_f0, raw_f4 = k0._as_function, k4._as_function
    packed = pack_args((buf, buf, 256, f32))  # the raw loop packs once, outside the loop
    subjects["cuda.bindings raw empty"] = (
        lambda: driver.cuLaunchKernelEx(raw_cfg, raw_f0, None, 0),
        s.sync,
    )
    subjects["cuda.bindings raw 4 args"] = (
        lambda: driver.cuLaunchKernelEx(raw_cfg, raw_f4, packed.params, 0),
        s.sync,
    )

    try:
        try:
            import cuda.core as cc

            cc.Device  # noqa: B018 - probe the 1.x top-level layout
        except (ImportError, AttributeError):
            import cuda.core.experimental as cc  # type: ignore[no-redef]
        cdev = cc.Device(0)
        cdev.set_current()
        cs = cdev.create_stream()
        ccfg = cc.LaunchConfig(grid=1, block=1)
        obj = cc.ObjectCode.from_cubin(cubin)
        ck0, ck4 = obj.get_kernel("empty"), obj.get_kernel("four")
        cbuf = cdev.allocate(1024, stream=cs)
        version = getattr(cc, "__version__", "?")
        subjects[f"cuda.core {version} empty"] = (lambda: cc.launch(cs, ccfg, ck0), cs.sync)
        subjects[f"cuda.core {version} 4 args"] = (
            lambda: cc.launch(cs, ccfg, ck4, cbuf, cbuf, 256, f32),
            cs.sync,
        )
    except ImportError as exc:
        print(f"cuda.core not importable ({exc}): cuforge numbers only")
    dev.set_current()

    results: dict[str, list[float]] = {name: [] for name in subjects}
    order = list(subjects.items())
    for launch_once, sync in subjects.values():  # warm-up
        for _ in range(1000):
            launch_once()
        sync()
    for _ in range(a.repeats):
        for name, (launch_once, sync) in order:
            results[name].append(per_launch_us(launch_once, sync, a.launches))
        order.reverse()

    loop = c_loop()
    if callable(loop):
        entry = driver_entry(b"cuLaunchKernel")
        for name, kern, params in (("C loop empty", k0, 0), ("C loop 4 args", k4, packed.params)):
            runs = []
            for _ in range(a.repeats):
                sec = loop(entry, kern._function_int, s._handle_int, params, a.launches)
                assert sec >= 0, f"cuLaunchKernel failed: {-sec}"
                runs.append(sec / a.launches * 1e6)
                s.sync()
            results[name] = runs
    else:
        print(f"C loop floor skipped: {loop}")

    print(f"{a.launches} launches x {a.repeats} repeats on {dev.name}")
    print(f"{'what':32} {'best us':>8} {'median us':>10}")
    for name, runs in results.items():
        print(f"{name:32} {min(runs):8.2f} {statistics.median(runs):10.2f}")
    med = {k: statistics.median(v) for k, v in results.items()}
    for kind in ("empty", "4 args"):
        mine = med.get(f"cuforge {kind}")
        theirs = [v for k, v in med.items() if k.startswith("cuda.core") and k.endswith(kind)]
        floor = med.get(f"C loop {kind}")
        line = f"{kind}:"
        if mine is not None and theirs:
            line += f" cuforge/cuda.core {mine / theirs[0]:.2f}x (target <= 1.0x);"
        if mine is not None and floor is not None:
            line += f" cuforge over the C floor {mine - floor:+.2f} us"
            if theirs:
                line += f", cuda.core over it {theirs[0] - floor:+.2f} us"
        print(line)
    raw = {
        "device": dev.name,
        "launches": a.launches,
        "repeats": a.repeats,
        "per_launch_us": {
            name: {"best": min(runs), "median": statistics.median(runs)}
            for name, runs in results.items()
        },
    }
    _results.write(a.json, "bench_launch", raw, a.note)


if __name__ == "__main__":
    main()
