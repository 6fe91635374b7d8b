"""shoal: a pluggable distributed execution backend for Polars and DuckDB, on Ray.

Public names: :class:`DistEngine` (the Polars engine ``"dist"``), :func:`explain`,
``duckdb`` (the DuckDB adapter, once installed), :mod:`ir`, :func:`execute`,
:func:`execute_batches`, :func:`udf`, :func:`trace`, :class:`Config`, :func:`get_config`,
:func:`set_config`, :func:`execution_config`, :func:`shutdown` and the errors
:class:`ShoalError`, :class:`UnsupportedError`, :class:`PlanError`,
:class:`ConfigFrozenError`, :class:`TaskError`, :class:`UdfError`,
:class:`QueryCancelledError`.

Note that ``shoal.udf`` is the decorator; its module is ``sys.modules["shoal.udf"]`` (import
names from it with ``from shoal.udf import UDF``).
"""

from __future__ import annotations

from typing import Any, Literal

from shoal import ir
from shoal.api import execute, execute_batches, shutdown
from shoal.api import explain as _explain
from shoal.config import Config, execution_config, get_config, set_config
from shoal.errors import (
    ConfigFrozenError,
    PlanError,
    QueryCancelledError,
    ShoalError,
    TaskError,
    UnsupportedError,
)
from shoal.tracing import trace
from shoal.udf import UdfError, udf

# Imported last: registers the Polars engine name "dist" and the LazyFrame namespace
# ``lf.shoal`` (user functions).
from shoal_polars import DistEngine  # noqa: E402
from shoal_polars import to_ir as _polars_to_ir  # noqa: E402
from shoal_polars import udf as _polars_udf  # noqa: E402, F401


def explain(
    query: Any, *, runner: Literal["ray", "local"] | None = None, config: Config | None = None
) -> str:
    """The settings, logical plan (shoal IR) and physical plan (stages, exchanges, partition
    counts) of ``query``: a shoal IR plan or a Polars ``LazyFrame`` (for the DuckDB
    frontend, ``shoal.duckdb.explain``). A LazyFrame that would fall back gets the reasons
    instead. See :func:`shoal.api.explain`."""
    return _explain(query, runner=runner, config=config, to_ir=_polars_to_ir)


__all__ = [
    "Config",
    "ConfigFrozenError",
    "DistEngine",
    "PlanError",
    "QueryCancelledError",
    "ShoalError",
    "TaskError",
    "UdfError",
    "UnsupportedError",
    "execute",
    "execute_batches",
    "execution_config",
    "explain",
    "get_config",
    "ir",
    "set_config",
    "shutdown",
    "trace",
    "udf",
]


def __getattr__(name: str) -> Any:
    if name == "duckdb":
        import importlib

        return importlib.import_module("shoal_duckdb")
    raise AttributeError(f"module 'shoal' has no attribute {name!r}")
