"""TPC-H queries through ``collect(engine=DistEngine(...))`` on both runners, against native
Polars; the physical plan's shape; where the tasks ran; bad input."""

from __future__ import annotations

import os
from datetime import date
from pathlib import Path
from typing import Literal

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.config import RunnerKind
from shoal.ir.nodes import Aggregate, Join, Scan, StageInput
from shoal.planner.physical import HashOutput, RangeOutput, ScanPartition, ScanSet, Stage
from shoal.runners.session import last_query
from shoal.tpch.compare import assert_frames_match
from shoal.tpch.queries import QUERIES, SORT_KEYS, scan_tables

from .conftest import SMALL_PARTITION_BYTES

pytestmark = pytest.mark.usefixtures("ray_runner")

#: Queries run on Ray in the default run (a mix of aggregation, join types, IEJoin, windows
#: of the planner); the others run on Ray under the ``slow`` marker. Every query runs on the
#: local runner by default.
RAY_DEFAULT = [1, 3, 5, 6, 10, 11, 13, 18, 21, 22]


def _cases() -> list[object]:
    cases: list[object] = []
    for q in sorted(QUERIES):
        cases.append(pytest.param("local", q, id=f"local-q{q}"))
        marks = () if q in RAY_DEFAULT else (pytest.mark.slow,)
        cases.append(pytest.param("ray", q, id=f"ray-q{q}", marks=marks))
    return cases


def _config(**kw: object) -> shoal.Config:
    return shoal.Config(target_partition_bytes=SMALL_PARTITION_BYTES, **kw)  # type: ignore[arg-type]


def _run(lf: pl.LazyFrame, runner: RunnerKind, **kw: object) -> pl.DataFrame:
    engine = shoal.DistEngine(runner=runner, raise_on_fail=True, config=_config(**kw))
    return lf.collect(engine=engine)


def _own_rows(st: Stage, scan_rows: int, p: int) -> int:
    """Rows task ``p`` of ``st`` read from its own scan's partition: a task that also
    computes a small build side (``broadcast_inline_bytes``) reads that side's scans whole
    beside it, which its ``scan_rows`` counts too."""
    part = st.scan_partitions[p] if st.scan_partitions else None
    if isinstance(part, ScanSet) and part.partitioned:
        own = [q for i, q in enumerate(part.parts) if not part.is_whole(i)]
        return sum(q.rows for q in own if isinstance(q, ScanPartition))
    return scan_rows


@pytest.mark.parametrize(("runner", "q"), _cases())
def test_query_matches_native_polars(tpch_dir: Path, runner: RunnerKind, q: int) -> None:
    tables = scan_tables(tpch_dir)
    expected = QUERIES[q](tables).collect()
    got = _run(QUERIES[q](tables), runner)
    assert_frames_match(got, expected, sort_keys=SORT_KEYS.get(q))
    report = last_query()
    assert report is not None and report.runner == runner
    # Several partitions in every scan stage, one of them empty; no scan task reads all rows.
    for st in report.physical.stages:
        if st.scan_partitions is None or not st.num_tasks:  # (0: skipped, its input empty)
            continue
        rows = [
            _own_rows(st, report.task_stats[(st.id, p)].scan_rows, p) for p in range(st.num_tasks)
        ]
        assert min(rows) == 0, f"{st.name}: the empty file should give an empty partition"
        # Big enough to split (a stage without broadcast inputs: its size is the scan's).
        if not st.inputs and st.est_bytes > 2 * SMALL_PARTITION_BYTES:
            assert sum(r > 0 for r in rows) >= 2 and max(rows) < sum(rows), st.name
    by_id = {st.id: st for st in report.physical.stages}
    assert any(
        s.rows_in - s.scan_rows + _own_rows(by_id[sid], s.scan_rows, p) == 0
        for (sid, p), s in report.task_stats.items()
    )


#: (query, shuffle partitions, target partition bytes) checked by default; the slow sweep runs
#: every query at 1, 2, 7 and 64 shuffle partitions and three scan partition sizes.
_CUT_DEFAULT = [(3, 1, 1 << 30), (13, 7, 16 * 1024), (18, 64, 64 * 1024), (22, 2, 32 * 1024)]
_CUT_SWEEP = [
    pytest.param(q, n, size, marks=pytest.mark.slow, id=f"q{q}-{n}-{size}")
    for q in sorted(QUERIES)
    for n in (1, 2, 7, 64)
    for size in (16 * 1024, 256 * 1024, 1 << 30)
    if (q, n, size) not in _CUT_DEFAULT
]


@pytest.mark.parametrize(("q", "shuffle", "size"), [*_CUT_DEFAULT, *_CUT_SWEEP])
def test_answer_does_not_depend_on_the_cut(tpch_dir: Path, q: int, shuffle: int, size: int) -> None:
    """The same answer however the scans are split and however many partitions follow each
    exchange (1, 2, 7, 64)."""
    tables = scan_tables(tpch_dir)
    engine = shoal.DistEngine(
        runner="local",
        raise_on_fail=True,
        config=shoal.Config(shuffle_partitions=shuffle, target_partition_bytes=size),
    )
    got = QUERIES[q](tables).collect(engine=engine)
    assert_frames_match(got, QUERIES[q](tables).collect(), sort_keys=SORT_KEYS.get(q))


def test_order_dependent_constructs_on_ray(tpch_dir: Path) -> None:
    """Row index, cumulative and window functions, an order-keeping semi join and a tail
    on Ray workers give Polars' rows in Polars' order."""
    tables = scan_tables(tpch_dir)
    lf = (
        tables["orders"]
        .select("o_orderkey", "o_custkey", "o_totalprice", "o_orderdate")
        .filter(pl.col("o_orderdate") < date(1994, 1, 1))
        .with_row_index("i")
        .with_columns(
            pl.col("o_totalprice").cum_sum().alias("running"),
            pl.col("o_totalprice").rank("ordinal").over("o_custkey").alias("rank_in_customer"),
            pl.col("o_orderdate").shift(1).alias("previous_date"),
        )
        .join(
            tables["customer"].filter(pl.col("c_mktsegment") == "BUILDING"),
            left_on="o_custkey",
            right_on="c_custkey",
            how="semi",
            maintain_order="left",
        )
        .tail(200)
    )
    got = _run(lf, "ray")
    assert_frame_equal(got, lf.collect(engine="in-memory"))


@pytest.mark.parametrize("how", ["right", "full", "anti"])
def test_hash_joins_on_ray(tpch_dir: Path, how: Literal["right", "full", "anti"]) -> None:
    """Join types that keep unmatched rows of a side, through a hash exchange on Ray."""
    tables = scan_tables(tpch_dir)
    orders = tables["orders"].filter(pl.col("o_orderpriority") == "1-URGENT")
    lf = tables["customer"].join(orders, left_on="c_custkey", right_on="o_custkey", how=how)
    got = _run(lf, "ray", broadcast_join_threshold_bytes=0)
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_row_order=False)
    report = last_query()
    assert report is not None
    joins = _joins(report.physical)
    assert [i.mode for i in joins[0][0].inputs] == ["bucket", "bucket"]


def test_every_tpch_query_is_implemented() -> None:
    assert sorted(QUERIES) == list(range(1, 23))
    assert sorted(SORT_KEYS) == list(range(1, 23))


def _stages(q: int, tpch_dir: Path, **kw: object):
    _run(QUERIES[q](scan_tables(tpch_dir)), "local", **kw)
    report = last_query()
    assert report is not None
    return report.physical


def test_q1_runs_two_phase_aggregation(tpch_dir: Path) -> None:
    physical = _stages(1, tpch_dir, adaptive=False)  # the plan as planned: no coalescing
    partial = [
        s
        for s in physical.stages
        if isinstance(s.output, HashOutput)
        and isinstance(s.fragment, Aggregate)
        and any(isinstance(n, Scan) for n in s.fragment.walk())
    ]
    assert len(partial) == 1 and partial[0].num_tasks > 1
    final = [s for s in physical.stages if any(i.stage == partial[0].id for i in s.inputs)]
    assert len(final) == 1
    assert final[0].inputs[0].mode == "bucket"
    assert any(isinstance(n, Aggregate) for n in final[0].fragment.walk())
    assert final[0].num_tasks == partial[0].output.n


def _joins(physical):
    return [(s, n) for s in physical.stages for n in s.fragment.walk() if isinstance(n, Join)]


def test_q3_hash_join_without_broadcast(tpch_dir: Path) -> None:
    physical = _stages(3, tpch_dir, broadcast_join_threshold_bytes=0)
    joins = _joins(physical)
    assert len(joins) == 2
    for st, join in joins:
        assert isinstance(join.left, StageInput) and isinstance(join.right, StageInput)
        assert [i.mode for i in st.inputs] == ["bucket", "bucket"]
        for i in st.inputs:
            assert isinstance(physical.stage(i.stage).output, HashOutput)


def test_q3_broadcast_join_when_small(tpch_dir: Path) -> None:
    physical = _stages(3, tpch_dir, broadcast_join_threshold_bytes=1 << 40)
    joins = _joins(physical)
    assert len(joins) == 2
    for st, _ in joins:
        assert "all" in [i.mode for i in st.inputs]
        assert "bucket" not in [i.mode for i in st.inputs]


def test_sort_uses_a_range_exchange(tpch_dir: Path) -> None:
    lf = scan_tables(tpch_dir)["orders"].select("o_orderkey", "o_totalprice", "o_orderdate")
    lf = lf.sort(["o_orderdate", "o_totalprice"], descending=[True, False])
    expected = lf.collect()
    got = _run(lf, "local")
    assert_frames_match(got, expected, sort_keys=[("o_orderdate", True), ("o_totalprice", False)])
    report = last_query()
    assert report is not None
    assert any(isinstance(s.output, RangeOutput) for s in report.physical.stages)


def test_ray_tasks_run_in_worker_processes(tpch_dir: Path) -> None:
    _run(QUERIES[1](scan_tables(tpch_dir)), "ray")
    report = last_query()
    assert report is not None
    pids = {s.pid for s in report.task_stats.values()}
    assert os.getpid() not in pids
    assert len(pids) >= 2


def test_missing_parquet_path_raises_before_any_task(tmp_path: Path) -> None:
    before = last_query()
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        _run(pl.scan_parquet(missing).select(pl.len()), "ray")
    schema = shoal.ir.Schema.from_polars({"a": pl.Int64})
    scan = shoal.ir.Scan(shoal.ir.ParquetSource((str(missing),)), schema)
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        shoal.execute(scan, runner="ray")
    assert last_query() is before


def test_unsupported_construct_names_the_polars_node(tpch_dir: Path) -> None:
    lf = scan_tables(tpch_dir)["nation"].map_batches(lambda df: df)
    with pytest.raises(shoal.UnsupportedError, match="MapFunction"):
        _run(lf, "ray")
