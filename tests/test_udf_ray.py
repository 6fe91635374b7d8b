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
from polars.testing import assert_frame_equal

import shoal
from shoal.config import Config
from shoal.ir import InMemorySource, Scan
from shoal.runners.actor_pool import pool_udf
from shoal.runners.session import last_query

from .test_udf import (
    Counted,
    Fails,
    Offset,
    SeeDevices,
    Slow,
    check_heap_reused,
    check_pool_reads_scan,
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
        runner="ray",
        raise_on_fail=True,
        config=Config(default_partitions=default_partitions, udf_keep_warm=False),
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


@pytest.mark.slow  # heavy (a Ray instance of its own or many processes): -m slow
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
    # 40 batches of 1 s each: run to its end, the query would take 20 s or more.
    lf = frame(4000).lazy().shoal.with_udf(Slow.with_init(str(marker), 1.0), inputs="a", output="b")
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
    warm = Config(default_partitions=6)  # udf_keep_warm is on by default
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


@shoal.udf(return_dtype=pl.Float64, concurrency=2)
class _Double:
    def __call__(self, a: pl.Series) -> pl.Series:
        return a * 2


@shoal.udf(return_dtype=pl.Float64)
class _PlusOne:
    def __call__(self, a: pl.Series) -> pl.Series:
        return a + 1


def test_a_warm_pool_does_not_starve_another_pool_of_the_query() -> None:
    """Found by a fresh user: after a query kept _PlusOne's pool warm (one actor, one of the
    two CPUs), a query running _Double (exactly 2 actors) then _PlusOne never returned: it
    took the warm pool over at its start, and _Double waited forever for its second CPU.
    A query with several pool stages now starts its pools cold. (The thread's join is a
    guard against hanging the suite, not a time limit on the answer.)"""
    import threading

    df = pl.DataFrame({"a": [None if i % 7 == 0 else float(i) for i in range(500)]})
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=Config(default_partitions=3))
    warm = df.lazy().shoal.with_udf(_PlusOne, inputs=["a"], output="y")
    assert_frame_equal(warm.collect(engine=engine), df.with_columns(y=pl.col("a") + 1))
    both = (
        df.lazy()
        .shoal.with_udf(_Double, inputs=["a"], output="x")
        .shoal.with_udf(_PlusOne, inputs=["a"], output="y")
    )
    out: list[pl.DataFrame] = []
    t = threading.Thread(target=lambda: out.append(both.collect(engine=engine)), daemon=True)
    t.start()
    t.join(timeout=300)
    try:
        assert out, "the query with two pools did not return (it waited for an actor)"
        assert_frame_equal(out[0], df.with_columns(x=pl.col("a") * 2, y=pl.col("a") + 1))
    finally:
        from shoal.runners.actor_pool import close_parked

        close_parked()


def test_ray_actor_takes_two_batches_at_a_time(tmp_path: Path) -> None:
    """One actor (concurrency=1) gets two batches in flight; the answer is unchanged."""
    one = Counted.options(concurrency=1).with_init(str(tmp_path), delay=0.05)
    df = frame(400)
    lf = df.lazy().shoal.with_udf(one, inputs="a", output="who")
    got = lf.collect(
        engine=shoal.DistEngine(
            raise_on_fail=True, config=Config(default_partitions=8, udf_keep_warm=False)
        )
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


def test_ray_pool_reading_its_scan_equals_native() -> None:
    """Stateful UDFs straight over in-memory frames with nulls on Ray (the pool's actors
    read the row ranges, shipped as call arguments): native Polars' answer, with empty
    partitions too, each query one stage."""
    check_pool_reads_scan(_ray)
    assert shoal_actors() == []


def test_warm_query_asks_ray_for_no_cluster_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """A query on a warm pool asks Ray's GCS nothing (each ask is a round trip of 5-25 ms
    on a loaded machine): the pool's parking reads the runner's cached cluster size, and
    a pool that cannot grow (concurrency=1) never asks for free resources. Failed before:
    every parking asked ``ray.cluster_resources()``."""
    from shoal.runners.actor_pool import close_parked

    engine = shoal.DistEngine(raise_on_fail=True, config=Config(default_partitions=3))
    one = Offset.options(concurrency=1).with_init(k=2)
    df = frame(900)
    lf = df.lazy().shoal.with_udf(one, inputs="a", output="b")
    want = df.with_columns(b=pl.col("a") + 2)
    try:
        assert lf.collect(engine=engine).equals(want)  # starts and parks the pool
        asked: list[str] = []
        for name in ("cluster_resources", "available_resources", "nodes"):
            real = getattr(ray, name)

            def counted(*a: object, _n: str = name, _f: object = real, **k: object) -> object:
                asked.append(_n)
                return _f(*a, **k)  # type: ignore[operator]

            monkeypatch.setattr(ray, name, counted)
        for _ in range(2):
            assert lf.collect(engine=engine).equals(want)
        assert asked == []
    finally:
        close_parked()
    assert shoal_actors() == []


def test_ray_actor_reuses_its_heap_between_batches() -> None:
    """See ``check_heap_reused`` (on a Ray actor)."""
    check_heap_reused(_ray(1))
    assert shoal_actors() == []


# ------------------------------------------------------------------ in-memory frames on Ray


class _Recorder:
    """Wraps the Ray runner's remote task function: records the arguments of every task
    it starts, then starts it."""

    def __init__(self, remote: object) -> None:
        self.inner = remote
        self.calls: list[tuple[object, ...]] = []

    def options(self, **kwargs: object) -> _Recorder._Call:
        return _Recorder._Call(self, self.inner.options(**kwargs))  # type: ignore[attr-defined]

    class _Call:
        def __init__(self, rec: _Recorder, made: object) -> None:
            self.rec, self.made = rec, made

        def remote(self, *args: object) -> object:
            self.rec.calls.append(args)
            return self.made.remote(*args)  # type: ignore[attr-defined]


@pytest.fixture
def recorded_tasks(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    """The arguments of every Ray task the runner starts during the test, and of every
    actor pool call (recorded as a task's: payload, config, digest, layout, tables)."""
    from shoal.runners import actor_pool, session

    session.start_runner(shoal.get_config().replace(runner="ray"))
    backend = session._backends["ray"]
    rec = _Recorder(backend._remote)
    monkeypatch.setattr(backend, "_remote", rec)
    real_ship = actor_pool.ship

    def ship(task: object) -> tuple[object, ...]:
        payload, layout, args = real_ship(task)  # type: ignore[arg-type]
        rec.calls.append((payload, task.config, task.config_digest, layout, *args))  # type: ignore[attr-defined]
        return payload, layout, args

    monkeypatch.setattr(actor_pool, "ship", ship)
    return rec


@pytest.mark.parametrize("udf_kind", ["none", "stateless", "stateful"])
def test_in_memory_frame_is_not_pickled_into_every_task(
    recorded_tasks: _Recorder, udf_kind: str
) -> None:
    """A query over an in-memory frame split into 4 partitions: each scan task's payload
    (fragment, schemas, scan partition, output spec, as pickled for Ray) is small, and the
    frame's rows travel once, as one table argument per partition (through the object
    store), not inside the plan of every task. Failed before: every payload held the whole
    frame twice (the scan node's table and its row range, which pickles with the whole
    buffers)."""
    import pickle

    import pyarrow as pa

    df = frame(60_000)
    frame_bytes = df.to_arrow().nbytes
    lf = df.lazy()
    if udf_kind == "stateless":
        lf = lf.shoal.with_udf(score, inputs=["a", "s"], output="y")
    elif udf_kind == "stateful":
        lf = lf.shoal.with_udf(Offset.with_init(k=3), inputs="a", output="y")
    else:
        lf = lf.with_columns(y=pl.col("a") * 2)
    got = lf.collect(engine=_ray(4))
    assert got.equals(lf.collect())
    scans = [
        c
        for c in recorded_tasks.calls
        if any(
            isinstance(n, Scan) and isinstance(n.source, InMemorySource)
            for n in pickle.loads(c[0][0])[0].walk()  # type: ignore[index]
        )
    ]
    assert recorded_tasks.calls and len(scans) == 4
    for args in recorded_tasks.calls:
        payload = args[0]
        assert len(pickle.dumps(payload)) < frame_bytes // 50
    shipped = [a for c in recorded_tasks.calls for a in c[4:] if isinstance(a, pa.Table)]
    assert sorted(t.num_rows for t in shipped) == [15_000] * 4
    assert shoal_actors() == []


def test_udfs_on_ray_equal_native_with_nulls_and_empty_partitions() -> None:
    """Five rows (two null) in eight partitions, three of them empty: a stateless and a
    stateful UDF on Ray give native Polars' map_batches answer, and the stateless one
    also map_elements' (nulls stay null)."""
    df = pl.DataFrame({"a": [4, None, 7, None, 1], "s": ["x", "yy", None, "", "zzz"]})
    lf = (
        df.lazy()
        .shoal.with_udf(score, inputs=["a", "s"], output="y")
        .shoal.with_udf(Offset.with_init(k=5), inputs="a", output="b")
    )
    got = lf.collect(engine=_ray(8))
    expected = polars_native(df, score.fn, ["a", "s"], "y", pl.Float64()).with_columns(
        b=pl.col("a").map_batches(lambda a: a + 5, return_dtype=pl.Int64)
    )
    assert got.equals(expected)
    by_rows = df.with_columns(
        y=pl.struct("a", "s").map_elements(
            lambda r: (
                r["a"] * 1.5 + len(r["s"]) if r["a"] is not None and r["s"] is not None else None
            ),
            return_dtype=pl.Float64,
        )
    )
    assert got["y"].equals(by_rows["y"])
    report = last_query()
    assert report is not None
    assert sum(1 for s in report.task_stats.values() if s.rows_out == 0) >= 3
    assert shoal_actors() == []
