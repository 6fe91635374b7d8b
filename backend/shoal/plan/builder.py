"""Building shoal IR plans by hand: a small dataframe-like API for library authors.

::

    from shoal import ir

    orders = ir.scan_parquet("/data/orders")          # schema from the Parquet footers
    plan = (
        orders.filter(ir.col("o_totalprice") > 1000)
        .group_by("o_orderstatus")
        .agg(ir.col("o_totalprice").sum().alias("total"), ir.len())
        .sort("o_orderstatus")
        .plan                                          # a shoal.ir.PlanNode
    )

Expressions (:class:`ExprBuilder`, made by :func:`col`, :func:`lit`, :func:`len_`,
:func:`when`) are *unresolved*: they name columns and operations but carry no types. A
:class:`Frame` method resolves them against its input schema, infers every dtype with
Polars' own type rules (Polars resolves the equivalent expression over an empty frame of
that schema, the same translation the kernel runs) and builds an IR node that has been
checked: a missing column, an operation Polars refuses for the input types (adding a string
to a date), a non-boolean filter predicate or join keys of different types raise
:class:`shoal.PlanError` naming the node, the column and the types.

Python ``int`` and ``float`` literals (and ``None``) are *dynamic*, as in Polars: next to a
numeric expression they take the supertype of that expression and the literal, so
``col("a_int8") + 1`` stays ``Int8``. Other literals take their Python type's Polars dtype.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime
import glob
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

import polars as pl
import pyarrow as pa

from shoal.errors import PlanError
from shoal.ir.expr import AGG_FUNCTIONS, Agg, BinaryOp, Cast, Col, Expr, Function, Lit, NamedExpr
from shoal.ir.expr import Ternary as IRTernary
from shoal.ir.functions import FUNCTION_NAMES, arity_error
from shoal.ir.nodes import (
    Aggregate,
    AsofStrategy,
    ClosedWindow,
    Distinct,
    Filter,
    InMemorySource,
    Join,
    JoinHow,
    ParquetSource,
    PlanNode,
    Project,
    Scan,
    Slice,
    Sort,
    StageInput,
    WindowLabel,
    WindowStart,
)
from shoal.ir.nodes import Union as UnionNode
from shoal.ir.types import BOOL, NULL, DataType, Schema
from shoal.lowering.infer import empty_frame, infer_dtypes
from shoal.lowering.plan import lower_plan, no_scan
from shoal.plan.validate import check_expr

if TYPE_CHECKING:
    from shoal.config import Config, RunnerKind
    from shoal.plan.builder_temporal import WindowGroupBy

#: What a dtype argument may be: a shoal DataType, an Arrow type or a Polars dtype.
DTypeLike = Union[DataType, pa.DataType, pl.DataType, type[pl.DataType]]  # noqa: UP007

#: What an expression argument may be: a builder expression, a resolved IR expression,
#: or a Python value (a literal). Where a column is expected, a ``str`` names a column.
IntoExpr = Any


def to_dtype(dtype: DTypeLike) -> DataType:
    """A :class:`~shoal.ir.types.DataType` from a DataType, an Arrow type or a Polars dtype.
    Raises ``TypeError`` for anything else."""
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, pa.DataType):
        return DataType(dtype)
    if isinstance(dtype, pl.DataType) or (
        isinstance(dtype, type) and issubclass(dtype, pl.DataType)
    ):
        return DataType.from_polars(dtype)
    raise TypeError(f"not a dtype: {dtype!r} (use a Polars dtype, an Arrow type or a DataType)")


# ---------------------------------------------------------------- unresolved expressions


@dataclass(frozen=True)
class _UCol:
    name: str


@dataclass(frozen=True)
class _ULit:
    value: Any
    dtype: DataType | None  # None: typed by its Python value (dynamic for int/float/None)


@dataclass(frozen=True)
class _UBin:
    op: str
    left: _U
    right: _U


@dataclass(frozen=True)
class _UCast:
    expr: _U
    dtype: DataType
    strict: bool


@dataclass(frozen=True)
class _UFn:
    name: str
    args: tuple[_U, ...]
    options: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class _UAgg:
    name: str
    arg: _U | None
    options: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class _UAlias:
    expr: _U
    name: str


@dataclass(frozen=True)
class _UWhen:
    predicate: _U
    then: _U
    otherwise: _U


@dataclass(frozen=True)
class _UIR:
    expr: Expr


_U = _UCol | _ULit | _UBin | _UCast | _UFn | _UAgg | _UAlias | _UWhen | _UIR


def _u(x: IntoExpr) -> _U:
    """A value in expression position: a literal unless it is already an expression."""
    if isinstance(x, ExprBuilder):
        return x._u
    if isinstance(x, Expr):
        return _UIR(x)
    if isinstance(x, pl.Expr):
        raise TypeError("a Polars expression is not a shoal expression: use shoal.ir.col/lit")
    return _ULit(x, None)


def _u_col(x: IntoExpr) -> _U:
    """A value in column position: a ``str`` names a column."""
    return _UCol(x) if isinstance(x, str) else _u(x)


class _Namespace:
    """``expr.str.<name>(...)`` / ``expr.dt.<name>(...)``: the kernel function
    ``"<prefix>.<name>"`` with this expression as its first argument."""

    def __init__(self, expr: ExprBuilder, prefix: str) -> None:
        self._expr = expr
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args: IntoExpr, **options: Any) -> ExprBuilder:
            return self._expr.fn(f"{self._prefix}.{name}", *args, **options)

        call.__name__ = name
        return call


class ExprBuilder:
    """An unresolved expression: Python operators, methods and functions build new ones;
    a :class:`Frame` method resolves it against its input (:meth:`resolve`).

    Operators: ``+ - * / // %`` (``/`` is true division, ``//`` floor division), ``== != <
    <= > >=``, ``& | ^ ~`` (boolean, Kleene logic), unary ``-``. Comparing two builders
    with ``==`` builds an expression; it does not compare them (so builders are unhashable
    and have no truth value).
    """

    __slots__ = ("_u",)
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, u: _U) -> None:
        self._u = u

    # -------------------------------------------------------- operators

    def _bin(self, op: str, other: IntoExpr, reflected: bool = False) -> ExprBuilder:
        o = _u(other)
        return ExprBuilder(_UBin(op, o, self._u) if reflected else _UBin(op, self._u, o))

    def __add__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("add", o)

    def __radd__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("add", o, True)

    def __sub__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("sub", o)

    def __rsub__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("sub", o, True)

    def __mul__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("mul", o)

    def __rmul__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("mul", o, True)

    def __truediv__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("truediv", o)

    def __rtruediv__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("truediv", o, True)

    def __floordiv__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("floordiv", o)

    def __rfloordiv__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("floordiv", o, True)

    def __mod__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("mod", o)

    def __rmod__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("mod", o, True)

    def __eq__(self, o: IntoExpr) -> ExprBuilder:  # type: ignore[override]
        return self._bin("eq", o)

    def __ne__(self, o: IntoExpr) -> ExprBuilder:  # type: ignore[override]
        return self._bin("ne", o)

    def __lt__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("lt", o)

    def __le__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("le", o)

    def __gt__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("gt", o)

    def __ge__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("ge", o)

    def __and__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("and", o)

    def __rand__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("and", o, True)

    def __or__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("or", o)

    def __ror__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("or", o, True)

    def __xor__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("xor", o)

    def __rxor__(self, o: IntoExpr) -> ExprBuilder:
        return self._bin("xor", o, True)

    def __invert__(self) -> ExprBuilder:
        return self.fn("not")

    def __neg__(self) -> ExprBuilder:
        return self.fn("neg")

    def __bool__(self) -> bool:
        raise TypeError(
            "a shoal expression has no truth value: use & | ~ instead of and/or/not, and "
            "build comparisons inside Frame methods"
        )

    def eq_missing(self, o: IntoExpr) -> ExprBuilder:
        """``==`` where null equals null (never null itself)."""
        return self._bin("eq_missing", o)

    def ne_missing(self, o: IntoExpr) -> ExprBuilder:
        """``!=`` where null equals null (never null itself)."""
        return self._bin("ne_missing", o)

    # -------------------------------------------------------- naming and types

    def alias(self, name: str) -> ExprBuilder:
        """The same expression producing a column named ``name``."""
        return ExprBuilder(_UAlias(self._u, name))

    def cast(self, dtype: DTypeLike, *, strict: bool = True) -> ExprBuilder:
        """Cast to ``dtype``; ``strict`` raises at run time on values that do not fit,
        otherwise they become null."""
        return ExprBuilder(_UCast(self._u, to_dtype(dtype), strict))

    # -------------------------------------------------------- functions

    def fn(self, name: str, *args: IntoExpr, **options: Any) -> ExprBuilder:
        """The kernel function ``name`` (a key of
        ``shoal.lowering.expressions.FUNCTIONS``) with this expression as its first
        argument, ``args`` as further (expression) arguments and ``options`` as its
        options. An unknown name raises ``PlanError`` when the expression is resolved."""
        return ExprBuilder(
            _UFn(name, (self._u, *(_u(a) for a in args)), tuple(sorted(options.items())))
        )

    @property
    def str(self) -> Any:
        """String functions: ``expr.str.starts_with("x")`` is ``fn("str.starts_with", "x")``."""
        return _Namespace(self, "str")

    @property
    def dt(self) -> Any:
        """Temporal functions: ``expr.dt.year()`` is ``fn("dt.year")``."""
        return _Namespace(self, "dt")

    def is_null(self) -> ExprBuilder:
        return self.fn("is_null")

    def is_not_null(self) -> ExprBuilder:
        return self.fn("is_not_null")

    def is_nan(self) -> ExprBuilder:
        return self.fn("is_nan")

    def is_not_nan(self) -> ExprBuilder:
        return self.fn("is_not_nan")

    def is_in(self, values: Iterable[Any] | IntoExpr, *, nulls_equal: bool = False) -> ExprBuilder:
        """Membership in ``values`` (a Python collection becomes a list literal of this
        expression's dtype, or an expression of list type)."""
        if isinstance(values, list | tuple | set | frozenset):
            vals = sorted(values, key=repr) if isinstance(values, set | frozenset) else values
            other: _U = _ULit(list(vals), None)
        else:
            other = _u(values)
        return ExprBuilder(_UFn("is_in", (self._u, other), (("nulls_equal", nulls_equal),)))

    def is_between(
        self,
        lower: IntoExpr,
        upper: IntoExpr,
        closed: Literal["both", "left", "right", "none"] = "both",
    ) -> ExprBuilder:
        return self.fn("is_between", lower, upper, closed=closed)

    def fill_null(self, value: IntoExpr) -> ExprBuilder:
        return self.fn("fill_null", value)

    def abs(self) -> ExprBuilder:
        return self.fn("abs")

    def round(self, decimals: int = 0) -> ExprBuilder:
        return self.fn("round", decimals=decimals)

    def sqrt(self) -> ExprBuilder:
        return self.fn("sqrt")

    # -------------------------------------------------------- aggregates

    def _agg(self, name: builtins.str, **options: Any) -> ExprBuilder:
        return ExprBuilder(_UAgg(name, self._u, tuple(sorted(options.items()))))

    def sum(self) -> ExprBuilder:
        """Sum of the non-null values (0 when there are none)."""
        return self._agg("sum")

    def mean(self) -> ExprBuilder:
        return self._agg("mean")

    def min(self) -> ExprBuilder:
        return self._agg("min")

    def max(self) -> ExprBuilder:
        return self._agg("max")

    def count(self) -> ExprBuilder:
        """Number of non-null values."""
        return self._agg("count")

    def n_unique(self) -> ExprBuilder:
        """Number of distinct values (null counts as a value)."""
        return self._agg("n_unique")

    def first(self) -> ExprBuilder:
        return self._agg("first")

    def last(self) -> ExprBuilder:
        return self._agg("last")

    def median(self) -> ExprBuilder:
        return self._agg("median")

    def std(self, ddof: int = 1) -> ExprBuilder:
        return self._agg("std", ddof=ddof)

    def var(self, ddof: int = 1) -> ExprBuilder:
        return self._agg("var", ddof=ddof)

    def null_count(self) -> ExprBuilder:
        return self._agg("null_count")

    # -------------------------------------------------------- resolution

    @property
    def output_name(self) -> builtins.str:
        """The column name this expression produces (Polars' rule: the alias, else the
        first column it reads, ``"literal"`` or ``"len"``)."""
        return _output_name(self._u)

    def resolve(self, schema: Schema, *, where: builtins.str = "expression") -> Expr:
        """The typed IR expression over ``schema``. Raises :class:`shoal.PlanError` naming
        ``where``, the column and the types when it does not fit the schema."""
        return _Resolver(schema, where).expr(self._u)

    def __repr__(self) -> builtins.str:
        return f"<unresolved {_show(self._u)}>"


def _show(u: _U) -> str:
    if isinstance(u, _UCol):
        return f"col({u.name!r})"
    if isinstance(u, _ULit):
        return f"lit({u.value!r})"
    if isinstance(u, _UBin):
        return f"({_show(u.left)} {u.op} {_show(u.right)})"
    if isinstance(u, _UCast):
        return f"{_show(u.expr)}.cast({u.dtype})"
    if isinstance(u, _UFn):
        return f"{u.name}({', '.join(_show(a) for a in u.args)})"
    if isinstance(u, _UAgg):
        return f"{u.name}({'' if u.arg is None else _show(u.arg)})"
    if isinstance(u, _UAlias):
        return f"{_show(u.expr)}.alias({u.name!r})"
    if isinstance(u, _UWhen):
        return f"when({_show(u.predicate)}).then({_show(u.then)}).otherwise({_show(u.otherwise)})"
    return str(u.expr)


def _output_name(u: _U) -> str:
    if isinstance(u, _UAlias):
        return u.name
    if isinstance(u, _UCol):
        return u.name
    if isinstance(u, _ULit):
        return "literal"
    if isinstance(u, _UBin):
        return _output_name(u.left)
    if isinstance(u, _UCast):
        return _output_name(u.expr)
    if isinstance(u, _UFn):
        return _output_name(u.args[0]) if u.args else "literal"
    if isinstance(u, _UAgg):
        return "len" if u.arg is None else _output_name(u.arg)
    if isinstance(u, _UWhen):
        return _output_name(u.then)
    e = u.expr
    for x in e.walk():
        if isinstance(x, Col):
            return x.name
        if isinstance(x, Agg) and x.name == "len":
            return "len"
    return "literal"


def _is_dynamic(u: _U) -> bool:
    return (
        isinstance(u, _ULit)
        and u.dtype is None
        and (
            u.value is None or (isinstance(u.value, int | float) and not isinstance(u.value, bool))
        )
    )


class _Resolver:
    """Resolves unresolved expressions against one input schema."""

    def __init__(self, schema: Schema, where: str) -> None:
        self.schema = schema
        self.where = where

    def typed(self, node: Expr) -> Expr:
        """``node`` (built with a placeholder dtype) with the dtype Polars infers."""
        (dtype,) = infer_dtypes([node], self.schema, where=self.where)
        return dataclasses.replace(node, dtype=dtype)  # type: ignore[type-var]

    def literal(self, value: Any) -> Lit:
        if isinstance(value, pl.Series):
            value = value.to_list()
        try:
            dtype = DataType.from_polars(pl.select(pl.lit(value)).to_series().dtype)
        except PlanError as exc:
            raise PlanError(f"{self.where}: literal {value!r}: {exc}") from exc
        except Exception as exc:
            raise PlanError(f"{self.where}: literal {value!r} has no Polars type: {exc}") from exc
        return Lit(value, dtype)

    def dynamic(self, lit: _ULit, other: Expr) -> Lit:
        """A Python int/float/None literal next to ``other``: Polars' dynamic typing."""
        from shoal.lowering.expressions import to_polars

        if lit.value is None:
            return Lit(None, other.dtype)
        if not other.dtype.is_numeric:
            return self.literal(lit.value)
        try:
            got = (
                empty_frame(self.schema)
                .select(pl.coalesce(to_polars(other), pl.lit(lit.value)).alias("x"))
                .collect_schema()["x"]
            )
            return Lit(lit.value, DataType.from_polars(got))
        except Exception:
            return self.literal(lit.value)

    def pair(self, a: _U, b: _U) -> tuple[Expr, Expr]:
        """Resolve two operands that Polars types together (dynamic literals)."""
        if _is_dynamic(a) and not _is_dynamic(b):
            rb = self.expr(b)
            return self.dynamic(a, rb), rb  # type: ignore[arg-type]
        ra = self.expr(a)
        if _is_dynamic(b) and not _is_dynamic(a):
            return ra, self.dynamic(b, ra)  # type: ignore[arg-type]
        return ra, self.expr(b)

    def expr(self, u: _U) -> Expr:
        if isinstance(u, _UIR):
            check_expr(u.expr, self.schema, where=self.where)
            return u.expr
        if isinstance(u, _UCol):
            if u.name not in self.schema:
                raise PlanError(
                    f"{self.where}: column {u.name!r} is not in the input schema {self.schema}"
                )
            return Col(u.name, self.schema[u.name])
        if isinstance(u, _ULit):
            if u.dtype is not None:
                return Lit(u.value, u.dtype)
            return self.literal(u.value)
        if isinstance(u, _UAlias):
            return self.expr(u.expr)
        if isinstance(u, _UBin):
            left, right = self.pair(u.left, u.right)
            return self.typed(BinaryOp(u.op, left, right, NULL))
        if isinstance(u, _UCast):
            return self.typed(Cast(self.expr(u.expr), u.dtype, u.strict))
        if isinstance(u, _UFn):
            return self.function(u)
        if isinstance(u, _UAgg):
            if u.name not in AGG_FUNCTIONS:
                raise PlanError(f"{self.where}: unknown aggregate function {u.name!r}")
            arg = None if u.arg is None else self.expr(u.arg)
            return self.typed(Agg(u.name, arg, NULL, u.options))
        if isinstance(u, _UWhen):
            pred = self.expr(u.predicate)
            if pred.dtype != BOOL:
                raise PlanError(
                    f"{self.where}: when() predicate {pred} has dtype {pred.dtype}, not Boolean"
                )
            then, otherwise = self.pair(u.then, u.otherwise)
            return self.typed(IRTernary(pred, then, otherwise, NULL))
        raise TypeError(f"not an expression: {u!r}")  # pragma: no cover

    def function(self, u: _UFn) -> Expr:
        if u.name not in FUNCTION_NAMES:
            raise PlanError(f"{self.where}: function {u.name!r} is not in the IR's function table")
        wrong = arity_error(u.name, len(u.args))
        if wrong is not None:
            raise PlanError(
                f"{self.where}: function {u.name!r} {wrong} (called with {len(u.args)} "
                "arguments; its signature in the IR's function table)"
            )
        if not u.args:
            return self.typed(Function(u.name, (), u.options, NULL))
        first = self.expr(u.args[0])
        args: list[Expr] = [first]
        for a in u.args[1:]:
            if isinstance(a, _ULit) and a.dtype is None and isinstance(a.value, list):
                # A list of values next to an expression: a list of that expression's type.
                args.append(Lit(a.value, DataType(pa.large_list(first.dtype.arrow))))
            elif _is_dynamic(a):
                args.append(self.dynamic(a, first))  # type: ignore[arg-type]
            else:
                args.append(self.expr(a))
        return self.typed(Function(u.name, tuple(args), u.options, NULL))


# ---------------------------------------------------------------- expression constructors


def col(name: str) -> ExprBuilder:
    """The input column ``name``."""
    if not isinstance(name, str):
        raise TypeError(f"col() takes a column name, got {name!r}")
    return ExprBuilder(_UCol(name))


def lit(value: Any, dtype: DTypeLike | None = None) -> ExprBuilder:
    """A literal. Without ``dtype``, ``int``/``float``/``None`` are dynamic (typed by the
    expression next to them, as in Polars) and other values take their Polars type
    (``str`` String, ``date`` Date, ``datetime`` Datetime(us), ``Decimal`` Decimal)."""
    return ExprBuilder(_ULit(value, None if dtype is None else to_dtype(dtype)))


def len_() -> ExprBuilder:
    """The number of rows (of the group, in an aggregation). Exported as ``ir.len``."""
    return ExprBuilder(_UAgg("len", None, ()))


class _When:
    def __init__(self, predicate: _U) -> None:
        self._predicate = predicate

    def then(self, value: IntoExpr) -> _Then:
        return _Then(self._predicate, _u(value))


class _Then:
    def __init__(self, predicate: _U, then: _U) -> None:
        self._predicate = predicate
        self._then = then

    def otherwise(self, value: IntoExpr) -> ExprBuilder:
        return ExprBuilder(_UWhen(self._predicate, self._then, _u(value)))


def when(predicate: IntoExpr) -> _When:
    """``when(p).then(a).otherwise(b)``: ``a`` where ``p`` is true, else ``b`` (a null
    predicate takes ``b``)."""
    return _When(_u(predicate))


# ---------------------------------------------------------------- sources


def scan_parquet(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    columns: Sequence[str] | None = None,
) -> Frame:
    """A frame reading Parquet files, in order, as one table.

    ``paths`` are files, directories (every ``*.parquet`` below, sorted) or glob patterns.
    The schema comes from the first file's footer; every file must have the same columns
    and types. ``columns`` reads only these columns.

    Raises ``FileNotFoundError`` naming a path that does not exist (or a pattern or
    directory with no Parquet file) and :class:`shoal.PlanError` when the files' schemas
    differ or ``columns`` names a missing column.
    """
    import pyarrow.parquet as pq

    raw = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    files: list[str] = []
    for p in raw:
        s = os.fspath(p)
        if glob.has_magic(s):
            found = sorted(f for f in glob.glob(s, recursive=True) if os.path.isfile(f))
            if not found:
                raise FileNotFoundError(2, "no file matches the pattern", s)
            files.extend(found)
        elif os.path.isdir(s):
            found = sorted(glob.glob(os.path.join(s, "**", "*.parquet"), recursive=True))
            if not found:
                raise FileNotFoundError(2, "no Parquet file in the directory", s)
            files.extend(found)
        elif os.path.exists(s):
            files.append(s)
        else:
            raise FileNotFoundError(2, "no such Parquet file", s)
    if not files:
        raise PlanError("scan_parquet: no paths given")
    files = [os.path.abspath(f) for f in files]
    schema = Schema.from_arrow(pq.read_schema(files[0]))
    for f in files[1:]:
        other = Schema.from_arrow(pq.read_schema(f))
        if other != schema:
            raise PlanError(
                f"Scan: Parquet file {f} has schema {other}, but {files[0]} has {schema}"
            )
    if columns is not None:
        for c in columns:
            if c not in schema:
                raise PlanError(f"Scan: column {c!r} is not in the Parquet files' schema {schema}")
        schema = Schema.of([(c, schema[c]) for c in columns])
    return Frame(Scan(ParquetSource(tuple(files)), schema))


def from_arrow(table: pa.Table | pa.RecordBatch) -> Frame:
    """A frame over an in-memory Arrow table (kept by reference, never copied)."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise TypeError(f"from_arrow() takes a pyarrow.Table, got {type(table).__name__}")
    return Frame(Scan(InMemorySource(table), Schema.from_arrow(table.schema)))


def from_polars(df: pl.DataFrame) -> Frame:
    """A frame over a Polars DataFrame (converted to Arrow once)."""
    if not isinstance(df, pl.DataFrame):
        raise TypeError(f"from_polars() takes a polars.DataFrame, got {type(df).__name__}")
    return from_arrow(df.to_arrow())


# ---------------------------------------------------------------- frames


def _flatten(items: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for x in items:
        if isinstance(x, list | tuple):
            out.extend(x)
        else:
            out.append(x)
    return out


def _kernel_schema(shell: PlanNode, inputs: Sequence[Schema], where: str) -> Schema:
    """The schema the kernel produces for ``shell`` (a node whose inputs are
    :class:`StageInput` leaves over ``inputs``), lowered as the kernel lowers it."""
    frames = [pl.DataFrame(schema=s.to_polars()) for s in inputs]
    try:
        return Schema.from_polars(lower_plan(shell, frames, no_scan).collect_schema())
    except PlanError as exc:
        raise PlanError(f"{where}: {exc}") from exc
    except Exception as exc:
        reason = builtins.str(exc).strip().splitlines()[0] if builtins.str(exc).strip() else ""
        raise PlanError(f"{where}: Polars cannot build this node: {reason or exc!r}") from exc


def _unique_names(names: Sequence[str], where: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise PlanError(f"{where}: column name {n!r} appears more than once in the output")
        seen.add(n)


def _flags(value: bool | Sequence[bool], n: int, what: str, where: str) -> tuple[bool, ...]:
    if isinstance(value, bool):
        return (value,) * n
    flags = tuple(builtins.bool(v) for v in value)
    if builtins.len(flags) != n:
        raise PlanError(f"{where}: {builtins.len(flags)} {what} flags for {n} sort keys")
    return flags


class Frame:
    """A plan under construction: an immutable wrapper around a
    :class:`~shoal.ir.nodes.PlanNode` (``.plan``) whose methods return new frames.

    Every method resolves its expressions against ``self.schema`` and raises
    :class:`shoal.PlanError` naming the node, the column and the types when they do not
    fit."""

    __slots__ = ("plan",)

    def __init__(self, plan: PlanNode) -> None:
        if not isinstance(plan, PlanNode):
            raise TypeError(f"Frame wraps a shoal.ir.PlanNode, got {type(plan).__name__}")
        self.plan = plan

    # -------------------------------------------------------- properties

    @property
    def schema(self) -> Schema:
        """The output schema of the plan."""
        return self.plan.schema

    @property
    def columns(self) -> list[str]:
        return list(self.plan.schema.names)

    def _resolve(self, x: IntoExpr, where: str, *, column: bool = True) -> tuple[str, Expr]:
        u = _u_col(x) if column else _u(x)
        return _output_name(u), _Resolver(self.schema, where).expr(u)

    def _named(
        self, exprs: Sequence[IntoExpr], named: Mapping[str, IntoExpr], where: str
    ) -> list[NamedExpr]:
        out = []
        for x in _flatten(exprs):
            name, e = self._resolve(x, where)
            out.append(NamedExpr(name, e))
        for name, x in named.items():
            _, e = self._resolve(x, where)
            out.append(NamedExpr(name, e))
        return out

    # -------------------------------------------------------- row-wise

    def filter(self, *predicates: IntoExpr) -> Frame:
        """Keep the rows where every predicate is true (null counts as false). Raises
        ``PlanError`` for a predicate that is not Boolean."""
        if not predicates:
            raise PlanError("Filter: needs at least one predicate")
        where = "Filter"
        resolved = [self._resolve(p, where, column=False)[1] for p in _flatten(predicates)]
        for p in resolved:
            if p.dtype != BOOL:
                cols = ", ".join(f"{c}: {self.schema[c]}" for c in sorted(p.columns()))
                raise PlanError(
                    f"Filter: predicate {p} has dtype {p.dtype}, not Boolean"
                    + (f" (inputs: {cols})" if cols else "")
                )
        pred = resolved[0]
        for p in resolved[1:]:
            pred = BinaryOp("and", pred, p, BOOL)
        return Frame(Filter(self.plan, pred, self.schema))

    def select(self, *exprs: IntoExpr, **named: IntoExpr) -> Frame:
        """Exactly these columns, in order (``str`` names a column; keywords name the
        output). When every expression is an aggregate the result is one row
        (an :class:`~shoal.ir.nodes.Aggregate` without keys)."""
        where = "Project (select)"
        items = self._named(exprs, named, where)
        if not items:
            raise PlanError(f"{where}: selects no columns")
        _unique_names([i.name for i in items], where)
        schema = Schema.of([(i.name, i.dtype) for i in items])
        if all(i.expr.has_agg() and not _cols_outside_aggs(i.expr) for i in items):
            return Frame(Aggregate(self.plan, (), tuple(items), False, schema))
        return Frame(Project(self.plan, tuple(items), schema))

    def with_columns(self, *exprs: IntoExpr, **named: IntoExpr) -> Frame:
        """All input columns plus these: a new column with an existing name replaces it
        in place, the others are appended in order."""
        where = "Project (with_columns)"
        items = self._named(exprs, named, where)
        _unique_names([i.name for i in items], where)
        new = {i.name: i for i in items}
        out = [new.pop(n, NamedExpr(n, Col(n, t))) for n, t in self.schema.fields]
        out.extend(i for i in items if i.name in new)
        schema = Schema.of([(i.name, i.dtype) for i in out])
        return Frame(Project(self.plan, tuple(out), schema, keep_height=True))

    def drop(self, *names: str) -> Frame:
        """All columns but ``names``; raises ``PlanError`` for a name not in the schema."""
        for n in _flatten(names):
            if n not in self.schema:
                raise PlanError(f"Project (drop): column {n!r} is not in the schema {self.schema}")
        gone = set(_flatten(names))
        return self.select(*[n for n in self.schema.names if n not in gone])

    def rename(self, mapping: Mapping[str, str]) -> Frame:
        """Columns renamed by ``mapping`` (old -> new), in place."""
        for n in mapping:
            if n not in self.schema:
                raise PlanError(
                    f"Project (rename): column {n!r} is not in the schema {self.schema}"
                )
        return self.select(*[col(n).alias(mapping.get(n, n)) for n in self.schema.names])

    # -------------------------------------------------------- aggregation

    def group_by(self, *keys: IntoExpr, maintain_order: bool = False) -> GroupBy:
        """Group by ``keys`` (names or expressions); finish with :meth:`GroupBy.agg`."""
        return GroupBy(self, _flatten(keys), maintain_order)

    def aggregate(
        self,
        keys: Sequence[IntoExpr],
        aggs: Sequence[IntoExpr] | Mapping[str, IntoExpr],
        *,
        maintain_order: bool = False,
    ) -> Frame:
        """Group by ``keys`` and compute ``aggs`` per group (one row when there are no
        keys). Output: the keys, then the aggregates. Every column an aggregate reads must
        be inside an aggregate function (else Polars would return a list per group):
        ``PlanError`` otherwise."""
        where = "Aggregate"
        key_items = self._named(list(keys), {}, where)
        if isinstance(aggs, Mapping):
            agg_items = self._named([], aggs, where)
        else:
            agg_items = self._named(list(aggs), {}, where)
        for k in key_items:
            if k.expr.has_agg():
                raise PlanError(f"{where}: key {k.name!r} ({k.expr}) contains an aggregate")
        for a in agg_items:
            outside = _cols_outside_aggs(a.expr)
            if outside:
                raise PlanError(
                    f"{where}: aggregation {a.name!r} ({a.expr}) reads column "
                    f"{sorted(outside)[0]!r} outside an aggregate function (Polars would make "
                    "a list per group; use .first(), .sum(), ...)"
                )
        items = key_items + agg_items
        _unique_names([i.name for i in items], where)
        schema = Schema.of([(i.name, i.dtype) for i in items])
        shell = Aggregate(
            StageInput(0, self.schema), tuple(key_items), tuple(agg_items), maintain_order, schema
        )
        got = _kernel_schema(shell, [self.schema], where)
        if got != schema:  # pragma: no cover - a Polars typing rule the builder missed
            raise PlanError(f"{where}: Polars gives the schema {got}, the builder {schema}")
        return Frame(
            Aggregate(self.plan, tuple(key_items), tuple(agg_items), maintain_order, schema)
        )

    def unique(
        self,
        subset: Sequence[str] | None = None,
        *,
        keep: Literal["first", "last", "any", "none"] = "any",
        maintain_order: bool = False,
    ) -> Frame:
        """Drop duplicate rows (equal on ``subset``, all columns when None)."""
        if subset is not None:
            for c in subset:
                if c not in self.schema:
                    raise PlanError(f"Distinct: column {c!r} is not in the schema {self.schema}")
        sub = None if subset is None else tuple(subset)
        return Frame(Distinct(self.plan, sub, keep, maintain_order, self.schema))

    # -------------------------------------------------------- joins and unions

    def join(
        self,
        other: Frame,
        on: IntoExpr | Sequence[IntoExpr] | None = None,
        *,
        left_on: IntoExpr | Sequence[IntoExpr] | None = None,
        right_on: IntoExpr | Sequence[IntoExpr] | None = None,
        how: JoinHow = "inner",
        suffix: str = "_right",
        nulls_equal: bool = False,
        coalesce: bool | None = None,
        maintain_order: Literal["none", "left", "right", "left_right", "right_left"] = "none",
    ) -> Frame:
        """Equi-join with ``other`` on ``on`` (the same names or expressions on both
        sides) or ``left_on``/``right_on``, with Polars' join semantics and output columns
        (``coalesce`` None: Polars' default, which merges the key columns except for full
        joins; ``maintain_order`` as Polars'). Raises ``PlanError`` for a missing key column
        or keys of different types.
        """
        where = f"Join ({how})"
        if not isinstance(other, Frame):
            raise TypeError(f"join() takes a Frame, got {type(other).__name__}")

        def keys(x: Any) -> list[Any]:
            if x is None:
                return []
            return list(x) if isinstance(x, list | tuple) else [x]

        if on is not None and (left_on is not None or right_on is not None):
            raise PlanError(f"{where}: give on= or left_on=/right_on=, not both")
        lk, rk = (keys(on), keys(on)) if on is not None else (keys(left_on), keys(right_on))
        if how == "cross":
            if lk or rk:
                raise PlanError(f"{where}: a cross join takes no keys")
        elif not lk or builtins.len(lk) != builtins.len(rk):
            raise PlanError(
                f"{where}: needs the same number (at least one) of left and right keys, got "
                f"{builtins.len(lk)} and {builtins.len(rk)}"
            )
        left_keys = tuple(self._resolve(k, f"{where}, left key")[1] for k in lk)
        right_keys = tuple(other._resolve(k, f"{where}, right key")[1] for k in rk)
        for i, (a, b) in enumerate(zip(left_keys, right_keys, strict=True)):
            if a.dtype != b.dtype:
                raise PlanError(
                    f"{where}: key {i} has different types: left {a} is {a.dtype}, right {b} "
                    f"is {b.dtype} (cast one side)"
                )
        if coalesce is None:
            coalesce = how != "full"
        options: dict[str, Any] = dict(
            left_on=left_keys,
            right_on=right_keys,
            how=how,
            suffix=suffix,
            nulls_equal=nulls_equal,
            coalesce=coalesce,
        )
        if maintain_order != "none":
            options["maintain_order"] = maintain_order
        shell = Join(
            left=StageInput(0, self.schema),
            right=StageInput(1, other.schema),
            schema=Schema(()),
            **options,
        )
        schema = _kernel_schema(shell, [self.schema, other.schema], where)
        return Frame(Join(left=self.plan, right=other.plan, schema=schema, **options))

    def union(self, *others: Frame) -> Frame:
        """The rows of this frame and then of ``others`` (vertical concatenation); every
        frame must have the same schema."""
        frames = [self, *others]
        for i, f in enumerate(frames[1:], 1):
            if f.schema != self.schema:
                raise PlanError(
                    f"Union: input {i} has schema {f.schema}, input 0 has {self.schema}"
                )
        if not others:
            return self
        return Frame(UnionNode(tuple(f.plan for f in frames), self.schema))

    # -------------------------------------------------------- temporal and ordered

    def join_asof(
        self,
        other: Frame,
        *,
        left_on: IntoExpr | None = None,
        right_on: IntoExpr | None = None,
        on: IntoExpr | None = None,
        by_left: str | Sequence[str] | None = None,
        by_right: str | Sequence[str] | None = None,
        by: str | Sequence[str] | None = None,
        strategy: AsofStrategy = "backward",
        suffix: str = "_right",
        tolerance: Any = None,
        allow_exact_matches: bool = True,
        check_sortedness: bool = True,
        coalesce: bool = True,
    ) -> Frame:
        """As-of join with ``other`` (:class:`~shoal.ir.nodes.AsofJoin`), with Polars'
        ``join_asof`` signature and semantics: each row of this frame, in order, with the
        row of ``other`` whose key (``on``, or ``left_on``/``right_on``: a name or an
        expression) is nearest in the direction of ``strategy`` (``"backward"``: last key
        <= this row's, ``"forward"``: first >=, ``"nearest"``), among the rows with equal
        ``by`` columns (names; ``by_left``/``by_right`` when they differ); null columns
        when there is none. ``tolerance``: None, a number in the key's unit, or for a
        temporal key a duration string (``"1h"``) or ``timedelta``. Both keys must be
        sorted ascending (within each by-group): Polars raises at run time for an unsorted
        key where it checks (``check_sortedness`` without by-columns).

        Raises ``PlanError`` for a missing key or by-column, keys or by-column pairs of
        different types, a key that is not numeric, temporal or a string, a tolerance that
        does not fit the key, an unknown strategy or a column name clash."""
        from shoal.plan.builder_temporal import join_asof

        return join_asof(
            self, other, left_on=left_on, right_on=right_on, on=on, by_left=by_left,
            by_right=by_right, by=by, strategy=strategy, suffix=suffix, tolerance=tolerance,
            allow_exact_matches=allow_exact_matches, check_sortedness=check_sortedness,
            coalesce=coalesce,
        )  # fmt: skip

    def group_by_dynamic(
        self,
        index_column: str,
        *,
        every: str | datetime.timedelta,
        period: str | datetime.timedelta | None = None,
        offset: str | datetime.timedelta | None = None,
        include_boundaries: bool = False,
        closed: ClosedWindow = "left",
        label: WindowLabel = "left",
        group_by: IntoExpr | Sequence[IntoExpr] | None = None,
        start_by: WindowStart = "window",
    ) -> WindowGroupBy:
        """Time windows over ``index_column`` (:class:`~shoal.ir.nodes.DynamicGroupBy`),
        Polars' ``group_by_dynamic``: a window starts every ``every`` and spans ``period``
        (default ``every``), shifted by ``offset`` (default 0); ``closed`` says which ends
        are inside, ``label`` which value names the window, ``start_by`` where the first
        window starts; ``include_boundaries`` adds ``_lower_boundary``/``_upper_boundary``;
        separate windows per ``group_by`` group. Finish with ``.agg(...)``. Durations are
        strings of Polars' duration language (``"1h"``, ``"1mo"``; ``"3i"`` for an integer
        index) or ``timedelta``. The index must be sorted ascending (within each group):
        Polars raises at run time otherwise.

        Raises ``PlanError`` for a missing index column, an index that is not Int32, Int64,
        Date or Datetime, a duration that is not one or does not fit the index (``"1h"``
        on an integer index), an unknown ``closed``/``label``/``start_by``, a missing group
        column, or (in ``agg``) a column read outside an aggregate function."""
        from shoal.plan.builder_temporal import group_by_dynamic

        return group_by_dynamic(
            self, index_column, every=every, period=period, offset=offset,
            include_boundaries=include_boundaries, closed=closed, label=label,
            group_by=group_by, start_by=start_by,
        )  # fmt: skip

    def rolling(
        self,
        index_column: str,
        *,
        period: str | datetime.timedelta,
        offset: str | datetime.timedelta | None = None,
        closed: ClosedWindow = "right",
        group_by: IntoExpr | Sequence[IntoExpr] | None = None,
    ) -> WindowGroupBy:
        """One window per row (:class:`~shoal.ir.nodes.RollingGroupBy`), Polars'
        ``LazyFrame.rolling``: for the row at index ``t``, the rows of its ``group_by``
        group with index in ``(t + offset, t + offset + period]`` (``offset`` default
        ``-period``; ends as ``closed`` says). Finish with ``.agg(...)``. Durations and
        sortedness as in :meth:`group_by_dynamic`; the index may also be UInt32 or UInt64.

        Raises ``PlanError`` as :meth:`group_by_dynamic` does."""
        from shoal.plan.builder_temporal import rolling

        return rolling(
            self, index_column, period=period, offset=offset, closed=closed, group_by=group_by
        )

    def merge_sorted(self, other: Frame, key: str | Sequence[str]) -> Frame:
        """The rows of this frame and ``other``, both sorted ascending by column ``key``
        (or by several columns, lexicographically), merged into one sorted frame
        (:class:`~shoal.ir.nodes.MergeSorted`, Polars' ``merge_sorted``). Unsorted inputs
        give an unsorted result, as in Polars.

        Raises ``PlanError`` when a key is not a column, the two schemas differ, or a
        key's type has no order (lists, structs, binary)."""
        from shoal.plan.builder_temporal import merge_sorted

        return merge_sorted(self, other, key)

    # -------------------------------------------------------- ordering and slicing

    def sort(
        self,
        by: IntoExpr | Sequence[IntoExpr],
        *more_by: IntoExpr,
        descending: bool | Sequence[bool] = False,
        nulls_last: bool | Sequence[bool] = False,
        stable: bool = False,
    ) -> Frame:
        """Sort by ``by`` (names or expressions); one ``descending``/``nulls_last`` flag
        for all keys or one per key. ``stable`` keeps the input order of ties."""
        where = "Sort"
        keys = _flatten([by, *more_by])
        if not keys:
            raise PlanError(f"{where}: needs at least one sort key")
        exprs = tuple(self._resolve(k, where)[1] for k in keys)
        n = builtins.len(exprs)
        return Frame(
            Sort(
                self.plan,
                exprs,
                _flags(descending, n, "descending", where),
                _flags(nulls_last, n, "nulls_last", where),
                stable,
                self.schema,
            )
        )

    def slice(self, offset: int, length: int | None = None) -> Frame:
        """Rows ``offset`` to ``offset + length`` (to the end when ``length`` is None);
        ``offset`` must be >= 0."""
        if not isinstance(offset, int) or offset < 0:
            raise PlanError(f"Slice: offset must be an int >= 0, got {offset!r}")
        if length is not None and (not isinstance(length, int) or length < 0):
            raise PlanError(f"Slice: length must be None or an int >= 0, got {length!r}")
        return Frame(Slice(self.plan, offset, length, self.schema))

    def limit(self, n: int) -> Frame:
        """The first ``n`` rows."""
        return self.slice(0, n)

    head = limit

    # -------------------------------------------------------- running and printing

    def explain(self) -> str:
        """The plan as an indented tree with schemas."""
        from shoal.ir.explain import explain

        return explain(self.plan, schema=True)

    def validate(self) -> None:
        """Check the whole plan (:func:`shoal.plan.validate.validate`)."""
        from shoal.plan.validate import validate

        validate(self.plan)

    def execute(
        self, *, runner: RunnerKind | None = None, config: Config | None = None
    ) -> pa.Table:
        """Run the plan with :func:`shoal.execute` and return an Arrow table."""
        from shoal.api import execute

        return execute(self.plan, runner=runner, config=config)

    def __repr__(self) -> str:
        return f"Frame\n{self.explain()}"


class GroupBy:
    """``frame.group_by(keys)``: finish with :meth:`agg`."""

    def __init__(self, frame: Frame, keys: list[Any], maintain_order: bool) -> None:
        self._frame = frame
        self._keys = keys
        self._maintain_order = maintain_order

    def agg(self, *aggs: IntoExpr, **named: IntoExpr) -> Frame:
        """One row per group: the keys, then ``aggs`` (see :meth:`Frame.aggregate`)."""
        items: list[Any] = _flatten(aggs)
        items.extend(ExprBuilder(_UAlias(_u(v), k)) for k, v in named.items())
        return self._frame.aggregate(self._keys, items, maintain_order=self._maintain_order)


def _cols_outside_aggs(e: Expr) -> set[str]:
    if isinstance(e, Agg):
        return set()
    if isinstance(e, Col):
        return {e.name}
    out: set[str] = set()
    for c in e.children():
        out |= _cols_outside_aggs(c)
    return out


__all__ = [
    "DTypeLike",
    "ExprBuilder",
    "Frame",
    "GroupBy",
    "col",
    "from_arrow",
    "from_polars",
    "len_",
    "lit",
    "scan_parquet",
    "to_dtype",
    "when",
]
