"""``Expr.gather``/``Expr.get``, Series literals, ``ewm_*`` and bitwise ``&``, ``|``, ``^`` on integers, distributed on the
local runner against native Polars (1, 3 and 7 partitions; 7 leaves partitions empty)."""

from __future__ import annotations

from collections.abc import Callable

import polars as pl
import pytest
from polars.exceptions import OutOfBoundsError

from shoal.errors import UnsupportedError
from shoal.ir.expr import ORDER_DEPENDENT_FUNCTIONS
from shoal.planner.physical import SingleOutput
from shoal.runners.session import last_query
from shoal_polars import DistEngine, ShoalFallbackWarning
from tests.test_polars_coverage import _left, check, run_dist

QUERIES: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "gather-list": lambda lf: lf.select(pl.col("n").gather([0, 2, -1])),
    "gather-expr": lambda lf: lf.select(pl.col("v").gather(pl.col("n") // 10 - 1)),
    "get": lambda lf: lf.select(pl.col("g").get(1), pl.col("v").get(-2)),
    "get-broadcast": lambda lf: lf.with_columns(first_n=pl.col("n").get(0)),
    "gather-after-filter": lambda lf: lf.filter(pl.col("n") > 15).select(
        pl.col("k").gather([1, 0])
    ),
    "gather-null-index": lambda lf: lf.select(
        pl.col("n").gather(pl.Series([None, 1], dtype=pl.Int64))
    ),
    "group_by-gather": lambda lf: lf.group_by("g", maintain_order=True).agg(
        pl.col("v").gather([0, -1]), pl.col("n").gather(pl.col("n") // 60).alias("by_expr")
    ),
    "group_by-get": lambda lf: lf.group_by("g", maintain_order=True).agg(
        pl.col("v").get(0),
        pl.col("n").get(-1).alias("last"),
        (pl.col("m") * 2).get(pl.len() - 1).alias("by_len"),
        pl.col("v").sort(nulls_last=True).get(pl.col("k").min() - pl.col("k").min()).alias("s"),
    ),
    "group_by-get-literal": lambda lf: lf.group_by("g", maintain_order=True).agg(
        pl.lit(7).get(0), pl.lit(pl.Series([7, 8, 9])).get(-1).alias("series")
    ),
    "ewm": lambda lf: lf.select(
        pl.col("v").ewm_mean(alpha=0.3),
        pl.col("n").ewm_mean(com=2, adjust=False, ignore_nulls=True).alias("n_mean"),
        pl.col("n").ewm_std(span=3, bias=True, min_samples=2).alias("n_std"),
        pl.col("k").ewm_var(half_life=1.5).alias("k_var"),
    ),
    "ewm-over": lambda lf: lf.with_columns(e=pl.col("n").ewm_mean(alpha=0.5).over("g")),
    "series-literal": lambda lf: lf.with_columns(s=pl.Series([5, None, 7, 8, 9, 10])),
    "series-literal-filter": lambda lf: lf.filter(pl.col("n") > 15).with_columns(
        s=pl.Series(["a", "b", None, "d", "e"])
    ),
    "bitwise-and": lambda lf: lf.select(pl.col("n") & 12, pl.col("k") & pl.col("k")),
    "bitwise-or-xor": lambda lf: lf.select(
        (pl.col("n") | 3).alias("o"),
        (pl.col("n") ^ pl.col("n").shift(1)).alias("x"),
        (pl.col("k") | pl.lit(None, dtype=pl.Int32)).alias("nul"),
    ),
    "bitwise-filter": lambda lf: lf.filter((pl.col("n") & 8) == 8),
    "bitwise-unsigned": lambda lf: lf.select(
        pl.col("n").cast(pl.UInt8) ^ pl.lit(255, dtype=pl.UInt8)
    ),
}


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_gather_and_bitwise_match_polars(name: str) -> None:
    check(QUERIES[name](_left().lazy()), ordered=True)


def test_gather_runs_after_a_gather_of_rows() -> None:
    """``gather`` reads positions of the whole column, so its input arrives in order in one
    task; bitwise logic is row-local and runs in every partition."""
    run_dist(QUERIES["gather-list"](_left().lazy()), 3)
    report = last_query()
    assert report is not None
    assert report.physical.stages[-1].num_tasks == 1
    scan = next(s for s in report.physical.stages if s.scan_partitions is not None)
    assert scan.num_tasks == 3 and isinstance(scan.output, SingleOutput)
    assert "gather" in ORDER_DEPENDENT_FUNCTIONS

    run_dist(QUERIES["bitwise-filter"](_left().lazy()), 3)
    report = last_query()
    assert report is not None
    assert [s.num_tasks for s in report.physical.stages] == [3]


def test_gather_out_of_bounds_raises_polars_error() -> None:
    lf = _left().lazy().select(pl.col("n").gather([0, 99]))
    with pytest.raises(OutOfBoundsError):
        lf.collect()
    with pytest.raises(OutOfBoundsError):  # a TaskError[OutOfBoundsError]
        run_dist(lf, 3)


def test_get_per_group_out_of_bounds_raises_polars_error() -> None:
    """``agg(x.get(i))`` is the group's ``i``-th value; past a group's end Polars raises
    ``ComputeError`` (not ``OutOfBoundsError``), and so does shoal."""
    lf = _left().lazy().group_by("g").agg(pl.col("n").get(1))  # group None has one row
    with pytest.raises(pl.exceptions.ComputeError, match="out of bounds"):
        lf.collect()
    with pytest.raises(pl.exceptions.ComputeError, match="out of bounds"):
        run_dist(lf, 3)


def test_bitwise_on_floats_is_refused_then_left_to_polars() -> None:
    """``&`` of floats has no meaning in Polars (it fails when run); shoal refuses it naming
    the operator, and on fallback the user gets Polars' own error."""
    lf = _left().lazy().select(pl.col("v") & 1.0)
    with pytest.raises(pl.exceptions.PolarsError):
        lf.collect()
    with pytest.raises(UnsupportedError, match=r"BinaryExpr\(And\).*Float64"):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))
    with pytest.warns(ShoalFallbackWarning), pytest.raises(pl.exceptions.PolarsError):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=False))
