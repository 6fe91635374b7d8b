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

This module also holds what one task is given (its scan partition, its output spec) and the
form tables travel in between tasks (:func:`to_wire`): the physical plan's types, which the
kernel (``shoal.execution``) imports from here. It imports nothing of the planner's logic at
module level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from shoal.ir.explain import describe
from shoal.ir.expr import Expr
from shoal.ir.nodes import InMemorySource, PlanNode, Scan
from shoal.ir.types import Schema

if TYPE_CHECKING:
    import polars as pl

# ------------------------------------------------ what one task is given
# Where a task's scan rows come from and how it partitions its output. These small frozen
# records travel with every task (pickled by Ray); they hold no data except
# :class:`MemoryPiece`, whose table the Ray runner moves through the object store. The
# kernel (``shoal.execution``) imports them from here.


@dataclass(frozen=True)
class ParquetPiece:
    """Rows ``offset`` to ``offset + rows`` of one Parquet file (row-group aligned where
    the target partition size allows)."""

    path: str
    offset: int
    rows: int
    #: Columns stored with Arrow's Null type in this file (pyarrow writes an empty or
    #: all-null untyped column so) that the scan reads with another type: the kernel casts
    #: them, as Polars does for every file after the first.
    null_columns: tuple[str, ...] = ()
    #: Every row group of this file that the scan reads (those the footers' statistics did
    #: not rule out against the scan's predicate) is in this piece's partition: the kernel
    #: reads the file without a slice, and the scan's predicate, applied above, drops the
    #: rows of the row groups left out (none of them passes it).
    whole_file: bool = False


@dataclass(frozen=True)
class ScanPartition:
    """One partition of a Parquet scan: pieces read in order and concatenated."""

    pieces: tuple[ParquetPiece, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)


@dataclass(frozen=True)
class FilePartition:
    """One partition of a CSV, NDJSON or IPC scan: one whole file."""

    path: str


@dataclass(frozen=True, eq=False)
class MemoryPiece:
    """One partition of an in-memory scan: a row range of the source table, in the form
    tables travel between tasks (:func:`to_wire`; the kernel reads the scan's columns)."""

    table: pa.Table


def plain_memory_scan(node: PlanNode) -> bool:
    """Whether ``node`` is a scan of an in-memory table that only selects columns (no
    predicate): its partitions are row ranges of a table the driver holds
    (:class:`MemoryPiece`), and reading one costs nothing but moving it. An actor pool
    stage reads such a scan itself instead of a stage of scan tasks before it."""
    return (
        isinstance(node, Scan)
        and isinstance(node.source, InMemorySource)
        and node.predicate is None
    )


#: Name of the single column that carries the row count of a table without columns
#: between tasks (see :func:`to_wire`).
HEIGHT_COLUMN = "__shoal_height"


def to_wire(table: pa.Table) -> pa.Table:
    """``table`` in the form it travels between tasks and to the driver: unchanged when it
    has columns; a table without columns becomes one column ``HEIGHT_COLUMN`` of type
    null and the same number of rows (no buffers: zero bytes).

    A table of ``n`` rows and no columns (what a count after a filter reads once Polars has
    pruned every column) loses its rows on the way otherwise: pyarrow pickles a table as
    its columns (Ray's object store and the local worker processes pickle), and
    ``pyarrow.concat_tables`` counts rows by column; both give 0 rows. :func:`from_wire`
    undoes this."""
    if table.num_columns or not table.num_rows:
        return table
    return pa.table({HEIGHT_COLUMN: pa.nulls(table.num_rows)})


def from_wire(table: pa.Table) -> pa.Table:
    """The table :func:`to_wire` was given: a table whose only column is ``HEIGHT_COLUMN``
    of type null becomes a table of as many rows and no columns."""
    if (
        table.num_columns == 1
        and table.column_names[0] == HEIGHT_COLUMN
        and pa.types.is_null(table.schema.field(0).type)
    ):
        return table.select([])
    return table


@dataclass(frozen=True, eq=False)
class ScanSet:
    """What one task reads of a fragment with several scans: the one task of a
    small-query plan (every scan whole), or a task whose fragment computes a small
    broadcast join's build side itself (its own scan's partition, the build side's scans
    whole; ``broadcast_inline_bytes``).

    ``parts[i]`` is for the ``i``-th distinct :class:`~shoal.ir.nodes.Scan` node of the
    fragment in :func:`scans_of` order: one partition holding all of the scan's rows (a
    Parquet scan's pieces, already pruned by the footers' statistics; an in-memory table),
    or a tuple of whole files read in order and concatenated (CSV, NDJSON, IPC).
    ``partitioned[i]`` is true where ``parts[i]`` is instead one partition of its scan
    (read as the pieces say, never as whole files); empty: every part is whole.
    """

    parts: tuple[ScanPartition | MemoryPiece | FilePartition | tuple[FilePartition, ...], ...]
    partitioned: tuple[bool, ...] = ()

    def is_whole(self, i: int) -> bool:
        """Whether ``parts[i]`` holds all of its scan's rows (see ``partitioned``)."""
        return not (self.partitioned and self.partitioned[i])

    @property
    def rows(self) -> int:
        """Rows the task reads from Parquet and in-memory scans (files are not counted)."""
        total = 0
        for p in self.parts:
            if isinstance(p, ScanPartition):
                total += p.rows
            elif isinstance(p, MemoryPiece):
                total += p.table.num_rows
        return total


def scans_of(fragment: PlanNode) -> list[Scan]:
    """The distinct :class:`~shoal.ir.nodes.Scan` nodes of ``fragment`` (by identity: a
    sub-plan shared by two parents counts once), in depth-first order, root first. Pickling
    keeps shared nodes shared, so a task computes the same list as the planner did."""
    seen: set[int] = set()
    out: list[Scan] = []
    for node in fragment.walk():
        if isinstance(node, Scan) and id(node) not in seen:
            seen.add(id(node))
            out.append(node)
    return out


#: What a scan task reads: Parquet pieces, an in-memory row range, one whole file, or (the
#: small-query path) every scan of the fragment whole.
ScanInput = ScanPartition | MemoryPiece | FilePartition | ScanSet


@dataclass(frozen=True)
class SingleOutput:
    """The task returns its result as one table."""

    sample_by: tuple[Expr, ...] = ()
    sample_rows: int = 0

    @property
    def num_outputs(self) -> int:
        return 1


@dataclass(frozen=True)
class HashOutput:
    """The task splits its result into ``n`` tables by hash of ``keys`` (same value, same
    table, on every task of the query: Polars' seeded hash, stable within one version)."""

    keys: tuple[Expr, ...]
    n: int

    @property
    def num_outputs(self) -> int:
        return self.n


@dataclass(frozen=True, eq=False)
class RangeOutput:
    """The task splits its result into ``n`` tables by the sort order of ``by``.

    ``boundaries`` holds ``n - 1`` rows of sort keys (columns ``__k0``, ``__k1``, ...),
    chosen by the runner from samples once the upstream stage is done (None until then).
    Table ``i`` holds the rows that sort after boundary ``i - 1`` and not after boundary
    ``i``, so concatenating the tables in order, each sorted, gives a sorted whole.
    """

    by: tuple[Expr, ...]
    descending: tuple[bool, ...]
    nulls_last: tuple[bool, ...]
    n: int
    boundaries: pa.Table | None = None

    @property
    def num_outputs(self) -> int:
        return self.n


OutputSpec = SingleOutput | HashOutput | RangeOutput


# ------------------------------------------------ stages

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


@dataclass(frozen=True)
class NativeQuery:
    """The query as its frontend holds it, which the frontend's own engine can run in this
    process (the ``small_query_native`` setting): ``run()`` computes the whole result as a
    ``polars.DataFrame`` with the plan's columns and types, raising what the frontend's
    engine raises; ``engine`` names that engine for ``explain`` and the query report (e.g.
    "Polars' streaming engine"). Given to :func:`shoal.api.execute` by a frontend (the
    Polars adapter's ``collect``); the session sets it on the one stage of a small query
    that runs in this process (:attr:`Stage.native`), whose task then calls ``run``
    instead of lowering its fragment."""

    run: Callable[[], pl.DataFrame]
    engine: str


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
    #: Why no task of the stage may be split into subtasks (:mod:`shoal.runners.skew`):
    #: an operator of its fragment needs every row of its bucket; empty: no such operator.
    whole_buckets: str = ""
    #: The frontend's own query, run by its task instead of the lowered fragment (a small
    #: query's one stage run in this process: ``small_query_native``); None: lowered.
    native: NativeQuery | None = None

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
    #: Whether the Ray runner runs this plan's small-query task(s) in the driver process
    #: instead of as Ray tasks (``small_query_where``; every stage is a small-query stage).
    small_query_in_driver: bool = False
    #: A plan of several queries (:func:`shoal.planner.planner.build_many`): the stage
    #: whose outputs are each query's result, in the queries' order (a stage may be the
    #: result of several, and also be read by other stages). Empty: one query, whose
    #: result is the root's.
    results: tuple[int, ...] = ()

    @property
    def root(self) -> Stage:
        return self.stages[-1]

    @property
    def result_stages(self) -> tuple[int, ...]:
        """The ids of the stages whose outputs are handed to the caller (each once): the
        root's, or every query's of a plan of several (:attr:`results`)."""
        return tuple(dict.fromkeys(self.results)) if self.results else (self.root.id,)

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
        if self.results:
            lines.append(
                "Results: " + ", ".join(f"query {i}: stage {s}" for i, s in enumerate(self.results))
            )
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


def plan_physical_many(
    plans: list[PlanNode], config: object, cpus: int | None = None
) -> PhysicalPlan:
    """One physical plan for several queries, sub-plans they share computed once (see
    :func:`shoal.planner.planner.build_many`); sized as :func:`plan_physical`."""
    from shoal.planner.planner import build_many

    return build_many(plans, config, cpus)  # type: ignore[arg-type]
