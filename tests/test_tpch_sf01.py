"""The 22 TPC-H queries at scale 0.1 on both runners against native Polars (issue 3: "equal
native Polars at scale 0.1 in tests").

The data (generated once per session): four files per table plus an empty one. Scans are
cut into partitions of about 4 MiB, so that lineitem and orders have many partitions and
every exchange (hash aggregation, hash and broadcast joins, range-partitioned sorts, hash
windows) runs with several tasks.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import shoal
from shoal.config import RunnerKind
from shoal.runners.session import last_query
from shoal.tpch.compare import assert_frames_match
from shoal.tpch.queries import QUERIES, SORT_KEYS, scan_tables

pytestmark = pytest.mark.usefixtures("ray_runner")

#: Scan partition size (bytes): lineitem at scale 0.1 (about 80 MiB in memory) gets ~20.
PARTITION_BYTES = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def expected(tpch_sf01_dir: Path) -> dict[int, pl.DataFrame]:
    """Native Polars' answers, computed once for both runners."""
    tables = scan_tables(tpch_sf01_dir)
    return {q: QUERIES[q](tables).collect() for q in sorted(QUERIES)}


@pytest.mark.parametrize("q", sorted(QUERIES))
@pytest.mark.parametrize("runner", ["local", "ray"])
def test_query_at_scale_0_1(
    tpch_sf01_dir: Path, expected: dict[int, pl.DataFrame], runner: RunnerKind, q: int
) -> None:
    engine = shoal.DistEngine(
        runner=runner,
        raise_on_fail=True,
        # the distributed path (small_query_bytes=0): this test checks stages and exchanges
        config=shoal.Config(target_partition_bytes=PARTITION_BYTES, small_query_bytes=0),
    )
    got = QUERIES[q](scan_tables(tpch_sf01_dir)).collect(engine=engine)
    assert_frames_match(got, expected[q], sort_keys=SORT_KEYS.get(q))
    report = last_query()
    assert report is not None and report.runner == runner
    assert max(st.num_tasks for st in report.physical.stages) > 1
