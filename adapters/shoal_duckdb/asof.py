"""DuckDB's ``ASOF JOIN`` (``LOGICAL_ASOF_JOIN``) -> :class:`~shoal.ir.nodes.AsofJoin`.

DuckDB's rules (https://duckdb.org/docs/stable/guides/sql_features/asof_join): the join's
conditions are equalities (the "by" keys) and exactly one inequality between a left key
and a right key; each left row matches the one right row with equal by-keys whose key is
nearest in the inequality's direction:

========================  ==========================================================
``l.k >= r.k``            the last right key at or before ``l.k`` (Polars ``backward``)
``l.k >  r.k``            the last right key strictly before (``backward``, no exact)
``l.k <= r.k``            the first right key at or after (``forward``)
``l.k <  r.k``            the first right key strictly after (``forward``, no exact)
========================  ==========================================================

A NULL by-key or key never matches. ``ASOF JOIN`` drops the left rows without a match,
``ASOF LEFT JOIN`` keeps them with NULL right columns; ``USING (by..., k)`` is ``=`` on
the first columns and ``>=`` on the last. NaN compares equal to NaN and above every number
in both DuckDB and Polars. Output order is unspecified without ``ORDER BY``.

The IR node needs both keys sorted; DuckDB's plan does not sort, so both inputs get a
:class:`~shoal.ir.nodes.Sort` on their key. The right side keeps only rows whose keys are
all non-NULL, and carries copies of its keys (Polars drops the right by-columns) and, for
an inner as-of join, a match marker: the left rows where it is NULL had no match and are
filtered out. When several right rows have the same by-keys and the same nearest key,
DuckDB does not say which one matches; shoal takes one of them too (Polars' choice in the
sorted right side: the last for ``>=``/``>``, the first for ``<=``/``<``).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from shoal.ir.expr import Expr
from shoal.ir.nodes import AsofJoin, AsofStrategy, Sort
from shoal.ir.types import BOOL, Schema
from shoal_duckdb.exprs import and_all, cast, is_not_null, lit
from shoal_duckdb.translate import Rel, Translator, _Failed, _join_output, _register

#: DuckDB comparison -> (Polars strategy, whether an exact key matches).
_DIRECTIONS: dict[str, tuple[AsofStrategy, bool]] = {
    "COMPARE_GREATERTHANOREQUALTO": ("backward", True),
    "COMPARE_GREATERTHAN": ("backward", False),
    "COMPARE_LESSTHANOREQUALTO": ("forward", True),
    "COMPARE_LESSTHAN": ("forward", False),
}


@_register("LOGICAL_ASOF_JOIN")
def _asof_join(t: Translator, op: dict[str, Any]) -> Rel:
    kind = str(op.get("join_type", "INNER"))
    where = f"LOGICAL_ASOF_JOIN({kind})"
    left, right = (t.exact(r) for r in t.children(op))
    by: list[tuple[Expr, Expr]] = []
    on: list[tuple[Expr, Expr, str]] = []
    for c in op.get("conditions", []):
        cmp = str(c.get("comparison"))
        if c.get("right") is None:
            t.error(where, "a condition that is not a comparison of the two sides")
            continue
        lx = t.expr(c["left"], left.cols, where)
        rx = t.expr(c["right"], right.cols, where)
        if cmp == "COMPARE_EQUAL":
            by.append((lx, cast(rx, lx.dtype)))
        elif cmp in _DIRECTIONS:
            on.append((lx, cast(rx, lx.dtype), cmp))
        elif cmp == "COMPARE_NOT_DISTINCT_FROM":
            t.error(where, "IS NOT DISTINCT FROM in an ASOF join is not supported")
        else:
            t.error(where, f"{cmp} conditions in an ASOF join are not supported")
    if kind not in ("INNER", "LEFT"):
        t.error(where, f"ASOF {kind} joins are not supported (only ASOF and ASOF LEFT)")
    if len(on) != 1:
        t.error(where, f"expects exactly one inequality condition, got {len(on)}")
    for lx, _, _ in on:
        dt = lx.dtype
        if not (dt.is_numeric or dt.is_temporal or dt.is_string):
            t.error(where, f"an inequality on {dt} keys is not supported")
    for lx, _ in by:
        if pa.types.is_nested(lx.dtype.arrow):
            # The kernel's as-of join cannot match on STRUCT or LIST keys.
            t.error(where, f"an equality on {lx.dtype} keys is not supported")
    if t.errors:
        raise _Failed()
    (lon, ron, cmp) = on[0]
    strategy, exact = _DIRECTIONS[cmp]
    inner = kind == "INNER"

    # Left: its columns and its keys (copies, so every key is a plain column).
    lkeys = t.project(
        left,
        [*((c.name, c) for c in left.cols), *(("asof_by", lx) for lx, _ in by), ("asof_key", lon)],
    )
    lby, lkey = lkeys.cols[len(left.cols) : -1], lkeys.cols[-1]
    if inner:
        # A left row with a NULL key has no match: an inner as-of join drops it anyway.
        lkeys = t.filter(lkeys, and_all([is_not_null(c) for c in (*lby, lkey)]))
    lsorted = Sort(lkeys.node, (lkey,), (False,), (True,), False, lkeys.node.schema)

    # Right: its columns, copies of its keys (in the left keys' types), a match marker.
    rexprs: list[tuple[str, Expr]] = [(c.name, c) for c in right.cols]
    rexprs += [("asof_by", rx) for _, rx in by]
    rexprs.append(("asof_key", ron))
    if inner:
        rexprs.append(("asof_match", lit(True, BOOL)))
    rkeys = t.project(right, rexprs)
    n = len(right.cols)
    rby, rkey = rkeys.cols[n : n + len(by)], rkeys.cols[n + len(by)]
    rkeys = t.filter(rkeys, and_all([is_not_null(c) for c in (*rby, rkey)]))
    rsorted = Sort(rkeys.node, (rkey,), (False,), (True,), False, rkeys.node.schema)

    dropped = {c.name for c in rby}  # Polars drops the right by-columns
    schema = Schema(
        (
            *lkeys.node.schema.fields,
            *((n_, d) for n_, d in rkeys.node.schema.fields if n_ not in dropped),
        )
    )
    node = AsofJoin(
        lsorted,
        rsorted,
        lkey,
        rkey,
        tuple(c.name for c in lby),
        tuple(c.name for c in rby),
        strategy,
        None,
        exact,
        False,  # sorted above: nothing to check
        "_r",
        False,
        schema,
    )
    rel = Rel(node, left.cols + right.cols)
    if inner:
        rel = t.filter(rel, is_not_null(rkeys.cols[-1]))
    lmap = [int(i) for i in op.get("left_projection_map") or []]
    rmap = [int(i) for i in op.get("right_projection_map") or []]
    return _join_output(t, rel, left, right, lmap, rmap)
