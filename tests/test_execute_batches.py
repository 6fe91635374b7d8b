"""shoal.execute_batches: partitions stream out in order as they finish."""

from __future__ import annotations

import gc

import polars as pl
import pyarrow as pa
import pytest

import shoal
from shoal.ir import InMemorySource, Scan, Schema, Slice
from shoal.runners.dispatch import DispatchLoop
from shoal.runners.session import last_query

from .irplans import agg_sort_plan, frame


def test_batches_equal_execute_and_keep_partition_order() -> None:
    plan, expected = agg_sort_plan(frame(3000))
    cfg = shoal.Config(default_partitions=5, shuffle_partitions=4)
    batches = list(shoal.execute_batches(plan, runner="local", config=cfg))
    got = pl.from_arrow(pa.Table.from_batches(batches))
    assert isinstance(got, pl.DataFrame)
    assert got.equals(expected)  # a sort: partition order is the global order


def test_first_partition_arrives_before_the_query_ends_and_dropping_cancels(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    df = pl.DataFrame({"a": range(10_000)})
    table = df.to_arrow()
    scan = Scan(InMemorySource(table), Schema.from_arrow(table.schema))
    before = last_query()
    stopped: list[bool] = []
    monkeypatch.setattr(DispatchLoop, "close_pools", lambda self: stopped.append(True))
    it = shoal.execute_batches(scan, runner="local", config=shoal.Config(default_partitions=8))
    assert isinstance(it, pa.RecordBatchReader)
    first = next(it)
    assert first.num_rows == 10_000 // 8 and first.column(0)[0].as_py() == 0
    assert not stopped
    del it  # stop early: the rest of the query is cancelled, nothing is reported
    gc.collect()
    assert stopped
    assert last_query() is before
    sliced = Slice(scan, 0, 3, scan.schema)
    rows = [b.num_rows for b in shoal.execute_batches(sliced, runner="local")]
    assert sum(rows) == 3
