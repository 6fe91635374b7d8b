"""User functions on the Ray runner's actor pools, on a Ray instance of its own with four
logical GPUs (a CPU-only machine): __init__ once per actor, CUDA_VISIBLE_DEVICES per actor
(one device each, then disjoint pairs), the answer equal to native Polars, and no named
shoal actor left after a query, a UDF error or Ctrl-C."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import ray

import shoal
from shoal.config import Config
from shoal.runners.actor_pool import pool_udf
from shoal.runners.session import last_query

from .test_udf import (
    Counted,
    Fails,
    Offset,
    SeeDevices,
    Slow,
    frame,
    interrupt_when,
    polars_native,
    score,
)


@pytest.fixture(scope="module", autouse=True)
def ray_with_gpus() -> Iterator[None]:
    """Ray with 2 CPUs and 4 logical GPUs for this module; settings restored after."""
    shoal.shutdown()
    if ray.is_initialized():  # pragma: no cover - someone else's instance
        ray.shutdown()
    shoal.set_config(num_cpus=2, num_gpus=4, ray_temp_dir=f"/tmp/shoal-ray-udf-{os.getpid()}")
    try:
        yield
    finally:
        shoal.shutdown()
        shoal.set_config(num_cpus=None, num_gpus=None, ray_temp_dir=None)


def shoal_actors() -> list[str]:
    return [
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["name"].startswith("shoal-")
    ]


def _ray(default_partitions: int = 8) -> shoal.DistEngine:
    return shoal.DistEngine(
        runner="ray", raise_on_fail=True, config=Config(default_partitions=default_partitions)
    )


def test_ray_stateful_init_runs_once_per_actor(tmp_path: Path) -> None:
    df = frame(4000)
    lf = df.lazy().shoal.with_udf(Counted.with_init(str(tmp_path)), inputs="a", output="who")
    got = lf.collect(engine=_ray(40))
    report = last_query()
    assert report is not None
    pool_stage = next(s for s in report.physical.stages if pool_udf(s))
    assert pool_stage.num_tasks == 40
    assert len(list(tmp_path.glob("init-*"))) == 2  # concurrency=2: one __init__ per actor
    actors = {v.extra["actor"] for (sid, _), v in report.task_stats.items() if sid == pool_stage.id}
    assert len(actors) == 2 and all(a.startswith("shoal-udf-Counted-") for a in actors)
    assert got["who"].n_unique() == 2
    assert got.drop("who").equals(df)
    assert shoal_actors() == []


def test_ray_pool_grows_from_min_to_max_while_batches_wait(tmp_path: Path) -> None:
    growing = Counted.options(concurrency=(1, 2)).with_init(str(tmp_path), delay=0.25)
    lf = frame(400).lazy().shoal.with_udf(growing, inputs="a", output="who")
    got = lf.collect(engine=_ray(30))
    assert len(list(tmp_path.glob("init-*"))) == 2  # started with 1, grew to 2
    assert got["who"].n_unique() == 2  # and the second actor took batches
    assert shoal_actors() == []


def test_ray_actors_see_their_own_gpus() -> None:
    lf = frame(2000).lazy().shoal.with_udf(SeeDevices, inputs="a", output="cvd")
    assert set(lf.collect(engine=_ray(16))["cvd"]) == {"0", "1", "2", "3"}
    assert shoal_actors() == []
    two_each = SeeDevices.options(num_gpus=2, concurrency=2)
    lf2 = frame(2000).lazy().shoal.with_udf(two_each, inputs="a", output="cvd")
    pairs = set(lf2.collect(engine=_ray(16))["cvd"])
    assert len(pairs) == 2
    a, b = ({int(x) for x in p.split(",")} for p in pairs)
    assert len(a) == len(b) == 2 and a.isdisjoint(b) and a | b == {0, 1, 2, 3}
    assert shoal_actors() == []


def test_ray_answer_equals_native_polars_row_for_row() -> None:
    df = frame()
    lf = (
        df.lazy()
        .shoal.with_udf(score, inputs=["a", "s"], output="y")
        .shoal.with_udf(Offset.with_init(k=7), inputs="a", output="a7")
        .filter(pl.col("y") > 3.0)
        .group_by("s")
        .agg(pl.col("a7").sum(), pl.len())
        .sort("s")
    )
    native = lf.collect()
    assert lf.collect(engine=_ray(12)).equals(native)
    expected = (
        polars_native(df, score.fn, ["a", "s"], "y", pl.Float64())
        .with_columns(a7=pl.col("a") + 7)
        .filter(pl.col("y") > 3.0)
        .group_by("s")
        .agg(pl.col("a7").sum(), pl.len())
        .sort("s")
    )
    assert native.equals(expected)
    assert shoal_actors() == []


def test_ray_udf_error_names_the_udf_and_leaves_no_actor() -> None:
    lf = frame(2000).lazy().shoal.with_udf(Fails.with_init(bad=77), inputs="a", output="b")
    with pytest.raises(shoal.TaskError) as info:
        lf.collect(engine=_ray(20))
    text = str(info.value)
    assert "user function 'Fails' raised ValueError: cannot score 77" in text
    assert 'raise ValueError(f"cannot score' in text and "test_udf.py" in text
    assert shoal_actors() == []


def test_ray_ctrl_c_leaves_no_actor(tmp_path: Path) -> None:
    marker = tmp_path / "working"
    lf = frame(4000).lazy().shoal.with_udf(Slow.with_init(str(marker)), inputs="a", output="b")
    t = interrupt_when(marker)
    with pytest.raises(KeyboardInterrupt):
        lf.collect(engine=_ray(40))
    t.join()
    # Interrupted, not run to its end: fewer than the 40 batches began.
    assert len(marker.read_text().splitlines()) < 40
    assert shoal_actors() == []


def test_warm_ray_pool_serves_the_next_query_then_shutdown_kills_it(tmp_path: Path) -> None:
    """udf_keep_warm on Ray: the second query runs on the first one's actor (no new
    __init__), same answer, although the parked actor holds one of the two CPUs (the
    other is left to the scan tasks); closing the parked pools leaves no named actor."""
    warm = Config(default_partitions=6, udf_keep_warm=True)
    engine = shoal.DistEngine(raise_on_fail=True, config=warm)
    counted = Counted.options(concurrency=1).with_init(str(tmp_path))
    df = frame(600)
    lf = df.lazy().shoal.with_udf(counted, inputs="a", output="who")
    first = lf.collect(engine=engine)
    inits = sorted(tmp_path.glob("init-*"))
    assert shoal_actors(), "the pool is parked, its actors alive"
    second = lf.collect(engine=engine)
    assert sorted(tmp_path.glob("init-*")) == inits
    assert set(second["who"]) <= {p.name.removeprefix("init-") for p in inits}
    assert first.drop("who").equals(df) and second.drop("who").equals(df)
    from shoal.runners.actor_pool import close_parked

    close_parked()
    assert shoal_actors() == []


def test_ray_actor_takes_two_batches_at_a_time(tmp_path: Path) -> None:
    """One actor (concurrency=1) gets two batches in flight; the answer is unchanged."""
    one = Counted.options(concurrency=1).with_init(str(tmp_path), delay=0.05)
    df = frame(400)
    lf = df.lazy().shoal.with_udf(one, inputs="a", output="who")
    got = lf.collect(
        engine=shoal.DistEngine(raise_on_fail=True, config=Config(default_partitions=8))
    )
    assert got.drop("who").equals(df) and got["who"].n_unique() == 1
    from shoal.config import get_config, query_digest
    from shoal.runners.actor_pool import CALLS_IN_FLIGHT, RayActorPool

    cfg = get_config()
    pool = RayActorPool(one, lambda i: f"shoal-udf-two-{os.getpid()}-{i}", cfg, query_digest(cfg))
    try:
        assert pool.capacity(backlog=1) == CALLS_IN_FLIGHT == 2
    finally:
        pool.close()
