"""The physical plan: a DAG of stages joined by exchanges.

A :class:`Stage` is a fragment (an IR pipeline with no exchange inside) run as one task
per partition, plus how each task partitions its output (:data:`OutputSpec`). Each input of
a stage reads the outputs of an upstream stage in one of three modes:

* ``"pointwise"``: task ``i`` reads output ``i`` of upstream task ``i`` (same partitioning);
* ``"bucket"``: task ``j`` reads bucket ``j`` of every upstream task (after a hash or range
  exchange: the shuffle);
* ``"all"``: every task reads every upstream output, in partition order (broadcast; or
  gather, when the stage has one task).

:func:`plan_physical` builds it from an IR plan (see :mod:`shoal.planner.planner`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from shoal.execution.task import (
    HashOutput,
    OutputSpec,
    RangeOutput,
    ScanInput,
    SingleOutput,
)
from shoal.ir.explain import describe
from shoal.ir.nodes import PlanNode
from shoal.ir.types import Schema

InputMode = Literal["pointwise", "bucket", "all", "concat"]


@dataclass(frozen=True)
class StageInputSpec:
    """Input ``index`` of a stage: the outputs of stage ``stage`` read in ``mode``.

    ``"concat"`` (a union) reads the partitions of ``stage`` and then of each stage in
    ``more``, one per task, in that order.
    """

    stage: int
    mode: InputMode
    schema: Schema
    more: tuple[int, ...] = ()

    @property
    def stages(self) -> tuple[int, ...]:
        return (self.stage, *self.more)


@dataclass
class Stage:
    """One stage: ``num_tasks`` tasks each running ``fragment`` on one partition.

    ``scan_partitions`` is set for a stage whose fragment holds a scan (task ``i`` reads
    partition ``i``). ``boundaries_from`` names the stage whose samples choose the range
    boundaries of a :class:`RangeOutput` (filled by the runner before dispatch).
    """

    id: int
    name: str
    fragment: PlanNode
    inputs: tuple[StageInputSpec, ...]
    output: OutputSpec
    num_tasks: int
    scan_partitions: tuple[ScanInput, ...] | None = None
    boundaries_from: int | None = None
    est_bytes: int = 0

    @property
    def operators(self) -> list[str]:
        """Names of the IR operators in the fragment, root first."""
        return [n.label for n in self.fragment.walk()]

    def describe_output(self) -> str:
        o = self.output
        if isinstance(o, HashOutput):
            return f"hash exchange on [{', '.join(map(str, o.keys))}] into {o.n} partitions"
        if isinstance(o, RangeOutput):
            return f"range exchange on [{', '.join(map(str, o.by))}] into {o.n} partitions"
        assert isinstance(o, SingleOutput)
        return "one output per task" + (" (with sort-key sample)" if o.sample_rows else "")


@dataclass
class PhysicalPlan:
    """Stages in a topological order (inputs first); the last one is the root, whose task
    outputs, concatenated in partition order, are the query's result."""

    stages: list[Stage] = field(default_factory=list)
    schema: Schema | None = None
    #: The CPU count the plan was sized by (scan splits, shuffle partitions), and where it
    #: came from: "cluster" (the running Ray cluster's or local runner's CPUs, read when the
    #: query was planned), "setting" (``num_cpus``) or "driver" (this machine's CPUs, for a
    #: plan explained before any runner started).
    cpus: int = 0
    cpus_source: str = ""
    #: Parquet row groups of the plan's scans, and how many the footers' min/max statistics
    #: ruled out against the scans' predicates (read by no task).
    row_groups: int = 0
    row_groups_pruned: int = 0
    #: What the small-query path decided (``small_query_bytes``): the line ``explain``
    #: shows, e.g. "small-query path: one task (estimated 1,000 rows / 8,000 bytes < ...)";
    #: empty when the setting is 0.
    small_query: str = ""

    @property
    def root(self) -> Stage:
        return self.stages[-1]

    def stage(self, stage_id: int) -> Stage:
        return self.stages[stage_id]

    def consumers(self, stage_id: int) -> list[Stage]:
        return [s for s in self.stages if any(stage_id in i.stages for i in s.inputs)]

    def explain(self) -> str:
        """Stages and exchanges as text, root first."""
        lines: list[str] = []
        if self.cpus:
            lines.append(f"Sized for {self.cpus} CPUs ({self.cpus_source})")
        if self.small_query:
            lines.append(self.small_query)
        if self.row_groups_pruned:
            lines.append(
                f"Parquet row groups: {self.row_groups - self.row_groups_pruned} of "
                f"{self.row_groups} read, {self.row_groups_pruned} pruned by statistics"
            )
        for st in reversed(self.stages):
            ins = ", ".join(
                f"stage{'s' if i.more else ''} {', '.join(map(str, i.stages))} ({i.mode})"
                for i in st.inputs
            )
            src = f"; scan of {len(st.scan_partitions)} partitions" if st.scan_partitions else ""
            lines.append(
                f"Stage {st.id} [{st.name}]: {st.num_tasks} task(s){src}"
                + (f"; inputs: {ins}" if ins else "")
            )
            lines.append(f"  output: {st.describe_output()}")

            def rec(n: PlanNode, depth: int) -> None:
                lines.append("  " * (depth + 2) + describe(n))
                for c in n.children():
                    rec(c, depth + 1)

            rec(st.fragment, 0)
        return "\n".join(lines)


def plan_physical(plan: PlanNode, config: object, cpus: int | None = None) -> PhysicalPlan:
    """Build the physical plan of ``plan`` (see :func:`shoal.planner.planner.build`), sized
    for ``cpus`` CPUs: the running cluster's, which the runner session reads per query so
    that an autoscaled cluster gets more partitions; None: the ``num_cpus`` setting, else
    this machine's CPU count."""
    from shoal.planner.planner import build

    return build(plan, config, cpus)  # type: ignore[arg-type]
