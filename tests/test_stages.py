"""Fewer stages (issue 17): an aggregation whose keys include the columns its input is
already hash partitioned on (after a hash join or another aggregation on them) completes
in place, without a second exchange; such a stage is never split into subtasks.

Every answer is checked against native Polars on data cut into several partitions, with
null keys, NaN, duplicates and an empty partition.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.config import Config
from shoal.planner.physical import HashOutput, plan_physical
from shoal.runners.session import last_query
from shoal.runners.skew import split_sides
from shoal_polars.engine import to_ir

#: Hash joins everywhere (no broadcast), 3 partitions after each exchange.
HASH = {"broadcast_join_threshold_bytes": 0, "shuffle_partitions": 3, "small_query_bytes": 0}


def _write(df: pl.DataFrame, root: Path, name: str, parts: int) -> pl.LazyFrame:
    """``df`` as ``parts`` Parquet files plus an empty one under ``root/name``."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    step = -(-df.height // parts)
    for i in range(parts):
        df.slice(i * step, step).write_parquet(d / f"{name}.{i}.parquet")
    df.clear().write_parquet(d / f"{name}.empty.parquet")
    return pl.scan_parquet(d / "*.parquet")


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    root = tmp_path_factory.mktemp("stages")
    n = 600
    facts = pl.DataFrame(
        {
            "k": [None if i % 11 == 0 else i % 37 for i in range(n)],
            "g": [f"g{i % 4}" if i % 7 else None for i in range(n)],
            "v": [
                float("nan") if i % 13 == 0 else (-0.0 if i % 17 == 0 else float(i))
                for i in range(n)
            ],
        }
    )
    dims = pl.DataFrame(
        {
            "dk": [*range(40), 3, 5, None],  # keys 3 and 5 twice: their matches double
            "name": [f"n{i % 6}" for i in range(43)],
        }
    )
    return _write(facts, root, "facts", 4), _write(dims, root, "dims", 2)


def _config(**kw: object) -> Config:
    return Config(target_partition_bytes=2048, **{**HASH, **kw})  # type: ignore[arg-type]


def _exchanges(lf: pl.LazyFrame, config: Config) -> int:
    plan = plan_physical(to_ir(lf), config, 2)
    return sum(isinstance(s.output, HashOutput) for s in plan.stages)


def _check(lf: pl.LazyFrame, runner: str = "local", **kw: object) -> None:
    engine = shoal.DistEngine(runner=runner, raise_on_fail=True, config=_config(**kw))  # type: ignore[arg-type]
    got = lf.collect(engine=engine)
    want = lf.collect(engine="in-memory")
    cols = want.columns
    assert_frame_equal(got.sort(cols, nulls_last=True), want.sort(cols, nulls_last=True))


def _queries(facts: pl.LazyFrame, dims: pl.LazyFrame) -> dict[str, tuple[pl.LazyFrame, int]]:
    """Name -> (query, hash exchanges now; each was one more before)."""
    joined = facts.join(dims, left_on="k", right_on="dk")
    return {
        # join on k, group by k (and more): the join's buckets hold every group.
        "inner-left-key": (joined.group_by("k", "name").agg(pl.col("v").sum(), pl.len()), 2),
        # the right key of an inner join (kept under its own name).
        "inner-right-key": (
            facts.join(dims, left_on="k", right_on="dk", coalesce=False)
            .group_by("dk")
            .agg(pl.col("v").max(), pl.col("g").n_unique()),
            2,
        ),
        # renamed by a projection on the way.
        "renamed": (
            joined.select(pl.col("k").alias("key"), "v", "name")
            .group_by("key")
            .agg(pl.col("v").mean()),
            2,
        ),
        # a left join keeps the left key's partitioning (null keys included).
        "left-join": (
            facts.join(dims, left_on="k", right_on="dk", how="left")
            .group_by("k", "g")
            .agg(pl.col("name").count(), pl.col("v").min()),
            2,
        ),
        # an aggregation on k, then another on (s, k) over its output.
        "agg-then-agg": (
            facts.group_by("k")
            .agg(pl.col("v").sum().alias("s"), pl.col("g").max())
            .group_by("s", "k")
            .agg(pl.col("g").min(), pl.len()),
            1,
        ),
    }


@pytest.mark.parametrize(
    "name", ["inner-left-key", "inner-right-key", "renamed", "left-join", "agg-then-agg"]
)
def test_aggregation_on_the_partition_keys_needs_no_exchange(tables, name):
    facts, dims = tables
    lf, exchanges = _queries(facts, dims)[name]
    assert _exchanges(lf, _config()) == exchanges
    _check(lf)


def test_other_keys_still_exchange(tables):
    """Grouping by a column the input is not partitioned on (g), by an expression of the
    key, or keeping order: the exchange (or gather) stays."""
    facts, dims = tables
    joined = facts.join(dims, left_on="k", right_on="dk")
    for lf, exchanges in (
        (joined.group_by("g").agg(pl.col("v").sum()), 3),
        # hash partitioned on (k, g): groups of k alone span partitions.
        (facts.group_by("k", "g").agg(pl.col("v").sum()).group_by("k").agg(pl.len()), 2),
        (joined.group_by((pl.col("k") + 1).alias("k1")).agg(pl.col("v").sum()), 3),
        (
            facts.join(dims, left_on="k", right_on="dk", how="full").group_by("k").agg(pl.len()),
            3,
        ),
    ):
        assert _exchanges(lf, _config()) == exchanges
        _check(lf)
    ordered = joined.group_by("k", maintain_order=True).agg(pl.col("v").sum())
    _check(ordered)


def test_a_stage_that_aggregates_in_place_is_never_split(tables):
    """A hash-join task over ``max_task_input_bytes`` is split into subtasks where exact;
    with the aggregation completed in place above the join, a group's rows would be cut
    across subtasks: the stage says why it is not split, and the answer is Polars'."""
    facts, dims = tables
    lf, _ = _queries(facts, dims)["inner-left-key"]
    plan = plan_physical(to_ir(lf), _config(), 2)
    joins = [s for s in plan.stages if s.whole_buckets]
    assert joins and all(isinstance(split_sides(s), str) for s in joins)
    _check(lf, max_task_input_bytes=64)
    report = last_query()
    assert report is not None and report.memory is not None
    assert not report.memory.splits


def test_in_place_aggregation_on_ray(ray_runner, tables):
    facts, dims = tables
    for name in ("inner-left-key", "left-join", "agg-then-agg"):
        _check(_queries(facts, dims)[name][0], runner="ray")
