"""Row-wise DuckDB expressions that the adapter cannot say in the IR run on DuckDB in the
tasks (``SqlMap``), distributed and exact: each query is compared with native DuckDB
(``con.sql(q)``): the same column types and the same rows, on a table split into three
partitions with NULLs, NaN, -0.0, empty lists and a partition that a filter empties.

Every query here fell back to DuckDB on the driver before (``raise_on_fail=True`` raised
``UnsupportedError``); the tests also check that the plan holds a ``SqlMap``. Local runner,
except the last test (Ray).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest

import shoal
from shoal.errors import PlanError, UnsupportedError
from shoal.execution.foreign import run_sql_map
from shoal.ir import InMemorySource, Scan, Schema, SqlMap, explain, from_json, to_json
from shoal.ir.types import DataType
from shoal.plan.validate import validate

CONFIG = shoal.Config(
    runner="local", default_partitions=3, shuffle_partitions=3, target_partition_bytes=256
)


def _norm(v: Any) -> Any:
    """A value that compares as DuckDB's results should: NaN equal to NaN, -0.0 apart."""
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else repr(v))
    if isinstance(v, list | tuple):
        return type(v)(_norm(x) for x in v)
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    return v


def check(
    con: duckdb.DuckDBPyConnection,
    query: str,
    ordered: bool = False,
    config: shoal.Config = CONFIG,
    sql_maps: int = 1,
) -> None:
    """``query`` with shoal (no fallback) and with DuckDB: the same names, DuckDB types and
    rows (as multisets unless ``ordered``); the plan has at least ``sql_maps`` SqlMap
    nodes and is valid."""
    plan = shoal.duckdb.to_ir(con, query)
    validate(plan)
    assert sum(isinstance(n, SqlMap) for n in plan.walk()) >= sql_maps, explain(plan)
    got_rel = shoal.duckdb.sql(con, query, raise_on_fail=True, config=config)
    want_rel = con.sql(query)
    assert got_rel.columns == want_rel.columns
    assert [str(t) for t in got_rel.types] == [str(t) for t in want_rel.types]
    got = [_norm(r) for r in got_rel.fetchall()]
    want = [_norm(r) for r in want_rel.fetchall()]
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    """Table t (30 rows, 3 partitions): i with NULLs, d with NaN, -0.0, NULL, s with
    NULLs and unicode, l lists with NULL elements, empty and NULL lists, st a struct.
    Rows 10..19 (the middle partition) have g = 'empty', which filters remove."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE t AS
        SELECT r AS id,
               CASE WHEN r % 7 = 3 THEN NULL ELSE (r * 37) % 23 - 5 END::INTEGER AS i,
               CASE r % 6 WHEN 0 THEN 'nan'::DOUBLE WHEN 1 THEN -0.0 WHEN 2 THEN NULL
                          ELSE r / 4.0 - 3 END::DOUBLE AS d,
               CASE WHEN r % 5 = 4 THEN NULL ELSE 'wörd' || r || '-x' || (r % 3) END AS s,
               CASE r % 8 WHEN 0 THEN NULL WHEN 1 THEN []::BIGINT[]
                          WHEN 2 THEN [NULL, 2]::BIGINT[] ELSE [r, r % 4, 7] END AS l,
               {'a': r % 3, 'b': 'q' || r} AS st,
               CASE WHEN r BETWEEN 10 AND 19 THEN 'empty' ELSE 'keep' END AS g
        FROM range(30) r(r)"""
    )
    return c


FUNCTIONS = [
    "SELECT id, list_reduce(l, lambda x, y: x + y + coalesce(i, 0)) AS r FROM t WHERE len(l) > 0",
    "SELECT id, list_transform(l, lambda x, k: x * k + i) AS r, "
    "list_filter(l, lambda x: x % 2 = 0) AS f FROM t",
    "SELECT id, printf('%5.2f|%s|%d', d, s, i) AS p FROM t WHERE g = 'keep'",
    "SELECT id, instr(s, '1') AS a, damerau_levenshtein(s, 'wörd12') AS b, "
    "regexp_extract_all(s, '[0-9]') AS c, substring_grapheme(s, 2, 3) AS e FROM t",
    "SELECT id, trunc(d) AS a, list_position(l, 7) AS b, list_sort(l, 'DESC') AS c, "
    "list_intersect(l, [2, 7, 9]) AS e FROM t",
    "SELECT id, {'k': i, 'v': [d, NULL]} AS s1, row(i, s) = row(3, 'x') AS eq FROM t",
]


@pytest.mark.parametrize("query", FUNCTIONS)
def test_select_list_runs_on_duckdb(con: duckdb.DuckDBPyConnection, query: str) -> None:
    check(con, query)


def test_where_clause(con: duckdb.DuckDBPyConnection) -> None:
    """An untranslatable predicate: DuckDB computes a Boolean column, an IR filter keeps
    its rows (the middle partition ends up empty)."""
    check(
        con,
        "SELECT id, s FROM t WHERE g = 'keep' AND (list_position(l, 7) IS NOT NULL "
        "OR instr(s, '2') > 0)",
    )


def test_group_by_key_and_aggregate_argument(con: duckdb.DuckDBPyConnection) -> None:
    """A GROUP BY key (create_sort_key, as DuckDB plans ORDER BY inside a group key) and
    an aggregate's argument computed by DuckDB, aggregated in two phases by shoal."""
    check(con, "SELECT trunc(d) AS k, count(*) AS n, sum(i) AS s FROM t GROUP BY 1")
    check(
        con,
        "SELECT g, sum(list_reduce(l, lambda x, y: x * y)) AS p, "
        "max(printf('%s/%d', s, i)) AS m FROM t WHERE len(l) > 1 GROUP BY g",
    )


def test_queries_without_a_table(con: duckdb.DuckDBPyConnection) -> None:
    # DuckDB's optimizer folds this one into a constant: no SqlMap needed.
    check(con, "SELECT list_reduce([1, 2, 3, 4], lambda x, y: x * y) AS r", sql_maps=0)
    check(con, "SELECT {'a': 1, 'b': [1.5, NULL, 'nan'::DOUBLE, -0.0]} AS s")
    check(con, "SELECT printf('%05.1f', -0.0::DOUBLE) AS p, instr('abc', 'c') AS q", sql_maps=0)
    # A projection over DuckDB's one-row dummy scan, no column read.
    check(con, "SELECT row(1, 'a') = row(1, 'a') AS eq, [{'a': 1}] AS s")


def test_values_lists_of_constants_the_ir_cannot_carry(con: duckdb.DuckDBPyConnection) -> None:
    """A VALUES list with STRUCT constants is evaluated by DuckDB on the driver: an
    in-memory scan of DuckDB's own values, then distributed as usual."""
    query = (
        "SELECT v.k, v.s, v.s.a + t.id AS x FROM (VALUES ({'a': 1.5, 'b': [1, NULL]}, 1), "
        "({'a': NULL, 'b': []}, 2), (NULL, 3)) v(s, k) JOIN t ON t.id % 4 = v.k"
    )
    check(con, query, sql_maps=0)


def test_constants_keep_type_and_value(con: duckdb.DuckDBPyConnection) -> None:
    """Constants that the IR cannot carry are written back as DuckDB SQL exactly (checked
    against DuckDB's own folding before use)."""
    check(
        con,
        "SELECT id, [{'x': 1.5::DECIMAL(9,2), 'y': TIMESTAMP '2024-02-29 12:34:56.789'}] AS c, "
        "{'h': 170141183460469231731687303715884105727::HUGEINT, 'f': 0.1::FLOAT} AS h, "
        "list_transform(l, lambda x: DATE '1900-03-01' + x::INTEGER) AS dates FROM t",
    )


def test_settings_follow_the_session() -> None:
    """The user's session settings that change results (TimeZone, default_order) are the
    task's DuckDB session's too."""
    c = duckdb.connect()
    c.execute("SET TimeZone = 'America/New_York'")
    c.execute("SET default_order = 'DESC'")
    c.execute("CREATE TABLE z AS SELECT r, [r, 30 - r, r % 5] AS l FROM range(30) t(r)")
    check(
        c,
        "SELECT r, list_sort(l) AS s, list_transform(l, lambda x: "
        "(TIMESTAMPTZ '2024-03-10 06:00:00+00' + to_hours(x))::VARCHAR) AS w FROM z",
    )


def test_no_computing_in_tasks_under_a_default_collation() -> None:
    """Under ``default_collation`` DuckDB's plan already holds the collation as functions,
    and ``list_sort`` applies it by itself: refused (it sorted case-sensitively)."""
    c = duckdb.connect()
    c.execute("SET default_collation = 'nocase'")
    c.execute(
        "CREATE TABLE cl AS SELECT 'Ab' || r AS s, ['B', 'a', 'C' || r] AS l FROM range(6) t(r)"
    )
    with pytest.raises(UnsupportedError, match="list_sort"):
        shoal.duckdb.sql(c, "SELECT s, list_sort(l) FROM cl", raise_on_fail=True, config=CONFIG)


def test_errors_keep_duckdb_classes(con: duckdb.DuckDBPyConnection) -> None:
    """Where DuckDB raises inside a task, the query raises DuckDB's class."""
    query = "SELECT printf('%d', s) FROM t"
    with pytest.raises(duckdb.InvalidInputException):
        con.sql(query).fetchall()
    with pytest.raises(duckdb.InvalidInputException) as info:
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG).fetchall()
    assert isinstance(info.value, shoal.TaskError)


#: Expressions the adapter refuses to re-express (its rule would differ from DuckDB's)
#: that DuckDB computes in the tasks: DuckDB raises there as natively, with its class.
RAISED_IN_TASKS = [
    "SELECT time_bucket('-1 month'::INTERVAL, ts::DATE) a FROM tb",
    "SELECT regexp_replace(s, '(b)', '\\3Y', 'g') a FROM tb",
    "SELECT time_bucket('3 months'::INTERVAL, ts::DATE, '2000000000 months'::INTERVAL) a FROM tb",
    "SELECT ts::DATE::BIGINT a FROM tb",
    # was refused ("string index"): a string index beyond 2**32 is DuckDB's OutOfRange
    "SELECT array_extract(s, 9223372036854775807) a FROM tb",
]


@pytest.mark.parametrize("query", RAISED_IN_TASKS)
def test_duckdb_raises_in_the_tasks_as_natively(query: str) -> None:
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE tb AS SELECT 'ab' || i AS s, TIMESTAMP '2024-01-01' + i * INTERVAL 5 HOUR "
        "AS ts FROM range(20) r(i)"
    )
    with pytest.raises(duckdb.Error) as native:
        c.sql(query).fetchall()
    with pytest.raises(type(native.value)) as got:
        shoal.duckdb.sql(c, query, raise_on_fail=True, config=CONFIG).fetchall()
    assert isinstance(got.value, shoal.TaskError)


def test_list_ordering_comparison_across_a_join() -> None:
    """``<`` of two LIST values (the kernel cannot order lists) over a cross join."""
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE lt AS SELECT i, CASE i % 4 WHEN 0 THEN NULL WHEN 1 THEN [] "
        "ELSE [i % 3, NULL, i] END AS l FROM range(12) r(i)"
    )
    check(c, "SELECT a.i, b.i AS j, a.l < b.l AS lt, a.l >= b.l AS ge FROM lt a, lt b")


def test_sum_of_booleans(con: duckdb.DuckDBPyConnection) -> None:
    """``SUM(<Boolean>)`` counts the trues (the kernel failed to cast a Boolean to the
    DECIMAL(38, 0) of DuckDB's sum)."""
    check(
        con,
        "SELECT g, SUM(i > 2) AS a, SUM(i IS NULL) AS b, SUM(d > 0) AS c FROM t GROUP BY g",
        sql_maps=0,
    )


def test_exported_aggregate_states_are_refused() -> None:
    """``agg(...) EXPORT_STATE`` is DuckDB's internal state: it was read as the aggregate's
    value (a wrong answer once VALUES of STRUCTs ran distributed)."""
    c = duckdb.connect()
    for query in (
        'SELECT (arg_min(a, b) EXPORT_STATE)::STRUCT(arg STRUCT(x INTEGER), "by" INTEGER) '
        "FROM (VALUES ({'x': 1}, 10), ({'x': 2}, 5)) t(a, b)",
        "SELECT (first(NULL::INTEGER) EXPORT_STATE)::STRUCT(value INTEGER)",
    ):
        with pytest.raises(UnsupportedError, match="EXPORT_STATE"):
            shoal.duckdb.sql(c, query, raise_on_fail=True, config=CONFIG)


def test_what_cannot_run_in_tasks_still_falls_back(con: duckdb.DuckDBPyConnection) -> None:
    """Volatile functions, the user's Python functions and results the IR cannot carry
    are refused with the reason, as before."""
    for query in (
        "SELECT list_transform(l, lambda x: x + random()) FROM t",
        "SELECT list_transform(l, lambda x: x * 2) AS l2, now() - INTERVAL 1 DAY > "
        "TIMESTAMPTZ '2000-01-01 00:00:00+00' AS b FROM t WHERE list_reduce(l, "
        "lambda x, y: x + y) > nextval('sq')",
        "SELECT list_transform(l, lambda x: to_days(x)) FROM t",
    ):
        with pytest.raises((UnsupportedError, duckdb.CatalogException)):
            shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    c = duckdb.connect()
    c.create_function("twice", lambda x: 2 * x, ["BIGINT"], "BIGINT")  # type: ignore[list-item]
    c.execute("CREATE TABLE u AS SELECT [r, r + 1] AS l FROM range(5) t(r)")
    with pytest.raises(UnsupportedError, match="twice"):
        shoal.duckdb.sql(
            c, "SELECT list_transform(l, lambda x: twice(x)) FROM u", raise_on_fail=True
        )


def test_time_24_00_is_refused_not_read_as_null() -> None:
    """DuckDB's TIME '24:00:00' read from a table: the kernel (Polars) reads it as NULL,
    so such a scan falls back instead of answering NULL."""
    c = duckdb.connect()
    c.execute("CREATE TABLE tm AS SELECT * FROM (VALUES (TIME '12:00:00'), (TIME '24:00:00')) v(x)")
    query = "SELECT x FROM tm"
    with pytest.raises(UnsupportedError, match="24:00:00"):
        shoal.duckdb.sql(c, query, raise_on_fail=True, config=CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = shoal.duckdb.sql(c, query, raise_on_fail=False, config=CONFIG).fetchall()
    assert sorted(map(str, got)) == sorted(map(str, c.sql(query).fetchall()))
    # The constant (DuckDB folds make_time(24, 0, 0) into one) read as 00:00:00 before.
    for query in ("SELECT x, TIME '24:00:00' AS y FROM tm", "SELECT make_time(24, 0, 0) FROM tm"):
        with pytest.raises(UnsupportedError, match="24:00:00"):
            shoal.duckdb.sql(c, query, raise_on_fail=True, config=CONFIG)


# ---------------------------------------------------------------- the node itself


def _scan() -> Scan:
    table = pa.table({"a": [1, None, 3, 4], "s": ["x", "y", None, "w"]})
    return Scan(InMemorySource(table), Schema.from_arrow(table.schema))


def test_node_serde_explain_and_execution() -> None:
    scan = _scan()
    node = SqlMap(
        scan,
        'SELECT "a" * 2 AS "b", printf(\'%s-%d\', "s", "a") AS "p" FROM shoal_input',
        ("a", "s"),
        Schema.of(
            [*scan.schema.fields, ("b", DataType(pa.int64())), ("p", DataType(pa.large_string()))]
        ),
        settings=(("TimeZone", "UTC"),),
    )
    validate(node)
    assert "printf" in explain(node) and "TimeZone='UTC'" in explain(node)
    table = scan.source.table  # type: ignore[union-attr]
    assert from_json(to_json(node, tables={"t": table}), tables={"t": table}) == node
    out = shoal.execute(node, config=CONFIG)
    native = duckdb.connect()
    native.register("tbl", table)
    want = native.sql("SELECT a, s, a * 2 AS b, printf('%s-%d', s, a) AS p FROM tbl")
    assert out.to_pylist() == want.to_arrow_table().to_pylist()


def test_node_checks_types_and_row_count() -> None:
    """DuckDB's result must have the declared types and one row per input row: otherwise
    a clear error naming the node (at validation, and in a task)."""
    scan = _scan()
    wrong_type = SqlMap(
        scan,
        'SELECT "a" * 2 AS "b" FROM shoal_input',
        ("a",),
        Schema.of([*scan.schema.fields, ("b", DataType(pa.int32()))]),
    )
    with pytest.raises(PlanError, match="SqlMap"):
        validate(wrong_type)
    frame = pl.DataFrame({"a": [1, 2], "s": ["x", "y"]})
    with pytest.raises(PlanError, match="declares int32"):
        run_sql_map(wrong_type, frame)
    not_row_wise = SqlMap(
        scan,
        'SELECT "a" AS "b" FROM shoal_input WHERE "a" > 1',
        ("a",),
        Schema.of([*scan.schema.fields, ("b", DataType(pa.int64()))]),
    )
    with pytest.raises(PlanError, match="row-wise"):
        run_sql_map(not_row_wise, frame)


# ---------------------------------------------------------------- on Ray


def test_on_ray(ray_runner: None, con: duckdb.DuckDBPyConnection) -> None:
    """Through Ray workers: each worker process opens its own DuckDB database."""
    ray = CONFIG.replace(runner="ray")
    check(con, FUNCTIONS[0], config=ray)
    check(con, "SELECT g, max(printf('%s/%d', s, i)) AS m FROM t GROUP BY g", config=ray)


def test_text_to_time_casts_run_on_duckdb() -> None:
    """Polars cannot cast text to TIME at all (the task failed with InvalidOperationError
    where DuckDB answers): the cast is computed by DuckDB in the tasks, with DuckDB's
    ConversionException for a bad value and NULL for TRY_CAST."""
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE tt AS SELECT * FROM (VALUES ('01:02:03.5'), ('12:00:00'), (NULL), "
        "('23:59:59.999999'), ('00:00:00'), ('x')) v(s)"
    )
    good = "SELECT s, s::TIME AS t FROM tt WHERE s <> 'x'"
    want = sorted(c.sql(good).fetchall(), key=repr)
    got = shoal.duckdb.sql(c, good, raise_on_fail=True, config=CONFIG).fetchall()
    assert sorted(got, key=repr) == want
    tried = "SELECT s, TRY_CAST(s AS TIME) AS t FROM tt"
    want = sorted(c.sql(tried).fetchall(), key=repr)
    got = shoal.duckdb.sql(c, tried, raise_on_fail=True, config=CONFIG).fetchall()
    assert sorted(got, key=repr) == want
    with pytest.raises(duckdb.ConversionException):
        c.sql("SELECT s::TIME AS t FROM tt").fetchall()
    with pytest.raises(duckdb.ConversionException):
        shoal.duckdb.sql(c, "SELECT s::TIME AS t FROM tt", raise_on_fail=True, config=CONFIG)
