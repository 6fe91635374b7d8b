"""Polars-style tests: plain lazy queries with their documented answers written out.

By default these check Polars itself. Under ``--shoal-engine`` (:mod:`tests.plugin_shoal_engine`)
every ``collect()`` here runs on shoal with very small partitions, which makes this module a
conformance test of shoal against Polars' documented behaviour
(``tests/test_polars_plugin.py`` runs it that way).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import polars as pl
from polars.testing import assert_frame_equal


def _sales() -> pl.LazyFrame:
    return pl.LazyFrame(
        {
            "shop": ["a", "b", "a", "c", "b", "a", None],
            "item": ["x", "y", "y", "x", "x", "z", "x"],
            "qty": [3, 1, None, 4, 2, 5, 1],
            "price": [1.5, 2.0, 2.5, float("nan"), 1.0, 3.0, 2.0],
            "day": [dt.date(2024, 1, d) for d in (1, 1, 2, 2, 3, 3, 4)],
        }
    )


def test_filter_with_nulls_keeps_only_true() -> None:
    out = _sales().filter(pl.col("qty") > 2).select("shop", "qty").collect()
    assert_frame_equal(out, pl.DataFrame({"shop": ["a", "c", "a"], "qty": [3, 4, 5]}))


def test_kleene_logic() -> None:
    lf = pl.LazyFrame({"p": [True, False, None, None], "q": [None, None, True, False]})
    out = lf.select(
        (pl.col("p") & pl.col("q")).alias("and"), (pl.col("p") | pl.col("q")).alias("or")
    )
    expected = pl.DataFrame({"and": [None, False, None, False], "or": [True, None, True, None]})
    assert_frame_equal(out.collect(), expected)


def test_group_by_sorted() -> None:
    out = (
        _sales()
        .group_by("shop")
        .agg(
            pl.col("qty").sum().alias("qty"),
            pl.col("qty").count().alias("n"),
            pl.len().alias("rows"),
            pl.col("price").max().alias("max_price"),
        )
        .sort("shop", nulls_last=True)
        .collect()
    )
    expected = pl.DataFrame(
        {
            "shop": ["a", "b", "c", None],
            "qty": [8, 3, 4, 1],
            "n": pl.Series([2, 2, 1, 1], dtype=pl.UInt32),
            "rows": pl.Series([3, 2, 1, 1], dtype=pl.UInt32),
            "max_price": [3.0, 2.0, float("nan"), 2.0],
        }
    )
    assert_frame_equal(out, expected)


def test_group_by_maintain_order_and_first() -> None:
    out = (
        _sales()
        .group_by("item", maintain_order=True)
        .agg(pl.col("shop").first(), pl.col("qty").median().alias("median"))
        .collect()
    )
    expected = pl.DataFrame(
        {"item": ["x", "y", "z"], "shop": ["a", "b", "a"], "median": [2.5, 1.0, 5.0]}
    )
    assert_frame_equal(out, expected)


def test_quantile_and_n_unique() -> None:
    out = _sales().select(
        pl.col("qty").quantile(0.5, "linear").alias("q"),
        pl.col("item").n_unique().alias("items"),
        pl.col("price").nan_max().alias("nan_max"),
        pl.col("price").max().alias("max"),
    )
    expected = pl.DataFrame(
        {
            "q": [2.5],
            "items": pl.Series([3], dtype=pl.UInt32),
            "nan_max": [float("nan")],
            "max": [3.0],
        }
    )
    assert_frame_equal(out.collect(), expected)


def test_mean_of_no_values_is_null_sum_is_zero() -> None:
    out = _sales().filter(pl.col("qty") > 100).select(pl.col("qty").sum(), pl.col("price").mean())
    assert_frame_equal(
        out.collect(),
        pl.DataFrame({"qty": [0], "price": [None]}, schema={"qty": pl.Int64, "price": pl.Float64}),
    )


def test_inner_and_left_join() -> None:
    shops = pl.LazyFrame({"shop": ["a", "b", "d"], "city": ["Oslo", "Rome", "Lima"]})
    inner = _sales().join(shops, on="shop").group_by("city").agg(pl.len()).sort("city")
    expected = pl.DataFrame({"city": ["Oslo", "Rome"], "len": pl.Series([3, 2], dtype=pl.UInt32)})
    assert_frame_equal(inner.collect(), expected)
    left = _sales().join(shops, on="shop", how="left").filter(pl.col("city").is_null())
    assert_frame_equal(
        left.select("shop", "qty").sort("qty").collect(),
        pl.DataFrame({"shop": [None, "c"], "qty": [1, 4]}),
    )


def test_semi_anti_full_joins() -> None:
    a = pl.LazyFrame({"k": [1, 2, 3, None]})
    b = pl.LazyFrame({"k": [2, 3, 3, 5, None], "v": [10, 20, 30, 40, 50]})
    assert_frame_equal(
        a.join(b, on="k", how="semi").sort("k").collect(), pl.DataFrame({"k": [2, 3]})
    )
    assert_frame_equal(
        a.join(b, on="k", how="anti").sort("k").collect(), pl.DataFrame({"k": [None, 1]})
    )
    assert_frame_equal(
        a.join(b, on="k", how="anti", nulls_equal=True).collect(), pl.DataFrame({"k": [1]})
    )
    full = a.join(b, on="k", how="full", coalesce=True).sort("k", "v", nulls_last=True)
    expected = pl.DataFrame(
        {"k": [1, 2, 3, 3, 5, None, None], "v": [None, 10, 20, 30, 40, 50, None]}
    )
    assert_frame_equal(full.collect(), expected)


def test_cross_join_and_join_where() -> None:
    a = pl.LazyFrame({"x": [1, 5, 9]})
    b = pl.LazyFrame({"lo": [0, 4], "hi": [6, 10]})
    out = a.join_where(b, pl.col("x") > pl.col("lo"), pl.col("x") < pl.col("hi")).sort("x", "lo")
    expected = pl.DataFrame({"x": [1, 5, 5, 9], "lo": [0, 0, 4, 4], "hi": [6, 6, 10, 10]})
    assert_frame_equal(out.collect(), expected)
    assert a.join(b, how="cross").select(pl.len()).collect().item() == 6


def test_sort_multi_key_nulls_last_and_slice() -> None:
    out = (
        _sales()
        .sort(["shop", "qty"], descending=[False, True], nulls_last=True)
        .select("shop", "qty")
        .slice(1, 4)
        .collect()
    )
    expected = pl.DataFrame({"shop": ["a", "a", "b", "b"], "qty": [3, None, 2, 1]})
    assert_frame_equal(out, expected)


def test_head_and_tail_keep_input_order() -> None:
    lf = _sales().select("qty")
    assert_frame_equal(lf.head(2).collect(), pl.DataFrame({"qty": [3, 1]}))
    assert_frame_equal(lf.tail(2).collect(), pl.DataFrame({"qty": [5, 1]}))
    assert_frame_equal(
        lf.sort("qty", nulls_last=True).tail(2).collect(), pl.DataFrame({"qty": [5, None]})
    )


def test_unique_keep_and_order() -> None:
    lf = _sales().select("item", "qty")
    first = lf.unique(subset="item", keep="first", maintain_order=True).collect()
    assert_frame_equal(first, pl.DataFrame({"item": ["x", "y", "z"], "qty": [3, 1, 5]}))
    last = lf.unique(subset="item", keep="last", maintain_order=True).collect()
    assert_frame_equal(last, pl.DataFrame({"item": ["y", "z", "x"], "qty": [None, 5, 1]}))
    none = lf.unique(subset="item", keep="none").collect()
    assert_frame_equal(none, pl.DataFrame({"item": ["z"], "qty": [5]}))


def test_cumulative_and_shift() -> None:
    out = _sales().select(
        pl.col("qty").cum_sum().alias("cum"),
        pl.col("qty").shift(1).alias("prev"),
        pl.col("qty").fill_null(strategy="forward").alias("ffill"),
        pl.col("qty").rank("dense").alias("rank"),
    )
    expected = pl.DataFrame(
        {
            "cum": [3, 4, None, 8, 10, 15, 16],
            "prev": [None, 3, 1, None, 4, 2, 5],
            "ffill": [3, 1, 1, 4, 2, 5, 1],
            "rank": pl.Series([3, 1, None, 4, 2, 5, 1], dtype=pl.UInt32),
        }
    )
    assert_frame_equal(out.collect(), expected)


def test_window_functions() -> None:
    out = _sales().select(
        "shop",
        pl.col("qty").sum().over("shop").alias("shop_qty"),
        pl.col("qty").cum_sum().over("shop", order_by="day").alias("running"),
        pl.col("day").rank("ordinal").over("item").alias("nth"),
    )
    expected = pl.DataFrame(
        {
            "shop": ["a", "b", "a", "c", "b", "a", None],
            "shop_qty": [8, 3, 8, 4, 3, 8, 1],
            "running": [3, 1, None, 4, 3, 8, 1],
            "nth": pl.Series([1, 1, 2, 2, 3, 1, 4], dtype=pl.UInt32),
        }
    )
    assert_frame_equal(out.collect(), expected)


def test_with_row_index_and_filter() -> None:
    out = _sales().with_row_index("i").filter(pl.col("item") == "x").select("i", "shop")
    expected = pl.DataFrame(
        {"i": pl.Series([0, 3, 4, 6], dtype=pl.UInt32), "shop": ["a", "c", "b", None]}
    )
    assert_frame_equal(out.collect(), expected)


def test_explode_unnest_unpivot() -> None:
    lf = pl.LazyFrame(
        {"id": [1, 2, 3], "tags": [["a", "b"], [], None], "pt": [{"x": 1, "y": 2}] * 3}
    )
    exploded = lf.select("id", "tags").explode("tags").collect()
    assert_frame_equal(exploded, pl.DataFrame({"id": [1, 1, 3], "tags": ["a", "b", None]}))
    unnested = lf.select("id", "pt").unnest("pt").collect()
    assert_frame_equal(unnested, pl.DataFrame({"id": [1, 2, 3], "x": [1, 1, 1], "y": [2, 2, 2]}))
    # The row order of a lazy unpivot differs between Polars' engines (the in-memory engine
    # gives column by column, the streaming engine row by row): compare sorted.
    long = pl.LazyFrame({"id": [1, 2], "a": [10, 20], "b": [30, 40]}).unpivot(index="id")
    long = long.sort("variable", "id")
    expected = pl.DataFrame(
        {"id": [1, 2, 1, 2], "variable": ["a", "a", "b", "b"], "value": [10, 20, 30, 40]}
    )
    assert_frame_equal(long.collect(), expected)


def test_concat_vertical_diagonal_horizontal() -> None:
    a = pl.LazyFrame({"x": [1, 2]})
    b = pl.LazyFrame({"x": [3], "y": ["q"]})
    assert_frame_equal(pl.concat([a, a]).collect(), pl.DataFrame({"x": [1, 2, 1, 2]}))
    diag = pl.concat([a, b], how="diagonal").collect()
    assert_frame_equal(diag, pl.DataFrame({"x": [1, 2, 3], "y": [None, None, "q"]}))
    wide = pl.concat([a, a.select(pl.col("x").alias("z") * 10)], how="horizontal").collect()
    assert_frame_equal(wide, pl.DataFrame({"x": [1, 2], "z": [10, 20]}))


def test_strings_dates_and_when() -> None:
    out = _sales().select(
        pl.concat_str([pl.col("shop"), pl.col("item")], separator="-").alias("key"),
        pl.col("day").dt.day().alias("d"),
        pl.when(pl.col("qty") >= 3).then(pl.lit("big")).otherwise(pl.lit("small")).alias("size"),
    )
    expected = pl.DataFrame(
        {
            "key": ["a-x", "b-y", "a-y", "c-x", "b-x", "a-z", None],
            "d": pl.Series([1, 1, 2, 2, 3, 3, 4], dtype=pl.Int8),
            "size": ["big", "small", "small", "big", "small", "big", "small"],
        }
    )
    assert_frame_equal(out.collect(), expected)


def test_casts_strict_and_not() -> None:
    lf = pl.LazyFrame({"s": ["1", "x", None], "n": [300, 1, -1]})
    out = lf.select(
        pl.col("s").cast(pl.Int32, strict=False),
        pl.col("n").cast(pl.UInt8, strict=False).alias("u"),
        pl.col("n").cast(pl.UInt8, wrap_numerical=True).alias("w"),
    )
    expected = pl.DataFrame(
        {
            "s": pl.Series([1, None, None], dtype=pl.Int32),
            "u": pl.Series([None, 1, None], dtype=pl.UInt8),
            "w": pl.Series([44, 1, 255], dtype=pl.UInt8),
        }
    )
    assert_frame_equal(out.collect(), expected)


def test_decimal_sums_stay_exact() -> None:
    lf = pl.LazyFrame(
        {
            "g": ["a", "a", "b"],
            "m": pl.Series(
                [Decimal("0.10"), Decimal("0.20"), Decimal("1.05")], dtype=pl.Decimal(10, 2)
            ),
        }
    )
    out = lf.group_by("g").agg(pl.col("m").sum()).sort("g").collect()
    assert out["m"].to_list() == [Decimal("0.30"), Decimal("1.05")]
