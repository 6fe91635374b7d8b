"""Adaptive execution: re-planning a stage from what its inputs actually produced.

When a stage becomes runnable, every stage it reads has finished, so the rows and bytes of
each of its input pieces are known (:attr:`~shoal.execution.kernel.TaskStats.output_rows`
and ``output_bytes``, per hash or range bucket). The dispatch loop
(:mod:`shoal.runners.dispatch`) then changes what is still to run, where that gives the
same rows:

* **empty stages**: a stage whose fragment yields no rows when some of its inputs are
  empty (:func:`empty_output`: an inner join or semi join with an empty side, a left or anti
  join with an empty left side, filters, projections, keyed aggregations over nothing...)
  runs no task at all. An aggregation without keys is never skipped: it emits one row over
  nothing (``count`` 0, ``sum`` 0, ``min`` null).
* **empty buckets**: the same rule per bucket of a shuffle: a hash-join task whose bucket
  is empty on one side of an inner join reads nothing and is not run.
* **coalescing**: adjacent small buckets are read by one task (task ``g`` reads buckets
  ``j..k`` of every bucket input, the same ids on every input, so joins stay correct; for a
  range exchange the buckets stay in order, so the sort's output stays sorted). A group
  holds about ``total / cpus`` bytes (never fewer than :data:`MIN_TASK_BYTES`, never more
  than ``target_partition_bytes``), so a shuffle of a few KiB runs as one task and a large
  one keeps every CPU busy. Off when ``shuffle_partitions`` is set (the user asked for
  that many partitions).

Where a stage's task count changes, the stages that follow its partitions one by one
(pointwise or concatenated inputs) change with it. What may not be re-planned is left as
planned, for a reason (:func:`coalesce_blocker`): a fragment whose operators need each
bucket alone (rows tagged with their upstream task, a sort on other keys than the range
exchange's, an operator not listed here) or a stage that reads pointwise beside a shuffle.
Each change is one line of the query's report (``explain(analyze=True)``) and a trace
event.
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
from shoal.planner.physical import HashOutput, PhysicalPlan, RangeOutput, Stage

#: The smallest input a coalesced task is given when the data allows (bytes): below this,
#: the fixed cost of a task (scheduling, a fresh Polars query) outweighs running buckets in
#: parallel.
MIN_TASK_BYTES = 8 * 1024 * 1024

#: Operators that give, over several buckets of a shuffle read together, the union of
#: what they give over each bucket alone (the planner places only these above a shuffle
#: in a multi-task stage; a :class:`Sort` is checked apart).
_BUCKET_WISE = (
    Filter,
    Project,
    Explode,
    Unnest,
    SqlMap,
    UdfProject,
    Aggregate,
    Distinct,
    Slice,
    Join,
)

#: Operators that give no rows over no rows (a projection only when it reads columns or
#: keeps its input's height; an aggregation only with keys: checked apart).
_EMPTY_PRESERVING = (Filter, Explode, Unnest, SqlMap, UdfProject, Distinct, Slice, Sort)


def empty_output(node: PlanNode, empty: set[int]) -> bool:
    """Whether ``node`` (a stage's fragment) certainly gives no rows when the stage inputs
    whose indices are in ``empty`` hold no rows. False whenever unsure: a scan, an
    aggregation without keys (one row over nothing), a projection of literals, a full
    join."""
    if isinstance(node, StageInput):
        return node.index in empty
    if isinstance(node, Project):
        reads = node.keep_height or any(e.expr.columns() for e in node.exprs)
        return reads and empty_output(node.input, empty)
    if isinstance(node, Aggregate):
        return bool(node.keys) and empty_output(node.input, empty)
    if isinstance(node, _EMPTY_PRESERVING):
        (child,) = node.children()
        return empty_output(child, empty)
    if isinstance(node, Join):
        left = empty_output(node.left, empty)
        right = empty_output(node.right, empty)
        if node.how in ("inner", "semi", "cross"):
            return left or right
        if node.how in ("left", "anti"):
            return left
        if node.how == "right":
            return right
        return left and right  # full
    return False


def _fragment_blocker(stage: Stage, plan: PhysicalPlan) -> str | None:
    """Why ``stage``'s fragment must see each bucket alone, or None."""

    def rec(node: PlanNode, parent: PlanNode | None) -> str | None:
        if isinstance(node, StageInput):
            if node.source_column is not None:
                return "its rows are tagged with their upstream task"
            return None
        if isinstance(node, Sort) and not isinstance(parent, Slice):
            # A sort is exact over several buckets only when they are ranges of its keys.
            ranges = [plan.stage(i.stage).output for i in stage.inputs if i.mode == "bucket"]
            same = all(
                isinstance(o, RangeOutput)
                and (o.by, o.descending, o.nulls_last)
                == (node.by, node.descending, node.nulls_last)
                for o in ranges
            )
            if not same:
                return "it sorts by other keys than its range exchange"
        elif not isinstance(node, (*_BUCKET_WISE, Sort)):
            return f"{node.label} needs each bucket alone"
        for child in node.children():
            why = rec(child, node)
            if why is not None:
                return why
        return None

    return rec(stage.fragment, None)


def retask_blocker(plan: PhysicalPlan, stage: Stage) -> str | None:
    """Why ``stage`` may not run another number of tasks than planned, or None: a stage
    that reads it pointwise or concatenated must follow its partitions, which it can only
    when its other inputs are broadcast (read whole) and it scans nothing."""
    for c in plan.consumers(stage.id):
        for spec in c.inputs:
            if stage.id not in spec.stages or spec.mode in ("all", "bucket"):
                continue
            if c.scan_partitions is not None:
                return f"stage {c.id} reads it {spec.mode} and scans"
            if any(i is not spec and i.mode != "all" for i in c.inputs):
                return f"stage {c.id} reads it {spec.mode} beside another partitioned input"
            why = retask_blocker(plan, c)
            if why is not None:
                return why
    return None


def coalesce_blocker(plan: PhysicalPlan, stage: Stage) -> str | None:
    """Why the buckets of ``stage`` (a stage with shuffle inputs) may not be read by fewer
    tasks than planned, or None (see the module docstring)."""
    buckets = [i for i in stage.inputs if i.mode == "bucket"]
    if not buckets:
        return "no shuffle input"
    if stage.scan_partitions is not None:
        return "it scans"
    others = [i for i in stage.inputs if i.mode not in ("bucket", "all")]
    if others:
        return f"it reads stage {others[0].stage} {others[0].mode}"
    for spec in buckets:
        out = plan.stage(spec.stage).output
        if not isinstance(out, HashOutput | RangeOutput) or out.n != stage.num_tasks:
            return f"stage {spec.stage}'s buckets do not match its tasks"
    return _fragment_blocker(stage, plan) or retask_blocker(plan, stage)


def coalesce_target(total: int, cpus: int, target_partition_bytes: int) -> int:
    """Bytes of input one coalesced task is given: ``total / cpus`` (every CPU busy), at
    least :data:`MIN_TASK_BYTES`, at most ``target_partition_bytes``."""
    share = -(-total // max(1, cpus))
    return min(target_partition_bytes, max(share, MIN_TASK_BYTES))


def group_buckets(
    sizes: Sequence[int], skip: Sequence[bool], target: int | None
) -> list[list[int]]:
    """Bucket ids (indices of ``sizes``, in order, without those ``skip`` marks) cut into
    consecutive groups of at most ``target`` bytes each (a bucket over ``target`` is a group
    of its own); ``target`` None: one bucket per group."""
    groups: list[list[int]] = []
    used = 0
    for b, (n, sk) in enumerate(zip(sizes, skip, strict=True)):
        if sk:
            continue
        if not groups or target is None or used + n > target:
            groups.append([])
            used = 0
        groups[-1].append(b)
        used += n
    return groups


def size(n: float) -> str:
    """``n`` bytes for a person: ``12.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover
