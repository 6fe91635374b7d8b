"""shoal.duckdb: DuckDB's semantics through the IR (each query compared with native DuckDB
on data with NULLs, NaN, infinities, duplicates and negative numbers), the fallback and
raise_on_fail, DuckDB's own errors for bad input, the relational API, and the result
relation on the caller's connection. Runs on the local runner."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shoal
import shoal_duckdb.api
from shoal.plan.validate import validate
from shoal.runners.session import last_query
from shoal.tpch.compare import assert_frames_match
from shoal_duckdb import DuckDBFallbackWarning

#: Tiny partitions: every in-memory table is split into 3 partitions.
CONFIG = shoal.Config(runner="local", default_partitions=3, target_partition_bytes=1024)

T_ROWS = """
(1, -7, 2, 1.5::DOUBLE, 12.25::DECIMAL(10,2), 'apple', DATE '2024-01-31', true, 'g1', 100::BIGINT),
(2, 7, -2, 'nan'::DOUBLE, -3.35, 'Apple pie', DATE '2023-12-31', false, 'g1', 200),
(3, NULL, 3, NULL, NULL, NULL, NULL, NULL, 'g2', NULL),
(4, -8, 3, -2.5, 0.05, 'a%b_c', DATE '2020-02-29', true, 'g2', 9223372036854775807),
(5, 9, 4, 'inf'::DOUBLE, 99.99, 'line1
line2', DATE '1999-03-01', NULL, 'g3', 1),
(6, 9, 4, 2.5, 1.25, 'banana', DATE '2024-03-15', false, NULL, 1),
(7, 0, 5, 3.5, -1.25, '', DATE '2024-02-29', true, 'g4', NULL),
(8, NULL, 1, 'nan'::DOUBLE, NULL, 'x', DATE '2000-01-01', true, 'g4', NULL),
(9, 9, 4, 2.5, 1.25, 'banana', DATE '2024-03-15', false, NULL, 1)
"""


@pytest.fixture(scope="module")
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    """Table t (every kind of awkward value, a duplicated row) and u (join keys with NULL
    and duplicates)."""
    c = duckdb.connect()
    c.execute(
        f"CREATE TABLE t AS SELECT * FROM (VALUES {T_ROWS}) v(id, a, b, x, d, s, dt, flag, g, big)"
    ).fetchall()
    c.execute(
        "CREATE TABLE u AS SELECT * FROM (VALUES (1, 'one'), (NULL, 'null'), (9, 'nine'), "
        "(9, 'nine again'), (-8, 'm8'), (42, 'none')) v(k, name)"
    ).fetchall()
    yield c
    c.close()


def _shoal(con: duckdb.DuckDBPyConnection, query: str) -> pl.DataFrame:
    return shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG).pl()


def check(
    con: duckdb.DuckDBPyConnection, query: str, sort_keys: list[tuple[str, bool]] | None = None
) -> pl.DataFrame:
    """Run ``query`` with shoal and DuckDB; assert the same names, types and rows, and that
    the IR is valid (every expression typed as the kernel types it)."""
    validate(shoal.duckdb.to_ir(con, query))
    got = _shoal(con, query)
    expected = con.sql(query).pl()
    assert_frames_match(got, expected, sort_keys)
    return got


SEMANTICS = {
    "integer division": "SELECT id, a / b AS q, a // b AS d, a % b AS m FROM t",
    "constants without FROM": "SELECT 7 / 2 AS x, 7 // 2 AS y, -7 % 3 AS z, -7 // 2 AS w",
    "checked integer arithmetic": "SELECT id, big - 1 AS b1, a + b AS ab, a * b AS m FROM t",
    "count(*) vs count(x)": "SELECT count(*) AS n, count(a) AS na, count(DISTINCT a) AS da, "
    "count(DISTINCT s) AS ds, count(x) AS nx FROM t",
    "grouped counts and sums": "SELECT g, count(*) AS n, count(a) AS na, sum(a) AS sa, "
    "sum(big) AS sb, min(s) AS mn, max(dt) AS mx FROM t GROUP BY g",
    "sum widening and averages": "SELECT sum(a) AS s, sum(big) AS sb, sum(x) AS sx, "
    "sum(d) AS sd, avg(a) AS aa, avg(d) AS ad, avg(x) AS ax FROM t",
    "sum of no rows is NULL": "SELECT sum(a) AS s, count(a) AS n, avg(a) AS m FROM t "
    "WHERE id > 100",
    "decimal arithmetic": "SELECT id, d * d AS p, d + 1.5 AS s, d * 3 AS m, d - d AS z, "
    "round(d, 1) AS r, d::INTEGER AS i, -d AS n, d::DECIMAL(5,1) AS narrow, d % 2 AS md "
    "FROM t",
    "double casts round": "SELECT id, x::INTEGER AS i, x::DECIMAL(6,1) AS dc, round(x) AS r "
    "FROM t WHERE isfinite(x)",
    "LIKE and ILIKE": "SELECT id, s LIKE 'a%' AS a1, s LIKE '%e' AS a2, s LIKE '%pp%' AS a3, "
    "s LIKE 'a_p%' AS a4, s LIKE 'a%e' AS a5, s LIKE '%' AS a6, s LIKE '_' AS a7, "
    "s ILIKE 'APP%' AS a8, s NOT LIKE '%a%' AS a9, s LIKE 'a\\%b%' ESCAPE '\\' AS a10, "
    "s LIKE 'line1%' AS a11, s LIKE 'apple' AS a12, s LIKE 'l%2' AS a13, "
    "s ILIKE '%PIE' AS a14 FROM t",
    "IN lists with NULL": "SELECT id, a IN (1, 9, NULL) AS i1, a IN (9, -8) AS i2, "
    "a NOT IN (9, -8) AS i3, s IN ('x', 'apple') AS i4 FROM t",
    "CASE, COALESCE, BETWEEN": "SELECT id, CASE WHEN a > 0 THEN 'pos' WHEN a < 0 THEN 'neg' "
    "END AS c, coalesce(a, b, 0) AS co, a BETWEEN -8 AND 7 AS bt, nullif(a, 9) AS ni FROM t",
    "date arithmetic": "SELECT id, dt + 5 AS p, dt - DATE '2020-01-01' AS diff, "
    "dt + INTERVAL 1 MONTH AS m, dt - INTERVAL 3 DAY AS d3, extract(year FROM dt) AS y, "
    "month(dt) AS mo, dayofweek(dt) AS dw, date_trunc('month', dt) AS tr, "
    "dt + INTERVAL '1 year 2 months 3 days' AS mix FROM t",
    "string functions": "SELECT id, upper(s) AS u, lower(s) AS l, length(s) AS n, "
    "substring(s, 2, 3) AS sub, concat(s, g) AS c1, s || g AS c2, "
    "trim('  ' || s || ' ') AS tr, replace(s, 'a', 'A') AS rp, left(s, 2) AS lf FROM t",
    "boolean logic": "SELECT id, flag AND a > 0 AS x1, flag OR a > 0 AS x2, NOT flag AS x3 FROM t",
    "NaN compares equal and largest": "SELECT id, x = x AS e, x > 1e308 AS g, x < 2 AS l, "
    "x IS DISTINCT FROM 1.5 AS df FROM t",
    "NaN and NULL groups": "SELECT x, count(*) AS n FROM t GROUP BY x",
    "statistics": "SELECT stddev_samp(x) AS s1, var_pop(a) AS v, median(a) AS md FROM t "
    "WHERE isfinite(x)",
    "bool and any_value": "SELECT g, bool_and(flag) AS ba, bool_or(flag) AS bo FROM t GROUP BY g",
    "aggregate FILTER": "SELECT count(*) FILTER (WHERE a > 0) AS c, sum(a) FILTER "
    "(WHERE flag) AS s FROM t",
    "VALUES": "SELECT * FROM (VALUES (1, 'a'), (2, NULL)) v(p, q)",
    "greatest and least": "SELECT id, greatest(a, b) AS g, least(a, b) AS l, abs(a) AS ab FROM t",
    "inner join, NULL keys and duplicates": "SELECT t.id, u.name FROM t JOIN u ON t.a = u.k",
    "left join": "SELECT t.id, u.name FROM t LEFT JOIN u ON t.a = u.k",
    "right join": "SELECT t.id, u.name FROM t RIGHT JOIN u ON t.a = u.k",
    "full join": "SELECT t.id, u.name, u.k FROM t FULL JOIN u ON t.a = u.k",
    "IS NOT DISTINCT FROM join": "SELECT t.id, u.name FROM t JOIN u "
    "ON t.a IS NOT DISTINCT FROM u.k",
    "non-equi join": "SELECT t.id, u.k FROM t JOIN u ON t.a = u.k AND t.b < u.k",
    "EXISTS": "SELECT id FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.k = t.a)",
    "NOT EXISTS": "SELECT id FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.k = t.a)",
    "IN subquery": "SELECT id FROM t WHERE a IN (SELECT k FROM u)",
    "NOT IN subquery with a NULL": "SELECT id FROM t WHERE a NOT IN (SELECT k FROM u)",
    "NOT IN subquery without NULL": "SELECT id FROM t WHERE a NOT IN "
    "(SELECT k FROM u WHERE k IS NOT NULL)",
    "IN subquery as a value": "SELECT id, a IN (SELECT k FROM u) AS m FROM t",
    "correlated scalar subquery": "SELECT id, (SELECT max(k) FROM u WHERE u.k < t.b) AS mk FROM t",
    "uncorrelated scalar subquery": "SELECT id, (SELECT max(k) FROM u) AS mk FROM t",
    "correlated scalar subquery without aggregate (single join)": "SELECT id, (SELECT name "
    "FROM u WHERE u.k = t.a AND name <> 'nine again') AS n FROM t",
    "correlated count(*) subquery": "SELECT id, (SELECT count(*) FROM u WHERE u.k = t.a) AS n "
    "FROM t",
    "scalar subquery with LIMIT": "SELECT id, (SELECT name FROM u ORDER BY k DESC, name LIMIT 1) "
    "AS n FROM t",
    "UNION": "SELECT a FROM t UNION SELECT k FROM u",
    "UNION ALL": "SELECT a FROM t UNION ALL SELECT k FROM u",
    "EXCEPT": "SELECT a FROM t EXCEPT SELECT k FROM u",
    "INTERSECT": "SELECT a FROM t INTERSECT SELECT k FROM u",
    "DISTINCT": "SELECT DISTINCT a, g FROM t",
    "GROUP BY without aggregates": "SELECT g FROM t GROUP BY g",
    "ROLLUP": "SELECT g, flag, sum(a) AS s, count(*) AS n FROM t GROUP BY ROLLUP (g, flag)",
    "GROUPING SETS": "SELECT g, flag, sum(a) AS s, grouping(g) AS gg FROM t "
    "GROUP BY GROUPING SETS ((g), (flag), ())",
    "CTE used twice": "WITH c AS (SELECT g, sum(a) AS s FROM t GROUP BY g) "
    "SELECT c1.g, c1.s, c2.s AS s2 FROM c c1 JOIN c c2 ON c1.g = c2.g",
    "duplicate column names": "SELECT a, a, b AS a FROM t",
    "row_number": "SELECT id, row_number() OVER (PARTITION BY g ORDER BY a DESC, id) AS rn FROM t",
    "rank and dense_rank with ties and NULLs": "SELECT id, rank() OVER (ORDER BY a) AS r, "
    "dense_rank() OVER (PARTITION BY g ORDER BY x) AS d FROM t",
    "aggregates over partitions": "SELECT id, sum(a) OVER (PARTITION BY g) AS s, "
    "count(*) OVER () AS n, avg(a) OVER (PARTITION BY flag) AS m FROM t",
    "running aggregates, RANGE frame with peers": "SELECT id, sum(a) OVER (ORDER BY b) AS s, "
    "count(a) OVER (ORDER BY b) AS c, min(a) OVER (ORDER BY b) AS mn, "
    "max(a) OVER (PARTITION BY g ORDER BY id) AS mx, count(*) OVER (ORDER BY b) AS n FROM t",
    "running aggregates, ROWS frame": "SELECT id, sum(a) OVER (ORDER BY b, id ROWS BETWEEN "
    "UNBOUNDED PRECEDING AND CURRENT ROW) AS s, avg(x) OVER (PARTITION BY g ORDER BY id) AS av "
    "FROM t",
    "lag and lead": "SELECT id, lag(a) OVER (ORDER BY id) AS l1, "
    "lead(a, 2, -1) OVER (PARTITION BY g ORDER BY id) AS l2 FROM t",
    "window over an aggregate": "SELECT g, sum(a) AS s, rank() OVER (ORDER BY sum(a) DESC) AS r "
    "FROM t GROUP BY g",
}


@pytest.mark.parametrize("query", list(SEMANTICS.values()), ids=list(SEMANTICS))
def test_semantics_match_duckdb(con: duckdb.DuckDBPyConnection, query: str) -> None:
    check(con, query)


ORDERED = {
    "default order is ASC NULLS LAST": (
        "SELECT id, a FROM t ORDER BY a, id",
        [("a", False), ("id", False)],
    ),
    "DESC keeps NULLS LAST": (
        "SELECT id, a FROM t ORDER BY a DESC, id",
        [("a", True), ("id", False)],
    ),
    "NULLS FIRST": (
        "SELECT id, a FROM t ORDER BY a NULLS FIRST, id",
        [("a", False), ("id", False)],
    ),
    "NaN sorts as the largest double": (
        "SELECT id, x FROM t ORDER BY x DESC, id",
        [("x", True), ("id", False)],
    ),
    "LIMIT and OFFSET": ("SELECT id FROM t ORDER BY id LIMIT 3 OFFSET 2", [("id", False)]),
    "top-N": (
        "SELECT id, a FROM t ORDER BY a DESC NULLS LAST, id LIMIT 3",
        [("a", True), ("id", False)],
    ),
}


@pytest.mark.parametrize("query,keys", list(ORDERED.values()), ids=list(ORDERED))
def test_ordering_matches_duckdb(
    con: duckdb.DuckDBPyConnection, query: str, keys: list[tuple[str, bool]]
) -> None:
    check(con, query, keys)


def test_result_types_are_duckdbs(con: duckdb.DuckDBPyConnection) -> None:
    query = "SELECT g, sum(a) AS s, sum(d) AS sd, avg(a) AS m, count(*) AS n FROM t GROUP BY g"
    rel = shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    native = con.sql(query)
    assert rel.columns == native.columns
    assert [str(t) for t in rel.types] == [
        "VARCHAR",
        "HUGEINT",
        "DECIMAL(38,2)",
        "DOUBLE",
        "BIGINT",
    ]
    assert rel.types == native.types


def test_integer_overflow_fails_as_in_duckdb(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.raises(duckdb.OutOfRangeException):
        con.sql("SELECT big + 1 FROM t").fetchall()
    with pytest.raises(duckdb.OutOfRangeException, match="Overflow in addition of INT64") as info:
        shoal.duckdb.sql(con, "SELECT big + 1 FROM t", raise_on_fail=True, config=CONFIG)
    assert isinstance(info.value, shoal.TaskError)


def test_division_by_zero_follows_the_duckdb_setting(con: duckdb.DuckDBPyConnection) -> None:
    query = "SELECT id, a // (b - b) AS d FROM t"
    with pytest.raises(duckdb.InvalidInputException, match="Division by zero"):
        con.sql(query).fetchall()
    with pytest.raises(shoal.TaskError, match="Division by zero"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    con.execute("SET error_on_division_by_zero = false").fetchall()
    try:
        check(con, "SELECT id, a // (b - b) AS d, a % (b - b) AS m, x // 0 AS f FROM t")
    finally:
        con.execute("RESET error_on_division_by_zero").fetchall()


def test_scalar_subquery_with_several_rows_fails_as_in_duckdb(
    con: duckdb.DuckDBPyConnection,
) -> None:
    check(con, "SELECT id, (SELECT name FROM u WHERE k = 1) AS n FROM t")
    query = "SELECT id, (SELECT name FROM u WHERE k = 9) AS n FROM t"
    with pytest.raises(duckdb.InvalidInputException, match="More than one row"):
        con.sql(query).fetchall()
    with pytest.raises(shoal.TaskError, match="More than one row"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    correlated = "SELECT id, (SELECT name FROM u WHERE u.k = t.a) AS n FROM t"
    with pytest.raises(duckdb.InvalidInputException, match="More than one row"):
        con.sql(correlated).fetchall()
    with pytest.raises(shoal.TaskError, match="More than one row"):
        shoal.duckdb.sql(con, correlated, raise_on_fail=True, config=CONFIG)


def test_the_result_is_a_relation_on_the_callers_connection(con: duckdb.DuckDBPyConnection) -> None:
    rel = shoal.duckdb.sql(
        con, "SELECT a, count(*) AS n FROM t GROUP BY a", raise_on_fail=True, config=CONFIG
    )
    assert isinstance(rel, duckdb.DuckDBPyRelation)
    assert sorted(rel.fetchall(), key=str) == sorted(
        con.sql("SELECT a, count(*) AS n FROM t GROUP BY a").fetchall(), key=str
    )
    # Joins with the caller's own tables, by the relational API and by SQL.
    joined = rel.join(con.table("u"), "a = k").aggregate("sum(n) AS total")
    assert joined.fetchall() == [(7,)]  # a = 9: 3 rows x 2 matches; a = -8: 1 x 1
    con.register("shoal_result", rel)
    try:
        rows = con.sql(
            "SELECT r.a, u.name FROM shoal_result r JOIN u ON r.a = u.k ORDER BY u.name"
        ).fetchall()
    finally:
        con.unregister("shoal_result")
    assert rows == [(-8, "m8"), (9, "nine"), (9, "nine again")]
    assert rel.to_arrow_table().num_rows == 6


def test_relational_api(con: duckdb.DuckDBPyConnection) -> None:
    rel = con.table("t").filter("a > 1").aggregate("g, sum(a) AS s", "g")
    got = shoal.duckdb.run(rel, raise_on_fail=True, config=CONFIG)
    assert_frames_match(got.pl(), rel.pl())
    assert last_query() is not None


#: A window frame shoal does not run (a sliding GROUPS frame).
SLIDING = "sum(a) OVER (ORDER BY id GROUPS BETWEEN 1 PRECEDING AND CURRENT ROW)"


def test_untranslatable_query_falls_back_with_a_warning(con: duckdb.DuckDBPyConnection) -> None:
    query = f"SELECT id, {SLIDING} AS s FROM t"
    with pytest.warns(DuckDBFallbackWarning, match=r"sum\(\.\.\.\) OVER"):
        rel = shoal.duckdb.sql(con, query, config=CONFIG)
    assert rel.fetchall() == con.sql(query).fetchall()


def test_raise_on_fail_names_the_operator(con: duckdb.DuckDBPyConnection) -> None:
    query = f"SELECT id, {SLIDING} AS s FROM t"
    with pytest.raises(
        shoal.UnsupportedError,
        match=r"sum\(\.\.\.\) OVER \(ORDER BY \.\.\.\): frame GROUPS BETWEEN <n> PRECEDING AND CURRENT ROW",
    ):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    with pytest.raises(shoal.UnsupportedError, match=r"sum\(\.\.\.\) OVER"):
        shoal.duckdb.sql(con, query, config=CONFIG.replace(raise_on_fail=True))


def test_every_unsupported_part_is_reported(con: duckdb.DuckDBPyConnection) -> None:
    query = f"SELECT id, {SLIDING} AS rn, md5(s) AS r FROM t"
    with pytest.raises(shoal.UnsupportedError) as info:
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    message = str(info.value)
    assert "sum(...) OVER" in message and "md5(s)" in message


def test_a_statement_that_is_not_a_query_runs_on_duckdb(con: duckdb.DuckDBPyConnection) -> None:
    with pytest.warns(DuckDBFallbackWarning, match="CREATE"):
        shoal.duckdb.sql(con, "CREATE TEMP TABLE made_here AS SELECT 1 AS one", config=CONFIG)
    assert con.sql("SELECT * FROM made_here").fetchall() == [(1,)]
    with pytest.raises(shoal.UnsupportedError, match="only SELECT"):
        shoal.duckdb.sql(con, "DROP TABLE made_here", raise_on_fail=True, config=CONFIG)


@pytest.fixture
def no_execution(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records every plan handed to shoal's runners (there should be none)."""
    calls: list[object] = []
    monkeypatch.setattr(shoal_duckdb.api, "_execute_result", lambda *a, **k: calls.append(a))
    return calls


def test_syntax_error_is_duckdbs_parser_exception(
    con: duckdb.DuckDBPyConnection, no_execution: list[object]
) -> None:
    with pytest.raises(duckdb.ParserException, match="syntax error"):
        shoal.duckdb.sql(con, "SELEC a FROM t", config=CONFIG)
    assert no_execution == []


def test_missing_table_is_duckdbs_catalog_exception(
    con: duckdb.DuckDBPyConnection, no_execution: list[object]
) -> None:
    with pytest.raises(duckdb.CatalogException, match="no_such_table"):
        shoal.duckdb.sql(con, "SELECT * FROM no_such_table", raise_on_fail=True, config=CONFIG)
    with pytest.raises(duckdb.BinderException):
        shoal.duckdb.sql(con, "SELECT no_such_column FROM t", config=CONFIG)
    assert no_execution == []


def test_stand_ins_and_settings_are_cleaned_up(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"v": [1, 2, 3]}), path)
    con.execute("SET disabled_optimizers = 'join_order'").fetchall()
    try:
        check(con, f"SELECT sum(v) AS s FROM read_parquet('{path}')")
        setting = con.sql("SELECT current_setting('disabled_optimizers')").fetchall()
        assert setting == [("join_order",)]
    finally:
        con.execute("SET disabled_optimizers = ''").fetchall()
    left = con.sql(
        "SELECT table_name FROM duckdb_tables() WHERE table_name LIKE '__shoal%'"
    ).fetchall()
    assert left == []


def test_explain_shows_the_ir_and_the_stages(con: duckdb.DuckDBPyConnection) -> None:
    text = shoal.duckdb.explain(con, "SELECT g, sum(a) AS s FROM t GROUP BY g", config=CONFIG)
    assert "Logical plan:" in text and "AGGREGATE" in text
    assert "Physical plan:" in text and "hash exchange" in text


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Parquet files of one table (with NULLs), and a file name with a quote."""
    root = tmp_path_factory.mktemp("pq")
    for i in range(3):
        n = 400
        table = pa.table(
            {
                "k": pa.array([(j * 7 + i) % 13 for j in range(n)], pa.int64()),
                "v": pa.array([None if j % 17 == 0 else j * 0.5 for j in range(n)]),
                "s": pa.array([f"s{j % 5}" for j in range(n)]),
            }
        )
        pq.write_table(table, root / f"part-{i}.parquet", row_group_size=100)
    return root


def test_read_parquet_is_split_by_file_and_row_group(
    con: duckdb.DuckDBPyConnection, parquet_dir: Path
) -> None:
    query = (
        f"SELECT s, count(*) AS n, sum(v) AS sv FROM read_parquet('{parquet_dir}/*.parquet')"
        " GROUP BY s"
    )
    check(con, query)
    report = last_query()
    assert report is not None
    scans = [s for s in report.physical.stages if s.scan_partitions is not None]
    assert scans and max(s.num_tasks for s in scans) > 1
    # 'file.parquet' replacement scans and views over read_parquet read the files too.
    check(con, f"SELECT count(*) AS n FROM '{parquet_dir}/part-1.parquet'")
    con.execute(
        f"CREATE OR REPLACE VIEW pv AS SELECT * FROM read_parquet("
        f"'{parquet_dir}/*.parquet') WHERE v > 10"
    ).fetchall()
    check(con, "SELECT k, max(v) AS m FROM pv GROUP BY k")


def test_other_table_functions_are_read_by_duckdb(
    con: duckdb.DuckDBPyConnection, tmp_path: Path
) -> None:
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n1,x\n2,\n3,z\n")
    check(con, f"SELECT a, b FROM read_csv('{csv}') WHERE a > 1")
    check(con, "SELECT range % 3 AS r, count(*) AS n FROM range(100) GROUP BY r")
    arrow = pa.table({"p": [1, 2, 2, None]})
    con.register("arrow_table", arrow)
    try:
        check(con, "SELECT p, count(*) AS n FROM arrow_table GROUP BY p")
    finally:
        con.unregister("arrow_table")


def test_polars_and_duckdb_agree_on_the_same_parquet_files(
    con: duckdb.DuckDBPyConnection, parquet_dir: Path
) -> None:
    files = sorted(str(p) for p in parquet_dir.glob("*.parquet"))
    lf = (
        pl.scan_parquet(files)
        .filter(pl.col("v") > 20)
        .group_by("k")
        .agg(pl.col("v").sum().alias("total"), pl.len().alias("n"))
        .sort("k")
    )
    from_polars = lf.collect(
        engine=shoal.DistEngine(runner="local", raise_on_fail=True, config=CONFIG)
    )
    listing = ", ".join(f"'{f}'" for f in files)
    from_duckdb = _shoal(
        con,
        f"SELECT k, sum(v) AS total, count(*) AS n FROM read_parquet([{listing}]) "
        "WHERE v > 20 GROUP BY k ORDER BY k",
    )
    assert from_polars.columns == from_duckdb.columns
    assert_frames_match(from_duckdb.cast({"n": pl.UInt32}), from_polars, [("k", False)])


def test_python_objects_are_found_by_name_as_duckdb_does(con: duckdb.DuckDBPyConnection) -> None:
    # Read by the queries below, by name.
    arrow_table = pa.table({"k": [1, 2, 2, None], "v": [1.0, 2.0, 3.0, 4.0]})  # noqa: F841
    polars_frame = pl.DataFrame({"k": [2, 3], "name": ["two", "three"]})  # noqa: F841
    query = (
        "SELECT a.k, sum(v) AS s, max(p.name) AS n FROM arrow_table a "
        "LEFT JOIN polars_frame p ON a.k = p.k GROUP BY a.k"
    )
    # Called here, not through a helper: both look up the names in the calling frame.
    got = shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG).pl()
    assert_frames_match(got, con.sql(query).pl())
    # The objects were registered for the call only.
    views = con.sql("SELECT view_name FROM duckdb_views() WHERE view_name LIKE '__shoal%'")
    assert views.fetchall() == []
    sliding = "sum(v) OVER (ORDER BY v GROUPS BETWEEN 1 PRECEDING AND CURRENT ROW)"
    with pytest.warns(DuckDBFallbackWarning):
        rel = shoal.duckdb.sql(con, f"SELECT k, {sliding} AS s FROM arrow_table", config=CONFIG)
    assert len(rel.fetchall()) == 4


def test_warnings_point_at_the_caller(con: duckdb.DuckDBPyConnection) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shoal.duckdb.sql(con, "SELECT row_number() OVER () FROM t", config=CONFIG)
    assert caught and caught[0].filename == __file__
    assert "virtual scan columns" in str(caught[0].message)


def test_constant_projection_has_one_row_per_input_row() -> None:
    """Regression: ``count(*)`` counted 1 row, because a projection of literals alone was
    one row (Polars' rule) instead of one per input row (DuckDB's)."""
    con = duckdb.connect()
    con.sql("CREATE TABLE t AS SELECT * FROM range(5) r(x)")
    for query in (
        "SELECT count(*) AS n FROM t",
        "SELECT 42 AS c FROM t",
        "SELECT 'a' AS s, 1 AS one FROM t WHERE x > 1",
    ):
        got = shoal.duckdb.sql(con, query, runner="local", raise_on_fail=True).fetchall()
        assert sorted(got) == sorted(con.sql(query).fetchall()), query


def test_registered_udf_runs_through_shoal_and_matches_native_duckdb() -> None:
    """A shoal UDF registered with ``register_udf`` runs distributed (no fallback)."""
    import polars as pl

    @shoal.udf(return_dtype=pl.Float64, name="shoal_test_twice")
    def twice(v: pl.Series) -> pl.Series:
        return v * 2

    con = duckdb.connect()
    con.sql("CREATE TABLE t AS SELECT range AS k, range * 1.5 AS v FROM range(100)")
    shoal.duckdb.register_udf(con, twice)
    query = "SELECT k, shoal_test_twice(v) AS w FROM t WHERE k % 3 = 0"
    config = shoal.Config(default_partitions=4)
    got = shoal.duckdb.sql(con, query, runner="local", raise_on_fail=True, config=config)
    assert sorted(got.fetchall()) == sorted(con.sql(query).fetchall())
    plan = shoal.duckdb.to_ir(con, query)
    assert any(type(n).__name__ == "UdfProject" for n in plan.walk())


def test_aggregates_of_constants_count_every_row() -> None:
    """Regression: ``count(1)`` gave 1 and ``sum(5)`` gave 5 (a literal aggregated once,
    per partition) where DuckDB aggregates the constant once per row."""
    con = duckdb.connect()
    con.sql("CREATE TABLE t AS SELECT i FROM range(10) r(i)")
    config = shoal.Config(default_partitions=4)
    for query in (
        "SELECT count(1) FROM t",
        "SELECT sum(5), count(*) FROM t",
        "SELECT sum(2.5) FROM t",
        "SELECT i % 2 AS g, sum(3), count(1) FROM t GROUP BY g ORDER BY g",
        "SELECT sum(1) FROM t WHERE i > 100",
    ):
        got = shoal.duckdb.sql(con, query, runner="local", raise_on_fail=True, config=config)
        assert got.fetchall() == con.sql(query).fetchall(), query


def test_max_of_floats_with_nan_is_nan_as_in_duckdb() -> None:
    """Regression: max skipped NaN (Polars' max) where DuckDB orders NaN above numbers."""
    con = duckdb.connect()
    con.sql("CREATE TABLE fl (k INTEGER, f DOUBLE)")
    con.sql("INSERT INTO fl VALUES (1, 1.0), (1, 'nan'), (2, -0.0), (2, 0.0), (3, 'nan')")
    for query in (
        "SELECT k, max(f), min(f) FROM fl GROUP BY k ORDER BY k",
        "SELECT max(f), min(f) FROM fl",
    ):
        got = shoal.duckdb.sql(con, query, runner="local", raise_on_fail=True).fetchall()
        assert str(got) == str(con.sql(query).fetchall()), query


def test_upper_and_lower_use_duckdbs_simple_case_mapping() -> None:
    """Regression: upper/lower used Polars' full Unicode case mapping ('ß' -> 'SS', final
    sigma 'σας'); DuckDB maps each character to one character ('ß' -> 'ẞ', 'σασ')."""
    con = duckdb.connect()
    con.sql("CREATE TABLE w (i INTEGER, s VARCHAR)")
    con.sql(
        "INSERT INTO w VALUES (1, 'straße'), (2, 'ΣΑΣ'), (3, NULL), (4, 'İstanbul'), "
        "(5, 'ﬁx'), (6, 'ǅemal'), (7, ''), (8, 'ABC def')"
    )
    config = shoal.Config(default_partitions=3, target_partition_bytes=64)
    for query in (
        "SELECT i, upper(s) AS u, lower(s) AS l, ucase(s) AS u2, lcase(s) AS l2 FROM w ORDER BY i",
        "SELECT upper(s) AS u, count(*) AS n FROM w GROUP BY upper(s) ORDER BY u NULLS FIRST",
        "SELECT i FROM w WHERE lower(s) = 'σασ' OR upper(s) = 'STRAẞE' ORDER BY i",
    ):
        got = shoal.duckdb.sql(con, query, runner="local", raise_on_fail=True, config=config)
        assert got.fetchall() == con.sql(query).fetchall(), query


def test_parquet_stand_ins_hold_proportional_samples_that_never_prune(tmp_path: Path) -> None:
    """Each Parquet stand-in holds the first rows of its files in proportion to their row
    counts (so that DuckDB's join order sees the real relative sizes), and the sample never
    decides an answer: filters on values outside the sample give DuckDB's rows."""
    from shoal_duckdb.prepare import SAMPLE_FRACTION, prepare

    big, small = tmp_path / "big.parquet", tmp_path / "small.parquet"
    pq.write_table(pa.table({"k": list(range(30_000)), "v": [i % 7 for i in range(30_000)]}), big)
    pq.write_table(pa.table({"k": [5, 29_999, 70_000], "name": ["a", "b", "c"]}), small)
    con = duckdb.connect()
    query = (
        f"SELECT s.name, count(*) AS n, sum(b.v) AS sv FROM read_parquet('{big}') b "
        f"JOIN read_parquet('{small}') s ON b.k = s.k WHERE b.k > 29000 OR b.v = 6 "
        "GROUP BY s.name"
    )
    prepared = prepare(con, query)
    try:
        counts = {
            s.paths[0].rsplit("/", 1)[-1]: con.execute(
                f'SELECT count(*) FROM "{s.name}"'
            ).fetchone()
            for s in prepared.standins.values()
        }
    finally:
        prepared.close()
    assert counts == {"big.parquet": (int(30_000 * SAMPLE_FRACTION),), "small.parquet": (1,)}
    config = shoal.Config(default_partitions=3, target_partition_bytes=4096)
    for q in (
        query,
        f"SELECT count(*) AS n FROM read_parquet('{big}') WHERE k >= 29990",
        f"SELECT k FROM read_parquet('{small}') WHERE name = 'c'",
    ):
        got = shoal.duckdb.sql(con, q, runner="local", raise_on_fail=True, config=config)
        assert sorted(got.fetchall()) == sorted(con.sql(q).fetchall()), q
