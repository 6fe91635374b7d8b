"""Translation functions for Polars plan nodes (NodeTraverser version (16, 0)).

Each ``_name`` function below translates the Polars node class of that name into shoal IR
and is registered in :data:`shoal_polars.translate.NODES`. Attribute layouts follow what
Polars 2.1's NodeTraverser shows; where a Polars option has no IR equivalent, the node is
recorded as unsupported with the reason.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Callable
from typing import Any, cast

import polars as pl
import pyarrow as pa

from shoal import storage
from shoal.errors import PlanError, UnsupportedError
from shoal.ir.expr import Agg, BinaryOp, Cast, Col, Expr, Function, Lit, NamedExpr, replace
from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Explode,
    FileSource,
    Filter,
    HConcat,
    InMemorySource,
    Join,
    JoinHow,
    JoinOrder,
    ParquetSource,
    PlanNode,
    Project,
    RowIndex,
    Scan,
    Slice,
    Sort,
    StorageOptions,
    Union,
    Unnest,
    Unpivot,
)
from shoal.ir.types import BOOL, DataType, Schema, frame_to_arrow
from shoal.planner.partitioning import HeldCache, file_digest
from shoal_polars.exprs import OPERATORS
from shoal_polars.functions import function_key
from shoal_polars.rewrite import origin_of
from shoal_polars.temporal import asof_join, temporal_group_by
from shoal_polars.translate import NODES, NodeHandler, Translator, Unsupported

#: Name prefix of the columns Polars' common subexpression elimination adds.
_CSE_PREFIX = "__POLARS_CSER_"

#: A Polars slice length at or above this means "to the end" (Polars' IdxSize::MAX).
_TO_END = 2**32 - 1

#: Polars join ``how`` -> IR join type (``IEJoin`` becomes a cross join and a filter).
_JOIN_HOW: dict[str, JoinHow] = {
    "Inner": "inner",
    "Left": "left",
    "Right": "right",
    "Full": "full",
    "Semi": "semi",
    "Anti": "anti",
    "Cross": "cross",
}

#: Polars' join ``maintain_order`` values (the IR's :data:`~shoal.ir.nodes.JoinOrder`).
_JOIN_ORDERS = frozenset({"none", "left", "right", "left_right", "right_left"})


def _register(name: str) -> Callable[[NodeHandler], NodeHandler]:
    def deco(fn: NodeHandler) -> NodeHandler:
        NODES[name] = fn
        return fn

    return deco


def _cols(schema: Schema) -> tuple[NamedExpr, ...]:
    return tuple(NamedExpr(n, Col(n, t)) for n, t in schema.fields)


def _length(length: int, offset: int) -> int | None:
    """A Polars slice length, None for "to the end": no frame has more than IdxSize::MAX
    rows, so a slice reaching that far (Polars fuses ``slice(1).slice(1)`` into one of
    length ``MAX - 1`` at offset 2) reads to the end."""
    return None if length + abs(offset) >= _TO_END else int(length)


def _is_true(e: Expr) -> bool:
    return isinstance(e, Lit) and e.value is True


def _cols_outside_aggs(e: Expr) -> bool:
    if isinstance(e, Agg):
        return False
    if isinstance(e, Col):
        return True
    return any(_cols_outside_aggs(c) for c in e.children())


# ---------------------------------------------------------------- sources


@_register("DataFrameScan")
def _dataframe_scan(t: Translator, node: Any, schema: Schema) -> PlanNode:
    # ``projection`` is already reflected in the node's schema; the table keeps every column
    # (its height too when the query reads none) except those of types shoal cannot carry
    # (Int128, Object): they matter only when the query reads them, and then the schema's
    # translation has reported them.
    if len(schema) != len(t.nt.get_schema()):  # a column shoal cannot carry: reported
        return t.placeholder(schema)
    frame = pl.DataFrame._from_pydf(node.df)
    origin = origin_of(frame) or ""
    carried = [c for c, dtype in frame.schema.items() if _carried(dtype)]
    if len(carried) != frame.width:
        frame = frame.select(carried)
    pred = None if node.selection is None else t.expr(node.selection.node, "DataFrameScan")
    return _scan(t, "DataFrameScan", InMemorySource(frame_to_arrow(frame), origin), schema, pred)


def _carried(dtype: Any) -> bool:
    """Whether shoal's types carry Polars ``dtype`` (not Int128, UInt128, Object)."""
    try:
        DataType.from_polars(dtype)
    except PlanError:
        return False
    return True


def _scan(t: Translator, where: str, source: Any, schema: Schema, pred: Expr | None) -> PlanNode:
    if pred is not None and _is_true(pred):
        pred = None
    if pred is not None and not pred.columns() <= set(schema.names):
        missing = sorted(pred.columns() - set(schema.names))
        t.error(where, f"pushed predicate reads columns {missing} that the scan does not output")
        return t.placeholder(schema)
    return Scan(source, schema, pred)


@_register("Scan")
def _file_scan(t: Translator, node: Any, schema: Schema) -> PlanNode:
    scan_type = str(node.scan_type[0] if isinstance(node.scan_type, tuple) else node.scan_type)
    where = f"Scan({scan_type})"
    fo = node.file_options
    problems = _scan_problems(node, scan_type)
    paths = tuple(_source_path(p) for p in node.paths)
    options = _storage_options(node, problems)
    row_index = fo.row_index
    index_name = None if row_index is None else str(row_index[0])
    # Hive partitions: one row of partition values per file (Polars has already dropped the
    # files its predicate rules out).
    hive = None if node.hive_parts is None else pl.DataFrame._from_pydf(node.hive_parts)
    hive_cols = [] if hive is None else [c for c in hive.columns if c in schema.names]
    if hive is not None and hive.height != len(paths):
        problems.append("hive partition values do not line up with the files")
    table_schema = Schema(tuple((n, dt) for n, dt in schema.fields if n != index_name))
    file_schema = Schema(tuple((n, dt) for n, dt in table_schema.fields if n not in hive_cols))
    sources: list[Any] = []
    for group in _file_groups(paths, hive, hive_cols) if not problems else []:
        if scan_type == "parquet":
            sources.append(ParquetSource(group, options))
            continue
        found = _file_source(scan_type, group, node.scan_type[1], file_schema, options)
        if isinstance(found, str):
            problems.append(found)
            break
        sources.append(found)
    if scan_type == "parquet" and not problems:
        _check_file_columns(fo, paths, options, file_schema.names)
    for p in problems:
        t.error(where, p)
    pred = None if node.predicate is None else t.expr(node.predicate.node, "Scan")
    if problems:
        return t.placeholder(schema)
    if hive is None and row_index is None and fo.n_rows is None:
        return _scan(t, "Scan", sources[0], schema, pred)
    out: PlanNode
    if hive is None:
        out = Scan(sources[0], file_schema)
    else:
        try:
            # The file columns' part of the predicate also goes into each file scan, where
            # the planner prunes row groups with it (it stays on the Filter below too).
            inner = pred if row_index is None and fo.n_rows is None else None
            out = _hive_union(sources, hive, hive_cols, table_schema, file_schema, inner)
        except UnsupportedError as exc:
            t.error(where, str(exc))
            return t.placeholder(schema)
    # Polars numbers the file rows (row index), then applies the pre-slice, then the
    # predicate: the row index and slice see every row of the files.
    if row_index is not None:
        out = RowIndex(out, str(index_name), int(row_index[1]), schema)
    if fo.n_rows is not None:
        offset, length = fo.n_rows
        out = Slice(out, int(offset), _length(length, offset), schema)
    if pred is not None and not _is_true(pred):
        out = Filter(out, pred, schema)
    return out


def _check_file_columns(
    fo: Any, paths: tuple[str, ...], options: StorageOptions | None, read: tuple[str, ...]
) -> None:
    """The column checks of Polars' multi-file Parquet scans, done on the footers before any
    task runs (shoal's tasks read only the columns ``read``, file by file):
    ``extra_columns="raise"`` (``scan_parquet``'s default) fails the query when a file has a
    top-level column that the first file (the scan's schema) lacks, whatever the query
    reads; ``missing_columns="raise"`` (the default; other policies are refused) fails it
    when a file lacks a column the query reads.

    Raises ``polars.exceptions.SchemaError`` / ``ColumnNotFoundError`` naming the column and
    the file, as Polars' engines do."""
    if len(paths) < 2:
        return
    # The footers' top-level column names, from the digests planning keeps beside the
    # footer cache (a file that changed is read again): converting every footer's schema to
    # Arrow on each query cost about 0.1 ms per file. A footer whose schema cannot be read
    # is left to the planner, which names the file (PlanError).
    metas = storage.read_footers(paths, options)
    check_extra = str(getattr(fo, "extra_columns_policy", "raise")) == "raise"
    # Files that passed these checks as they are now (the same footer objects: unchanged
    # files) pass them again: a TPC-H query at scale 0.1 spent a tenth of its planning here.
    key = (paths, tuple(map(id, metas)), read, check_extra)
    if _CHECKED.lookup(key)[0]:
        return
    digests = [file_digest(meta) for meta in metas]
    if any(isinstance(d.types, Exception) for d in digests):
        return
    names = [list(cast(dict[str, DataType], d.types)) for d in digests]
    expected = set(names[0])
    for path, have in zip(paths[1:], names[1:], strict=True):
        extra = [c for c in have if c not in expected]
        if check_extra and extra:
            raise pl.exceptions.SchemaError(
                f"extra column in file outside of expected schema: {extra[0]} (file "
                f"'{path}'; the first file has no such column): pass extra_columns='ignore' "
                "to scan_parquet to read the columns of the first file"
            )
        missing = [c for c in read if c not in have]
        if missing:
            raise pl.exceptions.ColumnNotFoundError(
                f"did not find column {missing[0]} in file '{path}': pass "
                "missing_columns='insert' to scan_parquet to read it as nulls there"
            )
    _CHECKED.put(key, metas, True)


#: Multi-file Parquet scans whose column checks passed (:func:`_check_file_columns`), by
#: (paths, the ids of their footer objects, the columns read, the extra-columns check),
#: held with the footers.
_CHECKED = HeldCache()


def _source_path(path: Any) -> str:
    """A scan's path as the IR keeps it: object-storage URLs as they are; a ``file:`` URI
    (``file:///a/b``, ``file:/a/b``; percent escapes decoded, as Polars reads them) as the
    path it names; local paths absolute. A file name is never a pattern here (Polars has
    already expanded the user's globs into file names)."""
    text = os.fspath(path)
    if text.startswith("file:"):
        parsed = urllib.parse.urlsplit(text)
        if parsed.netloc in ("", "localhost"):
            return os.path.abspath(urllib.parse.unquote(parsed.path))
    return text if storage.is_url(text) else os.path.abspath(text)


def _storage_options(node: Any, problems: list[str]) -> StorageOptions | None:
    """The scan's cloud options (Polars' serialised ``CloudOptions``, the third member of
    ``scan_type``) as ``storage_options`` in object_store's key names (``Endpoint`` of
    ``Aws`` -> ``aws_endpoint``, ``{"Client": "AllowHttp"}`` -> ``allow_http``), or None
    when the scan has none. Appends to ``problems`` when an option cannot be carried."""
    raw = (
        node.scan_type[2] if isinstance(node.scan_type, tuple) and len(node.scan_type) > 2 else None
    )
    if not raw:
        return None
    try:
        cloud = json.loads(raw)
    except (TypeError, ValueError):
        problems.append("its cloud storage options could not be read")
        return None
    provider = (cloud or {}).get("credential_provider")
    builder = provider.get("Builder") if isinstance(provider, dict) else None
    if provider is not None and not (
        isinstance(builder, list) and b"AutoInit" in bytes(b % 256 for b in builder)
    ):
        # Polars' default (AutoInit) provider builds itself from the options on each
        # reader; a provider of the user's own cannot travel to the tasks.
        problems.append("a credential_provider is not supported (storage_options are)")
        return None
    config = (cloud or {}).get("config") or {}
    out: dict[str, str] = {}
    for family, pairs in config.items():
        prefix = {"Aws": "aws_", "Gcp": "google_", "Azure": "azure_"}.get(family)
        if prefix is None or not isinstance(pairs, list):
            problems.append(f"{family} storage options are not supported")
            return None
        for key, value in pairs:
            if isinstance(key, dict) and "Client" in key:
                name = _snake(str(key["Client"]))
            elif isinstance(key, str):
                name = prefix + _snake(key)
            else:
                problems.append(f"storage option {key!r} is not supported")
                return None
            if name not in storage.OPTION_MAP:
                problems.append(f"storage option {name!r} is not supported")
                return None
            out[name] = str(value)
    return StorageOptions(out) if out else None


def _snake(name: str) -> str:
    """``AccessKeyId`` -> ``access_key_id``."""
    return "".join(f"_{c.lower()}" if c.isupper() and i else c.lower() for i, c in enumerate(name))


def _file_groups(
    paths: tuple[str, ...], hive: pl.DataFrame | None, hive_cols: list[str]
) -> list[tuple[str, ...]]:
    """The files in order, cut where the hive partition values change (one group without
    hive partitioning)."""
    if hive is None:
        return [paths]
    rows = hive.select(hive_cols).rows() if hive_cols else [()] * len(paths)
    groups: list[list[str]] = []
    for i, path in enumerate(paths):
        if i == 0 or rows[i] != rows[i - 1]:
            groups.append([])
        groups[-1].append(path)
    return [tuple(g) for g in groups]


def _hive_union(
    sources: list[Any],
    hive: pl.DataFrame,
    hive_cols: list[str],
    table_schema: Schema,
    file_schema: Schema,
    pred: Expr | None = None,
) -> PlanNode:
    """Each group of files with its partition values as literal columns, in file order.

    A literal takes the height of the columns beside it; where no file column is read (only
    partition columns are), the files' first column is read for its height and dropped.
    Raises :class:`shoal.UnsupportedError` for such a CSV or NDJSON scan."""
    carrier = file_schema
    if not file_schema.fields:
        if not isinstance(sources[0], ParquetSource):
            raise UnsupportedError("a scan of hive partition columns only (CSV, NDJSON)")
        src = sources[0]
        meta = storage.read_footers(src.paths[:1], src.storage_options)[0]
        fields = list(meta.schema.to_arrow_schema())
        # A file may hold a partition column too (sink_parquet(PartitionBy(key=lit(1))));
        # Polars takes the partition value, so the carrier is another column if any.
        first_field = next((f for f in fields if f.name not in hive_cols), fields[0])
        carrier = Schema(((first_field.name, DataType(first_field.type)),))
    kept = tuple((n, dt) for n, dt in carrier.fields if n not in hive_cols)
    wide = Schema((*kept, *((n, table_schema[n]) for n in hive_cols)))
    file_pred = _file_conjuncts(pred, set(carrier.names)) if pred is not None else None
    parts: list[PlanNode] = []
    first = 0
    for source in sources:
        values = hive.row(first, named=True)
        first += len(source.paths)
        exprs = (
            *_cols(Schema(kept)),
            *(NamedExpr(n, Lit(values[n], table_schema[n])) for n in hive_cols),
        )
        parts.append(Project(Scan(source, carrier, file_pred), exprs, wide, keep_height=True))
    out = parts[0] if len(parts) == 1 else Union(tuple(parts), wide)
    return Project(out, _cols(table_schema), table_schema, keep_height=True)


def _file_conjuncts(pred: Expr, columns: set[str]) -> Expr | None:
    """The AND of ``pred``'s top-level conjuncts that read only ``columns`` and are row
    local (None when there is none): a filter implied by ``pred``."""
    if isinstance(pred, BinaryOp) and pred.op == "and":
        left = _file_conjuncts(pred.left, columns)
        right = _file_conjuncts(pred.right, columns)
        if left is None or right is None:
            return left or right
        return BinaryOp("and", left, right, BOOL)
    if pred.columns() and pred.columns() <= columns and pred.is_row_local():
        return pred
    return None


def _scan_problems(node: Any, scan_type: str) -> list[str]:
    if scan_type not in ("parquet", "csv", "ndjson"):
        return [f"{scan_type} scans are not supported (Parquet, CSV and NDJSON are)"]
    out = []
    fo = node.file_options
    for attr, what in (
        ("include_file_paths", "include_file_paths"),
        ("deletion_files", "deletion files"),
        ("column_mapping", "column mapping"),
        ("default_values", "default column values"),
    ):
        if getattr(fo, attr, None) is not None:
            out.append(f"{what} is not supported")
    if getattr(fo, "row_count", None) is not None:
        # Iceberg's row count from table metadata (scan_parquet(_row_count=...)): Polars
        # counts rows by it without reading them, and raises where it exceeds its index.
        out.append("a row count given with the scan (_row_count) is not supported")
    if getattr(fo, "missing_columns_policy", "raise") != "raise":
        out.append("missing_columns other than 'raise' is not supported")
    policy = getattr(fo, "cast_columns_policy", None) or {}
    casts = sorted(k for k, v in policy.items() if v is True and k != "null_upcast")
    if casts:
        out.append(f"cast_options {casts} are not supported")
    if scan_type == "parquet":
        try:
            options = json.loads(node.scan_type[1])
        except (TypeError, ValueError, IndexError):
            options = {}
        if isinstance(options, dict) and options.get("schema") is not None:
            out.append("an explicit schema= is not supported")
    return out


#: CSV options in Polars' serialised ``CsvReadOptions`` whose value shoal passes on to
#: ``polars.scan_csv`` (JSON key -> keyword); ``parse_options`` keys are prefixed.
_CSV_OPTIONS = {
    "has_header": "has_header",
    "skip_rows": "skip_rows",
    "skip_lines": "skip_lines",
    "skip_rows_after_header": "skip_rows_after_header",
    "ignore_errors": "ignore_errors",
    "raise_if_empty": "raise_if_empty",
    "parse_options.missing_is_null": "empty_string_is_null",
    "parse_options.truncate_ragged_lines": "truncate_ragged_lines",
    "parse_options.try_parse_dates": "try_parse_dates",
    "parse_options.decimal_comma": "decimal_comma",
}

#: Options that only steer schema inference or buffering: each file is read with the
#: dtypes Polars inferred for the whole scan (the scan's schema), so they do not matter.
_INFERENCE_ONLY = frozenset(
    {"infer_schema_length", "infer_schema_files", "schema_overwrite", "dtype_overwrite",
     "low_memory", "chunk_size", "rechunk", "n_threads", "path", "columns", "projection",
     "n_rows", "row_index", "fields_to_cast"}
)  # fmt: skip

#: Serialised names of the dtypes an explicit CSV/NDJSON ``schema=`` may use.
_DTYPES: dict[str, pl.DataType] = {
    str(dt): dt
    for dt in (pl.Int8(), pl.Int16(), pl.Int32(), pl.Int64(), pl.UInt8(), pl.UInt16(),
               pl.UInt32(), pl.UInt64(), pl.Float32(), pl.Float64(), pl.String(),
               pl.Boolean(), pl.Date())
}  # fmt: skip


def _file_source(
    kind: str,
    paths: tuple[str, ...],
    options_json: str,
    schema: Schema,
    storage_options: StorageOptions | None = None,
) -> FileSource | str:
    """A CSV or NDJSON source whose files, each read on its own, give the rows Polars reads
    from all of them: the parse options are carried over, and each file is read with the
    dtypes of ``schema`` (the scan's columns, as Polars inferred them over the files), so
    that per-file type inference cannot differ. Returns the reason when an option cannot be
    carried over."""
    try:
        raw = json.loads(options_json)
    except (TypeError, ValueError):
        return "its options could not be read"
    flat = {k: v for k, v in raw.items() if k != "parse_options"}
    flat.update({f"parse_options.{k}": v for k, v in (raw.get("parse_options") or {}).items()})
    kwargs: dict[str, Any] = {}
    for key, value in flat.items():
        if key in _INFERENCE_ONLY:
            continue
        if key == "schema":
            if value is not None:
                fields = value.get("fields", {})
                unknown = sorted({str(v) for v in fields.values() if str(v) not in _DTYPES})
                if unknown:
                    return f"an explicit schema with dtypes {unknown} is not supported"
                kwargs["schema"] = tuple(
                    (n, DataType.from_polars(_DTYPES[str(v)])) for n, v in fields.items()
                )
        elif kind == "ndjson":
            if key != "ignore_errors":
                return f"option {key}={value!r} is not supported"
            kwargs[key] = bool(value)
        elif key in _CSV_OPTIONS:
            kwargs[_CSV_OPTIONS[key]] = value
        elif key in ("parse_options.separator", "parse_options.eol_char"):
            kwargs[key.split(".")[1]] = chr(value)
        elif key == "parse_options.quote_char":
            kwargs["quote_char"] = None if value is None else chr(value)
        elif key == "parse_options.encoding":
            kwargs["encoding"] = {"Utf8": "utf8", "LossyUtf8": "utf8-lossy"}[value]
        elif key == "parse_options.comment_prefix":
            if value is not None:
                kwargs["comment_prefix"] = _comment_prefix(value)
        elif key == "parse_options.null_values":
            if value is not None:
                kwargs["null_values"] = _null_values(value)
        elif key == "column_names_overwrite":
            if value is not None:
                kwargs["new_columns"] = tuple(value)
        else:
            return f"option {key}={value!r} is not supported"
    if "schema" not in kwargs and schema.fields:
        kwargs["schema_overrides"] = schema.fields
    return FileSource(kind, paths, tuple(sorted(kwargs.items())), storage_options)


def _comment_prefix(value: Any) -> str:
    """``{"Single": 35}`` or ``{"Multi": "//"}`` -> the prefix."""
    if "Single" in value:
        return chr(value["Single"])
    return str(value["Multi"])


def _null_values(value: Any) -> str | tuple[str, ...] | tuple[tuple[str, str], ...]:
    """Polars' serialised ``NullValues`` -> the ``null_values`` argument (hashable: a
    tuple for a list, pairs for a dict; the kernel turns them back)."""
    if "AllColumnsSingle" in value:
        return str(value["AllColumnsSingle"])
    if "AllColumns" in value:
        return tuple(value["AllColumns"])
    return tuple((str(k), str(v)) for k, v in value["Named"])


# ---------------------------------------------------------------- row-wise


@_register("Select")
def _select(t: Translator, node: Any, schema: Schema) -> PlanNode:
    child = t.plan(node.input)
    exprs = t.named_at(node.input, node.expr, "Select")
    scalar = all(
        ne.expr.has_agg() and not _cols_outside_aggs(ne.expr) and not ne.expr.sized_outside_aggs()
        for ne in exprs
    )
    if exprs and scalar:
        # Every column is an aggregate of the whole input: one row, computed in two phases.
        return Aggregate(child, (), exprs, False, schema)
    return Project(child, exprs, schema)


@_register("HStack")
def _hstack(t: Translator, node: Any, schema: Schema) -> PlanNode:
    child = t.plan(node.input)
    new = {ne.name: ne for ne in t.named_at(node.input, node.exprs, "HStack")}
    if all(name.startswith(_CSE_PREFIX) for name in new):
        # Polars' common subexpression elimination: columns that the node above reads (an
        # aggregate among them is one value, which Polars does not broadcast here). Each
        # read becomes the expression itself (Translator.expr), and this node goes.
        t.cse.update((name, ne.expr) for name, ne in new.items())
        return child
    # Polars: a new column with an existing name replaces it in place; others append.
    exprs = tuple(new.get(n) or NamedExpr(n, t.cse.get(n, Col(n, dt))) for n, dt in schema.fields)
    # with_columns keeps the frame's height: a literal replacing the only column broadcasts.
    return Project(child, exprs, schema, keep_height=True)


@_register("SimpleProjection")
def _simple_projection(t: Translator, node: Any, schema: Schema) -> PlanNode:
    # Column pruning keeps the rows, also down to no column (``select(pl.len())``).
    return Project(t.plan(node.input), _cols(schema), schema, keep_height=True)


@_register("Filter")
def _filter(t: Translator, node: Any, schema: Schema) -> PlanNode:
    child = t.plan(node.input)
    with t.at(node.input):
        pred = t.expr(node.predicate.node, "Filter")
    return child if _is_true(pred) else Filter(child, pred, schema)


@_register("Cache")
def _cache(t: Translator, node: Any, schema: Schema) -> PlanNode:
    # One IR object per Polars cache id, so that the planner sees a shared subplan.
    found = t.caches.get(node.id_)
    if found is None:
        found = t.caches[node.id_] = t.plan(node.input)
    return found


# ---------------------------------------------------------------- whole-input


@_register("GroupBy")
def _group_by(t: Translator, node: Any, schema: Schema) -> PlanNode:
    options = node.options
    if node.apply:
        t.error("GroupBy", "map_groups (a Python function per group) is not supported")
    child = t.plan(node.input)
    keys = t.named_at(node.input, node.keys, "GroupBy")
    aggs = tuple(_implode(ne, schema) for ne in t.named_at(node.input, node.aggs, "GroupBy"))
    for ne in aggs:
        if _aggregated_eval(ne.expr):
            t.error(
                f"GroupBy: aggregation {ne.name!r}",
                "an aggregate of list.eval lists inside group_by().agg() is not supported "
                "(Polars 2.1 takes first/last of the group's elements, not of its lists)",
            )
        if not ne.expr.has_agg() and not t.failed(ne.expr):
            t.error(f"GroupBy: aggregation {ne.name!r}", _not_an_aggregate(ne.expr))
    out: PlanNode
    if getattr(options, "dynamic", None) is not None or getattr(options, "rolling", None):
        out = temporal_group_by(t, options, child, keys, aggs, schema)
    else:
        out = Aggregate(child, keys, aggs, bool(node.maintain_order), schema)
    return _sliced(out, getattr(options, "slice", None))


def _implode(ne: NamedExpr, schema: Schema) -> NamedExpr:
    """A ``group_by().agg()`` item that aggregates nothing but reads columns
    (``agg(pl.col("x"))``, ``agg(pl.col("x").sort())``) is the list of its values per group,
    in the group's row order: Polars' ``implode`` of it (the output dtype, a list, is the
    one Polars resolved). A literal item (``agg(pl.lit(1) + pl.lit(2))``) is one value per
    group: its ``first``. Anything else stays as it is."""
    e = ne.expr
    if ne.name in schema.names:
        got = _get_per_group(e)
        if got is not None:
            return NamedExpr(ne.name, got)
    if e.has_agg() or ne.name not in schema.names:
        return ne
    if not e.columns():
        # A literal (lit(7) + lit(2), pl.struct of literals): one value per group.
        if e.is_row_local():
            return NamedExpr(ne.name, Agg("first", e, schema[ne.name]))
        return ne
    if any(isinstance(x, Function) and x.option("scalar") for x in e.walk()):
        return ne  # Expr.get of an index shoal does not take (see _get_per_group): refused
    return NamedExpr(ne.name, Agg("implode", e, schema[ne.name]))


def _get_per_group(e: Expr) -> Expr | None:
    """``x.get(i)`` in ``group_by().agg()``: the value at position ``i`` of the group's
    values of ``x`` (negative positions from the end; out of bounds a ``ComputeError``, as
    in Polars), written as the group's list of ``x`` (``implode``) and ``list.get(i)``,
    which is what Polars answers. ``i`` must be one value per group: an integer literal or
    an expression of aggregates and literals. None for anything else."""
    if not (isinstance(e, Function) and e.name == "gather" and e.option("scalar")):
        return None
    x, idx = e.args
    if x.has_agg() or not _one_per_group(idx):
        return None
    listed = Agg("implode", x, DataType.from_polars(pl.List(x.dtype.to_polars())))
    return Function("list.get", (listed, idx), (("null_on_oob", False),), e.dtype)


def _one_per_group(e: Expr) -> bool:
    """Whether ``e`` is one value per group: a non-null integer literal, an aggregate, or a
    row-wise expression of those."""
    if isinstance(e, Lit):
        return isinstance(e.value, int) and not isinstance(e.value, bool)
    if isinstance(e, Agg):
        return True
    kids = e.children()
    return bool(kids) and e.is_row_local() and all(_one_per_group(k) for k in kids)


#: IR functions that run Polars' own ``Eval`` (see :mod:`shoal_polars.rewrite`).
_EVALS = frozenset({"list.eval", "cumulative_eval"})


def _aggregated_eval(expr: Expr) -> bool:
    """Whether an aggregate other than ``implode`` reads the lists a ``list.eval`` made.
    Polars 2.1 (both engines) answers ``agg(pl.col("l").list.eval(e).first())`` with the
    first *element* of the group's evaluated lists (``[2]`` for a first row ``[1, 2, 2]``
    and ``e = element() + 1``), not the first list; lists per group (``implode``) and
    aggregates of values derived from the lists (``list.len().sum()``) are right."""
    for e in expr.walk():
        if not isinstance(e, Agg) or e.name == "implode" or e.arg is None:
            continue
        if not pa.types.is_list(e.arg.dtype.arrow) and not pa.types.is_large_list(
            e.arg.dtype.arrow
        ):
            continue
        if any(isinstance(x, Function) and x.name in _EVALS for x in e.arg.walk()):
            return True
    return False


def _not_an_aggregate(expr: Expr) -> str:
    """Why a ``group_by().agg()`` item that aggregates nothing cannot run."""
    if any(isinstance(e, Function) and e.option("scalar") for e in expr.walk()):
        return (
            "Expr.get (one value per group) in an aggregation is supported with an index "
            "that is an integer literal or an expression of aggregates only"
        )
    return "no aggregate function: Polars would return a list per group"


def _sliced(node: PlanNode, slice_: Any) -> PlanNode:
    """``node`` with a slice that Polars pushed into it, ``(offset, length)``, applied to
    its output (as Polars applies it)."""
    if slice_ is None:
        return node
    return Slice(node, int(slice_[0]), _length(slice_[1], slice_[0]), node.schema)


@_register("Distinct")
def _distinct(t: Translator, node: Any, schema: Schema) -> PlanNode:
    keep, subset, maintain_order, slice_ = node.options
    child = t.plan(node.input)
    if keep not in ("first", "last", "any", "none"):
        t.error(f"Distinct(keep={keep!r})", "unknown keep strategy")
        return t.placeholder(schema)
    names = None if subset is None else tuple(str(n) for n in subset)
    return _sliced(Distinct(child, names, keep, bool(maintain_order), schema), slice_)


@_register("Union")
def _union(t: Translator, node: Any, schema: Schema) -> PlanNode:
    # Polars has already made every input's schema equal to the output's (casts and
    # projections for relaxed and diagonal concatenation).
    inputs = tuple(t.plan(i) for i in node.inputs)
    if not inputs:
        t.error("Union", "no inputs")
        return t.placeholder(schema)
    return _sliced(Union(inputs, schema), node.slice)


@_register("Join")
def _join(t: Translator, node: Any, schema: Schema) -> PlanNode:
    how_raw, nulls_equal, slice_, suffix, coalesce, maintain_order = node.options
    # ``how`` is a string ("Inner"), or a tuple: ("Inner", "fused_predicate") when Polars
    # moved a filter on the join's output into the join, ("IEJoin", op1, op2) for an
    # inequality join (Polars' rewrite of a cross join under a filter, and join_where).
    how_name = str(how_raw[0] if isinstance(how_raw, tuple) else how_raw)
    if how_name == "AsOf":
        return _sliced(asof_join(t, node, schema), slice_)
    if _is_inequality(how_raw) and how_name != "IEJoin":
        # join_where(how="left"/"right"/"full"): Polars 2.1 shows ("Left", op1, op2), the
        # join type with the inequality operators of its keys. Only the inner inequality
        # join (("IEJoin", op1, op2), "Inner" here) is a cross join and a filter.
        if how_name != "Inner":
            t.error(
                f"Join(how={how_name}, inequality)",
                "join_where with how other than 'inner' is not supported by shoal",
            )
            t.plan(node.input_left)
            t.plan(node.input_right)
            return t.placeholder(schema)
        how_name = "IEJoin"
    how = _JOIN_HOW.get(how_name)
    if how is None and how_name != "IEJoin":
        t.error(f"Join(how={how_name})", "join type not supported by shoal")
    if node.predicate is not None and how_name not in ("Inner", "Cross"):
        # ("Cross", "cross_and_filter") with a predicate: an inner nested-loop join
        # (join_where on comparisons an IEJoin does not take), the rows of the cross join
        # where the predicate holds; a left one keeps unmatched rows, which a filter loses.
        t.error(f"Join(how={how_name})", "join predicates are supported on inner joins only")
    order = cast(JoinOrder, str(maintain_order or "none"))
    if order not in _JOIN_ORDERS:
        t.error("Join", f"unknown maintain_order={maintain_order!r}")
    left = t.plan(node.input_left)
    right = t.plan(node.input_right)
    if how is None and how_name != "IEJoin":
        # The join itself is the problem: its keys would only add noise to the report.
        return t.placeholder(schema)
    if how_name == "IEJoin":
        with t.at(node.input_left):
            left_on = tuple(_ie_key(t, e.node) for e in node.left_on)
        with t.at(node.input_right):
            right_on = tuple(_ie_key(t, e.node) for e in node.right_on)
        if _failed_join_part(t, left, right, left_on + right_on):
            return t.placeholder(schema)
        out = _ie_join(t, how_raw, left, right, left_on, right_on, str(suffix), order, schema)
    else:
        assert how is not None
        left_on = tuple(ne.expr for ne in t.named_at(node.input_left, node.left_on, "Join"))
        right_on = tuple(ne.expr for ne in t.named_at(node.input_right, node.right_on, "Join"))
        if _failed_join_part(t, left, right, left_on + right_on):
            # Still translate the fused predicate, to report its errors too.
            if node.predicate is not None:
                t.expr(node.predicate.node, "Join")
            return t.placeholder(schema)
        out = _equi_join(
            left,
            right,
            left_on,
            right_on,
            how,
            str(suffix),
            bool(nulls_equal),
            bool(coalesce),
            schema,
            order,
        )
        # A fused predicate reads the join's output columns (suffixed names included).
        pred = None if node.predicate is None else t.expr(node.predicate.node, "Join")
        if pred is not None and not _is_true(pred):
            # Inner (or cross) join with a predicate: the rows of the join where it holds.
            out = Filter(out, pred, schema)
    return _sliced(out, slice_)


def _is_inequality(how: Any) -> bool:
    """Whether a Join node's ``how`` option is an inequality join's: (name, operator,
    operator or None), where a fused predicate gives (name, "fused_predicate") instead."""
    return isinstance(how, tuple) and len(how) == 3 and not isinstance(how[1], str)


def _failed_join_part(
    t: Translator, left: PlanNode, right: PlanNode, keys: tuple[Expr, ...]
) -> bool:
    """Whether an input or a key of a join could not be translated (its error is recorded):
    the join is then a placeholder too, as its columns and keys are unknown."""
    return (
        isinstance(left, Unsupported)
        or isinstance(right, Unsupported)
        or any(t.failed(k) for k in keys)
    )


def _equi_join(
    left: PlanNode,
    right: PlanNode,
    left_on: tuple[Expr, ...],
    right_on: tuple[Expr, ...],
    how: JoinHow,
    suffix: str,
    nulls_equal: bool,
    coalesce: bool,
    schema: Schema,
    order: JoinOrder,
) -> PlanNode:
    """An IR join with Polars' output ``schema``.

    Polars' own plans coalesce keys that its ``join`` method would not: keys it cast to a
    common supertype (``col("k").cast(Int64)``), and keys it added to an inner or left join
    from a filter above it (``a == b`` on a left and a right column; their right column is
    kept). There the join does not coalesce, and a projection makes Polars' columns: the
    left key on inner and left joins, the right key on right joins, the first non-null of
    both on full joins (Polars' ``coalesce`` rules), every other column by its name.
    """
    left_names = set(left.schema.names)
    right_out = {n: n + suffix if n in left_names else n for n in right.schema.names}
    plain = all(isinstance(e, Col) for e in (*left_on, *right_on))
    kept = any(
        isinstance(e, Col) and e.name in schema.names and e.name not in left_names for e in right_on
    )
    if not coalesce or how not in ("inner", "left", "right", "full") or (plain and not kept):
        return Join(
            left, right, left_on, right_on, how, suffix, nulls_equal, coalesce, schema, order
        )
    wide = Schema((*left.schema.fields, *((right_out[n], dt) for n, dt in right.schema.fields)))
    joined = Join(left, right, left_on, right_on, how, suffix, nulls_equal, False, wide, order)

    def on_right_side(e: Expr) -> Expr | None:
        return Col(right_out[e.name], e.dtype) if isinstance(e, Col) else None

    out: dict[str, Expr] = {n: Col(n, dt) for n, dt in wide.fields}
    if how == "right":
        # Polars' coalescing right join: the left columns but its key columns, then every
        # right column, suffixed only where a kept left column has its name (a right
        # column named like a left key takes the name).
        dropped = {_key_column(k) for k in left_on} - {None}
        kept_left = [n for n in left.schema.names if n not in dropped]
        out = {n: Col(n, left.schema[n]) for n in kept_left}
        for n, dt in right.schema.fields:
            out[n + suffix if n in kept_left else n] = Col(right_out[n], dt)
    for lk, rk in zip(left_on, right_on, strict=True):
        lname = _key_column(lk)
        if how == "full" and lname is not None and lname in schema.names:
            dtype = schema[lname]
            out[lname] = Function(
                "coalesce",
                (
                    Cast(lk, dtype, strict=False),
                    Cast(replace(rk, on_right_side), dtype, strict=False),
                ),
                (),
                dtype,
            )
    exprs = tuple(NamedExpr(n, out[n]) for n in schema.names)
    return Project(joined, exprs, schema, keep_height=True)


def _key_column(key: Expr) -> str | None:
    """The column a join key reads: itself, or cast to the join's supertype."""
    if isinstance(key, Cast):
        key = key.expr
    return key.name if isinstance(key, Col) else None


def _ie_key(t: Translator, node: int) -> Expr:
    """One key of an IEJoin (cursor on its side's input).

    Polars compares Decimal keys as their Int128 physical values brought to one scale:
    ``col.to_physical().clip(-10**36, 10**36) * 10**k``. That order is the order of the
    decimals themselves (short of the clip, which only values above 10**34 reach), so the
    key is the decimal expression inside; Int128 has no Arrow type for the IR to carry.
    """
    if t.nt.get_dtype(node) != pl.Int128:
        return t.expr(node, "Join")
    view = t.nt.view_expression(node)
    while True:
        kind = type(view).__name__
        key = function_key(view.function_data[0]) if kind == "Function" else ""
        if kind == "BinaryExpr" and str(view.op).endswith("Multiply"):
            node = view.left
        elif key == "clip":
            node = view.input[0]
        elif key == "to_physical" and isinstance(t.nt.get_dtype(view.input[0]), pl.Decimal):
            return t.expr(view.input[0], "Join")
        else:
            t.error(f"Join(how=IEJoin): key {kind}", "an Int128 key shoal cannot carry")
            return t.placeholder_expr()
        view = t.nt.view_expression(node)


def _ie_join(
    t: Translator,
    how: tuple[Any, ...],
    left: PlanNode,
    right: PlanNode,
    left_on: tuple[Expr, ...],
    right_on: tuple[Expr, ...],
    suffix: str,
    order: JoinOrder,
    schema: Schema,
) -> PlanNode:
    """Polars' inequality join, ``left_on[i] <op_i> right_on[i]`` for every ``i``, as the
    cross join it is defined by, filtered by the comparisons. The output has every column of
    both sides (right names that clash get ``suffix``), so a right column in a comparison is
    read under its output name. The planner broadcasts the smaller side of a cross join, and
    the kernel's Polars turns each partition's cross join and filter back into an IEJoin."""
    ops = [op for op in how[1:] if op is not None]
    left_names = set(left.schema.names)

    def renamed(e: Expr) -> Expr | None:
        if isinstance(e, Col) and e.name in left_names:
            return Col(e.name + suffix, e.dtype)
        return None

    terms: list[Expr] = []
    for op, lhs, rhs in zip(ops, left_on, right_on, strict=True):
        name = OPERATORS.get(str(op).rsplit(".", 1)[-1])
        if name not in ("lt", "le", "gt", "ge"):
            t.error(f"Join(how=IEJoin, op={op})", "inequality operator not supported by shoal")
            return t.placeholder(schema)
        terms.append(BinaryOp(name, lhs, replace(rhs, renamed), BOOL))
    pred = terms[0]
    for term in terms[1:]:
        pred = BinaryOp("and", pred, term, BOOL)
    cross = Join(left, right, (), (), "cross", suffix, False, False, schema, order)
    return Filter(cross, pred, schema)


@_register("Sort")
def _sort(t: Translator, node: Any, schema: Schema) -> PlanNode:
    maintain_order, nulls_last, descending = node.sort_options[:3]
    child = t.plan(node.input)
    by = tuple(ne.expr for ne in t.named_at(node.input, node.by_column, "Sort"))
    n = len(by)
    desc = tuple(descending) * n if len(descending) == 1 else tuple(descending)
    last = tuple(nulls_last) * n if len(nulls_last) == 1 else tuple(nulls_last)
    out: PlanNode = Sort(
        child, by, tuple(map(bool, desc)), tuple(map(bool, last)), bool(maintain_order), schema
    )
    return _sliced(out, node.slice)


@_register("Slice")
def _slice(t: Translator, node: Any, schema: Schema) -> PlanNode:
    # A negative offset counts from the end (tail).
    return Slice(t.plan(node.input), int(node.offset), _length(node.len, node.offset), schema)


@_register("HConcat")
def _hconcat(t: Translator, node: Any, schema: Schema) -> PlanNode:
    # Polars' options: (parallel, strict, broadcast unit-length inputs); heights must match.
    _parallel, strict, broadcast = node.options
    inputs = tuple(t.plan(i) for i in node.inputs)
    return HConcat(inputs, schema, bool(strict), bool(broadcast))


def _fast_count(t: Translator, args: list[Any], schema: Schema) -> PlanNode:
    """``scan_csv(...).select(pl.len())``: Polars counts the files' rows without a scan
    below (its input is an empty frame); ``args`` are (paths, (kind, options, ...), name).
    The IR counts the rows of a scan that reads no column."""
    paths, (kind, options, *_), alias = args
    if kind not in ("csv", "ndjson"):
        t.error(f"MapFunction(fast_count, {kind})", "counting rows of these files is not supported")
        return t.placeholder(schema)
    files = tuple(os.path.abspath(os.fspath(p)) for p in paths)
    source = _file_source(kind, files, options, Schema(()))
    if isinstance(source, str):
        t.error(f"MapFunction(fast_count, {kind})", source)
        return t.placeholder(schema)
    count = NamedExpr(str(alias), Agg("len", None, schema[str(alias)]))
    return Aggregate(Scan(source, Schema(())), (), (count,), False, schema)


@_register("MapFunction")
def _map_function(t: Translator, node: Any, schema: Schema) -> PlanNode:
    name, *args = node.function
    if name == "fast_count":
        return _fast_count(t, args, schema)
    child = t.plan(node.input)
    if name == "explode":
        columns, empty_as_null, keep_nulls = args
        return Explode(child, tuple(columns), schema, bool(empty_as_null), bool(keep_nulls))
    if name == "unnest":
        columns, separator = args
        return Unnest(child, tuple(columns), schema, separator)
    if name == "unpivot":
        index, on, variable_name, value_name = args
        return Unpivot(child, tuple(index), tuple(on), str(variable_name), str(value_name), schema)
    if name == "row_index":
        index_name, offset = args
        return RowIndex(child, str(index_name), int(offset), schema)
    if name == "rename":
        # rename(mapping) where Polars kept it as a map function: existing -> new names.
        return Project(
            child,
            tuple(
                NamedExpr(new, Col(old, dt))
                for (new, dt), old in zip(schema.fields, child.schema.names, strict=True)
            ),
            schema,
            keep_height=True,
        )
    if name in ("rechunk", "set_sorted", "hint", "hint_sorted"):
        return child  # no effect on the rows
    t.error(f"MapFunction({name})", "this map function is not supported")
    return t.placeholder(schema)
