"""The builder's temporal and ordered operators: :meth:`Frame.join_asof`,
:meth:`Frame.group_by_dynamic`, :meth:`Frame.rolling` and :meth:`Frame.merge_sorted`
(:mod:`shoal.plan.builder` delegates to the functions here).

Each follows the signature and defaults of the Polars method of the same name and checks
at plan time what Polars would only find at run time: unknown columns, index and key
dtypes Polars' kernels refuse (``group_by_dynamic`` takes an Int32, Int64, Date or Datetime
index; ``rolling`` also UInt32 and UInt64), as-of keys and by-columns of different types,
durations of the wrong kind for the index (``"3i"`` counts rows of an integer index, the
other units need a temporal one), and tolerances of the wrong kind for the key. Every such
error is a :class:`shoal.PlanError` naming the node, the column and its type. Whether the
data is sorted is only known when it runs: Polars raises there where it checks.
"""

from __future__ import annotations

import builtins
import datetime
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, get_args

import pyarrow as pa

from shoal.errors import PlanError
from shoal.ir.expr import NamedExpr
from shoal.ir.nodes import (
    AsofJoin,
    AsofStrategy,
    ClosedWindow,
    DynamicGroupBy,
    MergeSorted,
    PlanNode,
    RollingGroupBy,
    StageInput,
    WindowLabel,
    WindowStart,
)
from shoal.ir.types import DataType, Schema
from shoal.plan.builder import (
    ExprBuilder,
    Frame,
    IntoExpr,
    _cols_outside_aggs,
    _flatten,
    _kernel_schema,
    _u,
    _UAlias,
    _unique_names,
)

if TYPE_CHECKING:
    from collections.abc import Callable

#: One duration of Polars' duration language: ``"1mo2d"``, ``"-90m"``, ``"3i"``.
_DURATION = re.compile(r"-?(\d+(ns|us|ms|s|m|h|d|w|mo|q|y))+|-?\d+i")
Duration = builtins.str | datetime.timedelta


def _is_datetime(dt: DataType) -> bool:
    return pa.types.is_date32(dt.arrow) or pa.types.is_timestamp(dt.arrow)


def _index_column(frame: Frame, name: Any, where: str, rolling: bool) -> tuple[str, bool]:
    """The index column's name and whether it is an integer index; ``PlanError`` for a
    missing column or a type Polars' window kernels refuse."""
    if not isinstance(name, builtins.str):
        raise PlanError(f"{where}: index_column must be a column name, got {name!r}")
    if name not in frame.schema:
        raise PlanError(f"{where}: index column {name!r} is not in the schema {frame.schema}")
    dt = frame.schema[name]
    ints = (pa.int32(), pa.int64()) + ((pa.uint32(), pa.uint64()) if rolling else ())
    if dt.arrow in ints:
        return name, True
    if _is_datetime(dt):
        return name, False
    allowed = "Int32, Int64, UInt32, UInt64" if rolling else "Int32, Int64"
    raise PlanError(
        f"{where}: index column {name!r} is {dt}; Polars needs {allowed}, Date or Datetime"
    )


def _duration(value: Any, what: str, integer: bool, where: str) -> str:
    """``value`` (a duration string or a ``timedelta``) as a duration string checked
    against the index kind: ``"<n>i"`` for an integer index, other units otherwise."""
    if isinstance(value, datetime.timedelta):
        if integer:
            raise PlanError(f"{where}: {what}={value!r} is a time span; an integer index "
                            "takes a duration in index units such as '3i'")  # fmt: skip
        return f"{value // datetime.timedelta(microseconds=1)}us"
    if not isinstance(value, builtins.str) or not _DURATION.fullmatch(value):
        raise PlanError(
            f"{where}: {what}={value!r} is not a duration of Polars' duration language "
            "('1h', '2d', '1mo', '3i', ...)"
        )
    if value.endswith("i") != integer:
        kind = "an integer" if integer else "a temporal"
        need = "index units ('3i')" if integer else "time units ('1h', '2d', '1mo')"
        raise PlanError(f"{where}: {what}={value!r} does not fit {kind} index: use {need}")
    return value


def _negated(duration: str) -> str:
    return duration[1:] if duration.startswith("-") else f"-{duration}"


def _choice(value: Any, options: Any, what: str, where: str) -> Any:
    allowed = get_args(options)
    if value not in allowed:
        raise PlanError(f"{where}: {what}={value!r} is not one of {list(allowed)}")
    return value


class WindowGroupBy:
    """``frame.group_by_dynamic(...)`` or ``frame.rolling(...)``: finish with :meth:`agg`."""

    def __init__(
        self,
        frame: Frame,
        where: str,
        keys: tuple[NamedExpr, ...],
        make: Callable[..., PlanNode],
    ) -> None:
        self._frame = frame
        self._where = where
        self._keys = keys
        self._make = make  # make(input, keys, aggs, schema) -> the IR node

    def agg(self, *aggs: IntoExpr, **named: IntoExpr) -> Frame:
        """One row per window (``group_by_dynamic``) or per input row (``rolling``): the
        group columns, the index (and window boundaries), then ``aggs``. Every column an
        aggregation reads must be inside an aggregate function (``PlanError`` otherwise,
        as in :meth:`Frame.aggregate`)."""
        where = self._where
        items: list[Any] = _flatten(aggs)
        items.extend(ExprBuilder(_UAlias(_u(v), k)) for k, v in named.items())
        agg_items = self._frame._named(items, {}, where)
        for a in agg_items:
            outside = _cols_outside_aggs(a.expr)
            if outside:
                raise PlanError(
                    f"{where}: aggregation {a.name!r} ({a.expr}) reads column "
                    f"{sorted(outside)[0]!r} outside an aggregate function"
                )
        keys = self._keys
        shell = self._make(StageInput(0, self._frame.schema), keys, tuple(agg_items), Schema(()))
        schema = _kernel_schema(shell, [self._frame.schema], where)
        _unique_names(schema.names, where)
        return Frame(self._make(self._frame.plan, keys, tuple(agg_items), schema))


def _group_keys(frame: Frame, group_by: Any, where: str) -> tuple[NamedExpr, ...]:
    keys = [] if group_by is None else _flatten([group_by])
    out = frame._named(keys, {}, f"{where}, group_by")
    for k in out:
        if k.expr.has_agg():
            raise PlanError(f"{where}: group_by key {k.name!r} ({k.expr}) contains an aggregate")
    return tuple(out)


def group_by_dynamic(
    frame: Frame,
    index_column: str,
    *,
    every: Duration,
    period: Duration | None = None,
    offset: Duration | None = None,
    include_boundaries: bool = False,
    closed: ClosedWindow = "left",
    label: WindowLabel = "left",
    group_by: IntoExpr | Sequence[IntoExpr] | None = None,
    start_by: WindowStart = "window",
) -> WindowGroupBy:
    """See :meth:`shoal.plan.builder.Frame.group_by_dynamic`."""
    where = "DynamicGroupBy"
    index, integer = _index_column(frame, index_column, where, rolling=False)
    every_s = _duration(every, "every", integer, where)
    period_s = every_s if period is None else _duration(period, "period", integer, where)
    zero = "0i" if integer else "0ns"
    offset_s = zero if offset is None else _duration(offset, "offset", integer, where)
    _choice(closed, ClosedWindow, "closed", where)
    _choice(label, WindowLabel, "label", where)
    _choice(start_by, WindowStart, "start_by", where)
    keys = _group_keys(frame, group_by, where)

    def make(inp: PlanNode, keys: Any, aggs: Any, schema: Schema) -> PlanNode:
        return DynamicGroupBy(
            inp, index, every_s, period_s, offset_s, closed, label, bool(include_boundaries),
            start_by, keys, aggs, schema,
        )  # fmt: skip

    return WindowGroupBy(frame, where, keys, make)


def rolling(
    frame: Frame,
    index_column: str,
    *,
    period: Duration,
    offset: Duration | None = None,
    closed: ClosedWindow = "right",
    group_by: IntoExpr | Sequence[IntoExpr] | None = None,
) -> WindowGroupBy:
    """See :meth:`shoal.plan.builder.Frame.rolling`."""
    where = "RollingGroupBy"
    index, integer = _index_column(frame, index_column, where, rolling=True)
    period_s = _duration(period, "period", integer, where)
    offset_s = _negated(period_s) if offset is None else _duration(offset, "offset", integer, where)
    _choice(closed, ClosedWindow, "closed", where)
    keys = _group_keys(frame, group_by, where)

    def make(inp: PlanNode, keys: Any, aggs: Any, schema: Schema) -> PlanNode:
        return RollingGroupBy(inp, index, period_s, offset_s, closed, keys, aggs, schema)

    return WindowGroupBy(frame, where, keys, make)


def _asof_key_ok(dt: DataType) -> bool:
    return dt.is_numeric or dt.is_temporal or dt.is_string


def _tolerance(value: Any, key: DataType, where: str) -> Any:
    if value is None:
        return None
    if key.is_temporal:
        if isinstance(value, datetime.timedelta):
            return f"{value // datetime.timedelta(microseconds=1)}us"
        if isinstance(value, builtins.str) and _DURATION.fullmatch(value) and value[-1] != "i":
            return value
        raise PlanError(
            f"{where}: tolerance={value!r} does not fit the {key} key: give a duration "
            "('1h', '2d') or a timedelta"
        )
    number = isinstance(value, builtins.int | builtins.float) and not isinstance(value, bool)
    if key.is_numeric and number:
        return value
    raise PlanError(f"{where}: tolerance={value!r} does not fit the {key} key: give a number")


def _names(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, builtins.str) else list(value)


def join_asof(
    left: Frame,
    right: Frame,
    *,
    left_on: IntoExpr | None = None,
    right_on: IntoExpr | None = None,
    on: IntoExpr | None = None,
    by_left: builtins.str | Sequence[builtins.str] | None = None,
    by_right: builtins.str | Sequence[builtins.str] | None = None,
    by: builtins.str | Sequence[builtins.str] | None = None,
    strategy: AsofStrategy = "backward",
    suffix: builtins.str = "_right",
    tolerance: Any = None,
    allow_exact_matches: bool = True,
    check_sortedness: bool = True,
    coalesce: bool = True,
) -> Frame:
    """See :meth:`shoal.plan.builder.Frame.join_asof`."""
    where = "AsofJoin"
    if not isinstance(right, Frame):
        raise TypeError(f"join_asof() takes a Frame, got {type(right).__name__}")
    if on is not None and (left_on is not None or right_on is not None):
        raise PlanError(f"{where}: give on= or left_on=/right_on=, not both")
    if on is not None:
        left_on = right_on = on
    if left_on is None or right_on is None:
        raise PlanError(f"{where}: needs on= or both left_on= and right_on=")
    if by is not None and (by_left is not None or by_right is not None):
        raise PlanError(f"{where}: give by= or by_left=/by_right=, not both")
    lby, rby = (_names(by), _names(by)) if by is not None else (_names(by_left), _names(by_right))
    _choice(strategy, AsofStrategy, "strategy", where)
    lkey = left._resolve(left_on, f"{where}, left key")[1]
    rkey = right._resolve(right_on, f"{where}, right key")[1]
    for side, key in (("left", lkey), ("right", rkey)):
        if not _asof_key_ok(key.dtype):
            raise PlanError(
                f"{where}: {side} key {key} is {key.dtype}; an as-of key must be numeric, "
                "temporal or a string"
            )
    if lkey.dtype != rkey.dtype:
        raise PlanError(
            f"{where}: as-of keys have different types: left {lkey} is {lkey.dtype}, right "
            f"{rkey} is {rkey.dtype} (cast one side)"
        )
    if builtins.len(lby) != builtins.len(rby):
        raise PlanError(
            f"{where}: {builtins.len(lby)} left and {builtins.len(rby)} right by-columns"
        )
    for side, names, frame in (("left", lby, left), ("right", rby, right)):
        for n in names:
            if n not in frame.schema:
                raise PlanError(
                    f"{where}: {side} by-column {n!r} is not in the schema {frame.schema}"
                )
    for a, b in zip(lby, rby, strict=True):
        if left.schema[a] != right.schema[b]:
            raise PlanError(
                f"{where}: by-columns {a!r} (left, {left.schema[a]}) and {b!r} (right, "
                f"{right.schema[b]}) have different types"
            )
    options: dict[str, Any] = dict(
        left_on=lkey,
        right_on=rkey,
        left_by=tuple(lby),
        right_by=tuple(rby),
        strategy=strategy,
        tolerance=_tolerance(tolerance, lkey.dtype, where),
        allow_exact_matches=bool(allow_exact_matches),
        check_sortedness=bool(check_sortedness),
        suffix=suffix,
        coalesce=bool(coalesce),
    )
    shell = AsofJoin(
        left=StageInput(0, left.schema), right=StageInput(1, right.schema), schema=Schema(()),
        **options,
    )  # fmt: skip
    schema = _kernel_schema(shell, [left.schema, right.schema], where)
    return Frame(AsofJoin(left=left.plan, right=right.plan, schema=schema, **options))


def merge_sorted(left: Frame, right: Frame, key: builtins.str | Sequence[builtins.str]) -> Frame:
    """See :meth:`shoal.plan.builder.Frame.merge_sorted`."""
    where = "MergeSorted"
    if not isinstance(right, Frame):
        raise TypeError(f"merge_sorted() takes a Frame, got {type(right).__name__}")
    keys = (key,) if isinstance(key, builtins.str) else tuple(key)
    if not keys:
        raise PlanError(f"{where}: no key to merge by")
    for k in keys:
        if not isinstance(k, builtins.str) or k not in left.schema:
            raise PlanError(f"{where}: key {k!r} is not a column of the schema {left.schema}")
    if right.schema != left.schema:
        raise PlanError(
            f"{where}: both inputs need the same schema: left {left.schema}, right {right.schema}"
        )
    for k in keys:
        dt = left.schema[k]
        if not (dt.is_numeric or dt.is_temporal or dt.is_string or dt.arrow == pa.bool_()):
            raise PlanError(f"{where}: key {k!r} is {dt}, which has no order to merge by")
    return Frame(MergeSorted(left.plan, right.plan, keys, left.schema))
