"""shoal: a pluggable distributed execution backend for Polars and DuckDB, on Ray.

Public names: :class:`DistEngine` (the Polars engine ``"dist"``), :func:`explain`,
``duckdb`` (the DuckDB adapter, once installed), :mod:`ir`, :func:`execute`,
:func:`execute_many`, :func:`execute_batches`, :func:`udf`, :func:`trace`, :class:`Config`, :func:`get_config`,
:func:`set_config`, :func:`execution_config`, :func:`shutdown` and the errors
:class:`ShoalError`, :class:`UnsupportedError`, :class:`PlanError`,
:class:`ConfigFrozenError`, :class:`TaskError`, :class:`UdfError`,
:class:`QueryCancelledError`, :class:`VersionMismatchError`, the warning base class
:class:`ShoalWarning` and :class:`ShoalFallbackWarning` (every frontend's fallback warning
derives from it), :class:`QueryResult` with :func:`execute_result` (a result left in Ray's
object store) and :func:`to_ray_dataset`, and ``__version__``.

Note that ``shoal.udf`` is the decorator; its module is ``sys.modules["shoal.udf"]`` (import
names from it with ``from shoal.udf import UDF``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any, Literal

from shoal import ir
from shoal import plan as _plan  # noqa: F401  (adds the builder and validate to shoal.ir)
from shoal.api import execute, execute_batches, execute_many, shutdown
from shoal.api import explain as _explain
from shoal.config import Config, execution_config, get_config, set_config
from shoal.errors import (
    ConfigFrozenError,
    PlanError,
    QueryCancelledError,
    ShoalError,
    ShoalFallbackWarning,
    ShoalWarning,
    TaskError,
    UnsupportedError,
    VersionMismatchError,
)
from shoal.execution import kernel as _kernel  # noqa: F401  (registers the nodes tasks run outside Polars)
from shoal.result import QueryResult, execute_result
from shoal.result import to_ray_dataset as _to_ray_dataset
from shoal.tracing import trace
from shoal.udf import UdfError, udf


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shoal")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree, not installed
        return "0+unknown"


#: The installed distribution's version (PEP 440).
__version__ = _version()

# Imported last: registers the Polars engine name "dist" and the LazyFrame namespace
# ``lf.shoal`` (user functions).
from shoal_polars import DistEngine  # noqa: E402
from shoal_polars import native_query as _polars_native  # noqa: E402
from shoal_polars import to_ir as _polars_to_ir  # noqa: E402
from shoal_polars import udf as _polars_udf  # noqa: E402, F401


def explain(
    query: Any,
    *,
    runner: Literal["ray", "local"] | None = None,
    config: Config | None = None,
    analyze: bool = False,
    format: Literal["text", "mermaid"] = "text",
) -> str:
    """The settings, logical plan (shoal IR) and physical plan (stages, exchanges, partition
    counts) of ``query``: a shoal IR plan or a Polars ``LazyFrame`` (for the DuckDB
    frontend, ``shoal.duckdb.explain``). A LazyFrame that would fall back gets the reasons
    instead. ``analyze=True`` runs the query and adds its per-stage profile (rows, bytes,
    task times min/median/max, skew and exchange warnings); ``format="mermaid"`` gives the
    stage graph as a mermaid flowchart. See :func:`shoal.api.explain`."""
    return _explain(
        query,
        runner=runner,
        config=config,
        to_ir=_polars_to_ir,
        to_native=_polars_native,
        analyze=analyze,
        format=format,
    )


def to_ray_dataset(
    query: Any, *, runner: Literal["ray", "local"] | None = None, config: Config | None = None
) -> Any:
    """Run ``query`` and return its result as a ``ray.data.Dataset`` whose blocks are the
    root stage's output tables, read from Ray's object store without passing through the
    driver (Ray runner). ``query`` is a shoal IR plan, a Polars ``LazyFrame`` (translated
    as ``collect(engine="dist")`` would; raises :class:`UnsupportedError` when shoal
    cannot translate it: there is no Polars engine to fall back to here), a
    :class:`QueryResult`, or the result of ``lf.execute(engine=DistEngine())``. Needs
    ``ray[data]``. See :meth:`QueryResult.to_ray_dataset`."""
    if hasattr(query, "to_ray_dataset"):
        return query.to_ray_dataset()
    if not isinstance(query, ir.PlanNode):
        query = _polars_to_ir(query)
    return _to_ray_dataset(query, runner=runner, config=config)


__all__ = [
    "Config",
    "ConfigFrozenError",
    "DistEngine",
    "PlanError",
    "QueryCancelledError",
    "QueryResult",
    "ShoalError",
    "ShoalFallbackWarning",
    "ShoalWarning",
    "TaskError",
    "UdfError",
    "UnsupportedError",
    "VersionMismatchError",
    "__version__",
    "execute",
    "execute_batches",
    "execute_many",
    "execute_result",
    "execution_config",
    "explain",
    "get_config",
    "ir",
    "set_config",
    "shutdown",
    "to_ray_dataset",
    "trace",
    "udf",
]


def _duckdb_adapter() -> Any:
    """The DuckDB adapter, or a ``ModuleNotFoundError`` naming the extra to install."""
    try:
        return importlib.import_module("shoal_duckdb")
    except ModuleNotFoundError as exc:
        if exc.name not in ("duckdb", "numpy"):
            raise
        raise ModuleNotFoundError(
            f"shoal.duckdb needs {exc.name}, which comes with an extra of shoal: "
            "pip install 'shoal[duckdb]'",
            name=exc.name,
        ) from exc


def __getattr__(name: str) -> Any:
    if name == "duckdb":
        return _duckdb_adapter()
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")


class _DuckDBAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import shoal.duckdb`` and ``from shoal.duckdb import sql`` work as
    ``shoal.duckdb.sql`` does: the module ``shoal.duckdb`` is the adapter ``shoal_duckdb``,
    imported only when first asked for (DuckDB is not imported with ``shoal``)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "shoal.duckdb":
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: Any) -> Any:
        return _duckdb_adapter()

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the adapter ran when it was imported."""


if not any(isinstance(f, _DuckDBAlias) for f in sys.meta_path):
    sys.meta_path.append(_DuckDBAlias())
