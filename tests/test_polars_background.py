"""lf.collect(engine=DistEngine, background=True): shoal runs the query in the background;
the handle has Polars' InProcessQuery interface and cancel() stops every task of it."""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

import polars as pl
import pytest
import ray
from polars.lazyframe.in_process import InProcessQuery

import shoal
from shoal.config import Config
from shoal.errors import QueryCancelledError, UnsupportedError
from shoal_polars.engine import DistQuery, ShoalFallbackWarning


@shoal.udf(return_dtype=pl.Int64, concurrency=2)
class SlowPool:
    """A stateful UDF (an actor pool) that sleeps per batch and touches ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, a: pl.Series) -> pl.Series:
        Path(self.marker).touch()
        time.sleep(0.4)
        return a * 2


@shoal.udf(return_dtype=pl.Int64, name="slow_in_task")
def slow_in_task(a: pl.Series) -> pl.Series:
    """A stateless UDF: runs in ordinary tasks, slowly."""
    time.sleep(0.4)
    return a * 2


@shoal.udf(return_dtype=pl.Int64, name="slow_logged")
def slow_logged(a: pl.Series, log: pl.Series) -> pl.Series:
    """As :func:`slow_in_task`, leaving a file in the directory ``log[0]`` per call."""
    if len(log):
        (Path(log[0]) / uuid.uuid4().hex).touch()
    time.sleep(0.4)
    return a * 2


@pytest.fixture(params=["local", "ray"])
def runner(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_runner")
    return str(request.param)


def engine(runner: str, partitions: int = 4) -> shoal.DistEngine:
    cfg = Config(runner=runner, default_partitions=partitions)  # type: ignore[arg-type]
    return shoal.DistEngine(runner=runner, raise_on_fail=True, config=cfg)  # type: ignore[arg-type]


def frame(rows: int = 2000) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "k": [None if i % 9 == 0 else i % 7 for i in range(rows)],
            "v": [float("nan") if i % 13 == 0 else i / 3 for i in range(rows)],
            "a": list(range(rows)),
        }
    )


def udf_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "shoal-udf-" in line and "_worker_main" in line]


def no_task_left(runner: str) -> None:
    """Nothing of the cancelled query still runs: Ray's CPUs are all free and no named
    actor is left; the local runner has no UDF worker process."""
    deadline = time.monotonic() + 5
    if runner == "ray":
        while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
            assert time.monotonic() < deadline, "tasks of the cancelled query still hold CPUs"
            time.sleep(0.05)
        assert ray.util.list_named_actors(all_namespaces=True) == []
    else:
        assert udf_processes() == []


def wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, "the query never started its UDF"
        time.sleep(0.05)


def test_fetch_blocking_equals_native(runner: str) -> None:
    lf = (
        pl.concat([frame(), frame(300)])  # duplicates
        .lazy()
        .filter(pl.col("v") > 10)
        .group_by("k")
        .agg(pl.col("v").sum(), pl.len())
        .sort("k")
    )
    q = lf.collect(engine=engine(runner), background=True)
    assert isinstance(q, DistQuery) and isinstance(q, InProcessQuery)
    got = q.fetch_blocking()
    assert got.equals(lf.collect())
    assert q.fetch() is not None and q.fetch().equals(got)  # type: ignore[union-attr]


def test_fetch_is_none_until_done(runner: str) -> None:
    lf = frame(400).lazy().shoal.with_udf(slow_in_task, inputs="a", output="b")
    q = lf.collect(engine=engine(runner, partitions=4), background=True)
    assert q.fetch() is None  # four batches of 0.4 s on two CPUs: not done yet
    deadline = time.monotonic() + 60
    while (got := q.fetch()) is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert got.equals(lf.collect())


def test_cancel_stops_every_task_and_pool_promptly(runner: str, tmp_path: Path) -> None:
    marker = tmp_path / "working"
    lf = frame(4000).lazy().shoal.with_udf(SlowPool.with_init(str(marker)), inputs="a", output="b")
    q = lf.collect(engine=engine(runner, partitions=40), background=True)  # ~8 s of batches
    wait_for(marker)
    start = time.monotonic()
    q.cancel()
    assert time.monotonic() - start < 10
    no_task_left(runner)
    with pytest.raises(QueryCancelledError):
        q.fetch_blocking()
    # The runner is ready for the next query.
    small = frame(300).lazy().filter(pl.col("k") > 2).select("k", "v")
    assert small.collect(engine=engine(runner)).equals(small.collect())


def test_cancel_of_many_ordinary_tasks(runner: str, tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    calls.mkdir()
    df = frame(4000).with_columns(log=pl.lit(str(calls)))
    lf = df.lazy().shoal.with_udf(slow_logged, inputs=["a", "log"], output="b")
    q = lf.collect(engine=engine(runner, partitions=40), background=True)  # ~8 s on 2 CPUs
    wait_for_any(calls)
    start = time.monotonic()
    q.cancel()
    assert time.monotonic() - start < 10
    with pytest.raises(QueryCancelledError):
        q.fetch()
    no_task_left(runner)
    started = len(list(calls.iterdir()))
    assert started < 40  # cancelled before the end
    time.sleep(1.0)
    assert len(list(calls.iterdir())) == started  # and no task of it starts afterwards
    again = frame(200).lazy().shoal.with_udf(slow_in_task, inputs="a", output="b")
    assert again.collect(engine=engine(runner)).equals(again.collect())


def wait_for_any(directory: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not any(directory.iterdir()):
        assert time.monotonic() < deadline, "the query never started its UDF"
        time.sleep(0.05)


def test_untranslatable_query_falls_back_to_polars_background() -> None:
    lf = frame(100).lazy().map_batches(lambda df: df)
    with pytest.warns(ShoalFallbackWarning, match="background collect falls back"):
        q = lf.collect(engine=shoal.DistEngine(runner="local"), background=True)
    assert not isinstance(q, DistQuery)
    assert q.fetch_blocking().equals(frame(100))
    with pytest.raises(UnsupportedError, match="MapFunction"):
        lf.collect(engine=engine("local"), background=True)
