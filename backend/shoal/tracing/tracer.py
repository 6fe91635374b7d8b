"""The per-query tracer the runners call, the listener hook, and ``shoal.trace``.

Off by default and free when off: :func:`start_query` returns None unless a
``shoal.trace`` block is open, ``Config.trace`` is set, or a listener is registered. The
runners then hold ``tracer = None`` and test it (``if tracer is not None``, or
``tracer.span(...) if tracer else NO_SPAN``) before anything else: no event objects are
built and no clock is read. When on, a :class:`QueryTracer` turns the runners' calls
into :mod:`~shoal.tracing.events`, which go to every sink (trace files) and every
listener, live.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from shoal.tracing import chrome, progress
from shoal.tracing.events import (
    CounterSample,
    LoopSpan,
    QueryFinished,
    QueryPlanned,
    QueryStarted,
    StageFinished,
    StageInfo,
    TaskDispatched,
    TaskFailed,
    TaskFinished,
    TraceEvent,
)

if TYPE_CHECKING:
    from shoal.config import Config
    from shoal.execution.kernel import TaskStats
    from shoal.planner.physical import PhysicalPlan
    from shoal.runners.dispatch import TaskSpec

_log = logging.getLogger("shoal.tracing")

Listener = Callable[[TraceEvent], object]
"""A callback that receives every trace event (see :mod:`shoal.tracing.events`)."""


class Sink(Protocol):
    """Where a query's events are written (a trace file)."""

    def handle(self, event: TraceEvent) -> None: ...

    def close(self) -> None: ...


_lock = threading.Lock()
_listeners: tuple[Listener, ...] = ()
_recordings: tuple[Sink, ...] = ()
_reported: list[Listener] = []
_query_ids = itertools.count(1)


# ------------------------------------------------------------------ listeners


def add_listener(callback: Listener) -> None:
    """Deliver every trace event of every query to ``callback(event)``, live.

    Events are the frozen dataclasses of :mod:`shoal.tracing.events`, delivered on the
    thread that runs the query's dispatch loop, in the order the driver observes them;
    keep the callback quick (hand events to a queue to forward them elsewhere). Adding a
    listener turns tracing on for the queries that start afterwards, without a trace file.
    A callback that raises is reported once (a warning on the ``shoal.tracing`` logger)
    and never breaks the query; it keeps receiving events.
    """
    global _listeners
    with _lock:
        _listeners = (*_listeners, callback)


def remove_listener(callback: Listener) -> None:
    """Stop delivering events to ``callback`` (no error when it is not registered)."""
    global _listeners
    with _lock:
        rest = list(_listeners)
        if callback in rest:
            rest.remove(callback)
        _listeners = tuple(rest)
        if callback in _reported:
            _reported.remove(callback)


def _report_listener(callback: Listener) -> None:
    with _lock:
        if callback in _reported:
            return
        _reported.append(callback)
    _log.warning(
        "shoal.tracing: listener %r raised; it stays registered and will not be reported again",
        callback,
        exc_info=True,
    )


# ------------------------------------------------------------------ shoal.trace


class TraceRecording:
    """The context manager :func:`trace` returns; see there."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._target = path
        self._sink: chrome.ChromeTraceWriter | chrome.PerQuerySink | None = None
        self._files: list[Path] = []

    @property
    def files(self) -> list[Path]:
        """The trace files written so far (one, or one per finished query)."""
        return list(self._sink.files if self._sink is not None else self._files)

    def __enter__(self) -> TraceRecording:
        global _recordings
        if self._sink is not None:
            raise RuntimeError(f"shoal.trace({str(self.path)!r}) is already open")
        self._sink = chrome.open_target(self._target)
        with _lock:
            _recordings = (*_recordings, self._sink)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        global _recordings
        sink, self._sink = self._sink, None
        if sink is None:
            return
        with _lock:
            _recordings = tuple(s for s in _recordings if s is not sink)
        sink.close()
        self._files = list(sink.files)

    def __repr__(self) -> str:
        return f"shoal.trace({str(self.path)!r})"


def trace(path: str | os.PathLike[str]) -> TraceRecording:
    """Trace every query run while the block is open: ``with shoal.trace("q.json"): ...``.

    ``path`` is a file (every query of the block goes into it, one after another) or a
    directory, an existing one or a path ending in ``/`` (one file per query, named
    ``shoal-<time>-<pid>-q<id>.json``). The file is Chrome trace-event JSON, which
    ui.perfetto.dev opens; timestamps in it are microseconds. Recording is process-wide:
    queries that other threads run during the block are recorded too. Raises ``OSError``
    at the start of the block when the file cannot be created.
    """
    return TraceRecording(path)


# ------------------------------------------------------------------ the per-query tracer


class Span:
    """A timed step of the driver; emits a :class:`LoopSpan` when the block ends."""

    __slots__ = ("_tracer", "name", "start", "args")

    def __init__(self, tracer: QueryTracer, name: str) -> None:
        self._tracer = tracer
        self.name = name
        self.start = 0.0
        self.args: dict[str, Any] = {}

    def set(self, **args: Any) -> None:
        """Attach ``args`` to the span (batch sizes and the like)."""
        self.args.update(args)

    def __enter__(self) -> Span:
        self.start = time.time()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.args["error"] = exc_type.__name__
        t = self._tracer
        t._emit(LoopSpan(t.query_id, self.name, self.start, time.time(), self.args))


class _NoSpan:
    """The span used when tracing is off: does nothing, reads no clock."""

    __slots__ = ()

    def set(self, **args: Any) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NO_SPAN = _NoSpan()
"""``with tracer.span("x") if tracer else NO_SPAN as span:`` keeps call sites uniform."""


def start_query(config: Config) -> QueryTracer | None:
    """The tracer of a query about to run under ``config``, or None when tracing is off
    (no ``shoal.trace`` block open, no ``config.trace``, no listener, no progress bars)."""
    recordings = _recordings
    show_progress = config.progress != "never" and progress.wanted(config.progress)
    if config.trace is None and not recordings and not _listeners and not show_progress:
        return None
    owned: list[Sink] = [chrome.config_target(config.trace)] if config.trace is not None else []
    if show_progress:
        owned.append(progress.ProgressSink(config.progress))
    return QueryTracer(next(_query_ids), config, [*recordings, *owned], owned)


class QueryTracer:
    """Turns one query's runner calls into trace events (use as a context manager around
    the whole query: entering emits :class:`QueryStarted`, leaving closes open stages,
    derives the worker-side counters and emits :class:`QueryFinished`).

    Called from the thread that runs the query's dispatch loop only. Events go to
    ``sinks`` (trace writers) and to the registered listeners; ``owned`` are the sinks
    this query opened itself (``Config.trace``), closed when it ends.
    """

    def __init__(
        self, query_id: int, config: Config, sinks: list[Sink], owned: list[Sink] | None = None
    ) -> None:
        self.query_id = query_id
        self.config = config
        self._sinks = sinks
        self._owned = owned or []
        self._start = 0.0
        self._stages: dict[int, StageInfo] = {}
        self._inputs: dict[int, set[int]] = {}
        self._readers_left: dict[int, int] = {}
        self._stage_bytes: dict[int, int] = {}
        self._finished: dict[int, list[TaskFinished]] = {}
        self._dispatched: dict[tuple[int, int, int], float] = {}
        #: Tasks more than planned per stage: partitions split into subtasks.
        self._extra_tasks: dict[int, int] = {}
        self._cpus = 0
        self._task_cpus = 0.0
        self._in_flight = 0
        self._rows = 0
        self._store_bytes = 0
        self._counters: dict[str, float] = {}

    # -- lifetime -----------------------------------------------------------------------

    def __enter__(self) -> QueryTracer:
        self._start = time.time()
        settings = {k: _jsonable(v) for k, v in self.config.non_defaults().items()}
        self._emit(
            QueryStarted(
                self.query_id, self._start, self.config.runner, self.config.digest(), settings
            )
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = time.time()
        for sid, tasks in self._finished.items():
            if tasks and len(tasks) < self._stages[sid].num_tasks + self._extra_tasks.get(sid, 0):
                self._emit(_stage_event(self.query_id, self._stages[sid], tasks, False))
        if self._store_bytes:
            self._store_bytes = 0
            self._counter(end, "object store bytes", 0)
        if self._counters.get("bytes held"):
            self._counter(end, "bytes held", 0)
        if self._in_flight:
            self._in_flight = 0
            self._counter(end, "tasks in flight", 0)
        self._worker_counters()
        error = None if exc_type is None else f"{exc_type.__name__}: {exc}"
        self._emit(QueryFinished(self.query_id, self._start, end, error))
        for sink in self._owned:  # the query's own files (Config.trace): close them here
            try:
                sink.close()
            except Exception:
                _log.warning(
                    "shoal.tracing: closing the trace of query %d failed",
                    self.query_id,
                    exc_info=True,
                )

    # -- calls from the runners -----------------------------------------------------------

    def span(self, name: str) -> Span:
        """A timed driver step: ``with tracer.span("dispatch") as s: ...; s.set(tasks=n)``."""
        return Span(self, name)

    def planned(self, physical: PhysicalPlan, cpus: int, max_in_flight: int) -> None:
        """The physical plan is ready; ``cpus`` is what the runner has in all."""
        now = time.time()
        self._cpus = cpus
        self._task_cpus = float(self.config.task_cpus)
        infos = []
        for st in physical.stages:
            info = StageInfo(
                st.id,
                st.name,
                st.num_tasks,
                tuple(st.operators),
                tuple((u, i.mode) for i in st.inputs for u in i.stages),
                st.describe_output(),
            )
            infos.append(info)
            self._stages[st.id] = info
            self._inputs[st.id] = {u for i in st.inputs for u in i.stages}
            self._finished[st.id] = []
            self._stage_bytes[st.id] = 0
        for sid in self._stages:
            self._readers_left[sid] = sum(sid in ins for ins in self._inputs.values())
        for root in physical.result_stages:
            self._readers_left[root] += 1  # the result fetch reads the root's outputs
        self._emit(
            QueryPlanned(
                self.query_id, now, tuple(infos), cpus, self.config.task_cpus, max_in_flight
            )
        )
        for name in ("tasks in flight", "rows produced", "object store bytes", "bytes held"):
            self._counter(now, name, 0)

    def task_dispatched(self, task: TaskSpec) -> None:
        """``task`` was handed to the backend."""
        now = time.time()
        self._dispatched[(task.stage.id, task.partition, task.subtask)] = now
        self._emit(TaskDispatched(self.query_id, now, task.stage.id, task.partition))
        self._in_flight += 1
        self._counter(now, "tasks in flight", self._in_flight)

    def task_finished(self, task: TaskSpec, stats: TaskStats) -> None:
        """``task``'s result reached the dispatch loop; ``stats`` were measured on the
        worker."""
        now = time.time()
        sid = task.stage.id
        info = self._stages[sid]
        ev = TaskFinished(
            query_id=self.query_id,
            stage=sid,
            stage_name=info.name,
            partition=task.partition,
            # what the task ran: adaptive execution may have given the stage another
            # fragment than planned (a final aggregation moved into its sort's task)
            operators=tuple(task.stage.operators),
            node_id=stats.node_id,
            pid=stats.pid,
            thread=stats.thread,
            start=stats.start,
            end=stats.end,
            dispatched=self._dispatched.pop((sid, task.partition, task.subtask), stats.start),
            collected=now,
            rows_in=stats.rows_in,
            rows_out=stats.rows_out,
            bytes_out=stats.bytes_out,
            cpus=self._task_cpus,
            gpus=0.0,
            memory_bytes=0,
            config_digest=stats.config_digest,
            early=task.early,
        )
        self._emit(ev)
        self._in_flight -= 1
        self._counter(now, "tasks in flight", self._in_flight)
        self._rows += stats.rows_out
        self._counter(now, "rows produced", self._rows)
        self._store_bytes += stats.bytes_out
        self._stage_bytes[sid] += stats.bytes_out
        self._counter(now, "object store bytes", self._store_bytes)
        tasks = self._finished[sid]
        tasks.append(ev)
        if len(tasks) == info.num_tasks + self._extra_tasks.get(sid, 0):
            self._emit(_stage_event(self.query_id, info, tasks, True))
            released = 0
            for up in self._inputs[sid]:
                self._readers_left[up] -= 1
                if self._readers_left[up] == 0:
                    released += self._stage_bytes[up]
            if released:
                self._store_bytes -= released
                self._counter(now, "object store bytes", self._store_bytes)

    def task_split(self, stage: int, partition: int, subtasks: int) -> None:
        """Partition ``partition`` of ``stage`` will run as ``subtasks`` tasks (its input
        was over ``max_task_input_bytes``): the stage ends after that many more tasks."""
        self._extra_tasks[stage] = self._extra_tasks.get(stage, 0) + subtasks - 1
        now = time.time()
        args = {"stage": stage, "partition": partition, "subtasks": subtasks}
        self._emit(LoopSpan(self.query_id, "split task", now, now, args))

    def stage_retasked(self, stage: int, old: int, new: int, reason: str) -> None:
        """Adaptive execution gave ``stage`` ``new`` tasks instead of ``old`` (buckets
        coalesced or skipped, an empty input; see :mod:`shoal.runners.adaptive`)."""
        self._extra_tasks[stage] = self._extra_tasks.get(stage, 0) + new - old
        now = time.time()
        args = {"stage": stage, "tasks_planned": old, "tasks": new, "reason": reason}
        self._emit(LoopSpan(self.query_id, "adaptive plan", now, now, args))

    def task_not_split(self, stage: int, partition: int, nbytes: int, reason: str) -> None:
        """Partition ``partition`` of ``stage`` reads ``nbytes`` bytes, over
        ``max_task_input_bytes``, but runs as one task: splitting it would not be exact."""
        now = time.time()
        args = {"stage": stage, "partition": partition, "input_bytes": nbytes, "reason": reason}
        self._emit(LoopSpan(self.query_id, "task not split", now, now, args))

    def counter(self, name: str, value: float) -> None:
        """A sample of counter ``name`` now (e.g. ``bytes held``, from the dispatch loop's
        memory ledger), unless it holds ``value`` already."""
        self._counter(time.time(), name, value)

    def task_failed(self, task: TaskSpec, exc: BaseException) -> None:
        """``task`` raised ``exc``."""
        now = time.time()
        self._dispatched.pop((task.stage.id, task.partition, task.subtask), None)
        self._emit(
            TaskFailed(
                self.query_id, now, task.stage.id, task.partition, f"{type(exc).__name__}: {exc}"
            )
        )
        self._in_flight -= 1
        self._counter(now, "tasks in flight", self._in_flight)

    # -- internals ----------------------------------------------------------------------

    def _counter(self, ts: float, name: str, value: float) -> None:
        """Emit a sample of counter ``name``, unless it holds ``value`` already."""
        if self._counters.get(name) == value:
            return
        self._counters[name] = value
        self._emit(CounterSample(self.query_id, ts, name, value))

    def _worker_counters(self) -> None:
        """``tasks running`` and ``CPUs free`` over the query, from worker start/end times
        (an end sorts before a start at the same instant)."""
        if not self._cpus:
            return
        steps = sorted(
            (t, d)
            for tasks in self._finished.values()
            for ev in tasks
            for t, d in ((ev.start, 1), (ev.end, -1))
        )
        running = 0
        self._counter(self._start, "tasks running", 0)
        self._counter(self._start, "CPUs free", self._cpus)
        for i, (t, d) in enumerate(steps):
            running += d
            if i + 1 < len(steps) and steps[i + 1][0] == t:
                continue
            self._counter(t, "tasks running", running)
            self._counter(t, "CPUs free", self._cpus - running * self._task_cpus)

    def _emit(self, event: TraceEvent) -> None:
        for sink in list(self._sinks):
            try:
                sink.handle(event)
            except Exception:
                self._sinks.remove(sink)
                _log.warning(
                    "shoal.tracing: writing the trace of query %d failed; this "
                    "query's trace stops here",
                    self.query_id,
                    exc_info=True,
                )
        for callback in _listeners:
            try:
                callback(event)
            except Exception:
                _report_listener(callback)


def _stage_event(
    query_id: int, info: StageInfo, tasks: list[TaskFinished], complete: bool
) -> StageFinished:
    return StageFinished(
        query_id,
        info.id,
        info.name,
        min(t.start for t in tasks),
        max(t.end for t in tasks),
        tuple(tasks),
        complete,
    )


def _jsonable(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return repr(v)
