"""The ``shoal`` command line.

``shoal tpch`` runs TPC-H queries with shoal and with native Polars (streaming and
in-memory engines), times them and checks that shoal's answers match Polars'.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import polars as pl

import shoal
from shoal.tpch import QUERIES, SORT_KEYS, compare_frames, generate, scan_tables

T = TypeVar("T")


@dataclass(frozen=True)
class QueryReport:
    """The outcome of one TPC-H query: timings in seconds and whether shoal matched."""

    query: int
    rows: int
    shoal_s: float | None
    streaming_s: float
    in_memory_s: float
    status: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether shoal ran the query and its answer matched native Polars."""
        return self.status == "yes"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``shoal`` command line with ``argv`` (default: ``sys.argv[1:]``).

    Returns the exit status: 0 when everything asked for succeeded, 1 when a query
    mismatched or failed. Invalid arguments exit with status 2 (argparse).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return _tpch(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shoal", description="shoal: a distributed execution backend for Polars on Ray."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    tpch = commands.add_parser(
        "tpch",
        help="run TPC-H queries with shoal and native Polars, and compare the answers",
        description=(
            "Generate TPC-H data (cached), run each query with native Polars (streaming "
            "and in-memory engines) and with shoal, time them and compare the answers. "
            "Exits with status 1 when any query mismatches or fails."
        ),
    )
    tpch.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default: 1)")
    tpch.add_argument(
        "--queries",
        type=_query_list,
        default=sorted(QUERIES),
        help=f"comma-separated query numbers (default: {','.join(map(str, sorted(QUERIES)))})",
    )
    tpch.add_argument(
        "--runner",
        choices=["ray", "local"],
        default="ray",
        help="shoal runner: a Ray cluster or in-process threads (default: ray)",
    )
    tpch.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where generated data is cached (default: $SHOAL_DATA_DIR or ~/.cache/shoal/tpch)",
    )
    tpch.add_argument(
        "--partitions",
        type=_positive_int,
        default=None,
        help="Parquet files per table, i.e. shoal's input partitions "
        "(default: 4 below scale 1, else 8)",
    )
    return parser


def _query_list(text: str) -> list[int]:
    try:
        numbers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None
    unknown = [n for n in numbers if n not in QUERIES]
    if not numbers or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown queries {unknown or text!r}; available: {sorted(QUERIES)}"
        )
    return numbers


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _tpch(args: argparse.Namespace) -> int:
    data_dir = generate(args.scale, args.data_dir, args.partitions)
    print(f"data:   {data_dir}")
    print(f"runner: {args.runner}")
    print("(the first shoal query includes starting the runner)")
    print()
    tables = scan_tables(data_dir)
    header = f"{'query':<6} {'rows':>6} {'shoal s':>9} {'polars streaming s':>19} "
    header += f"{'polars in-memory s':>19}  match"
    print(header)
    reports = []
    try:
        for number in args.queries:
            report = _run_query(number, tables, args.runner)
            reports.append(report)
            print(_format_row(report), flush=True)
    finally:
        shoal.shutdown()
    failures = [r for r in reports if not r.ok]
    if failures:
        print()
        for report in failures:
            print(f"Q{report.query}: {report.detail}")
    return 1 if failures else 0


def _run_query(number: int, tables: dict[str, pl.LazyFrame], runner: str) -> QueryReport:
    query = QUERIES[number]
    expected, streaming_s = _timed(lambda: query(tables).collect())
    _, in_memory_s = _timed(lambda: query(tables).collect(engine="in-memory"))
    report = QueryReport(number, expected.height, None, streaming_s, in_memory_s, "yes")
    try:
        engine = shoal.DistEngine(runner=runner, raise_on_fail=True)
        result, shoal_s = _timed(lambda: query(tables).collect(engine=engine))
    except shoal.UnsupportedError as exc:
        return replace(report, status="unsupported", detail=f"fallback/unsupported: {exc}")
    except Exception as exc:
        return replace(report, status="error", detail=f"error: {type(exc).__name__}: {exc}")
    ok, reason = compare_frames(result, expected, SORT_KEYS[number])
    if ok:
        return replace(report, shoal_s=shoal_s)
    return replace(report, shoal_s=shoal_s, status="NO", detail=f"mismatch: {reason}")


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _format_row(report: QueryReport) -> str:
    shoal_s = f"{report.shoal_s:.3f}" if report.shoal_s is not None else "-"
    return (
        f"{'Q' + str(report.query):<6} {report.rows:>6} {shoal_s:>9} "
        f"{report.streaming_s:>19.3f} {report.in_memory_s:>19.3f}  {report.status}"
    )
