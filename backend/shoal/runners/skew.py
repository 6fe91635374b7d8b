"""Splitting a task whose input is too large (skew), where that is exact.

A hash-join stage's task ``j`` reads bucket ``j`` of both sides. When one join key holds
most rows, that bucket is far larger than the others. Its task can be run as several
*subtasks*: the pieces of one side (the *split side*, one piece per upstream task) are
cut into consecutive groups, and each subtask reads one group plus every piece of the
other side for that bucket. Each row of the split side then meets every row of the
other side with the same key exactly once, so the subtasks' outputs, concatenated in
order, are that partition's output. This holds for:

* ``inner``: either side (the larger one of the bucket is split);
* ``left``, ``semi``, ``anti``: the left side (a left row's matches, or lack of them, are
  all in the right side, which every subtask reads whole);
* ``right``: the right side.

It does not hold for ``full`` (an unmatched row of either side would be emitted by every
subtask or by none) nor for ``cross``, nor for any stage that is not a hash join
(a final aggregation, a sort, a distinct after a shuffle: all need every row of the
bucket in one task). Such tasks run whole and the reason is reported.

Above the join, a multi-task fragment holds only operators the planner places on
partitions of any size (row-local filters and projections, broadcast joins on this side,
partial aggregations, per-partition limits and top-k, pre-deduplication): running them
on smaller partitions gives rows that the next exchange treats the same way.
:func:`split_side` checks that every operator on the path from the fragment's root to
the join is one of those.
"""

from __future__ import annotations

from collections.abc import Sequence

from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Explode,
    Filter,
    Join,
    PlanNode,
    Project,
    Slice,
    Sort,
    SqlMap,
    StageInput,
    UdfProject,
    Unnest,
)
from shoal.planner.physical import Stage

#: Operators that may sit above a split hash join in a multi-task fragment.
_PARTITION_LOCAL = (
    Filter,
    Project,
    Explode,
    Unnest,
    UdfProject,
    SqlMap,
    Aggregate,
    Distinct,
    Slice,
)

#: Join types, and the sides (0 = left, 1 = right) whose rows may be split into groups.
_SPLITTABLE_SIDES: dict[str, tuple[int, ...]] = {
    "inner": (0, 1),
    "left": (0,),
    "semi": (0,),
    "anti": (0,),
    "right": (1,),
}


def _find_hash_join(stage: Stage, node: PlanNode, parent: PlanNode | None) -> Join | str:
    """The hash join of ``stage`` below ``node``, or why the stage cannot be split."""
    if isinstance(node, Join):
        kids = (node.left, node.right)
        inputs = [k for k in kids if isinstance(k, StageInput)]
        if len(inputs) == 2:
            modes = {stage.inputs[k.index].mode for k in inputs}
            if modes == {"bucket"}:
                return node
            if "all" not in modes:
                return f"join reads its inputs as {sorted(modes)}"
        # A broadcast join: follow the side that is not the broadcast input.
        probe = [k for k in kids if not _is_broadcast(stage, k)]
        if len(probe) != 1:
            return "join with no single probe side"
        return _find_hash_join(stage, probe[0], node)
    if isinstance(node, Sort):
        if not isinstance(parent, Slice):  # a per-partition top-k only
            return "sort over the join"
        return _find_hash_join(stage, node.input, node)
    if isinstance(node, _PARTITION_LOCAL):
        (child, *more) = node.children()
        if more:
            return f"{node.label} with {len(more) + 1} inputs"
        return _find_hash_join(stage, child, node)
    return f"{node.label} needs all rows of its partition"


def _is_broadcast(stage: Stage, node: PlanNode) -> bool:
    return isinstance(node, StageInput) and stage.inputs[node.index].mode == "all"


def split_sides(stage: Stage) -> tuple[Join, tuple[int, ...]] | str:
    """The hash join of ``stage`` and the stage-input indices (one per join side that may
    be split, left first), or a reason why no task of ``stage`` may be split."""
    if stage.num_tasks < 2:
        return "single-task stage (operators above the join may need all rows)"
    if stage.whole_buckets:
        return stage.whole_buckets
    found = _find_hash_join(stage, stage.fragment, None)
    if isinstance(found, str):
        return found
    if found.maintain_order != "none":
        return f"join keeps order {found.maintain_order!r}"
    sides = _SPLITTABLE_SIDES.get(found.how)
    if not sides:
        return f"{found.how} join (an unmatched row needs all rows of both sides)"
    kids = (found.left, found.right)
    return found, tuple(kids[s].index for s in sides)  # type: ignore[attr-defined]


def group_pieces(sizes: Sequence[int], room: int) -> list[list[int]]:
    """Indices of ``sizes`` cut into consecutive groups of at most ``room`` bytes each
    (a piece larger than ``room`` is a group of its own); one group when all fit."""
    groups: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(sizes):
        if groups[-1] and used + n > room:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups
