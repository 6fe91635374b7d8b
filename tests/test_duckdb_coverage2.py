"""shoal.duckdb: more DuckDB constructs that now run distributed (or are refused cleanly
instead of answered wrong), each compared with native DuckDB (``con.sql(q)``) on tables
split into several partitions, with NULLs, NaN, -0.0, duplicates and a partition a filter
empties. Local runner throughout."""

from __future__ import annotations

import math
from typing import Any

import duckdb
import pytest

import shoal
from shoal.ir.validate import validate

#: Tiny partitions: every in-memory table is split into 3 partitions.
CONFIG = shoal.Config(
    runner="local", default_partitions=3, shuffle_partitions=3, target_partition_bytes=1024
)


def _norm(v: Any) -> Any:
    """A value that compares as DuckDB's results should: NaN equal to NaN, floats to 12
    significant digits (the order of a floating-point sum is the engine's)."""
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else f"{v:.12g}")
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_norm(x) for x in v)
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    return v


def check(con: duckdb.DuckDBPyConnection, query: str, ordered: bool = True) -> list[Any]:
    """Run ``query`` with shoal (``raise_on_fail=True``: no fallback) and with DuckDB;
    assert the same column names, DuckDB types and rows (in order when ``ordered``, else
    as multisets). Returns DuckDB's rows."""
    validate(shoal.duckdb.to_ir(con, query))
    got_rel = shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    want_rel = con.sql(query)
    assert got_rel.columns == want_rel.columns
    assert [str(t) for t in got_rel.types] == [str(t) for t in want_rel.types]
    got = [_norm(r) for r in got_rel.fetchall()]
    want = [_norm(r) for r in want_rel.fetchall()]
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want
    return want


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    """Table t (60 rows): g a group key with duplicates and NULLs, i a unique order key,
    x a DOUBLE with NULLs, NaN, -0.0 and duplicates, n an INTEGER with NULLs, s a VARCHAR."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE t AS
        SELECT i, CASE WHEN i % 7 = 3 THEN NULL ELSE i % 4 END AS g,
               CASE WHEN i % 9 = 2 THEN NULL WHEN i = 17 THEN 'nan'::DOUBLE
                    WHEN i % 10 = 5 THEN -0.0 ELSE ((i * 37) % 23) / 4.0 END AS x,
               CASE WHEN i % 5 = 1 THEN NULL ELSE (i * 13) % 11 END::INTEGER AS n,
               'v' || ((i * 7) % 5) AS s
        FROM range(60) r(i)"""
    )
    return c


# ---------------------------------------------------------------- aggregate state export


@pytest.mark.parametrize(
    "query",
    [
        "SELECT (first(NULL::INTEGER) EXPORT_STATE)::STRUCT(value INTEGER)",
        "SELECT min(n) EXPORT_STATE FROM t",
        "SELECT finalize(sum(n) EXPORT_STATE) FROM t",
    ],
)
def test_export_state_is_refused(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """DuckDB's aggregate states (EXPORT_STATE, AGGREGATE_STATE values) have DuckDB's own
    layout: shoal refuses them (DuckDB answers on the driver) instead of answering with
    a plain value (it answered NULL where DuckDB gives ``{'value': NULL}``)."""
    con.sql(query).fetchall()  # DuckDB answers
    with pytest.raises(shoal.UnsupportedError, match="EXPORT_STATE"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    rel = shoal.duckdb.sql(con, query, config=CONFIG)  # falls back: DuckDB's own answer
    assert rel.fetchall() == con.sql(query).fetchall()
