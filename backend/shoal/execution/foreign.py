"""The foreign kernel: a :class:`~shoal.ir.nodes.SqlMap` evaluated by DuckDB in a task.

The DuckDB frontend's expressions that the IR cannot say exactly (``list_reduce`` with a
lambda, ``printf``, STRUCT constants, ...) run on DuckDB itself, inside the task that
holds the partition: the task hands its input's columns to DuckDB as an Arrow table
(DuckDB scans Arrow without copying), runs the node's SELECT and appends the result
columns to its frame. DuckDB's per-row semantics and errors are then DuckDB's own.

One in-memory DuckDB database per process, opened on first use and reused (opening one
costs 30-300 ms; a cursor on it well under a millisecond): each run takes a cursor, sets
the node's session settings on it, registers the input and closes the cursor. DuckDB's
``threads`` (a database-wide setting) follows the task's CPUs (``task_cpus``). The
database is plain DuckDB: nothing routes its queries to shoal.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from shoal.config import get_config
from shoal.errors import PlanError, UnsupportedError
from shoal.ir.nodes import SQL_MAP_RELATION, SqlMap
from shoal.ir.types import DataType, Schema

_LOCK = threading.Lock()
_DATABASE: dict[int, Any] = {}
_THREADS: dict[int, int] = {}


def connection() -> Any:
    """This process's DuckDB database (a ``duckdb.DuckDBPyConnection``), opened on first
    use; a forked child opens its own."""
    import duckdb

    pid = os.getpid()
    with _LOCK:
        con = _DATABASE.get(pid)
        if con is None:
            _DATABASE.clear()
            _THREADS.clear()
            con = _DATABASE[pid] = duckdb.connect(":memory:")
        return con


def cursor(threads: int | None = None) -> Any:
    """A new cursor (a connection of its own) on this process's database; with
    ``threads``, DuckDB's ``threads`` setting first becomes that (it is global: the tasks
    of one process share the database). Close it after use."""
    con = connection()
    pid = os.getpid()
    with _LOCK:
        if threads is not None and _THREADS.get(pid) != threads:
            con.execute(f"SET GLOBAL threads = {int(threads)}")
            _THREADS[pid] = threads
        return con.cursor()


def quote_literal(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _input_table(node: SqlMap, frame: pl.DataFrame) -> pa.Table:
    """The ``inputs`` columns of ``frame`` as Arrow, with their IR types (the types the
    SQL was written for: a Polars ``Time`` is nanoseconds, a string a view, ...). A table
    of no columns gets one column of nulls, so that it keeps its height."""
    if not node.inputs:
        return pa.table({"__shoal_rows": pa.nulls(frame.height, pa.bool_())})
    table = frame.select(list(node.inputs)).to_arrow()
    want = Schema.of([(c, node.input.schema[c]) for c in node.inputs]).to_arrow()
    return table if table.schema == want else table.cast(want)


def run_sql_map(node: SqlMap, frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` (the rows of ``node.input`` in this partition) with the columns of
    ``node.sql`` appended, computed by DuckDB.

    Raises DuckDB's own exception classes where DuckDB raises (a failed cast, an
    overflow); :class:`shoal.PlanError` naming the node and column when DuckDB's result
    does not have the declared types or columns, or not one row per input row;
    :class:`shoal.UnsupportedError` for a dialect other than ``"duckdb"``.
    """
    if node.dialect != "duckdb":
        raise UnsupportedError(f"SqlMap: SQL dialect {node.dialect!r} (only 'duckdb' runs)")
    cur = cursor(max(1, int(get_config().task_cpus)))
    try:
        for name, value in node.settings:
            cur.execute(f"SET SESSION {name} = {quote_literal(value)}")
        cur.register(SQL_MAP_RELATION, _input_table(node, frame))
        result = cur.sql(node.sql).to_arrow_table()
    finally:
        cur.close()
    return frame.hstack(_checked(node, result, frame.height).get_columns())


#: Days from 1970-01-01 to the year 262000: the kernel's calendar (Polars) ends near there.
_CALENDAR_DAYS = int((262_000 - 1970) * 365.2425)
_UNITS_PER_DAY = {"s": 86_400, "ms": 86_400_000, "us": 86_400_000_000, "ns": 86_400 * 10**9}


def uncarried(column: pa.ChunkedArray | pa.Array) -> str | None:
    """What in ``column`` (DuckDB's result) the kernel cannot hold, or None: DuckDB's
    infinite DATE and TIMESTAMP values and values beyond the years -262000..262000 (the
    kernel would read them as other instants or panic), TIME ``24:00:00`` (the kernel
    reads it as NULL); inside lists and structs too."""
    if isinstance(column, pa.ChunkedArray):
        for chunk in column.chunks:
            found = uncarried(chunk)
            if found:
                return found
        return None
    t = column.type
    if column.null_count == len(column):
        return None
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return uncarried(column.flatten())
    if pa.types.is_struct(t):
        for i in range(t.num_fields):
            found = uncarried(column.field(i))
            if found:
                return found
        return None
    if pa.types.is_date32(t):
        raw, limit = column.cast(pa.int32()), _CALENDAR_DAYS
    elif pa.types.is_timestamp(t):
        per_day = _UNITS_PER_DAY[t.unit]
        raw, limit = column.cast(pa.int64()), min(_CALENDAR_DAYS * per_day, 2**63 - 2)
    elif pa.types.is_time(t):
        if pc.max(column.cast(pa.int64())).as_py() >= _UNITS_PER_DAY[t.unit]:
            return "TIME '24:00:00', which the kernel's TIME type cannot hold"
        return None
    else:
        return None
    if pc.max(raw).as_py() > limit or pc.min(raw).as_py() < -limit:
        return "infinite DATE or TIMESTAMP values or values beyond the years -262000..262000"
    return None


def _checked(node: SqlMap, result: pa.Table, height: int) -> pl.DataFrame:
    """DuckDB's result as a Polars frame of the declared output columns and types."""
    where = f"SqlMap ({node.dialect}) computing {list(node.outputs)}"
    names = list(node.outputs)
    if result.column_names != names:
        raise PlanError(f"{where}: the SQL gives columns {result.column_names}, not {names}")
    if result.num_rows != height:
        raise PlanError(
            f"{where}: the SQL gives {result.num_rows} rows for {height} input rows (it must "
            "be row-wise)"
        )
    fields = []
    for name, column in zip(names, result.columns, strict=True):
        declared = node.schema[name]
        got = DataType(column.type)
        if got.arrow != declared.arrow:
            raise PlanError(
                f"{where}: column {name!r} comes back from {node.dialect} as {column.type}, "
                f"but the plan declares {declared.arrow}"
            )
        problem = uncarried(column)
        if problem:
            raise UnsupportedError(f"{where}: column {name!r} holds {problem}")
        fields.append(pa.field(name, declared.arrow))
    want = pa.schema(fields)
    if result.schema != want:
        result = result.cast(want)
    df = pl.from_arrow(result)
    assert isinstance(df, pl.DataFrame)
    return df
