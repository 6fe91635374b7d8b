"""Row index (``with_row_index``) by prefix offsets: no gather, no data moved.

A partitioned input's rows are numbered in partition order, so row ``i`` of partition
``p`` gets ``offset + (rows of partitions 0 .. p-1) + i``. The plan
(:func:`plan_row_index`):

1. the input is cut into a stage as it is (one task per partition);
2. **row-count** (one task per partition, reading it pointwise): the partition's number
   of rows, one row each;
3. **row-offsets** (one task): reads every count, each tagged with its partition
   (:attr:`StageInput.source_column`), takes the exclusive prefix sum, and splits it by
   partition with a range exchange on the tag (fixed boundaries ``1 .. N-1``), so that its
   output ``p`` is partition ``p``'s offset;
4. **row-index** (one task per partition): reads its partition pointwise and output
   ``p`` of the offsets stage (a "bucket" read), and numbers its rows from that offset.

Exact by construction: the counts are the partitions' row counts, and partitions are
concatenated in order (Polars numbers rows in input order, starting at ``offset``; its
index type is kept, and a cast fails where Polars' would).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from shoal.execution.task import RangeOutput, SingleOutput
from shoal.ir.expr import Agg, BinaryOp, Cast, Col, Function, NamedExpr
from shoal.ir.nodes import Aggregate, Join, Project, RowIndex, StageInput
from shoal.ir.types import DataType, Schema
from shoal.planner.physical import StageInputSpec
from shoal.planner.windows import PART_TAG

if TYPE_CHECKING:  # the planner imports this module
    from shoal.planner.planner import _Builder, _Open

#: Columns of the small tables between the stages.
COUNT = "__shoal_rows"
OFFSET = "__shoal_offset"

_INT64 = DataType(pa.int64())
_UINT32 = DataType(pa.uint32())
_PART = Col(PART_TAG, _UINT32)


def plan_row_index(b: _Builder, op: _Open, node: RowIndex) -> _Open:
    """Plan ``node`` over the planned input ``op`` (several partitions) by prefix offsets.
    The returned fragment has ``op``'s partitions, in order."""
    from shoal.planner.planner import _Open

    parts = op.num_tasks
    data = b.cut(op, SingleOutput())
    data_schema = data.fragment.schema
    # 2. rows per partition.
    counts = b.read(data, "pointwise", parts, "row-count")
    count_schema = Schema.of([(COUNT, _INT64)])
    rows = Cast(Agg("len", None, _UINT32), _INT64)
    counts.wrap(Aggregate(counts.node, (), (NamedExpr(COUNT, rows),), False, count_schema))
    counted = b.cut(counts, SingleOutput(), name="row-count")
    # 3. exclusive prefix sums, one per partition, routed to output p.
    tagged = Schema.of([(COUNT, _INT64), (PART_TAG, _UINT32)])
    count = Col(COUNT, _INT64)
    running = Function("cum_sum", (count,), (("reverse", False),), _INT64)
    offsets_schema = Schema.of([(PART_TAG, _UINT32), (OFFSET, _INT64)])
    offsets = Project(
        StageInput(0, tagged, source_column=PART_TAG),
        (NamedExpr(PART_TAG, _PART), NamedExpr(OFFSET, BinaryOp("sub", running, count, _INT64))),
        offsets_schema,
    )
    bounds = pa.table({"__k0": pa.array(range(1, parts), pa.uint32())})
    route = RangeOutput((_PART,), (False,), (False,), parts, bounds)
    spec = StageInputSpec(counted.id, "all", tagged)
    routed = b.cut(_Open(offsets, 1, [spec], name="row-offsets"), route, name="row-offsets")
    # 4. number each partition's rows from its offset.
    out = b.read(data, "pointwise", parts, "row-index")
    out.inputs.append(StageInputSpec(routed.id, "bucket", offsets_schema))
    offset_schema = Schema.of([(OFFSET, _INT64)])
    offset_col = Col(OFFSET, _INT64)
    mine = Project(StageInput(1, offsets_schema), (NamedExpr(OFFSET, offset_col),), offset_schema)
    joined_schema = Schema.of([*data_schema.items(), (OFFSET, _INT64)])
    joined = Join(out.node, mine, (), (), "cross", "_right", False, False, joined_schema, "left")
    numbers = Function("int_range", (), (("start", node.offset),), _INT64)
    index = Cast(BinaryOp("add", numbers, offset_col, _INT64), node.schema[node.name])
    columns = (NamedExpr(c, Col(c, t)) for c, t in data_schema.items())
    return out.wrap(Project(joined, (NamedExpr(node.name, index), *columns), node.schema))
