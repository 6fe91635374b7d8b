"""CPU user functions: shoal against native ``map_batches``, several runs in one process.

A stateless function and a stateful class, both ``a * 2`` over ``--rows`` rows of an
in-memory frame (``lf.shoal.with_udf``), each run ``--runs`` times in one process, on one
runner, beside native Polars running the same function with ``map_batches``; every answer
is checked against native's. The runs are listed one by one (a slowdown from run to run
shows as a rising column), then medians::

    python -m benchmarks.udf --rows 3000000 --runs 5 --runner ray [--no-keep-warm]

``--json PATH`` writes every timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import polars as pl


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=3_000_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--runner", choices=["local", "ray"], default="ray")
    p.add_argument(
        "--keep-warm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="udf_keep_warm: reuse the actor pool across queries (default: the setting's, on)",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()

    import shoal

    def double(a: pl.Series) -> pl.Series:
        return a * 2

    class Doubler:
        def __init__(self) -> None:
            self.factor = 2

        def __call__(self, a: pl.Series) -> pl.Series:
            return a * self.factor

    stateless = shoal.udf(return_dtype=pl.Int64, name="double")(double)
    stateful = shoal.udf(return_dtype=pl.Int64, name="doubler")(Doubler)

    lf = pl.DataFrame({"a": pl.int_range(0, args.rows, eager=True)}).lazy()
    native_lf = lf.with_columns(b=pl.col("a").map_batches(double, return_dtype=pl.Int64))
    expected = native_lf.collect()
    t0 = time.perf_counter()
    shoal.set_config(runner=args.runner)
    if args.keep_warm is not None:
        shoal.set_config(udf_keep_warm=args.keep_warm)
    from shoal.runners.session import start_runner

    start_runner(shoal.get_config())
    start = time.perf_counter() - t0
    print(f"runner {args.runner} started in {start:.2f} s", flush=True)

    times: dict[str, list[float]] = {"native map_batches": [], "stateless": [], "stateful": []}
    for i in range(args.runs):
        for name, fn in (
            ("native map_batches", native_lf.collect),
            (
                "stateless",
                lambda: lf.shoal.with_udf(stateless, inputs=["a"], output="b").collect(
                    engine="dist"
                ),
            ),
            (
                "stateful",
                lambda: lf.shoal.with_udf(stateful, inputs=["a"], output="b").collect(
                    engine="dist"
                ),
            ),
        ):
            t0 = time.perf_counter()
            got: Any = fn()
            dt = time.perf_counter() - t0
            assert got.equals(expected), f"{name}: wrong answer"
            times[name].append(dt)
            print(f"run {i + 1} {name}: {dt:.3f} s", flush=True)
    base = statistics.median(times["native map_batches"])
    print()
    print(
        f"| {args.rows:,} rows, {args.runner} | "
        + " | ".join(f"run {i + 1}" for i in range(args.runs))
        + " | median | vs native |"
    )
    print("|:---|" + "---:|" * (args.runs + 2))
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"| {name} | "
            + " | ".join(f"{t:.3f}" for t in ts)
            + f" | {med:.3f} | {med / base:.2f}x |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rows": args.rows,
                    "runner": args.runner,
                    "udf_keep_warm": shoal.get_config().udf_keep_warm,
                    "times": times,
                },
                f,
                indent=1,
            )
    shoal.shutdown()


if __name__ == "__main__":
    main()
