"""Row-wise expressions that run on DuckDB in the tasks (:class:`shoal.ir.nodes.SqlMap`).

The adapter re-expresses DuckDB's expressions in the IR where it knows DuckDB's rule
exactly; where it does not (:class:`shoal_duckdb.exprs.Unsupported`), a row-wise,
deterministic expression is printed back as DuckDB SQL (:mod:`shoal_duckdb.render`) and
computed by DuckDB inside the tasks: a :class:`ForeignColumns` collects such expressions
over one operator's input and puts one ``SqlMap`` below the operator, which then reads
their values as ordinary columns. The smallest failing sub-expression whose type the IR
carries is the one sent to DuckDB; the rest of the expression stays in the IR.

Nothing is sent unchecked: each expression's SQL is bound by DuckDB over an empty input
with the same column types and settings as a task's (its result type must be the one
DuckDB's own plan gives), and every constant it writes must come back from DuckDB's
optimizer as the very value of the original plan. Where any of this fails, the
expression is refused as before, with its original reason.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from shoal.errors import ShoalError, UnsupportedError
from shoal.execution.foreign import cursor, quote_literal, run_sql_map, uncarried
from shoal.ir.expr import Col
from shoal.ir.nodes import SQL_MAP_RELATION, PlanNode, SqlMap
from shoal.ir.types import DataType, Schema
from shoal_duckdb.prepare import quote_ident
from shoal_duckdb.render import CannotRender, Renderer, builtin_functions, sql_type
from shoal_duckdb.types import dtype_of, loads_plan_json

#: Settings of the user's DuckDB session that change what an expression computes; a task's
#: DuckDB session gets the same values (``SqlMap.settings``). Under a ``default_collation``
#: nothing is computed in the tasks: DuckDB's binder has written the collation into the
#: plan as functions (``lower(s) = ...``, ``icu_sort_key``) that binding again under it
#: would apply twice, while some functions (``list_sort``) apply it themselves.
SESSION_SETTINGS = (
    "TimeZone",
    "Calendar",
    "default_order",
    "default_null_order",
    "default_collation",
    "ieee_floating_point_ops",
    "integer_division",
    "error_on_division_by_zero",
    "disable_timestamptz_casts",
    "errors_as_json",
    "scalar_subquery_error_on_multiple_rows",
)


#: Settings whose default depends on the machine (its time zone and locale): always set.
_MACHINE_SETTINGS = ("TimeZone", "Calendar")


def _read_settings(con: Any) -> dict[str, str]:
    out = {}
    for name in SESSION_SETTINGS:
        try:
            rows = con.execute(f"SELECT current_setting({quote_literal(name)})").fetchall()
        except Exception:  # a setting this release does not have
            continue
        if rows and rows[0][0] is not None:
            value = rows[0][0]
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


@functools.cache
def _defaults() -> dict[str, str]:
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        return _read_settings(con)
    finally:
        con.close()


def session_settings(con: Any) -> tuple[tuple[str, str], ...]:
    """The values of :data:`SESSION_SETTINGS` on the user's connection ``con`` that a
    task's fresh DuckDB session must be given: those that differ from a fresh session's,
    and the time zone and calendar (whose defaults depend on the machine)."""
    defaults = _defaults()
    return tuple(
        (name, value)
        for name, value in _read_settings(con).items()
        if name in _MACHINE_SETTINGS or defaults.get(name) != value
    )


class ForeignColumns:
    """Expressions over the columns of one operator's input (``node``, whose DuckDB
    columns are ``cols``) computed by DuckDB in the tasks, as new columns of ``node``.

    :meth:`compute` is the hook of :class:`shoal_duckdb.exprs.ExprTranslator`;
    :meth:`node_with_columns` gives the input with a ``SqlMap`` computing them.
    ``settings`` gives the user's session settings (read when first needed); ``fresh``
    makes a column name unused in the query.
    """

    def __init__(
        self,
        node: PlanNode,
        cols: Sequence[Col],
        names: Sequence[str | None],
        settings: Callable[[], tuple[tuple[str, str], ...]],
        fresh: Callable[[str], str],
    ) -> None:
        self.node = node
        self.cols = cols
        #: The name of each of ``cols`` in ``node``, None where DuckDB may not read it.
        self.names = names
        self._settings = settings
        self.fresh = fresh
        #: (output name, SQL, IR type, input columns read), in order of computation.
        self.pending: list[tuple[str, str, DataType, tuple[str, ...]]] = []

    def mark(self) -> int:
        """A point to :meth:`reset` to (the expressions computed so far)."""
        return len(self.pending)

    def reset(self, mark: int) -> None:
        """Forget the expressions computed since ``mark`` (an enclosing expression is
        computed whole instead)."""
        del self.pending[mark:]

    def compute(self, e: dict[str, Any]) -> Col | None:
        """A column holding DuckDB's value of the bound expression ``e`` for each row of
        the input, or None when ``e`` cannot run on DuckDB in the tasks (its type is not
        one the IR carries, it cannot be written as SQL, or the check fails)."""
        if _collated(self._settings()):
            return None
        try:
            duck_type = e.get("return_type") or e["value"]["type"]
            dtype = dtype_of(duck_type)
            sql_type(duck_type)  # a type a fresh session names (no user type, collation)
        except (UnsupportedError, CannotRender, KeyError, TypeError):
            return None
        renderer = Renderer(self.names, builtin_functions())
        try:
            text = renderer.render(e)
        except (CannotRender, KeyError, TypeError, ValueError, IndexError):
            return None
        if renderer.infinite and _has_temporal(dtype.arrow):
            return None  # the kernel cannot carry DuckDB's infinite dates (nor Polars')
        name = self.fresh(str(e.get("alias") or "duckdb"))
        used = tuple(renderer.used)
        if not self._check(name, text, dtype, used, renderer.constants):
            return None
        self.pending.append((name, text, dtype, used))
        return Col(name, dtype)

    def node_with_columns(self) -> PlanNode:
        """``node`` with the computed columns appended (itself when there are none)."""
        if not self.pending:
            return self.node
        return sql_map(self.node, self.pending, self._settings())

    # -- checks --------------------------------------------------------------------------

    def _check(
        self,
        name: str,
        text: str,
        dtype: DataType,
        used: tuple[str, ...],
        constants: list[tuple[str, dict[str, Any]]],
    ) -> bool:
        """Whether DuckDB binds ``text`` over an empty input to ``dtype`` and gives every
        constant back unchanged."""
        settings = self._settings()
        probe = sql_map(self.node, [(name, text, dtype, used)], settings)
        empty = pl.DataFrame(schema=self.node.schema.to_polars())
        try:
            run_sql_map(probe, empty)
        except (ShoalError, Exception):
            return False
        return not constants or _same_constants(constants, settings)


def sql_map(
    node: PlanNode,
    columns: Sequence[tuple[str, str, DataType, tuple[str, ...]]],
    settings: tuple[tuple[str, str], ...],
) -> SqlMap:
    """A :class:`SqlMap` over ``node`` computing ``columns`` (name, SQL, IR type, input
    columns read) in one SELECT."""
    items = ", ".join(f"{text} AS {quote_ident(name)}" for name, text, _, _ in columns)
    reads: list[str] = []
    for *_, used in columns:
        reads.extend(c for c in used if c not in reads)
    schema = Schema.of([*node.schema.fields, *((n, d) for n, _, d, _ in columns)])
    return SqlMap(
        node,
        f"SELECT {items} FROM {SQL_MAP_RELATION}",
        tuple(c for c in node.schema.names if c in reads),
        schema,
        "duckdb",
        settings,
    )


def _same_constants(
    constants: list[tuple[str, dict[str, Any]]], settings: tuple[tuple[str, str], ...]
) -> bool:
    """Whether DuckDB's optimizer folds each constant's SQL into exactly the serialised
    value it was written from (type and value)."""
    select = "SELECT " + ", ".join(text for text, _ in constants)
    con = cursor()
    try:
        for key, value in settings:
            con.execute(f"SET SESSION {key} = {quote_literal(value)}")
        rows = con.execute("SELECT json_serialize_plan(?, optimize := true)", [select]).fetchall()
        doc = loads_plan_json(str(rows[0][0]))
        exprs = doc["plans"][0]["expressions"]
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            con.close()
    if len(exprs) != len(constants):
        return False
    for got, (_, want) in zip(exprs, constants, strict=True):
        if got.get("expression_class") != "BOUND_CONSTANT":
            return False
        if not _same_value(got.get("value"), want):
            return False
    return True


def _same_value(a: Any, b: Any) -> bool:
    """Deep equality of serialised values, floats by their bits (NaN equals NaN, -0.0
    differs from 0.0) and ``type_info`` entries that carry nothing compared as absent."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = {k for k in (*a, *b) if not _empty(a.get(k)) or not _empty(b.get(k))}
        return all(_same_value(a.get(k), b.get(k)) for k in keys)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            return False
        x, y = float(a), float(b)
        if math.isnan(x) or math.isnan(y):
            return math.isnan(x) and math.isnan(y)
        return x == y and math.copysign(1.0, x) == math.copysign(1.0, y)
    return bool(a == b) and type(a) is type(b)


def _empty(v: Any) -> bool:
    return v is None or v == "" or v == [] or v == {}


def _has_temporal(t: pa.DataType) -> bool:
    """Whether ``t`` is or holds a DATE or TIMESTAMP type."""
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return True
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return _has_temporal(t.value_type)
    if pa.types.is_struct(t):
        return any(_has_temporal(f.type) for f in t)
    return False


def constant_rows(
    rows: Sequence[Sequence[dict[str, Any]]],
    types: Sequence[DataType],
    settings: tuple[tuple[str, str], ...],
) -> pa.Table | None:
    """The rows of a ``VALUES`` list of constant expressions (bound expressions that read
    no column) evaluated by DuckDB here, as an Arrow table of ``types`` (columns ``c0``,
    ``c1``, ...), or None when they cannot be (an expression that cannot be written as
    SQL, a constant that does not come back unchanged, another result type, a value the
    kernel cannot hold, or DuckDB raising: the caller refuses the query as before)."""
    if _collated(settings):
        return None
    renderer = Renderer([], builtin_functions())
    selects = []
    try:
        for i, row in enumerate(rows):
            items = [f"{i} AS {quote_ident('__shoal_row')}"]
            items += [f"{renderer.render(e)} AS {quote_ident(f'c{j}')}" for j, e in enumerate(row)]
            selects.append("SELECT " + ", ".join(items))
    except (CannotRender, KeyError, TypeError, ValueError, IndexError):
        return None
    if not selects or renderer.infinite:
        return None
    if renderer.constants and not _same_constants(renderer.constants, settings):
        return None
    query = f"SELECT * EXCLUDE ({quote_ident('__shoal_row')}) FROM ({' UNION ALL '.join(selects)}) ORDER BY {quote_ident('__shoal_row')}"
    cur = cursor()
    try:
        for key, value in settings:
            cur.execute(f"SET SESSION {key} = {quote_literal(value)}")
        table = cur.sql(query).to_arrow_table()
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            cur.close()
    if table.num_columns != len(types):
        return None
    for column, dtype in zip(table.columns, types, strict=True):
        if DataType(column.type).arrow != dtype.arrow or uncarried(column):
            return None
    return table.cast(Schema.of([(f"c{j}", d) for j, d in enumerate(types)]).to_arrow())


def _collated(settings: tuple[tuple[str, str], ...]) -> bool:
    """Whether the session has a ``default_collation`` (see :data:`SESSION_SETTINGS`)."""
    return bool(dict(settings).get("default_collation"))
