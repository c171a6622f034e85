"""The first torch.compile of a process, through cuforge beside stock, in one run.

Each sample is a fresh process (``_coldstart_child.py``) that compiles a small MLP
with ``torch.compile`` and times it from just after ``import torch`` to the first
compiled result on the host. Four kinds of process, per compile mode:

- **stock cold**: stock torch, empty ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR``;
- **stock warm-local**: stock again, on the directories its cold run just filled;
- **cuforge cold**: empty local directories and an empty cuforge ``file://`` cache,
  with a secret set; Triton's manager (``$TRITON_CACHE_MANAGER``, in Inductor's
  compile workers too) and Inductor's remote FX-graph, AOT-autograd, autotune and
  bundled-autotune caches on cuforge (``cuforge.integrations.inductor.install()``,
  inside the timed part);
- **cuforge fresh host**: empty local directories again, on the cuforge cache that
  its cold run just filled (a new machine of the fleet).

A pair is one stock and one cuforge process of the same kind; the order alternates
between pairs (stock first in even pairs), each warm kind right after the cold runs
that filled its caches. The figures are ratios of medians: cuforge cold / stock cold
(issue 37's goal: <= 1.03) and cuforge fresh host / stock warm-local (<= 1.10), for
each mode. Every process's counters are checked (a cold run compiled, a warm one
hit, cuforge stored and served), so a figure never measures the wrong thing.

    python3 benchmarks/bench_coldstart.py [--device cuda] [--pairs 3]
        [--modes max-autotune-no-cudagraphs,default] [--width 1024] [--profile] [--json PATH]

The environment gives the defaults (``COLDSTART_PAIRS``, ``COLDSTART_MODES``,
``COLDSTART_WIDTH``, ``COLDSTART_PROFILE=1``, ``COLDSTART_CUFORGE_ENV``: more
environment for the cuforge processes, such as ``CUFORGE_WRITE_BEHIND=0``), so
``scripts/gpu-test --bench coldstart`` can be narrowed without editing it.
``--profile`` runs, per mode, one profiled process of stock cold, cuforge cold and
cuforge fresh host instead, and prints where cuforge's time went, in the compiling
process and in the compile workers (``_coldprofile``); its times are not figures.

``scripts/gpu-test --bench`` runs it on the GPU machine and checks the ratios with
``bench_check.py --gpu`` against ``benchmarks/thresholds.toml``. On a CPU
(``--device cpu --width 64``) it checks the harness itself: Inductor compiles C++
there, so only Inductor's FX-graph and AOT-autograd caches go through cuforge.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _coldprofile
import _results

ROOT = Path(__file__).resolve().parent.parent
CHILD = str(Path(__file__).with_name("_coldstart_child.py"))
SITE = str(Path(__file__).with_name("_profilesite"))
MANAGER = "cuforge.integrations.triton:CuforgeCacheManager"
SECRET = "bench-coldstart-secret-0123456789abcdef"
MODES = ("max-autotune-no-cudagraphs", "default")
KINDS = ("stock cold", "cuforge cold", "stock warm-local", "cuforge fresh host")
#: Inductor's remote caches cuforge serves (each needs its own switch); the autotune
#: caches are Triton's, so a CPU run leaves them off (Inductor refuses them there).
REMOTE_SWITCHES = ("TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE", "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE")
GPU_SWITCHES = (
    "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
    "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE",
)
CHILD_TIMEOUT_S = 600


#: More environment for the cuforge processes (``$COLDSTART_CUFORGE_ENV``, ``K=V ...``),
#: e.g. ``CUFORGE_WRITE_BEHIND=0`` to measure synchronous stores.
CUFORGE_EXTRA: dict[str, str] = {}


def _env(
    local: Path, cuforge: Path | None, width: int, device: str, profile: Path | None = None
) -> dict[str, str]:
    """A child's environment: its own local directories; cuforge's settings or none;
    with ``profile``, every Python process of it profiled into that directory."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUFORGE_", "TRITON_", "TORCHINDUCTOR_", "COLDPROFILE_"))
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
    paths = [str(ROOT / "src"), env.get("PYTHONPATH", "")]
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        paths.insert(0, SITE)
        env[_coldprofile.ENV] = str(profile)
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if cuforge is not None:
        env.update(
            TRITON_CACHE_MANAGER=MANAGER,
            CUFORGE_CACHE=f"file://{cuforge}",
            CUFORGE_CACHE_SECRET=SECRET,
            **dict.fromkeys(REMOTE_SWITCHES, "1"),
        )
        if device != "cpu":
            env.update(dict.fromkeys(GPU_SWITCHES, "1"))
        env.update(CUFORGE_EXTRA)
    return env


def _run(device: str, mode: str, side: str, env: dict[str, str]) -> dict[str, Any]:
    """One child process; its report, with ``process_s`` (its whole life, measured
    here: start-up, the compile, and the exit that waits for every store) and
    ``pid``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, CHILD, device, mode, side],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    process_s = time.perf_counter() - t0
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(
            f"bench_coldstart: a {side} {mode} process failed (exit {proc.returncode}):\n"
            f"{err[-4000:]}"
        )
    report: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    report["process_s"] = process_s
    report["pid"] = proc.pid
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


def _pair_runs(base: Path, width: int, device: str) -> dict[str, tuple[str, dict[str, str]]]:
    """Each kind's side and environment for one pair, under ``base``."""
    stock_local, cache = base / "stock", base / "cuforge-cache"
    return {
        "stock cold": ("stock", _env(stock_local, None, width, device)),
        "stock warm-local": ("stock", _env(stock_local, None, width, device)),
        "cuforge cold": ("cuforge", _env(base / "cuforge-cold", cache, width, device)),
        "cuforge fresh host": ("cuforge", _env(base / "cuforge-fresh", cache, width, device)),
    }


def measure(device: str, mode: str, pairs: int, width: int, tmp: Path) -> dict[str, Any]:
    """``pairs`` alternated pairs of each kind for one compile ``mode``."""
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    problems: list[str] = []
    samples: list[dict[str, Any]] = []
    slug = mode.replace("-", "_")
    for p in range(pairs):
        base = tmp / f"{slug}-{p}"
        runs = _pair_runs(base, width, device)
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
            landed = f", landed {report['landed_s']:6.2f} s" if "landed_s" in report else ""
            print(
                f"  {mode:28s} pair {p} {kind:20s} {report['seconds']:7.2f} s"
                f"{landed} (process {report['process_s']:.1f} s)",
                flush=True,
            )
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


def profile(device: str, mode: str, width: int, tmp: Path) -> dict[str, Any]:
    """One profiled process each of stock cold, cuforge cold and cuforge fresh host."""
    base = tmp / f"profile-{mode.replace('-', '_')}"
    out: dict[str, Any] = {}
    cache = base / "cuforge-cache"
    for kind, local, cuforge in (
        ("stock cold", base / "stock", None),
        ("cuforge cold", base / "cuforge-cold", cache),
        ("cuforge fresh host", base / "cuforge-fresh", cache),
    ):
        where = base / f"profile-{kind.replace(' ', '-')}"
        env = _env(local, cuforge, width, device, profile=where)
        report = _run(device, mode, "stock" if cuforge is None else "cuforge", env)
        report["profile"] = _coldprofile.summarize(str(where), report["pid"])
        report["problems"] = _problems(kind, report)
        out[kind] = report
    shutil.rmtree(base, ignore_errors=True)
    return out


def figures(results: dict[str, Any]) -> dict[str, float]:
    """The ratios ``bench_check.py --gpu`` checks, by threshold name."""
    out = {}
    for mode, row in results["modes"].items():
        name = "autotune" if mode.startswith("max-autotune") else mode.replace("-", "_")
        out[f"coldstart_{name}_cold"] = row["ratio_cold"]
        out[f"coldstart_{name}_fresh_host"] = row["ratio_fresh_host"]
    return out


def _print_profile(mode: str, runs: dict[str, Any]) -> list[str]:
    problems = []
    for kind, report in runs.items():
        landed = f", stores landed at {report['landed_s']:.2f} s" if "landed_s" in report else ""
        print(
            f"\n{mode}, {kind}: first result at {report['seconds']:.2f} s{landed}; "
            f"{report['profile']['processes']} processes profiled"
        )
        print(_coldprofile.table(report["profile"]))
        problems += [f"{mode}, profile, {kind}: {why}" for why in report["problems"]]
    return problems


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=env.get("COLDSTART_DEVICE", "cuda"), help="cuda or cpu")
    ap.add_argument(
        "--pairs",
        type=int,
        default=int(env.get("COLDSTART_PAIRS", "3")),
        help="alternated pairs of each kind ($COLDSTART_PAIRS, 3)",
    )
    ap.add_argument(
        "--modes",
        default=env.get("COLDSTART_MODES", ",".join(MODES)),
        help=f"torch.compile modes ($COLDSTART_MODES, {','.join(MODES)})",
    )
    ap.add_argument(
        "--width",
        type=int,
        default=int(env.get("COLDSTART_WIDTH", "1024")),
        help="the MLP's width ($COLDSTART_WIDTH, 1024)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        default=env.get("COLDSTART_PROFILE", "") not in ("", "0"),
        help="profiled processes instead of the figures ($COLDSTART_PROFILE=1)",
    )
    ap.add_argument(
        "--cuforge-env",
        default=env.get("COLDSTART_CUFORGE_ENV", ""),
        help="more environment for the cuforge processes, 'K=V K2=V2' "
        "($COLDSTART_CUFORGE_ENV; e.g. CUFORGE_WRITE_BEHIND=0)",
    )
    _results.add_arguments(ap)
    args = ap.parse_args(argv)
    for word in shlex.split(args.cuforge_env):
        name, eq, value = word.partition("=")
        if not eq or not name:
            ap.error(f"--cuforge-env / $COLDSTART_CUFORGE_ENV: {word!r} is not NAME=VALUE")
        CUFORGE_EXTRA[name] = value
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.pairs < 1 or not modes or args.width < 1:
        ap.error("--pairs and --width must be >= 1 and --modes must name at least one mode")
    tmp = Path(tempfile.mkdtemp(prefix="bench-coldstart-"))
    results: dict[str, Any] = {
        "device": args.device,
        "width": args.width,
        "cuforge_env": CUFORGE_EXTRA,
        "modes": {},
    }
    try:
        # Untimed: the page cache holds torch, triton and Inductor before pair 0.
        warm = _env(tmp / "warmup", None, args.width, args.device)
        subprocess.run(
            [sys.executable, "-c", "import torch, torch._inductor.compile_fx"],
            env=warm,
            check=False,
            timeout=CHILD_TIMEOUT_S,
        )
        if args.profile:
            problems = []
            for mode in modes:
                runs = profile(args.device, mode, args.width, tmp)
                results["modes"][mode] = runs
                problems += _print_profile(mode, runs)
        else:
            for mode in modes:
                results["modes"][mode] = measure(args.device, mode, args.pairs, args.width, tmp)
            problems = [p for row in results["modes"].values() for p in row["problems"]]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not args.profile:
        results["figures"] = figures(results)
        print(f"\ntorch.compile in a fresh process, {args.device}, medians of {args.pairs} pairs:")
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
    for p in problems:
        print(f"PROBLEM: {p}")
    name = "bench_coldstart_profile" if args.profile else "bench_coldstart"
    _results.write(args.json, name, results, args.note)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
