"""The dispatch loop shared by every runner.

One loop drives a physical plan to completion over a :class:`Backend` (the local thread
pool, Ray, or a fake in tests):

1. :meth:`DispatchLoop._construct_dispatch_batch` pulls runnable tasks from the plan (the
   only place that iterates over it) and says whether more will follow;
2. the batch is dispatched within the limit on tasks in flight;
3. :meth:`DispatchLoop._await_tasks` waits for any one task, then collects every other
   task already done.

A stage is runnable when every stage it reads from has finished. Task outputs stay where
the backend keeps them (object references on Ray); the loop only moves references.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from shoal.errors import task_error
from shoal.execution.kernel import TaskStats, choose_boundaries
from shoal.execution.task import OutputSpec, RangeOutput, ScanInput
from shoal.ir.nodes import PlanNode
from shoal.ir.types import Schema
from shoal.planner.physical import PhysicalPlan, Stage
from shoal.tracing.tracer import NO_SPAN, QueryTracer


@dataclass
class TaskSpec:
    """One task: ``stage`` run on ``partition``; ``inputs[i]`` are references to the tables
    of stage input ``i`` (backend-specific references, in partition order)."""

    stage: Stage
    partition: int
    inputs: list[list[Any]]
    scan: ScanInput | None
    output: OutputSpec
    config: Any = None
    config_digest: str = ""
    max_retries: int = 0
    #: The actor pool that runs this task (a stage of a stateful or GPU UDF), else None;
    #: backends send such a task to the pool instead of starting a task.
    pool: Any = None

    @property
    def fragment(self) -> PlanNode:
        return self.stage.fragment

    @property
    def input_schemas(self) -> list[Schema]:
        return [i.schema for i in self.stage.inputs]


@dataclass
class TaskResult:
    """A finished task: its stats and one reference per output table."""

    spec: TaskSpec
    stats: TaskStats
    outputs: list[Any]


class Backend(Protocol):
    """Where tasks run. References returned by ``submit`` are opaque to the loop."""

    def begin_query(self, config: Any) -> Any:
        """Make the query's config snapshot available to its tasks; return the handle that
        every task of the query carries (the Ray runner: one ``ray.put``)."""

    def submit(self, task: TaskSpec) -> Any:
        """Start ``task``; return a handle."""

    def wait(self, handles: Sequence[Any]) -> list[Any]:
        """Block until at least one handle is done; return every done handle."""

    def result(self, handle: Any) -> TaskResult:
        """The result of a done handle; raises the task's error."""

    def fetch(self, refs: Sequence[Any]) -> list[pa.Table]:
        """Tables behind output references."""

    def cancel(self, handles: Sequence[Any]) -> None:
        """Cancel unfinished tasks (best effort)."""


@dataclass
class _StageState:
    stage: Stage
    next_partition: int = 0
    done: int = 0
    outputs: dict[int, list[Any]] = field(default_factory=dict)
    stats: dict[int, TaskStats] = field(default_factory=dict)
    output: OutputSpec | None = None
    #: Partitions to run again (their actor died), and how often each was re-sent.
    retry: list[int] = field(default_factory=list)
    resent: dict[int, int] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.done == self.stage.num_tasks

    @property
    def undispatched(self) -> int:
        return self.stage.num_tasks - self.next_partition + len(self.retry)


class DispatchLoop:
    """Runs a :class:`PhysicalPlan` on a :class:`Backend`.

    ``max_in_flight`` bounds the tasks submitted and not yet finished. ``config`` is the
    query's snapshot: the backend publishes it once and every task installs it. After
    :meth:`run`,
    ``task_stats`` holds every task's stats by (stage id, partition). ``tracer`` is the
    query's :class:`~shoal.tracing.QueryTracer`, or None when tracing is off: then the
    loop only tests ``tracer`` and calls nothing of tracing.

    ``pools`` maps a stage id to the actor pool (:mod:`shoal.runners.actor_pool`) that runs
    that stage's tasks. The loop dispatches a pool stage's tasks only to free actors
    (``pool.capacity(backlog)``, which also starts the pool before the stage's first task
    and grows it), closes a pool as soon as its stage has finished, and closes every pool
    when the run ends, also on failure and on ``KeyboardInterrupt``.
    """

    def __init__(
        self,
        plan: PhysicalPlan,
        backend: Backend,
        max_in_flight: int,
        config: Any = None,
        tracer: QueryTracer | None = None,
        pools: dict[int, Any] | None = None,
    ) -> None:
        self.plan = plan
        self.config_digest = config.digest() if config is not None else ""
        self.max_retries = config.task_max_retries if config is not None else 0
        self.config_handle = backend.begin_query(config) if config is not None else None
        self.backend = backend
        self.max_in_flight = max(1, max_in_flight)
        self.states = [_StageState(s) for s in plan.stages]
        self.in_flight: dict[Any, TaskSpec] = {}
        self.task_stats: dict[tuple[int, int], TaskStats] = {}
        self.tracer = tracer
        self.pools: dict[int, Any] = dict(pools or {})

    # -- the three steps ----------------------------------------------------------------

    def _construct_dispatch_batch(self) -> tuple[list[TaskSpec], bool]:
        """Runnable tasks, up to the free slots; and whether any task remains undispatched."""
        free = self.max_in_flight - len(self.in_flight)
        batch: list[TaskSpec] = []
        has_next = False
        for st in self.states:
            if not st.undispatched:
                continue
            has_next = True
            if free <= 0 or not self._ready(st):
                continue
            if st.output is None:
                st.output = self._resolve_output(st)
            room = free
            pool = self.pools.get(st.stage.id)
            if pool is not None:  # only as many tasks as the pool has free actors
                room = min(free, pool.capacity(st.undispatched))
            while room > 0 and st.retry:
                batch.append(self._task(st, st.retry.pop(0)))
                free -= 1
                room -= 1
            while room > 0 and st.next_partition < st.stage.num_tasks:
                batch.append(self._task(st, st.next_partition))
                st.next_partition += 1
                free -= 1
                room -= 1
        has_next = any(s.undispatched for s in self.states)
        return batch, has_next

    def _dispatch(self, batch: list[TaskSpec]) -> None:
        tracer = self.tracer
        for task in batch:
            if tracer is not None:
                tracer.task_dispatched(task)
            self.in_flight[self.backend.submit(task)] = task

    def _await_tasks(self) -> list[TaskResult]:
        done = self.backend.wait(list(self.in_flight))
        results = []
        for handle in done:
            spec = self.in_flight.pop(handle)
            try:
                res = self.backend.result(handle)
            except BaseException as exc:
                if self._resend_after_actor_loss(spec, handle, exc):
                    continue
                if self.tracer is not None:
                    self.tracer.task_failed(spec, exc)
                self.backend.cancel(list(self.in_flight))
                self.in_flight.clear()
                if isinstance(exc, KeyboardInterrupt):
                    raise
                retried = (
                    f" (after up to {spec.max_retries} retries on worker or object loss)"
                    if spec.max_retries
                    else ""
                )
                raise task_error(
                    f"task failed in stage {spec.stage.id} [{spec.stage.name}], partition "
                    f"{spec.partition}{retried}: {type(exc).__name__}: {exc}",
                    exc,
                ) from exc
            st = self.states[spec.stage.id]
            st.outputs[spec.partition] = res.outputs
            st.stats[spec.partition] = res.stats
            st.done += 1
            if st.finished and spec.pool is not None:
                spec.pool.close()  # its stage is done: give the actors' resources back
            self.task_stats[(spec.stage.id, spec.partition)] = res.stats
            if self.tracer is not None:
                self.tracer.task_finished(spec, res.stats)
            results.append(res)
        return results

    # -- driving ------------------------------------------------------------------------

    def run(self) -> list[Any]:
        """Run every task; return the root stage's output references in partition order."""
        return list(self.stream())

    def stream(self) -> Iterator[Any]:
        """Run every task, yielding the root stage's output references in partition order,
        each as soon as it and the partitions before it have finished. Closing the
        generator early cancels the query's tasks and tears down its actor pools."""
        tracer = self.tracer  # None when tracing is off: each step then tests it only
        root = self.states[-1]
        emitted = 0
        try:
            while True:
                with tracer.span("construct dispatch batch") if tracer else NO_SPAN as span:
                    batch, has_next = self._construct_dispatch_batch()
                    span.set(tasks=len(batch), has_next=has_next)
                if batch:
                    with tracer.span("dispatch") if tracer else NO_SPAN as span:
                        self._dispatch(batch)
                        span.set(tasks=len(batch), in_flight=len(self.in_flight))
                if not self.in_flight:
                    if has_next:  # pragma: no cover - a plan whose inputs never finish
                        raise RuntimeError("dispatch loop stalled: no task can run")
                    break
                with tracer.span("await") if tracer else NO_SPAN as span:
                    done = self._await_tasks()
                    span.set(tasks=len(done), in_flight=len(self.in_flight))
                while emitted < root.stage.num_tasks and emitted in root.outputs:
                    yield root.outputs[emitted][0]
                    emitted += 1
        except BaseException:
            if self.in_flight:
                self.backend.cancel(list(self.in_flight))
                self.in_flight.clear()
            raise
        finally:
            self.close_pools()
        while emitted < root.stage.num_tasks:
            yield root.outputs[emitted][0]
            emitted += 1

    def _resend_after_actor_loss(self, spec: TaskSpec, handle: Any, exc: BaseException) -> bool:
        """When the actor that held a pool task died, the pool replaces it and the task's
        partition is queued to be sent again (its outputs were never recorded, so no row is
        lost or doubled), up to ``task_max_retries`` times per partition."""
        pool = spec.pool
        if pool is None or not hasattr(pool, "replace_lost"):
            return False
        st = self.states[spec.stage.id]
        if st.resent.get(spec.partition, 0) >= self.max_retries:
            return False
        if not pool.replace_lost(handle, exc):
            return False
        st.resent[spec.partition] = st.resent.get(spec.partition, 0) + 1
        st.retry.append(spec.partition)
        return True

    def close_pools(self) -> None:
        """Tear down every actor pool of the query (idempotent)."""
        for pool in self.pools.values():
            pool.close()

    # -- helpers ------------------------------------------------------------------------

    def _ready(self, st: _StageState) -> bool:
        deps = [d for i in st.stage.inputs for d in i.stages]
        if st.stage.boundaries_from is not None:
            deps.append(st.stage.boundaries_from)
        return all(self.states[d].finished for d in deps)

    def _resolve_output(self, st: _StageState) -> OutputSpec:
        out = st.stage.output
        if isinstance(out, RangeOutput) and out.boundaries is None:
            src = self.states[st.stage.boundaries_from]  # type: ignore[index]
            samples = [s.sample for s in src.stats.values() if s.sample is not None]
            bounds = choose_boundaries(samples, out.descending, out.nulls_last, out.n)
            return RangeOutput(out.by, out.descending, out.nulls_last, out.n, bounds)
        return out

    def _task(self, st: _StageState, partition: int) -> TaskSpec:
        inputs: list[list[Any]] = []
        for spec in st.stage.inputs:
            up = self.states[spec.stage]
            n_up = up.stage.num_tasks
            if spec.mode == "concat":
                flat = [(s, p) for s in spec.stages for p in range(self.states[s].stage.num_tasks)]
                s_id, p_id = flat[partition]
                inputs.append([self.states[s_id].outputs[p_id][0]])
            elif spec.mode == "pointwise":
                inputs.append([up.outputs[partition][0]])
            elif spec.mode == "bucket":
                inputs.append([up.outputs[i][partition] for i in range(n_up)])
            else:
                inputs.append([up.outputs[i][0] for i in range(n_up)])
        scan = st.stage.scan_partitions[partition] if st.stage.scan_partitions else None
        assert st.output is not None
        pool = self.pools.get(st.stage.id)  # an actor pool's tasks are not retried
        return TaskSpec(
            st.stage,
            partition,
            inputs,
            scan,
            st.output,
            self.config_handle,
            self.config_digest,
            0 if pool else self.max_retries,
            pool,
        )
