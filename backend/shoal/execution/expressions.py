"""IR expressions -> Polars expressions (the kernel's expression half).

One entry per IR function name in :data:`FUNCTIONS`; an IR expression whose function is not
in the table raises :class:`shoal.UnsupportedError` naming the function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from shoal.errors import UnsupportedError
from shoal.ir.expr import Agg, BinaryOp, Cast, Col, Expr, Function, Lit, Ternary

FunctionImpl = Callable[[list[pl.Expr], dict[str, Any]], pl.Expr]

#: IR function name -> builder from (Polars argument expressions, options) to a Polars expr.
FUNCTIONS: dict[str, FunctionImpl] = {
    "is_null": lambda a, o: a[0].is_null(),
    "is_not_null": lambda a, o: a[0].is_not_null(),
    "not": lambda a, o: a[0].not_(),
    "neg": lambda a, o: -a[0],
    "abs": lambda a, o: a[0].abs(),
    "is_in": lambda a, o: a[0].is_in(a[1], nulls_equal=o.get("nulls_equal", False)),
    "is_between": lambda a, o: a[0].is_between(a[1], a[2], closed=o.get("closed", "both")),
    "str.starts_with": lambda a, o: a[0].str.starts_with(a[1]),
    "str.ends_with": lambda a, o: a[0].str.ends_with(a[1]),
    "str.contains": lambda a, o: a[0].str.contains(a[1], literal=o.get("literal", False),
                                                  strict=o.get("strict", True)),
    "dt.year": lambda a, o: a[0].dt.year(),
    "dt.month": lambda a, o: a[0].dt.month(),
    "dt.day": lambda a, o: a[0].dt.day(),
}

_BINARY: dict[str, Callable[[pl.Expr, pl.Expr], pl.Expr]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq_missing": lambda a, b: a.eq_missing(b),
    "ne_missing": lambda a, b: a.ne_missing(b),
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
}


def _agg(name: str, arg: pl.Expr | None, options: dict[str, Any]) -> pl.Expr:
    if name == "len":
        return pl.len()
    assert arg is not None
    if name in ("sum", "mean", "min", "max", "count", "n_unique", "first", "last", "median",
                "null_count"):
        return getattr(arg, name)()
    if name in ("std", "var"):
        return getattr(arg, name)(ddof=options.get("ddof", 1))
    raise UnsupportedError(f"aggregate function {name!r} is not supported by the kernel")


def to_polars(expr: Expr) -> pl.Expr:
    """Translate an IR expression into an equivalent Polars expression.

    Raises :class:`shoal.UnsupportedError` for a function the kernel does not know.
    """
    if isinstance(expr, Col):
        return pl.col(expr.name)
    if isinstance(expr, Lit):
        return pl.lit(expr.value, dtype=expr.dtype.to_polars())
    if isinstance(expr, BinaryOp):
        return _BINARY[expr.op](to_polars(expr.left), to_polars(expr.right))
    if isinstance(expr, Cast):
        return to_polars(expr.expr).cast(expr.dtype.to_polars(), strict=expr.strict)
    if isinstance(expr, Ternary):
        return (
            pl.when(to_polars(expr.predicate))
            .then(to_polars(expr.then))
            .otherwise(to_polars(expr.otherwise))
        )
    if isinstance(expr, Function):
        impl = FUNCTIONS.get(expr.name)
        if impl is None:
            raise UnsupportedError(f"function {expr.name!r} is not supported by the kernel")
        return impl([to_polars(a) for a in expr.args], dict(expr.options))
    if isinstance(expr, Agg):
        return _agg(expr.name, None if expr.arg is None else to_polars(expr.arg), dict(expr.options))
    raise UnsupportedError(f"expression {type(expr).__name__} is not supported by the kernel")
