"""shoal as Polars' engine affinity, and queries that reach shoal from inside its own tasks.

``pl.Config.set_engine_affinity(shoal.DistEngine(...))`` makes every plain ``collect()`` run
on shoal. A task's own Polars queries must not come back to shoal (on a full pool that is a
deadlock): shoal's collects name their engine, and ``DistEngine`` runs any query reaching it
from inside a task on Polars' own engine. Each test here hung before that (the
``timeout`` marks turn a hang into a failure instead of a stuck run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.execution.scope import in_task
from shoal.runners.session import last_query
from shoal_polars import ShoalFallbackWarning

CONFIG = shoal.Config(default_partitions=3, shuffle_partitions=3, target_partition_bytes=512)


def _frames() -> tuple[pl.LazyFrame, pl.LazyFrame]:
    left = pl.LazyFrame(
        {
            "k": [1, 2, 2, None, 3, 1, 4, 2],
            "v": [1.5, float("nan"), 2.0, None, -0.0, 2.0, 7.0, -3.0],
            "s": ["a", "b", None, "d", "e", "a", "g", "b"],
        }
    )
    right = pl.LazyFrame({"k": [1, 2, 3, 5], "w": ["x", "y", "z", "q"]})
    return left, right


def _queries() -> dict[str, pl.LazyFrame]:
    left, right = _frames()
    return {
        "group_by": left.group_by("k").agg(pl.col("v").sum(), pl.len()).sort("k"),
        "join-sort": left.join(right, on="k", how="left").sort("k", "v", nulls_last=True),
        "filter-with_row_index": left.filter(pl.col("k") > 1).with_row_index(),
        "unique": left.unique("s", keep="first", maintain_order=True),
    }


@pytest.fixture
def affinity() -> Iterator[Callable[[shoal.DistEngine], None]]:
    """Set a ``DistEngine`` as Polars' engine affinity for the test; cleared after."""

    def set_it(engine: shoal.DistEngine) -> None:
        pl.Config.set_engine_affinity(engine)

    yield set_it
    pl.Config.set_engine_affinity(None)


def _check_affinity_runs_on_shoal(engine: shoal.DistEngine, set_affinity: Any) -> None:
    expected = {name: lf.collect(engine="streaming") for name, lf in _queries().items()}
    set_affinity(engine)
    for name, lf in _queries().items():
        before = last_query()
        got = lf.collect()
        assert last_query() is not before, f"{name}: did not run on shoal"
        assert_frame_equal(got, expected[name])


@pytest.mark.timeout(120)
def test_affinity_local_runner(affinity: Any) -> None:
    _check_affinity_runs_on_shoal(
        shoal.DistEngine(runner="local", raise_on_fail=True, config=CONFIG), affinity
    )


@pytest.mark.timeout(120)
def test_affinity_with_fallback(affinity: Any) -> None:
    """A query shoal cannot run falls back to Polars' default engine, also under the
    affinity (the fallback must not resolve the affinity to shoal again)."""
    lf = pl.LazyFrame({"a": [3, 1, 2]}).map_batches(lambda df: df * 2).sort("a")
    expected = lf.collect(engine="streaming")
    affinity(shoal.DistEngine(runner="local", raise_on_fail=False, config=CONFIG))
    with pytest.warns(ShoalFallbackWarning):
        got = lf.collect()
    assert_frame_equal(got, expected)


@pytest.mark.timeout(120)
def test_patched_collect_routing_everything_to_shoal() -> None:
    """A process-wide patch of ``LazyFrame.collect`` that sends every collect to shoal,
    whatever engine it names (the kernel's own included): the kernel's queries reach
    ``DistEngine`` from inside tasks and run on Polars there."""
    engine = shoal.DistEngine(runner="local", raise_on_fail=True, config=CONFIG)
    expected = {name: lf.collect(engine="streaming") for name, lf in _queries().items()}
    original = pl.LazyFrame.collect
    reached_from_tasks = []

    def routed(self: pl.LazyFrame, *args: Any, **kwargs: Any) -> Any:
        reached_from_tasks.append(in_task())
        kwargs["engine"] = engine
        return original(self, *args, **kwargs)

    pl.LazyFrame.collect = routed  # type: ignore[method-assign]
    try:
        got = {name: lf.collect() for name, lf in _queries().items()}
    finally:
        pl.LazyFrame.collect = original  # type: ignore[method-assign]
    for name, df in got.items():
        assert_frame_equal(df, expected[name])
    assert any(reached_from_tasks), "the kernel's collects did not go through the patch"


@pytest.mark.timeout(120)
def test_udf_collect_inside_a_task_stays_on_polars(affinity: Any) -> None:
    """A UDF whose body collects a lazy query (under the affinity) runs it on Polars from
    within the task instead of starting a nested shoal query."""

    @shoal.udf(return_dtype=pl.Int64)
    def plus_count(a: pl.Series) -> pl.Series:
        n = pl.LazyFrame({"x": [1, 2, 3]}).select(pl.len()).collect().item()
        return a + n

    lf = pl.LazyFrame({"a": [1, 2, 3, 4, 5]})
    affinity(shoal.DistEngine(runner="local", raise_on_fail=True, config=CONFIG))
    got = lf.shoal.with_udf(plus_count, "a", "b").collect()
    assert got["b"].to_list() == [4, 5, 6, 7, 8]


@pytest.mark.timeout(120)
def test_udf_sink_inside_a_task_stays_on_polars(affinity: Any, tmp_path: Any) -> None:
    """``sink_parquet`` from a UDF's body (under the affinity) writes with Polars."""
    target = tmp_path / "side.parquet"

    @shoal.udf(return_dtype=pl.Int64)
    def writes_a_file(a: pl.Series) -> pl.Series:
        a.to_frame().lazy().sink_parquet(target)
        return a * 2

    lf = pl.LazyFrame({"a": [1, 2, 3]})
    affinity(shoal.DistEngine(runner="local", raise_on_fail=True, config=CONFIG))
    got = lf.shoal.with_udf(writes_a_file, "a", "b").collect()
    assert got["b"].to_list() == [2, 4, 6]
    assert target.exists()


@pytest.mark.timeout(300)
def test_affinity_ray_runner(affinity: Any, ray_runner: None) -> None:
    _check_affinity_runs_on_shoal(
        shoal.DistEngine(runner="ray", raise_on_fail=True, config=CONFIG), affinity
    )


#: The Ray runner's small-query path, its one task in the driver process (the default).
DRIVER = shoal.Config(small_query_where="driver")


@pytest.mark.timeout(300)
def test_ray_driver_task_collects_stay_on_polars(ray_runner: None) -> None:
    """A small query on Ray runs its one task in the driver, inside the kernel's task
    scope: under a patch that sends every collect to shoal (the kernel's own included),
    the task's queries run on Polars, not as nested shoal queries."""
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=DRIVER)
    expected = {name: lf.collect(engine="streaming") for name, lf in _queries().items()}
    original = pl.LazyFrame.collect
    reached_from_tasks = []
    started = []

    import shoal.runners.session as session

    real_start = session._start

    def counted_start(*args: Any, **kwargs: Any) -> Any:
        started.append(1)
        return real_start(*args, **kwargs)

    def routed(self: pl.LazyFrame, *args: Any, **kwargs: Any) -> Any:
        reached_from_tasks.append(in_task())
        kwargs["engine"] = engine
        return original(self, *args, **kwargs)

    pl.LazyFrame.collect = routed  # type: ignore[method-assign]
    session._start = counted_start  # type: ignore[assignment]
    try:
        got = {name: lf.collect() for name, lf in _queries().items()}
    finally:
        pl.LazyFrame.collect = original  # type: ignore[method-assign]
        session._start = real_start  # type: ignore[assignment]
    for name, df in got.items():
        assert_frame_equal(df, expected[name])
    report = last_query()
    assert report is not None and report.physical.small_query_in_driver
    assert any(reached_from_tasks), "the kernel's collects did not go through the patch"
    assert len(started) == len(got), "a collect inside a task started a shoal query"


@pytest.mark.timeout(300)
def test_ray_driver_udf_collect_stays_on_polars(affinity: Any, ray_runner: None) -> None:
    """A stateless UDF of a small Ray query runs in the driver; a query its body collects
    under the affinity runs on Polars (not on shoal, not through the affinity again)."""

    @shoal.udf(return_dtype=pl.Int64)
    def plus_count(a: pl.Series) -> pl.Series:
        assert in_task()
        n = pl.LazyFrame({"x": [1, 2, 3]}).select(pl.len()).collect().item()
        return a + n

    lf = pl.LazyFrame({"a": [1, 2, 3, 4, 5]})
    affinity(shoal.DistEngine(runner="ray", raise_on_fail=True, config=DRIVER))
    got = lf.shoal.with_udf(plus_count, "a", "b").collect()
    assert got["b"].to_list() == [4, 5, 6, 7, 8]
    report = last_query()
    assert report is not None and report.physical.small_query_in_driver
