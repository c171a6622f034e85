"""``torch.compile`` on the CPU under ``cuforge run``, with no code change: a fresh
host (an empty ``TORCHINDUCTOR_CACHE_DIR`` and home) gets Inductor's compiled FX graph
through the remote-cache integration and the C++ libraries Inductor built with the
host compiler through the mirror's ``torchinductor`` profile, so it runs the compiled
function without calling the compiler once -- and a host whose compiler differs gets
none of them (they were built with ``-march=native`` by another compiler).

The compiler is ``$CXX``: a ``g++`` script in front of the real one that writes each
build command to ``$CXX_LOG`` (Inductor's own call) and, where ``$CXX_VERSION_LINE``
is set, answers ``--version`` with it (another host's compiler at the same path).
Needs torch (``make test-integrations``); skipped where it is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from _cli import SCRIPT, isolated_env

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SECRET = "s3cret-for-the-run-inductor-tests-0123456789"
JOB = """
import json, torch
from torch._dynamo.utils import counters

def f(x, w):
    for i in range(3):
        x = torch.tanh(x @ w) + torch.sin(x) * (i + 1)
    return x.sum(dim=0)

torch.manual_seed(0)
x = torch.randn(32, 32)
w = torch.randn(32, 32) * 0.1
got = torch.compile(f)(x, w)
print("RESULT " + json.dumps({
    "same_as_eager": bool(torch.allclose(got, f(x, w), rtol=1e-4, atol=1e-3)),
    "fx": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph")},
}))
"""
WRAPPER = """#!/bin/sh
if [ "$1" = "--version" ] && [ -n "$CXX_VERSION_LINE" ]; then
    echo "$CXX_VERSION_LINE"; exit 0
fi
case " $* " in *" -o "*) echo "$*" >> "$CXX_LOG" ;; esac
exec {real} "$@"
"""


@pytest.fixture
def world(tmp_path: Path) -> Path:
    real = shutil.which("g++")
    if real is None:
        pytest.skip("no g++: Inductor cannot build C++ on the CPU here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "g++"  # the name tells Inductor it is GCC
    wrapper.write_text(WRAPPER.format(real=real))
    wrapper.chmod(0o755)
    (tmp_path / "job.py").write_text(textwrap.dedent(JOB))
    return tmp_path


def _host(world: Path, name: str, url: str, **extra: str) -> tuple[dict[str, Any], list[str]]:
    """One job on a fresh host through ``cuforge run``: its result and the libraries
    the compiler built into Inductor's directory (``-o <dir>/...so`` or ``.o``) or its
    precompiled header (``-o $TMPDIR/.../precompiled_headers/...h.gch``), which it
    keeps outside that directory; not the preprocessing it runs at every start."""
    home = world / name
    (home / "tmp").mkdir(parents=True)
    log = home / "builds.log"
    inductor = home / "inductor"
    env = isolated_env(
        home,
        HOME=str(home),
        TMPDIR=str(home / "tmp"),
        TORCHINDUCTOR_CACHE_DIR=str(inductor),
        TORCHINDUCTOR_COMPILE_THREADS="1",
        CXX=str(world / "bin" / "g++"),
        CXX_LOG=str(log),
        CUFORGE_CACHE_SECRET=SECRET,
        **extra,
    )
    env = {k: v for k, v in env.items() if not k.startswith(("TORCHINDUCTOR_FX", "TRITON_"))}
    proc = subprocess.run(
        [str(SCRIPT), "run", "--cache", url, "--", sys.executable, str(world / "job.py")],
        env=env, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    commands = log.read_text().splitlines() if log.exists() else []
    pch = re.escape(str(home / "tmp")) + r"/torchinductor_\S+/precompiled_headers/\S+\.gch"
    built = re.compile(rf" -o ({re.escape(str(inductor))}/\S+\.(so|o)|{pch})( |$)")
    return json.loads(lines[-1][len("RESULT ") :]), [c for c in commands if built.search(c)]


def test_a_fresh_host_runs_torch_compile_without_building_and_another_compiler_builds(
    world: Path,
) -> None:
    url = f"file://{world / 'shared'}"
    first, builds = _host(world, "host1", url)
    assert first["same_as_eager"] and first["fx"].get("fxgraph_cache_miss", 0) >= 1
    assert builds, "Inductor built no C++ library: nothing for the mirror to carry"
    assert any(".gch" in c for c in builds), "Inductor built no precompiled header here"

    second, builds = _host(world, "host2", url)
    assert second["same_as_eager"]
    assert second["fx"].get("fxgraph_cache_hit", 0) >= 1  # the remote FX-graph cache
    # Every library and the precompiled header came from the mirror: no build ran.
    assert builds == []
    libraries = list((world / "host2" / "inductor").rglob("*.so"))
    assert libraries and all(p.stat().st_size > 0 for p in libraries)
    headers = list((world / "host2" / "tmp").rglob("precompiled_headers/*.gch"))
    assert headers and all(p.stat().st_size > 1 << 20 for p in headers)

    # The same compiler path, another compiler behind it (another host's g++): the
    # libraries it built here are never handed over; Inductor builds its own.
    third, builds = _host(world, "host3", url, CXX_VERSION_LINE="g++ (Other) 99.1.0")
    assert third["same_as_eager"]
    assert builds, "a library built by another compiler reached this host"
    assert any(".gch" in c for c in builds), "another compiler's precompiled header reached it"
