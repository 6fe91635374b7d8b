"""One query built three ways (Polars, DuckDB SQL, the IR builder): each IR validates and
all three run to the same answer, which is native Polars'."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl

import shoal
from shoal import ir
from shoal.plan.validate import validate
from shoal_duckdb import to_ir as duckdb_to_ir
from shoal_polars import to_ir as polars_to_ir


def _data(tmp_path: Path) -> Path:
    df = pl.DataFrame(
        {
            "k": ["a", "b", None, "a", "c", "b", "a", None] * 25,
            "v": [1.5, 2.0, 3.0, None, float("nan"), 4.5, 0.5, 7.0] * 25,
            "n": list(range(200)),
        }
    )
    path = tmp_path / "t.parquet"
    df.write_parquet(path, row_group_size=32)
    return path


def test_same_query_three_ways_same_answer(tmp_path: Path) -> None:
    path = _data(tmp_path)
    lf = (
        pl.scan_parquet(path)
        .filter(pl.col("n") >= 10)
        .group_by("k")
        .agg(pl.col("v").sum().alias("total"))
        .sort("k", nulls_last=True)
    )
    from_polars = polars_to_ir(lf)

    con = duckdb.connect()
    con.sql(f"CREATE VIEW t AS SELECT * FROM read_parquet('{path}')")
    sql = "SELECT k, sum(v) AS total FROM t WHERE n >= 10 GROUP BY k ORDER BY k NULLS LAST"
    from_duckdb = duckdb_to_ir(con, sql)

    built = (
        ir.scan_parquet([str(path)])
        .filter(ir.col("n") >= 10)
        .group_by("k")
        .agg(ir.col("v").sum().alias("total"))
        .sort("k", nulls_last=True)
    )
    from_builder = built.plan

    expected = lf.collect()
    config = shoal.Config(target_partition_bytes=512)
    answers = []
    for plan in (from_polars, from_duckdb, from_builder):
        validate(plan)
        got = pl.from_arrow(shoal.execute(plan, runner="local", config=config))
        assert isinstance(got, pl.DataFrame)
        got.columns = ["k", "total"]
        answers.append(got)
    for got in answers:
        assert got["k"].to_list() == expected["k"].to_list()
        a, b = got["total"].to_list(), expected["total"].to_list()
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert (x != x and y != y) or abs(x - y) <= 1e-9 * max(1.0, abs(y)), (x, y)
