"""shoal's Polars adapter: the Polars engine ``"dist"``.

Importing this package registers the engine name, so that ``lf.collect(engine="dist")``
runs the query with shoal (a :class:`DistEngine` with the configured defaults). Public
names: :class:`DistEngine`, :class:`DistQuery` (a background query),
:class:`PolarsFallbackWarning` (a ``shoal.ShoalFallbackWarning`` and a
``polars.exceptions.PerformanceWarning``; ``ShoalFallbackWarning`` is its former name, kept),
:func:`to_ir`.

Polars (2.1) accepts only auto/in-memory/streaming/gpu as engine names and keeps the
Python-side names in the private dict ``polars.lazyframe.engine_config._ENGINE_BY_NAME``;
if a Polars release moves it, importing this package raises ``ImportError``.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from shoal_polars.engine import DistEngine, DistQuery, native_query, to_ir

#: The Polars version whose engine registry and NodeTraverser (16, 0) were tested.
TESTED_POLARS_VERSION = "2.1.0"

__all__ = [
    "DistEngine",
    "DistQuery",
    "PolarsFallbackWarning",
    "ShoalFallbackWarning",
    "native_query",
    "to_ir",
]


def __getattr__(name: str) -> Any:
    # The warning's module imports shoal's facade, which imports this package: reached
    # lazily (see shoal_polars.fallback).
    if name in ("PolarsFallbackWarning", "ShoalFallbackWarning"):
        from shoal_polars.fallback import PolarsFallbackWarning

        return PolarsFallbackWarning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _register() -> None:
    try:
        from polars.lazyframe import engine_config
    except ImportError as exc:  # pragma: no cover - depends on the Polars release
        raise ImportError(_moved(f"polars.lazyframe.engine_config is gone ({exc})")) from exc
    registry = getattr(engine_config, "_ENGINE_BY_NAME", None)
    if not isinstance(registry, dict):
        raise ImportError(_moved("polars.lazyframe.engine_config._ENGINE_BY_NAME is gone"))
    registry["dist"] = DistEngine()


def _moved(what: str) -> str:
    return (
        f"shoal_polars cannot register the Polars engine name 'dist': {what}. shoal was "
        f"tested with Polars {TESTED_POLARS_VERSION}; this is Polars {pl.__version__}. "
        "Install a tested Polars version."
    )


_register()

# shoal's facade imports this package and its ``udf`` module, which imports the translator,
# which imports shoal: importing the facade here, once this package's names exist, leaves
# both packages whole whichever is imported first (``from shoal_polars import to_ir`` alone
# used to fail at the first translation with a circular import).
import shoal  # noqa: E402, F401
