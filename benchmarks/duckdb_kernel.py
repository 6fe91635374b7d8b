"""Per-task work of DuckDB-frontend fragments: shoal's Polars kernel against DuckDB itself
querying the task's Arrow tables.

Measures, on one partition of TPC-H scale 1 (part 1 of 8 of ``lineitem`` and ``orders``,
made by ``tpchgen-cli``), the work a task does for three fragments (Q1's partial
aggregate, Q6's filtered partial sum, a Q3-like join of the co-partitioned orders and
lineitem with its partial aggregate):

* ``polars``: the fragment as shoal runs it today (``shoal.duckdb.sql`` on the local runner,
  one partition, so every task of the query is this partition's work): the sum of the
  tasks' wall times (IR -> Polars lazy query -> collect -> Arrow);
* ``duckdb``: the same SQL run by DuckDB over the Arrow tables (a replacement scan reads
  them without copying), result fetched as Arrow, on a connection opened once;
* ``duckdb+connect``: the same with a new in-memory connection per task (the cost of
  starting DuckDB in a task), and ``connect`` alone.

Run it in a process of its own, so that the thread settings hold::

    POLARS_MAX_THREADS=1 python benchmarks/duckdb_kernel.py --threads 1

Reports medians of ``--repeat`` runs in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

FRAGMENTS = {
    "Q1 partial aggregate": """
        SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty,
               sum(l_extendedprice) AS sum_base_price,
               sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
               sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
               count(l_quantity) AS n_qty, count(l_extendedprice) AS n_price,
               count(l_discount) AS n_disc, count(*) AS count_order
        FROM lineitem WHERE l_shipdate <= DATE '1998-09-02'
        GROUP BY l_returnflag, l_linestatus""",
    "Q6 filter + sum": """
        SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem
        WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
          AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24""",
    "Q3-like join + aggregate": """
        SELECT l_orderkey, o_orderdate, o_shippriority,
               sum(l_extendedprice * (1 - l_discount)) AS revenue
        FROM orders JOIN lineitem ON l_orderkey = o_orderkey
        WHERE o_orderdate < DATE '1995-03-15' AND l_shipdate > DATE '1995-03-15'
        GROUP BY l_orderkey, o_orderdate, o_shippriority""",
}


def _data(root: Path) -> tuple[Path, Path]:
    lineitem = root / "lineitem" / "lineitem.1.parquet"
    orders = root / "orders" / "orders.1.parquet"
    if not (lineitem.exists() and orders.exists()):
        subprocess.run(
            [
                "tpchgen-cli",
                "parquet",
                "-s",
                "1",
                "--tables=lineitem,orders",
                "--parts=8",
                "--part=1",
                f"--output-dir={root}",
            ],
            check=True,
        )
    return lineitem, orders


def _median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="/tmp/shoal-duckdb-kernel", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import duckdb
    import pyarrow.parquet as pq

    import shoal
    from shoal.runners.session import last_query

    lineitem_path, orders_path = _data(args.data)
    lineitem = pq.read_table(lineitem_path)
    orders = pq.read_table(orders_path)
    print(
        f"partition: lineitem {lineitem.num_rows:,} rows, orders {orders.num_rows:,} rows; "
        f"threads {args.threads} (POLARS_MAX_THREADS={os.environ.get('POLARS_MAX_THREADS')})"
    )

    con = duckdb.connect()
    con.execute(f"SET threads = {args.threads}")
    con.register("lineitem", lineitem)
    con.register("orders", orders)
    config = shoal.Config(runner="local", default_partitions=1, shuffle_partitions=1)

    def fresh_connection() -> duckdb.DuckDBPyConnection:
        c = duckdb.connect()
        c.execute(f"SET threads = {args.threads}")
        return c

    connect_ms = _median_ms(lambda: fresh_connection().close(), args.repeat)
    print(f"{'fragment':28} {'polars':>9} {'duckdb':>9} {'duckdb+connect':>15}")
    for name, sql in FRAGMENTS.items():
        task_ms: list[float] = []

        def polars_run(sql: str = sql, task_ms: list[float] = task_ms) -> None:
            shoal.duckdb.sql(con, sql, config=config, raise_on_fail=True).fetchall()
            report = last_query()
            assert report is not None
            task_ms.append(1000 * sum(s.end - s.start for s in report.task_stats.values()))

        def duckdb_run(c: duckdb.DuckDBPyConnection = con, sql: str = sql) -> None:
            c.sql(sql).to_arrow_table()

        def duckdb_connect_run(sql: str = sql) -> None:
            c = fresh_connection()
            c.register("lineitem", lineitem)
            c.register("orders", orders)
            c.sql(sql).to_arrow_table()
            c.close()

        _median_ms(polars_run, args.repeat)
        polars_ms = statistics.median(task_ms[1:])
        duck_ms = _median_ms(duckdb_run, args.repeat)
        fresh_ms = _median_ms(duckdb_connect_run, args.repeat)
        print(f"{name:28} {polars_ms:9.1f} {duck_ms:9.1f} {fresh_ms:15.1f}")
    print(f"{'connect (duckdb.connect())':28} {'':9} {'':9} {connect_ms:15.1f}")


if __name__ == "__main__":
    main()
