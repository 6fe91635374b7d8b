"""Soak (slow): many queries in a row on one Ray instance; the driver does not grow and
nothing leaks. Run with ``pytest -m slow tests/test_soak.py``."""

from __future__ import annotations

import gc

import polars as pl
import pytest

import shoal
from shoal.config import Config

from .irplans import agg_sort_plan, frame

pytestmark = [pytest.mark.usefixtures("ray_runner"), pytest.mark.slow]

#: Driver resident memory may grow by at most this much over the run (after warm-up).
RSS_GROWTH_BOUND_BYTES = 64 * 1024 * 1024


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def test_two_hundred_queries_without_growth_or_leaks() -> None:
    import ray

    plan, expected = agg_sort_plan(frame(20_000))
    cfg = Config(default_partitions=8)
    for _ in range(10):  # warm-up: Ray workers, caches
        shoal.execute(plan, runner="ray", config=cfg)
    gc.collect()
    start = _rss_bytes()
    for i in range(200):
        got = shoal.execute(plan, runner="ray", config=cfg)
        if i % 50 == 0:
            assert pl.from_arrow(got).equals(expected)
    gc.collect()
    growth = _rss_bytes() - start
    assert growth < RSS_GROWTH_BOUND_BYTES, f"driver RSS grew by {growth / 2**20:.1f} MiB"
    assert ray.util.list_named_actors(all_namespaces=True) == []
    store = ray.available_resources().get("object_store_memory")
    assert store is not None and store > 0
