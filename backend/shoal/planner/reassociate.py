"""Join reassociation: ``(X ⋈ Y) ⋈ Z`` planned as ``X ⋈ (Y ⋈ Z)`` when the second join's
keys are Y's columns, so that Y and Z, two Parquet scans stored in the order of that key,
can be joined as an aligned join (:mod:`shoal.planner.aligned`) instead of shuffling Z
to meet ``X ⋈ Y`` (called by :meth:`shoal.planner.planner._Builder.join`).

TPC-H Q10 is the case: ``customer ⋈ orders`` on the customer key, then ``⋈ lineitem`` on
the order key. Polars keeps the order the query was written in, and shoal's plan then
shuffled lineitem's filtered rows (565 MiB at scale 10) by the order key. Joined first,
orders and lineitem meet partition by partition (both are stored in order-key order), and
what they give is joined with customer.

Exact: two inner joins whose conditions relate different pairs of inputs are
associative. A triple of rows (x, y, z) is in either result exactly when x meets y on
the first join's keys and y meets z on the second's (each join with its own
``nulls_equal``), as often as such triples exist; only the order of the rows may differ,
and an inner join without ``maintain_order`` leaves it open. The rewrite is taken only
where the columns of X, Y and Z have distinct names (no suffixes to place), every key is
a plain column, both joins are inner joins without ``maintain_order``, and the new plan's
columns, recomputed by the join rule (left columns, then the right columns less the
right keys when ``coalesce``), are the original plan's, names and types in order.
"""

from __future__ import annotations

from dataclasses import replace

from shoal.ir.expr import Col, Expr
from shoal.ir.nodes import Filter, Join, PlanNode, Project, Scan
from shoal.ir.types import Schema


def _names(keys: tuple[Expr, ...]) -> list[str] | None:
    """The column names of ``keys`` when every key is a plain column, else None."""
    out = []
    for k in keys:
        if not isinstance(k, Col):
            return None
        out.append(k.name)
    return out


def _joined(left: Schema, right: Schema, right_keys: list[str], coalesce: bool) -> Schema:
    """The columns of an inner join of ``left`` and ``right`` whose names do not clash:
    the left columns, then the right ones (less the right keys with ``coalesce``)."""
    dropped = set(right_keys) if coalesce else set()
    return Schema(left.fields + tuple(f for f in right.fields if f[0] not in dropped))


def _plain(j: PlanNode) -> bool:
    return isinstance(j, Join) and j.how == "inner" and j.maintain_order == "none"


def reassociate(node: Join) -> tuple[Join, Join] | None:
    """``(inner, outer)``: ``node`` = ``(X ⋈ Y) ⋈ Z`` rewritten as ``outer`` = ``X ⋈
    inner`` with ``inner`` = ``Y ⋈ Z`` (see the module docstring for when), ``outer``
    having ``node``'s schema; None where the rewrite does not apply."""
    if not _plain(node) or not _plain(node.left):
        return None
    first = node.left
    assert isinstance(first, Join)
    x, y, z = first.left, first.right, node.right
    names = [n for part in (x, y, z) for n in part.schema.names]
    if len(set(names)) != len(names):
        return None  # suffixes would be placed differently
    outer_left, outer_right = _names(node.left_on), _names(node.right_on)
    first_left, first_right = _names(first.left_on), _names(first.right_on)
    if None in (outer_left, outer_right, first_left, first_right) or not outer_left:
        return None
    assert outer_left is not None and outer_right is not None and first_right is not None
    y_names = set(y.schema.names)
    if not set(outer_left) <= y_names or not set(first_right) <= y_names:
        return None
    inner_schema = _joined(y.schema, z.schema, outer_right, node.coalesce)
    inner = replace(node, left=y, right=z, schema=inner_schema)
    outer_schema = _joined(x.schema, inner_schema, first_right, first.coalesce)
    if outer_schema != node.schema:
        return None
    return inner, replace(first, right=inner, schema=outer_schema)


def scan_only(node: PlanNode) -> bool:
    """Whether ``node`` is a scan under row-local filters and projections only (planning
    it cuts no stage)."""
    while isinstance(node, Filter | Project) and _row_local(node):
        node = node.input
    return isinstance(node, Scan)


def _row_local(node: Filter | Project) -> bool:
    if isinstance(node, Filter):
        return node.predicate.is_row_local()
    return all(e.expr.is_row_local() for e in node.exprs)
