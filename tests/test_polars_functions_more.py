"""Everyday Polars functions (issue 3: ``list.*``, ``str.*``, ``dt.*``, ``struct.*``, other
row-local functions and aggregating functions) on shoal, against native Polars.

Each query runs at 1, 3 and 7 partitions (``check`` from ``test_polars_coverage``: 7
partitions of 6 rows leave some empty) with ``raise_on_fail=True``, so a function that falls
back to Polars fails the test. The frame has nulls, NaN, duplicates, empty lists, a null
list, a null struct and datetimes in a time zone with a daylight-saving change.
"""

from __future__ import annotations

import datetime as dt

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

from shoal.config import Config
from shoal.errors import TaskError, UnsupportedError
from shoal.ir import serde
from shoal.ir.expr import AGGREGATING_FUNCTIONS, ORDER_DEPENDENT_FUNCTIONS
from shoal.ir.nodes import Aggregate, InMemorySource, PlanNode, Scan
from shoal.plan.substrait import to_substrait
from shoal.planner.physical import HashOutput
from shoal.runners.session import last_query
from shoal_polars import DistEngine, to_ir
from tests.test_polars_coverage import check, run_dist

Query = dict[str, pl.Expr]


def _frame() -> pl.DataFrame:
    """Six rows: nulls everywhere, NaN, duplicate keys, an empty and a null list."""
    berlin = pl.Datetime("us", "Europe/Berlin")
    return pl.DataFrame(
        {
            "k": ["a", "b", "a", None, "b", "a"],
            "i": [1, 2, 2, None, 5, 1],
            "x": [1.5, float("nan"), 2.0, None, -4.0, 2.0],
            "y": [3.0, 1.0, None, 2.0, -8.0, 4.5],
            "l": [[3, 1, None], [], None, [5], [2, 2, 9, 7], [0]],
            "s": ["a,b,c", "xyz", None, "", "A,B", "b,a"],
            "j": ['{"a": 1, "b": "p"}', '{"a": null}', None, '{"b": "q"}', "{}", '{"a": 5}'],
            "t": pl.Series(
                [dt.datetime(2024, 3, 31, 1, 29), None, dt.datetime(2024, 10, 27, 3, 45),
                 dt.datetime(2021, 1, 1, 0, 0, 30), dt.datetime(1999, 12, 31, 23, 59),
                 dt.datetime(2024, 3, 31, 3, 31)]
            ).dt.replace_time_zone("Europe/Berlin", ambiguous="earliest").cast(berlin),
            "d": [dt.date(2020, 1, 5), None, dt.date(2021, 3, 1), dt.date(2020, 1, 5),
                  dt.date(1969, 12, 31), dt.date(2022, 7, 4)],
            "tm": [dt.time(1, 2, 3), dt.time(23, 59, 59, 999999), None, dt.time(0, 0),
                   dt.time(12, 0), dt.time(6, 30)],
            "st": [{"p": 1, "q": "u"}, {"p": 2, "q": None}, None, {"p": 4, "q": "w"},
                   {"p": 5, "q": "v"}, {"p": None, "q": "u"}],
        }
    )  # fmt: skip


@pytest.fixture(scope="module")
def frame() -> pl.LazyFrame:
    return _frame().lazy()


# ---------------------------------------------------------------- row-local functions

ROW_LOCAL: Query = {
    # lists
    "list.get": pl.col("l").list.get(1, null_on_oob=True),
    "list.get-negative": pl.col("l").list.get(-1, null_on_oob=True),
    "list.get-column-index": pl.col("l").list.get(pl.col("i") - 1, null_on_oob=True),
    "list.first": pl.col("l").list.first(),
    "list.last": pl.col("l").list.last(),
    "list.sort": pl.col("l").list.sort(),
    "list.sort-desc-nulls_last": pl.col("l").list.sort(descending=True, nulls_last=True),
    "list.sort-nulls_last": pl.col("l").list.sort(nulls_last=True),
    "list.sort-strings": pl.col("s").str.split(",").list.sort(descending=True),
    "list.sort-floats-nan": pl.concat_list("x", "y", "x").list.sort(),
    "list.slice": pl.col("l").list.slice(1, 2),
    "list.slice-negative": pl.col("l").list.slice(-2),
    "concat_list": pl.concat_list("l", pl.col("l").list.slice(1)),
    "concat_list-scalars": pl.concat_list("i", pl.col("i") * 2),
    # strings
    "str.contains_any": pl.col("s").str.contains_any(["a", "Y"]),
    "str.contains_any-ci": pl.col("s").str.contains_any(["a", "Y"], ascii_case_insensitive=True),
    "str.split_exact": pl.col("s").str.split_exact(",", 1),
    "str.split_exact-inclusive": pl.col("s").str.split_exact(",", 2, inclusive=True),
    "str.json_decode": pl.col("j").str.json_decode(pl.Struct({"a": pl.Int64, "b": pl.String})),
    "str.extract_all": pl.col("s").str.extract_all(r"[a-b]"),
    "str.find": pl.col("s").str.find("b"),
    "str.find-literal": pl.col("s").str.find(",", literal=True),
    "str.find-not-strict": pl.col("s").str.find("(", strict=False),
    # temporal (time zone Europe/Berlin, across daylight-saving changes)
    "dt.round": pl.col("t").dt.round("1h"),
    "dt.round-15m": pl.col("t").dt.round("15m"),
    "dt.round-date": pl.col("d").dt.round("1mo"),
    "dt.round-1d-tz": pl.col("t").dt.round("1d"),
    "dt.round-1w-tz": pl.col("t").dt.round("1w"),
    "dt.timestamp": pl.col("t").dt.timestamp(),
    "dt.timestamp-ms": pl.col("t").dt.timestamp("ms"),
    "dt.timestamp-date": pl.col("d").dt.timestamp("ns"),
    "dt.epoch-s": pl.col("t").dt.epoch("s"),
    "dt.epoch-d": pl.col("t").dt.epoch("d"),
    "dt.epoch-us": pl.col("t").dt.epoch("us"),
    "dt.combine": pl.col("d").dt.combine(pl.col("tm")),
    "dt.combine-ms": pl.col("d").dt.combine(pl.col("tm"), "ms"),
    "dt.combine-tz": pl.col("t").dt.combine(pl.col("tm")),
    # other row-local functions
    "hash": pl.col("i").hash(42),
    "hash-str": pl.col("s").hash(7),
    "replace_strict-default": pl.col("i").replace_strict([1, 2], [10, 20], default=0),
    "replace_strict-dtype": pl.col("k").replace_strict(
        {"a": 1, "b": 2}, default=None, return_dtype=pl.Int16
    ),
    "replace_strict-default-column": pl.col("i").replace_strict([1, 5], [-1, -5], default="i"),
    "replace_strict-complete": pl.col("i")
    .fill_null(5)
    .replace_strict({1: "one", 2: "two", 5: "five"}),
    "struct.rename_fields": pl.col("st").struct.rename_fields(["a", "b"]),
    "struct.with_fields": pl.col("st").struct.with_fields(z=pl.col("i") * 2, q=pl.col("s")),
    "int_ranges": pl.int_ranges(0, pl.col("i"), 2),
    "int_ranges-columns": pl.int_ranges(pl.col("i"), pl.col("i") * 3, pl.col("i").fill_null(1)),
    "int_ranges-dtype": pl.int_ranges(pl.col("i"), 4, dtype=pl.Int16),
    "round_sig_figs": pl.col("x").round_sig_figs(1),
    "round_sig_figs-3": (pl.col("y") * 1234.5678).round_sig_figs(3),
    "dt.time": pl.col("t").dt.time(),
    "dt.time-combine": pl.col("d").dt.combine(pl.col("t").dt.time()),
    "bitwise_count_ones": pl.col("i").bitwise_count_ones(),
    "bitwise_leading_zeros": pl.col("i").bitwise_leading_zeros(),
    "bitwise_trailing_ones": pl.col("i").cast(pl.UInt8).bitwise_trailing_ones(),
}


@pytest.mark.parametrize("name", sorted(ROW_LOCAL))
def test_row_local(frame: pl.LazyFrame, name: str) -> None:
    check(frame.select("i", ROW_LOCAL[name].alias("out")), ordered=True)


@pytest.mark.parametrize("name", sorted(ROW_LOCAL))
def test_row_local_runs_in_every_partition(frame: pl.LazyFrame, name: str) -> None:
    """Row-local functions need no gather: the projection runs in the scan's tasks."""
    plan = to_ir(frame.select(ROW_LOCAL[name].alias("out")))
    exprs = [e for n in plan.walk() for ne in getattr(n, "exprs", ()) for e in ne.expr.walk()]
    assert exprs and all(ne.is_row_local() for ne in exprs)


def test_replace_strict_unmapped_raises_polars_error(frame: pl.LazyFrame) -> None:
    """An unmapped value without a default: the task fails with Polars' own
    InvalidOperationError, named in the TaskError that names the stage and partition."""
    lf = frame.select(pl.col("i").replace_strict({1: 10, 2: 20}))
    with pytest.raises(pl.exceptions.InvalidOperationError):
        lf.collect(engine="in-memory")
    for partitions in (1, 3):
        with pytest.raises(TaskError, match="InvalidOperationError: incomplete mapping"):
            run_dist(lf, partitions)


def test_json_decode_bad_json_raises_polars_error(frame: pl.LazyFrame) -> None:
    lf = frame.select(pl.col("s").str.json_decode(pl.Struct({"a": pl.Int64})))
    with pytest.raises(pl.exceptions.ComputeError):
        lf.collect(engine="in-memory")
    with pytest.raises(TaskError, match="ComputeError: error deserializing JSON"):
        run_dist(lf, 3)


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        (pl.col("i").approx_n_unique(), "HyperLogLog"),
        (pl.col("l").list.eval(pl.element().shuffle()), "Polars does not show this expression"),
    ],
)
def test_refused_with_reason(frame: pl.LazyFrame, expr: pl.Expr, reason: str) -> None:
    with pytest.raises(UnsupportedError, match=reason):
        to_ir(frame.select(expr))


# ---------------------------------------------------------------- aggregating functions

AGGREGATIONS: Query = {
    "corr": pl.corr("x", "y"),
    "corr-spearman": pl.corr("i", "y", method="spearman"),
    "corr-spearman-propagate_nans": pl.corr("x", "y", method="spearman", propagate_nans=True),
    "cov": pl.cov("i", "y"),
    "cov-ddof0": pl.cov("x", "y", ddof=0),
    "entropy": pl.col("i").entropy(),
    "entropy-base2-raw": pl.col("y").abs().entropy(base=2, normalize=False),
    "corr-plus-sum": pl.corr("i", "y") + pl.col("i").sum(),
    "bitwise_and": pl.col("i").bitwise_and(),
    "bitwise_or": pl.col("i").bitwise_or(),
    "bitwise_xor": (pl.col("i") * 3).bitwise_xor(),
}

#: Aggregating functions that give several rows in ``select`` (a list per group in ``agg``).
MULTI_ROW: Query = {
    "value_counts": pl.col("i").value_counts(),
    "value_counts-sort-normalize": pl.col("k").value_counts(sort=True, normalize=True),
    "value_counts-name": pl.col("i").value_counts(name="n"),
    "unique_counts": pl.col("k").unique_counts(),
    "drop_nulls": pl.col("i").drop_nulls(),
    "drop_nans": pl.col("x").drop_nans(),
}


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_aggregation_in_select(frame: pl.LazyFrame, name: str) -> None:
    check(frame.select(AGGREGATIONS[name].alias("out")))


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_aggregation_in_group_by(frame: pl.LazyFrame, name: str) -> None:
    check(frame.group_by("k").agg(AGGREGATIONS[name].alias("out"), pl.len()))


@pytest.mark.parametrize("name", sorted(AGGREGATIONS))
def test_aggregation_in_group_by_maintain_order(frame: pl.LazyFrame, name: str) -> None:
    check(
        frame.group_by("k", maintain_order=True).agg(AGGREGATIONS[name].alias("out")), ordered=True
    )


def test_unique_counts_in_select_keeps_order_of_appearance(frame: pl.LazyFrame) -> None:
    check(frame.select(MULTI_ROW["unique_counts"].alias("out")), ordered=True)


@pytest.mark.parametrize("name", sorted(MULTI_ROW))
def test_multi_row_in_select(frame: pl.LazyFrame, name: str) -> None:
    # value_counts without sort gives its rows in no defined order: compare as sets.
    lf = frame.select(MULTI_ROW[name].alias("out"))
    check(lf.unnest("out", separator=".") if name.startswith("value_counts") else lf)


@pytest.mark.parametrize("name", sorted(MULTI_ROW))
def test_multi_row_in_group_by(frame: pl.LazyFrame, name: str) -> None:
    # one list per group; the order of value_counts' rows inside it is not defined
    lf = frame.group_by("k").agg(MULTI_ROW[name].alias("out")).explode("out")
    if name.startswith("value_counts"):
        lf = lf.unnest("out", separator=".")
    check(lf)


def test_aggregation_over_window(frame: pl.LazyFrame) -> None:
    check(frame.select("i", pl.corr("x", "y").over("k").alias("c")), ordered=True)


def test_aggregations_hash_exchange_rows_by_key(frame: pl.LazyFrame) -> None:
    """group_by().agg(corr) cannot be split: the rows are shuffled by key, one task per
    bucket aggregates each group once (no single-task gather)."""
    # adaptive=False: the stages as planned (adaptive execution may coalesce small buckets)
    config = Config(
        runner="local", default_partitions=3, target_partition_bytes=512, adaptive=False
    )
    frame.group_by("k").agg(pl.corr("x", "y")).collect(engine=DistEngine(config=config))
    report = last_query()
    assert report is not None
    stages = report.physical.stages
    assert any(isinstance(s.output, HashOutput) for s in stages)
    assert all(
        s.num_tasks > 1 for s in stages if any(isinstance(n, Aggregate) for n in s.fragment.walk())
    )


def test_aggregating_functions_read_other_rows() -> None:
    assert AGGREGATING_FUNCTIONS <= ORDER_DEPENDENT_FUNCTIONS


# ---------------------------------------------------------------- Ray runner


def _ray(lf: pl.LazyFrame) -> pl.DataFrame:
    config = Config(runner="ray", default_partitions=4)
    return lf.collect(engine=DistEngine(config=config, raise_on_fail=True))


def test_ray(frame: pl.LazyFrame, ray_runner: None) -> None:
    """A mix of the new functions on the Ray runner (hash values computed in other
    processes included)."""
    lf = frame.select(
        "i",
        pl.col("l").list.sort(descending=True).list.get(0, null_on_oob=True).alias("top"),
        pl.col("s").str.split_exact(",", 1).alias("parts"),
        pl.col("t").dt.round("1h").dt.timestamp("ms").alias("ts"),
        pl.col("s").hash(3).alias("h"),
        pl.col("i").replace_strict([1, 2], [10, 20], default=0).alias("r"),
        pl.int_ranges(0, pl.col("i")).alias("ir"),
    )
    assert_frame_equal(_ray(lf), lf.collect(engine="in-memory"))
    agg = frame.group_by("k").agg(
        pl.corr("x", "y").alias("c"), pl.col("i").entropy().alias("e"), pl.cov("i", "y")
    )
    assert_frame_equal(_ray(agg), agg.collect(engine="in-memory"), check_row_order=False)
    with pytest.raises(TaskError, match="InvalidOperationError"):
        _ray(frame.select(pl.col("i").replace_strict({1: 10})))


# ---------------------------------------------------------------- bad input, IR forms


def test_list_get_out_of_bounds_raises_polars_error(frame: pl.LazyFrame) -> None:
    """``list.get`` without ``null_on_oob``: Polars' own error, from the task."""
    lf = frame.select(pl.col("l").list.get(2))
    with pytest.raises(pl.exceptions.ComputeError):
        lf.collect(engine="in-memory")
    with pytest.raises(TaskError, match="ComputeError: get index is out of bounds"):
        run_dist(lf, 3)


def _plans() -> dict[str, PlanNode]:
    lf = _frame().lazy()
    plans = {f"select-{k}": to_ir(lf.select(e.alias("o"))) for k, e in ROW_LOCAL.items()}
    for k, e in {**AGGREGATIONS, **MULTI_ROW}.items():
        plans[f"group_by-{k}"] = to_ir(lf.group_by("k").agg(e.alias("o")))
    return plans


def _tables(plan: PlanNode) -> dict[str, pa.Table]:
    scans = [n for n in plan.walk() if isinstance(n, Scan)]
    assert len(scans) == 1 and isinstance(scans[0].source, InMemorySource)
    return {"frame": scans[0].source.table}


def test_plans_round_trip_through_json() -> None:
    """Every new function's options (tuples of names, dtypes) serialise and come back equal."""
    for name, plan in _plans().items():
        tables = _tables(plan)
        assert serde.from_json(serde.to_json(plan, tables=tables), tables=tables) == plan, name


@pytest.mark.parametrize(
    "expr", [pl.corr("x", "y"), pl.col("i").entropy(), pl.col("k").unique_counts()]
)
def test_aggregating_functions_have_no_substrait_mapping(
    frame: pl.LazyFrame, expr: pl.Expr
) -> None:
    """A Substrait scalar function is evaluated row by row: exporting these would be wrong."""
    for lf in (frame.select(expr.alias("o")), frame.group_by("k").agg(expr.alias("o"))):
        plan = to_ir(lf)
        with pytest.raises(UnsupportedError, match="aggregating function"):
            to_substrait(plan, tables=_tables(plan))
