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
from typing import Any, Literal

import polars as pl
import polars.selectors as cs
import pyarrow as pa
from polars.exceptions import PanicException

from shoal.config import get_config
from shoal.errors import UnsupportedError
from shoal.execution.scope import TASK_ENGINE, task_scope
from shoal.execution.temporal import TEMPORAL_NODES, build_temporal
from shoal.ir.expr import Col, Function, NamedExpr
from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Explode,
    FileSource,
    Filter,
    HConcat,
    InMemorySource,
    Join,
    ParquetSource,
    PlanNode,
    Project,
    RowIndex,
    Scan,
    Sink,
    Slice,
    Sort,
    SqlMap,
    StageInput,
    StorageOptions,
    UdfProject,
    Union,
    Unnest,
    Unpivot,
)
from shoal.ir.types import DataType, Schema, frame_to_arrow, restore_wide
from shoal.lowering.expressions import to_polars
from shoal.planner.physical import (
    FilePartition,
    HashOutput,
    MemoryPiece,
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
    """Partitions for several scans of one plan (:func:`run_single`, the small-query path)."""

    def __init__(self, scans: Sequence[Scan], parts: Sequence[ScanInput | list[ScanInput]]):
        self._parts = {id(s): p for s, p in zip(scans, parts, strict=True)}

    def get(self, node: Scan) -> ScanInput | list[ScanInput]:
        return self._parts[id(node)]


def _scan(node: Scan, part: ScanInput | _ScanLookup | None) -> pl.LazyFrame:
    if isinstance(part, _ScanLookup):
        got = part.get(node)
        if isinstance(got, list):
            lfs = [_scan(node, p) for p in got]
            return pl.concat(lfs, how="vertical") if lfs else _empty(node.schema).lazy()
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
        lfs = [
            _null_columns_cast(
                pl.scan_parquet(p.path, glob=False, **so).slice(p.offset, p.rows).select(cols),
                p.null_columns,
                node.schema,
            )
            for p in part.pieces
            if p.rows > 0 and cols
        ]
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


_JOIN_HOW = {
    "inner": "inner",
    "left": "left",
    "right": "right",
    "full": "full",
    "semi": "semi",
    "anti": "anti",
    "cross": "cross",
}


def build(
    node: PlanNode,
    inputs: Sequence[pl.DataFrame],
    scan: ScanInput | _ScanLookup | None,
) -> pl.LazyFrame:
    """The Polars lazy query for ``node`` over this task's inputs."""
    if isinstance(node, Scan):
        return _scan(node, scan)
    if isinstance(node, StageInput):
        return inputs[node.index].lazy()
    if isinstance(node, Project):
        out = _project(build(node.input, inputs, scan), node)
        return in_memory(out) if needs_in_memory(node.exprs) else out
    if isinstance(node, Filter):
        out = build(node.input, inputs, scan).filter(to_polars(node.predicate))
        return in_memory(out) if needs_in_memory((NamedExpr("", node.predicate),)) else out
    if isinstance(node, Aggregate):
        lf = build(node.input, inputs, scan)
        aggs = [to_polars(e.expr).alias(e.name) for e in node.aggs]
        if not node.keys:
            out = lf.select(aggs)
        else:
            keys = [to_polars(e.expr).alias(e.name) for e in node.keys]
            out = lf.group_by(keys, maintain_order=node.maintain_order).agg(aggs)
        return in_memory(out) if needs_in_memory(node.aggs) else out
    if isinstance(node, Join):
        left = build(node.left, inputs, scan)
        right = build(node.right, inputs, scan)
        if node.how == "cross":
            # Polars' in-memory engine pairs the rows left-major whatever maintain_order
            # says; its streaming engine (a task's collect) interleaves morsels unless told
            # to keep the order (a nested-loop join of SQL's IN subquery came back 4, 3).
            cross_order = "left_right" if node.maintain_order == "none" else node.maintain_order
            return left.join(
                right,
                how="cross",
                suffix=node.suffix,
                maintain_order=cross_order,  # type: ignore[arg-type]
            )
        # A semi or anti join keeps a subset of the left rows: in their order, as Polars'
        # in-memory engine does whatever maintain_order says (its streaming engine, which a
        # task's collect runs, may not), so that a partition's rows stay in input order.
        order = "left" if node.how in ("semi", "anti") else node.maintain_order
        return left.join(
            right,
            left_on=[to_polars(e) for e in node.left_on],
            right_on=[to_polars(e) for e in node.right_on],
            how=_JOIN_HOW[node.how],  # type: ignore[arg-type]
            suffix=node.suffix,
            nulls_equal=node.nulls_equal,
            coalesce=node.coalesce,
            maintain_order=order,  # type: ignore[arg-type]
        )
    if isinstance(node, Sort):
        lf = build(node.input, inputs, scan)
        return lf.sort(
            [to_polars(e) for e in node.by],
            descending=list(node.descending),
            nulls_last=list(node.nulls_last),
            maintain_order=node.stable,
        )
    if isinstance(node, Slice):
        return build(node.input, inputs, scan).slice(node.offset, node.length)
    if isinstance(node, Distinct):
        return build(node.input, inputs, scan).unique(
            subset=list(node.subset) if node.subset is not None else None,
            keep=node.keep,
            maintain_order=node.maintain_order,
        )
    if isinstance(node, Union):
        return pl.concat([build(i, inputs, scan) for i in node.inputs], how="vertical")
    if isinstance(node, HConcat):
        # Polars 2.1: "horizontal" is strict; "horizontal_extend" pads with nulls.
        how: Literal["horizontal", "horizontal_extend"] = (
            "horizontal" if node.strict else "horizontal_extend"
        )
        parts = [build(i, inputs, scan) for i in node.inputs]
        if node.broadcast:
            parts = _broadcast_unit_length([collect(p) for p in parts])
        return pl.concat(parts, how=how)
    if isinstance(node, Explode):
        return build(node.input, inputs, scan).explode(
            list(node.columns), empty_as_null=node.empty_as_null, keep_nulls=node.keep_nulls
        )
    if isinstance(node, Unnest):
        return build(node.input, inputs, scan).unnest(list(node.columns), separator=node.separator)
    if isinstance(node, Unpivot):
        return _unpivot(node, build(node.input, inputs, scan))
    if isinstance(node, RowIndex):
        return build(node.input, inputs, scan).with_row_index(node.name, offset=node.offset)
    if isinstance(node, TEMPORAL_NODES):
        return build_temporal(node, [build(c, inputs, scan) for c in node.children()])
    if isinstance(node, UdfProject):
        # The user's function runs here, on this process's instance (an actor's, for a
        # stateful or GPU UDF: the planner gives those an actor pool stage of their own).
        from shoal.udf import apply_project

        frame = collect(build(node.input, inputs, scan))
        return apply_project(node, frame).lazy()
    if isinstance(node, SqlMap):
        # The node's row-wise SQL runs on DuckDB (shoal.execution.foreign) over this
        # partition's rows; its columns are appended to them.
        from shoal.execution.foreign import run_sql_map

        return run_sql_map(node, collect(build(node.input, inputs, scan))).lazy()
    if isinstance(node, Sink):
        # This task writes its own partition's files; its result lists them.
        from shoal.execution.sink import write_partition

        frame = collect(build(node.input, inputs, scan))
        return write_partition(frame, node).lazy()
    raise UnsupportedError(f"plan node {node.label} is not supported by the kernel")


_HEIGHT_TMP = "__shoal_keep_height"


def _project(lf: pl.LazyFrame, node: Project) -> pl.LazyFrame:
    """``node`` (a :class:`Project`) over ``lf``. Polars' ``select`` gives one row when
    every expression is a scalar and none without expressions (``keep_height`` False);
    with ``keep_height`` the output keeps ``lf``'s height, which Polars' ``with_columns``
    gives (scalars broadcast to it, also over a frame of no columns): the expressions are
    added as temporary columns and then picked. Plain column references need no such
    help (a column has the input's height); no expression at all drops every column."""
    if not node.keep_height or all(isinstance(e.expr, Col) for e in node.exprs):
        if node.keep_height and not node.exprs:
            return lf.drop(cs.all())
        return lf.select([to_polars(e.expr).alias(e.name) for e in node.exprs])
    computed = {
        i: to_polars(e.expr).alias(f"{_HEIGHT_TMP}{i}")
        for i, e in enumerate(node.exprs)
        if not isinstance(e.expr, Col)
    }
    return lf.with_columns(list(computed.values())).select(
        [
            pl.col(f"{_HEIGHT_TMP}{i}").alias(e.name)
            if i in computed
            else to_polars(e.expr).alias(e.name)
            for i, e in enumerate(node.exprs)
        ]
    )


def _broadcast_unit_length(frames: list[pl.DataFrame]) -> list[pl.LazyFrame]:
    """Polars' horizontal concatenation with unit-length inputs as scalars: the height is
    the largest that is not 1 (1 if every input has one row), and each one-row input is
    repeated to it (:class:`~shoal.ir.nodes.HConcat` ``broadcast``)."""
    height = max((f.height for f in frames if f.height != 1), default=1)
    return [(f[[0] * height] if f.height == 1 else f).lazy() for f in frames]


def _unpivot(node: Unpivot, lf: pl.LazyFrame) -> pl.LazyFrame:
    """Unpivot column by column, as the IR defines it. Polars' own ``unpivot`` orders rows
    by chunk of its input (the in-memory engine column by column within each chunk, the
    streaming engine row by row), so a partitioned input would change the order. Values are
    cast to the output's value type (the supertype of the ``on`` columns)."""
    value_type = node.schema[node.value_name].to_polars()
    index = [pl.col(i) for i in node.index]
    parts = [
        lf.select(
            *index,
            pl.lit(c, pl.String).alias(node.variable_name),
            pl.col(c).cast(value_type).alias(node.value_name),
        )
        for c in node.on
    ]
    if not parts:
        return pl.DataFrame(schema=node.schema.to_polars()).lazy()
    return pl.concat(parts, how="vertical")


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
    rows' order: one stable sort on the bucket and ``n`` zero-copy slices, which costs the
    same for any ``n`` (``partition_by`` grouped the rows, and ``n`` filters would pass
    over them ``n`` times)."""
    ordered = tagged.with_columns(pl.col(_BUCKET).cast(pl.UInt32)).sort(
        _BUCKET, maintain_order=True
    )
    bounds = (
        ordered.get_column(_BUCKET)
        .search_sorted(pl.Series(range(n + 1), dtype=pl.UInt32), side="left")
        .to_list()
    )
    data = ordered.drop(_BUCKET)
    return [data.slice(bounds[i], bounds[i + 1] - bounds[i]) for i in range(n)]


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
    """Run a task's query: Polars' :data:`~shoal.execution.scope.TASK_ENGINE` (named, so
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


def run_fragment(
    fragment: PlanNode,
    inputs: Sequence[Sequence[pa.Table]],
    scan: ScanInput | None,
    output: OutputSpec,
    input_schemas: Sequence[Schema],
) -> tuple[TaskStats, list[pa.Table]]:
    """Run ``fragment`` on one partition.

    ``inputs[i]`` are the tables of stage input ``i`` (concatenated in order). Returns the
    task's stats and ``output.num_outputs`` Arrow tables. The task's code runs inside
    :func:`~shoal.execution.scope.task_scope`: a Polars query it starts never comes back to
    shoal.
    """
    with task_scope():
        return _run_fragment(fragment, inputs, scan, output, input_schemas)


def _run_fragment(
    fragment: PlanNode,
    inputs: Sequence[Sequence[pa.Table]],
    scan: ScanInput | None,
    output: OutputSpec,
    input_schemas: Sequence[Schema],
) -> tuple[TaskStats, list[pa.Table]]:
    start = time.time()
    tags = _source_columns(fragment)
    frames = [
        _tagged_from_arrow(ts, s, tags[i]) if i in tags else _from_arrow(ts, s)
        for i, (ts, s) in enumerate(zip(inputs, input_schemas, strict=True))
    ]
    rows_in = sum(f.height for f in frames)
    source: ScanInput | _ScanLookup | None = scan
    if isinstance(scan, ScanSet):  # the small-query path: every scan of the plan, whole
        source = _ScanLookup(scans_of(fragment), [_whole(p) for p in scan.parts])
    df = collect(build(fragment, frames, source))
    scan_rows = 0
    if isinstance(scan, ScanSet | ScanPartition):
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
    tables = [to_wire(frame_to_arrow(p)) for p in parts]
    sizes = tuple(t.nbytes for t in tables)
    stats = TaskStats(
        pid=os.getpid(),
        node_id=_node_id(),
        rows_in=rows_in,
        scan_rows=scan_rows,
        rows_out=df.height,
        bytes_out=sum(sizes),
        start=start,
        end=time.time(),
        sample=sample,
        config_digest=get_config().digest(),
        output_bytes=sizes,
    )
    return stats, tables


def _whole(part: ScanPartition | MemoryPiece | tuple[FilePartition, ...]) -> Any:
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
