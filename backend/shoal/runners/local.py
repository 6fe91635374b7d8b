"""The local runner: tasks in an in-process thread pool, no Ray (tests, small data).

Stages of stateful or GPU user functions run on worker processes instead (one actor pool
per such stage, :class:`shoal.runners.actor_pool.LocalProcessPool`); ``resources`` is the
ledger of CPUs, memory and GPU devices those processes hold.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
from collections.abc import Sequence
from typing import Any

import polars as pl
import pyarrow as pa

from shoal.config import Config, task_config
from shoal.execution.kernel import KeptFrame, run_fragment
from shoal.resources import ResourceLedger, local_ledger
from shoal.runners.dispatch import TaskResult, TaskSpec


class LocalBackend:
    """Runs tasks on a thread pool of ``num_threads`` threads; output references are the
    Arrow tables themselves. Polars releases the GIL while it works."""

    #: Threads do not die alone and outputs are never lost: nothing is run again.
    retries_lost_tasks = False

    def __init__(
        self,
        num_threads: int | None = None,
        resources: ResourceLedger | None = None,
        keep_frames: bool = False,
    ) -> None:
        self.num_threads = num_threads or os.cpu_count() or 1
        #: A task's single output stays the Polars frame it computed (a
        #: :class:`~shoal.execution.kernel.KeptFrame`): the driver's small-query backend,
        #: whose one task's output is the query's result. :meth:`fetch` still gives Arrow
        #: tables; :meth:`fetch_frames` gives the frames.
        self.keep_frames = keep_frames
        self._pool = cf.ThreadPoolExecutor(self.num_threads, thread_name_prefix="shoal-task")
        self.resources = resources or local_ledger(num_threads, None)

    def begin_query(self, config: Config) -> Config:
        """The local runner passes the snapshot object itself to its tasks."""
        return config

    def submit(self, task: TaskSpec) -> cf.Future[TaskResult]:
        if task.pool is not None:  # a stage of a stateful or GPU UDF: its worker processes
            return task.pool.submit(task)  # type: ignore[no-any-return]
        return self._pool.submit(_run, task, self.keep_frames)

    def wait(
        self, handles: Sequence[cf.Future[TaskResult]], timeout: float | None = None
    ) -> list[cf.Future[TaskResult]]:
        done, _ = cf.wait(handles, timeout=timeout, return_when=cf.FIRST_COMPLETED)
        return [h for h in handles if h in done or h.done()]

    def result(self, handle: cf.Future[TaskResult]) -> TaskResult:
        return handle.result()

    def fetch(self, refs: Sequence[Any]) -> list[pa.Table]:
        return [r.table() if isinstance(r, KeptFrame) else r for r in refs]

    def fetch_frames(self, refs: Sequence[Any]) -> list[pa.Table | pl.DataFrame]:
        """Like :meth:`fetch`, but an output kept as a Polars frame (``keep_frames``) is
        that frame."""
        return [r.frame if isinstance(r, KeptFrame) else r for r in refs]

    def cancel(self, handles: Sequence[cf.Future[TaskResult]]) -> None:
        for h in handles:
            h.cancel()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _run(task: TaskSpec, keep_frames: bool = False) -> TaskResult:
    args = (task.fragment, task.inputs, task.scan, task.output, task.input_schemas)
    native = task.stage.native  # set only for a stage run in this process
    if task.config is None:
        stats, tables = run_fragment(*args, keep_frame=keep_frames, native=native)
    else:
        with task_config(task.config, task.config_digest):
            stats, tables = run_fragment(*args, keep_frame=keep_frames, native=native)
    return TaskResult(task, stats, tables)
