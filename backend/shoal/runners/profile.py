"""The profile of a query that ran: ``explain(..., analyze=True)``'s per-stage table, and
the stage graph as a mermaid flowchart (``explain(..., format="mermaid")``).

Read from a :class:`~shoal.runners.session.QueryReport` (the physical plan and every
task's :class:`~shoal.execution.kernel.TaskStats`); nothing here runs a query.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.planner.physical import PhysicalPlan
    from shoal.runners.session import QueryReport

#: A stage is flagged as skewed when its slowest task took this many times its median task
#: (and at least :data:`SKEW_MIN_S` seconds), or its largest output this many times the
#: median output.
SKEW_RATIO = 4.0
SKEW_MIN_S = 0.05
#: A shuffle or broadcast writing more than this many bytes in all is flagged.
LARGE_EXCHANGE_BYTES = 1 << 30


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def analyze_text(report: QueryReport) -> str:
    """Per stage, root last: tasks, rows in and out, bytes out, task wall time
    (min / median / max in seconds, so that skew shows), the nodes the tasks ran on, and
    warnings for skew, large exchanges and broadcasts; then the memory controls' counts
    (peak bytes held, tasks held back, split tasks) and replaced UDF actors."""
    lines = ["Profile (ran on the " + report.runner + " runner):"]
    header = (
        f"{'stage':<28} {'tasks':>5} {'rows in':>12} {'rows out':>12} {'bytes out':>11} "
        f"{'task s min/med/max':>20}  nodes"
    )
    lines.append(header)
    warnings: list[str] = []
    for st in report.physical.stages:
        stats = [s for (sid, _), s in report.task_stats.items() if sid == st.id]
        if not stats:
            lines.append(f"{f'{st.id} [{st.name}]':<28} {st.num_tasks:>5}  (no task ran)")
            continue
        times = sorted(s.end - s.start for s in stats)
        med = statistics.median(times)
        rows_in = sum(s.rows_in for s in stats)  # scanned rows included
        rows_out = sum(s.rows_out for s in stats)
        bytes_out = sum(s.bytes_out for s in stats)
        nodes = len({s.node_id for s in stats})
        timing = f"{times[0]:.3f}/{med:.3f}/{times[-1]:.3f}"
        lines.append(
            f"{f'{st.id} [{st.name}]':<28} {len(stats):>5} {rows_in:>12,} {rows_out:>12,} "
            f"{_size(bytes_out):>11} {timing:>20}  {nodes}"
        )
        if len(times) > 1 and times[-1] >= SKEW_MIN_S and times[-1] > SKEW_RATIO * max(med, 1e-9):
            warnings.append(
                f"stage {st.id} [{st.name}]: skew: its slowest task took {times[-1]:.3f} s, "
                f"{times[-1] / max(med, 1e-9):.1f}x the median"
            )
        outs = sorted(s.bytes_out for s in stats)
        median_out = max(statistics.median(outs), 1)
        if len(outs) > 1 and outs[-1] >= 1 << 20 and outs[-1] > SKEW_RATIO * median_out:
            warnings.append(
                f"stage {st.id} [{st.name}]: skew: its largest output is "
                f"{_size(outs[-1])}, {outs[-1] / median_out:.1f}x the median"
            )
        kind = st.describe_output()
        if bytes_out > LARGE_EXCHANGE_BYTES and ("hash" in kind or "range" in kind):
            warnings.append(
                f"stage {st.id} [{st.name}]: a large shuffle: {_size(bytes_out)} written ({kind})"
            )
        for inp in st.inputs:
            if inp.mode == "all":  # every task reads all of it: a broadcast
                sent = sum(
                    s.bytes_out for (sid, _), s in report.task_stats.items() if sid in inp.stages
                )
                if sent > LARGE_EXCHANGE_BYTES // 8:
                    warnings.append(
                        f"stage {st.id} [{st.name}]: broadcasts {_size(sent)} to each of its "
                        f"{st.num_tasks} tasks"
                    )
    mem = report.memory
    if mem is not None:
        lines.append(
            f"memory: peak {_size(mem.peak_bytes_held)} of task outputs held"
            + (f" (limit {_size(mem.max_bytes_held)})" if mem.max_bytes_held else "")
            + f"; {mem.held_back} times held back, {mem.forced} forced, "
            f"{len(mem.splits)} tasks split"
        )
    lines.extend(adaptive_lines(report))
    if report.actors_replaced:
        lines.append(f"UDF actors replaced after dying: {report.actors_replaced}")
    if warnings:
        lines.append("Warnings:")
        lines.extend("  " + w for w in warnings)
    return "\n".join(lines)


def adaptive_lines(report: QueryReport) -> list[str]:
    """What adaptive execution changed in the query (``Config.adaptive``): a heading and
    one line per stage (buckets coalesced or skipped, stages skipped over empty inputs,
    and why a change was not made); nothing when it changed nothing."""
    if not report.adaptive:
        return []
    return ["Adaptive execution:", *("  " + line for line in report.adaptive)]


def mermaid(physical: PhysicalPlan, report: QueryReport | None = None) -> str:
    """The stage graph as a mermaid ``flowchart`` (renders on GitHub and in Jupyter with
    mermaid support): one box per stage with its task count and output partitioning
    (rows out when ``report`` is given), one arrow per input labelled with its mode."""
    lines = ["flowchart BT"]
    for st in physical.stages:
        label = f"stage {st.id}: {st.name}<br/>{st.num_tasks} task(s), {st.describe_output()}"
        if report is not None:
            rows = sum(s.rows_out for (sid, _), s in report.task_stats.items() if sid == st.id)
            label += f"<br/>{rows:,} rows out"
        lines.append(f'    s{st.id}["{label.replace(chr(34), chr(39))}"]')
    for st in physical.stages:
        for inp in st.inputs:
            for src in inp.stages:
                lines.append(f"    s{src} -- {inp.mode} --> s{st.id}")
    return "\n".join(lines)
