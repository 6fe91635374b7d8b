"""Polars expression nodes (NodeTraverser version (16, 0)) -> shoal IR expressions.

One function per Polars expression class, chosen by class name in :data:`_EXPRS`. Every IR
expression carries the dtype Polars resolved for it (``nt.get_dtype``), which also gives
"dynamic" literals (``pl.lit(1)`` next to a ``UInt8`` column) their real type. Expressions
are translated with the NodeTraverser cursor on the node whose columns they read (a
node's input), since ``get_dtype`` resolves column names against the current node.
What cannot be translated is recorded on the :class:`~shoal_polars.translate.Translator`
and replaced by a placeholder so that translation goes on.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
from polars._plr import PySeries

from shoal.ir.expr import Agg, BinaryOp, Cast, Col, Expr, Function, Lit, Ternary
from shoal.ir.functions import FUNCTION_TABLE
from shoal.ir.types import BOOL, DataType
from shoal_polars.functions import function_key, lookup
from shoal_polars.rewrite import OPAQUE_EVAL, EvalStandIn, eval_stand_in

if TYPE_CHECKING:
    from shoal_polars.translate import Translator

ExprHandler = Callable[["Translator", Any, int, DataType, str], Expr]

#: Polars ``Operator`` names -> IR binary operator names (Polars' ``/`` is ``TrueDivide``).
OPERATORS: dict[str, str] = {
    "Plus": "add",
    "Minus": "sub",
    "Multiply": "mul",
    "TrueDivide": "truediv",
    "FloorDivide": "floordiv",
    "Modulus": "mod",
    "Eq": "eq",
    "NotEq": "ne",
    "Lt": "lt",
    "LtEq": "le",
    "Gt": "gt",
    "GtEq": "ge",
    "EqValidity": "eq_missing",
    "NotEqValidity": "ne_missing",
    "And": "and",
    "Or": "or",
    "Xor": "xor",
    "LogicalAnd": "and",
    "LogicalOr": "or",
}

#: Polars ``Agg`` names that map one to one onto IR aggregates.
_PLAIN_AGGS = frozenset(
    {"sum", "mean", "n_unique", "first", "last", "median", "first_non_null", "last_non_null",
     "implode"}
)  # fmt: skip

#: Polars ``CastOptions`` codes: 0 strict, 1 non-strict (null on failure), 2 overflowing
#: (numbers wrap around: ``wrap_numerical``).
_CAST_STRICT = {0: True, 1: False, 2: False}
_CAST_WRAP = 2

#: Polars ``over(mapping_strategy=...)`` as the NodeTraverser shows it -> Polars' name.
_MAPPING_STRATEGIES = {"groups_to_rows": "group_to_rows", "explode": "explode", "join": "join"}

#: Expression classes shoal cannot run, with the reason.
_UNSUPPORTED_EXPRS: dict[str, str] = {
    "Rolling": "rolling windows are not supported",
    "RollingFunction": "rolling windows are not supported",
    "RollingFunctionBy": "rolling windows are not supported",
}


def translate_expr(t: Translator, node: int, where: str) -> Expr:
    """Translate Polars expression ``node`` (viewed at the cursor's current node).

    Never raises for an unsupported expression: the reason is recorded on ``t`` (naming
    ``where``, the Polars plan node it belongs to) and a placeholder is returned.
    """
    try:
        view = t.nt.view_expression(node)
    except NotImplementedError as exc:
        if "anonymousfunction" in str(exc).lower():
            reason = "Python UDFs (map_batches, map_elements) cannot run in shoal"
        else:  # e.g. sort_by(...).last() rewritten to max_by: "total order min_by/max_by"
            reason = "Polars does not show this expression to engines"
        t.error(f"{where}: expression ({exc})", reason)
        if str(exc) == OPAQUE_EVAL:
            t.rewritable.add(f"{where}: expression ({exc}): {reason}")
        return t.placeholder_expr()
    name = type(view).__name__
    if name == "Column":
        dtype = t.column_dtype(view.name, node, where)
    else:
        dtype = t.dtype(node, where)
    handler = _EXPRS.get(name)
    if handler is None:
        reason = _UNSUPPORTED_EXPRS.get(name, "expression class not supported by shoal")
        t.error(f"{where}: expression {name}", reason)
        return t.placeholder_expr(dtype)
    return handler(t, view, node, dtype, where)


def _column(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    return Col(view.name, dtype)


def literal_value(value: Any, dtype: pl.DataType) -> Any:
    """The Python value of a Polars literal: a Series becomes a list, an integer duration
    becomes a ``datetime.timedelta`` (a nanosecond one that is not a whole number of
    microseconds stays the integer). Raises ``ValueError`` when a value cannot be kept
    exactly."""
    if isinstance(value, pl.Series):
        return value.to_list()
    if isinstance(dtype, pl.Duration) and isinstance(value, int):
        unit = dtype.time_unit or "us"
        if unit == "ns":
            if value % 1000:
                return value  # its physical integer (see shoal.ir.expr.Lit)
            value //= 1000
            unit = "us"
        return datetime.timedelta(**{"microseconds" if unit == "us" else "milliseconds": value})
    return value


def _has_time_of_day(dtype: Any) -> bool:
    """Whether ``dtype`` is or holds (in lists, arrays, structs) a Datetime, Duration or
    Time."""
    if isinstance(dtype, pl.Datetime | pl.Duration | pl.Time):
        return True
    if isinstance(dtype, pl.List | pl.Array):
        return _has_time_of_day(dtype.inner)
    if isinstance(dtype, pl.Struct):
        return any(_has_time_of_day(f.dtype) for f in dtype.fields)
    return False


def _submicro_dtype(dtype: Any) -> bool:
    """Whether values of ``dtype`` may be finer than Python's datetime types hold."""
    if isinstance(dtype, pl.Datetime | pl.Duration):
        return dtype.time_unit == "ns"
    return isinstance(dtype, pl.Time)


def _literal(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    if isinstance(view.value, pl.Series | PySeries):
        # A Series literal is a column of values by position (``with_columns(pl.Series(...))``,
        # the indices of ``gather``), not a scalar: the IR function ``series`` carries it.
        values = (
            pl.Series._from_pyseries(view.value) if isinstance(view.value, PySeries) else view.value
        )
        if _has_time_of_day(values.dtype):
            # Python datetimes, times and timedeltas stop at microseconds (and at year
            # 9999): the values go as their physical integers, which the kernel reads back
            # in the Series' dtype.
            values = values.to_physical()
        return Function("series", (), (("values", tuple(values.to_list())),), dtype)
    polars_dtype = t.polars_dtype(node)
    try:
        value = literal_value(view.value, polars_dtype)
    except ValueError as exc:
        t.error(f"{where}: expression Literal({view.value!r})", str(exc))
        return t.placeholder_expr(dtype)
    inner = polars_dtype.inner if isinstance(polars_dtype, pl.List | pl.Array) else None
    if _submicro_dtype(polars_dtype) or (inner is not None and _submicro_dtype(inner)):
        # Polars' NodeTraverser gives these as Python datetimes and times, cut to the
        # microsecond: Translator.nanoseconds finds the nanoseconds in Polars' plan text.
        try:
            if isinstance(value, list):
                value = [_exact_ns(t, v) for v in value]
            else:
                value = _exact_ns(t, value)
        except ValueError:
            t.error(
                f"{where}: expression Literal({view.value!r}: {polars_dtype})",
                "Polars shows engines nanosecond datetime and time literals to the "
                "microsecond only, and its plan has more than one value with nanoseconds "
                "for this one",
            )
            return t.placeholder_expr(dtype)
    return Lit(value, dtype)


def _between_bounds(t: Translator, view: Any) -> tuple[Lit, Lit] | None:
    """The bounds of ``is_between`` when both are nanosecond datetime (or time) literals
    alike up to the microsecond, exactly: Polars makes ``col == datetime`` on a nanosecond
    column into ``is_between(v, v + 999ns)``, whose two bounds :meth:`Translator.nanoseconds`
    cannot tell apart, but the lower bound is the smaller. None otherwise (the bounds are
    translated one by one)."""
    if len(view.input) != 3:
        return None
    views = [t.nt.view_expression(n) for n in view.input[1:]]
    if not all(type(v).__name__ == "Literal" for v in views):
        return None
    low, high = (v.value for v in views)
    dtypes = [t.polars_dtype(n) for n in view.input[1:]]
    if not (
        isinstance(low, datetime.datetime | datetime.time)
        and low == high
        and dtypes[0] == dtypes[1]
        and _submicro_dtype(dtypes[0])
    ):
        return None
    if t.nanosecond_candidates(low) != {0, 999}:
        return None
    dtype = DataType.from_polars(dtypes[0])
    base = _physical_ns(low)
    return Lit(base, dtype), Lit(base + 999, dtype)


def _exact_ns(t: Translator, value: Any) -> Any:
    """A nanosecond datetime or time literal given cut to the microsecond, exactly: as
    itself when it is a whole number of microseconds, else as its physical integer (see
    :class:`~shoal.ir.expr.Lit`). Raises ``ValueError`` when that cannot be told."""
    if not isinstance(value, datetime.datetime | datetime.time):
        return value
    found = t.nanoseconds(value)
    if found is None:
        raise ValueError(value)
    return _physical_ns(value) + found if found else value


def _physical_ns(value: datetime.datetime | datetime.time) -> int:
    """Nanoseconds since the epoch (UTC; a naive datetime as if in UTC) or since midnight."""
    if isinstance(value, datetime.time):
        seconds = value.hour * 3600 + value.minute * 60 + value.second
        return (seconds * 1_000_000 + value.microsecond) * 1000
    naive = value.replace(tzinfo=None) - (value.utcoffset() or datetime.timedelta(0))
    delta = naive - datetime.datetime(1970, 1, 1)
    return (delta // datetime.timedelta(microseconds=1)) * 1000


def _binary(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    op_name = str(view.op).rsplit(".", 1)[-1]
    left = translate_expr(t, view.left, where)
    right = translate_expr(t, view.right, where)
    op = OPERATORS.get(op_name)
    if op_name == "Divide":
        divide = _rust_divide(left, right, dtype)
        if divide is not None:
            return divide
        t.error(
            f"{where}: expression BinaryExpr(Divide)",
            "Rust's / (what Polars' SQL EXTRACT writes) other than of floats or of integers "
            "by a constant other than 0 and -1 is not supported",
        )
        return t.placeholder_expr(dtype)
    if op is None:
        t.error(f"{where}: expression BinaryExpr({op_name})", "operator not supported by shoal")
        return t.placeholder_expr(dtype)
    if op in _ARITHMETIC:
        ldt, rdt = _uncast_dtype(t, view.left), _uncast_dtype(t, view.right)
        if _null_operand_disagrees(op, ldt, rdt):
            t.error(
                f"{where}: expression BinaryExpr({op_name}) of {ldt} and {rdt}",
                f"Polars' schema says {dtype.to_polars()} where its engines return another "
                "dtype (an operand of dtype Null)",
            )
            return t.placeholder_expr(dtype)
    if op in ("and", "or", "xor") and not _logical_operands(left.dtype, right.dtype):
        t.error(
            f"{where}: expression BinaryExpr({op_name})",
            f"{op} of {left.dtype} and {right.dtype} is not supported "
            "(booleans, or integers of one type)",
        )
        return t.placeholder_expr(dtype)
    return BinaryOp(op, left, right, dtype)


def _uncast_dtype(t: Translator, node: int) -> pl.DataType:
    """The Polars dtype of expression ``node``, or of its input when it is a cast (type
    coercion casts a Null operand to the other operand's dtype); a column's from the
    cursor node's schema (see :meth:`Translator.column_dtype`)."""
    view = t.nt.view_expression(node)
    if type(view).__name__ == "Cast":
        node = view.expr
        view = t.nt.view_expression(node)
    if type(view).__name__ == "Column":
        got = t.polars_schema().get(view.name)
        if got is not None:
            return got
    return t.polars_dtype(node)


_ARITHMETIC = frozenset({"add", "sub", "mul", "truediv", "floordiv", "mod"})


def _null_operand_disagrees(op: str, left: pl.DataType, right: pl.DataType) -> bool:
    """Whether Polars' plan and its engines disagree on the dtype of ``left op right``
    where an operand is of dtype Null (a ``pl.lit(None)``, an all-null column), as measured
    on Polars 2.1: a Null divided by anything is Null in the plan, Float64 (or Float32,
    Decimal) when run; a Decimal with a Null keeps the Decimal's precision in the plan and
    gets precision 38 when run; a Boolean with a Null stays Boolean in the plan and is
    UInt32 (``+``) or Float64 (``/``) when run."""
    if left != pl.Null and right != pl.Null:
        return False
    if op == "truediv" and left == pl.Null:
        return True
    other = right if left == pl.Null else left
    return isinstance(other, pl.Decimal) or other == pl.Boolean


def _rust_divide(left: Expr, right: Expr, dtype: DataType) -> Expr | None:
    """Polars' ``Divide`` operator (Rust's ``/`` on the operands' type; Polars' SQL writes
    it for ``EXTRACT``), where its meaning is certain: IEEE division of floats (Polars' ``/``
    of floats), and integer division rounding toward zero (``truncdiv``) by an integer
    constant other than 0 (whose Rust meaning Polars' kernels define their own way) and
    -1 (which overflows for the type's minimum). None otherwise."""
    if left.dtype.is_float and right.dtype.is_float and dtype.is_float:
        return BinaryOp("truediv", left, right, dtype)
    ints = all(pa.types.is_integer(d.arrow) for d in (left.dtype, right.dtype, dtype))
    constant = isinstance(right, Lit) and isinstance(right.value, int)
    if ints and constant and right.value not in (0, -1):  # type: ignore[attr-defined]
        return Function("truncdiv", (left, right), (("dtype", dtype),), dtype)
    return None


def _logical_operands(left: DataType, right: DataType) -> bool:
    """Whether ``&``, ``|``, ``^`` of these operands has a meaning the IR carries: Kleene
    logic on two booleans, or bitwise logic on two integers of the same type (Polars casts
    mixed integer operands to their supertype before engines see them)."""
    if left == BOOL and right == BOOL:
        return True
    return left == right and pa.types.is_integer(left.arrow)


def _cast(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    stand_in = _eval_stand_in(t, view.expr)
    if stand_in is not None:
        spec, arg = stand_in
        lst = translate_expr(t, arg, where)
        options = (("eval", spec.template), ("element", spec.element))
        return Function(spec.name, (lst,), options, dtype)
    inner = translate_expr(t, view.expr, where)
    strict = _CAST_STRICT.get(view.options)
    if strict is None:
        t.error(
            f"{where}: expression Cast({inner.dtype} -> {dtype}, options={view.options})",
            "unknown cast option",
        )
        return t.placeholder_expr(dtype)
    target = t.polars_dtype(node)
    if isinstance(target, pl.Enum):
        # shoal's types carry an Enum without its categories (an Arrow dictionary): the
        # kernel casts to the Enum itself, so that values outside it fail or become null
        # as in Polars.
        categories = tuple(target.categories.to_list())
        strict_enum = strict or view.options == _CAST_WRAP
        return Function(
            "cast_enum", (inner,), (("categories", categories), ("strict", strict_enum)), dtype
        )
    if view.options == _CAST_WRAP and not _widening(inner.dtype, dtype):
        return Cast(inner, dtype, strict=False, wrap=True)
    # A wrapping cast that cannot wrap (Polars adds these for supertypes) is a plain one.
    return Cast(inner, dtype, strict or view.options == _CAST_WRAP)


def _eval_stand_in(t: Translator, node: int) -> tuple[EvalStandIn, int] | None:
    """The ``Eval`` whose stand-in ``<list>.hash(seed).cast(dtype)`` is the cast of
    expression ``node`` (see :mod:`shoal_polars.rewrite`), and the list expression."""
    try:
        view = t.nt.view_expression(node)
    except NotImplementedError:
        return None
    if type(view).__name__ != "Function" or len(view.function_data) != 2:
        return None
    head, seed = view.function_data
    if function_key(head) != "hash":
        return None
    spec = eval_stand_in(seed)
    return None if spec is None else (spec, view.input[0])


def _widening(src: DataType, dst: DataType) -> bool:
    """Whether every ``src`` integer fits ``dst`` (an integer or float type)."""
    a, b = src.arrow, dst.arrow
    if not pa.types.is_integer(a):
        return False
    if pa.types.is_floating(b):
        return True
    if not pa.types.is_integer(b):
        return False
    if pa.types.is_signed_integer(a) and pa.types.is_unsigned_integer(b):
        return False
    if pa.types.is_unsigned_integer(a) and pa.types.is_signed_integer(b):
        return b.bit_width > a.bit_width
    return b.bit_width >= a.bit_width


def _ternary(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    return Ternary(
        translate_expr(t, view.predicate, where),
        translate_expr(t, view.truthy, where),
        translate_expr(t, view.falsy, where),
        dtype,
    )


def _agg(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    args = view.arguments if isinstance(view.arguments, list) else [view.arguments]
    arg = translate_expr(t, args[0], where)
    name, options = view.name, view.options
    if name in _PLAIN_AGGS:
        return Agg(name, arg, dtype)
    if name in ("min", "max"):
        # options: propagate_nans (nan_min / nan_max: NaN wins over every number).
        return Agg(f"nan_{name}" if options else name, arg, dtype)
    if name == "count":
        # Polars: count() skips nulls (include_nulls=False); len() counts all values.
        if not options:
            return Agg("count", arg, dtype)
        if isinstance(arg, Col) and not arg.name.startswith("__POLARS_CSER_"):
            return Agg("len", None, dtype)  # a column has the rows of its frame (group)
        # len() of an expression counts its values, which need not be one per row
        # (drop_nulls(), filter(), a literal): its values, null or not.
        return BinaryOp("add", Agg("count", arg, dtype), Agg("null_count", arg, dtype), dtype)
    if name in ("std", "var"):
        if t.nt.get_dtype(args[0]) == pl.Null:
            # Polars answers null (dtype Null); shoal's split (squares summed per
            # partition) cannot square a Null column.
            t.error(f"{where}: expression Agg({name}) of a Null column", "not supported")
            return t.placeholder_expr(dtype)
        return Agg(name, arg, dtype, (("ddof", int(options)),))
    if name == "item":
        # Expr.item(allow_empty=): the group's single value (LazyFrame.pivot's aggregate)
        return Agg("item", arg, dtype, (("allow_empty", bool(options)),))
    t.error(f"{where}: expression Agg({name})", "aggregate not supported by shoal")
    return t.placeholder_expr(dtype)


def _len(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    return Agg("len", None, dtype)


def _alias(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    return translate_expr(t, view.expr, where)


#: Functions whose result dtype Polars' planner and engines disagree on for a UInt128
#: input (the plan's schema says Int64, ``collect`` returns UInt128; Polars 2.1).
_UINT128_TYPE_DISAGREES = frozenset({"cum_sum", "cum_prod", "product"})


def _function(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    data = view.function_data
    # A function without parameters may come as its name alone (TemporalFunction.Replace).
    head, *extra = data if isinstance(data, tuple) else (data,)
    key = function_key(head)
    if key == "dynamic_pred":
        # A runtime filter Polars adds below a top-k sort; always true is exact.
        return Lit(True, BOOL)
    if key in ("sqrt", "cbrt") and view.input:
        arg_dtype = t.nt.get_dtype(view.input[0])
        if not (arg_dtype.is_numeric() or arg_dtype == pl.Boolean):
            # Polars' planner keeps the input's dtype (Date, Time, String, Null, ...), its
            # engines take the root of the physical values (or fail) and return Float64
            # (Polars 2.1): no one answer to give.
            t.error(
                f"{where}: expression Function({key}) of a {arg_dtype} column",
                f"Polars' schema says {arg_dtype} where its engines return Float64",
            )
            return t.placeholder_expr(dtype)
    if key == "interpolate" and view.input and t.nt.get_dtype(view.input[0]) == pl.Boolean:
        t.error(
            f"{where}: expression Function(interpolate) of a Boolean column",
            "Polars' schema and engines disagree (Float64 or Boolean; some paths panic)",
        )
        return t.placeholder_expr(dtype)
    if key in _UINT128_TYPE_DISAGREES and t.nt.get_dtype(view.input[0]) == pl.UInt128:
        # Polars' planner types these Int64 for a UInt128 input, but its engines return
        # UInt128 (Polars 2.1): no one dtype answers both, so the query stays on Polars.
        t.error(
            f"{where}: expression Function({key}) of a UInt128 column",
            "Polars' schema says Int64 where its engines return UInt128",
        )
        return t.placeholder_expr(dtype)
    if key == "BooleanFunction.IsBetween":
        bounds = _between_bounds(t, view)
        if bounds is not None:
            value = translate_expr(t, view.input[0], where)
            return Function("is_between", (value, *bounds), (("closed", extra[0]),), dtype)
    args = tuple(translate_expr(t, i, where) for i in view.input)
    if key == "arg_max" and len(extra) == 2:
        # Polars' NodeTraverser shows arg_sort(descending, nulls_last) under the name
        # "arg_max" (crates/polars-python/src/lazyframe/visitor/expr_nodes.rs); arg_max
        # itself has no parameters.
        descending, nulls_last = (bool(x) for x in extra)
        order = (("descending", descending), ("nulls_last", nulls_last))
        return Function("arg_sort", args, order, dtype)
    if key in ("null_count", "product", "arg_min", "arg_max"):
        if extra:
            t.error(f"{where}: expression Function({key})", f"unexpected parameters {extra!r}")
            return t.placeholder_expr(dtype)
        return Agg(key, args[0], dtype)
    if key == "quantile":
        # quantile(q, interpolation): q must be a literal (Polars allows an expression).
        q = args[1]
        if not isinstance(q, Lit) or not isinstance(q.value, int | float):
            t.error(f"{where}: expression Function(quantile)", "the quantile must be a number")
            return t.placeholder_expr(dtype)
        return Agg("quantile", args[0], dtype, (("quantile", q.value), ("interpolation", extra[0])))
    if key.startswith("RollingFunction."):
        return _rolling(t, key, extra, args, dtype, where)
    if key == "RangeFunction.IntRange":
        # int_range(start, end, step, dtype): the dtype is the function's own.
        return Function("int_range", args, (("step", int(extra[0])), ("dtype", dtype)), dtype)
    if key == "RangeFunction.IntRanges":
        # int_ranges(start, end, step, dtype): one list per row; the dtype is its items'.
        return Function("int_ranges", args, (("dtype", DataType(dtype.arrow.value_type)),), dtype)
    if key == "to_physical" and pa.types.is_dictionary(args[0].dtype.arrow):
        # Categorical codes are Polars' own numbering; shoal carries categories as Arrow
        # dictionaries, whose codes differ.
        t.error(f"{where}: expression Function(to_physical)", "codes of a Categorical or Enum")
        return t.placeholder_expr(dtype)
    if key.startswith("RollingFunctionBy."):
        return _rolling_by(t, key, extra, args, dtype, where)
    if key == "StringFunction.Format":
        return _format(t, extra, args, dtype, where)
    if key == "EwmFunction.MeanBy":
        # ewm_mean_by(by, half_life): order-dependent (gather)
        return Function("ewm_mean_by", args, (("half_life", _duration(extra[0])),), dtype)
    if key == "StringFunction.ExtractGroups":
        # (dtype, pattern): the struct dtype is the function's own
        return Function("str.extract_groups", args, (("pattern", str(extra[1])),), dtype)
    if key in _TEMPORAL_RANGES:
        return _temporal_range(t, key, extra, args, dtype, where)
    # shuffle, sample and rank(method="random") without a seed: random in Polars too. They
    # are order-dependent functions (the planner gathers their input), so one task draws
    # from every row with Polars' own generator: an answer from the same distribution as
    # Polars' (a uniform permutation, a uniform sample), different at each run as Polars'
    # is. Two occurrences of such an expression are evaluated apart, as Polars does.
    if key == "corr":
        return _corr(t, extra, args, dtype, where)
    if key in ("trunc_int_div", "trunc_rem"):
        # Polars' SQL DIV (//) and %: rounding toward zero. Integers only: the remainder of
        # floats is C's fmod, which the kernel has no exact form of.
        if not all(pa.types.is_integer(a.dtype.arrow) for a in args):
            t.error(f"{where}: expression Function({key})", "of non-integer values")
            return t.placeholder_expr(dtype)
        name = "truncdiv" if key == "trunc_int_div" else "truncrem"
        return Function(name, args, (("dtype", dtype),), dtype)
    if key == "set_sorted":
        # A hint that the values are sorted: the values themselves. (Where the hint is
        # false Polars may answer from it wrongly, per its documentation; shoal answers
        # from the values.)
        return args[0]
    if key == "as_struct":
        # pl.struct(...): the field names are those of the struct dtype Polars resolved.
        fields = tuple(f.name for f in dtype.arrow)
        return Function("as_struct", args, (("fields", fields),), dtype)
    if key == "TemporalFunction.OffsetBy":
        # dt.offset_by("1mo"): a literal offset is an option; an expression (one offset per
        # row) is the second argument.
        by = args[1]
        if isinstance(by, Lit) and isinstance(by.value, str):
            return Function("dt.offset_by", args[:1], (("by", by.value),), dtype)
        return Function("dt.offset_by", args[:2], (), dtype)
    if key == "reinterpret":
        # reinterpret(dtype=): the bits of each value as the function's own dtype
        return Function("reinterpret", args, (("dtype", dtype),), dtype)
    if key in ("RangeFunction.TimeRanges", "RangeFunction.TimeRange") and len(extra) == 2:
        # (interval, closed): one list of times per row, or a column of times
        name = "time_ranges" if key.endswith("Ranges") else "time_range"
        return Function(
            name, args, (("interval", _duration(extra[0])), ("closed", str(extra[1]))), dtype
        )
    if key == "BooleanFunction.IsIn" and args[0].dtype.is_enum:
        args = (args[0], _enum_values_as_strings(args[1]), *args[2:])
    found = lookup(key, tuple(extra))
    if isinstance(found, str):
        t.error(f"{where}: expression Function({key})", found)
        return t.placeholder_expr(dtype)
    name, options = found
    low, high = FUNCTION_TABLE[name].arity()
    if len(args) < low or (high is not None and len(args) > high):
        takes = str(low) if low == high else f"{low} to {'any number' if high is None else high}"
        t.error(
            f"{where}: expression Function({key})",
            f"{len(args)} arguments where the IR's {name!r} takes {takes} "
            "(a NodeTraverser change?)",
        )
        return t.placeholder_expr(dtype)
    if name in _TYPED_FUNCTIONS:
        options += (("dtype", dtype),)
    return Function(name, args, options, dtype)


#: Polars' date and datetime range functions -> IR function name.
_TEMPORAL_RANGES = {
    "RangeFunction.DatetimeRanges": "datetime_ranges",
    "RangeFunction.DateRanges": "date_ranges",
    "RangeFunction.DatetimeRange": "datetime_range",
    "RangeFunction.DateRange": "date_range",
}


def _temporal_range(
    t: Translator, key: str, extra: list[Any], args: tuple[Expr, ...], dtype: DataType, where: str
) -> Expr:
    """``datetime_ranges``/``date_ranges`` (a list per row) and ``datetime_range``/
    ``date_range`` (a column) from start, end and an interval. ``function_data`` is
    (interval, closed, [time_unit, time_zone,] mode); the interval is Polars' ``Duration``
    as :func:`_duration` reads it; Polars has already cast
    start and end to the output's unit and zone. Only the start/end/interval form."""
    interval, closed, *_rest, mode = extra
    if mode != "start_end_interval" or len(args) != 2 or len(interval) != 6:
        t.error(f"{where}: expression Function({key}, {mode})", "only start, end and interval")
        return t.placeholder_expr(dtype)
    options = (("interval", _duration(interval)), ("closed", str(closed)))
    return Function(_TEMPORAL_RANGES[key], args, options, dtype)


def _duration(value: Any) -> str:
    """Polars' ``Duration`` as the NodeTraverser shows it, (months, weeks, days,
    nanoseconds, parsed_int, negative), as a duration string (``"-1mo2w3d4ns"``; zero
    parts left out, as ``time_range`` takes no months)."""
    months, weeks, days, nanoseconds, parsed_int, negative = value
    if parsed_int:
        # "3i": a number of index steps (an integer index)
        return f"{'-' if negative else ''}{nanoseconds}i"
    parts = [f"{n}{unit}" for n, unit in ((months, "mo"), (weeks, "w"), (days, "d")) if n]
    if nanoseconds or not parts:
        parts.append(f"{nanoseconds}ns")
    return ("-" if negative else "") + "".join(parts)


#: Polars ``rolling_<fn>_by`` functions shoal runs.
_ROLLING_BY = frozenset({"sum", "mean", "min", "max", "std", "var", "quantile"})


def _rolling_by(
    t: Translator, key: str, extra: list[Any], args: tuple[Expr, ...], dtype: DataType, where: str
) -> Expr:
    """``rolling_<fn>_by(by, window_size, min_samples=, closed=)``: ``function_data`` is
    (window, min_samples, closed, params), params ``(ddof,)`` for std and var,
    ``(quantile, interpolation)`` for quantile (and median); args are (values, by).
    Order-dependent: evaluated after a gather, or per window group inside ``over``."""
    name = key.rsplit(".", 1)[-1].lower().removesuffix("by")
    if name not in _ROLLING_BY or len(extra) != 4 or len(args) != 2:
        t.error(f"{where}: expression Function({key})", "this rolling function is not supported")
        return t.placeholder_expr(dtype)
    window, min_samples, closed, params = extra
    options: tuple[tuple[str, Any], ...] = (
        ("function", name),
        ("window_size", _duration(window)),
        ("min_samples", int(min_samples)),
        ("closed", str(closed)),
    )
    if name in ("std", "var"):
        options += (("ddof", int(params[0]) if params else 1),)
    if name == "quantile":
        options += (("quantile", float(params[0])), ("interpolation", str(params[1])))
    return Function("rolling_by", args, options, dtype)


def _format(
    t: Translator, extra: list[Any], args: tuple[Expr, ...], dtype: DataType, where: str
) -> Expr:
    """``pl.format(fmt, *args)``: ``function_data`` is (the text, the positions in it where
    the arguments go), rebuilt into Polars' format string."""
    text, positions = str(extra[0]), list(extra[1])
    if "{" in text or "}" in text or len(positions) != len(args):
        t.error(f"{where}: expression Function(StringFunction.Format)", "braces in the text")
        return t.placeholder_expr(dtype)
    pieces, last = [], 0
    for pos in positions:
        piece = text.encode()[last:pos].decode()
        pieces.append(piece + "{}")
        last = pos
    fmt = "".join(pieces) + text.encode()[last:].decode()
    return Function("str.format", args, (("format", fmt),), dtype)


def _enum_values_as_strings(values: Expr) -> Expr:
    """The values an Enum column is compared with by ``is_in``: Polars types a list of
    them as a list of the Enum, which shoal carries as a list of Categorical (only a
    top-level Enum keeps its categories), and Polars refuses to look Enum values up in
    Categorical ones. As strings, Polars finds them by name, as in the Enum."""
    t = values.dtype.arrow
    if pa.types.is_large_list(t) and pa.types.is_dictionary(t.value_type):
        strings = DataType(pa.large_list(pa.large_string()))
        if isinstance(values, Lit):
            return Lit(values.value, strings)
        return Cast(values, strings, strict=True)
    return values


#: Functions whose output dtype is a parameter in Polars: it travels as option ``dtype``.
_TYPED_FUNCTIONS = frozenset(
    {"str.to_integer", "str.strptime", "str.json_decode", "replace_strict"}
)

#: ``function_data`` of Polars' ``corr`` (``pl.corr``, ``pl.cov``): method, then parameters.
_CORR_PARAMS = {"pearson": (), "spearman_rank": ("propagate_nans",), "covariance": ("ddof",)}


def _corr(
    t: Translator, extra: list[Any], args: tuple[Expr, ...], dtype: DataType, where: str
) -> Expr:
    """``pl.corr(a, b, method=)`` and ``pl.cov(a, b, ddof=)`` -> IR function ``corr`` with
    option ``method`` (``pearson``, ``spearman_rank`` or ``covariance``)."""
    method, *params = extra
    names = _CORR_PARAMS.get(str(method))
    if names is None or len(params) != len(names):
        t.error(f"{where}: expression Function(corr, {method!r})", "unknown correlation method")
        return t.placeholder_expr(dtype)
    return Function(
        "corr", args, (("method", str(method)), *zip(names, params, strict=True)), dtype
    )


#: Polars rolling window functions shoal runs (``rolling_<name>``).
_ROLLING = frozenset({"min", "max", "mean", "sum", "std", "var", "quantile"})


def _rolling(
    t: Translator, key: str, extra: list[Any], args: tuple[Expr, ...], dtype: DataType, where: str
) -> Expr:
    """``rolling_<fn>(window_size, weights=, min_samples=, center=)`` -> IR function
    ``rolling``; ``function_data`` is (window_size, min_samples, weights, center, params),
    params being ``(ddof,)`` for std and var, ``(quantile, interpolation)`` for quantile
    (and median, which Polars shows as the 0.5 quantile)."""
    name = key.rsplit(".", 1)[-1].lower()
    if name not in _ROLLING or len(extra) != 5:
        t.error(f"{where}: expression Function({key})", "this rolling function is not supported")
        return t.placeholder_expr(dtype)
    window_size, min_samples, weights, center, params = extra
    options: tuple[tuple[str, Any], ...] = (
        ("function", name),
        ("window_size", int(window_size)),
        ("min_samples", int(min_samples)),
        ("weights", None if weights is None else tuple(float(w) for w in weights)),
        ("center", bool(center)),
    )
    if name in ("std", "var"):
        options += (("ddof", int(params[0]) if params else 1),)
    if name == "quantile":
        options += (("quantile", float(params[0])), ("interpolation", str(params[1])))
    return Function("rolling", args, options, dtype)


def _window(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    """``expr.over(partition_by, order_by=...)`` -> IR function ``over``: arguments are the
    function, the partition keys, then the order key (when there is one)."""
    fn = translate_expr(t, view.function, where)
    keys = tuple(translate_expr(t, k, where) for k in view.partition_by)
    order = () if view.order_by is None else (translate_expr(t, view.order_by, where),)
    kind = getattr(view.options, "kind", None)
    strategy = _MAPPING_STRATEGIES.get(str(kind))
    if strategy is None:
        t.error(f"{where}: expression Window({kind})", "window kind not supported by shoal")
        return t.placeholder_expr(dtype)
    options = (
        ("partitions", len(keys)),
        ("ordered", bool(order)),
        ("descending", bool(view.order_by_descending)),
        ("nulls_last", bool(view.order_by_nulls_last)),
        ("mapping_strategy", strategy),
    )
    return Function("over", (fn, *keys, *order), options, dtype)


def _explode(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    """``expr.explode(empty_as_null=, keep_nulls=)`` inside an expression: a column of its
    own length (order-dependent: evaluated after a gather)."""
    empty_as_null, keep_nulls = view.options
    options = (("empty_as_null", bool(empty_as_null)), ("keep_nulls", bool(keep_nulls)))
    return Function("explode", (translate_expr(t, view.expr, where),), options, dtype)


def _gather(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    """``expr.gather(indices)`` and ``expr.get(index)`` (``scalar``): values by position,
    negative positions counting from the end, as Polars defines them."""
    expr = translate_expr(t, view.expr, where)
    idx = translate_expr(t, view.idx, where)
    return Function("gather", (expr, idx), (("scalar", bool(view.scalar)),), dtype)


def _filter(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    """``expr.filter(predicate)``: the values where the predicate holds."""
    args = (translate_expr(t, view.input, where), translate_expr(t, view.by, where))
    return Function("filter", args, (), dtype)


def _slice(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    """``expr.slice(offset, length)`` (also ``head``/``tail``)."""
    args = tuple(translate_expr(t, i, where) for i in (view.input, view.offset, view.length))
    return Function("slice", args, (), dtype)


def _sort(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    """``expr.sort(descending=, nulls_last=)``; options are (stable, nulls_last, descending)."""
    _stable, nulls_last, descending = view.options[:3]
    options = (("descending", bool(descending)), ("nulls_last", bool(nulls_last)))
    return Function("sort", (translate_expr(t, view.expr, where),), options, dtype)


def _sort_by(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    """``expr.sort_by(by, descending=, nulls_last=, maintain_order=)``; options are
    (maintain_order, nulls_last per key, descending per key)."""
    maintain_order, nulls_last, descending = view.sort_options[:3]
    by = tuple(translate_expr(t, b, where) for b in view.by)
    n = len(by)
    options = (
        ("descending", tuple(map(bool, descending * n if len(descending) == 1 else descending))),
        ("nulls_last", tuple(map(bool, nulls_last * n if len(nulls_last) == 1 else nulls_last))),
        ("maintain_order", bool(maintain_order)),
    )
    return Function("sort_by", (translate_expr(t, view.expr, where), *by), options, dtype)


def _struct_eval(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    """``struct.with_fields(...)`` -> IR function ``struct.with_fields``: the struct, then
    one expression per new or replaced field (option ``names``). Polars does not show
    ``pl.field`` to engines, so expressions that read the struct's own fields fall back."""
    if str(view.variant) != "with_fields":
        t.error(f"{where}: expression StructEval({view.variant})", "not supported by shoal")
        return t.placeholder_expr(dtype)
    struct = translate_expr(t, view.expr, where)
    for e in view.evaluation:
        try:
            t.nt.get_dtype(e.node)
        except pl.exceptions.InvalidOperationError:  # "`field` is not allowed in this context"
            entry = f"{where}: expression StructEval(with_fields, {e.output_name!r})"
            reason = (
                "reads the struct's fields with pl.field, which Polars does not show to engines"
            )
            t.error(entry, reason)
            t.rewritable.add(f"{entry}: {reason}")
            return t.placeholder_expr(dtype)
    fields = tuple(translate_expr(t, e.node, where) for e in view.evaluation)
    names = tuple(str(e.output_name) for e in view.evaluation)
    return Function("struct.with_fields", (struct, *fields), (("names", names),), dtype)


_EXPRS: dict[str, ExprHandler] = {
    "Column": _column,
    "Literal": _literal,
    "BinaryExpr": _binary,
    "Cast": _cast,
    "Ternary": _ternary,
    "Agg": _agg,
    "Len": _len,
    "Alias": _alias,
    "Function": _function,
    "Window": _window,
    "Filter": _filter,
    "Gather": _gather,
    "Explode": _explode,
    "Slice": _slice,
    "Sort": _sort,
    "SortBy": _sort_by,
    "StructEval": _struct_eval,
}
