"""Checking one engine's TPC-H answer against native Polars', across engines.

:func:`shoal.tpch.compare.compare_frames` is strict: same column names, same dtypes, floats
within 1e-9. Engines legitimately differ in names and types (DuckDB's ``count(*)`` is
``Int64`` where Polars' ``len()`` is ``UInt32``; DuckDB averages decimals into doubles;
Daft's years are ``Int32`` or ``Int64``), and in the last digits of decimal arithmetic
(Polars rounds each ``Decimal * Decimal`` product to the inputs' scale, DuckDB keeps the
exact product). So the benchmark compares *values*:

1. the result's columns are renamed to the expected names by position (same count
   required);
2. both frames are normalised: every integer column becomes ``Int64``, every decimal or
   float column ``Float64`` (an integer column paired with a non-integer one becomes
   ``Float64`` on both sides), string-like columns ``String``; dates stay dates;
3. :func:`compare_frames` runs on the normalised frames with the query's sort keys, first
   with a relative tolerance of :data:`EXACT_TOL` (``"ok"``), then :data:`CLOSE_TOL`
   (``"close"``: the engines agree to about 4 significant digits, as decimal rounding
   explains). Anything else is a ``"mismatch"`` with the first difference as the reason.

Integer columns (counts, keys, years) are compared exactly at every level.
"""

from __future__ import annotations

from typing import Literal

import polars as pl

from shoal.tpch.compare import compare_frames

EXACT_TOL = 1e-9
"""Relative tolerance of floats for the verdict ``"ok"``."""

CLOSE_TOL = 1e-3
"""Relative tolerance of floats (decimals included) for the verdict ``"close"``."""

Verdict = Literal["ok", "close", "mismatch"]


def normalise(
    result: pl.DataFrame, expected: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """``result`` and ``expected`` renamed and cast to comparable dtypes, plus notes.

    The notes say what was changed (renamed columns, dtype changes) in a few words. Raises
    ``ValueError`` when the frames do not have the same number of columns.
    """
    if result.width != expected.width:
        raise ValueError(
            f"{result.width} columns {result.columns}, expected {expected.width} {expected.columns}"
        )
    notes: list[str] = []
    if result.columns != expected.columns:
        renamed = [
            f"{r}->{e}" for r, e in zip(result.columns, expected.columns, strict=True) if r != e
        ]
        notes.append("renamed " + ", ".join(renamed))
        result = result.rename(dict(zip(result.columns, expected.columns, strict=True)))
    casts_r: list[pl.Expr] = []
    casts_e: list[pl.Expr] = []
    changed: list[str] = []
    for name in expected.columns:
        r_dtype, e_dtype = result.schema[name], expected.schema[name]
        target = _common_dtype(r_dtype, e_dtype)
        if r_dtype != e_dtype:
            changed.append(f"{name}: {r_dtype} vs {e_dtype}")
        casts_r.append(pl.col(name).cast(target) if target is not None else pl.col(name))
        casts_e.append(pl.col(name).cast(target) if target is not None else pl.col(name))
    if changed:
        notes.append("dtypes " + "; ".join(changed))
    return result.select(casts_r), expected.select(casts_e), notes


def _common_dtype(a: pl.DataType, b: pl.DataType) -> pl.DataType | None:
    """The dtype both columns are cast to, or None to leave them as they are."""
    if a.is_integer() and b.is_integer():
        return pl.Int64()
    if a.is_numeric() and b.is_numeric():
        return pl.Float64()
    if a in (pl.String, pl.Categorical) and b in (pl.String, pl.Categorical):
        return pl.String()
    return None


def check_result(
    result: pl.DataFrame,
    expected: pl.DataFrame,
    sort_keys: list[tuple[str, bool]] | None,
) -> tuple[Verdict, str]:
    """Compare ``result`` with ``expected`` by value (see the module docstring).

    ``sort_keys`` are the query's ORDER BY in ``expected``'s column names. Returns the
    verdict and a short detail: for ``"ok"`` the normalisations applied (may be empty),
    for ``"close"`` and ``"mismatch"`` the first difference found.
    """
    try:
        norm_r, norm_e, notes = normalise(result, expected)
    except ValueError as exc:
        return "mismatch", str(exc)
    try:
        ok, reason = compare_frames(norm_r, norm_e, sort_keys, rel_tol=EXACT_TOL)
        if ok:
            return "ok", "; ".join(notes)
        close, close_reason = compare_frames(norm_r, norm_e, sort_keys, rel_tol=CLOSE_TOL)
    except Exception as exc:  # a comparison that cannot run is a mismatch, never a crash
        return "mismatch", f"comparison failed: {type(exc).__name__}: {exc}"
    if close:
        return "close", reason
    return "mismatch", close_reason
