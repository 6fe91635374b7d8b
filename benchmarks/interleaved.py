"""TPC-H, native Polars and shoal alternating in one process: the best of K runs each.

On a machine shared with other work, load spikes hit single runs; alternating the two
engines run by run and keeping each one's fastest run gives ratios that move much less
than medians of runs made one engine after the other. For the published tables use
``python -m benchmarks.tpch``; this is for before/after comparisons of one change::

    python -m benchmarks.interleaved --scale 1 --runs 5 --queries 4,12,14,18,20
    python -m benchmarks.interleaved --scale 1 --stages   # per-stage task times too

Data: the cache of ``benchmarks.tpch`` (``~/.cache/shoal/tpch/sf<N>``, generated there).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import polars as pl

import shoal
from shoal.runners.session import last_query
from shoal.tpch.queries import QUERIES, scan_tables


def _stages() -> None:
    """Print the last query's stages: tasks, span from its first task, median and
    longest task, rows out."""
    rep = last_query()
    if rep is None or not rep.task_stats:
        return
    first = min(s.start for s in rep.task_stats.values())
    for st in rep.physical.stages:
        got = [v for (sid, _), v in rep.task_stats.items() if sid == st.id]
        if not got:
            continue
        durs = sorted(s.end - s.start for s in got)
        begin = (min(s.start for s in got) - first) * 1e3
        end = (max(s.end for s in got) - first) * 1e3
        print(
            f"    stage {st.id:2d} {st.name[:44]:44s} tasks {len(got):3d} "
            f"{begin:7.1f}-{end:7.1f} ms, task median {durs[len(durs) // 2] * 1e3:6.1f} "
            f"max {durs[-1] * 1e3:6.1f} ms, rows out {sum(s.rows_out for s in got):,}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="1")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--queries", default="", help="comma-separated (default: all 22)")
    ap.add_argument("--runner", default="ray", choices=["ray", "local"])
    ap.add_argument("--data-dir", default=os.environ.get("SHOAL_DATA_DIR", ""))
    ap.add_argument("--stages", action="store_true", help="print per-stage task times")
    args = ap.parse_args()
    root = Path(args.data_dir or Path.home() / ".cache" / "shoal" / "tpch") / f"sf{args.scale}"
    tables = scan_tables(root)
    engine = shoal.DistEngine(runner=args.runner, raise_on_fail=True)
    queries = [int(q) for q in args.queries.split(",")] if args.queries else sorted(QUERIES)
    total_native = total_shoal = 0.0
    print(f"scale {args.scale}, {args.runner} runner, best of {args.runs}, load {os.getloadavg()}")
    for q in queries:
        lf = QUERIES[q](tables)
        lf.collect(engine=engine)  # warm-up
        native, dist = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            lf.collect()
            native.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = lf.collect(engine=engine)
            dist.append(time.perf_counter() - t0)
        assert isinstance(got, pl.DataFrame)
        a, b = min(native), min(dist)
        total_native += a
        total_shoal += b
        print(f"Q{q}: polars {a:.3f} s, shoal-{args.runner} {b:.3f} s ({b / a:.2f}x)", flush=True)
        if args.stages:
            _stages()
    print(
        f"total: polars {total_native:.3f} s, shoal-{args.runner} {total_shoal:.3f} s "
        f"({total_shoal / total_native:.2f}x); load {os.getloadavg()}"
    )


if __name__ == "__main__":
    main()
