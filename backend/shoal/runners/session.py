"""The runner session: which backend runs queries, and running one plan end to end."""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

import polars as pl
import polars.selectors as cs
import pyarrow as pa

from shoal import config as _config
from shoal.config import Config
from shoal.errors import ConfigFrozenError
from shoal.execution.kernel import TaskStats, frame_of
from shoal.ir.nodes import PlanNode
from shoal.ir.types import frame_to_arrow
from shoal.lowering.plan import runs_foreign_code
from shoal.planner.physical import NativeQuery, PhysicalPlan, plan_physical, plan_physical_many
from shoal.runners.actor_pool import close_parked, make_pools, new_query_id, pool_udf
from shoal.runners.dispatch import CancelToken, DispatchLoop
from shoal.runners.memory import MemoryReport, default_max_bytes_held
from shoal.runners.profile import SpillReport, SpillSampler
from shoal.tracing.tracer import NO_SPAN, QueryTracer, start_query

_lock = threading.RLock()
_backends: dict[str, Any] = {}
_owns_ray = False
#: Runs the small-query task of a Ray query in the driver (``small_query_where``).
_driver: Any = None


@dataclass
class QueryReport:
    """What the last query did: its physical plan, each task's stats by
    (stage id, partition) (a partition split into subtasks: their merged stats, with
    ``extra["subtasks"]``), and what the memory controls did (``memory``: peak bytes held,
    tasks held back, split tasks; see :class:`~shoal.runners.memory.MemoryReport`),
    ``actors_replaced``: how many actor pool members died and were replaced (their batches
    were sent again), and ``adaptive``: what adaptive execution changed. ``physical`` is the
    plan as it ran: a stage's ``num_tasks`` is the tasks it ran after adaptive changes."""

    physical: PhysicalPlan
    task_stats: dict[tuple[int, int], TaskStats]
    runner: str
    memory: MemoryReport | None = None
    actors_replaced: int = 0
    #: What adaptive execution changed (``Config.adaptive``), one line per stage, e.g.
    #: ``"stage 3 [hash-join]: 8 buckets (12.0 MiB) read by 1 task(s) of about 8.0 MiB"``.
    adaptive: tuple[str, ...] = ()
    #: Tasks the dispatch loop sent again, by stage id (see ``DispatchLoop.resent``).
    resent: dict[int, int] = field(default_factory=dict)
    #: Ray's spilling during the query, by stage (a query run under :func:`profiling` on
    #: the Ray runner; else None): see :class:`~shoal.runners.profile.SpillReport`.
    spill: SpillReport | None = None


def _report(physical: PhysicalPlan, loop: DispatchLoop, config: Config) -> QueryReport:
    replaced = sum(getattr(pool, "replaced", 0) for pool in loop.pools.values())
    sampler = loop.on_stage_done
    spill = sampler.finish() if isinstance(sampler, SpillSampler) else None
    return QueryReport(
        physical,
        loop.task_stats,
        config.runner,
        loop.memory_report(),
        replaced,
        adaptive=tuple(loop.adaptations),
        resent=loop.resent(),
        spill=spill,
    )


_profiling: contextvars.ContextVar[bool] = contextvars.ContextVar("shoal_profiling", default=False)


@contextlib.contextmanager
def profiling() -> Iterator[None]:
    """Queries this thread runs inside the block also record what costs a little to read
    (``explain(analyze=True)`` runs its query so): on the Ray runner, the cluster's spill
    counters at the query's start, at the end of each stage and at its end (about 10 ms
    each), which :func:`last_query` reports as ``spill``."""
    token = _profiling.set(True)
    try:
        yield
    finally:
        _profiling.reset(token)


_last: QueryReport | None = None


def last_query() -> QueryReport | None:
    """The report of the most recent query run in this process (None before any)."""
    return _last


_started_with: dict[str, Config] = {}
_DEFAULTS: list[Config] = []


def _defaults() -> Config:
    """``Config()``, made once (every query compares its runner settings with it)."""
    if not _DEFAULTS:
        _DEFAULTS.append(Config())
    return _DEFAULTS[0]


def runner_settings(config: Config) -> Config:
    """The settings a runner starts with: the global config's runner settings, overridden
    by those that ``config`` (a query's config) sets to a non-default value."""
    base = _config.get_config()
    defaults = _defaults()
    explicit = {
        k: getattr(config, k)
        for k in _config.RUNNER_FIELDS
        if getattr(config, k) != getattr(defaults, k)
    }
    return base.replace(**{k: v for k, v in explicit.items() if k != "runner"})


def _backend(config: Config) -> Any:
    global _owns_ray
    with _lock:
        kind = config.runner
        if kind in _backends:
            _check_same_runner(kind, config)
            return _backends[kind]
        settings = runner_settings(config)
        if kind == "ray":
            from shoal.runners.ray_runner import RayBackend, start_ray

            _owns_ray = start_ray(settings) or _owns_ray
            backend: Any = RayBackend(settings)
        else:
            from shoal.resources import local_ledger
            from shoal.runners.local import LocalBackend

            backend = LocalBackend(
                settings.num_cpus, local_ledger(settings.num_cpus, settings.gpus)
            )
        _backends[kind] = backend
        _started_with[kind] = settings
        _config.mark_runner_started(True)
        return backend


def _driver_backend() -> Any:
    """The backend that runs a Ray query's small-query task in this process (see the
    ``small_query_where`` setting): a local runner's thread pool, started on first use,
    closed by :func:`shutdown_runner`. Its task runs with every thread of the driver's
    Polars, inside the kernel's task scope as any task (a Polars query it starts never
    comes back to shoal), and a UDF stage never reaches it (actor pools are not on the
    small-query path)."""
    global _driver
    with _lock:
        if _driver is None:
            from shoal.runners.local import LocalBackend

            _driver = LocalBackend(keep_frames=True)
        return _driver


def _check_same_runner(kind: str, config: Config) -> None:
    """A query may not ask for runner settings other than those its runner started with."""
    started = _started_with[kind]
    defaults = _defaults()
    for name in sorted(_config.RUNNER_FIELDS - {"runner"}):
        wanted = getattr(config, name)
        if wanted != getattr(defaults, name) and wanted != getattr(started, name):
            shown = {"wanted": wanted, "running": getattr(started, name)}
            if name == "ray_address":
                shown = {k: _config.redact(v) if v else v for k, v in shown.items()}
            raise ConfigFrozenError(
                f"shoal setting {name}={shown['wanted']!r} differs from the running {kind} "
                f"runner's {shown['running']!r}; call shoal.shutdown() first to start a new one"
            )


def running_cpus(config: Config) -> int | None:
    """The CPUs of ``config``'s runner if it is running (Ray: the cluster's alive nodes',
    read at most :data:`~shoal.runners.ray_runner.CLUSTER_VIEW_TTL_S` ago), else None."""
    with _lock:
        if config.runner not in _backends:
            return None
    return _cpus(config)


def _cpus(config: Config) -> int:
    if config.runner == "ray":
        backend = _backends.get("ray")
        if backend is not None:  # cached for a moment: see ray_runner.ClusterView
            return int(backend.cluster_cpus())
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    started = _started_with.get("local")
    return (started.num_cpus if started else None) or os.cpu_count() or 1


_T = TypeVar("_T")


def _traced(config: Config, run: Callable[[QueryTracer | None], _T]) -> _T:
    """``run(tracer)`` inside the query's tracer when tracing is on, ``run(None)`` otherwise."""
    tracer = start_query(config)  # None unless tracing is on
    if tracer is None:
        return run(None)
    with tracer:
        return run(tracer)


@overload
def run_plan(
    plan: PlanNode,
    config: Config,
    cancel: CancelToken | None = None,
    polars_ok: Literal[False] = False,
    native: NativeQuery | None = None,
) -> pa.Table: ...


@overload
def run_plan(
    plan: PlanNode,
    config: Config,
    cancel: CancelToken | None,
    polars_ok: bool,
    native: NativeQuery | None = None,
) -> pa.Table | pl.DataFrame: ...


def run_plan(
    plan: PlanNode,
    config: Config,
    cancel: CancelToken | None = None,
    polars_ok: bool = False,
    native: NativeQuery | None = None,
) -> pa.Table | pl.DataFrame:
    """Plan ``plan``, run it on the configured runner, and return the result with exactly
    ``plan.schema``. Raises ``FileNotFoundError`` for a missing input before any task runs,
    :class:`shoal.TaskError` when a task fails, :class:`shoal.QueryCancelledError` when
    ``cancel`` is set (from another thread) before the query ends. Traced when tracing is
    on (see :mod:`shoal.tracing`).

    ``polars_ok`` (the Polars frontend): where the result is one Polars frame in this
    process (a small query run in the driver) whose schema is ``plan.schema`` as Polars
    types, that frame is returned as it is (a ``polars.DataFrame``) instead of an Arrow
    table: converting it to Arrow here and back to Polars in the frontend gives the same
    frame (:func:`_polars_result`).

    ``native`` (a frontend that holds the query as its own engine runs it): where the plan
    is a small query whose one task runs in this process and ``small_query_native`` is on,
    that task runs ``native.run()`` instead of the lowered plan (see
    :class:`~shoal.planner.physical.NativeQuery`)."""
    return _traced(
        config, lambda tracer: _run_plan(plan, config, tracer, cancel, polars_ok, native)
    )


def start_runner(config: Config) -> None:
    """Start ``config``'s runner now (in the calling thread) unless it is already up; a
    query started later reuses it. Raises as a query would when it cannot start."""
    _backend(config)


def _start(
    plan: PlanNode | list[PlanNode],
    config: Config,
    tracer: QueryTracer | None,
    cancel: CancelToken | None = None,
    native: NativeQuery | None = None,
) -> tuple[PhysicalPlan, Any, DispatchLoop]:
    """Plan ``plan`` (a list: several queries in one plan), start (or reuse) its runner,
    and set up the query's dispatch loop, with one actor pool per stage of a stateful or
    GPU user function (started by the loop when the stage becomes runnable, closed when it
    ends or the query does). ``native``: the frontend's own query, which the one task of a
    small query run in this process runs instead of the lowered plan
    (``small_query_native``)."""
    with tracer.span("start runner") if tracer else NO_SPAN:
        backend = _backend(config)
    # Sized by the cluster as it is now, give or take CLUSTER_VIEW_TTL_S (an autoscaled
    # cluster may have grown since the last query), not by the driver's CPUs.
    cpus = _cpus(config)
    with tracer.span("plan") if tracer else NO_SPAN:
        if isinstance(plan, list):
            physical = plan_physical_many(plan, config, cpus)
        else:
            physical = plan_physical(plan, config, cpus)
    where = config.runner
    if physical.small_query_in_driver:  # small_query_where: outputs in the driver's heap
        backend.check_task_cpus(config)  # fails as the query would on the cluster
        backend, where = _driver_backend(), "local"
    if native is not None and config.small_query_native and where == "local":
        _run_native(physical, native)
    limit = config.max_tasks_in_flight or 2 * cpus
    if tracer is not None:
        tracer.planned(physical, cpus=cpus, max_in_flight=limit)
    held = config.max_bytes_held
    if held is None:
        read_store = getattr(backend, "object_store_bytes", None)  # cached: see ClusterView
        store = read_store() if read_store is not None else None
        held = default_max_bytes_held(where, store or None)
    loop = DispatchLoop(
        physical,
        backend,
        limit,
        config,
        tracer,
        max_bytes_held=held,
        max_task_input_bytes=config.max_task_input_bytes,
        cancel=cancel,
        adaptive=config.adaptive,
        # An explicit shuffle_partitions is the user's partition count: not coalesced.
        coalesce_bytes=None if config.shuffle_partitions else config.target_partition_bytes,
    )
    read_spill = getattr(backend, "spill_counters", None)
    if _profiling.get() and read_spill is not None:
        loop.on_stage_done = SpillSampler(read_spill)
    if any(pool_udf(st) for st in physical.stages):
        loop.pools = make_pools(
            physical,
            backend,
            config.runner,
            new_query_id(),
            loop.config_handle,
            loop.config_digest,
            keep_warm=config.udf_keep_warm,
            reserve_cpus=config.task_cpus,
            idle_s=config.udf_keep_warm_idle_s,
        )
    return physical, backend, loop


def _run_native(physical: PhysicalPlan, native: NativeQuery) -> None:
    """Give the one stage of ``physical`` the frontend's own query to run
    (``small_query_native``) when ``physical`` is a small query's plan (one stage of one
    task) that runs only what the frontend's engine runs, and say so on its
    ``small_query`` line. A plan with a shoal user function (or DuckDB's SQL, a sink) is
    lowered: the frontend's engine would call the function on its own threads, outside
    the task and its config (``udf_batch_size``, and queries the function starts would
    reach shoal again)."""
    (stage, *more) = physical.stages
    if more or stage.name != "small-query" or stage.num_tasks != 1:
        return
    if runs_foreign_code(stage.fragment):
        return
    stage.native = native
    physical.small_query += f"; run as the frontend's own query by {native.engine}"


def _run_plan(
    plan: PlanNode,
    config: Config,
    tracer: QueryTracer | None,
    cancel: CancelToken | None,
    polars_ok: bool = False,
    native: NativeQuery | None = None,
) -> pa.Table | pl.DataFrame:
    global _last
    physical, backend, loop = _start(plan, config, tracer, cancel, native)
    refs = loop.run()
    with tracer.span("fetch result") if tracer else NO_SPAN:
        result = _polars_result(backend, refs, plan) if polars_ok else None
        if result is None:
            result = conform(backend.fetch(refs), plan)
    _last = _report(physical, loop, config)
    return result


def _polars_result(backend: Any, refs: list[Any], plan: PlanNode) -> pl.DataFrame | None:
    """The query's result as the one Polars frame its task kept (a backend with
    ``fetch_frames``: the driver's small-query task), when that frame is what
    :func:`conform` would make of it: ``plan``'s columns, each of ``plan``'s type as Polars
    types it (conform's casts change nothing), and at least one column (a frame of no
    columns travels as Arrow, which keeps its height). None otherwise."""
    fetch_frames = getattr(backend, "fetch_frames", None)
    if fetch_frames is None or len(refs) != 1 or not plan.schema.fields:
        return None
    (got,) = fetch_frames(refs)
    if not isinstance(got, pl.DataFrame):
        return None
    fields = plan.schema.fields
    if got.columns != [name for name, _ in fields]:
        return None
    if any(have != want.to_polars() for have, (_, want) in zip(got.dtypes, fields, strict=True)):
        return None
    return got


def run_plans(
    plans: list[PlanNode], config: Config, cancel: CancelToken | None = None
) -> list[pa.Table]:
    """Run several plans as one query (``pl.collect_all``): one physical plan in which
    sub-plans they share (the same node objects) are computed once
    (:func:`shoal.planner.planner.build_many`), one dispatch loop, one report
    (:func:`last_query`). Returns each plan's result with exactly its schema, in order.
    Raises as :func:`run_plan` does."""
    return _traced(config, lambda tracer: _run_plans(plans, config, tracer, cancel))


def _run_plans(
    plans: list[PlanNode],
    config: Config,
    tracer: QueryTracer | None,
    cancel: CancelToken | None,
) -> list[pa.Table]:
    global _last
    physical, backend, loop = _start(list(plans), config, tracer, cancel)
    refs = {physical.root.id: loop.run()}
    for sid in physical.result_stages:
        if sid not in refs:
            refs[sid] = loop.take_outputs(sid)
    with tracer.span("fetch result") if tracer else NO_SPAN:
        tables = {sid: backend.fetch(r) for sid, r in refs.items()}
        out = [conform(tables[sid], p) for sid, p in zip(physical.results, plans, strict=True)]
    _last = _report(physical, loop, config)
    return out


@dataclass
class ResultRefs:
    """A finished query's result where its tasks left it: ``refs`` (the root stage's
    outputs in partition order: Ray object references, or Arrow tables for the local
    runner), the ``backend`` that can fetch them, and the result's total ``rows``."""

    refs: list[Any]
    backend: Any
    rows: int
    runner: str
    #: The Ray runner ran the query in the driver (``small_query_where``): ``refs`` are
    #: Arrow tables in this process, not object references.
    in_driver: bool = False


def run_plan_refs(plan: PlanNode, config: Config, cancel: CancelToken | None = None) -> ResultRefs:
    """Like :func:`run_plan`, but leave the result where the tasks put it (nothing is
    fetched to the driver): see :class:`ResultRefs`. Raises as :func:`run_plan` does."""
    return _traced(config, lambda tracer: _run_plan_refs(plan, config, tracer, cancel))


def _run_plan_refs(
    plan: PlanNode, config: Config, tracer: QueryTracer | None, cancel: CancelToken | None
) -> ResultRefs:
    global _last
    physical, backend, loop = _start(plan, config, tracer, cancel)
    refs = loop.run()
    _last = _report(physical, loop, config)
    root = physical.root.id
    rows = sum(s.rows_out for (stage, _), s in loop.task_stats.items() if stage == root)
    return ResultRefs(refs, backend, rows, config.runner, physical.small_query_in_driver)


def stream_plan(plan: PlanNode, config: Config) -> Iterator[pa.Table]:
    """Like :func:`run_plan`, but yield the result partition by partition, in order, each
    as soon as it and the partitions before it are done (each with ``plan.schema``).
    Closing the iterator early cancels the rest of the query."""
    global _last
    physical, backend, loop = _start(plan, config, None)
    for ref in loop.stream():
        yield conform(backend.fetch([ref]), plan)
    _last = _report(physical, loop, config)


def conform(tables: list[pa.Table], plan: PlanNode) -> pa.Table:
    """Concatenate partition results in order and cast to ``plan.schema``. A plan without
    columns gives a table of no columns and as many rows as the partitions hold."""
    full = [t for t in tables if t.num_rows]
    if len(full) == 1 and _conformed(full[0], plan):
        return full[0]
    schema = plan.schema.to_polars()
    frames = [frame_of(t) for t in full]
    if not frames:
        return frame_to_arrow(pl.DataFrame(schema=schema))
    df = pl.concat(frames, how="vertical_relaxed") if len(frames) > 1 else frames[0]
    assert isinstance(df, pl.DataFrame)
    if schema:
        if list(df.schema.items()) != list(schema.items()):  # else the casts change nothing
            df = df.select([pl.col(n).cast(t) for n, t in schema.items()])
    else:
        df = df.drop(cs.all())
    return frame_to_arrow(df)


def _conformed(table: pa.Table, plan: PlanNode) -> bool:
    """Whether ``table`` (a task's output) is already what :func:`conform` makes of it: the
    plan's column names and, column by column, the plan's Arrow type, each of a flat type
    that Polars imports and exports unchanged (numbers, strings, binary, temporal, decimal,
    null; not a dictionary, list, struct or array, an ``Enum``, or a 128-bit integer carried
    as bytes), and no metadata. Converting it to Polars and back (about 0.2 ms for a small
    result, the driver's fixed cost of every query) would give the same table."""
    fields = plan.schema.fields
    if not fields or table.schema.metadata or table.num_columns != len(fields):
        return False
    for f, (name, dtype) in zip(table.schema, fields, strict=True):
        if (
            f.name != name
            or not f.nullable
            or f.metadata
            or dtype.categories is not None
            or dtype.wide is not None
            or not _flat(f.type)
            or f.type != dtype.arrow
        ):
            return False
    return True


#: Arrow types that Polars imports and exports as they are (:func:`_flat`); Polars reads
#: others as a type of its own (``string`` as ``large_string``, ``date64`` as ``date32``,
#: second units as milliseconds, a fixed offset as a zone name, ...).
_POLARS_ARROW_TYPES = frozenset(
    [pa.bool_(), pa.null(), pa.large_string(), pa.large_binary(), pa.date32(),
     pa.time64("ns"), pa.float32(), pa.float64()]
    + [getattr(pa, f"{s}int{b}")() for s in ("", "u") for b in (8, 16, 32, 64)]
    + [pa.duration(u) for u in ("ms", "us", "ns")]
)  # fmt: skip


def _flat(t: pa.DataType) -> bool:
    """Whether ``t`` is one of the flat Arrow types that Polars imports and exports as they
    are (see :func:`_conformed`)."""
    if isinstance(t, pa.TimestampType):  # Polars respells time zones (+00:00 -> UTC)
        return t.unit in ("ms", "us", "ns") and t.tz in (None, "UTC")
    if isinstance(t, pa.Decimal128Type):
        return True
    return t in _POLARS_ARROW_TYPES


def shutdown_runner() -> None:
    """Close every backend, stop a Ray instance shoal started, and thaw runner settings."""
    global _owns_ray
    with _lock:
        global _driver
        close_parked()  # warm actor pools (udf_keep_warm)
        for b in _backends.values():
            b.close()
        _backends.clear()
        if _driver is not None:
            _driver.close()
            _driver = None
        _started_with.clear()
        if _owns_ray:
            import ray

            ray.shutdown()
            _owns_ray = False
        _config.mark_runner_started(False)
