"""The runner session: which backend runs queries, and running one plan end to end."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from shoal import config as _config
from shoal.config import Config
from shoal.execution.kernel import TaskStats
from shoal.ir.nodes import PlanNode
from shoal.planner.physical import PhysicalPlan, plan_physical
from shoal.runners.dispatch import DispatchLoop

_lock = threading.RLock()
_backends: dict[str, Any] = {}
_owns_ray = False


@dataclass
class QueryReport:
    """What the last query did: its physical plan and each task's stats by
    (stage id, partition)."""

    physical: PhysicalPlan
    task_stats: dict[tuple[int, int], TaskStats]
    runner: str


_last: QueryReport | None = None


def last_query() -> QueryReport | None:
    """The report of the most recent query run in this process (None before any)."""
    return _last


def _backend(config: Config) -> Any:
    global _owns_ray
    with _lock:
        kind = config.runner
        if kind in _backends:
            return _backends[kind]
        if kind == "ray":
            from shoal.runners.ray_runner import RayBackend, start_ray

            _owns_ray = start_ray(config) or _owns_ray
            backend: Any = RayBackend(config)
        else:
            from shoal.runners.local import LocalBackend

            backend = LocalBackend(config.num_cpus)
        _backends[kind] = backend
        _config.mark_runner_started(True)
        return backend


def _cpus(config: Config) -> int:
    if config.runner == "ray":
        import ray

        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    return config.num_cpus or os.cpu_count() or 1


def run_plan(plan: PlanNode, config: Config) -> pa.Table:
    """Plan ``plan``, run it on the configured runner, and return the result with exactly
    ``plan.schema``. Raises ``FileNotFoundError`` for a missing input before any task runs,
    :class:`shoal.TaskError` when a task fails."""
    global _last
    physical = plan_physical(plan, config)
    backend = _backend(config)
    limit = config.max_tasks_in_flight or 2 * _cpus(config)
    loop = DispatchLoop(physical, backend, limit, config)
    refs = loop.run()
    tables = backend.fetch(refs)
    _last = QueryReport(physical, loop.task_stats, config.runner)
    return conform(tables, plan)


def conform(tables: list[pa.Table], plan: PlanNode) -> pa.Table:
    """Concatenate partition results in order and cast to ``plan.schema``."""
    schema = plan.schema.to_polars()
    frames = [pl.from_arrow(t) for t in tables if t.num_rows]
    if not frames:
        return pl.DataFrame(schema=schema).to_arrow()
    df = pl.concat(frames, how="vertical_relaxed") if len(frames) > 1 else frames[0]
    assert isinstance(df, pl.DataFrame)
    df = df.select([pl.col(n).cast(t) for n, t in schema.items()])
    return df.to_arrow()


def shutdown_runner() -> None:
    """Close every backend, stop a Ray instance shoal started, and thaw runner settings."""
    global _owns_ray
    with _lock:
        for b in _backends.values():
            b.close()
        _backends.clear()
        if _owns_ray:
            import ray

            ray.shutdown()
            _owns_ray = False
        _config.mark_runner_started(False)
