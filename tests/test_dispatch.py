"""The dispatch loop, driven against fake backends (no cluster), as Daft tests its
scheduler: completion order, the in-flight limit, stage barriers, and failures."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa
import pytest

from shoal.config import Config
from shoal.errors import QueryCancelledError, TaskError
from shoal.execution.kernel import run_fragment
from shoal.planner.physical import plan_physical
from shoal.runners.dispatch import CancelToken, DispatchLoop, TaskResult, TaskSpec

from .irplans import agg_sort_plan, frame


class FakeBackend:
    """Runs each task when it is awaited, finishing tasks in a random order."""

    def __init__(self, seed: int, fail: tuple[int, int] | None = None) -> None:
        self.rng = random.Random(seed)
        self.pending: dict[int, TaskSpec] = {}
        self.next_id = 0
        self.max_seen = 0
        self.fail = fail
        self.cancelled: list[int] = []
        self.order: list[tuple[int, int]] = []

    def submit(self, task: TaskSpec) -> int:
        self.next_id += 1
        self.pending[self.next_id] = task
        self.max_seen = max(self.max_seen, len(self.pending))
        return self.next_id

    def wait(self, handles: Sequence[int]) -> list[int]:
        k = self.rng.randint(1, len(handles))
        return self.rng.sample(list(handles), k)

    def result(self, handle: int) -> TaskResult:
        task = self.pending.pop(handle)
        self.order.append((task.stage.id, task.partition))
        if self.fail == (task.stage.id, task.partition):
            raise ValueError("injected failure")
        stats, tables = run_fragment(
            task.fragment, task.inputs, task.scan, task.output, task.input_schemas
        )
        return TaskResult(task, stats, tables)

    def fetch(self, refs: Sequence[Any]) -> list[pa.Table]:
        return list(refs)

    def cancel(self, handles: Sequence[int]) -> None:
        self.cancelled.extend(handles)
        for h in handles:
            self.pending.pop(h, None)


def _plan():
    return agg_sort_plan(frame())


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("limit", [1, 3, 50])
def test_any_completion_order_gives_the_same_answer(seed, limit):
    plan, expected = _plan()
    physical = plan_physical(plan, Config(runner="local", target_partition_bytes=800))
    assert physical.stages[0].num_tasks > 3
    backend = FakeBackend(seed)
    loop = DispatchLoop(physical, backend, max_in_flight=limit)
    got = pl.from_arrow(pa.concat_tables(loop.run()))
    assert got.equals(expected)
    assert backend.max_seen <= limit
    # Stage barrier: no task of a stage finished before every task of its inputs.
    finished: dict[int, int] = {}
    for stage_id, _ in backend.order:
        st = physical.stage(stage_id)
        for inp in st.inputs:
            assert finished.get(inp.stage, 0) == physical.stage(inp.stage).num_tasks
        finished[stage_id] = finished.get(stage_id, 0) + 1


def test_a_failed_task_names_stage_and_partition_and_cancels_the_rest():
    plan, _ = _plan()
    physical = plan_physical(plan, Config(runner="local", target_partition_bytes=800))
    backend = FakeBackend(0, fail=(0, 2))
    loop = DispatchLoop(physical, backend, max_in_flight=50)
    with pytest.raises(TaskError, match=r"stage 0 .*partition 2: ValueError: injected"):
        loop.run()
    assert not loop.in_flight
    assert backend.pending == {}


class StuckBackend(FakeBackend):
    """Tasks never finish until cancelled; then they are done (as a cancelled Ray task's
    reference is)."""

    def wait(self, handles: Sequence[int], timeout: float | None = None) -> list[int]:
        assert timeout is not None, "a loop with a cancel token must wait with a timeout"
        done = [h for h in handles if h in self.cancelled]
        if not done:
            time.sleep(timeout)
        return done


def test_a_cancel_token_set_from_another_thread_stops_the_loop():
    plan, _ = _plan()
    physical = plan_physical(plan, Config(runner="local", target_partition_bytes=800))
    backend = StuckBackend(0)
    token = CancelToken()
    loop = DispatchLoop(physical, backend, max_in_flight=3, cancel=token)
    threading.Timer(0.2, token.cancel).start()
    with pytest.raises(QueryCancelledError):
        loop.run()
    assert sorted(backend.cancelled) == [1, 2, 3]  # every task in flight, nothing more
    assert not loop.in_flight and backend.pending == {}
