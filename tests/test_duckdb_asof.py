"""DuckDB's ASOF JOIN through shoal (shoal_duckdb/asof.py), compared with native DuckDB.

Trades and quotes are Parquet files (three with rows, one empty) read with read_parquet,
so each side is several partitions, and in-memory tables split into three partitions.
The data has NULL by-keys and keys on both sides, duplicated left rows, duplicated right
rows, left keys equal to right keys (exact matches), several by-groups and left rows
before the first and after the last quote. Tied right rows (same by-keys and key) carry
the same payload, since DuckDB does not say which of them matches; the test of differing
tied payloads compares the matched key only.
"""

from __future__ import annotations

import datetime as dt
import random
import warnings
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shoal
from shoal.errors import UnsupportedError
from shoal.ir.nodes import AsofJoin
from shoal.plan.validate import validate
from shoal.runners.session import last_query
from shoal.tpch.compare import assert_frames_match
from shoal_duckdb import DuckDBFallbackWarning

CONFIG = shoal.Config(runner="local", default_partitions=3, target_partition_bytes=1024)
#: No broadcast: the right side is too big, so the left side is gathered into one task.
NO_BROADCAST = CONFIG.replace(broadcast_join_threshold_bytes=1)

SYMS = ["a", "b", "c", None]
VENUES = ["x", "y"]
T0 = dt.datetime(2024, 1, 1, 9, 30)


def _trades(rng: random.Random, n: int) -> pa.Table:
    rows = []
    for i in range(n):
        ts = rng.choice([*range(0, 40), None])
        rows.append((i, rng.choice(SYMS), rng.choice(VENUES), ts, rng.random() * 100))
    rows += rows[:5]  # duplicated left rows
    ids, syms, venues, ts, px = zip(*rows, strict=True)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "sym": pa.array(syms, pa.string()),
            "venue": pa.array(venues, pa.string()),
            "ts": pa.array(ts, pa.int64()),
            "at": pa.array([None if t is None else T0 + dt.timedelta(minutes=t) for t in ts]),
            "px": pa.array(px, pa.float64()),
        }
    )


def _quotes(rng: random.Random, n: int) -> pa.Table:
    rows = []
    for _ in range(n):
        sym = rng.choice(SYMS)
        ts = rng.choice([*range(3, 35, 2), None])  # odd minutes: gaps and exact matches
        # Every column is a function of (sym, ts): right rows that tie are equal.
        rows.append((sym, VENUES[(ts or 0) // 2 % 2], ts))
    rows += rows[:6]  # duplicated right rows (ties with the same payload)
    syms, venues, ts = zip(*rows, strict=True)

    def bid(s: str | None, _v: str, t: int | None) -> float | None:
        return None if t is None else (SYMS.index(s) * 1000 + t) / 4

    return pa.table(
        {
            "sym": pa.array(syms, pa.string()),
            "venue": pa.array(venues, pa.string()),
            "ts": pa.array(ts, pa.int64()),
            "day": pa.array(
                [None if t is None else (T0 + dt.timedelta(days=t)).date() for t in ts]
            ),
            "at": pa.array([None if t is None else T0 + dt.timedelta(minutes=t) for t in ts]),
            "bid": pa.array([bid(*r) for r in rows], pa.float64()),
        }
    )


def _write_parts(table: pa.Table, root: Path) -> None:
    root.mkdir()
    n = table.num_rows
    for i in range(3):
        piece = table.slice(i * n // 3, (i + 1) * n // 3 - i * n // 3)
        pq.write_table(piece, root / f"part-{i}.parquet", row_group_size=16)
    pq.write_table(table.slice(0, 0), root / "part-3.parquet")  # an empty partition


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(7)
    root = tmp_path_factory.mktemp("asof")
    _write_parts(_trades(rng, 120), root / "trades")
    _write_parts(_quotes(rng, 60), root / "quotes")
    return root


@pytest.fixture(scope="module")
def con(data: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    """Views over the Parquet files, and in-memory copies (t, q) of the same rows."""
    c = duckdb.connect()
    c.execute(f"CREATE VIEW trades AS SELECT * FROM read_parquet('{data}/trades/*.parquet')")
    c.execute(f"CREATE VIEW quotes AS SELECT * FROM read_parquet('{data}/quotes/*.parquet')")
    c.execute("CREATE TABLE t AS SELECT * FROM trades")
    c.execute("CREATE TABLE q AS SELECT * FROM quotes")
    c.execute(
        "CREATE TABLE fl AS SELECT * FROM (VALUES (1, 1.0::DOUBLE), (2, 2.5), (3, 'nan'), "
        "(4, NULL), (5, -0.0), (6, 'inf'), (7, 2.5)) v(id, x)"
    )
    c.execute(
        "CREATE TABLE fr AS SELECT * FROM (VALUES (0.0::DOUBLE, 'zero'), (2.5, 'two'), "
        "('nan', 'nan'), (NULL, 'null'), ('-inf', 'minf')) v(y, name)"
    )
    yield c
    c.close()


def check(
    con: duckdb.DuckDBPyConnection, query: str, config: shoal.Config = CONFIG
) -> pl.DataFrame:
    """shoal's answer equals DuckDB's (rows in any order, unless ORDER BY); the IR has an
    AsofJoin."""
    plan = shoal.duckdb.to_ir(con, query)
    validate(plan)
    assert any(isinstance(n, AsofJoin) for n in plan.walk())
    got = shoal.duckdb.sql(con, query, raise_on_fail=True, config=config).pl()
    expected = con.sql(query).pl()
    assert len(expected) > 0
    order = [("id", False), ("ts", False)] if "ORDER BY t.id" in query else None
    assert_frames_match(got, expected, order)
    return got


QUERIES = {
    ">= inner": "SELECT t.id, t.sym, t.ts, q.ts AS qts, q.bid FROM trades t "
    "ASOF JOIN quotes q ON t.sym = q.sym AND t.ts >= q.ts",
    "> inner": "SELECT t.id, t.sym, t.ts, q.ts AS qts, q.bid FROM trades t "
    "ASOF JOIN quotes q ON t.sym = q.sym AND t.ts > q.ts",
    "<= inner": "SELECT t.id, t.ts, q.ts AS qts, q.bid FROM trades t "
    "ASOF JOIN quotes q ON t.sym = q.sym AND t.ts <= q.ts",
    "< inner": "SELECT t.id, t.ts, q.ts AS qts, q.bid FROM trades t "
    "ASOF JOIN quotes q ON t.sym = q.sym AND t.ts < q.ts",
    ">= left": "SELECT t.*, q.* FROM trades t "
    "ASOF LEFT JOIN quotes q ON t.sym = q.sym AND t.ts >= q.ts",
    "> left": "SELECT t.id, q.ts AS qts, q.sym AS qsym, q.bid FROM trades t "
    "ASOF LEFT JOIN quotes q ON t.sym = q.sym AND t.ts > q.ts",
    "<= left": "SELECT t.id, q.ts AS qts, q.bid FROM trades t "
    "ASOF LEFT JOIN quotes q ON t.sym = q.sym AND t.ts <= q.ts",
    "< left": "SELECT t.id, q.ts AS qts, q.bid FROM trades t "
    "ASOF LEFT JOIN quotes q ON t.sym = q.sym AND t.ts < q.ts",
    "condition written right to left": "SELECT t.id, q.ts AS qts FROM trades t "
    "ASOF JOIN quotes q ON q.sym = t.sym AND q.ts <= t.ts",
    "USING": "SELECT * FROM trades ASOF JOIN quotes USING (sym, venue, ts)",
    "USING, left": "SELECT * FROM trades ASOF LEFT JOIN quotes USING (sym, ts)",
    "two by-keys": "SELECT t.id, q.venue, q.ts AS qts, q.bid FROM trades t "
    "ASOF JOIN quotes q ON t.sym = q.sym AND t.venue = q.venue AND t.ts >= q.ts",
    "no by-key": "SELECT t.id, q.ts AS qts FROM trades t ASOF LEFT JOIN quotes q ON t.ts >= q.ts",
    "timestamps": "SELECT t.id, q.at AS qat, q.bid FROM trades t "
    "ASOF LEFT JOIN quotes q ON t.sym = q.sym AND t.at > q.at",
    "timestamp against date": "SELECT t.id, q.day FROM trades t "
    "ASOF JOIN quotes q ON t.sym = q.sym AND t.at + INTERVAL 20 DAY >= q.day",
    "key expressions": "SELECT t.id, q.ts AS qts FROM trades t ASOF JOIN quotes q "
    "ON upper(t.sym) = upper(q.sym) AND t.ts + 3 < q.ts - 1",
    "filter, subquery and aggregate": "SELECT t.sym, count(*) AS n, sum(q.bid) AS s, "
    "count(q.bid) AS nb FROM (SELECT * FROM trades WHERE px > 20) t ASOF LEFT JOIN "
    "(SELECT sym, ts, max(bid) AS bid FROM quotes GROUP BY sym, ts) q "
    "ON t.sym = q.sym AND t.ts >= q.ts GROUP BY t.sym",
    "ORDER BY": "SELECT t.id, t.ts, q.bid FROM trades t ASOF JOIN quotes q "
    "ON t.sym = q.sym AND t.ts >= q.ts ORDER BY t.id, t.ts",
    "in-memory tables": "SELECT t.id, q.ts AS qts, q.bid FROM t "
    "ASOF LEFT JOIN q ON t.sym = q.sym AND t.ts >= q.ts",
}


@pytest.mark.parametrize("name", QUERIES)
def test_asof_join_matches_duckdb(con: duckdb.DuckDBPyConnection, name: str) -> None:
    check(con, QUERIES[name])


@pytest.mark.parametrize("op", [">=", ">", "<=", "<"])
def test_asof_join_without_broadcast(con: duckdb.DuckDBPyConnection, op: str) -> None:
    check(
        con,
        f"SELECT t.id, q.ts AS qts, q.bid FROM trades t ASOF LEFT JOIN quotes q "
        f"ON t.sym = q.sym AND t.ts {op} q.ts",
        NO_BROADCAST,
    )


def test_left_side_stays_partitioned(con: duckdb.DuckDBPyConnection) -> None:
    check(con, QUERIES[">= inner"])
    report = last_query()
    assert report is not None
    joins = [s for s in report.physical.stages if "asof-join" in s.name]
    assert joins and joins[0].num_tasks > 1


@pytest.mark.parametrize("op", [">=", ">", "<=", "<"])
def test_float_keys_with_nan_and_infinities(con: duckdb.DuckDBPyConnection, op: str) -> None:
    check(con, f"SELECT fl.id, fl.x, fr.y, fr.name FROM fl ASOF LEFT JOIN fr ON fl.x {op} fr.y")


def test_float_by_keys_nan_and_negative_zero(con: duckdb.DuckDBPyConnection) -> None:
    # DuckDB: NaN = NaN and -0.0 = 0.0 in the by-keys.
    check(
        con,
        "SELECT l.id, r.name, r.g FROM (VALUES (0.0::DOUBLE, 1, 1), (-0.0, 2, 2), ('nan', 3, 3), "
        "(1.5, 4, 4), (NULL, 5, 5)) l(g, ts, id) ASOF LEFT JOIN (VALUES (-0.0::DOUBLE, 1, 'p1'), "
        "('nan', 2, 'pn'), (0.0, 3, 'p0'), (NULL, 0, 'null')) r(g, ts, name) "
        "ON l.g = r.g AND l.ts >= r.ts",
    )


def test_tied_right_rows_match_the_same_key(con: duckdb.DuckDBPyConnection) -> None:
    # Several quotes per (sym, ts) with different payloads: DuckDB picks one of them, so
    # only the matched key is compared.
    query = (
        "SELECT t.id, q.ts AS qts FROM trades t ASOF JOIN "
        "(SELECT sym, ts, bid + i AS bid FROM quotes, range(3) r(i)) q "
        "ON t.sym = q.sym AND t.ts >= q.ts"
    )
    check(con, query)


def test_is_not_distinct_from_is_refused(con: duckdb.DuckDBPyConnection) -> None:
    query = (
        "SELECT t.id, q.ts AS qts FROM trades t ASOF JOIN quotes q "
        "ON t.sym IS NOT DISTINCT FROM q.sym AND t.ts >= q.ts"
    )
    with pytest.raises(UnsupportedError, match=r"ASOF JOIN.*IS NOT DISTINCT FROM"):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DuckDBFallbackWarning)
        got = shoal.duckdb.sql(con, query, raise_on_fail=False, config=CONFIG).pl()
    assert_frames_match(got, con.sql(query).pl())


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        (
            "SELECT t.id, q.ts AS qts FROM trades t ASOF RIGHT JOIN quotes q "
            "ON t.sym = q.sym AND t.ts >= q.ts",
            r"ASOF JOIN \(RIGHT\): ASOF RIGHT joins are not supported",
        ),
        (
            "SELECT t.id, q.ts AS qts FROM trades t ASOF JOIN quotes q "
            "ON t.sym <> q.sym AND t.ts >= q.ts",
            r"ASOF JOIN \(INNER\): a condition that is not a comparison",
        ),
    ],
)
def test_other_asof_forms_are_refused(
    con: duckdb.DuckDBPyConnection, query: str, reason: str
) -> None:
    with pytest.raises(UnsupportedError, match=reason):
        shoal.duckdb.sql(con, query, raise_on_fail=True, config=CONFIG)


def test_asof_join_on_ray(con: duckdb.DuckDBPyConnection, ray_runner: None) -> None:
    check(con, QUERIES[">= left"], CONFIG.replace(runner="ray"))
    report = last_query()
    assert report is not None and report.runner == "ray"
