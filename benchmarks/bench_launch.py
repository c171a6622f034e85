"""Launch overhead: microseconds per launch of an empty kernel, cuforge vs cuda.core.

Both libraries launch the same cubin (compiled here with the machine's NVRTC) on
their own non-blocking stream in the same process: 10,000 launches after a warm-up,
repeated, best and median reported. A raw ``cuda.bindings`` cuLaunchKernelEx loop is
the floor. cuda.core is measured only when importable (it is never a dependency)::

    python benchmarks/bench_launch.py [--launches 10000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

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


def per_launch_us(
    launch_once: Callable[[], None], sync: Callable[[], None], n: int, repeats: int
) -> list[float]:
    for _ in range(1000):
        launch_once()
    sync()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            launch_once()
        runs.append((time.perf_counter() - t0) / n * 1e6)
        sync()
    return runs


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
    a = ap.parse_args()

    import numpy as np
    from cuda.bindings import driver

    import cuforge
    from cuforge.runtime.module import load_kernel

    dev = cuforge.Device(0)
    dev.set_current()
    cubin = cubin_for(dev.arch)
    code = StandInObjectCode(cubin)
    s = dev.create_stream()
    cfg = cuforge.LaunchConfig(1, 1)
    k0, k4 = load_kernel(code, "empty"), load_kernel(code, "four")
    buf = dev.allocate(1024, s)
    results: dict[str, list[float]] = {}

    def cf_empty() -> None:
        cuforge.launch(s, cfg, k0)

    def cf_four() -> None:
        cuforge.launch(s, cfg, k4, buf, buf, 256, np.float32(2.0))

    results["cuforge empty"] = per_launch_us(cf_empty, s.sync, a.launches, a.repeats)
    results["cuforge 4 args"] = per_launch_us(cf_four, s.sync, a.launches, a.repeats)

    raw_cfg = cfg._native_for(s)
    raw_fn = k0._as_function

    def raw_empty() -> None:
        driver.cuLaunchKernelEx(raw_cfg, raw_fn, None, 0)

    results["cuda.bindings raw"] = per_launch_us(raw_empty, s.sync, a.launches, a.repeats)

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

        def cc_empty() -> None:
            cc.launch(cs, ccfg, ck0)

        def cc_four() -> None:
            cc.launch(cs, ccfg, ck4, cbuf, cbuf, 256, np.float32(2.0))

        results[f"cuda.core {version} empty"] = per_launch_us(
            cc_empty, cs.sync, a.launches, a.repeats
        )
        results[f"cuda.core {version} 4 args"] = per_launch_us(
            cc_four, cs.sync, a.launches, a.repeats
        )
    except ImportError as exc:
        print(f"cuda.core not importable ({exc}): cuforge numbers only")

    print(f"{a.launches} launches x {a.repeats} repeats on {dev.name}")
    print(f"{'what':32} {'best us':>8} {'median us':>10}")
    for name, runs in results.items():
        print(f"{name:32} {min(runs):8.2f} {statistics.median(runs):10.2f}")
    for kind in ("empty", "4 args"):
        mine = [v for k, v in results.items() if k == f"cuforge {kind}"]
        theirs = [v for k, v in results.items() if k.startswith("cuda.core") and k.endswith(kind)]
        if mine and theirs:
            ratio = statistics.median(mine[0]) / statistics.median(theirs[0])
            print(f"ratio cuforge/cuda.core ({kind}, median): {ratio:.2f}x (target <= 1.2x)")


if __name__ == "__main__":
    main()
