"""The events of a traced query, as small frozen dataclasses.

Listeners (:func:`shoal.tracing.add_listener`) receive these objects live, in the order
the driver observes them; the Chrome trace writer turns the same objects into trace-event
JSON. Every time here is in **seconds since the epoch** (``time.time()``): driver events
are measured on the driver, a task's ``start`` and ``end`` on the worker that ran it (the
trace file converts them to microseconds). Clocks of different machines agree only as well
as NTP keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias


@dataclass(frozen=True)
class QueryStarted:
    """A query began (before planning). ``settings`` are the non-default settings of the
    query's config snapshot, JSON-friendly; ``config_digest`` its content hash."""

    query_id: int
    ts: float
    runner: str
    config_digest: str
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class StageInfo:
    """One stage of the physical plan: ``inputs`` are (upstream stage id, read mode)."""

    id: int
    name: str
    num_tasks: int
    operators: tuple[str, ...]
    inputs: tuple[tuple[int, str], ...]
    output: str


@dataclass(frozen=True)
class QueryPlanned:
    """The physical plan is ready; ``cpus`` is what the runner has in all, ``task_cpus``
    what each task holds, ``max_in_flight`` the dispatch loop's limit."""

    query_id: int
    ts: float
    stages: tuple[StageInfo, ...]
    cpus: int
    task_cpus: int
    max_in_flight: int


@dataclass(frozen=True)
class LoopSpan:
    """A step of the driver: ``plan``, ``start runner``, ``construct dispatch batch``,
    ``dispatch``, ``await`` or ``fetch result``, with its sizes in ``args``."""

    query_id: int
    name: str
    start: float
    end: float
    args: Mapping[str, Any]


@dataclass(frozen=True)
class TaskDispatched:
    """The dispatch loop handed a task to the backend (driver time)."""

    query_id: int
    ts: float
    stage: int
    partition: int


@dataclass(frozen=True)
class TaskFinished:
    """A task's result reached the driver.

    ``start`` and ``end`` are measured on the worker (process ``pid``, thread ``thread``,
    on node ``node_id``); ``dispatched`` and ``collected`` on the driver, so
    ``start - dispatched`` is the time the task waited for a worker and
    ``collected - end`` the time its result took to reach the dispatch loop. ``cpus``,
    ``gpus`` and ``memory_bytes`` are the task's resource request (0: none requested).
    ``early``: dispatched before the stages it reads had finished (then ``start -
    dispatched`` includes the wait for its inputs).
    """

    query_id: int
    stage: int
    stage_name: str
    partition: int
    operators: tuple[str, ...]
    node_id: str
    pid: int
    thread: int
    start: float
    end: float
    dispatched: float
    collected: float
    rows_in: int
    rows_out: int
    bytes_out: int
    cpus: float
    gpus: float
    memory_bytes: int
    config_digest: str
    early: bool = False


@dataclass(frozen=True)
class TaskFailed:
    """A task raised; the query fails with :class:`shoal.TaskError` right after."""

    query_id: int
    ts: float
    stage: int
    partition: int
    error: str


@dataclass(frozen=True)
class StageFinished:
    """A stage's last task reached the driver (``complete``), or the query ended with the
    stage unfinished (not ``complete``). The stage spans from its first task's start to
    its last task's end, worker times; ``tasks`` are its finished tasks."""

    query_id: int
    stage: int
    name: str
    start: float
    end: float
    tasks: tuple[TaskFinished, ...]
    complete: bool


@dataclass(frozen=True)
class CounterSample:
    """A counter's new value at ``ts``.

    Counters: ``tasks in flight`` (dispatched, not yet collected; driver times),
    ``rows produced`` (cumulative rows out of finished tasks), ``object store bytes``
    (estimate: output bytes of finished tasks that an unfinished stage still reads, or
    that the result fetch still needs), and, computed from worker times once the query
    ends, ``tasks running`` and ``CPUs free``.
    """

    query_id: int
    ts: float
    name: str
    value: float


@dataclass(frozen=True)
class QueryFinished:
    """The query ended: ``error`` is None on success, else ``"Type: message"``."""

    query_id: int
    start: float
    end: float
    error: str | None


TraceEvent: TypeAlias = (
    QueryStarted
    | QueryPlanned
    | LoopSpan
    | TaskDispatched
    | TaskFinished
    | TaskFailed
    | StageFinished
    | CounterSample
    | QueryFinished
)
"""Any event a listener may receive."""
