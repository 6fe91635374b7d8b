"""Join reassociation: a join ``L ⋈ Z`` whose left keys are columns of some sub-plan
``S`` inside ``L`` planned with Z joined to ``S`` there, so that ``S`` and Z, sides stored
in the order of that key, meet in an aligned join (:mod:`shoal.planner.aligned`)
instead of Z being shuffled to meet ``L`` (called by
:meth:`shoal.planner.planner._Builder.join`, which tries the join as written first and
moves it only where that is a hash join, both sides shuffled).

TPC-H Q10 is the case of one level: ``customer ⋈ orders`` on the customer key, then
``⋈ lineitem`` on the order key. Polars keeps the order the query was written in, and
at scale 10 (customer too large to broadcast) shoal's plan shuffled lineitem's filtered
rows (565 MiB) by the order key; joined first, orders and lineitem meet partition by
partition and what they give is joined with customer. TPC-H Q9 is the deeper case:
``orders`` moves below the joins with ``supplier`` and ``partsupp`` (a hash join) to
``part ⋈ lineitem``, lineitem's scan stage with ``part`` broadcast into it.

Exact: inner joins whose conditions relate different pairs of inputs are associative. A
tuple of rows is in either result exactly when each pair meets on its join's keys (each
join with its own ``nulls_equal``), as often as such tuples exist; only the order of the
rows may differ, which an inner join without ``maintain_order`` leaves open. Projections
of plain columns on the way down pass Z's columns on. The move is taken only through
inner joins without ``maintain_order`` whose sides' columns and Z's have distinct names
(no suffixes to place), with plain-column keys, and where the columns of the new plan,
recomputed by the join rule (left columns, then the right columns less the right keys
when ``coalesce``) and put back in the original order by a projection where a join
moved them, are the original plan's, names and types.
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
