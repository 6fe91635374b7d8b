"""The Polars engine ``"dist"``: run ``LazyFrame.collect`` with shoal.

:class:`DistEngine` is a Polars ``InMemoryEngine`` whose post-optimisation callback
translates Polars' optimised plan into the shoal IR and replaces the plan's execution with a
function that runs the IR with shoal (Polars returns that function's result as the query's
result; this is the mechanism the GPU engine uses). When the plan cannot be translated, the
callback leaves the plan alone and Polars runs it itself, after a
:class:`ShoalFallbackWarning`; with ``raise_on_fail`` the query raises
:class:`shoal.UnsupportedError` instead.

This module imports nothing from ``shoal`` at import time: ``shoal``'s facade imports this
package, and either may be imported first.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any

import polars as pl
from polars.lazyframe.engine import InMemoryEngine, StreamingEngine
from polars.lazyframe.in_process import InProcessQuery

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from shoal.config import Config, RunnerKind
    from shoal.ir.nodes import PlanNode
    from shoal.runners.background import BackgroundQuery


class ShoalFallbackWarning(UserWarning):
    """A query that shoal could not translate ran on Polars' own engine instead.

    The message gives the reason (each unsupported Polars node and expression).
    """


def _execute(plan: PlanNode, runner: RunnerKind | None, config: Config | None) -> pa.Table:
    """Run ``plan`` with shoal (a seam that tests may replace)."""
    from shoal.api import execute

    return execute(plan, runner=runner, config=config)


class DistEngine(InMemoryEngine):
    """Run Polars queries distributed with shoal: ``lf.collect(engine=DistEngine())``, or
    ``lf.collect(engine="dist")`` once :mod:`shoal_polars` is imported.

    ``runner`` is ``"ray"``, ``"local"`` or None (the configured runner); ``config`` is a
    :class:`shoal.Config` (None: :func:`shoal.get_config` when the query runs).
    ``raise_on_fail`` True makes a query that shoal cannot translate raise
    :class:`shoal.UnsupportedError` from ``collect``; False falls back to Polars' in-memory
    engine with a :class:`ShoalFallbackWarning`; None (the default) takes
    ``config.raise_on_fail``. An explicit value wins over the config.

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
    ) -> None:
        super().__init__()
        if runner not in (None, "ray", "local"):
            raise ValueError(f"DistEngine runner={runner!r}: expected 'ray', 'local' or None")
        self.runner = runner
        self.raise_on_fail = raise_on_fail
        self.config = config

    def __repr__(self) -> str:
        return (
            f"DistEngine(runner={self.runner!r}, raise_on_fail={self.raise_on_fail!r}, "
            f"config={self.config!r})"
        )

    def _should_raise(self) -> bool:
        if self.raise_on_fail is not None:
            return self.raise_on_fail
        if self.config is not None:
            return self.config.raise_on_fail
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
        warnings.warn(
            f"shoal: {what} to Polars' engine: {exc}",
            ShoalFallbackWarning,
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
        """Polars' ``Engine.collect``; with ``background`` the query runs with shoal in a
        background thread and a :class:`DistQuery` is returned at once (falling back to
        Polars' background collection, as ``collect`` falls back)."""
        if not background or post_opt_callback is not None:
            if post_opt_callback is None and not optimizations._pyoptflags.eager:
                # The callback with this query's plan text at hand (see translate_plan).
                text = _plan_text(lf, optimizations)

                def post_opt_callback(nt: Any, *args: Any) -> None:
                    self._callback(nt, *args, plan_text=text)

            return super().collect(
                lf,
                optimizations=optimizations,
                background=background,
                post_opt_callback=post_opt_callback,
            )
        from shoal.api import execute_background
        from shoal.errors import UnsupportedError

        try:
            plan, schema = optimised_plan(lf, optimizations)
        except UnsupportedError as exc:
            self._fallback(exc, "background collect falls back")
            return super().collect(lf, optimizations=optimizations, background=True)
        query = execute_background(
            plan,
            runner=self.runner,
            config=self.config,
            convert=lambda table: to_polars_frame(table, schema),
        )
        return DistQuery(query)

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
        cannot translate fall back to Polars' streaming sink with a
        :class:`ShoalFallbackWarning`, or raise :class:`shoal.UnsupportedError` with
        ``raise_on_fail``. A bad target raises before any task runs, naming the path
        (``IsADirectoryError``, ``FileNotFoundError``, ``NotADirectoryError``).
        """
        from shoal.errors import UnsupportedError
        from shoal_polars.sink import sink_plan, user_path

        callback = kwargs.pop("sinked_paths_callback", None)
        optimizations = kwargs.pop("optimizations")
        writer = {k: v for k, v in kwargs.items() if k != "maintain_order"}
        try:
            plan, _ = optimised_plan(lf, optimizations)
            sink = sink_plan(plan, path, **writer)
        except UnsupportedError as exc:
            self._fallback(exc, "sink_parquet falls back")
            StreamingEngine().sink_parquet(
                lf, path, optimizations=optimizations, sinked_paths_callback=callback, **kwargs
            )
            return
        written = _execute(sink, self.runner, self.config)
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

    def _callback(self, nt: Any, *args: Any, plan_text: Callable[[], str] | None = None) -> None:
        """Polars' post-optimisation callback: translate, then hand Polars the function
        that runs the plan, or leave the plan to Polars (fallback). ``plan_text`` gives
        Polars' text of the plan (see :func:`shoal_polars.translate.translate_plan`)."""
        from shoal.errors import UnsupportedError
        from shoal_polars.translate import translate_plan

        expected = nt.get_schema()
        try:
            plan = translate_plan(nt, plan_text)
        except Exception as exc:
            unsupported = isinstance(exc, UnsupportedError)
            if self._should_raise():
                # Polars turns an exception raised by the callback itself into a
                # ComputeError ("'cuda' conversion failed: ..."), losing its class; an
                # exception raised by the function given to set_udf propagates unchanged.
                nt.set_udf(_raiser(exc))
                return
            reason = str(exc) if unsupported else f"translation failed: {type(exc).__name__}: {exc}"
            try:
                warnings.warn(
                    f"shoal: falling back to Polars' engine: {reason}",
                    ShoalFallbackWarning,
                    stacklevel=_user_stacklevel(),
                )
            except Warning as w:  # warnings turned into errors: report as such
                nt.set_udf(_raiser(w))
            return

        def run(*_: Any) -> pl.DataFrame:
            return to_polars_frame(_execute(plan, self.runner, self.config), expected)

        nt.set_udf(run)


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


def to_polars_frame(table: pa.Table, schema: Any) -> pl.DataFrame:
    """``table`` as a ``polars.DataFrame`` with exactly Polars' expected ``schema`` (names,
    order and dtypes). Raises :class:`shoal.PlanError` when the columns differ."""
    from shoal.errors import PlanError

    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
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
    found: dict[str, Any] = {}

    def record(nt: Any, *args: Any) -> None:
        from shoal_polars.translate import translate_plan

        schema = found["schema"] = nt.get_schema()
        try:
            found["plan"] = translate_plan(nt, _plan_text(lf, optimizations or pl.QueryOptFlags()))
        except Exception as exc:
            nt.set_udf(_raiser(exc))
            return
        nt.set_udf(lambda *_: pl.DataFrame(schema=schema))

    InMemoryEngine().collect(
        lf, optimizations=optimizations or pl.QueryOptFlags(), post_opt_callback=record
    )
    if "plan" not in found:  # pragma: no cover - Polars did not call the callback
        raise RuntimeError("Polars did not hand its optimised plan to shoal")
    return found["plan"], pl.Schema(found["schema"])
