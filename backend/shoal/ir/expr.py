"""Expressions of the shoal IR: immutable, typed trees.

Every expression carries its output ``dtype``. The semantics are Polars' semantics unless
a node says otherwise (frontends whose rules differ, such as DuckDB's integer division,
translate into explicit casts and functions so that one IR expression means one thing):

* Nulls propagate through arithmetic and comparisons; ``and``/``or`` use Kleene logic.
* Integer arithmetic wraps on overflow as Polars does; ``truediv`` gives a float.
* Aggregates skip nulls; ``sum`` of no values is 0, ``min``/``max``/``mean`` of no
  values is null; ``count`` counts non-null values, ``len`` counts rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from shoal.ir.functions import AGG_NAMES, AGGREGATING_NAMES, ORDER_DEPENDENT_NAMES
from shoal.ir.types import DataType

#: Binary operators: arithmetic, comparison and logic (``and``/``or``/``xor``: Kleene logic
#: on booleans, bitwise on two integers of one type, as in Polars).
ARITHMETIC_OPS = frozenset({"add", "sub", "mul", "truediv", "floordiv", "mod"})
COMPARISON_OPS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "eq_missing", "ne_missing"})
BOOLEAN_OPS = frozenset({"and", "or", "xor"})
BINARY_OPS = ARITHMETIC_OPS | COMPARISON_OPS | BOOLEAN_OPS

#: Aggregate functions the IR knows (``Agg`` nodes): from the function table,
#: :data:`shoal.ir.functions.FUNCTION_TABLE`.
AGG_FUNCTIONS = AGG_NAMES

#: Functions that aggregate: like an :class:`Agg`, one reads every row of its group (the
#: whole input in a ``select``) and gives one value per group, or, for ``value_counts``
#: and ``unique_counts``, a new set of rows (a list per group in ``group_by().agg()``).
#: They take several arguments (``corr``) or give several rows, so they are functions, not
#: ``Agg`` nodes; :meth:`Expr.has_agg` counts them and the planner aggregates their input
#: rows once (after a gather, or a hash exchange on the group keys), which is exact.
#: The table's ``Function`` entries of kind ``"aggregate"``.
AGGREGATING_FUNCTIONS = AGGREGATING_NAMES

#: Functions whose value on a row depends on other rows or on row order. A plan node that
#: evaluates one needs all its rows in order (the planner gathers its input first, which
#: is exact); every other function is row-local and runs on any partition. The table's
#: window and order functions, and the aggregating functions.
ORDER_DEPENDENT_FUNCTIONS = ORDER_DEPENDENT_NAMES

_SYMBOL = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "truediv": "/",
    "floordiv": "//",
    "mod": "%",
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq_missing": "eq_missing",
    "ne_missing": "ne_missing",
    "and": "&",
    "or": "|",
    "xor": "^",
}


#: What :func:`field_names` answered, by class.
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The field names of dataclass ``cls`` (an expression or plan node class), in order:
    ``dataclasses.fields`` builds its answer on every call, and plans are walked often."""
    got = _FIELD_NAMES.get(cls)
    if got is None:
        got = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    return got


#: What :func:`child_fields` answered, by (class, node base class).
_CHILD_FIELDS: dict[tuple[type, str], tuple[str, ...]] = {}


def child_fields(cls: type, base: str) -> tuple[str, ...]:
    """The fields of dataclass ``cls`` that may hold a child of class ``base`` (named:
    ``"Expr"``, ``"PlanNode"``), in order: those whose type annotation names ``base`` or is
    open (``Any``, ``object``). Fields of other types (a name, a schema, flags, options)
    cannot hold one (the package is type-checked), and :meth:`Expr.children` and
    ``PlanNode.children`` look at them no more: plans and their expressions are walked
    many times per query, a node has up to a dozen such fields, and a node's ``children``
    was the costliest call of a small query's planning."""
    key = (cls, base)
    got = _CHILD_FIELDS.get(key)
    if got is None:
        got = _CHILD_FIELDS[key] = tuple(
            f.name
            for f in fields(cls)  # type: ignore[arg-type]
            if any(w in str(f.type) for w in (base, "Any", "object"))
        )
    return got


class Expr:
    """Base class of IR expressions. Subclasses are frozen dataclasses with a ``dtype``."""

    dtype: DataType

    def children(self) -> tuple[Expr, ...]:
        out: list[Expr] = []
        for name in child_fields(type(self), "Expr"):
            v = getattr(self, name)
            if isinstance(v, Expr):
                out.append(v)
            elif isinstance(v, tuple) and v and all(isinstance(x, Expr) for x in v):
                out.extend(v)
        return tuple(out)

    def map_children(self, fn: Callable[[Expr], Expr]) -> Expr:
        """A copy with ``fn`` applied to each direct child expression."""
        changes: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, Expr):
                changes[f.name] = fn(v)
            elif isinstance(v, tuple) and v and all(isinstance(x, Expr) for x in v):
                changes[f.name] = tuple(fn(x) for x in v)
        if not changes:
            return self
        kwargs = {f.name: changes.get(f.name, getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]
        return type(self)(**kwargs)

    def walk(self) -> Iterator[Expr]:
        """This expression and every descendant, pre-order."""
        yield self
        for c in self.children():
            yield from c.walk()

    def columns(self) -> set[str]:
        """Names of the input columns this expression reads."""
        return {e.name for e in self.walk() if isinstance(e, Col)}

    def has_agg(self) -> bool:
        """True when this expression aggregates rows: it has an aggregate (an :class:`Agg`
        or one of :data:`AGGREGATING_FUNCTIONS`) outside any window (``over``), whose
        aggregates are computed per group and mapped back to rows."""
        if isinstance(self, Agg):
            return True
        if isinstance(self, Function) and self.name == "over":
            return False
        if isinstance(self, Function) and self.name in AGGREGATING_FUNCTIONS:
            return True
        return any(c.has_agg() for c in self.children())

    def sized_outside_aggs(self) -> bool:
        """True when an order-dependent function sits outside every aggregate of this
        expression (``pl.repeat(sum(a), 3)``): its length is its own, so a ``select`` of it
        is no one-row aggregation (it is evaluated once, on the gathered rows)."""
        if isinstance(self, Agg) or (
            isinstance(self, Function) and self.name in AGGREGATING_FUNCTIONS
        ):
            return False
        if isinstance(self, Function) and self.name in ORDER_DEPENDENT_FUNCTIONS:
            return True
        return any(c.sized_outside_aggs() for c in self.children())

    def is_row_local(self) -> bool:
        """True when each output row depends only on the same input row (no aggregate,
        no order-dependent function): safe to evaluate on any partition."""
        for e in self.walk():
            if isinstance(e, Agg):
                return False
            if isinstance(e, Function) and e.name in ORDER_DEPENDENT_FUNCTIONS:
                return False
        return True

    def collect_order_dependent(
        self, take: Callable[[Function], bool | None], out: list[Function]
    ) -> bool:
        """Collect into ``out`` the functions of this expression that ``take`` accepts, when
        they are its only parts that read other rows. ``take(f)`` is True (collect ``f``,
        not its arguments), False (refuse) or None (not of the wanted kind: the usual rule,
        where an aggregate or another order-dependent function refuses). Returns False on a
        refusal (``out`` is then incomplete)."""
        if isinstance(self, Function):
            verdict = take(self)
            if verdict is not None:
                if verdict:
                    out.append(self)
                return verdict
            if self.name in ORDER_DEPENDENT_FUNCTIONS:
                return False
        if isinstance(self, Agg):
            return False
        return all(c.collect_order_dependent(take, out) for c in self.children())


@dataclass(frozen=True)
class Col(Expr):
    """An input column by name."""

    name: str
    dtype: DataType

    def __str__(self) -> str:
        return f"col({self.name!r})"


@dataclass(frozen=True)
class Lit(Expr):
    """A scalar literal (Python value: int, float, str, bool, date, datetime, Decimal, None).

    A temporal literal may also be its physical integer in its dtype's unit (a Datetime
    since the epoch in UTC, a Time since midnight in nanoseconds): Python's datetime types
    stop at microseconds, so nanosecond values travel that way."""

    value: Any
    dtype: DataType

    def __hash__(self) -> int:
        # A list value (the right side of is_in) hashes by its items.
        return hash((_hashable(self.value), self.dtype))

    def __str__(self) -> str:
        return f"lit({self.value!r}: {self.dtype})"


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _hashable(v)) for k, v in value.items())
    return value


@dataclass(frozen=True)
class BinaryOp(Expr):
    """``left <op> right`` with ``op`` one of :data:`BINARY_OPS`."""

    op: str
    left: Expr
    right: Expr
    dtype: DataType

    def __str__(self) -> str:
        return f"({self.left} {_SYMBOL.get(self.op, self.op)} {self.right})"


@dataclass(frozen=True)
class Cast(Expr):
    """Cast to ``dtype``; ``strict`` raises on values that do not fit (else they become null);
    ``wrap`` makes numbers that do not fit wrap around instead (Polars'
    ``wrap_numerical``, which Polars also uses for its own integer supertype casts)."""

    expr: Expr
    dtype: DataType
    strict: bool = True
    wrap: bool = False

    def __str__(self) -> str:
        kind = "wrapping_" if self.wrap else "strict_" if self.strict else ""
        return f"{self.expr}.{kind}cast({self.dtype})"


@dataclass(frozen=True)
class Ternary(Expr):
    """``when(predicate).then(then).otherwise(otherwise)``; a null predicate takes otherwise."""

    predicate: Expr
    then: Expr
    otherwise: Expr
    dtype: DataType

    def __str__(self) -> str:
        return f"when({self.predicate}).then({self.then}).otherwise({self.otherwise})"


@dataclass(frozen=True)
class Function(Expr):
    """A scalar function by name with positional ``args`` and keyword ``options``.

    Names are namespaced as in Polars (``str.starts_with``, ``dt.year``) or plain
    (``is_null``, ``not``, ``abs``). The IR's function table
    (:data:`shoal.ir.functions.FUNCTION_TABLE`) says what each name is;
    :data:`shoal.lowering.expressions.FUNCTIONS` how Polars runs it.
    """

    name: str
    args: tuple[Expr, ...]
    options: tuple[tuple[str, Any], ...]
    dtype: DataType

    def option(self, key: str, default: Any = None) -> Any:
        for k, v in self.options:
            if k == key:
                return v
        return default

    def __str__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self.options)
        return f"{self.name}({', '.join(map(str, self.args))}{opts})"


@dataclass(frozen=True)
class Agg(Expr):
    """An aggregate function (one of :data:`AGG_FUNCTIONS`) over ``arg`` (None for ``len``)."""

    name: str
    arg: Expr | None
    dtype: DataType
    options: tuple[tuple[str, Any], ...] = ()

    def children(self) -> tuple[Expr, ...]:
        return () if self.arg is None else (self.arg,)

    def map_children(self, fn: Callable[[Expr], Expr]) -> Expr:
        if self.arg is None:
            return self
        return Agg(self.name, fn(self.arg), self.dtype, self.options)

    def __str__(self) -> str:
        return f"{self.name}({'' if self.arg is None else self.arg})"


@dataclass(frozen=True)
class NamedExpr:
    """An expression and the name of the column it produces."""

    name: str
    expr: Expr

    @property
    def dtype(self) -> DataType:
        return self.expr.dtype

    def __str__(self) -> str:
        if isinstance(self.expr, Col) and self.expr.name == self.name:
            return str(self.expr)
        return f"{self.expr} AS {self.name}"


def replace(expr: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Rewrite bottom-up: ``fn`` returns a replacement or None to keep the node."""
    new = expr.map_children(lambda c: replace(c, fn))
    out = fn(new)
    return new if out is None else out
