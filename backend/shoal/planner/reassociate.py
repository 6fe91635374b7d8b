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

from shoal.ir.expr import Col, Expr, NamedExpr
from shoal.ir.nodes import Filter, Join, PlanNode, Project, Scan
from shoal.ir.types import DataType, Schema


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


#: How deep below the join a key's side is looked for (each level one join or projection).
MAX_DEPTH = 8


def pushdowns(node: Join) -> list[tuple[Join, PlanNode]]:
    """Each way to move the join ``node`` = ``L ⋈ Z`` down into ``L``, shallowest first, as
    ``(inner, rewritten)``: ``inner`` = ``S ⋈ Z`` for a sub-plan ``S`` of ``L`` that gives
    every left key of ``node``, reached through inner joins without ``maintain_order``
    (into the side that holds the keys) and projections of plain columns; ``rewritten``
    is the whole plan with ``inner`` in ``S``'s place, with ``node``'s columns in
    ``node``'s order (a projection restores it where a join moved Z's columns). Empty
    where the rewrite does not apply (see the module docstring)."""
    if not _plain(node):
        return []
    left_keys, right_keys = _names(node.left_on), _names(node.right_on)
    if not left_keys or right_keys is None:
        return []
    z = node.right
    z_names = set(z.schema.names)
    added = _joined(Schema(()), z.schema, right_keys, node.coalesce).fields
    out: list[tuple[Join, PlanNode]] = []
    for inner, replaced in _push(node.left, node, set(left_keys), z_names, added, 0):
        if replaced is node.left:
            continue  # the join where it is
        if replaced.schema.fields != node.schema.fields:
            if sorted(replaced.schema.fields) != sorted(node.schema.fields):
                continue
            keep = tuple(NamedExpr(n, Col(n, t)) for n, t in node.schema.fields)
            replaced = Project(replaced, keep, node.schema)
        out.append((inner, replaced))
    return out


def _push(
    sub: PlanNode,
    node: Join,
    keys: set[str],
    z_names: set[str],
    added: tuple[tuple[str, DataType], ...],
    depth: int,
) -> list[tuple[Join, PlanNode]]:
    """``(inner, replaced)`` for each place below ``sub`` (``sub`` included, first of
    all) where ``node``'s right side may be joined: ``replaced`` gives ``sub``'s columns
    and Z's (``added``), in some order. ``sub`` itself is returned as ``replaced`` for the
    join ``node`` over ``sub`` as it is."""
    names = set(sub.schema.names)
    if not keys <= names or names & z_names:
        return []
    here = replace(node, left=sub, schema=Schema(sub.schema.fields + added))
    out: list[tuple[Join, PlanNode]] = [(here, sub if sub is node.left else here)]
    if depth >= MAX_DEPTH:
        return out
    if isinstance(sub, Project) and all(
        isinstance(e.expr, Col) and e.expr.name == e.name for e in sub.exprs
    ):
        extra = tuple(NamedExpr(n, Col(n, t)) for n, t in added)
        for inner, child in _push(sub.input, node, keys, z_names, added, depth + 1):
            schema = Schema(sub.schema.fields + added)
            out.append((inner, Project(child, sub.exprs + extra, schema)))
    elif _plain(sub):
        assert isinstance(sub, Join)
        sub_right = _names(sub.right_on)
        if sub_right is None or _names(sub.left_on) is None:
            return out
        both = set(sub.left.schema.names) | set(sub.right.schema.names)
        if set(sub.left.schema.names) & set(sub.right.schema.names) or both & z_names:
            return out  # suffixes placed by this join, or by Z's join below it
        for side in ("left", "right"):
            child = getattr(sub, side)
            for inner, new in _push(child, node, keys, z_names, added, depth + 1):
                if new is child:
                    continue
                lhs, rhs = (new, sub.right) if side == "left" else (sub.left, new)
                schema = _joined(lhs.schema, rhs.schema, sub_right, sub.coalesce)
                out.append((inner, replace(sub, left=lhs, right=rhs, schema=schema)))
    return out


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
