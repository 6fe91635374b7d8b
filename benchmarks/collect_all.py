"""``pl.collect_all`` on shoal: three queries over one filtered, derived lineitem, run as
one plan (the shared part computed once) against one ``collect`` per query.

    python -m benchmarks.collect_all --scale 0.1 --runner local --repeat 5

Prints the median wall time of each way and the rows their scan tasks read; both ways'
answers are checked against Polars' own ``collect_all``.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    import polars as pl
    from polars.testing import assert_frame_equal

    import shoal
    from shoal.runners.session import last_query
    from shoal.tpch.datagen import generate

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.1)
    parser.add_argument("--runner", choices=["local", "ray"], default="local")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data-dir", default=None)
    args = parser.parse_args()

    root = generate(args.scale, args.data_dir, parts=4)
    lineitem = pl.scan_parquet(f"{root}/lineitem/*.parquet")
    shared = lineitem.filter(pl.col("l_shipdate") <= pl.date(1998, 9, 2)).with_columns(
        rev=pl.col("l_extendedprice") * (1 - pl.col("l_discount"))
    )
    queries = [
        shared.group_by("l_returnflag", "l_linestatus")
        .agg(pl.col("rev").sum(), pl.len())
        .sort("l_returnflag", "l_linestatus"),
        shared.select(pl.col("rev").sum(), pl.col("l_quantity").mean()),
        shared.group_by("l_shipmode").agg(pl.col("rev").max()).sort("l_shipmode"),
    ]
    engine = shoal.DistEngine(runner=args.runner, raise_on_fail=True, small_query_bytes=0)
    expected = pl.collect_all(queries, engine="in-memory")

    def scanned() -> int:
        report = last_query()
        assert report is not None
        return sum(s.scan_rows for s in report.task_stats.values())

    pl.collect_all(queries, engine=engine)  # warm-up (starts the runner)
    together, apart = [], []
    rows_together = rows_apart = 0
    for _ in range(args.repeat):
        start = time.perf_counter()
        got = pl.collect_all(queries, engine=engine)
        together.append(time.perf_counter() - start)
        rows_together = scanned()
        for g, e in zip(got, expected, strict=True):
            assert_frame_equal(g, e, check_exact=False)
        start = time.perf_counter()
        rows_apart = 0
        for q, e in zip(queries, expected, strict=True):
            assert_frame_equal(q.collect(engine=engine), e, check_exact=False)
            rows_apart += scanned()
        apart.append(time.perf_counter() - start)
    print(f"scale {args.scale:g}, {args.runner} runner, medians of {args.repeat}")
    print(
        f"collect_all, one plan:  {statistics.median(together):.3f} s, "
        f"scan tasks read {rows_together:,} rows"
    )
    print(
        f"one collect per query: {statistics.median(apart):.3f} s, "
        f"scan tasks read {rows_apart:,} rows"
    )
    shoal.shutdown()


if __name__ == "__main__":
    main()
