"""Running DuckDB queries with shoal: :func:`sql`, :func:`run`, :func:`explain`, :func:`to_ir`.

The flow of :func:`sql`:

1. DuckDB parses the query (a syntax error raises DuckDB's ``ParserException``) and binds it
   on the caller's connection (a missing table raises DuckDB's ``CatalogException``), before
   anything else happens;
2. the query's optimised logical plan is serialised (:mod:`shoal_duckdb.prepare`) and
   translated into the shoal IR (:mod:`shoal_duckdb.translate`);
3. shoal runs the IR (``runner="ray"`` or ``"local"``) and the result comes back as a
   ``duckdb.DuckDBPyRelation`` on the caller's connection, with DuckDB's column names and
   types; users go on with ``.fetchall()``, ``.pl()``, ``.arrow()`` or joins.

A query shoal cannot translate runs on DuckDB itself, on the driver, after a
:class:`DuckDBFallbackWarning` naming the DuckDB operator and reason; with
``raise_on_fail=True`` it raises :class:`shoal.UnsupportedError` instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

import duckdb
import pyarrow as pa

from shoal.errors import ShoalFallbackWarning, TaskError, UnsupportedError
from shoal_duckdb.errors import duckdb_error
from shoal_duckdb.prepare import (
    bind_parameters,
    lookup,
    parse_tree,
    prepare,
    quote_ident,
    rewrite_refs,
    to_sql,
    walk_dicts,
)

if TYPE_CHECKING:
    from shoal.config import Config, RunnerKind
    from shoal.ir.nodes import PlanNode


class DuckDBFallbackWarning(ShoalFallbackWarning):
    """A DuckDB query that shoal could not translate ran on DuckDB itself, on the driver.

    The message names each unsupported DuckDB operator (or function) and the reason. A
    :class:`shoal.ShoalFallbackWarning`, as every frontend's fallback warning is.
    """


def _check_statement(
    con: duckdb.DuckDBPyConnection, query: str, with_params: bool = False
) -> str | None:
    """Parse ``query`` with DuckDB (raising its ``ParserException``); the reason it cannot
    run distributed when it is not a single SELECT (or has parameters but no values for
    them), else None."""
    statements = con.extract_statements(query)
    if len(statements) != 1:
        return f"{len(statements)} statements (shoal runs one SELECT at a time)"
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        # DuckDB runs PIVOT and UNPIVOT as several statements (type MULTI): name what the
        # user wrote, the statement's first keyword.
        words = query.strip().split(None, 1)
        keyword = words[0].upper() if words else getattr(kind, "name", str(kind))
        return f"{keyword} statements do not run distributed (only SELECT does)"
    if statements[0].named_parameters and not with_params:
        return "prepared-statement parameters without values (pass params=)"
    return None


def to_ir(con: duckdb.DuckDBPyConnection, query: str) -> PlanNode:
    """The shoal IR of ``query`` (one SELECT) on ``con``, without running it.

    The IR's columns are the query's result columns (renamed ``c0``, ``c1``, ... when the
    result has duplicate names). Names that are no table of ``con`` are looked up among the
    caller's variables, as DuckDB's replacement scans do (Arrow tables, Polars and pandas
    frames, DuckDB relations). Raises DuckDB's own ``ParserException``,
    ``CatalogException`` or ``BinderException`` for bad input, and
    :class:`shoal.UnsupportedError` naming each DuckDB operator or function shoal cannot
    translate.
    """
    return _to_ir(con, query, _caller_frame())


def _to_ir(con: duckdb.DuckDBPyConnection, query: str, frame: FrameType | None) -> PlanNode:
    """:func:`to_ir` with the caller's frame (for replacement scans) given. Any failure of
    the translation itself is an :class:`shoal.UnsupportedError` (what :func:`sql` would
    fall back for); DuckDB's own errors for bad input propagate."""
    reason = _check_statement(con, query)
    if reason is not None:
        raise UnsupportedError(f"shoal cannot run this DuckDB query: {reason}")
    with _python_objects(con, query, frame) as (text, _):
        bound = _bind(con, text)
        try:
            plan, _names = _translate(con, text, list(bound.columns))
        except UnsupportedError:
            raise
        except Exception as exc:
            raise UnsupportedError(
                f"shoal could not translate this DuckDB query: {type(exc).__name__}: {exc}"
            ) from exc
    return plan


#: Python object types that DuckDB's replacement scans read by variable name.
_SCANNABLE = ("Table", "RecordBatchReader", "DataFrame", "LazyFrame", "DuckDBPyRelation", "Dataset")


def _caller_frame() -> FrameType | None:
    """The first frame outside this package: the user's, whose variables DuckDB's
    replacement scans would see."""
    here = os.path.dirname(__file__)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame = frame.f_back
    return frame


@contextlib.contextmanager
def _python_objects(
    con: duckdb.DuckDBPyConnection, query: str, frame: FrameType | None
) -> Iterator[tuple[str, list[str]]]:
    """``query`` with references to the caller's Arrow/Polars/pandas objects replaced by
    views registered on ``con`` for the duration (DuckDB would only look in the frame that
    calls it, which is shoal's); yields the query and the registered names."""
    registered: list[str] = []
    tree = parse_tree(con, query) if frame is not None else None
    if tree is None or frame is None:
        yield query, registered
        return
    ctes = {
        str(e["key"]).lower()
        for d in walk_dicts(tree)
        for e in (d.get("cte_map") or {}).get("map", [])
    }

    def replace(ref: dict[str, Any]) -> dict[str, Any] | None:
        if ref["type"] != "BASE_TABLE" or ref.get("schema_name") or ref.get("catalog_name"):
            return None
        name = str(ref.get("table_name", ""))
        if name.lower() in ctes or lookup(con, "", "", name) is not None:
            return None
        obj = frame.f_locals.get(name, frame.f_globals.get(name))
        if obj is None or type(obj).__name__ not in _SCANNABLE:
            return None
        alias = f"__shoal_py_{uuid.uuid4().hex[:12]}"
        con.register(alias, obj)
        registered.append(alias)
        return dict(
            ref, table_name=alias, alias=ref.get("alias") or name, qualified_name={"path": [alias]}
        )

    try:
        new_tree = rewrite_refs(tree, replace)
        yield (to_sql(con, new_tree) if registered else query), registered
    finally:
        for alias in registered:
            with contextlib.suppress(Exception):
                con.unregister(alias)


def _translate(
    con: duckdb.DuckDBPyConnection, query: str, names: list[str]
) -> tuple[PlanNode, list[str]]:
    """IR plan of ``query`` whose columns are the result columns (renamed when duplicated),
    and those IR column names."""
    from shoal.ir.expr import NamedExpr
    from shoal.ir.nodes import Project
    from shoal.ir.types import Schema
    from shoal_duckdb.reasons import SourceText
    from shoal_duckdb.translate import translate

    prepared = prepare(con, query)
    try:
        root = prepared.plan_json()
        source = SourceText(prepared.sql, parse_tree(con, prepared.sql), prepared.standins)
        node, cols = translate(con, root, prepared.standins, source)
    finally:
        prepared.close()
    if len(cols) != len(names):
        raise UnsupportedError(
            f"the translated plan has {len(cols)} columns, DuckDB's result {len(names)}"
        )
    unique = len({n.lower() for n in names}) == len(names) and all(names)
    out_names = list(names) if unique else [f"c{i}" for i in range(len(names))]
    exprs = tuple(NamedExpr(n, c) for n, c in zip(out_names, cols, strict=True))
    schema = Schema.of([(e.name, e.dtype) for e in exprs])
    return Project(node, exprs, schema), out_names


@dataclass(frozen=True)
class _Shape:
    """The names and types of a result bound over stand-ins (which are gone by now)."""

    columns: list[str]
    types: list[Any]


def _bind(con: duckdb.DuckDBPyConnection, text: str) -> duckdb.DuckDBPyRelation | _Shape:
    """``text`` bound by DuckDB (names and types of its result). A query that reads object
    storage (``read_parquet('s3://...')``) cannot bind where DuckDB's httpfs extension is
    not installed: it is bound over shoal's stand-in tables instead, whose schemas come
    from shoal's own footer reads (``shoal.storage``); DuckDB's error stands otherwise."""
    try:
        return con.sql(text)
    except duckdb.Error as exc:
        if "httpfs" not in str(exc):
            raise
        try:
            prepared = prepare(con, text)
        except Exception:
            raise exc from None
        try:
            rel = con.sql(prepared.sql)
            return _Shape(list(rel.columns), list(rel.types))
        except Exception:
            raise exc from None
        finally:
            prepared.close()


def _result_relation(
    con: duckdb.DuckDBPyConnection, table: pa.Table, bound: duckdb.DuckDBPyRelation | _Shape
) -> duckdb.DuckDBPyRelation:
    """``table`` as a relation on ``con`` with the names and types of DuckDB's own result."""
    inner = [f"c{i}" for i in range(table.num_columns)]
    rel = con.from_arrow(table.rename_columns(inner))
    items = [
        f"CAST({quote_ident(c)} AS {t}) AS {quote_ident(n)}"
        for c, n, t in zip(inner, bound.columns, bound.types, strict=True)
    ]
    return rel.project(", ".join(items)) if items else rel


def _user_stacklevel() -> int:
    """The stacklevel of the first frame outside this package (the caller), for warnings."""
    here = os.path.dirname(__file__)
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(here):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def _should_raise(raise_on_fail: bool | None, config: Config | None) -> bool:
    if raise_on_fail is not None:
        return raise_on_fail
    if config is not None:
        return config.raise_on_fail
    from shoal.config import get_config

    return get_config().raise_on_fail


def sql(
    query: str | duckdb.DuckDBPyConnection,
    legacy_query: str | None = None,
    *,
    connection: duckdb.DuckDBPyConnection | None = None,
    params: Any = None,
    runner: RunnerKind | None = None,
    raise_on_fail: bool | None = None,
    config: Config | None = None,
) -> Any:
    """Run the SELECT ``query`` distributed with shoal, on the tables of ``connection``
    (None: DuckDB's default connection, as ``duckdb.sql(query, connection=None)``).

    Returns a :class:`~shoal_duckdb.relation.DistRelation`: like a DuckDB relation it is
    lazy. The query is parsed, bound and translated now (bad input raises DuckDB's
    exceptions here; a query shoal cannot translate warns or raises here) and runs with
    shoal when the relation is first read (``.fetchall()``, ``.pl()``, ``.df()``,
    ``.arrow()`` (a ``RecordBatchReader``), ``.to_arrow_table()``, ``.show()``, ...), once;
    later reads reuse the result. Its ``columns`` and ``types`` are DuckDB's, known
    without running. ``.materialize()`` runs it and returns the ``duckdb.DuckDBPyRelation``
    of the result on ``connection`` (for joins with the connection's other relations).
    A query that falls back returns DuckDB's own relation.

    The earlier form ``sql(con, query, ...)`` (the connection first) is kept: it runs at
    once and returns the ``duckdb.DuckDBPyRelation`` (``sql(query,
    connection=con).materialize()``), raising the query's errors from the call.

    ``params`` are the values of the query's prepared-statement parameters (``?``, ``$1``,
    ``$name``), a sequence or a mapping as ``con.sql(query, params=...)`` takes them:
    DuckDB binds them first, and the query runs with each value written in as a constant
    of the type DuckDB gives it.

    ``runner`` is ``"ray"``, ``"local"`` or None (the configured runner); ``config`` is a
    :class:`shoal.Config` (None: :func:`shoal.get_config`). ``raise_on_fail`` True raises
    :class:`shoal.UnsupportedError` (naming each DuckDB operator or function and the reason)
    for a query shoal cannot translate; False runs it on DuckDB itself, on the driver, after
    a :class:`DuckDBFallbackWarning`; None takes ``config.raise_on_fail``. A statement that
    is not one SELECT (DDL, several statements) counts as untranslatable.

    Errors: a syntax error raises DuckDB's ``ParserException``; a missing table or column
    DuckDB's ``CatalogException``/``BinderException``; both before anything runs on the
    cluster. Where DuckDB raises while it runs the query (a failed cast, an overflow, a
    division by zero), shoal raises, when the result is read, a ``shoal.TaskError`` that is
    also DuckDB's class (``duckdb.ConversionException``, ``OutOfRangeException``,
    ``InvalidInputException``) with DuckDB's message first; other task errors
    (``shoal.TaskError``) propagate. ``TypeError`` when ``query`` is not a string.
    """
    if isinstance(query, duckdb.DuckDBPyConnection):
        if legacy_query is None:
            raise TypeError("sql(con, query): the query is missing")
        if connection is not None:
            raise TypeError("sql(con, query): pass the connection once")
        rel = _lazy_sql(query, legacy_query, params, runner, raise_on_fail, config, _caller_frame())
        return rel.materialize() if isinstance(rel, _relation().DistRelation) else rel
    if legacy_query is not None:
        raise TypeError("sql(query, ...): the second positional argument is not taken")
    if not isinstance(query, str):
        raise TypeError(f"sql(): query must be a str, got {type(query).__name__}")
    con = connection if connection is not None else duckdb.default_connection()
    return _lazy_sql(con, query, params, runner, raise_on_fail, config, _caller_frame())


def _relation() -> Any:
    from shoal_duckdb import relation

    return relation


def _lazy_sql(
    con: duckdb.DuckDBPyConnection,
    query: str,
    params: Any,
    runner: RunnerKind | None,
    raise_on_fail: bool | None,
    config: Config | None,
    frame: FrameType | None,
) -> Any:
    """:func:`sql` up to the run: a ``DistRelation``, or DuckDB's relation after a
    fallback."""
    reason = _check_statement(con, query, params is not None)
    if reason is not None:
        return _fallback(con, query, None, UnsupportedError(reason), raise_on_fail, config)
    native = None
    if params is not None:
        # DuckDB binds the query with its values first (its errors for missing or
        # ill-typed values); shoal runs the query with the values written in as constants
        # and returns the result with the types of DuckDB's own binding.
        native = con.sql(query, params=params)
        try:
            query = bind_parameters(con, query, params)
        except UnsupportedError as exc:
            return _fallback(con, query, native, exc, raise_on_fail, config)
    with _python_objects(con, query, frame) as (text, registered):
        # binds: DuckDB's CatalogException / BinderException (with parameter values, DuckDB
        # has bound it already)
        bound = native if native is not None else _bind(con, text)
        try:
            plan, _ = _translate(con, text, list(bound.columns))
        except Exception as exc:
            native = bound if isinstance(bound, duckdb.DuckDBPyRelation) else None
            rel = _fallback(con, text, native, exc, raise_on_fail, config)
            if registered:
                # The relation reads objects registered only for this call: keep its rows.
                return _result_relation(con, rel.to_arrow_table(), bound)
            return rel
        shape = _Shape(list(bound.columns), list(bound.types))
    return _relation().DistRelation(con, query, plan, shape, runner, config)


def _execute_result(plan: PlanNode, runner: RunnerKind | None, config: Config | None) -> Any:
    """Run ``plan`` with shoal, leaving the result in the object store (a
    :class:`shoal.QueryResult`; a seam that tests may replace). A task's DuckDB error is
    raised as DuckDB's class (:func:`shoal_duckdb.errors.duckdb_error`)."""
    from shoal.result import execute_result

    try:
        return execute_result(plan, runner=runner, config=config)
    except TaskError as exc:
        mapped = duckdb_error(exc)
        if mapped is None:
            raise
        raise mapped from exc


def _fallback(
    con: duckdb.DuckDBPyConnection,
    query: str,
    bound: duckdb.DuckDBPyRelation | None,
    exc: BaseException,
    raise_on_fail: bool | None,
    config: Config | None,
) -> duckdb.DuckDBPyRelation:
    unsupported = isinstance(exc, UnsupportedError)
    if _should_raise(raise_on_fail, config):
        if unsupported:
            raise exc
        raise UnsupportedError(
            f"shoal could not translate this DuckDB query: {type(exc).__name__}: {exc}"
        ) from exc
    reason = str(exc) if unsupported else f"translation failed: {type(exc).__name__}: {exc}"
    warnings.warn(
        f"shoal: running the query on DuckDB itself (driver): {reason}",
        DuckDBFallbackWarning,
        stacklevel=_user_stacklevel(),
    )
    return bound if bound is not None else con.sql(query)


def run(
    relation: duckdb.DuckDBPyRelation,
    *,
    con: duckdb.DuckDBPyConnection | None = None,
    runner: RunnerKind | None = None,
    raise_on_fail: bool | None = None,
    config: Config | None = None,
) -> duckdb.DuckDBPyRelation:
    """Run a relation built with DuckDB's relational API (``con.table("t").filter(...)``)
    distributed with shoal, through its SQL (``relation.sql_query()``); a lazy
    ``DistRelation`` as :func:`sql` returns.

    ``con`` is the relation's connection (found from the relation when None). Other
    arguments, the result and the errors are those of :func:`sql`; a relation without SQL
    text (over a Python object) counts as untranslatable.
    """
    connection = con if con is not None else getattr(relation, "_con", None)
    if connection is None:
        raise ValueError("run(): pass con=, the relation's connection")
    try:
        query = relation.sql_query()
    except Exception as exc:  # pragma: no cover - depends on DuckDB's relation kinds
        reason = UnsupportedError(f"the relation has no SQL form ({exc})")
        if _should_raise(raise_on_fail, config):
            raise reason from exc
        warnings.warn(
            f"shoal: running the relation on DuckDB itself: {reason}",
            DuckDBFallbackWarning,
            stacklevel=_user_stacklevel(),
        )
        return relation
    return sql(
        query, connection=connection, runner=runner, raise_on_fail=raise_on_fail, config=config
    )


def explain(
    con: duckdb.DuckDBPyConnection,
    query: str,
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    analyze: bool = False,
    format: Literal["text", "mermaid"] = "text",
) -> str:
    """The settings, logical plan (shoal IR) and physical plan (stages and exchanges) that
    shoal would run for ``query``, as :func:`shoal.explain` gives them; nothing runs unless
    ``analyze=True``, which runs the query and adds its per-stage profile (as DuckDB's
    ``EXPLAIN ANALYZE`` does); ``format="mermaid"`` gives the stage graph.

    For a query that :func:`sql` would run on DuckDB itself, the text says so and gives
    every reason, as the fallback warning does (nothing raises). DuckDB's own errors for
    bad input (``ParserException``, ``CatalogException``, ``BinderException``) propagate.
    """
    from shoal.api import explain as explain_ir

    frame = _caller_frame()
    return explain_ir(
        query,
        runner=runner,
        config=config,
        to_ir=lambda q: _to_ir(con, q, frame),
        analyze=analyze,
        format=format,
    )
