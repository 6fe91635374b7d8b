"""Typing IR expressions by lowering them to Polars: :func:`infer_dtypes`.

The kernel runs on Polars, so Polars' type rules are the IR's type rules: an expression's
dtype is what Polars gives its lowering (:func:`shoal.lowering.expressions.to_polars`) in a
``select`` over an empty frame of the input schema. The builder, the validator and the
Substrait import (``shoal.plan``) type expressions with this module.
"""

from __future__ import annotations

from functools import lru_cache

import polars as pl

from shoal.errors import PlanError, UnsupportedError
from shoal.ir.expr import Expr
from shoal.ir.types import DataType, Schema
from shoal.lowering.expressions import shared_lowering, to_polars


def input_types(expr: Expr, schema: Schema) -> str:
    """`` (inputs: a: i64, b: str)``: the input columns ``expr`` reads and their dtypes, for
    error messages; empty when it reads none."""
    cols = sorted(c for c in expr.columns() if c in schema)
    if not cols:
        return ""
    return " (inputs: " + ", ".join(f"{c}: {schema[c]}" for c in cols) + ")"


@lru_cache(maxsize=256)
def empty_frame(schema: Schema) -> pl.LazyFrame:
    """A lazy frame with no rows and the given schema (for type inference)."""
    return pl.DataFrame(schema=schema.to_polars()).lazy()


def infer_dtypes(
    exprs: list[Expr],
    schema: Schema,
    *,
    where: str = "expression",
    paths: list[str] | None = None,
) -> list[DataType]:
    """The dtype Polars gives each of ``exprs`` (IR expressions, read in a ``select`` over
    ``schema``). The ``dtype`` fields of the expressions themselves are ignored except where
    the kernel uses them (literals and casts).

    Raises :class:`shoal.PlanError` naming ``where``, the path of the smallest failing
    expression (from ``paths``), the input types and Polars' reason.
    """
    if not exprs:
        return []
    lf = empty_frame(schema)
    try:
        with shared_lowering():  # sub-expressions overlap: lower each node once
            pes = [to_polars(e).alias(f"__e{i}") for i, e in enumerate(exprs)]
        got = lf.select(pes).collect_schema()
        return [DataType.from_polars(got[f"__e{i}"]) for i in range(len(exprs))]
    except (UnsupportedError, PlanError, pl.exceptions.PolarsError, TypeError, ValueError):
        pass
    # Find the first expression (they come children first) that Polars refuses.
    for i, e in enumerate(exprs):
        try:
            pe = to_polars(e).alias("__e")
            lf.select(pe).collect_schema()
        except (
            UnsupportedError,
            PlanError,
            pl.exceptions.PolarsError,
            TypeError,
            ValueError,
        ) as exc:
            at = f" at {paths[i]}" if paths else ""
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise PlanError(
                f"{where}: expression {e}{at} is not valid: {reason}" + input_types(e, schema)
            ) from exc
    raise PlanError(
        f"{where}: Polars cannot resolve these expressions together"
    )  # pragma: no cover
