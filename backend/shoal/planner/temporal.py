"""Planning of the temporal and ordered operators (called by
:mod:`shoal.planner.planner` for :data:`TEMPORAL_NODES`).

* :class:`~shoal.ir.nodes.AsofJoin` keeps every left row in order and matches it against
  the whole right side, so the right side is broadcast and the left stays in its
  partitions (their concatenation is the left order, which is Polars' output order) when
  the right side is small enough to broadcast, and when no check needs the whole left key:
  with ``check_sortedness`` and no by-columns Polars checks that the left key is sorted over
  all rows, so the left side is gathered into one task. Otherwise both sides go to one task.
* :class:`~shoal.ir.nodes.DynamicGroupBy` / :class:`~shoal.ir.nodes.RollingGroupBy`
  without group columns need every row of the index in order: one task after a gather.
  With group columns that are plain columns of simple types, rows are hash-partitioned on
  them (a group is whole in one task, its rows in input order, as the exchange keeps the
  order of each upstream partition and reads them in order), and a gather puts the groups
  back in Polars' order (:class:`~shoal.ir.nodes.RestoreGroupOrder`).
* :class:`~shoal.ir.nodes.MergeSorted` gathers each side and merges in one task. (A range
  exchange of both sides on the key by shared boundaries would not be exact: Polars'
  merge breaks ties between the sides differently depending on where the inputs start,
  so a merge per range can order equal keys otherwise than the merge of the whole.)
"""

from __future__ import annotations

from shoal.ir.expr import Col
from shoal.ir.nodes import (
    AsofJoin,
    DynamicGroupBy,
    MergeSorted,
    PlanNode,
    RestoreGroupOrder,
    RollingGroupBy,
    StageInput,
)
from shoal.ir.types import BOOL
from shoal.planner.context import OpenFragment, PlanningContext
from shoal.planner.physical import HashOutput, SingleOutput, StageInputSpec

#: The plan nodes this module places.
TEMPORAL_NODES = (AsofJoin, DynamicGroupBy, RollingGroupBy, MergeSorted)


def plan_temporal(b: PlanningContext, node: PlanNode) -> OpenFragment:
    """Place ``node`` (one of :data:`TEMPORAL_NODES`); ``b`` is the planning context."""
    if isinstance(node, AsofJoin):
        return _asof_join(b, node)
    if isinstance(node, DynamicGroupBy | RollingGroupBy):
        return _window_group_by(b, node)
    assert isinstance(node, MergeSorted)
    # The right side is cut into a stage of its own and read whole by the one task.
    left = b.gather(b.visit(node.left), "gather")
    right = b.visit(node.right)
    return b.combine_single(
        [left, right], lambda kids: MergeSorted(kids[0], kids[1], node.key, node.schema), "merge"
    )


def _asof_join(b: PlanningContext, node: AsofJoin) -> OpenFragment:
    left = b.visit(node.left)
    right = b.visit(node.right)
    threshold = b.config.broadcast_join_threshold_bytes
    small_right = right.num_tasks == 1 or bool(threshold and right.est_bytes <= threshold)
    whole_left_checked = node.check_sortedness and not node.left_by
    if not small_right or whole_left_checked:
        left = b.gather(left, "gather")
    st = b.cut(right, SingleOutput(), name=f"{right.name}+broadcast")
    idx = len(left.inputs)
    left.inputs.append(StageInputSpec(st.id, "all", st.fragment.schema))
    left.est_bytes += right.est_bytes
    left.name = f"{left.name}+asof-join"
    return left.wrap(node.with_children((left.node, StageInput(idx, st.fragment.schema))))


def _simple_key(node: DynamicGroupBy | RollingGroupBy) -> bool:
    """Whether the group columns are plain columns of types whose group order the kernel
    restores exactly: values that compare the same in every process (no categoricals,
    whose codes are per process) and equal themselves in a join (no float NaN)."""
    for k in node.keys:
        if not isinstance(k.expr, Col) or k.expr.name != k.name:
            return False
        dt = k.expr.dtype
        if not (dt.is_integer or dt.is_string or dt.is_temporal or dt == BOOL):
            return False
    return True


def _window_group_by(b: PlanningContext, node: DynamicGroupBy | RollingGroupBy) -> OpenFragment:
    op = b.visit(node.input)
    if op.num_tasks == 1 or not node.keys or not _simple_key(node):
        op = b.gather(op, "gather")
        return op.wrap(node.with_children((op.node,)))
    n = b.shuffle_n(op)
    st = b.cut(op, HashOutput(tuple(k.expr for k in node.keys), n), name=f"{op.name}+shuffle")
    part = b.read(st, "bucket", n, "window-group-by")
    part.wrap(node.with_children((part.node,)))
    g = b.gather(part, "group-order")
    keys = tuple(k.name for k in node.keys)
    if isinstance(node, RollingGroupBy):
        return g.wrap(RestoreGroupOrder(g.node, keys, "rolling", node.schema))
    return g.wrap(RestoreGroupOrder(g.node, keys, "group_by_dynamic", node.schema))
