"""Render a shoal trace (Chrome trace-event JSON) as a PNG timeline with matplotlib.

Makes the picture in ``docs/tracing.md``: it records TPC-H query ``--query`` at
``--scale`` on the Ray runner with ``shoal.trace`` and draws the trace::

    pip install matplotlib   # not a dependency of shoal
    python benchmarks/trace_timeline.py --scale 0.1 --query 5 \\
        --trace /tmp/q5.json --png docs/img/trace-tpch-q5.png

With ``--no-run`` it only draws an existing ``--trace``. The top panel has one row per
track (the dispatch loop, each stage, each worker); the bottom panel the counters.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

DRIVER_COLORS = {
    "plan": "#888888",
    "start runner": "#bbbbbb",
    "construct dispatch batch": "#e6ab02",
    "dispatch": "#d95f02",
    "await": "#7570b3",
    "fetch result": "#1b9e77",
}


def record(scale: float, query: int, trace_path: Path, partition_bytes: int, cpus: int) -> None:
    """Run TPC-H ``query`` at ``scale`` on Ray (after one untraced warm-up run) under
    ``shoal.trace(trace_path)``."""
    import shoal
    from shoal.tpch.datagen import generate
    from shoal.tpch.queries import QUERIES, scan_tables

    data = generate(scale)
    shoal.set_config(num_cpus=cpus)
    config = shoal.Config(target_partition_bytes=partition_bytes)
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=config)
    lf = QUERIES[query](scan_tables(data))
    lf.collect(engine=engine)
    with shoal.trace(trace_path):
        lf.collect(engine=engine)
    shoal.shutdown()


def render(trace_path: Path, png_path: Path, title: str) -> None:
    """Draw the first query of ``trace_path`` into ``png_path``, laid out as Perfetto
    lays out the same file: a time ruler on top, one group per process (the query's
    driver tracks, then each Ray node's worker processes) under a shaded header, each
    track a row of slices named as in the trace (a slice wide enough shows its name),
    the launch arrows from stage slices to task slices, and the counters below."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    data = json.loads(trace_path.read_text())
    events: list[dict[str, Any]] = data["traceEvents"]
    names: dict[tuple[int, int], str] = {}
    procs: dict[int, str] = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
    slices = [e for e in events if e["ph"] == "X"]
    (query,) = [e for e in slices if e["name"] == "query"][:1]
    qpid = query["pid"]

    # Rows, top to bottom, in Perfetto's groups: the query's process (dispatch loop, then
    # one track per stage), then one group per Ray node (a track per worker process).
    loop_track = (qpid, query["tid"])
    stage_tracks = sorted({(e["pid"], e["tid"]) for e in slices if e["cat"] == "stage"})
    worker_tracks = sorted({(e["pid"], e["tid"]) for e in slices if e["cat"] == "task"})
    rows: list[tuple[int, int] | None] = [None, loop_track, *stage_tracks]  # None: a header
    labels = [procs.get(qpid, "shoal query"), "dispatch loop"]
    labels += [_short(names[t]) for t in stage_tracks]
    headers = [0]
    for pid in sorted({t[0] for t in worker_tracks}):
        headers.append(len(rows))
        rows.append(None)
        labels.append(procs.get(pid, f"process {pid}"))
        for t in (t for t in worker_tracks if t[0] == pid):
            rows.append(t)
            labels.append(names[t])
    y = {t: i for i, t in enumerate(rows) if t is not None}

    cmap = plt.get_cmap("tab10")
    stage_ids = sorted({e["args"]["stage"] for e in slices if e["cat"] in ("stage", "task")})
    color = {sid: cmap(i % 10) for i, sid in enumerate(stage_ids)}
    ms = 1e-3  # trace microseconds -> milliseconds
    t0, end = query["ts"] * ms, (query["ts"] + query["dur"]) * ms

    fig, (ax, axc) = plt.subplots(
        2,
        1,
        figsize=(14, 0.36 * len(rows) + 4.4),
        sharex=True,
        gridspec_kw={"height_ratios": [0.36 * len(rows) + 0.8, 2.4]},
    )
    ax.set_xlim(t0, end)
    for h in headers:  # a process's header row, shaded as Perfetto shades it
        ax.axhspan(h - 0.5, h + 0.5, color="#e8eaed", zorder=0)
    fig.canvas.draw()
    px_per_ms = ax.get_window_extent().width / max(end - t0, 1e-9)
    for e in slices:
        track = (e["pid"], e["tid"])
        if track not in y or e["name"] == "query":
            continue
        c: Any
        if e["cat"] == "driver":
            c = DRIVER_COLORS.get(e["name"], "#444444")
            text = e["name"]
        else:
            c = color[e["args"]["stage"]]
            text = f"p{e['args']['partition']}" if e["cat"] == "task" else e["name"]
        x, w = e["ts"] * ms, max(e["dur"] * ms, 0.05)
        ax.broken_barh(
            [(x, w)], (y[track] - 0.4, 0.8), facecolors=c, edgecolors="#202124", linewidth=0.3
        )
        room = int((w * px_per_ms - 4) / 5.2)  # characters that fit (7-pixel font)
        if len(text) <= room or room >= 8:
            shown = text if len(text) <= room else text[: room - 1] + "\u2026"
            ax.text(
                x + w / 2, y[track], shown, ha="center", va="center", fontsize=6.5,
                color="white" if e["cat"] != "driver" else "black", clip_on=True,
            )  # fmt: skip
    # The launch arrows, faint: stage slice -> task slice (drawn at the task's midpoint).
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    for f in (e for e in events if e["ph"] == "f"):
        s = starts.get(f["id"])
        if s is None or (s["pid"], s["tid"]) not in y or (f["pid"], f["tid"]) not in y:
            continue
        ax.annotate(
            "",
            xy=(f["ts"] * ms, y[(f["pid"], f["tid"])] - 0.4),
            xytext=(s["ts"] * ms, y[(s["pid"], s["tid"])] + 0.4),
            arrowprops={"arrowstyle": "-|>", "color": "#5f6368", "lw": 0.3, "alpha": 0.45},
            zorder=0,
        )
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    for h in headers:
        ax.get_yticklabels()[h].set_fontweight("bold")
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.grid(axis="x", linewidth=0.3, color="#dadce0")
    ax.tick_params(axis="x", top=True, labeltop=True, labelsize=8)  # the ruler on top
    ax.set_title(title, fontsize=11)
    legend = [Patch(color=v, label=k) for k, v in DRIVER_COLORS.items()]
    legend += [Patch(color=color[s], label=f"stage {s}") for s in stage_ids]
    ax.legend(handles=legend, fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))

    counters: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "C" and e["pid"] == qpid:
            ((series, value),) = e["args"].items()
            counters[f"{e['name']} {series}"].append((e["ts"] * ms, value))
    # ("CPUs free" is the CPU count minus "tasks running" here: one CPU per task.)
    shown = {"tasks running": "tasks running (workers)", "tasks in flight": "tasks in flight"}
    for name, label in shown.items():
        pts = sorted(counters.get(name, []))
        if pts:
            xs = [p[0] for p in pts] + [end]
            ys = [p[1] for p in pts] + [pts[-1][1]]
            axc.step(xs, ys, where="post", label=label)
    axc.set_ylabel("count")
    axc.grid(linewidth=0.3, color="#dadce0")
    axb = axc.twinx()
    pts = sorted(counters.get("object store bytes", []))
    if pts:
        xs = [p[0] for p in pts] + [end]
        ys = [p[1] / 2**20 for p in pts] + [pts[-1][1] / 2**20]
        axb.fill_between(xs, ys, step="post", color="#1b9e77", alpha=0.15)
        axb.step(
            xs, ys, where="post", color="#1b9e77", linewidth=0.8, label="object store MiB (est.)"
        )
    axb.set_ylabel("MiB")
    handles = axc.get_legend_handles_labels()[0] + axb.get_legend_handles_labels()[0]
    axc.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.06, 1.0))
    axc.set_xlabel("time since the trace's start (ms)")
    fig.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=110)


def _short(label: str, width: int = 44) -> str:
    return label if len(label) <= width else label[: width - 1] + "\u2026"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--query", type=int, default=5)
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--partition-mib", type=float, default=4.0)
    p.add_argument("--trace", type=Path, default=Path("/tmp/shoal-trace-tpch.json"))
    p.add_argument("--png", type=Path, default=Path("docs/img/trace-tpch-q5.png"))
    p.add_argument("--no-run", action="store_true", help="only draw an existing --trace")
    args = p.parse_args()
    if not args.no_run:
        record(args.scale, args.query, args.trace, int(args.partition_mib * 2**20), args.cpus)
    title = f"shoal trace: TPC-H Q{args.query}, scale {args.scale:g}, Ray runner"
    render(args.trace, args.png, title)
    print(f"wrote {args.png} from {args.trace}")


if __name__ == "__main__":
    main()
