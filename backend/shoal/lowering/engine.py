"""Which Polars engine runs a lowered query, and how (the kernel's and the plan checks'
``collect``).

A task's own Polars queries must never come back to shoal: every collect that shoal makes
names :data:`TASK_ENGINE` (an engine name given explicitly is never resolved through
Polars' engine affinity; see :mod:`shoal.execution.scope`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import polars as pl
from polars.exceptions import PanicException

from shoal.ir.expr import Function, NamedExpr

#: The Polars engine of every query a task runs: Polars 2.1's default (what a plain
#: ``collect()`` runs when no affinity is set), named so that an affinity never applies.
TASK_ENGINE: Final = "streaming"


#: Functions whose answer from Polars' streaming engine (what a task's ``collect()`` runs)
#: differs from its in-memory engine (what ``DistEngine`` users compare with): in Polars 2.1
#: the streaming engine gives null where the in-memory engine gives NaN for ``corr`` of a
#: group where a column has no value and ``entropy`` of the group whose key is null, and
#: null where the in-memory engine gives false (true for ``bitwise_and``) for the bitwise
#: aggregations of a Boolean group without a value; ``drop_nans`` in a group of nulls and
#: NaN drops the nulls too in the streaming engine.
IN_MEMORY_FUNCTIONS = frozenset(
    {"corr", "entropy", "bitwise_and", "bitwise_or", "bitwise_xor", "drop_nans"}
)


def needs_in_memory(exprs: Sequence[NamedExpr]) -> bool:
    """Whether any of ``exprs`` uses one of :data:`IN_MEMORY_FUNCTIONS`."""
    return any(
        isinstance(e, Function) and e.name in IN_MEMORY_FUNCTIONS
        for ne in exprs
        for e in ne.expr.walk()
    )


def in_memory(lf: pl.LazyFrame) -> pl.LazyFrame:
    """``lf`` run now by Polars' in-memory engine, as a lazy frame over the result."""
    return lf.collect(engine="in-memory", optimizations=collect_optimizations()).lazy()


def collect(lf: pl.LazyFrame) -> pl.DataFrame:
    """Run a task's query: Polars' :data:`TASK_ENGINE` (named, so
    that no engine affinity sends it back to shoal) with :func:`collect_optimizations`.

    Where that engine panics, the query runs again on Polars' in-memory engine, as Polars
    itself does for a query an engine cannot run: Polars 2.1's streaming engine panics on
    some inputs the in-memory engine runs (``list.diff`` of some row ranges of an Arrow
    list column). A panic there too fails the task (a ``PanicException`` is not an
    ``Exception``: the query raises a plain :class:`shoal.TaskError` naming it).
    """
    try:
        return lf.collect(engine=TASK_ENGINE, optimizations=collect_optimizations())
    except PanicException:
        return lf.collect(engine="in-memory", optimizations=collect_optimizations())


def collect_optimizations() -> pl.QueryOptFlags:
    """Polars' optimisations for a task's query: all of them except join reordering.

    The join order is the plan's: the frontend's optimiser chose it over the whole data, and
    the planner chose each join's strategy for it. Polars reordering a task's joins from its
    partition-level row estimates can be far worse: in TPC-H Q5 from DuckDB's plan it joined
    customer to supplier on the nation key first (millions of rows), 4.4 s per task instead
    of 0.15 s at scale 1.
    """
    flags = pl.QueryOptFlags()
    flags.join_order = False
    return flags
