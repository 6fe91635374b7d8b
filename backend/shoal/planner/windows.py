"""Windows (``over(partition_by)``) distributed by a hash exchange on the window keys.

A projection or filter whose only order-dependent parts are windows that all partition by
a common set of keys does not need every row in one task: each window group is evaluated
on its own rows in their input order, so the groups may be spread over tasks as long as
each group stays whole and keeps its order. The plan (:func:`plan_hash_window`):

1. **tag and shuffle** (the input's tasks, one per input partition): each row gets its row
   number within its partition (``__shoal_row``); rows are hash-partitioned on the common
   window keys. A hash exchange concatenates each bucket's rows in partition order, so
   every group arrives whole and in input order;
2. **evaluate** (one task per bucket): the stage input tags each row with the index of the
   partition it came from (``__shoal_part``, :attr:`StageInput.source_column`); the
   projection (or filter) runs on the bucket, keeping both tags; the rows are then
   range-partitioned on ``__shoal_part`` with fixed boundaries ``1 .. N-1``, so that
   bucket ``p`` of every task holds the rows of input partition ``p``;
3. **restore the order** (one task per input partition, reading bucket ``p`` of every
   evaluate task): sort by ``__shoal_row`` and drop the tags. The output partitions are
   the input's partitions, each in its input order, which is Polars' row order.

Exactness rests on Polars' rules for ``over``: a window's value on a row depends only on
the rows of its group, in their order (``order_by`` sorts within the group, ties in input
order). Hence only windows with partition keys qualify, every order-dependent or
aggregating part of the expressions must sit inside such a window, the partition keys
and ``order_by`` keys must be row-local, and a window's keys must include the hash keys.
``mapping_strategy="explode"`` changes the number and order of rows (one row per value of
each group, groups in order), so it keeps the gather, as does everything else that does
not qualify.

A window step right after another hash-window plan (with only row-wise steps in between)
whose windows all include that plan's keys joins its evaluate stage: a chain of window
steps over one key costs one round trip (:class:`HashWindow` remembers the open plan).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

from shoal.ir.expr import (
    Col,
    Expr,
    Function,
    NamedExpr,
)
from shoal.ir.nodes import Filter, PlanNode, Project, Sort, StageInput
from shoal.ir.types import DataType, Schema
from shoal.planner.context import OpenFragment, PlanningContext
from shoal.planner.physical import HashOutput, RangeOutput, Stage, StageInputSpec

#: Row number within the input partition (Int64), added before the hash exchange.
ROW_TAG = "__shoal_row"
#: Index of the input partition (UInt32), added by the evaluating stage's input.
PART_TAG = "__shoal_part"

_ROW_TYPE = DataType(pa.int64())
_PART_TYPE = DataType(pa.uint32())


def _is_window(f: Function) -> bool | None:
    """``over`` windows are what this plan runs (see ``Expr.collect_order_dependent``)."""
    return True if f.name == "over" else None


def _window_keys(window: Function) -> tuple[Expr, ...] | None:
    """The partition keys of ``window`` when it may run per hash bucket, else None."""
    n = int(window.option("partitions", 0))
    if n == 0 or window.option("mapping_strategy", "group_to_rows") == "explode":
        return None
    keys = window.args[1 : 1 + n]
    order = window.args[1 + n :]
    if not all(k.is_row_local() for k in (*keys, *order)):
        return None
    # A window inside the window's function is evaluated per outer group; keep it simple
    # and exact: such nestings gather.
    if any(isinstance(e, Function) and e.name == "over" for e in window.args[0].walk()):
        return None
    return keys


def hash_window_keys(exprs: Sequence[Expr]) -> tuple[Expr, ...] | None:
    """The keys to hash-partition on so that ``exprs`` can be evaluated per bucket: the
    partition keys common to every window of ``exprs`` (in the first window's order).
    None when ``exprs`` have no window, a part outside the windows depends on other rows,
    a window does not qualify (see the module docstring) or the windows share no key."""
    windows: list[Function] = []
    if not all(e.collect_order_dependent(_is_window, windows) for e in exprs) or not windows:
        return None
    common: list[Expr] | None = None
    for w in windows:
        keys = _window_keys(w)
        if keys is None:
            return None
        if common is None:
            common = list(dict.fromkeys(keys))
        else:
            common = [k for k in common if k in keys]
    # A constant key (Polars shows ``over(order_by=...)`` without partition keys as a window
    # over ``lit(1)``) puts every row in one bucket: a gather costs less.
    common = [k for k in common or () if k.columns()]
    return tuple(common) if common else None


def _with_tags(schema: Schema, *tags: tuple[str, DataType]) -> Schema:
    return Schema.of([*schema.items(), *tags])


@dataclass
class HashWindow:
    """A hash-window plan whose output is still the open fragment ``tail``: a following
    window projection or filter over the same keys joins its evaluate stage (no second
    round trip). ``keys`` are the hash keys as expressions over ``tail``'s columns."""

    tail: PlanNode
    window: Stage
    keys: tuple[Expr, ...]


def plan_hash_window(
    b: PlanningContext, op: OpenFragment, node: Project | Filter
) -> OpenFragment | None:
    """Plan ``node`` (over the planned input ``op``, several partitions) as a hash-window
    plan when its windows allow it (:func:`hash_window_keys`); None otherwise, and nothing
    is planned. The returned fragment has ``op``'s partitions, in input order. A node right
    above another hash-window plan whose keys are among its own windows' keys joins that
    plan's evaluate stage."""
    exprs = [e.expr for e in node.exprs] if isinstance(node, Project) else [node.predicate]
    keys = hash_window_keys(exprs)
    if keys is None:
        return None
    in_schema = node.input.schema
    if {ROW_TAG, PART_TAG} & {*in_schema.names, *node.schema.names}:
        return None  # a user column named like a tag: gather instead
    fused = _join_previous(b, op, node, keys)
    if fused is not None:
        return fused
    parts = op.num_tasks
    # 1. number the rows of each partition, hash-partition on the keys.
    tagged = _with_tags(in_schema, (ROW_TAG, _ROW_TYPE))
    row_number = Function("int_range", (), (("start", 0),), _ROW_TYPE)
    op.wrap(
        Project(
            op.node,
            (
                *(NamedExpr(n, Col(n, t)) for n, t in in_schema.items()),
                NamedExpr(ROW_TAG, row_number),
            ),
            tagged,
        )
    )
    n = b.shuffle_n(op)
    shuffled = b.cut(op, HashOutput(keys, n), name=f"{op.name}+window-shuffle")
    # 2. evaluate per bucket, each row tagged with its input partition; route the rows back
    # to their partitions by a range exchange with fixed boundaries 1 .. parts-1.
    bucket_schema = _with_tags(tagged, (PART_TAG, _PART_TYPE))
    source = StageInput(0, bucket_schema, source_column=PART_TAG)
    evaluated = _evaluate(node, source)
    bounds = pa.table({"__k0": pa.array(range(1, parts), pa.uint32())})
    route = RangeOutput((_PART,), (False,), (False,), parts, bounds)
    spec = StageInputSpec(shuffled.id, "bucket", bucket_schema)
    window = b.cut(
        _open(evaluated, n, [spec], op.est_bytes, "window"), route, name="window-evaluate"
    )
    return _restore(b, window, evaluated, node, parts, keys)


def _join_previous(
    b: PlanningContext, op: OpenFragment, node: Project | Filter, keys: tuple[Expr, ...]
) -> OpenFragment | None:
    """``node`` added to the evaluate stage of the hash-window plan below it, when there is
    one with only row-wise projections and filters in between (they move into the evaluate
    stage too: a row-wise step gives the same rows in any order) and its keys, unchanged
    by those steps, are among ``keys``. None when there is no such plan."""
    between: list[Project | Filter] = []
    below = op.node
    while True:
        found = b.hash_windows.get(id(below))
        if found is not None and found.tail is below:
            break
        if not isinstance(below, Project | Filter) or not _row_wise(below):
            return None
        between.append(below)
        below = below.input
    hashed = found.keys
    evaluated = found.window.fragment
    for step in reversed(between):
        hashed = _passed_through(step, hashed)
        evaluated = _evaluate(step, evaluated)
    if not hashed or not set(hashed) <= set(keys):
        return None
    return _restore(b, found.window, _evaluate(node, evaluated), node, op.num_tasks, hashed)


def _row_wise(node: Project | Filter) -> bool:
    """Each output row is computed from its input row alone (a projection of literals only
    is one row, not one per input row, unless it keeps its input's height: not row-wise)."""
    if isinstance(node, Filter):
        return node.predicate.is_row_local()
    exprs = [e.expr for e in node.exprs]
    return all(e.is_row_local() for e in exprs) and (
        node.keep_height or any(e.columns() for e in exprs)
    )


_ROW = Col(ROW_TAG, _ROW_TYPE)
_PART = Col(PART_TAG, _PART_TYPE)


def _evaluate(node: Project | Filter, child: PlanNode) -> Project | Filter:
    """``node`` over ``child`` (its input's columns plus the tags), keeping the tags."""
    if isinstance(node, Filter):
        return Filter(child, node.predicate, child.schema)
    schema = _with_tags(node.schema, (ROW_TAG, _ROW_TYPE), (PART_TAG, _PART_TYPE))
    tags = (NamedExpr(ROW_TAG, _ROW), NamedExpr(PART_TAG, _PART))
    return Project(child, (*node.exprs, *tags), schema, node.keep_height)


def _restore(
    b: PlanningContext,
    window: Stage,
    evaluated: Project | Filter,
    node: Project | Filter,
    parts: int,
    keys: tuple[Expr, ...],
) -> OpenFragment:
    """3. each input partition's rows back in input order, without the tags: the fragment
    that reads bucket ``p`` of the evaluate stage ``window`` (whose fragment becomes
    ``evaluated``) and sorts it by row number. Remembers the plan for a following node."""
    window.fragment = evaluated
    back = b.read(window, "bucket", parts, "window")
    back.wrap(Sort(back.node, (_ROW,), (False,), (False,), False, evaluated.schema))
    final = node.schema
    back.wrap(Project(back.node, tuple(NamedExpr(c, Col(c, t)) for c, t in final.items()), final))
    kept = _passed_through(node, keys)
    if kept:
        b.hash_windows[id(back.node)] = HashWindow(back.node, window, kept)
    return back


def _passed_through(node: Project | Filter, keys: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """``keys`` when every column they read leaves ``node`` unchanged under its name (so
    they mean the same over ``node``'s output), else ()."""
    if isinstance(node, Filter):
        return keys
    same = {e.name for e in node.exprs if isinstance(e.expr, Col) and e.expr.name == e.name}
    return keys if all(k.columns() <= same for k in keys) else ()


def _open(
    node: Project | Filter, tasks: int, inputs: list[StageInputSpec], est: int, name: str
) -> OpenFragment:
    return OpenFragment(node, tasks, inputs, est_bytes=est, name=name)
