"""shoal.duckdb gives what DuckDB gives: the same rows, types and order, and DuckDB's
exception classes. Each query runs through shoal (local runner, tables split into several
partitions) and natively (``con.sql(q)``), over data with NULLs, NaN, -0.0, duplicates and
NULL struct fields; values are compared by their ``repr`` (so -0.0 is not 0.0 and NaN
equals NaN)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shoal
from shoal_duckdb import DuckDBFallbackWarning

#: Every table splits into several partitions (3, and 5 for 12 rows: one nearly empty).
CONFIGS = {
    "3 partitions": shoal.Config(runner="local", default_partitions=3, shuffle_partitions=3),
    "5 partitions": shoal.Config(runner="local", default_partitions=5, shuffle_partitions=2),
}

ROWS = """
(1, {'score': 1.5::DOUBLE, 'src': 'ads', 'n': {'a': 1, 'b': 'x'}}, 's1', 1.5::DOUBLE, 2.50::DECIMAL(6,2)),
(2, {'score': NULL, 'src': 'web', 'n': {'a': NULL, 'b': 'y'}}, 's2', 'nan'::DOUBLE, -1.25),
(3, NULL, 's1', NULL, NULL),
(4, {'score': 1.5, 'src': NULL, 'n': NULL}, 's2', -0.0::DOUBLE, 0.00),
(5, {'score': 'nan'::DOUBLE, 'src': 'ads', 'n': {'a': 2, 'b': NULL}}, NULL, 0.25, 0.25),
(6, {'score': -0.0::DOUBLE, 'src': 'web', 'n': {'a': 1, 'b': 'x'}}, 's3', -0.5, -0.50),
(7, {'score': NULL, 'src': NULL, 'n': {'a': NULL, 'b': NULL}}, 's1', -3.0, 3.00),
(8, {'score': 2.0, 'src': 'ads', 'n': {'a': 1, 'b': 'x'}}, 's2', 'inf'::DOUBLE, NULL),
(9, {'score': 1.5, 'src': 'ads', 'n': {'a': 1, 'b': 'x'}}, 's1', 1.5, 2.50),
(10, {'score': -7.0, 'src': 'mail', 'n': {'a': 3, 'b': 'z'}}, 's3', '-inf'::DOUBLE, -9.99),
(11, {'score': 0.0, 'src': 'mail', 'n': {'a': 0, 'b': ''}}, NULL, 0.0, 0.01),
(12, {'score': 2.0, 'src': 'web', 'n': {'a': -1, 'b': 'w'}}, 's1', NULL, 1.00)
"""


@pytest.fixture(scope="module")
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    c.execute(f"CREATE TABLE t AS SELECT * FROM (VALUES {ROWS}) v(id, m, store, x, d)").fetchall()
    yield c
    c.close()


def _canon(v: Any) -> Any:
    """A value as comparable text: ``repr`` keeps -0.0 apart from 0.0, NaN equals NaN."""
    if isinstance(v, dict):
        return tuple((k, _canon(x)) for k, x in v.items())
    if isinstance(v, list | tuple):
        return tuple(_canon(x) for x in v)
    return repr(v)


def check(
    con: duckdb.DuckDBPyConnection, query: str, config: shoal.Config, ordered: bool = False
) -> None:
    """Same column names, types and rows (in order when ``ordered``) as native DuckDB."""
    native = con.sql(query)
    rel = shoal.duckdb.sql(con, query, raise_on_fail=True, config=config)
    assert rel.columns == native.columns
    assert rel.types == native.types
    got = [_canon(r) for r in rel.fetchall()]
    want = [_canon(r) for r in native.fetchall()]
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want


@pytest.fixture(params=list(CONFIGS), ids=list(CONFIGS))
def config(request: pytest.FixtureRequest) -> shoal.Config:
    return CONFIGS[request.param]


STRUCT_ACCESS = {
    "dot": "SELECT id, m.src FROM t",
    "dot, DECIMAL-free double field": "SELECT id, m.score FROM t",
    "brackets": "SELECT id, m['score'] AS s FROM t",
    "brackets, other case": "SELECT id, m['SRC'] AS s, m FROM t",
    "struct_extract": "SELECT id, struct_extract(m, 'score') AS s FROM t",
    "struct_extract_at": "SELECT id, struct_extract_at(m, 2) AS s FROM t",
    "nested field": "SELECT id, m.n.b, m.n.a FROM t",
    "field and the struct itself": "SELECT id, m.src, m.n, m FROM t",
    "unnest of a struct": "SELECT id, unnest(m) FROM t",
    "star of a struct": "SELECT m.* FROM t",
    "group by a field": "SELECT m.src, count(*) AS n, sum(m.score) AS s FROM t GROUP BY m.src",
    "group by a nested field": "SELECT m.n.b, count(m.score) AS n FROM t GROUP BY ALL",
    "filter on a field": "SELECT id FROM t WHERE m.score > 1",
    "filter on a field, struct selected": "SELECT id, m FROM t WHERE m.score >= 1.5",
    "filter on a nested field": "SELECT id, m.src FROM t WHERE m.n.a = 1",
    "filter on a string field": "SELECT id, m.src FROM t WHERE m.src LIKE 'a%'",
    "field IS NULL": "SELECT id FROM t WHERE m.src IS NULL",
    "join on a field": "SELECT a.id, b.id AS id2 FROM t a JOIN t b ON a.m.src = b.m.src",
    "struct_pack": "SELECT id, {'k': m.src, 'v': x, 'w': {'z': d}} AS s FROM t",
    "field of a packed struct": "SELECT s.k, s.w.z FROM (SELECT {'k': m.src, 'w': {'z': d}} AS s "
    "FROM t) q",
    "struct comparisons": "SELECT a.id, b.id AS id2, a.m < b.m AS lt, a.m <= b.m AS le, "
    "a.m > b.m AS gt, a.m >= b.m AS ge, a.m = b.m AS eq, a.m.n < b.m.n AS nlt FROM t a, t b",
    "join on a struct inequality": "SELECT a.id, b.id AS id2 FROM t a JOIN t b "
    "ON a.store = b.store AND a.m > b.m",
    "count of a struct vs its field": "SELECT count(m) AS a, count(m.src) AS b, count(*) AS c "
    "FROM t",
}


@pytest.mark.parametrize("query", list(STRUCT_ACCESS.values()), ids=list(STRUCT_ACCESS))
def test_struct_access(con: duckdb.DuckDBPyConnection, config: shoal.Config, query: str) -> None:
    check(con, query, config)


STRUCT_ORDER = {
    # DuckDB sorts a NULL inside a struct above every value, whatever NULLS FIRST says.
    "ascending": "SELECT id, m FROM t ORDER BY m, id",
    "descending": "SELECT id FROM t ORDER BY m DESC, id",
    "NULLS FIRST": "SELECT id FROM t ORDER BY m NULLS FIRST, id",
    "DESC NULLS LAST": "SELECT id FROM t ORDER BY m DESC NULLS LAST, id",
    "nested struct": "SELECT id FROM t ORDER BY m.n, id",
    "top-N": "SELECT id FROM t ORDER BY m DESC, id LIMIT 4",
    "window order": "SELECT id, row_number() OVER (ORDER BY m, id) AS r FROM t ORDER BY id",
}


@pytest.fixture(scope="module")
def lists() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE l AS SELECT * FROM (VALUES (1, [0], {'a': [1, NULL]}, [[0]]), "
        "(2, [NULL], {'a': [NULL]}, [[NULL]]), (3, [1], NULL, [NULL]), "
        "(4, NULL, {'a': NULL}, [[1], NULL]), (5, [0, NULL], {'a': [1]}, NULL), "
        "(6, [0, 1], {'a': []}, [[]]), (7, [], {'a': [1, 2]}, []), "
        "(8, [NULL, 1], {'a': [NULL, 1]}, [[0, NULL]])) v(id, l, s, ll)"
    ).fetchall()
    yield c
    c.close()


LIST_ORDER = {
    "ascending": "SELECT id, l FROM l ORDER BY l, id",
    "descending": "SELECT id FROM l ORDER BY l DESC, id",
    "NULLS FIRST": "SELECT id FROM l ORDER BY l NULLS FIRST, id",
    "list in a struct": "SELECT id FROM l ORDER BY s, id",
    "list in a struct, DESC NULLS LAST": "SELECT id FROM l ORDER BY s DESC NULLS LAST, id",
    "list of lists": "SELECT id FROM l ORDER BY ll, id",
    "top-N": "SELECT id FROM l ORDER BY l DESC, id LIMIT 3",
}


@pytest.mark.parametrize("query", list(LIST_ORDER.values()), ids=list(LIST_ORDER))
def test_list_ordering(lists: duckdb.DuckDBPyConnection, config: shoal.Config, query: str) -> None:
    # DuckDB sorts a NULL inside a list above every value, as inside a struct.
    check(lists, query, config, ordered=True)


@pytest.mark.parametrize("query", list(STRUCT_ORDER.values()), ids=list(STRUCT_ORDER))
def test_struct_ordering(con: duckdb.DuckDBPyConnection, config: shoal.Config, query: str) -> None:
    check(con, query, config, ordered=True)


CONSTANT_ARGUMENTS = {
    "count(1) over a partition": "SELECT id, count(1) OVER (PARTITION BY store) AS n FROM t",
    "count(1) over everything": "SELECT id, count(1) OVER () AS n FROM t",
    "sum(2) over everything": "SELECT id, sum(2) OVER () AS n FROM t",
    "count(*), count(1), count(x), count(NULL) over a partition": "SELECT id, "
    "count(*) OVER w AS a, count(1) OVER w AS b, count(x) OVER w AS c, count(NULL) OVER w AS e "
    "FROM t WINDOW w AS (PARTITION BY store)",
    "the same over everything": "SELECT id, count(*) OVER () AS a, count(1) OVER () AS b, "
    "count(x) OVER () AS c, count(NULL) OVER () AS e FROM t",
    "running count(1) and sum(1)": "SELECT id, count(1) OVER (PARTITION BY store ORDER BY id) "
    "AS c, sum(1) OVER (ORDER BY id ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS s FROM t",
    "running avg, min, max of constants": "SELECT id, avg(3) OVER (ORDER BY id) AS a, "
    "min(4) OVER (ORDER BY id) AS b, max('z') OVER () AS c, count(NULL) OVER (ORDER BY id) AS e "
    "FROM t",
    "lag and lead of constants": "SELECT id, lag(1) OVER (ORDER BY id) AS a, "
    "lead('q', 2, 'd') OVER (PARTITION BY store ORDER BY id) AS b FROM t",
    "constants in a filtered window": "SELECT id, count(1) OVER () AS n, sum(1) OVER "
    "(PARTITION BY store) AS s FROM t WHERE id > 6",
    "aggregates of constants": "SELECT store, count(1) AS a, count(*) AS b, count(x) AS c, "
    "sum(2) AS s, count(NULL) AS e, avg(1) AS f FROM t GROUP BY store",
    "aggregates of constants without groups": "SELECT count(1) AS a, sum(1) AS b, "
    "count(NULL) AS c FROM t WHERE id > 20",
}


@pytest.mark.parametrize("query", list(CONSTANT_ARGUMENTS.values()), ids=list(CONSTANT_ARGUMENTS))
def test_constant_arguments_count_rows(
    con: duckdb.DuckDBPyConnection, config: shoal.Config, query: str
) -> None:
    check(con, query, config)


def test_sign(con: duckdb.DuckDBPyConnection, config: shoal.Config) -> None:
    # DuckDB: sign(NaN) = 0, sign(-0.0) = 0, sign(0.25) = 1 (not a cast to TINYINT first).
    check(
        con,
        "SELECT id, sign(x) AS a, sign(d) AS b, sign(id - 6) AS c, sign(m.score) FROM t",
        config,
    )


@pytest.fixture(scope="module")
def parquet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Files that disagree on column types (and one without column ``s``)."""
    d = tmp_path_factory.mktemp("mixed")
    pq.write_table(
        pa.table(
            {
                "id": pa.array([1, 2, 3], pa.int32()),
                "v": pa.array([1.5, None, -0.0], pa.float32()),
                "s": ["a", "b", None],
            }
        ),
        d / "a.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "id": pa.array([4, 5], pa.int64()),
                "v": pa.array([2, None], pa.int64()),
                "s": pa.array([b"x", b"y"], pa.binary()),
            }
        ),
        d / "b.parquet",
    )
    pq.write_table(
        pa.table({"id": pa.array([6], pa.int16()), "v": pa.array([7.25], pa.float64())}),
        d / "c.parquet",
    )
    return d


def test_parquet_glob_with_different_types(
    con: duckdb.DuckDBPyConnection, config: shoal.Config, parquet_dir: Path
) -> None:
    # DuckDB reads every file with the first file's types (INTEGER, FLOAT, VARCHAR).
    glob = f"'{parquet_dir}/[ab].parquet'"
    check(con, f"SELECT * FROM {glob}", config)
    check(con, f"SELECT id, v FROM {glob} WHERE v > 1.6 OR s = 'b'", config)
    check(con, f"SELECT s, sum(v) AS sv, max(id) AS mi FROM {glob} GROUP BY s", config)
    both = f"read_parquet(['{parquet_dir}/b.parquet', '{parquet_dir}/a.parquet'])"
    check(con, f"SELECT id, v, s FROM {both}", config)


def test_parquet_file_without_an_unread_column(
    con: duckdb.DuckDBPyConnection, config: shoal.Config, parquet_dir: Path
) -> None:
    # c.parquet lacks column s: DuckDB answers a query that does not read it.
    files = f"read_parquet(['{parquet_dir}/a.parquet', '{parquet_dir}/c.parquet'])"
    check(con, f"SELECT id, v FROM {files}", config)


def test_parquet_file_without_a_read_column_falls_back(
    con: duckdb.DuckDBPyConnection, parquet_dir: Path
) -> None:
    files = f"read_parquet(['{parquet_dir}/a.parquet', '{parquet_dir}/c.parquet'])"
    query = f"SELECT id, s FROM {files}"
    with pytest.raises(duckdb.InvalidInputException), con.cursor() as cur:
        cur.sql(query).fetchall()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DuckDBFallbackWarning)
        # Falls back to DuckDB, which raises its own error.
        with pytest.raises(duckdb.InvalidInputException):
            shoal.duckdb.sql(con, query, config=CONFIGS["3 partitions"]).fetchall()


# ---------------------------------------------------------------- fallback reasons


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    """A table and a Parquet file with a MAP column (a type shoal does not carry), and a
    SQL macro over a function shoal does not translate."""
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE o AS SELECT i AS id, 'a,b,' || i AS s, MAP {'k': i} AS mp FROM range(6) r(i)"
    ).fetchall()
    path = tmp_path_factory.mktemp("odd") / "o.parquet"
    c.execute(f"COPY o TO '{path}'").fetchall()
    # A Python function of the user's: neither the IR nor a task's DuckDB has it.
    c.create_function("edits", lambda a, b: abs(len(a) - len(b)), ["VARCHAR", "VARCHAR"], "BIGINT")  # type: ignore[list-item]
    c.execute("CREATE MACRO lev1(a) AS edits(a, 'x') + 1").fetchall()
    c.execute(f"CREATE VIEW ov AS SELECT * FROM read_parquet('{path}')").fetchall()
    yield c
    c.close()


def _reason(con: duckdb.DuckDBPyConnection, query: str) -> str:
    with pytest.raises(shoal.UnsupportedError) as info:
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIGS["3 partitions"])
    text = str(info.value)
    assert "LOGICAL_" not in text and "__shoal" not in text, text
    return text


def test_reason_quotes_the_expression_written(odd: duckdb.DuckDBPyConnection) -> None:
    assert "SELECT: edits(s, 'x'): function edits() is not supported" in _reason(
        odd, "SELECT id, edits(s, 'x') AS d FROM o"
    )
    # A macro: DuckDB's plan has the macro's body; the reason quotes the call.
    assert "lev1(s): not supported (DuckDB computes it with its function edits()" in (
        _reason(odd, "SELECT id, lev1(s) AS d FROM o WHERE id > 1")
    )


def test_reason_names_the_file_and_column(odd: duckdb.DuckDBPyConnection) -> None:
    text = _reason(odd, "SELECT id, mp FROM ov")
    assert "FROM read_parquet('" in text and "o.parquet')" in text
    assert "column mp: DuckDB type MAP" in text
    assert "FROM table o: column mp: DuckDB type MAP" in _reason(odd, "SELECT mp FROM o")


def test_reason_for_a_filter_pushed_into_a_parquet_scan(odd: duckdb.DuckDBPyConnection) -> None:
    text = _reason(odd, "SELECT id FROM ov WHERE edits(s, 'a') < 3")
    assert "WHERE: edits(s, 'a'): function edits() is not supported" in text


def test_reason_writes_the_window_frame_in_sql(odd: duckdb.DuckDBPyConnection) -> None:
    text = _reason(
        odd,
        "SELECT id, sum(id) OVER (ORDER BY id GROUPS BETWEEN 2 PRECEDING AND 1 FOLLOWING) FROM o",
    )
    assert "sum(...) OVER (ORDER BY ...): frame GROUPS BETWEEN <n> PRECEDING AND <n> FOLLOWING" in (
        text
    )


def test_explain_prints_the_reason_instead_of_raising(odd: duckdb.DuckDBPyConnection) -> None:
    text = shoal.duckdb.explain(
        odd, "SELECT id, lev1(s) AS d FROM ov", config=CONFIGS["3 partitions"]
    )
    assert "Falls back" in text and "lev1(s): not supported" in text
    assert "__shoal" not in text
    # A query that runs distributed still explains its plans; the caller's Arrow table is
    # found by name as DuckDB's replacement scans would.
    local_arrow = pa.table({"k": [1, 2, 3]})
    text = shoal.duckdb.explain(
        odd, "SELECT k, count(*) FROM local_arrow GROUP BY k", config=CONFIGS["3 partitions"]
    )
    assert "Physical plan" in text and local_arrow.num_rows == 3
    # DuckDB's own errors for bad input still raise.
    with pytest.raises(duckdb.CatalogException):
        shoal.duckdb.explain(odd, "SELECT * FROM no_such_table")


# ---------------------------------------------------------------- DuckDB's errors


@pytest.fixture(scope="module")
def nums() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE n AS SELECT i::INT AS id, (i * 1000000)::INT AS big, "
        "CASE WHEN i = 7 THEN 'abc' WHEN i = 3 THEN NULL ELSE i::VARCHAR END AS s, "
        "9999999999999999.99::DECIMAL(18,2) AS d, i % 3 AS z, i - 4 AS neg, "
        "(-2147483647 - 1 + (i > 8)::INT)::INT AS low, "
        "99999999999999999999999999999999999.99::DECIMAL(37,2) AS huge FROM range(12) r(i)"
    ).fetchall()
    yield c
    c.close()


ERRORS = {
    "INT32 multiplication overflow": (
        "SELECT id, big * big AS p FROM n",
        duckdb.OutOfRangeException,
        r"^Out of Range Error: Overflow in multiplication of INT32 \(\d+ \* \d+\)!",
    ),
    "INT32 addition overflow": (
        "SELECT big + 2147483000 AS p FROM n",
        duckdb.OutOfRangeException,
        r"^Out of Range Error: Overflow in addition of INT32",
    ),
    "DECIMAL multiplication overflow": (
        "SELECT sum(d * 100) AS s FROM n",
        duckdb.OutOfRangeException,
        r"^Out of Range Error: Overflow in multiplication of DECIMAL\(18\)",
    ),
    "DECIMAL sum overflow": (
        "SELECT sum(huge) AS s FROM n",
        duckdb.OutOfRangeException,
        r"^Out of Range Error: Overflow in (SUM of DECIMAL|HUGEINT addition)",
    ),
    "negation of the smallest INT32": (
        "SELECT -low AS m FROM n",
        duckdb.OutOfRangeException,
        r"^Out of Range Error: Overflow in negation of numeric value!",
    ),
    "abs of the smallest INT32": (
        "SELECT abs(low) AS m FROM n",
        duckdb.OutOfRangeException,
        r"^Out of Range Error: Overflow on abs\(-2147483648\)",
    ),
    "smallest INT32 // -1": (
        "SELECT low // -1 AS m FROM n",
        duckdb.OutOfRangeException,
        r"^Out of Range Error: Overflow in division of -2147483648 / -1",
    ),
    "bad string to INTEGER": (
        "SELECT s::INT AS v FROM n",
        duckdb.ConversionException,
        r"^Conversion Error: Could not convert string 'abc' to INT32 when casting from source "
        r"column s",
    ),
    "bad string to DATE": (
        "SELECT (s || '-01-01')::DATE AS v FROM n",
        duckdb.ConversionException,
        r'^Conversion Error: invalid date field format: "abc-01-01", expected format is '
        r"\(YYYY-MM-DD\)",
    ),
    "bad string to DECIMAL": (
        "SELECT CAST(s AS DECIMAL(5,2)) AS v FROM n",
        duckdb.ConversionException,
        r'^Conversion Error: Could not convert string "abc" to DECIMAL\(5,2\)',
    ),
    "INTEGER out of SMALLINT's range": (
        "SELECT big::SMALLINT AS v FROM n",
        duckdb.ConversionException,
        r"^Conversion Error: Type INT32 with value \d+ can't be cast because the value is out "
        r"of range for the destination type INT16",
    ),
    "DOUBLE out of a DECIMAL's range": (
        "SELECT (big * 1.5)::DOUBLE::DECIMAL(3,1) AS v FROM n",
        duckdb.ConversionException,
        r"^Conversion Error: Could not cast value \d+\.0* to DECIMAL\(3,1\)",
    ),
    "HUGEINT out of BIGINT's range": (
        "SELECT sum(big)::TINYINT AS v FROM n",
        duckdb.ConversionException,
        r"^Conversion Error: Type INT128 with value \d+ can't be cast because the value is out of "
        r"range for the destination type INT8",
    ),
    "DECIMAL out of a narrower DECIMAL's range": (
        "SELECT d::DECIMAL(5,2) AS v FROM n",
        duckdb.ConversionException,
        r'^Conversion Error: Casting value "9999999999999999.99" to type DECIMAL\(5,2\) failed',
    ),
    "integer division by zero": (
        "SELECT id // z AS q FROM n",
        duckdb.InvalidInputException,
        r"^Invalid Input Error: Division by zero in expression",
    ),
    "modulo by zero": (
        "SELECT id % z AS q FROM n",
        duckdb.InvalidInputException,
        r"^Invalid Input Error: Division by zero in expression",
    ),
    "scalar subquery with several rows": (
        "SELECT (SELECT id FROM n WHERE z = 1) AS q",
        duckdb.InvalidInputException,
        r"^Invalid Input Error: More than one row returned by a subquery",
    ),
}


@pytest.mark.parametrize(("query", "cls", "message"), list(ERRORS.values()), ids=list(ERRORS))
def test_errors_are_duckdbs(
    nums: duckdb.DuckDBPyConnection, query: str, cls: type[Exception], message: str
) -> None:
    with pytest.raises(cls, match=message):
        nums.sql(query).fetchall()
    with pytest.raises(cls, match=message) as info:
        shoal.duckdb.sql(nums, query, raise_on_fail=True, config=CONFIGS["3 partitions"])
    assert isinstance(info.value, shoal.TaskError)


CHECKED_BUT_FINE = {
    "TRY_CAST": "SELECT id, TRY_CAST(s AS INT) AS a, TRY_CAST(big AS SMALLINT) AS b, "
    "TRY_CAST(big * 1.5 AS DECIMAL(4,1)) AS c, TRY_CAST(big AS DECIMAL(4,0)) AS e FROM n",
    "casts that fit": "SELECT id, s::INT AS a, big::BIGINT AS b, (id * 1000)::SMALLINT AS c, "
    "d::DECIMAL(20,1) AS e FROM n WHERE id <> 7",
    # DuckDB reads numbers with whitespace, integers from decimal and exponent forms
    # (rounded half away from zero), booleans from t/yes/y/1 and f/no/n/0.
    "text to numbers and booleans": "SELECT x, x::INT AS i, x::DOUBLE AS f, "
    "TRY_CAST(x AS DECIMAL(6,2)) AS d, TRY_CAST(x AS BOOLEAN) AS b FROM (VALUES (' 12 '), "
    "('+5'), ('-0'), ('2.5'), ('-2.5'), ('1e3'), (NULL), ('1'), ('0')) v(x)",
    "text to integers: grouped digits, hexadecimal, binary": "SELECT x, x::BIGINT AS i, "
    "TRY_CAST(x AS DOUBLE) AS f FROM (VALUES ('0x1F'), ('0X1f'), ('0b101'), ('1_000'), "
    "('1_000.5'), (' 12 '), ('7'), (NULL)) v(x)",
    "text to DATE and TIMESTAMP": "SELECT x, x::DATE AS d, x::TIMESTAMP AS t FROM (VALUES "
    "('1992-01-01'), ('1992-1-1'), ('1992-01-01 10:00:00'), ('1992-01-01T10:00:00.5'), "
    "('1992-01-01 10:00'), (NULL)) v(x)",
    "text to booleans": "SELECT x, x::BOOLEAN AS b FROM (VALUES ('TRUE'), ('f'), ('yes'), "
    "('0'), ('N'), (NULL), ('t')) v(x)",
    "truncating division and remainder": "SELECT id, neg // 3 AS a, neg % 3 AS b, "
    "neg // -3 AS c, neg % -3 AS e, (-id) // (z + 1) AS f, low // 3 AS g, low % 7 AS h FROM n",
    "arithmetic near the limits": "SELECT id, big * 1000 AS a, low + 2147483647 AS b, "
    "-neg AS c, abs(neg) AS e, d + 1 AS f FROM n WHERE id < 3",
}


@pytest.mark.parametrize("query", list(CHECKED_BUT_FINE.values()), ids=list(CHECKED_BUT_FINE))
def test_checks_do_not_change_answers(
    nums: duckdb.DuckDBPyConnection, config: shoal.Config, query: str
) -> None:
    check(nums, query, config)


# ---------------------------------------------------------------- found by DuckDB's suite

SUITE = {
    # any_value is the first non-NULL value in input order, arbitrary the first value.
    # (Not of a struct holding -0.0: DuckDB's any_value of a struct gives 0.0 there.)
    "any_value and arbitrary": "SELECT store, any_value(x) AS a, arbitrary(x) AS b, "
    "any_value(m.n) AS c FROM t GROUP BY store",
    "any_value without groups": "SELECT any_value(x) AS a, arbitrary(d) AS b, any_value(m) AS c "
    "FROM t",
    # A ROWS frame without ORDER BY runs in input order; a RANGE frame covers the partition.
    "ROWS frame without ORDER BY": "SELECT id, count(*) OVER (ROWS BETWEEN UNBOUNDED PRECEDING "
    "AND CURRENT ROW) AS c, sum(id) OVER (PARTITION BY store ROWS BETWEEN UNBOUNDED PRECEDING "
    "AND CURRENT ROW) AS s FROM t",
    "UNBOUNDED FOLLOWING with ORDER BY": "SELECT id, sum(id) OVER (ORDER BY id ROWS BETWEEN "
    "UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS s FROM t",
    "rank without ORDER BY": "SELECT id, rank() OVER () AS r, dense_rank() OVER "
    "(PARTITION BY store) AS d FROM t",
    # A projection of literals (or whole-input aggregates) alone keeps the input's rows.
    "count(*) OVER () alone": "SELECT count(*) OVER () AS n FROM t",
    "row_number() OVER () alone": "SELECT row_number() OVER () AS a, row_number() OVER () AS b "
    "FROM t",
    "constant subqueries per row": "SELECT exists(SELECT 1) AS e, (SELECT 42) AS f FROM t",
    "cross product with a table function": "SELECT count(*) AS n FROM t, range(5) r",
    "fdiv and fmod": "SELECT id, fdiv(x, 2) AS a, fmod(x, 2) AS b, fmod(-x, 3) AS c, "
    "fmod(x, -3) AS e FROM t",
    # DECIMAL(38) constants keep their 38 digits (not the 28 of Python's decimal context).
    "38-digit DECIMAL constants": "SELECT first('4567645908450368043562342564564938245.1'"
    "::DECIMAL(38,1))::VARCHAR AS a, ceil('-9999999999999999999999999999999999999.9'"
    "::DECIMAL(38,1)) AS b, sum(id * 1234567890123456789012345678901234::HUGEINT) AS c FROM t",
}


@pytest.mark.parametrize("query", list(SUITE.values()), ids=list(SUITE))
def test_found_by_duckdbs_suite(
    con: duckdb.DuckDBPyConnection, config: shoal.Config, query: str
) -> None:
    check(con, query, config)


IEEE_OFF = {
    "ln(0)": (
        "SELECT ln(x) FROM f WHERE x >= 0",
        r"^Out of Range Error: cannot take logarithm of zero",
    ),
    "log10 of a negative": (
        "SELECT log10(x) FROM f WHERE x <> 0",
        r"^Out of Range Error: cannot take logarithm of a negative number",
    ),
    "log(1, x)": (
        "SELECT log(1, x) FROM f WHERE x > 0",
        r"^Out of Range Error: division by zero in based logarithm",
    ),
    "sqrt of a negative": (
        "SELECT sqrt(x) FROM f",
        r"^Out of Range Error: cannot take square root of a negative number",
    ),
    "zero to a negative power": (
        "SELECT power(x, -1) FROM f",
        r"^Out of Range Error: zero raised to a negative power is undefined",
    ),
}


@pytest.fixture(scope="module")
def strict_math() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    c.execute("SET ieee_floating_point_ops = false").fetchall()
    c.execute(
        "CREATE TABLE f AS SELECT * FROM (VALUES (64.0::DOUBLE), (0.0), (-1.0), (NULL), "
        "('nan'::DOUBLE), (2.5), (-0.0::DOUBLE)) v(x)"
    ).fetchall()
    yield c
    c.close()


@pytest.mark.parametrize(("query", "message"), list(IEEE_OFF.values()), ids=list(IEEE_OFF))
def test_math_errors_without_ieee_semantics(
    strict_math: duckdb.DuckDBPyConnection, query: str, message: str
) -> None:
    with pytest.raises(duckdb.OutOfRangeException, match=message):
        strict_math.sql(query).fetchall()
    with pytest.raises(duckdb.OutOfRangeException, match=message):
        shoal.duckdb.sql(strict_math, query, raise_on_fail=True, config=CONFIGS["3 partitions"])


def test_math_without_ieee_semantics_where_defined(strict_math: duckdb.DuckDBPyConnection) -> None:
    q = "SELECT x, ln(x) AS a, sqrt(x) AS b, log(2, x) AS c, x / 2 AS e FROM f WHERE x > 0"
    check(strict_math, q, CONFIGS["3 partitions"])
    with pytest.raises(duckdb.InvalidInputException, match="Division by zero"):
        shoal.duckdb.sql(
            strict_math, "SELECT x / 0 FROM f", raise_on_fail=True, config=CONFIGS["3 partitions"]
        )


def test_float_sum_with_order_by_falls_back(con: duckdb.DuckDBPyConnection) -> None:
    # The order of a floating-point sum changes its rounding: shoal does not pretend.
    with pytest.raises(shoal.UnsupportedError, match="floating-point values with ORDER BY"):
        shoal.duckdb.sql(
            con,
            "SELECT sum(x ORDER BY id) FROM t",
            raise_on_fail=True,
            config=CONFIGS["3 partitions"],
        )
    check(con, "SELECT sum(id ORDER BY x) AS s FROM t", CONFIGS["3 partitions"])


def test_nested_min_max_and_list_comparisons_fall_back(lists: duckdb.DuckDBPyConnection) -> None:
    # Not crashes in a task: reported before anything runs.
    # (``a.l < b.l`` of two lists is computed by DuckDB in the tasks: test_duckdb_fragment.)
    for query in ("SELECT max(s) FROM l", "SELECT min(l) FROM l"):
        with pytest.raises(shoal.UnsupportedError, match="STRUCT|LIST"):
            shoal.duckdb.sql(lists, query, raise_on_fail=True, config=CONFIGS["3 partitions"])


@pytest.fixture(scope="module")
def pairs() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE pl AS SELECT * FROM (VALUES (1, 10), (1, 11), (2, 20), (3, 30), (NULL, 40), "
        "(4, NULL)) v(a, x); "
        "CREATE TABLE pr AS SELECT * FROM (VALUES (10, 'p'), (20, 'q'), (30, NULL), (40, 'r'), "
        "(NULL, 's')) v(b, y); "
        "CREATE TABLE ps AS SELECT * FROM (VALUES (1, 10), (1, 20), (2, 20), (NULL, 30), "
        "(3, NULL), (4, 10)) v(a, b)"
    ).fetchall()
    yield c
    c.close()


CORRELATED = {
    # DuckDB's mark join of a correlated NOT IN: the NULL counts are per correlated value.
    "correlated NOT IN in a join condition": "SELECT l.a, l.x, r.b FROM pl l LEFT JOIN pr r "
    "ON r.b NOT IN (SELECT s.b FROM ps s WHERE s.a = l.a)",
    "scalar subquery with several rows is DuckDB's error": "SELECT l.a, (SELECT s.b FROM ps s "
    "WHERE s.a = l.a AND s.b > 100) AS b FROM pl l",
    "correlated IN as a value": "SELECT l.a, l.x, l.x IN (SELECT s.b * 1 FROM ps s "
    "WHERE s.a = l.a) AS i FROM pl l",
    "correlated NOT IN with NULL probes": "SELECT r.b, r.y FROM pr r WHERE r.b NOT IN "
    "(SELECT s.b FROM ps s WHERE s.a = r.b // 10)",
    "NULL IN an empty correlated set": "SELECT l.a, NULL::INT IN (SELECT s.b FROM ps s "
    "WHERE s.a = l.a + 100) AS i FROM pl l",
    # DuckDB repeats a join condition for PARTITION BY a, a.
    "repeated PARTITION BY key": "SELECT a, x, sum(x) OVER (PARTITION BY a, a) AS s1, "
    "sum(x) OVER (PARTITION BY a) AS s2 FROM pl",
}


@pytest.mark.parametrize("query", list(CORRELATED.values()), ids=list(CORRELATED))
def test_correlated_subqueries(
    pairs: duckdb.DuckDBPyConnection, config: shoal.Config, query: str
) -> None:
    check(pairs, query, config)


@pytest.fixture(scope="module")
def temporal() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE d AS SELECT * FROM (VALUES "
        "(DATE '1992-01-01', TIMESTAMP '1992-03-02 10:30:20.123456', 'hello', 'ho'), "
        "(NULL, NULL, 'test', NULL), "
        "(DATE '2020-08-09', TIMESTAMP '2020-08-09 00:00:00', 'mühleisen', 'mün'), "
        "(DATE '1960-05-05', TIMESTAMP '1960-01-01 01:23:45.5', 'x', 'x'), "
        "(DATE '2000-02-29', TIMESTAMP '2020-01-01 01:23:45.12', '  y ', ' ')) v(d, ts, a, b)"
    ).fetchall()
    yield c
    c.close()


TEMPORAL_AND_STRINGS = {
    # DuckDB writes the fraction of a second only when it is not zero, without trailing zeros.
    "TIMESTAMP to VARCHAR": "SELECT ts::VARCHAR AS a, ts::TIMESTAMP_S::VARCHAR AS b, "
    "ts::TIMESTAMP_MS::VARCHAR AS c, ts::TIMESTAMP_NS::VARCHAR AS e, ts::TIME::VARCHAR AS f FROM d",
    # To a coarser TIMESTAMP: rounded half away from zero (before 1970 too).
    "TIMESTAMP to TIMESTAMP_S and _MS": "SELECT ts, ts::TIMESTAMP_S AS s, ts::TIMESTAMP_MS AS m "
    "FROM d",
    # strftime: %x, %X, %c, %f, %g, %n are DuckDB's (chrono's differ); a DATE is its midnight.
    "strftime specifiers": "SELECT strftime(d, '%x') AS a, strftime(d, '%H:%M') AS b, "
    "strftime(ts, '%x %X|%c|%f|%g|%n|%-d|%j|%p|%I') AS c FROM d",
    # trim(a, NULL) is NULL (Polars would strip whitespace).
    "trim with NULL characters": "SELECT ltrim(a, b) AS l, rtrim(a, b) AS r, trim(a, b) AS t, "
    "trim(a, NULL) AS n, trim(a) AS s FROM d",
}


@pytest.mark.parametrize(
    "query", list(TEMPORAL_AND_STRINGS.values()), ids=list(TEMPORAL_AND_STRINGS)
)
def test_temporal_and_string_forms(
    temporal: duckdb.DuckDBPyConnection, config: shoal.Config, query: str
) -> None:
    check(temporal, query, config)


def test_substring_offsets_out_of_range(temporal: duckdb.DuckDBPyConnection) -> None:
    for query, message in (
        ("SELECT substring(a, 9223372036854775807, 2) FROM d", r"offset .*\(> 4294967295\)"),
        ("SELECT substring(a, 2, 4294967296) FROM d", r"length .*\(> 4294967295\)"),
    ):
        with pytest.raises(duckdb.OutOfRangeException, match=message):
            temporal.sql(query).fetchall()
        with pytest.raises(duckdb.OutOfRangeException, match=message):
            shoal.duckdb.sql(temporal, query, raise_on_fail=True, config=CONFIGS["3 partitions"])


def test_correlated_subquery_with_hash_joins(pairs: duckdb.DuckDBPyConnection) -> None:
    # DuckDB joins on a column twice (l = r1 AND l IS NOT DISTINCT FROM r2); hashing on it
    # twice crashed the exchange (DuplicateError).
    hash_joins = shoal.Config(
        runner="local", default_partitions=3, shuffle_partitions=3, broadcast_join_threshold_bytes=0
    )
    check(
        pairs,
        "SELECT l.a, l.x, r.b FROM pl l LEFT JOIN pr r ON r.b = "
        "(SELECT max(s.b) FROM ps s WHERE s.a = l.a AND s.b <= r.b)",
        hash_joins,
    )
    check(
        pairs,
        "SELECT l.a, l.x, (SELECT count(*) FROM ps s WHERE s.a = l.a AND s.b >= l.x) AS n "
        "FROM pl l",
        hash_joins,
    )
    # A mark join on one column twice (correlated ANY): joins on a copy of the column.
    check(pairs, "SELECT a, a = ANY(SELECT a FROM ps WHERE a = l.a) AS y FROM pl l", hash_joins)
    check(pairs, "SELECT a, x > ALL(SELECT b FROM ps WHERE a = l.a) AS y FROM pl l", hash_joins)
