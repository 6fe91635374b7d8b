"""Comparing a query result with the expected (native Polars) result.

Rules: the same column names in the same order, the same dtypes and the same number of
rows; floating-point values equal within a relative tolerance (NaN equals NaN, null equals
null); every other value (decimals, integers, strings, dates) exactly equal.

Row order: with ``sort_keys`` the sort-key columns must hold the same sequence of values
in both frames, while rows with equal keys may come in any order; without ``sort_keys``
the frames are compared as multisets of rows.
"""

from __future__ import annotations

import polars as pl

_RUN = "__shoal_compare_run__"


def compare_frames(
    result: pl.DataFrame,
    expected: pl.DataFrame,
    sort_keys: list[tuple[str, bool]] | None = None,
    rel_tol: float = 1e-9,
) -> tuple[bool, str]:
    """Whether ``result`` matches ``expected``, and the reason when it does not.

    ``sort_keys`` is the query's ORDER BY as ``(column, descending)`` pairs; only the
    column names are used, as ``expected`` defines the order to follow. ``rel_tol`` is
    the relative tolerance for Float32/Float64 columns: ``|a - b| <= rel_tol * max(|a|,
    |b|)``. Returns ``(True, "")`` on a match, else ``(False, reason)``.

    Raises ``ValueError`` when a sort key is not a column of the frames.
    """
    if result.columns != expected.columns:
        return False, f"columns differ: result {result.columns}, expected {expected.columns}"
    for name, r_dtype, e_dtype in zip(result.columns, result.dtypes, expected.dtypes, strict=True):
        if r_dtype != e_dtype:
            return False, f"column {name!r} has dtype {r_dtype}, expected {e_dtype}"
    if result.height != expected.height:
        return False, f"{result.height} rows, expected {expected.height}"

    keys = [name for name, _descending in sort_keys or []]
    unknown = [name for name in keys if name not in expected.columns]
    if unknown:
        raise ValueError(f"sort keys {unknown} are not columns of the frames {expected.columns}")
    for name in keys:
        row = _first_difference(result[name], expected[name], rel_tol)
        if row is not None:
            return False, (
                f"order differs: sort key {name!r} at row {row} is "
                f"{result[name][row]!r}, expected {expected[name][row]!r}"
            )

    # Rows with equal sort keys form a run; compare each run as a multiset by sorting both
    # frames by run, then by every column (exact columns first, so that a float within
    # tolerance cannot reorder rows). The key sequences are equal, so ``expected`` numbers
    # the runs of both frames.
    if keys:
        new_run = pl.any_horizontal(pl.col(name).ne_missing(pl.col(name).shift(1)) for name in keys)
        runs = expected.select(new_run.cum_sum().alias(_RUN)).to_series()
    else:
        runs = pl.Series(_RUN, [0] * expected.height, dtype=pl.UInt32)
    exact = [name for name, dtype in expected.schema.items() if not dtype.is_float()]
    floats = [name for name, dtype in expected.schema.items() if dtype.is_float()]
    order = [_RUN, *exact, *floats]
    result_sorted = result.with_columns(runs).sort(order, nulls_last=True)
    expected_sorted = expected.with_columns(runs).sort(order, nulls_last=True)
    for name in expected.columns:
        row = _first_difference(result_sorted[name], expected_sorted[name], rel_tol)
        if row is not None:
            return False, (
                f"column {name!r} differs (rows sorted by "
                f"{'sort-key run, then ' if keys else ''}all columns) at row {row}: "
                f"{result_sorted[name][row]!r}, expected {expected_sorted[name][row]!r}"
            )
    return True, ""


def assert_frames_match(
    result: pl.DataFrame,
    expected: pl.DataFrame,
    sort_keys: list[tuple[str, bool]] | None = None,
    rel_tol: float = 1e-9,
) -> None:
    """Raise ``AssertionError`` with the reason when :func:`compare_frames` finds a difference."""
    ok, reason = compare_frames(result, expected, sort_keys, rel_tol)
    if not ok:
        raise AssertionError(reason)


def _first_difference(a: pl.Series, b: pl.Series, rel_tol: float) -> int | None:
    """The first row where ``a`` and ``b`` differ (same dtype and length), or None."""
    frame = pl.DataFrame([a.alias("a"), b.alias("b")])
    equal = pl.col("a").eq_missing(pl.col("b"))  # null == null, NaN == NaN, inf == inf
    if a.dtype.is_float():
        bound = rel_tol * pl.max_horizontal(pl.col("a").abs(), pl.col("b").abs())
        equal = equal | ((pl.col("a") - pl.col("b")).abs() <= bound).fill_null(False)
    mismatches = frame.select((~equal).arg_true()).to_series()
    return int(mismatches[0]) if len(mismatches) else None
