"""The kernel: run one plan fragment on one partition with Polars.

A fragment is an IR tree whose leaves are :class:`~shoal.ir.nodes.Scan` (this task's
partition of it) or :class:`~shoal.ir.nodes.StageInput` (tables from upstream stages).
The fragment becomes one Polars lazy query over Arrow input, collected once; the result is
split as the task's :data:`~shoal.planner.physical.OutputSpec` says.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl
import pyarrow as pa

from shoal.config import get_config
from shoal.errors import UnsupportedError
from shoal.execution.scope import task_scope
from shoal.ir.nodes import (
    FileSource,
    InMemorySource,
    ParquetSource,
    PlanNode,
    Scan,
    Sink,
    SqlMap,
    StageInput,
    StorageOptions,
    UdfProject,
)
from shoal.ir.types import DataType, Schema, frame_to_arrow, restore_wide
from shoal.lowering.engine import (  # noqa: F401  (the kernel's names, kept for callers)
    IN_MEMORY_FUNCTIONS,
    collect,
    collect_optimizations,
    in_memory,
    needs_in_memory,
)
from shoal.lowering.expressions import to_polars
from shoal.lowering.plan import lower_plan, register_foreign
from shoal.planner.physical import (
    FilePartition,
    HashOutput,
    MemoryPiece,
    NativeQuery,
    OutputSpec,
    ParquetPiece,
    RangeOutput,
    ScanInput,
    ScanPartition,
    ScanSet,
    SingleOutput,
    from_wire,
    scans_of,
    to_wire,
)

_BUCKET = "__shoal_bucket"
_HASH_SEED = 0x5EED


@dataclass
class TaskStats:
    """What a task reports back to the driver (small; travels as the task's first result)."""

    pid: int
    node_id: str
    rows_in: int
    scan_rows: int
    rows_out: int
    bytes_out: int
    start: float
    end: float
    sample: pa.Table | None = None
    config_digest: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Bytes of each output table, in output order (``sum == bytes_out``): what the
    #: dispatch loop's memory ledger counts per output partition (hash or range bucket).
    output_bytes: tuple[int, ...] = ()
    #: Rows of each output table, in output order (``sum == rows_out``): what adaptive
    #: execution (:mod:`shoal.runners.adaptive`) reads to skip empty buckets.
    output_rows: tuple[int, ...] = ()
    #: Native id of the thread that ran the task (filled where the stats are built, on the
    #: worker); with ``pid`` it names the task's track in a trace.
    thread: int = field(default_factory=threading.get_native_id)


def _empty(schema: Schema) -> pl.DataFrame:
    return pl.DataFrame(schema=schema.to_polars())


def frame_of(table: pa.Table) -> pl.DataFrame:
    """An Arrow table (as it travels between tasks: :func:`~shoal.planner.physical.to_wire`)
    as a Polars DataFrame, zero-copy where Arrow's layout allows; a table of no columns
    keeps its height, and every column its name (``pl.from_arrow`` renames a column named
    ``""`` to ``column_0``, which Polars itself allows as a name).

    Polars 2.1 cannot import a *sliced* fixed-size list (Array) column with nulls (a row
    range of an in-memory frame): ``ComputeError: validity mask length must be equal to
    the number of values divided by size``. Such a table is copied into fresh arrays
    (``take``) and imported again."""
    table = from_wire(table)
    try:
        df = pl.from_arrow(table)
    except pl.exceptions.ComputeError as exc:
        if "validity mask length" not in str(exc):
            raise
        df = pl.from_arrow(table.take(pa.array(range(table.num_rows), pa.int64())))
    assert isinstance(df, pl.DataFrame)
    if df.columns != table.column_names:
        df.columns = table.column_names
    return restore_wide(df, table.schema)


def _from_arrow(tables: Sequence[pa.Table], schema: Schema) -> pl.DataFrame:
    frames = [frame_of(t) for t in tables if t.num_rows > 0]
    if not frames:
        return _empty(schema)
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed")


def _source_columns(fragment: PlanNode) -> dict[int, str]:
    """Stage input index -> name of the column that takes each row's upstream task index
    (:attr:`StageInput.source_column`)."""
    return {
        n.index: n.source_column
        for n in fragment.walk()
        if isinstance(n, StageInput) and n.source_column is not None
    }


def _tagged_from_arrow(tables: Sequence[pa.Table], schema: Schema, column: str) -> pl.DataFrame:
    """``tables`` (one per upstream task, in partition order) concatenated, each row with
    the index of the table it came from in ``column`` (``UInt32``, the last column)."""
    frames = [
        frame_of(t).with_columns(pl.lit(i, pl.UInt32).alias(column))
        for i, t in enumerate(tables)
        if t.num_rows > 0
    ]
    if not frames:
        return _empty(schema)
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical_relaxed")


class _ScanLookup:
    """Partitions for several scans of one plan (:func:`run_single`, the small-query path,
    a fragment that computes a small broadcast side itself): by scan node, the partition
    and whether it holds all of the scan's rows (``partitioned``: which do not)."""

    def __init__(
        self,
        scans: Sequence[Scan],
        parts: Sequence[Any],
        partitioned: Sequence[bool] = (),
    ):
        flags = list(partitioned) or [False] * len(parts)
        self._parts = {id(s): (p, not f) for s, p, f in zip(scans, parts, flags, strict=True)}

    def get(self, node: Scan) -> tuple[ScanInput | list[ScanInput], bool]:
        return self._parts[id(node)]


def _scan(node: Scan, part: ScanInput | _ScanLookup | None) -> pl.LazyFrame:
    whole = False
    if isinstance(part, _ScanLookup):
        got, whole = part.get(node)
        if isinstance(got, list):
            lfs = [_scan(node, p) for p in got]
            return pl.concat(lfs, how="vertical") if lfs else _empty(node.schema).lazy()
        if not whole:
            return _scan(node, got)
        part = got
    cols = list(node.schema.names)
    if isinstance(node.source, InMemorySource):
        if not isinstance(part, MemoryPiece):
            raise RuntimeError("in-memory scan without its partition")
        lf = _from_arrow([part.table.select(cols)], node.schema).lazy()
    elif isinstance(node.source, ParquetSource):
        if not isinstance(part, ScanPartition):
            raise RuntimeError("parquet scan without its partition")
        so = _storage(node.source.storage_options)
        if whole and cols:
            lfs = _whole_files(part, cols, node.schema, so)
        elif cols:
            lfs = _pieces(part, cols, node.schema, so)
        else:
            lfs = []
        if not cols:
            lf = _height_only(part.rows).lazy()
        elif not lfs:
            return _empty(node.schema).lazy()
        else:
            lf = lfs[0] if len(lfs) == 1 else pl.concat(lfs, how="vertical")
    elif isinstance(node.source, FileSource):
        if not isinstance(part, FilePartition):
            raise RuntimeError("file scan without its partition")
        reader = _READERS.get(node.source.format)
        if reader is None:
            raise UnsupportedError(f"scan of {node.source.format!r} files")
        so = _storage(node.source.storage_options)
        lf = reader(part.path, **_reader_options(node.source.options), **so)
        if not cols:
            lf = _height_only(collect(lf.select(pl.len())).item()).lazy()
        else:
            lf = lf.select(cols)
    else:  # pragma: no cover
        raise UnsupportedError(f"scan source {type(node.source).__name__}")
    if node.predicate is not None:
        lf = lf.filter(to_polars(node.predicate))
    return lf


def _whole_files(
    part: ScanPartition, cols: list[str], schema: Schema, so: dict[str, Any]
) -> list[pl.LazyFrame]:
    """The files of a small-query scan (``part``: every row group of its files that the
    footers' statistics did not rule out), each read whole: the scan's predicate is applied
    after, and rules out the rows of the row groups left out, so Polars gets the whole
    file with the predicate above it, which it pushes into its reader (row-group statistics,
    late materialisation) where row slices keep it above the reads.

    Consecutive files are read by one multi-file ``scan_parquet`` (building a scan per file
    cost about 0.1 ms each, over a dozen per TPC-H query). Its checks are the planner's
    already: the planner checked by Polars' rules that every file has each column read
    (a later file's extra columns were refused or allowed by the adapter, per the user's
    ``extra_columns``), of one type as Polars reads it, so the scan is told to ignore extra
    columns (``extra_columns="ignore"``) and columns it does not read
    (``missing_columns="insert"`` applies to them only); the first file gives the types. A
    file with a Null-typed column (``null_columns``, pyarrow's untyped column) is read by a
    scan of its own and cast to the scan's types (it must not give its Null type to the
    files after it)."""
    paths: list[str] = []
    nulls: dict[str, tuple[str, ...]] = {}
    last: tuple[str, int] | None = None
    for p in part.pieces:
        if p.rows <= 0:
            continue
        # A file's row groups follow each other with rising offsets; a path the scan lists
        # twice starts again at a lower offset (or the same one): it is read again.
        if last is None or p.path != last[0] or p.offset <= last[1]:
            paths.append(p.path)
            nulls[p.path] = p.null_columns
        last = (p.path, p.offset)
    out: list[pl.LazyFrame] = []
    run: list[str] = []
    for path in [*paths, None]:
        if path is not None and not nulls[path]:
            run.append(path)
            continue
        if run:
            out.append(
                pl.scan_parquet(
                    run[0] if len(run) == 1 else run,
                    glob=False,
                    hive_partitioning=False,
                    extra_columns="ignore",
                    missing_columns="insert",
                    **so,
                ).select(cols)
            )
            run = []
        if path is not None:
            lf = pl.scan_parquet(path, glob=False, **so).select(cols)
            out.append(_null_columns_cast(lf, nulls[path], schema))
    return out


def _pieces(
    part: ScanPartition, cols: list[str], schema: Schema, so: dict[str, Any]
) -> list[pl.LazyFrame]:
    """The reads of one partition of a Parquet scan, in order: one per file, or per run of
    contiguous rows of a file. A file whose pieces are marked
    :attr:`~shoal.planner.physical.ParquetPiece.whole_file` (the partition holds every row
    group of it that the scan reads) is read without a slice, so that Polars pushes the
    scan's predicate, applied above, into its reader (row groups skipped by statistics,
    late materialisation) instead of keeping it above the slices; the rows of the row
    groups that planning left out do not pass that predicate (the footers' statistics
    proved it), so the answer is the same. Other pieces of one file that follow each other
    (a row group's rows, then the next one's) are one slice: one scan per file and
    partition, where a scan per row group made Polars read the file once into a cache and
    slice it."""
    runs: list[tuple[ParquetPiece, int]] = []  # (first piece of a run, rows of the run)
    for p in part.pieces:
        if p.rows <= 0:
            continue
        if runs:
            first, rows = runs[-1]
            if first.path == p.path and (
                (first.whole_file and p.whole_file) or first.offset + rows == p.offset
            ):
                runs[-1] = (first, rows + p.rows)
                continue
        runs.append((p, p.rows))
    out = []
    for first, rows in runs:
        lf = pl.scan_parquet(first.path, glob=False, **so)
        if not first.whole_file:
            lf = lf.slice(first.offset, rows)
        out.append(_null_columns_cast(lf.select(cols), first.null_columns, schema))
    return out


def _null_columns_cast(lf: pl.LazyFrame, nulls: tuple[str, ...], schema: Schema) -> pl.LazyFrame:
    """``lf`` (one Parquet piece) with its Null-typed columns ``nulls`` cast to the scan's
    types, as Polars reads a file whose column pyarrow wrote untyped."""
    cast = {c: schema[c].to_polars() for c in nulls if c in lf.collect_schema()}
    return lf.cast(cast) if cast else lf  # type: ignore[arg-type]


def _storage(options: StorageOptions | None) -> dict[str, Any]:
    """Polars' ``storage_options`` keyword for a source read from object storage (Polars
    reads with its own object_store client, as it would natively)."""
    return {"storage_options": options.to_dict()} if options else {}


def _height_only(rows: int) -> pl.DataFrame:
    """A frame of ``rows`` rows and no columns, for a scan that reads no column (``len()``,
    ``with_row_index``): a lazy scan narrowed to no columns would lose its rows."""
    df = pl.from_arrow(pa.table({"_": pa.nulls(rows)}).select([]))
    assert isinstance(df, pl.DataFrame)
    return df


#: Readers of one file each, by format. The planner lists the files, so a name is a name,
#: never a pattern: ``[``, ``]``, ``*`` and ``?`` in it are literal (``glob=False``, or escaped
#: for ``scan_ndjson``, which has no such option).
_READERS: dict[str, Any] = {
    "csv": lambda path, **kw: pl.scan_csv(path, glob=False, **kw),
    "ndjson": lambda path, **kw: pl.scan_ndjson(glob.escape(path), **kw),
    "ipc": lambda path, **kw: pl.scan_ipc(path, glob=False, **kw),
}


def _reader_options(options: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    """A :class:`FileSource`'s options as reader keyword arguments. The IR keeps them
    hashable: a schema (``schema``, ``schema_overrides``) as (name, DataType) pairs, a
    mapping as (key, value) pairs and a list as a tuple; they become dicts and lists."""
    out: dict[str, Any] = {}
    for key, value in options:
        if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
            value = {k: v.to_polars() if isinstance(v, DataType) else v for k, v in value}
        elif isinstance(value, tuple):
            value = list(value)
        out[key] = value
    return out


def build(
    node: PlanNode,
    inputs: Sequence[pl.DataFrame],
    scan: ScanInput | _ScanLookup | None,
) -> pl.LazyFrame:
    """The Polars lazy query for ``node`` over this task's inputs: the lowering
    (:func:`shoal.lowering.plan.lower_plan`) with this task's scan partitions."""
    return lower_plan(node, inputs, lambda n: _scan(n, scan))


def _run_udf(node: PlanNode, frame: pl.DataFrame) -> pl.DataFrame:
    from shoal.udf import apply_project

    assert isinstance(node, UdfProject)
    return apply_project(node, frame)


def _run_sql_map(node: PlanNode, frame: pl.DataFrame) -> pl.DataFrame:
    from shoal.execution.foreign import run_sql_map

    assert isinstance(node, SqlMap)
    return run_sql_map(node, frame)


def _write_partition(node: PlanNode, frame: pl.DataFrame) -> pl.DataFrame:
    from shoal.execution.sink import write_partition

    assert isinstance(node, Sink)
    return write_partition(frame, node)


register_foreign(UdfProject, _run_udf)
register_foreign(SqlMap, _run_sql_map)
register_foreign(Sink, _write_partition)


def hash_buckets(keys: Sequence[pl.Expr], n: int) -> pl.Expr:
    """The bucket (``UInt32``, ``0 .. n-1``) of each row under a hash exchange on ``keys``
    (Polars expressions): each key hashed by Polars with a seed of its own position, the
    hashes combined by XOR, modulo ``n``.

    Rows whose keys are equal get the same bucket on every task of the query (Polars'
    seeded hash is stable within one version; a join's two sides hash keys of one type:
    see the planner's ``_hash_keys``). Polars' hash of a column treats what its joins and
    group-bys treat as equal alike: -0.0 and 0.0, every NaN, a null with a null, a
    categorical by its value. One hash per key column costs a fraction of hashing a struct
    of the keys (2 to 8 times less on TPC-H keys)."""
    if not keys:
        return pl.lit(0, pl.UInt32).alias(_BUCKET)
    combined = keys[0].hash(seed=_HASH_SEED)
    for i, k in enumerate(keys[1:], start=1):
        combined = combined ^ k.hash(seed=_HASH_SEED + i)
    return (combined % n).cast(pl.UInt32).alias(_BUCKET)


def _split_hash(df: pl.DataFrame, spec: HashOutput) -> list[pl.DataFrame]:
    return _split(df.with_columns(hash_buckets([to_polars(k) for k in spec.keys], spec.n)), spec.n)


def _split(tagged: pl.DataFrame, n: int) -> list[pl.DataFrame]:
    """``tagged`` cut into ``n`` frames by its bucket column (dropped), each keeping the
    rows' order. ``partition_by`` gathers each bucket into buffers of its own: slices of
    one sort by bucket cost no less, and a slice of a string-view column keeps the
    shared data buffers, which pickle (to the object store) up to the slice's end."""
    schema = tagged.drop(_BUCKET).schema
    parts = tagged.partition_by(_BUCKET, as_dict=True, include_key=False, maintain_order=True)
    out = []
    for i in range(n):
        got = parts.get((i,))
        out.append(got if got is not None else pl.DataFrame(schema=schema))
    return out


def range_buckets(
    keys: pl.DataFrame,
    boundaries: pl.DataFrame,
    descending: Sequence[bool],
    nulls_last: Sequence[bool],
) -> pl.Series:
    """Bucket index (0..len(boundaries)) of each row of ``keys`` under the sort order:
    the number of boundaries that sort before the row or equal to it (a row equal to
    boundary ``i`` goes to bucket ``i + 1``: equal keys always share a bucket, so a stable
    sort stays stable across buckets). ``keys`` and ``boundaries`` have the same columns;
    ``boundaries`` are in the sort order. A single key of a plain type is bucketed by
    binary search (:func:`_search_buckets`), several keys by one sort of the rows and the
    boundaries together."""
    if keys.width == 1 and _searchable(keys.dtypes[0]):
        return _search_buckets(
            keys.to_series(0),
            boundaries.to_series(0).cast(keys.dtypes[0]),
            descending[0],
            nulls_last[0],
        )
    return _sort_buckets(keys, boundaries, descending, nulls_last)


def _sort_buckets(
    keys: pl.DataFrame,
    boundaries: pl.DataFrame,
    descending: Sequence[bool],
    nulls_last: Sequence[bool],
) -> pl.Series:
    """:func:`range_buckets` of any keys: the rows and the boundaries sorted together."""
    names = keys.columns
    marked = pl.concat(
        [
            keys.with_columns(
                pl.lit(1, pl.Int8).alias("__is_data"),
                pl.int_range(pl.len(), dtype=pl.UInt32).alias("__row"),
            ),
            boundaries.select(names).with_columns(
                pl.lit(0, pl.Int8).alias("__is_data"), pl.lit(None, pl.UInt32).alias("__row")
            ),
        ],
        how="vertical_relaxed",
    )
    # Boundary rows sort before equal data rows (is_data 0 < 1), so a row equal to
    # boundary i lands after it: bucket i + 1. Consistent on every task.
    ordered = marked.sort(
        [*names, "__is_data"],
        descending=[*descending, False],
        nulls_last=[*nulls_last, False],
        maintain_order=True,
    )
    ordered = ordered.with_columns(
        (pl.col("__is_data") == 0).cast(pl.UInt32).cum_sum().alias(_BUCKET)
    ).filter(pl.col("__is_data") == 1)
    return ordered.sort("__row")[_BUCKET]


def _searchable(dtype: pl.DataType) -> bool:
    """Whether :meth:`polars.Series.search_sorted` orders ``dtype`` as ``sort`` does:
    integers, floats (NaN above every number, -0.0 equal to 0.0, in both), temporal
    types, strings, binary, booleans."""
    return (
        dtype.is_integer()
        or dtype.is_float()
        or dtype.is_temporal()
        or dtype in (pl.String, pl.Binary, pl.Boolean)
    )


def _search_buckets(
    key: pl.Series, boundaries: pl.Series, descending: bool, nulls_last: bool
) -> pl.Series:
    """:func:`range_buckets` of one key by binary search of the boundaries: a non-null
    row's bucket is the number of non-null boundaries that sort before it or equal to it
    (``search_sorted(side="right")``), plus the null boundaries when nulls sort first; a
    null row's is every boundary (nulls last) or the null boundaries (nulls first)."""
    nulls = boundaries.null_count()
    values = boundaries.drop_nulls()
    found = values.search_sorted(key, side="right", descending=descending).cast(pl.UInt32)
    if not nulls_last:
        found = found + nulls
    null_bucket = boundaries.len() if nulls_last else nulls
    if key.null_count():
        found = found.zip_with(key.is_not_null(), pl.Series([null_bucket], dtype=pl.UInt32))
    return found.alias(_BUCKET)


def _split_range(df: pl.DataFrame, spec: RangeOutput) -> list[pl.DataFrame]:
    if spec.boundaries is None or spec.boundaries.num_rows == 0 or df.height == 0:
        return [df] + [df.clear() for _ in range(spec.num_outputs - 1)]
    if spec.boundaries.num_rows != spec.n - 1:
        raise ValueError(
            f"range exchange: {spec.boundaries.num_rows} boundaries for {spec.n} outputs"
        )
    keys = df.select([to_polars(e).alias(f"__k{i}") for i, e in enumerate(spec.by)])
    bounds = frame_of(spec.boundaries)
    assert isinstance(bounds, pl.DataFrame)
    bounds = bounds.rename(dict(zip(bounds.columns, keys.columns, strict=True)))
    bucket = range_buckets(keys, bounds, spec.descending, spec.nulls_last)
    return _split(df.with_columns(bucket.alias(_BUCKET)), spec.num_outputs)


def choose_boundaries(
    samples: Sequence[pa.Table],
    descending: Sequence[bool],
    nulls_last: Sequence[bool],
    n: int,
    rows: Sequence[int] | None = None,
) -> pa.Table | None:
    """``n - 1`` rows of the sorted union of ``samples`` (sort-key columns ``__k0..``) that
    cut it into ``n`` ranges of about equal weight, or None when there is nothing to choose
    from.

    ``rows[i]`` is the number of rows sample ``i`` was drawn from: each of its rows stands
    for ``rows[i] / len(samples[i])`` rows, so a partition of a million rows weighs as
    much as its rows and not as much as its sample (without weights, 100 partitions of 10
    rows and one of a million gave ranges of 500, 500, 500,000 and 500,000 rows). None:
    every sample row weighs the same."""
    if not samples or n <= 1:
        return None
    weights = rows if rows is not None else [t.num_rows for t in samples]
    frames = [
        frame_of(s).with_columns(pl.lit(w / s.num_rows, pl.Float64).alias(_WEIGHT))
        for s, w in zip(samples, weights, strict=True)
        if s.num_rows > 0 and w > 0
    ]
    if not frames:
        return None
    allk = pl.concat(frames, how="vertical_relaxed")
    keys = [c for c in allk.columns if c != _WEIGHT]
    allk = allk.sort(keys, descending=list(descending), nulls_last=list(nulls_last))
    cum = allk[_WEIGHT].cum_sum()
    total = cum[-1]
    # Boundary i: the first sample row whose cumulative weight reaches i / n of the total.
    targets = pl.Series([total * i / n for i in range(1, n)], dtype=pl.Float64)
    idx = cum.search_sorted(targets, side="left").clip(0, allk.height - 1)
    return frame_to_arrow(allk.select(keys)[idx.to_list()])


_WEIGHT = "__shoal_weight"


def sample_keys(df: pl.DataFrame, by: Sequence[Any], rows: int) -> pa.Table:
    """Up to ``rows`` evenly spaced rows of the sort keys ``by`` (IR expressions)."""
    keys = df.select([to_polars(e).alias(f"__k{i}") for i, e in enumerate(by)])
    if keys.height > rows:
        step = keys.height / rows
        keys = keys[[int(i * step) for i in range(rows)]]
    return frame_to_arrow(keys)


def run_fragment(
    fragment: PlanNode,
    inputs: Sequence[Sequence[pa.Table]],
    scan: ScanInput | None,
    output: OutputSpec,
    input_schemas: Sequence[Schema],
    empty: bool = False,
    keep_frame: bool = False,
    native: NativeQuery | None = None,
) -> tuple[TaskStats, list[Any]]:
    """Run ``fragment`` on one partition.

    ``inputs[i]`` are the tables of stage input ``i`` (concatenated in order). Returns the
    task's stats and ``output.num_outputs`` Arrow tables. The task's code runs inside
    :func:`~shoal.execution.scope.task_scope`: a Polars query it starts never comes back to
    shoal. ``empty``: the caller knows the fragment gives no rows (an input it needs is
    empty, :func:`shoal.runners.adaptive.empty_output`): its query is not run (nor its
    scan read) and the outputs are empty tables of its schema (``extra["empty_input"]``).
    ``keep_frame`` (a task that runs where its output is used: the driver's small-query
    task): a single output is returned as a :class:`KeptFrame` of the Polars result
    instead of an Arrow table. ``native`` (the one task of a small query run in this
    process, ``small_query_native``): the frontend's own query computes the rows instead of
    the lowered fragment (its scan is not read here; the task's stats are as for the
    fragment).
    """
    with task_scope():
        return _run_fragment(
            fragment, inputs, scan, output, input_schemas, empty, keep_frame, native
        )


def _run_fragment(
    fragment: PlanNode,
    inputs: Sequence[Sequence[pa.Table]],
    scan: ScanInput | None,
    output: OutputSpec,
    input_schemas: Sequence[Schema],
    empty: bool = False,
    keep_frame: bool = False,
    native: NativeQuery | None = None,
) -> tuple[TaskStats, list[Any]]:
    start = time.time()
    tags = _source_columns(fragment) if inputs else {}
    frames = [
        _tagged_from_arrow(ts, s, tags[i]) if i in tags else _from_arrow(ts, s)
        for i, (ts, s) in enumerate(zip(inputs, input_schemas, strict=True))
    ]
    rows_in = sum(f.height for f in frames)
    source: ScanInput | _ScanLookup | None = scan
    # Several scans (the small-query path: all whole), read here unless the frontend's own
    # query runs instead.
    if isinstance(scan, ScanSet) and native is None:
        source = _ScanLookup(
            scans_of(fragment),
            [_whole(p) if scan.is_whole(i) else p for i, p in enumerate(scan.parts)],
            scan.partitioned,
        )
    read = time.time()
    if empty:
        df = _empty(fragment.schema)
    elif native is not None:
        df = native.run()
    else:
        df = collect(build(fragment, frames, source))
    ran = time.time()
    scan_rows = 0
    if empty:
        pass  # nothing was read
    elif isinstance(scan, ScanSet | ScanPartition):
        scan_rows = scan.rows
    elif isinstance(scan, MemoryPiece):
        scan_rows = scan.table.num_rows
    rows_in += scan_rows
    sample = None
    if isinstance(output, SingleOutput):
        parts = [df]
        if output.sample_rows:
            sample = sample_keys(df, output.sample_by, output.sample_rows)
    elif isinstance(output, HashOutput):
        parts = _split_hash(df, output)
    else:
        parts = _split_range(df, output)
    tables: list[Any]
    if keep_frame and isinstance(output, SingleOutput):
        # The driver's own task (the small-query path): its one output is the query's
        # result, in this process; it stays a Polars frame (see :class:`KeptFrame`).
        tables = [KeptFrame(df)]
        sizes = (tables[0].nbytes,)
    else:
        tables = [to_wire(frame_to_arrow(p)) for p in parts]
        sizes = tuple(t.nbytes for t in tables)
    end = time.time()
    stats = TaskStats(
        pid=os.getpid(),
        node_id=_node_id(),
        rows_in=rows_in,
        scan_rows=scan_rows,
        rows_out=df.height,
        bytes_out=sum(sizes),
        start=start,
        end=end,
        sample=sample,
        config_digest=get_config().digest(),
        output_bytes=sizes,
        output_rows=tuple(t.num_rows for t in tables),
        extra=_profile(frames, parts, output, (read - start, ran - read, end - ran)),
    )
    if empty:
        stats.extra["empty_input"] = True
    return stats, tables


class KeptFrame:
    """A task's one output kept as the Polars frame the task computed (``run_fragment``
    with ``keep_frame``): the result of a small query run in the driver, which the Polars
    frontend hands to its user as it is, where converting it to Arrow and back (0.1-0.4 ms
    each way for a small result, paid by every small query) gives the same frame.
    :meth:`table` is the Arrow table the task would have returned, for every other reader
    (made on first use, then kept)."""

    __slots__ = ("_table", "frame")

    def __init__(self, frame: pl.DataFrame) -> None:
        self.frame = frame
        self._table: pa.Table | None = None

    @property
    def num_rows(self) -> int:
        return self.frame.height

    @property
    def nbytes(self) -> int:
        """Polars' estimate of the frame's size (what the memory ledger counts)."""
        return int(self.frame.estimated_size())

    def table(self) -> pa.Table:
        """The frame as the Arrow table a task returns (:func:`frame_to_arrow`, then
        :func:`~shoal.planner.physical.to_wire`)."""
        if self._table is None:
            self._table = to_wire(frame_to_arrow(self.frame))
        return self._table


def _profile(
    frames: Sequence[pl.DataFrame],
    parts: Sequence[pl.DataFrame],
    output: OutputSpec,
    phases: tuple[float, float, float],
) -> dict[str, Any]:
    """What a task measures for the query's profile (``explain(analyze=True)``, read by
    :mod:`shoal.runners.profile`) at no cost beyond counting: rows read from each stage
    input (``input_rows``), rows of each output bucket of a hash or range exchange
    (``bucket_rows``), and seconds spent turning the inputs into Polars frames, running
    the fragment's Polars query, and partitioning and converting its output
    (``phase_s``: inputs, query, output)."""
    extra: dict[str, Any] = {
        "input_rows": tuple(f.height for f in frames),
        "phase_s": phases,
    }
    if not isinstance(output, SingleOutput):
        extra["bucket_rows"] = tuple(p.height for p in parts)
    return extra


#: The keys of ``TaskStats.extra`` that :func:`_profile` fills: tuples of numbers that the
#: stats of a partition run as subtasks sum element by element (:func:`merge_profile`).
PROFILE_KEYS = ("input_rows", "phase_s", "bucket_rows")


def merge_profile(extras: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The profile entries of one partition that ran as several subtasks (their
    ``TaskStats.extra``, in order): each of :data:`PROFILE_KEYS` summed element by element
    where every subtask has it."""
    out: dict[str, Any] = {}
    for key in PROFILE_KEYS:
        values = [e.get(key) for e in extras]
        if values and all(v is not None for v in values):
            out[key] = tuple(map(sum, zip(*values, strict=True)))
    return out


def _whole(part: ScanPartition | MemoryPiece | FilePartition | tuple[FilePartition, ...]) -> Any:
    """One scan's entry of a :class:`ScanSet` as :class:`_ScanLookup` takes it."""
    return list(part) if isinstance(part, tuple) else part


def _node_id() -> str:
    try:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    except Exception:  # pragma: no cover
        pass
    return "local"


def run_single(plan: PlanNode) -> pa.Table:
    """Run a whole IR plan (no :class:`StageInput`) in this process as one partition.

    A reference path for tests and debugging: every scan reads all its rows.
    """
    from shoal import storage

    def whole(node: Scan) -> ScanInput | list[ScanInput]:
        if isinstance(node.source, InMemorySource):
            return MemoryPiece(node.source.table)
        if isinstance(node.source, FileSource):
            return [FilePartition(p) for p in node.source.paths]
        assert isinstance(node.source, ParquetSource)
        return ScanPartition(
            tuple(
                ParquetPiece(p, 0, m.num_rows)
                for p, m in zip(
                    node.source.paths,
                    storage.read_footers(node.source.paths, node.source.storage_options),
                    strict=True,
                )
            )
        )

    scans = [n for n in plan.walk() if isinstance(n, Scan)]
    lookup = _ScanLookup(scans, [whole(s) for s in scans])
    out = collect(build(plan, [], lookup))
    return frame_to_arrow(out)
