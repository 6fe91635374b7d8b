"""shoal.duckdb: more DuckDB constructs that now run distributed (or are refused cleanly
instead of answered wrong), each compared with native DuckDB (``con.sql(q)``) on tables
split into several partitions, with NULLs, NaN, -0.0, duplicates and a partition a filter
empties. Local runner throughout."""

from __future__ import annotations

import math
from typing import Any

import duckdb
import pytest

import shoal
from shoal.plan.validate import validate

#: Tiny partitions: every in-memory table is split into 3 partitions.
CONFIG = shoal.Config(
    runner="local", default_partitions=3, shuffle_partitions=3, target_partition_bytes=1024
)


def _norm(v: Any) -> Any:
    """A value that compares as DuckDB's results should: NaN equal to NaN, floats to 12
    significant digits (the order of a floating-point sum is the engine's)."""
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else f"{v:.12g}")
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_norm(x) for x in v)
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    return v


def check(con: duckdb.DuckDBPyConnection, query: str, ordered: bool = True) -> list[Any]:
    """Run ``query`` with shoal (``raise_on_fail=True``: no fallback) and with DuckDB;
    assert the same column names, DuckDB types and rows (in order when ``ordered``, else
    as multisets). Returns DuckDB's rows."""
    validate(shoal.duckdb.to_ir(con, query))
    got_rel = shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    want_rel = con.sql(query)
    assert got_rel.columns == want_rel.columns
    assert [str(t) for t in got_rel.types] == [str(t) for t in want_rel.types]
    got = [_norm(r) for r in got_rel.fetchall()]
    want = [_norm(r) for r in want_rel.fetchall()]
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want
    return want


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    """Table t (60 rows): g a group key with duplicates and NULLs, i a unique order key,
    x a DOUBLE with NULLs, NaN, -0.0 and duplicates, n an INTEGER with NULLs, s a VARCHAR."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE t AS
        SELECT i, CASE WHEN i % 7 = 3 THEN NULL ELSE i % 4 END AS g,
               CASE WHEN i % 9 = 2 THEN NULL WHEN i = 17 THEN 'nan'::DOUBLE
                    WHEN i % 10 = 5 THEN -0.0 ELSE ((i * 37) % 23) / 4.0 END AS x,
               CASE WHEN i % 5 = 1 THEN NULL ELSE (i * 13) % 11 END::INTEGER AS n,
               'v' || ((i * 7) % 5) AS s
        FROM range(60) r(i)"""
    )
    return c


# ---------------------------------------------------------------- aggregate state export


@pytest.mark.parametrize(
    "query",
    [
        "SELECT (first(NULL::INTEGER) EXPORT_STATE)::STRUCT(value INTEGER)",
        "SELECT min(n) EXPORT_STATE FROM t",
        "SELECT finalize(sum(n) EXPORT_STATE) FROM t",
    ],
)
def test_export_state_is_refused(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """DuckDB's aggregate states (EXPORT_STATE, AGGREGATE_STATE values) have DuckDB's own
    layout: shoal refuses them (DuckDB answers on the driver) instead of answering with
    a plain value (it answered NULL where DuckDB gives ``{'value': NULL}``)."""
    con.sql(query).fetchall()  # DuckDB answers
    with pytest.raises(shoal.UnsupportedError, match="EXPORT_STATE"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    rel = shoal.duckdb.sql(con, query, config=CONFIG)  # falls back: DuckDB's own answer
    assert rel.fetchall() == con.sql(query).fetchall()


# ---------------------------------------------------------------- window frames


@pytest.mark.parametrize(
    "window",
    [
        "ROWS BETWEEN 1 FOLLOWING AND 2 FOLLOWING",
        "ROWS BETWEEN 2 PRECEDING AND 1 FOLLOWING",
        "ROWS BETWEEN 3 FOLLOWING AND 1 FOLLOWING",
        "ROWS BETWEEN 2 PRECEDING AND 1 PRECEDING",
        "ROWS BETWEEN UNBOUNDED PRECEDING AND 1 FOLLOWING",
        "ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING",
        "RANGE BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING",
    ],
)
def test_bounded_frames(con: duckdb.DuckDBPyConnection, window: str) -> None:
    """Aggregates over frames that end after the current row, or before it, or are
    empty: each row gets the aggregate of its frame's rows (count 0 and NULL for empty
    frames)."""
    check(
        con,
        f"""SELECT i, g,
               count(*) OVER w AS c, count(n) OVER w AS cn, sum(n) OVER w AS s,
               min(x) OVER w AS lo, max(s) OVER w AS hi, avg(n) OVER w AS a,
               median(n) OVER w AS m, list(n) OVER w AS l,
               first_value(x) OVER w AS f, last_value(n) OVER w AS la,
               nth_value(s, 2) OVER w AS nth
        FROM t WINDOW w AS (PARTITION BY g ORDER BY n DESC NULLS FIRST, i {window})
        ORDER BY i""",
    )


def test_frames_without_partition(con: duckdb.DuckDBPyConnection) -> None:
    check(
        con,
        """SELECT i, sum(n) OVER (ORDER BY i ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS s,
               count(*) OVER (ORDER BY i ROWS BETWEEN 5 FOLLOWING AND 10 FOLLOWING) AS c,
               first_value(n) OVER (ORDER BY n, i) AS f,
               median(n) OVER (ORDER BY g) AS m,
               list(n ORDER BY i) OVER (ORDER BY g DESC) AS l
        FROM t ORDER BY i""",
    )


def test_value_functions_ignore_nulls_distinct_order(con: duckdb.DuckDBPyConnection) -> None:
    """IGNORE NULLS, DISTINCT and ORDER BY inside a window function's arguments."""
    check(
        con,
        """SELECT i,
               first_value(n IGNORE NULLS) OVER w AS f, last_value(n IGNORE NULLS) OVER w AS l,
               nth_value(n, 2 IGNORE NULLS) OVER w AS n2,
               last(n IGNORE NULLS) OVER w AS last_agg,
               count(DISTINCT n) OVER w AS d, max(DISTINCT s) OVER w AS md,
               list(n ORDER BY s DESC, i) OVER w AS ordered,
               first_value(s ORDER BY x DESC NULLS LAST, i) OVER w AS fo
        FROM t WINDOW w AS (PARTITION BY g ORDER BY i ROWS BETWEEN 3 PRECEDING AND 1 FOLLOWING)
        ORDER BY i""",
    )


def test_partition_ranks(con: duckdb.DuckDBPyConnection) -> None:
    """percent_rank, cume_dist and ntile (peers by the ORDER BY keys, n above and below the
    partition size, frames ignored as DuckDB ignores them)."""
    check(
        con,
        """SELECT i, percent_rank() OVER (PARTITION BY g ORDER BY n) AS pr,
               cume_dist() OVER (PARTITION BY g ORDER BY n) AS cd,
               ntile(4) OVER (PARTITION BY g ORDER BY n, i) AS q4,
               ntile(100) OVER (PARTITION BY g ORDER BY i) AS q100,
               ntile(7) OVER (ORDER BY i ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS q7,
               percent_rank() OVER () AS pr_all, cume_dist() OVER (ORDER BY g) AS cd_all
        FROM t ORDER BY i""",
    )


def test_whole_partition_distinct_and_filter(con: duckdb.DuckDBPyConnection) -> None:
    check(
        con,
        """SELECT i, count(DISTINCT n) OVER (PARTITION BY g) AS d,
               count(DISTINCT s) OVER () AS ds,
               sum(n) FILTER (WHERE x > 1) OVER (PARTITION BY g) AS f
        FROM t ORDER BY i""",
    )


def test_order_of_a_join_is_refused(con: duckdb.DuckDBPyConnection) -> None:
    """row_number() OVER () over a join's rows numbers them in DuckDB's join order, which
    shoal does not reproduce: refused rather than answered in another order."""
    query = """SELECT row_number() OVER () AS r, count(DISTINCT a.s) OVER () AS d, a.i
        FROM t a JOIN t b ON a.i = b.n"""
    con.sql(query).fetchall()
    with pytest.raises(shoal.UnsupportedError, match="order of the rows a join produced"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)


# ---------------------------------------------------------------- set operations


@pytest.mark.parametrize("setop", ["EXCEPT ALL", "INTERSECT ALL"])
def test_bag_set_operations(con: duckdb.DuckDBPyConnection, setop: str) -> None:
    """EXCEPT ALL / INTERSECT ALL keep copies: the k-th copy of a row stays when the right
    side has fewer than (at least) k of it; NULLs and NaN equal themselves."""
    check(
        con,
        f"""SELECT g, x FROM t {setop} SELECT g, x FROM t WHERE i % 3 = 0
        ORDER BY ALL""",
    )
    check(con, f"SELECT n FROM t {setop} SELECT n % 4 FROM t WHERE i < 30 ORDER BY ALL")


# ---------------------------------------------------------------- aggregates


def test_quantile_lists_and_product(con: duckdb.DuckDBPyConnection) -> None:
    """quantile_cont/quantile_disc of a list of quantiles (NULL for a group without
    values), and product (DOUBLE; NULL for no values)."""
    check(
        con,
        """SELECT g, quantile_cont(n, [0.5, 0.25, 0.9]) AS qc,
               quantile_disc(x, [0.1, 0.5, 1.0]) AS qd,
               quantile_cont(x, [0.75]) AS one,
               product(CASE WHEN i % 6 = 0 THEN n END) AS p, product(n % 3 + 1) AS p2
        FROM t GROUP BY g ORDER BY g""",
    )
    check(con, "SELECT quantile_disc(n, [0.5, 0.2]), product(n) FROM t WHERE i < 0")


# ---------------------------------------------------------------- constant tables


@pytest.mark.parametrize(
    "query",
    [
        "SELECT column_name, column_type FROM (DESCRIBE SELECT 42 AS a, 1.5 AS b)",
        "SELECT * FROM (DESCRIBE SELECT 1 a, 2 b, 3 c, 4 d, 5 e, 'x' f)",
        "SELECT column_type, count(*) FROM (DESCRIBE t) GROUP BY ALL",
    ],
)
def test_describe_subquery(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """DESCRIBE's constant table comes serialised column by column: it crashed
    (IndexError) or, with as many rows as columns, came out transposed."""
    check(con, query, ordered=False)


# ---------------------------------------------------------------- LIMIT p %


@pytest.mark.parametrize(
    "limit", ["LIMIT 20 %", "LIMIT 35 PERCENT", "LIMIT 79.9 % OFFSET 7", "LIMIT 100 %", "LIMIT 0 %"]
)
def test_limit_percent(con: duckdb.DuckDBPyConnection, limit: str) -> None:
    """LIMIT p %: the first floor(p / 100 * rows) rows after the offset."""
    check(con, f"SELECT i, n FROM t WHERE i % 11 <> 4 ORDER BY n DESC, i {limit}")


def test_sum_avg_distinct(con: duckdb.DuckDBPyConnection) -> None:
    """sum(DISTINCT x) / avg(DISTINCT x): each value once (NaN once), NULL for none."""
    check(
        con,
        """SELECT g, sum(DISTINCT n) AS s, avg(DISTINCT n) AS a, sum(DISTINCT x) AS sx,
               avg(DISTINCT x) AS ax, sum(DISTINCT n) FILTER (WHERE i > 50) AS f
        FROM t GROUP BY g ORDER BY g""",
    )
    check(con, "SELECT sum(DISTINCT n), avg(DISTINCT n::DECIMAL(10,2)) FROM t")


def test_mad(con: duckdb.DuckDBPyConnection) -> None:
    """mad(): the median of the absolute deviations from the median (NaN largest), in
    GROUP BY, over a whole table, of a constant, and over window frames."""
    check(
        con,
        """SELECT g, mad(n) AS a, mad(x) AS b, mad(i::TINYINT) AS c,
               mad(CASE WHEN i > 50 THEN n END) AS d
        FROM t GROUP BY g ORDER BY g""",
    )
    check(con, "SELECT mad(NULL), mad(1), mad(n) FROM t")
    check(
        con,
        """SELECT i, mad(x) OVER (ORDER BY i ROWS BETWEEN 2 PRECEDING AND 3 FOLLOWING) AS f
        FROM t ORDER BY i""",
    )


# ---------------------------------------------------------------- ENUM


@pytest.fixture(scope="module")
def moods() -> duckdb.DuckDBPyConnection:
    """Table m: an ENUM column e whose category order ('sad' < 'ok' < 'happy') is not the
    alphabetical one, with NULLs and duplicates; s holds names, some of no category."""
    c = duckdb.connect()
    c.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    c.execute("CREATE TABLE m (e mood, i INTEGER, s VARCHAR)")
    c.execute(
        """INSERT INTO m SELECT CASE WHEN i % 7 = 3 THEN NULL
                                 ELSE ['happy', 'sad', 'ok'][i % 3 + 1] END,
               i, ['ok', 'meh', 'happy'][i % 3 + 1]
        FROM range(40) r(i)"""
    )
    return c


@pytest.mark.parametrize(
    "query",
    [
        "SELECT e, i FROM m ORDER BY e, i",
        "SELECT e FROM m WHERE e < 'ok' ORDER BY ALL",  # compared as text
        "SELECT i FROM m WHERE e > 'ok'::mood ORDER BY i",  # compared by category
        "SELECT e, count(*), min(i) FROM m GROUP BY e ORDER BY e",
        "SELECT min(e), max(e), count(DISTINCT e) FROM m",
        "SELECT e::VARCHAR || '!' AS t, 'ok'::mood AS k, TRY_CAST(s AS mood) AS c FROM m",
        "SELECT i FROM m WHERE e IN ('ok', 'happy') ORDER BY i",
        "SELECT a.i, b.i FROM m a JOIN m b ON a.e = b.e WHERE a.i < 5 ORDER BY ALL",
        "SELECT e, lag(e) OVER (ORDER BY i) FROM m ORDER BY i",
    ],
)
def test_enum(moods: duckdb.DuckDBPyConnection, query: str) -> None:
    """DuckDB's ENUM: ordered by category position, compared with text as text, cast to
    and from VARCHAR, grouped, joined, in windows."""
    check(moods, query, ordered="ORDER BY" in query)


def test_enum_cast_error(moods: duckdb.DuckDBPyConnection) -> None:
    """A name that is no category: DuckDB's ConversionException, with its message."""
    query = "SELECT s::mood FROM m"
    with pytest.raises(duckdb.ConversionException) as want:
        moods.sql(query).fetchall()
    with pytest.raises(duckdb.ConversionException) as got:
        shoal.duckdb.sql(moods, query, raise_on_fail=True, config=CONFIG).fetchall()
    assert str(want.value).split("\n")[0] in str(got.value)


# ---------------------------------------------------------------- lazy COALESCE / CASE


@pytest.mark.parametrize(
    "query",
    [
        "SELECT COALESCE(i, CAST(x * 1e300 AS INTEGER)) AS c FROM t",
        "SELECT CASE WHEN x IS NULL OR x < 100 THEN 0 ELSE CAST(x * 1e300 AS INTEGER) END AS c "
        "FROM t WHERE x IS NULL OR NOT isnan(x)",
        "SELECT CASE WHEN i > 1000 THEN CAST(x * 1e300 AS INTEGER) ELSE i END AS c FROM t",
    ],
)
def test_errors_only_where_evaluated(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """DuckDB evaluates COALESCE's later arguments and CASE's branches only where they
    are needed: a cast that would fail elsewhere raises nothing (shoal raised
    ConversionException; seen once EXCEPT ALL ran distributed in the property test)."""
    check(con, query, ordered=False)


def test_errors_where_evaluated_still_raise(con: duckdb.DuckDBPyConnection) -> None:
    query = "SELECT COALESCE(n, CAST(x * 1e300 AS INTEGER)) AS c FROM t"
    with pytest.raises(duckdb.Error) as want:
        con.sql(query).fetchall()
    with pytest.raises(type(want.value)):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG).fetchall()
