"""The rest of Polars' Engine API on shoal: ``collect_batches``, ``collect_async`` /
``collect_all_async`` and ``execute`` (:class:`DistQueryResult`).

Each translates the query first, as ``collect`` does; a query shoal cannot translate runs
on :func:`~shoal_polars.engine.native_engine` after a
:class:`~shoal_polars.fallback.PolarsFallbackWarning` (or raises
:class:`shoal.UnsupportedError` with ``raise_on_fail``).
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import polars as pl

from shoal_polars.engine import native_engine, optimised_plan, to_polars_frame

if TYPE_CHECKING:
    import pyarrow as pa

    from shoal.ir.nodes import PlanNode
    from shoal.result import QueryResult
    from shoal_polars.engine import DistEngine


def _translate(
    engine: DistEngine, lf: pl.LazyFrame, optimizations: pl.QueryOptFlags, what: str
) -> tuple[PlanNode, pl.Schema] | None:
    """``lf``'s IR and result schema, or None after the fallback warning (``raise_on_fail``:
    raises). Inside a shoal task: None at once (never a nested shoal query)."""
    from shoal.errors import UnsupportedError
    from shoal.execution.scope import in_task

    if in_task():
        return None
    try:
        return optimised_plan(lf, optimizations)
    except UnsupportedError as exc:
        engine._fallback(exc, f"{what} falls back")
        return None


class DistBatches:
    """The batches of ``collect_batches`` on shoal: an iterator of ``polars.DataFrame``,
    the result's partitions in order, each as soon as it and those before it have finished
    (with ``chunk_size``, cut into frames of that many rows, the last one shorter). Also an
    Arrow C stream (``__arrow_c_stream__``), as Polars' own batches are. :meth:`close`
    (or dropping the iterator) before the end cancels the rest."""

    def __init__(
        self, tables: Iterator[pa.Table], schema: pl.Schema, chunk_size: int | None
    ) -> None:
        self._tables = tables
        self._schema = schema
        self._chunk = chunk_size
        self._frames = self._generate()

    def _generate(self) -> Generator[pl.DataFrame, None, None]:
        pending: list[pl.DataFrame] = []
        rows = 0
        for table in self._tables:
            df = to_polars_frame(table, self._schema)
            if self._chunk is None:
                if df.height:
                    yield df
                continue
            pending.append(df)
            rows += df.height
            while rows >= self._chunk:
                merged = pl.concat(pending) if len(pending) > 1 else pending[0]
                yield merged.head(self._chunk)
                rest = merged.slice(self._chunk)
                pending, rows = [rest], rest.height
        if rows:
            yield pl.concat(pending) if len(pending) > 1 else pending[0]

    def __iter__(self) -> DistBatches:
        return self

    def __next__(self) -> pl.DataFrame:
        return next(self._frames)

    def close(self) -> None:
        """Stop: the rest of the query is cancelled."""
        self._frames.close()
        close = getattr(self._tables, "close", None)
        if close is not None:
            close()

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        import pyarrow as pa

        schema = pl.DataFrame(schema=self._schema).to_arrow().schema
        reader = pa.RecordBatchReader.from_batches(
            schema, (b for df in self for b in df.to_arrow().cast(schema).to_batches())
        )
        return reader.__arrow_c_stream__(requested_schema)


def collect_batches(
    engine: DistEngine,
    lf: pl.LazyFrame,
    optimizations: pl.QueryOptFlags,
    *,
    maintain_order: bool = True,
    chunk_size: int | None = None,
    lazy: bool = False,
) -> Any:
    """``lf.collect_batches(engine=DistEngine())``: a :class:`DistBatches` of the result,
    streamed partition by partition in the result's order (``maintain_order=False``
    changes nothing: shoal's order costs nothing here). With ``lazy=False`` (Polars'
    default) the query starts now and runs on in a background thread, keeping up to two
    partitions ready (:class:`Prefetch`); with ``lazy=True`` it starts when the first batch
    is asked for and advances only while the caller asks. Falls back to
    :func:`native_engine`'s batches for a query shoal cannot translate."""
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"collect_batches chunk_size={chunk_size!r}: expected a positive int")
    found = _translate(engine, lf, optimizations, "collect_batches")
    if found is None:
        return native_engine().collect_batches(
            lf,
            optimizations=optimizations,
            maintain_order=maintain_order,
            chunk_size=chunk_size,
            lazy=lazy,
        )
    plan, schema = found
    from shoal.api import _resolve
    from shoal.runners.session import stream_plan

    tables: Iterator[pa.Table] = stream_plan(plan, _resolve(engine.runner, engine._config()))
    if not lazy:
        tables = Prefetch(tables)
    return DistBatches(tables, schema, chunk_size)


class Prefetch:
    """Drives ``tables`` (a query's partition stream) in a background thread from now on,
    keeping up to ``depth`` partitions ready: ``collect_batches(lazy=False)`` starts the
    query at once, as Polars does, and the query goes on while the caller works on a batch.
    Errors of the query are raised by ``next``; :meth:`close`, or dropping this object,
    stops the query (at the latest when the partition being awaited arrives)."""

    def __init__(self, tables: Iterator[pa.Table], depth: int = 2) -> None:
        import queue

        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        # The thread holds the queue and the event, not this object, so that dropping the
        # iterator stops it (``__del__``).
        self._thread = threading.Thread(
            target=_prefetch,
            args=(tables, self._queue, self._stop),
            name="shoal-collect-batches",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self) -> Prefetch:
        return self

    def __next__(self) -> pa.Table:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if item is _END:
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            raise item.exc
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the query; returns when the background thread has ended."""
        self._done = True
        self._stop.set()
        self._thread.join()

    def __del__(self) -> None:
        self._stop.set()


_END = object()


def _prefetch(tables: Iterator[pa.Table], out: Any, stop: threading.Event) -> None:
    """:class:`Prefetch`'s thread: move ``tables`` into ``out`` until the end, an error or
    ``stop``; then close ``tables`` (which cancels the rest of a stopped query)."""
    import queue

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    try:
        for table in tables:
            if not put(table):
                break
        else:
            put(_END)
    except BaseException as exc:  # handed to the consumer
        put(_Failure(exc))
    finally:
        close = getattr(tables, "close", None)
        if close is not None:
            close()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def collect_async(
    engine: DistEngine,
    lfs: list[pl.LazyFrame],
    optimizations: pl.QueryOptFlags,
    *,
    gevent: bool,
    single: bool,
) -> Any:
    """``lf.collect_async(engine=...)`` (``single``) and ``pl.collect_all_async``: the
    queries run with shoal in a background thread, several of them as one query that
    computes the sub-plans they share once (as :meth:`DistEngine.collect_all`); the result
    is Polars' own awaitable (or, with ``gevent``, Polars' gevent result) that resolves to
    the frame (or the list of frames), or raises the query's error. Queries shoal cannot
    translate run on :func:`native_engine` in that thread, after the fallback warning
    (given now, in the caller's thread)."""
    from polars._utils.async_ import _AioDataFrameResult, _GeventDataFrameResult

    from shoal.api import _resolve
    from shoal.execution.scope import in_task
    from shoal.runners.session import start_runner
    from shoal_polars.engine import optimised_plans

    if len(lfs) > 1 and not in_task():
        plans = optimised_plans(lfs, optimizations)
        plans = [
            p if p is not None else _translate(engine, lf, optimizations, "collect_all_async")
            for lf, p in zip(lfs, plans, strict=True)
        ]
    else:
        plans = [_translate(engine, lf, optimizations, "collect_async") for lf in lfs]
    result: Any = _GeventDataFrameResult() if gevent else _AioDataFrameResult()
    config = _resolve(engine.runner, engine._config())
    if any(p is not None for p in plans):
        start_runner(config)  # a runner that cannot start raises here, in the caller

    def run() -> None:
        from shoal.api import execute_many

        frames: list[pl.DataFrame | None] = [None] * len(lfs)
        try:
            for i, (lf, found) in enumerate(zip(lfs, plans, strict=True)):
                if found is None:
                    df = native_engine().collect(lf, optimizations=optimizations)
                    assert isinstance(df, pl.DataFrame)
                    frames[i] = df
            todo = [i for i, found in enumerate(plans) if found is not None]
            if todo:
                tables = execute_many([plans[i][0] for i in todo], config=config)  # type: ignore[index]
                for i, table in zip(todo, tables, strict=True):
                    frames[i] = to_polars_frame(table, plans[i][1])  # type: ignore[index]
        except Exception as exc:
            (result._callback if single else result._callback_all)(exc)
            return
        done = [df for df in frames if df is not None]
        if single:
            result._callback(done[0]._df)
        else:
            result._callback_all([df._df for df in done])

    threading.Thread(target=run, name="shoal-collect-async", daemon=True).start()
    return result


class DistQueryResult:
    """``lf.execute(engine=DistEngine())``: Polars' ``QueryResult`` (``head``,
    ``n_rows_total``, ``lazy()``) over a :class:`shoal.result.QueryResult`, whose data stays
    where the tasks put it (Ray's object store) until read.

    ``lazy()`` gives a ``LazyFrame`` that reads the result piece by piece when collected
    (projections, filters and row limits Polars pushes into the scan are applied per
    piece); :meth:`collect` the whole frame; :meth:`to_ray_dataset` a ``ray.data.Dataset``
    read straight from the object store; ``__arrow_c_stream__`` an Arrow stream of it.
    """

    def __init__(self, result: QueryResult, schema: pl.Schema) -> None:
        self.result = result
        self.schema = schema

    @property
    def head(self) -> pl.DataFrame:
        """The first 5 rows (as Polars' in-process ``QueryResult``); reads only the pieces
        needed."""
        return to_polars_frame(self.result.head(5), self.schema)

    @property
    def n_rows_total(self) -> int:
        """The number of rows (known without reading the data)."""
        return self.result.num_rows

    def collect(self) -> pl.DataFrame:
        """The whole result as a ``polars.DataFrame`` on the driver."""
        return to_polars_frame(self.result.to_arrow(), self.schema)

    def lazy(self) -> pl.LazyFrame:
        """A ``LazyFrame`` over the result that reads it piece by piece when collected
        (a :class:`ResultSource`; collected on shoal, the result is read on the driver and
        distributed again)."""
        from polars.io.plugins import register_io_source

        return register_io_source(
            ResultSource(self.result, self.schema), schema=self.schema, explain_name="shoal result"
        )

    def to_ray_dataset(self) -> Any:
        """The result as a ``ray.data.Dataset``: see
        :meth:`shoal.result.QueryResult.to_ray_dataset`."""
        return self.result.to_ray_dataset()

    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        return self.result.__arrow_c_stream__(requested_schema)

    def __repr__(self) -> str:
        with pl.Config(tbl_hide_dataframe_shape=True):
            return f"QueryResult (shoal, {self.n_rows_total} rows); head:\n{self.head}"


class ResultSource:
    """The Polars IO source of :meth:`DistQueryResult.lazy`: yields the result's pieces
    as frames, applying the columns, filter and row limit Polars pushes into the scan.
    shoal's translator recognises it (``shoal_polars.udf.translate_python_scan``)."""

    def __init__(self, result: QueryResult, schema: pl.Schema) -> None:
        self.result = result
        self.schema = schema

    def __repr__(self) -> str:
        return f"ResultSource({self.result!r})"

    def __call__(
        self,
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> Iterator[pl.DataFrame]:
        left = n_rows
        for piece in self.result.pieces():
            if left is not None and left <= 0:
                return
            df = to_polars_frame(piece, self.schema)
            if predicate is not None:
                df = df.filter(predicate)
            if with_columns is not None:
                df = df.select(with_columns)
            if left is not None:
                df = df.head(left)
                left -= df.height
            yield df

    def table(self) -> pa.Table:
        """The whole result with Polars' schema, as Arrow (read on the driver)."""
        return to_polars_frame(self.result.to_arrow(), self.schema).to_arrow()


def execute(engine: DistEngine, lf: pl.LazyFrame, optimizations: pl.QueryOptFlags) -> Any:
    """``lf.execute(engine=DistEngine())``: run the query with shoal and return a
    :class:`DistQueryResult`, its data left in the object store; a query shoal cannot
    translate runs with :func:`native_engine`'s ``execute`` after the fallback warning."""
    found = _translate(engine, lf, optimizations, "execute")
    if found is None:
        return native_engine().execute(lf, optimizations=optimizations)
    plan, schema = found
    from shoal.result import execute_result
    from shoal_polars.fallback import ran

    out = DistQueryResult(
        execute_result(plan, runner=engine.runner, config=engine._config()), schema
    )
    ran("execute")
    return out
