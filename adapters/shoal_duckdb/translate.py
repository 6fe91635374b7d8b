"""DuckDB's optimised logical plan (``json_serialize_plan`` JSON) -> shoal IR plan.

One function per DuckDB logical operator type, chosen by name in :data:`OPERATORS`.
DuckDB's operators address columns by position (``BOUND_REF`` index ``i`` is column ``i``
of the child's output); the translation gives every column a name unique in the whole
query, so that joins never clash, and keeps for each translated operator the list of its
output columns in DuckDB's order (a :class:`Rel`). An operator or expression that cannot be
translated is recorded and translation goes on, so that one
:class:`shoal.UnsupportedError` names every unsupported part of the query at once.
"""

from __future__ import annotations

import contextlib
import decimal
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from shoal.errors import UnsupportedError
from shoal.ir.expr import Agg, Cast, Col, Expr, Function, Lit, NamedExpr, Ternary
from shoal.ir.expr import replace as replace_expr
from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Explode,
    Filter,
    InMemorySource,
    Join,
    JoinHow,
    ParquetSource,
    PlanNode,
    Project,
    RollingGroupBy,
    RowIndex,
    Scan,
    Slice,
    Sort,
    Union,
)
from shoal.ir.types import BOOL, FLOAT64, INT64, STRING, DataType, Schema
from shoal.lowering.expressions import nested_nulls_last_type
from shoal_duckdb.exprs import (
    IDX,
    ExprTranslator,
    Unsupported,
    agg_order_key,
    aggregate,
    and_all,
    binop,
    cast,
    compare,
    comparison_op,
    duck_cast,
    fail_where,
    fn,
    is_not_null,
    is_null,
    is_tstz,
    lit,
    or_all,
    ordered_values,
    python_value,
    raise_where,
    struct_field,
)
from shoal_duckdb.fragment import ForeignColumns, constant_rows, session_settings
from shoal_duckdb.prepare import StandIn, quote_ident
from shoal_duckdb.reasons import SourceText, frame_words, unmask, where_words, window_words
from shoal_duckdb.types import Interval, RawTemporal, dtype_of, time_zone, value_of
from shoal_duckdb.udf import lookup_udf, udf_project_for

_VIRTUAL = (
    "virtual scan columns (rowid, or the row number DuckDB's optimizer makes of "
    "row_number() OVER ()) are not supported: they depend on storage order"
)

#: DuckDB writes "no value" for an index as the largest unsigned 64-bit integer.
_INVALID_INDEX = 2**64 - 1


@dataclass(frozen=True)
class Rel:
    """A translated operator: its IR node and its output columns in DuckDB's order.

    ``node`` may carry further columns (never read through ``cols``)."""

    node: PlanNode
    cols: tuple[Col, ...]


OperatorHandler = Callable[["Translator", dict[str, Any]], Rel]

#: DuckDB logical operator type -> translation function.
OPERATORS: dict[str, OperatorHandler] = {}

#: Operators shoal cannot run, with the reason.
UNSUPPORTED_OPERATORS: dict[str, str] = {
    "LOGICAL_PIVOT": "not supported",
    "LOGICAL_SAMPLE": "sampling is not supported",
    "LOGICAL_DELIM_JOIN": "this form of correlated subquery (a duplicate-eliminated join) is "
    "not supported",
    "LOGICAL_DELIM_GET": "this form of correlated subquery (a duplicate-eliminated join) is "
    "not supported",
    "LOGICAL_RECURSIVE_CTE": "recursive CTEs are not supported",
    "LOGICAL_POSITIONAL_JOIN": "positional joins depend on row order",
    "LOGICAL_DEPENDENT_JOIN": "this form of correlated subquery is not supported",
    "LOGICAL_INSERT": "only queries run distributed",
    "LOGICAL_DELETE": "only queries run distributed",
    "LOGICAL_UPDATE": "only queries run distributed",
}


def _register(*names: str) -> Callable[[OperatorHandler], OperatorHandler]:
    def deco(f: OperatorHandler) -> OperatorHandler:
        for n in names:
            OPERATORS[n] = f
        return f

    return deco


class _Failed(Exception):
    """Internal: an operator could not be translated (its error is recorded)."""


class Translator:
    """The state of one translation: the connection (to read its tables), the stand-ins,
    the names in use, the CTEs and the errors found so far."""

    def __init__(
        self, con: Any, standins: dict[str, StandIn], source: SourceText | None = None
    ) -> None:
        self.con = con
        self.standins = standins
        self.source = source
        self.errors: list[str] = []
        self.names: set[str] = set()
        self.ctes: dict[int, Rel] = {}
        #: Names of columns standing for DuckDB's virtual columns (rowid): never readable.
        self.virtual: set[str] = set()
        self._tables: dict[tuple[str, ...], pa.Table] = {}
        setting = con.sql("SELECT current_setting('error_on_division_by_zero')").fetchall()
        self.error_on_division_by_zero = bool(setting[0][0]) if setting else True
        #: DuckDB's ``TimeZone`` and ``Calendar`` settings (ICU): the zone of every
        #: TIMESTAMPTZ in the plan (see :func:`shoal_duckdb.types.time_zone`).
        self.time_zone, self.calendar = _zone_settings(con)
        try:
            ieee = con.sql("SELECT current_setting('ieee_floating_point_ops')").fetchall()
        except Exception:  # a DuckDB release without the setting: IEEE semantics
            ieee = []
        self.ieee_floating_point_ops = bool(ieee[0][0]) if ieee else True
        try:
            several = con.sql(
                "SELECT current_setting('scalar_subquery_error_on_multiple_rows')"
            ).fetchall()
        except Exception:  # a DuckDB release without the setting: it raises
            several = []
        #: DuckDB's setting of that name: when false, a correlated scalar subquery that
        #: gives several rows for a row gives any one of them instead of raising.
        self.scalar_subquery_error_on_multiple_rows = bool(several[0][0]) if several else True
        #: The operator input whose untranslatable expressions DuckDB computes in the
        #: tasks (:meth:`foreign`), if any.
        self._foreign: ForeignColumns | None = None
        self._settings: tuple[tuple[str, str], ...] | None = None

    # -- errors -------------------------------------------------------------------------

    def error(self, what: str, reason: str) -> None:
        """Record that ``what`` (a DuckDB operator, ``LOGICAL_GET(<table>)``, or words)
        cannot run, for ``reason``; both are reported in the words of the user's query
        (the clause, the table or file, never a stand-in's name)."""
        entry = f"{where_words(what, self.standins)}: {unmask(reason, self.standins)}"
        if entry not in self.errors:
            self.errors.append(entry)

    # -- names --------------------------------------------------------------------------

    def fresh(self, hint: str = "c") -> str:
        """A column name not used anywhere in the plan yet (``hint`` when free)."""
        base = re.sub(r"\s+", "_", hint.strip()) or "c"
        if base.startswith("__"):
            base = base.lstrip("_") or "c"
        name, i = base, 0
        while name.lower() in self.names:
            i += 1
            name = f"{base}_{i}"
        self.names.add(name.lower())
        return name

    def claim(self, name: str) -> bool:
        """Take ``name`` if it is free; whether it was."""
        if name.lower() in self.names:
            return False
        self.names.add(name.lower())
        return True

    # -- expressions --------------------------------------------------------------------

    def expr(self, e: dict[str, Any], cols: Sequence[Expr], where: str) -> Expr:
        """Translate expression ``e`` over ``cols``; records the error and returns a
        placeholder when it cannot."""
        try:
            return self._no_virtual(self._exprs(cols).expr(e), where)
        except Unsupported as exc:
            self.error(where, exc.explained())
            return Lit(None, BOOL)

    def agg(self, e: dict[str, Any], cols: Sequence[Expr], where: str) -> Expr:
        try:
            return self._no_virtual(aggregate(self._exprs(cols), e), where)
        except Unsupported as exc:
            self.error(where, exc.explained())
            return Lit(None, BOOL)

    def _exprs(self, cols: Sequence[Expr]) -> ExprTranslator:
        foreign = self._foreign
        return ExprTranslator(
            cols,
            self.error_on_division_by_zero,
            self.source,
            self.ieee_floating_point_ops,
            foreign if foreign is not None and cols is foreign.cols else None,
        )

    @contextlib.contextmanager
    def foreign(self, rel: Rel | None) -> Iterator[ForeignColumns | None]:
        """While the block runs, expressions over ``rel``'s columns that cannot be
        translated are computed by DuckDB in the tasks where they can be
        (:mod:`shoal_duckdb.fragment`); :meth:`with_foreign` then gives ``rel`` with
        those columns. Yields None (nothing computed) when ``rel`` failed."""
        if rel is None:
            yield None
            return
        names = [None if c.name.lower() in self.virtual else c.name for c in rel.cols]
        scope = ForeignColumns(rel.node, rel.cols, names, self.session_settings, self.fresh)
        previous, self._foreign = self._foreign, scope
        try:
            yield scope
        finally:
            self._foreign = previous

    def with_foreign(self, rel: Rel, scope: ForeignColumns | None) -> Rel:
        """``rel`` with the columns that DuckDB computes in the tasks for ``scope``."""
        if scope is None or not scope.pending:
            return rel
        return Rel(scope.node_with_columns(), rel.cols)

    def session_settings(self) -> tuple[tuple[str, str], ...]:
        """The user's DuckDB settings a task's DuckDB session gets (read once)."""
        if self._settings is None:
            self._settings = session_settings(self.con)
        return self._settings

    def _no_virtual(self, e: Expr, where: str) -> Expr:
        if self.virtual and any(c.lower() in self.virtual for c in e.columns()):
            raise Unsupported(_VIRTUAL)
        return e

    def dtype(self, t: dict[str, Any], where: str) -> DataType:
        try:
            return dtype_of(t)
        except UnsupportedError as exc:
            self.error(where, str(exc))
            raise _Failed() from None

    # -- operators ----------------------------------------------------------------------

    def plan(self, op: dict[str, Any]) -> Rel:
        kind = str(op.get("type"))
        handler = OPERATORS.get(kind)
        if handler is None:
            reason = UNSUPPORTED_OPERATORS.get(kind, "operator not supported by shoal")
            self.error(kind, reason)
            for child in op.get("children", []):
                self._try(child)
            raise _Failed()
        return handler(self, op)

    def _try(self, op: dict[str, Any]) -> None:
        with contextlib.suppress(_Failed):
            self.plan(op)

    def single_child(self, op: dict[str, Any]) -> tuple[Rel | None, Sequence[Col]]:
        """Translate the only child; when it fails, stand-in columns so that the caller
        still translates (and reports) its own expressions, then raises."""
        (child,) = op["children"]
        try:
            rel = self.plan(child)
        except _Failed:
            return None, _AnyColumns()
        return rel, rel.cols

    def children(self, op: dict[str, Any]) -> list[Rel]:
        """Translate every child (all of them, to report every error), or raise."""
        out: list[Rel | None] = []
        failed = False
        for child in op.get("children", []):
            try:
                out.append(self.plan(child))
            except _Failed:
                out.append(None)
                failed = True
        if failed:
            raise _Failed()
        return [r for r in out if r is not None]

    # -- building blocks ----------------------------------------------------------------

    def project(self, rel: Rel, exprs: Sequence[tuple[str, Expr]]) -> Rel:
        """A projection computing ``exprs`` (hint, expression) over ``rel``; plain column
        references keep their names when they can."""
        named: list[NamedExpr] = []
        seen: set[str] = set()
        for hint, e in exprs:
            if isinstance(e, Col) and e.name not in seen:
                name = e.name
            else:
                name = self.fresh(hint)
            seen.add(name)
            named.append(NamedExpr(name, e))
        schema = Schema.of([(n.name, n.dtype) for n in named])
        cols = tuple(Col(n.name, n.dtype) for n in named)
        node = rel.node
        if named and rel.cols and not any(n.expr.columns() or n.expr.has_agg() for n in named):
            # DuckDB evaluates a constant projection once per input row; in the IR (Polars'
            # rules) a projection of literals alone is one row. Carry an input column along
            # so the literals broadcast to the input's height, then drop it.
            height = NamedExpr(self.fresh("height"), rel.cols[0])
            with_height = Schema.of([*schema.fields, (height.name, height.dtype)])
            carried = Project(node, (*named, height), with_height)
            return Rel(Project(carried, tuple(NamedExpr(c.name, c) for c in cols), schema), cols)
        if isinstance(node, Project) and all(isinstance(n.expr, Col) for n in named):
            # Columns picked from a projection: one projection (plans read better).
            inner = {n.name: n.expr for n in node.exprs}
            picked = [inner.get(n.expr.name) for n in named if isinstance(n.expr, Col)]
            # Only when a row-wise expression is left to give the height: in the IR (as in
            # Polars) a projection of literals or whole-input aggregates alone is one row,
            # while the inner projection carries a column of the input's height.
            if all(e is not None for e in picked) and any(
                e is not None and e.columns() and not e.has_agg() for e in picked
            ):
                composed = tuple(
                    NamedExpr(n.name, e) for n, e in zip(named, picked, strict=True) if e
                )
                return Rel(Project(node.input, composed, schema), cols)
        return Rel(Project(node, tuple(named), schema), cols)

    def select(self, rel: Rel, indexes: Sequence[int]) -> Rel:
        """Columns ``indexes`` of ``rel`` (all when empty)."""
        if not indexes:
            return rel
        return self.project(rel, [(rel.cols[i].name, rel.cols[i]) for i in indexes])

    def renamed(self, rel: Rel) -> Rel:
        """``rel`` with fresh names for every column (a second use of a shared plan)."""
        named = tuple(NamedExpr(self.fresh(c.name), c) for c in rel.cols)
        # a virtual column (rowid) stays unreadable under its new name
        self.virtual.update(
            n.name.lower()
            for n, c in zip(named, rel.cols, strict=True)
            if c.name.lower() in self.virtual
        )
        schema = Schema.of([(n.name, n.dtype) for n in named])
        return Rel(Project(rel.node, named, schema), tuple(Col(n.name, n.dtype) for n in named))

    def exact(self, rel: Rel) -> Rel:
        """``rel`` whose node has exactly its columns, in order."""
        if rel.node.schema.names == tuple(c.name for c in rel.cols):
            return rel
        return self.project(rel, [(c.name, c) for c in rel.cols])

    def filter(self, rel: Rel, predicate: Expr) -> Rel:
        if isinstance(predicate, Lit) and predicate.value is True:
            return rel
        return Rel(Filter(rel.node, predicate, rel.node.schema), rel.cols)

    def table_arrow(
        self, qualified: str, columns: Sequence[str], rowid: str | None = None
    ) -> pa.Table:
        """Columns of a DuckDB table as Arrow (read once per query); with ``rowid`` also
        DuckDB's virtual ``rowid`` column under that name, last."""
        key = (qualified, *columns, f"rowid={rowid}")
        got = self._tables.get(key)
        if got is None:
            listing = ", ".join(
                [quote_ident(c) for c in columns]
                + ([f"rowid AS {quote_ident(rowid)}"] if rowid is not None else [])
            )
            got = self.con.sql(f"SELECT {listing} FROM {qualified}").to_arrow_table()
            self._tables[key] = got
        return got


#: Days from 1970-01-01 to the year 262000, inside the kernel's calendar (years
#: -262143..262143), which DuckDB's TIMESTAMP_S / _MS and DATE ranges exceed.
_CALENDAR_DAYS = int((262_000 - 1970) * 365.2425)
_PER_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000}


def _with_enums(arrow: pa.Table, dtypes: dict[str, DataType]) -> pa.Table:
    """``arrow`` with each ENUM column (DuckDB gives a dictionary of its categories) in
    the IR's Enum form: Polars' dictionary with the categories in the field's metadata,
    so that the kernel reads it as an Enum (ordered by category)."""
    for name, dtype in dtypes.items():
        if not dtype.is_enum or name not in arrow.column_names:
            continue
        as_enum = pl.from_arrow(arrow.select([name]).cast(pa.schema([(name, pa.large_string())])))
        assert isinstance(as_enum, pl.DataFrame)
        column = as_enum.cast({name: dtype.to_polars()}).to_arrow()
        i = arrow.column_names.index(name)
        arrow = arrow.set_column(i, column.schema.field(0), column.column(0))
    return arrow


def _out_of_calendar(arrow: pa.Table) -> str | None:
    """The first DATE or TIMESTAMP column of ``arrow`` that holds DuckDB's ``infinity`` or
    ``-infinity`` (raw ``+-(2**31 - 1)`` days, ``+-(2**63 - 1)`` in a TIMESTAMP's unit) or
    a value beyond the year 262000 either way, or None. The kernel reads infinities as
    instants (TIMESTAMP_S overflows into milliseconds: 1969-12-31 23:59:59; calendar parts
    and arithmetic give numbers where DuckDB gives NULL or infinity), and panics on
    values outside its calendar."""
    for name, column in zip(arrow.column_names, arrow.columns, strict=True):
        if pa.types.is_timestamp(column.type):
            raw = column.cast(pa.int64())
            per_day = _PER_DAY.get(column.type.unit)
            if per_day is None:  # nanoseconds: only the infinities are out of range
                limit = 2**63 - 2
            else:
                limit = min(_CALENDAR_DAYS * per_day, 2**63 - 2)
        elif pa.types.is_date32(column.type):
            raw = column.cast(pa.int32())
            limit = _CALENDAR_DAYS
        else:
            continue
        if column.null_count == len(column):
            continue
        if pc.max(raw).as_py() > limit or pc.min(raw).as_py() < -limit:
            return name
    return None


def _beyond_precision(arrow: pa.Table) -> str | None:
    """The first DECIMAL(38) column of ``arrow`` holding a value of 39 digits, or None.

    DuckDB's HUGEINT reaches +-1.7e38 (39 digits) but travels as Arrow's
    ``decimal128(38, 0)`` (as DuckDB exports it, unchecked); the kernel's DECIMAL(38)
    cannot hold such a value (Polars panics on it). Exact: the candidates (high 64 bits
    at or beyond those of 10**38) are checked as Python integers."""
    bound = 10**38
    hi_pos, hi_neg = bound >> 64, (-bound) >> 64
    for name, column in zip(arrow.column_names, arrow.columns, strict=True):
        if not (pa.types.is_decimal128(column.type) and column.type.precision == 38):
            continue
        for chunk in column.chunks:
            if len(chunk) == chunk.null_count:
                continue
            words = np.frombuffer(chunk.buffers()[1], dtype="<i8")
            hi = words[2 * chunk.offset : 2 * (chunk.offset + len(chunk))][1::2]
            (maybe,) = np.nonzero((hi >= hi_pos) | (hi <= hi_neg))
            for i in maybe.tolist():
                v = chunk[i].as_py()
                if v is not None and abs(int(v.scaleb(column.type.scale, _WIDE))) >= bound:
                    return name
    return None


_WIDE = decimal.Context(prec=80)


def _end_of_day(arrow: pa.Table) -> str | None:
    """The first TIME column of ``arrow`` that holds DuckDB's ``24:00:00``, or None."""
    for name, column in zip(arrow.column_names, arrow.columns, strict=True):
        if pa.types.is_time(column.type) and column.null_count < len(column):
            per_day = 86_400 * {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[column.type.unit]
            if pc.max(column.cast(pa.int64())).as_py() >= per_day:
                return name
    return None


def _zone_settings(con: Any) -> tuple[str, str]:
    """The connection's ``TimeZone`` and ``Calendar`` settings (``UTC`` and ``gregorian``
    when DuckDB has no ICU extension loaded, as it then knows only UTC)."""
    try:
        rows = con.sql("SELECT current_setting('TimeZone'), current_setting('Calendar')").fetchall()
    except duckdb.Error:
        return "UTC", "gregorian"
    return str(rows[0][0]), str(rows[0][1])


class _AnyColumns(Sequence[Col]):
    """Columns of an operator that could not be translated: any index is a column of
    unknown type (its readers translate their expressions only to report their errors)."""

    def __getitem__(self, index: Any) -> Any:
        return Col(f"?{index}", DataType(pa.null()))

    def __len__(self) -> int:
        return 2**31


def _done(child: Rel | None) -> Rel:
    """``child``, or raise when it failed (after the caller reported its own errors)."""
    if child is None:
        raise _Failed()
    return child


def translate(
    con: Any,
    root: dict[str, Any],
    standins: dict[str, StandIn],
    source: SourceText | None = None,
) -> tuple[PlanNode, tuple[Col, ...]]:
    """Translate a plan's root operator; returns the IR plan (exactly the output columns,
    in order) and its columns. ``source`` is the text of the query whose plan this is, to
    quote the user's expressions in errors.

    Raises :class:`shoal.UnsupportedError` listing every unsupported part, each in the
    words of the query (the clause, the expression as written where the plan locates it,
    the table, file or column) and the reason.
    """
    t = Translator(con, standins, source)
    try:
        with time_zone(t.time_zone, t.calendar):
            rel = t.exact(t.plan(root))
        if any(c.name.lower() in t.virtual for c in rel.cols):
            t.error("result", _VIRTUAL)
    except _Failed:
        rel = None
    if t.errors or rel is None:
        listing = "\n".join(f"  - {e}" for e in t.errors) or "  - (no reason recorded)"
        n = len(t.errors)
        raise UnsupportedError(
            f"shoal cannot run this DuckDB query ({n} unsupported part{'s' if n != 1 else ''}):"
            f"\n{listing}"
        )
    return rel.node, rel.cols


# ---------------------------------------------------------------- scans


#: DuckDB's column index of a table's virtual ``rowid`` column (COLUMN_IDENTIFIER_ROW_ID).
_ROW_ID = 2**64 - 1


@_register("LOGICAL_GET")
def _get(t: Translator, op: dict[str, Any]) -> Rel:
    func = str(op.get("qname", {}).get("path", ["?"])[-1])
    if func != "seq_scan":
        t.error(f"LOGICAL_GET({func})", "table function scans are not supported here")
        raise _Failed()
    data = op.get("function_data") or {}
    table = str(data.get("table"))
    names: list[str] = op["names"]
    types: list[dict[str, Any]] = op["returned_types"]
    indexes = [int(c["index"]) for c in op.get("column_indexes", [])]
    where = f"LOGICAL_GET({table})"
    # Virtual columns (rowid) have indexes past the table's columns. A scan that reads
    # none but counts rows (count(*)) still needs a real column to carry the row count.
    read = list(dict.fromkeys(i for i in indexes if i < len(names))) or [0]
    standin = t.standins.get(table.lower()) if data.get("catalog") == "temp" else None
    # DuckDB's rowid of a table's row is read from DuckDB with the row (exact, gaps left
    # by deleted rows included); not of a stand-in (another table than the user's), nor
    # where a real column named rowid hides it.
    rowid = (
        t.fresh("rowid")
        if _ROW_ID in indexes and standin is None and not any(n.lower() == "rowid" for n in names)
        else None
    )
    scanned: list[tuple[str, DataType]] = []
    for i in read:
        try:
            scanned.append((names[i], dtype_of(types[i])))
        except UnsupportedError as exc:
            t.error(where, f"column {names[i]}: {exc}")
    if len(scanned) < len(read):
        raise _Failed()
    if rowid is not None:
        read.append(_ROW_ID)
        scanned.append((rowid, INT64))
    if standin is not None and standin.kind == "parquet":
        from shoal import storage

        # Object storage: the driver's AWS_* credentials travel with the plan.
        source: Any = ParquetSource(standin.paths, storage.env_options(standin.paths[0]))
        schema = Schema.of(_as_in_files(scanned, standin.paths))
    else:
        if standin is not None:
            arrow = t.con.sql(standin.source_sql).to_arrow_table().select([n for n, _ in scanned])
        else:
            qualified = ".".join(
                quote_ident(str(data.get(k))) for k in ("catalog", "schema", "table")
            )
            listed = [n for n, _ in scanned if n != rowid]
            arrow = t.table_arrow(qualified, listed, rowid)
        arrow = _with_enums(arrow, dict(scanned))
        beyond = _out_of_calendar(arrow)
        if beyond:
            t.error(
                where,
                f"column {beyond}: infinite DATE or TIMESTAMP values ('infinity') or values"
                " beyond the years -262000..262000",
            )
            raise _Failed()
        huge = _beyond_precision(arrow)
        if huge:
            t.error(
                where,
                f"column {huge}: HUGEINT values of 39 digits (the kernel's DECIMAL(38) cannot"
                " hold them)",
            )
            raise _Failed()
        midnight = _end_of_day(arrow)
        if midnight:
            t.error(
                where,
                f"column {midnight}: TIME '24:00:00' (the kernel's TIME ends at 23:59:59.999999 "
                "and reads it as NULL)",
            )
            raise _Failed()
        try:
            schema = Schema.from_arrow(arrow.schema)
        except Exception as exc:
            t.error(where, f"column types shoal cannot carry ({exc})")
            raise _Failed() from None
        source = InMemorySource(arrow)
    cols_as_read = [Col(n, dt) for n, dt in schema.fields]
    by_index = dict(zip(read, cols_as_read, strict=True))
    positional: list[Expr | None] = []
    for entry in op.get("column_indexes", []):
        i = int(entry["index"])
        c = by_index.get(i) if i < len(names) or i == _ROW_ID else None
        name = "rowid" if i == _ROW_ID else names[i] if i < len(names) else "?"
        positional.append(None if c is None else _extracted(t, c, entry, name, where))
    pred = _table_filters(t, op, positional, where)
    scan_rel = Rel(Scan(source, schema, pred), tuple(cols_as_read))
    if isinstance(source, ParquetSource):
        unified = _unified_parquet(t, source.paths, schema, where)
        if unified is not None:
            node = unified if pred is None else Filter(unified, pred, schema)
            scan_rel = Rel(node, tuple(cols_as_read))
    proj_ids = [int(i) for i in op.get("projection_ids") or range(len(indexes))]
    out: list[tuple[str, Expr]] = []
    virtual: list[int] = []
    for k, p in enumerate(proj_ids):
        got = positional[p]
        if got is None:
            # A virtual column (rowid, a row number): any use is reported by Translator.expr.
            virtual.append(k)
            out.append(("rowid", Lit(None, INT64)))
            continue
        entry = op["column_indexes"][p]
        if entry.get("child_indexes"):
            hint = str(entry.get("field") or names[indexes[p]])
            out.append((hint, got))  # a struct field: typed by _extracted
            continue
        assert isinstance(got, Col)
        want = INT64 if indexes[p] == _ROW_ID else t.dtype(types[indexes[p]], where)
        out.append((got.name, got if got.dtype == want else cast(got, want)))
    plain = [e for _, e in out] == cols_as_read
    if plain and not any(c.name.lower() in t.names for c in cols_as_read):
        for c in cols_as_read:
            t.claim(c.name)
        return scan_rel
    # The same table read twice, a filter-only column or a virtual column: a projection.
    rel = _fresh_projection(t, scan_rel, out)
    t.virtual.update(rel.cols[k].name.lower() for k in virtual)
    if all(isinstance(e, Lit) for _, e in out):
        # Keep a real column so that the projection keeps the scan's row count.
        keep = cols_as_read[0]
        node = rel.node
        assert isinstance(node, Project)
        exprs = (*node.exprs, NamedExpr(keep.name, keep))
        fields = (*node.schema.fields, (keep.name, keep.dtype))
        rel = Rel(Project(node.input, exprs, Schema(fields)), rel.cols)
    return rel


def _as_in_files(
    scanned: list[tuple[str, DataType]], paths: Sequence[str]
) -> list[tuple[str, DataType]]:
    """The scan's column types as the kernel reads them from the Parquet files: a
    TIMESTAMPTZ column comes with the zone (and unit) the file holds (UTC, or the zone in
    its Arrow schema), not the session's; the scan's projection converts it (the same
    instants)."""
    from shoal import storage

    if not paths or not any(is_tstz(dt) for _, dt in scanned) or storage.is_url(paths[0]):
        return scanned  # (a file in object storage: the zone the footer read gave)
    import polars as pl

    in_file = pl.read_parquet_schema(paths[0])
    out = []
    for name, dtype in scanned:
        got = in_file.get(name)
        if is_tstz(dtype) and isinstance(got, pl.Datetime) and got.time_zone is not None:
            dtype = DataType.from_polars(got)
        out.append((name, dtype))
    return out


def _unified_parquet(
    t: Translator, paths: Sequence[str], schema: Schema, where: str
) -> PlanNode | None:
    """A scan of Parquet files that disagree on the types of the columns read, as DuckDB
    reads them (``read_parquet`` without ``union_by_name``): the first file gives each
    column's type, every other file's values are cast to it. One scan per run of files of
    the same types, each cast to DuckDB's types, and their union, in file order. None
    when the files agree (a plain scan does).

    A file that lacks a column is recorded as unsupported (DuckDB itself then answers or
    raises its own error)."""
    from shoal import storage

    runs: list[tuple[tuple[DataType, ...], list[str]]] = []
    for path in paths:
        try:
            footer = storage.read_footers([path], storage.env_options(path))[0]
            file_schema = footer.schema.to_arrow_schema()
        except Exception:
            return None  # the planner names the unreadable file
        types: list[DataType] = []
        for name, _ in schema.fields:
            k = file_schema.get_field_index(name)
            if k < 0:
                t.error(where, f"column {name!r} is not in Parquet file {path}")
                raise _Failed()
            types.append(DataType(file_schema.field(k).type))
        if runs and runs[-1][0] == tuple(types):
            runs[-1][1].append(path)
        else:
            runs.append((tuple(types), [path]))
    if len(runs) == 1:
        return None
    branches: list[PlanNode] = []
    for types_, group in runs:
        read = Schema.of(list(zip(schema.names, types_, strict=True)))
        scan = Scan(ParquetSource(tuple(group)), read)
        exprs: list[NamedExpr] = []
        for (name, want), have in zip(schema.fields, types_, strict=True):
            try:
                exprs.append(NamedExpr(name, duck_cast(Col(name, have), want)))
            except Unsupported as exc:
                t.error(
                    where, f"column {name!r} ({have} in {group[0]}, {want} in {paths[0]}): {exc}"
                )
                raise _Failed() from None
        branches.append(Project(scan, tuple(exprs), schema))
    return Union(tuple(branches), schema)


def _extracted(t: Translator, col: Col, entry: dict[str, Any], name: str, where: str) -> Expr:
    """The value a scan's ``column_indexes`` entry reads from column ``col``: the column
    itself, or, where DuckDB's optimizer pushed a struct field access into the scan
    (``index_type`` ``PUSHDOWN_EXTRACT``: ``m.src``, ``m['src']``, ``struct_extract``,
    ``unnest(m)``), the field that its ``child_indexes`` chain names (field positions in
    the struct, nested for nested structs)."""
    out: Expr = col
    path = name
    while True:
        kids = entry.get("child_indexes") or []
        if not kids:
            return out
        if entry.get("index_type", "PUSHDOWN_EXTRACT") != "PUSHDOWN_EXTRACT" or len(kids) != 1:
            t.error(where, f"column {path}: a scan of part of a struct is not supported")
            raise _Failed()
        (entry,) = kids
        k = int(entry["index"])
        try:
            field = struct_field(out, k)
        except Unsupported as exc:
            t.error(where, f"column {path}: {exc}")
            raise _Failed() from None
        out, path = field, f"{path}.{dict(field.options)['name']}"


def _fresh_projection(t: Translator, rel: Rel, exprs: list[tuple[str, Expr]]) -> Rel:
    named = [NamedExpr(t.fresh(hint), e) for hint, e in exprs]
    schema = Schema.of([(n.name, n.dtype) for n in named])
    return Rel(Project(rel.node, tuple(named), schema), tuple(Col(n.name, n.dtype) for n in named))


def _table_filters(
    t: Translator, op: dict[str, Any], cols: list[Expr | None], where: str
) -> Expr | None:
    tf = op.get("table_filters") or {}
    by_projection = op.get("table_filters_by_projection", True)
    indexes = [int(c["index"]) for c in op.get("column_indexes", [])]

    def position(key: int) -> int:
        return key if by_projection else (indexes.index(key) if key in indexes else -1)

    parts: list[Expr] = []
    for f in tf.get("multi_column_filters", []):
        # An expression over several scanned columns (BOUND_REF i reads column_indexes[i]).
        kind = str(f.get("filter_type", "")).removeprefix("LEGACY_")
        positions = [position(int(k)) for k in f.get("column_indexes", [])]
        used = [cols[p] if 0 <= p < len(cols) else None for p in positions]
        if kind != "EXPRESSION_FILTER" or any(c is None for c in used):
            t.error(where, f"multi-column table filter {kind} is not supported")
            continue
        # A WHERE condition DuckDB pushed into the scan: reported as the WHERE it was.
        parts.append(t.expr(f["expr"], [c for c in used if c is not None], "LOGICAL_FILTER"))
    for f in tf.get("filters", []):
        key = int(f["key"])
        pos = position(key)
        col = cols[pos] if 0 <= pos < len(cols) else None
        if col is None:
            t.error(where, f"table filter on a virtual or unknown column ({key})")
            continue
        try:
            got = _table_filter(f["value"], col, t.source)
        except Unsupported as exc:
            t.error("LOGICAL_FILTER", exc.explained())
            continue
        if got is not None:
            parts.append(got)
    return and_all(parts) if parts else None


def _table_filter(f: dict[str, Any], col: Expr, source: SourceText | None = None) -> Expr | None:
    """One pushed-down DuckDB table filter on ``col`` (None: nothing to apply); ``source``
    the query text, to quote the user's expression in an error."""
    kind = str(f.get("filter_type", "")).removeprefix("LEGACY_")
    if kind == "STRUCT_EXTRACT":
        # A filter on a field of a struct column (``WHERE m.score > 1`` reading all of m).
        inner = struct_field(col, int(f.get("child_idx", -1)))
        return _table_filter(f["child_filter"], inner, source)
    if kind == "CONSTANT_COMPARISON":
        value = lit(value_of(f["constant"]), dtype_of(f["constant"]["type"]))
        return compare(comparison_op(f["comparison_type"]), col, value)
    if kind == "IS_NULL":
        return is_null(col)
    if kind == "IS_NOT_NULL":
        return is_not_null(col)
    if kind in ("CONJUNCTION_AND", "CONJUNCTION_OR"):
        kids = [_table_filter(c, col, source) for c in f.get("child_filters", [])]
        if kind == "CONJUNCTION_AND":
            return and_all([k for k in kids if k is not None])
        if any(k is None for k in kids):
            return None  # an OR with an optional branch constrains nothing for sure
        return or_all([k for k in kids if k is not None])
    if kind in ("OPTIONAL_FILTER", "DYNAMIC_FILTER"):
        return None  # hints only: the same condition is evaluated elsewhere in the plan
    if kind == "IN_FILTER":
        values = [value_of(v) for v in f.get("values", [])]
        list_type = DataType(pa.large_list(col.dtype.arrow))
        return fn("is_in", [col, lit([v for v in values if v is not None], list_type)], BOOL)
    if kind == "EXPRESSION_FILTER":
        return ExprTranslator([col], source=source).expr(f["expr"])
    raise Unsupported(f"table filter {kind}")


@_register("LOGICAL_EMPTY_RESULT")
def _empty(t: Translator, op: dict[str, Any]) -> Rel:
    types = [t.dtype(x, "LOGICAL_EMPTY_RESULT") for x in op.get("return_types", [])]
    names = [t.fresh("c") for _ in types]
    table = pa.table({n: pa.array([], type=d.arrow) for n, d in zip(names, types, strict=True)})
    if not names:
        table = pa.table({t.fresh("dummy"): pa.array([], type=pa.bool_())})
    schema = Schema.from_arrow(table.schema)
    return Rel(
        Scan(InMemorySource(table), schema),
        tuple(Col(n, d) for n, d in zip(names, types, strict=True)),
    )


@_register("LOGICAL_DUMMY_SCAN")
def _dummy(t: Translator, op: dict[str, Any]) -> Rel:
    """DuckDB's dummy scan (SELECT without FROM): one row, and one column of its own that
    the operators above it count (a window or a mark join over it outputs the dummy column
    first: their own columns are ``#1`` on)."""
    name = t.fresh("dummy")
    table = pa.table({name: pa.array([True])})
    schema = Schema.from_arrow(table.schema)
    return Rel(Scan(InMemorySource(table), schema), (Col(name, schema[name]),))


def _constant_table(
    t: Translator, where: str, types: list[dict[str, Any]], rows: list[list[Any]]
) -> Rel:
    dtypes = [t.dtype(x, where) for x in types]
    names = [t.fresh("col") for _ in dtypes]
    arrays = []
    for j, d in enumerate(dtypes):
        column = [r[j] for r in rows]
        if any(isinstance(v, RawTemporal) for v in column):
            column = [_raw_number(v, d) for v in column]
            raw = pa.array(column, type=pa.int32() if pa.types.is_date32(d.arrow) else pa.int64())
            arrays.append(raw.cast(d.arrow))
            continue
        try:
            arrays.append(pa.array(column, type=d.arrow))
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
            t.error(where, f"values of type {d} cannot be made into a table ({exc})")
            raise _Failed() from None
    table = pa.Table.from_arrays(arrays, names=names)
    return Rel(
        Scan(InMemorySource(table), Schema.from_arrow(table.schema)),
        tuple(Col(n, d) for n, d in zip(names, dtypes, strict=True)),
    )


def _raw_number(v: Any, dtype: DataType) -> int | None:
    """A DATE or TIMESTAMP value as its number since 1970-01-01 in ``dtype``'s unit."""
    if v is None or isinstance(v, RawTemporal):
        return None if v is None else v.value
    one = pa.array([v], type=dtype.arrow)
    number = one.cast(pa.int32() if pa.types.is_date32(dtype.arrow) else pa.int64())
    return int(number[0].as_py())


@_register("LOGICAL_EXPRESSION_GET")
def _expression_get(t: Translator, op: dict[str, Any]) -> Rel:
    kids = op.get("children") or []
    if kids and kids[0].get("type") != "LOGICAL_DUMMY_SCAN":
        return _values_per_row(t, op)
    rows = []
    try:
        for row in op["expressions"]:
            rows.append([python_value(ExprTranslator([], source=t.source).expr(e)) for e in row])
    except Unsupported as exc:
        # Constants the IR cannot carry (STRUCT, MAP, ...): DuckDB evaluates the rows here.
        rel = _values_on_duckdb(t, op)
        if rel is not None:
            return rel
        t.error("LOGICAL_EXPRESSION_GET", exc.explained())
        raise _Failed() from None
    return _constant_table(t, "LOGICAL_EXPRESSION_GET", op["expr_types"], rows)


def _values_per_row(t: Translator, op: dict[str, Any]) -> Rel:
    """A VALUES list over an input (a LATERAL VALUES that reads the columns of the row it
    joins): every row of the list computed over every input row, as DuckDB's expression
    scan does; the output is the list's columns only (its input's are not among its
    bindings)."""
    where = "VALUES"
    child, cols = t.single_child(op)
    types = [t.dtype(x, where) for x in op["expr_types"]]
    rows = [[t.expr(e, cols, where) for e in row] for row in op["expressions"]]
    rel = _done(child)
    for row in rows:
        for e, want in zip(row, types, strict=True):
            if e.dtype != want:
                t.error(where, f"a value of type {e.dtype} in a column of type {want}")
                raise _Failed()
    names = [t.fresh("col") for _ in types]
    schema = Schema.of(list(zip(names, types, strict=True)))
    parts: list[PlanNode] = []
    for row in rows:
        computed = t.project(rel, [("col", e) for e in row])
        renamed = tuple(NamedExpr(n, c) for n, c in zip(names, computed.cols, strict=True))
        parts.append(Project(computed.node, renamed, schema))
    node = parts[0] if len(parts) == 1 else Union(tuple(parts), schema)
    return Rel(node, tuple(Col(n, d) for n, d in zip(names, types, strict=True)))


def _values_on_duckdb(t: Translator, op: dict[str, Any]) -> Rel | None:
    """A VALUES list of constant rows evaluated by DuckDB on the driver
    (:func:`shoal_duckdb.fragment.constant_rows`), or None when it cannot be."""
    kids = op.get("children") or []
    if any(k.get("type") != "LOGICAL_DUMMY_SCAN" for k in kids):
        return None  # a lateral VALUES reads other columns
    try:
        types = [dtype_of(x) for x in op["expr_types"]]
    except UnsupportedError:
        return None
    table = constant_rows(op["expressions"], types, t.session_settings())
    if table is None:
        return None
    names = [t.fresh("col") for _ in types]
    table = table.rename_columns(names)
    return Rel(
        Scan(InMemorySource(table), Schema.from_arrow(table.schema)),
        tuple(Col(n, d) for n, d in zip(names, types, strict=True)),
    )


@_register("LOGICAL_CHUNK_GET")
def _chunk_get(t: Translator, op: dict[str, Any]) -> Rel:
    coll = op.get("collection") or {}
    types = coll.get("types") or op.get("chunk_types", [])
    try:
        # DuckDB serialises the collection column by column (values[j] holds column j).
        columns = [[value_of(v) for v in column] for column in coll.get("values", [])]
        if len(columns) != len(types) or len({len(c) for c in columns}) > 1:
            t.error("LOGICAL_CHUNK_GET", "a constant table of an unexpected shape")
            raise _Failed()
        rows = [list(r) for r in zip(*columns, strict=True)]
    except UnsupportedError as exc:
        t.error("LOGICAL_CHUNK_GET", str(exc))
        raise _Failed() from None
    rel = _constant_table(t, "LOGICAL_CHUNK_GET", types, rows)
    ids = op.get("column_ids")
    if ids and list(ids) != list(range(len(rel.cols))):
        rel = t.select(rel, [int(i) for i in ids])
    return rel


# ---------------------------------------------------------------- row-wise


@_register("LOGICAL_PROJECTION")
def _projection(t: Translator, op: dict[str, Any]) -> Rel:
    child, cols = t.single_child(op)
    if child is not None and not any(_registered_udf(e) for e in op["expressions"]):
        with t.foreign(child) as scope:
            exprs = [
                (str(e.get("alias") or "c"), t.expr(e, cols, "LOGICAL_PROJECTION"))
                for e in op["expressions"]
            ]
        return t.project(t.with_foreign(child, scope), exprs)
    rel = child
    exprs = []
    for e in op["expressions"]:
        hint = str(e.get("alias") or "c")
        udf = _registered_udf(e)
        if udf is None or rel is None:
            exprs.append((hint, t.expr(e, cols, "LOGICAL_PROJECTION")))
            continue
        # A shoal UDF called at the top of a projection expression runs as its own plan
        # node (on an actor pool where it is stateful or wants GPUs); the projection
        # then reads its output column.
        args = [t.expr(a, cols, "LOGICAL_PROJECTION") for a in e.get("children", [])]
        out = t.fresh(hint)
        node = udf_project_for(rel.node, udf, args, out)
        exprs.append((hint, Col(out, node.schema[out])))
        rel = Rel(node, rel.cols)
    return t.project(_done(rel), exprs)


@_register("LOGICAL_UNNEST")
def _unnest(t: Translator, op: dict[str, Any]) -> Rel:
    """``unnest(list)``: one row per element, the input's columns repeated; a NULL or empty
    list gives no row (DuckDB's rule; the IR's ``Explode`` without null rows). Its output is
    the input's columns, then the unnested values."""
    where = "UNNEST"
    child, cols = t.single_child(op)
    exprs = op.get("expressions") or []
    if len(exprs) > 1:
        return _unnest_several(t, op, child, cols)
    e = exprs[0]
    if e.get("expression_class") != "BOUND_UNNEST":
        t.error(where, f"{e.get('expression_class')} is not supported")
        raise _Failed()
    rel = _done(child)
    values = t.expr(e["child"], cols, where)
    if not pa.types.is_large_list(values.dtype.arrow):
        t.error(where, f"unnest() of {values.dtype} (only lists unnest here)")
        raise _Failed()
    element = DataType(values.dtype.arrow.value_type)
    want = t.dtype(e["return_type"], where)
    listed = t.project(rel, [*((c.name, c) for c in rel.cols), ("unnest", values)])
    name = listed.cols[-1].name
    fields = [(n, element if n == name else dt) for n, dt in listed.node.schema.fields]
    node = Explode(listed.node, (name,), Schema.of(fields), empty_as_null=False, keep_nulls=False)
    out = Col(name, element)
    exploded = Rel(node, (*rel.cols, out))
    if element != want:
        return t.project(exploded, [*((c.name, c) for c in rel.cols), ("unnest", cast(out, want))])
    return exploded


def _unnest_several(
    t: Translator, op: dict[str, Any], child: Rel | None, cols: Sequence[Col]
) -> Rel:
    """Several ``unnest(list)`` in one SELECT: per input row as many rows as its longest
    list, the shorter lists padded with NULL (a NULL list counts as empty); none where
    every list is NULL or empty (DuckDB's rule). Output: the input's columns, then the
    unnested values in order."""
    where = "UNNEST"
    values: list[Expr] = []
    wants: list[DataType] = []
    for e in op["expressions"]:
        if e.get("expression_class") != "BOUND_UNNEST":
            t.error(where, f"{e.get('expression_class')} is not supported")
            raise _Failed()
        v = t.expr(e["child"], cols, where)
        if not pa.types.is_large_list(v.dtype.arrow):
            t.error(where, f"unnest() of {v.dtype} (only lists unnest here)")
            raise _Failed()
        values.append(fn("coalesce", [v, lit([], v.dtype)], v.dtype))
        wants.append(t.dtype(e["return_type"], where))
    rel = _done(child)
    lengths = [cast(fn("list.len", [v], IDX), INT64) for v in values]
    longest = fn("max_horizontal", lengths, INT64) if len(lengths) > 1 else lengths[0]
    index_list = DataType(pa.large_list(pa.int64()))
    positions = Function(
        "int_ranges", (lit(0, INT64), longest, lit(1, INT64)), (("dtype", INT64),), index_list
    )
    padded = [fn("list.gather", [v, positions], v.dtype, null_on_oob=True) for v in values]
    kept = t.filter(rel, compare("gt", longest, lit(0, INT64)))
    listed = t.project(kept, [*((c.name, c) for c in kept.cols), *(("unnest", p) for p in padded)])
    names = [c.name for c in listed.cols[len(kept.cols) :]]
    elements = {n: DataType(v.dtype.arrow.value_type) for n, v in zip(names, values, strict=True)}
    fields = [(n, elements.get(n, dt)) for n, dt in listed.node.schema.fields]
    node = Explode(
        listed.node, tuple(names), Schema.of(fields), empty_as_null=False, keep_nulls=False
    )
    outs = [Col(n, elements[n]) for n in names]
    exploded = Rel(node, (*kept.cols, *outs))
    if all(o.dtype == w for o, w in zip(outs, wants, strict=True)):
        return exploded
    return t.project(
        exploded,
        [
            *((c.name, c) for c in kept.cols),
            *(
                ("unnest", o if o.dtype == w else cast(o, w))
                for o, w in zip(outs, wants, strict=True)
            ),
        ],
    )


def _registered_udf(e: dict[str, Any]) -> Any:
    """The shoal UDF that expression ``e`` calls at its top, if any."""
    if e.get("expression_class") != "BOUND_FUNCTION":
        return None
    path = (e.get("qname") or {}).get("path") or []
    return lookup_udf(str(path[-1])) if path else None


@_register("LOGICAL_FILTER")
def _filter(t: Translator, op: dict[str, Any]) -> Rel:
    child, cols = t.single_child(op)
    with t.foreign(child) as scope:
        preds = [t.expr(e, cols, "LOGICAL_FILTER") for e in op["expressions"]]
    rel = t.filter(t.with_foreign(_done(child), scope), and_all(preds))
    return t.select(rel, [int(i) for i in op.get("projection_map") or []])


# ---------------------------------------------------------------- aggregation


@_register("LOGICAL_AGGREGATE_AND_GROUP_BY")
def _aggregate(t: Translator, op: dict[str, Any]) -> Rel:
    maybe, cols = t.single_child(op)
    where = "LOGICAL_AGGREGATE_AND_GROUP_BY"
    with t.foreign(maybe) as scope:
        groups = [t.expr(g, cols, where) for g in op.get("groups", [])]
        aggs = [t.agg(a, cols, where) for a in op.get("expressions", [])]
    child = t.with_foreign(_done(maybe), scope)
    child, aggs = _per_row_constants(t, child, aggs)
    # DuckDB groups by a constant key once per row: over no rows there is no group (it
    # plans count(DISTINCT <constant>) so); in the IR a literal key makes one group even
    # of no rows. So constant keys become columns first.
    child, groups = _constant_columns(t, child, groups)
    sets = [list(map(int, s)) for s in op.get("grouping_sets") or []]
    all_groups = list(range(len(groups)))
    grouping_functions = [list(map(int, g)) for g in op.get("grouping_functions") or []]
    key_names = [t.fresh(str(g.get("alias") or "key")) for g in op.get("groups", [])]
    agg_names = [t.fresh("agg") for _ in aggs]
    gf_names = [t.fresh("grouping") for _ in grouping_functions]
    if not sets or (len(sets) == 1 and sorted(sets[0]) == all_groups):
        if grouping_functions:
            sets = [all_groups]
        else:
            return _group_by(
                t,
                child,
                list(zip(key_names, groups, strict=True)),
                list(zip(agg_names, aggs, strict=True)),
            )
    # GROUPING SETS / ROLLUP / CUBE: one aggregation per set, the other keys NULL.
    branches: list[PlanNode] = []
    out_cols: tuple[Col, ...] = ()
    for s in sets:
        keys = [(key_names[i], groups[i]) for i in s]
        part = _group_by(t, child, keys, list(zip(agg_names, aggs, strict=True)), rename=True)
        by_key = dict(zip([k for k, _ in keys], part.cols[: len(keys)], strict=True))
        exprs: list[NamedExpr] = []
        for i, name in enumerate(key_names):
            got = by_key.get(name)
            exprs.append(NamedExpr(name, got if got is not None else lit(None, groups[i].dtype)))
        for j, name in enumerate(agg_names):
            exprs.append(NamedExpr(name, part.cols[len(keys) + j]))
        for name, members in zip(gf_names, grouping_functions, strict=True):
            value = 0
            for bit, g in enumerate(reversed(members)):
                if g not in s:
                    value |= 1 << bit
            exprs.append(NamedExpr(name, lit(value, DataType(pa.int64()))))
        schema = Schema.of([(e.name, e.dtype) for e in exprs])
        branches.append(Project(part.node, tuple(exprs), schema))
        out_cols = tuple(Col(e.name, e.dtype) for e in exprs)
    return Rel(Union(tuple(branches), branches[0].schema), out_cols)


def _per_row_constants(t: Translator, child: Rel, aggs: list[Expr]) -> tuple[Rel, list[Expr]]:
    """DuckDB aggregates a constant argument once per row (``sum(5)`` over 10 rows is 50,
    ``count(1)`` counts rows); in the IR, as in Polars, a literal is one value. Such
    arguments become columns of a projection below the aggregate, one value per row."""
    extra: list[NamedExpr] = []

    def per_row(e: Expr) -> Expr | None:
        if isinstance(e, Agg) and e.arg is not None and not e.arg.columns():
            name = t.fresh("const")
            extra.append(NamedExpr(name, e.arg))
            return Agg(e.name, Col(name, e.arg.dtype), e.dtype, e.options)
        return None

    rewritten = [replace_expr(a, per_row) for a in aggs]
    if not extra or not child.node.schema.names:
        return child, aggs
    return _with_columns(child, extra), rewritten


def _constant_columns(t: Translator, rel: Rel, args: list[Expr]) -> tuple[Rel, list[Expr]]:
    """``args`` with each constant one (no column read) replaced by a column of ``rel``
    holding its value on every row (see :func:`_per_row_constants`)."""
    extra = [NamedExpr(t.fresh("const"), a) for a in args if not a.columns()]
    if not extra or not rel.node.schema.names:
        return rel, args
    by_arg = iter(extra)
    out = [a if a.columns() else Col((x := next(by_arg)).name, x.dtype) for a in args]
    return _with_columns(rel, extra), out


def _with_columns(rel: Rel, extra: Sequence[NamedExpr]) -> Rel:
    """``rel`` with the ``extra`` columns appended to its node (its ``cols`` unchanged)."""
    keep = tuple(NamedExpr(n, Col(n, dt)) for n, dt in rel.node.schema.fields)
    schema = Schema.of([*rel.node.schema.fields, *((x.name, x.dtype) for x in extra)])
    return Rel(Project(rel.node, (*keep, *extra), schema), rel.cols)


def _group_by(
    t: Translator,
    child: Rel,
    keys: list[tuple[str, Expr]],
    aggs: list[tuple[str, Expr]],
    rename: bool = False,
) -> Rel:
    key_exprs = tuple(NamedExpr(t.fresh(n) if rename else n, e) for n, e in keys)
    agg_exprs = tuple(NamedExpr(t.fresh(n) if rename else n, e) for n, e in aggs)
    if not agg_exprs and key_exprs:
        # GROUP BY without aggregates: the distinct keys.
        proj = Project(child.node, key_exprs, Schema.of([(k.name, k.dtype) for k in key_exprs]))
        node: PlanNode = Distinct(proj, None, "any", False, proj.schema)
    else:
        schema = Schema.of(
            [(k.name, k.dtype) for k in key_exprs] + [(a.name, a.dtype) for a in agg_exprs]
        )
        node = Aggregate(child.node, key_exprs, agg_exprs, False, schema)
    cols = tuple(Col(n.name, n.dtype) for n in (*key_exprs, *agg_exprs))
    return Rel(node, cols)


@_register("LOGICAL_DISTINCT")
def _distinct(t: Translator, op: dict[str, Any]) -> Rel:
    (child,) = t.children(op)
    if op.get("order_by"):
        # DISTINCT ON (keys) ... ORDER BY: of each key's rows, the first in that order.
        by, desc, last = _sort_keys(t, op["order_by"], child.cols, "LOGICAL_DISTINCT")
        targets = [t.expr(e, child.cols, "LOGICAL_DISTINCT") for e in op["distinct_targets"]]
        if not all(isinstance(x, Col) for x in targets):
            t.error("LOGICAL_DISTINCT", "DISTINCT ON an expression is not supported")
            raise _Failed()
        rel = t.exact(child)
        ordered = Sort(rel.node, by, desc, last, True, rel.node.schema)
        on = tuple(x.name for x in targets if isinstance(x, Col))
        return Rel(Distinct(ordered, on, "first", True, rel.node.schema), rel.cols)
    targets = [t.expr(e, child.cols, "LOGICAL_DISTINCT") for e in op.get("distinct_targets", [])]
    rel = t.exact(child)
    names = [c.name for c in rel.cols]
    subset: tuple[str, ...] | None = None
    if op.get("distinct_type") == "DISTINCT_ON" or not (
        all(isinstance(x, Col) for x in targets)
        and sorted(x.name for x in targets if isinstance(x, Col)) == sorted(names)
    ):
        if not all(isinstance(x, Col) for x in targets):
            t.error("LOGICAL_DISTINCT", "DISTINCT ON an expression is not supported")
            raise _Failed()
        subset = tuple(x.name for x in targets if isinstance(x, Col))
    return Rel(Distinct(rel.node, subset, "any", False, rel.node.schema), rel.cols)


# ---------------------------------------------------------------- order and limits


def _sort_keys(
    t: Translator, op: dict[str, Any], cols: Sequence[Col], where: str
) -> tuple[tuple[Expr, ...], tuple[bool, ...], tuple[bool, ...]]:
    by: list[Expr] = []
    desc: list[bool] = []
    last: list[bool] = []
    for o in op.get("orders", []):
        e = t.expr(o["expression"], cols, where)
        d = o.get("type") in ("DESCENDING", "ORDER_DESCENDING")
        null_order = str(o.get("null_order", "NULLS_LAST")).replace(" ", "_")
        if null_order not in ("NULLS_LAST", "NULLS_FIRST", "ORDER_NULLS_LAST", "ORDER_NULLS_FIRST"):
            t.error(where, f"null order {null_order}")
        for key, kd, kl in _struct_sort_keys(e, d, null_order.endswith("NULLS_LAST"), False):
            by.append(key)
            desc.append(kd)
            last.append(kl)
    return tuple(by), tuple(desc), tuple(last)


def _struct_sort_keys(
    e: Expr, desc: bool, nulls_last: bool, nested: bool
) -> list[tuple[Expr, bool, bool]]:
    """Sort keys (key, descending, nulls last) that order by ``e`` as DuckDB does.

    DuckDB orders a STRUCT field by field and a LIST element by element, and a NULL
    inside either (a field, an element, a nested value) sorts above every value: last
    ascending, first descending, whatever NULLS FIRST/LAST says (that applies to the
    top-level value only). Polars orders nested NULLs first; so a struct key becomes one
    key per field (nested structs recursively), after a key that places the NULL structs
    themselves, and a list key the kernel's ``nested_nulls_last`` of it."""
    if pa.types.is_large_list(e.dtype.arrow) or pa.types.is_list(e.dtype.arrow):
        # A list: its elements' NULLs (and theirs) sort last, by the kernel's key.
        key = Function(
            "nested_nulls_last",
            (e,),
            (("dtype", e.dtype),),
            DataType(nested_nulls_last_type(e.dtype.arrow)),
        )
        return [(key, desc, nulls_last if not nested else not desc)]
    if not pa.types.is_struct(e.dtype.arrow):
        return [(e, desc, nulls_last if not nested else not desc)]
    # is_null ascending puts NULL rows last.
    null_key_desc = desc if nested else not nulls_last
    out = [(is_null(e), null_key_desc, False)]
    for i in range(e.dtype.arrow.num_fields):
        out += _struct_sort_keys(struct_field(e, i), desc, True, True)
    return out


@_register("LOGICAL_ORDER_BY")
def _order_by(t: Translator, op: dict[str, Any]) -> Rel:
    maybe, cols = t.single_child(op)
    by, desc, last = _sort_keys(t, op, cols, "LOGICAL_ORDER_BY")
    child = _done(maybe)
    rel = Rel(Sort(child.node, by, desc, last, False, child.node.schema), child.cols)
    return t.select(rel, [int(i) for i in op.get("projections") or []])


@_register("LOGICAL_TOP_N")
def _top_n(t: Translator, op: dict[str, Any]) -> Rel:
    maybe, cols = t.single_child(op)
    by, desc, last = _sort_keys(t, op, cols, "LOGICAL_TOP_N")
    child = _done(maybe)
    sort = Sort(child.node, by, desc, last, False, child.node.schema)
    limit, offset = int(op["limit"]), int(op.get("offset") or 0)
    return Rel(Slice(sort, offset, limit, child.node.schema), child.cols)


def _limit_value(t: Translator, v: dict[str, Any] | None, what: str) -> int | None:
    if v is None:
        return None
    kind = v.get("type")
    if kind == "UNSET":
        return None
    if kind == "CONSTANT_VALUE":
        return int(v["constant_integer"])
    t.error("LOGICAL_LIMIT", f"{what} that is not a constant ({kind})")
    raise _Failed()


def _is_expression_bound(v: dict[str, Any] | None) -> bool:
    return v is not None and v.get("type") == "EXPRESSION_VALUE"


def _limit_by_row_numbers(t: Translator, child: Rel, op: dict[str, Any]) -> Rel:
    """LIMIT / OFFSET given by expressions (``LIMIT (SELECT k FROM ...)``; DuckDB joins the
    value to every row): the rows numbered in order, then kept where ``offset <= n <
    offset + limit``. A NULL limit or offset is no limit or offset; a negative one fails the
    query, as in DuckDB; a DECIMAL or DOUBLE is rounded half to even (DuckDB 2.0.1: ``LIMIT
    (SELECT 2.5)`` is 2 rows, ``LIMIT (SELECT 2.7)`` 3)."""
    where = "LOGICAL_LIMIT"
    numbered, row = _numbered(t, t.exact(child), "row")
    n = cast(row, INT64)

    def bound(v: dict[str, Any] | None, what: str) -> Expr | None:
        if v is None or v.get("type") == "UNSET":
            return None
        if v.get("type") == "CONSTANT_VALUE":
            return lit(int(v["constant_integer"]), INT64)
        if v.get("type") == "EXPRESSION_VALUE":
            value = t.expr(v["expression"], child.cols, where)
            if value.dtype.is_decimal:  # DuckDB reads it as a DOUBLE: 2.5 rounds to 2
                value = cast(value, FLOAT64)
            if value.dtype.is_string:
                # DuckDB reads text as a UINT64 and raises InvalidInputException.
                parsed = duck_cast(value, INT64, try_cast=True)
                failed = and_all([is_null(parsed), is_not_null(value)])
                parts: list[Expr | str] = [
                    "Invalid Input Error: Could not convert string '",
                    value,
                    "' to UINT64",
                ]
                return Ternary(failed, fail_where(failed, parts, INT64), parsed, INT64)
            return duck_cast(value, INT64)
        t.error(where, f"{what} of kind {v.get('type')} (percentages) is not supported")
        raise _Failed()

    limit_val = op.get("limit_val") or {}
    percent = None
    if limit_val.get("type") == "CONSTANT_PERCENTAGE":
        percent = float(limit_val["constant_percentage"])
        limit = None
    else:
        limit = bound(op.get("limit_val"), "a LIMIT")
    offset = bound(op.get("offset_val"), "an OFFSET")
    zero = lit(0, INT64)
    start = fn("coalesce", [offset, zero], INT64) if offset is not None else zero
    keep: list[Expr] = [compare("ge", n, start)]
    if percent is not None:
        # LIMIT p %: after the offset, floor(p / 100 * rows) rows, ``rows`` counting the
        # skipped ones too (DuckDB's arithmetic, in DOUBLE).
        numbered = t.project(
            numbered,
            [
                *((c.name, c) for c in numbered.cols),
                ("rows", cast(Agg("len", None, IDX), INT64)),
            ],
        )
        rows = numbered.cols[-1]
        share = binop("mul", lit(percent / 100, FLOAT64), cast(rows, FLOAT64), FLOAT64)
        count = cast(fn("floor", [share], FLOAT64), INT64)
        keep.append(compare("lt", binop("sub", n, start, INT64), count))
    if limit is not None:
        end = binop("add", start, limit, INT64)
        keep.append(or_all([is_null(limit), compare("lt", n, end)]))
    for value, what in ((limit, "LIMIT"), (offset, "OFFSET")):
        if value is not None and not isinstance(value, Lit):
            negative = compare("lt", value, zero)
            message = lit(f"Invalid Input Error: {what} must not be negative", STRING)
            keep.append(is_null(raise_where(negative, message, BOOL)))
    kept = t.filter(numbered, and_all(keep))
    return Rel(kept.node, child.cols)


@_register("LOGICAL_LIMIT")
def _limit(t: Translator, op: dict[str, Any]) -> Rel:
    (child,) = t.children(op)
    percent = (op.get("limit_val") or {}).get("type") == "CONSTANT_PERCENTAGE"
    if (
        percent
        or _is_expression_bound(op.get("limit_val"))
        or _is_expression_bound(op.get("offset_val"))
    ):
        return _limit_by_row_numbers(t, child, op)
    limit = _limit_value(t, op.get("limit_val"), "a LIMIT")
    offset = _limit_value(t, op.get("offset_val"), "an OFFSET") or 0
    if limit is None and offset == 0:
        return child
    return Rel(Slice(child.node, offset, limit, child.node.schema), child.cols)


# ---------------------------------------------------------------- windows

_RANKING = frozenset({"WINDOW_ROW_NUMBER", "WINDOW_RANK", "WINDOW_RANK_DENSE"})
_SHIFTS = frozenset({"WINDOW_LAG", "WINDOW_LEAD"})
_RUNNING = {"sum", "sum_no_overflow", "count", "count_star", "min", "max", "avg", "mean"}


def _over(e: Expr, keys: Sequence[Expr], dtype: DataType) -> Expr:
    """``e`` evaluated per group of ``keys`` and mapped back to the rows (the whole input
    when there are no keys)."""
    if not keys:
        return e
    options = {
        "partitions": len(keys),
        "ordered": False,
        "descending": False,
        "nulls_last": False,
        "mapping_strategy": "group_to_rows",
    }
    return fn("over", [e, *keys], dtype, **options)


@_register("LOGICAL_WINDOW")
def _window(t: Translator, op: dict[str, Any]) -> Rel:
    """Window functions: ``row_number``, ``rank``, ``dense_rank``, ``lag``/``lead`` with a
    constant offset, aggregates over whole partitions, and running ``sum``/``count``/
    ``min``/``max``/``avg`` (frames from UNBOUNDED PRECEDING to the current row, ROWS or
    RANGE). The input is sorted by the window's PARTITION BY and ORDER BY keys, then the
    values are computed in that order, in one task (order-dependent functions run after a
    gather)."""
    maybe, cols = t.single_child(op)
    where = "LOGICAL_WINDOW"
    plans: list[
        tuple[dict[str, Any], list[Expr], list[Expr], tuple[bool, ...], tuple[bool, ...]]
    ] = []
    for w in op["expressions"]:
        if w.get("expression_class") != "BOUND_WINDOW":
            t.error(where, f"expression {w.get('expression_class')}")
            continue
        parts = [t.expr(p, cols, where) for p in w.get("partitions", [])]
        order, desc, last = _sort_keys(t, w, cols, where)
        plans.append((w, parts, list(order), desc, last))
        reason = _window_problem(w)
        if reason is None and _input_order_dependent(w) and _unordered(op["children"][0]):
            reason = (
                "without ORDER BY it depends on the order of the rows a join produced "
                "(DuckDB's own order)"
            )
        if reason:
            t.error(window_words(w), reason)
    rel = _done(maybe)
    if t.errors:
        raise _Failed()
    rel = t.exact(rel)
    base = rel.cols
    outputs: dict[int, Col] = {}
    source: Col | None = None
    if any(_framed(p[0]) for p in plans):
        # Framed windows reorder the rows: they sort by the input order last, numbered here.
        rel = t.project(
            rel,
            [*((c.name, c) for c in rel.cols), ("input_row", fn("int_range", [], INT64, start=0))],
        )
        source = rel.cols[-1]
    # Framed windows join their values back (their output is in no particular row order):
    # they come after the windows that read the input order.
    steps = sorted(range(len(plans)), key=lambda i: _framed(plans[i][0]))
    for i in steps:
        w, parts, keys, desc, last = plans[i]
        if _framed(w):
            assert source is not None
            rel, col = _framed_window(
                t, rel, w, parts, [*keys, source], (*desc, False), (*last, False), where
            )
        else:
            rel, col = _one_window(t, rel, w, parts, keys, desc, last, base, where)
        outputs[i] = col
    return t.project(rel, [(c.name, c) for c in (*base, *(outputs[i] for i in range(len(plans))))])


#: Operators whose output order is DuckDB's join order.
_UNORDERED_OPERATORS = frozenset(
    {"LOGICAL_COMPARISON_JOIN", "LOGICAL_ANY_JOIN", "LOGICAL_CROSS_PRODUCT", "LOGICAL_DELIM_JOIN"}
)

#: Operators below which the order does not matter: they make an order of their own
#: (DuckDB numbers the groups of a decorrelated subquery with ``row_number() OVER ()``
#: over an aggregation, as join keys, where any numbering gives the same answer).
_REORDERING_OPERATORS = frozenset(
    {"LOGICAL_ORDER_BY", "LOGICAL_TOP_N", "LOGICAL_AGGREGATE_AND_GROUP_BY", "LOGICAL_DISTINCT"}
)

#: Aggregates whose value depends on the order of their input rows.
_ORDER_SENSITIVE_AGGREGATES = frozenset(
    {"first", "last", "arbitrary", "list", "array_agg", "string_agg", "group_concat", "listagg"}
)


def _input_order_dependent(w: dict[str, Any]) -> bool:
    """Whether window ``w`` has neither PARTITION BY nor ORDER BY but its value depends on
    the order of the rows. (With PARTITION BY it is left alone: DuckDB decorrelates a
    subquery's LIMIT into ``row_number() OVER (PARTITION BY <correlated columns>)``, where
    every order of a partition's rows gives the same answer.)"""
    if w.get("orders") or w.get("partitions"):
        return False
    kind = w["type"]
    if kind in ("WINDOW_ROW_NUMBER", "WINDOW_NTILE") or kind in _SHIFTS:
        return True
    if kind in _VALUE_FUNCTIONS:
        return not w.get("arg_orders")
    if kind != "WINDOW_AGGREGATE":
        return False
    if _frame(w) != "whole":
        return True
    name = str(w["qname"]["path"][-1]).lower()
    return name in _ORDER_SENSITIVE_AGGREGATES and not w.get("arg_orders")


def _unordered(op: dict[str, Any]) -> bool:
    """Whether the rows of ``op`` come in DuckDB's join order (a join below, without an
    ORDER BY or aggregation between)."""
    kind = str(op.get("type"))
    if kind in _UNORDERED_OPERATORS:
        return True
    if kind in _REORDERING_OPERATORS:
        return False
    return any(_unordered(c) for c in op.get("children", []))


def _window_problem(w: dict[str, Any]) -> str | None:
    kind = w["type"]
    frameless = kind in _RANKING | _PARTITION_RANKS | _SHIFTS and not w.get("arg_orders")
    if w.get("exclude_clause", "NO_OTHER") != "NO_OTHER" and not frameless:
        # (ranks, ntile and lag/lead without ORDER BY in their arguments ignore the frame,
        # its EXCLUDE clause included)
        return "EXCLUDE is not supported"
    if _framed(w):
        return _framed_problem(w)
    whole = kind == "WINDOW_AGGREGATE" and _frame(w) == "whole" and not w.get("orders")
    for key, words in (
        ("filters", "FILTER (WHERE ...)"),
        ("ignore_nulls", "IGNORE NULLS"),
        ("distinct", "DISTINCT arguments"),
        ("arg_orders", "ORDER BY inside the function's arguments"),
    ):
        if key in ("filters", "distinct") and whole:
            continue  # the partition-wide aggregate takes them
        if w.get(key):
            return f"{words} is not supported in a window function"
    if kind in _PARTITION_RANKS:
        return _partition_rank_problem(w)
    if kind in _RANKING:
        return None  # without ORDER BY every row is a peer: rank 1
    if kind in _SHIFTS:
        kids = w.get("children", [])
        if len(kids) > 1 and kids[1].get("expression_class") != "BOUND_CONSTANT":
            return "a lag/lead offset that is not a constant"
        return None
    if kind != "WINDOW_AGGREGATE":
        return "this window function is not supported"
    name = str(w["qname"]["path"][-1]).lower()
    frame = _frame(w)
    if frame is None:
        return f"frame {frame_words(w)} is not supported"
    if frame == "running" and name not in _RUNNING:
        return f"running {name}() is not supported"
    if frame == "range":
        return None if name in _RUNNING else f"{name}() over a RANGE frame is not supported"
    if frame == "whole" and w.get("orders") and name not in _RUNNING:
        return f"{name}() over an ordered frame is not supported"
    return None


#: Ranks computed from the whole partition (DuckDB ignores the frame of these without an
#: ORDER BY inside the arguments).
_PARTITION_RANKS = frozenset({"WINDOW_PERCENT_RANK", "WINDOW_CUME_DIST", "WINDOW_NTILE"})

#: Value functions of a frame: its first, last, n-th row.
_VALUE_FUNCTIONS = frozenset({"WINDOW_FIRST_VALUE", "WINDOW_LAST_VALUE", "WINDOW_NTH_VALUE"})

#: Aggregates that ``IGNORE NULLS`` changes, as the value function they become.
_IGNORING_NULLS = {"first": "WINDOW_FIRST_VALUE", "last": "WINDOW_LAST_VALUE"}

#: A frame end this many rows away is beyond every partition (UNBOUNDED).
_UNBOUNDED_ROWS = 1 << 40


def _partition_rank_problem(w: dict[str, Any]) -> str | None:
    if w["type"] != "WINDOW_NTILE":
        return None
    n = _constant_int((w.get("children") or [None])[0])
    if n is None or n < 1:
        return "ntile() of a number that is not a positive constant"
    return None


def _framed(w: dict[str, Any]) -> bool:
    """Whether window ``w`` is computed per row over its frame (:func:`_framed_window`):
    ``first_value``/``last_value``/``nth_value``, and aggregates the partition-wide and
    running forms do not cover (bounded ROWS frames, DISTINCT, FILTER, ORDER BY inside the
    arguments, IGNORE NULLS, aggregates other than sum/count/min/max/avg over a running
    or ordered frame)."""
    kind = w["type"]
    if kind in _VALUE_FUNCTIONS:
        return True
    if kind != "WINDOW_AGGREGATE":
        return False
    name = str(w["qname"]["path"][-1]).lower()
    frame = _frame(w)
    if w.get("ignore_nulls") or w.get("arg_orders"):
        return True
    if (w.get("filters") or w.get("distinct")) and not (frame == "whole" and not w.get("orders")):
        return True
    if frame is None:
        return True
    if frame == "running":
        return name not in _RUNNING
    if frame == "whole":
        return bool(w.get("orders")) and name not in _RUNNING
    return False


def _constant_int(e: dict[str, Any] | None) -> int | None:
    """The value of a constant integer expression (None: not one, or NULL)."""
    if not e:
        return None
    try:
        x = ExprTranslator([]).expr(e)
    except Unsupported:
        return None
    while isinstance(x, Cast) and x.dtype.is_integer:
        x = x.expr
    if isinstance(x, Lit) and isinstance(x.value, int) and not isinstance(x.value, bool):
        return x.value
    return None


def _frame_bound(w: dict[str, Any], which: str) -> int | str | None:
    """A frame end as rows from the current one (negative: preceding), ``"peers"`` for a
    RANGE/GROUPS CURRENT ROW with ORDER BY (the current row's peers), None when neither."""
    kind = str(w.get(which))
    before = -_UNBOUNDED_ROWS if which == "start" else _UNBOUNDED_ROWS
    if kind == "UNBOUNDED_PRECEDING":
        return -_UNBOUNDED_ROWS
    if kind == "UNBOUNDED_FOLLOWING":
        return _UNBOUNDED_ROWS
    if kind == "CURRENT_ROW_ROWS":
        return 0
    if kind in ("CURRENT_ROW_RANGE", "CURRENT_ROW_GROUPS"):
        # Without ORDER BY every row of the partition is a peer.
        return "peers" if w.get("orders") else before
    if kind in ("EXPR_PRECEDING_ROWS", "EXPR_FOLLOWING_ROWS"):
        n = _constant_int(w.get(f"{which}_expr"))
        if n is None or n < 0:
            return None
        n = min(n, _UNBOUNDED_ROWS)
        return -n if kind == "EXPR_PRECEDING_ROWS" else n
    return None


def _rows_frame(w: dict[str, Any]) -> tuple[int, int, str | None] | None:
    """``(a, b, peer)``: the frame of a row is the rows ``a`` to ``b`` away from it in its
    partition (clipped to the partition; empty when ``b < a``); ``peer`` ``"last"``
    (``"first"``) when every row takes the frame of the last (first) of its peers
    (``RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW`` and the reverse). None: another
    frame."""
    start, end = _frame_bound(w, "start"), _frame_bound(w, "end")
    if start is None or end is None or (start == "peers" and end == "peers"):
        return None
    if end == "peers":
        assert isinstance(start, int)
        return start, 0, "last"
    if start == "peers":
        assert isinstance(end, int)
        return 0, end, "first"
    assert isinstance(start, int) and isinstance(end, int)
    return start, end, None


def _framed_problem(w: dict[str, Any]) -> str | None:
    if _rows_frame(w) is None:
        return f"frame {frame_words(w)} is not supported"
    kind = w["type"]
    if kind == "WINDOW_AGGREGATE" and w.get("ignore_nulls"):
        name = str(w["qname"]["path"][-1]).lower()
        if name not in _IGNORING_NULLS:
            return f"IGNORE NULLS in {name}() is not supported"
    if kind == "WINDOW_NTH_VALUE":
        kids = w.get("children") or []
        n = _constant_int(kids[1]) if len(kids) > 1 else None
        if n is None or n < 1:
            return "nth_value() of a position that is not a positive constant"
    if kind in _VALUE_FUNCTIONS and w.get("filters"):
        return "FILTER (WHERE ...) is not supported in a window function"
    return None


def _frame(w: dict[str, Any]) -> str | None:
    """What a window aggregate's frame covers: ``"whole"`` (the whole partition),
    ``"running"`` (from the partition's first row to the current row, or to its last
    peer for RANGE, in ORDER BY order, or in input order without ORDER BY), or None
    (another frame), or ``"range"`` (``RANGE BETWEEN <offset> PRECEDING AND CURRENT ROW``
    that :func:`_range_frame_problem` accepts)."""
    start, end = w.get("start"), w.get("end")
    if start == "EXPR_PRECEDING_RANGE" and end == "CURRENT_ROW_RANGE":
        return "range" if _range_frame_problem(w) is None else None
    if start != "UNBOUNDED_PRECEDING":
        return None
    if end == "UNBOUNDED_FOLLOWING":
        return "whole"
    if end in ("CURRENT_ROW_RANGE", "CURRENT_ROW_GROUPS"):
        # Without ORDER BY every row is a peer of every other: the whole partition.
        return "running" if w.get("orders") else "whole"
    if end == "CURRENT_ROW_ROWS":
        return "running"
    return None


def _range_frame_problem(w: dict[str, Any]) -> str | None:
    """Why ``RANGE BETWEEN <offset> PRECEDING AND CURRENT ROW`` cannot run (None: it can:
    one ascending ORDER BY key of a date, timestamp or integer type and a constant offset)."""
    orders = w.get("orders") or []
    if len(orders) != 1 or orders[0].get("type") not in ("ASCENDING", "ORDER_ASCENDING"):
        return "a RANGE frame over several or descending ORDER BY keys"
    key_type = str(orders[0]["expression"]["return_type"]["id"])
    if key_type not in ("DATE", "TIMESTAMP", "TINYINT", "SMALLINT", "INTEGER", "BIGINT"):
        return f"a RANGE frame ordered by {key_type}"
    if _range_offset(w) is None:
        return "a RANGE frame offset that is not a constant"
    return None


def _range_offset(w: dict[str, Any]) -> str | None:
    """The kernel's window size of a RANGE frame's ``<offset> PRECEDING`` (DuckDB binds it
    as ``key - offset``): "3h"-like for an INTERVAL, "5i" for an integer offset."""
    start = w.get("start_expr") or {}
    kids = start.get("children") or []
    if start.get("expression_class") != "BOUND_FUNCTION" or len(kids) != 2:
        return None
    if str(start["qname"]["path"][-1]) not in ("-", "subtract"):
        return None
    constant = kids[1]
    if constant.get("expression_class") != "BOUND_CONSTANT":
        return None
    try:
        value = value_of(constant["value"])
    except UnsupportedError:
        return None
    if isinstance(value, Interval):
        parts = [(value.months, "mo"), (value.days, "d"), (value.micros, "us")]
        if any(n < 0 for n, _ in parts) or not any(n for n, _ in parts):
            return None
        return "".join(f"{n}{unit}" for n, unit in parts if n)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return f"{value}i"
    return None


def _one_window(
    t: Translator,
    rel: Rel,
    w: dict[str, Any],
    parts: list[Expr],
    keys: list[Expr],
    desc: tuple[bool, ...],
    last: tuple[bool, ...],
    base: tuple[Col, ...],
    where: str,
) -> tuple[Rel, Col]:
    kind = w["type"]
    dtype = t.dtype(w["return_type"], where)
    running = kind == "WINDOW_AGGREGATE" and _frame(w) == "running"
    ranked = kind in _RANKING or kind in _PARTITION_RANKS
    if (keys or ranked or kind in _SHIFTS or running) and (parts or keys):
        # (A stable sort: without ORDER BY, rows keep their input order in a partition.)
        by = (*parts, *keys)
        n = len(parts)
        sort = Sort(rel.node, by, (False,) * n + desc, (False,) * n + last, True, rel.node.schema)
        rel = Rel(sort, rel.cols)
    cols = rel.cols

    def add(rel: Rel, hint: str, e: Expr) -> tuple[Rel, Col]:
        out = t.project(rel, [*((c.name, c) for c in rel.cols), (hint, e)])
        return out, out.cols[-1]

    row_number = _over(fn("int_range", [], INT64, start=1), parts, INT64)
    if kind == "WINDOW_ROW_NUMBER":
        return add(rel, "row_number", cast(row_number, dtype))
    if kind in ("WINDOW_RANK", "WINDOW_RANK_DENSE"):
        rel, rn = add(rel, "row_number", row_number)
        # The rank of a row is the row number of the first row of its peer group.
        peers = [*parts, *keys]
        rel, rank = add(rel, "rank", _over(Agg("min", rn, INT64), peers, INT64))
        if kind == "WINDOW_RANK":
            return rel, rank
        first = cast(compare("eq", rn, rank), INT64)
        return add(
            rel, "dense_rank", cast(_over(fn("cum_sum", [first], INT64), parts, INT64), dtype)
        )
    if kind in _PARTITION_RANKS:
        return _partition_rank(t, rel, w, parts, keys, row_number, dtype)
    if kind in _SHIFTS:
        kids = w.get("children", [])
        rel, (x,) = _constant_columns(t, rel, [t.expr(kids[0], cols, where)])
        offset = 1
        if len(kids) > 1:
            value = ExprTranslator([]).expr(kids[1])
            offset = int(value.value) if isinstance(value, Lit) else 1
        default = t.expr(kids[2], cols, where) if len(kids) > 2 else lit(None, dtype)
        step = offset if kind == "WINDOW_LAG" else -offset
        shifted = fn("shift", [cast(x, dtype), lit(step, INT64), cast(default, dtype)], dtype)
        return add(rel, "lag" if kind == "WINDOW_LAG" else "lead", _over(shifted, parts, dtype))
    # Aggregates. A constant argument counts once per row in DuckDB (count(1), sum(2));
    # in the kernel a literal is one value, so constants become columns first.
    if kind == "WINDOW_AGGREGATE" and _frame(w) == "range":
        name = str(w["qname"]["path"][-1]).lower()
        args = [t.expr(c, cols, where) for c in w.get("children", [])]
        rel, args = _constant_columns(t, rel, args)
        size = _range_offset(w)
        assert size is not None  # _frame checked
        try:
            value = _range_window(name, args, parts, keys[0], size, dtype)
        except Unsupported as exc:
            t.error(where, str(exc))
            raise _Failed() from None
        return add(rel, "range_agg", value)
    if not running:
        rel, (value,) = _per_row_constants(t, rel, [t.agg(_as_aggregate(w), cols, where)])
        return add(rel, "window_agg", _over(value, parts, dtype))
    name = str(w["qname"]["path"][-1]).lower()
    args = [t.expr(c, cols, where) for c in w.get("children", [])]
    rel, args = _constant_columns(t, rel, args)
    running = _running(name, args, parts, row_number, dtype)
    rel, value = add(rel, "running", running)
    if w.get("end") == "CURRENT_ROW_RANGE":
        # RANGE frames include the current row's peers: every peer gets the value at the
        # last row of its peer group.
        rel, value = add(rel, "running", _over(Agg("last", value, dtype), [*parts, *keys], dtype))
    return rel, value


def _partition_rank(
    t: Translator,
    rel: Rel,
    w: dict[str, Any],
    parts: list[Expr],
    keys: list[Expr],
    row_number: Expr,
    dtype: DataType,
) -> tuple[Rel, Col]:
    """``percent_rank()``: ``(rank - 1) / (rows - 1)`` (0 for a partition of one row);
    ``cume_dist()``: the row number of the current row's last peer over the partition's
    rows; ``ntile(k)``: the partition's rows cut into ``min(k, rows)`` buckets in order,
    the first ``rows mod buckets`` of them one row larger (DuckDB's rule). Over the
    sorted input (see :func:`_one_window`)."""

    def add(rel: Rel, hint: str, e: Expr) -> tuple[Rel, Col]:
        out = t.project(rel, [*((c.name, c) for c in rel.cols), (hint, e)])
        return out, out.cols[-1]

    def i64(op: str, x: Expr, y: Expr) -> Expr:
        return binop(op, x, y, INT64)

    kind = w["type"]
    rel, rn = add(rel, "row_number", row_number)
    rel, rows = add(rel, "partition_rows", _over(cast(Agg("len", None, IDX), INT64), parts, INT64))
    one = lit(1, INT64)
    if kind == "WINDOW_PERCENT_RANK":
        rel, rank = add(rel, "rank", _over(Agg("min", rn, INT64), [*parts, *keys], INT64))
        ratio = binop(
            "truediv",
            cast(i64("sub", rank, one), FLOAT64),
            cast(i64("sub", rows, one), FLOAT64),
            FLOAT64,
        )
        single = compare("le", rows, one)
        return add(
            rel, "percent_rank", cast(Ternary(single, lit(0.0, FLOAT64), ratio, FLOAT64), dtype)
        )
    if kind == "WINDOW_CUME_DIST":
        rel, upto = add(rel, "peers_end", _over(Agg("max", rn, INT64), [*parts, *keys], INT64))
        ratio = binop("truediv", cast(upto, FLOAT64), cast(rows, FLOAT64), FLOAT64)
        return add(rel, "cume_dist", cast(ratio, dtype))
    k = _constant_int(w["children"][0])
    assert k is not None and k >= 1  # _partition_rank_problem checked
    buckets = fn("min_horizontal", [lit(k, INT64), rows], INT64)
    size = i64("floordiv", rows, buckets)
    large = i64("sub", rows, i64("mul", buckets, size))
    small = i64("mul", large, i64("add", size, one))
    index = i64("sub", rn, one)
    in_large = i64("add", one, i64("floordiv", index, i64("add", size, one)))
    in_small = i64("add", i64("add", one, large), i64("floordiv", i64("sub", index, small), size))
    out = Ternary(compare("lt", index, small), in_large, in_small, INT64)
    return add(rel, "ntile", cast(out, dtype))


def _as_aggregate(w: dict[str, Any]) -> dict[str, Any]:
    """A window aggregate as the ``BOUND_AGGREGATE`` JSON that :func:`aggregate` reads
    (DISTINCT, FILTER and ORDER BY inside the arguments under their names there)."""
    return dict(
        w,
        aggregate_type="DISTINCT" if w.get("distinct") else "NON_DISTINCT",
        filter=w.get("filters"),
        order_bys={"orders": w["arg_orders"]} if w.get("arg_orders") else None,
    )


def _framed_window(
    t: Translator,
    rel: Rel,
    w: dict[str, Any],
    parts: list[Expr],
    keys: list[Expr],
    desc: tuple[bool, ...],
    last: tuple[bool, ...],
    where: str,
) -> tuple[Rel, Col]:
    """A window function computed over each row's frame (see :func:`_rows_frame`): the
    input sorted by the window's keys (stably: without ORDER BY rows keep their input
    order) and numbered; a rolling aggregation over that number, per partition, gives
    each row the aggregate of the rows of its frame (any aggregate the GROUP BY
    translation supports, so empty frames follow DuckDB's rules for no rows); the values
    are joined back to the rows by number (a row of a RANGE frame takes that of its last,
    or first, peer)."""
    frame = _rows_frame(w)
    assert frame is not None  # _framed_problem checked
    a, b, peer = frame
    kind = str(w["type"])
    dtype = t.dtype(w["return_type"], where)
    n = len(parts)
    sort = Sort(
        rel.node, (*parts, *keys), (False,) * n + desc, (False,) * n + last, True, rel.node.schema
    )
    rel = Rel(sort, rel.cols)

    def add(rel: Rel, hint: str, e: Expr) -> tuple[Rel, Col]:
        out = t.project(rel, [*((c.name, c) for c in rel.cols), (hint, e)])
        return out, out.cols[-1]

    rel, row = add(rel, "frame_row", fn("int_range", [], INT64, start=0))
    group: list[NamedExpr] = []
    if parts:
        rel, pid = add(rel, "frame_partition", _over(Agg("min", row, INT64), parts, INT64))
        group.append(NamedExpr(pid.name, pid))
    target = row
    if peer is not None:
        extreme = Agg("max" if peer == "last" else "min", row, INT64)
        # (the last key is the input order, which no peers share)
        rel, target = add(rel, "frame_peer", _over(extreme, [*parts, *keys[:-1]], INT64))
    cols = rel.cols
    if kind == "WINDOW_AGGREGATE" and w.get("ignore_nulls"):
        kind = _IGNORING_NULLS[str(w["qname"]["path"][-1]).lower()]
    if kind in _VALUE_FUNCTIONS:
        kids = w.get("children") or []
        rel, (x,) = _constant_columns(t, rel, [t.expr(kids[0], cols, where)])
        ex = t._exprs(cols)
        try:
            order = [agg_order_key(ex, o) for o in w.get("arg_orders") or []]
        except Unsupported as exc:
            t.error(where, exc.explained())
            raise _Failed() from None
        values = ordered_values(x, order, None, x.dtype)
        if w.get("ignore_nulls"):
            values = fn("drop_nulls", [values], x.dtype)
        if kind == "WINDOW_NTH_VALUE":
            position = _constant_int(kids[1])
            assert position is not None
            values = fn("slice", [values, lit(position - 1, INT64), lit(1, INT64)], x.dtype)
        which = "last" if kind == "WINDOW_LAST_VALUE" else "first"
        value: Expr = cast(Agg(which, values, x.dtype), dtype)
    else:
        rel, (value,) = _per_row_constants(t, rel, [t.agg(_as_aggregate(w), cols, where)])
        if t.errors:
            raise _Failed()
    if b < a:
        offset, period = f"{_UNBOUNDED_ROWS}i", "1i"  # no row: every frame is empty
    else:
        offset, period = f"{a - 1}i", f"{b - a + 1}i"
    name = t.fresh("framed")
    rolling_schema = Schema.of(
        [*((g.name, g.dtype) for g in group), (row.name, INT64), (name, value.dtype)]
    )
    rolling = RollingGroupBy(
        rel.node,
        row.name,
        period,
        offset,
        "right",  # (t + a - 1, t + b]: the rows t + a .. t + b
        tuple(group),
        (NamedExpr(name, value),),
        rolling_schema,
    )
    at = t.fresh("frame_of")
    right_schema = Schema.of([(at, INT64), (name, value.dtype)])
    right = Project(
        rolling,
        (NamedExpr(at, Col(row.name, INT64)), NamedExpr(name, Col(name, value.dtype))),
        right_schema,
    )
    left = t.exact(rel)
    schema = Schema(left.node.schema.fields + right_schema.fields)
    joined = Join(
        left.node, right, (target,), (Col(at, INT64),), "left", "_r", False, False, schema
    )
    out = Rel(joined, left.cols)
    return add(out, "framed", cast(Col(name, value.dtype), dtype))


def _range_window(
    name: str, args: list[Expr], parts: list[Expr], key: Expr, size: str, dtype: DataType
) -> Expr:
    """An aggregate over ``RANGE BETWEEN <size> PRECEDING AND CURRENT ROW``: the rows of the
    partition whose key lies in ``[key - size, key]`` (peers included); NULL when none of
    their values is non-NULL (``count``: 0). Rows with a NULL key are each other's peers
    (their frame is those rows).

    Only exact computations: counts of anything, and ``sum``/``avg``/``min``/``max`` of
    integers (the kernel's sliding sums add and subtract, which rounds floating-point
    values differently from DuckDB and keeps a NaN after it left the frame)."""
    if name == "count_star" or (name == "count" and not args):
        # 1 per row, as a column (a bare literal would be one value, not one per row)
        x: Expr = Ternary(is_null(key), lit(1, INT64), lit(1, INT64), INT64)
    else:
        (x,) = args
    counting = name in ("count", "count_star")
    if not counting and not x.dtype.is_integer:
        raise Unsupported(f"{name}() of {x.dtype} over a RANGE frame (inexact when sliding)")

    def sliding(function: str, values: Expr) -> Expr:
        # closed="both": the rows from key - size to key, peers (same key) included
        moving = fn(
            "rolling_by",
            [values, key],
            INT64,
            function=function,
            window_size=size,
            min_samples=1,
            closed="both",
        )
        whole = Agg(function, values, INT64)
        return Ternary(
            is_null(key), _over(whole, [*parts, key], INT64), _over(moving, parts, INT64), INT64
        )

    present = cast(is_not_null(x), INT64)
    count = fn("coalesce", [sliding("sum", present), lit(0, INT64)], INT64)
    if counting:
        return cast(count, dtype)
    values = cast(x, INT64)
    none = compare("eq", count, lit(0, INT64))
    if name in ("min", "max"):
        out: Expr = sliding(name, values)
    else:
        total = sliding("sum", values)
        out = total
        if name in ("avg", "mean"):  # the exact sum over the count, one rounding
            out = binop("truediv", cast(total, FLOAT64), cast(count, FLOAT64), FLOAT64)
    return cast(Ternary(none, lit(None, out.dtype), out, out.dtype), dtype)


def _running(
    name: str, args: list[Expr], parts: list[Expr], row_number: Expr, dtype: DataType
) -> Expr:
    """A running aggregate from the partition's first row to the current one (in order)."""
    if name == "count_star" or (name == "count" and not args):
        return cast(row_number, dtype)
    (x,) = args
    seen = _over(fn("cum_count", [x], IDX), parts, IDX)
    if name == "count":
        return cast(seen, dtype)
    none_yet = compare("eq", seen, lit(0, IDX))
    if name in ("sum", "sum_no_overflow", "avg", "mean"):
        work = FLOAT64 if name in ("avg", "mean") or dtype.is_float else dtype
        zero = lit(0, work)
        total = _over(
            fn("cum_sum", [fn("fill_null", [cast(x, work), zero], work)], work), parts, work
        )
        if name in ("avg", "mean"):
            total = binop("truediv", total, cast(seen, FLOAT64), FLOAT64)
        return Ternary(none_yet, lit(None, dtype), cast(total, dtype), dtype)
    # min / max: a running extreme, carried over the NULL rows.
    running = _over(fn(f"cum_{name}", [x], x.dtype), parts, x.dtype)
    filled = _over(fn("fill_null_strategy", [running], x.dtype, strategy="forward"), parts, x.dtype)
    if name == "max" and x.dtype.is_float:
        # DuckDB orders NaN above every number: the running max is NaN from the first NaN
        # on. Polars' cum_max skips NaN after the first value (its cum_min, skipping NaN
        # unless nothing else came yet, is already DuckDB's min).
        nans = fn("fill_null", [cast(fn("is_nan", [x], BOOL), INT64), lit(0, INT64)], INT64)
        seen_nan = compare("gt", _over(fn("cum_sum", [nans], INT64), parts, INT64), lit(0, INT64))
        filled = Ternary(seen_nan, lit(float("nan"), x.dtype), filled, x.dtype)
    return cast(filled, dtype)


# ---------------------------------------------------------------- set operations


def _aligned(t: Translator, rels: list[Rel], where: str) -> list[Rel]:
    """The inputs of a set operation with the first one's column names and types."""
    first = t.exact(rels[0])
    out = [first]
    for rel in rels[1:]:
        if len(rel.cols) != len(first.cols):
            t.error(where, "inputs with different numbers of columns")
            raise _Failed()
        named = tuple(
            NamedExpr(f.name, c if c.dtype == f.dtype else duck_cast(c, f.dtype))
            for f, c in zip(first.cols, rel.cols, strict=True)
        )
        node = Project(rel.node, named, first.node.schema)
        out.append(Rel(node, first.cols))
    return out


@_register("LOGICAL_UNION")
def _union(t: Translator, op: dict[str, Any]) -> Rel:
    rels = _aligned(t, t.children(op), "LOGICAL_UNION")
    node: PlanNode = Union(tuple(r.node for r in rels), rels[0].node.schema)
    if not op.get("setop_all", True):
        node = Distinct(node, None, "any", False, node.schema)
    return Rel(node, rels[0].cols)


@_register("LOGICAL_EXCEPT", "LOGICAL_INTERSECT")
def _except_intersect(t: Translator, op: dict[str, Any]) -> Rel:
    kind = op["type"]
    left, right = _aligned(t, t.children(op), kind)
    right = t.renamed(right)
    how: JoinHow = "semi" if kind == "LOGICAL_INTERSECT" else "anti"
    if op.get("setop_all"):
        # Bag semantics: the k-th copy of a row stays when the right side has at least
        # (INTERSECT ALL) or fewer than (EXCEPT ALL) k copies of it. Copies are numbered
        # within each group of equal rows (NULLs equal) on both sides and the copy
        # number joins with the row.
        def numbered(rel: Rel) -> Rel:
            rel = t.exact(rel)
            copy = _over(fn("int_range", [], INT64, start=1), list(rel.cols), INT64)
            return t.project(rel, [*((c.name, c) for c in rel.cols), ("copy", copy)])

        nleft, nright = numbered(left), numbered(right)
        node: PlanNode = Join(
            nleft.node,
            nright.node,
            tuple(nleft.cols),
            tuple(nright.cols),
            how,
            "_r",
            True,
            False,
            nleft.node.schema,
        )
        return t.project(Rel(node, nleft.cols), [(c.name, c) for c in nleft.cols[:-1]])
    # Set semantics: distinct left rows with (INTERSECT) or without (EXCEPT) an equal
    # right row, NULLs comparing equal.
    dleft = Distinct(left.node, None, "any", False, left.node.schema)
    node = Join(
        dleft,
        right.node,
        tuple(left.cols),
        tuple(right.cols),
        how,
        "_r",
        True,
        False,
        left.node.schema,
    )
    return Rel(node, left.cols)


# ---------------------------------------------------------------- CTEs


@_register("LOGICAL_MATERIALIZED_CTE")
def _materialized_cte(t: Translator, op: dict[str, Any]) -> Rel:
    definition, body = op["children"]
    index = int(op["table_index"])
    try:
        t.ctes[index] = t.exact(t.plan(definition))
    except _Failed:
        t._try(body)
        raise
    return t.plan(body)


@_register("LOGICAL_CTE_REF")
def _cte_ref(t: Translator, op: dict[str, Any]) -> Rel:
    found = t.ctes.get(int(op["cte_index"]))
    if found is None:
        t.error("LOGICAL_CTE_REF", f"unknown CTE {op.get('cte_index')}")
        raise _Failed()
    n = len(op.get("chunk_types") or found.cols)
    if n != len(found.cols):
        t.error("LOGICAL_CTE_REF", f"reads {n} columns of a CTE with {len(found.cols)}")
        raise _Failed()
    # The same node object for every reference: the planner computes it once.
    return t.renamed(found)


# ---------------------------------------------------------------- joins


@_register("LOGICAL_CROSS_PRODUCT")
def _cross(t: Translator, op: dict[str, Any]) -> Rel:
    left, right = (t.exact(r) for r in t.children(op))
    schema = Schema(left.node.schema.fields + right.node.schema.fields)
    node = Join(left.node, right.node, (), (), "cross", "_r", False, False, schema)
    return Rel(node, left.cols + right.cols)


@dataclass
class _Key:
    left: Expr
    right: Expr
    null_safe: bool


@_register("LOGICAL_COMPARISON_JOIN", "LOGICAL_ANY_JOIN")
def _join(t: Translator, op: dict[str, Any]) -> Rel:
    kind = str(op.get("join_type", "INNER"))
    where = f"{op['type']}({kind})"
    left, right = (t.exact(r) for r in t.children(op))
    both = left.cols + right.cols
    keys: list[_Key] = []
    residual: list[Expr] = []
    if op["type"] == "LOGICAL_ANY_JOIN":
        residual.append(t.expr(op["condition"], both, where))
    for c in op.get("conditions", []):
        if c.get("right") is None:
            residual.append(t.expr(c["left"], both, where))
            continue
        cmp = str(c["comparison"])
        lx = t.expr(c["left"], left.cols, where)
        rx = t.expr(c["right"], right.cols, where)
        if cmp in ("COMPARE_EQUAL", "COMPARE_NOT_DISTINCT_FROM"):
            if lx.dtype != rx.dtype:
                rx = cast(rx, lx.dtype)
            key = _Key(lx, rx, cmp == "COMPARE_NOT_DISTINCT_FROM")
            if key not in keys:  # DuckDB repeats a condition (PARTITION BY a, a)
                keys.append(key)
        else:
            try:
                residual.append(compare(comparison_op(cmp), lx, rx))
            except Unsupported as exc:
                t.error(where, exc.explained())
    if t.errors:
        raise _Failed()
    left, right, keys = _repeated_key_columns(t, left, right, keys, kind)
    lmap = [int(i) for i in op.get("left_projection_map") or []]
    rmap = [int(i) for i in op.get("right_projection_map") or []]
    if kind == "INNER":
        rel = _inner(t, left, right, keys, residual)
        return _join_output(t, rel, left, right, lmap, rmap)
    if kind in ("LEFT", "RIGHT", "OUTER", "FULL"):
        how: JoinHow = {"LEFT": "left", "RIGHT": "right"}.get(kind, "full")  # type: ignore[assignment]
        if residual:
            rel = _outer_with_residual(t, left, right, keys, residual, how)
        else:
            rel = _equi(t, left, right, keys, how)
        return _join_output(t, rel, left, right, lmap, rmap)
    if kind == "SINGLE":
        if residual:
            t.error(where, "non-equality conditions on a single join are not supported")
            raise _Failed()
        rel = _single(t, left, right, keys, where)
        return _join_output(t, rel, left, right, lmap, rmap)
    if kind in ("SEMI", "ANTI"):
        rel = _semi(t, left, right, keys, residual, kind == "ANTI", where)
        return t.select(rel, lmap)
    if kind in ("RIGHT_SEMI", "RIGHT_ANTI"):
        swapped = [_Key(k.right, k.left, k.null_safe) for k in keys]
        rel = _semi(t, right, left, swapped, residual, kind == "RIGHT_ANTI", where)
        return t.select(rel, rmap)
    if kind == "MARK":
        if residual:
            t.error(where, "non-equality conditions on a mark join are not supported")
            raise _Failed()
        rel = _mark(t, left, right, keys, where)
        if lmap:
            rel = t.select(rel, [*lmap, len(left.cols)])
        return rel
    t.error(where, f"{kind} joins are not supported")
    raise _Failed()


def _numbered(t: Translator, rel: Rel, hint: str) -> tuple[Rel, Col]:
    """``rel`` with a row number column in front (the rows' identity for an anti join)."""
    name = t.fresh(hint)
    schema = Schema(((name, IDX), *rel.node.schema.fields))
    col = Col(name, IDX)
    return Rel(RowIndex(rel.node, name, 0, schema), (col, *rel.cols)), col


def _outer_with_residual(
    t: Translator, left: Rel, right: Rel, keys: list[_Key], residual: list[Expr], how: JoinHow
) -> Rel:
    """An outer join whose condition has more than equalities (``a.k = b.k AND a.x < b.y``):
    the inner join with the whole condition, then the rows of the outer side(s) that it did
    not match (found by an anti join on row numbers), padded with NULLs."""
    lnum, lid = _numbered(t, left, "left_row")
    rnum, rid = _numbered(t, right, "right_row")
    matched = _inner(t, lnum, rnum, keys, residual)
    out_cols = (*left.cols, *right.cols)
    parts = [t.project(matched, [(c.name, c) for c in out_cols])]
    names = [c.name for c in parts[0].cols]

    def unmatched(side: Rel, ident: Col, other: Rel) -> Rel:
        seen = t.project(matched, [(ident.name, ident)])
        alias = t.fresh(ident.name)
        seen = t.project(seen, [(alias, seen.cols[0])])
        schema = side.node.schema
        anti = Join(
            side.node, seen.node, (ident,), (seen.cols[0],), "anti", "_r", False, False, schema
        )
        kept = Rel(anti, side.cols)
        nulls = {c.name: lit(None, c.dtype) for c in other.cols}
        exprs = [(c.name, nulls.get(c.name, c)) for c in out_cols]
        padded = t.project(kept, exprs)
        # the same column names as the matched part, in the same order
        return Rel(
            Project(
                padded.node,
                tuple(NamedExpr(n, c) for n, c in zip(names, padded.cols, strict=True)),
                Schema(tuple((n, c.dtype) for n, c in zip(names, padded.cols, strict=True))),
            ),
            parts[0].cols,
        )

    if how in ("left", "full"):
        parts.append(unmatched(lnum, lid, right))
    if how in ("right", "full"):
        parts.append(unmatched(rnum, rid, left))
    schema = parts[0].node.schema
    return Rel(Union(tuple(p.node for p in parts), schema), parts[0].cols)


#: Join types whose output has no unmatched row of the right (left) side.
_NO_UNMATCHED_RIGHT = frozenset({"INNER", "LEFT", "SEMI", "ANTI"})
_NO_UNMATCHED_LEFT = frozenset({"INNER", "RIGHT", "RIGHT_SEMI", "RIGHT_ANTI"})


def _repeated_key_columns(
    t: Translator, left: Rel, right: Rel, keys: list[_Key], kind: str
) -> tuple[Rel, Rel, list[_Key]]:
    """Join keys with each column once per side. DuckDB writes conditions such as
    ``l = r1 AND l IS NOT DISTINCT FROM r2`` (decorrelated subqueries); the kernel cannot
    hash or join on a column twice. Given the first condition, the second says ``r1 op
    r2`` (``l`` and ``r1`` are the same value), a filter of the right side, exact where the
    join keeps no unmatched right row (the same for the left side)."""
    kept: list[_Key] = []
    right_conditions: list[Expr] = []
    left_conditions: list[Expr] = []
    for k in keys:
        op = "eq_missing" if k.null_safe else "eq"
        same_left = next((o for o in kept if o.left == k.left), None)
        same_right = next((o for o in kept if o.right == k.right), None)
        if same_left is not None and kind in _NO_UNMATCHED_RIGHT:
            right_conditions.append(compare(op, same_left.right, k.right))
        elif same_right is not None and kind in _NO_UNMATCHED_LEFT:
            left_conditions.append(compare(op, same_right.left, k.left))
        elif same_left is not None or same_right is not None:
            # Other joins (mark, single, outer): join on a copy of the column instead.
            if same_left is not None:
                left, copy = _with_copy(t, left, k.left)
                k = _Key(copy, k.right, k.null_safe)
            if same_right is not None:
                right, copy = _with_copy(t, right, k.right)
                k = _Key(k.left, copy, k.null_safe)
            kept.append(k)
        else:
            kept.append(k)
    if right_conditions:
        right = t.filter(right, and_all(right_conditions))
    if left_conditions:
        left = t.filter(left, and_all(left_conditions))
    return left, right, kept


def _with_copy(t: Translator, rel: Rel, e: Expr) -> tuple[Rel, Col]:
    """``rel`` carrying one more column holding ``e`` (its ``cols`` unchanged)."""
    extra = NamedExpr(t.fresh("key"), e)
    return _with_columns(rel, [extra]), Col(extra.name, extra.dtype)


def _join_output(
    t: Translator, rel: Rel, left: Rel, right: Rel, lmap: list[int], rmap: list[int]
) -> Rel:
    if not lmap and not rmap:
        return rel
    idx = (lmap or list(range(len(left.cols)))) + [
        len(left.cols) + j for j in (rmap or range(len(right.cols)))
    ]
    return t.select(rel, idx)


def _prepare_keys(
    t: Translator, left: Rel, right: Rel, keys: list[_Key], filter_left: bool, filter_right: bool
) -> tuple[Rel, Rel, bool]:
    """Join inputs and the ``nulls_equal`` flag for ``keys``. Keys of both kinds (``=`` and
    ``IS NOT DISTINCT FROM``) use ``nulls_equal`` with the NULLs of the ``=`` keys removed
    from a side whose unmatched rows are not kept."""
    null_safe = [k.null_safe for k in keys]
    if all(null_safe) or not any(null_safe):
        return left, right, bool(keys) and all(null_safe)
    plain = [k for k in keys if not k.null_safe]
    if not (filter_left or filter_right):
        raise Unsupported("a full outer join mixing = and IS NOT DISTINCT FROM")
    if filter_left:
        left = t.filter(left, and_all([is_not_null(k.left) for k in plain]))
    if filter_right:
        right = t.filter(right, and_all([is_not_null(k.right) for k in plain]))
    return left, right, True


def _equi(t: Translator, left: Rel, right: Rel, keys: list[_Key], how: JoinHow) -> Rel:
    if not keys:
        # A cross join; for a left join exact only when the right side has exactly one row
        # (DuckDB joins a correlated count(*) subquery's default this way).
        if how == "inner" or (how == "left" and _one_row(right.node)):
            schema = Schema(left.node.schema.fields + right.node.schema.fields)
            node = Join(left.node, right.node, (), (), "cross", "_r", False, False, schema)
            return Rel(node, left.cols + right.cols)
        t.error("LOGICAL_COMPARISON_JOIN", f"a {how} join without equality conditions")
        raise _Failed()
    try:
        left, right, nulls_equal = _prepare_keys(
            t,
            left,
            right,
            keys,
            filter_left=how in ("inner", "right"),
            filter_right=how in ("inner", "left"),
        )
    except Unsupported as exc:
        t.error("LOGICAL_COMPARISON_JOIN", exc.explained())
        raise _Failed() from None
    schema = Schema(left.node.schema.fields + right.node.schema.fields)
    node = Join(
        left.node,
        right.node,
        tuple(k.left for k in keys),
        tuple(k.right for k in keys),
        how,
        "_r",
        nulls_equal,
        False,
        schema,
    )
    return Rel(node, left.cols + right.cols)


def _one_row(node: PlanNode) -> bool:
    """Whether ``node`` always produces exactly one row (an aggregate without keys, under
    projections)."""
    while isinstance(node, Project):
        node = node.input
    return isinstance(node, Aggregate) and not node.keys


def _single(t: Translator, left: Rel, right: Rel, keys: list[_Key], where: str) -> Rel:
    """A single join (a correlated scalar subquery): a left join where a left row may
    match at most one right row; DuckDB raises when one matches several. Each right row
    carries the number of right rows with its key, and a left row that meets a count
    above one fails the query."""
    if not keys:
        return _equi(t, left, right, keys, "left")
    width = len(right.cols)
    message = lit(
        "Invalid Input Error: More than one row returned by a subquery used as an "
        "expression - scalar subqueries can only return a single row.",
        STRING,
    )
    if not t.scalar_subquery_error_on_multiple_rows:
        # DuckDB gives any one of the rows, which one being its hash table's business:
        # where they are all equal that is the row; where they differ shoal cannot know
        # DuckDB's pick and fails the query rather than answer otherwise.
        named = _fresh_projection(
            t,
            right,
            [*(("single_col", c) for c in right.cols), *(("single_key", k.right) for k in keys)],
        )
        keys = [_Key(k.left, c, k.null_safe) for k, c in zip(keys, named.cols[width:], strict=True)]
        # (the keys stay columns of the right side for the join; not in the output)
        right = Rel(Distinct(named.node, None, "any", False, named.node.schema), named.cols)
        message = lit(
            "shoal: a correlated scalar subquery gave several different rows for one row "
            "(scalar_subquery_error_on_multiple_rows=false: DuckDB returns any one of them, "
            "and shoal cannot tell which)",
            STRING,
        )
    key_proj = _fresh_projection(t, right, [("single_key", k.right) for k in keys])
    n_name = t.fresh("single_count")
    counts_schema = Schema.of([*((c.name, c.dtype) for c in key_proj.cols), (n_name, IDX)])
    counts = Aggregate(
        key_proj.node,
        tuple(NamedExpr(c.name, c) for c in key_proj.cols),
        (NamedExpr(n_name, Agg("len", None, IDX)),),
        False,
        counts_schema,
    )
    counted_schema = Schema(right.node.schema.fields + counts_schema.fields)
    counted = Join(
        right.node,
        counts,
        tuple(k.right for k in keys),
        tuple(key_proj.cols),
        "inner",
        "_r",
        True,
        False,
        counted_schema,
    )
    n = Col(n_name, IDX)
    counted_rel = t.project(
        Rel(counted, right.cols), [*((c.name, c) for c in right.cols), (n_name, n)]
    )
    rel = _equi(t, left, counted_rel, keys, "left")
    too_many = compare("gt", rel.cols[-1], lit(1, IDX))
    exprs: list[tuple[str, Expr]] = [(c.name, c) for c in left.cols]
    for j, c in enumerate(right.cols[:width]):
        e: Expr = c
        if j == 0:
            e = Ternary(too_many, raise_where(too_many, message, c.dtype), c, c.dtype)
        exprs.append((c.name, e))
    return t.project(rel, exprs)


def _inner(t: Translator, left: Rel, right: Rel, keys: list[_Key], residual: list[Expr]) -> Rel:
    rel = _equi(t, left, right, keys, "inner")
    return t.filter(rel, and_all(residual)) if residual else rel


def _semi(
    t: Translator,
    left: Rel,
    right: Rel,
    keys: list[_Key],
    residual: list[Expr],
    anti: bool,
    where: str,
) -> Rel:
    how: JoinHow = "anti" if anti else "semi"
    if not residual:
        if not keys:
            t.error(where, "a semi or anti join without conditions")
            raise _Failed()
        try:
            left2, right2, nulls_equal = _prepare_keys(
                t, left, right, keys, filter_left=not anti, filter_right=True
            )
        except Unsupported as exc:  # pragma: no cover - both flags set
            t.error(where, exc.explained())
            raise _Failed() from None
        node = Join(
            left2.node,
            right2.node,
            tuple(k.left for k in keys),
            tuple(k.right for k in keys),
            how,
            "_r",
            nulls_equal,
            False,
            left2.node.schema,
        )
        return Rel(node, left.cols)
    # Conditions beyond equality: the distinct left rows that have a match (inner join and
    # filter), then a semi (anti) join of the left rows with them on every column, NULLs
    # equal. Equal left rows behave alike, so duplicates keep their multiplicity.
    matched = _inner(t, left, right, keys, residual)
    matched = t.exact(t.project(matched, [(c.name, c) for c in left.cols]))
    matched = t.renamed(matched)
    dmatched = Distinct(matched.node, None, "any", False, matched.node.schema)
    node = Join(
        left.node,
        dmatched,
        tuple(left.cols),
        tuple(matched.cols),
        how,
        "_r",
        True,
        False,
        left.node.schema,
    )
    return Rel(node, left.cols)


def _mark(t: Translator, left: Rel, right: Rel, keys: list[_Key], where: str) -> Rel:
    """A mark join: the left rows and a BOOLEAN "has a match" column with SQL's ``IN``
    semantics (NULL when there is no match but a NULL took part in the comparison)."""
    if not keys:
        t.error(where, "a mark join without equality conditions")
        raise _Failed()
    plain = [k for k in keys if not k.null_safe]
    if len(plain) > _MARK_KEYS:
        t.error(where, f"a mark join on more than {_MARK_KEYS} = conditions is not supported")
        raise _Failed()
    key_names = [t.fresh("mark_key") for _ in keys]
    proj = t.project(right, [(n, k.right) for n, k in zip(key_names, keys, strict=True)])
    rkeys = proj.cols
    usable = proj
    if plain:
        usable = t.filter(
            proj, and_all([is_not_null(rkeys[j]) for j, k in enumerate(keys) if not k.null_safe])
        )
    flag = t.fresh("mark_found")
    marked = t.project(
        Rel(Distinct(usable.node, None, "any", False, usable.node.schema), usable.cols),
        [*((c.name, c) for c in usable.cols), (flag, lit(True, BOOL))],
    )
    # NULLs equal: the IS NOT DISTINCT FROM keys match NULL to NULL, and the right side
    # holds no NULL in the = key (filtered above), which a NULL on the left thus never
    # meets. (With NULLs unequal for all keys, a NULL correlated key found nothing.)
    nulls_equal = True
    # Keys as columns of the left side (the kernel's join keys are columns or plain
    # expressions: a STRUCT built of columns is refused there).
    key_exprs = [(t.fresh("mark_lkey"), k.left) for k in keys if not isinstance(k.left, Col)]
    left_node = left.node
    left_keys: list[Expr] = [k.left for k in keys]
    if key_exprs:
        with_keys = t.project(left, [*((c.name, c) for c in left.cols), *key_exprs])
        left_node = with_keys.node
        extra = iter(with_keys.cols[len(left.cols) :])
        left_keys = [k.left if isinstance(k.left, Col) else next(extra) for k in keys]
    schema = Schema(left_node.schema.fields + marked.node.schema.fields)
    joined = Rel(
        Join(
            left_node,
            marked.node,
            tuple(left_keys),
            tuple(marked.cols[:-1]),
            "left",
            "_r",
            nulls_equal,
            False,
            schema,
        ),
        left.cols + marked.cols,
    )
    found = marked.cols[-1]
    mark_name = t.fresh("mark")
    if not plain:
        mark: Expr = is_not_null(found)
        return t.project(joined, [*((c.name, c) for c in left.cols), (mark_name, mark)])
    if len(plain) > 1:
        unknown_rel, maybe = _mark_unknown(t, joined, proj, keys, left_keys)
        mark = Ternary(
            is_not_null(found),
            lit(True, BOOL),
            Ternary(maybe, lit(None, BOOL), lit(False, BOOL), BOOL),
            BOOL,
        )
        return t.project(unknown_rel, [*((c.name, c) for c in left.cols), (mark_name, mark)])
    # NULL semantics of "x IN (right keys)": needs the right side's row and NULL counts,
    # per value of the IS NOT DISTINCT FROM keys (a correlated NOT IN: DuckDB joins on the
    # correlated columns with those), else over the whole right side.
    i = keys.index(plain[0])
    n_rows, n_nulls = t.fresh("mark_rows"), t.fresh("mark_nulls")
    safe = [(j, k) for j, k in enumerate(keys) if k.null_safe]
    groups = tuple(NamedExpr(t.fresh("mark_group"), rkeys[j]) for j, _ in safe)
    stats_schema = Schema.of([*((g.name, g.dtype) for g in groups), (n_rows, IDX), (n_nulls, IDX)])
    stats = Aggregate(
        proj.node,
        groups,
        (
            NamedExpr(n_rows, Agg("len", None, IDX)),
            NamedExpr(n_nulls, Agg("null_count", rkeys[i], IDX)),
        ),
        False,
        stats_schema,
    )
    with_stats = Join(
        joined.node,
        stats,
        tuple(k.left for _, k in safe),
        tuple(Col(g.name, g.dtype) for g in groups),
        "left" if groups else "cross",
        "_r",
        bool(groups),
        False,
        Schema(joined.node.schema.fields + stats_schema.fields),
    )
    rows = fn("coalesce", [Col(n_rows, IDX), lit(0, IDX)], IDX)
    nulls = fn("coalesce", [Col(n_nulls, IDX), lit(0, IDX)], IDX)
    unknown = Ternary(
        compare("eq", rows, lit(0, IDX)),
        lit(False, BOOL),
        Ternary(
            binop("or", is_null(keys[i].left), compare("gt", nulls, lit(0, IDX)), BOOL),
            lit(None, BOOL),
            lit(False, BOOL),
            BOOL,
        ),
        BOOL,
    )
    mark = Ternary(is_not_null(found), lit(True, BOOL), unknown, BOOL)
    rel = Rel(with_stats, joined.cols)
    return t.project(rel, [*((c.name, c) for c in left.cols), (mark_name, mark)])


#: The most = conditions of a mark join (``(a, b) IN (SELECT x, y ...)``): its NULL
#: semantics take 3**n joins (:func:`_mark_unknown`).
_MARK_KEYS = 3


def _mark_unknown(
    t: Translator, joined: Rel, proj: Rel, keys: list[_Key], left_keys: list[Expr]
) -> tuple[Rel, Expr]:
    """Whether a left row of a mark join on several ``=`` conditions (and any IS NOT
    DISTINCT FROM ones) meets a right row where no ``=`` is false and some compares a NULL:
    then ``(a, b) IN (...)`` is NULL rather than FALSE when no row matches (SQL's
    three-valued AND, over the right rows with the same IS NOT DISTINCT FROM keys).

    For each split of the ``=`` keys into Q (both sides equal, not NULL) and D (NULL on the
    right) with the left row non-NULL exactly on Q and D: the distinct right rows of that
    NULL pattern, joined on Q and the IS NOT DISTINCT FROM keys (NULLs equal: the right
    side holds no NULL in Q). Returns ``joined`` with those joins and the condition."""
    plain = [j for j, k in enumerate(keys) if not k.null_safe]
    safe = [j for j, k in enumerate(keys) if k.null_safe]
    node, cols = joined.node, joined.cols
    terms: list[Expr] = []
    for choice in itertools.product((0, 1, 2), repeat=len(plain)):  # 0: left NULL, 1: Q, 2: D
        q = [j for j, c in zip(plain, choice, strict=True) if c == 1]
        d = [j for j, c in zip(plain, choice, strict=True) if c == 2]
        if len(q) == len(plain):
            continue  # all equal: the match itself
        pattern = [is_not_null(proj.cols[j]) for j in q] + [is_null(proj.cols[j]) for j in d]
        rows = t.filter(proj, and_all(pattern)) if pattern else proj
        on = safe + q
        flag = t.fresh("mark_null_match")
        if on:
            picked = _fresh_projection(t, rows, [("mark_nkey", proj.cols[j]) for j in on])
            distinct = Distinct(picked.node, None, "any", False, picked.node.schema)
            flagged = t.project(
                Rel(distinct, picked.cols),
                [*((c.name, c) for c in picked.cols), (flag, lit(True, BOOL))],
            )
            schema = Schema(node.schema.fields + flagged.node.schema.fields)
            node = Join(
                node,
                flagged.node,
                tuple(left_keys[j] for j in on),
                tuple(flagged.cols[:-1]),
                "left",
                "_r",
                True,
                False,
                schema,
            )
            hit: Expr = is_not_null(flagged.cols[-1])
        else:
            counted = Aggregate(
                rows.node,
                (),
                (NamedExpr(flag, Agg("len", None, IDX)),),
                False,
                Schema.of([(flag, IDX)]),
            )
            schema = Schema(node.schema.fields + counted.schema.fields)
            node = Join(node, counted, (), (), "cross", "_r", False, False, schema)
            hit = compare("gt", Col(flag, IDX), lit(0, IDX))
        left_pattern = [
            is_not_null(left_keys[j]) if c else is_null(left_keys[j])
            for j, c in zip(plain, choice, strict=True)
        ]
        terms.append(and_all([*left_pattern, hit]))
    return Rel(node, cols), or_all(terms)


__all__ = ["OPERATORS", "Rel", "Translator", "translate"]

# ASOF joins live in a module of their own, which registers into OPERATORS.
from shoal_duckdb import asof as _asof  # noqa: E402, F401
