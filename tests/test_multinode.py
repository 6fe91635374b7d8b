"""A three-node Ray test cluster (``ray.cluster_utils.Cluster`` on this machine): queries
spread over the nodes, and survive losing a worker node mid-query."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import shoal
from shoal.config import Config
from shoal.runners.ray_runner import CLUSTER_VIEW_TTL_S
from shoal.runners.session import last_query
from shoal.tpch.compare import assert_frames_match
from shoal.tpch.queries import QUERIES, SORT_KEYS, scan_tables

from .conftest import ray_test_cluster
from .irplans import agg_sort_plan
from .test_object_storage import BUCKET as S3_BUCKET
from .test_object_storage import _queries as _s3_queries
from .test_object_storage import s3  # noqa: F401, F811  (the moto S3 server fixture)


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    with ray_test_cluster(0, [1, 1], "mn") as (c, workers):
        yield c, workers


def test_tasks_spread_over_the_worker_nodes(cluster: object, tpch_dir: Path) -> None:
    tables = scan_tables(tpch_dir)
    cfg = Config(target_partition_bytes=96 * 1024)
    got = QUERIES[1](tables).collect(
        engine=shoal.DistEngine(runner="ray", raise_on_fail=True, config=cfg)
    )
    assert_frames_match(got, QUERIES[1](tables).collect(), sort_keys=SORT_KEYS[1])
    report = last_query()
    assert report is not None
    assert len({s.node_id for s in report.task_stats.values()}) == 2


def test_losing_a_worker_node_mid_query_still_gives_the_right_answer(cluster: object) -> None:
    import ray

    c, workers = cluster  # type: ignore[misc]
    i = pl.int_range(1_500_000, eager=True)
    df = pl.DataFrame({"k": i * 7919 % 40_000, "v": (i * 31 % 1000).cast(pl.Float64)})
    plan, expected = agg_sort_plan(df)
    cfg = Config(default_partitions=40, shuffle_partitions=16, task_max_retries=5)
    removed: list[float] = []

    def remove() -> None:
        time.sleep(1.0)
        c.remove_node(workers[1])  # its running tasks die and its objects are lost
        removed.append(time.monotonic())

    t = threading.Thread(target=remove, daemon=True)
    t.start()
    got = shoal.execute(plan, runner="ray", config=cfg)
    finished = time.monotonic()
    t.join()
    assert removed and removed[0] < finished, "the node went only after the query ended"
    assert pl.from_arrow(got).equals(expected)
    alive = [n for n in ray.nodes() if n["Alive"]]
    assert len(alive) == 2  # the head and the remaining worker did all the work


def test_plans_are_sized_by_the_cluster_as_it_is_now(cluster: object) -> None:
    """The planner sizes scans and shuffles by the cluster's CPUs, read again for a query
    once the last read is CLUSTER_VIEW_TTL_S old (not the driver's os.cpu_count()), so a
    node that joins gives the next query after that more partitions."""
    import ray

    c, _ = cluster  # type: ignore[misc]
    i = pl.int_range(200_000, eager=True)
    df = pl.DataFrame({"k": i * 7919 % 5_000, "v": (i * 31 % 1000).cast(pl.Float64)})
    plan, expected = agg_sort_plan(df)
    shoal.execute(plan, runner="ray")  # connects to the cluster when run alone
    # A test before this one may have removed a node: the runner's view of the cluster
    # (read for the query above, or up to CLUSTER_VIEW_TTL_S before it) may predate that.
    before = int(sum(n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]))
    time.sleep(CLUSTER_VIEW_TTL_S)
    got = shoal.execute(plan, runner="ray")
    assert pl.from_arrow(got).equals(expected)
    report = last_query()
    assert report is not None
    assert (report.physical.cpus, report.physical.cpus_source) == (before, "cluster")
    c.add_node(num_cpus=6)
    c.wait_for_nodes()
    time.sleep(CLUSTER_VIEW_TTL_S)  # the runner reads the cluster's size at most this often
    got = shoal.execute(plan, runner="ray")
    assert pl.from_arrow(got).equals(expected)
    report = last_query()
    assert report is not None
    assert report.physical.cpus == before + 6
    assert f"Sized for {before + 6} CPUs (cluster)" in shoal.explain(plan, runner="ray")


def test_udf_larger_than_any_node_fails_before_running(cluster: object) -> None:
    """Issue 19: an actor must fit on one node. The pool counted the cluster's totals, so a
    UDF asking for more CPUs than any node has (but fewer than all nodes together) waited
    forever for its actor."""
    import ray

    eng = shoal.DistEngine(runner="ray", raise_on_fail=True)
    assert pl.LazyFrame({"a": [1]}).select(pl.len()).collect(engine=eng).item() == 1  # connect
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    largest = max(r.get("CPU", 0) for r in nodes)
    need = largest + 1
    if sum(r.get("CPU", 0) for r in nodes) < need:  # a test before this one removed a node
        c, _ = cluster  # type: ignore[misc]
        c.add_node(num_cpus=int(largest))
        c.wait_for_nodes()
        nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]
    assert sum(r.get("CPU", 0) for r in nodes) >= need  # the totals would have let it through

    @shoal.udf(return_dtype=pl.Int64, num_cpus=need, concurrency=1)
    class Wide:
        def __call__(self, a: pl.Series) -> pl.Series:
            return a + 1

    lf = pl.LazyFrame({"a": [1, 2, 3]}).shoal.with_udf(Wide, inputs="a", output="b")
    with pytest.raises(shoal.ShoalError, match=r"Wide.*the largest has"):
        lf.collect(engine=eng)


def test_data_only_in_the_bucket_is_read_and_written_by_the_worker_nodes(
    cluster: object,
    s3: dict[str, Any],  # noqa: F811  (the fixture imported above)
) -> None:
    """Issue 16: on a cluster the data lives in object storage. The head node has no CPUs,
    so every scan and sink task runs on a worker node and reads the bucket itself (with the
    credentials that travel in the plan); nothing is on a local disk."""
    so = s3["options"]
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=Config(default_partitions=3))
    for name, lf in _s3_queries(so).items():
        got = lf.collect(engine=engine)
        want = lf.collect()
        assert_frames_match(got, want, sort_keys=[(c, False) for c in want.columns])
        report = last_query()
        assert report is not None
        assert report.task_stats, name
    lf = pl.scan_parquet(f"s3://{S3_BUCKET}/flat/*.parquet", storage_options=so).filter(
        pl.col("a") > 105
    )
    url = f"s3://{S3_BUCKET}/multinode-sink/out.parquet"
    lf.sink_parquet(url, storage_options=so, engine=engine)
    back = pl.read_parquet(url, storage_options=so)
    assert_frames_match(back, lf.collect(), sort_keys=[("a", False)])
