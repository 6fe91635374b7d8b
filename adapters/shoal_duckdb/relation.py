"""DuckDB-shaped results and connections: :class:`DistRelation`, :class:`DistConnection`,
:func:`connect`, :func:`install`.

DuckDB's Python API lets nobody plug an executor into a connection: there is no hook to
register a table function or an optimizer extension from Python (``create_function``
registers scalar functions only), and ``DuckDBPyConnection`` and ``DuckDBPyRelation``
cannot be subclassed (their constructors are not exposed). So shoal wraps: a
:class:`DistConnection` forwards everything to the DuckDB connection it wraps, except that
its ``sql()``/``query()``/``execute()``/``table()``/``view()`` run SELECTs through shoal and
return :class:`DistRelation` objects, which behave like DuckDB's lazy relations.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import duckdb

if TYPE_CHECKING:
    import pyarrow as pa

    from shoal.config import Config, RunnerKind
    from shoal.ir.nodes import PlanNode
    from shoal.result import QueryResult
    from shoal_duckdb.api import _Shape


class DistRelation:
    """A SELECT that shoal will run distributed: the lazy result of
    :func:`shoal_duckdb.sql` (and of a :class:`DistConnection`'s ``sql()``).

    Like a ``duckdb.DuckDBPyRelation`` it holds a bound query, not its rows: ``columns``,
    ``types``, ``dtypes``, ``alias`` and :meth:`sql_query` need no run. The query runs with
    shoal the first time the relation is read, and only then; later reads reuse that
    result. A DuckDB relation runs its query again at every read; a ``DistRelation`` does
    not see changes made to the connection's tables after it was made (the rows of DuckDB
    tables and Python objects are taken when the query is translated; files are read when
    it runs). Every reading method of
    DuckDB's relations works, on the ``duckdb.DuckDBPyRelation`` of the result
    (:meth:`materialize`): ``fetchall``, ``fetchmany``, ``fetchnumpy``, ``df``/``fetchdf``,
    ``pl``, ``arrow`` (a ``pyarrow.RecordBatchReader``), ``to_arrow_table``,
    ``fetch_arrow_table``, ``fetch_record_batch``, ``show``, ``shape``, ``write_parquet``,
    ``to_table``, and the relational methods (``filter``, ``order``, ``aggregate``,
    ``join``, ...), which DuckDB then applies to the result on the driver. It is also an
    Arrow C stream (``__arrow_c_stream__``): ``polars.DataFrame(rel)``, ``pyarrow.table(rel)``
    and DuckDB's replacement scans (``con.sql("SELECT * FROM rel")``) read it.
    :meth:`to_ray_dataset` hands the result to Ray Data without the driver.

    A task's error (a failed cast, an overflow) is raised when the relation is first read,
    as DuckDB raises it when its relation is read: a ``shoal.TaskError`` that is also
    DuckDB's exception class.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        query: str,
        plan: PlanNode,
        shape: _Shape,
        runner: RunnerKind | None,
        config: Config | None,
    ) -> None:
        self._con = con
        self._query = query
        self.plan = plan
        self._shape = shape
        self._runner = runner
        self._config = config
        self._result: QueryResult | None = None
        self._relation: duckdb.DuckDBPyRelation | None = None
        self._arrow: pa.Table | None = None

    @property
    def columns(self) -> list[str]:
        """The result's column names (DuckDB's), without running the query."""
        return list(self._shape.columns)

    @property
    def types(self) -> list[Any]:
        """The result's DuckDB types, without running the query."""
        return list(self._shape.types)

    @property
    def dtypes(self) -> list[Any]:
        """The result's DuckDB types (DuckDB's alias of :attr:`types`)."""
        return self.types

    @property
    def alias(self) -> str:
        """A name for the relation (as DuckDB's ``alias``)."""
        return f"shoal_{id(self):x}"

    def sql_query(self) -> str:
        """The SQL text of the query (as given, with parameter values written in)."""
        return self._query

    def explain(self) -> str:
        """shoal's plans for the query (as :func:`shoal_duckdb.explain`); nothing runs."""
        from shoal.api import explain

        return explain(self.plan, runner=self._runner, config=self._config)

    def result(self) -> QueryResult:
        """Run the query (once) and return shoal's :class:`shoal.QueryResult`, which
        leaves the data where the tasks put it (column names are the plan's: ``c0``,
        ``c1``, ... when the result has duplicate names; types are shoal's)."""
        if self._result is None:
            from shoal_duckdb.api import _execute_result

            self._result = _execute_result(self.plan, self._runner, self._config)
        return self._result

    def materialize(self) -> duckdb.DuckDBPyRelation:
        """Run the query (once) and return the ``duckdb.DuckDBPyRelation`` that holds the
        result on the connection, with DuckDB's own column names and types."""
        if self._relation is None:
            from shoal_duckdb.api import _result_relation

            self._relation = _result_relation(self._con, self.result().to_arrow(), self._shape)
        return self._relation

    def to_ray_dataset(self) -> Any:
        """Run the query (once) and return the result as a ``ray.data.Dataset`` (see
        :meth:`shoal.QueryResult.to_ray_dataset`: no row passes through the driver with
        the Ray runner). Names and types are those of :meth:`result`."""
        return self.result().to_ray_dataset()

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        if self._arrow is None:
            from shoal_duckdb.api import _result_relation

            table = self.result().to_arrow()
            try:
                self._arrow = _result_relation(self._con, table, self._shape).to_arrow_table()
            except duckdb.Error:
                # A replacement scan on the relation's own connection reads this stream while
                # that connection runs its query, and DuckDB refuses to use it (or a cursor
                # of it) then: DuckDB's casts run on a connection of their own.
                with duckdb.connect() as other:
                    self._arrow = _result_relation(other, table, self._shape).to_arrow_table()
        return self._arrow.__arrow_c_stream__(requested_schema)

    def __getattr__(self, name: str) -> Any:
        # Only DuckDB's relation methods run the query: readers probe other names (DuckDB's
        # replacement scan asks for ``schema``), which must not.
        if name.startswith("__") or not hasattr(duckdb.DuckDBPyRelation, name):
            raise AttributeError(f"'DistRelation' object has no attribute {name!r}")
        return getattr(self.materialize(), name)

    def __len__(self) -> int:
        return self.result().num_rows

    def __repr__(self) -> str:
        return repr(self.materialize())

    def __str__(self) -> str:
        return str(self.materialize())


class DistConnection:
    """A DuckDB connection whose queries run distributed with shoal: what
    :func:`connect` and :func:`install` return.

    ``sql(query, params=None)`` and ``query(...)`` return a lazy :class:`DistRelation` for
    a SELECT; any other statement (``CREATE``, ``INSERT``, ``SET``, ...) runs on DuckDB
    itself at once, as it would on the wrapped connection (no warning: there is nothing to
    distribute). ``execute(query, parameters=None)`` runs a SELECT with shoal and keeps its
    result for ``fetchone()``, ``fetchmany()``, ``fetchall()``, ``df()``, ``pl()``,
    ``fetchnumpy()``, ``arrow()`` and ``fetch_arrow_table()`` on this object, as DuckDB's
    cursor does; other statements go to DuckDB. ``table(name)`` and ``view(name)`` are
    ``SELECT * FROM name``. ``cursor()`` wraps a cursor of the same database. Everything
    else (``register``, ``create_function``, ``read_parquet``, ``close``, ...) is the
    wrapped connection's (:attr:`connection`), unchanged.
    """

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        *,
        runner: RunnerKind | None = None,
        raise_on_fail: bool | None = None,
        config: Config | None = None,
    ) -> None:
        if not isinstance(con, duckdb.DuckDBPyConnection):
            raise TypeError(f"expected a duckdb.DuckDBPyConnection, got {type(con).__name__}")
        self.connection = con
        self.runner = runner
        self.raise_on_fail = raise_on_fail
        self.config = config
        self._pending: DistRelation | None = None
        self._rows: Iterator[tuple[Any, ...]] | None = None

    def __repr__(self) -> str:
        return f"shoal.duckdb.DistConnection({self.connection!r}, runner={self.runner!r})"

    def _is_select(self, query: str) -> bool:
        statements = self.connection.extract_statements(query)
        return len(statements) == 1 and statements[0].type == duckdb.StatementType.SELECT

    def sql(self, query: str, *, alias: str = "", params: Any = None) -> Any:
        """``DuckDBPyConnection.sql``: a SELECT becomes a lazy :class:`DistRelation` (or
        DuckDB's relation after a fallback warning); other statements run on DuckDB now.
        ``alias`` is accepted for DuckDB's signature and not used."""
        if not self._is_select(query):
            return self.connection.sql(query, params=params)
        from shoal_duckdb.api import _caller_frame, _lazy_sql

        return _lazy_sql(
            self.connection, query, params, self.runner, self.raise_on_fail, self.config,
            _caller_frame(),
        )  # fmt: skip

    query = sql

    def table(self, name: str) -> Any:
        """``DuckDBPyConnection.table``: the table (or view) ``name`` as a lazy
        :class:`DistRelation`."""
        from shoal_duckdb.prepare import quote_ident

        return self.sql(f"SELECT * FROM {quote_ident(name)}")

    view = table

    def execute(self, query: str, parameters: Any = None) -> DistConnection:
        """``DuckDBPyConnection.execute``: a SELECT runs with shoal (now, as DuckDB's
        execute runs it) and its result is kept for this object's fetch methods; other
        statements run on DuckDB. Returns this connection."""
        self._pending, self._rows = None, None
        if not self._is_select(query):
            self.connection.execute(query, parameters)
            return self
        rel = self.sql(query, params=parameters)
        if isinstance(rel, DistRelation):
            rel.materialize()
        self._pending = rel
        return self

    def _result(self) -> Any:
        if self._pending is None:
            return None
        return (
            self._pending.materialize()
            if isinstance(self._pending, DistRelation)
            else self._pending
        )

    def _row_iter(self) -> Iterator[tuple[Any, ...]]:
        if self._rows is None:
            self._rows = iter(self._result().fetchall())
        return self._rows

    def fetchone(self) -> tuple[Any, ...] | None:
        """The next row of the last ``execute``'s result, or None at the end."""
        if self._pending is None:
            return self.connection.fetchone()
        return next(self._row_iter(), None)

    def fetchmany(self, size: int = 1) -> list[tuple[Any, ...]]:
        """The next ``size`` rows of the last ``execute``'s result."""
        if self._pending is None:
            return self.connection.fetchmany(size)
        rows = self._row_iter()
        return [row for _, row in zip(range(size), rows, strict=False)]

    def fetchall(self) -> list[tuple[Any, ...]]:
        """The remaining rows of the last ``execute``'s result."""
        if self._pending is None:
            return self.connection.fetchall()
        return list(self._row_iter())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if name in _RESULT_METHODS and self._pending is not None:
            return getattr(self._result(), _RESULT_METHODS[name])
        return getattr(self.connection, name)

    def cursor(self) -> DistConnection:
        """A :class:`DistConnection` over a new cursor of the same database."""
        return DistConnection(
            self.connection.cursor(),
            runner=self.runner,
            raise_on_fail=self.raise_on_fail,
            config=self.config,
        )

    def close(self) -> None:
        """Close the wrapped connection."""
        self._pending, self._rows = None, None
        self.connection.close()

    def __enter__(self) -> DistConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: A connection's fetch methods for the last ``execute``'s result, and the relation
#: methods that give them.
_RESULT_METHODS = {
    "df": "df",
    "fetchdf": "df",
    "fetch_df": "df",
    "pl": "pl",
    "fetchnumpy": "fetchnumpy",
    "arrow": "arrow",
    "to_arrow_table": "to_arrow_table",
    "fetch_arrow_table": "to_arrow_table",
    "to_arrow_reader": "to_arrow_reader",
    "fetch_record_batch": "fetch_record_batch",
}


def install(
    con: duckdb.DuckDBPyConnection,
    *,
    runner: RunnerKind | None = None,
    raise_on_fail: bool | None = None,
    config: Config | None = None,
) -> DistConnection:
    """``con`` wrapped so that its SELECTs run distributed with shoal (a
    :class:`DistConnection`; ``con`` itself is unchanged and still runs on DuckDB).
    ``runner``, ``raise_on_fail`` and ``config`` are :func:`shoal_duckdb.sql`'s."""
    return DistConnection(con, runner=runner, raise_on_fail=raise_on_fail, config=config)


def connect(
    database: str = ":memory:",
    read_only: bool = False,
    config: dict[str, Any] | None = None,
    *,
    runner: RunnerKind | None = None,
    raise_on_fail: bool | None = None,
    shoal_config: Config | None = None,
) -> DistConnection:
    """``duckdb.connect(database, read_only, config)`` (``config`` is DuckDB's settings
    dict, as there) wrapped by :func:`install`: a :class:`DistConnection` whose SELECTs
    run with shoal. ``shoal_config`` is the :class:`shoal.Config` for its queries."""
    con = duckdb.connect(database, read_only=read_only, config=config or {})
    return DistConnection(con, runner=runner, raise_on_fail=raise_on_fail, config=shoal_config)
