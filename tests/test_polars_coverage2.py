"""Constructs Polars hides from engines or shoal refused before, against native Polars.

Scans Polars does not show to engines (in-memory buffers, IPC) read on the driver,
``list.eval`` and the list/array functions Polars lowers to it, ``cumulative_eval``, ranges,
``pl.repeat``, ``pl.datetime``, seeded ``shuffle``/``sample``. Every query runs on the local
runner at 1, 3 and 7 partitions per in-memory frame (7 leaves some empty: checked), with
``raise_on_fail=True``, and is compared with ``collect(engine="in-memory")``, row order
included where Polars defines it.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import warnings
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.errors import UnsupportedError
from shoal_polars import DistEngine, ShoalFallbackWarning
from tests.test_polars_coverage import PARTITIONS, assert_split_with_an_empty_partition, run_dist

NAN = float("nan")


def _frame() -> pl.DataFrame:
    """Six rows: nulls, NaN, -0.0, duplicates, empty and null lists."""
    return pl.DataFrame(
        {
            "k": [1, 2, 2, None, 3, 1],
            "g": ["a", "b", "b", None, "a", "a"],
            "v": [1.5, NAN, -0.0, None, -4.0, 2.0],
            "n": [2, 3, 0, 1, 4, 2],
            "l": [[1, 2, 2], [], None, [3, None], [-5, 4, 6], [7]],
            "f": [[1.0, NAN], [-0.0, 0.0], None, [None], [2.5, -1.0], []],
            "s": [["a", "Bb"], ["c"], None, [], ["d", None], ["e", "e"]],
            "d": [dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 2), None,
                  dt.datetime(2020, 3, 28, 12), dt.datetime(2020, 1, 1), dt.datetime(2021, 2, 28)],
            "e": [dt.datetime(2020, 1, 3), dt.datetime(2020, 1, 2), dt.datetime(2020, 1, 1),
                  dt.datetime(2020, 4, 2), dt.datetime(2019, 1, 1), dt.datetime(2021, 3, 3)],
        }
    )  # fmt: skip


def check(lf: pl.LazyFrame, *, ordered: bool = True, empty: bool = True) -> None:
    """``lf`` gives Polars' answer at every partition count."""
    expected = lf.collect(engine="in-memory")
    for partitions in PARTITIONS:
        got = run_dist(lf, partitions)
        assert_frame_equal(got, expected, check_row_order=ordered)
    if empty:
        assert_split_with_an_empty_partition()


# ---------------------------------------------------------------- sources on the driver


def _buffer(kind: str) -> io.BytesIO:
    buf = io.BytesIO()
    df = _frame().select("k", "g", "v", "n")
    if kind == "csv":
        df.write_csv(buf)
    elif kind == "ndjson":
        df.write_ndjson(buf)
    elif kind == "ipc":
        df.write_ipc(buf)
    else:
        df.write_parquet(buf)
    buf.seek(0)
    return buf


SCANS: dict[str, Callable[[io.BytesIO], pl.LazyFrame]] = {
    "parquet": lambda b: pl.scan_parquet(b),
    "csv": lambda b: pl.scan_csv(b),
    "ndjson": lambda b: pl.scan_ndjson(b),
    "ipc": lambda b: pl.scan_ipc(b),
}


@pytest.mark.parametrize("kind", sorted(SCANS))
def test_buffer_scans(kind: str) -> None:
    lf = SCANS[kind](_buffer(kind))
    check(
        lf.filter(pl.col("v").is_not_nan() | pl.col("v").is_null()).with_columns(w=pl.col("n") * 2)
    )
    check(lf.group_by("g").agg(pl.col("v").sum(), pl.col("n").max()), ordered=False)
    other = pl.LazyFrame({"k": [2, 3, None], "x": ["p", "q", "r"]})
    check(lf.join(other, on="k", how="left", maintain_order="left"))


@pytest.mark.parametrize("kind", ["csv", "ndjson"])
def test_buffer_scan_count(kind: str) -> None:
    """``select(pl.len())`` of a buffer: Polars' fast count, which it does not show either."""
    check(SCANS[kind](_buffer(kind)).select(pl.len()), empty=False)


def test_buffer_scan_options_apply_on_the_driver() -> None:
    """Options of the scan itself (row index, slice) are Polars' own, read on the driver."""
    lf = pl.scan_parquet(_buffer("parquet"), row_index_name="i", row_index_offset=10, n_rows=5)
    check(lf.filter(pl.col("n") > 0).select("i", "k", "v"))


def test_buffer_scan_explain_says_read_on_the_driver() -> None:
    lf = pl.scan_parquet(_buffer("parquet")).join(pl.LazyFrame({"k": [1]}), on="k")
    text = shoal.explain(lf, runner="local")
    assert "read on the driver: Parquet scan of an in-memory buffer" in text
    assert text.count("read on the driver") == 2  # logical and physical plan


def test_ipc_files(tmp_path: Path) -> None:
    df = _frame().select("k", "g", "v", "n")
    df.head(4).write_ipc(tmp_path / "a.arrow")
    df.tail(2).write_ipc(tmp_path / "b.arrow")
    df.clear().write_ipc(tmp_path / "c.arrow")
    lf = pl.scan_ipc(tmp_path / "*.arrow")
    check(lf.filter(pl.col("k").is_not_null()).select("k", "v", pl.col("n").cum_sum()))
    check(lf.group_by("k").agg(pl.len(), pl.col("v").mean()), ordered=False)
    assert "IPC scan of" in shoal.explain(lf, runner="local")


def test_buffer_scan_under_an_untranslatable_operator_falls_back() -> None:
    """Only sources are read on the driver: a Python function above one still falls back,
    on the original query, for that reason."""
    lf = pl.scan_parquet(_buffer("parquet")).map_batches(lambda df: df.head(2))
    expected = lf.collect(engine="in-memory")
    with pytest.raises(UnsupportedError, match="mapfunction"):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))
    with pytest.warns(ShoalFallbackWarning):
        got = lf.collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert_frame_equal(got, expected)


# ---------------------------------------------------------------- list.eval


@pytest.fixture(scope="module")
def frame() -> pl.LazyFrame:
    return _frame().lazy()


EVALS: dict[str, Callable[[], pl.Expr]] = {
    "arith": lambda: pl.col("l").list.eval(pl.element() * 2 + 1),
    "cast": lambda: pl.col("l").list.eval(pl.element().cast(pl.Float64)),
    "cast-nonstrict": lambda: pl.col("f").list.eval(pl.element().cast(pl.Int8, strict=False)),
    "compare": lambda: pl.col("f").list.eval(pl.element() > 0),
    "is_nan": lambda: pl.col("f").list.eval(pl.element().is_nan()),
    "string": lambda: pl.col("s").list.eval(pl.element().str.to_uppercase() + "!"),
    "when": lambda: pl.col("l").list.eval(pl.when(pl.element() > 2).then(pl.element())),
    "sum-per-list": lambda: pl.col("l").list.eval(pl.element().sum()),
    "rank": lambda: pl.col("f").list.eval(pl.element().rank()),
    "sort": lambda: pl.col("f").list.eval(pl.element().sort(nulls_last=True)),
    "cum_sum": lambda: pl.col("l").list.eval(pl.element().cum_sum()),
    "nested": lambda: pl.col("l").list.eval(pl.concat_list(pl.element(), pl.element())),
    "unique": lambda: pl.col("l").list.unique(maintain_order=True),
    "reverse": lambda: pl.col("s").list.reverse(),
    "n_unique": lambda: pl.col("f").list.n_unique(),
    "any": lambda: pl.col("l").list.eval(pl.element() > 2).list.any(),
    "all": lambda: pl.col("l").list.eval(pl.element().is_not_null()).list.all(),
    "agg": lambda: pl.col("l").list.agg(pl.element().max() - pl.element().min()),
    "array": lambda: pl.concat_list("k", "n", "k").list.to_array(3).arr.unique(),
}


@pytest.mark.parametrize("name", sorted(EVALS))
def test_list_eval(frame: pl.LazyFrame, name: str) -> None:
    check(frame.select("k", x=EVALS[name]()))


def test_list_eval_in_filter_and_sort(frame: pl.LazyFrame) -> None:
    check(frame.filter(pl.col("l").list.eval(pl.element() > 2).list.any()).select("k", "l"))
    check(frame.sort(pl.col("l").list.eval(pl.element().abs()).list.sum(), "k").select("k", "l"))


def test_list_eval_in_group_by(frame: pl.LazyFrame) -> None:
    check(
        frame.group_by("g").agg(
            x=pl.col("l").list.eval(pl.element() + 1),
            n=pl.col("l").list.eval(pl.element()).list.len().sum(),
        ),
        ordered=False,
    )


def test_first_of_list_eval_in_group_by_is_refused(frame: pl.LazyFrame) -> None:
    """Polars 2.1 (both engines) answers ``list.eval(...).first()`` inside ``agg`` with the
    first element of the group's evaluated lists (``[2]`` for a first row ``[1, 2, 2]``
    and ``element() + 1``), not the first list: refused rather than answered differently."""
    lf = frame.group_by("g").agg(pl.col("l").list.eval(pl.element() + 1).first())
    with pytest.raises(UnsupportedError, match="an aggregate of list.eval lists"):
        run_dist(lf, 3)


def test_cumulative_eval(frame: pl.LazyFrame) -> None:
    check(frame.select("k", x=pl.col("n").cumulative_eval(pl.element().max() - pl.element().min())))


def test_list_eval_with_a_random_element_expression_is_refused(frame: pl.LazyFrame) -> None:
    """A random draw per list is not repeatable: refused, and the fallback runs the
    original query (not the rewritten one)."""
    lf = frame.select(pl.col("l").list.eval(pl.element().shuffle()))
    with pytest.raises(UnsupportedError, match="list.eval"):
        run_dist(lf, 3)
    with pytest.warns(ShoalFallbackWarning):
        got = lf.collect(engine=DistEngine(runner="local", raise_on_fail=False))
    assert got.schema == lf.collect_schema()
    assert got["l"].list.len().to_list() == frame.collect()["l"].list.len().to_list()


def test_list_eval_over_a_buffer_scan() -> None:
    lf = pl.scan_ipc(_buffer("ipc")).select(
        "k", x=pl.concat_list("k", "n").list.eval(pl.element() ** 2)
    )
    check(lf)


# ---------------------------------------------------------------- ranges, repeat, seeds


GENERATORS: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "linear_spaces": lambda f: f.select("k", x=pl.linear_spaces("v", "n", "n")),
    "linear_spaces-array": lambda f: f.select(
        x=pl.linear_spaces(pl.col("n"), 10, 3, as_array=True, closed="left")
    ),
    "datetime_ranges": lambda f: f.select("k", x=pl.datetime_ranges("d", "e", "1d12h")),
    "datetime_ranges-zone": lambda f: f.select(
        x=pl.datetime_ranges(
            "d", "e", "1w", closed="right", time_unit="ms", time_zone="Europe/Berlin"
        )
    ),
    "date_ranges": lambda f: f.select(
        x=pl.date_ranges(pl.col("d").dt.date(), pl.col("e").dt.date(), "1mo", closed="none")
    ),
    "datetime": lambda f: f.with_columns(x=pl.datetime(2020, 2, pl.col("n") + 25, pl.col("n"))),
    "repeat-len": lambda f: f.with_columns(x=pl.repeat(pl.lit("r"), pl.len())),
    "repeat-n": lambda f: f.select(x=pl.repeat(1.5, 4)),
    "repeat-agg": lambda f: f.select(x=pl.repeat(pl.col("n").sum(), 3)),
    "linear_space": lambda f: f.select(x=pl.linear_space(0, 1, 5)),
    "datetime_range": lambda f: f.select(
        x=pl.datetime_range(dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 2), "7h")
    ),
    "shuffle": lambda f: f.select(pl.col("v").shuffle(seed=3), pl.col("k").shuffle(seed=3)),
    "shuffle-with_columns": lambda f: f.with_columns(x=pl.col("n").shuffle(seed=11)),
    "sample": lambda f: f.select(pl.col("v").sample(n=3, seed=2)),
    "sample-fraction": lambda f: f.select(
        pl.col("n").sample(fraction=0.5, with_replacement=True, shuffle=True, seed=5)
    ),
}


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_generators(frame: pl.LazyFrame, name: str) -> None:
    check(GENERATORS[name](frame))


def test_seeded_shuffle_per_group(frame: pl.LazyFrame) -> None:
    check(frame.group_by("g").agg(pl.col("n").shuffle(seed=1).first()), ordered=False)


def test_unseeded_draws_run_with_polars_distribution() -> None:
    """Without a seed, ``shuffle``, ``sample`` and ``rank("random")`` are random in Polars
    too: shoal draws in one task over every row (the values' multiset, the length and the
    ranks of untied values are what both give), and two occurrences are drawn apart."""
    n = 60
    lf = pl.LazyFrame(
        {"a": [i % 7 if i % 11 else None for i in range(n)], "g": [i % 3 for i in range(n)]}
    )
    native = lf.collect()
    for partitions in PARTITIONS:
        shuffled = run_dist(lf.select(pl.col("a").shuffle(), pl.col("g")), partitions)
        assert_frame_equal(shuffled.select("a").sort("a"), native.select("a").sort("a"))
        assert_frame_equal(shuffled["g"].to_frame(), native["g"].to_frame())
        once = lf.select(pl.col("a").shuffle())
        twice = run_dist(pl.concat([once, once]), partitions)
        assert not twice.slice(0, n).equals(twice.slice(n, n))  # independent draws
        sample = run_dist(lf.select(pl.col("a").drop_nulls().sample(5)), partitions)
        assert sample.height == 5
        assert set(sample["a"].to_list()) <= set(native["a"].drop_nulls().to_list())
        ranked = run_dist(lf.with_columns(r=pl.col("a").rank("random")), partitions)
        assert sorted(ranked["r"].drop_nulls().to_list()) == list(range(1, native["a"].count() + 1))
        # the random ranks order the values as their ordinal ranks do, ties apart
        dense = ranked.with_columns(d=pl.col("a").rank("dense"))
        assert dense.filter(pl.col("r").is_not_null()).sort("r")["d"].is_sorted()
        per_group = run_dist(lf.group_by("g").agg(pl.col("a").shuffle()), partitions)
        expected = native.group_by("g").agg(pl.col("a").sort()).sort("g")
        assert_frame_equal(per_group.with_columns(pl.col("a").list.sort()).sort("g"), expected)
    seeded = lf.with_columns(r=pl.col("a").rank("random", seed=5))
    check(seeded, empty=False)


def test_no_rewrite_without_need(frame: pl.LazyFrame) -> None:
    """Queries Polars shows whole are translated once, without serialising them."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check(frame.select("k", pl.col("l").list.len()))


# ---------------------------------------------------------------- group_by and structs


def test_lists_per_group(frame: pl.LazyFrame) -> None:
    """``agg(pl.col("x"))``: the group's values as a list, in row order."""
    check(
        frame.group_by("g").agg(pl.col("v"), ks=pl.col("k").sort(), w=pl.col("n") * 2),
        ordered=False,
    )
    check(frame.group_by("g", maintain_order=True).agg(pl.col("v"), pl.col("n").max()))


def test_literals_per_group(frame: pl.LazyFrame) -> None:
    """``agg(pl.lit(1) + pl.lit(2))``: one value per group (no group: no row)."""
    for lf in (frame, frame.filter(pl.col("k") > 100)):
        check(
            lf.group_by("g").agg(
                z=(pl.lit(1, pl.Int64) + pl.lit(2)).pow(pl.lit(3)),
                s=pl.struct(pl.lit(7).alias("a"), pl.lit("x").alias("b")),
                n=pl.col("n") + pl.lit(1),
            ),
            ordered=False,
            empty=False,
        )


def test_hconcat_not_strict(frame: pl.LazyFrame) -> None:
    """``concat(how="horizontal_extend")`` pads the shorter input with nulls;
    ``how="horizontal"`` with heights that differ raises Polars' ShapeError."""
    short = frame.select("k").head(2)
    check(pl.concat([frame.select("g", "v"), short], how="horizontal_extend"), empty=False)
    with pytest.raises(pl.exceptions.ShapeError):
        run_dist(pl.concat([frame.select("g"), short], how="horizontal"), 3)


def test_pivot(frame: pl.LazyFrame) -> None:
    """``LazyFrame.pivot`` aggregates with ``item``: the group's only value."""
    lf = frame.filter(pl.col("k").is_not_null()).unique(["k", "g"], keep="first")
    check(lf.pivot(on="g", on_columns=["a", "b"], index="k", values="v"), ordered=False)


def test_item_of_a_group_with_two_values_raises_as_polars(frame: pl.LazyFrame) -> None:
    lf = frame.group_by("g").agg(pl.col("n").item())
    with pytest.raises(pl.exceptions.ComputeError):
        lf.collect(engine="in-memory")
    with pytest.raises(pl.exceptions.ComputeError, match="item"):
        run_dist(lf, 3)


def test_with_fields_reading_the_struct() -> None:
    lf = pl.LazyFrame(
        {
            "k": [1, 2, 3, 4, 5, 6],
            "s": [{"a": 1, "b": "p"}, None, {"a": 3, "b": None}, {"a": None, "b": "q"},
                  {"a": -5, "b": "r"}, {"a": 6, "b": "s"}],
        }
    )  # fmt: skip
    check(
        lf.with_columns(
            pl.col("s").struct.with_fields(
                pl.field("a") * 2, c=pl.field("b").str.to_uppercase(), d=pl.col("k") + pl.field("a")
            )
        )
    )


# ---------------------------------------------------------------- the long tail


def _tail_frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "g": ["a", "b", "b", None, "a", "a"],
            "x": [0.5, NAN, -0.0, None, -0.25, 1.0],
            "i": [3, -2, None, 0, 7, 3],
            "s": ['{"a": 1}', "Hello wORLD", None, "ab.c", "über straße", ""],
            "d": [dt.datetime(2020, 2, 29, 1, 2, 3, 456789), None, dt.datetime(1999, 12, 31),
                  dt.datetime(2024, 1, 1), dt.datetime(2000, 6, 15, 12), dt.datetime(2021, 3, 3)],
            "l": [[1, 2, 2], [], None, [3, None], [-5, 4, 6], [7]],
            "a": pl.Series([[1, 2], [None, 4], None, [0, 0], [5, -6], [3, 3]],
                           dtype=pl.Array(pl.Int64, 2)),
            "st": [{"p": 1}, None, {"p": 3}, {"p": None}, {"p": 5}, {"p": 6}],
        }
    )  # fmt: skip


ROW_WISE: dict[str, Callable[[], pl.Expr]] = {
    **{
        f: (lambda f=f: getattr(pl.col("x"), f)())
        for f in (
            "sin",
            "cos",
            "tan",
            "cot",
            "arcsin",
            "arccos",
            "arctan",
            "sinh",
            "cosh",
            "tanh",
            "arcsinh",
            "arctanh",
            "degrees",
            "radians",
        )
    },
    "arccosh": lambda: (pl.col("x") + 1).arccosh(),
    "to_physical": lambda: pl.col("d").to_physical(),
    "is_close": lambda: pl.col("x").is_close(0.5, abs_tol=0.3, nans_equal=True),
    "truncate": lambda: (pl.col("x") * 7.77).truncate(1),
    "truncate-decimal": lambda: pl.col("x").fill_nan(None).cast(pl.Decimal(10, 3)).truncate(1),
    "titlecase": lambda: pl.col("s").str.to_titlecase(),
    "encode-hex": lambda: pl.col("s").str.encode("hex"),
    "encode-base64": lambda: pl.col("s").str.encode("base64"),
    "json_path_match": lambda: pl.col("s").str.json_path_match("$.a"),
    "splitn": lambda: pl.col("s").str.splitn(" ", 2),
    "replace_many": lambda: pl.col("s").str.replace_many(["l", "ß"], ["L", "ss"]),
    "escape_regex": lambda: pl.col("s").str.escape_regex(),
    "normalize": lambda: pl.col("s").str.normalize("NFD"),
    "extract_groups": lambda: pl.col("s").str.extract_groups(r"(?<w>\w)(\w)"),
    "extract_many": lambda: pl.col("s").str.extract_many(["l", "o"], overlapping=True),
    "find_many": lambda: pl.col("s").str.find_many(["l", "o"]),
    **{
        f"dt.{f}": (lambda f=f: getattr(pl.col("d").dt, f)())
        for f in (
            "nanosecond",
            "microsecond",
            "millisecond",
            "is_leap_year",
            "days_in_month",
            "iso_year",
            "century",
            "millennium",
        )
    },
    "cast_time_unit": lambda: pl.col("d").dt.cast_time_unit("ms"),
    "total_nanoseconds": lambda: (pl.col("d") - dt.datetime(2000, 1, 1)).dt.total_nanoseconds(),
    "dt.replace": lambda: pl.col("d").dt.replace(day=1, hour=pl.col("i").abs()),
    "list.median": lambda: pl.col("l").list.median(),
    "list.std": lambda: pl.col("l").list.std(ddof=0),
    "list.var": lambda: pl.col("l").list.var(),
    "list.arg_min": lambda: pl.col("l").list.arg_min(),
    "list.arg_max": lambda: pl.col("l").list.arg_max(),
    "list.shift": lambda: pl.col("l").list.shift(pl.col("i").fill_null(1) % 2),
    "list.count_matches": lambda: pl.col("l").list.count_matches(2),
    "list.drop_nulls": lambda: pl.col("l").list.drop_nulls(),
    "list.diff": lambda: pl.col("l").list.diff(),
    "list.diff-drop": lambda: pl.col("l").list.diff(2, null_behavior="drop"),
    "list.diff-u8": lambda: pl.col("l").cast(pl.List(pl.UInt8), strict=False).list.diff(-1),
    "list.set_union": lambda: pl.col("l").list.set_union([2, 9]),
    "list.set_difference": lambda: pl.col("l").list.set_difference([2, 9]),
    "list.gather_every": lambda: pl.col("l").list.gather_every(2),
    "list.gather": lambda: pl.col("l").list.gather([0, -1], null_on_oob=True),
    "list.to_struct": lambda: pl.col("l").list.to_struct(fields=["u", "w"]),
    **{
        f"arr.{f}": (lambda f=f: getattr(pl.col("a").arr, f)())
        for f in (
            "len",
            "sum",
            "max",
            "min",
            "mean",
            "median",
            "std",
            "var",
            "arg_min",
            "arg_max",
            "to_list",
            "first",
            "last",
            "sort",
        )
    },
    "arr.get": lambda: pl.col("a").arr.get(pl.col("i").fill_null(0) % 3, null_on_oob=True),
    "arr.count_matches": lambda: pl.col("a").arr.count_matches(3),
    "arr.contains": lambda: pl.col("a").arr.contains(4),
    "arr.to_struct": lambda: pl.col("a").arr.to_struct(),
    "arr.join": lambda: pl.col("a").cast(pl.Array(pl.String, 2)).arr.join("-"),
    "arr.shift": lambda: pl.col("a").arr.shift(1),
    "json_encode": lambda: pl.col("st").struct.json_encode(),
    "as_list": lambda: pl.list("i"),
    "as_list-of-lists": lambda: pl.list("l"),
    "arr.dot": lambda: pl.col("a").arr.dot(pl.col("a")),
    "reinterpret": lambda: pl.col("i").reinterpret(dtype=pl.UInt64),
    "offset_by-expression": lambda: pl.col("d").dt.offset_by(pl.format("{}d", pl.col("i"))),
    "time_ranges": lambda: pl.time_ranges(pl.col("d").dt.time(), dt.time(13), "3h7m"),
}


@pytest.mark.parametrize("name", sorted(ROW_WISE))
def test_row_wise_functions(name: str) -> None:
    check(_tail_frame().lazy().select("g", x=ROW_WISE[name]()))


AGGREGATING: dict[str, Callable[[], pl.Expr]] = {
    "any": lambda: (pl.col("x") > 0).any(),
    "all-nulls": lambda: (pl.col("x") > -1).all(ignore_nulls=False),
    "has_nulls": lambda: pl.col("i").has_nulls(),
    "is_empty": lambda: pl.col("i").filter(pl.col("i") > 5).is_empty(),
    "is_empty-ignore_nulls": lambda: (
        pl.col("x").filter(pl.col("x") > 0.75).is_empty(ignore_nulls=True)
    ),
    "is_sorted": lambda: pl.col("i").is_sorted(),
    "skew": lambda: pl.col("i").skew(),
    "kurtosis": lambda: pl.col("i").kurtosis(fisher=False, bias=False),
    "str.join": lambda: pl.col("s").str.join("|"),
    "index_of": lambda: pl.col("i").index_of(3),
    "index_of-null": lambda: pl.col("x").index_of(None),
    "max_by": lambda: pl.col("s").max_by("i"),
    "min_by": lambda: pl.col("i").min_by(pl.col("x") * 2),
    "search_sorted": lambda: pl.col("i").sort().search_sorted(3, "right"),
}


@pytest.mark.parametrize("name", sorted(AGGREGATING))
def test_aggregating_functions(name: str) -> None:
    lf = _tail_frame().lazy()
    check(lf.select(AGGREGATING[name]()))
    check(lf.group_by("g").agg(AGGREGATING[name]()), ordered=False)


ORDERED: dict[str, Callable[[], pl.Expr]] = {
    "peak_max": lambda: pl.col("i").peak_max(),
    "peak_min": lambda: pl.col("x").peak_min(),
    "arg_unique": lambda: pl.col("g").arg_unique(),
    "explode": lambda: pl.col("l").explode(),
    "explode-empty_as_null": lambda: pl.col("l").explode(empty_as_null=False, keep_nulls=False),
}


@pytest.mark.parametrize("name", sorted(ORDERED))
def test_order_dependent_functions(name: str) -> None:
    check(_tail_frame().lazy().select(ORDERED[name]()))


def test_ray(ray_runner: None) -> None:
    """A buffer scan read on the driver, list.eval run by Ray workers (Polars' JSON of the
    expression deserialised in other processes) and a seeded shuffle, on the Ray runner."""
    config = shoal.Config(runner="ray", default_partitions=4)
    engine = DistEngine(config=config, raise_on_fail=True)
    lf = (
        pl.scan_parquet(_buffer("parquet"))
        .join(_frame().lazy().select("k", "l", "s"), on="k", how="left", maintain_order="left")
        .with_columns(
            x=pl.col("l").list.eval(pl.element().cast(pl.Float64) / 2),
            u=pl.col("s").list.unique(maintain_order=True),
            y=pl.col("n").shuffle(seed=5),
        )
    )
    assert_frame_equal(lf.collect(engine=engine), lf.collect(engine="in-memory"))


MORE: dict[str, tuple[Callable[[], pl.Expr], bool]] = {
    # name: (expression, whether it needs the frame sorted by "d" first)
    "duration": (lambda: pl.duration(days=pl.col("i"), hours=2, time_unit="ms"), False),
    "format": (lambda: pl.format("<{}|{}>", "g", "i"), False),
    "cut": (
        lambda: pl.col("x").cut([-0.1, 0.5], labels=["lo", "mid", "hi"], left_closed=True),
        False,
    ),
    "cut-breaks": (lambda: pl.col("x").cut([0.0], include_breaks=True), False),
    "qcut": (lambda: pl.col("i").qcut(2, allow_duplicates=True), False),
    "arctan2": (lambda: pl.arctan2("x", "i"), False),
    "fused-fma": (lambda: pl.col("x") * pl.col("i") + pl.col("x"), False),
    "fused-fsm": (lambda: pl.col("x") - pl.col("i") * pl.col("x"), False),
    "fused-fms": (lambda: pl.col("x") * 1.5 - pl.col("i"), False),
    "time_range": (lambda: pl.time_range(dt.time(1), dt.time(5), "50m", closed="left"), False),
    "rolling_sum_by": (lambda: pl.col("i").rolling_sum_by("d", "400d", closed="left"), True),
    "rolling_std_by": (lambda: pl.col("x").rolling_std_by("d", "3000d", min_samples=1), True),
    "rolling_quantile_by": (
        lambda: pl.col("i").rolling_quantile_by("d", "400d", quantile=0.3),
        True,
    ),
    "ewm_mean_by": (lambda: pl.col("i").ewm_mean_by("d", half_life="100d"), True),
    "rolling_sum_by-closed-none": (
        lambda: pl.col("i").rolling_sum_by("d", "1000d", closed="none"),
        True,
    ),
    "rolling_sum_by-integer-index": (
        lambda: pl.col("x").rolling_sum_by(pl.int_range(pl.len()), "2i", closed="both"),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(MORE))
def test_more_functions(name: str) -> None:
    expr, by_d = MORE[name]
    lf = _tail_frame().lazy()
    if by_d:
        lf = lf.drop_nulls("d").sort("d")
    q = lf.select(x=expr()) if name == "time_range" else lf.select("g", x=expr())
    check(q, empty=not by_d and name != "time_range")


def test_a_read_error_on_the_driver_is_refused_not_raised_as_the_query_s() -> None:
    """The driver reads every column of the scan: an error there need not be the query's.
    Strict: refused, naming Polars' error; otherwise Polars runs the query itself."""
    lf = pl.scan_ndjson(
        io.BytesIO(b'{"a": 1, "b": true}\n{"a": 2, "b": "x"}\n'),
        schema={"a": pl.Int64, "b": pl.Boolean},
    )
    with pytest.raises(UnsupportedError, match="cannot be rewritten"):
        lf.select("a").collect(engine=DistEngine(runner="local", raise_on_fail=True))
    native = lf.select("a").collect(engine="in-memory") if _reads(lf.select("a")) else None
    with pytest.warns(ShoalFallbackWarning):
        if native is None:
            with pytest.raises(pl.exceptions.ComputeError):
                lf.select("a").collect(engine=DistEngine(runner="local", raise_on_fail=False))
        else:
            got = lf.select("a").collect(engine=DistEngine(runner="local", raise_on_fail=False))
            assert_frame_equal(got, native)


def _reads(lf: pl.LazyFrame) -> bool:
    try:
        lf.collect(engine="in-memory")
    except pl.exceptions.ComputeError:
        return False
    return True


@pytest.mark.filterwarnings("ignore:.*serialization format")
def test_a_query_whose_json_form_differs_is_not_rewritten() -> None:
    from shoal_polars.rewrite import _check_round_trip

    lf = pl.LazyFrame({"a": [1]}).select(pl.col("a") + 1)
    other = json.loads(pl.LazyFrame({"a": [1]}).select(pl.col("a") + 2).serialize(format="json"))
    with pytest.raises(UnsupportedError, match="does not read back"):
        _check_round_trip(lf, other)


def test_durations_as_polars_shows_them() -> None:
    """(months, weeks, days, nanoseconds, parsed_int, negative), as NodeTraverser 16.0
    shows ``"1mo2w3d4ns"``, ``"-1mo2w3d4h"``, ``"2i"``."""
    from shoal_polars.exprs import _duration

    assert _duration((1, 2, 3, 4, False, False)) == "1mo2w3d4ns"
    assert _duration((1, 2, 3, 14_400_000_000_000, False, True)) == "-1mo2w3d14400000000000ns"
    assert _duration((0, 0, 0, 2, True, False)) == "2i"
    assert _duration((0, 0, 0, 0, False, False)) == "0ns"
