"""Faults on the Ray runner: a worker killed mid-shuffle, retries running out, Ctrl-C."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time

import polars as pl
import pytest
import ray

import shoal
from shoal.config import Config

from .irplans import agg_sort_plan

pytestmark = pytest.mark.usefixtures("ray_runner")


def _big_frame(rows: int) -> pl.DataFrame:
    i = pl.int_range(rows, eager=True)
    return pl.DataFrame({"k": i * 7919 % 50_000, "v": (i * 31 % 1000).cast(pl.Float64)})


def _shoal_workers(stage_prefix: str = "ray::shoal-stage") -> list[tuple[int, str]]:
    """Processes of this test's own Ray instance (descendants of this process: its raylet
    and workers) whose title starts with ``stage_prefix``. Never another program's: the
    machine may run other Ray instances, whose workers have the same titles."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True)
    parent: dict[int, int] = {}
    titles: dict[int, str] = {}
    for line in out.stdout.splitlines():
        pid, ppid, *rest = line.split(None, 2)
        parent[int(pid)] = int(ppid)
        titles[int(pid)] = rest[0] if rest else ""
    me = os.getpid()

    def ours(pid: int) -> bool:
        seen = set()
        while pid not in (0, 1) and pid not in seen:
            if pid == me:
                return True
            seen.add(pid)
            pid = parent.get(pid, 0)
        return False

    return [
        (pid, args)
        for pid, args in titles.items()
        if args.startswith(stage_prefix) and pid != me and ours(pid)
    ]


class _Killer(threading.Thread):
    """SIGKILLs the first Ray worker seen running a task of a shuffle's reduce side (or, if
    none shows up in time, of any stage), or the first process whose title starts with
    ``prefix``."""

    def __init__(self, prefix: str | None = None) -> None:
        super().__init__(daemon=True)
        self.killed: list[str] = []
        self.stop = threading.Event()
        self.prefix = prefix

    def run(self) -> None:
        deadline = time.monotonic() + 30
        while not self.stop.is_set() and time.monotonic() < deadline:
            if self.prefix is not None:
                workers = _shoal_workers(self.prefix)
            else:
                workers = _shoal_workers("ray::shoal-stage1") or (
                    _shoal_workers() if time.monotonic() > deadline - 25 else []
                )
            for pid, args in workers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                self.killed.append(args)
                return
            time.sleep(0.005)


def test_worker_killed_mid_shuffle_still_gives_the_right_answer() -> None:
    plan, expected = agg_sort_plan(_big_frame(2_000_000))
    cfg = Config(default_partitions=48, shuffle_partitions=24)
    for _attempt in range(4):
        killer = _Killer()
        killer.start()
        got = shoal.execute(plan, runner="ray", config=cfg)
        killer.stop.set()
        killer.join()
        assert pl.from_arrow(got).equals(expected)
        if killer.killed:
            break
    assert killer.killed, "no worker was caught running a task"


def test_retries_running_out_names_stage_and_partition() -> None:
    plan, _ = agg_sort_plan(_big_frame(2_000_000))
    cfg = Config(default_partitions=48, shuffle_partitions=24, task_max_retries=0)
    for _attempt in range(4):
        killer = _Killer()
        killer.start()
        try:
            shoal.execute(plan, runner="ray", config=cfg)
        except shoal.TaskError as exc:
            assert killer.killed
            assert "stage" in str(exc) and "partition" in str(exc)
            assert "WorkerCrashedError" in str(exc) or "died" in str(exc).lower()
            break
        finally:
            killer.stop.set()
            killer.join()
    else:
        pytest.fail("no worker was caught running a task")


def test_keyboard_interrupt_cancels_the_query_quickly() -> None:
    plan, expected = agg_sort_plan(_big_frame(6_000_000))
    cfg = Config(default_partitions=96)
    small, small_expected = agg_sort_plan(_big_frame(10_000))
    # Ray is up before the interrupt (when this test runs alone, too).
    assert pl.from_arrow(shoal.execute(small, runner="ray", config=cfg)).equals(small_expected)
    sent = {}

    def interrupt() -> None:
        time.sleep(0.5)
        sent["at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt, daemon=True)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        shoal.execute(plan, runner="ray", config=cfg)
    assert time.monotonic() - sent["at"] < 5
    t.join()
    # Every task of the query is cancelled or finished: all CPUs come back.
    deadline = time.monotonic() + 5
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
        assert time.monotonic() < deadline, "tasks of the interrupted query still hold CPUs"
        time.sleep(0.05)
    # The runner is ready for the next query.
    assert pl.from_arrow(shoal.execute(small, runner="ray", config=cfg)).equals(small_expected)
    del expected


class _SlowDouble:
    """A stateful UDF that takes a while per batch, so an actor can be killed mid-stage."""

    def __call__(self, v: pl.Series) -> pl.Series:
        time.sleep(0.15)
        return v * 2


@pytest.mark.parametrize("actors", [1, 2])
def test_udf_actor_killed_mid_stage_is_replaced_and_its_batch_resent(actors: int) -> None:
    """With one actor (one GPU, one model) too: its replacement must take the resent
    batch (the query used to fail with 'no free actor')."""
    from shoal.runners.session import last_query

    udf = shoal.udf(return_dtype=pl.Float64, concurrency=actors, name="slow_double")(_SlowDouble)
    df = pl.DataFrame({"k": range(4000), "v": [float(i) for i in range(4000)]})
    lf = df.lazy().shoal.with_udf(udf, inputs=["v"], output="v2")
    expected = lf.collect()  # native Polars runs the same UDF in-process
    engine = shoal.DistEngine(
        runner="ray", raise_on_fail=True, config=Config(default_partitions=24, udf_batch_size=200)
    )
    for _attempt in range(4):
        killer = _Killer(prefix="ray::_UdfActor.run")
        killer.start()
        got = lf.collect(engine=engine)
        killer.stop.set()
        killer.join()
        assert got.sort("k").equals(expected.sort("k"))  # no row lost or doubled
        if killer.killed:
            break
    assert killer.killed, "no actor was caught running a batch"
    report = last_query()
    assert report is not None
    # The dead actor was replaced (whether its replacement got a batch before the stage
    # ended depends on timing: the surviving actor may have taken the rest).
    assert report.actors_replaced >= 1
    # The batch the dead actor held was sent again: the profile counts it for that stage.
    (pool_stage,) = [st.id for st in report.physical.stages if st.name.startswith("actor-pool")]
    assert report.resent.get(pool_stage, 0) >= 1
    from shoal.runners import profile

    line = next(
        ln for ln in profile.analyze_text(report).splitlines() if ln.startswith(f"{pool_stage} [")
    )
    assert int(line.split()[-2]) == report.resent[pool_stage]
    assert ray.util.list_named_actors(all_namespaces=True) == []


def test_a_failing_query_leaves_no_unhandled_ray_errors(caplog: pytest.LogCaptureFixture) -> None:
    """Regression: when one task failed, the failed tasks beside it (and the failed task's
    own outputs) were dropped unread, and Ray printed each as an "Unhandled error" with its
    traceback after the query had already raised."""
    import gc

    lf = pl.DataFrame({"s": ["1", "x"] * 2000}).lazy().select(pl.col("s").cast(pl.Int64))
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=Config(default_partitions=8))
    with caplog.at_level(logging.ERROR), pytest.raises(pl.exceptions.InvalidOperationError):
        lf.collect(engine=engine)
    gc.collect()
    time.sleep(3)  # Ray reports unread errors when it frees the objects
    gc.collect()
    assert not [r for r in caplog.records if "Unhandled error" in r.getMessage()]


def test_failing_queries_do_not_crash_ray() -> None:
    """Regression: when a task failed, the loop cancelled the tasks in flight beside it, which
    were failing the same way at that moment; in Ray 2.60 a ``ray.cancel`` racing a task's
    completion crashes the driver ("Tried to complete task that was not pending"). It
    crashed within 40 such queries; the backend now lets finishing tasks finish first."""
    lf = pl.DataFrame({"s": ["1", "x"] * 4000}).lazy().select(pl.col("s").cast(pl.Int64))
    engine = shoal.DistEngine(
        runner="ray", raise_on_fail=True, config=Config(default_partitions=16)
    )
    for _ in range(40):
        with pytest.raises(pl.exceptions.InvalidOperationError):
            lf.collect(engine=engine)
    ok = pl.DataFrame({"s": ["1", "2"] * 100}).lazy().select(pl.col("s").cast(pl.Int64).sum())
    assert ok.collect(engine=engine).item() == 300
