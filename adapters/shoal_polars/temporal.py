"""Translation of Polars' temporal and ordered operators (NodeTraverser version (16, 0)).

* ``join_asof`` is a ``Join`` whose ``how`` is the tuple
  ``("AsOf", strategy, tolerance, tolerance_str, left_by, right_by, allow_exact_matches,
  check_sortedness)`` -> :class:`~shoal.ir.nodes.AsofJoin`;
* ``group_by_dynamic`` and ``rolling`` are a ``GroupBy`` whose ``options.dynamic``
  (``DynamicGroupOptions``) or ``options.rolling`` (``RollingGroupOptions``) is set ->
  :class:`~shoal.ir.nodes.DynamicGroupBy` / :class:`~shoal.ir.nodes.RollingGroupBy`;
* ``merge_sorted`` is the ``MergeSorted`` node -> :class:`~shoal.ir.nodes.MergeSorted`.

Polars shows durations as ``(months, weeks, days, nanoseconds, parsed_int, negative)``;
the IR carries them as strings of Polars' duration language (``"1mo2d"``, ``"3i"``).
"""

from __future__ import annotations

from typing import Any, cast

from shoal.ir.expr import NamedExpr
from shoal.ir.nodes import (
    AsofJoin,
    AsofStrategy,
    ClosedWindow,
    DynamicGroupBy,
    MergeSorted,
    PlanNode,
    RollingGroupBy,
    WindowLabel,
    WindowStart,
)
from shoal.ir.types import Schema
from shoal_polars.translate import NODES, Translator

_STRATEGIES = frozenset({"backward", "forward", "nearest"})
_CLOSED = frozenset({"left", "right", "both", "none"})
#: Polars' serialised ``Label`` / ``StartBy`` names -> the names its Python API takes.
_LABELS = {"left": "left", "right": "right", "data_point": "datapoint", "datapoint": "datapoint"}
_STARTS = {"window_bound": "window", "data_point": "datapoint", "datapoint": "datapoint"}
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def duration_text(raw: Any, integer_index: bool) -> str:
    """Polars' ``(months, weeks, days, nanoseconds, parsed_int, negative)`` as a duration
    string (``"-1mo2w"``, ``"3h"`` as ``"10800000000000ns"``, ``"3i"``). An integer index
    counts in ``"i"`` units, which Polars stores in the nanoseconds field."""
    months, weeks, days, nsecs, parsed_int, negative = raw
    if parsed_int or integer_index:
        text = f"{int(nsecs)}i"
    else:
        parts = [f"{int(v)}{u}" for v, u in ((months, "mo"), (weeks, "w"), (days, "d")) if v]
        if nsecs or not parts:
            parts.append(f"{int(nsecs)}ns")
        text = "".join(parts)
    return f"-{text}" if negative else text


def asof_join(t: Translator, node: Any, schema: Schema) -> PlanNode:
    """``join_asof``: a ``Join`` node whose ``options[0]`` is the AsOf tuple."""
    how, _nulls_equal, _slice, suffix, coalesce, _order = node.options
    _, strategy, tolerance, tolerance_str, left_by, right_by, exact, check_sorted = how
    left = t.plan(node.input_left)
    right = t.plan(node.input_right)
    left_on = t.named_at(node.input_left, node.left_on, "Join(how=AsOf)")
    right_on = t.named_at(node.input_right, node.right_on, "Join(how=AsOf)")
    if str(strategy) not in _STRATEGIES:
        t.error(f"Join(how=AsOf, strategy={strategy!r})", "unknown as-of strategy")
        return t.placeholder(schema)
    if len(left_on) != 1 or len(right_on) != 1:
        t.error("Join(how=AsOf)", f"expects one key per side, got {len(left_on)}, {len(right_on)}")
        return t.placeholder(schema)
    return AsofJoin(
        left,
        right,
        left_on[0].expr,
        right_on[0].expr,
        tuple(str(c) for c in left_by or ()),
        tuple(str(c) for c in right_by or ()),
        cast(AsofStrategy, str(strategy)),
        str(tolerance_str) if tolerance_str is not None else tolerance,
        bool(exact),
        bool(check_sorted),
        str(suffix),
        bool(coalesce),
        schema,
    )


def temporal_group_by(
    t: Translator,
    options: Any,
    child: PlanNode,
    keys: tuple[NamedExpr, ...],
    aggs: tuple[NamedExpr, ...],
    schema: Schema,
) -> PlanNode:
    """``group_by_dynamic`` (``options.dynamic``) or ``rolling`` (``options.rolling``)."""
    dyn = options.dynamic
    opts = dyn if dyn is not None else options.rolling
    what = "group_by_dynamic" if dyn is not None else "rolling"
    index = str(opts.index_column)
    if index not in child.schema:
        t.error(f"GroupBy({what})", f"index column {index!r} is not in the input")
        return t.placeholder(schema)
    integer = child.schema[index].is_integer
    closed = str(opts.closed_window)
    if closed not in _CLOSED:
        t.error(f"GroupBy({what}, closed={closed!r})", "unknown closed window")
        return t.placeholder(schema)
    if dyn is None:
        return RollingGroupBy(
            child,
            index,
            duration_text(opts.period, integer),
            duration_text(opts.offset, integer),
            cast(ClosedWindow, closed),
            keys,
            aggs,
            schema,
        )
    label = _LABELS.get(str(dyn.label))
    start = str(dyn.start_by)
    start = _STARTS.get(start, start if start in _WEEKDAYS else "")
    if label is None or not start:
        t.error(f"GroupBy({what})", f"unknown label {dyn.label!r} or start_by {dyn.start_by!r}")
        return t.placeholder(schema)
    return DynamicGroupBy(
        child,
        index,
        duration_text(dyn.every, integer),
        duration_text(dyn.period, integer),
        duration_text(dyn.offset, integer),
        cast(ClosedWindow, closed),
        cast(WindowLabel, label),
        bool(dyn.include_boundaries),
        cast(WindowStart, start),
        keys,
        aggs,
        schema,
    )


def _merge_sorted(t: Translator, node: Any, schema: Schema) -> PlanNode:
    # merge_sorted(key=[k1, k2]) merges by every key in order, not by the first alone.
    key = node.key
    keys = tuple(str(k) for k in key) if isinstance(key, list | tuple) else (str(key),)
    return MergeSorted(t.plan(node.input_left), t.plan(node.input_right), keys, schema)


NODES["MergeSorted"] = _merge_sorted
