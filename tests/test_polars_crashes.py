"""Queries Polars answers where shoal crashed (issue 14), and where a query shoal cannot run
goes (the engine the user would have had without shoal).

Each query runs on shoal's local runner with ``raise_on_fail=True`` at 1, 3 and 7
partitions per in-memory frame (7 leaves some empty) and after every exchange, and is
compared with native Polars.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.errors import UnsupportedError
from shoal.ir import serde
from shoal.ir.types import DataType, Schema
from shoal_polars import DistEngine, ShoalFallbackWarning, to_ir

PARTITIONS = (1, 3, 7)


def run(lf: pl.LazyFrame, partitions: int = 3) -> pl.DataFrame:
    config = shoal.Config(
        runner="local",
        default_partitions=partitions,
        shuffle_partitions=partitions,
        target_partition_bytes=64,
    )
    return lf.collect(engine=DistEngine(config=config, raise_on_fail=True))


def check(lf: pl.LazyFrame, *, ordered: bool = True) -> None:
    expected = lf.collect()
    for n in PARTITIONS:
        assert_frame_equal(run(lf, n), expected, check_row_order=ordered)


# ---------------------------------------------------------------- fallback engine


def _untranslatable_corr() -> pl.LazyFrame:
    """corr of a group whose values are all null: Polars' streaming engine gives null, its
    in-memory engine NaN. ``map_batches`` (a Python function) makes shoal fall back."""
    lf = pl.LazyFrame({"g": [1, 1, 2, 2], "a": [None, None, 1.0, 2.0], "b": [None, 3.0, 2.0, 5.0]})
    return lf.group_by("g").agg(pl.corr("a", "b")).sort("g").map_batches(lambda df: df)


def test_fallback_runs_the_default_engine() -> None:
    lf = _untranslatable_corr()
    streaming, in_memory = lf.collect(engine="streaming"), lf.collect(engine="in-memory")
    assert streaming["a"][0] is None and in_memory["a"][0] != in_memory["a"][0]  # the premise
    with pytest.warns(ShoalFallbackWarning, match="falling back"):
        got = lf.collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, lf.collect())
    assert_frame_equal(got, streaming)


@pytest.fixture
def in_memory_affinity() -> Iterator[None]:
    pl.Config.set_engine_affinity("in-memory")
    yield
    pl.Config.set_engine_affinity(None)


def test_fallback_follows_a_named_affinity(in_memory_affinity: None) -> None:
    """With ``pl.Config.set_engine_affinity("in-memory")`` a plain collect runs the
    in-memory engine, and so does the fallback of ``collect(engine="dist")``."""
    lf = _untranslatable_corr()
    with pytest.warns(ShoalFallbackWarning):
        got = lf.collect(engine="dist")
    assert_frame_equal(got, lf.collect(engine="in-memory"))


def test_fallback_of_collect_all_and_batches() -> None:
    lf = _untranslatable_corr()
    engine = DistEngine(runner="local", raise_on_fail=False)
    with pytest.warns(ShoalFallbackWarning):
        (got,) = pl.collect_all([lf], engine=engine)
    assert_frame_equal(got, lf.collect())
    batches = list(lf.collect_batches(engine=engine))
    assert_frame_equal(pl.concat(batches), lf.collect())


def test_polars_panic_while_reading_the_plan_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Polars panic is a ``BaseException``: it escaped ``except Exception`` and came out
    of ``collect`` as a ``PanicException``."""
    import shoal_polars.translate as translate

    def panic(nt: object) -> None:
        raise pl.exceptions.PanicException("not implemented")

    monkeypatch.setattr(translate, "check_version", panic)
    lf = pl.LazyFrame({"a": [1, 2]}).select(pl.col("a") * 2)
    with pytest.warns(ShoalFallbackWarning, match="panicked"):
        got = lf.collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, lf.collect())
    with pytest.raises(UnsupportedError, match="panicked"):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))
    with pytest.raises(UnsupportedError, match="panicked"):
        to_ir(lf)


# ---------------------------------------------------------------- column named ""


def test_column_named_empty_string() -> None:
    """``pl.from_arrow`` renames a column ``""`` to ``column_0``."""
    lf = pl.LazyFrame({"": [3, 1, None, 3, 2], "a": [1.0, None, 2.5, -0.0, 4.0]})
    right = pl.LazyFrame({"": [3, 2], "w": ["x", "y"]})
    check(lf.with_columns((pl.col("") * 2).alias("b")))
    check(lf.group_by("").agg(pl.col("a").sum()), ordered=False)
    check(lf.join(right, on="", how="left"), ordered=False)
    check(lf.sort("", nulls_last=True))
    check(lf.select(pl.col("a").alias("")))


# ---------------------------------------------------------------- Enum


def _enum_frames() -> tuple[pl.LazyFrame, pl.LazyFrame]:
    enum = pl.Enum(["z", "a", "m"])
    left = pl.LazyFrame(
        {"k": pl.Series(["a", "z", None, "m", "a"], dtype=enum), "v": [1, 2, 3, 4, 5]}
    )
    right = pl.LazyFrame({"k": ["a", "m", "q"], "w": [10, 20, 30]})
    return left, right


def test_enum_join_with_a_column_cast_to_the_enum() -> None:
    """Join keys: an Enum column and a column the query casts to it (carried as
    Categorical before, which Polars refuses to join with an Enum)."""
    left, right = _enum_frames()
    enum = left.collect_schema()["k"]
    cast = right.with_columns(pl.col("k").cast(enum, strict=False))
    check(left.join(cast, on="k", how="inner"), ordered=False)
    check(left.join(cast, on="k", how="left", maintain_order="left"))
    check(left.join(cast, on="k", how="full"), ordered=False)


def test_enum_is_in_and_dtype() -> None:
    left, _ = _enum_frames()
    check(left.filter(pl.col("k").is_in(["a", "m"])))
    check(left.with_columns(pl.col("k").cast(pl.String).cast(left.collect_schema()["k"])))
    assert run(left).schema == left.collect_schema()


def test_enum_dtype_keeps_categories() -> None:
    enum = pl.Enum(["z", "a"])
    t = DataType.from_polars(enum)
    assert t.to_polars() == enum
    assert t != DataType.from_polars(pl.Categorical)
    assert serde.dtype_from_json(json.loads(json.dumps(serde.dtype_to_json(t)))) == t
    arrow = pl.DataFrame({"k": pl.Series(["a"], dtype=enum)}).to_arrow()
    assert Schema.from_arrow(arrow.schema)["k"] == t


# ---------------------------------------------------------------- file names


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files whose names hold glob characters, in a directory that does too."""
    root = tmp_path_factory.mktemp("odd") / "dir [1]"
    root.mkdir()
    df = pl.DataFrame({"a": [1, None, 3, 4], "s": ["x", "y", None, "w"]})
    df.write_parquet(root / "part[0].parquet")
    df.head(0).write_parquet(root / "part[1].parquet")
    df.tail(2).write_parquet(root / "part[2].parquet")
    df.write_csv(root / "t[0].csv")
    df.write_ndjson(root / "t[0].ndjson")
    return root


def _escaped(path: Path) -> str:
    return str(path).replace("[", "[[]")


def test_file_names_with_glob_characters(odd_files: Path) -> None:
    files = sorted(str(p) for p in odd_files.glob("part*.parquet"))
    check(pl.scan_parquet(files, glob=False))
    check(pl.scan_parquet(files[0], glob=False).filter(pl.col("a") > 1))
    check(pl.scan_parquet(_escaped(odd_files) + "/*.parquet").select(pl.col("a").sum()))
    check(pl.scan_csv(odd_files / "t[0].csv", glob=False))
    check(pl.scan_ndjson(_escaped(odd_files / "t[0].ndjson")))


def test_file_uris(odd_files: Path) -> None:
    path = str(odd_files / "part[0].parquet")
    uri = "file://" + urllib.parse.quote(path)
    check(pl.scan_parquet(uri))
    check(pl.scan_parquet("file://" + path, glob=False))
    check(pl.scan_csv("file://" + urllib.parse.quote(str(odd_files / "t[0].csv"))))


# ---------------------------------------------------------------- aggregations


def test_int_range_of_len_in_select() -> None:
    lf = pl.LazyFrame({"g": [1, 1, 2, None, 2], "a": [1.0, None, 3.0, 4.0, -0.0]})
    check(lf.select(pl.int_range(pl.len()).alias("i")))
    check(lf.select(pl.int_range(pl.len()).alias("i"), pl.col("a").sum()))
    check(lf.select(pl.int_range(pl.col("a").count()).alias("i"), pl.col("a").mean()))
    check(lf.filter(pl.col("a") > 0).select(pl.int_range(0, pl.col("a").len() * 2, 3).alias("i")))
    check(lf.group_by("g").agg(pl.int_range(pl.len()).alias("i")), ordered=False)


# ---------------------------------------------------------------- joins


def test_full_join_without_coalescing_keeps_both_keys() -> None:
    left = pl.LazyFrame({"k": [1, 2, None, 4], "k2": ["a", "b", "c", None], "x": [1, 2, 3, 4]})
    right = pl.LazyFrame({"k": [2, 3, None, 4], "k2": ["b", "c", "c", None], "y": [5, 6, 7, 8]})
    for how in ("full", "left", "inner", "right"):
        check(left.join(right, on="k", how=how, coalesce=False), ordered=False)
        check(left.join(right, on=["k", "k2"], how=how, coalesce=False), ordered=False)
    check(
        left.join(right, left_on="k", right_on="k", how="full", coalesce=False, nulls_equal=True),
        ordered=False,
    )
    check(
        left.join(right.rename({"k": "kk"}), left_on="k", right_on="kk", how="full"), ordered=False
    )


def test_join_on_one_column_against_two() -> None:
    """``left_on=["a", "a"]``: the hash exchange named its struct's fields after the key
    columns, and a struct cannot have two fields named ``a`` (DuplicateError). And the
    names of a coalescing right join's columns where the right has one named like a left
    key."""
    left = pl.LazyFrame({"a": [1, 2, 3, None, 5], "b": [1, 2, 3, 4, 5]})
    right = pl.LazyFrame({"a": [0, 2, 3, 5, 5], "b": [1, 2, 3, 5, None], "c": [7, 2, 3, 5, 5]})
    for how in ("full", "inner", "left", "right", "semi", "anti"):
        for coalesce in (False, True):
            lf = left.join(
                right, how=how, left_on=["a", "a"], right_on=["b", "c"], coalesce=coalesce
            )
            check(lf, ordered=False)
            if how not in ("semi", "anti"):
                check(lf.select("a", "b"), ordered=False)
    # A coalescing right join drops the left key "a": the right column "a" takes its name
    # (shoal gave the left key's values).
    check(left.join(right, how="right", left_on="a", right_on="c"), ordered=False)
    check(left.join(right, how="right", left_on=["b", "a"], right_on=["b", "c"]), ordered=False)


# ---------------------------------------------------------------- structs


def test_with_fields_of_a_nested_struct() -> None:
    """``pl.field`` in a ``with_fields`` nested in another's evaluation names a field of
    the inner struct, and the inner struct itself a field of the outer one; the rewrite
    read the inner struct's fields from the outer struct."""
    lf = pl.LazyFrame(
        {
            "n": [1, 2, 3, 4],
            "s": [
                {"a": 1, "b": {"x": 1, "y": 2}},
                {"a": 2, "b": {"x": None, "y": 3}},
                {"a": 3, "b": None},
                None,
            ],
        }
    )
    inner = pl.field("b").struct.with_fields(
        (pl.field("x") * pl.field("y") + pl.col("n")).alias("z"), pl.field("y").alias("x")
    )
    check(lf.select(pl.col("s").struct.with_fields(inner)))
    check(lf.select(pl.col("s").struct.with_fields(inner, (pl.field("a") * 10).alias("a10"))))
    chained = pl.col("s").struct.with_fields(inner).struct.with_fields(pl.field("b").alias("c"))
    check(lf.select(chained))


# ---------------------------------------------------------------- types


WIDE = [1, None, -(2**127), 2**127 - 1, -1, 0, 10**38, 5, 5]
UWIDE = [0, 2**128 - 1, None, 2**127, 3, 3, 10**38, 2, 2]


def _wide_frame() -> pl.LazyFrame:
    return pl.LazyFrame(
        {
            "a": pl.Series(WIDE, dtype=pl.Int128),
            "u": pl.Series(UWIDE, dtype=pl.UInt128),
            "k": [1, 2, 1, 2, 1, 2, 3, 3, None],
            "x": range(9),
        }
    )


@pytest.mark.parametrize(
    "query",
    [
        lambda lf: lf,
        lambda lf: lf.select(pl.col("a") + 1, pl.col("u") // 3, b=pl.col("a").abs()),
        lambda lf: lf.filter(pl.col("a") > 0),
        lambda lf: lf.sort("a", "x", nulls_last=True),
        lambda lf: lf.sort("u", "x", descending=True),
        lambda lf: lf.group_by("k").agg(pl.col("a").sum(), pl.col("u").max(), f=pl.col("a").first()),
        lambda lf: lf.group_by("a").agg(pl.len(), pl.col("u").min()),
        lambda lf: lf.join(lf.select("a", y="x"), on="a"),
        lambda lf: lf.join(lf.select("u", y="x"), on="u", how="full"),
        lambda lf: lf.unique("u"),
        lambda lf: lf.select(pl.col("a") * pl.lit(2**100, pl.Int128), pl.col("x").cast(pl.Int128) * 2**70),
        lambda lf: lf.select(pl.col("u").cast(pl.Float64), pl.col("a").cast(pl.String)),
        lambda lf: lf.filter(pl.col("a").abs() < 100).select(pl.col("a").sum(), pl.col("u").mean()),
        lambda lf: lf.with_columns(pl.col("a").cum_count(), r=pl.col("u").rank()),
        lambda lf: lf.select(
            pl.col("a").cum_sum(), m=pl.col("u").cum_max(), s=pl.col("a").cum_sum().over("k")
        ),
    ],
    ids=["scan", "arith", "filter", "sort", "sort_u", "group_by", "group_by_key", "join",
         "full_join", "unique", "literals", "casts", "aggregates", "windows", "cumulative"],
)  # fmt: skip
def test_128_bit_integer_columns_run_exactly(query: Callable[[pl.LazyFrame], pl.LazyFrame]) -> None:
    """pyarrow has no 128-bit integer: shoal carries Int128 and UInt128 columns as the 16
    bytes of an Arrow decimal128 (values beyond 10**38 too), and they raised
    ``ArrowInvalid`` or were refused."""
    lf = query(_wide_frame())
    plan = lf.explain()
    check(lf, ordered=not any(op in plan for op in ("AGGREGATE", "JOIN", "UNIQUE")))


def test_128_bit_integers_in_lists_are_refused_naming_the_column() -> None:
    lf = pl.LazyFrame({"l": pl.Series([[1, 2**100], None], dtype=pl.List(pl.Int128)), "a": [1, 2]})
    with pytest.raises(
        UnsupportedError, match=r"column 'l': Polars dtype List\(Int128\).*inside a list"
    ):
        to_ir(lf.select(pl.col("l").list.len()))
    with pytest.warns(ShoalFallbackWarning, match="Int128"):
        got = lf.collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, lf.collect())
    check(lf.select(pl.col("a") * 2))  # the list column is not read: runs on shoal


@pytest.mark.parametrize(
    "expr",
    [
        pl.col("u").cum_sum(),
        pl.col("u").cum_prod(reverse=True),
        pl.col("u").product(),
        pl.col("u").cum_sum().over("k"),
    ],
    ids=["cum_sum", "cum_prod", "product", "cum_sum_over"],
)
def test_uint128_sums_whose_dtype_polars_disagrees_on_are_refused(expr: pl.Expr) -> None:
    """For a UInt128 input Polars' plan types cum_sum, cum_prod and product Int64 while its
    engines return UInt128 (Polars 2.1): shoal answered Int64, a wrong dtype. They are
    refused by name and the fallback gives Polars' own answer; Int128 runs on shoal."""
    lf = pl.LazyFrame({"u": pl.Series([3, None, 2, 2, 0], dtype=pl.UInt128), "k": [1, 1, 2, 2, 1]})
    lf = lf.with_columns(a=pl.col("u").cast(pl.Int128))
    with pytest.raises(UnsupportedError, match=r"of a UInt128 column: Polars' schema says Int64"):
        to_ir(lf.select(expr))
    with pytest.warns(ShoalFallbackWarning, match="UInt128"):
        got = lf.select(expr).collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, lf.select(expr).collect())
    check(lf.select(pl.col("a").cum_sum(), c=pl.col("a").cum_prod(), p=pl.col("a").product()))


@pytest.mark.parametrize(
    "expr",
    [
        pl.col("d").sqrt(),
        pl.col("d").cbrt(),
        pl.col("s").sqrt(),
        pl.col("t").cbrt(),
        pl.col("n").sqrt(),
        pl.col("u").sqrt(),
    ],
    ids=["date-sqrt", "date-cbrt", "string", "time", "null", "duration"],
)
def test_roots_of_non_numeric_columns_are_refused(expr: pl.Expr) -> None:
    """Polars' plan types sqrt and cbrt of a Date, Time, Duration, String or Null column
    as the input's dtype while its engines return Float64 (Polars 2.1): shoal answered the
    plan's dtype (a String column of roots, a Date) or failed casting NaN to a Date. They
    are refused by name; the roots of numbers and booleans run on shoal."""
    lf = pl.LazyFrame(
        {
            "d": [dt.date(2020, 1, 1), None, dt.date(1969, 12, 31), dt.date(2020, 1, 1)],
            "s": ["4", None, "x", "4"],
            "t": [dt.time(1), None, dt.time(0), dt.time(23)],
            "n": pl.Series([None] * 4, dtype=pl.Null),
            "u": [dt.timedelta(1), None, dt.timedelta(-2), dt.timedelta(0)],
            "x": [4.0, float("nan"), -0.0, None],
            "b": [True, None, False, True],
        }
    )
    with pytest.raises(
        UnsupportedError, match=r"Polars' schema says .* its engines return Float64"
    ):
        to_ir(lf.select(expr))
    with pytest.warns(ShoalFallbackWarning, match=r"Function\((sqrt|cbrt)\)"):
        got = lf.select(expr).collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, lf.select(expr).collect())
    check(lf.select(pl.col("x").sqrt(), c=pl.col("x").cbrt(), b=pl.col("b").sqrt()))


@pytest.mark.parametrize(
    "expr",
    [
        pl.col("d") + pl.col("n"),
        pl.col("n") * pl.col("d"),
        pl.col("d") - None,
        pl.col("b") + pl.col("n"),
        pl.col("b") / None,
        pl.col("n") / pl.col("i"),
        pl.lit(None) / pl.col("f"),
        pl.col("n") / pl.col("n"),
    ],
    ids=[
        "dec-add",
        "dec-mul",
        "dec-lit",
        "bool-add",
        "bool-div",
        "null-div",
        "lit-div",
        "null-null",
    ],
)
def test_arithmetic_with_a_null_operand_whose_dtype_polars_disagrees_on(expr: pl.Expr) -> None:
    """An operand of dtype Null (an all-null column, ``None``) divided, or added to a
    Decimal or Boolean: Polars' plan says one dtype (Null, the Decimal's precision,
    Boolean), its engines return another (Float64, precision 38, UInt32), Polars 2.1.
    shoal answered the plan's dtype; now refused by name, and the fallback is Polars'."""
    lf = pl.LazyFrame(
        {
            "d": pl.Series([Decimal("1.5"), None, Decimal("-0.0"), Decimal("1.5")]),
            "b": [True, None, False, True],
            "n": pl.Series([None] * 4, dtype=pl.Null),
            "i": [1, None, 0, 1],
            "f": [1.0, float("nan"), -0.0, None],
        }
    ).with_columns(pl.col("d").cast(pl.Decimal(5, 1)))
    q = lf.select(x=expr)
    with pytest.raises(UnsupportedError, match=r"BinaryExpr.*an operand of dtype Null"):
        to_ir(q)
    with pytest.warns(ShoalFallbackWarning, match="dtype Null"):
        got = q.collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, q.collect())
    check(lf.select(pl.col("i") / None, pl.col("f") + None, b=pl.col("d") + pl.col("d")))


@pytest.mark.parametrize(
    "query",
    [
        lambda lf: lf.select(pl.col("n").std(), v=pl.col("n").var(ddof=0)),
        lambda lf: lf.group_by("k").agg(pl.col("n").std()),
        lambda lf: lf.select(pl.col("n").var().over("k")),
        lambda lf: lf.select(pl.col("b").interpolate().over("k")),
    ],
    ids=["std-var", "group_by", "over", "bool-interpolate"],
)
def test_std_of_a_null_column_and_interpolate_of_booleans_are_refused(
    query: Callable[[pl.LazyFrame], pl.LazyFrame],
) -> None:
    """std/var of a Null column failed in shoal's tasks (InvalidOperationError: pow of
    Null) where Polars answers null; interpolate of a Boolean column came back Float64 (the
    plan's dtype) where Polars' default engine returns Boolean. Both refused by name; the
    fallback gives Polars' own answer."""
    lf = pl.LazyFrame(
        {
            "k": [1, 1, 2, 2, None, 3],
            "n": pl.Series([None] * 6, dtype=pl.Null),
            "b": [True, None, False, True, True, False],
        }
    )
    q = query(lf)
    with pytest.raises(UnsupportedError, match=r"(std|var|interpolate)\) of a (Null|Boolean)"):
        to_ir(q)
    with pytest.warns(ShoalFallbackWarning):
        got = q.collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, q.collect(), check_row_order=False)


def test_object_columns_are_refused() -> None:
    """pyarrow took a Polars Object column as the objects' addresses (bytes)."""
    lf = pl.LazyFrame({"o": pl.Series([object(), 1], dtype=pl.Object), "a": [1, 2]})
    with pytest.raises(UnsupportedError, match=r"column 'o': Polars dtype Object"):
        to_ir(lf)
    check(lf.select("a"))


# ---------------------------------------------------------------- Parquet files


@pytest.fixture(scope="module")
def typed_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("typed")
    pq.write_table(pa.table({"a": pa.array([1, 2, 3]), "s": ["x", "y", "z"]}), root / "0.parquet")
    empty = pa.table({"a": pa.array([], pa.null()), "s": pa.array([], pa.string())})
    pq.write_table(empty, root / "1-empty-null.parquet")
    nulls = pa.table({"a": pa.array([None, None], pa.null()), "s": ["u", None]})
    pq.write_table(nulls, root / "2-null.parquet")
    t = [dt.datetime(2024, 3, 31, 1, 30), dt.datetime(2024, 10, 27, 2, 30)]
    pq.write_table(pa.table({"t": pa.array(t, pa.timestamp("us", "UTC"))}), root / "tz-0.parquet")
    pq.write_table(
        pa.table({"t": pa.array(t[::-1], pa.timestamp("us", "+00:00"))}), root / "tz-1.parquet"
    )
    return root


def test_later_file_with_a_null_typed_column(typed_files: Path) -> None:
    """pyarrow writes an untyped empty or all-null column as type Null; Polars reads it
    with the first file's type."""
    files = [str(typed_files / n) for n in ("0.parquet", "1-empty-null.parquet", "2-null.parquet")]
    check(pl.scan_parquet(files))
    check(pl.scan_parquet(files[:2]).select(pl.col("a").sum(), pl.len()))
    check(pl.scan_parquet(files).group_by("s").agg(pl.col("a").max()), ordered=False)


def test_time_zone_spelled_two_ways(typed_files: Path) -> None:
    files = [str(typed_files / "tz-0.parquet"), str(typed_files / "tz-1.parquet")]
    check(pl.scan_parquet(files))
    check(pl.scan_parquet(files).select(pl.col("t").dt.hour()))


def test_odd_files_leave_no_warning(odd_files: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(pl.scan_parquet(os.fspath(odd_files / "part[0].parquet"), glob=False))


def test_streaming_engine_panic_in_a_task_runs_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polars 2.1's streaming engine panics on some inputs its in-memory engine runs
    (``list.diff`` of some row ranges of an Arrow list column); a task whose query panics
    runs it again on the in-memory engine instead of failing with the panic."""
    from shoal.execution.scope import in_task

    original = pl.LazyFrame.collect
    panics = []

    def streaming_panics(self: pl.LazyFrame, *args: object, **kwargs: object) -> object:
        if in_task() and kwargs.get("engine") == "streaming":
            panics.append(1)
            raise pl.exceptions.PanicException("type Int64 is incompatible with expected type Null")
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    lf = pl.LazyFrame({"g": [1, 2, 1, None], "a": [1.5, None, -0.0, 4.0]})
    query = lf.group_by("g").agg(pl.col("a").sum()).sort("g")
    expected = query.collect()
    monkeypatch.setattr(pl.LazyFrame, "collect", streaming_panics)
    for n in PARTITIONS:
        assert_frame_equal(run(query, n), expected)
    assert panics


def test_a_schema_polars_cannot_show_falls_back() -> None:
    """Polars 2.1 panics in ``NodeTraverser.get_schema`` for a ``binary[offset]`` column
    (``Expr._row_encode``), and the panic poisons the traverser; the panic escaped the
    fallback. Now: refused, or run by Polars with the fallback."""
    buf = io.BytesIO()
    pl.LazyFrame({"a": [1, None, 3]}).select(pl.col("a")._row_encode()).sink_parquet(buf)
    buf.seek(0)
    lf = pl.scan_parquet(buf)
    with pytest.raises(UnsupportedError, match="get_schema panicked"):
        run(lf)
    with pytest.warns(ShoalFallbackWarning, match="get_schema panicked"):
        got = lf.collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, lf.collect())


def test_a_row_count_given_with_the_scan_is_refused(tmp_path: Path) -> None:
    """``scan_parquet(_row_count=(rows, deleted))`` (Iceberg's count from table metadata):
    Polars counts by it without reading, and raises where it exceeds its row index; shoal
    counted the rows it read."""
    path = tmp_path / "x.parquet"
    pl.DataFrame({"x": [1, 2]}).write_parquet(path)
    buf = io.BytesIO()
    pl.DataFrame({"x": [1, 2]}).write_parquet(buf)
    for lf in (
        pl.scan_parquet(path, _row_count=(10, 3)),
        pl.scan_parquet([buf.getvalue()], schema={"x": pl.Int64}, _row_count=(10, 3)),
    ):
        count = lf.select(pl.len())
        with pytest.raises(UnsupportedError, match=r"_row_count"):
            run(count)
        with pytest.warns(ShoalFallbackWarning, match="_row_count"):
            got = count.collect(engine=DistEngine(runner="local", raise_on_fail=False))
        assert_frame_equal(got, count.collect())
        assert got.item() == 7


def test_128_bit_integers_through_ray(ray_runner: None) -> None:
    """The same bytes through Ray's object store (tables pickled between processes)."""
    lf = _wide_frame().join(_wide_frame().select("u", y="x"), on="u", how="left").sort("x", "y")
    config = shoal.Config(runner="ray", default_partitions=3, shuffle_partitions=3)
    got = lf.collect(engine=DistEngine(config=config, raise_on_fail=True))
    assert_frame_equal(got, lf.collect())
