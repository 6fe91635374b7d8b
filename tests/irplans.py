"""Small IR plans built by hand, for tests that do not go through a frontend."""

from __future__ import annotations

import polars as pl

from shoal.ir import Agg, Aggregate, Col, InMemorySource, NamedExpr, PlanNode, Scan, Schema, Sort
from shoal.ir.types import DataType


def frame(rows: int = 500) -> pl.DataFrame:
    """Keys with nulls and skew (key 0 is most common), values with NaN."""
    return pl.DataFrame(
        {
            "k": [(i % 7 if i % 3 else 0) if i % 11 else None for i in range(rows)],
            "v": [float(i) if i % 13 else float("nan") for i in range(rows)],
        }
    )


def agg_sort_plan(df: pl.DataFrame) -> tuple[PlanNode, pl.DataFrame]:
    """``group_by(k).agg(sum(v), len()).sort(k, nulls_last)`` as IR, and Polars' answer."""
    table = df.to_arrow()
    schema = Schema.from_arrow(table.schema)
    k = Col("k", schema["k"])
    f64 = DataType.from_polars(pl.Float64)
    idx = DataType.from_polars(pl.get_index_type())
    agg = Aggregate(
        Scan(InMemorySource(table), schema),
        (NamedExpr("k", k),),
        (NamedExpr("s", Agg("sum", Col("v", f64), f64)), NamedExpr("n", Agg("len", None, idx))),
        False,
        Schema.of([("k", schema["k"]), ("s", f64), ("n", idx)]),
    )
    plan = Sort(agg, (k,), (False,), (True,), False, agg.schema)
    expected = (
        df.group_by("k")
        .agg(pl.col("v").sum().alias("s"), pl.len().alias("n"))
        .sort("k", nulls_last=True)
    )
    return plan, expected
