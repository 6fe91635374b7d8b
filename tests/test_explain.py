"""shoal.explain: settings, logical and physical plans, and fallback reasons."""

from __future__ import annotations

import polars as pl

import shoal
from shoal.plan.validate import validate
from shoal_polars import to_ir


def test_explain_shows_settings_logical_and_physical_plan() -> None:
    lf = pl.LazyFrame({"k": [1, 2, 2, None], "v": [1.0, 2.0, float("nan"), 4.0]})
    lf = lf.group_by("k").agg(pl.col("v").sum()).sort("k")
    text = shoal.explain(lf, config=shoal.Config(runner="local", default_partitions=3))
    assert "default_partitions=3" in text
    assert "Logical plan:" in text and "AGGREGATE BY" in text
    assert "Physical plan:" in text and "hash exchange" in text


def test_explain_names_the_reason_a_query_would_fall_back() -> None:
    lf = pl.LazyFrame({"a": [1, 2, 3]}).map_batches(lambda df: df)
    text = shoal.explain(lf, runner="local")
    assert "Falls back to the frontend's own engine" in text
    assert "MapFunction" in text


def test_tail_plans_validate() -> None:
    lf = pl.LazyFrame({"a": [1, 2, 3, 4]}).tail(2)
    validate(to_ir(lf))  # a negative Slice offset counts from the end, as in Polars
    got = lf.collect(engine=shoal.DistEngine(runner="local", raise_on_fail=True))
    assert got.equals(lf.collect())
