"""IR plan -> physical plan.

The planner walks the IR bottom-up, growing an *open fragment* (operators that need no
data exchange: scans, filters, projections) and cutting a stage wherever an operator needs
rows from other partitions:

* aggregation: two-phase (partial per partition, hash exchange on the keys, final) where
  every aggregate splits exactly (:mod:`shoal.planner.aggregate`); otherwise a hash
  exchange of the input rows and one full aggregation per partition; without keys, a
  gather to one task;
* join: two Parquet scans stored in the order of the join key are joined partition by
  partition, each task reading the other side's row groups that can match its own
  (:mod:`shoal.planner.aligned`); otherwise broadcast the smaller side when its estimated
  size is at most ``broadcast_join_threshold_bytes`` (computed inside each task of the
  other side when it is a few small file scans), otherwise hash-partition both sides on
  their keys;
* sort: sample the sort keys, range exchange with boundaries chosen from the sample, then
  a local sort per range; a sort followed by a slice is a top-k per partition, gathered
  and cut again;
* slice: pushed into each partition, applied again after the gather;
* temporal and ordered operators (as-of join, dynamic and rolling group-by, merge of
  sorted inputs): see :mod:`shoal.planner.temporal`;
* anything else that needs all rows runs after a gather to one task;
* sink: each task writes its own partition's files (one file: after a gather);
* a user function (:class:`~shoal.ir.nodes.UdfProject`) runs in place when it is a
  stateless CPU function, else on an actor pool stage of its own (see ``udf_project``).

A fragment that already has a single partition takes every operator in place.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import polars as pl

from shoal.config import Config
from shoal.errors import UnsupportedError
from shoal.ir.expr import Cast, Col, Expr, NamedExpr
from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Explode,
    FileSource,
    Filter,
    HConcat,
    InMemorySource,
    Join,
    ParquetSource,
    PlanNode,
    Project,
    RowIndex,
    Scan,
    Sink,
    Slice,
    Sort,
    SqlMap,
    StageInput,
    UdfProject,
    Union,
    Unnest,
    Unpivot,
    shared_nodes,
)
from shoal.ir.types import DataType, Schema
from shoal.planner import aggregate as agg2
from shoal.planner import prefix, windows
from shoal.planner.aligned import aligned_join, origin, task_scans
from shoal.planner.context import OpenFragment as _Open
from shoal.planner.copartition import co_located
from shoal.planner.keyfilter import aggregate_side, reduced_input
from shoal.planner.keyreduce import anti_by_keys
from shoal.planner.partitioning import ScanSplit, split_scan, whole_split
from shoal.planner.physical import (
    FilePartition,
    HashOutput,
    MemoryPiece,
    OutputSpec,
    PhysicalPlan,
    RangeOutput,
    ScanInput,
    ScanPartition,
    ScanSet,
    SingleOutput,
    Stage,
    StageInputSpec,
    plain_memory_scan,
    scans_of,
    to_wire,
)
from shoal.planner.ranges import disjoint_columns
from shoal.planner.reassociate import pushdowns, scan_only
from shoal.planner.shared import inline_shared_stages
from shoal.planner.temporal import TEMPORAL_NODES, plan_temporal

#: A semi join broadcasts its (small) left side to the right side's partitions when
#: broadcasting the right side to the left's would move this many times more bytes.
SEMI_BY_PROBE_FACTOR = 2
#: Columns of a left row's identity in a semi join by the right side's partitions.
_SEMI_ROW = "__shoal_semi_row"
_SEMI_PART = "__shoal_semi_part"

#: Fraction of rows a filter is assumed to keep when estimating sizes for the broadcast
#: decision (no column statistics yet; DuckDB's optimizer uses the same default).
FILTER_SELECTIVITY = 0.2


def scan_selectivity(split: ScanSplit) -> float:
    """Fraction of a filtered scan's rows estimated to pass its predicate: what the
    Parquet footers' min/max statistics say of its ``col <op> literal`` terms
    (:attr:`ScanSplit.selectivity`), times :data:`FILTER_SELECTIVITY` when some terms (or
    all) are beyond the statistics (column against column, ``is_in``, string functions)."""
    known = 1.0 if split.selectivity is None else split.selectivity
    unknown = split.unestimated or split.selectivity is None
    return known * (FILTER_SELECTIVITY if unknown else 1.0)


class _Builder:
    def __init__(
        self, config: Config, shared: set[int] | None = None, cpus: int | None = None
    ) -> None:
        self.config = config
        self.plan = PhysicalPlan()
        self.shared = shared or set()
        self.memo: dict[int, Stage] = {}
        #: Whether a shared scan that filters (a predicate pushed into it) is computed once
        #: and read by each use, as other shared sub-plans are (:func:`build_many`); off,
        #: each use reads the scan again.
        self.cache_filtered_scans = False
        if cpus:
            self.plan.cpus_source = "cluster"
        elif config.num_cpus:
            self.plan.cpus_source = "setting num_cpus"
        else:
            self.plan.cpus_source = "driver's CPUs; a query reads the cluster's"
        self.cpus = int(cpus or config.num_cpus or os.cpu_count() or 1)
        self.plan.cpus = self.cpus
        self.max_shuffle = max(2, 4 * self.cpus)
        #: Scan splits by the id of the scan node.
        self.splits: dict[int, ScanSplit] = {}
        #: Hash-window plans by the id of their open fragment (``windows.HashWindow``).
        self.hash_windows: dict[int, windows.HashWindow] = {}
        #: Whether some aggregation of the plan groups by keys: then the scans' partitions
        #: are checked for columns held in disjoint ranges
        #: (:func:`shoal.planner.ranges.disjoint_columns`). Set by :func:`build`.
        self.grouped = False
        #: The hashed column sets of each shared sub-plan's stage (read pointwise: the same
        #: partitions), by the id of its node.
        self.memo_hashed: dict[int, tuple[tuple[str, ...], ...]] = {}
        #: Joins planned before the plan that holds them is visited (the node and its
        #: plan), by the id of the join node (:meth:`_moved_down`).
        self.planned: dict[int, tuple[Join, _Open]] = {}
        #: Above 0 while a sub-plan is planned to try it (:meth:`_trial`).
        self.trying = 0

    def split(self, node: Scan) -> ScanSplit:
        """The partitions of scan ``node`` (footers are read once per scan and plan)."""
        got = self.splits.get(id(node))
        if got is None:
            got = self.splits[id(node)] = split_scan(
                node,
                self.config.target_partition_bytes,
                self.config.default_partitions,
                self.cpus,  # one task per CPU at least: see partitioning.partition_count
                self.cpus,
            )
        return got

    def resplit(self, node: Scan, n: int) -> tuple[ScanInput, ...]:
        """Scan ``node`` cut into about ``n`` partitions (finer than :meth:`split`, for
        an aligned join's kept side; see :mod:`shoal.planner.aligned`)."""
        est = self.split(node).est_bytes
        return split_scan(node, max(1, est // max(1, n)), 0, n, self.cpus).partitions

    # -- the small-query path -----------------------------------------------------------

    def small_query(self, plan: PlanNode) -> bool:
        """Plan ``plan`` as one stage of one task that runs the whole plan, when its scans
        are small (the ``small_query_bytes`` setting); return whether it did. Records the
        decision in ``self.plan.small_query`` for ``explain``.

        The estimate is the scans' sizes before filters: Arrow bytes and rows from the
        Parquet footers (row groups pruned by statistics left out), in-memory tables'
        sizes, CSV/NDJSON/IPC files' sizes. The path is off when the setting is 0, when
        ``default_partitions`` or ``shuffle_partitions`` asks for partitions, and for a
        stateful or GPU user function (which runs on an actor pool stage). One task gives
        the same answer as the distributed plan: every operator runs as Polars runs it on
        the whole input, which is what each distributed strategy reproduces.
        """
        limit = self.config.small_query_bytes
        if not limit:
            return False
        scans = scans_of(plan)
        # A Parquet scan read whole when the query is small: its row groups, not cut into
        # partitions (the partitions, when it is not, are cut when it is visited).
        splits = [
            whole_split(s) if isinstance(s.source, ParquetSource) else self.split(s) for s in scans
        ]
        rows = sum(s.est_rows for s in splits)
        nbytes = sum(s.est_bytes for s in splits)
        est = f"estimated {rows:,} rows / {nbytes:,} bytes"
        cap = min(limit, self.config.target_partition_bytes)
        blocker = _small_query_blocker(plan, self.config)
        if blocker is None and nbytes >= cap:
            blocker = f"{est} >= threshold {cap:,}"
        if blocker is not None:
            self.plan.small_query = f"small-query path: not taken ({blocker})"
            return False
        self.plan.small_query = f"small-query path: one task ({est} < threshold {cap:,})"
        for sp in splits:
            self.plan.row_groups += sp.row_groups
            self.plan.row_groups_pruned += sp.row_groups_pruned
        parts = ScanSet(tuple(_whole_scan(s, sp) for s, sp in zip(scans, splits, strict=True)))
        self.plan.stages.append(
            Stage(
                id=len(self.plan.stages),
                name="small-query",
                fragment=plan,
                inputs=(),
                output=SingleOutput(),
                num_tasks=1,
                scan_partitions=(parts,) if scans else None,
                est_bytes=nbytes,
            )
        )
        return True

    # -- stages -----------------------------------------------------------------------

    def cut(
        self,
        op: _Open,
        output: OutputSpec,
        name: str | None = None,
        boundaries_from: int | None = None,
    ) -> Stage:
        st = Stage(
            id=len(self.plan.stages),
            name=name or op.name,
            fragment=op.node,
            inputs=tuple(op.inputs),
            output=output,
            num_tasks=op.num_tasks,
            scan_partitions=op.scan_partitions,
            boundaries_from=boundaries_from,
            est_bytes=op.est_bytes,
            whole_buckets=op.whole_buckets,
        )
        self.plan.stages.append(st)
        return st

    def read(self, st: Stage, mode: str, num_tasks: int, name: str) -> _Open:
        spec = StageInputSpec(st.id, mode, st.fragment.schema)  # type: ignore[arg-type]
        return _Open(
            StageInput(0, st.fragment.schema), num_tasks, [spec], est_bytes=st.est_bytes, name=name
        )

    def gather(self, op: _Open, name: str) -> _Open:
        """All rows in one task, in partition order."""
        if op.num_tasks == 1:
            return op
        st = self.cut(op, SingleOutput())
        return self.read(st, "all", 1, name)

    def shuffle_n(self, *ops: _Open) -> int:
        if self.config.shuffle_partitions:
            return self.config.shuffle_partitions
        return max(1, min(self.max_shuffle, max(o.num_tasks for o in ops)))

    # -- nodes ------------------------------------------------------------------------

    def visit(self, node: PlanNode) -> _Open:
        if id(node) in self.shared and (
            not isinstance(node, Scan) or (self.cache_filtered_scans and node.predicate is not None)
        ):
            # A sub-plan used more than once (Polars' Cache): computed once, read by each use.
            st = self.memo.get(id(node))
            if st is None:
                op = self._visit(node)
                st = self.memo[id(node)] = self.cut(op, SingleOutput(), name=f"{op.name}+cache")
                self.memo_hashed[id(node)] = op.hashed
            out = self.read(st, "pointwise", st.num_tasks, "cached")
            out.hashed = self.memo_hashed.get(id(node), ())  # the same partitions
            return out
        return self._visit(node)

    def _visit(self, node: PlanNode) -> _Open:
        if isinstance(node, Scan):
            split = self.split(node)
            self.plan.row_groups += split.row_groups
            self.plan.row_groups_pruned += split.row_groups_pruned
            est = split.est_bytes
            if node.predicate is not None:
                est = int(est * scan_selectivity(split))
            op = _Open(
                node,
                len(split.partitions),
                scan_partitions=split.partitions,
                est_bytes=est,
                name="scan",
            )
            if self.grouped and op.num_tasks > 1:
                # Columns whose values each partition holds in a range of its own (sorted
                # data, from the footers): partitioned as by a hash exchange on them.
                found = disjoint_columns(node, split.partitions, node.schema.names)
                op.hashed = tuple((c,) for c in found)
            return op
        if isinstance(node, Filter):
            op = self.visit(node.input)
            if not node.predicate.is_row_local():
                windowed = self.hash_window(op, node)
                if windowed is not None:
                    return windowed
                op = self.gather(op, "gather")
            op.est_bytes = int(op.est_bytes * FILTER_SELECTIVITY)
            return op.wrap(Filter(op.node, node.predicate, node.schema))
        if isinstance(node, Project):
            return self.project(node)
        if isinstance(node, Aggregate):
            return self.aggregate(node)
        if isinstance(node, Join):
            return self.join(node)
        if isinstance(node, Sort):
            return self.sort(node)
        if isinstance(node, Slice):
            return self.slice(node)
        if isinstance(node, Distinct):
            return self.distinct(node)
        if isinstance(node, Union):
            return self.union(node)
        if isinstance(node, HConcat):
            ops = [self.gather(self.visit(i), "gather") for i in node.inputs]
            return self.combine_single(ops, lambda kids: node.with_children(tuple(kids)), "hconcat")
        if isinstance(node, Explode | Unnest | SqlMap):
            # Row-wise (a SqlMap's SQL is, by its contract): in the input's stage.
            op = self.visit(node.input)
            return op.wrap(node.with_children((op.node,)))
        if isinstance(node, RowIndex):
            return self.row_index(node)
        if isinstance(node, Unpivot):
            # Polars defines the output order of these by the input order: one partition.
            op = self.gather(self.visit(node.input), "gather")
            return op.wrap(node.with_children((op.node,)))
        if isinstance(node, UdfProject):
            return self.udf_project(node)
        if isinstance(node, TEMPORAL_NODES):
            return plan_temporal(self, node)
        if isinstance(node, Sink):
            return self.sink(node)
        raise UnsupportedError(f"the planner cannot place plan node {node.label}")

    def udf_project(self, node: UdfProject) -> _Open:
        """A user function. A stateless CPU function runs in place, in ordinary tasks. A
        stateful or GPU one gets an actor pool stage of its own: its fragment is only the
        :class:`UdfProject` over the upstream stage's output, read pointwise (same
        partitions, same order), so that nothing else runs on the pool's actors; what
        follows reads the pool stage pointwise, in ordinary tasks again.

        One exception: over a scan of an in-memory table that only selects columns (no
        predicate), the pool stage reads its scan partitions itself (fragment
        ``UdfProject(Scan)``): the partitions are row ranges of a table the driver already
        holds, so a stage of scan tasks would only add a task and a copy of the rows per
        partition (see ``actor_pool.pool_udf``)."""
        op = self.visit(node.input)
        if not getattr(node.udf, "needs_actor_pool", False):
            return op.wrap(node.with_children((op.node,)))
        if plain_memory_scan(op.node) and not op.inputs:
            op.name = f"actor-pool[{node.udf_name}]"
            st = self.cut(op.wrap(node.with_children((op.node,))), SingleOutput())
            return self.read(st, "pointwise", st.num_tasks, "after-udf")
        if (
            isinstance(op.node, StageInput)
            and op.scan_partitions is None
            and len(op.inputs) == 1
            and op.inputs[0].mode == "pointwise"
        ):
            up = self.plan.stage(op.inputs[0].stage)  # already a stage's output: read it
        else:
            up = self.cut(op, SingleOutput())
        pool = self.read(up, "pointwise", up.num_tasks, f"actor-pool[{node.udf_name}]")
        pool.wrap(node.with_children((pool.node,)))
        st = self.cut(pool, SingleOutput())
        return self.read(st, "pointwise", st.num_tasks, "after-udf")

    def sink(self, node: Sink) -> _Open:
        """Each task writes its own partition's files (see ``shoal.execution.sink``): a
        single file after a gather to one task (rows in order); a directory of numbered
        files in place, pointwise on the input's partitions; a hive layout after a hash
        exchange on the key columns, so that every key's rows (in order) meet in one task,
        which writes that key's directory alone."""
        op = self.visit(node.input)
        if node.layout == "file":
            op = self.gather(op, "sink")
        elif node.layout == "hive" and op.num_tasks > 1:
            keys = tuple(Col(c, node.input.schema[c]) for c in node.partition_by)
            n = self.shuffle_n(op)
            st = self.cut(op, HashOutput(keys, n), name=f"{op.name}+shuffle")
            op = self.read(st, "bucket", n, "sink")
        else:
            op.name = f"{op.name}+sink"
        return op.wrap(node.with_children((op.node,)))

    def project(self, node: Project) -> _Open:
        op = self.visit(node.input)
        with_agg = [e.expr.has_agg() for e in node.exprs]
        reads_cols = any(e.expr.columns() for e in node.exprs)
        if op.num_tasks == 1:
            return op.wrap(replace(node, input=op.node))
        if (
            not node.keep_height
            and any(with_agg)
            and all(with_agg[i] or not e.expr.columns() for i, e in enumerate(node.exprs))
            and not any(e.expr.sized_outside_aggs() for e in node.exprs)
        ):
            # select(sum(a), ...): a global aggregation.
            agg = Aggregate(node.input, (), node.exprs, False, node.schema)
            return self.aggregate(agg, planned=op)
        # A projection of scalars alone is one row (not one per partition), unless it keeps
        # its input's height: then each partition broadcasts them to its own rows.
        if not all(e.expr.is_row_local() for e in node.exprs) or not (
            reads_cols or node.keep_height
        ):
            windowed = self.hash_window(op, node) if reads_cols else None
            if windowed is not None:
                return windowed
            op = self.gather(op, "gather")
        return op.wrap(replace(node, input=op.node))

    def row_index(self, node: RowIndex) -> _Open:
        """``with_row_index``: in place on one partition, else by prefix offsets
        (:mod:`shoal.planner.prefix`), without a gather."""
        op = self.visit(node.input)
        if op.num_tasks == 1:
            return op.wrap(node.with_children((op.node,)))
        return prefix.plan_row_index(self, op, node)

    def hash_window(self, op: _Open, node: Project | Filter) -> _Open | None:
        """``over(partition_by)`` windows per hash bucket (:mod:`shoal.planner.windows`), or
        cumulative functions by prefix carries (:mod:`shoal.planner.prefix`), instead of a
        gather, where exact; None when the node must gather."""
        if op.num_tasks == 1:
            return None
        planned = windows.plan_hash_window(self, op, node)
        return planned if planned is not None else prefix.plan_cumulative(self, op, node)

    def aggregate(self, node: Aggregate, planned: _Open | None = None) -> _Open:
        op = planned if planned is not None else self.visit(node.input)
        if not all(k.expr.is_row_local() for k in node.keys):
            # A key like rank(a) depends on all rows: evaluated on one partition.
            op = self.gather(op, "gather")
        if op.num_tasks == 1:
            return op.wrap(
                Aggregate(op.node, node.keys, node.aggs, node.maintain_order, node.schema)
            )
        if not node.maintain_order and _co_located(op.hashed, node.keys):
            # Every group's rows are in one partition already (an earlier hash exchange on
            # a subset of the keys): the aggregation completes in place, with no exchange.
            op.whole_buckets = "an aggregation completes in place on each bucket"
            return op.wrap(
                Aggregate(op.node, node.keys, node.aggs, node.maintain_order, node.schema)
            )
        key_cols = tuple(NamedExpr(k.name, Col(k.name, k.dtype)) for k in node.keys)
        if agg2.can_split(node.aggs):
            tp = agg2.split(node.keys, node.aggs)
            partial_schema = Schema.of(
                [(k.name, k.dtype) for k in node.keys] + [(p.name, p.dtype) for p in tp.partial]
            )
            final_schema = Schema.of(
                [(k.name, k.dtype) for k in node.keys] + [(f.name, f.dtype) for f in tp.final]
            )
            op.wrap(Aggregate(op.node, node.keys, tp.partial, node.maintain_order, partial_schema))
            if node.keys and not node.maintain_order:
                n = self.shuffle_n(op)
                st = self.cut(
                    op,
                    HashOutput(tuple(k.expr for k in key_cols), n),
                    name=f"{op.name}+partial-agg",
                )
                final = self.read(st, "bucket", n, "final-agg")
                final.hashed = (tuple(k.name for k in key_cols),)
            else:
                st = self.cut(op, SingleOutput(), name=f"{op.name}+partial-agg")
                final = self.read(st, "all", 1, "final-agg")
            final.wrap(Aggregate(final.node, key_cols, tp.final, node.maintain_order, final_schema))
            return final.wrap(Project(final.node, tp.project, node.schema))
        if node.keys and not node.maintain_order:
            n = self.shuffle_n(op)
            st = self.cut(op, HashOutput(tuple(k.expr for k in node.keys), n))
            final = self.read(st, "bucket", n, "agg")
            final.hashed = _column_set(tuple(k.expr for k in node.keys))
        else:
            final = self.gather(op, "agg")
        return final.wrap(
            Aggregate(final.node, node.keys, node.aggs, node.maintain_order, node.schema)
        )

    def join(self, node: Join) -> _Open:
        planned = self.planned.get(id(node))
        if planned is not None and planned[0] is node:  # a join moved down: _moved_down
            op = planned[1]
            return replace(op, inputs=list(op.inputs))  # a copy: grown in place
        sides = aggregate_side(node) if self.config.aggregate_key_filter else []
        if sides:
            # Planned as written first: a join that runs in place (co-located, aligned)
            # moves nothing and is kept, as is one whose other side is too big to
            # broadcast (no join is moved down into an aggregation: see _moves). Else the
            # aggregation's input is reduced to the other side's keys first.
            saved = self._checkpoint()
            left, right = self.visit(node.left), self.visit(node.right)
            before = len(self.plan.stages)
            out = self._join(node, left, right)
            small = [right if is_left else left for is_left, *_ in sides]
            if len(self.plan.stages) == before or not any(map(self._broadcastable, small)):
                return out
            self._rollback(saved)
            reduced = self._key_filtered_aggregate(node)
            if reduced is not None:
                return reduced
        moves = self._moves(node) if self.config.aligned_joins and not self.trying else []
        if not moves:
            return self._join(node, self.visit(node.left), self.visit(node.right))
        saved = self._checkpoint()
        with self._trial():
            left, right = self.visit(node.left), self.visit(node.right)
            before = len(self.plan.stages)
            out = self._join(node, left, right)
        if len(self.plan.stages) == before or out.name != "hash-join":
            # Joined in place, with no exchange; or with a broadcast, which moving down
            # may trade for a larger one (TPC-H Q10 at scale 1: the customer table
            # broadcast, instead of its 57,000-row join with orders, was no faster).
            return out
        self._rollback(saved)
        moved = self._moved_down(moves)
        if moved is not None:
            return moved
        return self._join(node, self.visit(node.left), self.visit(node.right))

    def _key_filtered_aggregate(self, node: Join) -> _Open | None:
        """Inner join ``node`` of an aggregation on group keys with a side small enough to
        broadcast, planned with the aggregation's input reduced first to the rows whose
        keys that side has (:mod:`shoal.planner.keyfilter`); None where it does not apply
        (the small side's planning undone)."""
        for is_left, projections, agg, keys in aggregate_side(node):
            if any(id(n) in self.shared for n in (*projections, agg)):
                continue
            other, other_on = (node.right, node.right_on) if is_left else (node.left, node.left_on)
            saved = self._checkpoint()
            small = self.visit(other)
            if not self._broadcastable(small):
                self._rollback(saved)
                continue
            st = self.cut(small, SingleOutput(), name=f"{small.name}+broadcast")
            x = self.visit(agg.input)
            x.inputs.append(StageInputSpec(st.id, "all", st.fragment.schema))
            x.wrap(
                reduced_input(
                    x.node,
                    keys,
                    StageInput(len(x.inputs) - 1, st.fragment.schema),
                    other_on,
                    node.nulls_equal,
                )
            )
            x.name = f"{x.name}+key-filter"
            out = self.aggregate(agg, planned=x)
            for p in reversed(projections):
                out.wrap(replace(p, input=out.node))
            out.inputs.append(StageInputSpec(st.id, "all", st.fragment.schema))
            read = StageInput(len(out.inputs) - 1, st.fragment.schema)
            left, right = (out.node, read) if is_left else (read, out.node)
            out.est_bytes += small.est_bytes
            out.name = f"{out.name}+broadcast-join"
            return out.wrap(replace(node, left=left, right=right))
        return None

    def _broadcastable(self, op: _Open) -> bool:
        """Whether ``op`` may be broadcast to a join's other side: one partition, or an
        estimate within ``broadcast_join_threshold_bytes``."""
        threshold = self.config.broadcast_join_threshold_bytes
        return op.num_tasks == 1 or bool(threshold and op.est_bytes <= threshold)

    @contextlib.contextmanager
    def _trial(self) -> Iterator[None]:
        """Plan a sub-plan to try it (:meth:`join`): the joins inside it are planned where
        they are, none moved down (trying those too would try every sub-plan once per
        join above it)."""
        self.trying += 1
        try:
            yield
        finally:
            self.trying -= 1

    def _moves(self, node: Join) -> list[tuple[Join, PlanNode]]:
        """Where the join ``node`` = ``L ⋈ Z`` may be moved down into ``L``
        (:func:`~shoal.planner.reassociate.pushdowns`), kept only where ``Z`` is a scan
        (row-local filters and projections above it) that no other part of the plan
        shares and some key pair of the moved join is two Parquet scan columns."""
        z = node.right
        if not scan_only(z) or any(id(n) in self.shared for n in z.walk()):
            return []
        moves = [m for m in pushdowns(node) if _keys_from_parquet(m[0])]
        if moves:
            counted = (self.plan.row_groups, self.plan.row_groups_pruned)
            one = self.visit(z).num_tasks < 2  # (a scan: plans no stage)
            self.plan.row_groups, self.plan.row_groups_pruned = counted
            if one:
                return []  # an aligned join keeps the side of more partitions
        return moves

    def _moved_down(self, moves: list[tuple[Join, PlanNode]]) -> _Open | None:
        """A join that the plan as written joins by shuffling both sides, planned at the
        shallowest of ``moves`` (``(inner, rewritten)``: :func:`_moves`) where its inner
        join is an aligned join (:mod:`shoal.planner.reassociate`); None where none is.
        Each place is tried by planning its join: what that planned (stages cut, row
        groups counted) is undone when it does not align."""
        for inner, rewritten in moves:
            saved = self._checkpoint()
            with self._trial():
                aligned = aligned_join(
                    inner,
                    self.visit(inner.left),
                    self.visit(inner.right),
                    self.config.target_partition_bytes,
                    self.resplit,
                )
            if aligned is None:
                self._rollback(saved)
                continue
            aligned.name = f"{aligned.name}+reordered"
            self.planned[id(inner)] = (inner, aligned)  # the node kept: its id not reused
            return self.visit(rewritten)
        return None

    def _checkpoint(self) -> tuple[Any, ...]:
        """What planning a sub-plan may change in this builder (see :meth:`_rollback`)."""
        p = self.plan
        return (
            len(p.stages),
            p.row_groups,
            p.row_groups_pruned,
            dict(self.memo),
            dict(self.memo_hashed),
            dict(self.hash_windows),
            dict(self.planned),
        )

    def _rollback(self, saved: tuple[Any, ...]) -> None:
        """Forget what was planned since :meth:`_checkpoint` gave ``saved``."""
        n, self.plan.row_groups, self.plan.row_groups_pruned, *maps = saved
        del self.plan.stages[n:]
        self.memo, self.memo_hashed, self.hash_windows, self.planned = maps

    def _join(self, node: Join, left: _Open, right: _Open) -> _Open:
        """``node`` planned over its sides ``left`` and ``right``, planned already."""
        if node.maintain_order != "none":
            return self._ordered_join(node, left, right)
        in_place = co_located(node, left, right)
        if in_place is not None:
            return in_place
        threshold = self.config.broadcast_join_threshold_bytes
        # Which side may be broadcast: the other side's rows must each meet the whole of it.
        can_right = node.how in ("inner", "left", "semi", "anti", "cross")
        can_left = node.how in ("inner", "right", "cross")
        if left.num_tasks == 1 and right.num_tasks == 1:
            return self._broadcast(node, probe=left, build=right, build_is_right=True)
        if self.config.aligned_joins:
            aligned = aligned_join(
                node, left, right, self.config.target_partition_bytes, self.resplit
            )
            if aligned is not None:
                return aligned
        if (
            node.how == "semi"
            and threshold
            and left.est_bytes <= threshold
            and right.num_tasks > 1
            and left.num_tasks * right.est_bytes
            > SEMI_BY_PROBE_FACTOR * right.num_tasks * left.est_bytes
            # One left task reading the right side whole is a gather: as good and a stage
            # fewer, unless the right side is too big to gather.
            and (left.num_tasks > 1 or right.est_bytes > threshold)
        ):
            return self._semi_by_probe(node, left, right)
        reduced = anti_by_keys(self, node, left, right)
        if reduced is not None:
            return reduced
        candidates = []
        if can_right and (node.how == "cross" or self._broadcastable(right)):
            candidates.append((right.est_bytes, True))
        if can_left and (node.how == "cross" or self._broadcastable(left)):
            candidates.append((left.est_bytes, False))
        if candidates:
            _, build_right = min(candidates)
            if len(candidates) == 2:
                # A build side computed inside the other side's tasks saves a stage: it
                # wins over a smaller build that needs a stage of its own.
                inline_right = self._can_inline(left, right)
                if inline_right != self._can_inline(right, left):
                    build_right = inline_right
            if build_right:
                return self._broadcast(node, probe=left, build=right, build_is_right=True)
            return self._broadcast(node, probe=right, build=left, build_is_right=False)
        n = self.shuffle_n(left, right)
        lkeys, rkeys = _hash_keys(node.left_on, node.right_on)
        ls = self.cut(left, HashOutput(lkeys, n), name=f"{left.name}+shuffle")
        rs = self.cut(right, HashOutput(rkeys, n), name=f"{right.name}+shuffle")
        specs = [
            StageInputSpec(ls.id, "bucket", ls.fragment.schema),
            StageInputSpec(rs.id, "bucket", rs.fragment.schema),
        ]
        joined = replace(
            node, left=StageInput(0, ls.fragment.schema), right=StageInput(1, rs.fragment.schema)
        )
        out = _Open(joined, n, specs, est_bytes=left.est_bytes + right.est_bytes, name="hash-join")
        out.hashed = _join_hashed(node)
        return out

    def _semi_by_probe(self, node: Join, left: _Open, right: _Open) -> _Open:
        """A semi join of a small left side with a large right side: the left side is
        broadcast to the right side's partitions instead of the right side to the left's
        (or both shuffled). Each left row gets an identity, (its task, its index in the
        task); each right partition keeps the left rows that have a match in it; one task
        then keeps each identity once, in the left side's order, and drops it. A left row
        is in the output exactly when some right partition matched it, as the semi join
        says; duplicate left rows keep their own identities, so they stay duplicated."""
        idx = DataType.from_polars(pl.get_index_type())
        indexed = Schema.of([(_SEMI_ROW, idx), *left.node.schema.items()])
        left.wrap(RowIndex(left.node, _SEMI_ROW, 0, indexed))
        rows = self.cut(left, SingleOutput(), name=f"{left.name}+broadcast")
        tagged = Schema.of([*indexed.items(), (_SEMI_PART, DataType.from_polars(pl.UInt32))])
        k = len(right.inputs)
        right.inputs.append(StageInputSpec(rows.id, "all", tagged))
        small = StageInput(k, tagged, source_column=_SEMI_PART)
        right.wrap(replace(node, left=small, right=right.node, schema=tagged))
        right.name = f"{right.name}+semi-join"
        matched = self.cut(right, SingleOutput())
        out = self.read(matched, "all", 1, "semi-join")
        ident = (_SEMI_PART, _SEMI_ROW)
        out.wrap(Distinct(out.node, ident, "any", False, tagged))
        order = tuple(Col(c, tagged[c]) for c in ident)
        out.wrap(Sort(out.node, order, (False, False), (False, False), False, tagged))
        keep = tuple(NamedExpr(c, Col(c, t)) for c, t in node.schema.items())
        out.est_bytes = left.est_bytes
        return out.wrap(Project(out.node, keep, node.schema))

    def _ordered_join(self, node: Join, left: _Open, right: _Open) -> _Open:
        """A join whose output order Polars defines (``maintain_order``): the side whose
        order leads is the probe side, in its partitions, and the other side is broadcast
        whole (in its order), so that the concatenated partitions are in Polars' order.
        Where the other side may not be broadcast (a full join, or a left join ordered by
        its right side), both sides are gathered into one task."""
        leads_left = node.maintain_order.startswith("left")
        if leads_left and node.how in ("inner", "left", "semi", "anti", "cross"):
            return self._broadcast(node, probe=left, build=right, build_is_right=True)
        if not leads_left and node.how in ("inner", "right"):
            return self._broadcast(node, probe=right, build=left, build_is_right=False)
        left = self.gather(left, "ordered-join")
        return self._broadcast(
            node, probe=left, build=self.gather(right, "gather"), build_is_right=True
        )

    def distinct(self, node: Distinct) -> _Open:
        op = self.visit(node.input)
        if op.num_tasks == 1:
            return op.wrap(node.with_children((op.node,)))
        names = node.subset if node.subset is not None else node.schema.names
        if node.maintain_order or not names:
            # (A frame of no columns has no key to hash: one task.)
            # Per-partition dedupe keeps each partition's first (last) rows in order; the
            # gather keeps partition order, so a final dedupe is exact. "none" cannot
            # pre-dedupe: a row duplicated across partitions must go.
            if node.keep != "none":
                op.wrap(Distinct(op.node, node.subset, node.keep, True, node.schema))
            g = self.gather(op, "distinct")
            return g.wrap(Distinct(g.node, node.subset, node.keep, True, node.schema))
        # The hash exchange keeps the input order of rows within each partition (tasks'
        # outputs are read in partition order), so keep first/last stays exact.
        if node.keep != "none":
            op.wrap(Distinct(op.node, node.subset, node.keep, False, node.schema))
        keys = tuple(Col(n, node.input.schema[n]) for n in names)
        n = self.shuffle_n(op)
        st = self.cut(op, HashOutput(keys, n), name=f"{op.name}+shuffle")
        final = self.read(st, "bucket", n, "distinct")
        final.hashed = (tuple(names),)
        return final.wrap(Distinct(final.node, node.subset, node.keep, False, node.schema))

    def union(self, node: Union) -> _Open:
        ops = [self.visit(i) for i in node.inputs]
        if all(o.num_tasks == 1 for o in ops):
            return self.combine_single(ops, lambda kids: Union(kids, node.schema), "union")
        stages = [self.cut(o, SingleOutput(), name=f"{o.name}+union") for o in ops]
        spec = StageInputSpec(stages[0].id, "concat", node.schema, tuple(s.id for s in stages[1:]))
        return _Open(
            StageInput(0, node.schema),
            sum(s.num_tasks for s in stages),
            [spec],
            est_bytes=sum(o.est_bytes for o in ops),
            name="union",
        )

    def combine_single(self, ops: list[_Open], make: Any, name: str) -> _Open:
        """Single-partition inputs combined by one node (union, hconcat) in one task."""
        first = ops[0]
        kids: list[PlanNode] = [first.node]
        for o in ops[1:]:
            st = self.cut(o, SingleOutput())
            kids.append(StageInput(len(first.inputs), st.fragment.schema))
            first.inputs.append(StageInputSpec(st.id, "all", st.fragment.schema))
            first.est_bytes += o.est_bytes
        first.name = name
        return first.wrap(make(tuple(kids)))

    def _broadcast(self, node: Join, probe: _Open, build: _Open, build_is_right: bool) -> _Open:
        if self._inline_build(node, probe, build, build_is_right):
            return probe
        st = self.cut(build, SingleOutput(), name=f"{build.name}+broadcast")
        idx = len(probe.inputs)
        probe.inputs.append(StageInputSpec(st.id, "all", st.fragment.schema))
        small = StageInput(idx, st.fragment.schema)
        left, right = (probe.node, small) if build_is_right else (small, probe.node)
        probe.est_bytes += build.est_bytes
        probe.name = f"{probe.name}+broadcast-join"
        return probe.wrap(replace(node, left=left, right=right))

    def _inline_build(self, node: Join, probe: _Open, build: _Open, build_is_right: bool) -> bool:
        """Join ``probe`` with a small build side computed inside each of the probe's
        tasks, instead of in a broadcast stage of its own; return whether it did.

        Taken when the build side is a sub-plan of file scans only (Parquet, or CSV, NDJSON
        and IPC files the tasks read; with filters, projections and joins of them, no union,
        no stage input), its scans read
        at most ``broadcast_inline_bytes`` (footer estimates) and all the probe's copies of
        it at most ``target_partition_bytes``. Each task then reads the build side's scans
        whole (as the small-query path does) beside its own partition and computes what the
        broadcast stage's one output would hold: the same rows in the same order (a
        broadcast is read whole, in partition order, which is the scans' order). It saves
        the stage, its task and the wait between the two stages. Not for in-memory tables
        (every task would carry a copy), nor for a scan the probe side also reads, nor for a
        probe side that scans nothing."""
        if not self._can_inline(probe, build):
            return False
        build_scans = scans_of(build.node)
        own = task_scans(probe, scans_of(probe.node))
        assert own is not None
        whole = {id(s): _whole_scan(s, self.split(s)) for s in build_scans}
        left, right = (probe.node, build.node) if build_is_right else (build.node, probe.node)
        joined = replace(node, left=left, right=right)
        order = scans_of(joined)
        entries: list[ScanInput] = []
        for mine in own:
            parts = [mine[id(s)] if id(s) in mine else (whole[id(s)], False) for s in order]
            entries.append(ScanSet(tuple(p for p, _ in parts), tuple(flag for _, flag in parts)))
        probe.scan_partitions = tuple(entries)
        probe.est_bytes += build.est_bytes
        probe.name = f"{probe.name}+inline-join"
        probe.wrap(joined)
        return True

    def _can_inline(self, probe: _Open, build: _Open) -> bool:
        """Whether :meth:`_inline_build` computes ``build`` inside ``probe``'s tasks (see
        there for the rules)."""
        limit = self.config.broadcast_inline_bytes
        if not limit or build.inputs or build.scan_partitions is None:
            return False
        if not all(isinstance(n, Scan | Filter | Project | Join) for n in build.node.walk()):
            return False
        build_scans = scans_of(build.node)
        if not build_scans or not all(
            isinstance(s.source, ParquetSource | FileSource) for s in build_scans
        ):
            return False
        probe_scans = scans_of(probe.node)
        if not probe_scans or {id(s) for s in build_scans} & {id(s) for s in probe_scans}:
            # A probe side that reads stages only (a hash join's buckets, a gather) stays
            # without scans: adaptive execution coalesces such a stage's buckets and
            # switches its hash join to a broadcast join only where the stage scans nothing.
            return False
        read = sum(self.split(s).est_bytes for s in build_scans)
        if read > limit or read * probe.num_tasks > self.config.target_partition_bytes:
            return False
        return task_scans(probe, probe_scans) is not None

    def sort(self, node: Sort) -> _Open:
        op = self.visit(node.input)
        if not all(e.is_row_local() for e in node.by):
            # A key like cum_sum(a) depends on all rows in order: evaluated on one partition.
            op = self.gather(op, "gather")
        if op.num_tasks == 1:
            return op.wrap(
                Sort(op.node, node.by, node.descending, node.nulls_last, node.stable, node.schema)
            )
        n = self.shuffle_n(op)
        sampled = self.cut(
            op, SingleOutput(node.by, self.config.sort_sample_rows), name=f"{op.name}+sample"
        )
        split_in = self.read(sampled, "pointwise", sampled.num_tasks, "range-split")
        spec = RangeOutput(node.by, node.descending, node.nulls_last, n)
        split = self.cut(split_in, spec, boundaries_from=sampled.id)
        final = self.read(split, "bucket", n, "sort")
        return final.wrap(
            Sort(final.node, node.by, node.descending, node.nulls_last, node.stable, node.schema)
        )

    def slice(self, node: Slice) -> _Open:
        inner = node.input
        if node.offset < 0:
            g = self.gather(self.visit(inner), "limit")
            return g.wrap(Slice(g.node, node.offset, node.length, node.schema))
        if (
            isinstance(inner, Sort)
            and node.length is not None
            and all(e.is_row_local() for e in inner.by)
        ):
            op = self.visit(inner.input)
            sort = Sort(
                op.node, inner.by, inner.descending, inner.nulls_last, inner.stable, inner.schema
            )
            if op.num_tasks == 1:
                return op.wrap(Slice(sort, node.offset, node.length, node.schema))
            op.wrap(Slice(sort, 0, node.offset + node.length, node.schema))
            op.name = f"{op.name}+top-k"
            g = self.gather(op, "top-k")
            top = Sort(
                g.node, inner.by, inner.descending, inner.nulls_last, inner.stable, inner.schema
            )
            return g.wrap(Slice(top, node.offset, node.length, node.schema))
        op = self.visit(inner)
        if op.num_tasks == 1:
            return op.wrap(Slice(op.node, node.offset, node.length, node.schema))
        if node.length is not None:
            op.wrap(Slice(op.node, 0, node.offset + node.length, node.schema))
        g = self.gather(op, "limit")
        return g.wrap(Slice(g.node, node.offset, node.length, node.schema))


def _column_set(exprs: tuple[Expr, ...]) -> tuple[tuple[str, ...], ...]:
    """``exprs`` (the keys of a hash exchange) as one column set, when each is a plain
    column; else none."""
    if exprs and all(isinstance(e, Col) for e in exprs):
        return (tuple(e.name for e in exprs if isinstance(e, Col)),)
    return ()


def _join_hashed(node: Join) -> tuple[tuple[str, ...], ...]:
    """The column sets of a hash join's output (both sides hash partitioned on their keys)
    that its partitions are hash partitioned on: the left keys, unless a right or full join
    emits left keys of null for unmatched right rows of any bucket; the right keys of an
    inner or right join where the output keeps them under their own names. Equal values of
    a right key meet in one bucket: both sides hash the same type (:func:`_hash_keys`)."""
    out: list[tuple[str, ...]] = []
    if node.how in ("inner", "left", "semi", "anti"):
        out.extend(_column_set(node.left_on))
    if node.how in ("inner", "right"):
        rights = _column_set(node.right_on)
        left_names = set(node.left.schema.names)
        for cols in rights:
            if all(c in node.schema.names and c not in left_names for c in cols):
                out.append(cols)
    return tuple(out)


def _co_located(hashed: tuple[tuple[str, ...], ...], keys: tuple[NamedExpr, ...]) -> bool:
    """Whether rows with equal ``keys`` (an aggregation's) are certainly in one partition:
    some hashed column set of the input is among the keys' plain columns."""
    plain = {k.expr.name for k in keys if isinstance(k.expr, Col)}
    return any(cols and set(cols) <= plain for cols in hashed)


def _hash_keys(
    left: tuple[Expr, ...], right: tuple[Expr, ...]
) -> tuple[tuple[Expr, ...], tuple[Expr, ...]]:
    """Join keys to hash on; a pair of keys of different types is cast to the left's type
    so that equal values land in the same partition on both sides."""
    rk = tuple(
        r if r.dtype == lft.dtype else Cast(r, lft.dtype, strict=False)
        for lft, r in zip(left, right, strict=True)
    )
    return left, rk


def _keys_from_parquet(join: Join) -> bool:
    """Whether some key pair of ``join`` is two columns of Parquet scans, passed on
    unchanged (the first condition of an aligned join, read off the plan before planning
    it)."""
    for lk, rk in zip(join.left_on, join.right_on, strict=True):
        if not isinstance(lk, Col) or not isinstance(rk, Col):
            continue
        sides = (origin(join.left, lk.name), origin(join.right, rk.name))
        if all(f is not None and isinstance(f[0].source, ParquetSource) for f in sides):
            return True
    return False


def _small_query_blocker(plan: PlanNode, config: Config) -> str | None:
    """Why ``plan`` may not take the small-query path whatever its size, or None."""
    if config.default_partitions:
        return f"default_partitions={config.default_partitions} asks for partitions"
    if config.shuffle_partitions:
        return f"shuffle_partitions={config.shuffle_partitions} asks for partitions"
    for n in plan.walk():
        if isinstance(n, UdfProject) and getattr(n.udf, "needs_actor_pool", False):
            return f"user function {n.udf_name!r} runs on an actor pool"
    return None


def _place_small_queries(b: _Builder) -> None:
    """Decide where the small-query stages of ``b.plan`` run on the Ray runner (the
    ``small_query_where`` setting) and say so on its ``small_query`` line: in the driver
    when every stage of the plan is a small-query stage (a ``collect_all`` that also plans
    a distributed query runs its small ones as Ray tasks beside it), else on Ray workers.
    The local runner runs every task in its own process: nothing to decide."""
    stages = b.plan.stages
    if b.config.runner != "ray" or not any(s.name == "small-query" for s in stages):
        return
    reason = ""
    if b.config.small_query_where == "worker":
        reason = "small_query_where='worker'"
    elif any(s.name != "small-query" for s in stages):
        reason = "the other queries of the plan run distributed"
    elif b.config.ray_runtime_env and any(
        isinstance(n, UdfProject) for s in stages for n in s.fragment.walk()
    ):
        reason = "a user function may need ray_runtime_env, which only the workers have"
    b.plan.small_query_in_driver = not reason
    where = "runs in the driver process" if not reason else f"runs on a Ray worker ({reason})"
    b.plan.small_query += f"; {where}"


def _whole_scan(
    scan: Scan, split: ScanSplit
) -> ScanPartition | MemoryPiece | tuple[FilePartition, ...]:
    """All partitions of ``split`` (of ``scan``) as one :class:`ScanSet` entry."""
    if isinstance(scan.source, InMemorySource):
        return MemoryPiece(to_wire(scan.source.table.select(list(scan.schema.names))))
    parts = split.partitions
    if all(isinstance(p, FilePartition) for p in parts):
        return tuple(p for p in parts if isinstance(p, FilePartition))
    return ScanPartition(
        tuple(pc for p in parts if isinstance(p, ScanPartition) for pc in p.pieces)
    )


def _grouped(*plans: PlanNode) -> bool:
    """Whether some aggregation of ``plans`` groups by keys, without keeping their order
    (each shared sub-plan visited once)."""
    seen: set[int] = set()
    todo = list(plans)
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, Aggregate) and n.keys and not n.maintain_order:
            return True
        todo.extend(n.children())
    return False


def build(plan: PlanNode, config: Config, cpus: int | None = None) -> PhysicalPlan:
    """The physical plan of ``plan`` under ``config`` (partition sizes, broadcast threshold,
    shuffle partitions), sized for ``cpus`` CPUs (None: ``config.num_cpus``, else this
    machine's). Reads Parquet footers; raises ``FileNotFoundError`` naming a missing file,
    before anything runs."""
    b = _Builder(config, set(shared_nodes(plan)), cpus)
    if b.small_query(plan):
        b.plan.schema = plan.schema
        _place_small_queries(b)
        return b.plan
    b.grouped = _grouped(plan)
    _result_stage(b, b.visit(plan))
    b.plan.schema = plan.schema
    if config.inline_shared_stages:
        inline_shared_stages(b.plan)
    return b.plan


def _result_stage(b: _Builder, root: _Open) -> int:
    """Close the fragment ``root`` of a whole plan into the stage whose outputs are the
    plan's result; return its id. A plan that ends with an actor pool stage, or (in
    :func:`build_many`) with a sub-plan that other plans share, already has that stage:
    its outputs are the result as they are."""
    if isinstance(root.node, StageInput) and len(root.inputs) == 1:
        spec = root.inputs[0]
        if spec.mode == "pointwise" and root.name in ("after-udf", "cached"):
            return spec.stage
    return b.cut(root, SingleOutput(), name=root.name).id


def build_many(plans: Sequence[PlanNode], config: Config, cpus: int | None = None) -> PhysicalPlan:
    """One physical plan computing every plan of ``plans`` (``pl.collect_all``):
    ``PhysicalPlan.results[i]`` is the stage whose outputs, in partition order, are the
    result of ``plans[i]``.

    A sub-plan that several plans share (the same node object, as the frontend's own
    common sub-plan elimination leaves it: Polars' ``Cache``) is computed once, by one
    stage that every use reads pointwise, including a shared scan with a filter pushed
    into it; a bare shared scan is read again by each use (reading costs about what
    holding its rows would). A plan small enough for the small-query path
    (``small_query_bytes``) runs whole as one task of its own, shared parts included.
    Stages of different plans that do not depend on each other run side by side. Raises
    as :func:`build` does; ``ValueError`` for no plans."""
    if not plans:
        raise ValueError("build_many: no plans")
    b = _Builder(config, None, cpus)
    b.cache_filtered_scans = True
    results: list[int | None] = [None] * len(plans)
    paths = []
    for i, plan in enumerate(plans):
        if b.small_query(plan):
            results[i] = b.plan.stages[-1].id
        paths.append(b.plan.small_query)
    planned = [i for i, r in enumerate(results) if r is None]
    b.shared = set(shared_nodes(*(plans[i] for i in planned)))
    b.grouped = _grouped(*(plans[i] for i in planned))
    for i in planned:
        results[i] = _result_stage(b, b.visit(plans[i]))
    if len(set(paths)) == 1:  # the same decision for every query: said once
        b.plan.small_query = paths[0]
    else:
        b.plan.small_query = "; ".join(f"query {i}: {p}" for i, p in enumerate(paths) if p)
    b.plan.results = tuple(r for r in results if r is not None)
    b.plan.schema = plans[-1].schema
    if config.inline_shared_stages:
        inline_shared_stages(b.plan)
    _place_small_queries(b)
    return b.plan
