"""IR plan nodes -> one Polars lazy query: what the kernel runs for a fragment
(:mod:`shoal.execution.kernel` supplies this task's scan partitions), and what the builder
and the validator (:mod:`shoal.plan`) read a node's output schema from, over empty inputs.

Nodes that Polars does not run (``UdfProject``, ``SqlMap``, ``Sink``) run over their
collected input with a runner the kernel registers (:func:`register_foreign`), so that this
floor imports nothing above the IR.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Literal

import polars as pl
import polars.selectors as cs
import pyarrow as pa

from shoal.errors import UnsupportedError
from shoal.ir.expr import Col, NamedExpr
from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Explode,
    Filter,
    HConcat,
    Join,
    PlanNode,
    Project,
    RowIndex,
    Scan,
    Slice,
    Sort,
    StageInput,
    Union,
    Unnest,
    Unpivot,
    shared_nodes,
)
from shoal.ir.types import DataType
from shoal.lowering.engine import collect, in_memory, needs_in_memory
from shoal.lowering.expressions import to_polars
from shoal.lowering.temporal import TEMPORAL_NODES, build_temporal

#: A runner of a node Polars does not run: (the node, its collected input) -> its output.
ForeignRunner = Callable[[PlanNode, pl.DataFrame], pl.DataFrame]

_FOREIGN: dict[type[PlanNode], ForeignRunner] = {}


def no_scan(node: Scan) -> pl.LazyFrame:
    """The ``scan`` of :func:`lower_plan` where no partition is at hand (the plan checks
    lower nodes over :class:`~shoal.ir.nodes.StageInput` leaves): raises ``RuntimeError``
    naming the scan."""
    raise RuntimeError(f"scan without its partition: {node.label}")


def runs_foreign_code(node: PlanNode) -> bool:
    """Whether ``node`` holds a node that Polars does not run (one with a runner from
    :func:`register_foreign`: a user function, DuckDB's SQL, a sink)."""
    return any(type(n) in _FOREIGN for n in node.walk())


def register_foreign(node_class: type[PlanNode], runner: ForeignRunner) -> None:
    """Make :func:`lower_plan` run nodes of ``node_class`` with ``runner`` (the kernel
    registers ``UdfProject``, ``SqlMap`` and ``Sink`` when it is imported; ``import
    shoal`` imports it)."""
    _FOREIGN[node_class] = runner


_JOIN_HOW = {
    "inner": "inner",
    "left": "left",
    "right": "right",
    "full": "full",
    "semi": "semi",
    "anti": "anti",
    "cross": "cross",
}


#: The order a task asks of a join whose ``maintain_order`` names one side: that side's
#: order, then the other side's among one row's matches. Polars leaves that second order
#: open for the one-sided setting; its in-memory engine gives the other side's order on
#: most inputs (all 400 random in-memory frame pairs tried; not on some Parquet inputs),
#: its streaming engine, which a task runs, not always (a task's answer changed from run
#: to run). Asked for, it is the same on every run and every partitioning.
_TIE_ORDER = {"left": "left_right", "right": "right_left"}


def lower_plan(
    node: PlanNode,
    inputs: Sequence[pl.DataFrame],
    scan: Callable[[Scan], pl.LazyFrame],
) -> pl.LazyFrame:
    """The Polars lazy query for ``node``: ``inputs[i]`` are the rows of
    :class:`~shoal.ir.nodes.StageInput` ``i``; ``scan`` gives the rows of a
    :class:`~shoal.ir.nodes.Scan` (the kernel: this task's partition of it). A node that
    Polars does not run (a UDF, DuckDB's SQL, a sink) runs over its collected input with
    the runner registered for its class (:func:`register_foreign`).

    One node object reached twice (a shared sub-plan: :mod:`shoal.planner.shared`) is
    lowered once, to one lazy frame; one that holds a join is computed then, once, for
    both uses (a frame over its rows).

    Raises :class:`shoal.UnsupportedError` for a node nothing here can lower."""
    state = _LOWERED.get()
    if state is None:
        token = _LOWERED.set(({}, _shared_joins(node)))
        try:
            return lower_plan(node, inputs, scan)
        finally:
            _LOWERED.reset(token)
    memo, shared = state
    got = memo.get(id(node))
    if got is None:
        got = _lower_node(node, inputs, scan)
        if id(node) in shared:
            # A join computed now, once, for every use (TPC-H Q2's parts supplied from
            # Europe). Left lazy, Polars' common sub-plan elimination finds the uses only
            # while they stay equal: its predicate pushdown may push a different filter
            # into each (a key prefilter, a semi join's filter), and then it drops even an
            # explicit cache and computes the sub-plan twice. A scan with filters stays
            # lazy (one lazy frame for its uses): scanning it twice with those filters
            # pushed into the reader cost less than holding all its rows (TPC-H Q21's
            # lineitem).
            got = collect(got).lazy()
        memo[id(node)] = got
    return got


#: For the current top-level call of :func:`lower_plan`: the lazy frame of each node object
#: lowered so far, and the node objects reached more than once, by ``id`` (the call holds
#: the plan, so the ids stay its nodes').
_LOWERED: ContextVar[tuple[dict[int, pl.LazyFrame], set[int]] | None] = ContextVar(
    "shoal_lowered", default=None
)


def _shared_joins(root: PlanNode) -> set[int]:
    """Ids of the node objects that ``root`` reaches by more than one path and that hold a
    join."""
    found = shared_nodes(root).items()
    return {i for i, n in found if any(isinstance(d, Join) for d in n.walk())}


def _lower_node(
    node: PlanNode,
    inputs: Sequence[pl.DataFrame],
    scan: Callable[[Scan], pl.LazyFrame],
) -> pl.LazyFrame:
    """:func:`lower_plan` of one node (its children through :func:`lower_plan`)."""
    if isinstance(node, Scan):
        return scan(node)
    if isinstance(node, StageInput):
        return inputs[node.index].lazy()
    if isinstance(node, Project):
        out = _project(lower_plan(node.input, inputs, scan), node)
        return in_memory(out) if needs_in_memory(node.exprs) else out
    if isinstance(node, Filter):
        out = lower_plan(node.input, inputs, scan).filter(to_polars(node.predicate))
        return in_memory(out) if needs_in_memory((NamedExpr("", node.predicate),)) else out
    if isinstance(node, Aggregate):
        lf = lower_plan(node.input, inputs, scan)
        aggs = [to_polars(e.expr).alias(e.name) for e in node.aggs]
        if not node.keys:
            out = lf.select(aggs)
        else:
            keys = [to_polars(e.expr).alias(e.name) for e in node.keys]
            out = lf.group_by(keys, maintain_order=node.maintain_order).agg(aggs)
        return in_memory(out) if needs_in_memory(node.aggs) else out
    if isinstance(node, Join):
        left = lower_plan(node.left, inputs, scan)
        right = lower_plan(node.right, inputs, scan)
        if node.how == "cross":
            # Polars' in-memory engine pairs the rows left-major whatever maintain_order
            # says; its streaming engine (a task's collect) interleaves morsels unless told
            # to keep the order (a nested-loop join of SQL's IN subquery came back 4, 3).
            cross_order = "left_right" if node.maintain_order == "none" else node.maintain_order
            return left.join(
                right,
                how="cross",
                suffix=node.suffix,
                maintain_order=cross_order,  # type: ignore[arg-type]
            )
        by_set = _semi_by_set(node, left, right)
        if by_set is not None:
            return by_set
        left, right = _key_prefilter(node, left, right)
        # A semi or anti join keeps a subset of the left rows: in their order, as Polars'
        # in-memory engine does whatever maintain_order says (its streaming engine, which a
        # task's collect runs, may not), so that a partition's rows stay in input order.
        # "left" ("right") alone leaves the order of one row's matches open: the in-memory
        # engine mostly gives them in the other side's order, the streaming engine too
        # but not always (one run in 500 of a six-row join). Spelling the tie order out
        # makes a task's output the same on every run (_TIE_ORDER).
        if node.how in ("semi", "anti"):
            order = "left"
        else:
            order = _TIE_ORDER.get(node.maintain_order, node.maintain_order)
        left, right, left_on, right_on, coalesce, temps = _join_keys(left, right, node)
        out = left.join(
            right,
            left_on=left_on,
            right_on=right_on,
            how=_JOIN_HOW[node.how],  # type: ignore[arg-type]
            suffix=node.suffix,
            nulls_equal=node.nulls_equal,
            coalesce=coalesce,
            maintain_order=order,  # type: ignore[arg-type]
        )
        return out.drop(temps, strict=False) if temps else out
    if isinstance(node, Sort):
        lf = lower_plan(node.input, inputs, scan)
        return lf.sort(
            [to_polars(e) for e in node.by],
            descending=list(node.descending),
            nulls_last=list(node.nulls_last),
            maintain_order=node.stable,
        )
    if isinstance(node, Slice):
        return lower_plan(node.input, inputs, scan).slice(node.offset, node.length)
    if isinstance(node, Distinct):
        return lower_plan(node.input, inputs, scan).unique(
            subset=list(node.subset) if node.subset is not None else None,
            keep=node.keep,
            maintain_order=node.maintain_order,
        )
    if isinstance(node, Union):
        return pl.concat([lower_plan(i, inputs, scan) for i in node.inputs], how="vertical")
    if isinstance(node, HConcat):
        # Polars 2.1: "horizontal" is strict; "horizontal_extend" pads with nulls.
        how: Literal["horizontal", "horizontal_extend"] = (
            "horizontal" if node.strict else "horizontal_extend"
        )
        parts = [lower_plan(i, inputs, scan) for i in node.inputs]
        if node.broadcast:
            parts = _broadcast_unit_length([collect(p) for p in parts])
        return pl.concat(parts, how=how)
    if isinstance(node, Explode):
        return lower_plan(node.input, inputs, scan).explode(
            list(node.columns), empty_as_null=node.empty_as_null, keep_nulls=node.keep_nulls
        )
    if isinstance(node, Unnest):
        return lower_plan(node.input, inputs, scan).unnest(
            list(node.columns), separator=node.separator
        )
    if isinstance(node, Unpivot):
        return _unpivot(node, lower_plan(node.input, inputs, scan))
    if isinstance(node, RowIndex):
        return lower_plan(node.input, inputs, scan).with_row_index(node.name, offset=node.offset)
    if isinstance(node, TEMPORAL_NODES):
        return build_temporal(node, [lower_plan(c, inputs, scan) for c in node.children()])
    runner = _FOREIGN.get(type(node))
    if runner is not None:
        # A UdfProject runs the user's function on this process's instance (an actor's,
        # for a stateful or GPU UDF: the planner gives those a stage of their own); a
        # SqlMap runs its row-wise SQL on DuckDB over this partition's rows; a Sink writes
        # this task's own partition's files and lists them.
        (child,) = node.children()
        return runner(node, collect(lower_plan(child, inputs, scan))).lazy()
    raise UnsupportedError(f"plan node {node.label} is not supported by the kernel")


_HEIGHT_TMP = "__shoal_keep_height"


def _project(lf: pl.LazyFrame, node: Project) -> pl.LazyFrame:
    """``node`` (a :class:`Project`) over ``lf``. Polars' ``select`` gives one row when
    every expression is a scalar and none without expressions (``keep_height`` False);
    with ``keep_height`` the output keeps ``lf``'s height, which Polars' ``with_columns``
    gives (scalars broadcast to it, also over a frame of no columns): the expressions are
    added as temporary columns and then picked. Plain column references need no such
    help (a column has the input's height); no expression at all drops every column."""
    if not node.keep_height or all(isinstance(e.expr, Col) for e in node.exprs):
        if node.keep_height and not node.exprs:
            return lf.drop(cs.all())
        return lf.select([to_polars(e.expr).alias(e.name) for e in node.exprs])
    computed = {
        i: to_polars(e.expr).alias(f"{_HEIGHT_TMP}{i}")
        for i, e in enumerate(node.exprs)
        if not isinstance(e.expr, Col)
    }
    return lf.with_columns(list(computed.values())).select(
        [
            pl.col(f"{_HEIGHT_TMP}{i}").alias(e.name)
            if i in computed
            else to_polars(e.expr).alias(e.name)
            for i, e in enumerate(node.exprs)
        ]
    )


_JOIN_KEY_TMP = "__shoal_join_key"


def _join_keys(
    left: pl.LazyFrame, right: pl.LazyFrame, node: Join
) -> tuple[pl.LazyFrame, pl.LazyFrame, list[pl.Expr], list[pl.Expr], bool, list[str]]:
    """The inputs and keys of an equi-join ``node`` as Polars can take them: ``(left,
    right, left_on, right_on, coalesce, temporary columns to drop after the join)``.

    Polars refuses a key expression that holds an ``alias`` ("'alias' is not allowed in a
    join key"), which a STRUCT key built of columns does (its fields are named with
    ``alias``). So a key pair that is not two plain columns is computed first, as a
    temporary column on each side, and the join runs on those. The answer is Polars' own:
    Polars computes non-column keys the same way and turns key coalescing off for the
    whole join when any key is not a column reference (``polars.LazyFrame.join``: "not all
    join keys are column references, turning off key coalescing"), so ``coalesce`` is False
    then; the temporary columns are dropped after the join. Keys that are all plain
    columns are passed through unchanged."""
    left_on = [to_polars(e) for e in node.left_on]
    right_on = [to_polars(e) for e in node.right_on]
    if all(e.meta.is_column() for e in (*left_on, *right_on)):
        return left, right, left_on, right_on, node.coalesce, []
    computed_left: list[pl.Expr] = []
    computed_right: list[pl.Expr] = []
    temps: list[str] = []
    for i, (a, b) in enumerate(zip(left_on, right_on, strict=True)):
        if a.meta.is_column() and b.meta.is_column():
            continue
        lname, rname = f"{_JOIN_KEY_TMP}_l{i}", f"{_JOIN_KEY_TMP}_r{i}"
        computed_left.append(a.alias(lname))
        computed_right.append(b.alias(rname))
        left_on[i], right_on[i] = pl.col(lname), pl.col(rname)
        temps += [lname, rname]
    return (
        left.with_columns(computed_left),
        right.with_columns(computed_right),
        left_on,
        right_on,
        False,
        temps,
    )


#: The most rows an in-memory join side may have for its keys to filter the other side's
#: scan first (:func:`_key_prefilter`). Measured on one thread, a lineitem file of SF10:
#: 2,000 keys (TPC-H Q17) read a third less; 1M keys that half the rows match cost a
#: fifth more (the set is built, every row probed, and few rows skipped).
PREFILTER_MAX_ROWS = 250_000


def _set_key(t: DataType) -> bool:
    """Whether membership (``is_in``) of values of type ``t`` agrees with join equality:
    integers, strings and dates (not floats: NaN and -0.0; not 128-bit integers)."""
    return t.wide is None and (
        t.is_integer or t.arrow in (pa.string(), pa.large_string(), pa.string_view(), pa.date32())
    )


def _key_prefilter(
    node: Join, left: pl.LazyFrame, right: pl.LazyFrame
) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """The inputs of join ``node``, the side that scans filtered first by membership of its
    keys in the other side's keys, when the other side is already in the task's
    memory (stage inputs with row-local filters and projections only, at most
    :data:`PREFILTER_MAX_ROWS` rows): Polars pushes such a filter into its Parquet reader,
    which then decodes the other columns only for rows that can match (a broadcast join
    with a few thousand keys read a third less). Exact where the join drops that side's
    unmatched rows (both sides of an inner join, the right side of a left, semi or anti
    join, the left side of a right join): a row whose key is not among the other side's
    keys has no match (each key of several is a necessary condition of its own); nulls are
    kept exactly where ``nulls_equal`` and the other side has a null. Key pairs that are not plain columns of one integer, string
    or date type are left out; with none left, or for another join type, the inputs are
    returned as they are."""
    scans = [any(isinstance(n, Scan) for n in side.walk()) for side in (node.left, node.right)]
    if scans[0] == scans[1]:
        return left, right
    probe_left = scans[0]
    # Only a side whose unmatched rows the join drops.
    if node.how not in (("inner", "right") if probe_left else ("inner", "left", "semi", "anti")):
        return left, right
    mem_node = node.right if probe_left else node.left
    if not all(isinstance(n, StageInput | Project | Filter) for n in mem_node.walk()):
        return left, right
    probe_on, mem_on = (
        (node.left_on, node.right_on) if probe_left else (node.right_on, node.left_on)
    )
    pairs = [
        (p, m)
        for p, m in zip(probe_on, mem_on, strict=True)
        if isinstance(p, Col) and isinstance(m, Col) and p.dtype == m.dtype and _set_key(p.dtype)
    ]
    if not pairs:
        return left, right
    mem = right if probe_left else left
    keys = collect(mem.select([pl.col(m.name).alias(f"k{i}") for i, (_, m) in enumerate(pairs)]))
    if keys.height > PREFILTER_MAX_ROWS:
        return left, right
    cond = pl.all_horizontal(
        pl.col(p.name).is_in(keys[f"k{i}"].implode(), nulls_equal=node.nulls_equal)
        for i, (p, _) in enumerate(pairs)
    )
    return (left.filter(cond), right) if probe_left else (left, right.filter(cond))


def _semi_by_set(node: Join, left: pl.LazyFrame, right: pl.LazyFrame) -> pl.LazyFrame | None:
    """A semi or anti join on one key whose right side reads no scan (stage inputs, already
    in the task's memory) as a filter of the left rows by membership of their key in the
    right side's keys (``is_in``), or None. The right side's keys are computed first; the
    filter keeps the left rows in their order, as the join does (Polars' semi join probes
    a hash table of row indices: several times the cost of ``is_in``'s hash set). Only for
    a plain column key of one integer, string or date type on both sides (equality and
    membership agree there). Nulls as the join has them: with ``nulls_equal`` a null key
    is in the set when the right side has one; without it, membership of a null is null,
    which a semi join drops and an anti join keeps."""
    if node.how not in ("semi", "anti") or len(node.left_on) != 1:
        return None
    lk, rk = node.left_on[0], node.right_on[0]
    if not (isinstance(lk, Col) and isinstance(rk, Col)) or lk.dtype != rk.dtype:
        return None
    if not _set_key(lk.dtype):
        return None
    if any(isinstance(n, Scan) for n in node.right.walk()):
        return None
    keys = collect(right.select(pl.col(rk.name))).to_series().implode()
    member = pl.col(lk.name).is_in(keys, nulls_equal=node.nulls_equal)
    if node.how == "semi":
        return left.filter(member)
    return left.filter(~member.fill_null(False))


def _broadcast_unit_length(frames: list[pl.DataFrame]) -> list[pl.LazyFrame]:
    """Polars' horizontal concatenation with unit-length inputs as scalars: the height is
    the largest that is not 1 (1 if every input has one row), and each one-row input is
    repeated to it (:class:`~shoal.ir.nodes.HConcat` ``broadcast``)."""
    height = max((f.height for f in frames if f.height != 1), default=1)
    return [(f[[0] * height] if f.height == 1 else f).lazy() for f in frames]


def _unpivot(node: Unpivot, lf: pl.LazyFrame) -> pl.LazyFrame:
    """Unpivot column by column, as the IR defines it. Polars' own ``unpivot`` orders rows
    by chunk of its input (the in-memory engine column by column within each chunk, the
    streaming engine row by row), so a partitioned input would change the order. Values are
    cast to the output's value type (the supertype of the ``on`` columns)."""
    value_type = node.schema[node.value_name].to_polars()
    index = [pl.col(i) for i in node.index]
    parts = [
        lf.select(
            *index,
            pl.lit(c, pl.String).alias(node.variable_name),
            pl.col(c).cast(value_type).alias(node.value_name),
        )
        for c in node.on
    ]
    if not parts:
        return pl.DataFrame(schema=node.schema.to_polars()).lazy()
    return pl.concat(parts, how="vertical")
