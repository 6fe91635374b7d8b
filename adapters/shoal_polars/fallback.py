"""The Polars frontend's fallback warning, and ``POLARS_VERBOSE`` messages.

:class:`PolarsFallbackWarning` is both :class:`shoal.ShoalFallbackWarning` (shoal's common
base for every frontend) and ``polars.exceptions.PerformanceWarning``, the category Polars'
GPU engine warns with when a query falls back to the CPU. This module imports
:mod:`shoal.errors` at import time, so :mod:`shoal_polars.engine` (imported while the
``shoal`` facade itself is being imported) reaches it only when it warns.
"""

from __future__ import annotations

import os
import sys

from polars.exceptions import PerformanceWarning

from shoal.errors import ShoalFallbackWarning


class PolarsFallbackWarning(ShoalFallbackWarning, PerformanceWarning):
    """A Polars query (or sink, batch stream, ...) that shoal could not run ran on
    Polars' own engine instead. The message gives the reason (each unsupported Polars
    node and expression). Also a ``polars.exceptions.PerformanceWarning``, as Polars' GPU
    engine reports its fallbacks, and a :class:`shoal.ShoalFallbackWarning`."""


def verbose() -> bool:
    """Whether Polars' verbose mode is on (``POLARS_VERBOSE``, which
    ``pl.Config.set_verbose(True)`` sets): any value but empty or ``0``."""
    return os.environ.get("POLARS_VERBOSE", "") not in ("", "0")


def say(message: str) -> None:
    """Print ``message`` to stderr in Polars' verbose mode (where Polars prints its own
    verbose output), else nothing."""
    if verbose():
        print(f"shoal: {message}", file=sys.stderr, flush=True)


def ran(what: str) -> None:
    """In verbose mode, say what shoal ran and where: the runner, stages and tasks of the
    last query (``shoal.runners.session.last_query``)."""
    if not verbose():
        return
    from shoal.runners.session import last_query

    report = last_query()
    if report is None:  # pragma: no cover - a query always leaves a report
        say(f"{what} ran with shoal")
        return
    stages = report.physical.stages
    tasks = sum(st.num_tasks for st in stages)
    say(
        f"{what} ran with shoal on the {report.runner} runner: {len(stages)} stage(s), "
        f"{tasks} task(s)"
    )
