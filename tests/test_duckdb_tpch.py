"""The 22 TPC-H queries in DuckDB SQL through ``shoal.duckdb.sql`` with ``raise_on_fail``,
against native DuckDB, on the local runner (all) and on Ray (a subset); a Polars query and a
DuckDB query over the same Parquet files on the same Ray instance."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest

import shoal
from shoal.config import RunnerKind
from shoal.ir.nodes import ParquetSource, Scan
from shoal.plan.validate import validate
from shoal.runners.session import last_query
from shoal.tpch.compare import assert_frames_match
from shoal.tpch.queries import QUERIES, scan_tables
from shoal.tpch.sql import SQL_QUERIES, SQL_SORT_KEYS, register_tpch

from .conftest import SMALL_PARTITION_BYTES

CONFIG = shoal.Config(target_partition_bytes=SMALL_PARTITION_BYTES)

#: Queries also run on Ray: aggregation, joins with a sort and limit, an outer join, and
#: semi/anti joins with conditions beyond equality.
ON_RAY = [1, 3, 13, 21]


@pytest.fixture(scope="module")
def con(tpch_dir: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    register_tpch(c, tpch_dir)
    yield c
    c.close()


def _check(con: duckdb.DuckDBPyConnection, q: int, runner: RunnerKind) -> None:
    validate(shoal.duckdb.to_ir(con, SQL_QUERIES[q]), check_sources=True)
    got = shoal.duckdb.sql(con, SQL_QUERIES[q], runner=runner, raise_on_fail=True, config=CONFIG)
    assert_frames_match(got.pl(), con.sql(SQL_QUERIES[q]).pl(), SQL_SORT_KEYS[q])
    report = last_query()
    assert report is not None and report.runner == runner
    scans = [s for s in report.physical.stages if s.scan_partitions is not None]
    assert scans and max(s.num_tasks for s in scans) > 1, "the scans should be split"
    for stage in scans:
        for node in stage.fragment.walk():
            if isinstance(node, Scan):
                assert isinstance(node.source, ParquetSource), "views read the Parquet files"


@pytest.mark.parametrize("q", sorted(SQL_QUERIES))
def test_query_matches_native_duckdb(con: duckdb.DuckDBPyConnection, q: int) -> None:
    _check(con, q, "local")


@pytest.mark.parametrize("q", ON_RAY)
def test_query_matches_native_duckdb_on_ray(
    con: duckdb.DuckDBPyConnection, ray_runner: None, q: int
) -> None:
    _check(con, q, "ray")


def test_polars_and_duckdb_agree_on_one_ray_instance(
    con: duckdb.DuckDBPyConnection, tpch_dir: Path, ray_runner: None
) -> None:
    import ray

    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=CONFIG)
    from_polars = QUERIES[1](scan_tables(tpch_dir)).collect(engine=engine)
    assert ray.is_initialized()
    address = ray.get_runtime_context().gcs_address
    polars_report = last_query()
    from_duckdb = shoal.duckdb.sql(
        con, SQL_QUERIES[1], runner="ray", raise_on_fail=True, config=CONFIG
    ).pl()
    duckdb_report = last_query()
    assert ray.get_runtime_context().gcs_address == address
    assert polars_report is not None and duckdb_report is not None
    assert polars_report.runner == duckdb_report.runner == "ray"
    assert from_polars.columns == from_duckdb.columns
    # The frameworks' own types differ (BIGINT vs UInt32 counts, DuckDB's exact DECIMAL
    # products vs Polars' rounded ones): compare the values as doubles.
    numeric = [c for c, t in from_duckdb.schema.items() if t.is_numeric()]
    as_float = pl.col(numeric).cast(pl.Float64)
    assert_frames_match(
        from_duckdb.with_columns(as_float),
        from_polars.with_columns(as_float),
        SQL_SORT_KEYS[1],
        rel_tol=1e-6,
    )


def test_duckdb_tables_are_read_into_memory(tpch_dir: Path) -> None:
    c = duckdb.connect()
    try:
        register_tpch(c, tpch_dir, kind="table")
        got = shoal.duckdb.sql(
            c,
            SQL_QUERIES[3],
            runner="local",
            raise_on_fail=True,
            config=CONFIG.replace(default_partitions=3),
        )
        assert_frames_match(got.pl(), c.sql(SQL_QUERIES[3]).pl(), SQL_SORT_KEYS[3])
        report = last_query()
        assert report is not None
        sources = [
            n.source
            for s in report.physical.stages
            for n in s.fragment.walk()
            if isinstance(n, Scan)
        ]
        assert sources and not any(isinstance(s, ParquetSource) for s in sources)
    finally:
        c.close()


def test_register_tpch_rejects_bad_input(tmp_path: Path) -> None:
    c = duckdb.connect()
    with pytest.raises(FileNotFoundError, match="lineitem|region"):
        register_tpch(c, tmp_path)
    with pytest.raises(ValueError, match="kind"):
        register_tpch(c, tmp_path, kind="nope")
