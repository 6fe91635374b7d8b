"""Lowering of the temporal and ordered operators: each IR node becomes the Polars
method of the same meaning (``join_asof``, ``group_by_dynamic``, ``rolling``,
``merge_sorted``) over the Polars queries of its inputs."""

from __future__ import annotations

import polars as pl

from shoal.ir.nodes import (
    AsofJoin,
    DynamicGroupBy,
    MergeSorted,
    PlanNode,
    RestoreGroupOrder,
    RollingGroupBy,
)
from shoal.lowering.engine import TASK_ENGINE
from shoal.lowering.expressions import to_polars

#: The plan nodes this module builds.
TEMPORAL_NODES = (AsofJoin, DynamicGroupBy, RollingGroupBy, MergeSorted, RestoreGroupOrder)

_RANK = "__shoal_group_rank"
_INDEX = "__shoal_index"


def build_temporal(node: PlanNode, inputs: list[pl.LazyFrame]) -> pl.LazyFrame:
    """The Polars query of ``node`` (one of :data:`TEMPORAL_NODES`) over the queries of its
    inputs (in :meth:`~shoal.ir.nodes.PlanNode.children` order)."""
    if isinstance(node, AsofJoin):
        left, right = inputs
        by = bool(node.left_by)
        return left.join_asof(
            right,
            left_on=to_polars(node.left_on),
            right_on=to_polars(node.right_on),
            by_left=list(node.left_by) if by else None,
            by_right=list(node.right_by) if by else None,
            strategy=node.strategy,
            suffix=node.suffix,
            tolerance=node.tolerance,
            allow_exact_matches=node.allow_exact_matches,
            # Polars checks no sortedness with by-columns (it warns that it cannot).
            check_sortedness=node.check_sortedness and not by,
            coalesce=node.coalesce,
        )
    if isinstance(node, DynamicGroupBy):
        (lf,) = inputs
        if not node.keys:
            lf = _checked_sorted(lf, node.index_column, "group_by_dynamic")
        return lf.group_by_dynamic(
            node.index_column,
            every=node.every,
            period=node.period,
            offset=node.offset,
            include_boundaries=node.include_boundaries,
            closed=node.closed,
            label=node.window_label,
            group_by=[to_polars(k.expr).alias(k.name) for k in node.keys] or None,
            start_by=node.start_by,
        ).agg([to_polars(a.expr).alias(a.name) for a in node.aggs])
    if isinstance(node, RollingGroupBy):
        (lf,) = inputs
        return lf.rolling(
            node.index_column,
            period=node.period,
            offset=node.offset,
            closed=node.closed,
            group_by=[to_polars(k.expr).alias(k.name) for k in node.keys] or None,
        ).agg([to_polars(a.expr).alias(a.name) for a in node.aggs])
    if isinstance(node, MergeSorted):
        left, right = inputs
        return left.merge_sorted(right, key=list(node.key))
    if isinstance(node, RestoreGroupOrder):
        (lf,) = inputs
        return _restore_group_order(lf, list(node.keys), node.operator)
    raise TypeError(f"not a temporal plan node: {node.label}")  # pragma: no cover


def _checked_sorted(lf: pl.LazyFrame, index: str, operation: str) -> pl.LazyFrame:
    """``lf``, collected, after checking that ``index`` is sorted ascending. Polars'
    in-memory engine raises ``InvalidOperationError`` for an unsorted index of
    ``group_by_dynamic`` without group columns; its streaming engine (what ``collect()``
    runs) does not check, and returns windows that mean nothing. shoal raises, as the
    in-memory engine does."""
    df = lf.collect(engine=TASK_ENGINE)
    if not df.get_column(index).is_sorted():
        raise pl.exceptions.InvalidOperationError(
            f"argument in operation {operation!r} is not sorted, please sort the "
            "'expr/series/column' first"
        )
    return df.lazy()


def _restore_group_order(lf: pl.LazyFrame, keys: list[str], operator: str) -> pl.LazyFrame:
    """Groups of ``keys`` (each contiguous) put in the order that Polars' ``operator`` gives
    them. Polars orders the groups of ``rolling``/``group_by_dynamic`` by their key values
    in an order of its own (not first appearance, nor ``sort``'s null placement for every
    type), so the order is asked of Polars itself: the same operator over one row per
    distinct key, all at index 0, lists the keys in its order; each row then takes its
    key's rank and a stable sort by rank reorders whole groups."""
    distinct = lf.select(keys).unique().with_columns(pl.lit(0, pl.Int64).alias(_INDEX))
    if operator == "rolling":
        grouped = distinct.rolling(_INDEX, period="1i", group_by=keys)
    else:
        grouped = distinct.group_by_dynamic(_INDEX, every="1i", group_by=keys)
    order = grouped.agg().select(keys).with_row_index(_RANK)
    return (
        lf.join(order, on=keys, how="left", nulls_equal=True, maintain_order="left")
        .sort(_RANK, maintain_order=True)
        .drop(_RANK)
    )
