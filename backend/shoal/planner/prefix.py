"""Row index and cumulative functions by prefix carries: no gather, no data moved.

A partitioned input's rows are in partition order, so a row index or a running total on
row ``i`` of partition ``p`` is the partition's own running value combined with a
*carry*: the same quantity over partitions ``0 .. p-1``. The plan (:func:`plan_carries`):

1. the input is cut into a stage as it is (one task per partition);
2. **summary** (one task per partition, reading it pointwise): one row of aggregates of
   the partition (its row count, the sum, count, min or max of a cumulative function's
   argument);
3. **carries** (one task): reads every summary, each tagged with its partition
   (:attr:`StageInput.source_column`), combines them into exclusive prefixes (a running
   sum minus the partition's own, or the running min/max of the partitions before), and
   splits them by partition with a range exchange on the tag (fixed boundaries
   ``1 .. N-1``), so that its output ``p`` is partition ``p``'s carries;
4. **apply** (one task per partition): reads its partition pointwise and output ``p`` of
   the carries stage (a "bucket" read), and evaluates the node with each running value
   combined with its carry.

Where this is exact (Polars' definitions, checked against native Polars in the tests):

* ``with_row_index(name, offset)``: ``offset`` + rows before + the local row number, in
  Polars' index type (a cast fails where Polars' would);
* ``cum_count``: non-null values before + the local count;
* ``cum_sum`` of integers or booleans: integer addition wraps as Polars' does, and
  wrapping addition is associative, so carry + local running sum is the running sum
  bit for bit; a null row stays null. Floats are not associative: they gather;
* ``cum_min``/``cum_max`` of integers: the smaller (larger) of the carry and the local
  running value; a null row stays null.

``reverse=True`` and every other order-dependent function gather.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from shoal.ir.expr import (
    Agg,
    BinaryOp,
    Cast,
    Col,
    Expr,
    Function,
    Lit,
    NamedExpr,
    Ternary,
    replace,
)
from shoal.ir.nodes import Aggregate, Filter, Join, PlanNode, Project, RowIndex, StageInput
from shoal.ir.types import DataType, Schema
from shoal.planner.context import OpenFragment, PlanningContext
from shoal.planner.physical import RangeOutput, SingleOutput, StageInputSpec
from shoal.planner.windows import PART_TAG

_INT64 = DataType(pa.int64())
_UINT32 = DataType(pa.uint32())
_BOOL = DataType(pa.bool_())
_PART = Col(PART_TAG, _UINT32)

#: Cumulative functions that run by carries (where their types allow).
CUMULATIVE = frozenset({"cum_sum", "cum_count", "cum_min", "cum_max"})


@dataclass(frozen=True)
class Carry:
    """One carried quantity: ``summary`` aggregates a partition's rows into one value of
    type ``dtype``; ``combine`` says how the partitions before are combined into the
    carry (``"sum"``: their total, ``"min"``/``"max"``: their extreme, null when none)."""

    name: str
    summary: Expr
    combine: Literal["sum", "min", "max"]
    dtype: DataType


def plan_row_index(b: PlanningContext, op: OpenFragment, node: RowIndex) -> OpenFragment:
    """``with_row_index`` over the planned input ``op`` (several partitions)."""
    offset = Carry("__shoal_offset", Cast(Agg("len", None, _UINT32), _INT64), "sum", _INT64)
    numbers = Function("int_range", (), (("start", node.offset),), _INT64)
    index = Cast(BinaryOp("add", numbers, Col(offset.name, _INT64), _INT64), node.schema[node.name])

    def apply(joined: PlanNode, data: Schema) -> PlanNode:
        columns = (NamedExpr(c, Col(c, t)) for c, t in data.items())
        return Project(joined, (NamedExpr(node.name, index), *columns), node.schema)

    return plan_carries(b, op, (offset,), apply, "row-index")


def plan_cumulative(
    b: PlanningContext, op: OpenFragment, node: Project | Filter
) -> OpenFragment | None:
    """``node`` over the planned input ``op`` (several partitions) by carries, when its
    only order-dependent parts are cumulative functions that carries make exact (see the
    module docstring); None otherwise, and nothing is planned."""
    exprs = [e.expr for e in node.exprs] if isinstance(node, Project) else [node.predicate]
    found: list[Function] = []
    if not all(e.collect_order_dependent(_carriable, found) for e in exprs) or not found:
        return None
    carries: dict[Function, Carry] = {}
    for f in dict.fromkeys(found):
        carries[f] = _carry_of(f, f"__shoal_carry{len(carries)}")

    def swap(e: Expr) -> Expr | None:
        c = carries.get(e) if isinstance(e, Function) else None
        return None if c is None else _combine(e, Col(c.name, c.dtype), c.combine)

    def apply(joined: PlanNode, data: Schema) -> PlanNode:
        if isinstance(node, Project):
            new = tuple(NamedExpr(e.name, replace(e.expr, swap)) for e in node.exprs)
            return Project(joined, new, node.schema, node.keep_height)
        kept = Filter(joined, replace(node.predicate, swap), joined.schema)
        columns = tuple(NamedExpr(c, Col(c, t)) for c, t in data.items())
        return Project(kept, columns, node.schema)

    return plan_carries(b, op, tuple(carries.values()), apply, "cumulative")


def _carriable(f: Function) -> bool | None:
    """Whether carries make cumulative function ``f`` exact (None: not cumulative; see
    ``Expr.collect_order_dependent``)."""
    if f.name not in CUMULATIVE:
        return None
    arg = f.args[0] if len(f.args) == 1 else None
    if arg is None or f.option("reverse", False) or not arg.is_row_local():
        return False
    if f.name == "cum_sum" and not (
        f.dtype.is_integer and (arg.dtype.is_integer or arg.dtype == _BOOL)
    ):
        return False
    return not (f.name in ("cum_min", "cum_max") and not arg.dtype.is_integer)


def _carry_of(f: Function, name: str) -> Carry:
    arg = f.args[0]
    if f.name == "cum_count":
        return Carry(name, Agg("count", arg, f.dtype), "sum", f.dtype)
    if f.name == "cum_sum":
        # The partition's total in the running sum's type, wrapping as the sum does.
        total = Agg("sum", Cast(arg, f.dtype, strict=False, wrap=True), f.dtype)
        return Carry(name, Cast(total, f.dtype, strict=False, wrap=True), "sum", f.dtype)
    extreme: Literal["min", "max"] = "min" if f.name == "cum_min" else "max"
    return Carry(name, Agg(extreme, arg, f.dtype), extreme, f.dtype)


def _combine(local: Expr, carry: Col, how: str) -> Expr:
    """The running value ``local`` of this partition combined with the partitions' before."""
    if how == "sum":
        return BinaryOp("add", local, carry, local.dtype)
    both = Function(f"{how}_horizontal", (local, carry), (), local.dtype)
    is_null = Function("is_null", (local,), (), _BOOL)
    return Ternary(is_null, Lit(None, local.dtype), both, local.dtype)


def _exclusive(carry: Carry) -> Expr:
    """Over the partitions' summaries in partition order: the carry of each partition."""
    own = Col(carry.name, carry.dtype)
    if carry.combine == "sum":
        running = Function("cum_sum", (own,), (("reverse", False),), carry.dtype)
        return BinaryOp("sub", running, own, carry.dtype)
    running = Function(f"cum_{carry.combine}", (own,), (("reverse", False),), carry.dtype)
    filled = Function("fill_null_strategy", (running,), (("strategy", "forward"),), carry.dtype)
    return Function("shift", (filled, Lit(1, _INT64)), (), carry.dtype)


def plan_carries(
    b: PlanningContext,
    op: OpenFragment,
    carries: tuple[Carry, ...],
    apply: Callable[[PlanNode, Schema], PlanNode],
    name: str,
) -> OpenFragment:
    """The four stages of the module docstring: ``apply(joined, data_schema)`` builds the
    final fragment over ``joined``, the partition's rows (``data_schema``) with one column
    per carry appended. Returns the open fragment, with ``op``'s partitions in order."""
    parts = op.num_tasks
    data = b.cut(op, SingleOutput())
    data_schema = data.fragment.schema
    # 2. one summary row per partition.
    summary = b.read(data, "pointwise", parts, f"{name}-summary")
    sums = Schema.of([(c.name, c.dtype) for c in carries])
    aggs = tuple(NamedExpr(c.name, c.summary) for c in carries)
    summary.wrap(Aggregate(summary.node, (), aggs, False, sums))
    summed = b.cut(summary, SingleOutput(), name=f"{name}-summary")
    # 3. each partition's carries, routed to output p.
    tagged = Schema.of([*sums.items(), (PART_TAG, _UINT32)])
    prefix = Project(
        StageInput(0, tagged, source_column=PART_TAG),
        (NamedExpr(PART_TAG, _PART), *(NamedExpr(c.name, _exclusive(c)) for c in carries)),
        Schema.of([(PART_TAG, _UINT32), *sums.items()]),
    )
    bounds = pa.table({"__k0": pa.array(range(1, parts), pa.uint32())})
    route = RangeOutput((_PART,), (False,), (False,), parts, bounds)
    spec = StageInputSpec(summed.id, "all", tagged)
    routed = b.cut(
        OpenFragment(prefix, 1, [spec], name=f"{name}-carry"), route, name=f"{name}-carry"
    )
    # 4. the node, with this partition's carries joined to every row.
    out = b.read(data, "pointwise", parts, name)
    out.inputs.append(StageInputSpec(routed.id, "bucket", prefix.schema))
    mine = Project(
        StageInput(1, prefix.schema), tuple(NamedExpr(c, Col(c, t)) for c, t in sums.items()), sums
    )
    joined_schema = Schema.of([*data_schema.items(), *sums.items()])
    joined = Join(out.node, mine, (), (), "cross", "_right", False, False, joined_schema, "left")
    return out.wrap(apply(joined, data_schema))
