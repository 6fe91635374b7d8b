"""shoal.duckdb: queries where shoal raised while DuckDB answered, or raised another
exception class than DuckDB (the conformance run's "crashed" records), each compared with
native DuckDB (``con.sql(q)``) on tables split into several partitions, with NULLs,
duplicates and a partition a filter empties. Local runner throughout."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pytest

import shoal

#: Tiny partitions: every in-memory table is split into 3 partitions.
CONFIG = shoal.Config(
    runner="local", default_partitions=3, shuffle_partitions=3, target_partition_bytes=256
)


def check(con: duckdb.DuckDBPyConnection, query: str, ordered: bool = False) -> list[Any]:
    """``query`` on shoal (``raise_on_fail=True``) and on DuckDB: the same column names,
    types and rows (a multiset unless ``ordered``). Returns DuckDB's rows."""
    got_rel = shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    want_rel = con.sql(query)
    assert [str(t) for t in got_rel.types] == [str(t) for t in want_rel.types]
    got, want = got_rel.fetchall(), want_rel.fetchall()
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want
    return want


def check_raises(con: duckdb.DuckDBPyConnection, query: str) -> type[BaseException]:
    """``query`` raises on DuckDB, and on shoal an error of DuckDB's class."""
    with pytest.raises(duckdb.Error) as native:
        con.sql(query).fetchall()
    cls = type(native.value)
    with pytest.raises(cls):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG).fetchall()
    return cls


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    """Table t (30 rows): i unique, g a key with duplicates and NULLs, txt text, d a
    DECIMAL(38,1) near its limit, ts a TIMESTAMP with NULLs, s a STRUCT with NULLs."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE t AS
        SELECT i, CASE WHEN i % 7 = 3 THEN NULL ELSE i % 4 END AS g,
               CASE WHEN i % 5 = 0 THEN NULL ELSE '[' || i || ', ' || (i % 3) || ']' END AS txt,
               9900000000000000000000000000000000000.0::DECIMAL(38,1) - i AS d,
               CASE WHEN i % 6 = 1 THEN NULL
                    ELSE TIMESTAMP '2020-03-01 10:00:00' + INTERVAL (i) HOUR END AS ts,
               CASE WHEN i % 8 = 2 THEN NULL
                    ELSE {'a': i % 5, 'b': i % 2 = 0, 'c': 'x' || i} END AS s
        FROM range(30) r(i)"""
    )
    yield c
    c.close()


# ---------------------------------------------------------------- scalar subqueries


def test_scalar_subquery_any_row_when_the_setting_allows_several(
    con: duckdb.DuckDBPyConnection,
) -> None:
    """``SET scalar_subquery_error_on_multiple_rows=false``: a correlated scalar subquery
    with several rows gives one of them (here all equal) instead of raising."""
    con.execute("SET scalar_subquery_error_on_multiple_rows=false")
    check(con, "SELECT i, (SELECT 42 + t.g FROM t t2) AS j FROM t WHERE i < 20")
    check(con, "SELECT i, (SELECT t2.g FROM t t2 WHERE t2.g = t.g) AS j FROM t")
    check(con, "SELECT i, (SELECT t2.g FROM t t2 WHERE t2.g = t.g AND t2.i > 100) FROM t")
    # Different rows: DuckDB's pick is its hash table's; shoal fails rather than guess.
    query = "SELECT i, (SELECT t2.i FROM t t2 WHERE t2.g = t.g) AS j FROM t"
    with pytest.raises(shoal.TaskError, match="several different rows"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG).fetchall()
    con.execute("SET scalar_subquery_error_on_multiple_rows=true")
    check_raises(con, "SELECT i, (SELECT t2.g FROM t t2 WHERE t2.g = t.g) AS j FROM t")


# ---------------------------------------------------------------- DECIMAL(38) and HUGEINT


@pytest.mark.parametrize(
    "query",
    [
        "SELECT d * 1.0 FROM t",
        "SELECT d * 2::DECIMAL(1,0) FROM t",
        "SELECT -d - d FROM t",
    ],
)
def test_decimal38_overflow_is_out_of_range(con: duckdb.DuckDBPyConnection, query: str) -> None:
    assert check_raises(con, query) is duckdb.OutOfRangeException


def test_decimal38_arithmetic_that_fits(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT d * 1.0 FROM t WHERE i > 100")  # empty: no row overflows
    check(con, "SELECT (d / 1e20) * 1.0, d - d FROM t WHERE i % 3 = 0")
    # An operand wider than the result's integer digits, a product that fits.
    check(con, "SELECT i, d * 0.01 FROM t")


def test_hugeint_keys_of_39_digits_fall_back(con: duckdb.DuckDBPyConnection) -> None:
    """HUGEINT values beyond DECIMAL(38) are refused when translating (Polars panicked
    on them in the tasks: in hash tables, and in a sort's range split, which builds a
    Series of them); smaller ones run."""
    con.execute("CREATE TABLE h(k HUGEINT)")
    con.execute(
        "INSERT INTO h VALUES (-170141183460469231731687303715884105728), (3), (3), (NULL),"
        " (170141183460469231731687303715884105727)"
    )
    query = "SELECT k, count(*) FROM h GROUP BY k"
    with pytest.raises(shoal.UnsupportedError, match="39 digits"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    with pytest.warns(shoal.duckdb.DuckDBFallbackWarning):
        got = shoal.duckdb.sql(con, query, config=CONFIG).fetchall()
    assert sorted(got, key=repr) == sorted(con.sql(query).fetchall(), key=repr)
    sort = "SELECT k FROM h ORDER BY k DESC"
    with pytest.raises(shoal.UnsupportedError, match="39 digits"):
        shoal.duckdb.sql(con, sort, raise_on_fail=True, config=CONFIG)
    con.execute("DELETE FROM h WHERE k > 10 OR k < -10")
    check(con, query)
    check(con, "SELECT [-100::BIGINT, 9999999999999999999::UBIGINT, NULL] FROM h")


# ---------------------------------------------------------------- casts


def test_struct_casts_match_fields_by_name(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT i, s::STRUCT(b BOOL, a INTEGER, c VARCHAR) FROM t")
    check(con, "SELECT i, s::STRUCT(c VARCHAR, b INTEGER, a BIGINT) FROM t")
    check(con, "SELECT i, [s]::STRUCT(b INTEGER, c VARCHAR, a BIGINT)[] FROM t")
    # A field of a nested STRUCT column (DuckDB pushes the field into the scan).
    con.execute("CREATE TABLE n AS SELECT i, {'x': i, 'inner': s} AS o FROM t")
    check(con, "SELECT o.inner::STRUCT(b INTEGER, a BIGINT, c VARCHAR) FROM n")


def test_text_to_list_casts(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT i, txt::INTEGER[] FROM t")
    check(con, "SELECT i, TRY_CAST(txt || ']' AS INTEGER[]) FROM t")
    assert check_raises(con, "SELECT (txt || ',')::INTEGER[] FROM t") is duckdb.ConversionException
    assert check_raises(con, "SELECT i::DOUBLE::INTEGER[] FROM t") is duckdb.ConversionException
    query = "SELECT s::STRUCT(a INTEGER, b BOOL, c VARCHAR)[] FROM t"
    assert check_raises(con, query) is duckdb.ConversionException


def test_list_and_struct_to_text(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT i, txt::INTEGER[]::VARCHAR, s::VARCHAR FROM t")


def test_timestamp_to_nanoseconds(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT i, ts::TIMESTAMP_NS, ts::TIMESTAMP_S::TIMESTAMP_NS FROM t")
    con.execute("CREATE TABLE far AS SELECT TIMESTAMP '90000-01-19 03:14:07.999999' AS ts")
    check(con, "SELECT TRY_CAST(ts AS TIMESTAMP_NS) FROM far")
    assert check_raises(con, "SELECT ts::TIMESTAMP_NS FROM far") is duckdb.ConversionException


def test_strftime_zone_of_naive_values(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT i, strftime(ts, '%Y-%m-%d %H:%M %z|%Z') FROM t")
    check(con, "SELECT i, strftime(ts::DATE, '%z %d') FROM t")


def test_limit_of_text(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT i FROM t ORDER BY i LIMIT (SELECT '4')", ordered=True)
    check(con, "SELECT i FROM t ORDER BY i LIMIT (SELECT NULL::VARCHAR)", ordered=True)
    query = "SELECT i FROM t LIMIT (SELECT 'ab')"
    assert check_raises(con, query) is duckdb.InvalidInputException


# ---------------------------------------------------------------- ASOF joins


def test_asof_join_on_struct_keys_falls_back(con: duckdb.DuckDBPyConnection) -> None:
    query = (
        "SELECT a.i, b.i FROM t a ASOF JOIN t b"
        " ON {'g': a.g} = {'g': b.g} AND a.ts >= b.ts + INTERVAL 1 HOUR"
    )
    with pytest.raises(shoal.UnsupportedError, match="keys is not supported"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    with pytest.warns(shoal.duckdb.DuckDBFallbackWarning):
        got = shoal.duckdb.sql(con, query, config=CONFIG).fetchall()
    assert sorted(got, key=repr) == sorted(con.sql(query).fetchall(), key=repr)
