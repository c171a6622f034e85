"""The first torch.compile of a process, through cuforge beside stock, in one run.

Each sample is a fresh process (``_coldstart_child.py``) that compiles a small MLP
with ``torch.compile`` and times it from just after ``import torch`` to the first
compiled result on the host. Four kinds of process, per compile mode:

- **stock cold**: stock torch, empty ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``;
- **stock warm-local**: stock again, on the directories its cold run just filled;
- **cuforge cold**: empty local directories and an empty cuforge ``file://`` cache,
  with a secret set; Triton's manager (``$TRITON_CACHE_MANAGER``) and Inductor's
  remote FX-graph, AOT-autograd, autotune and bundled-autotune caches on cuforge
  (``cuforge.integrations.inductor.install()``, inside the timed part);
- **cuforge fresh host**: empty local directories again, on the cuforge cache that
  its cold run just filled (a new machine of the fleet).

A pair is one stock and one cuforge process of the same kind; the order alternates
between pairs (stock first in even pairs). The figures are ratios of medians:
cuforge cold / stock cold (issue 37's goal: <= 1.03) and cuforge fresh host /
stock warm-local (<= 1.10), for each mode. Every process's counters are checked
(a cold run compiled, a warm one hit), so a figure never measures the wrong thing.

    python3 benchmarks/bench_coldstart.py [--device cuda] [--pairs 3]
        [--modes max-autotune-no-cudagraphs,default] [--json PATH]

``scripts/gpu-test --bench`` runs it on the GPU machine and checks the ratios with
``bench_check.py --gpu`` against ``benchmarks/thresholds.toml``. On a CPU
(``--device cpu --width 64``) it checks the harness itself in a minute or two.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _results

ROOT = Path(__file__).resolve().parent.parent
CHILD = str(Path(__file__).with_name("_coldstart_child.py"))
MANAGER = "cuforge.integrations.triton:CuforgeCacheManager"
SECRET = "bench-coldstart-secret-0123456789abcdef"
MODES = ("max-autotune-no-cudagraphs", "default")
#: Inductor's remote caches cuforge serves (each needs its own switch); the autotune
#: caches are Triton's, so a CPU run leaves them off (Inductor refuses them there).
REMOTE_SWITCHES = ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE")
GPU_SWITCHES = ("TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE", "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE")


def _env(local: Path, cuforge: Path | None, width: int, device: str) -> dict[str, str]:
    """A child's environment: its own local directories; cuforge's settings or none."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUFORGE_", "TRITON_", "TORCHINDUCTOR_"))
    }
    # An installed cuforge has its bytecode (pip compiles it); a source tree under
    # PYTHONDONTWRITEBYTECODE would compile every module again in each process.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(local / "inductor"),
        TRITON_CACHE_DIR=str(local / "triton"),
        TRITON_HOME=str(local / "home"),
        TRITON_DEFAULT_FP_FUSION="1",  # triton 3.9 warns without it; 3.6 ignores it
        COLDSTART_WIDTH=str(width),
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    if cuforge is not None:
        env.update(
            TRITON_CACHE_MANAGER=MANAGER,
            CUFORGE_CACHE=f"file://{cuforge}",
            CUFORGE_CACHE_SECRET=SECRET,
            **dict.fromkeys(REMOTE_SWITCHES, "1"),
        )
        if device != "cpu":
            env.update(dict.fromkeys(GPU_SWITCHES, "1"))
    return env


def _run(device: str, mode: str, side: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, CHILD, device, mode, side],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"bench_coldstart: a {side} process failed:\n{proc.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return report


def _problems(kind: str, report: dict[str, Any]) -> list[str]:
    """What makes ``report`` not the ``kind`` of process it should be."""
    out = []
    if not report["close_to_eager"]:
        out.append("the compiled result differs from eager")
    fx = report.get("inductor", {})
    warm = kind in ("stock warm-local", "cuforge fresh host")
    if warm and not fx.get("fxgraph_cache_hit"):
        out.append(f"no FX-graph cache hit ({fx})")
    if not warm and (fx.get("fxgraph_cache_hit") or not fx.get("fxgraph_cache_miss")):
        out.append(f"not a cold compile ({fx})")
    stats = report.get("cuforge")
    if kind == "cuforge cold" and not (stats and stats["stores"]):
        out.append(f"nothing stored through cuforge ({stats})")
    if kind == "cuforge fresh host" and not (stats and stats["hits"]):
        out.append(f"no cuforge hit ({stats})")
    return out


def measure(device: str, mode: str, pairs: int, width: int, tmp: Path) -> dict[str, Any]:
    """``pairs`` alternated pairs of each kind for one compile ``mode``."""
    times: dict[str, list[float]] = {
        k: [] for k in ("stock cold", "cuforge cold", "stock warm-local", "cuforge fresh host")
    }
    problems: list[str] = []
    samples: list[dict[str, Any]] = []
    slug = mode.replace("-", "_")
    for p in range(pairs):
        base = tmp / f"{slug}-{p}"
        stock_local, cache = base / "stock", base / "cuforge-cache"
        runs = {
            "stock cold": ("stock", _env(stock_local, None, width, device)),
            "stock warm-local": ("stock", _env(stock_local, None, width, device)),
            "cuforge cold": ("cuforge", _env(base / "cuforge-cold", cache, width, device)),
            "cuforge fresh host": ("cuforge", _env(base / "cuforge-fresh", cache, width, device)),
        }
        cold = ["stock cold", "cuforge cold"]
        warm = ["stock warm-local", "cuforge fresh host"]
        if p % 2:
            cold.reverse()
            warm.reverse()
        for kind in cold + warm:  # each warm kind after its own cold run filled the caches
            side, env = runs[kind]
            report = _run(device, mode, side, env)
            times[kind].append(report["seconds"])
            problems += [f"{mode}, pair {p}, {kind}: {why}" for why in _problems(kind, report)]
            samples.append({"pair": p, "kind": kind, **report})
            print(f"  {mode:28s} pair {p} {kind:20s} {report['seconds']:7.2f} s", flush=True)
        shutil.rmtree(base, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "seconds": times,
        "median_s": med,
        "ratio_cold": med["cuforge cold"] / med["stock cold"],
        "ratio_fresh_host": med["cuforge fresh host"] / med["stock warm-local"],
        "problems": problems,
        "samples": samples,
    }


def figures(results: dict[str, Any]) -> dict[str, float]:
    """The ratios ``bench_check.py --gpu`` checks, by threshold name."""
    out = {}
    for mode, row in results["modes"].items():
        name = "autotune" if mode.startswith("max-autotune") else mode.replace("-", "_")
        out[f"coldstart_{name}_cold"] = row["ratio_cold"]
        out[f"coldstart_{name}_fresh_host"] = row["ratio_fresh_host"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--pairs", type=int, default=3, help="alternated pairs of each kind (3)")
    ap.add_argument(
        "--modes", default=",".join(MODES), help=f"torch.compile modes (default {','.join(MODES)})"
    )
    ap.add_argument("--width", type=int, default=1024, help="the MLP's width (1024)")
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.pairs < 1 or not modes:
        ap.error("--pairs must be >= 1 and --modes name at least one mode")
    tmp = Path(tempfile.mkdtemp(prefix="bench-coldstart-"))
    try:
        # Untimed: the page cache holds torch, triton and the compilers before pair 0.
        _run(args.device, "default", "stock", _env(tmp / "warmup", None, args.width, args.device))
        results: dict[str, Any] = {"device": args.device, "width": args.width, "modes": {}}
        for mode in modes:
            results["modes"][mode] = measure(args.device, mode, args.pairs, args.width, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["figures"] = figures(results)
    print(f"\ntorch.compile from a fresh process, {args.device}, medians of {args.pairs} pairs:")
    for mode, row in results["modes"].items():
        med = row["median_s"]
        print(
            f"  {mode:28s} cold: stock {med['stock cold']:6.2f} s, cuforge "
            f"{med['cuforge cold']:6.2f} s = {row['ratio_cold']:.3f}x (goal <= 1.03)"
        )
        print(
            f"  {'':28s} warm: stock warm-local {med['stock warm-local']:6.2f} s, cuforge "
            f"fresh host {med['cuforge fresh host']:6.2f} s = {row['ratio_fresh_host']:.3f}x "
            "(goal <= 1.10)"
        )
    problems = [p for row in results["modes"].values() for p in row["problems"]]
    for p in problems:
        print(f"PROBLEM: {p}")
    _results.write(args.json, "bench_coldstart", results, args.note)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
