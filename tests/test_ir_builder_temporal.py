"""The builder's temporal operators (Frame.join_asof, group_by_dynamic, rolling,
merge_sorted; shoal/plan/builder_temporal.py): each plan, run with shoal.execute on several
partitions (Parquet parts with an empty one), equals native Polars, row order included;
bad input raises PlanError naming the column and type before anything runs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal import ir
from shoal.errors import PlanError
from shoal.ir.nodes import AsofJoin, DynamicGroupBy, MergeSorted, RollingGroupBy
from shoal.plan.validate import validate

CONFIG = shoal.Config(default_partitions=3)
#: Polars warns that it cannot check sortedness with by-columns (the data is sorted).
pytestmark = pytest.mark.filterwarnings("ignore:Sortedness of columns cannot be checked")
T0 = dt.datetime(2024, 3, 1)


def run(frame: ir.Frame) -> pl.DataFrame:
    validate(frame.plan)
    out = pl.from_arrow(frame.execute(runner="local", config=CONFIG))
    assert isinstance(out, pl.DataFrame)
    return out


def parts(df: pl.DataFrame, root: Path) -> ir.Frame:
    """``df`` as four Parquet files read in order: three slices and an empty one."""
    root.mkdir()
    n = df.height
    pieces = [df.slice(0, n // 3), df.clear(), df.slice(n // 3, n // 3), df.slice(2 * (n // 3))]
    for i, piece in enumerate(pieces):
        piece.write_parquet(root / f"part-{i}.parquet")
    return ir.scan_parquet(root)


@pytest.fixture(scope="module")
def trades() -> pl.DataFrame:
    """Sorted by ts; NULL and duplicated syms; repeated timestamps."""
    ts = [0, 1, 1, 2, 4, 5, 5, 7, 8, 10, 11, 11, 13, 14, 16, 20, 21, 25]
    syms = ["a", "b", None, "a", "a", "b", "b", "c", None, "a", "b", "a", "c", "a", "b", "a",
            "c", "b"]  # fmt: skip
    return pl.DataFrame(
        {
            "ts": ts,
            "at": [T0 + dt.timedelta(hours=t) for t in ts],
            "sym": syms,
            "qty": [float(i) if i % 5 else None for i in range(len(ts))],
        }
    )


@pytest.fixture(scope="module")
def quotes() -> pl.DataFrame:
    ts = [0, 1, 1, 3, 5, 6, 9, 11, 12, 15, 19, 22]
    return pl.DataFrame(
        {
            "qts": ts,
            "qat": [T0 + dt.timedelta(hours=t) for t in ts],
            "qsym": ["a", "a", "b", "b", None, "a", "c", "a", "b", "c", "a", "b"],
            "bid": [float(t) / 2 for t in ts],
        }
    )


@pytest.fixture()
def frames(tmp_path: Path, trades: pl.DataFrame, quotes: pl.DataFrame) -> tuple[ir.Frame, ir.Frame]:
    return parts(trades, tmp_path / "t"), parts(quotes, tmp_path / "q")


ASOF_CASES: dict[str, dict[str, Any]] = {
    "backward by": dict(left_on="ts", right_on="qts", by_left="sym", by_right="qsym"),
    "forward by, no exact": dict(
        left_on="ts",
        right_on="qts",
        by_left="sym",
        by_right="qsym",
        strategy="forward",
        allow_exact_matches=False,
    ),  # fmt: skip
    "nearest": dict(left_on="ts", right_on="qts", strategy="nearest"),
    "numeric tolerance": dict(left_on="ts", right_on="qts", tolerance=1),
    "datetime, duration tolerance": dict(
        left_on="at", right_on="qat", by_left="sym", by_right="qsym", tolerance="2h"
    ),
    "datetime, timedelta tolerance, forward": dict(
        left_on="at", right_on="qat", strategy="forward", tolerance=dt.timedelta(hours=3)
    ),
}


@pytest.mark.parametrize("name", ASOF_CASES)
def test_join_asof_matches_polars(
    frames: tuple[ir.Frame, ir.Frame], trades: pl.DataFrame, quotes: pl.DataFrame, name: str
) -> None:
    left, right = frames
    options = ASOF_CASES[name]
    q = left.join_asof(right, **options)
    assert isinstance(q.plan, AsofJoin)
    expected = trades.lazy().join_asof(quotes.lazy(), **options).collect()
    assert q.schema == ir.Schema.from_polars(expected.schema)
    assert_frame_equal(run(q), expected)


def test_join_asof_on_the_same_name_and_by(trades: pl.DataFrame, tmp_path: Path) -> None:
    quotes = pl.DataFrame({"ts": [1, 4, 9], "sym": ["a", "b", "a"], "px": [1.0, 2.0, 3.0]})
    left = parts(trades.select("ts", "sym", "qty"), tmp_path / "t")
    q = left.join_asof(ir.from_polars(quotes), on="ts", by="sym", suffix="_q")
    expected = trades.select("ts", "sym", "qty").join_asof(quotes, on="ts", by="sym", suffix="_q")
    assert_frame_equal(run(q), expected)


@pytest.mark.parametrize(
    ("options", "polars_options"),
    [
        (dict(every="3i"), dict(every="3i")),
        (
            dict(every="4i", period="6i", offset="-1i", closed="both", label="right",
                 include_boundaries=True, group_by="sym"),
            dict(every="4i", period="6i", offset="-1i", closed="both", label="right",
                 include_boundaries=True, group_by="sym"),
        ),
        (dict(every="5i", start_by="datapoint", group_by="sym"),
         dict(every="5i", start_by="datapoint", group_by="sym")),
    ],
)  # fmt: skip
def test_group_by_dynamic_integer_index(
    frames: tuple[ir.Frame, ir.Frame],
    trades: pl.DataFrame,
    options: dict[str, Any],
    polars_options: dict[str, Any],
) -> None:
    left, _ = frames
    q = left.group_by_dynamic("ts", **options).agg(
        ir.col("qty").sum(), n=ir.len(), last_sym=ir.col("sym").last()
    )
    assert isinstance(q.plan, DynamicGroupBy)
    expected = (
        trades.lazy()
        .group_by_dynamic("ts", **polars_options)
        .agg(pl.col("qty").sum(), n=pl.len(), last_sym=pl.col("sym").last())
        .collect()
    )
    assert_frame_equal(run(q), expected)


def test_group_by_dynamic_datetime_index(
    frames: tuple[ir.Frame, ir.Frame], trades: pl.DataFrame
) -> None:
    left, _ = frames
    q = left.group_by_dynamic(
        "at", every=dt.timedelta(hours=4), period="6h", group_by=ir.col("sym")
    ).agg(ir.col("qty").mean().alias("mean_qty"), ir.col("qty").count().alias("n"))
    expected = (
        trades.lazy()
        .group_by_dynamic("at", every="4h", period="6h", group_by="sym")
        .agg(pl.col("qty").mean().alias("mean_qty"), pl.col("qty").count().alias("n"))
        .collect()
    )
    assert_frame_equal(run(q), expected)


@pytest.mark.parametrize(
    ("index", "options"),
    [
        ("ts", dict(period="3i")),
        ("ts", dict(period="4i", offset="-1i", closed="both", group_by="sym")),
        ("at", dict(period="5h", group_by="sym")),
        ("at", dict(period=dt.timedelta(hours=2), closed="left")),
    ],
)
def test_rolling_matches_polars(
    frames: tuple[ir.Frame, ir.Frame], trades: pl.DataFrame, index: str, options: dict[str, Any]
) -> None:
    left, _ = frames
    q = left.rolling(index, **options).agg(ir.col("qty").sum().alias("s"), n=ir.len())
    assert isinstance(q.plan, RollingGroupBy)
    expected = (
        trades.lazy()
        .rolling(index, **options)
        .agg(pl.col("qty").sum().alias("s"), n=pl.len())
        .collect()
    )
    assert_frame_equal(run(q), expected)


def test_merge_sorted_matches_polars(tmp_path: Path) -> None:
    a = pl.DataFrame({"k": [1, 1, 3, 5, 8, None], "v": ["a1", "a2", "a3", "a4", "a5", "a6"]})
    b = pl.DataFrame({"k": [0, 1, 4, 5, 9], "v": ["b1", "b2", "b3", "b4", "b5"]})
    a = a.with_columns(pl.col("k").set_sorted())
    q = parts(a, tmp_path / "a").merge_sorted(parts(b, tmp_path / "b"), "k")
    assert isinstance(q.plan, MergeSorted)
    expected = a.lazy().merge_sorted(b.lazy(), key="k").collect()
    assert_frame_equal(run(q), expected)


def test_unsorted_index_fails_when_it_runs(trades: pl.DataFrame) -> None:
    unsorted = ir.from_polars(trades.reverse())
    q = unsorted.group_by_dynamic("ts", every="2i").agg(ir.len())  # plans fine
    with pytest.raises(Exception, match="not sorted"):
        run(q)


Build = Callable[[ir.Frame, ir.Frame], Any]


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda t, q: t.join_asof(q, left_on="nope", right_on="qts"),
         r"AsofJoin, left key: column 'nope'"),
        (lambda t, q: t.join_asof(q, left_on="ts", right_on="qat"),
         r"AsofJoin: as-of keys have different types: left col\('ts'\) is Int64, right "
         r"col\('qat'\) is Datetime"),
        (lambda t, q: t.join_asof(q, on="ts"), r"AsofJoin, right key: column 'ts'"),
        (lambda t, q: t.join_asof(q, left_on="ts", right_on="qts", by_left="sym",
                                  by_right="bid"),
         r"by-columns 'sym' \(left, String\) and 'bid' \(right, Float64\) have different"),
        (lambda t, q: t.join_asof(q, left_on="ts", right_on="qts", by_left="zz",
                                  by_right="qsym"),
         r"left by-column 'zz' is not in the schema"),
        (lambda t, q: t.join_asof(q, left_on="ts", right_on="qts", by_left=["sym"],
                                  by_right=[]),
         r"1 left and 0 right by-columns"),
        (lambda t, q: t.join_asof(q, left_on="ts", right_on="qts", strategy="closest"),
         r"strategy='closest' is not one of"),
        (lambda t, q: t.join_asof(q, left_on="at", right_on="qat", tolerance=3),
         r"tolerance=3 does not fit the Datetime"),
        (lambda t, q: t.join_asof(q, left_on="ts", right_on="qts", tolerance="1h"),
         r"tolerance='1h' does not fit the Int64 key"),
        (lambda t, q: t.join_asof(q, left_on=ir.col("ts") > 1, right_on=ir.col("qts") > 1),
         r"left key .* is Boolean; an as-of key must be numeric"),
        (lambda t, q: t.group_by_dynamic("sym", every="1i").agg(ir.len()),
         r"DynamicGroupBy: index column 'sym' is String; Polars needs Int32, Int64, Date"),
        (lambda t, q: t.group_by_dynamic("qty", every="1i").agg(ir.len()),
         r"index column 'qty' is Float64"),
        (lambda t, q: t.group_by_dynamic("missing", every="1i").agg(ir.len()),
         r"index column 'missing' is not in the schema"),
        (lambda t, q: t.group_by_dynamic("ts", every="1h").agg(ir.len()),
         r"every='1h' does not fit an integer index"),
        (lambda t, q: t.group_by_dynamic("at", every="2i").agg(ir.len()),
         r"every='2i' does not fit a temporal index"),
        (lambda t, q: t.group_by_dynamic("at", every="soon").agg(ir.len()),
         r"every='soon' is not a duration"),
        (lambda t, q: t.group_by_dynamic("ts", every="1i", closed="open").agg(ir.len()),
         r"closed='open' is not one of"),
        (lambda t, q: t.group_by_dynamic("ts", every="1i", group_by="nope").agg(ir.len()),
         r"DynamicGroupBy, group_by: column 'nope'"),
        (lambda t, q: t.group_by_dynamic("ts", every="1i").agg(ir.col("qty")),
         r"aggregation 'qty' .* outside an aggregate function"),
        (lambda t, q: t.rolling("ts", period=dt.timedelta(hours=1)).agg(ir.len()),
         r"RollingGroupBy: period=.* an integer index takes a duration in index units"),
        (lambda t, q: t.rolling("sym", period="2i").agg(ir.len()),
         r"RollingGroupBy: index column 'sym' is String; Polars needs Int32, Int64, UInt32"),
        (lambda t, q: t.merge_sorted(t, "nope"), r"MergeSorted: key 'nope' is not a column"),
        (lambda t, q: t.merge_sorted(t.select("ts", "sym"), "ts"),
         r"MergeSorted: both inputs need the same schema"),
    ],
)  # fmt: skip
def test_bad_input_raises_plan_error(
    trades: pl.DataFrame, quotes: pl.DataFrame, build: Build, match: str
) -> None:
    with pytest.raises(PlanError, match=match):
        build(ir.from_polars(trades), ir.from_polars(quotes))
