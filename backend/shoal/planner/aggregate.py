"""Two-phase aggregation: split aggregates into a partial part (per partition) and a final
part (after the exchange), where that split is exact. Which aggregates split, and how, is
the ``split`` of their entry in the IR's function table (:mod:`shoal.ir.functions`).

``sum``, ``count``, ``len``, ``min``, ``max``, ``nan_min``, ``nan_max``, ``product`` and
``null_count`` combine exactly; ``mean`` becomes ``sum / count`` (null when the count is 0,
as Polars' mean of no values), except of a temporal column (Polars' own unit rules). ``n_unique``, ``median``, ``quantile``, ``std``, ``var``,
``first``, ``last``, ``implode`` and the rest are not split, nor is any aggregate of an
order-dependent expression (``cum_sum(a).sum()``): their rows are shuffled by key and
aggregated once, which is exact (the shuffle keeps the input order within a group).
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.ir.expr import (
    ORDER_DEPENDENT_FUNCTIONS,
    Agg,
    BinaryOp,
    Cast,
    Col,
    Expr,
    Function,
    Lit,
    NamedExpr,
    Ternary,
    replace,
)
from shoal.ir.functions import SPLITS
from shoal.ir.types import FLOAT64, DataType

#: Aggregates whose split is the aggregate itself per partition, merged by another one
#: (``count`` partials are summed), and those whose partials are other aggregates
#: (``mean``: a sum and a count): the IR's function table says which.
_FINAL = {name: sp.merge for name, sp in SPLITS.items() if not sp.partial}
DECOMPOSABLE = frozenset(SPLITS)


@dataclass(frozen=True)
class TwoPhase:
    """The partial aggregates (per partition, same keys), the final aggregates over the
    partial columns, and the projection that computes the query's aggregate columns."""

    partial: tuple[NamedExpr, ...]
    final: tuple[NamedExpr, ...]
    project: tuple[NamedExpr, ...]


def can_split(aggs: tuple[NamedExpr, ...]) -> bool:
    """Whether every aggregate in ``aggs`` has an exact partial/final split."""
    for ne in aggs:
        for e in ne.expr.walk():
            if isinstance(e, Agg):
                if e.name not in DECOMPOSABLE:
                    return False
                if e.arg is not None and not e.arg.columns():
                    # An aggregate of a literal sees one value however many rows there
                    # are (Polars: lit(1).sum() is 1): per-partition parts would add up.
                    return False
                if e.arg is not None and not _rows_independent(e.arg):
                    return False
                if e.name == "mean" and e.arg is not None and e.arg.dtype.is_temporal:
                    # Polars' mean of a Date is a Datetime of its days in microseconds, of a
                    # Datetime/Duration/Time the mean of its physical integers, rounded as
                    # Polars rounds: the raw rows give exactly that.
                    return False
        if _col_outside_agg(ne.expr):
            return False
    return True


def _col_outside_agg(e: Expr) -> bool:
    """Whether some column of ``e`` is read outside every aggregate (a per-row use of an
    input column in an aggregation: ``col('x').sort().get(col('x').count() - 1)``). Each
    occurrence counts, even when one expression object is shared with an aggregate."""
    if isinstance(e, Agg):
        return False
    if isinstance(e, Col):
        return True
    return any(_col_outside_agg(c) for c in e.children())


def _rows_independent(arg: Expr) -> bool:
    """Whether each row's contribution to an aggregate of ``arg`` depends on that row only
    (row-local functions, and ``filter``, which only drops rows): then the aggregate of a
    group is the combination of its partial aggregates over any split of the rows."""
    for e in arg.walk():
        if isinstance(e, Agg):
            return False
        if isinstance(e, Function) and e.name in ORDER_DEPENDENT_FUNCTIONS and e.name != "filter":
            return False
    return True


def split(keys: tuple[NamedExpr, ...], aggs: tuple[NamedExpr, ...]) -> TwoPhase:
    """Split ``aggs`` (every one passing :func:`can_split`) into two phases.

    Partial columns are named ``__p<i>``; the final aggregate columns ``__f<i>``. Without
    keys the projection reads each final column as ``first(__f<i>)``, a scalar to Polars:
    functions that need a scalar argument (``int_range(pl.len())``) accept it, and a
    multi-row result (``int_range``) broadcasts the other columns as Polars does.
    """
    partial: list[NamedExpr] = []
    final: list[NamedExpr] = []
    memo: dict[Agg, Expr] = {}

    def add(agg: Agg, final_name: str, dtype: DataType) -> Expr:
        i = len(partial)
        partial.append(NamedExpr(f"__p{i}", agg))
        final.append(NamedExpr(f"__f{i}", Agg(final_name, Col(f"__p{i}", agg.dtype), dtype)))
        ref = Col(f"__f{i}", dtype)
        return ref if keys else Agg("first", ref, dtype)

    def rewrite(e: Expr) -> Expr | None:
        if not isinstance(e, Agg):
            return None
        if e in memo:
            return memo[e]
        if SPLITS[e.name].final == "sum/count":
            assert e.arg is not None
            idx = DataType.from_polars(_idx())
            if e.arg.dtype.is_decimal:
                # A decimal sum is exact (Decimal(38, s)); divide in Float64 as Polars does.
                arg: Expr = e.arg
                sum_dtype = DataType.from_polars(_decimal38(e.arg.dtype))
            else:
                arg = Cast(e.arg, FLOAT64, strict=False)
                sum_dtype = FLOAT64
            s = add(Agg("sum", arg, sum_dtype), "sum", sum_dtype)
            c = add(Agg("count", e.arg, idx), "sum", idx)
            out: Expr = Ternary(
                BinaryOp("eq", c, Lit(0, idx), _bool()),
                Lit(None, e.dtype),
                Cast(
                    BinaryOp(
                        "truediv",
                        Cast(s, FLOAT64, strict=False),
                        Cast(c, FLOAT64, strict=False),
                        FLOAT64,
                    ),
                    e.dtype,
                    strict=False,
                ),
                e.dtype,
            )
        else:
            out = add(e, _FINAL[e.name], e.dtype)
        memo[e] = out
        return out

    project = [NamedExpr(k.name, Col(k.name, k.dtype)) for k in keys]
    for ne in aggs:
        project.append(NamedExpr(ne.name, replace(ne.expr, rewrite)))
    return TwoPhase(tuple(partial), tuple(final), tuple(project))


def _idx() -> object:
    import polars as pl

    return pl.get_index_type()


def _decimal38(dtype: DataType) -> object:
    import polars as pl

    return pl.Decimal(38, dtype.arrow.scale)


def _bool() -> DataType:
    from shoal.ir.types import BOOL

    return BOOL
