"""The small-query path's crossover: TPC-H with the path forced off and forced on.

For each scale and query, in one process: native Polars ``collect()``, then shoal on one
runner with ``small_query_bytes=0`` (always distributed) and with it (and
``target_partition_bytes``, which caps it) above every input (always one task); medians of ``--runs`` timed runs after one warm-up, interleaved per
query. Each row gives the scans' estimated input (the planner's estimate, the number the
threshold is compared with) so that the crossover (where one task stops paying) can be
read off as a size::

    python -m benchmarks.small_query --scales 0.01,0.1,1 --runner ray --runs 3

Prints a Markdown table sorted by estimated input; ``--json PATH`` writes every timing.
The one-task answer is checked against the distributed one and native Polars'
(``benchmarks._check``); a difference is printed in the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import polars as pl

#: A threshold above every input (target_partition_bytes caps it): the one-task plan.
ONE_TASK = {"small_query_bytes": 1 << 62, "target_partition_bytes": 1 << 62}
DISTRIBUTED = {"small_query_bytes": 0}


def _timed(fn: Any, runs: int) -> tuple[float, Any]:
    fn()  # warm-up
    times = []
    out = None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", default="0.01,0.1,1")
    p.add_argument("--queries", default="")
    p.add_argument("--runner", choices=["local", "ray"], default="local")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import shoal
    from benchmarks._check import check_result
    from shoal.planner.physical import plan_physical
    from shoal.tpch.datagen import generate
    from shoal.tpch.queries import QUERIES, SORT_KEYS, scan_tables
    from shoal_polars.engine import to_ir

    wanted = [int(q) for q in args.queries.split(",") if q] or sorted(QUERIES)
    rows: list[dict[str, Any]] = []
    for scale in [float(s) for s in args.scales.split(",")]:
        tables = scan_tables(generate(scale, args.data_dir))
        for q in wanted:
            lf = QUERIES[q](tables)
            cfg = shoal.get_config().replace(runner=args.runner, **ONE_TASK)
            ir = to_ir(lf)
            physical = plan_physical(ir, cfg)
            est = physical.stages[0].est_bytes if len(physical.stages) == 1 else -1
            native, expected = _timed(lf.collect, args.runs)
            res = {}
            for name, settings in (("distributed", DISTRIBUTED), ("one task", ONE_TASK)):

                def run(settings: dict[str, int] = settings, lf: pl.LazyFrame = lf) -> pl.DataFrame:
                    with shoal.execution_config(**settings):
                        return lf.collect(
                            engine=shoal.DistEngine(runner=args.runner, raise_on_fail=True)
                        )

                t, got = _timed(run, args.runs)
                verdict = check_result(got, expected, SORT_KEYS.get(q))[0]
                res[name] = (t, verdict)
            rows.append(
                {
                    "scale": scale,
                    "query": q,
                    "est_bytes": est,
                    "polars": native,
                    "distributed": res["distributed"][0],
                    "one_task": res["one task"][0],
                    "check": f"{res['distributed'][1]}/{res['one task'][1]}",
                }
            )
            r = rows[-1]
            print(
                f"sf{scale} Q{q}: {est / 2**20:.1f} MiB polars {native:.3f} "
                f"distributed {r['distributed']:.3f} one task {r['one_task']:.3f} {r['check']}",
                flush=True,
            )
    print()
    print(
        f"| est. input MiB | query | polars s | distributed s | one task s | one task / "
        f"distributed | check ({args.runner}) |"
    )
    print("|---:|:---|---:|---:|---:|---:|:---|")
    for r in sorted(rows, key=lambda r: r["est_bytes"]):
        print(
            f"| {r['est_bytes'] / 2**20:.1f} | sf{r['scale']:g} Q{r['query']} | "
            f"{r['polars']:.3f} | {r['distributed']:.3f} ({r['distributed'] / r['polars']:.2f}x) "
            f"| {r['one_task']:.3f} ({r['one_task'] / r['polars']:.2f}x) | "
            f"{r['one_task'] / r['distributed']:.2f} | {r['check']} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
