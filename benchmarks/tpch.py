"""TPC-H benchmark: shoal against native Polars, native DuckDB and Daft, in one run.

::

    python -m benchmarks.tpch --scale 1                       # every engine, 22 queries
    python -m benchmarks.tpch --scale 0.1 --queries 1,6 --engines polars,duckdb,shoal-local
    python -m benchmarks.tpch --scales 1,3,10 --engines polars,shoal-ray
    python -m benchmarks.tpch --from-json benchmarks/results/2026-11-20-sf1.json  # redraw

What it does:

1. Generates the TPC-H data at the scale with tpchgen-cli, or reuses it
   (:func:`shoal.tpch.datagen.generate`); for Daft it also writes a copy with plain strings.
2. Starts each engine (:mod:`benchmarks._engines`) in a process of its own
   (:mod:`benchmarks._worker`), so that its peak memory is its own.
3. For each query, for each engine in turn (the baseline ``polars`` first): one warm-up
   run, then ``--runs`` timed runs; the median is quoted. Interleaving engines per query
   means that drift of the machine (other load, thermal) hits every engine alike;
   ``--order sequential`` runs one engine's whole list after the other instead.
4. Checks every answer against native Polars' by value (:mod:`benchmarks._check`) and
   reports a difference in the table instead of stopping.
5. Writes ``<out>/<date>-sf<N>.md`` (time per query with ratios to native Polars, totals,
   geometric means, peak memory, failures), ``.png`` (matplotlib, when installed) and
   ``.json`` (everything measured, to redraw the report with ``--from-json``).

With ``--scales 1,3,10`` it does this per scale, then writes ``<date>-scaling-sf1-3-10.md``
and ``.png``: how the total time of each engine grows with the data.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl

from benchmarks import _report
from benchmarks._check import check_result
from benchmarks._engines import BASELINE, ENGINES, EngineOptions, plain_string_copy
from benchmarks._memory import SAMPLE_INTERVAL_S
from benchmarks._worker import REPO_ROOT, EngineProcess
from shoal.tpch.datagen import default_data_dir, generate
from shoal.tpch.queries import QUERIES, SORT_KEYS

DEFAULT_OUT = Path(__file__).resolve().parent / "results"
"""Where reports go unless ``--out`` says otherwise."""

Record = dict[str, Any]
Log = Callable[[str], None]


def machine_info() -> dict[str, Any]:
    """CPU model, CPU count, memory, platform and Python version of this machine."""
    cpu = platform.processor() or platform.machine()
    memory = 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_bytes": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def git_description() -> str:
    """The repository's commit, and whether the working tree had changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"commit {commit}" + (" with uncommitted changes" if dirty else "")


def order_engines(engines: Sequence[str]) -> list[str]:
    """``engines`` without duplicates, the baseline first (added when missing)."""
    ordered = [BASELINE]
    for engine in engines:
        if engine not in ordered:
            ordered.append(engine)
    return ordered


def run_benchmark(
    scale: float,
    queries: Sequence[int],
    engines: Sequence[str],
    *,
    runs: int = 3,
    warmup: int = 1,
    data_root: Path | None = None,
    parts: int | None = None,
    options: EngineOptions | None = None,
    order: str = "interleaved",
    timeout_s: float = 1800.0,
    command: str = "",
    log: Log = print,
) -> Record:
    """Run the benchmark at one scale and return its record (see :mod:`benchmarks._report`).

    ``engines`` are names of :data:`benchmarks._engines.ENGINES`; the baseline
    (``polars``) is always run, first. ``timeout_s`` bounds one query block (warm-up and
    timed runs) of one engine; a block that overruns is interrupted and reported as
    ``timeout``. Engines that cannot start are reported ``unavailable``.
    """
    if order not in ("interleaved", "sequential"):
        raise ValueError(f"order must be 'interleaved' or 'sequential', got {order!r}")
    engines = order_engines(engines)
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"unknown engines {unknown}; known: {list(ENGINES)}")
    started = dt.datetime.now().astimezone()
    wall = time.perf_counter()
    data_dir = generate(scale, data_root, parts).resolve()
    log(f"data: {data_dir}")
    work = Path(tempfile.mkdtemp(prefix="shoal-bench-"))
    options = options or EngineOptions()
    record: Record = {
        "meta": {
            "scale": scale,
            "queries": list(queries),
            "engines": engines,
            "baseline": BASELINE,
            "runs": runs,
            "warmup": warmup,
            "order": order,
            "timeout_s": timeout_s,
            "data_dir": str(data_dir),
            "started": started.isoformat(timespec="seconds"),
            "command": command,
            "machine": machine_info(),
            "git": git_description(),
            "memory_sample_s": SAMPLE_INTERVAL_S,
            "work_dir": str(work),
        },
        "engines": {
            name: {"description": ENGINES[name].description, "status": "not started"}
            for name in engines
        },
        "results": {name: {} for name in engines},
    }
    if "daft" in engines:
        try:
            log(f"daft data: {plain_string_copy(data_dir)}")
        except Exception as exc:  # Daft's run then fails on its own and says so
            log(f"daft data: could not write the plain-string copy: {exc}")
    # Ray session dirs must stay short: Unix socket paths are limited to 107 bytes.
    processes = {
        name: EngineProcess(
            name,
            data_dir,
            replace(options, ray_temp_dir=options.ray_temp_dir or str(work / f"ray{i}")),
            work / f"{name}.log",
        )
        for i, name in enumerate(engines)
    }
    expected: dict[int, pl.DataFrame] = {}
    trouble = False
    try:
        if order == "interleaved":
            for name in engines:
                _start(processes[name], record, log)
            for query in queries:
                for name in engines:
                    trouble |= _run_one(processes[name], query, record, expected, work, log)
            for name in engines:
                _close(processes[name], record)
        else:
            for name in engines:
                _start(processes[name], record, log)
                for query in queries:
                    trouble |= _run_one(processes[name], query, record, expected, work, log)
                _close(processes[name], record)
    finally:
        for process in processes.values():
            process.close()
    trouble |= any(info["status"] != "ready" for info in record["engines"].values())
    record["meta"]["wall_s"] = time.perf_counter() - wall
    if trouble:
        log(f"engine logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return record


def _start(process: EngineProcess, record: Record, log: Log) -> None:
    hello = process.start()
    info = record["engines"][process.engine]
    info["status"] = hello.get("status", "unavailable")
    if info["status"] == "ready":
        info["start_s"] = hello.get("start_s")
        info["versions"] = hello.get("versions", {})
        log(f"{process.engine}: started in {hello.get('start_s', 0):.1f} s")
    else:
        info["detail"] = hello.get("detail", "")
        log(f"{process.engine}: not run: {info['detail']}")


def _close(process: EngineProcess, record: Record) -> None:
    process.close()
    record["engines"][process.engine].update(process.memory, restarts=process.restarts)


def _run_one(
    process: EngineProcess,
    query: int,
    record: Record,
    expected: dict[int, pl.DataFrame],
    work: Path,
    log: Log,
) -> bool:
    """Run one query block on one engine and file its result; True when it went wrong."""
    name = process.engine
    if record["engines"][name]["status"] != "ready":
        record["results"][name][str(query)] = {"status": "unavailable"}
        return False
    result_path = work / f"{name}-q{query}.arrow"
    reply = process.run(
        query,
        record["meta"]["warmup"],
        record["meta"]["runs"],
        result_path,
        record["meta"]["timeout_s"],
    )
    cell: dict[str, Any] = {
        "status": reply.get("status", "error"),
        "warmup_s": reply.get("warmup_s", []),
        "times_s": reply.get("times_s", []),
        "rows": reply.get("rows"),
        "detail": reply.get("detail", ""),
        "window_peak_pss_bytes": reply.get("window_peak_pss_bytes"),
    }
    if cell["status"] == "done":
        answer = pl.read_ipc(result_path)
        result_path.unlink(missing_ok=True)
        if name == BASELINE:
            expected[query] = answer
            cell["status"] = "baseline"
        elif query in expected:
            cell["status"], cell["detail"] = check_result(answer, expected[query], SORT_KEYS[query])
        else:
            cell["status"], cell["detail"] = "unchecked", f"no {BASELINE} answer to check against"
    record["results"][name][str(query)] = cell
    median = _report.median_s(cell)
    timing = f"{median:8.3f} s" if median is not None else " " * 10
    detail = f"  {cell['detail']}" if cell["detail"] and cell["status"] != "ok" else ""
    log(f"Q{query:<3} {name:<20} {timing}  {cell['status']}{detail}")
    return cell["status"] in ("error", "timeout")


def write_report(record: Record, out_dir: Path, stem: str, chart: bool = True) -> Path:
    """Write ``<stem>.json``, ``.png`` (when ``chart`` and matplotlib is installed) and
    ``.md`` into ``out_dir``; returns the Markdown file's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    record["meta"]["report"] = f"{stem}.md"
    (out_dir / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    png: Path | None = None
    note = "--no-chart"
    if chart:
        try:
            png = out_dir / f"{stem}.png"
            _report.render_chart(record, png)
        except ImportError:
            png, note = None, "matplotlib is not installed (pip install matplotlib)"
    md = out_dir / f"{stem}.md"
    md.write_text(_report.render_markdown(record, png, note))
    return md


def write_scaling_report(records: Sequence[Record], out_dir: Path, stem: str, chart: bool) -> Path:
    """Write the scaling report ``<stem>.md`` (and ``.png``) for per-scale ``records``."""
    png: Path | None = None
    if chart:
        try:
            png = out_dir / f"{stem}.png"
            _report.render_scaling_chart(records, png)
        except ImportError:
            png = None
    md = out_dir / f"{stem}.md"
    md.write_text(_report.render_scaling_markdown(records, png))
    return md


def unique_stem(out_dir: Path, stem: str) -> str:
    """``stem``, or ``stem-2``, ``stem-3``... when a report of that name exists already."""
    candidate, n = stem, 1
    while (out_dir / f"{candidate}.md").exists() or (out_dir / f"{candidate}.json").exists():
        n += 1
        candidate = f"{stem}-{n}"
    return candidate


def _int_list(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("empty list")
    return values


def _query_list(text: str) -> list[int]:
    values = _int_list(text)
    unknown = [q for q in values if q not in QUERIES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown queries {unknown}; available: 1-22")
    return values


def _scale_list(text: str) -> list[float]:
    try:
        values = sorted(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of scales: {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"scales must be positive: {text!r}")
    return values


def _engine_list(text: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [e for e in values if e not in ENGINES]
    if not values or unknown:
        raise argparse.ArgumentTypeError(f"unknown engines {unknown}; known: {','.join(ENGINES)}")
    return values


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.tpch``."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tpch",
        description=(
            "TPC-H with shoal, native Polars, native DuckDB and Daft in one run: median "
            "times with ratios to native Polars, answers checked, peak memory per engine, "
            "a Markdown report and a chart."
        ),
    )
    p.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default: 1)")
    p.add_argument(
        "--scales",
        type=_scale_list,
        default=None,
        help="scaling run: comma-separated scale factors, e.g. 1,3,10 (overrides --scale)",
    )
    p.add_argument(
        "--queries",
        type=_query_list,
        default=sorted(QUERIES),
        help="comma-separated query numbers (default: all 22)",
    )
    p.add_argument(
        "--engines",
        type=_engine_list,
        default=list(ENGINES),
        help=f"comma-separated engines (default: all: {','.join(ENGINES)}); "
        f"{BASELINE} always runs, as the baseline",
    )
    p.add_argument(
        "--runs", type=_positive_int, default=3, help="timed runs per query (default: 3)"
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed runs before them (default: 1)")
    p.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"where generated data is cached (default: $SHOAL_DATA_DIR or {default_data_dir()})",
    )
    p.add_argument(
        "--parts",
        type=_positive_int,
        default=None,
        help="Parquet files per table (default: tpch datagen's: 4 below scale 1, else 8)",
    )
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"report directory (default: {DEFAULT_OUT})"
    )
    p.add_argument(
        "--order",
        choices=["interleaved", "sequential"],
        default="interleaved",
        help="interleaved: per query, every engine in turn (default); sequential: per engine, "
        "every query (only one engine process alive at a time)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        help="seconds one engine may spend on one query, warm-up and runs (default: 1800)",
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="a Ray cluster for shoal-ray, shoal-duckdb-ray and daft (default: each starts a "
        "local instance; the memory of a cluster's processes is then not measured)",
    )
    p.add_argument(
        "--daft-path",
        default=os.environ.get("SHOAL_BENCH_DAFT_PATH"),
        help="directory holding the daft package when it is not installed in this "
        "environment (default: $SHOAL_BENCH_DAFT_PATH)",
    )
    p.add_argument("--no-chart", action="store_true", help="do not draw the PNG charts")
    p.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="do not run anything: redraw the report of an earlier run from its .json",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark command line. Returns 0, or 1 when an answer was wrong or an
    engine errored or timed out (unsupported queries and unavailable engines are not
    failures: they are reported)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(args_list)
    if args.from_json is not None:
        record = json.loads(args.from_json.read_text())
        md = write_report(record, args.from_json.parent, args.from_json.stem, not args.no_chart)
        print(f"report: {md}")
        return 0
    command = shlex.join(["python", "-m", "benchmarks.tpch", *args_list])
    options = EngineOptions(ray_address=args.ray_address, daft_path=args.daft_path)
    scales = args.scales or [args.scale]
    date = dt.date.today().isoformat()
    records = []
    for scale in scales:
        record = run_benchmark(
            scale,
            args.queries,
            args.engines,
            runs=args.runs,
            warmup=args.warmup,
            data_root=args.data_dir,
            parts=args.parts,
            options=options,
            order=args.order,
            timeout_s=args.timeout,
            command=command,
        )
        stem = unique_stem(args.out, f"{date}-sf{scale:g}")
        md = write_report(record, args.out, stem, not args.no_chart)
        print(f"report: {md}")
        records.append(record)
    if len(records) > 1:
        stem = unique_stem(args.out, f"{date}-scaling-sf{'-'.join(f'{s:g}' for s in scales)}")
        md = write_scaling_report(records, args.out, stem, not args.no_chart)
        print(f"scaling report: {md}")
    bad = {"mismatch", "error", "timeout"}
    failed = any(
        cell["status"] in bad
        for record in records
        for cells in record["results"].values()
        for cell in cells.values()
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
