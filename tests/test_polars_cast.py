"""``cast`` of bad values, strict and non-strict, on shoal against native Polars (issue 3).

Each source column holds values that cannot be cast (text that is no number, integers that
overflow the target, NaN and infinity to integers, decimals beyond the target's precision,
text outside an Enum), next to good values, nulls and duplicates, in a frame cut into more
partitions than it has rows (so some are empty). A non-strict cast must give Polars'
answer (null where the value does not fit); a strict cast must fail with the class of error
Polars raises (``polars.exceptions.InvalidOperationError``): shoal raises a
``TaskError[<that class>]``, which is both (see :func:`shoal.errors.task_error`). Where
Polars refuses a cast outright (text to date without a format), shoal must refuse it too.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.config import Config

from .test_polars_coverage import assert_split_with_an_empty_partition

#: More partitions than rows: some partitions are empty, several hold rows.
PARTITIONS = 9

#: (source values, source dtype, target dtype): bad values beside good ones, nulls, NaN
#: and duplicates.
CASES: dict[str, tuple[list[Any], pl.DataType, pl.DataType]] = {
    "str-int64": (["1", "x", None, "3", "1", "99999999999999999999", "-2"], pl.String(), pl.Int64()),
    "int64-int8": ([1, 300, None, -129, 1, 5, -128], pl.Int64(), pl.Int8()),
    "int64-uint8": ([1, -1, None, 2, 1, 255, 256], pl.Int64(), pl.UInt8()),
    "int64-uint64": ([1, -5, None, 2, 1, 5, 0], pl.Int64(), pl.UInt64()),
    "float-int32": ([1.5, float("nan"), None, float("inf"), 1.5, -2.7, 3e10], pl.Float64(), pl.Int32()),
    "float-int64": ([1.0, 1e20, None, float("-inf"), 1.0, 3.0, float("nan")], pl.Float64(), pl.Int64()),
    "str-float": (["1.5", "abc", None, "nan", "1.5", "inf", "-0"], pl.String(), pl.Float64()),
    "str-date": (["2024-01-02", "nope", None, "2024-02-30", "2024-01-02", "2023-12-31", ""], pl.String(), pl.Date()),
    "str-datetime": (["2024-01-02 10:00:00", "bad", None, "2024-01-03", "2024-01-02 10:00:00", "x", "y"], pl.String(), pl.Datetime("us")),
    "str-bool": (["true", "yes", None, "false", "true", "x", "1"], pl.String(), pl.Boolean()),
    "int64-decimal": ([1, 123456, None, 99, 1, 12345, -999], pl.Int64(), pl.Decimal(5, 2)),
    "decimal-decimal": (
        [Decimal("1.25"), Decimal("123456.78"), None, Decimal("9.99"), Decimal("1.25"),
         Decimal("0.01"), Decimal("-999.99")],
        pl.Decimal(10, 2), pl.Decimal(4, 1),
    ),
    "float-decimal": ([1.25, 1e10, None, float("nan"), 1.25, 0.5, float("inf")], pl.Float64(), pl.Decimal(6, 2)),
    "str-decimal": (["1.25", "x", None, "123456", "1.25", "0.5", "-1"], pl.String(), pl.Decimal(6, 2)),
    "str-enum": (["a", "z", None, "b", "a", "b", ""], pl.String(), pl.Enum(["a", "b"])),
    "date-int8": ([dt.date(1970, 1, 2), dt.date(2020, 1, 1), None, dt.date(1970, 1, 3),
                   dt.date(1970, 1, 2), dt.date(1969, 12, 31), dt.date(1970, 5, 1)], pl.Date(), pl.Int8()),
}  # fmt: skip


def _frame(case: str) -> pl.LazyFrame:
    values, source, _ = CASES[case]
    return pl.DataFrame(
        {"i": range(len(values)), "a": pl.Series(values, dtype=source, strict=False)}
    ).lazy()


def _queries(case: str, strict: bool) -> dict[str, pl.LazyFrame]:
    """The cast's rows (and whether each is null, computed in the task), and an aggregate
    over it: a strict cast must fail even when its column is not returned."""
    target = CASES[case][2]
    cast = pl.col("a").cast(target, strict=strict)
    lf = _frame(case)
    return {
        "rows": lf.select("i", cast.alias("b"), cast.is_null().alias("b_null")),
        "null_count": lf.select(cast.null_count().alias("nulls"), pl.len()),
    }


def _engine(runner: str) -> shoal.DistEngine:
    config = Config(default_partitions=PARTITIONS, target_partition_bytes=64)
    return shoal.DistEngine(runner=runner, raise_on_fail=True, config=config)  # type: ignore[arg-type]


def _native(lf: pl.LazyFrame) -> pl.DataFrame | Exception:
    try:
        return lf.collect(engine="in-memory")
    except Exception as exc:
        return exc


def check_like_polars(lf: pl.LazyFrame, runner: str = "local") -> pl.DataFrame | Exception:
    """``lf`` on shoal gives native Polars' rows, or raises an error of the class Polars
    raises; returns what Polars gave."""
    expected = _native(lf)
    if isinstance(expected, Exception):
        with pytest.raises(Exception) as info:
            lf.collect(engine=_engine(runner))
        assert isinstance(info.value, type(expected)), (
            f"Polars raises {type(expected).__name__}, shoal {type(info.value).__mro__}"
        )
        return expected
    got = lf.collect(engine=_engine(runner))
    assert_frame_equal(got, expected, check_row_order=True)
    assert_split_with_an_empty_partition()
    return expected


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_cast_of_bad_values_is_as_in_polars(case: str, strict: bool) -> None:
    outcomes = {shape: check_like_polars(lf) for shape, lf in _queries(case, strict).items()}
    rows = outcomes["rows"]
    if strict:  # the case has values that do not fit: Polars refuses them
        assert isinstance(rows, pl.exceptions.InvalidOperationError), rows
    elif isinstance(rows, pl.DataFrame):  # null where a value does not fit, nowhere else
        assert rows["b_null"].sum() > 1


def test_a_strict_cast_error_names_the_stage_and_partition() -> None:
    lf = _queries("str-int64", strict=True)["rows"]
    with pytest.raises(pl.exceptions.InvalidOperationError) as info:
        lf.collect(engine=_engine("local"))
    err = info.value
    assert isinstance(err, shoal.TaskError)
    assert type(err).__name__ == "TaskError[InvalidOperationError]"
    text = str(err)
    assert text.startswith("task failed in stage 0 [scan], partition ")
    assert "InvalidOperationError: conversion from `str` to `i64` failed" in text
    assert isinstance(err.__cause__, pl.exceptions.InvalidOperationError)


def test_wrap_numerical_wraps_as_in_polars() -> None:
    lf = _frame("int64-int8").select("i", pl.col("a").cast(pl.Int8, wrap_numerical=True))
    check_like_polars(lf)


@pytest.mark.usefixtures("ray_runner")
@pytest.mark.parametrize("case", ["str-int64", "decimal-decimal", "str-enum"])
def test_cast_on_ray_is_as_in_polars(case: str) -> None:
    """On Ray the task's error crosses processes (Ray's RayTaskError); the user still gets
    Polars' class."""
    for strict in (True, False):
        for lf in _queries(case, strict).values():
            check_like_polars(lf, runner="ray")
