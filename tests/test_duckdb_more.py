"""shoal.duckdb: TUPLE values (unnamed STRUCTs), mark joins (``IN``/``= ANY`` subqueries)
and the other constructs that fell back or answered wrong, compared with native DuckDB
(``con.sql(q)``) on tables split into several partitions, with NULLs, duplicates and a
partition a filter empties. Local runner throughout."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from .test_duckdb_crashes import check


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    """l (k, x) and r (k, y): keys with NULLs and duplicates; rows with k = 9 are the ones
    a filter removes."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE l AS SELECT * FROM (VALUES (1, 1), (NULL, 2), (NULL, 5), (3, NULL),
        (1, 1), (2, 7), (9, 9), (9, 9), (4, 4), (NULL, NULL)) v(k, x)"""
    )
    c.execute(
        """CREATE TABLE r AS SELECT * FROM (VALUES (1, 1), (NULL, 2), (3, 4), (3, NULL),
        (2, 7), (2, 7), (9, 9), (4, NULL)) v(k, y)"""
    )
    yield c
    c.close()


def test_correlated_in_matches_null_correlated_keys(con: duckdb.DuckDBPyConnection) -> None:
    """DuckDB decorrelates with IS NOT DISTINCT FROM: a NULL correlated value finds the
    right rows whose key is NULL (shoal answered FALSE where DuckDB answers TRUE)."""
    for op in ("IN", "NOT IN"):
        check(
            con, f"SELECT k, x, x {op} (SELECT y FROM r WHERE r.k IS NOT DISTINCT FROM l.k) FROM l"
        )
        check(con, f"SELECT k, x, x {op} (SELECT y FROM r WHERE r.k = l.k AND r.k < 9) FROM l")
    check(con, "SELECT k, x, x = ANY (SELECT y FROM r WHERE r.k IS NOT DISTINCT FROM l.k) FROM l")


def test_tuples(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT row(k, x) AS a, (k, 'v' || x) AS b FROM l")
    check(con, "SELECT row(k, x) = row(1, 1), row(k, x) < (2, 0), (k, x) IS NULL FROM l")
    check(con, "SELECT r[1], r[2] FROM (SELECT row(k, x) AS r FROM l WHERE k < 9)")
    check(con, "SELECT (k, x) AS t, count(*) FROM l GROUP BY 1")
    check(con, "SELECT (k, x) AS t FROM l ORDER BY t", ordered=True)
    check(con, "SELECT (1, 'a') AS t, NULL::TUPLE(INTEGER, VARCHAR) AS n")


def test_tuple_in_correlated_subquery(con: duckdb.DuckDBPyConnection) -> None:
    check(
        con,
        "SELECT k, x, row(k, x) = ANY (SELECT (r.k, r.y) FROM r WHERE r.k = l.k) FROM l",
    )


@pytest.mark.parametrize(
    "query",
    [
        "SELECT k, x, (k, x) IN (SELECT k, y FROM r) FROM l",
        "SELECT k, x, (k, x) NOT IN (SELECT k, y FROM r WHERE k < 3) FROM l",
        "SELECT k, x, (k, x) IN (SELECT k, y FROM r WHERE k > 100) FROM l",
        "SELECT k, x, (k, x) IN (SELECT k, y FROM r WHERE y IS NOT NULL) FROM l",
        "SELECT k, x, (k, x, k) IN (SELECT k, y, k + 0 FROM r) FROM l",
        "SELECT k, x, (x, k) = ANY (SELECT y, k FROM r WHERE k <> 9) FROM l WHERE k IS NULL OR k < 9",
        "SELECT k, x FROM l WHERE (k, x) NOT IN (SELECT k, y FROM r WHERE y IS NOT NULL)",
    ],
)
def test_mark_join_on_several_equalities(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """``(a, b) IN (SELECT x, y ...)``: TRUE on a match, else NULL where some right row
    has no unequal pair but a NULL in one, else FALSE."""
    check(con, query)
