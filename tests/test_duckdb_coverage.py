"""shoal.duckdb: constructs that used to fall back to DuckDB on the driver and now run
distributed, each compared with native DuckDB (``con.sql(q)``): the same result types and
the same rows, on tables split into several partitions, with NULLs, NaN and a partition
that a filter empties.

TIMESTAMP WITH TIME ZONE comes first: it is carried as an Arrow timestamp in the
connection's ``TimeZone``, with DuckDB's (ICU's) rules for wall-clock times that a daylight
saving transition repeats or skips. Runs on the local runner, except the last test (Ray).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shoal
from shoal.plan.validate import validate

#: Tiny partitions: every in-memory table is split into 3 partitions.
CONFIG = shoal.Config(
    runner="local", default_partitions=3, shuffle_partitions=3, target_partition_bytes=1024
)


def _norm(v: Any) -> Any:
    """A value that compares as DuckDB's results should: NaN equal to NaN, -0.0 apart."""
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else repr(v))
    if isinstance(v, list):
        return [_norm(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_norm(x) for x in v)
    if isinstance(v, dict):
        return {k: _norm(x) for k, x in v.items()}
    return v


def check(
    con: duckdb.DuckDBPyConnection,
    query: str,
    ordered: bool = True,
    config: shoal.Config = CONFIG,
) -> list[tuple[Any, ...]]:
    """Run ``query`` with shoal (``raise_on_fail=True``: no fallback) and with DuckDB;
    assert the same column names, the same DuckDB types and the same rows (in order when
    ``ordered``, else as multisets). Returns the rows."""
    validate(shoal.duckdb.to_ir(con, query))
    got_rel = shoal.duckdb.sql(con, query, raise_on_fail=True, config=config)
    want_rel = con.sql(query)
    assert got_rel.columns == want_rel.columns
    assert [str(t) for t in got_rel.types] == [str(t) for t in want_rel.types]
    got = [_norm(r) for r in got_rel.fetchall()]
    want = [_norm(r) for r in want_rel.fetchall()]
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want
    return want_rel.fetchall()


# ---------------------------------------------------------------- TIMESTAMP WITH TIME ZONE


def _tz_connection(zone: str) -> duckdb.DuckDBPyConnection:
    """Table tz: instants every 37 minutes across both 2024 transitions of New York and
    Berlin (so that wall-clock times repeat and are skipped), every 11th NULL, and a naive
    TIMESTAMP column n that walks through the same transitions as wall-clock times."""
    c = duckdb.connect()
    c.execute(f"SET TimeZone = '{zone}'")
    c.execute(
        """CREATE TABLE tz AS
        SELECT i,
               CASE WHEN i % 11 = 5 THEN NULL
                    ELSE TIMESTAMPTZ '2024-03-09 12:00:00+00' + i * INTERVAL 37 minute
                         + (i % 7) * INTERVAL 1001 millisecond END AS ts,
               TIMESTAMP '2024-03-10 00:00:00' + i * INTERVAL 13 minute AS n,
               (i % 5)::INTEGER AS g
        FROM range(200) r(i)
        UNION ALL
        SELECT 1000 + i,
               TIMESTAMPTZ '2024-10-26 12:00:00+00' + i * INTERVAL 37 minute,
               TIMESTAMP '2024-11-03 00:00:00' + i * INTERVAL 13 minute,
               (i % 5)::INTEGER
        FROM range(200) r(i)"""
    )
    return c


@pytest.fixture(scope="module", params=["America/New_York", "Europe/Berlin"])
def tzcon(request: pytest.FixtureRequest) -> Iterator[duckdb.DuckDBPyConnection]:
    c = _tz_connection(request.param)
    yield c
    c.close()


TZ_QUERIES = {
    "scan": "SELECT i, ts FROM tz ORDER BY i",
    "casts to TIMESTAMP and DATE (wall-clock time in the zone)": (
        "SELECT i, ts::TIMESTAMP AS l, ts::DATE AS d, CAST(ts AS TIMESTAMP_MS) AS s FROM tz "
        "ORDER BY i"
    ),
    "casts to coarser units round as DuckDB's TIMESTAMP casts": (
        "SELECT i, CAST(ts + INTERVAL 1500 MICROSECOND AS TIMESTAMP_MS) AS a, "
        "CAST(ts - INTERVAL 2500 MICROSECOND AS TIMESTAMP_MS) AS b FROM tz ORDER BY i"
    ),
    "casts from TIMESTAMP and DATE (repeated and skipped times)": (
        "SELECT i, n::TIMESTAMPTZ AS a, n::DATE::TIMESTAMPTZ AS b, TRY_CAST(n AS TIMESTAMPTZ) c "
        "FROM tz ORDER BY i"
    ),
    "comparisons with constants and between columns": (
        "SELECT i, ts > TIMESTAMPTZ '2024-03-10 07:30:00+00' AS a, ts = ts AS b, "
        "ts < n::TIMESTAMPTZ AS c, ts BETWEEN '2024-11-03 01:00:00' AND '2024-11-03 02:00' AS d "
        "FROM tz ORDER BY i"
    ),
    "filter": "SELECT i FROM tz WHERE ts >= '2024-11-03 01:30:00' AND ts < '2024-11-04' ORDER BY i",
    "date parts": (
        "SELECT i, year(ts), month(ts), day(ts), hour(ts), minute(ts), second(ts), "
        "dayofweek(ts), isodow(ts), dayofyear(ts), week(ts), quarter(ts), "
        "extract(hour FROM ts) AS eh, date_part('minute', ts) AS dm, millisecond(ts) AS ms, "
        "microsecond(ts) AS us FROM tz ORDER BY i"
    ),
    "epoch": (
        "SELECT i, date_part('epoch', ts) AS e, epoch(ts) AS e2, epoch_ms(ts) AS ems, "
        "epoch_us(ts) AS eus, epoch(n) AS en, date_part('epoch', n::DATE) AS ed FROM tz ORDER BY i"
    ),
    "date_trunc": (
        "SELECT i, date_trunc('year', ts) y, date_trunc('quarter', ts) q, "
        "date_trunc('month', ts) m, date_trunc('week', ts) w, date_trunc('day', ts) d, "
        "date_trunc('hour', ts) h, date_trunc('minute', ts) mi, date_trunc('second', ts) s "
        "FROM tz ORDER BY i"
    ),
    "interval arithmetic": (
        "SELECT i, ts + INTERVAL 1 DAY a, ts - INTERVAL 1 DAY b, ts + INTERVAL 1 MONTH c, "
        "ts + INTERVAL 90 MINUTE d, ts + INTERVAL '1 day 2 hours' e, "
        "ts + INTERVAL '1 month -1 day 3 hours' f, ts - INTERVAL '2 months 5 days 1 second' g, "
        "INTERVAL 1 DAY + ts h FROM tz ORDER BY i"
    ),
    "AT TIME ZONE": (
        "SELECT i, ts AT TIME ZONE 'UTC' a, ts AT TIME ZONE 'Asia/Kolkata' b, "
        "n AT TIME ZONE 'America/Los_Angeles' c, timezone('Europe/London', n) d FROM tz ORDER BY i"
    ),
    "strftime": "SELECT i, strftime(ts, '%Y-%m-%d %H:%M:%S') AS f FROM tz ORDER BY i",
    "group by a truncated TIMESTAMPTZ": (
        "SELECT date_trunc('day', ts) AS d, count(*) AS n, min(ts) AS lo, max(ts) AS hi, "
        "count(DISTINCT ts) AS k FROM tz GROUP BY 1 ORDER BY 1"
    ),
    "group by the column, join on it": (
        "SELECT a.ts, count(*) AS n FROM tz a JOIN tz b ON a.ts = b.ts "
        "GROUP BY a.ts ORDER BY a.ts NULLS FIRST"
    ),
    "window partitioned by a TIMESTAMPTZ day": (
        "SELECT i, row_number() OVER (PARTITION BY ts::DATE ORDER BY i) AS r, "
        "max(ts) OVER (PARTITION BY g) AS m FROM tz ORDER BY i"
    ),
    "an emptied partition": "SELECT i, ts::DATE AS d FROM tz WHERE i >= 1150 ORDER BY i",
    "sort on the instant": "SELECT ts, i FROM tz ORDER BY ts DESC NULLS FIRST, i",
}


@pytest.mark.parametrize("name", list(TZ_QUERIES))
def test_timestamptz(tzcon: duckdb.DuckDBPyConnection, name: str) -> None:
    check(tzcon, TZ_QUERIES[name])


def test_timestamptz_type_carries_the_session_zone(tzcon: duckdb.DuckDBPyConnection) -> None:
    """The IR's TIMESTAMPTZ is an Arrow timestamp in the connection's TimeZone setting."""
    zone = tzcon.sql("SELECT current_setting('TimeZone')").fetchall()[0][0]
    plan = shoal.duckdb.to_ir(tzcon, "SELECT ts FROM tz")
    assert plan.schema["ts"].arrow == pa.timestamp("us", tz=zone)


def test_timestamptz_dst_rules_spelled_out() -> None:
    """DuckDB's answers at New York's transitions of 2024, which shoal must give: a
    repeated wall-clock time is read with the later offset, a skipped one moves forward,
    truncation into the repeated hour lands on its second pass, and adding a day keeps
    the offset the time had."""
    c = _tz_connection("America/New_York")
    check(
        c,
        "SELECT TIMESTAMP '2024-11-03 01:30:00'::TIMESTAMPTZ AS repeated, "
        "TIMESTAMP '2024-03-10 02:30:00'::TIMESTAMPTZ AS skipped, "
        "date_trunc('hour', TIMESTAMPTZ '2024-11-03 05:30:00+00') AS trunc_repeated, "
        "TIMESTAMPTZ '2024-11-02 05:06:00+00' + INTERVAL 1 DAY AS keeps_offset, "
        "TIMESTAMPTZ '2024-11-02 05:06:00+00' + INTERVAL '1 day 2 hours' AS day_then_hours "
        "FROM tz LIMIT 1",
    )


def test_timestamptz_other_zone_setting() -> None:
    """Changing the TimeZone setting changes the answers (and shoal follows)."""
    c = _tz_connection("Australia/Lord_Howe")  # a 30-minute daylight saving shift
    check(
        c,
        "SELECT i, ts::TIMESTAMP AS l, date_trunc('hour', ts) AS h, n::TIMESTAMPTZ AS t FROM tz ORDER BY i",
    )
    c.execute("SET TimeZone = 'Asia/Kathmandu'")
    check(c, "SELECT i, hour(ts) AS h, minute(ts) AS m, ts::DATE AS d FROM tz ORDER BY i")


def test_timestamptz_parquet(tmp_path: Path) -> None:
    """Parquet files hold TIMESTAMPTZ as UTC instants (DuckDB's writer) or with a zone of
    their own (pyarrow's): either way the values are the session's instants."""
    c = _tz_connection("Europe/Berlin")
    duck_file = tmp_path / "duck.parquet"
    c.execute(f"COPY (SELECT i, ts FROM tz) TO '{duck_file}'")
    import datetime as dt

    arrow_file = tmp_path / "arrow.parquet"
    start = dt.datetime(2024, 10, 27, 0, 0)
    pq.write_table(
        pa.table(
            {
                "i": list(range(300)),
                "ts": pa.array(
                    [start + dt.timedelta(minutes=13 * i) for i in range(300)],
                    pa.timestamp("ms", tz="America/Chicago"),
                ),
            }
        ),
        arrow_file,
        row_group_size=50,
    )
    for f in (duck_file, arrow_file):
        check(
            c,
            f"SELECT i, ts, hour(ts) AS h, ts::TIMESTAMP AS l FROM '{f}' "
            "WHERE ts > TIMESTAMPTZ '2024-10-27 00:30:00+00' ORDER BY i",
        )


# ---------------------------------------------------------------- lists, strings, aggregates


@pytest.fixture(scope="module")
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    """Table t: 60 rows, NULLs in every column, empty lists, NaN and -0.0 in a float list,
    non-ASCII strings, a signed index column k."""
    c = duckdb.connect()
    c.execute(
        """CREATE TABLE t AS SELECT i, (i % 4)::INTEGER AS g,
          CASE WHEN i % 7 = 0 THEN NULL ELSE (i * 1.5) - 20 END::DOUBLE AS x,
          CASE WHEN i % 9 = 0 THEN NULL ELSE 'a,b,' || i::VARCHAR || ',,é' END AS s,
          CASE WHEN i % 8 = 0 THEN NULL WHEN i % 8 = 1 THEN [] ELSE [i, i + 1, NULL, i % 3] END AS l,
          CASE WHEN i % 5 = 0 THEN [1.0, 'nan'::DOUBLE, -0.0] ELSE [2.5, NULL] END AS fl,
          (i % 6) - 3 AS k,
          CASE WHEN i % 11 = 4 THEN NULL
               ELSE TIMESTAMP '2024-01-01' + (i * 37 % 50) * INTERVAL 1 HOUR END AS ts
        FROM range(60) r(i)"""
    )
    yield c
    c.close()


LIST_QUERIES = {
    "list index (1-based, negative from the end, 0 and out of range NULL)": (
        "SELECT i, l[1] a, l[-1] b, l[0] c, l[k] d, l[5] e, list_extract(l, 2) f FROM t ORDER BY i"
    ),
    "string index": "SELECT i, s[1] a, s[-1] b, s[0] c, s[100] d FROM t ORDER BY i",
    "list slices": (
        "SELECT i, l[2:3] a, l[-2:] b, l[:k] c, l[k:] d, array_slice(l, 0, 0) e, l[-10:10] f, "
        "array_slice(l, 2, NULL) h, l[:-1] m, list_slice(l, 1, 2, 1) n FROM t ORDER BY i"
    ),
    "string slices": "SELECT i, s[2:4] a, s[-3:] b, array_slice(s, k, 5) c FROM t ORDER BY i",
    "list_contains (NULL, NaN, -0.0, empty lists)": (
        "SELECT i, list_contains(l, 3) a, list_contains(l, NULL) b, list_contains(l, k) c, "
        "list_has(fl, 'nan'::DOUBLE) d, list_contains(fl, 0.0) e, array_contains(fl, NULL) f, "
        "len(l) h, length(fl) j FROM t ORDER BY i"
    ),
    "list_aggr and the list_* aggregates": (
        "SELECT i, list_count(l) a, list_first(l) b, list_last(l) c, list_sum(l) d, "
        "list_min(l) e, list_max(l) f, list_aggr(l, 'sum') g, "
        "list_string_agg(string_split(s, ',')) h, "
        "list_aggr(string_split(s, ','), 'string_agg', '|') j, list_count(fl) k2 FROM t ORDER BY i"
    ),
    "list_contains in a filter": "SELECT i FROM t WHERE list_contains(l, 4) ORDER BY i",
    "split_part and string_split": (
        "SELECT i, split_part(s, ',', 2) a, split_part(s, ',', -1) b, split_part(s, ',', 0) c, "
        "split_part(s, ',', 9) d, string_split(s, ',') e, string_split(s, '') f, "
        "split_part(s, '', 1) h, str_split(s, 'b,') j FROM t ORDER BY i"
    ),
    "regexp_replace (first match, 'g', 'i', groups, '$' literal)": (
        "SELECT i, regexp_replace(s, '[ab]', 'X') a, regexp_replace(s, '[ab]', 'X', 'g') b, "
        "regexp_replace(s, 'A(,)', '<\\1>', 'gi') c, regexp_replace(s, ',', '$', 'g') d, "
        "regexp_replace(s, '(\\d+)', '\\0\\1\\\\') e, regexp_replace(s, '', '-', 'g') f, "
        "regexp_replace(s, '^a', 'Z') h, regexp_replace(s, 'b(?i)(A)(,)', '\\2\\1') j "
        "FROM t ORDER BY i"
    ),
}


@pytest.mark.parametrize("name", list(LIST_QUERIES))
def test_lists_and_strings(con: duckdb.DuckDBPyConnection, name: str) -> None:
    check(con, LIST_QUERIES[name])


AGG_QUERIES = {
    "string_agg with ORDER BY, FILTER, separators": (
        "SELECT g, string_agg(s, '|' ORDER BY i DESC) a, "
        "string_agg(s, ',' ORDER BY x NULLS FIRST, i) b, "
        "string_agg(s, ';' ORDER BY i) FILTER (WHERE i > 40) c, "
        "string_agg(s, '-' ORDER BY i) FILTER (WHERE i > 1000) d FROM t GROUP BY g ORDER BY g"
    ),
    "list/array_agg with ORDER BY (NULLs kept)": (
        "SELECT g, list(x ORDER BY i) a, array_agg(l ORDER BY i DESC) FILTER (WHERE i % 2 = 0) b "
        "FROM t GROUP BY g ORDER BY g"
    ),
    "ungrouped": "SELECT string_agg(s, '|' ORDER BY i) a, list(i ORDER BY x DESC, i) b FROM t",
    "arg_max / arg_min (NULLs skipped, NaN largest)": (
        "SELECT g, arg_max(i, x) a, arg_min(s, x) b, max_by(x, i) c, arg_max(i, fl[2]) d, "
        "arg_min(i, x) FILTER (WHERE i > 20) e, arg_min(s, i) f FROM t GROUP BY g ORDER BY g"
    ),
    "quantiles": (
        "SELECT g, quantile_cont(x, 0.25) a, quantile_cont(i, 0.9) b, median(x) c, "
        "quantile_disc(x, 0.3) d, quantile_disc(i, 0.5) e, quantile_cont(fl[2], 0.5) f, "
        "quantile_disc(fl[2], 1.0) h, quantile(x, 0.77) j FROM t GROUP BY g ORDER BY g"
    ),
    "quantiles of no rows": (
        "SELECT quantile_cont(x, 0.37) a, quantile_disc(x, 0.37) b, median(x) c FROM t "
        "WHERE i > 100"
    ),
}


@pytest.mark.parametrize("name", list(AGG_QUERIES))
def test_aggregates(con: duckdb.DuckDBPyConnection, name: str) -> None:
    check(con, AGG_QUERIES[name])


def test_quantile_cont_rounds_as_duckdb() -> None:
    """DuckDB interpolates ``lo * (1 - d) + hi * d`` with a fused multiply-add; Polars'
    linear interpolation differs in the last bit for about one group in ten."""
    c = duckdb.connect()
    c.execute(
        "CREATE TABLE q AS SELECT (i % 13)::INTEGER g, "
        "CASE WHEN hash(i) % 10 = 0 THEN NULL ELSE (hash(i * 7) % 1000003) / 997.0 - 300 END x "
        "FROM range(3000) r(i)"
    )
    for q in (0.01, 0.1, 0.3333, 0.77, 0.9, 0.999):
        check(c, f"SELECT g, quantile_cont(x, {q}) a FROM q GROUP BY g ORDER BY g")


def test_approx_count_distinct_falls_back(con: duckdb.DuckDBPyConnection) -> None:
    """DuckDB's HyperLogLog estimate is not the exact count (33 for range(32)); shoal does
    not give a different number: the query runs on DuckDB, and says why."""
    with pytest.raises(shoal.UnsupportedError, match="HyperLogLog"):
        shoal.duckdb.sql(con, "SELECT approx_count_distinct(i) FROM t", raise_on_fail=True)


# ---------------------------------------------------------------- operators

OPERATOR_QUERIES = {
    "UNNEST (NULL and empty lists give no row)": (
        "SELECT i, unnest(l) AS u FROM t ORDER BY i, u NULLS FIRST"
    ),
    "UNNEST under an expression, after a filter": (
        "SELECT i, unnest(l) + 1 AS u, g FROM t WHERE i > 10 ORDER BY i, u NULLS FIRST"
    ),
    "UNNEST then aggregate": (
        "SELECT g, sum(u) AS s, count(*) AS n FROM (SELECT g, unnest(l) AS u FROM t) "
        "GROUP BY g ORDER BY g"
    ),
    "UNNEST of a split string": "SELECT i, unnest(string_split(s, ',')) AS p FROM t ORDER BY i, p",
    "UNNEST of floats (NaN, -0.0)": "SELECT i, unnest(fl) AS v FROM t ORDER BY i, v",
    "UNNEST without FROM": "SELECT unnest([1, 2, NULL]) AS a",
    "lateral unnest in FROM": "SELECT i, u FROM t, unnest(t.l) AS r(u) ORDER BY i, u NULLS FIRST",
    "DISTINCT ON ... ORDER BY": "SELECT DISTINCT ON (g) g, i, x FROM t ORDER BY g, i DESC",
    "DISTINCT ON ... ORDER BY with NULLs first": (
        "SELECT DISTINCT ON (g) g, i, x FROM t ORDER BY g, x NULLS FIRST, i"
    ),
    "DISTINCT ON two keys": "SELECT DISTINCT ON (g, k) * FROM t ORDER BY k DESC, g, i",
    "LEFT JOIN with a non-equality condition": (
        "SELECT a.i, b.i AS j FROM t a LEFT JOIN t b ON a.g = b.g AND a.i < b.i - 30 "
        "ORDER BY a.i, j"
    ),
    "RIGHT JOIN with a non-equality condition": (
        "SELECT a.i, b.i AS j, b.x FROM t a RIGHT JOIN t b ON a.g = b.g AND a.x > b.x + 40 "
        "ORDER BY a.i, j"
    ),
    "FULL JOIN with a non-equality condition": (
        "SELECT a.i, b.i AS j FROM t a FULL JOIN t b ON a.k = b.k AND a.i + 50 < b.i "
        "ORDER BY a.i, j"
    ),
    "LEFT JOIN on an inequality only": (
        "SELECT a.i, b.i AS j FROM t a LEFT JOIN t b ON a.i < b.i - 55 ORDER BY a.i, j"
    ),
    "RANGE frame over an INTERVAL, per partition (peers, NULL keys)": (
        "SELECT i, sum(i) OVER (PARTITION BY g ORDER BY ts RANGE BETWEEN INTERVAL 3 HOUR "
        "PRECEDING AND CURRENT ROW) AS a FROM t ORDER BY i"
    ),
    "RANGE frames: count, count(*), avg, min, max": (
        "SELECT i, count(x) OVER w1 AS a, count(*) OVER w1 AS b, avg(i) OVER w2 AS c, "
        "min(i) OVER w3 AS d, max(k) OVER w3 AS e, sum(k) OVER w1 AS f FROM t "
        "WINDOW w1 AS (PARTITION BY g ORDER BY ts RANGE BETWEEN INTERVAL 1 DAY PRECEDING "
        "AND CURRENT ROW), w2 AS (PARTITION BY g ORDER BY ts RANGE BETWEEN INTERVAL 90 MINUTE "
        "PRECEDING AND CURRENT ROW), w3 AS (PARTITION BY g ORDER BY ts RANGE BETWEEN "
        "INTERVAL 2 HOUR PRECEDING AND CURRENT ROW) ORDER BY i"
    ),
    "RANGE frame over an integer key": (
        "SELECT i, sum(i) OVER (PARTITION BY g ORDER BY k RANGE BETWEEN 2 PRECEDING AND "
        "CURRENT ROW) AS a FROM t ORDER BY i"
    ),
    "RANGE frame without PARTITION BY": (
        "SELECT i, sum(i) OVER (ORDER BY ts RANGE BETWEEN INTERVAL 5 HOUR PRECEDING AND "
        "CURRENT ROW) AS a FROM t ORDER BY i"
    ),
    "interval comparisons of timestamp differences": (
        "SELECT i FROM t WHERE ts - TIMESTAMP '2024-01-01' > INTERVAL 10 HOUR "
        "AND TIMESTAMP '2024-01-03' - ts <= INTERVAL '1 day 2 hours' ORDER BY i"
    ),
    "interval comparison in a projection": (
        "SELECT i, ts - TIMESTAMP '2023-12-01' >= INTERVAL 1 MONTH AS a FROM t ORDER BY i"
    ),
    "time_bucket (days, minutes, weeks, months; origins and offsets)": (
        "SELECT i, time_bucket(INTERVAL 2 DAY, ts) a, time_bucket(INTERVAL 15 MINUTE, ts) b, "
        "time_bucket(INTERVAL 1 WEEK, ts::DATE) c, time_bucket(INTERVAL 3 MONTH, ts::DATE) d, "
        "time_bucket(INTERVAL 3 MONTH, ts) e, "
        "time_bucket(INTERVAL 2 DAY, ts, TIMESTAMP '2024-01-01 06:00') f, "
        "time_bucket(INTERVAL '1 day 2 hours', ts) g, "
        "time_bucket(INTERVAL 1 YEAR, ts::DATE, DATE '2023-03-01') h, "
        "time_bucket(INTERVAL 2 DAY, ts, INTERVAL 1 HOUR) j, "
        "time_bucket(INTERVAL 5 MONTH, ts - INTERVAL 400 DAY) k FROM t ORDER BY i"
    ),
    "LIMIT and OFFSET given by subqueries": (
        "SELECT i, x FROM t ORDER BY x DESC NULLS LAST, i LIMIT (SELECT max(g) FROM t) "
        "OFFSET (SELECT min(g) + 2 FROM t)"
    ),
    "LIMIT (SELECT NULL) is no limit": (
        "SELECT i FROM t ORDER BY i LIMIT (SELECT NULL::INT) OFFSET 50"
    ),
    "LIMIT of a DECIMAL subquery": "SELECT i FROM t ORDER BY i DESC LIMIT (SELECT 2.5)",
    "PIVOT with the values listed": (
        "PIVOT t ON g IN (0, 1, 2) USING sum(i) AS s, count(*) AS n GROUP BY k ORDER BY k"
    ),
    "LEFT JOIN with a condition on the right side only": (
        "SELECT a.i, b.s FROM t a LEFT JOIN t b ON a.x = b.x AND b.s LIKE '%1%' ORDER BY a.i, b.s"
    ),
}


@pytest.mark.parametrize("name", list(OPERATOR_QUERIES))
def test_operators(con: duckdb.DuckDBPyConnection, name: str) -> None:
    check(con, OPERATOR_QUERIES[name])


def test_range_frame_of_doubles_falls_back(con: duckdb.DuckDBPyConnection) -> None:
    """Sliding sums of DOUBLEs would round differently from DuckDB's (and keep a NaN that
    left the frame): such a frame says why it runs on DuckDB."""
    q = (
        "SELECT i, sum(x) OVER (ORDER BY ts RANGE BETWEEN INTERVAL 5 HOUR PRECEDING AND "
        "CURRENT ROW) FROM t"
    )
    with pytest.raises(shoal.UnsupportedError, match="RANGE frame"):
        shoal.duckdb.sql(con, q, raise_on_fail=True, config=CONFIG)


def test_list_value_of_columns(con: duckdb.DuckDBPyConnection) -> None:
    check(con, "SELECT i, list_value(i, x, NULL) a, [i, k] b, [s, NULL, 'z'] c FROM t ORDER BY i")


# ---------------------------------------------------------------- prepared parameters

PARAM_CASES = [
    ("SELECT i, ? + 1 AS p, s FROM t WHERE i > $1 ORDER BY i", [3]),
    ("SELECT i FROM t WHERE i > $x AND s <> $y ORDER BY i", {"x": 5, "y": "a,b,7,,é"}),
    ("SELECT count(*) AS n, sum(x) AS sx FROM t WHERE x >= ? AND i < ?", [1.5, 2**40]),
    ("SELECT ? AS a, ? AS b, ? AS c", ["it's", None, True]),
    ("SELECT i FROM t WHERE s LIKE ? ORDER BY i", ["%1%"]),
]


@pytest.mark.parametrize(("query", "params"), PARAM_CASES)
def test_prepared_parameters(con: duckdb.DuckDBPyConnection, query: str, params: Any) -> None:
    """``params=`` as ``con.sql(query, params=...)`` takes them: DuckDB's result types."""
    got = shoal.duckdb.sql(con, query, params=params, raise_on_fail=True, config=CONFIG)
    want = con.sql(query, params=params)
    assert got.columns == want.columns
    assert [str(t) for t in got.types] == [str(t) for t in want.types]
    assert [_norm(r) for r in got.fetchall()] == [_norm(r) for r in want.fetchall()]


def test_prepared_parameters_missing_value_is_duckdbs_error(
    con: duckdb.DuckDBPyConnection,
) -> None:
    with pytest.raises(duckdb.InvalidInputException):
        shoal.duckdb.sql(con, "SELECT ? + ?", params=[1], raise_on_fail=True, config=CONFIG)
    with pytest.raises(shoal.UnsupportedError, match="params="):
        shoal.duckdb.sql(con, "SELECT i FROM t WHERE i > ?", raise_on_fail=True, config=CONFIG)


def test_dates_beyond_python_years(con: duckdb.DuckDBPyConnection) -> None:
    """DATE and TIMESTAMP constants past the year 9999 (Python's datetime stops there, the
    kernel's calendar goes to 262143) are carried as numbers cast to the type; beyond the
    kernel's calendar, and DuckDB's infinities, the query says why it falls back."""
    check(
        con,
        "SELECT x, year(x) AS y, x + 1 AS n FROM (VALUES ('20000-01-10'::DATE), "
        "('2000-01-01'::DATE), (NULL)) v(x) ORDER BY x",
    )
    check(con, "SELECT i FROM t WHERE DATE '12000-01-01' > DATE '2024-01-01' + i::INT ORDER BY i")
    check(
        con,
        "SELECT x, month(x) AS m FROM (VALUES ('12000-01-10 04:00:54'::TIMESTAMP), "
        "(TIMESTAMP '2024-01-01')) v(x) ORDER BY x",
    )
    with pytest.raises(shoal.UnsupportedError, match="262143"):
        shoal.duckdb.sql(
            con, "SELECT year(x) FROM (VALUES ('294247-01-10'::DATE)) v(x)", raise_on_fail=True
        )


# ---------------------------------------------------------------- silently wrong before

#: Queries that shoal answered differently from DuckDB (sqllogictest runner, branch
#: duckdb-coverage), each exact now.
EXACT_QUERIES = {
    "time parts of a DATE (0, as of its midnight; the kernel raised)": (
        "SELECT i, hour(d) a, minute(d) b, second(d) c, millisecond(d) e, "
        "date_part('microsecond', d) f FROM (SELECT i, CASE WHEN i % 7 = 0 THEN NULL "
        "ELSE ts::DATE END d FROM t) ORDER BY i"
    ),
    "quantiles of a constant (the kernel's gather was out of bounds)": (
        "SELECT g, quantile_cont(42, 0.5) a, quantile_disc(7, 0.9) b, median(2.5::DOUBLE) c, "
        "quantile_cont(NULL::DOUBLE, 0.5) d FROM t GROUP BY g ORDER BY g"
    ),
    "quantile of a constant over no rows": "SELECT quantile_cont(42, 0.5) a FROM t WHERE i < 0",
    "DOUBLE divided by a constant (rounded as one division, not by the reciprocal)": (
        "SELECT i, (1709990042002000 + i * 1000)::DOUBLE / 1e6 a, x / 3.0 b, x / 7 c, "
        "fdiv((1709990042002000 + i * 1000)::DOUBLE, 1e6) d, "
        "(1709990042002000 + i * 1000)::DOUBLE // 1e6 e, 7 / x f FROM t ORDER BY i"
    ),
}


@pytest.mark.parametrize("name", list(EXACT_QUERIES))
def test_formerly_wrong(con: duckdb.DuckDBPyConnection, name: str) -> None:
    check(con, EXACT_QUERIES[name])


def test_infinite_timestamps_cast_to_timestamptz(tmp_path: Path) -> None:
    """DuckDB's ``infinity`` / ``-infinity`` of TIMESTAMP_NS, TIMESTAMP and DATE stay
    infinite through a cast to TIMESTAMPTZ and back (they were read as instants: 2262-04-11
    from TIMESTAMP_NS, a crash from TIMESTAMP). Read from Parquet (a DuckDB table holding
    them is refused, see the next test)."""
    c = duckdb.connect()
    c.execute("SET TimeZone = 'America/New_York'")
    path = tmp_path / "inf.parquet"
    c.execute(
        f"""COPY (SELECT i,
          CASE i % 4 WHEN 0 THEN 'infinity'::TIMESTAMP_NS WHEN 1 THEN '-infinity'::TIMESTAMP_NS
            WHEN 2 THEN NULL ELSE TIMESTAMP_NS '2020-01-01 10:00:00.123456789' END v,
          CASE i % 3 WHEN 0 THEN 'infinity'::TIMESTAMP WHEN 1 THEN '-infinity'::TIMESTAMP
            ELSE TIMESTAMP '2024-03-10 02:30:00' + i * INTERVAL 1 HOUR END w,
          CASE i % 5 WHEN 0 THEN 'infinity'::DATE WHEN 1 THEN '-infinity'::DATE
            ELSE DATE '2024-03-10' + i::INT END d
        FROM range(40) r(i)) TO '{path}' (ROW_GROUP_SIZE 8)"""
    )
    check(
        c,
        "SELECT i, v, v::TIMESTAMPTZ a, v::TIMESTAMPTZ::TIMESTAMP b, w::TIMESTAMPTZ e, "
        f"d::TIMESTAMPTZ f, d::TIMESTAMPTZ::DATE h FROM '{path}' ORDER BY i",
    )


def test_infinite_timestamp_s_and_renamed_rowid_refused() -> None:
    """Values shoal read wrongly and now refuses (the query runs on DuckDB): DuckDB's
    ``infinity`` in a DATE or TIMESTAMP column of a table (TIMESTAMP_S read as 1969-12-31
    23:59:59, ``weekofyear`` gave a number where DuckDB gives NULL); and ``rowid`` of a
    table that a decorrelated join renames (it read as NULL, then was refused; now read
    from DuckDB with the rows, branch exact)."""
    c = duckdb.connect()
    for unit in ("TIMESTAMP_S", "TIMESTAMP_NS", "DATE"):
        c.execute(
            f"CREATE OR REPLACE TABLE sec AS SELECT i, CASE i % 3 WHEN 0 THEN 'infinity'::{unit} "
            f"WHEN 1 THEN '-infinity'::{unit} ELSE {unit} '2020-01-01' END ts FROM range(30) r(i)"
        )
        query = "SELECT i, ts, weekofyear(ts) w FROM sec ORDER BY i"
        with pytest.raises(shoal.UnsupportedError, match="infinite DATE or TIMESTAMP"):
            shoal.duckdb.sql(c, query, raise_on_fail=True, config=CONFIG)
        assert shoal.duckdb.sql(c, query, config=CONFIG).fetchall() == c.sql(query).fetchall()
    # beyond the kernel's calendar (years -262143..262143): the kernel panicked
    c.execute(
        "CREATE OR REPLACE TABLE far AS SELECT i, CASE WHEN i = 4 THEN TIMESTAMP '290000-01-01' "
        "ELSE TIMESTAMP '2020-01-01' + i * INTERVAL 1 DAY END ts FROM range(30) r(i)"
    )
    query = "SELECT i, ts::TIMESTAMPTZ z, weekofyear(ts) w FROM far ORDER BY i"
    with pytest.raises(shoal.UnsupportedError, match="beyond the years"):
        shoal.duckdb.sql(c, query, raise_on_fail=True, config=CONFIG)
    assert shoal.duckdb.sql(c, query, config=CONFIG).fetchall() == c.sql(query).fetchall()
    c.execute("CREATE TABLE l AS SELECT i AS a FROM range(1, 7) r(i)")
    c.execute("CREATE TABLE r AS SELECT i * 10 AS b FROM range(1, 7) r(i)")
    c.execute("CREATE TABLE s AS SELECT i AS a, i * 10 AS b FROM range(1, 7, 2) r(i)")
    c.execute("PRAGMA disable_optimizer")
    query = (
        "SELECT l.rowid, l.a, r.rowid, r.b FROM l FULL OUTER JOIN r ON EXISTS "
        "(SELECT 1 FROM s WHERE s.a = l.a AND s.b = r.b) ORDER BY ALL"
    )
    got = shoal.duckdb.sql(c, query, raise_on_fail=True, config=CONFIG).fetchall()
    assert got == c.sql(query).fetchall()


#: Queries shoal answered where DuckDB raises, or answered differently, and now refuses
#: (they run on DuckDB, which is right): (query, words of the reason, DuckDB's error class
#: or None where DuckDB answers). Those whose expression DuckDB can compute in the tasks
#: run distributed now (tests/test_duckdb_fragment.py, RAISED_IN_TASKS).
REFUSED = [
    ("SELECT regexp_matches(s, '*') a FROM t", "does not parse", duckdb.InvalidInputException),
    ("SELECT regexp_replace(s, '(', 'x') a FROM t", "does not parse", duckdb.InvalidInputException),
    ("SELECT i FROM t LIMIT DATE '1992-01-01'", "DuckDB has no such cast", None),
]


@pytest.mark.parametrize(("query", "reason", "error"), REFUSED)
def test_formerly_wrong_now_refused(
    con: duckdb.DuckDBPyConnection, query: str, reason: str, error: type[Exception] | None
) -> None:
    """shoal refuses in the translator (UnsupportedError naming what the user wrote); the
    fallback then gives DuckDB's own answer or exception class."""
    with pytest.raises(shoal.UnsupportedError, match=reason.replace("(", "\\(")):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    try:
        want: Any = sorted(con.sql(query).fetchall(), key=repr)
    except duckdb.Error as native:
        want = type(native)
    if error is not None:
        assert want is error
    try:
        got: Any = sorted(shoal.duckdb.sql(con, query, config=CONFIG).fetchall(), key=repr)
    except duckdb.Error as fallback:
        got = type(fallback)
    assert _norm(got) == _norm(want)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT percentile_disc(0.25) WITHIN GROUP (ORDER BY i DESC) a FROM t",
        "SELECT g, quantile_disc(i, -0.25) a FROM t GROUP BY g",
        "SELECT quantile_cont(x, -0.1) a FROM t",
    ],
)
def test_descending_quantiles(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Formerly wrong (ascending positions), then refused; now positions in the descending
    order as DuckDB reads a negative quantile (branch exact)."""
    check(con, query, ordered=False)


# ---------------------------------------------------------------- on Ray


def test_on_ray(ray_runner: None) -> None:
    """The new constructs through Ray workers (types with a time zone, lists, ordered
    aggregates and row-numbered outer joins cross the object store)."""
    c = _tz_connection("America/New_York")
    ray = CONFIG.replace(runner="ray")
    check(
        c,
        "SELECT date_trunc('day', ts) AS d, count(*) AS n, "
        "string_agg(hour(ts)::VARCHAR, ',' ORDER BY i) AS hours, quantile_cont(i, 0.3) AS q "
        "FROM tz GROUP BY 1 ORDER BY 1",
        config=ray,
    )
    check(
        c,
        "SELECT a.i, b.i AS j, unnest([a.ts, b.ts]) AS u FROM tz a "
        "LEFT JOIN tz b ON a.g = b.g AND a.ts + INTERVAL 1 DAY < b.ts AND b.i < 5 "
        "WHERE a.i < 40 ORDER BY a.i, j, u",
        config=ray,
    )
