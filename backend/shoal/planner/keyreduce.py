"""An anti join of a small left side with a large right side, by reducing the right side
to the keys that matter.

Whether a left row has a match on the right depends only on which of the left side's key
tuples occur on the right. Each right partition gives its distinct key tuples that the
left side has (the left side is small and read whole by each): a semi join of its keys
with the left side's, at most the left side's distinct keys per partition; the anti
join then runs in the left side's own partitions against all those tuples, read whole.
The right side is never shuffled: it is read once and gives at most the left side's keys
per partition, where a hash join would write all its rows to an exchange. Exact for either null rule: with
``nulls_equal`` a null right key is kept exactly when some left key is null too, so a
left row with a null key finds it as it would have found the original; without it a null
key matches nothing on either path.
"""

from __future__ import annotations

from dataclasses import replace

from shoal.ir.expr import Col, NamedExpr
from shoal.ir.nodes import Distinct, Join, Project, StageInput
from shoal.ir.types import Schema
from shoal.planner.context import OpenFragment, PlanningContext
from shoal.planner.physical import SingleOutput, StageInputSpec


def anti_by_keys(
    ctx: PlanningContext, node: Join, left: OpenFragment, right: OpenFragment
) -> OpenFragment | None:
    """Plan anti join ``node`` (left input planned as ``left``, right as ``right``) by
    the right side's matching keys (see the module docstring), or None where it does not
    apply: another join type or an ordered one, keys that are not plain columns of one
    type on both sides, a left side estimated over ``broadcast_join_threshold_bytes``, or
    a right side small enough to be broadcast itself (or of one partition)."""
    threshold = ctx.config.broadcast_join_threshold_bytes
    if node.how != "anti" or node.maintain_order != "none" or not threshold:
        return None
    if left.est_bytes > threshold or right.num_tasks < 2 or right.est_bytes <= threshold:
        return None
    pairs = list(zip(node.left_on, node.right_on, strict=True))
    if not pairs or not all(
        isinstance(lk, Col) and isinstance(rk, Col) and lk.dtype == rk.dtype for lk, rk in pairs
    ):
        return None
    names = [rk.name for _, rk in pairs if isinstance(rk, Col)]
    if len(set(names)) != len(names):
        return None
    keys = Schema.of([(rk.name, rk.dtype) for _, rk in pairs if isinstance(rk, Col)])
    key_cols = tuple(Col(n, t) for n, t in keys.items())
    # The left side as a stage of its own, read pointwise by the anti join and whole by
    # each right partition (a left side that only reads one stage pointwise is that stage).
    if (
        isinstance(left.node, StageInput)
        and left.node.source_column is None
        and left.scan_partitions is None
        and len(left.inputs) == 1
        and left.inputs[0].mode == "pointwise"
    ):
        left_stage, left_schema = left.inputs[0].stage, left.node.schema
    else:
        st = ctx.cut(left, SingleOutput())
        hashed = left.hashed
        left = ctx.read(st, "pointwise", st.num_tasks, "anti-join")
        left.hashed = hashed  # the same partitions
        left_stage, left_schema = st.id, st.fragment.schema
    k = len(right.inputs)
    right.inputs.append(StageInputSpec(left_stage, "all", left_schema))
    left_keys = Project(
        StageInput(k, left_schema),
        tuple(NamedExpr(n, lk) for n, (lk, _) in zip(keys.names, pairs, strict=True)),
        keys,
    )
    mine = Project(
        right.node,
        tuple(NamedExpr(n, c) for n, c in zip(keys.names, key_cols, strict=True)),
        keys,
    )
    # The partition's key tuples that the left side has, once each (with one key, Polars
    # runs this semi join as a filter by membership: lowering/plan.py).
    semi = Join(
        mine, left_keys, key_cols, key_cols, "semi", node.suffix, node.nulls_equal, True, keys
    )
    right.wrap(mine)
    right.wrap(semi)
    right.wrap(Distinct(right.node, None, "any", False, keys))
    right.name = f"{right.name}+key-semi-join"
    reduced = ctx.cut(right, SingleOutput())
    j = len(left.inputs)
    left.inputs.append(StageInputSpec(reduced.id, "all", keys))
    left.name = f"{left.name}+anti-join"
    return left.wrap(replace(node, left=left.node, right=StageInput(j, keys), right_on=key_cols))
