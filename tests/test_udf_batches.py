"""How many rows a user function gets per call when its ``batch_size`` is unset: a
stateless CPU function each task's rows in one call (as Polars' ``map_batches`` gets a
whole column), a stateful class 8192 (``shoal.udf.POOL_BATCH_SIZE``), and the
``udf_batch_size`` setting, when set, for both. Each function returns the size of the batch
it was given, so the output column shows every call's rows (also from a worker process)."""

from __future__ import annotations

import polars as pl
import pytest

import shoal
from shoal.udf import POOL_BATCH_SIZE, UDF

ROWS = 20_000


@shoal.udf(return_dtype=pl.Int64, name="batch_rows_fn")
def batch_rows(a: pl.Series) -> pl.Series:
    return pl.Series([a.len()] * a.len(), dtype=pl.Int64)


@shoal.udf(return_dtype=pl.Int64, name="batch_rows_cls", concurrency=1)
class BatchRows:
    def __call__(self, a: pl.Series) -> pl.Series:
        return pl.Series([a.len()] * a.len(), dtype=pl.Int64)


def _calls(udf: UDF, config: shoal.Config) -> list[int]:
    """The rows of each call, in order, for ``ROWS`` rows (checked row for row against the
    input: every row got exactly one value)."""
    lf = pl.LazyFrame({"a": range(ROWS)}).shoal.with_udf(udf, "a", "n")
    got = lf.collect(engine=shoal.DistEngine(config=config, raise_on_fail=True))
    assert got["a"].to_list() == list(range(ROWS))
    sizes = got["n"].to_list()
    out, i = [], 0
    while i < len(sizes):
        out.append(sizes[i])
        i += sizes[i]
    assert i == ROWS and sum(out) == ROWS
    return out


def test_stateless_function_gets_each_tasks_rows_in_one_call() -> None:
    small = shoal.Config(runner="local")
    assert _calls(batch_rows, small) == [ROWS]
    split = shoal.Config(runner="local", default_partitions=3)
    assert _calls(batch_rows, split) == [6666, 6667, 6667]


def test_batch_sizes_that_are_set_still_apply() -> None:
    setting = shoal.Config(runner="local", udf_batch_size=5000)
    assert _calls(batch_rows, setting) == [5000] * 4
    own = batch_rows.options(batch_size=3000)
    assert _calls(own, setting) == [3000] * 6 + [2000]


@pytest.mark.timeout(300)
def test_stateful_class_keeps_pool_sized_batches() -> None:
    got = _calls(BatchRows, shoal.Config(runner="local"))
    assert got == [POOL_BATCH_SIZE, POOL_BATCH_SIZE, ROWS - 2 * POOL_BATCH_SIZE]
