"""Why a fresh host is slower than warm-local: two diagnostics for bench_coldstart.

    python3 benchmarks/diag_coldstart.py misses [--mode max-autotune-no-cudagraphs]
    python3 benchmarks/diag_coldstart.py controls [--mode default] [--rounds 3]
    python3 benchmarks/diag_coldstart.py stockremote [--mode ...] [--rounds 3]  # redis on PATH
    python3 benchmarks/diag_coldstart.py split [--mode ...] [--rounds 3]  # redis on PATH

``misses``: one cuforge cold process, then two fresh hosts on its cache; after each,
the entries the cache gained (``cuforge cache ls``), by name, and for the Triton
kernels a fresh host compiled, how their metadata (``.json``) and Triton source
(``.source``) differ from the variants the cold run stored -- what the fresh host
compiled that the cold run never did. ``controls``: per round, stock cold and warm-
local, cuforge cold, cuforge on its own filled local directories (warm-local through
cuforge), a cuforge fresh host and stock on a copy of its filled local directories at
another path -- which of "empty local directories", "another path" and "cuforge
installed" a gap comes from. ``stockremote``: per round, stock cold and warm-local,
then stock with its *own* remote caches on a loopback redis-server (Inductor's Redis
FX-graph, AOT-autograd, autotune and bundled-autotune caches; the FX-graph entries
bundle their Triton kernels. Triton 3.6's own ``RedisRemoteCacheBackend`` fails at
construction -- it reads a ``knobs.cache.redis`` that version lacks): a cold process, then a
fresh host (empty local directories, the same Redis) -- whether stock's own fleet
cache brings a new host to warm-local, the control for cuforge's fresh host; and
cuforge's cold process and fresh host, each round starting with another of the three.
``split``: cold processes only -- stock, stock with its own remote caches, cuforge
whole, behind Triton only, behind Inductor only, and with synchronous stores. Times
are bench_coldstart's (first result after ``import torch``); not figures, no
thresholds.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_coldstart as bc
from cuforge.integrations._tritonpack import unpack


def _cli(cache: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CUFORGE_CACHE_SECRET": bc.SECRET}
    cmd = [sys.executable, "-m", "cuforge", "cache", *args, "--cache", f"file://{cache}"]
    return subprocess.run(cmd, capture_output=True, env=env, check=False)


def _entries(cache: Path) -> dict[str, dict[str, Any]]:
    out = json.loads(_cli(cache, "ls", "--json", "--limit", "1000000").stdout)
    return {e["id"]: e for e in out}


def _show(line: str, rep: dict[str, Any]) -> None:
    stats = {k: v for k, v in rep.get("cuforge", {}).items() if v}
    print(f"{line:24s} {rep['seconds']:6.2f} s  triton {rep.get('triton')}  cuforge {stats}")


def misses(mode: str, base: Path) -> None:
    cache = base / "cache"
    _show("cold", bc._run("cuda", mode, "cuforge", bc._env(base / "cold", cache, 1024, "cuda")))
    cold = before = _entries(cache)
    for i in range(2):
        env = bc._env(base / f"fresh{i}", cache, 1024, "cuda")
        _show(f"fresh host {i}", bc._run("cuda", mode, "cuforge", env))
        after = _entries(cache)
        new = [after[k] for k in after if k not in before]
        print("  new entries:", dict(collections.Counter(e["name"] for e in new)))
        for e in new:
            name = e["name"]
            if e["kind"] == "triton" and name.startswith("__kernel__"):  # a kernel's pack
                _compare(cache, e, [c for c in cold.values() if c["name"] == e["name"]])
        before = after


def _member(cache: Path, entry_id: str, name: str) -> bytes:
    """The bytes of Triton's file ``name`` in the kernel pack ``entry_id`` (b"": none)."""
    files = dict(unpack(_cli(cache, "show", entry_id, "--extract", "-").stdout) or [])
    return files.get(name, b"")


def _compare(cache: Path, new: dict[str, Any], olds: list[dict[str, Any]]) -> None:
    kernel = new["name"].removeprefix("__kernel__")  # the kernel's metadata file
    meta = json.loads(_member(cache, new["id"], kernel))
    print(f"  {kernel}: compiled by the fresh host; the cold run stored {len(olds)}")
    for old in olds:
        was = json.loads(_member(cache, old["id"], kernel))
        diff = {k: (was.get(k), v) for k, v in meta.items() if k != "hash" and was.get(k) != v}
        print(f"    vs {old['id'][:8]}: {diff}")
    src = kernel[: -len(".json")] + ".source"
    ids = [e["id"] for e in (new, *olds)]
    texts = {i: _member(cache, i, src).decode("utf-8", "replace") for i in ids}
    if len(set(texts.values())) > 1:
        a, b = list(dict.fromkeys(texts.values()))[:2]
        print("".join(list(difflib.unified_diff(a.splitlines(True), b.splitlines(True), n=0))[:12]))


def controls(mode: str, base: Path, rounds: int) -> None:
    times: dict[str, list[float]] = collections.defaultdict(list)
    for r in range(rounds):
        at = base / f"round{r}"
        cache, stock, mine = at / "cache", at / "stock", at / "cuforge"
        plan: list[tuple[str, str, Path, Path | None]] = [
            ("stock cold", "stock", stock, None),
            ("cuforge cold", "cuforge", mine, cache),
            ("stock warm-local", "stock", stock, None),
            ("cuforge warm-local", "cuforge", mine, cache),
            ("cuforge fresh, same path", "cuforge", mine, cache),
            ("cuforge fresh, new path", "cuforge", at / "fresh", cache),
            ("stock, dirs moved", "stock", at / "moved", None),
        ]
        for kind, side, local, cf in plan:
            if kind == "stock, dirs moved":
                shutil.copytree(stock, local, symlinks=True)
            if kind == "cuforge fresh, same path":  # a new host: the same paths, empty
                shutil.rmtree(mine)
            rep = bc._run("cuda", mode, side, bc._env(local, cf, 1024, "cuda"))
            times[kind].append(rep["seconds"])
            _show(f"{r} {kind}", rep)
    for kind, ts in times.items():
        print(f"{kind:24s} median {statistics.median(ts):6.2f} s  {[round(t, 2) for t in ts]}")


def _redis() -> tuple[subprocess.Popen[bytes], int]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    for _ in range(100):
        if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                          check=False).stdout.strip() == b"PONG":  # fmt: skip
            return proc, port
        import time

        time.sleep(0.05)
    raise SystemExit("diag_coldstart: redis-server did not start")


def _remote_env(port: int) -> dict[str, str]:
    """Stock Inductor's own Redis remote caches, on the loopback server at ``port``."""
    return {
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_REDIS_HOST": "127.0.0.1",
        "TORCHINDUCTOR_REDIS_PORT": str(port),
    }


def split(mode: str, base: Path, rounds: int) -> None:
    """Cold processes only, per round in a rotated order: stock; stock with its own
    Redis remote caches; cuforge whole (Triton's manager and Inductor's remote
    caches); cuforge behind Triton only; cuforge behind Inductor only; cuforge whole
    with synchronous stores -- which part of cuforge a cold gap comes from."""
    times: dict[str, list[float]] = collections.defaultdict(list)
    server, port = _redis()
    try:
        for r in range(rounds):
            subprocess.run(["redis-cli", "-p", str(port), "flushall"], capture_output=True,
                           check=True)  # fmt: skip
            at = base / f"round{r}"
            arms = ["stock", "stock-remote", "cuforge", "cuforge triton only",
                    "cuforge inductor only", "cuforge synchronous"]  # fmt: skip
            shift = r % len(arms)
            for kind in arms[shift:] + arms[:shift]:
                local = at / kind.replace(" ", "-")
                cf = None if kind.startswith("stock") else at / f"cache-{kind.replace(' ', '-')}"
                env = bc._env(local, cf, 1024, "cuda")
                side = "cuforge" if kind in ("cuforge", "cuforge inductor only",
                                             "cuforge synchronous") else "stock"  # fmt: skip
                if kind == "stock-remote":
                    env.update(_remote_env(port))
                if kind == "cuforge inductor only":
                    env.pop("TRITON_CACHE_MANAGER", None)
                if kind == "cuforge triton only":  # Inductor's remote caches off
                    for name in (*bc.REMOTE_SWITCHES, *bc.GPU_SWITCHES):
                        env.pop(name, None)
                if kind == "cuforge synchronous":
                    env["CUFORGE_WRITE_BEHIND"] = "0"
                rep = bc._run("cuda", mode, side, env)
                times[kind].append(rep["seconds"])
                _show(f"{r} {kind}", rep)
    finally:
        server.terminate()
        server.wait()
    for kind, ts in times.items():
        per = [t / s for t, s in zip(ts, times["stock"], strict=True)]
        print(f"{kind:24s} median {statistics.median(ts):6.2f} s  {[round(t, 2) for t in ts]}"
              f"  / stock per round {[round(p, 2) for p in per]}")  # fmt: skip


def stockremote(mode: str, base: Path, rounds: int) -> None:
    times: dict[str, list[float]] = collections.defaultdict(list)
    server, port = _redis()
    remote = _remote_env(port)
    try:
        for r in range(rounds):
            subprocess.run(["redis-cli", "-p", str(port), "flushall"], capture_output=True,
                           check=True)  # fmt: skip
            at = base / f"round{r}"
            groups: list[list[tuple[str, str, Path, Path | None, bool]]] = [
                [
                    ("stock cold", "stock", at / "stock", None, False),
                    ("stock warm-local", "stock", at / "stock", None, False),
                ],
                [
                    ("stock-remote cold", "stock", at / "remote-cold", None, True),
                    ("stock-remote fresh host", "stock", at / "remote-fresh", None, True),
                    ("stock-remote warm-local", "stock", at / "remote-fresh", None, True),
                ],
                [
                    ("cuforge cold", "cuforge", at / "cf-cold", at / "cache", False),
                    ("cuforge fresh host", "cuforge", at / "cf-fresh", at / "cache", False),
                ],
            ]
            shift = r % len(groups)  # each round starts with another group
            plan = [step for g in groups[shift:] + groups[:shift] for step in g]
            for kind, side, local, cf, use in plan:
                env = bc._env(local, cf, 1024, "cuda")
                if use:
                    env.update(remote)
                rep = bc._run("cuda", mode, side, env)
                times[kind].append(rep["seconds"])
                keys = subprocess.run(["redis-cli", "-p", str(port), "dbsize"],
                                      capture_output=True, check=False).stdout.strip()  # fmt: skip
                _show(f"{r} {kind}", rep)
                print(f"{'':24s} redis keys {keys.decode()}")
    finally:
        server.terminate()
        server.wait()
    for kind, ts in times.items():
        print(f"{kind:24s} median {statistics.median(ts):6.2f} s  {[round(t, 2) for t in ts]}")
    ratios = [
        ("cuforge cold", "stock cold"),
        ("cuforge cold", "stock-remote cold"),
        ("stock-remote cold", "stock cold"),
        ("cuforge fresh host", "stock warm-local"),
        ("stock-remote fresh host", "stock warm-local"),
    ]
    for a, b in ratios:
        per = [x / y for x, y in zip(times[a], times[b], strict=True)]
        print(f"{a} / {b}: per round {[round(p, 2) for p in per]}, "
              f"median {statistics.median(per):.2f}")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("misses", "controls", "stockremote", "split"))
    ap.add_argument("--mode", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/cuforge-diag-coldstart")
    args = ap.parse_args()
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    if args.what == "misses":
        misses(args.mode or "max-autotune-no-cudagraphs", base)
    elif args.what == "split":
        split(args.mode or "max-autotune-no-cudagraphs", base, args.rounds)
    elif args.what == "stockremote":
        stockremote(args.mode or "max-autotune-no-cudagraphs", base, args.rounds)
    else:
        controls(args.mode or "default", base, args.rounds)
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
