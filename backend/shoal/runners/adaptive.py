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
* **a small sort in one task**: when a sort's sampled stage gave at most one coalesced
  task's bytes, its range split runs no task and the sort stage one task over every piece
  of the sampled stage (:func:`range_sort_stage`).

* **a one-task stage run by its reader**: a stage now of one task whose only reader
  would run one task over it too (a gather, or a shuffle of at most
  :data:`MIN_TASK_BYTES` read by a final aggregation or a join) runs inside the reader's
  one task (:func:`gather_consumer`): one task and one round trip fewer. Such a stage is
  held back while the reader's other inputs still run, since the reader waits for them
  anyway.

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
from dataclasses import dataclass, replace

from shoal.ir.expr import Col, NamedExpr
from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Explode,
    Filter,
    Join,
    PlanNode,
    Project,
    Scan,
    Slice,
    Sort,
    SqlMap,
    StageInput,
    UdfProject,
    Unnest,
    transform,
)
from shoal.ir.types import Schema
from shoal.planner.physical import (
    HashOutput,
    PhysicalPlan,
    RangeOutput,
    SingleOutput,
    Stage,
    StageInputSpec,
)
from shoal.planner.shared import fused_fragment

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
    aggregation without keys (one row over nothing), a projection of literals or with an
    aggregate, a full join, any operator not named here."""
    if isinstance(node, StageInput):
        return node.index in empty
    if isinstance(node, Project):
        # Row-wise only: an aggregate in a projection (``select(a.sum() + 1)``) gives a row
        # over nothing.
        exprs = [e.expr for e in node.exprs]
        rowwise = all(e.is_row_local() for e in exprs)
        reads = node.keep_height or any(e.columns() for e in exprs)
        return rowwise and reads and empty_output(node.input, empty)
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


def pointwise_input(stage: Stage) -> int | None:
    """The index of ``stage``'s one pointwise input when every other input is read whole
    (broadcasts) and it scans nothing, samples nothing and range-partitions nothing; else
    None."""
    if stage.scan_partitions is not None or stage.boundaries_from is not None:
        return None
    out = stage.output
    if isinstance(out, RangeOutput) or (isinstance(out, SingleOutput) and out.sample_rows):
        return None
    found = [i for i, spec in enumerate(stage.inputs) if spec.mode != "all"]
    if len(found) != 1 or stage.inputs[found[0]].mode != "pointwise":
        return None
    return found[0]


def pointwise_blocker(plan: PhysicalPlan, stage: Stage) -> str | None:
    """Why the partitions that ``stage`` reads pointwise (:func:`pointwise_input`) may not
    be read by one task, in partition order, or None. Exact where its operators give, over
    partitions read together, the union of what they give over each alone (those that
    coalesced buckets allow, a sort only under a slice: a top-k), and where the stages
    that read it one partition at a time can follow (:func:`retask_blocker`)."""
    for node in stage.fragment.walk():
        if isinstance(node, Sort):
            parents = [n for n in stage.fragment.walk() if isinstance(n, Slice) and n.input is node]
            if not parents:
                return "it sorts each partition"
    if tagged_reader(plan, stage):
        return "a stage that reads it tags each row with its task"
    return _fragment_blocker(stage, plan) or retask_blocker(plan, stage)


def tagged_reader(plan: PhysicalPlan, stage: Stage) -> bool:
    """Whether a stage that reads ``stage`` tags each row with the task it came from (a
    :class:`StageInput` with a ``source_column``: the prefix and window plans, a semi join
    by the large side): its answer depends on ``stage``'s partitions as planned."""
    for c in plan.consumers(stage.id):
        idx = {i for i, spec in enumerate(c.inputs) if stage.id in spec.stages}
        for n in c.fragment.walk():
            if isinstance(n, StageInput) and n.index in idx and n.source_column is not None:
                return True
    return False


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


def skip_blocker(plan: PhysicalPlan, stage: Stage) -> str | None:
    """Why ``stage``, whose output is certainly empty, may not run no task at all, or None:
    the stages that follow its partitions (pointwise or concatenated readers) then run no
    task either, which is right only where each gives no rows over an empty input. One
    with an aggregation without keys (``select(pl.len())`` fused into a reader) gives one
    row over nothing: the stage runs, with empty outputs, and its readers run over them."""
    for c in plan.consumers(stage.id):
        follows = {
            i
            for i, spec in enumerate(c.inputs)
            if stage.id in spec.stages and spec.mode not in ("all", "bucket")
        }
        if not follows:
            continue
        if not empty_output(c.fragment, follows):
            return f"stage {c.id} follows its partitions and gives rows over an empty input"
        why = skip_blocker(plan, c)
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


def range_sort_stage(plan: PhysicalPlan, split: Stage) -> tuple[Stage, int] | str | None:
    """For ``split``, the range-split stage of a sort (it reads its sampled stage pointwise
    and range-partitions it for one sort stage, which reads its buckets): that sort stage
    and the index of its input reading ``split``, when the sort may instead run as one task
    reading every piece of the sampled stage; a string saying why not; None when ``split``
    is no such stage.

    Exact where coalescing every bucket of ``split`` into one task of the sort stage is
    (:func:`coalesce_blocker`): equal keys share a range bucket, so one task reading the
    buckets in order sees tied rows in the sampled stage's partition order, as it does
    reading that stage's pieces in partition order; the same sort then gives the same rows
    in the same order."""
    if not isinstance(split.output, RangeOutput) or split.boundaries_from is None:
        return None
    if len(split.inputs) != 1 or split.inputs[0].mode != "pointwise":
        return None
    if split.inputs[0].stage != split.boundaries_from:
        return None
    consumers = plan.consumers(split.id)
    if len(consumers) != 1:
        return "its buckets are read by several stages"
    sort = consumers[0]
    reads = [i for i, spec in enumerate(sort.inputs) if split.id in spec.stages]
    if len(reads) != 1 or sort.inputs[reads[0]].mode != "bucket":
        return f"stage {sort.id} does not read its buckets alone"
    if sum(spec.mode == "bucket" for spec in sort.inputs) != 1:
        return f"stage {sort.id} reads another shuffle"
    why = coalesce_blocker(plan, sort)
    if why is not None:
        return why
    return sort, reads[0]


#: Operators that give no more rows than they read: a stage made of these only, over
#: inputs that fit one task, gives an output that fits one task too.
_NOT_GROWING = (StageInput, Aggregate, Distinct, Filter, Project, Slice)


def fuse_into_sort(
    sort: Stage, index: int, source: Stage
) -> tuple[PlanNode, tuple[StageInputSpec, ...]] | None:
    """The sort stage's new fragment and inputs once ``source`` (the sampled stage, now one
    task) runs in it: ``source``'s inputs first, its fragment in place of the sort's input
    ``index`` (the range split), then the sort's other inputs. None when ``source``'s
    fragment may give more rows than it reads (a join, an explode: then its output may not
    fit one task)."""
    if not all(isinstance(n, _NOT_GROWING) for n in source.fragment.walk()):
        return None
    return fuse_stage(sort, index, source)


def fuse_stage(
    consumer: Stage, index: int, source: Stage
) -> tuple[PlanNode, tuple[StageInputSpec, ...]]:
    """``consumer``'s new fragment and inputs once ``source`` (which it reads at input
    ``index``) runs inside it: ``source``'s inputs first, its fragment in place of that
    input, then the consumer's other inputs (:func:`shoal.planner.shared.fused_fragment`)."""
    return fused_fragment(consumer, {index}, source)


def gather_consumer(plan: PhysicalPlan, stage: Stage) -> tuple[Stage, int] | None:
    """For ``stage`` (now one task, reading no scan), the stage that may run it inside its
    own one task, and the input index that reads it: ``stage``'s only consumer, reading it
    at one input, scanning nothing and no result of the plan, that is either

    * of one task reading it whole and every other input whole too (broadcasts): a gather
      after a top-k, a limit, an aggregation without keys; or
    * reading it by bucket (a shuffle), every other input by bucket or whole, its
      operators exact over all its buckets at once (:func:`coalesce_blocker`), and
      ``stage``'s fragment not growing (no join or explode): a final aggregation after a
      partial one, a join after it. The consumer then runs as one task over every bucket;
      the caller checks that its inputs are small enough for that.

    The consumer's one task then reads what ``stage``'s task read and computes the same
    rows. None when there is no such stage."""
    if stage.num_tasks != 1 or stage.scan_partitions is not None:
        return None
    if stage.id in plan.result_stages or stage.boundaries_from is not None:
        return None
    consumers = plan.consumers(stage.id)
    if len(consumers) != 1:
        return None
    (c,) = consumers
    if c.scan_partitions is not None or c.boundaries_from is not None:
        return None
    reads = [i for i, spec in enumerate(c.inputs) if stage.id in spec.stages]
    if len(reads) != 1 or any(spec.more for spec in c.inputs):
        return None
    if sum(isinstance(n, StageInput) and n.index == reads[0] for n in c.fragment.walk()) != 1:
        return None
    if tagged_reader(plan, stage):
        return None
    if c.inputs[reads[0]].mode == "bucket":
        if any(spec.mode not in ("bucket", "all") for spec in c.inputs):
            return None
        if not all(isinstance(n, _NOT_GROWING) for n in stage.fragment.walk()):
            return None
        if coalesce_blocker(plan, c) is not None:
            return None
    elif c.num_tasks != 1 or any(spec.mode != "all" for spec in c.inputs):
        return None
    return c, reads[0]


def coalesce_target(total: int, cpus: int, target_partition_bytes: int) -> int:
    """Bytes of input one coalesced task is given: ``total / cpus`` (every CPU busy), at
    least :data:`MIN_TASK_BYTES`, at most ``target_partition_bytes``."""
    share = -(-total // max(1, cpus))
    return min(target_partition_bytes, max(share, MIN_TASK_BYTES))


def group_buckets(
    sizes: Sequence[int], skip: Sequence[bool], target: int | None, cpus: int = 1
) -> list[list[int]]:
    """Bucket ids (indices of ``sizes``, in order, without those ``skip`` marks) cut into
    consecutive groups of about equal bytes: as many groups as ``target`` bytes each needs
    (rounded up to a multiple of ``cpus`` when over ``cpus``: no wave of fewer tasks than
    CPUs), each bucket in the group its middle byte falls in, so that a bucket much larger
    than the others is a group of its own; ``target`` None: one bucket per group.

    Cutting by equal shares, not filling each group up to ``target`` in turn: four buckets
    of 16.1, 16.0, 15.9 and 16.0 MiB for two CPUs (``target`` 32 MiB) are two groups, where
    filling gave three (16.1 alone, 31.9, 16.0), a second wave of one task."""
    ids = [b for b in range(len(sizes)) if not skip[b]]
    if target is None:
        return [[b] for b in ids]
    total = sum(sizes[b] for b in ids)
    k = max(1, -(-total // max(1, target)))
    if k > cpus:
        k = -(-k // cpus) * cpus
    groups: list[list[int]] = []
    last = -1
    before = 0
    for b in ids:
        share = min(k - 1, (2 * before + sizes[b]) * k // max(1, 2 * total))
        if share != last:
            groups.append([])
            last = share
        groups[-1].append(b)
        before += sizes[b]
    return groups


# ------------------------------------------------ a hash join turned broadcast join


@dataclass(frozen=True)
class Regroup:
    """An aggregation that completes in place in a hash join's buckets (the planner placed
    it there because every key's rows meet in one bucket), split again so that the join
    may run as a broadcast join in the probe side's partitions, where a key's rows may
    span tasks: the join stage then computes the partial aggregates of its partition
    (:func:`shoal.planner.aggregate.split`), and stage ``consumer``, the one task that reads
    the join stage whole (input ``index``: a top-k's or limit's gather, an aggregation
    without keys), merges them into the final aggregates before the operators that were
    above the aggregation in the join stage (row-local filters and projections, a
    per-partition top-k or limit) and its own."""

    consumer: int
    index: int


#: Operators that may sit above a regrouped aggregation in its join stage (moved to the
#: gathering task as they are; a :class:`Sort` only under a :class:`Slice`, a top-k).
_ABOVE_REGROUP = (Filter, Project, Slice, Sort)


def _regroup_path(fragment: PlanNode) -> tuple[list[PlanNode], Aggregate] | str:
    """The operators from ``fragment``'s root down to its one aggregation (root first), and
    that aggregation, when it may be regrouped (:class:`Regroup`); else why not."""
    from shoal.planner import aggregate as agg2

    above: list[PlanNode] = []
    node = fragment
    while isinstance(node, _ABOVE_REGROUP):
        if isinstance(node, Sort) and not (above and isinstance(above[-1], Slice)):
            return "a sort over the aggregation"
        if isinstance(node, Project) and not all(e.expr.is_row_local() for e in node.exprs):
            return "a projection over the aggregation that is not row-local"
        if isinstance(node, Filter) and not node.predicate.is_row_local():
            return "a filter over the aggregation that is not row-local"
        above.append(node)
        node = node.children()[0]
    if not isinstance(node, Aggregate) or not node.keys or node.maintain_order:
        return f"{node.label} over the join is not an aggregation by keys"
    if any(isinstance(n, Aggregate) for n in node.input.walk()):
        return "another aggregation under it"
    if not agg2.can_split(node.aggs):
        return "its aggregates do not split into partial and final parts"
    return above, node


def regroup_target(plan: PhysicalPlan, stage: Stage) -> Regroup | str:
    """For ``stage`` (a hash-join stage whose aggregation completes in its buckets), the
    :class:`Regroup` that lets it run as a broadcast join, or why there is none: its
    aggregation must be its fragment's only one, split exactly in two phases, under only
    row-local operators and a top-k or limit; the stage must be read by exactly one stage,
    of one task, that reads it whole and alone in that input (a gather)."""
    why = _regroup_path(stage.fragment)
    if isinstance(why, str):
        return why
    if stage.id in plan.result_stages:
        return "its outputs are the query's result"
    consumers = plan.consumers(stage.id)
    if len(consumers) != 1:
        return "it is read by several stages"
    (c,) = consumers
    reads = [i for i, spec in enumerate(c.inputs) if stage.id in spec.stages]
    if c.num_tasks != 1 or len(reads) != 1:
        return f"stage {c.id} does not gather it in one task"
    spec = c.inputs[reads[0]]
    if spec.mode != "all" or spec.more:
        return f"stage {c.id} reads it {spec.mode}"
    if sum(isinstance(n, StageInput) and n.index == reads[0] for n in c.fragment.walk()) != 1:
        return f"stage {c.id} reads it more than once"
    return Regroup(c.id, reads[0])


def regroup(join: Stage, consumer: Stage, rg: Regroup) -> None:
    """Apply ``rg`` to ``join`` (its fragment already the broadcast join's) and its gathering
    ``consumer``: the join stage ends with the partial aggregation; the consumer's input
    ``rg.index`` becomes the final aggregation over the partial rows, under the operators
    that were above the aggregation in the join stage. Both stages are changed in place."""
    from shoal.planner import aggregate as agg2

    found = _regroup_path(join.fragment)
    assert not isinstance(found, str), found
    above, agg = found
    tp = agg2.split(agg.keys, agg.aggs)
    partial_schema = Schema.of(
        [(k.name, k.dtype) for k in agg.keys] + [(p.name, p.dtype) for p in tp.partial]
    )
    final_schema = Schema.of(
        [(k.name, k.dtype) for k in agg.keys] + [(f.name, f.dtype) for f in tp.final]
    )
    join.fragment = Aggregate(agg.input, agg.keys, tp.partial, False, partial_schema)
    join.whole_buckets = ""
    key_cols = tuple(NamedExpr(k.name, Col(k.name, k.dtype)) for k in agg.keys)
    merged: PlanNode = Aggregate(
        StageInput(rg.index, partial_schema), key_cols, tp.final, False, final_schema
    )
    merged = Project(merged, tp.project, agg.schema)
    for node in reversed(above):
        merged = node.with_children((merged,))

    def swap(node: PlanNode) -> PlanNode | None:
        if isinstance(node, StageInput) and node.index == rg.index:
            return merged
        return None

    consumer.fragment = transform(consumer.fragment, swap)
    consumer.inputs = tuple(
        replace(spec, schema=partial_schema) if i == rg.index else spec
        for i, spec in enumerate(consumer.inputs)
    )


@dataclass(frozen=True)
class BroadcastSwitch:
    """A planned hash join (stage ``join``) that may run as a broadcast join instead: if
    stage ``build`` (one side's shuffle) turns out at most ``broadcast_join_threshold_bytes``
    while stage ``probe`` (the other side's shuffle) has not started, the probe stage's
    fragment runs in the join stage, on its own partitions, with every bucket of ``build``
    read whole; the probe side is never shuffled. ``probe_input`` and ``build_input`` are
    the join stage's input indices of the two sides.

    Until ``build`` has finished, the loop holds ``probe`` back (it starts no task of it):
    that is the price of the switch, so a switch is planned only where the build side's
    size was a guess (:func:`_size_is_a_guess`)."""

    join: int
    probe: int
    build: int
    probe_input: int
    build_input: int
    #: The join stage's aggregation completes in its buckets: how it is split again at
    #: the switch (None: no such aggregation).
    regroup: Regroup | None = None


def _size_is_a_guess(stage: Stage) -> bool:
    """Whether the planner's size of ``stage``'s output was a guess (filters, aggregations,
    joins, other stages' outputs), not read from footers or table sizes."""
    for node in stage.fragment.walk():
        if isinstance(node, Scan):
            if node.predicate is not None:
                return True
        elif not isinstance(node, Project):
            return True
    return False


def broadcast_switches(plan: PhysicalPlan) -> list[BroadcastSwitch]:
    """The hash joins of ``plan`` that may turn into broadcast joins at run time.

    A join stage qualifies when it reads exactly two shuffles, each read by it alone; its
    join lets the probe side's rows be partitioned in any way (each probe row meets the
    whole build side: inner, left/semi/anti probing with the left side, right with the
    right; see :func:`shoal.runners.skew.split_sides`, the same rule), every other input is
    a broadcast, and the stages after it may follow another task count
    (:func:`retask_blocker`). For an inner join the side with the smaller estimate is the
    build side."""
    from shoal.runners.skew import split_sides

    found = []
    for st in plan.stages:
        buckets = [i for i, spec in enumerate(st.inputs) if spec.mode == "bucket"]
        if len(buckets) != 2 or any(
            spec.mode != "all" for i, spec in enumerate(st.inputs) if i not in buckets
        ):
            continue
        ups = [plan.stage(st.inputs[i].stage) for i in buckets]
        if any(
            not isinstance(u.output, HashOutput)
            or len(st.inputs[i].stages) != 1
            or [c.id for c in plan.consumers(u.id)] != [st.id]
            or u.boundaries_from is not None
            for i, u in zip(buckets, ups, strict=True)
        ):
            continue
        sides = split_sides(st)
        rg = None
        if isinstance(sides, str) and st.whole_buckets:
            # An aggregation completes in the buckets: switched only where it may be split
            # again, its final part moved to the task that gathers the join stage.
            target = regroup_target(plan, st)
            if isinstance(target, Regroup):
                rg = target
                sides = split_sides(replace(st, whole_buckets=""))
        if isinstance(sides, str) or retask_blocker(plan, st) is not None:
            continue
        options = []
        for probe_input in sides[1]:
            build_input = next(i for i in buckets if i != probe_input)
            probe = plan.stage(st.inputs[probe_input].stage)
            build = plan.stage(st.inputs[build_input].stage)
            if _size_is_a_guess(build):
                options.append(
                    (
                        build.est_bytes,
                        BroadcastSwitch(st.id, probe.id, build.id, probe_input, build_input, rg),
                    )
                )
        if options:
            found.append(min(options, key=lambda o: o[0])[1])
    return found


def fuse_probe(
    join: Stage, probe: Stage, sw: BroadcastSwitch
) -> tuple[PlanNode, tuple[StageInputSpec, ...]]:
    """The join stage's new fragment and inputs once ``probe``'s fragment runs in it: the
    probe stage's inputs first (its fragment unchanged, in place of the probe side's stage
    input), then the join stage's other inputs in order, the build side read whole
    (``"all"``: every bucket of every task)."""
    offset = len(probe.inputs)
    kept = [i for i in range(len(join.inputs)) if i != sw.probe_input]
    index = {old: offset + k for k, old in enumerate(kept)}
    inputs = list(probe.inputs)
    for old in kept:
        spec = join.inputs[old]
        inputs.append(replace(spec, mode="all") if old == sw.build_input else spec)

    def swap(node: PlanNode) -> PlanNode | None:
        if isinstance(node, StageInput):
            if node.index == sw.probe_input:
                return probe.fragment
            return replace(node, index=index[node.index])
        return None

    return transform(join.fragment, swap), tuple(inputs)
