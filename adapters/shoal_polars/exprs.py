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

from shoal.ir.expr import Agg, BinaryOp, Cast, Col, Expr, Function, Lit, Ternary
from shoal.ir.types import BOOL, DataType
from shoal_polars.functions import function_key, lookup

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
_PLAIN_AGGS = frozenset({"sum", "mean", "n_unique", "first", "last", "median"})

#: Polars ``CastOptions`` codes: 0 strict, 1 non-strict (null on failure), 2 overflowing.
_CAST_STRICT = {0: True, 1: False}

#: Expression classes shoal cannot run, with the reason.
_UNSUPPORTED_EXPRS: dict[str, str] = {
    "Window": "window expressions (.over()) are not supported yet",
    "Rolling": "rolling windows are not supported",
    "RollingFunction": "rolling windows are not supported",
    "RollingFunctionBy": "rolling windows are not supported",
    "EwmFunction": "exponentially weighted functions depend on row order",
    "Sort": "sorting inside an expression depends on all rows of the column",
    "SortBy": "sorting inside an expression depends on all rows of the column",
    "Gather": "gather (get/take by index) depends on row positions",
    "Filter": "filtering inside an expression is not supported",
    "Slice": "slicing inside an expression (head/tail/slice of a column) depends on row positions",
    "Explode": "explode changes the number of rows",
}


def translate_expr(t: Translator, node: int, where: str) -> Expr:
    """Translate Polars expression ``node`` (viewed at the cursor's current node).

    Never raises for an unsupported expression: the reason is recorded on ``t`` (naming
    ``where``, the Polars plan node it belongs to) and a placeholder is returned.
    """
    try:
        view = t.nt.view_expression(node)
    except NotImplementedError as exc:
        t.error(
            f"{where}: expression ({exc})",
            "Python UDFs (map_batches, map_elements) cannot run in shoal",
        )
        return t.placeholder_expr()
    dtype = t.dtype(node, where)
    name = type(view).__name__
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
    becomes a ``datetime.timedelta``. Raises ``ValueError`` when a value cannot be kept
    exactly."""
    if isinstance(value, pl.Series):
        return value.to_list()
    if isinstance(dtype, pl.Duration) and isinstance(value, int):
        unit = dtype.time_unit or "us"
        if unit == "ns":
            if value % 1000:
                raise ValueError("nanosecond durations do not fit datetime.timedelta")
            value //= 1000
            unit = "us"
        return datetime.timedelta(**{"microseconds" if unit == "us" else "milliseconds": value})
    return value


def _literal(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    try:
        value = literal_value(view.value, t.nt.get_dtype(node))
    except ValueError as exc:
        t.error(f"{where}: expression Literal({view.value!r})", str(exc))
        return t.placeholder_expr(dtype)
    return Lit(value, dtype)


def _binary(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    op_name = str(view.op).rsplit(".", 1)[-1]
    left = translate_expr(t, view.left, where)
    right = translate_expr(t, view.right, where)
    op = OPERATORS.get(op_name)
    if op is None:
        t.error(f"{where}: expression BinaryExpr({op_name})", "operator not supported by shoal")
        return t.placeholder_expr(dtype)
    if op in ("and", "or", "xor") and not (left.dtype == BOOL and right.dtype == BOOL):
        t.error(
            f"{where}: expression BinaryExpr({op_name})",
            f"bitwise {op} on {left.dtype} and {right.dtype} is not supported (booleans only)",
        )
        return t.placeholder_expr(dtype)
    return BinaryOp(op, left, right, dtype)


def _cast(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    inner = translate_expr(t, view.expr, where)
    strict = _CAST_STRICT.get(view.options)
    if strict is None and _widening(inner.dtype, dtype):
        strict = True  # a wrapping cast that cannot wrap (Polars adds these for supertypes)
    if strict is None:
        t.error(
            f"{where}: expression Cast({inner.dtype} -> {dtype}, options={view.options})",
            "wrapping (overflowing) casts are not supported",
        )
        return t.placeholder_expr(dtype)
    return Cast(inner, dtype, strict)


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
    desc = f"{where}: expression Agg({name})"
    if name in _PLAIN_AGGS:
        return Agg(name, arg, dtype)
    if name in ("min", "max"):
        if options:  # propagate_nans: nan_min / nan_max
            t.error(desc, f"nan_{name} (NaN-propagating {name}) is not supported")
            return t.placeholder_expr(dtype)
        return Agg(name, arg, dtype)
    if name == "count":
        # Polars: count() skips nulls (include_nulls=False); len() on a column counts all rows.
        return Agg("len", None, dtype) if options else Agg("count", arg, dtype)
    if name in ("std", "var"):
        return Agg(name, arg, dtype, (("ddof", int(options)),))
    t.error(
        desc,
        "aggregate not supported by shoal"
        + (" (it returns a list per group)" if name == "implode" else ""),
    )
    return t.placeholder_expr(dtype)


def _len(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    return Agg("len", None, dtype)


def _alias(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    return translate_expr(t, view.expr, where)


def _function(t: Translator, view: Any, node: int, dtype: DataType, where: str) -> Expr:
    head, *extra = view.function_data
    key = function_key(head)
    if key == "dynamic_pred":
        # A runtime filter Polars adds below a top-k sort; always true is exact.
        return Lit(True, BOOL)
    args = tuple(translate_expr(t, i, where) for i in view.input)
    if key == "null_count":
        return Agg("null_count", args[0], dtype)
    found = lookup(key, tuple(extra))
    if isinstance(found, str):
        t.error(f"{where}: expression Function({key})", found)
        return t.placeholder_expr(dtype)
    name, options = found
    return Function(name, args, options, dtype)


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
}
