"""The profile of a query that ran: ``explain(..., analyze=True)``'s per-stage table, its
operators with what the kernel measured of them, and the stage graph as a mermaid
flowchart (``explain(..., format="mermaid")``).

Read from a :class:`~shoal.runners.session.QueryReport` (the physical plan and every
task's :class:`~shoal.execution.kernel.TaskStats`); nothing here runs a query. Also the
:class:`SpillSampler` that the session hangs on the dispatch loop of a profiled query
(:func:`shoal.runners.session.profiling`) to read Ray's spill counters per stage.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shoal.execution.kernel import TaskStats
    from shoal.ir.nodes import PlanNode
    from shoal.planner.physical import PhysicalPlan, Stage
    from shoal.runners.session import QueryReport

#: A stage is flagged as skewed when its slowest task took this many times its median task
#: (and at least :data:`SKEW_MIN_S` seconds), or its largest output this many times the
#: median output.
SKEW_RATIO = 4.0
SKEW_MIN_S = 0.05
#: A shuffle or broadcast writing more than this many bytes in all is flagged.
LARGE_EXCHANGE_BYTES = 1 << 30


def size_text(n: float) -> str:
    """``n`` bytes for a person: ``12.0 MiB`` (``B``, ``KiB``, ``MiB``, ``GiB``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def analyze_text(report: QueryReport) -> str:
    """Per stage, root last: tasks, rows in and out, bytes out, task wall time
    (min / median / max in seconds, so that skew shows), the nodes the tasks ran on, the
    tasks the dispatch loop sent again and the bytes Ray spilled while the stage ran, and
    warnings for skew (task time, task output, shuffle buckets), large exchanges and
    broadcasts; then the memory controls' counts (peak bytes held, tasks held back, split
    tasks), Ray's spilling, replaced UDF actors, and each stage's operators
    (:func:`operator_lines`)."""
    lines = ["Profile (ran on the " + report.runner + " runner):"]
    w = max([28, *(len(f"{st.id} [{st.name}]") for st in report.physical.stages)])
    header = (
        f"{'stage':<{w}} {'tasks':>5} {'rows in':>12} {'rows out':>12} {'bytes out':>11} "
        f"{'task s min/med/max':>20}  {'nodes':>5} {'resent':>6} {'spilled':>9}"
    )
    lines.append(header)
    warnings: list[str] = []
    spill = report.spill
    for st in report.physical.stages:
        stats = [s for (sid, _), s in report.task_stats.items() if sid == st.id]
        if not stats:
            lines.append(f"{f'{st.id} [{st.name}]':<{w}} {st.num_tasks:>5}  (no task ran)")
            continue
        times = sorted(s.end - s.start for s in stats)
        med = statistics.median(times)
        rows_in = sum(s.rows_in for s in stats)  # scanned rows included
        rows_out = sum(s.rows_out for s in stats)
        bytes_out = sum(s.bytes_out for s in stats)
        nodes = len({s.node_id for s in stats})
        timing = f"{times[0]:.3f}/{med:.3f}/{times[-1]:.3f}"
        spilled = "-" if spill is None else size_text(spill.by_stage.get(st.id, (0,))[0])
        lines.append(
            f"{f'{st.id} [{st.name}]':<{w}} {len(stats):>5} {rows_in:>12,} {rows_out:>12,} "
            f"{size_text(bytes_out):>11} {timing:>20}  {nodes:>5} "
            f"{report.resent.get(st.id, 0):>6} {spilled:>9}"
        )
        warnings.extend(bucket_skew(st, stats))
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
                f"{size_text(outs[-1])}, {outs[-1] / median_out:.1f}x the median"
            )
        kind = st.describe_output()
        if bytes_out > LARGE_EXCHANGE_BYTES and ("hash" in kind or "range" in kind):
            warnings.append(
                f"stage {st.id} [{st.name}]: a large shuffle: {size_text(bytes_out)} written ({kind})"
            )
        for inp in st.inputs:
            if inp.mode == "all":  # every task reads all of it: a broadcast
                sent = sum(
                    s.bytes_out for (sid, _), s in report.task_stats.items() if sid in inp.stages
                )
                if sent > LARGE_EXCHANGE_BYTES // 8:
                    warnings.append(
                        f"stage {st.id} [{st.name}]: broadcasts {size_text(sent)} to each of its "
                        f"{st.num_tasks} tasks"
                    )
    mem = report.memory
    if mem is not None:
        lines.append(
            f"memory: peak {size_text(mem.peak_bytes_held)} of task outputs held"
            + (f" (limit {size_text(mem.max_bytes_held)})" if mem.max_bytes_held else "")
            + f"; {mem.held_back} times held back, {mem.forced} forced, "
            f"{len(mem.splits)} tasks split"
        )
    lines.append(spill_line(report))
    lines.extend(adaptive_lines(report))
    if report.actors_replaced:
        lines.append(f"UDF actors replaced after dying: {report.actors_replaced}")
    if warnings:
        lines.append("Warnings:")
        lines.extend("  " + w for w in warnings)
    lines.extend(operator_lines(report))
    return "\n".join(lines)


def adaptive_lines(report: QueryReport) -> list[str]:
    """What adaptive execution changed in the query (``Config.adaptive``): a heading and
    one line per stage (buckets coalesced or skipped, stages skipped over empty inputs,
    and why a change was not made); nothing when it changed nothing."""
    if not report.adaptive:
        return []
    return ["Adaptive execution:", *("  " + line for line in report.adaptive)]


# ------------------------------------------------ operators


def operator_lines(report: QueryReport) -> list[str]:
    """Each stage's operators, root first, with what the kernel measures of them without
    slowing the task down (:func:`shoal.execution.kernel._profile`): the rows each stage
    input and each scan gave, the rows the fragment's root produced, the rows of each
    bucket of an exchange (min / median / max over the reading tasks), and the seconds all
    tasks of the stage spent reading their inputs into Polars, in the fragment's Polars
    query, and partitioning and converting its output. The operators between a fragment's
    leaves and its root run fused in one Polars query: Polars 2 no longer times the nodes of
    a query (``LazyFrame.profile`` was removed), and materialising each one would change
    the plan being measured, so they carry no numbers of their own."""
    lines = ["Operators (per stage, root first; rows where the kernel counts them):"]
    for st in reversed(report.physical.stages):
        stats = [s for (sid, _), s in report.task_stats.items() if sid == st.id]
        phases = [s.extra["phase_s"] for s in stats if "phase_s" in s.extra]
        timing = ""
        if phases:
            inputs, query, output = (sum(p[i] for p in phases) for i in range(3))
            timing = (
                f": task seconds in all: inputs {inputs:.3f}, Polars query {query:.3f}, "
                f"output {output:.3f}"
            )
        lines.append(f"  stage {st.id} [{st.name}]{timing}")
        lines.append(_op_line(2, f"-> {st.describe_output()}", _exchange_numbers(st, stats)))
        _operator_tree(st, stats, lines)
    return lines


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _op_line(depth: int, text: str, numbers: str) -> str:
    pad = "  " * depth
    if not numbers:
        return pad + _short(text, 100 - len(pad))
    return f"{pad}{_short(text, 60 - len(pad)):<{60 - len(pad)}}  {numbers}"


def _exchange_numbers(st: Stage, stats: list[TaskStats]) -> str:
    if not stats:
        return ""
    rows = sum(s.rows_out for s in stats)
    buckets = _bucket_totals(stats, "bucket_rows")
    if not buckets or len(buckets) < 2:
        return f"rows out {rows:,}"
    srt = sorted(buckets)
    return (
        f"rows out {rows:,}; per bucket min/med/max "
        f"{srt[0]:,}/{statistics.median(srt):,.0f}/{srt[-1]:,}"
    )


def _operator_tree(st: Stage, stats: list[TaskStats], lines: list[str]) -> None:
    from shoal.ir.explain import describe
    from shoal.ir.nodes import Scan, StageInput

    scans = [n for n in st.fragment.walk() if isinstance(n, Scan)]
    scan_rows = sum(s.scan_rows for s in stats)
    per_input = _bucket_totals(stats, "input_rows")

    def rec(node: PlanNode, depth: int) -> None:
        numbers = ""
        if isinstance(node, StageInput) and node.index < len(st.inputs):
            spec = st.inputs[node.index]
            src = ", ".join(map(str, spec.stages))
            got = per_input[node.index] if node.index < len(per_input) else None
            read = f"rows in {got:,} " if got is not None else ""
            numbers = f"{read}(stage{'s' if spec.more else ''} {src}, {spec.mode})"
        elif isinstance(node, Scan) and stats:
            numbers = f"rows read {scan_rows:,}" + (" (all scans)" if len(scans) > 1 else "")
        lines.append(_op_line(depth, describe(node), numbers))
        for child in node.children():
            rec(child, depth + 1)

    rec(st.fragment, 2)


def _bucket_totals(stats: list[TaskStats], key: str) -> list[int]:
    """``extra[key]`` (a tuple per task) summed element by element over the tasks that
    have it; empty when none has."""
    values = [s.extra[key] for s in stats if key in s.extra]
    if not values or len({len(v) for v in values}) != 1:
        return []
    return [sum(col) for col in zip(*values, strict=True)]


def bucket_skew(st: Stage, stats: list[TaskStats]) -> list[str]:
    """A warning when one bucket of the stage's hash or range exchange (what one task of
    the reading stage gets) holds more than :data:`SKEW_RATIO` times the median bucket's
    bytes and at least 1 MiB: that task will run longest. Bytes are the tasks' Arrow
    sizes per bucket (``output_bytes``), rows from ``extra["bucket_rows"]``."""
    sizes = [s.output_bytes for s in stats if len(s.output_bytes) > 1]
    if not sizes or len({len(x) for x in sizes}) != 1:
        return []
    per_bucket = [sum(col) for col in zip(*sizes, strict=True)]
    median = max(statistics.median(per_bucket), 1)
    big = max(range(len(per_bucket)), key=per_bucket.__getitem__)
    if per_bucket[big] < 1 << 20 or per_bucket[big] <= SKEW_RATIO * median:
        return []
    rows = _bucket_totals(stats, "bucket_rows")
    held = f" ({rows[big]:,} rows)" if len(rows) == len(per_bucket) else ""
    return [
        f"stage {st.id} [{st.name}]: skewed exchange: bucket {big} holds "
        f"{size_text(per_bucket[big])}{held}, {per_bucket[big] / median:.1f}x the median bucket "
        "(one task of the reading stage gets all of it)"
    ]


# ------------------------------------------------ spilling


@dataclass
class SpillReport:
    """Ray's object spilling during one query, from the cluster-wide counters
    (``RayBackend.spill_counters``: bytes spilled, objects spilled, bytes restored,
    objects restored) read at the query's start, at the end of each stage and at its end.

    ``by_stage[stage id]``: the growth of the counters between the previous reading and the
    end of that stage (stages that saw none left out). Ray does not say which task's
    objects it spilled, so spilling is given to the stage that ended next: with stages
    running side by side, the one that ended first takes what they spilled together.
    ``total``: the growth over the whole query (other queries on the cluster included).
    ``unknown``: Ray did not answer a reading (the numbers then cover less)."""

    total: tuple[int, int, int, int] = (0, 0, 0, 0)
    by_stage: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)
    unknown: bool = False


class SpillSampler:
    """Reads ``read()`` (Ray's spill counters) now and, as the dispatch loop's
    ``on_stage_done`` hook, at the end of each stage; :meth:`finish` reads them a last
    time and gives the :class:`SpillReport`."""

    def __init__(self, read: Callable[[], tuple[int, int, int, int] | None]) -> None:
        self.read = read
        self.first = self.last = read()
        self.report = SpillReport(unknown=self.first is None)

    def __call__(self, stage_id: int) -> None:
        now = self.read()
        if now is None or self.last is None:
            self.report.unknown = True
            self.last = now if now is not None else self.last
            return
        delta = _minus(now, self.last)
        if any(delta):
            self.report.by_stage[stage_id] = delta
        self.last = now

    def finish(self) -> SpillReport:
        now = self.read()
        if now is None or self.first is None:
            self.report.unknown = True
        else:
            self.report.total = _minus(now, self.first)
        return self.report


def _minus(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, int, int, int]:
    d = [x - y for x, y in zip(a, b, strict=True)]
    return (d[0], d[1], d[2], d[3])


def spill_line(report: QueryReport) -> str:
    """One line on spilling: Ray's counters over the query, or why there are none."""
    spill = report.spill
    if spill is None:
        if report.runner == "ray":
            return "spilled: not read (profiled queries read Ray's spill counters)"
        return "spilled: nothing (the local runner keeps task outputs in its own memory)"
    if spill.unknown and not any(spill.total):
        return "spilled: unknown (Ray did not report its spill counters)"
    b, n, rb, rn = spill.total
    if not (b or rb):
        return "spilled: nothing (Ray's object store, whole cluster)"
    return (
        f"spilled: {size_text(b)} in {n:,} objects to disk, {size_text(rb)} in {rn:,} objects "
        "restored (Ray's object store, whole cluster, during the query)"
    )


def _scans_read(st: Stage) -> str:
    """What the stage's scans read, short: a file's name, or a directory's name and its
    file count (never a whole path), or "in-memory table"."""
    import os

    from shoal.ir.nodes import FileSource, ParquetSource, Scan

    out = []
    for node in st.fragment.walk():
        if not isinstance(node, Scan):
            continue
        src = node.source
        if isinstance(src, ParquetSource | FileSource) and src.paths:
            paths = [p.rstrip("/") for p in src.paths]
            if len(paths) == 1:
                out.append(os.path.basename(paths[0]))
            else:
                common = os.path.basename(os.path.commonpath(paths)) or "files"
                out.append(f"{common}/ ({len(paths)} files)")
        else:
            out.append("in-memory table")
    return ", ".join(dict.fromkeys(out))


def mermaid(physical: PhysicalPlan, report: QueryReport | None = None) -> str:
    """The stage graph as a mermaid ``flowchart`` (renders on GitHub and in Jupyter with
    mermaid support): one box per stage with its task count, output partitioning and what
    its scans read (rows out when ``report`` is given), one arrow per input labelled with
    its mode."""
    lines = ["flowchart BT"]
    for st in physical.stages:
        label = f"stage {st.id}: {st.name}<br/>{st.num_tasks} task(s), {st.describe_output()}"
        reads = _scans_read(st)
        if reads:
            label += f"<br/>reads {reads}"
        if report is not None:
            rows = sum(s.rows_out for (sid, _), s in report.task_stats.items() if sid == st.id)
            label += f"<br/>{rows:,} rows out"
        lines.append(f'    s{st.id}["{label.replace(chr(34), chr(39))}"]')
    for st in physical.stages:
        for inp in st.inputs:
            for src in inp.stages:
                lines.append(f"    s{src} -- {inp.mode} --> s{st.id}")
    return "\n".join(lines)
