"""Ctrl-C as Ray's state API sees it (issue 8): control comes back within 5 seconds, and
afterwards ``ray.util.state`` lists no live task or actor of the interrupted query.

The module starts its own local Ray instance with the dashboard (``ray_dashboard=True``,
which needs ``ray[default]``): the state API reads the dashboard. The query has ordinary
tasks (a stateless UDF runs inside them) and, on a parallel branch, a stateful UDF on an
actor pool, and the interrupt is sent only once the state API shows both at work. The
state API is eventually consistent (workers report task events about once a second), so
the checks poll with a bounded timeout.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import ray
from ray.util.state import list_actors, list_tasks

import shoal
from shoal.config import Config

#: Task states after which a task holds nothing (src/ray/protobuf/common.proto).
_TASK_DONE = {"FINISHED", "FAILED"}
#: Seconds to wait for the state API to catch up with what happened.
_STATE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module", autouse=True)
def ray_with_dashboard() -> Iterator[None]:
    """A local Ray instance with the dashboard for this module (4 logical CPUs: the actor
    pool holds one, tasks run beside it), started by a first small query, shut down after
    the module."""
    shoal.shutdown()
    shoal.set_config(
        num_cpus=4, ray_temp_dir=f"/tmp/shoal-ray-st-{os.getpid()}", ray_dashboard=True
    )
    pl.LazyFrame({"x": [1, 2]}).collect(engine=shoal.DistEngine(runner="ray"))
    yield
    shoal.shutdown()
    shoal.set_config(num_cpus=None, ray_temp_dir=None, ray_dashboard=False)


class _SlowDouble:
    """A stateful UDF (an actor pool) that takes a while per batch."""

    def __call__(self, v: pl.Series) -> pl.Series:
        time.sleep(0.2)
        return v * 2


#: How long the ordinary task that meets the marker row would run if nothing cancelled it,
#: in seconds: longer than the test waits for the state API, so that a task left running
#: after Ctrl-C fails the test.
_STUCK_S = 3 * _STATE_TIMEOUT_S


def _slow_negate(stuck_marker: Path) -> Callable[[pl.Series], pl.Series]:
    """A stateless UDF for ordinary tasks, slow; the batch holding the marker row (a
    negative value, in the last partition) creates the file ``stuck_marker`` and then does
    not finish unless cancelled."""

    def slow_negate(w: pl.Series) -> pl.Series:
        if (w < 0).any():
            stuck_marker.touch()
            time.sleep(_STUCK_S)
        time.sleep(0.2)
        return -w

    return slow_negate


def _query(stuck_marker: Path) -> pl.LazyFrame:
    """A join of two branches that run at the same time: a stateful UDF on an actor pool,
    and a stateless one in ordinary tasks (one of which gets stuck)."""
    pooled = shoal.udf(return_dtype=pl.Float64, concurrency=1, name="cancel_double")(_SlowDouble)
    plain = shoal.udf(return_dtype=pl.Float64, name="cancel_negate")(_slow_negate(stuck_marker))
    n = 8000
    a = pl.DataFrame({"k": range(n), "v": [float(i) if i % 7 else None for i in range(n)]})
    b = pl.DataFrame({"k": range(n), "w": [float(i % 13) for i in range(n - 1)] + [-1.0]})
    left = a.lazy().shoal.with_udf(pooled, inputs=["v"], output="v2")
    right = b.lazy().shoal.with_udf(plain, inputs=["w"], output="w2")
    return left.join(right, on="k", how="inner")


def _address() -> str:
    """This module's Ray instance (other Ray instances may run on the machine: the state
    API must not guess)."""
    return str(ray.get_runtime_context().gcs_address)


def _query_actors(prefix: str) -> list[Any]:
    actors = list_actors(address=_address(), limit=10_000)
    return [a for a in actors if (a.name or "").startswith(prefix)]


def _live_tasks(actor_ids: set[str], before: set[str]) -> list[Any]:
    """Tasks not finished nor failed that belong to the query: shoal's Ray tasks (named
    ``shoal-stage<id>``; none from earlier queries, ``before``) and every
    task of the query's actors (creation and calls)."""
    return [
        t
        for t in list_tasks(address=_address(), limit=10_000)
        if t.state not in _TASK_DONE
        and t.task_id not in before
        and ((t.name or "").startswith("shoal-stage") or t.actor_id in actor_ids)
    ]


class _Interrupter(threading.Thread):
    """Sends SIGINT to this process once the stuck task has started (``stuck_marker``
    exists) and the state API shows an actor of the pool ALIVE and the query's ordinary
    tasks RUNNING; records what it saw."""

    def __init__(self, before: set[str], stuck_marker: Path) -> None:
        super().__init__(daemon=True)
        self.before = before
        self.stuck_marker = stuck_marker
        self.actors: list[Any] = []
        self.tasks: list[Any] = []
        self.sent_at: float | None = None
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            self._watch()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def _watch(self) -> None:
        deadline = time.monotonic() + _STATE_TIMEOUT_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            if not self.stuck_marker.exists():
                time.sleep(0.1)
                continue
            actors = [a for a in _query_actors("shoal-udf-cancel_double-") if a.state == "ALIVE"]
            tasks = [
                t
                for t in list_tasks(
                    address=_address(), limit=10_000, filters=[("state", "=", "RUNNING")]
                )
                if (t.name or "").startswith("shoal-stage") and t.task_id not in self.before
            ]
            if actors and tasks:
                self.actors, self.tasks = actors, tasks
                break
            time.sleep(0.1)
        if self.stop.is_set():
            return
        self.sent_at = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.slow  # heavy (a Ray instance of its own or many processes): -m slow
def test_ctrl_c_leaves_no_task_or_actor_of_the_query_in_rays_state(tmp_path: Path) -> None:
    engine = shoal.DistEngine(
        runner="ray",
        raise_on_fail=True,
        config=Config(default_partitions=24, udf_batch_size=100, progress="never"),
    )
    before = {t.task_id for t in list_tasks(address=_address(), limit=10_000)}
    stuck_marker = tmp_path / "stuck-task-started"
    interrupter = _Interrupter(before, stuck_marker)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _query(stuck_marker).collect(engine=engine)
        returned_at = time.monotonic()
    finally:
        interrupter.stop.set()
        interrupter.join()
    assert interrupter.error is None, f"reading Ray's state failed: {interrupter.error!r}"
    assert interrupter.actors and interrupter.tasks, (
        "the state API never showed the pool's actor and the stuck task at work together"
    )
    assert interrupter.sent_at is not None
    assert returned_at - interrupter.sent_at < 5

    # Every actor of the query, by name: shoal-udf-<udf name>-<query id>-<i>.
    seen = interrupter.actors[0].name
    query_prefix = seen.rsplit("-", 1)[0] + "-"
    deadline = time.monotonic() + _STATE_TIMEOUT_S
    while True:
        actors = _query_actors(query_prefix)
        live_actors = [a for a in actors if a.state != "DEAD"]
        live_tasks = _live_tasks({a.actor_id for a in actors}, before)
        if not live_actors and not live_tasks:
            break
        assert time.monotonic() < deadline, (
            "after Ctrl-C the state API still lists the query's "
            f"actors {[(a.name, a.state) for a in live_actors]} and "
            f"tasks {[(t.name, t.state) for t in live_tasks]}"
        )
        time.sleep(0.25)
    assert {a.name for a in interrupter.actors} <= {a.name for a in actors}

    # The runner is ready for the next query, with every CPU back.
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
        assert time.monotonic() < deadline, "the interrupted query still holds CPUs"
        time.sleep(0.05)
    small = pl.LazyFrame({"k": [1, 2, 2, None], "x": [1.0, float("nan"), 3.0, None]})
    small = small.group_by("k").agg(pl.col("x").sum()).sort("k")
    assert small.collect(engine=engine).equals(small.collect())
