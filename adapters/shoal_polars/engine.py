"""The Polars engine ``"dist"``: run ``LazyFrame.collect`` with shoal.

:class:`DistEngine` is a Polars ``InMemoryEngine`` whose post-optimisation callback
translates Polars' optimised plan into the shoal IR and replaces the plan's execution with a
function that runs the IR with shoal (Polars returns that function's result as the query's
result; this is the mechanism the GPU engine uses). When the plan cannot be translated, the
callback leaves the plan alone and Polars runs it itself, after a
:class:`~shoal_polars.fallback.PolarsFallbackWarning` (a ``shoal.ShoalFallbackWarning`` and a
``polars.exceptions.PerformanceWarning``); with ``raise_on_fail`` the query raises
:class:`shoal.UnsupportedError` instead. In Polars' verbose mode (``POLARS_VERBOSE=1``)
shoal also prints to stderr what it ran and where, or why it fell back.

This module imports nothing from ``shoal`` at import time: ``shoal``'s facade imports this
package, and either may be imported first.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

import polars as pl
from polars.exceptions import PanicException as _PanicException
from polars.lazyframe.engine import Engine, InMemoryEngine, StreamingEngine
from polars.lazyframe.in_process import InProcessQuery

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import pyarrow as pa

    from shoal.config import Config, RunnerKind
    from shoal.ir.nodes import PlanNode
    from shoal.planner.physical import NativeQuery
    from shoal.runners.background import BackgroundQuery


def __getattr__(name: str) -> Any:
    # The fallback warning's module imports shoal's facade, which imports this module:
    # reached lazily. ``ShoalFallbackWarning`` is the name this class had before shoal
    # gave every frontend's fallback warning a common base.
    if name in ("PolarsFallbackWarning", "ShoalFallbackWarning"):
        from shoal_polars.fallback import PolarsFallbackWarning

        return PolarsFallbackWarning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _warning() -> type[Warning]:
    from shoal_polars.fallback import PolarsFallbackWarning

    return PolarsFallbackWarning


def _execute(
    plan: PlanNode,
    runner: RunnerKind | None,
    config: Config | None,
    native: NativeQuery | None = None,
) -> pa.Table | pl.DataFrame:
    """Run ``plan`` with shoal (a seam that tests may replace): an Arrow table, or the
    Polars frame of a small query run in this process (``shoal.api.execute``'s
    ``polars_ok``; a sink's list of files is always a table). ``native``: the user's own
    query, which a small query run in this process runs on Polars' engine
    (``small_query_native``)."""
    from shoal.api import execute

    return execute(plan, runner=runner, config=config, polars_ok=True, native=native)


def native_query(lf: pl.LazyFrame, optimizations: pl.QueryOptFlags | None = None) -> NativeQuery:
    """``lf`` as the user collects it, on :func:`native_engine` with the query's own
    optimisation flags (None: Polars' defaults): what a small query run in this process
    runs (``small_query_native``; ``shoal.explain(lf, analyze=True)`` runs it so too). Its
    result has the columns and types Polars' optimised plan gives, which the translated
    plan's schema equals."""
    from shoal.planner.physical import NativeQuery

    engine = native_engine()
    flags = optimizations or pl.QueryOptFlags()

    def run() -> pl.DataFrame:
        out = engine.collect(lf, optimizations=flags)
        assert isinstance(out, pl.DataFrame)
        return out

    return NativeQuery(run, f"Polars' {engine.name} engine")


class DistEngine(InMemoryEngine):
    """Run Polars queries distributed with shoal: ``lf.collect(engine=DistEngine())``, or
    ``lf.collect(engine="dist")`` once :mod:`shoal_polars` is imported.

    ``runner`` is ``"ray"``, ``"local"`` or None (the configured runner); ``config`` is a
    :class:`shoal.Config` (None: :func:`shoal.get_config` when the query runs).
    ``raise_on_fail`` True makes a query that shoal cannot translate raise
    :class:`shoal.UnsupportedError` from ``collect``; False falls back, with a
    :class:`~shoal_polars.fallback.PolarsFallbackWarning`, to the Polars engine the query would have run on without
    shoal (:func:`native_engine`: Polars 2.1's default streaming engine unless
    ``POLARS_ENGINE_AFFINITY`` names another); None (the default) takes
    ``config.raise_on_fail``. An explicit value wins over the config.

    It may be set as Polars' engine affinity
    (``pl.Config.set_engine_affinity(DistEngine(...))``), so that a plain ``collect()``
    runs on shoal. Queries started inside a shoal task never come back to shoal: shoal's
    own collects name their engine, and this engine runs any query that reaches it from a
    task on :func:`native_engine`.

    Settings may be given as keywords, as Polars' ``GPUEngine(raise_on_fail=..., **options)``
    takes cudf-polars' options: ``DistEngine(default_partitions=8, trace="q.json")`` is
    ``DistEngine(config=Config(...))`` over the configured settings (with ``config=``, over
    that one), applied when a query runs. A keyword that is no :class:`shoal.Config` field
    raises ``TypeError`` naming it (and the closest field); a bad value raises what
    :class:`shoal.Config` raises (``ValueError`` naming the setting), here.

    Polars' whole Engine API runs on shoal: ``collect``, ``pl.collect_all``,
    ``collect_batches`` (batches streamed as the result's partitions finish),
    ``collect_async`` and ``pl.collect_all_async``, ``execute`` (a
    :class:`~shoal_polars.results.DistQueryResult` whose data stays where the tasks put it),
    and ``sink_parquet``/``sink_csv``/``sink_ipc``/``sink_ndjson``. Each falls back to
    :func:`native_engine` with a warning (or raises with ``raise_on_fail``) for what shoal
    cannot run; ``sink_batches`` always runs on :func:`native_engine`, with a warning.

    ``collect(background=True)`` runs the query with shoal in a background thread and
    returns a :class:`DistQuery` (Polars' ``InProcessQuery`` interface: ``fetch()``,
    ``fetch_blocking()``, ``cancel()``). ``lf.sink_parquet(path, engine=...)`` runs the
    query with shoal, each task writing its own partition's file(s) (see
    :meth:`sink_parquet`). Polars' internal eager operations run on Polars' engine. Errors
    while shoal runs the query (for example :class:`shoal.TaskError`) propagate from
    ``collect`` unchanged.
    """

    def __init__(
        self,
        *,
        runner: RunnerKind | None = None,
        raise_on_fail: bool | None = None,
        config: Config | None = None,
        **options: Any,
    ) -> None:
        super().__init__()
        if runner not in (None, "ray", "local"):
            raise ValueError(f"DistEngine runner={runner!r}: expected 'ray', 'local' or None")
        if raise_on_fail is not None and not isinstance(raise_on_fail, bool):
            raise ValueError(
                f"DistEngine raise_on_fail={raise_on_fail!r}: expected True, False or None"
            )
        self.runner = runner
        self.raise_on_fail = raise_on_fail
        self.config = config
        self.options = _check_options(options, config)

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return (
            f"DistEngine(runner={self.runner!r}, raise_on_fail={self.raise_on_fail!r}, "
            f"config={self.config!r}{extra})"
        )

    def _config(self) -> Config | None:
        """The settings a query runs with: ``config`` (None: the configured settings, read
        now) with the keyword ``options`` applied; None when neither is given (the runner
        reads the configured settings itself)."""
        if not self.options:
            return self.config
        from shoal.config import get_config

        base = self.config if self.config is not None else get_config()
        return base.replace(**self.options)

    def _should_raise(self) -> bool:
        if self.raise_on_fail is not None:
            return self.raise_on_fail
        config = self._config()
        if config is not None:
            return config.raise_on_fail
        from shoal.config import get_config

        return get_config().raise_on_fail

    def _post_opt_callback(self, *, background: bool, eager: bool) -> Callable[..., None] | None:
        if background or eager:
            return None
        return self._callback

    def _fallback(self, exc: Exception, what: str) -> None:
        """Raise ``exc`` (``raise_on_fail``) or warn that ``what`` runs on Polars."""
        if self._should_raise():
            raise exc
        from shoal_polars.fallback import say

        say(f"{what} to Polars' {native_engine().name} engine: {exc}")
        warnings.warn(
            f"shoal: {what} to Polars' engine: {exc}",
            _warning(),
            stacklevel=_user_stacklevel(),
        )

    def collect(  # type: ignore[override]
        self,
        lf: pl.LazyFrame,
        *,
        optimizations: pl.QueryOptFlags,
        background: bool = False,
        post_opt_callback: Any = None,
    ) -> pl.DataFrame | InProcessQuery:
        """Polars' ``Engine.collect``: run ``lf`` with shoal; with ``background`` the query
        runs with shoal in a background thread and a :class:`DistQuery` is returned at once.

        A query shoal cannot translate runs on :func:`native_engine` (the engine a plain
        ``collect()`` would have used without shoal), after a :class:`~shoal_polars.fallback.PolarsFallbackWarning`,
        or raises :class:`shoal.UnsupportedError` with ``raise_on_fail``. A query started
        inside a shoal task (the user's engine affinity, or a patched ``collect``, reaching
        this engine from a task's own code) runs on :func:`native_engine` at once: it never
        starts a nested shoal query.
        """
        from shoal.execution.scope import in_task

        if post_opt_callback is not None or optimizations._pyoptflags.eager:
            # Polars' own uses (optimised_plan below, internal eager operations): the
            # in-memory engine, as Polars runs them.
            return super().collect(
                lf,
                optimizations=optimizations,
                background=background,
                post_opt_callback=post_opt_callback,
            )
        if in_task():
            return native_engine().collect(lf, optimizations=optimizations, background=background)
        if background:
            return self._collect_background(lf, optimizations)
        from shoal.storage import one_look

        with one_look():  # the column checks and the planner stat each file once
            return self._collect(lf, optimizations)

    def _collect_background(
        self, lf: pl.LazyFrame, optimizations: pl.QueryOptFlags
    ) -> pl.DataFrame | InProcessQuery:
        from shoal.api import execute_background
        from shoal.errors import UnsupportedError

        try:
            plan, schema = optimised_plan(lf, optimizations)
        except UnsupportedError as exc:
            self._fallback(exc, "background collect falls back")
            return native_engine().collect(lf, optimizations=optimizations, background=True)
        query = execute_background(
            plan,
            runner=self.runner,
            config=self._config(),
            convert=lambda table: to_polars_frame(table, schema),
        )
        return DistQuery(query)

    def collect_all(  # type: ignore[override]
        self, lfs: Iterable[pl.LazyFrame], *, optimizations: pl.QueryOptFlags
    ) -> list[pl.DataFrame]:
        """Polars' ``Engine.collect_all`` (``pl.collect_all(..., engine=...)``): the queries
        run together as one shoal query, sub-plans they share computed once.

        Polars optimises the queries together, as its own ``collect_all`` does (its common
        sub-plan elimination across queries puts a ``Cache`` over each shared part, with the
        union of the columns the queries read and a filter pushed into it only when every
        query has it); :func:`optimised_plans` translates them, and
        :func:`shoal.api.execute_many` runs one physical plan where each shared part is one
        stage (a shared filtered scan included) that each query reads, and the stages of
        different queries run side by side. ``last_query()`` reports all of them.

        A query shoal cannot translate runs on its own (:meth:`collect`: on
        :func:`native_engine` after the fallback warning, or raising with
        ``raise_on_fail``) before the others start; the rest still run together. Returns
        the frames in the order of ``lfs``, each exactly as ``collect`` would give it."""
        from shoal.api import execute_many
        from shoal.execution.scope import in_task
        from shoal_polars.fallback import ran

        lfs = list(lfs)
        if in_task():
            return native_engine().collect_all(lfs, optimizations=optimizations)
        if len(lfs) < 2:
            return [self._collected(lf, optimizations) for lf in lfs]
        found = optimised_plans(lfs, optimizations)
        out: list[pl.DataFrame | None] = [None] * len(lfs)
        for i, f in enumerate(found):
            if f is None:  # runs alone: on shoal after all, or on Polars with the warning
                out[i] = self._collected(lfs[i], optimizations)
        todo = [i for i, f in enumerate(found) if f is not None]
        if todo:
            plans = [found[i][0] for i in todo]  # type: ignore[index]
            tables = execute_many(plans, runner=self.runner, config=self._config())
            for i, table in zip(todo, tables, strict=True):
                out[i] = to_polars_frame(table, found[i][1])  # type: ignore[index]
            ran(f"{len(todo)} queries of collect_all, as one plan,")
        return [df for df in out if df is not None]

    def _collected(self, lf: pl.LazyFrame, optimizations: pl.QueryOptFlags) -> pl.DataFrame:
        df = self.collect(lf, optimizations=optimizations)
        assert isinstance(df, pl.DataFrame)
        return df

    def collect_batches(  # type: ignore[override]
        self,
        lf: pl.LazyFrame,
        *,
        optimizations: pl.QueryOptFlags,
        maintain_order: bool = True,
        chunk_size: int | None = None,
        lazy: bool = False,
    ) -> Any:
        """Polars' ``Engine.collect_batches``: see
        :func:`shoal_polars.results.collect_batches` (the result's partitions streamed in
        order as they finish)."""
        from shoal_polars.results import collect_batches

        return collect_batches(
            self, lf, optimizations, maintain_order=maintain_order, chunk_size=chunk_size,
            lazy=lazy,
        )  # fmt: skip

    def collect_async(  # type: ignore[override]
        self, lf: pl.LazyFrame, *, optimizations: pl.QueryOptFlags, gevent: bool = False
    ) -> Any:
        """Polars' ``Engine.collect_async``: see :func:`shoal_polars.results.collect_async`."""
        from shoal_polars.results import collect_async

        return collect_async(self, [lf], optimizations, gevent=gevent, single=True)

    def collect_all_async(  # type: ignore[override]
        self,
        lfs: Iterable[pl.LazyFrame],
        *,
        optimizations: pl.QueryOptFlags,
        gevent: bool = False,
    ) -> Any:
        """Polars' ``Engine.collect_all_async``: see
        :func:`shoal_polars.results.collect_async`."""
        from shoal_polars.results import collect_async

        return collect_async(self, list(lfs), optimizations, gevent=gevent, single=False)

    def execute(self, lf: pl.LazyFrame, *, optimizations: pl.QueryOptFlags) -> Any:  # type: ignore[override]
        """Polars' ``Engine.execute`` (``lf.execute(engine=...)``): see
        :func:`shoal_polars.results.execute` (a query result that stays in Ray's object
        store until read)."""
        from shoal_polars.results import execute

        return execute(self, lf, optimizations)

    def sink_batches(self, lf: pl.LazyFrame, function: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Polars' ``Engine.sink_batches``: the function runs on the driver, once per
        batch, so the query runs on :func:`native_engine`, after a warning (or raises
        :class:`shoal.UnsupportedError` with ``raise_on_fail``); ``collect_batches`` runs on
        shoal."""
        from shoal.errors import UnsupportedError
        from shoal.execution.scope import in_task

        if not in_task():
            self._fallback(
                UnsupportedError("sink_batches calls a Python function on the driver per batch"),
                "sink_batches falls back",
            )
        native_engine().sink_batches(lf, function, **kwargs)

    def sink_csv(self, lf: pl.LazyFrame, path: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Polars' ``Engine.sink_csv``, distributed as :meth:`sink_parquet` is (the same
        layouts; every CSV writer option goes to Polars' writer in each task, so each
        file of a ``PartitionBy`` target has its own header, as Polars writes them)."""
        self._sink("csv", lf, path, kwargs)

    def sink_ipc(self, lf: pl.LazyFrame, path: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Polars' ``Engine.sink_ipc`` (Arrow IPC files), distributed as
        :meth:`sink_parquet` is."""
        self._sink("ipc", lf, path, kwargs)

    def sink_ndjson(self, lf: pl.LazyFrame, path: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Polars' ``Engine.sink_ndjson``, distributed as :meth:`sink_parquet` is."""
        self._sink("ndjson", lf, path, kwargs)

    def sink_parquet(self, lf: pl.LazyFrame, path: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """Polars' ``Engine.sink_parquet``: run ``lf`` with shoal, each task writing its own
        output partition's file(s), in Polars 2.1's layouts:

        * a file path: one file with exactly Polars' rows in Polars' order (a gather, then
          one writer task);
        * ``pl.PartitionBy(base, max_rows_per_file=, approximate_bytes_per_file=)``: files
          ``base/00000000.parquet``, ``00000001``, ... written in parallel, one or more per
          partition, renamed into order on the driver (each has at most
          ``max_rows_per_file`` rows; reading them in name order gives Polars' rows in
          order);
        * ``pl.PartitionBy(base, key=<columns>)``: hive directories ``base/<col>=<value>/``
          written by the tasks of a hash exchange on the keys (one task per key).

        ``compression``, ``compression_level``, ``statistics``, ``row_group_size``,
        ``data_page_size``, ``metadata`` (a dict), ``sync_on_close`` and ``mkdir`` go to
        Polars' writer in each task; ``sinked_paths_callback`` is called once on the
        driver with every file (paths as Polars gives them). What shoal cannot honour (a
        file-like or cloud target, storage options, ``arrow_schema``, ``encryption``,
        ``PartitionBy`` with a ``file_path_provider`` or expression keys) and queries it
        cannot translate fall back to the sink of :func:`native_engine` (Polars'
        streaming engine by default) with a :class:`~shoal_polars.fallback.PolarsFallbackWarning`, or raise
        :class:`shoal.UnsupportedError` with ``raise_on_fail``; inside a shoal task the sink
        runs there at once. A bad target raises before any task runs, naming the path
        (``IsADirectoryError``, ``FileNotFoundError``, ``NotADirectoryError``).
        """
        self._sink("parquet", lf, path, kwargs)

    def _sink(self, fmt: str, lf: pl.LazyFrame, path: Any, kwargs: dict[str, Any]) -> None:
        """``sink_<fmt>`` on shoal (see :meth:`sink_parquet`), or on
        :func:`native_engine` for what shoal cannot honour."""
        from shoal.errors import UnsupportedError
        from shoal.execution.scope import in_task
        from shoal_polars.sink import sink_plan, user_path

        native = getattr(native_engine(), f"sink_{fmt}")
        if in_task():  # never a nested shoal query from a task (see collect)
            native(lf, path, **kwargs)
            return
        takes_callback = "sinked_paths_callback" in kwargs  # parquet and ipc
        callback = kwargs.pop("sinked_paths_callback", None)
        optimizations = kwargs.pop("optimizations")
        writer = {k: v for k, v in kwargs.items() if k != "maintain_order"}
        try:
            plan, _ = optimised_plan(lf, optimizations)
            sink = sink_plan(plan, path, fmt=fmt, **writer)
        except UnsupportedError as exc:
            self._fallback(exc, f"sink_{fmt} falls back")
            if takes_callback:
                kwargs["sinked_paths_callback"] = callback
            native(lf, path, optimizations=optimizations, **kwargs)
            return
        written = _execute(sink, self.runner, self._config())
        assert not isinstance(written, pl.DataFrame)  # a sink gives its files as a table
        from shoal_polars.fallback import ran

        ran(f"sink_{fmt}")
        if callback is not None:
            from polars.io.partition import SinkedPath, SinkedPathsCallbackArgs

            to_user = user_path(sink, path)
            callback(
                SinkedPathsCallbackArgs(
                    paths=[
                        SinkedPath(path=to_user(p), num_rows=r, num_bytes=b)
                        for p, r, b in zip(
                            written["path"].to_pylist(),
                            written["rows"].to_pylist(),
                            written["bytes"].to_pylist(),
                            strict=True,
                        )
                    ]
                )
            )

    def _collect(self, lf: pl.LazyFrame, optimizations: pl.QueryOptFlags) -> pl.DataFrame:
        """``collect`` on shoal. A query whose only untranslatable parts are scans or
        ``list.eval`` expressions that Polars does not show to engines runs again,
        rewritten (:mod:`shoal_polars.rewrite`: such sources read on the driver, ``Eval``
        expressions carried through); if it cannot be rewritten, it falls back (or
        raises) for the original reasons."""
        from shoal.errors import UnsupportedError
        from shoal_polars.rewrite import labelled, rewrite

        needed: list[Exception] = []
        needed_schema: list[Any] = []

        state: dict[str, Any] = {}

        def first(nt: Any, *args: Any) -> None:
            schema = _schema_or_none(nt)
            if schema is None:
                # The panic poisoned the NodeTraverser: touch it no more (Polars then
                # panics too, below).
                state["schema_panic"] = True
                return
            needed_schema.append(schema)
            self._translate_or_fall_back(
                nt,
                state,
                _plan_text(lf, optimizations),
                deferred=needed,
                native=native_query(lf, optimizations),
            )

        try:
            out = super().collect(lf, optimizations=optimizations, post_opt_callback=first)
        except _PanicException:
            if not state.get("schema_panic"):
                raise
            why = UnsupportedError(
                "the plan's schema has a type that Polars cannot show to engines "
                "(NodeTraverser.get_schema panicked, e.g. the binary[offset] of _row_encode)"
            )
            self._fallback(why, "falling back")
            return native_engine().collect(lf, optimizations=optimizations)  # type: ignore[return-value]
        if state.get("fallback"):
            return native_engine().collect(lf, optimizations=optimizations)  # type: ignore[return-value]
        if not needed:
            assert isinstance(out, pl.DataFrame)
            return out
        try:
            rewritten, done = rewrite(lf)
        except Exception as exc:
            why = UnsupportedError(f"{needed[0]}\n(the query cannot be rewritten: {exc})")
            self._fallback(why, "falling back")
            return native_engine().collect(lf, optimizations=optimizations)  # type: ignore[return-value]
        failed: list[Exception] = []

        def second(nt: Any, *args: Any) -> None:
            # The rewritten query must give exactly the original's columns and types.
            schema = nt.get_schema()
            if schema != needed_schema[0]:
                failed.append(UnsupportedError("the rewritten query's schema differs"))
                nt.set_udf(lambda *_: pl.DataFrame(schema=schema))
                return
            self._translate_or_fall_back(
                nt,
                None,
                _plan_text(rewritten, optimizations),
                deferred=failed,
                defer_all=True,
            )

        with labelled(done):
            got = super().collect(rewritten, optimizations=optimizations, post_opt_callback=second)
        if failed:
            # The rewritten query is shoal's to run, never Polars': fall back on the original.
            self._fallback(failed[0], "falling back")
            return native_engine().collect(lf, optimizations=optimizations)  # type: ignore[return-value]
        assert isinstance(got, pl.DataFrame)
        return got

    def _callback(self, nt: Any, *args: Any, plan_text: Callable[[], str] | None = None) -> None:
        """Polars' post-optimisation callback (for callers that run this engine's
        ``_post_opt_callback`` themselves): translate and run with shoal, or leave the plan
        to Polars' in-memory engine (fallback). :meth:`collect` falls back to
        :func:`native_engine` instead."""
        self._translate_or_fall_back(nt, None, plan_text)

    def _translate_or_fall_back(
        self,
        nt: Any,
        state: dict[str, Any] | None,
        plan_text: Callable[[], str] | None,
        deferred: list[Exception] | None = None,
        defer_all: bool = False,
        native: NativeQuery | None = None,
    ) -> None:
        """Translate the plan and hand Polars the function that runs it with shoal; or,
        when it cannot be translated, raise (``raise_on_fail``) or warn, then: with a
        ``state``, set ``state["fallback"]`` and hand Polars a function returning an empty
        frame (the caller runs the query on :func:`native_engine`); without, leave the plan
        to Polars. Inside a shoal task the plan is left to Polars untouched. ``plan_text``
        gives Polars' text of the plan (see :func:`shoal_polars.translate.translate_plan`).
        With ``deferred``, a plan that needs rewriting
        (:class:`~shoal_polars.rewrite.RewriteNeeded`; any failure with ``defer_all``) is not
        run: the error is appended to ``deferred`` for the caller (:meth:`_collect`) and
        Polars gets an empty frame. ``native``: the user's query as Polars runs it, for a
        small query run in this process (``small_query_native``)."""
        from shoal.errors import UnsupportedError
        from shoal.execution.scope import in_task
        from shoal_polars.rewrite import RewriteNeeded
        from shoal_polars.translate import translate_plan

        if in_task():
            return
        expected = nt.get_schema()
        try:
            plan = translate_plan(nt, plan_text)
        except (Exception, _PanicException) as exc:
            exc = _unpanicked(exc)
            if deferred is not None and (defer_all or isinstance(exc, RewriteNeeded)):
                deferred.append(exc)
                nt.set_udf(lambda *_: pl.DataFrame(schema=expected))
                return
            unsupported = isinstance(exc, UnsupportedError)
            if self._should_raise():
                # Polars turns an exception raised by the callback itself into a
                # ComputeError ("'cuda' conversion failed: ..."), losing its class; an
                # exception raised by the function given to set_udf propagates unchanged.
                nt.set_udf(_raiser(exc))
                return
            reason = str(exc) if unsupported else f"translation failed: {type(exc).__name__}: {exc}"
            from shoal_polars.fallback import say

            say(f"falling back to Polars' {native_engine().name} engine: {reason}")
            try:
                warnings.warn(
                    f"shoal: falling back to Polars' engine: {reason}",
                    _warning(),
                    stacklevel=_user_stacklevel(),
                )
            except Warning as w:  # warnings turned into errors: report as such
                nt.set_udf(_raiser(w))
                return
            if state is not None:
                state["fallback"] = True
                nt.set_udf(lambda *_: pl.DataFrame(schema=expected))
            return

        def run(*_: Any) -> pl.DataFrame:
            from shoal.errors import SchemaMismatchError

            try:
                table = _execute(plan, self.runner, self._config(), native)
            except SchemaMismatchError as exc:
                raise _schema_mismatch_class()(str(exc)) from None
            out = to_polars_frame(table, expected)
            from shoal_polars.fallback import ran

            ran("the query")
            return out

        nt.set_udf(run)


_schema_mismatch: list[type[Exception]] = []


def _schema_mismatch_class() -> type[Exception]:
    """:class:`shoal.errors.SchemaMismatchError` as a Polars user meets it: a class that is
    also a ``polars.exceptions.SchemaError``, what Polars' ``scan_parquet`` raises when its
    files disagree on a column's type (``except shoal.PlanError`` still catches it). Made on
    first use: ``shoal`` imports this package, so this module cannot import ``shoal`` at
    its top."""
    if not _schema_mismatch:
        from shoal.errors import SchemaMismatchError

        _schema_mismatch.append(
            type(
                "SchemaMismatchError",
                (pl.exceptions.SchemaError, SchemaMismatchError),
                {"__module__": __name__, "__doc__": _schema_mismatch_class.__doc__},
            )
        )
    return _schema_mismatch[0]


def _check_options(options: dict[str, Any], config: Config | None) -> dict[str, Any]:
    """``DistEngine``'s keyword settings, checked now: each must be a :class:`shoal.Config`
    field (``TypeError`` naming it and the closest field) with a valid value (what
    ``Config`` raises)."""
    if not options:
        return {}
    import dataclasses
    import difflib

    from shoal.config import Config

    names = sorted(f.name for f in dataclasses.fields(Config))
    for key in options:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"DistEngine() got an unexpected keyword argument {key!r}: it is no shoal "
                f"setting{hint} (settings: shoal.Config's fields)"
            )
    (config if config is not None else Config()).replace(**options)  # checks the values
    return dict(options)


def native_engine() -> Engine:
    """The Polars engine a plain ``collect()`` would use without shoal: the one named by
    ``POLARS_ENGINE_AFFINITY`` (what ``pl.Config.set_engine_affinity("in-memory")`` sets),
    else Polars 2.1's default, the streaming engine. An engine *object* set as the
    affinity is never taken (it may be a :class:`DistEngine`): shoal's fallbacks and the
    queries started inside a task run here."""
    name = os.environ.get("POLARS_ENGINE_AFFINITY", "auto")
    if name in ("in-memory", "cpu"):
        return InMemoryEngine()
    if name == "gpu":
        return pl.GPUEngine()
    return StreamingEngine()


def _schema_or_none(nt: Any) -> Any:
    """``nt.get_schema()``, or None where Polars panics turning a type of the plan's schema
    into Python (Polars 2.1: the ``binary[offset]`` of ``Expr._row_encode``, "not
    implemented"): such a plan is not shoal's to run, and the panic leaves ``nt`` unusable
    (its lock is poisoned)."""
    try:
        return nt.get_schema()
    except _PanicException:
        return None


def _unpanicked(exc: BaseException) -> Exception:
    """``exc``, or for a Polars panic (a ``BaseException``, which no ``except Exception``
    catches) an :class:`shoal.UnsupportedError` saying where Polars panicked."""
    if isinstance(exc, Exception):
        return exc
    from shoal.errors import UnsupportedError

    return UnsupportedError(f"Polars panicked while shoal read its plan: {exc}")


def _plan_text(lf: pl.LazyFrame, optimizations: pl.QueryOptFlags) -> Callable[[], str]:
    """Polars' text of ``lf``'s optimised plan, when called (see ``translate_plan``)."""
    return lambda: lf.explain(engine="in-memory", optimizations=optimizations)


def _raiser(exc: BaseException) -> Callable[..., pl.DataFrame]:
    def raise_it(*_: Any) -> pl.DataFrame:
        raise exc

    return raise_it


def _user_stacklevel() -> int:
    """The stacklevel of the first frame outside Polars and this package (the caller of
    ``collect``), for warnings."""
    skip = (os.path.dirname(pl.__file__), os.path.dirname(__file__))
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


def to_polars_frame(table: pa.Table | pl.DataFrame, schema: Any) -> pl.DataFrame:
    """``table`` (an Arrow table, or a Polars frame as shoal may return a small query's
    result) as a ``polars.DataFrame`` with exactly Polars' expected ``schema`` (names,
    order and dtypes). Raises :class:`shoal.PlanError` when the columns differ."""
    from shoal.errors import PlanError
    from shoal.execution.kernel import frame_of

    df = table if isinstance(table, pl.DataFrame) else frame_of(table)
    expected = pl.Schema(schema)
    if df.columns != list(expected.names()):
        raise PlanError(
            f"shoal returned columns {df.columns}, Polars expects {list(expected.names())}"
        )
    if df.schema != expected:
        df = df.cast(dict(expected))  # type: ignore[arg-type]
    return df


class DistQuery(InProcessQuery):
    """A query running with shoal in the background (``collect(background=True)`` on a
    :class:`DistEngine`), with Polars' ``InProcessQuery`` interface."""

    def __init__(self, query: BackgroundQuery) -> None:
        # Polars' InProcessQuery wraps a Rust handle; this one wraps shoal's instead.
        self._query = query

    def cancel(self) -> None:
        """Cancel the query: every task of it is cancelled and its actor pools torn down;
        returns once they have stopped (within seconds), leaving the runner ready for the
        next query. ``fetch_blocking()`` then raises :class:`shoal.QueryCancelledError`."""
        self._query.cancel()

    def fetch(self) -> pl.DataFrame | None:
        """The result if the query has finished, else None; raises the query's error if it
        failed."""
        if not self._query.done():
            return None
        return self.fetch_blocking()

    def fetch_blocking(self) -> pl.DataFrame:
        """Wait for the result; raises the query's error if it failed (for example
        :class:`shoal.TaskError`, or :class:`shoal.QueryCancelledError` after
        :meth:`cancel`)."""
        out = self._query.result()
        assert isinstance(out, pl.DataFrame)
        return out


def to_ir(lf: pl.LazyFrame, *, optimizations: pl.QueryOptFlags | None = None) -> PlanNode:
    """The shoal IR of ``lf`` after Polars' optimiser, without running the query.

    Raises :class:`shoal.UnsupportedError` (naming every unsupported part) when shoal cannot
    translate the plan.
    """
    return optimised_plan(lf, optimizations)[0]


def optimised_plan(
    lf: pl.LazyFrame, optimizations: pl.QueryOptFlags | None = None
) -> tuple[PlanNode, pl.Schema]:
    """``lf``'s shoal IR after Polars' optimiser, and the schema Polars gives its result
    (see :func:`to_ir`)."""
    from shoal.errors import UnsupportedError

    found: dict[str, Any] = {}
    flags = optimizations or pl.QueryOptFlags()
    query = [lf]  # the query being translated (the rewritten one on the second pass)

    def record(nt: Any, *args: Any) -> None:
        from shoal_polars.translate import translate_plan

        schema = found["schema"] = nt.get_schema()
        try:
            found["plan"] = translate_plan(nt, _plan_text(query[0], flags))
        except (Exception, _PanicException) as exc:
            nt.set_udf(_raiser(_unpanicked(exc)))
            return
        nt.set_udf(lambda *_: pl.DataFrame(schema=schema))

    from shoal_polars.rewrite import RewriteNeeded, labelled, rewrite

    try:
        InMemoryEngine().collect(lf, optimizations=flags, post_opt_callback=record)
    except RewriteNeeded as exc:
        # Parts Polars does not show to engines: recover them from the query, translate again.
        try:
            rewritten, done = rewrite(lf)
        except UnsupportedError as why:
            raise UnsupportedError(f"{exc}\n(the query cannot be rewritten: {why})") from why
        query[0] = rewritten
        with labelled(done):
            InMemoryEngine().collect(rewritten, optimizations=flags, post_opt_callback=record)
    if "plan" not in found:  # pragma: no cover - Polars did not call the callback
        raise RuntimeError("Polars did not hand its optimised plan to shoal")
    return found["plan"], pl.Schema(found["schema"])


class _Translated(Exception):
    """Raised from the post-optimisation callback of :func:`optimised_plans` once the
    plans are translated, so that Polars runs nothing."""


def optimised_plans(
    lfs: list[pl.LazyFrame], optimizations: pl.QueryOptFlags | None = None
) -> list[tuple[PlanNode, pl.Schema] | None]:
    """The shoal IR and result schema of each query of ``lfs``, optimised together as
    Polars' ``collect_all`` optimises them (see :meth:`DistEngine.collect_all`): a sub-plan
    several queries share is one IR node object that each of their plans holds. None for a
    query that shoal cannot translate (nothing is warned here: the caller runs it alone).

    Polars shows the queries together only as ``pl.collect_all([...sinks], lazy=True)``, a
    ``SinkMultiple`` over one sink per query: each query is given an IPC sink to a path in a
    directory that does not exist (``mkdir=False``), and the callback stops Polars once the
    plans below the sinks are translated, so that nothing is written. When a query cannot
    be translated, the others are optimised together again without it; a query whose plan
    needs rewriting (:mod:`shoal_polars.rewrite`) is translated alone."""
    flags = optimizations or pl.QueryOptFlags()
    try:
        return list(_optimised_together(lfs, flags))
    except (Exception, _PanicException):
        pass
    alone: list[tuple[PlanNode, pl.Schema] | None] = []
    for lf in lfs:
        try:
            alone.append(optimised_plan(lf, flags))
        except (Exception, _PanicException):
            alone.append(None)
    ok = [i for i, f in enumerate(alone) if f is not None]
    if 1 < len(ok) < len(lfs):
        try:
            together = _optimised_together([lfs[i] for i in ok], flags)
        except (Exception, _PanicException):
            return alone
        for i, f in zip(ok, together, strict=True):
            alone[i] = f
    return alone


def _optimised_together(
    lfs: list[pl.LazyFrame], flags: pl.QueryOptFlags
) -> list[tuple[PlanNode, pl.Schema]]:
    """Every query's IR and schema from one optimisation of them all (see
    :func:`optimised_plans`); raises what translating raises."""
    import tempfile
    import uuid

    from shoal_polars.translate import translate_roots

    nowhere = os.path.join(tempfile.gettempdir(), f"shoal-never-written-{uuid.uuid4().hex}")
    sinks = [
        lf.sink_ipc(os.path.join(nowhere, f"{i}.ipc"), lazy=True, mkdir=False)
        for i, lf in enumerate(lfs)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pl.exceptions.UnstableWarning)
        together = pl.collect_all(sinks, lazy=True, optimizations=flags)
    found: dict[str, Any] = {}

    def record(nt: Any, *args: Any) -> None:
        try:
            roots: list[int | None] = []
            schemas = []
            for sink in nt.get_inputs():
                nt.set_node(sink)
                (root,) = nt.get_inputs()
                nt.set_node(root)
                roots.append(root)
                schemas.append(pl.Schema(nt.get_schema()))
            plans = translate_roots(nt, roots, _plan_text(together, flags))
            found["plans"] = list(zip(plans, schemas, strict=True))
        except (Exception, _PanicException) as exc:
            found["error"] = _unpanicked(exc)
        raise _Translated

    try:
        InMemoryEngine().collect(together, optimizations=flags, post_opt_callback=record)
    except pl.exceptions.ComputeError:
        if not found:
            raise
    if "error" in found:
        raise found["error"]
    if len(found.get("plans", ())) != len(lfs):  # pragma: no cover - Polars changed
        raise RuntimeError("Polars did not hand shoal one plan per query of collect_all")
    return found["plans"]  # type: ignore[no-any-return]
