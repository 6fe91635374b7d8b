"""What tracing costs: TPC-H on the Ray runner with and without ``shoal.trace``, one run.

Each round runs every query once untraced and once traced (the order alternates between
rounds, so neither side always runs on warmer caches); traced runs write one trace file
per query, and the time to write it counts. After one warm-up round, the script reports
the median time per query on each side and the ratio traced / untraced::

    python benchmarks/trace_overhead.py --scale 0.1 --rounds 7

Prints a Markdown table (the one in docs/tracing.md); ``--json PATH`` also writes the
raw times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def replay(report: Any, config: Any, path: Path, repeat: int = 5, trials: int = 7) -> float:
    """Microseconds of driver time the tracer spends per task: replay the recorded tasks
    of ``report`` through a :class:`~shoal.tracing.QueryTracer` writing to ``path``, as the
    dispatch loop would call it (dispatch, finish, the loop's spans, the file), ``repeat``
    times per trial; the best of ``trials`` (the least disturbed by other processes)."""
    from shoal.runners.dispatch import TaskSpec
    from shoal.tracing import ChromeTraceWriter, QueryTracer

    physical = report.physical
    specs = [
        (TaskSpec(physical.stage(sid), part, [], None, physical.stage(sid).output), stats)
        for (sid, part), stats in sorted(report.task_stats.items())
    ]
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for i in range(repeat):
            writer = ChromeTraceWriter(path)
            with QueryTracer(i, config, [writer]) as tracer:
                tracer.planned(physical, cpus=2, max_in_flight=4)
                for spec, stats in specs:
                    with tracer.span("dispatch") as span:
                        tracer.task_dispatched(spec)
                        span.set(tasks=1)
                    with tracer.span("await") as span:
                        tracer.task_finished(spec, stats)
                        span.set(tasks=1)
            writer.close()
        best = min(best, time.perf_counter() - t0)
    return best / (repeat * len(specs)) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=float, default=0.1, help="TPC-H scale factor")
    p.add_argument("--rounds", type=int, default=7, help="measured rounds (after a warm-up)")
    p.add_argument("--queries", default="", help="comma-separated query numbers; default all")
    p.add_argument("--cpus", type=int, default=0, help="CPUs of the local Ray instance")
    p.add_argument(
        "--partition-mib", type=float, default=8.0, help="target_partition_bytes, in MiB"
    )
    p.add_argument("--data-dir", type=Path, default=None, help="TPC-H cache directory")
    p.add_argument("--json", type=Path, default=None, help="also write raw times here")
    args = p.parse_args()

    import shoal
    from shoal.runners.session import last_query
    from shoal.tpch.datagen import generate
    from shoal.tpch.queries import QUERIES, scan_tables

    data = generate(args.scale, args.data_dir)
    if args.cpus:
        shoal.set_config(num_cpus=args.cpus)
    config = shoal.Config(target_partition_bytes=int(args.partition_mib * 2**20))
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=config)
    tables = scan_tables(data)
    queries = [int(q) for q in args.queries.split(",") if q] or sorted(QUERIES)
    out = Path(tempfile.mkdtemp(prefix="shoal-trace-overhead-"))

    def run(q: int, traced: bool, tag: str) -> float:
        lf = QUERIES[q](tables)
        t0 = time.perf_counter()
        if traced:
            with shoal.trace(out / f"q{q}-{tag}.json"):
                lf.collect(engine=engine)
        else:
            lf.collect(engine=engine)
        return time.perf_counter() - t0

    times: dict[int, dict[str, list[float]]] = {q: {"off": [], "on": []} for q in queries}
    tasks: dict[int, int] = {}
    replay_us: list[float] = []
    for q in queries:  # warm-up: start Ray, fill the OS page cache, import everything
        run(q, False, "warm")
        run(q, True, "warm")
        report = last_query()
        assert report is not None
        tasks[q] = len(report.task_stats)
        replay_us.append(replay(report, config, out / f"replay-q{q}.json"))
    for r in range(args.rounds):
        for q in queries:
            for traced in (False, True) if r % 2 == 0 else (True, False):
                times[q]["on" if traced else "off"].append(run(q, traced, str(r)))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    size = {q: (out / f"q{q}-0.json").stat().st_size for q in queries}
    rows = []
    for q in queries:
        off, on = statistics.median(times[q]["off"]), statistics.median(times[q]["on"])
        rows.append((q, tasks[q], off, on, on / off, size[q]))
    total_off = sum(r[2] for r in rows)
    total_on = sum(r[3] for r in rows)

    cpus = args.cpus or os.cpu_count()
    print(
        f"\nTPC-H scale {args.scale:g}, Ray runner ({cpus} CPUs), target_partition_bytes "
        f"{args.partition_mib:g} MiB, median of {args.rounds} rounds\n"
    )
    print("| query | tasks | untraced (s) | traced (s) | traced / untraced | trace file |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for q, n, off, on, ratio, nbytes in rows:
        print(f"| Q{q} | {n} | {off:.3f} | {on:.3f} | {ratio:.3f} | {nbytes / 1024:.0f} KiB |")
    print(
        f"| all | {sum(tasks.values())} | {total_off:.3f} | {total_on:.3f} | "
        f"{total_on / total_off:.3f} | |"
    )
    geo = statistics.geometric_mean([r[4] for r in rows])
    print(f"\ngeometric mean of the per-query ratios: {geo:.3f}")
    print(
        "driver time in the tracer per task (replaying each query's recorded tasks into a "
        f"trace file, including the file writes): median {statistics.median(replay_us):.0f} "
        f"us over the queries, max {max(replay_us):.0f} us"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"data_dir": str(data), "json": str(args.json)},
                    "times": times,
                    "tasks": tasks,
                },
                indent=1,
            )
        )
    shoal.shutdown()


if __name__ == "__main__":
    main()
