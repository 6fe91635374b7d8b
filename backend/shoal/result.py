"""A query's result left where its tasks put it: :class:`QueryResult`.

:func:`shoal.execute` fetches the whole result to the driver as one Arrow table.
:func:`execute_result` runs the query the same way but keeps the root stage's output
tables where the tasks left them (Ray's object store for the Ray runner; this process for
the local runner) until they are read: as Arrow (:meth:`QueryResult.to_arrow`, a
``pyarrow.RecordBatchReader`` that fetches one partition at a time), as Polars, or as a
Ray Data ``Dataset`` (:meth:`QueryResult.to_ray_dataset`), which reads the object store
directly: no row passes through the driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from shoal.ir.nodes import PlanNode

if TYPE_CHECKING:
    import polars as pl

    from shoal.config import Config, RunnerKind
    from shoal.runners.dispatch import CancelToken
    from shoal.runners.session import ResultRefs


def result_schema(plan: PlanNode) -> pa.Schema:
    """The Arrow schema of ``plan``'s result as shoal returns it (:func:`shoal.execute`'s
    table, each batch of :func:`shoal.execute_batches`)."""
    from shoal.runners.session import conform

    return conform([], plan).schema


class QueryResult:
    """The result of a finished query, kept in the tasks' output tables (one or more per
    partition of the root stage, in order) until read.

    With the Ray runner the tables are objects in Ray's object store and live as long as
    this object (and any dataset made from it) does, and as long as the Ray instance:
    read them before :func:`shoal.shutdown`; a small query run in the driver
    (``small_query_where``) keeps its tables in this process, as the local runner does. ``num_rows`` is known without reading.
    Reading methods return the result with exactly the plan's schema (what
    :func:`shoal.execute` returns). It implements the Arrow PyCapsule stream interface
    (``__arrow_c_stream__``), so ``polars.DataFrame(result)``, ``pyarrow.table(result)``
    and DuckDB's replacement scans read it directly.
    """

    def __init__(self, plan: PlanNode, refs: ResultRefs) -> None:
        self.plan = plan
        self._refs = refs
        self.schema: pa.Schema = result_schema(plan)

    @property
    def num_rows(self) -> int:
        """The number of rows (from the tasks' statistics; nothing is read)."""
        return self._refs.rows

    @property
    def num_pieces(self) -> int:
        """The number of output tables (at least one per root partition that ran)."""
        return len(self._refs.refs)

    @property
    def runner(self) -> str:
        """The runner that ran the query (``"ray"`` or ``"local"``)."""
        return self._refs.runner

    def __repr__(self) -> str:
        return (
            f"QueryResult({self.num_rows} rows in {self.num_pieces} pieces on the "
            f"{self.runner} runner; schema {self.schema.names})"
        )

    def _conform(self, tables: list[pa.Table]) -> pa.Table:
        from shoal.runners.session import conform

        return conform(tables, self.plan)

    def pieces(self) -> Iterator[pa.Table]:
        """The output tables one by one, in order, each fetched when asked for and with
        the plan's schema (empty pieces included)."""
        backend = self._refs.backend
        for ref in self._refs.refs:
            yield self._conform(backend.fetch([ref]))

    def to_arrow(self) -> pa.Table:
        """The whole result as one Arrow table on the driver."""
        return self._conform(self._refs.backend.fetch(self._refs.refs))

    def to_polars(self) -> pl.DataFrame:
        """The whole result as one ``polars.DataFrame`` on the driver."""
        from shoal.execution.kernel import frame_of

        return frame_of(self.to_arrow())

    def head(self, n: int = 5) -> pa.Table:
        """The first ``n`` rows; fetches only the pieces needed."""
        got: list[pa.Table] = []
        rows = 0
        for piece in self.pieces():
            if rows >= n:
                break
            got.append(piece)
            rows += piece.num_rows
        table = pa.concat_tables(got) if got else self.schema.empty_table()
        return table.slice(0, n)

    def to_reader(self) -> pa.RecordBatchReader:
        """A ``pyarrow.RecordBatchReader`` over the result (Arrow C stream), fetching one
        piece at a time; DuckDB and Polars read it directly."""
        schema = self.schema

        def batches() -> Iterator[pa.RecordBatch]:
            for piece in self.pieces():
                yield from piece.to_batches()

        return pa.RecordBatchReader.from_batches(schema, batches())

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def to_ray_dataset(self) -> Any:
        """The result as a ``ray.data.Dataset``, one block per output table, in order.

        Ray runner: ``ray.data.from_arrow_refs`` over the tasks' objects, each first cast
        to the plan's schema by a small Ray task beside it; no row passes through the
        driver. Local runner, and a small query run in the driver: the tables (already in
        this process) are put into Ray with
        ``ray.data.from_arrow`` (starting a local Ray instance if none is running). Needs
        Ray Data (the ``data`` extra, ``pip install "shoal[data]"``: it imports pandas);
        raises ``ImportError`` saying so when it is missing."""
        try:
            import ray.data
        except ImportError as exc:
            raise ImportError(
                f"to_ray_dataset needs Ray Data, which comes with an extra of shoal: "
                f"pip install 'shoal[data]' ({exc})"
            ) from exc
        if self._refs.runner != "ray" or self._refs.in_driver:
            tables = list(self.pieces()) or [self.schema.empty_table()]
            return ray.data.from_arrow(tables)
        import ray

        if not self._refs.refs:
            return ray.data.from_arrow([self.schema.empty_table()])
        plan_ref = ray.put(self.plan)
        conform_remote = _conform_remote()
        refs = [conform_remote.remote(ref, plan_ref) for ref in self._refs.refs]
        return ray.data.from_arrow_refs(refs)


_remote: Any = None


def _conform_piece(table: pa.Table, plan: PlanNode) -> pa.Table:
    """One output table with the plan's schema (runs on a Ray worker)."""
    from shoal.runners.session import conform

    return conform([table], plan)


def _conform_remote() -> Any:
    """:func:`_conform_piece` as a Ray remote function (made once)."""
    global _remote
    if _remote is None:
        import ray

        _remote = ray.remote(num_cpus=0.25)(_conform_piece)
    return _remote


def execute_result(
    plan: PlanNode,
    *,
    runner: RunnerKind | None = None,
    config: Config | None = None,
    cancel: CancelToken | None = None,
) -> QueryResult:
    """Run ``plan`` as :func:`shoal.execute` does, but leave the result where the tasks
    put it: a :class:`QueryResult`. Raises as :func:`shoal.execute` does, and
    :class:`shoal.PlanError` for a :class:`~shoal.ir.nodes.Sink` plan (run it with
    :func:`shoal.execute`, which finishes the files)."""
    from shoal.api import _resolve
    from shoal.errors import PlanError
    from shoal.ir.nodes import Sink
    from shoal.runners.session import run_plan_refs

    if isinstance(plan, Sink):
        raise PlanError("execute_result: a Sink plan writes files; run it with shoal.execute")
    return QueryResult(plan, run_plan_refs(plan, _resolve(runner, config), cancel))


def to_ray_dataset(
    query: Any, *, runner: RunnerKind | None = None, config: Config | None = None
) -> Any:
    """Run ``query`` (a shoal IR plan or a :class:`QueryResult`) and return its result as a
    ``ray.data.Dataset`` (see :meth:`QueryResult.to_ray_dataset`: with the Ray runner no
    row passes through the driver). The facade's :func:`shoal.to_ray_dataset` also takes
    a Polars ``LazyFrame``."""
    if isinstance(query, QueryResult):
        return query.to_ray_dataset()
    if not isinstance(query, PlanNode):
        raise TypeError(f"to_ray_dataset: expected a shoal IR plan, got {type(query).__name__}")
    return execute_result(query, runner=runner, config=config).to_ray_dataset()
