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
from polars.lazyframe.engine import InMemoryEngine

if TYPE_CHECKING:
    from collections.abc import Callable

    import pyarrow as pa

    from shoal.config import Config, RunnerKind
    from shoal.ir.nodes import PlanNode


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

    Background collection (``collect(background=True)``) and Polars' internal eager
    operations run on Polars' engine. Errors while shoal runs the query (for example
    :class:`shoal.TaskError`) propagate from ``collect`` unchanged.
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

    def _callback(self, nt: Any, *args: Any) -> None:
        """Polars' post-optimisation callback: translate, then hand Polars the function
        that runs the plan, or leave the plan to Polars (fallback)."""
        from shoal.errors import UnsupportedError
        from shoal_polars.translate import translate_plan

        expected = nt.get_schema()
        try:
            plan = translate_plan(nt)
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


def to_ir(lf: pl.LazyFrame, *, optimizations: pl.QueryOptFlags | None = None) -> PlanNode:
    """The shoal IR of ``lf`` after Polars' optimiser, without running the query.

    Raises :class:`shoal.UnsupportedError` (naming every unsupported part) when shoal cannot
    translate the plan.
    """
    found: dict[str, Any] = {}

    def record(nt: Any, *args: Any) -> None:
        from shoal_polars.translate import translate_plan

        schema = nt.get_schema()
        try:
            found["plan"] = translate_plan(nt)
        except Exception as exc:
            nt.set_udf(_raiser(exc))
            return
        nt.set_udf(lambda *_: pl.DataFrame(schema=schema))

    InMemoryEngine().collect(
        lf, optimizations=optimizations or pl.QueryOptFlags(), post_opt_callback=record
    )
    if "plan" not in found:  # pragma: no cover - Polars did not call the callback
        raise RuntimeError("Polars did not hand its optimised plan to shoal")
    return found["plan"]
