"""One process using a directory-cached JIT (run by the mirror's tests and benchmark).

``python _jit_child.py warp``: launches a Warp kernel on the CPU (Warp builds it with
its bundled compiler into ``$WARP_CACHE_PATH/<version>``, or loads it from there);
Warp itself prints whether the module was ``(compiled)`` or ``(cached)``.

``python _jit_child.py numba``: calls an ``@njit(cache=True)`` function (cached in
``$NUMBA_CACHE_DIR``); ``hits``/``misses`` are numba's own cache counters.

The last line printed is JSON: ``result`` and, for numba, the counters.
"""

from __future__ import annotations

import json
import sys


def warp() -> dict[str, object]:
    import warp as wp

    wp.config.quiet = False

    @wp.kernel
    def scale(a: wp.array(dtype=float), s: float):  # type: ignore[valid-type]
        i = wp.tid()
        a[i] = a[i] * s

    wp.init()
    a = wp.array([1.0, 2.0, 3.0], dtype=float, device="cpu")
    wp.launch(scale, dim=3, inputs=[a, 2.0], device="cpu")
    return {"result": a.numpy().tolist()}


def numba() -> dict[str, object]:
    from numba import njit

    @njit(cache=True)
    def total(n: int) -> float:
        s = 0.0
        for i in range(n):
            s += i * 0.5
        return s

    result = total(10)
    return {
        "result": result,
        "hits": sum(total.stats.cache_hits.values()),
        "misses": sum(total.stats.cache_misses.values()),
    }


if __name__ == "__main__":
    out = {"warp": warp, "numba": numba}[sys.argv[1]]()
    sys.stdout.flush()
    print(json.dumps(out))
