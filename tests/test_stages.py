"""Fewer stages (issue 17): an aggregation whose keys include the columns its input is
already hash partitioned on (after a hash join or another aggregation on them) completes
in place, without a second exchange; such a stage is never split into subtasks.

Every answer is checked against native Polars on data cut into several partitions, with
null keys, NaN, duplicates and an empty partition.
"""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.config import Config
from shoal.ir.nodes import Join
from shoal.planner.physical import HashOutput, plan_physical
from shoal.runners.session import last_query
from shoal.runners.skew import split_sides
from shoal_polars.engine import to_ir

from .test_memory import _write

#: Hash joins everywhere (no broadcast), 3 partitions after each exchange.
HASH = {"broadcast_join_threshold_bytes": 0, "shuffle_partitions": 3, "small_query_bytes": 0}


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


# -- selectivity from the Parquet footers (broadcast decisions) ---------------------------


@pytest.fixture(scope="module")
def dated(tmp_path_factory: pytest.TempPathFactory) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """Facts over 1,000 days (a tenth of the dates null, keys repeating, NaN values) in 4
    files of several row groups plus an empty one; dims of 3,000 keys (some null)."""
    import datetime

    root = tmp_path_factory.mktemp("dated")
    n = 20_000
    start = datetime.date(2020, 1, 1)
    facts = pl.DataFrame(
        {
            "d": [
                None if i % 10 == 0 else start + datetime.timedelta(days=i % 1000) for i in range(n)
            ],
            "k": [i % 3001 for i in range(n)],
            "q": [i % 50 for i in range(n)],
            "v": [float("nan") if i % 19 == 0 else float(i) for i in range(n)],
        }
    )
    d = root / "facts"
    d.mkdir()
    for i in range(4):
        facts.slice(i * n // 4, n // 4).write_parquet(d / f"f{i}.parquet", row_group_size=1000)
    facts.clear().write_parquet(d / "empty.parquet")
    dims = pl.DataFrame(
        {
            "k": [None if i % 97 == 0 else i for i in range(3000)],
            "s": [f"s{i % 7}" for i in range(3000)],
        }
    )
    dims.write_parquet(root / "dims.parquet")
    return pl.scan_parquet(d / "*.parquet"), pl.scan_parquet(root / "dims.parquet")


def test_footer_statistics_estimate_range_terms(dated):
    """``d >= x AND d < y`` over uniform dates keeps the interval's share of the rows
    (nulls never pass); an ``==`` on integers one of the values; a term the statistics say
    nothing about (column against column) leaves the default selectivity to the planner."""
    import datetime

    from shoal.ir.nodes import Scan
    from shoal.planner.partitioning import split_scan
    from shoal.planner.planner import FILTER_SELECTIVITY, scan_selectivity

    facts, _ = dated
    lo, hi = datetime.date(2020, 3, 1), datetime.date(2020, 4, 10)
    cases = [
        facts.filter(pl.col("d") >= lo, pl.col("d") < hi),
        facts.filter(pl.col("d") > lo, pl.col("q") == 7),
        facts.filter(pl.col("d") < hi, pl.col("q") <= 24),
    ]
    for lf in cases:
        scan = next(n for n in to_ir(lf).walk() if isinstance(n, Scan))
        split = split_scan(scan, 1 << 20)
        actual = lf.select(pl.len()).collect().item() / split.est_rows
        assert split.selectivity is not None and not split.unestimated
        assert abs(scan_selectivity(split) - actual) <= 0.25 * actual + 0.002, (actual, split)
    other = facts.filter(pl.col("q") < pl.col("k"))
    scan = next(n for n in to_ir(other).walk() if isinstance(n, Scan))
    assert scan_selectivity(split_scan(scan, 1 << 20)) == FILTER_SELECTIVITY


def test_a_narrow_range_makes_a_side_small_enough_to_broadcast(dated):
    """Filtered to 10 of 1,000 days, the facts side is estimated at about 1 % of its
    rows (not the default fifth), so it is broadcast instead of shuffling both sides; the
    answer is Polars'."""
    import datetime

    facts, dims = dated
    day = datetime.date(2021, 5, 1)
    narrow = facts.filter(pl.col("d") >= day, pl.col("d") < day + datetime.timedelta(days=10))
    lf = dims.join(narrow, on="k").group_by("s").agg(pl.col("v").sum(), pl.len())
    config = Config(
        target_partition_bytes=64 * 1024,
        broadcast_join_threshold_bytes=40_000,
        shuffle_partitions=3,
        small_query_bytes=0,
    )
    plan = plan_physical(to_ir(lf), config, 2)
    modes = [i.mode for s in plan.stages for i in s.inputs]
    assert "all" in modes and sum(isinstance(s.output, HashOutput) for s in plan.stages) == 1
    got = lf.collect(engine=shoal.DistEngine(runner="local", raise_on_fail=True, config=config))
    want = lf.collect(engine="in-memory")
    assert_frame_equal(got.sort("s"), want.sort("s"))


# -- a semi join of a small left side with a large right side -----------------------------


@pytest.fixture(scope="module")
def semi(tmp_path_factory: pytest.TempPathFactory) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """A small left side (duplicate rows, null keys, NaN) and a large right side (keys
    repeated across its files, null keys, one file empty)."""
    root = tmp_path_factory.mktemp("semi")
    small = pl.DataFrame(
        {
            "k": [1, 2, 2, None, 5, 8, 13, 99, 2, None, 21, 1000],
            "tag": ["a", "b", "b", "c", "d", "e", "f", "g", "b", "h", None, "i"],
            "x": [
                0.5,
                float("nan"),
                float("nan"),
                -0.0,
                1.0,
                2.0,
                3.0,
                4.0,
                float("nan"),
                5.0,
                6.0,
                7.0,
            ],
        }
    )
    n = 30_000
    big = pl.DataFrame(
        {"rk": [None if i % 29 == 0 else i % 400 for i in range(n)], "w": [i % 3 for i in range(n)]}
    )
    return _write(small, root, "small", 2), _write(big, root, "big", 5)


def _semi_config(**kw: object) -> Config:
    return Config(
        target_partition_bytes=32 * 1024,
        broadcast_join_threshold_bytes=64 * 1024,
        small_query_bytes=0,
        **kw,  # type: ignore[arg-type]
    )


def test_a_small_semi_join_side_goes_to_the_large_sides_partitions(semi):
    """The small left side is broadcast to the large right side's partitions (the right
    side is neither broadcast nor shuffled); the answer is Polars' with null keys (equal
    or not), duplicate left rows and right keys matched in several partitions."""
    small, big = semi
    for nulls_equal in (False, True):
        # (w > 5: the footers say no row passes; that side is broadcast, as before)
        empty = big.filter(pl.col("w") > 5)
        for right in (big, big.filter(pl.col("w") == 1), empty):
            lf = small.join(right, left_on="k", right_on="rk", how="semi", nulls_equal=nulls_equal)
            config = _semi_config()
            plan = plan_physical(to_ir(lf), config, 2)
            joins = [s for s in plan.stages if any(isinstance(n, Join) for n in s.fragment.walk())]
            assert len(joins) == 1
            if right is not empty:  # in the large side's scan tasks, the small side broadcast
                assert joins[0].num_tasks > 3 and joins[0].scan_partitions is not None
                assert [i.mode for i in joins[0].inputs] == ["all"]
            assert not any(isinstance(s.output, HashOutput) for s in plan.stages)
            engine = shoal.DistEngine(runner="local", raise_on_fail=True, config=config)
            got = lf.collect(engine=engine)
            want = lf.collect(engine="in-memory")
            assert_frame_equal(got.sort("k", "tag", "x"), want.sort("k", "tag", "x"))
            assert got.equals(want)  # and in the left side's order


def test_semi_join_by_the_large_side_then_aggregate_on_ray(ray_runner, semi):
    small, big = semi
    lf = (
        small.join(big, left_on="k", right_on="rk", how="semi")
        .group_by("tag")
        .agg(pl.len(), pl.col("x").sum())
    )
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=_semi_config())
    got = lf.collect(engine=engine)
    want = lf.collect(engine="in-memory")
    assert_frame_equal(got.sort("tag"), want.sort("tag"))
