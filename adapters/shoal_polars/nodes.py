"""Translation functions for Polars plan nodes (NodeTraverser version (16, 0)).

Each ``_name`` function below translates the Polars node class of that name into shoal IR
and is registered in :data:`shoal_polars.translate.NODES`. Attribute layouts follow what
Polars 2.1's NodeTraverser shows; where a Polars option has no IR equivalent, the node is
recorded as unsupported with the reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import polars as pl

from shoal.ir.expr import Agg, Col, Expr, Lit, NamedExpr
from shoal.ir.nodes import (
    Aggregate,
    Distinct,
    Filter,
    InMemorySource,
    Join,
    JoinHow,
    ParquetSource,
    PlanNode,
    Project,
    Scan,
    Slice,
    Sort,
    Union,
)
from shoal.ir.types import Schema
from shoal_polars.translate import NODES, NodeHandler, Translator

#: A Polars slice length at or above this means "to the end" (Polars' IdxSize::MAX).
_TO_END = 2**32 - 1

#: Polars join ``how`` -> IR join type, for the join types shoal runs.
_JOIN_HOW: dict[str, JoinHow] = {"Inner": "inner", "Left": "left"}


def _register(name: str) -> Callable[[NodeHandler], NodeHandler]:
    def deco(fn: NodeHandler) -> NodeHandler:
        NODES[name] = fn
        return fn

    return deco


def _cols(schema: Schema) -> tuple[NamedExpr, ...]:
    return tuple(NamedExpr(n, Col(n, t)) for n, t in schema.fields)


def _length(length: int) -> int | None:
    return None if length >= _TO_END else int(length)


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
    # ``projection`` is already reflected in the node's schema; the table keeps every column.
    table = pl.DataFrame._from_pydf(node.df).to_arrow()
    pred = None if node.selection is None else t.expr(node.selection.node, "DataFrameScan")
    return _scan(t, "DataFrameScan", InMemorySource(table), schema, pred)


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
    scan_type = node.scan_type[0] if isinstance(node.scan_type, tuple) else node.scan_type
    problems = _scan_problems(node, str(scan_type))
    for p in problems:
        t.error(f"Scan({scan_type})", p)
    pred = None if node.predicate is None else t.expr(node.predicate.node, "Scan")
    if problems:
        return t.placeholder(schema)
    paths = tuple(os.path.abspath(os.fspath(p)) for p in node.paths)
    n_rows = node.file_options.n_rows
    if n_rows is None:
        return _scan(t, "Scan", ParquetSource(paths), schema, pred)
    # Polars applies a scan's pre-slice to the file rows, before its predicate.
    offset, length = n_rows
    out: PlanNode = Slice(Scan(ParquetSource(paths), schema), offset, _length(length), schema)
    if pred is not None and not _is_true(pred):
        out = Filter(out, pred, schema)
    return out


def _scan_problems(node: Any, scan_type: str) -> list[str]:
    if scan_type != "parquet":
        return [f"{scan_type} scans are not supported (Parquet only)"]
    out = []
    fo = node.file_options
    if node.hive_parts is not None:
        out.append("hive-partitioned datasets are not supported")
    for attr, what in (
        ("row_index", "a row index (with_row_index / row_index_name)"),
        ("include_file_paths", "include_file_paths"),
        ("deletion_files", "deletion files"),
        ("column_mapping", "column mapping"),
        ("default_values", "default column values"),
    ):
        if getattr(fo, attr, None) is not None:
            out.append(f"{what} is not supported")
    if getattr(fo, "missing_columns_policy", "raise") != "raise":
        out.append("missing_columns other than 'raise' is not supported")
    policy = getattr(fo, "cast_columns_policy", None) or {}
    casts = sorted(k for k, v in policy.items() if v is True and k != "null_upcast")
    if casts:
        out.append(f"cast_options {casts} are not supported")
    n_rows = fo.n_rows
    if n_rows is not None and n_rows[0] < 0:
        out.append(f"a slice from the end (offset {n_rows[0]}) is not supported")
    try:
        options = json.loads(node.scan_type[1])
    except (TypeError, ValueError, IndexError):
        options = {}
    if isinstance(options, dict) and options.get("schema") is not None:
        out.append("an explicit schema= is not supported")
    return out


# ---------------------------------------------------------------- row-wise


@_register("Select")
def _select(t: Translator, node: Any, schema: Schema) -> PlanNode:
    child = t.plan(node.input)
    exprs = t.named_at(node.input, node.expr, "Select")
    scalar = all(ne.expr.has_agg() and not _cols_outside_aggs(ne.expr) for ne in exprs)
    if exprs and scalar:
        # Every column is an aggregate of the whole input: one row, computed in two phases.
        return Aggregate(child, (), exprs, False, schema)
    return Project(child, exprs, schema)


@_register("HStack")
def _hstack(t: Translator, node: Any, schema: Schema) -> PlanNode:
    child = t.plan(node.input)
    new = {ne.name: ne for ne in t.named_at(node.input, node.exprs, "HStack")}
    # Polars: a new column with an existing name replaces it in place; others append.
    exprs = tuple(new.get(n, NamedExpr(n, Col(n, dt))) for n, dt in schema.fields)
    return Project(child, exprs, schema)


@_register("SimpleProjection")
def _simple_projection(t: Translator, node: Any, schema: Schema) -> PlanNode:
    return Project(t.plan(node.input), _cols(schema), schema)


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
    for attr, what in (
        ("dynamic", "group_by_dynamic"),
        ("rolling", "rolling"),
        ("slice", "a slice pushed into the group-by"),
    ):
        if getattr(options, attr, None) is not None:
            t.error("GroupBy", f"{what} is not supported")
    if node.apply:
        t.error("GroupBy", "map_groups (a Python function per group) is not supported")
    child = t.plan(node.input)
    keys = t.named_at(node.input, node.keys, "GroupBy")
    aggs = t.named_at(node.input, node.aggs, "GroupBy")
    for ne in aggs:
        if not ne.expr.has_agg() and not t.failed(ne.expr):
            t.error(
                f"GroupBy: aggregation {ne.name!r}",
                "no aggregate function: Polars would return a list per group",
            )
    return Aggregate(child, keys, aggs, bool(node.maintain_order), schema)


@_register("Distinct")
def _distinct(t: Translator, node: Any, schema: Schema) -> PlanNode:
    keep, subset, maintain_order, slice_ = node.options
    child = t.plan(node.input)
    if slice_ is not None:
        t.error("Distinct", "a slice pushed into unique() is not supported")
        return t.placeholder(schema)
    if keep not in ("first", "last", "any", "none"):
        t.error(f"Distinct(keep={keep!r})", "unknown keep strategy")
        return t.placeholder(schema)
    names = None if subset is None else tuple(str(n) for n in subset)
    return Distinct(child, names, keep, bool(maintain_order), schema)


@_register("Union")
def _union(t: Translator, node: Any, schema: Schema) -> PlanNode:
    # Polars has already made every input's schema equal to the output's (casts and
    # projections for relaxed and diagonal concatenation).
    inputs = tuple(t.plan(i) for i in node.inputs)
    if not inputs:
        t.error("Union", "no inputs")
        return t.placeholder(schema)
    slice_ = node.slice
    out: PlanNode = Union(inputs, schema)
    if slice_ is not None:
        offset, length = slice_[0], slice_[1]
        if offset < 0:
            t.error("Union", f"a slice from the end (offset {offset}) is not supported")
            return t.placeholder(schema)
        out = Slice(out, int(offset), _length(length), schema)
    return out


@_register("Join")
def _join(t: Translator, node: Any, schema: Schema) -> PlanNode:
    how_raw, nulls_equal, slice_, suffix, coalesce, maintain_order = node.options
    # ``how`` is a string ("Inner"), or a tuple: ("Inner", "fused_predicate") when Polars
    # moved a filter on the join's output into the join, ("IEJoin", op, ...) for inequality
    # joins.
    how_name = str(how_raw[0] if isinstance(how_raw, tuple) else how_raw)
    how = _JOIN_HOW.get(how_name)
    if how is None:
        t.error(f"Join(how={how_name})", "only inner and left joins are supported")
    if node.predicate is not None and how_name != "Inner":
        t.error(f"Join(how={how_name})", "join predicates are supported on inner joins only")
    if slice_ is not None:
        t.error("Join", "a slice pushed into the join is not supported")
    if maintain_order not in (None, "none"):
        t.error(
            "Join", f"maintain_order={maintain_order!r} is not supported (order is unspecified)"
        )
    left = t.plan(node.input_left)
    right = t.plan(node.input_right)
    if how is None:
        # The join itself is the problem: its keys (Polars rewrites them for some join
        # types) would only add noise to the report.
        return t.placeholder(schema)
    left_on = tuple(ne.expr for ne in t.named_at(node.input_left, node.left_on, "Join"))
    right_on = tuple(ne.expr for ne in t.named_at(node.input_right, node.right_on, "Join"))
    # A fused predicate reads the join's output columns (suffixed names included).
    pred = None if node.predicate is None else t.expr(node.predicate.node, "Join")
    out: PlanNode = Join(
        left, right, left_on, right_on, how, str(suffix), bool(nulls_equal), bool(coalesce), schema
    )
    if pred is not None and not _is_true(pred):
        # Inner join with a predicate: the rows of the equi-join where it holds.
        out = Filter(out, pred, schema)
    return out


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
    if node.slice is not None:
        offset, length = node.slice[0], node.slice[1]
        if offset < 0:
            t.error("Sort", f"a slice from the end (offset {offset}, e.g. tail) is not supported")
            return t.placeholder(schema)
        out = Slice(out, int(offset), _length(length), schema)
    return out


@_register("Slice")
def _slice(t: Translator, node: Any, schema: Schema) -> PlanNode:
    child = t.plan(node.input)
    if node.offset < 0:
        t.error("Slice", f"a slice from the end (offset {node.offset}, e.g. tail) is not supported")
        return t.placeholder(schema)
    return Slice(child, int(node.offset), _length(node.len), schema)
