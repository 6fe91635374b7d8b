"""Chaos (issue 19, behind ``slow``): TPC-H queries and a UDF query on a three-node Ray test
cluster while a thread SIGKILLs random task workers and UDF actors at random moments and
removes a worker node (then adds a fresh one). Every answer is checked against native
Polars; the counts are printed (``pytest -m slow -s tests/test_chaos.py``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

import shoal
from shoal.config import Config
from shoal.tpch.compare import assert_frames_match
from shoal.tpch.queries import QUERIES, SORT_KEYS, scan_tables

from .conftest import own_ray_processes, ray_test_cluster

pytestmark = pytest.mark.slow

#: Process titles of the processes the chaos thread may kill: shoal's stage tasks and the
#: actors of UDF pools.
VICTIMS = ("ray::shoal-stage", "ray::_UdfActor")


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    with ray_test_cluster(1, [1, 1], "chaos") as (c, _workers):
        yield c


def _victims() -> list[int]:
    """Task workers and UDF actors of this module's own Ray cluster (never another
    program's Ray instance on the machine)."""
    return [pid for pid, _ in own_ray_processes(VICTIMS)]


class _Chaos(threading.Thread):
    """Every 0.1-0.8 s (seeded), SIGKILLs one random task worker or UDF actor; once, after
    ``node_after`` kills, removes a worker node and adds a fresh one."""

    def __init__(self, cluster: object, seed: int, node_after: int) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.node_after = node_after
        self.kills = 0
        self.nodes_removed = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.1, 0.8)):
            pids = _victims()
            if pids:
                try:
                    os.kill(self.rng.choice(pids), signal.SIGKILL)
                    self.kills += 1
                except ProcessLookupError:
                    pass
            if self.kills >= self.node_after and not self.nodes_removed:
                workers = sorted(self.cluster.worker_nodes, key=id)  # type: ignore[attr-defined]
                if workers:
                    self.cluster.remove_node(self.rng.choice(workers))  # type: ignore[attr-defined]
                    self.nodes_removed += 1
                    self.cluster.add_node(num_cpus=1)  # type: ignore[attr-defined]


@shoal.udf(return_dtype=pl.Float64, concurrency=2, name="chaos_scale")
class _Scale:
    """A stateful UDF (an actor pool) that takes a little while per batch."""

    def __call__(self, v: pl.Series) -> pl.Series:
        time.sleep(0.02)
        return v * 1.5


def test_answers_stay_right_while_workers_actors_and_a_node_die(
    cluster: object, tpch_dir: Path
) -> None:
    tables = scan_tables(tpch_dir)
    engine = shoal.DistEngine(
        runner="ray",
        raise_on_fail=True,
        config=Config(target_partition_bytes=64 * 1024, task_max_retries=20, udf_batch_size=500),
    )
    udf_frame = pl.DataFrame({"k": range(20_000), "v": [float(i) for i in range(20_000)]})
    udf_query = udf_frame.lazy().shoal.with_udf(_Scale, inputs=["v"], output="w")
    expected_udf = udf_frame.with_columns(w=pl.col("v") * 1.5)
    chaos = _Chaos(cluster, seed=19, node_after=12)
    chaos.start()
    queries = right = 0
    try:
        for _round in range(2):
            for q in sorted(QUERIES):
                got = QUERIES[q](tables).collect(engine=engine)
                assert_frames_match(got, QUERIES[q](tables).collect(), sort_keys=SORT_KEYS[q])
                queries += 1
                right += 1
            got = udf_query.collect(engine=engine)
            assert got.sort("k").equals(expected_udf)  # no batch lost or doubled
            queries += 1
            right += 1
    finally:
        chaos.stop.set()
        chaos.join()
        print(
            f"\nchaos: {queries} queries, {right} right, {chaos.kills} processes killed, "
            f"{chaos.nodes_removed} node(s) removed"
        )
    assert chaos.kills > 0
    assert chaos.nodes_removed == 1
