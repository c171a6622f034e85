"""The integrations on a GPU (scripts/gpu-test): torch.compile'd CUDA code and CuPy
kernels served through cuforge to a second process with fresh local cache dirs,
results checked against eager torch / NumPy. Skipped where torch or cupy is absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

SECRET = "gpu-integration-tests-secret-0123456789"

INDUCTOR_CHILD = r"""
import json, sys
import torch
from torch._dynamo.utils import counters
from cuforge.integrations import inductor

mode = sys.argv[1] if len(sys.argv) > 1 else "plain"
cache = inductor.install()
loaded = inductor.load_artifacts("gpu-t") if mode == "load" else None

def f(x, y):
    return torch.relu(x @ y) * torch.sigmoid(x).sum(dim=1, keepdim=True)

torch.manual_seed(0)
x = torch.randn(64, 64, device="cuda")
y = torch.randn(64, 64, device="cuda")
got = torch.compile(f)(x, y)
saved = inductor.save_artifacts("gpu-t") if mode == "save" else None
st = cache.stats()
print("RESULT " + json.dumps({
    "saved": saved,
    "loaded": loaded,
    "same_as_eager": bool(torch.allclose(got, f(x, y), rtol=1e-3, atol=1e-3)),
    "hit": counters["inductor"]["fxgraph_cache_hit"],
    "miss": counters["inductor"]["fxgraph_cache_miss"],
    "stats": {"hits": st.hits, "stores": st.stores},
}))
"""

CUPY_CHILD = r"""
import json
import numpy as np
import cupy as cp
from cuforge.integrations import cupy as cf_cupy

cache = cf_cupy.install()
kernel = cp.RawKernel(r'''
extern "C" __global__ void axpy(const float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
''', "axpy")
n = 1000
x = np.arange(n, dtype=np.float32)
y = np.full(n, 2.0, dtype=np.float32)
dx, dy = cp.asarray(x), cp.asarray(y)
kernel(((n + 127) // 128,), (128,), (np.float32(3.0), dx, dy, np.int32(n)))
st = cache.stats()
print("RESULT " + json.dumps({
    "correct": bool(np.allclose(cp.asnumpy(dy), 3.0 * x + y)),
    "stats": {"hits": st.hits, "misses": st.misses, "stores": st.stores},
}))
"""


def _run(
    tmp: Path, script: str, cache_url: str, n: int, env_extra: dict[str, str], *args: str
) -> dict:
    local = tmp / f"local-{n}"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHINDUCTOR_", "CUFORGE_CACHE", "CUFORGE_INDUCTOR", "CUFORGE_CUPY"))
    }
    env.update(
        CUFORGE_CACHE=cache_url,
        CUFORGE_CACHE_SECRET=SECRET,
        TORCHINDUCTOR_CACHE_DIR=str(local / "inductor"),
        TRITON_CACHE_DIR=str(local / "triton"),
        CUPY_CACHE_DIR=str(local / "cupy"),
        **env_extra,
    )
    path = tmp / "child.py"
    path.write_text(script)
    proc = subprocess.run(
        [sys.executable, str(path), *args], env=env, capture_output=True, text=True, timeout=400
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_torch_compile_on_cuda_hits_inductor_cache_through_cuforge(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    url = str(tmp_path / "cf")
    remote = {"TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1"}
    first = _run(tmp_path, INDUCTOR_CHILD, url, 1, remote)
    assert first["same_as_eager"] and first["miss"] >= 1 and first["stats"]["stores"] >= 1
    second = _run(tmp_path, INDUCTOR_CHILD, url, 2, remote)
    assert second["same_as_eager"]
    assert second["hit"] >= 1 and second["miss"] == 0
    assert second["stats"]["hits"] >= 1


def test_artifacts_saved_on_this_gpu_load_into_a_fresh_process(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    url = str(tmp_path / "cf")
    saved = _run(tmp_path, INDUCTOR_CHILD, url, 1, {}, "save")
    assert saved["saved"] is True and saved["same_as_eager"]
    loaded = _run(tmp_path, INDUCTOR_CHILD, url, 2, {}, "load")
    assert loaded["loaded"] is True and loaded["same_as_eager"]
    assert loaded["hit"] >= 1 and loaded["miss"] == 0  # the artifacts filled the local cache


def test_cupy_rawkernel_hits_through_cuforge_in_a_second_process(tmp_path: Path) -> None:
    pytest.importorskip("cupy")
    url = str(tmp_path / "cf")
    first = _run(tmp_path, CUPY_CHILD, url, 1, {})
    assert first["correct"] and first["stats"]["stores"] >= 1 and first["stats"]["hits"] == 0
    second = _run(tmp_path, CUPY_CHILD, url, 2, {})
    assert second["correct"]
    assert second["stats"]["hits"] >= 1 and second["stats"]["stores"] == 0
