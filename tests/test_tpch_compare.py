"""shoal.tpch.compare: what counts as a match between a result and the expected frame."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import polars as pl
import pytest

from shoal.tpch.compare import assert_frames_match, compare_frames

NAN = float("nan")


@pytest.fixture
def expected() -> pl.DataFrame:
    """A frame sorted by ``revenue`` descending, with a tie between rows 1 and 2."""
    return pl.DataFrame(
        {
            "key": [1, 2, 3, 4],
            "name": ["a", "b", "c", None],
            "revenue": pl.Series(
                [Decimal("30.00"), Decimal("20.00"), Decimal("20.00"), Decimal("10.00")],
                dtype=pl.Decimal(38, 2),
            ),
            "avg": [1.5, NAN, None, 1e300],
            "day": [date(1994, 1, 1), date(1995, 3, 15), None, date(1993, 10, 1)],
        }
    )


SORT = [("revenue", True)]


def test_identical_frames_match(expected: pl.DataFrame) -> None:
    assert compare_frames(expected.clone(), expected, SORT) == (True, "")
    assert compare_frames(expected.clone(), expected) == (True, "")
    assert_frames_match(expected.clone(), expected, SORT)


def test_changed_value_is_caught(expected: pl.DataFrame) -> None:
    result = expected.with_columns(
        pl.when(pl.col("key") == 3).then(pl.lit("x")).otherwise("name").alias("name")
    )
    ok, reason = compare_frames(result, expected, SORT)
    assert not ok
    assert "'name'" in reason


def test_changed_decimal_by_one_cent_is_caught(expected: pl.DataFrame) -> None:
    result = expected.with_columns(
        pl.when(pl.col("key") == 1)
        .then(pl.lit(Decimal("30.01"), dtype=pl.Decimal(38, 2)))
        .otherwise("revenue")
        .alias("revenue")
    )
    ok, reason = compare_frames(result, expected)
    assert not ok
    assert "'revenue'" in reason


def test_float_off_by_1e6_relative_is_caught(expected: pl.DataFrame) -> None:
    result = expected.with_columns(
        pl.when(pl.col("key") == 1).then(1.5 * (1 + 1e-6)).otherwise("avg").alias("avg")
    )
    ok, reason = compare_frames(result, expected, SORT)
    assert not ok
    assert "'avg'" in reason


def test_float_within_tolerance_matches(expected: pl.DataFrame) -> None:
    result = expected.with_columns(
        pl.when(pl.col("key") == 4).then(1e300 * (1 + 1e-12)).otherwise("avg").alias("avg")
    )
    assert compare_frames(result, expected, SORT) == (True, "")


def test_nan_equals_nan_and_null_equals_null() -> None:
    frame = pl.DataFrame({"x": [NAN, None, 1.0], "s": [None, "a", None]})
    assert compare_frames(frame.clone(), frame) == (True, "")


def test_nan_does_not_equal_null_or_a_number() -> None:
    expected = pl.DataFrame({"x": [NAN, 1.0]})
    assert not compare_frames(pl.DataFrame({"x": [None, 1.0]}), expected)[0]
    assert not compare_frames(pl.DataFrame({"x": [2.0, 1.0]}), expected)[0]


def test_missing_row_is_caught(expected: pl.DataFrame) -> None:
    ok, reason = compare_frames(expected.head(3), expected, SORT)
    assert not ok
    assert "3 rows, expected 4" in reason


def test_swapped_non_tied_rows_are_caught(expected: pl.DataFrame) -> None:
    result = expected[[1, 0, 2, 3]]
    ok, reason = compare_frames(result, expected, SORT)
    assert not ok
    assert "order differs" in reason


def test_swapped_tied_rows_match(expected: pl.DataFrame) -> None:
    result = expected[[0, 2, 1, 3]]
    assert compare_frames(result, expected, SORT) == (True, "")


def test_rows_moved_between_runs_are_caught() -> None:
    # Same key sequence and same multiset of rows, but rows swapped between two runs
    # with the same key value: a real order difference.
    expected = pl.DataFrame({"k": [1, 2, 1], "v": ["a", "b", "c"]})
    result = pl.DataFrame({"k": [1, 2, 1], "v": ["c", "b", "a"]})
    ok, reason = compare_frames(result, expected, [("k", False)])
    assert not ok
    assert "'v'" in reason


def test_without_sort_keys_order_is_ignored(expected: pl.DataFrame) -> None:
    assert compare_frames(expected.reverse(), expected) == (True, "")


def test_without_sort_keys_multiset_counts_duplicates() -> None:
    expected = pl.DataFrame({"x": [1, 1, 2]})
    assert not compare_frames(pl.DataFrame({"x": [1, 2, 2]}), expected)[0]


def test_dtype_difference_is_caught(expected: pl.DataFrame) -> None:
    result = expected.with_columns(pl.col("key").cast(pl.Int32))
    ok, reason = compare_frames(result, expected, SORT)
    assert not ok
    assert "'key'" in reason and "Int32" in reason


def test_decimal_scale_difference_is_caught(expected: pl.DataFrame) -> None:
    result = expected.with_columns(pl.col("revenue").cast(pl.Decimal(38, 4)))
    assert not compare_frames(result, expected, SORT)[0]


def test_column_names_and_order_are_checked(expected: pl.DataFrame) -> None:
    assert not compare_frames(expected.rename({"name": "n"}), expected)[0]
    reordered = expected.select("name", "key", "revenue", "avg", "day")
    ok, reason = compare_frames(reordered, expected)
    assert not ok
    assert "columns differ" in reason


def test_empty_frames_match() -> None:
    frame = pl.DataFrame(schema={"a": pl.Int64, "b": pl.Float64})
    assert compare_frames(frame.clone(), frame, [("a", False)]) == (True, "")


def test_unknown_sort_key_raises(expected: pl.DataFrame) -> None:
    with pytest.raises(ValueError, match="nope"):
        compare_frames(expected, expected, [("nope", False)])


def test_assert_frames_match_raises_with_reason(expected: pl.DataFrame) -> None:
    with pytest.raises(AssertionError, match="3 rows, expected 4"):
        assert_frames_match(expected.head(3), expected, SORT)
