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

Memory (see :mod:`shoal.runners.memory` and :mod:`shoal.runners.skew`): the loop keeps a
ledger of the bytes of task outputs the query holds, from each task's per-output sizes.
An output is released, and the loop drops its references so that Ray can free it, when
its last reader finishes. While the held bytes (plus an estimate for the tasks in flight)
are over ``max_bytes_held``, the loop starts no task that only adds bytes (a scan, a task
that reads its inputs whole); tasks that read and so release outputs still start, and when
nothing is in flight and nothing else can run, one task starts anyway, so the query always
makes progress. A hash-join task whose input exceeds ``max_task_input_bytes`` is split
into subtasks where that is exact; their outputs, in order, are the partition's output.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import pyarrow as pa

from shoal import config as _config
from shoal.errors import QueryCancelledError, task_error
from shoal.execution.kernel import TaskStats, choose_boundaries, merge_profile
from shoal.ir.nodes import PlanNode
from shoal.ir.types import Schema
from shoal.planner.physical import OutputSpec, PhysicalPlan, RangeOutput, ScanInput, Stage
from shoal.runners import adaptive as adapt
from shoal.runners.memory import ByteLedger, MemoryReport, PieceKey, readers
from shoal.runners.profile import size_text
from shoal.runners.skew import group_pieces, split_sides
from shoal.tracing.tracer import NO_SPAN, QueryTracer

_log = logging.getLogger("shoal")

#: Seconds between checks of a :class:`CancelToken` while the loop waits for tasks.
CANCEL_POLL_S = 0.05
#: Seconds a cancelled query waits at most for its cancelled tasks to stop.
CANCEL_SETTLE_S = 15.0


class CancelToken:
    """Cancels a running query from any thread: :meth:`cancel` sets it; the dispatch loop
    that holds it notices within :data:`CANCEL_POLL_S` seconds (it then waits for tasks
    with that timeout), cancels every task in flight, tears down the query's actor pools,
    waits (up to :data:`CANCEL_SETTLE_S` seconds) until the cancelled tasks have stopped,
    and raises :class:`shoal.QueryCancelledError`."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        """Ask the query to stop (idempotent; returns at once)."""
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


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
    #: A partition split because its input was too large runs as ``subtasks`` tasks;
    #: this one is number ``subtask`` (0-based). Unsplit: 0 of 1.
    subtask: int = 0
    subtasks: int = 1
    #: The output pieces (stage, partition, output index) this task reads, for the ledger.
    reads: tuple[PieceKey, ...] = ()
    #: A dict the backend may keep per-stage shipping state in (the same object for every
    #: task of the stage, for the query's life; e.g. the Ray runner's pickled fragment).
    ship_cache: dict[str, Any] | None = None
    #: Dispatched before every stage it reads had finished (its inputs are the producing
    #: tasks' future output references; see :meth:`DispatchLoop._early`).
    early: bool = False
    #: Stage inputs over which the fragment certainly gives no rows when they are empty
    #: (:func:`shoal.runners.adaptive.empty_output`): a task started early that finds one
    #: empty returns empty outputs without scanning (what the loop's skip of a stage over
    #: an empty input does for a stage started after its inputs).
    empty_if: tuple[int, ...] = ()

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

    def wait(self, handles: Sequence[Any], timeout: float | None = None) -> list[Any]:
        """Block until at least one handle is done (or ``timeout`` seconds have passed,
        when not None: then possibly none); return every done handle."""

    def result(self, handle: Any) -> TaskResult:
        """The result of a done handle; raises the task's error."""

    def fetch(self, refs: Sequence[Any]) -> list[pa.Table]:
        """Tables behind output references."""

    def cancel(self, handles: Sequence[Any]) -> None:
        """Cancel unfinished tasks (best effort)."""

    # Optional: ``pending_outputs(handle) -> list[Any]``, the output references of a task
    # not yet finished, which other tasks may be given as inputs (the backend starts such a
    # task once they exist: Ray resolves task dependencies). A backend with it lets the
    # loop start stages before their inputs finish (:meth:`DispatchLoop._early`).


@dataclass
class _StageState:
    stage: Stage
    next_partition: int = 0
    done: int = 0
    #: Per finished partition, per output index: the references of its tables, in order
    #: (several when the partition ran as subtasks; emptied once the output is released).
    outputs: dict[int, list[list[Any]]] = field(default_factory=dict)
    stats: dict[int, TaskStats] = field(default_factory=dict)
    output: OutputSpec | None = None
    #: Partitions to run again (their actor died), and how often each was re-sent.
    retry: list[int] = field(default_factory=list)
    resent: dict[int, int] = field(default_factory=dict)
    #: Split partitions: partition -> (stage input split, groups of its upstream pieces);
    #: subtasks not yet dispatched; finished subtasks' results by partition.
    splits: dict[int, tuple[int, list[list[int]]]] = field(default_factory=dict)
    queued: list[tuple[int, int]] = field(default_factory=list)
    parts: dict[int, dict[int, TaskResult]] = field(default_factory=dict)
    #: Adaptive execution: the buckets task ``p`` reads (``buckets[p]``), when they are not
    #: one per task as planned (coalesced or skipped; see :mod:`shoal.runners.adaptive`).
    buckets: list[list[int]] | None = None
    #: Re-planned already (a stage that took its sampled stage's fragment and buckets).
    adapted: bool = False
    #: The backend's per-stage shipping state (:attr:`TaskSpec.ship_cache`).
    ship_cache: dict[str, Any] = field(default_factory=dict)
    #: Per partition in flight: the future references of its outputs (backends that
    #: resolve task dependencies themselves), until the partition is recorded.
    future: dict[int, list[Any]] = field(default_factory=dict)
    #: Started before its inputs had finished (:meth:`DispatchLoop._early`); the stage
    #: inputs that make its output empty when empty; its tasks that found one empty.
    early: bool = False
    empty_if: tuple[int, ...] = ()
    empty_tasks: int = 0

    @property
    def finished(self) -> bool:
        return self.done == self.stage.num_tasks

    @property
    def undispatched(self) -> int:
        return self.stage.num_tasks - self.next_partition + len(self.retry) + len(self.queued)

    @property
    def releases(self) -> bool:
        """Whether each task of the stage is the last reader of its inputs (so finishing
        it releases bytes): it reads pointwise, by bucket or concatenated, or it is the
        single task of a gather."""
        ins = self.stage.inputs
        return any(i.mode != "all" for i in ins) or (bool(ins) and self.stage.num_tasks == 1)

    def estimate(self) -> int:
        """Expected output bytes of one task: the mean of its finished tasks, else the
        planner's estimate for the stage."""
        if self.stats:
            return sum(s.bytes_out for s in self.stats.values()) // len(self.stats)
        return self.stage.est_bytes // max(1, self.stage.num_tasks)


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

    ``max_bytes_held`` (bytes; None: no limit) is the backpressure limit on the bytes of
    task outputs the query holds; ``max_task_input_bytes`` (bytes; None: never) the input
    size above which a hash-join task is split into subtasks (see the module docstring).
    ``ledger`` holds the bytes; :meth:`memory_report` says what both controls did. A split
    partition's stats in ``task_stats`` are its subtasks' merged (``extra["subtasks"]``);
    each subtask's own stats are in ``subtask_stats`` by (stage id, partition, subtask).
    ``cancel`` is a :class:`CancelToken` that another thread may set to cancel the query
    (None: the loop waits for tasks without a timeout, as before).
    """

    def __init__(
        self,
        plan: PhysicalPlan,
        backend: Backend,
        max_in_flight: int,
        config: Any = None,
        tracer: QueryTracer | None = None,
        pools: dict[int, Any] | None = None,
        max_bytes_held: int | None = None,
        max_task_input_bytes: int | None = None,
        cancel: CancelToken | None = None,
        adaptive: bool = False,
        coalesce_bytes: int | None = None,
    ) -> None:
        self.plan = plan
        #: Tasks cancelled because another task of the query failed.
        self._stopped_by_failure: list[Any] = []
        # The config's hash plus the driver's software versions: every task checks both.
        self.config_digest = _config.query_digest(config) if config is not None else ""
        self.max_retries = config.task_max_retries if config is not None else 0
        self.config_handle = backend.begin_query(config) if config is not None else None
        self.backend = backend
        self.max_in_flight = max(1, max_in_flight)
        self.states = [_StageState(s) for s in plan.stages]
        self.in_flight: dict[Any, TaskSpec] = {}
        self.task_stats: dict[tuple[int, int], TaskStats] = {}
        self.tracer = tracer
        self.pools: dict[int, Any] = dict(pools or {})
        self.ledger = ByteLedger(max_bytes_held or None)
        self.max_task_input_bytes = max_task_input_bytes or None
        self.readers = {s.id: readers(plan, s.id) for s in plan.stages}
        self.subtask_stats: dict[tuple[int, int, int], TaskStats] = {}
        self._memory = MemoryReport(self.ledger.limit, 0)
        #: Expected output bytes of each task in flight (backpressure counts them as held).
        self._reserved: dict[Any, int] = {}
        self.cancel = cancel
        #: Set once :meth:`stream` has run every task: pools may then be parked.
        self._completed = False
        #: Adaptive execution (:mod:`shoal.runners.adaptive`): on or off; the most bytes of
        #: shuffle buckets one task reads when coalescing (None: no coalescing); what it
        #: changed, one line per stage (``adaptations``).
        self.adaptive = adaptive
        self.coalesce_bytes = coalesce_bytes
        self.adaptations: list[str] = []
        #: Hash joins that may turn into broadcast joins (by join stage id), and the probe
        #: stages held back until their build side has finished (probe id -> build id).
        threshold = config.broadcast_join_threshold_bytes if config is not None else 0
        self.broadcast_bytes = threshold if adaptive else 0
        self._switches: dict[int, adapt.BroadcastSwitch] = {}
        if self.broadcast_bytes:
            self._switches = {sw.join: sw for sw in adapt.broadcast_switches(plan)}
        self._held = {sw.probe: sw.build for sw in self._switches.values()}
        #: One-task stages held back until the other inputs of the stage that reads them
        #: have finished, so that it may run them (:meth:`_fuse_gather`): stage -> reader.
        self._fuse_wait: dict[int, int] = {}
        #: Called with a stage's id when its last task has been recorded (None: nothing);
        #: the session's profiling samples Ray's spill counters here.
        self.on_stage_done: Any = None
        #: The backend can give a task the outputs of tasks not yet finished.
        self.early_start = callable(getattr(backend, "pending_outputs", None))

    # -- the three steps ----------------------------------------------------------------

    def _construct_dispatch_batch(self) -> tuple[list[TaskSpec], bool]:
        """Runnable tasks, up to the free slots; and whether any task remains undispatched."""
        free = self.max_in_flight - len(self.in_flight)
        batch: list[TaskSpec] = []
        reserved = sum(self._reserved.values())
        first_ready: _StageState | None = None
        if self._switches:
            self._decide_switches()
        # Stages whose inputs have finished first, then (with the slots left) stages that
        # may start before their inputs finish (:meth:`_early`). Asked lazily: adapting
        # one stage may make a later one runnable (a sort fused with its sampled stage).
        for st in self._candidates():
            if free <= 0:
                break
            if st.stage.id in self._held:  # its hash join may become a broadcast join
                continue
            if st.output is None:
                if self.adaptive and not st.adapted:
                    self._adapt(st)
                    if not st.undispatched:  # it runs no task
                        continue
                if st.stage.id in self._fuse_wait and not self._fuse_when_ready(st):
                    continue
                st.output = self._resolve_output(st)
                self._plan_splits(st)
                if not self._ready(st):
                    self._start_early(st)
            first_ready = first_ready or st
            room = free
            pool = self.pools.get(st.stage.id)
            if pool is not None:  # only as many tasks as the pool has free actors
                room = min(free, pool.capacity(st.undispatched))
            while room > 0 and st.undispatched:
                if not st.releases and self._over(reserved):
                    self._memory.held_back += 1  # backpressure: it would only add bytes
                    break
                batch.append(self._next_task(st))
                reserved += st.estimate()
                free -= 1
                room -= 1
        if not batch and not self.in_flight and first_ready is not None:
            # Over the limit and nothing can release bytes: one task, so the query moves.
            self._memory.forced += 1
            batch.append(self._next_task(first_ready))
        has_next = any(s.undispatched for s in self.states)
        return batch, has_next

    def _candidates(self) -> Iterator[_StageState]:
        """Stages with tasks to dispatch: those whose inputs have finished, then those
        that may start before (:meth:`_early`), each in plan order."""
        for st in self.states:
            if st.undispatched and self._ready(st):
                yield st
        if self.early_start:
            for st in self.states:
                if st.undispatched and not self._ready(st) and self._early(st):
                    yield st

    def _over(self, reserved: int) -> bool:
        """Whether the held bytes plus ``reserved`` (tasks in flight or just batched)
        reach ``max_bytes_held``."""
        limit = self.ledger.limit
        return limit is not None and self.ledger.held + reserved >= limit

    def _next_task(self, st: _StageState) -> TaskSpec:
        """The stage's next task: a partition to re-send, a queued subtask, or the next
        partition (queueing the other subtasks when it is split)."""
        if st.retry:
            return self._task(st, st.retry.pop(0))
        if st.queued:
            return self._task(st, *st.queued.pop(0))
        p = st.next_partition
        st.next_partition += 1
        split = st.splits.get(p)
        if split is not None:
            st.queued.extend((p, k) for k in range(1, len(split[1])))
        return self._task(st, p)

    def _dispatch(self, batch: list[TaskSpec]) -> None:
        tracer = self.tracer
        for task in batch:
            if tracer is not None:
                tracer.task_dispatched(task)
            handle = self.backend.submit(task)
            self.in_flight[handle] = task
            st = self.states[task.stage.id]
            self._reserved[handle] = st.estimate()
            if self.early_start and task.subtasks == 1 and task.pool is None:
                st.future[task.partition] = self.backend.pending_outputs(handle)  # type: ignore[attr-defined]

    def _wait(self) -> list[Any]:
        handles = list(self.in_flight)
        if self.cancel is None:
            return self.backend.wait(handles)
        while True:
            self._check_cancel()
            done = self.backend.wait(handles, timeout=CANCEL_POLL_S)
            if done:
                return done

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise QueryCancelledError("the query was cancelled")

    def _await_tasks(self) -> list[TaskResult]:
        done = self._wait()
        if self.early_start:
            done = self._with_producers(done)
        results = []
        for handle in done:
            spec = self.in_flight.pop(handle)
            self._reserved.pop(handle, None)
            try:
                res = self.backend.result(handle)
            except BaseException as exc:
                if self._resend_after_actor_loss(spec, handle, exc):
                    continue
                if self.tracer is not None:
                    self.tracer.task_failed(spec, exc)
                self._stopped_by_failure = list(self.in_flight)
                self.backend.cancel(self._stopped_by_failure)
                self.in_flight.clear()
                self._reserved.clear()
                if isinstance(exc, KeyboardInterrupt):
                    raise
                retried = (
                    f" (after up to {spec.max_retries} retries on worker or object loss)"
                    if spec.max_retries and getattr(self.backend, "retries_lost_tasks", False)
                    else ""
                )
                raise task_error(
                    f"task failed in stage {spec.stage.id} [{spec.stage.name}], partition "
                    f"{spec.partition}{retried}: {type(exc).__name__}: {exc}",
                    exc,
                ) from exc
            st = self.states[spec.stage.id]
            self._record(st, spec, res)
            if st.finished and spec.pool is not None:
                spec.pool.finish()  # its stage is done: give the actors' resources back
            if self.tracer is not None:
                self.tracer.task_finished(spec, res.stats)
                self.tracer.counter("bytes held", self.ledger.held)
            results.append(res)
        return results

    def _record(self, st: _StageState, spec: TaskSpec, res: TaskResult) -> None:
        """Account a finished task: release the pieces it read, hold the ones it made, and
        record its partition's outputs once the partition (all its subtasks) is done."""
        for key in spec.reads:
            if self.ledger.read(key):
                s, p, o = key
                self.states[s].outputs[p][o] = []  # drop the references: Ray may free it
        sid, p = spec.stage.id, spec.partition
        if spec.subtasks == 1:
            st.future.pop(p, None)
        if res.stats.extra.get("empty_input"):
            st.empty_tasks += 1
        sizes = res.stats.output_bytes or (0,) * len(res.outputs)
        for o, nbytes in enumerate(sizes):
            self.ledger.produced((sid, p, o), nbytes, self.readers[sid])
        self._memory.peak_bytes_held = self.ledger.peak
        if spec.subtasks == 1:
            st.outputs[p] = [[r] for r in res.outputs]
            stats = res.stats
        else:
            self.subtask_stats[(sid, p, spec.subtask)] = res.stats
            parts = st.parts.setdefault(p, {})
            parts[spec.subtask] = res
            if len(parts) < spec.subtasks:
                return
            ordered = [parts[k] for k in range(spec.subtasks)]
            del st.parts[p]
            st.outputs[p] = [[r.outputs[o] for r in ordered] for o in range(len(res.outputs))]
            stats = merge_stats([r.stats for r in ordered])
        st.stats[p] = stats
        st.done += 1
        self.task_stats[(sid, p)] = stats
        if st.finished and st.empty_tasks:
            self._note(
                f"stage {sid} [{st.stage.name}]: started before its inputs finished; "
                f"{st.empty_tasks} of its {st.stage.num_tasks} task(s) found an input empty "
                "and gave no rows without running (nothing scanned)"
            )
        if st.finished and self.on_stage_done is not None:
            self.on_stage_done(sid)

    def memory_report(self) -> MemoryReport:
        """What backpressure and task splitting did in this run."""
        self._memory.peak_bytes_held = self.ledger.peak
        return self._memory

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
        completed = False
        idle_passes = 0
        try:
            while True:
                self._check_cancel()
                while True:
                    with tracer.span("construct dispatch batch") if tracer else NO_SPAN as span:
                        batch, has_next = self._construct_dispatch_batch()
                        span.set(tasks=len(batch), has_next=has_next)
                    if batch:
                        with tracer.span("dispatch") if tracer else NO_SPAN as span:
                            self._dispatch(batch)
                            span.set(tasks=len(batch), in_flight=len(self.in_flight))
                    # A stage whose tasks are now all dispatched may be followed at once
                    # by the stages that read it whole (_early): asked again while slots
                    # are free.
                    if not (batch and self.early_start and has_next):
                        break
                    if len(self.in_flight) >= self.max_in_flight or all(
                        self.states[t.stage.id].undispatched for t in batch
                    ):
                        break
                if not self.in_flight:
                    if not has_next:
                        break
                    # A pass may leave work that only the next pass sees: a stage skipped
                    # late in a pass (its input empty) finishes a stage that a held one
                    # waits for (_fuse_wait), or the build side of a broadcast switch
                    # (decided at the start of a pass). Passes that dispatch nothing
                    # while nothing runs: at most one per stage, then it is a stall.
                    idle_passes += 1
                    if idle_passes > len(self.states):
                        raise RuntimeError("dispatch loop stalled: no task can run")
                    continue
                idle_passes = 0
                with tracer.span("await") if tracer else NO_SPAN as span:
                    done = self._await_tasks()
                    span.set(tasks=len(done), in_flight=len(self.in_flight))
                while emitted < root.stage.num_tasks and emitted in root.outputs:
                    yield from self._hand_over(emitted)
                    emitted += 1
            completed = True
        except BaseException as exc:
            running = list(self.in_flight)
            stopped = running + self._stopped_by_failure  # (the latter already cancelled)
            if running:
                self.backend.cancel(running)
                self.in_flight.clear()
                self._reserved.clear()
            # A cancelled query, and one that writes files (its staged files are removed
            # once the loop returns), wait until no task of theirs still runs.
            if isinstance(exc, QueryCancelledError) or self._writes_files():
                self.close_pools()  # ends the pools' tasks too
                self._settle(stopped)
            raise
        finally:
            self._completed = completed
            self.close_pools()
        while emitted < root.stage.num_tasks:
            yield from self._hand_over(emitted)
            emitted += 1

    def _hand_over(self, partition: int) -> list[Any]:
        """The root's output references of ``partition``, released from the ledger: the
        caller holds them now."""
        root = self.states[-1]
        refs = root.outputs[partition][0]
        root.outputs[partition][0] = []
        self.ledger.read((root.stage.id, partition, 0))
        if self.tracer is not None:
            self.tracer.counter("bytes held", self.ledger.held)
        return refs

    def take_outputs(self, stage_id: int) -> list[Any]:
        """After :meth:`run`: the output references of finished result stage ``stage_id``
        (a plan of several queries, ``PhysicalPlan.results``), every partition's in
        order, released from the ledger: the caller holds them now. The root's are what
        :meth:`run` returned."""
        st = self.states[stage_id]
        refs: list[Any] = []
        for p in range(st.stage.num_tasks):
            refs.extend(st.outputs[p][0])
            st.outputs[p][0] = []
            self.ledger.read((stage_id, p, 0))
        return refs

    def resent(self) -> dict[int, int]:
        """Tasks the loop sent again, by stage id (stages that re-sent none left out): a
        pool task whose actor died. Ray's own retries of a task whose worker died or whose
        output was lost (``task_max_retries``) happen inside Ray, unseen here."""
        return {s.stage.id: sum(s.resent.values()) for s in self.states if s.resent}

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

    def _writes_files(self) -> bool:
        """Whether the query's root stage writes files (a sink)."""
        return bool(self.plan.stages) and self.plan.root.operators[:1] == ["Sink"]

    def _settle(self, handles: list[Any]) -> None:
        """Wait until the cancelled ``handles`` are done (at most :data:`CANCEL_SETTLE_S`
        seconds), so that no task of a cancelled query still runs when the loop returns."""
        deadline = time.monotonic() + CANCEL_SETTLE_S
        pending = handles
        while pending and time.monotonic() < deadline:
            done = self.backend.wait(pending, timeout=min(0.1, deadline - time.monotonic()))
            finished = set(done)
            pending = [h for h in pending if h not in finished]

    def close_pools(self) -> None:
        """Tear down every actor pool of the query (idempotent). Once the run has completed,
        a pool whose UDF asks to stay warm is parked for the next query instead
        (``pool.finish()``, see :mod:`shoal.runners.actor_pool`)."""
        for pool in self.pools.values():
            if self._completed:
                pool.finish()
            else:
                pool.close()

    # -- helpers ------------------------------------------------------------------------

    def _ready(self, st: _StageState) -> bool:
        deps = [d for i in st.stage.inputs for d in i.stages]
        if st.stage.boundaries_from is not None:
            deps.append(st.stage.boundaries_from)
        return all(self.states[d].finished for d in deps)

    def _early(self, st: _StageState) -> bool:
        """Whether ``st`` may start before the stages it reads have finished, with their
        tasks' future output references as inputs (the backend starts each task once
        they exist: Ray resolves task dependencies without holding a worker). Only where
        that is exact and adaptive execution could change nothing of it:

        * every input is read whole (a broadcast: ``"all"``), so no task count, bucket
          grouping, coalescing or skew split depends on the inputs' sizes; no range
          boundaries to choose (``boundaries_from``); not a stage held for a broadcast
          switch, nor the stage of an actor pool;
        * every stage it reads is running with all its tasks dispatched (its plan can no
          longer change), none split into subtasks nor run by an actor pool (whose
          calls may be re-sent with other references).

        Skipping a stage over an empty input is the one adaptive change that needs the
        inputs' rows: the tasks of a stage started early do it themselves (``empty_if``:
        a task that finds such an input empty gives empty outputs without running)."""
        stage = st.stage
        if st.early:  # started early: the rest of its tasks may follow
            return True
        if st.output is not None or st.next_partition or not stage.inputs:
            return False
        if stage.boundaries_from is not None or stage.id in self._held:
            return False
        if self.pools.get(stage.id) is not None or any(
            sw.join == stage.id for sw in self._switches.values()
        ):
            return False
        if isinstance(stage.output, RangeOutput) and stage.output.boundaries is None:
            return False
        for spec in stage.inputs:
            if spec.mode != "all":
                return False
            for s in spec.stages:
                up = self.states[s]
                if up.finished:
                    continue
                if up.output is None or up.undispatched or up.splits or up.parts:
                    return False
                if self.pools.get(s) is not None:
                    return False
                if any(
                    p not in up.outputs and p not in up.future for p in range(up.stage.num_tasks)
                ):
                    return False
        return True

    def _start_early(self, st: _StageState) -> None:
        """Mark ``st`` (adapted, its output resolved) as started before its inputs
        finished, with the inputs whose emptiness empties its output."""
        st.early = True
        frag = st.stage.fragment
        st.empty_if = tuple(i for i in range(len(st.stage.inputs)) if adapt.empty_output(frag, {i}))

    def _with_producers(self, done: list[Any]) -> list[Any]:
        """``done`` plus the tasks in flight whose outputs a done early-started task read
        (they finished before it began: the backend only started it once their outputs
        existed), producers first: a task is recorded after the pieces it read."""
        if not any(self.in_flight[h].early for h in done):
            return done
        by_piece = {(t.stage.id, t.partition): h for h, t in self.in_flight.items()}
        got = set(done)
        todo = [h for h in done if self.in_flight[h].early]
        while todo:  # (transitively: a producer may itself have started early)
            for s, p, _ in self.in_flight[todo.pop()].reads:
                h = by_piece.get((s, p))
                if h is not None and h not in got:
                    got.add(h)
                    if self.in_flight[h].early:
                        todo.append(h)
        order = {h: i for i, h in enumerate(self.in_flight)}  # dispatch order
        return sorted(got, key=lambda h: (self.in_flight[h].stage.id, order[h]))

    def _resolve_output(self, st: _StageState) -> OutputSpec:
        out = st.stage.output
        if isinstance(out, RangeOutput) and out.boundaries is None:
            src = self.states[st.stage.boundaries_from]  # type: ignore[index]
            # Each sample weighted by the rows it was drawn from (its task's output rows).
            drawn = [(s.sample, s.rows_out) for s in src.stats.values() if s.sample is not None]
            bounds = choose_boundaries(
                [t for t, _ in drawn],
                out.descending,
                out.nulls_last,
                out.n,
                [rows for _, rows in drawn],
            )
            return RangeOutput(out.by, out.descending, out.nulls_last, out.n, bounds)
        return out

    def _pieces(self, st: _StageState, index: int, partition: int) -> list[PieceKey]:
        """The output pieces that input ``index`` of ``st``'s task ``partition`` reads,
        in order."""
        spec = st.stage.inputs[index]
        n_up = self.states[spec.stage].stage.num_tasks
        if spec.mode == "concat":
            flat = [(s, p) for s in spec.stages for p in range(self.states[s].stage.num_tasks)]
            s_id, p_id = flat[partition]
            return [(s_id, p_id, 0)]
        if spec.mode == "pointwise":
            return [(spec.stage, partition, 0)]
        if spec.mode == "all":  # every output of every task (a broadcast)
            outs = self.states[spec.stage].stage.output.num_outputs
            return [(spec.stage, i, o) for i in range(n_up) for o in range(outs)]
        if spec.mode == "bucket":
            ids = st.buckets[partition] if st.buckets is not None else [partition]
            return [(spec.stage, i, b) for b in ids for i in range(n_up)]
        return [(spec.stage, i, 0) for i in range(n_up)]

    def _plan_splits(self, st: _StageState) -> None:
        """Once ``st`` is runnable (its inputs' sizes known), split each of its bucket-mode
        tasks whose input exceeds ``max_task_input_bytes`` into subtasks, where exact (see
        :mod:`shoal.runners.skew`); report the ones that cannot be split."""
        limit = self.max_task_input_bytes
        if limit is None or not any(i.mode == "bucket" for i in st.stage.inputs):
            return
        sides: Any = None
        sid = st.stage.id
        for p in range(st.stage.num_tasks):
            keys = [self._pieces(st, i, p) for i in range(len(st.stage.inputs))]
            sizes = [[self.ledger.nbytes(k) for k in ks] for ks in keys]
            total = sum(map(sum, sizes))
            if total <= limit:
                continue
            sides = split_sides(st.stage) if sides is None else sides
            if isinstance(sides, str):
                self._not_split(sid, p, total, sides)
                continue
            side = max(sides[1], key=lambda i: sum(sizes[i]))
            groups = group_pieces(sizes[side], limit - (total - sum(sizes[side])))
            if len(groups) < 2:
                self._not_split(sid, p, total, "its rows come from one upstream piece")
                continue
            st.splits[p] = (side, groups)
            for i, ks in enumerate(keys):
                if i != side:  # every subtask reads these pieces whole
                    for k in ks:
                        self.ledger.add_readers(k, len(groups) - 1)
            self._memory.splits[(sid, p)] = len(groups)
            if self.tracer is not None:
                self.tracer.task_split(sid, p, len(groups))

    # -- adaptive execution (see shoal.runners.adaptive) --------------------------------

    def _rows(self, key: PieceKey) -> int | None:
        """Rows of the finished piece ``key`` (None when its task did not say)."""
        s, p, o = key
        stats = self.states[s].stats.get(p)
        if stats is None or not stats.output_rows:
            return None
        return stats.output_rows[o]

    def _input_empty(self, st: _StageState, index: int) -> bool:
        """Whether stage input ``index`` of ``st`` holds no rows at all (every piece that
        any task of the stage reads is known to be empty)."""
        spec = st.stage.inputs[index]
        for s in spec.stages:
            up = self.states[s]
            outs = up.stage.output.num_outputs if spec.mode in ("bucket", "all") else 1
            for p in range(up.stage.num_tasks):
                for o in range(outs):
                    if self._rows((s, p, o)) != 0:
                        return False
        return True

    def _adapt(self, st: _StageState) -> None:
        """Re-plan ``st`` (now runnable: its inputs have finished) from what its inputs
        produced: run no task when its output is certainly empty, skip empty buckets and
        coalesce small ones into fewer tasks (:mod:`shoal.runners.adaptive`)."""
        stage = st.stage
        label = f"stage {stage.id} [{stage.name}]"
        if not stage.num_tasks:
            return
        empty = {i for i in range(len(stage.inputs)) if self._input_empty(st, i)}
        if empty and adapt.empty_output(stage.fragment, empty):
            why = adapt.retask_blocker(self.plan, stage) or adapt.skip_blocker(self.plan, stage)
            ins = ", ".join(f"stage {stage.inputs[i].stage}" for i in sorted(empty))
            if why is None:
                for p in range(stage.num_tasks):  # (broadcast pieces: in _retask)
                    for i, spec in enumerate(stage.inputs):
                        if spec.mode != "all":
                            self._release(self._pieces(st, i, p))
                tasks = stage.num_tasks
                self._retask(stage, 0, f"skipped: its input {ins} is empty")
                self._note(f"{label}: {tasks} task(s) skipped: input from {ins} is empty")
                return
            self._note(f"{label}: input from {ins} is empty, not skipped: {why}")
        if self.coalesce_bytes is not None and self._sort_in_one_task(st):
            return
        bucket_inputs = [i for i, spec in enumerate(stage.inputs) if spec.mode == "bucket"]
        if not bucket_inputs:
            if self.coalesce_bytes is not None:
                self._pointwise_in_one_task(st)
            return
        n = stage.num_tasks
        sizes = [0] * n
        skip = []
        for b in range(n):
            empties = set(empty)
            for i in bucket_inputs:
                keys = self._pieces(st, i, b)
                sizes[b] += sum(self.ledger.nbytes(k) for k in keys)
                if all(self._rows(k) == 0 for k in keys):
                    empties.add(i)
            skip.append(bool(empties) and adapt.empty_output(stage.fragment, empties))
        total = sum(sizes)
        target = None
        if self.coalesce_bytes is not None:
            target = adapt.coalesce_target(total, self.plan.cpus, self.coalesce_bytes)
        groups = adapt.group_buckets(sizes, skip, target, self.plan.cpus)
        if len(groups) == n:
            return  # one bucket per task, as planned
        why = adapt.coalesce_blocker(self.plan, stage)
        if why is not None:
            self._note(f"{label}: {n} buckets not coalesced: {why}")
            return
        skipped = [b for b in range(n) if skip[b]]
        for b in skipped:
            for i in bucket_inputs:
                self._release(self._pieces(st, i, b))
        st.buckets = groups
        what = f"{n} buckets ({size_text(total)}) read by {len(groups)} task(s)"
        if target is not None and len(groups) < n - len(skipped):
            what = (
                f"{n} buckets ({size_text(total)}) coalesced into {len(groups)} task(s) "
                f"(target {size_text(target)} each)"
            )
        if skipped:
            what += f"; {len(skipped)} empty bucket(s) skipped"
        self._retask(stage, len(groups), what)
        self._note(f"{label}: {what}")
        if len(groups) == 1 and self.coalesce_bytes is not None:
            self._fuse_sort(st, total)
            self._fuse_gather(st)

    def _pointwise_in_one_task(self, st: _StageState) -> None:
        """When ``st`` reads one stage pointwise (and others whole) and those partitions
        hold at most :data:`adaptive.MIN_TASK_BYTES` in all, one task reads them all, in
        partition order (:func:`adaptive.pointwise_blocker` says where that is exact); the
        stages that follow its partitions follow. Then, as for coalesced buckets, a reader
        that gathers it may run it (:meth:`_fuse_gather`)."""
        stage = st.stage
        if stage.num_tasks < 2 or self.pools.get(stage.id) is not None:
            return
        found = adapt.pointwise_input(stage)
        if found is None:
            return
        total = sum(
            self.ledger.nbytes(k)
            for p in range(stage.num_tasks)
            for k in self._pieces(st, found, p)
        )
        if total > adapt.MIN_TASK_BYTES:
            return
        label = f"stage {stage.id} [{stage.name}]"
        why = adapt.pointwise_blocker(self.plan, stage)
        if why is not None:
            self._note(f"{label}: {stage.num_tasks} partitions not read by one task: {why}")
            return
        tasks = stage.num_tasks
        what = f"{tasks} partitions ({size_text(total)}) read by 1 task"
        self._retask(stage, 1, what)
        # Then read whole: each piece keeps its one reader (this task).
        spec = stage.inputs[found]
        stage.inputs = tuple(
            replace(spec, mode="all") if i == found else s for i, s in enumerate(stage.inputs)
        )
        self.readers = {s.id: readers(self.plan, s.id) for s in self.plan.stages}
        self._note(f"{label}: {what}")
        self._fuse_gather(st)

    def _sort_in_one_task(self, st: _StageState) -> bool:
        """When ``st`` is the range split of a sort (:func:`adaptive.range_sort_stage`) and
        its sampled stage gave no more bytes than one coalesced task is given: run no task
        of it; its sort stage runs as one task reading every piece of the sampled stage, in
        partition order. Whether it did so."""
        stage = st.stage
        found = adapt.range_sort_stage(self.plan, stage)
        if found is None:
            return False
        assert self.coalesce_bytes is not None
        src = self.states[stage.inputs[0].stage]
        total = sum(s.bytes_out for s in src.stats.values())
        target = adapt.coalesce_target(total, self.plan.cpus, self.coalesce_bytes)
        if total > target:
            return False
        label = f"stage {stage.id} [{stage.name}]"
        if isinstance(found, str):
            self._note(f"{label}: kept for a small input ({size_text(total)}): {found}")
            return False
        sort, index = found
        planned, tasks = sort.num_tasks, stage.num_tasks
        self._retask(sort, 1, "sorts its input in one task")
        spec = sort.inputs[index]
        direct = replace(spec, stage=src.stage.id, mode="all", more=())
        sort.inputs = tuple(direct if i == index else s for i, s in enumerate(sort.inputs))
        self._retask(stage, 0, "skipped: its sort runs in one task")
        self._note(
            f"{label}: {tasks} task(s) skipped: stage {src.stage.id} gave "
            f"{size_text(total)} (at most {size_text(target)} for one task); stage "
            f"{sort.id} [{sort.name}] sorts it in 1 task (planned {planned}), no range split"
        )
        return True

    def _fuse_sort(self, st: _StageState, total: int) -> None:
        """``st`` now runs as one task: when it is the sampled stage of a sort that may run
        as one task (:func:`adaptive.range_sort_stage`) and its fragment gives no more
        rows than it reads (:func:`adaptive.fuse_into_sort`), its fragment runs in the
        sort stage's one task, over the same buckets; it and the range split run no
        task."""
        stage = st.stage
        consumers = self.plan.consumers(stage.id)
        if len(consumers) != 1:
            return
        split = consumers[0]
        found = adapt.range_sort_stage(self.plan, split)
        if not isinstance(found, tuple) or split.boundaries_from != stage.id:
            return
        sort, index = found
        fused = adapt.fuse_into_sort(sort, index, stage)
        if fused is None:
            return
        planned = sort.num_tasks
        self._retask(sort, 1, "runs its sampled stage and sorts in one task")
        sort.fragment, sort.inputs = fused
        sort.est_bytes += stage.est_bytes
        sort.name = f"{stage.name.removesuffix('+sample')}+sort"
        sort_state = self.states[sort.id]
        sort_state.buckets, sort_state.adapted = st.buckets, True
        stage.inputs, stage.scan_partitions = (), None
        self._retask(stage, 0, f"runs in stage {sort.id}")  # the range split follows
        self._note(
            f"stage {stage.id} and stage {split.id} [range-split] run in stage {sort.id} "
            f"[{sort.name}]: 1 task (planned {planned}) over {size_text(total)}, no sample "
            f"or range split"
        )

    def _fuse_gather(self, st: _StageState) -> None:
        """``st`` now runs as one task: when its only reader may run it inside one task of
        its own (:func:`adaptive.gather_consumer`: a top-k or limit gathered after a
        coalesced final aggregation; a final aggregation or a join reading a small
        shuffle of it), that reader runs ``st``'s fragment itself, over the same buckets,
        and ``st`` runs no task: one task and one round trip fewer. A reader by bucket
        becomes one task over all its buckets, only when that task reads at most
        :data:`adaptive.MIN_TASK_BYTES` (``st``'s inputs and the reader's other
        shuffles), the size below which coalescing gives one task anyway. The reader may
        then run in its own reader the same way."""
        stage = st.stage
        if stage.num_tasks != 1 or self.pools.get(stage.id) is not None:
            return
        found = adapt.gather_consumer(self.plan, stage)
        if found is None:
            return
        consumer, index = found
        if self.pools.get(consumer.id) is not None:
            return
        state = self.states[consumer.id]
        if state.output is not None or state.adapted:
            return  # (it started early, before this stage ran: it reads it as planned)
        switching = {stage.id, consumer.id}
        if any(
            switching & {sw.join, sw.probe, sw.regroup.consumer if sw.regroup else -1}
            for sw in self._switches.values()
        ):
            return  # (a broadcast switch may still rewrite them)
        pending = self._unfinished_besides(consumer, stage.id)
        if pending:
            # The reader waits for them anyway: hold this small stage back until they
            # finish (unless one of them is held for this reader too).
            small = self._task_input_bytes(st, range(len(stage.inputs)), [0])
            if small <= adapt.MIN_TASK_BYTES and not any(s in self._fuse_wait for s in pending):
                self._fuse_wait[stage.id] = consumer.id
                st.adapted = True
            return
        buckets = st.buckets
        shuffled = consumer.inputs[index].mode == "bucket"
        planned = consumer.num_tasks
        if shuffled:
            groups = self._one_task_buckets(st, state, index)
            if groups is False:
                return
            buckets = groups
            self._retask(consumer, 1, f"runs stage {stage.id} and all its buckets in one task")
        consumer.fragment, consumer.inputs = adapt.fuse_stage(consumer, index, stage)
        consumer.est_bytes += stage.est_bytes
        consumer.name = f"{stage.name}+{consumer.name}"
        state.buckets, state.adapted = buckets, True
        stage.inputs = ()
        self._retask(stage, 0, f"runs in stage {consumer.id}")
        self.readers = {s.id: readers(self.plan, s.id) for s in self.plan.stages}
        how = "the one task that gathers it"
        if shuffled:
            how = f"1 task over its shuffle (planned {planned})"
        self._note(
            f"stage {stage.id} runs in stage {consumer.id} [{consumer.name}], {how}: 1 task fewer"
        )
        self._fuse_gather(state)

    def _fuse_when_ready(self, st: _StageState) -> bool:
        """For ``st``, held back for its reader (``_fuse_wait``): whether to dispatch it
        now. Not while the reader's other inputs run; once they have finished, the reader
        runs it when it may (:meth:`_fuse_gather`: then ``st`` runs no task), else it runs
        as planned."""
        reader = self.states[self._fuse_wait[st.stage.id]].stage
        if self._unfinished_besides(reader, st.stage.id):
            return False
        del self._fuse_wait[st.stage.id]
        self._fuse_gather(st)
        return bool(st.undispatched)

    def _one_task_buckets(
        self, st: _StageState, reader: _StageState, index: int
    ) -> list[list[int]] | None | Literal[False]:
        """The bucket groups of ``reader`` once it runs ``st`` (one task, which it reads
        by bucket at input ``index``) in one task over all its buckets: ``st``'s groups
        for ``st``'s own shuffle inputs, every bucket for the reader's other shuffles (None:
        neither has any). False when that task would read more than
        :data:`adaptive.MIN_TASK_BYTES`, or when the two need different buckets."""
        stage, consumer = st.stage, reader.stage
        others = [
            i for i, spec in enumerate(consumer.inputs) if spec.mode == "bucket" and i != index
        ]
        total = self._task_input_bytes(st, range(len(stage.inputs)), [0])
        total += self._task_input_bytes(reader, others, range(consumer.num_tasks))
        if total > adapt.MIN_TASK_BYTES:
            return False
        every = list(range(consumer.num_tasks))
        own = any(spec.mode == "bucket" for spec in stage.inputs)
        if not own:
            return [every] if others else None
        groups = st.buckets if st.buckets is not None else [[0]]
        if others and groups != [every]:
            return False
        return groups

    def _unfinished_besides(self, reader: Stage, stage_id: int) -> list[int]:
        """The stages ``reader`` reads, other than ``stage_id``, that have not finished."""
        return [
            s
            for spec in reader.inputs
            for s in spec.stages
            if s != stage_id and not self.states[s].finished
        ]

    def _task_input_bytes(
        self, st: _StageState, inputs: Sequence[int], partitions: Sequence[int]
    ) -> int:
        """Bytes held of the pieces that tasks ``partitions`` of ``st`` read at ``inputs``."""
        return sum(
            self.ledger.nbytes(k)
            for i in inputs
            for p in partitions
            for k in self._pieces(st, i, p)
        )

    def _decide_switches(self) -> None:
        """For each planned hash join whose build side has finished while its probe side
        has not started: run it as a broadcast join when the build side is small enough,
        else release the probe side to run as planned."""
        for sw in list(self._switches.values()):
            build = self.states[sw.build]
            if not build.finished:
                continue
            del self._switches[sw.join]
            self._held.pop(sw.probe, None)
            probe, join = self.states[sw.probe], self.states[sw.join]
            label = f"stage {join.stage.id} [{join.stage.name}]"
            nbytes = sum(s.bytes_out for s in build.stats.values())
            if probe.next_partition or join.next_partition or probe.output is not None:
                continue  # (started after all: as planned)
            ins = join.stage.inputs
            if (
                max(sw.probe_input, sw.build_input) >= len(ins)
                or sw.probe not in ins[sw.probe_input].stages
                or sw.build not in ins[sw.build_input].stages
                or not probe.stage.num_tasks
            ):
                # Another switch ran the join stage (or the probe stage) inside its own
                # join: it reads other inputs now. As it is.
                continue
            if nbytes > self.broadcast_bytes:
                self._note(
                    f"{label}: stays a hash join: stage {sw.build} gave {size_text(nbytes)}"
                    f" > broadcast_join_threshold_bytes"
                )
                continue
            self._switch_to_broadcast(sw, nbytes)
            self._note(
                f"{label}: hash join run as a broadcast join of stage {sw.build} "
                f"({size_text(nbytes)}, estimated {size_text(build.stage.est_bytes)}) "
                f"in {join.stage.num_tasks} task(s) of stage {sw.probe}'s partitions; "
                f"stage {sw.probe} not shuffled"
                + (
                    f"; its aggregation is partial there and completes in stage "
                    f"{sw.regroup.consumer}"
                    if sw.regroup is not None
                    else ""
                )
            )

    def _switch_to_broadcast(self, sw: adapt.BroadcastSwitch, nbytes: int) -> None:
        """Rewrite the join stage of ``sw`` to run the probe stage's fragment with the build
        side read whole (:func:`shoal.runners.adaptive.fuse_probe`); the probe stage runs no task."""
        probe, join = self.plan.stage(sw.probe), self.plan.stage(sw.join)
        old = join.num_tasks
        fragment, inputs = adapt.fuse_probe(join, probe, sw)
        others = [
            s
            for i, spec in enumerate(join.inputs)
            if i not in (sw.probe_input, sw.build_input)
            for s in spec.stages
        ]
        join.fragment, join.inputs = fragment, inputs
        if sw.regroup is not None:  # its aggregation completes in the gathering task
            adapt.regroup(join, self.plan.stage(sw.regroup.consumer), sw.regroup)
        join.scan_partitions = probe.scan_partitions
        join.num_tasks = n = probe.num_tasks
        join.est_bytes = probe.est_bytes + nbytes
        join.name = f"{probe.name.removesuffix('+shuffle')}+broadcast-join"
        planned = probe.num_tasks
        probe.inputs, probe.num_tasks, probe.scan_partitions = (), 0, None
        self._drop_readers(sw.build, 1 - n)  # read by every task now, not one
        for s in others:  # broadcast inputs: read by n tasks instead of old
            self._drop_readers(s, old - n)
        if self.tracer is not None:
            self.tracer.stage_retasked(sw.probe, planned, 0, "runs in its join stage")
            self.tracer.stage_retasked(sw.join, old, n, "broadcast join")
        self._follow(join, old, n)
        self.readers = {s.id: readers(self.plan, s.id) for s in self.plan.stages}

    def _release(self, keys: Sequence[PieceKey]) -> None:
        """Pieces no task will read after all: one reader fewer each."""
        for key in keys:
            if self.ledger.read(key):
                s, p, o = key
                self.states[s].outputs[p][o] = []

    def _retask(self, stage: Stage, n: int, why: str) -> None:
        """Give ``stage`` (not started) ``n`` tasks, and every stage that follows its
        partitions one by one (pointwise or concatenated readers) as many as it then
        needs; the readers counted for the broadcast pieces they read change with them."""
        old = stage.num_tasks
        if n == old:
            return
        stage.num_tasks = n
        for spec in stage.inputs:
            if spec.mode != "all":
                continue
            for s in spec.stages:
                self._drop_readers(s, old - n)
        if self.tracer is not None:
            self.tracer.stage_retasked(stage.id, old, n, why)
        self._follow(stage, old, n)
        self.readers = {s.id: readers(self.plan, s.id) for s in self.plan.stages}

    def _drop_readers(self, stage_id: int, n: int) -> None:
        """Every piece of stage ``stage_id`` produced and held is read by ``n`` tasks fewer
        (its broadcast reader runs fewer tasks; negative: more)."""
        st = self.states[stage_id]
        for p in range(st.stage.num_tasks):
            for o in range(st.stage.output.num_outputs):
                key = (stage_id, p, o)
                if self.ledger.holds(key) and self.ledger.drop_readers(key, n):
                    st.outputs[p][o] = []

    def _follow(self, stage: Stage, old: int, n: int) -> None:
        """The stages that follow ``stage``'s partitions one by one (pointwise or
        concatenated readers) get as many tasks as it now has (``n`` instead of ``old``)."""
        for c in self.plan.consumers(stage.id):
            for spec in c.inputs:
                if stage.id not in spec.stages:
                    continue
                if spec.mode == "pointwise":
                    self._retask(c, n, f"follows stage {stage.id}")
                elif spec.mode == "concat":
                    self._retask(c, c.num_tasks + n - old, f"follows stage {stage.id}")

    def _note(self, line: str) -> None:
        self.adaptations.append(line)
        _log.info("shoal: adaptive: %s", line)

    def _not_split(self, stage_id: int, partition: int, nbytes: int, why: str) -> None:
        self._memory.not_split.append((stage_id, partition, why))
        if self.tracer is not None:
            self.tracer.task_not_split(stage_id, partition, nbytes, why)
        _log.info(
            "shoal: stage %d partition %d reads %d bytes (over max_task_input_bytes) and "
            "runs as one task: %s",
            stage_id,
            partition,
            nbytes,
            why,
        )

    def _task(self, st: _StageState, partition: int, subtask: int = 0) -> TaskSpec:
        split = st.splits.get(partition)
        inputs: list[list[Any]] = []
        reads: list[PieceKey] = []
        for index in range(len(st.stage.inputs)):
            keys = self._pieces(st, index, partition)
            if split is not None and split[0] == index:
                keys = [keys[i] for i in split[1][subtask]]
            inputs.append([r for s, p, o in keys for r in self._refs(s, p, o)])
            reads.extend(keys)
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
            subtask,
            len(split[1]) if split is not None else 1,
            tuple(reads),
            st.ship_cache,
            st.early and not self._ready(st),
            st.empty_if,
        )

    def _refs(self, s: int, p: int, o: int) -> list[Any]:
        """The references of piece ``(s, p, o)``: its recorded outputs, or the future
        outputs of its task still in flight (a stage started early)."""
        outs = self.states[s].outputs.get(p)
        if outs is not None:
            return outs[o]  # type: ignore[no-any-return]
        return [self.states[s].future[p][o]]


def merge_stats(parts: Sequence[TaskStats]) -> TaskStats:
    """The stats of one partition that ran as the subtasks ``parts`` (in order): counts and
    bytes summed, the earliest start and latest end, samples concatenated;
    ``extra["subtasks"]`` says how many."""
    first = parts[0]
    samples = [p.sample for p in parts if p.sample is not None]
    sizes = [p.output_bytes for p in parts if p.output_bytes]
    return replace(
        first,
        rows_in=sum(p.rows_in for p in parts),
        scan_rows=sum(p.scan_rows for p in parts),
        rows_out=sum(p.rows_out for p in parts),
        bytes_out=sum(p.bytes_out for p in parts),
        start=min(p.start for p in parts),
        end=max(p.end for p in parts),
        sample=pa.concat_tables(samples) if samples else None,
        extra={**first.extra, **merge_profile([p.extra for p in parts]), "subtasks": len(parts)},
        output_bytes=tuple(map(sum, zip(*sizes, strict=True))) if sizes else (),
    )
