"""Joins of two fragments that read the same stage's partitions pointwise, in place.

A sub-plan used twice (Polars' cache: a correlated subquery decorrelated into "rows of X
joined with an aggregation of X") is computed once, in a stage of its own, and each use
reads that stage's partitions pointwise (task ``i`` reads partition ``i``). When that
stage's partitions are hash partitioned on a column set ``H`` (after a hash exchange, or
a Parquet scan whose partitions hold disjoint key ranges, :mod:`shoal.planner.ranges`),
every row whose ``H`` values are ``v`` is in one partition ``p(v)``, in both uses. A join
of the two uses whose keys pair each column of ``H``, as it flows up one side, with the
same column of ``H`` as it flows up the other side, meets every matching pair of rows in
task ``p(v)``: it runs in place, with no broadcast and no exchange of either side.

The rule needs the columns' lineage, not only their names: two different hashed sets of
the stage (two sorted columns) place rows by different functions, so each key is traced
down to the stage column it carries unchanged (:func:`origin`).
"""

from __future__ import annotations

from dataclasses import replace

from shoal.ir.expr import Col
from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Filter,
    Join,
    PlanNode,
    Project,
    Slice,
    Sort,
    StageInput,
    transform,
)
from shoal.planner.context import OpenFragment, carry_hashed, source_column

#: Why a task of a co-located join may not be split into subtasks (runners/skew.py).
WHOLE = "a join in place of two reads of one stage's partitions needs all rows of both"


def origin(node: PlanNode, name: str, index: int) -> str | None:
    """The column of stage input ``index`` that column ``name`` of ``node``'s output
    carries unchanged, row by row: through filters, sorts, slices, distincts, plain column
    projections (renames), aggregation keys, and inner, left, semi and anti joins (a left
    column by its name; a right column of an inner join the output keeps under its own
    name, and a left key of an inner join as the right key it equals: plain columns of one type, not
    floating point). None when the column is computed, comes from elsewhere, or its
    lineage is not one of those."""
    if isinstance(node, StageInput):
        ok = node.index == index and name in node.schema.names and name != node.source_column
        return name if ok else None
    if isinstance(node, Filter | Sort | Slice | Distinct):
        return origin(node.input, name, index)
    if isinstance(node, Project | Aggregate):
        src = source_column(node, name)
        return None if src is None else origin(node.input, src, index)
    if not isinstance(node, Join) or node.how not in ("inner", "left", "semi", "anti"):
        return None
    if name not in node.schema.names:
        return None
    if name in node.left.schema.names:
        got = origin(node.left, name, index)
        if got is not None or node.how != "inner":
            return got
        for lk, rk in zip(node.left_on, node.right_on, strict=True):
            if (
                isinstance(lk, Col)
                and isinstance(rk, Col)
                and lk.name == name
                and lk.dtype == rk.dtype
                and not lk.dtype.is_float
            ):
                return origin(node.right, rk.name, index)
        return None
    if node.how == "inner" and name in node.right.schema.names:
        return origin(node.right, name, index)
    return None


def _pointwise(op: OpenFragment) -> int | None:
    """The index of ``op``'s one pointwise input when every other input is read whole and
    it scans nothing; else None."""
    if op.scan_partitions is not None:
        return None
    found = [i for i, spec in enumerate(op.inputs) if spec.mode != "all"]
    if len(found) != 1 or op.inputs[found[0]].mode != "pointwise":
        return None
    return found[0]


def co_located(node: Join, left: OpenFragment, right: OpenFragment) -> OpenFragment | None:
    """``node`` (left input planned as ``left``, right as ``right``) run in place in the
    tasks of both, when both read one stage pointwise (and nothing else but broadcasts)
    and its keys meet in one partition (see the module docstring); else None.

    The fragment returned reads ``left``'s inputs, then ``right``'s broadcasts (the
    partition both read is one input); its tasks may not be split (:data:`WHOLE`)."""
    if node.how == "cross" or node.maintain_order != "none":
        return None
    n = left.num_tasks
    if n < 2 or right.num_tasks != n:
        return None
    li, ri = _pointwise(left), _pointwise(right)
    if li is None or ri is None or left.inputs[li].stage != right.inputs[ri].stage:
        return None
    if any(
        isinstance(x, StageInput) and x.source_column is not None
        for op in (left, right)
        for x in op.node.walk()
    ):
        return None  # rows tagged with their task: kept apart
    pairs: dict[str, str] = {}  # left key column -> right key column
    for lk, rk in zip(node.left_on, node.right_on, strict=True):
        if not (isinstance(lk, Col) and isinstance(rk, Col)) or lk.dtype != rk.dtype:
            continue
        lo, ro = origin(left.node, lk.name, li), origin(right.node, rk.name, ri)
        if lo is not None and lo == ro:
            pairs.setdefault(lk.name, rk.name)
    # A hashed set of the left side made of key columns, each paired with a right key
    # column that carries the same stage column: the stage's rows are placed by it.
    if not any(cols and all(c in pairs for c in cols) for cols in left.hashed):
        return None
    # The right side's reads: its pointwise one is the left side's (one input: the task
    # reads its partition once), its broadcasts follow the left side's inputs.
    index = {ri: li}
    inputs = list(left.inputs)
    for j, spec in enumerate(right.inputs):
        if j != ri:
            index[j] = len(inputs)
            inputs.append(spec)

    def renumber(x: PlanNode) -> PlanNode | None:
        if isinstance(x, StageInput):
            return replace(x, index=index[x.index])
        return None

    joined = replace(node, left=left.node, right=transform(right.node, renumber))
    out = OpenFragment(
        joined,
        n,
        inputs,
        est_bytes=left.est_bytes + right.est_bytes,
        name=f"{left.name}+join-in-place",
        whole_buckets=WHOLE,
    )
    out.hashed = carry_hashed(left.node, joined, left.hashed)
    return out
