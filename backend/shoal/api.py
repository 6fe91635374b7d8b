"""Running IR plans: :func:`execute`, :func:`execute_many`, :func:`execute_batches`,
:func:`explain`, :func:`shutdown`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal, overload

import pyarrow as pa

from shoal.config import Config, RunnerKind, get_config
from shoal.errors import PlanError, UnsupportedError
from shoal.ir.nodes import PlanNode, Sink

if TYPE_CHECKING:
    import polars as pl

    from shoal.planner.physical import NativeQuery
    from shoal.runners.background import BackgroundQuery
    from shoal.runners.dispatch import CancelToken


@overload
def execute(
    plan: PlanNode,
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    cancel: CancelToken | None = None,
    polars_ok: Literal[False] = False,
    native: NativeQuery | None = None,
) -> pa.Table: ...


@overload
def execute(
    plan: PlanNode,
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    cancel: CancelToken | None = None,
    polars_ok: bool,
    native: NativeQuery | None = None,
) -> pa.Table | pl.DataFrame: ...


def execute(
    plan: PlanNode,
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    cancel: CancelToken | None = None,
    polars_ok: bool = False,
    native: NativeQuery | None = None,
) -> pa.Table | pl.DataFrame:
    """Run ``plan`` distributed and return the whole result as one Arrow table.

    ``runner`` overrides the config's runner ("ray" or "local"); ``config`` defaults to
    :func:`shoal.get_config`; ``cancel`` (a :class:`shoal.runners.dispatch.CancelToken`)
    lets another thread cancel the query. A plan whose root is a
    :class:`~shoal.ir.nodes.Sink` writes files (each task its own partition's) and returns
    one row per file (path, rows, bytes), in order; its target is checked first
    (``shoal.execution.sink.check_target``). Raises ``FileNotFoundError`` for a missing
    input path before any task runs, :class:`shoal.TaskError` naming the stage and
    partition when a task fails, :class:`shoal.QueryCancelledError` when cancelled.
    ``polars_ok`` (the Polars frontend): the result may come as the ``polars.DataFrame``
    a small query's task computed in this process, with ``plan.schema`` as Polars types
    (see :func:`shoal.runners.session.run_plan`), instead of an Arrow table. ``native``
    (:class:`~shoal.planner.physical.NativeQuery`, a frontend's own query): a small query
    run in this process runs it instead of the lowered plan (``small_query_native``).
    """
    from shoal.runners.session import run_plan

    cfg = _resolve(runner, config)
    if not isinstance(plan, Sink):
        try:
            return run_plan(plan, cfg, cancel, polars_ok=polars_ok, native=native)
        except RecursionError:
            raise PlanError(
                "shoal: the plan or an expression in it is nested too deeply to plan (over "
                "about half of Python's recursion limit in levels)"
            ) from None
    from shoal.execution import sink

    sink.check_target(plan)
    plan = sink.prepare(plan)
    try:
        written = run_plan(plan, cfg, cancel)
        assert isinstance(written, pa.Table)
    except BaseException:
        sink.abort(plan)
        raise
    return sink.commit(plan, written)


def execute_many(
    plans: list[PlanNode],
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    cancel: CancelToken | None = None,
) -> list[pa.Table]:
    """Run several plans as one query and return each one's result as an Arrow table, in
    order (``pl.collect_all(..., engine=DistEngine())`` runs here).

    One physical plan computes them all: a sub-plan the plans share (the same IR node
    object, as a frontend's common sub-plan elimination leaves it) runs once, as one stage
    that each use reads, and stages of different plans run side by side on the cluster;
    ``shoal.runners.session.last_query()`` reports them together. ``runner``, ``config`` and
    ``cancel`` as for :func:`execute`. Raises as :func:`execute` does; ``PlanError`` for a
    :class:`~shoal.ir.nodes.Sink` plan (run it with :func:`execute`), ``ValueError`` for
    no plans.
    """
    from shoal.runners.session import run_plans

    plans = list(plans)
    if not plans:
        raise ValueError("execute_many: no plans")
    if any(isinstance(p, Sink) for p in plans):
        raise PlanError("execute_many: a Sink plan writes files; run it with shoal.execute")
    cfg = _resolve(runner, config)
    if len(plans) == 1:
        return [execute(plans[0], config=cfg, cancel=cancel)]
    try:
        return run_plans(plans, cfg, cancel)
    except RecursionError:
        raise PlanError(
            "shoal: a plan or an expression in it is nested too deeply to plan (over "
            "about half of Python's recursion limit in levels)"
        ) from None


def execute_background(
    plan: PlanNode,
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    convert: Callable[[pa.Table], Any] | None = None,
) -> BackgroundQuery:
    """Start running ``plan`` (as :func:`execute`) in a background thread and return its
    :class:`~shoal.runners.background.BackgroundQuery` handle at once (``done()``,
    ``result()``, ``cancel()``). ``convert`` turns the Arrow result into what ``result()``
    returns (for example a ``polars.DataFrame``). The runner starts in the calling thread
    first, so that a runner that cannot start raises here."""
    from shoal.runners.background import BackgroundQuery
    from shoal.runners.session import start_runner

    cfg = _resolve(runner, config)
    start_runner(cfg)

    def run(token: CancelToken) -> Any:
        table = execute(plan, config=cfg, cancel=token)
        return convert(table) if convert is not None else table

    return BackgroundQuery(run)


def execute_batches(
    plan: PlanNode, *, runner: RunnerKind | None = None, config: Config | None = None
) -> pa.RecordBatchReader:
    """Run ``plan`` and return its result as a ``pyarrow.RecordBatchReader`` (an Arrow C
    stream that DuckDB, Polars and pyarrow read directly), with the schema of
    :func:`execute`'s table. Batches come in partition order, each partition's as soon as
    it and the partitions before it have finished; the query starts when the first batch
    is read. Dropping the reader (its last reference) before the end cancels the rest of
    the query (``reader.close()`` alone does not: pyarrow keeps the batch source until
    the reader is freed). Raises as :func:`execute` does, when the batches are read, and at once
    ``PlanError`` for a :class:`~shoal.ir.nodes.Sink` plan (run it with :func:`execute`,
    which finishes the files)."""
    from shoal.result import result_schema
    from shoal.runners.session import stream_plan

    if isinstance(plan, Sink):
        raise PlanError("execute_batches: a Sink plan writes files; run it with shoal.execute")
    cfg = _resolve(runner, config)
    schema = result_schema(plan)

    def batches() -> Iterator[pa.RecordBatch]:
        for table in stream_plan(plan, cfg):
            yield from (table if table.schema == schema else table.cast(schema)).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


def explain(
    query: Any,
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    to_ir: Callable[[Any], PlanNode] | None = None,
    analyze: bool = False,
    format: Literal["text", "mermaid"] = "text",
    to_native: Callable[[Any], NativeQuery] | None = None,
) -> str:
    """The logical (shoal IR) and physical plan (stages and exchanges) of ``query``.

    ``analyze=True`` runs the query (its result is dropped) and adds its profile: per
    stage, the tasks, rows in and out, bytes written, task wall time min / median / max
    (seconds), the nodes used, tasks sent again and bytes Ray spilled, warnings for skew,
    large shuffles and broadcasts, and per operator the rows the kernel counts (stage
    inputs, scans, each fragment's output, exchange buckets) and the tasks' time split
    into reading inputs, the Polars query and writing the output
    (:func:`shoal.runners.profile.analyze_text`). ``format="mermaid"`` returns the stage
    graph as a mermaid flowchart instead of text (with rows out per stage when analyzing).
    Raises ``ValueError`` for another ``format``.

    ``query`` is a shoal IR :class:`~shoal.ir.nodes.PlanNode`, or a frontend's query that
    ``to_ir`` translates (``shoal.explain``, the facade, passes the Polars adapter's for a
    ``LazyFrame``), and ``to_native`` its :class:`~shoal.planner.physical.NativeQuery`,
    which ``analyze`` runs as ``collect`` would for a small query run in this process
    (``small_query_native``). For a query that shoal cannot run, the text says that it would fall
    back to the frontend's engine and names every node and expression that is the reason
    (the same reasons the fallback warning gives). Raises ``FileNotFoundError`` for a
    missing input, ``TypeError`` for a query that is not a plan when ``to_ir`` is None.
    """
    from shoal.ir.explain import explain as explain_ir
    from shoal.planner.physical import plan_physical

    if format not in ("text", "mermaid"):
        raise ValueError(f"explain: format must be 'text' or 'mermaid', not {format!r}")
    cfg = _resolve(runner, config)
    changed = cfg.non_defaults()
    settings = ", ".join(f"{k}={v!r}" for k, v in changed.items()) or "all defaults"
    header = f"Settings (config {cfg.digest()}): {settings}\n\n"
    native = None
    if not isinstance(query, PlanNode):
        if analyze and to_native is not None:
            native = to_native(query)
        if to_ir is None:
            raise TypeError(f"explain: expected a shoal IR plan, got {type(query).__name__}")
        try:
            query = to_ir(query)
        except UnsupportedError as exc:
            # What collect(engine="dist") would do: fall back, for these reasons.
            return header + f"Falls back to the frontend's own engine:\n{exc}"
    from shoal.runners import profile
    from shoal.runners.session import last_query, profiling, running_cpus

    report = None
    if analyze:
        with profiling():
            execute(query, config=cfg, native=native)
        report = last_query()
        assert report is not None
        physical = report.physical
    else:
        physical = plan_physical(query, cfg, running_cpus(cfg))
    if format == "mermaid":
        return profile.mermaid(physical, report)
    text = header + (
        "Logical plan:\n" + explain_ir(query) + "\n\nPhysical plan:\n" + physical.explain()
    )
    if report is not None:
        text += "\n\n" + profile.analyze_text(report)
    return text


def shutdown() -> None:
    """Stop the runner (and a local Ray instance shoal started); runner settings thaw."""
    from shoal.runners.session import shutdown_runner

    shutdown_runner()


def _resolve(runner: RunnerKind | None, config: Config | None) -> Config:
    cfg = config if config is not None else get_config()
    if runner is not None and runner != cfg.runner:
        cfg = cfg.replace(runner=runner)
    return cfg
