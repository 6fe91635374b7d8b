"""A shared sub-plan read by one stage only, partition by partition: run in that stage.

A sub-plan used more than once (Polars' cache) is planned as a stage of its own whose
partitions each use reads pointwise (task ``i`` reads partition ``i``): computed once,
held in the object store, read back. When every use ends up in the same stage (the two
uses of TPC-H Q2's "parts supplied from Europe" joined in place,
:mod:`shoal.planner.copartition`), that stage boundary buys nothing: the consumer's task
``i`` can compute partition ``i`` itself, once, and use it twice, and nothing is written
to the object store (318 MiB in Q2 at scale 10).

:func:`inline_shared_stages` does that after planning. The consumer's fragment then holds
the shared fragment at each use as one node object; the lowering computes a node object
reached twice that holds a join once, in the task, and gives each use a frame over its
rows (:func:`shoal.lowering.plan.lower_plan`; Polars' own common sub-plan elimination
misses uses into which its predicate pushdown pushes different filters). A shared scan
with filters stays one lazy frame, which Polars may read twice with each use's filters
pushed into the reader: cheaper than holding all its rows.

Only where exact and no slower: the shared stage holds a join (a scan with filters is
cheaper read twice, each use's filters pushed into the reader, than held: TPC-H Q21's
lineitem at scale 1 took 0.84-0.89 s as a stage of its own, 1.4-1.6 s inside its
reader), gives one output per task (no exchange, no sample), is no result of the plan
and runs no user function (an actor pool's stage);
its one consumer stage reads it only pointwise, with as many tasks, scans nothing of its
own and has no rows tagged with their task.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from shoal.ir.nodes import Join, PlanNode, Sink, StageInput, UdfProject
from shoal.planner.physical import PhysicalPlan, SingleOutput, Stage, StageInputSpec


def inline_shared_stages(plan: PhysicalPlan) -> None:
    """Run each shared stage that one stage reads pointwise inside that stage (see the
    module docstring), renumbering the stages that follow; the plan changes in place
    (``explain`` shows the reader's name with the shared stage's in front)."""
    while True:
        for stage in plan.stages:
            reader = _sole_pointwise_reader(plan, stage)
            if reader is not None:
                _fuse(stage, reader)
                _drop(plan, stage.id)
                break
        else:
            return


def _runs_user_code(stage: Stage) -> bool:
    return any(isinstance(n, UdfProject | Sink) for n in stage.fragment.walk())


def _sole_pointwise_reader(plan: PhysicalPlan, stage: Stage) -> Stage | None:
    """The one stage that reads ``stage``, where it may run ``stage``'s fragment itself;
    else None."""
    out = stage.output
    if not isinstance(out, SingleOutput) or out.sample_rows:
        return None
    if stage.id in plan.result_stages or stage.boundaries_from is not None:
        return None
    if _runs_user_code(stage) or not any(isinstance(n, Join) for n in stage.fragment.walk()):
        return None
    readers = plan.consumers(stage.id)
    if len(readers) != 1:
        return None
    (reader,) = readers
    if reader.scan_partitions is not None or reader.boundaries_from is not None:
        return None
    if reader.num_tasks != stage.num_tasks or _runs_user_code(reader):
        return None
    specs = [spec for spec in reader.inputs if stage.id in spec.stages]
    if any(spec.mode != "pointwise" or spec.more for spec in specs):
        return None
    reads = {i for i, spec in enumerate(reader.inputs) if stage.id in spec.stages}
    for n in reader.fragment.walk():
        if isinstance(n, StageInput) and n.index in reads and n.source_column is not None:
            return None
    return reader


def _fuse(stage: Stage, reader: Stage) -> None:
    """``reader`` runs ``stage``'s fragment at each of its reads of it, and its scan."""
    reads = {i for i, spec in enumerate(reader.inputs) if stage.id in spec.stages}
    reader.fragment, reader.inputs = fused_fragment(reader, reads, stage)
    reader.scan_partitions = stage.scan_partitions
    reader.name = f"{stage.name.removesuffix('+cache')}+{reader.name.removeprefix('cached+')}"


def fused_fragment(
    reader: Stage, reads: Collection[int], source: Stage
) -> tuple[PlanNode, tuple[StageInputSpec, ...]]:
    """``reader``'s fragment and inputs once ``source`` runs inside it: ``source``'s
    fragment (one node object, so that the lowering computes it once) in place of each
    :class:`StageInput` whose index is in ``reads``, ``source``'s inputs first, then
    ``reader``'s other inputs, renumbered. Node objects that ``reader``'s fragment shares
    stay shared."""
    kept = [i for i in range(len(reader.inputs)) if i not in reads]
    moved = {old: len(source.inputs) + k for k, old in enumerate(kept)}
    memo: dict[int, PlanNode] = {}

    def rewrite(node: PlanNode) -> PlanNode:
        got = memo.get(id(node))
        if got is not None:
            return got
        if isinstance(node, StageInput):
            new = source.fragment if node.index in reads else replace(node, index=moved[node.index])
        else:
            kids = node.children()
            new = node.with_children(tuple(rewrite(c) for c in kids)) if kids else node
        memo[id(node)] = new
        return new

    return rewrite(reader.fragment), (*source.inputs, *(reader.inputs[i] for i in kept))


def _drop(plan: PhysicalPlan, gone: int) -> None:
    """Remove stage ``gone`` (read by no stage now) and renumber the stages after it, with
    every reference to them."""

    def new_id(old: int) -> int:
        assert old != gone, f"stage {gone} is still read"
        return old - 1 if old > gone else old

    del plan.stages[gone]
    for st in plan.stages:
        st.id = new_id(st.id)
        st.inputs = tuple(
            replace(spec, stage=new_id(spec.stage), more=tuple(map(new_id, spec.more)))
            for spec in st.inputs
        )
        if st.boundaries_from is not None:
            st.boundaries_from = new_id(st.boundaries_from)
    plan.results = tuple(map(new_id, plan.results))
