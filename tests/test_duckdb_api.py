"""DuckDB's way of working: ``shoal.duckdb.sql(query, connection=None)`` returning a lazy
relation, ``shoal.duckdb.connect()`` / ``install(con)`` connections whose queries run on
shoal, and results read as Arrow streams. Every answer is compared with DuckDB's own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import shoal
import shoal_duckdb
from shoal.runners.session import last_query

CONFIG = shoal.Config(default_partitions=3, shuffle_partitions=3, runner="local")


def same(got: Any, want: Any) -> None:
    """Equal rows (NaN equal to NaN: compared by their text)."""
    assert repr(got) == repr(want)


def same_table(got: pa.Table, want: pa.Table) -> None:
    assert got.schema == want.schema
    assert_frame_equal(pl.DataFrame(got), pl.DataFrame(want))


QUERY = "SELECT k, sum(v) AS total, count(*) AS n, min(s) AS first FROM t GROUP BY k ORDER BY k"


def _fill(con: Any) -> None:
    con.execute(
        "CREATE OR REPLACE TABLE t AS SELECT * FROM (VALUES "
        "(1, 1.5, 'a'), (2, 'nan'::DOUBLE, 'b'), (2, 2.0, NULL), (NULL, NULL, 'd'), "
        "(3, -0.0, 'e'), (1, 2.0, 'a'), (4, 7.0, 'g'), (2, -3.0, 'b')) AS v(k, v, s)"
    )


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    c = duckdb.connect()
    _fill(c)
    yield c
    c.close()


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Counts the queries shoal runs for the DuckDB frontend."""
    calls: list[object] = []
    real = shoal_duckdb.api._execute_result

    def counted(*args: Any) -> Any:
        calls.append(args[0])
        return real(*args)

    monkeypatch.setattr(shoal_duckdb.api, "_execute_result", counted)
    return calls


def test_sql_is_lazy_and_reads_like_a_duckdb_relation(
    con: duckdb.DuckDBPyConnection, runs: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    native = con.sql(QUERY)
    rel = shoal.duckdb.sql(QUERY, connection=con, raise_on_fail=True, config=CONFIG)
    assert isinstance(rel, shoal.duckdb.DistRelation)
    assert rel.columns == native.columns and rel.types == native.types
    assert runs == []  # nothing ran yet
    same(rel.fetchall(), native.fetchall())
    assert len(runs) == 1
    assert_frame_equal(rel.pl(), native.pl())
    same_table(rel.to_arrow_table(), native.to_arrow_table())
    reader = rel.arrow()
    assert isinstance(reader, pa.RecordBatchReader)
    same_table(reader.read_all(), native.to_arrow_table())
    assert rel.df().equals(native.df())  # pandas: NaN equals NaN
    rel.show()
    assert "total" in capsys.readouterr().out
    same(rel.filter("k > 1").fetchall(), native.filter("k > 1").fetchall())
    assert len(runs) == 1  # every read reuses the one result
    assert len(rel) == len(native.fetchall())


def test_the_relation_is_an_arrow_stream(con: duckdb.DuckDBPyConnection) -> None:
    rel = shoal.duckdb.sql(QUERY, connection=con, raise_on_fail=True, config=CONFIG)
    native = con.sql(QUERY).to_arrow_table()
    assert_frame_equal(pl.DataFrame(rel), pl.DataFrame(native))
    same_table(pa.table(rel), native)
    # DuckDB's replacement scan reads it (on the same connection and on another)
    assert con.sql("SELECT count(*), sum(n) FROM rel").fetchall() == [(5, 8)]
    assert duckdb.sql("SELECT sum(n) FROM rel").fetchall() == [(8,)]


def test_sql_defaults_to_duckdbs_default_connection() -> None:
    default = duckdb.default_connection()
    _fill(default)
    try:
        rel = shoal.duckdb.sql(QUERY, raise_on_fail=True, config=CONFIG)
        same(rel.fetchall(), duckdb.sql(QUERY).fetchall())
    finally:
        default.execute("DROP TABLE t")


def test_runtime_errors_come_when_read_as_in_duckdb(
    con: duckdb.DuckDBPyConnection, runs: list[object]
) -> None:
    query = "SELECT CAST(s AS INTEGER) FROM t"
    native = con.sql(query)  # DuckDB too raises only when the relation is read
    with pytest.raises(duckdb.ConversionException):
        native.fetchall()
    rel = shoal.duckdb.sql(query, connection=con, raise_on_fail=True, config=CONFIG)
    with pytest.raises(duckdb.ConversionException):
        rel.fetchall()
    # bad input still raises at once, before anything runs
    with pytest.raises(duckdb.CatalogException):
        shoal.duckdb.sql("SELECT * FROM missing", connection=con, config=CONFIG)
    with pytest.raises(duckdb.ParserException):
        shoal.duckdb.sql("SELEC 1", connection=con, config=CONFIG)
    assert len(runs) == 1


def test_the_earlier_form_runs_at_once(con: duckdb.DuckDBPyConnection, runs: list[object]) -> None:
    rel = shoal.duckdb.sql(con, QUERY, raise_on_fail=True, config=CONFIG)
    assert isinstance(rel, duckdb.DuckDBPyRelation)
    assert len(runs) == 1
    same(rel.fetchall(), con.sql(QUERY).fetchall())
    with pytest.raises(TypeError):
        shoal.duckdb.sql(con, QUERY, connection=con)
    with pytest.raises(TypeError):
        shoal.duckdb.sql(42)  # type: ignore[arg-type]


def test_fallback_returns_duckdbs_relation_with_a_shoal_fallback_warning(
    con: duckdb.DuckDBPyConnection,
) -> None:
    query = "SELECT approx_count_distinct(k) FROM t"
    with pytest.warns(shoal.ShoalFallbackWarning):
        rel = shoal.duckdb.sql(query, connection=con, config=CONFIG)
    same(rel.fetchall(), con.sql(query).fetchall())


def test_connect_gives_a_connection_that_runs_selects_on_shoal(runs: list[object]) -> None:
    with shoal.duckdb.connect(shoal_config=CONFIG, raise_on_fail=True) as con:
        _fill(con)  # DDL runs on DuckDB, not counted
        assert runs == []
        native = con.connection
        rel = con.sql(QUERY)
        assert isinstance(rel, shoal.duckdb.DistRelation)
        same(rel.fetchall(), native.sql(QUERY).fetchall())
        same(con.table("t").fetchall(), native.table("t").fetchall())
        got = con.execute("SELECT k, v FROM t WHERE k > ? ORDER BY k, v", [1])
        assert got is con
        expected = native.execute("SELECT k, v FROM t WHERE k > ? ORDER BY k, v", [1]).fetchall()
        same(con.fetchone(), expected[0])
        same(con.fetchmany(2), expected[1:3])
        same(con.fetchall(), expected[3:])
        con.execute(QUERY)
        assert_frame_equal(con.pl(), native.sql(QUERY).pl())
        same_table(con.execute(QUERY).fetch_arrow_table(), native.sql(QUERY).to_arrow_table())
        cur = con.cursor()
        assert isinstance(cur, shoal.duckdb.DistConnection)
        same(cur.sql(QUERY).fetchall(), native.sql(QUERY).fetchall())
        assert con.execute("INSERT INTO t VALUES (9, 9.0, 'z')").fetchall() == [(1,)]
        assert con.get_table_names("SELECT * FROM t") == {"t"}  # the connection's own
        assert len(runs) == 6


def test_install_wraps_an_existing_connection(con: duckdb.DuckDBPyConnection) -> None:
    dist = shoal.duckdb.install(con, config=CONFIG, raise_on_fail=True)
    before = last_query()
    same(dist.sql(QUERY).fetchall(), con.sql(QUERY).fetchall())
    assert last_query() is not before
    with pytest.raises(TypeError):
        shoal.duckdb.install("not a connection")  # type: ignore[arg-type]


def test_public_names() -> None:
    for name in ("register_udf", "connect", "install", "DistRelation", "DistConnection", "sql"):
        assert name in shoal_duckdb.__all__
        assert hasattr(shoal.duckdb, name)
