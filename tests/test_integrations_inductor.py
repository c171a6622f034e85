"""cuforge behind PyTorch Inductor's remote caches, with the real torch (CPU build).

Every compile runs in a fresh process with an empty ``TORCHINDUCTOR_CACHE_DIR``, so
a hit can only come through cuforge. Hits are counted twice: by torch
(``counters["inductor"]["fxgraph_cache_hit"]``) and by the cuforge cache's stats.
Needs torch (``make test-integrations``); skipped where it is not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SECRET = "s3cret-for-the-inductor-tests-0123456789"

CHILD = r"""
import json, os, sys
import torch
from torch._dynamo.utils import counters
from cuforge.integrations import inductor

mode = sys.argv[1]
cache = inductor.install()

def f(x, y):
    return torch.sin(x) * y + torch.cos(x) - y.exp()

x = torch.linspace(-3.0, 3.0, 64)
y = torch.linspace(0.5, 1.5, 64)
out = {}
if mode == "load":
    out["loaded"] = inductor.load_artifacts("t1")
    out["loaded_other"] = inductor.load_artifacts("other-tag")
if mode == "grad":
    xg = x.clone().requires_grad_()
    torch.compile(f)(xg, y).sum().backward()
    xe = x.clone().requires_grad_()
    f(xe, y).sum().backward()
    out["same_grad_as_eager"] = bool(torch.allclose(xg.grad, xe.grad))
got = torch.compile(f)(x, y)
out["same_as_eager"] = bool(torch.allclose(got, f(x, y)))
if mode == "save":
    out["saved"] = inductor.save_artifacts("t1")
from cuforge.integrations import flush
flush()  # Inductor's values are stored behind: the counters then include them
st = cache.stats()
counted = ("hits", "misses", "stores", "signature_failures", "read_failures")
out["stats"] = {k: getattr(st, k) for k in counted}
out["inductor"] = {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")}
out["aot_autograd"] = dict(counters["aot_autograd"])
print("RESULT " + json.dumps(out))
"""


def _run(
    tmp: Path, cache_url: str, *, secret: str | None, mode: str = "plain", remote: bool = True
) -> dict:
    """One fresh process compiling ``f``; its result record."""
    local = tmp / f"inductor-local-{len(list(tmp.glob('inductor-local-*')))}"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "CUFORGE_CACHE"))
    }
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(local),
        CUFORGE_INDUCTOR_CACHE=cache_url,
        TORCHINDUCTOR_COMPILE_THREADS="1",
    )
    if remote:
        env["TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE"] = "1"
    if mode == "grad":
        env["TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE"] = "1"
    if secret is not None:
        env["CUFORGE_CACHE_SECRET"] = secret
    script = tmp / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run(
        [sys.executable, str(script), mode], env=env, capture_output=True, text=True, timeout=240
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_fx_graph_cache_hits_through_filestream_and_rejects_another_secret(tmp_path: Path) -> None:
    url = str(tmp_path / "cf")
    first = _run(tmp_path, url, secret=SECRET)
    assert first["same_as_eager"]
    assert first["inductor"].get("fxgraph_cache_miss", 0) >= 1
    assert first["stats"]["stores"] >= 1 and first["stats"]["hits"] == 0

    second = _run(tmp_path, url, secret=SECRET)
    assert second["same_as_eager"]
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert second["inductor"].get("fxgraph_cache_miss", 0) == 0
    assert second["stats"]["hits"] >= 1 and second["stats"]["stores"] == 0

    # Signed under another secret: a miss (counted), a recompile, the right result.
    other = _run(tmp_path, url, secret=SECRET[::-1])
    assert other["same_as_eager"]
    assert other["inductor"].get("fxgraph_cache_hit", 0) == 0
    assert other["stats"]["signature_failures"] >= 1 and other["stats"]["hits"] == 0

    # What is stored is listed as Inductor's, with its cache and key.
    from cuforge.storage.record import decode_record
    from cuforge.storage.urls import open_cache

    with open_cache(url, secret=SECRET) as cache:
        records = [decode_record(i.meta) for i in cache.iter_entries()]
    fx = [r for r in records if r and r["kind"] == "inductor" and r["cache"] == "fx_graph"]
    assert fx and all(r["key"].startswith("pt2:fx-graph-") for r in fx)


def _plant_pickles(url: str, marker: Path) -> int:
    """Replace every stored Inductor value with JSON around a pickle that creates
    ``marker`` when unpickled; stored unsigned. Returns how many were replaced."""
    import base64
    import pickle

    from cuforge.integrations._cache import ForeignEntries
    from cuforge.storage.record import decode_record
    from cuforge.storage.urls import open_cache

    class Evil:
        def __reduce__(self):  # type: ignore[no-untyped-def]
            return (open, (str(marker), "w"))

    value = json.dumps(
        {"data": base64.b64encode(pickle.dumps(Evil())).decode(), "time_taken_ms": 1}
    ).encode()
    n = 0
    # Listed through a signed handle (which shows a signed entry's record as well as
    # an unsigned one's), written through an unsigned one: unsigned, as a planter would.
    with open_cache(url, secret=SECRET) as lister, open_cache(url, secret=None) as cache:
        entries = ForeignEntries(cache, "inductor")
        for info in list(lister.iter_entries()):
            record = decode_record(info.meta)
            if record and record["kind"] == "inductor":
                entries.store(record["key"], value, {"cache": record["cache"]})
                n += 1
    return n


def test_fx_graph_cache_hits_through_redis_and_a_planted_pickle_is_never_loaded(
    tmp_path: Path, redis_server
) -> None:
    url = redis_server.url
    first = _run(tmp_path, url, secret=None)
    assert first["same_as_eager"] and first["stats"]["stores"] >= 1
    second = _run(tmp_path, url, secret=None)
    assert second["same_as_eager"]
    assert second["inductor"].get("fxgraph_cache_hit", 0) >= 1
    assert second["stats"]["hits"] >= 1

    marker = tmp_path / "unpickled"
    assert _plant_pickles(url, marker) >= 1
    signed = _run(tmp_path, url, secret=SECRET)
    assert not marker.exists(), "a planted, unsigned value reached Inductor's unpickler"
    assert signed["same_as_eager"]
    assert signed["inductor"].get("fxgraph_cache_hit", 0) == 0
    assert signed["stats"]["signature_failures"] >= 1

    # Control: without a secret the planted value is what Inductor reads -- the
    # danger the secret closes is real, and the check above could fail. (The signed
    # run stored signed values over the planted ones: plant again.)
    assert _plant_pickles(url, marker) >= 1
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUFORGE_CACHE")}
    env.update(
        CUFORGE_INDUCTOR_CACHE=url,
        TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE="1",
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "control-local"),
    )
    subprocess.run(
        [sys.executable, str(tmp_path / "child.py"), "plain"],
        env=env,
        capture_output=True,
        timeout=240,
    )
    assert marker.exists()


def test_aot_autograd_cache_hits_through_cuforge_with_eager_gradients(tmp_path: Path) -> None:
    url = str(tmp_path / "cf")
    first = _run(tmp_path, url, secret=SECRET, mode="grad")
    assert first["same_grad_as_eager"] and first["same_as_eager"]
    assert first["aot_autograd"].get("autograd_cache_miss", 0) >= 1
    second = _run(tmp_path, url, secret=SECRET, mode="grad")
    assert second["same_grad_as_eager"] and second["same_as_eager"]
    assert second["aot_autograd"].get("autograd_cache_hit", 0) >= 1
    assert second["aot_autograd"].get("autograd_cache_miss", 0) == 0

    from cuforge.storage.record import decode_record
    from cuforge.storage.urls import open_cache

    with open_cache(url, secret=SECRET) as cache:
        caches = {r["cache"] for i in cache.iter_entries() if (r := decode_record(i.meta))}
    assert {"aot_autograd", "fx_graph"} <= caches


def test_an_unreachable_redis_never_fails_the_compile(tmp_path: Path) -> None:
    from _redis import free_port

    down = _run(tmp_path, f"redis://127.0.0.1:{free_port()}/0?timeout=200ms", secret=SECRET)
    assert down["same_as_eager"]
    assert down["inductor"].get("fxgraph_cache_miss", 0) >= 1
    assert down["stats"]["read_failures"] >= 1 and down["stats"]["hits"] == 0


def test_artifacts_round_trip_in_a_fresh_process(tmp_path: Path) -> None:
    url = str(tmp_path / "cf")
    saved = _run(tmp_path, url, secret=SECRET, mode="save", remote=False)
    assert saved["saved"] is True and saved["same_as_eager"]
    loaded = _run(tmp_path, url, secret=SECRET, mode="load", remote=False)
    assert loaded["loaded"] is True and loaded["loaded_other"] is False
    assert loaded["same_as_eager"]
    # The artifacts filled the empty local cache: Inductor's own lookup hits.
    assert loaded["inductor"].get("fxgraph_cache_hit", 0) >= 1
    # Another secret: the bundle is never handed to torch.
    foreign = _run(tmp_path, url, secret=SECRET[::-1], mode="load", remote=False)
    assert foreign["loaded"] is False and foreign["stats"]["signature_failures"] >= 1
    assert foreign["inductor"].get("fxgraph_cache_hit", 0) == 0


def test_a_torch_without_backend_override_cls_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._inductor import remote_cache

    from cuforge.integrations import inductor

    monkeypatch.delattr(remote_cache.RemoteCache, "backend_override_cls")
    with pytest.raises(RuntimeError) as err:
        inductor.install(str(tmp_path / "cf"))
    message = str(err.value)
    assert "\n" not in message
    assert "backend_override_cls" in message and torch.__version__ in message
    assert not (tmp_path / "cf").exists()  # refused before anything was opened


def test_install_sets_every_remote_cache_and_uninstall_restores(tmp_path: Path) -> None:
    from torch._inductor import remote_cache

    from cuforge.integrations import flush, inductor

    try:
        chosen = inductor.install(str(tmp_path / "cf"))
        assert chosen is not None
        for name in inductor.REMOTE_CACHES.values():
            backend = getattr(remote_cache, name).backend_override_cls()
            backend.put("k-" + name, b'{"x": 1}')
            assert backend.get("k-" + name) == b'{"x": 1}'
        flush()  # stored behind
        assert chosen.stats().stores == len(inductor.REMOTE_CACHES)
    finally:
        inductor.uninstall()
    assert all(
        getattr(remote_cache, n).backend_override_cls is None
        for n in inductor.REMOTE_CACHES.values()
    )
