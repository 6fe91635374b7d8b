"""The ``shoal`` command line.

``shoal tpch`` runs TPC-H queries with shoal and with native Polars (streaming and
in-memory engines), times them and checks that shoal's answers match Polars'. With
``--frontend duckdb`` it runs the DuckDB SQL forms through ``shoal.duckdb.sql`` and checks
them against native DuckDB.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import polars as pl

import shoal
from shoal.config import RunnerKind
from shoal.tpch import QUERIES, SORT_KEYS, compare_frames, generate, scan_tables
from shoal.tpch.sql import SQL_QUERIES, SQL_SORT_KEYS, register_tpch

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
        prog="shoal",
        description="shoal: a distributed execution backend for Polars and DuckDB on Ray.",
    )
    from importlib.metadata import PackageNotFoundError, version

    try:
        shown = version("shoal")
    except PackageNotFoundError:  # pragma: no cover - a source tree, not installed
        shown = "unknown"
    parser.add_argument("--version", action="version", version=f"shoal {shown}")
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
    tpch.add_argument(
        "--scale", type=_positive_float, default=1.0, help="TPC-H scale factor (default: 1)"
    )
    tpch.add_argument(
        "--queries",
        type=_query_list,
        default=None,
        help="comma-separated query numbers (default: every query of the frontend: "
        f"{','.join(map(str, sorted(QUERIES)))} for polars, 1-22 for duckdb)",
    )
    tpch.add_argument(
        "--frontend",
        choices=["polars", "duckdb"],
        default="polars",
        help="polars: the Polars queries through DistEngine, checked against native Polars; "
        "duckdb: the SQL queries through shoal.duckdb.sql, checked against native DuckDB "
        "(default: polars)",
    )
    tpch.add_argument(
        "--runner",
        choices=["ray", "local"],
        default=None,
        help="shoal runner: a Ray cluster or in-process threads (default: the configured "
        "runner, SHOAL_RUNNER, else ray)",
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
    known = set(QUERIES) | set(SQL_QUERIES)
    unknown = [n for n in numbers if n not in known]
    if not numbers or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown queries {unknown or text!r}; available: {sorted(known)}"
        )
    return numbers


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _tpch(args: argparse.Namespace) -> int:
    available = SQL_QUERIES if args.frontend == "duckdb" else QUERIES
    if args.queries is None:
        args.queries = sorted(available)
    missing = [n for n in args.queries if n not in available]
    if missing:
        print(
            f"shoal tpch: the {args.frontend} frontend has no queries {missing}; "
            f"available: {sorted(available)}"
        )
        return 2
    if args.runner is None:
        args.runner = shoal.get_config().runner
    try:
        data_dir = generate(args.scale, args.data_dir, args.partitions, say=_say)
    except (OSError, RuntimeError) as exc:
        print(f"shoal tpch: cannot prepare the TPC-H data: {exc}")
        return 2
    if args.frontend == "duckdb":
        return _tpch_duckdb(args, data_dir)
    print(f"data:   {data_dir}")
    if not _start_runner(args.runner):
        return 2
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


def _say(line: str) -> None:
    print(line, flush=True)


def _start_runner(runner: RunnerKind) -> bool:
    """Start the runner before the first query (so that no query's time includes it),
    saying so; False, after saying why, when it cannot start."""
    from shoal.runners.session import start_runner

    print(f"starting the {runner} runner ...", flush=True)
    start = time.perf_counter()
    try:
        start_runner(shoal.get_config().replace(runner=runner))
    except shoal.ShoalError as exc:
        print(f"shoal tpch: {exc}")
        return False
    print(f"runner: {runner} (started in {time.perf_counter() - start:.1f} s)", flush=True)
    return True


def _run_query(number: int, tables: dict[str, pl.LazyFrame], runner: RunnerKind) -> QueryReport:
    query = QUERIES[number]
    expected, streaming_s = _timed(lambda: query(tables).collect())
    _, in_memory_s = _timed(lambda: query(tables).collect(engine="in-memory"))
    report = QueryReport(number, expected.height, None, streaming_s, in_memory_s, "yes")
    engine = shoal.DistEngine(runner=runner, raise_on_fail=True)
    return _checked(
        report, lambda: query(tables).collect(engine=engine), expected, SORT_KEYS[number]
    )


def _tpch_duckdb(args: argparse.Namespace, data_dir: Path) -> int:
    """``shoal tpch --frontend duckdb``: the SQL queries, shoal against native DuckDB."""
    try:
        import duckdb
    except ModuleNotFoundError as exc:  # pragma: no cover - the extra is not installed
        raise SystemExit(
            "shoal tpch --frontend duckdb needs DuckDB: pip install 'shoal[tpch]'"
        ) from exc

    print(f"data:   {data_dir}")
    if not _start_runner(args.runner):
        return 2
    print()
    con = duckdb.connect()
    register_tpch(con, data_dir)
    print(f"{'query':<6} {'rows':>6} {'shoal s':>9} {'duckdb s':>9}  match")
    reports = []
    try:
        for number in args.queries:
            report = _run_sql_query(number, con, args.runner)
            reports.append(report)
            shoal_s = f"{report.shoal_s:.3f}" if report.shoal_s is not None else "-"
            print(
                f"{'Q' + str(number):<6} {report.rows:>6} {shoal_s:>9} "
                f"{report.streaming_s:>9.3f}  {report.status}",
                flush=True,
            )
    finally:
        shoal.shutdown()
        con.close()
    failures = [r for r in reports if not r.ok]
    if failures:
        print()
        for report in failures:
            print(f"Q{report.query}: {report.detail}")
    return 1 if failures else 0


def _run_sql_query(number: int, con: Any, runner: RunnerKind) -> QueryReport:
    """One SQL query: native DuckDB's time is reported in both native-time fields."""
    query = SQL_QUERIES[number]
    expected, duckdb_s = _timed(lambda: con.sql(query).pl())
    report = QueryReport(number, expected.height, None, duckdb_s, duckdb_s, "yes")
    return _checked(
        report,
        lambda: shoal.duckdb.sql(con, query, runner=runner, raise_on_fail=True).pl(),
        expected,
        SQL_SORT_KEYS[number],
    )


def _checked(
    report: QueryReport,
    run: Callable[[], pl.DataFrame],
    expected: pl.DataFrame,
    sort_keys: list[tuple[str, bool]],
) -> QueryReport:
    """``report`` completed with shoal's time and whether ``run()`` matched ``expected``."""
    try:
        result, shoal_s = _timed(run)
    except shoal.UnsupportedError as exc:
        return replace(report, status="unsupported", detail=f"fallback/unsupported: {exc}")
    except Exception as exc:
        return replace(report, status="error", detail=f"error: {type(exc).__name__}: {exc}")
    ok, reason = compare_frames(result, expected, sort_keys)
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
