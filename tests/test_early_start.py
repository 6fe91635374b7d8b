"""Stages started before their inputs finish (issue 17, "start a stage's tasks as soon as
the inputs they read are ready"): on a backend that resolves task dependencies itself
(Ray), a stage that reads only broadcasts of stages already running is dispatched with
their tasks' future outputs as inputs, and its tasks start once those exist.

Checked against a fake backend that runs a task only once its inputs exist (any
completion order, failures) and on Ray against native Polars: chains of broadcast joins,
an empty broadcast side (the early tasks then give no rows without scanning), and a query
cancelled while early tasks wait for their inputs.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

import shoal
from shoal.config import Config
from shoal.errors import QueryCancelledError, TaskError
from shoal.execution.kernel import run_fragment
from shoal.planner.physical import plan_physical
from shoal.runners import dispatch
from shoal.runners.dispatch import CancelToken, DispatchLoop, TaskResult, TaskSpec
from shoal.runners.ray_runner import _ray_task_body, ship
from shoal.runners.session import conform, last_query, run_plan
from shoal_polars.engine import to_ir

from .test_memory import _write

#: No small-query path (these tables are tiny), 3 partitions per shuffle.
#: (``broadcast_inline_bytes=0``: every build side a broadcast stage of its own, the chains
#: of stages that early start is for; small dimension tables are read by the probe's tasks
#: otherwise.)
CFG = {
    "small_query_bytes": 0,
    "shuffle_partitions": 3,
    "target_partition_bytes": 2048,
    "broadcast_inline_bytes": 0,
}


class _Future:
    """A task output that does not exist yet."""

    def __init__(self) -> None:
        self.table: pa.Table | None = None


class DependencyBackend:
    """A fake Ray: a task may take the future outputs of tasks not yet run
    (``pending_outputs``) and runs only once they exist; ``wait`` runs a random subset of
    the runnable tasks and returns a random subset of the finished ones. Tasks run as the
    Ray runner's worker runs them (:func:`_ray_task_body` over :func:`ship`'s payload)."""

    def __init__(self, seed: int, fail: tuple[int, int] | None = None) -> None:
        self.rng = random.Random(seed)
        self.tasks: dict[int, tuple[TaskSpec, list[_Future]]] = {}
        self.done: dict[int, tuple[Any, ...] | BaseException] = {}
        self.next_id = 0
        self.fail = fail
        self.cancelled: list[int] = []
        #: (stage, partition, whether every input existed when it was submitted)
        self.submitted: list[tuple[int, int, bool]] = []
        self.ran: list[tuple[int, int]] = []

    def submit(self, task: TaskSpec) -> int:
        self.next_id += 1
        self.tasks[self.next_id] = (task, [_Future() for _ in range(task.output.num_outputs)])
        ready = all(self._exists(r) for g in task.inputs for r in g)
        self.submitted.append((task.stage.id, task.partition, ready))
        return self.next_id

    def pending_outputs(self, handle: int) -> list[Any]:
        return list(self.tasks[handle][1])

    @staticmethod
    def _exists(ref: Any) -> bool:
        return not isinstance(ref, _Future) or ref.table is not None

    def _run(self, handle: int) -> None:
        task, futures = self.tasks[handle]
        self.ran.append((task.stage.id, task.partition))
        payload, layout, args = ship(task)
        tables = tuple(a.table if isinstance(a, _Future) else a for a in args)
        if self.fail == (task.stage.id, task.partition) or any(
            isinstance(t, BaseException) for t in tables
        ):
            err = ValueError("injected failure")
            self.done[handle] = err
            for f in futures:  # (as Ray: readers of a failed task's outputs fail too)
                f.table = err  # type: ignore[assignment]
            return
        out = _ray_task_body(payload, layout, tables, run_fragment)
        for f, t in zip(futures, out[1:], strict=True):
            f.table = t
        self.done[handle] = out

    def wait(self, handles: Sequence[int], timeout: float | None = None) -> list[int]:
        runnable = [
            h
            for h in handles
            if h not in self.done
            and h not in self.cancelled
            and all(self._exists(r) for g in self.tasks[h][0].inputs for r in g)
        ]
        if runnable:
            for h in self.rng.sample(runnable, self.rng.randint(1, len(runnable))):
                self._run(h)
        finished = [h for h in handles if h in self.done]
        assert finished or timeout is not None, "nothing can run: a task waits on itself"
        if not finished:
            return []
        return self.rng.sample(finished, self.rng.randint(1, len(finished)))

    def result(self, handle: int) -> TaskResult:
        task, futures = self.tasks.pop(handle)
        out = self.done.pop(handle)
        if isinstance(out, BaseException):
            raise out
        return TaskResult(task, out[0], list(futures))

    def fetch(self, refs: Sequence[Any]) -> list[pa.Table]:
        return [r.table if isinstance(r, _Future) else r for r in refs]

    def cancel(self, handles: Sequence[int]) -> None:
        self.cancelled.extend(handles)
        for h in handles:
            self.done.setdefault(h, ValueError("cancelled"))


def _frames(root: Path, empty_region: bool = False) -> dict[str, pl.LazyFrame]:
    """A star in the shape of TPC-H Q5: region -> nation -> customer -> orders, lineitem;
    null keys, NaN and -0.0 values, duplicates, an empty file in each table."""
    n = 3000
    region = pl.DataFrame({"r": [0, 1, 2, None], "rname": ["A", "B", "A", "C"]})
    nation = pl.DataFrame({"n": list(range(12)) + [None], "r": [i % 4 for i in range(12)] + [1]})
    customer = pl.DataFrame(
        {"c": list(range(200)), "n": [None if i % 17 == 0 else i % 12 for i in range(200)]}
    )
    orders = pl.DataFrame({"o": list(range(900)), "c": [i % 210 for i in range(900)]})
    lineitem = pl.DataFrame(
        {
            "o": [None if i % 23 == 0 else i % 950 for i in range(n)],
            "v": [
                float("nan") if i % 31 == 0 else (-0.0 if i % 29 == 0 else float(i % 97))
                for i in range(n)
            ],
        }
    )
    if empty_region:
        region = region.clear()
    return {
        "region": _write(region, root, "region", 1),
        "nation": _write(nation, root, "nation", 2),
        "customer": _write(customer, root, "customer", 3),
        "orders": _write(orders, root, "orders", 3),
        "lineitem": _write(lineitem, root, "lineitem", 4),
    }


def _q5_like(t: dict[str, pl.LazyFrame], rname: str = "A") -> pl.LazyFrame:
    return (
        t["lineitem"]
        .join(
            t["orders"]
            .join(
                t["customer"].join(
                    t["nation"].join(t["region"].filter(pl.col("rname") == rname), on="r"),
                    on="n",
                ),
                on="c",
            )
            .select("o", "n"),
            on="o",
        )
        .group_by("n")
        .agg(pl.col("v").sum(), pl.len())
        .sort("n")
    )


@pytest.fixture(scope="module")
def star(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pl.LazyFrame]:
    return _frames(tmp_path_factory.mktemp("star"))


def _chain(physical: Any) -> list[int]:
    """Stages that read only broadcasts of other stages."""
    return [s.id for s in physical.stages if s.inputs and all(i.mode == "all" for i in s.inputs)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("limit", [1, 2, 4, 50])
def test_broadcast_stages_start_before_their_inputs_finish(star, seed, limit):
    """Any completion order, any in-flight limit: the answer is native Polars', stages of
    broadcast readers are submitted before their inputs exist (failed before: each stage
    waited for every input to finish), and no task runs before its inputs."""
    lf = _q5_like(star)
    physical = plan_physical(to_ir(lf), Config(**CFG), 2)  # type: ignore[arg-type]
    assert len(_chain(physical)) >= 3, [s.name for s in physical.stages]
    backend = DependencyBackend(seed)
    loop = DispatchLoop(physical, backend, max_in_flight=limit, adaptive=True)
    got = pl.from_arrow(pa.concat_tables(backend.fetch(loop.run())))
    assert isinstance(got, pl.DataFrame)
    assert got.equals(lf.collect(engine="in-memory"))
    if limit >= 4:
        assert any(not ready for _, _, ready in backend.submitted), backend.submitted
    assert not loop.in_flight and loop.ledger.held == 0


@pytest.mark.parametrize("seed", range(4))
def test_a_failed_input_of_an_early_stage_names_its_own_stage(star, seed):
    lf = _q5_like(star)
    physical = plan_physical(to_ir(lf), Config(**CFG), 2)  # type: ignore[arg-type]
    first = _chain(physical)[0]
    producer = physical.stage(first).inputs[0].stage
    backend = DependencyBackend(seed, fail=(producer, 0))
    loop = DispatchLoop(physical, backend, max_in_flight=50, adaptive=True)
    with pytest.raises(TaskError, match=rf"stage {producer} .*partition 0: ValueError"):
        loop.run()
    assert not loop.in_flight
    assert any(not ready for _, _, ready in backend.submitted)


def test_an_empty_broadcast_gives_no_rows_without_running_the_early_tasks(tmp_path):
    """Region filtered to nothing: the stages started early find their broadcast input
    empty and give no rows without running their query (nothing scanned)."""
    t = _frames(tmp_path)
    lf = _q5_like(t, rname="none")
    physical = plan_physical(to_ir(lf), Config(**CFG), 2)  # type: ignore[arg-type]
    backend = DependencyBackend(0)
    loop = DispatchLoop(physical, backend, max_in_flight=50, adaptive=True)
    got = pl.from_arrow(conform(backend.fetch(loop.run()), to_ir(lf)))
    want = lf.collect(engine="in-memory")
    assert isinstance(got, pl.DataFrame) and got.schema == want.schema and got.is_empty()
    empty = [s for s in loop.task_stats.values() if s.extra.get("empty_input")]
    assert empty and all(s.scan_rows == 0 and s.rows_out == 0 for s in empty)
    assert any("found an input empty" in line for line in loop.adaptations)


# -- on Ray ---------------------------------------------------------------------------


def _record_early(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(stage, partition) of every task dispatched while a stage it reads still ran."""
    seen: list[tuple[int, int]] = []
    real = dispatch.DispatchLoop._dispatch

    def spy(self: DispatchLoop, batch: list[TaskSpec]) -> None:
        for task in batch:
            if not all(self.states[s].finished for i in task.stage.inputs for s in i.stages):
                seen.append((task.stage.id, task.partition))
        real(self, batch)

    monkeypatch.setattr(dispatch.DispatchLoop, "_dispatch", spy)
    return seen


def test_a_chain_of_broadcast_joins_on_ray_answers_as_polars(ray_runner, star, monkeypatch):
    early = _record_early(monkeypatch)
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=Config(**CFG))  # type: ignore[arg-type]
    for rname in ("A", "B", "none"):
        lf = _q5_like(star, rname)
        got = lf.collect(engine=engine)
        assert isinstance(got, pl.DataFrame)
        assert got.equals(lf.collect(engine="in-memory")), rname
    assert early  # (failed before: no stage started before its inputs finished)
    report = last_query()
    assert report is not None and report.task_stats


@shoal.udf(return_dtype=pl.Int64)
def _slow(r: pl.Series) -> pl.Series:
    time.sleep(float(r.len() and 4.0))
    return r


def test_a_query_cancelled_while_early_tasks_wait_for_inputs(ray_runner, star, monkeypatch):
    """The region side sleeps 4 s (a UDF) while the stages after it wait for it on Ray; a
    cancel then stops the query, and every CPU comes back."""
    import ray

    from shoal.runners.session import start_runner

    early = _record_early(monkeypatch)
    t = dict(star)
    t["region"] = (
        t["region"]
        .shoal.with_udf(_slow, inputs="r", output="r2")
        .select(pl.col("r2").alias("r"), "rname")
    )
    lf = _q5_like(t)
    config = shoal.get_config().replace(runner="ray", **CFG)
    start_runner(config)
    token = CancelToken()

    def cancel_once_early() -> None:
        deadline = time.monotonic() + 60
        while not early and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        token.cancel()

    threading.Thread(target=cancel_once_early, daemon=True).start()
    with pytest.raises(QueryCancelledError):
        run_plan(to_ir(lf), config, cancel=token)
    assert early  # tasks were waiting for their inputs when the query was cancelled
    deadline = time.monotonic() + 120  # (a hang guard: they come back within a second)
    while ray.available_resources().get("CPU") != ray.cluster_resources().get("CPU"):
        assert time.monotonic() < deadline, "tasks of the cancelled query still hold CPUs"
        time.sleep(0.05)
    want = _q5_like(star)
    got = want.collect(engine=shoal.DistEngine(runner="ray", config=Config(**CFG)))  # type: ignore[arg-type]
    assert isinstance(got, pl.DataFrame) and got.equals(want.collect(engine="in-memory"))
