"""One fresh process of ``bench_coldstart.py``: a small MLP through ``torch.compile``.

``python _coldstart_child.py DEVICE MODE SIDE`` prints one line ``RESULT {json}``:

- ``seconds``: from just after ``import torch`` to the first compiled result on the
  host (the device synchronised) -- the figure;
- ``landed_s`` (SIDE ``cuforge``): from the same start to when this process's stores
  written behind had landed (``cuforge.integrations.flush``); the compile workers'
  land before they end, so before this process does;
- what the caches saw: Inductor's FX-graph counters, and with SIDE ``cuforge`` the
  cuforge cache's counters (after the flush) and Triton manager's (this process's).

With SIDE ``cuforge`` the process puts cuforge behind Inductor's remote caches
(``cuforge.integrations.inductor.install()``, inside the timed part); Triton finds
cuforge's manager through ``$TRITON_CACHE_MANAGER``, which the parent sets, in this
process and in Inductor's compile workers. Everything else (cache directories,
cuforge's cache and secret, Inductor's switches, the width ``$COLDSTART_WIDTH``)
comes from the environment the parent gives.
"""

from __future__ import annotations

import time

import torch

T0 = time.perf_counter()

import json  # noqa: E402 -- after the clock starts, like everything the compile needs
import os  # noqa: E402
import sys  # noqa: E402


def main() -> None:
    device, mode, side = sys.argv[1:4]
    cache = None
    if side == "cuforge":
        from cuforge.integrations import inductor

        cache = inductor.install()
        if cache is None:
            raise SystemExit("cuforge.integrations.inductor.install() found no cache")
    width = int(os.environ.get("COLDSTART_WIDTH", "1024"))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width),
        torch.nn.GELU(),
        torch.nn.Linear(4 * width, width),
        torch.nn.LayerNorm(width),
    ).to(device)
    x = torch.randn(64, width, device=device)
    compiled = torch.compile(model, mode=None if mode == "default" else mode)
    with torch.no_grad():
        out = compiled(x)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        first = out.sum().item()  # the first compiled result, on the host
    seconds = time.perf_counter() - T0
    report: dict[str, object] = {"seconds": seconds, "first": first}
    if cache is not None:
        from cuforge.integrations import flush

        flush()
        report["landed_s"] = time.perf_counter() - T0
    with torch.no_grad():
        expect = model(x)
    report["close_to_eager"] = bool(torch.allclose(out, expect, rtol=1e-2, atol=1e-2))
    from torch._dynamo.utils import counters

    report["inductor"] = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")}
    if cache is not None:
        report["cuforge"] = cache.stats().as_dict()
        triton = sys.modules.get("cuforge.integrations.triton")
        if triton is not None:
            report["triton"] = dict(triton.counters)  # this process's, not its workers'
    print("RESULT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
