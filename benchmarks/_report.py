"""Markdown tables and PNG charts from a benchmark record.

A *record* is the JSON-ready dictionary :func:`benchmarks.tpch.run_benchmark` returns and
writes next to the report: ``meta`` (scale, queries, engines, runs, machine, versions,
command), ``engines`` (per engine: description, status, start-up time, memory peaks) and
``results`` (per engine, per query: status, warm-up and timed runs in seconds, rows,
detail). Everything here is a pure function of a record, so a report can be drawn again
from its JSON (``python -m benchmarks.tpch --from-json FILE``).

Result statuses: ``baseline`` (the answer every other is checked against), ``ok`` (same
values), ``close`` (floats agree to :data:`benchmarks._check.CLOSE_TOL` only),
``mismatch``, ``unchecked`` (no baseline answer), ``unsupported``, ``error``,
``timeout``, ``unavailable`` (the engine could not start).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Record = dict[str, Any]

GOOD = frozenset({"baseline", "ok", "close"})
"""Statuses whose times count in totals and means."""

MARK = {"close": " ≈", "unchecked": " ?"}
"""A suffix for timed cells whose answer is not plainly right."""


def median_s(cell: dict[str, Any] | None) -> float | None:
    """The median of a cell's timed runs, or None when it has none."""
    if not cell or not cell.get("times_s"):
        return None
    return float(statistics.median(cell["times_s"]))


def _cell(record: Record, engine: str, query: int) -> dict[str, Any] | None:
    return record["results"].get(engine, {}).get(str(query))


def _good(record: Record, engine: str, query: int) -> bool:
    cell = _cell(record, engine, query)
    return cell is not None and cell["status"] in GOOD and median_s(cell) is not None


def ran_engines(record: Record) -> list[str]:
    """The engines that started, in report order."""
    return [e for e in record["meta"]["engines"] if record["engines"][e]["status"] == "ready"]


def common_queries(record: Record, engines: Sequence[str] | None = None) -> list[int]:
    """The queries every engine of ``engines`` (default: every engine that started)
    answered correctly (status ``baseline``, ``ok`` or ``close``)."""
    chosen = ran_engines(record) if engines is None else list(engines)
    return [q for q in record["meta"]["queries"] if all(_good(record, e, q) for e in chosen)]


def geometric_mean(values: Sequence[float]) -> float | None:
    """The geometric mean of positive ``values``, or None when there are none."""
    if not values:
        return None
    return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 100 else f"{value:.1f}"


def _ratio(value: float | None, base: float | None) -> str:
    if value is None or not base:
        return ""
    return f" ({value / base:.2f}x)"


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def time_table(record: Record) -> list[list[str]]:
    """The query x engine table (header row first): median seconds, ratio to the
    baseline, then the summary rows."""
    meta = record["meta"]
    baseline = meta["baseline"]
    engines = ran_engines(record)
    rows = [["query", *engines]]
    for query in meta["queries"]:
        base = median_s(_cell(record, baseline, query)) if _good(record, baseline, query) else None
        row = [f"Q{query}"]
        for engine in engines:
            cell = _cell(record, engine, query)
            status = cell["status"] if cell else "not run"
            seconds = median_s(cell)
            if status in GOOD or (status == "unchecked" and seconds is not None):
                ratio = "" if engine == baseline else _ratio(seconds, base)
                row.append(_seconds(seconds) + ratio + MARK.get(status, ""))
            elif status == "mismatch":
                row.append(f"{_seconds(seconds)} **wrong**")
            else:
                row.append(status)
        rows.append(row)

    common = common_queries(record)
    base_total = sum(median_s(_cell(record, baseline, q)) or 0.0 for q in common)
    base_geo = geometric_mean([median_s(_cell(record, baseline, q)) or 0.0 for q in common])
    total_row = [f"total, the {len(common)} queries all answered"]
    geo_row = ["geometric mean, same queries"]
    paired_row = [f"total vs {baseline}, on the queries each answered"]
    count_row = ["queries answered right / asked"]
    for engine in engines:
        times = [median_s(_cell(record, engine, q)) or 0.0 for q in common]
        total = sum(times) if common else None
        geo = geometric_mean(times)
        is_base = engine == baseline
        total_row.append(_seconds(total) + ("" if is_base else _ratio(total, base_total)))
        geo_row.append(_seconds(geo) + ("" if is_base else _ratio(geo, base_geo)))
        answered = [q for q in meta["queries"] if _good(record, engine, q)]
        paired = [q for q in answered if _good(record, baseline, q)]
        own = sum(median_s(_cell(record, engine, q)) or 0.0 for q in paired)
        theirs = sum(median_s(_cell(record, baseline, q)) or 0.0 for q in paired)
        paired_row.append(f"{own / theirs:.2f}x ({len(paired)} q)" if theirs else "-")
        count_row.append(f"{len(answered)}/{len(meta['queries'])}")
    rows += [total_row, geo_row, paired_row, count_row]
    return rows


def memory_table(record: Record) -> list[list[str]]:
    """Per engine: start-up seconds, driver peak RSS and process-tree peak PSS (MiB), and
    the tree peak relative to the baseline's."""
    baseline = record["meta"]["baseline"]
    base = record["engines"].get(baseline, {}).get("tree_peak_pss_bytes")
    rows = [
        [
            "engine",
            "start-up s",
            "driver peak RSS, MiB",
            "process tree peak, MiB",
            f"tree peak vs {baseline}",
        ]
    ]
    for engine in ran_engines(record):
        info = record["engines"][engine]
        tree = info.get("tree_peak_pss_bytes")
        ratio = f"{tree / base:.2f}x" if tree and base else "-"
        rows.append(
            [
                engine,
                _seconds(info.get("start_s")),
                _mib(info.get("driver_peak_rss_bytes")),
                _mib(tree),
                ratio,
            ]
        )
    return rows


def markdown_table(rows: Sequence[Sequence[str]]) -> str:
    """GitHub-flavoured Markdown for ``rows`` (the first row is the header); the first
    column is left-aligned, the others right-aligned."""
    header, *body = rows
    lines = ["| " + " | ".join(_escape(c) for c in header) + " |"]
    lines.append("|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|")
    lines += ["| " + " | ".join(_escape(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def parse_markdown_tables(text: str) -> list[list[list[str]]]:
    """Every pipe table in ``text``, as rows of cells (header first, separator dropped).

    Raises ``ValueError`` for a table whose rows do not all have the header's width.
    """
    tables: list[list[list[str]]] = []
    current: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith("|") and stripped.endswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in _split_row(stripped[1:-1])]
            if all(set(c) <= set(":-") and c for c in cells):
                continue  # the separator row
            current.append(cells)
        elif current:
            widths = {len(r) for r in current}
            if len(widths) != 1:
                raise ValueError(f"table rows of different widths {sorted(widths)}: {current}")
            tables.append(current)
            current = []
    return tables


def _split_row(text: str) -> list[str]:
    cells, cell, escaped = [], "", False
    for char in text:
        if char == "|" and not escaped:
            cells.append(cell)
            cell = ""
        else:
            cell += char
        escaped = char == "\\" and not escaped
    cells.append(cell)
    return cells


def _problems(record: Record) -> list[str]:
    lines: list[str] = []
    for engine in ran_engines(record):
        for query in record["meta"]["queries"]:
            cell = _cell(record, engine, query)
            if cell and cell["status"] not in ("baseline", "ok"):
                detail = _escape(cell.get("detail") or "")
                lines.append(
                    f"- Q{query}, {engine}: {cell['status']}" + (f": {detail}" if detail else "")
                )
    return lines


def render_markdown(record: Record, chart: Path | None, chart_note: str = "") -> str:
    """The whole report for one scale."""
    meta = record["meta"]
    machine = meta["machine"]
    baseline = meta["baseline"]
    engines = record["engines"]
    lines = [
        f"# TPC-H at scale {meta['scale']:g}: shoal, Polars, DuckDB, Daft",
        "",
        f"Measured {meta['started']} in {meta['wall_s']:.0f} s. Reproduce with:",
        "",
        "```bash",
        meta["command"],
        "```",
        "",
        f"- Machine: {machine['cpu']}, {machine['cpus']} CPUs, "
        f"{machine['memory_bytes'] / 2**30:.1f} GiB memory, {machine['platform']}, "
        f"Python {machine['python']}.",
        f"- Code: {meta['git']}.",
        f"- Data: `{meta['data_dir']}` (tpchgen-cli Parquet).",
        f"- Method: per query, each engine in turn ({meta['order']}): {meta['warmup']} warm-up "
        f"run(s), then {meta['runs']} timed run(s); the table gives the median in seconds and, "
        f"in brackets, the ratio to `{baseline}` (below 1: faster). Each engine runs in a "
        "process of its own. Every answer is checked against "
        f"`{baseline}`'s by value: ≈ means the floats agree only to about 4 significant "
        "digits (decimal rounding differs between engines), **wrong** that they differ.",
        "",
        "## Engines",
        "",
    ]
    for name in meta["engines"]:
        info = engines[name]
        versions = ", ".join(f"{k} {v}" for k, v in sorted(info.get("versions", {}).items()))
        line = f"- `{name}`: {info['description']}"
        if info["status"] != "ready":
            line += f". **Not run**: {info.get('detail', '')}"
        elif versions:
            line += f" ({versions})"
        lines.append(line)
    lines += ["", "## Time per query", "", markdown_table(time_table(record)), ""]
    if chart is not None:
        lines += [f"![TPC-H at scale {meta['scale']:g}]({chart.name})", ""]
    elif chart_note:
        lines += [f"(No chart: {chart_note}.)", ""]
    lines += [
        "## Peak memory",
        "",
        markdown_table(memory_table(record)),
        "",
        "Driver peak RSS: `getrusage(RUSAGE_SELF).ru_maxrss` of the engine's process "
        "(all its resident pages, shared library code included). Process tree peak: the "
        f"largest sum, sampled every {meta['memory_sample_s']:g} s during each query's "
        "warm-up runs (the timed runs are not sampled: a sample costs CPU; with no warm-up, "
        "during the timed runs) and after each query, of the anonymous and "
        "shared memory (`Pss_Anon + Pss_Shmem` from `/proc/PID/smaps_rollup`) of the "
        "engine's process and of every process it started (for a local Ray instance: GCS, "
        "raylet, workers, agents; Ray's object store is shared memory, counted once): the "
        "memory that holds data, without code and page cache. Both cover start-up and every "
        "query, and include the idle runtime (for Ray engines: Ray's own processes).",
        "",
    ]
    problems = _problems(record)
    if problems:
        lines += ["## Answers not plainly right, and failures", "", *problems, ""]
    return "\n".join(lines)


def _colors(engines: Sequence[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {engine: cmap(i % 10) for i, engine in enumerate(engines)}


def render_chart(record: Record, path: Path) -> None:
    """A PNG at ``path``: per-query time relative to the baseline (log scale), total
    time over the queries all engines answered, and peak memory per engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    meta = record["meta"]
    baseline = meta["baseline"]
    engines = ran_engines(record)
    colors = _colors(engines)
    queries = meta["queries"]
    fig = plt.figure(figsize=(max(10.0, 0.55 * len(queries) * max(1, len(engines)) / 3), 8.5))
    grid = fig.add_gridspec(2, 2, height_ratios=[1.3, 1], hspace=0.6, wspace=0.35)
    ax = fig.add_subplot(grid[0, :])
    others = [e for e in engines if e != baseline]
    width = 0.8 / max(1, len(others))
    for i, engine in enumerate(others):
        xs, ys = [], []
        for j, query in enumerate(queries):
            base = median_s(_cell(record, baseline, query))
            own = median_s(_cell(record, engine, query))
            if _good(record, engine, query) and _good(record, baseline, query) and base and own:
                xs.append(j + (i - (len(others) - 1) / 2) * width)
                ys.append(own / base)
        # Bars grow from the baseline's line: up is slower, down is faster.
        ax.bar(xs, [y - 1 for y in ys], bottom=1, width=width, color=colors[engine], label=engine)
    ax.axhline(1.0, color=colors[baseline], linewidth=1.5, label=f"{baseline} (baseline)")
    ax.set_yscale("log")
    ratios = [y for bars in ax.containers for y in (1 + b.get_height() for b in bars)]
    low, high = min([1.0, *ratios]), max([1.0, *ratios])
    ax.set_ylim(low / 1.25, high * 1.25)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}x"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _pos: ""))
    ax.set_xticks(range(len(queries)), [f"Q{q}" for q in queries])
    ax.set_xlim(-0.6, len(queries) - 0.4)
    ax.set_ylabel(f"median time / {baseline}'s (log)")
    ax.set_title(
        f"TPC-H scale {meta['scale']:g}: time per query relative to {baseline} "
        "(below the line: faster; no bar: no right answer)"
    )
    ax.legend(ncol=min(5, len(engines)), fontsize="small", loc="upper center",
              bbox_to_anchor=(0.5, -0.08))  # fmt: skip
    ax.grid(axis="y", which="both", alpha=0.3)

    common = common_queries(record)
    totals = [sum(median_s(_cell(record, e, q)) or 0.0 for q in common) for e in engines]
    ax_total = fig.add_subplot(grid[1, 0])
    bars = ax_total.bar(engines, totals, color=[colors[e] for e in engines])
    ax_total.bar_label(bars, fmt="%.2f", fontsize="small")
    ax_total.set_ylabel("seconds")
    ax_total.set_title(f"total time, the {len(common)} queries all engines answered")
    ax_total.tick_params(axis="x", labelrotation=30)

    ax_mem = fig.add_subplot(grid[1, 1])
    tree = [(record["engines"][e].get("tree_peak_pss_bytes") or 0) / 2**20 for e in engines]
    driver = [(record["engines"][e].get("driver_peak_rss_bytes") or 0) / 2**20 for e in engines]
    positions = list(range(len(engines)))
    engine_colors = [colors[e] for e in engines]
    tree_bars = ax_mem.bar([x - 0.2 for x in positions], tree, width=0.4, color=engine_colors,
                           label="process tree peak")  # fmt: skip
    ax_mem.bar([x + 0.2 for x in positions], driver, width=0.4, color=engine_colors,
               alpha=0.35, hatch="//", label="driver peak RSS")  # fmt: skip
    ax_mem.bar_label(tree_bars, fmt="%.0f", fontsize="small")
    ax_mem.set_xticks(positions, engines)
    ax_mem.set_ylabel("MiB")
    ax_mem.set_title("peak memory (tree: anonymous + shared, PSS)")
    ax_mem.legend(fontsize="small")
    ax_mem.tick_params(axis="x", labelrotation=30)
    for axis in (ax_total, ax_mem):
        for label in axis.get_xticklabels():
            label.set_horizontalalignment("right")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def scaling_rows(records: Sequence[Record]) -> tuple[list[list[str]], list[int]]:
    """Total time per engine at each scale, over the queries every engine answered at
    every scale (header row first), and those queries."""
    scales = [r["meta"]["scale"] for r in records]
    engines = [e for e in ran_engines(records[0]) if all(e in ran_engines(r) for r in records)]
    queries = [
        q for q in records[0]["meta"]["queries"] if all(q in common_queries(r) for r in records)
    ]
    baseline = records[0]["meta"]["baseline"]
    rows = [["engine", *[f"sf{s:g} s" for s in scales], f"sf{scales[-1]:g} / sf{scales[0]:g}"]]
    for engine in engines:
        totals = [sum(median_s(_cell(r, engine, q)) or 0.0 for q in queries) for r in records]
        bases = [sum(median_s(_cell(r, baseline, q)) or 0.0 for q in queries) for r in records]
        cells = [
            _seconds(t) + ("" if engine == baseline else _ratio(t, b))
            for t, b in zip(totals, bases, strict=True)
        ]
        growth = f"{totals[-1] / totals[0]:.1f}x" if totals[0] else "-"
        rows.append([engine, *cells, growth])
    return rows, queries


def shoal_growth_rows(records: Sequence[Record]) -> list[list[str]]:
    """Per query, each shoal engine's median time at each scale and its growth from the
    smallest to the largest scale (header row first)."""
    scales = [r["meta"]["scale"] for r in records]
    engines = [
        e
        for e in ran_engines(records[0])
        if e.startswith("shoal") and all(e in ran_engines(r) for r in records)
    ]
    rows = [["query", *[f"{e} sf{s:g}" for e in engines for s in scales]]]
    rows[0] += [f"{e} growth" for e in engines]
    for query in records[0]["meta"]["queries"]:
        row = [f"Q{query}"]
        growth = []
        for engine in engines:
            times = [median_s(_cell(r, engine, query)) if _good(r, engine, query) else None
                     for r in records]  # fmt: skip
            row += [_seconds(t) for t in times]
            first, last = times[0], times[-1]
            growth.append(f"{last / first:.1f}x" if first and last else "-")
        rows.append(row + growth)
    return rows


def render_scaling_markdown(records: Sequence[Record], chart: Path | None) -> str:
    """The report of a scaling run (one record per scale, smallest first)."""
    scales = [r["meta"]["scale"] for r in records]
    totals, queries = scaling_rows(records)
    data_growth = scales[-1] / scales[0]
    lines = [
        f"# TPC-H scaling: scale factors {', '.join(f'{s:g}' for s in scales)}",
        "",
        "Reproduce with:",
        "",
        "```bash",
        records[0]["meta"]["command"],
        "```",
        "",
        f"Total of the median times over the {len(queries)} queries every engine answered "
        f"right at every scale ({', '.join(f'Q{q}' for q in queries) or 'none'}); in "
        f"brackets the ratio to `{records[0]['meta']['baseline']}`. The data grows "
        f"{data_growth:g}x from the first scale to the last; the last column is how much "
        "the time grew.",
        "",
        markdown_table(totals),
        "",
    ]
    if chart is not None:
        lines += [f"![TPC-H scaling]({chart.name})", ""]
    growth = shoal_growth_rows(records)
    if len(growth[0]) > 1:
        lines += ["## shoal per query", "", markdown_table(growth), ""]
    lines += ["Per-scale reports: " + ", ".join(f"`{r['meta']['report']}`" for r in records), ""]
    return "\n".join(lines)


def render_scaling_chart(records: Sequence[Record], path: Path) -> None:
    """Total time against scale factor per engine, log-log, with linear growth dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    rows, queries = scaling_rows(records)
    scales = [r["meta"]["scale"] for r in records]
    engines = [row[0] for row in rows[1:]]
    colors = _colors(ran_engines(records[0]))
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for engine in engines:
        totals = [sum(median_s(_cell(r, engine, q)) or 0.0 for q in queries) for r in records]
        ax.plot(scales, totals, marker="o", color=colors.get(engine), label=engine)
        if engine.startswith("shoal") and totals[0]:
            ax.plot(scales, [totals[0] * s / scales[0] for s in scales], linestyle="--",
                    color=colors.get(engine), alpha=0.4, label=f"{engine}, linear")  # fmt: skip
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _pos: ""))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda value, _pos: ""))
    ax.set_xticks(scales, [f"{s:g}" for s in scales])
    ax.set_xlabel("TPC-H scale factor")
    ax.set_ylabel(f"total seconds, {len(queries)} queries")
    ax.set_title("TPC-H total time against data size (dashed: time growing like the data)")
    ax.grid(which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
