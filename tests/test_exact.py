"""Exactness fixes from the conformance suites and found-bugs.md (branch ``exact``): each
query runs on shoal's local runner with ``raise_on_fail=True`` on inputs split into several
partitions (hash joins on both sides) and is compared with the framework's own answer
(native Polars ``collect()``, native DuckDB ``con.sql``), with NULLs, NaN, -0.0 and
duplicates."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal

PARTITIONS = (1, 3, 7)


def _config(partitions: int) -> shoal.Config:
    return shoal.Config(
        runner="local",
        default_partitions=partitions,
        shuffle_partitions=partitions,
        target_partition_bytes=64,
        broadcast_join_threshold_bytes=0,
    )


def _key(row: tuple[Any, ...]) -> str:
    return repr(tuple("nan" if isinstance(v, float) and math.isnan(v) else v for v in row))


def check_sql(con: duckdb.DuckDBPyConnection, query: str) -> list[Any]:
    """``query`` on shoal and on DuckDB: the same column types and the same multiset of
    rows (NaN equal to NaN) at every partition count. Returns DuckDB's rows."""
    want_rel = con.sql(query)
    want = sorted(map(_key, want_rel.fetchall()))
    for n in PARTITIONS:
        got_rel = shoal.duckdb.sql(con, query, raise_on_fail=True, config=_config(n))
        assert [str(t) for t in got_rel.types] == [str(t) for t in want_rel.types]
        assert sorted(map(_key, got_rel.fetchall())) == want, (n, query)
    return want


def check_polars(lf: pl.LazyFrame) -> None:
    """``lf`` on shoal equals native Polars (rows in any order) at every partition count."""
    want = lf.collect()
    for n in PARTITIONS:
        got = lf.collect(engine=shoal.DistEngine(config=_config(n), raise_on_fail=True))
        assert_frame_equal(got, want, check_row_order=False)


# ---------------------------------------------------------------- computed join keys


@pytest.fixture
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    """l(k, x) and r(k, y): duplicate keys, NULLs, NaN, 0.0 against -0.0."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE l AS SELECT * FROM (VALUES (1, 0.0::DOUBLE), (2, -0.0), (2, 'nan'),
           (NULL, 1.5), (3, NULL), (5, -0.0), (7, 'nan'), (7, 'nan'), (8, 2.0)) t(k, x)"""
    )
    c.execute(
        """CREATE TABLE r AS SELECT * FROM (VALUES (1, -0.0::DOUBLE), (2, 0.0), (NULL, 1.5),
           (3, NULL), (4, 1.0), (5, 0.0), (7, 'nan'), (8, 2.0), (8, 2.0)) t(k, y)"""
    )
    yield c
    c.close()


@pytest.mark.parametrize("how", ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"])
def test_duckdb_join_on_a_struct_built_of_columns(con: duckdb.DuckDBPyConnection, how: str) -> None:
    """A join key that is a STRUCT built of columns (its fields are named: Polars refused
    the ``alias`` in the join key, in the task) is computed before the join."""
    rows = check_sql(
        con, f"SELECT * FROM l {how} r ON {{'a': l.k, 'b': l.x}} = {{'a': r.k, 'b': r.y}}"
    )
    assert rows


def test_duckdb_join_on_structs_lists_and_expressions(con: duckdb.DuckDBPyConnection) -> None:
    check_sql(con, "SELECT * FROM l JOIN r ON {'a': l.k} = {'a': r.k} AND l.x = r.y")
    check_sql(con, "SELECT * FROM l JOIN r ON [l.k, l.x] = [r.k, r.y]")
    check_sql(con, "SELECT * FROM l JOIN r ON l.k + 1 = r.k + 1 AND l.x = r.y")
    check_sql(con, "SELECT * FROM l WHERE {'a': l.k, 'b': l.x} IN (SELECT {'a': k, 'b': y} FROM r)")


@pytest.mark.parametrize("how", ["inner", "left", "right", "full", "semi", "anti"])
@pytest.mark.parametrize("nulls_equal", [False, True])
def test_polars_join_on_struct_keys(how: str, nulls_equal: bool) -> None:
    """``join`` on ``pl.struct(...)`` keys (lowered with field aliases) as Polars answers."""
    left = pl.LazyFrame(
        {
            "k": [1, 2, 2, None, 3, 5, 7, 7],
            "f": [0.0, -0.0, math.nan, 1.5, None, -0.0, math.nan, 2.0],
        }
    )
    right = pl.LazyFrame(
        {"k": [1, 2, None, 3, 4, 5, 7, 7], "f": [-0.0, 0.0, 1.5, None, 1.0, 0.0, math.nan, 2.0]}
    )
    check_polars(
        left.join(
            right,
            left_on=pl.struct("k", "f"),
            right_on=pl.struct("k", "f"),
            how=how,  # type: ignore[arg-type]
            nulls_equal=nulls_equal,
        )
    )


@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
@pytest.mark.parametrize("coalesce", [True, False])
def test_polars_join_on_a_column_and_an_expression(how: str, coalesce: bool) -> None:
    """A column key beside a computed one: Polars turns coalescing off for the whole join
    (the output keeps both ``k`` and ``k_right``); shoal's computed keys must too."""
    left = pl.LazyFrame({"k": [1, 2, 2, None, 3], "x": [10, 20, 20, 5, None]})
    right = pl.LazyFrame({"k": [1, 2, None, 3, 4], "x": [10, 20, 5, None, 1]})
    check_polars(
        left.join(
            right,
            left_on=[pl.col("k"), pl.struct("x")],
            right_on=[pl.col("k"), pl.struct("x")],
            how=how,  # type: ignore[arg-type]
            coalesce=coalesce,
        )
    )


# ---------------------------------------------------------------- HUGEINT constants


@pytest.fixture
def huge() -> Iterator[duckdb.DuckDBPyConnection]:
    """t(i HUGEINT[], h HUGEINT): NULLs, duplicates, an empty list, a list holding NULL."""
    c = duckdb.connect()
    c.execute("CREATE TABLE t (i HUGEINT[], h HUGEINT)")
    c.execute(
        """INSERT INTO t VALUES ([2], 2), ([1], 1), ([1, 2], NULL), ([], 3), ([NULL], 4),
           ([2, 3], 3), (NULL, -12345678901234567890123456789), ([-1, 0], 0)"""
    )
    yield c
    c.close()


@pytest.mark.parametrize(
    "expr",
    [
        # 39-digit constants: the kernel's DECIMAL(38) cannot hold them (the task raised
        # Polars' InvalidOperationError); DuckDB computes such an expression in the task.
        "list_contains(i, 170141183460469231731687303715884105727)",
        "list_contains([170141183460469231731687303715884105727::HUGEINT, 1], h)",
        "h = -170141183460469231731687303715884105727",
        "h IN (1, 170141183460469231731687303715884105727)",
        # an IN list of HUGEINT constants mixing small and large values (a TypeError
        # building the list of DECIMAL(38) values from Python ints)
        "h IN (1, 12345678901234567890123456789)",
        "h NOT IN (3, -12345678901234567890123456789, NULL)",
        "list_contains(i, h)",
        "list_contains(i, 12345678901234567890123456789)",
    ],
)
def test_hugeint_constants(huge: duckdb.DuckDBPyConnection, expr: str) -> None:
    check_sql(huge, f"SELECT h, {expr} AS x FROM t")


def test_hugeint_overflow_raises_duckdbs_class(huge: duckdb.DuckDBPyConnection) -> None:
    query = "SELECT h + 170141183460469231731687303715884105727 FROM t"
    with pytest.raises(duckdb.OutOfRangeException):
        huge.sql(query).fetchall()
    with pytest.raises(duckdb.OutOfRangeException):
        shoal.duckdb.sql(huge, query, raise_on_fail=True, config=_config(3)).fetchall()


def test_hugeint_of_39_digits_in_a_table_falls_back(huge: duckdb.DuckDBPyConnection) -> None:
    """A table holding 39-digit HUGEINT values is refused (the kernel's DECIMAL(38) cannot
    carry them), with a message naming the column; without raise_on_fail DuckDB answers."""
    huge.execute("INSERT INTO t VALUES ([], 170141183460469231731687303715884105727)")
    query = "SELECT h, count(*) FROM t GROUP BY h"
    with pytest.raises(shoal.UnsupportedError, match="column h: HUGEINT values of 39 digits"):
        shoal.duckdb.sql(huge, query, raise_on_fail=True, config=_config(3))
    got = shoal.duckdb.sql(huge, query, raise_on_fail=False, config=_config(3)).fetchall()
    assert sorted(got, key=repr) == sorted(huge.sql(query).fetchall(), key=repr)


# ---------------------------------------------------------------- arg_max_null & co


@pytest.fixture
def args() -> Iterator[duckdb.DuckDBPyConnection]:
    """tbl(grp, arg, val): NULL args at the extremes, NULL vals, NaN, -0.0 tied with 0.0,
    groups of NULL vals only, ties of different args (first in input order wins)."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE tbl AS SELECT * FROM (VALUES (1, 5, 1.0::DOUBLE), (1, NULL, 2.0),
           (1, 3, NULL), (2, NULL, NULL), (3, 1, NULL), (4, 7, 'nan'), (4, 8, 'nan'),
           (4, NULL, 1.0), (5, 1, -0.0), (5, 2, 0.0), (6, 1, NULL), (6, 2, NULL),
           (7, NULL, -5.0), (7, 9, 3.0), (7, 4, -5.0)) t(grp, arg, val)"""
    )
    yield c
    c.close()


@pytest.mark.parametrize(
    "agg",
    [
        "arg_max_null(arg, val)",
        "arg_min_null(arg, val)",
        "arg_max_nulls_last(arg, val)",
        "arg_min_nulls_last(arg, val)",
        "arg_max_null(arg, val) FILTER (WHERE grp <> 4)",
        "arg_min_nulls_last(arg, val) FILTER (WHERE arg IS NOT NULL)",
        "arg_max_nulls_last(arg, val) FILTER (WHERE val IS NULL)",
    ],
)
def test_arg_extremes_that_keep_nulls(args: duckdb.DuckDBPyConnection, agg: str) -> None:
    """``arg_max_null``/``arg_min_null`` skip only NULL ``val`` rows (a NULL ``arg`` at the
    extreme is the answer); ``*_nulls_last`` skip nothing and order NULL ``val`` last."""
    check_sql(args, f"SELECT grp, {agg} AS a FROM tbl GROUP BY grp")
    check_sql(args, f"SELECT {agg} AS a FROM tbl")
    check_sql(args, f"SELECT {agg} AS a FROM tbl WHERE grp > 100")


def test_min_max_with_a_count_is_refused(args: duckdb.DuckDBPyConnection) -> None:
    """``min(x, n)`` (the list form) is refused by name (it was a ValueError inside the
    translator)."""
    with pytest.raises(shoal.UnsupportedError, match=r"min\(\) with a count"):
        shoal.duckdb.sql(args, "SELECT min(arg, 2) FROM tbl", raise_on_fail=True)


# ---------------------------------------------------------------- SELECT without FROM


@pytest.fixture
def ints() -> Iterator[duckdb.DuckDBPyConnection]:
    """integers(i), strings(v): duplicates and NULLs."""
    c = duckdb.connect()
    c.execute("CREATE TABLE integers AS SELECT * FROM (VALUES (1), (2), (2), (3), (NULL)) t(i)")
    c.execute("CREATE TABLE strings AS SELECT * FROM (VALUES ('hello'), ('world'), (NULL)) t(v)")
    yield c
    c.close()


@pytest.mark.parametrize(
    "query",
    [
        # DuckDB's dummy scan has a column of its own, which a window or a mark join over
        # it outputs first ("column reference #1 out of range" before)
        "SELECT row_number() OVER ()",
        "SELECT avg(42) OVER (), count(*) OVER ()",
        "SELECT 1 IN (SELECT 1)",
        "SELECT 1 IN (SELECT i FROM integers), 4 IN (SELECT i FROM integers)",
        "SELECT NULL IN (SELECT i FROM integers), 1 IN (SELECT NULL)",
        "SELECT 1 = ANY(SELECT i FROM integers WHERE i IS NOT NULL)",
        "SELECT 'hello' IN (SELECT v FROM strings), 'bla' IN (SELECT v FROM strings)",
        "SELECT ROW(1, 2) IN (SELECT i, i + 1 FROM integers)",
        "SELECT ROW(1, 3) IN (SELECT i, i + 1 FROM integers WHERE i IS NOT NULL)",
        "FROM (SELECT 42) t(x), (SELECT x * 2 QUALIFY row_number() OVER () < 10)",
        # a LATERAL VALUES list that reads the row it joins ("column reference #0 out of
        # range" before): every list row computed over every input row
        "SELECT * FROM integers, LATERAL (VALUES (integers.i + 1), (integers.i * 2)) t(k)",
        "SELECT * FROM integers a, integers b JOIN LATERAL (VALUES (a.i)) ss(x) ON (true)",
        "SELECT count(*) FROM integers a, integers b JOIN LATERAL (VALUES (a.i), (-1)) ss(x)"
        " ON b.i = ss.x",
        "SELECT * FROM (VALUES (1), (NULL)) x(lb), LATERAL (VALUES (lb, lb + 1.5)) y(a, b)",
    ],
)
def test_without_from_and_lateral_values(ints: duckdb.DuckDBPyConnection, query: str) -> None:
    check_sql(ints, query)


# ---------------------------------------------------------------- rowid


@pytest.fixture
def rows() -> Iterator[duckdb.DuckDBPyConnection]:
    """t(i, g) with deleted rows (gaps in rowid), NULLs and duplicates; a view filtering on
    rowid; r(rowid, x), whose real column named rowid hides the virtual one."""
    c = duckdb.connect()
    c.execute("CREATE TABLE t AS SELECT range AS i, range % 3 AS g FROM range(20)")
    c.execute("DELETE FROM t WHERE i IN (3, 4, 11)")
    c.execute("INSERT INTO t VALUES (100, 1), (101, NULL), (5, 2)")
    c.execute("CREATE VIEW late AS SELECT * FROM t WHERE rowid > 5")
    c.execute(
        "CREATE TABLE r AS SELECT * FROM (VALUES (7, 'a'), (7, 'b'), (NULL, 'c')) v(rowid, x)"
    )
    yield c
    c.close()


@pytest.mark.parametrize(
    "query",
    [
        "SELECT rowid, i FROM t",
        "SELECT count(*) FROM t WHERE rowid > 10",
        "SELECT * FROM late",
        "SELECT count(*) FROM late JOIN t USING (i)",
        "SELECT g, sum(rowid), count(rowid) FROM t GROUP BY g",
        "SELECT rowid // 4 AS b, count(*) FROM t GROUP BY b",
        "SELECT ARRAY(SELECT i FROM t ORDER BY rowid DESC)",
        "SELECT a.rowid, b.rowid FROM t a JOIN t b ON a.i = b.i + 1",
        "SELECT rowid, x FROM r",
    ],
)
def test_rowid_is_read_from_duckdb(rows: duckdb.DuckDBPyConnection, query: str) -> None:
    """DuckDB's virtual rowid of a table (refused before: 'they depend on storage order')
    is read from DuckDB with the rows."""
    check_sql(rows, query)


# ---------------------------------------------------------------- several UNNESTs


@pytest.fixture
def lists() -> Iterator[duckdb.DuckDBPyConnection]:
    """t(k, a, b): lists of different lengths, NULL lists, empty lists, NULL elements."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE t AS SELECT * FROM (VALUES (1, [1, 2, 3], ['a']), (2, NULL, ['b', 'c']),
           (3, [], NULL), (4, NULL, NULL), (5, [NULL, 4], []), (6, [7], ['x', NULL, 'z']),
           (6, [7], ['x', NULL, 'z'])) t(k, a, b)"""
    )
    yield c
    c.close()


@pytest.mark.parametrize(
    "query",
    [
        "SELECT k, unnest(a), unnest(b) FROM t",
        "SELECT unnest(a) AS x, unnest(b) AS y, k FROM t WHERE k > 1",
        "SELECT unnest([1, 2, 3]), unnest([4, 5])",
        "SELECT k, unnest(a) + 1, unnest(b) || '!' FROM t",
        "SELECT k, unnest(a), unnest(a) FROM t",
        "SELECT unnest(a), unnest(b), unnest([k]) FROM t",
        "SELECT k, count(*), count(x), count(y) FROM (SELECT k, unnest(a) x, unnest(b) y FROM t)"
        " GROUP BY k",
    ],
)
def test_several_unnests_pad_with_null(lists: duckdb.DuckDBPyConnection, query: str) -> None:
    """Several UNNESTs in one SELECT (refused before): as many rows as the longest list,
    the others padded with NULL; none when every list is NULL or empty."""
    check_sql(lists, query)


# ---------------------------------------------------------------- EXCLUDE


@pytest.mark.parametrize("exclude", ["CURRENT ROW", "GROUP", "TIES"])
@pytest.mark.parametrize(
    "function", ["row_number()", "rank()", "percent_rank()", "ntile(3)", "lag(v)", "lead(v, 2)"]
)
def test_exclude_is_ignored_where_the_frame_is(exclude: str, function: str) -> None:
    """Ranks, ntile and lag/lead ignore the frame, its EXCLUDE clause too (refused before)."""
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE t AS SELECT range AS i, range % 3 AS g, "
        "CASE WHEN range % 4 = 0 THEN NULL ELSE range END AS v FROM range(12)"
    )
    check_sql(
        c,
        f"SELECT i, {function} OVER (PARTITION BY i % 2 ORDER BY g, i "
        f"ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING EXCLUDE {exclude}) AS w FROM t",
    )


# ---------------------------------------------------------------- descending quantiles


@pytest.mark.parametrize(
    "aggs",
    [
        "quantile_disc(x, -0.25), quantile_cont(x, -0.25), quantile_cont(x, -0.9)",
        "percentile_disc(0.25) WITHIN GROUP (ORDER BY x DESC), "
        "percentile_cont(0.3) WITHIN GROUP (ORDER BY x DESC)",
        "quantile_disc(x, [-0.1, -0.5, -0.75]), quantile_cont(x, [-0.1, -0.5, -0.75])",
        "quantile_disc(x, -1.0), quantile_disc(x, -0.0)",
    ],
)
def test_negative_quantiles_count_from_the_top(aggs: str) -> None:
    """A negative quantile (and WITHIN GROUP (ORDER BY x DESC)) is a position in the
    descending order, NaN first (refused before)."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE t AS SELECT * FROM (VALUES (1, 1.5::DOUBLE), (1, 'nan'), (1, NULL),
           (1, -2.0), (1, 7.25), (2, 3.0), (2, 3.0), (2, -0.0), (3, NULL), (4, 10), (4, 20),
           (4, 30), (4, 40), (4, 50), (4, 60)) t(g, x)"""
    )
    check_sql(c, f"SELECT g, {aggs} FROM t GROUP BY g")
    check_sql(c, f"SELECT {aggs} FROM t")


# ---------------------------------------------------------------- Polars: set_sorted


def test_polars_set_sorted_is_the_values() -> None:
    """``set_sorted`` (a hint: refused before) over sorted values, in an as-of join key and
    a projection, as Polars answers."""
    left = pl.LazyFrame({"a": [-10, 5, 5, 10, None], "v": ["a", "b", "c", "d", "e"]})
    right = pl.LazyFrame({"a": [1, 2, 3, 6, 7], "w": [1.0, -0.0, math.nan, 6.0, None]})
    left, right = (f.drop_nulls("a").with_columns(pl.col("a").set_sorted()) for f in (left, right))
    check_polars(left.join_asof(right, on="a"))
    check_polars(left.join_asof(right, on=pl.col("a").set_sorted(), strategy="forward"))
    check_polars(left.select(pl.col("a").set_sorted().alias("s"), pl.col("v")))


# ---------------------------------------------------------------- Polars SQL: DIV and %


@pytest.mark.parametrize(
    "query",
    [
        "SELECT a % b AS r, a // b AS q FROM df WHERE a > -9223372036854775808 OR b <> -1",
        "SELECT a % b AS r FROM df",
        "SELECT a % b AS r, a // b AS q FROM small",
        "SELECT a % 3 AS r, a // -3 AS q, -a % 4 AS s FROM small",
        "SELECT a % b AS r, a // b AS q FROM unsigned",
    ],
)
def test_polars_sql_truncating_division(query: str) -> None:
    """Polars' SQL ``//`` and ``%`` (``trunc_int_div``/``trunc_rem``: rounding toward zero,
    NULL for a zero divisor, ``MIN % -1`` is 0; refused before) on integers."""
    ctx = pl.SQLContext(
        df=pl.LazyFrame(
            {
                "a": [-(2**63), 7, -7, None, 5, 7, -7, 0, 9, 7],
                "b": [-1, -2, 2, 3, 0, 2, -2, -5, None, 7],
            }
        ),
        small=pl.LazyFrame(
            {"a": [-127, 7, -7, 100, None], "b": [-1, -2, 0, 3, 1]},
            schema={"a": pl.Int8, "b": pl.Int8},
        ),
        unsigned=pl.LazyFrame(
            {"a": [200, 7, 0], "b": [3, 2, 0]}, schema={"a": pl.UInt8, "b": pl.Int64}
        ),
    )
    check_polars(ctx.execute(query))


@pytest.mark.parametrize(
    "part", ["millennium", "century", "decade", "epoch", "millisecond", "microsecond", "quarter"]
)
def test_polars_sql_extract(part: str) -> None:
    """Polars' SQL ``EXTRACT`` writes Rust's ``/`` (``BinaryExpr(Divide)``, refused before):
    floats divided, integers by a constant rounded toward zero."""
    import datetime as dt

    frame = pl.LazyFrame(
        {
            "t": [
                dt.datetime(1999, 12, 31, 23, 59, 59, 999999),
                dt.datetime(2000, 1, 1),
                None,
                dt.datetime(1, 1, 1, 0, 0, 0, 1),
                dt.datetime(1969, 7, 20, 20, 17, 40, 123456),
                dt.datetime(2024, 2, 29, 12),
            ]
        }
    )
    check_polars(pl.SQLContext(df=frame).execute(f"SELECT EXTRACT({part} FROM t) AS x FROM df"))
