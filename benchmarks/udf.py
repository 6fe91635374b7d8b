"""CPU user functions: shoal against native ``map_batches``, several runs in one process.

Two kinds of work over ``--rows`` rows of an in-memory frame (``lf.shoal.with_udf``), each
as a stateless function and as a stateful class, each run ``--runs`` times in one process,
on one runner, beside native Polars running the same function with ``map_batches``; every
answer is checked against native's:

* ``double``: ``a * 2``, next to nothing per row, so what is measured is shoal's fixed
  cost per query (planning, Ray calls, moving the rows through the object store);
* ``model``: a small model's worth of NumPy per batch (one hidden layer of
  :data:`HIDDEN` tanh units, a few ms per 8,192 rows), which the class builds in its
  ``__init__`` as a model would be loaded. Native ``map_batches`` hands the function the
  whole column, which runs the same layer over the same 8,192-row slices, so both do the
  same arithmetic; this is the ratio a user with real work per batch sees.

The runs are listed one by one (a slowdown from run to run shows as a rising column),
then medians::

    python -m benchmarks.udf --rows 3000000 --runs 6 --runner ray [--work double|model]

``--json PATH`` writes every timing.

Ray starts its workers at the driver's niceness plus 15 (its ``worker_niceness``, which
keeps the raylet responsive), where native Polars runs in the driver. On a machine that
other work keeps busy that gives every Ray task a fraction of the CPU share the native
run gets (nice 19 against 10: a seventh of the weight), which measures the machine's
load, not shoal. This benchmark starts Ray's workers at the driver's niceness instead
(``RAY_worker_niceness=0``, as on a machine that runs nothing else);
``--ray-worker-niceness 15`` keeps Ray's default.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl
from polars.testing import assert_frame_equal

#: Hidden units of the ``model`` work, and the rows it computes at once (shoal's default
#: ``udf_batch_size``, so that native and shoal cut the same slices).
HIDDEN = 16
SLICE = 8192
#: The environment variable of Ray's ``worker_niceness`` setting (Ray spells it so).
WORKER_NICENESS = "RAY_worker_niceness"


def _weights() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(17)
    return rng.normal(size=HIDDEN) / 1e6, rng.normal(size=HIDDEN), rng.normal(size=HIDDEN)


def run_model(a: pl.Series, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray) -> pl.Series:
    """One tanh layer and a weighted sum per row, :data:`SLICE` rows at a time."""
    x = a.cast(pl.Float64).to_numpy()
    out = np.empty(len(x))
    for s in range(0, len(x), SLICE):
        h = np.tanh(x[s : s + SLICE, None] * w1 + b1)
        out[s : s + SLICE] = (h * w2).sum(axis=1)
    return pl.Series(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=3_000_000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--runner", choices=["local", "ray"], default="ray")
    p.add_argument("--work", choices=["double", "model", "both"], default="both")
    p.add_argument(
        "--keep-warm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="udf_keep_warm: reuse the actor pool across queries (default: the setting's, on)",
    )
    p.add_argument(
        "--ray-worker-niceness",
        type=int,
        default=0,
        help="niceness of Ray's workers over the driver's (Ray's default: 15); see above",
    )
    p.add_argument("--json", default=None)
    args = p.parse_args()
    # Read by the raylet that shoal starts (it inherits this process's environment).
    os.environ.setdefault(WORKER_NICENESS, str(args.ray_worker_niceness))

    import shoal

    def double(a: pl.Series) -> pl.Series:
        return a * 2

    class Doubler:
        def __init__(self) -> None:
            self.factor = 2

        def __call__(self, a: pl.Series) -> pl.Series:
            return a * self.factor

    w1, b1, w2 = _weights()

    def model(a: pl.Series) -> pl.Series:
        return run_model(a, w1, b1, w2)

    class Model:
        def __init__(self) -> None:
            self.w1, self.b1, self.w2 = _weights()  # "loading the model"

        def __call__(self, a: pl.Series) -> pl.Series:
            return run_model(a, self.w1, self.b1, self.w2)

    works: dict[str, tuple[Callable[..., Any], Any, Any, pl.DataType]] = {
        "double": (double, double, Doubler, pl.Int64()),
        "model": (model, model, Model, pl.Float64()),
    }
    chosen = list(works) if args.work == "both" else [args.work]

    lf = pl.DataFrame({"a": pl.int_range(0, args.rows, eager=True)}).lazy()
    t0 = time.perf_counter()
    shoal.set_config(runner=args.runner)
    if args.keep_warm is not None:
        shoal.set_config(udf_keep_warm=args.keep_warm)
    from shoal.runners.session import start_runner

    start_runner(shoal.get_config())
    start = time.perf_counter() - t0
    print(f"runner {args.runner} started in {start:.2f} s", flush=True)

    times: dict[str, dict[str, list[float]]] = {}
    for work in chosen:
        native_fn, fn, cls, dtype = works[work]
        stateless = shoal.udf(return_dtype=dtype, name=work)(fn)
        stateful = shoal.udf(return_dtype=dtype, name=f"{work}_class")(cls)
        native_lf = lf.with_columns(b=pl.col("a").map_batches(native_fn, return_dtype=dtype))
        expected = native_lf.collect()
        queries: list[tuple[str, Callable[[], Any]]] = [
            ("native map_batches", native_lf.collect),
            (
                "stateless",
                lambda u=stateless: lf.shoal.with_udf(u, inputs=["a"], output="b").collect(
                    engine="dist"
                ),
            ),
            (
                "stateful",
                lambda u=stateful: lf.shoal.with_udf(u, inputs=["a"], output="b").collect(
                    engine="dist"
                ),
            ),
        ]
        ts: dict[str, list[float]] = {name: [] for name, _ in queries}
        times[work] = ts
        for i in range(args.runs):
            for name, q in queries:
                t0 = time.perf_counter()
                got: Any = q()
                dt = time.perf_counter() - t0
                assert_frame_equal(got, expected, check_exact=True)
                ts[name].append(dt)
                print(f"run {i + 1} {work} {name}: {dt:.3f} s", flush=True)

    for work, ts in times.items():
        base = statistics.median(ts["native map_batches"])
        print()
        print(
            f"| {work}, {args.rows:,} rows, {args.runner} | "
            + " | ".join(f"run {i + 1}" for i in range(args.runs))
            + " | median | vs native |"
        )
        print("|:---|" + "---:|" * (args.runs + 2))
        for name, t in ts.items():
            med = statistics.median(t)
            print(
                f"| {name} | "
                + " | ".join(f"{x:.3f}" for x in t)
                + f" | {med:.3f} | {med / base:.2f}x |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "rows": args.rows,
                    "runner": args.runner,
                    "udf_keep_warm": shoal.get_config().udf_keep_warm,
                    "ray_worker_niceness": os.environ[WORKER_NICENESS],
                    "times": times,
                },
                f,
                indent=1,
            )
    shoal.shutdown()


if __name__ == "__main__":
    main()
