"""Running IR plans: :func:`execute`, :func:`execute_batches`, :func:`explain`, :func:`shutdown`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from shoal.config import Config, RunnerKind, get_config
from shoal.errors import UnsupportedError
from shoal.ir.nodes import PlanNode


def execute(
    plan: PlanNode, *, runner: RunnerKind | None = None, config: Config | None = None
) -> pa.Table:
    """Run ``plan`` distributed and return the whole result as one Arrow table.

    ``runner`` overrides the config's runner ("ray" or "local"); ``config`` defaults to
    :func:`shoal.get_config`. Raises ``FileNotFoundError`` for a missing input path before
    any task runs, and :class:`shoal.TaskError` naming the stage and partition when a task
    fails.
    """
    from shoal.runners.session import run_plan

    cfg = _resolve(runner, config)
    return run_plan(plan, cfg)


def execute_batches(
    plan: PlanNode, *, runner: RunnerKind | None = None, config: Config | None = None
) -> Iterator[pa.RecordBatch]:
    """Run ``plan`` and yield its result as Arrow record batches (``plan.schema``), in
    partition order, each partition's batches as soon as it and the partitions before it
    have finished. Stopping the iteration early cancels the rest of the query. Raises as
    :func:`execute` does."""
    from shoal.runners.session import stream_plan

    for table in stream_plan(plan, _resolve(runner, config)):
        yield from table.to_batches()


def explain(
    query: Any,
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    to_ir: Callable[[Any], PlanNode] | None = None,
) -> str:
    """The logical (shoal IR) and physical plan (stages and exchanges) of ``query``.

    ``query`` is a shoal IR :class:`~shoal.ir.nodes.PlanNode`, or a frontend's query that
    ``to_ir`` translates (``shoal.explain``, the facade, passes the Polars adapter's for a
    ``LazyFrame``). For a query that shoal cannot run, the text says that it would fall
    back to the frontend's engine and names every node and expression that is the reason
    (the same reasons the fallback warning gives). Raises ``FileNotFoundError`` for a
    missing input, ``TypeError`` for a query that is not a plan when ``to_ir`` is None.
    """
    from shoal.ir.explain import explain as explain_ir
    from shoal.planner.physical import plan_physical

    cfg = _resolve(runner, config)
    changed = cfg.non_defaults()
    settings = ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "all defaults"
    header = f"Settings (config {cfg.digest()}): {settings}\n\n"
    if not isinstance(query, PlanNode):
        if to_ir is None:
            raise TypeError(f"explain: expected a shoal IR plan, got {type(query).__name__}")
        try:
            query = to_ir(query)
        except UnsupportedError as exc:
            # What collect(engine="dist") would do: fall back, for these reasons.
            return header + f"Falls back to the frontend's own engine:\n{exc}"
    physical = plan_physical(query, cfg)
    return header + (
        "Logical plan:\n" + explain_ir(query) + "\n\nPhysical plan:\n" + physical.explain()
    )


def shutdown() -> None:
    """Stop the runner (and a local Ray instance shoal started); runner settings thaw."""
    from shoal.runners.session import shutdown_runner

    shutdown_runner()


def _resolve(runner: RunnerKind | None, config: Config | None) -> Config:
    cfg = config if config is not None else get_config()
    if runner is not None and runner != cfg.runner:
        cfg = cfg.replace(runner=runner)
    return cfg
