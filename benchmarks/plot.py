"""SVG plots for the docs, drawn from recorded benchmark results only.

    python benchmarks/plot.py [--results benchmarks/results] [--out docs/_generated/plots]

Reads every ``*.json`` in ``--results`` (the files ``--json PATH`` of a bench writes,
see ``_results.py``, and GPU runs recorded in the same format). Each plot takes the
newest result (by its ``date``) that holds the numbers it needs, and writes
``NAME.svg`` and ``NAME.md`` -- a caption naming the result file, its date, machine,
command and note -- into ``--out``:

- ``cache-hits``: a compile-with-cache hit and a raw 4 KiB ``get`` per backend,
  cuforge beside cuda.core (``run.py``, i.e. ``make bench``);
- ``cli-cold``: whole ``cuforge`` processes beside ``python -c pass`` (``bench_cli``
  or ``run.py``);
- ``graph-phases``: graph build / instantiate / launch+sync / destroy by node count,
  cuforge beside cuda.core (``bench_graph``, GPU);
- ``launch``: one kernel launch beside cuda.core and the C floor (``bench_launch``, GPU).

Nothing is typed in by hand here: a plot whose numbers no result holds is an error
(exit 1) naming what is missing, and so is a file that is not a result. matplotlib
(the ``docs`` extra) draws; the SVGs keep text as text and carry no timestamp, so
the same results give the same files.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CUFORGE, PEER, OTHER = "#2a7ab0", "#e08a2c", "#8c8c8c"


class PlotError(Exception):
    """A result file is malformed, or no result holds what a plot needs."""


class Result:
    """One result file: its path (relative, for captions) and parsed content."""

    def __init__(self, path: str) -> None:
        self.path = os.path.relpath(os.path.abspath(path), REPO)  # as captions name it
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            raise PlotError(f"{self.path}: not readable JSON ({exc})") from None
        if not isinstance(doc, dict):
            raise PlotError(f"{self.path}: not a benchmark result (a JSON object expected)")
        for field in ("schema", "bench", "date", "command", "results"):
            if field not in doc:
                raise PlotError(f"{self.path}: not a benchmark result (no {field!r})")
        if doc["schema"] != 1:
            raise PlotError(f"{self.path}: schema {doc['schema']!r}, this script reads 1")
        self.doc = doc
        self.bench: str = doc["bench"]
        self.date: str = doc["date"]
        self.results: dict[str, Any] = doc["results"]

    def version(self, dist: str) -> str:
        return (self.doc.get("versions") or {}).get(dist) or "?"

    def caption(self, what: str) -> str:
        """Markdown: what the plot shows and where every number comes from."""
        d = self.doc
        m = d.get("machine") or {}
        if "gpu" in m:
            machine = m["gpu"] + (f", driver {m['driver']}" if m.get("driver") else "")
        else:
            machine = f"{m.get('cpus', '?')} CPUs ({m.get('cpu', '?')}), Python {m.get('python')}"
            load = m.get("loadavg") or {}
            if load.get("start") and load.get("end"):
                machine += (
                    f", load average {load['start'][0]:.1f} at the start and "
                    f"{load['end'][0]:.1f} at the end"
                )
        lines = [
            what,
            "",
            f"Source: `{self.path}`"
            + (f" (recorded from {d['recorded_from']})" if d.get("recorded_from") else "")
            + f"; measured {self.date[:10]} on {machine}; command `{_shown(d['command'])}`.",
        ]
        if d.get("note"):
            lines += ["", f"Note: {d['note']}"]
        return "\n".join(lines) + "\n"


def _shown(command: str) -> str:
    """The command as a caption shows it: without ``--note TEXT`` (shown on its own)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
        elif w == "--note":
            skip = True
        elif not w.startswith("--note="):
            out.append(w)
    return shlex.join(out)


def load(folder: str) -> list[Result]:
    paths = sorted(glob.glob(os.path.join(folder, "*.json")))
    if not paths:
        raise PlotError(f"{folder}: no result files (*.json)")
    return [Result(p) for p in paths]


def newest(results: list[Result], what: str, pick: Callable[[Result], Any]) -> tuple[Result, Any]:
    """The newest result for which ``pick`` finds the numbers (not None, no KeyError)."""
    for r in sorted(results, key=lambda r: (r.date, r.path), reverse=True):
        try:
            found = pick(r)
        except (KeyError, TypeError):
            continue
        if found is not None:
            return r, found
    raise PlotError(f"no result file holds {what}")


# -- the numbers each plot needs ---------------------------------------------------


def _cache_hits(r: Result) -> dict[str, Any] | None:
    if r.bench != "run":
        return None
    m = r.results["measurements"]
    fleet = r.results.get("fleet_compile_hit_1kb_us") or {}
    backends = r.results["backends"]["backends_us"]
    peer = f"cuda.core {r.version('cuda-core')}"
    hit = m["compile(cubin, cache=FileStream) hit, 1 KB"]
    compile_bars = [("cuforge", "FileStream", hit["cuforge"])]
    if hit["cuda.core"]:
        compile_bars.append((peer, "FileStream", hit["cuda.core"]))
    for key, label in (
        ("tiered_hit_us", "memory -> Redis (repeat hit)"),
        ("redis_hit_us", "Redis (loopback)"),
        ("signed_redis_hit_us", "Redis, signed entries"),
    ):
        if key in fleet:
            compile_bars.append(("cuforge", label, fleet[key]))
    get_bars = []
    for name, label in (("InMemory get, 4 KiB", "memory"), ("FileStream get, 4 KiB", "FileStream")):
        get_bars.append(("cuforge", label, m[name]["cuforge"]))
        if m[name]["cuda.core"]:
            get_bars.append((peer, label, m[name]["cuda.core"]))
    get_bars.append(("cuforge", "SQLite", backends["sqlite"]["get"]))
    if "diskcache" in backends:
        get_bars.append(("diskcache", "SQLite (diskcache)", backends["diskcache"]["get"]))
    return {"compile": compile_bars, "get": get_bars, "peer": peer}


def _cli(r: Result) -> dict[str, Any] | None:
    if r.bench == "bench_cli":
        return r.results["process_ms"]
    if r.bench == "run":
        return r.results["cli"]["process_ms"]
    return None


def _graph(r: Result) -> dict[str, Any] | None:
    if r.bench != "bench_graph" or not r.results["collect"]:
        return None
    nodes = r.results["nodes"]
    if not all("cuda.core_us" in v for v in nodes.values()):
        return None
    return nodes


def _launch(r: Result) -> dict[str, Any] | None:
    return r.results["per_launch_us"] if r.bench == "bench_launch" else None


# -- drawing -------------------------------------------------------------------------


def _setup() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: small, searchable, crisp
            "svg.hashsalt": "cuforge",  # stable ids: same results, same file
            "font.family": "sans-serif",
            "font.size": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


def _save(fig: Any, out: str, name: str, caption: str) -> None:
    fig.savefig(
        os.path.join(out, f"{name}.svg"),
        format="svg",
        bbox_inches="tight",
        metadata={"Date": None, "Creator": "benchmarks/plot.py"},
    )
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(caption)


def _fmt_us(us: float) -> str:
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} µs" if us >= 10 else f"{us:.2f} µs"


def _color(who: str) -> str:
    return CUFORGE if who == "cuforge" else PEER if who.startswith("cuda.core") else OTHER


def _hbars(ax: Any, bars: list[tuple[str, str, float]], title: str) -> None:
    """Horizontal bars on a log axis, labelled with library, backend and value."""
    labels = [f"{who}: {what}" for who, what, _ in bars]
    values = [v for _, _, v in bars]
    ys = range(len(bars))[::-1]
    ax.barh(list(ys), values, color=[_color(w) for w, _, _ in bars], height=0.6)
    ax.set_yticks(list(ys), labels)
    ax.set_xscale("log")
    ax.set_xlim(min(values) / 2, max(values) * 6)
    for y, v in zip(ys, values, strict=True):
        ax.text(v * 1.12, y, _fmt_us(v), va="center", fontsize=9)
    ax.set_title(title, loc="left", fontsize=10)
    ax.set_xlabel("median time per call, µs (log scale; shorter is faster)")


def plot_cache_hits(plt: Any, r: Result, d: dict[str, Any], out: str) -> None:
    heights = [len(d["compile"]), len(d["get"])]
    fig, axes = plt.subplots(
        2, 1, figsize=(8, 0.42 * sum(heights) + 2.2), gridspec_kw={"height_ratios": heights}
    )
    _hbars(axes[0], d["compile"], "Program(src).compile('cubin', cache=...) on a hit, 1 KB kernel")
    _hbars(axes[1], d["get"], "cache.get(key), one warm 4 KiB entry")
    fig.tight_layout()
    _save(
        fig,
        out,
        "cache-hits",
        r.caption(
            f"Cache hits by backend, cuforge beside {d['peer']} (and diskcache, the "
            "SQLite-backed Python cache, beside cuforge's SQLite backend). Each pair "
            "of bars was measured the same way in one run; Redis is a private "
            "redis-server on loopback."
        ),
    )
    plt.close(fig)


CLI_CASES = (
    ("python -c pass", "python -c pass (the floor)"),
    ("import cuforge", "python -c 'import cuforge'"),
    ("import cuforge.utils", "python -c 'import cuforge.utils'"),
    ("from cuforge import Program, ProgramOptions", "the README's import line, compile only"),
    (
        "from cuforge import Device, LaunchConfig, Program, ProgramOptions, launch",
        "the README's import line, with the runtime",
    ),
    ("compile hit (repeated command)", "cuforge compile: hit, repeated command"),
    ("compile hit (kernel with a header)", "cuforge compile: hit, kernel with a header"),
    ("compile hit (nothing kept: STATE_DIR=off)", "... the same, CUFORGE_STATE_DIR=off"),
)


def plot_cli(plt: Any, r: Result, p: dict[str, Any], out: str) -> None:
    cases = [(label, p[key]["median"]) for key, label in CLI_CASES if key in p]
    floor = p["python -c pass"]["median"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(cases) + 1.2))
    ys = list(range(len(cases)))[::-1]
    values = [v for _, v in cases]
    colors = [OTHER if i == 0 else CUFORGE for i in range(len(cases))]
    ax.barh(ys, values, color=colors, height=0.6)
    ax.set_yticks(ys, [label for label, _ in cases])
    ax.axvline(floor, color=OTHER, linestyle="--", linewidth=1)
    for y, v in zip(ys, values, strict=True):
        ax.text(v + max(values) * 0.01, y, f"{v:.1f} ms  ({v / floor:.2f}x pass)", va="center")
    ax.set_xlim(0, max(values) * 1.35)
    ax.set_xlabel("median wall time of a whole process, ms (shorter is faster)")
    ax.set_title("A cuforge command from a cold process, beside the interpreter's start-up",
                 loc="left", fontsize=10)  # fmt: skip
    fig.tight_layout()
    runs = r.results.get("runs") or r.results.get("cli", {}).get("runs")
    _save(
        fig,
        out,
        "cli-cold",
        r.caption(
            "Cold-process command-line times: each case is a new process, "
            f"{runs} runs each, interleaved with `python -c pass` so machine load hits "
            "both alike. The dashed line is the floor."
        ),
    )
    plt.close(fig)


PHASES = (("build", "build"), ("instantiate", "instantiate"),
          ("launch+sync", "launch + sync"), ("destroy", "destroy"))  # fmt: skip


def plot_graph(plt: Any, r: Result, nodes: dict[str, Any], out: str) -> None:
    sizes = sorted(nodes, key=int)
    peer = f"cuda.core {r.version('cuda-core')}"
    fig, axes = plt.subplots(1, 4, figsize=(10, 3.6), sharey=True)
    width = 0.38
    for ax, (key, title) in zip(axes, PHASES, strict=True):
        ours = [nodes[n]["cuforge_us"][key] for n in sizes]
        theirs = [nodes[n]["cuda.core_us"][key] for n in sizes]
        xs = range(len(sizes))
        ax.bar([x - width / 2 for x in xs], ours, width, color=CUFORGE, label="cuforge")
        ax.bar([x + width / 2 for x in xs], theirs, width, color=PEER, label=peer)
        for x, n, a, b in zip(xs, sizes, ours, theirs, strict=True):
            # A recorded ratio (of unrounded medians) wins over one of rounded values.
            ratio = nodes[n].get("ratio", {}).get(key, a / b)
            ax.text(x, max(a, b) * 1.25, f"{ratio:.2f}x", ha="center", fontsize=8)
        ax.set_xticks(list(xs), [f"{int(n):,}" for n in sizes])
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("kernel nodes")
    axes[0].set_ylabel("median µs (log scale)")
    axes[0].legend(loc="upper left", frameon=False, fontsize=8)
    top = max(nodes[n][f"{who}_us"][k] for n in sizes for who in ("cuforge", "cuda.core")
              for k, _ in PHASES)  # fmt: skip
    axes[0].set_ylim(top=top * 3)
    fig.tight_layout()
    _save(
        fig,
        out,
        "graph-phases",
        r.caption(
            f"CUDA graph phases by node count, cuforge beside {peer} in the same process "
            "(labels: cuforge's time as a ratio of cuda.core's; below 1.00x is faster). "
            "Every round starts after `gc.collect()`; the libraries alternate which "
            "goes first."
        ),
    )
    plt.close(fig)


LAUNCH_ROWS = ("C loop", "cuda.bindings raw", "cuforge", "cuda.core")


def plot_launch(plt: Any, r: Result, per: dict[str, Any], out: str) -> None:
    bars: list[tuple[str, str, float]] = []
    for kind, label in (("empty", "empty kernel"), ("4 args", "4 arguments")):
        for who in LAUNCH_ROWS:
            for name, v in per.items():
                if name.startswith(who) and name.endswith(" " + kind):
                    shown = name[: -len(kind) - 1]
                    bars.append((shown, label, v["median"]))
    fig, ax = plt.subplots(figsize=(8, 0.42 * len(bars) + 1.2))
    ys = list(range(len(bars)))[::-1]
    values = [v for _, _, v in bars]
    ax.barh(ys, values, color=[_color(w) for w, _, _ in bars], height=0.6)
    ax.set_yticks(ys, [f"{kind}: {who}" for who, kind, _ in bars])
    for y, v in zip(ys, values, strict=True):
        ax.text(v + 0.05, y, f"{v:.2f} µs", va="center")
    ax.set_xlim(0, max(values) * 1.25)
    ax.set_xlabel("median µs per launch (shorter is faster)")
    ax.set_title("One kernel launch: the C loop floor, cuda.bindings, cuforge, cuda.core",
                 loc="left", fontsize=10)  # fmt: skip
    fig.tight_layout()
    _save(
        fig,
        out,
        "launch",
        r.caption(
            "Launch overhead: the wall time of "
            f"{r.results['launches']:,} back-to-back launches divided by their number, "
            f"median of {r.results['repeats']} repeats, the libraries alternating. "
            "`C loop` calls `cuLaunchKernel` from C, a floor no Python library can go "
            "below; `cuda.bindings raw` calls `cuLaunchKernelEx` through cuda.bindings."
        ),
    )
    plt.close(fig)


#: name -> (what the numbers are, where they come from, how they are drawn)
PLOTS: dict[str, tuple[str, Callable[[Result], Any], Callable[..., None]]] = {
    "cache-hits": (
        "cache hit latencies (a run.py result: make bench BENCH_ARGS='--json PATH')",
        _cache_hits,
        plot_cache_hits,
    ),
    "cli-cold": (
        "cold-process CLI times (bench_cli.py --json or run.py --json)",
        _cli,
        plot_cli,
    ),
    "graph-phases": (
        "graph phase timings beside cuda.core (bench_graph.py --json)",
        _graph,
        plot_graph,
    ),
    "launch": ("launch timings (bench_launch.py --json)", _launch, plot_launch),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=os.path.join(HERE, "results"), help="result JSON files")
    ap.add_argument("--out", default=os.path.join(HERE, "..", "docs", "_generated", "plots"))
    args = ap.parse_args(argv)
    try:
        results = load(args.results)
        # Every plot's numbers first: a missing one is reported before any drawing.
        chosen = {name: newest(results, what, pick) for name, (what, pick, _) in PLOTS.items()}
        try:
            plt = _setup()
        except ImportError as exc:
            raise PlotError(f"{exc.name} is not installed: pip install -e '.[docs]'") from None
        os.makedirs(args.out, exist_ok=True)
        for name, (r, data) in chosen.items():
            PLOTS[name][2](plt, r, data, args.out)
            print(f"{os.path.relpath(os.path.join(args.out, name))}.svg <- {r.path}")
    except PlotError as exc:
        print(f"plot.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
