"""Checking a whole IR plan: :func:`validate`.

A plan is valid when every node's expressions read columns that exist in its input with the
dtype they claim, every expression's ``dtype`` is the dtype Polars gives it (the kernel runs
on Polars, so Polars' type rules are the IR's type rules), every function and aggregate is
one the kernel knows, and every node's ``schema`` is the schema its operation produces.

Errors name the node and its path in the JSON form of the plan (:mod:`shoal.ir.serde`), so
``"Filter at $.plan.input: ..."`` points at the document's ``plan.input`` object and
``$.plan.input.predicate.left`` at an expression inside it.

Expressions are typed by lowering them to Polars (:mod:`shoal.lowering.infer`): the IR is
typed by what runs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import fields, is_dataclass

import polars as pl

from shoal.errors import PlanError, UnsupportedError
from shoal.ir import serde
from shoal.ir.expr import (
    AGG_FUNCTIONS,
    BINARY_OPS,
    Agg,
    BinaryOp,
    Col,
    Expr,
    Function,
    Lit,
    NamedExpr,
)
from shoal.ir.functions import FUNCTION_NAMES, arity_error
from shoal.ir.nodes import (
    SINK_SCHEMA,
    AsofJoin,
    FileSource,
    InMemorySource,
    Join,
    ParquetSource,
    PlanNode,
    Scan,
    Sink,
    Slice,
    SqlMap,
    Union,
)
from shoal.ir.types import BOOL, DataType, Schema
from shoal.lowering.infer import infer_dtypes, input_types
from shoal.lowering.plan import lower_plan, no_scan

#: Fields of single-input nodes that name input columns (``Distinct.subset``, ...).
_COLUMN_LIST_FIELDS = frozenset({"columns", "subset", "index", "on", "inputs"})


def validate(
    plan: PlanNode,
    *,
    functions: Collection[str] | None = None,
    check_sources: bool = False,
) -> None:
    """Check ``plan`` and every node below it; return None when it is valid.

    ``functions`` are the function names allowed in :class:`~shoal.ir.expr.Function`
    expressions (default: the IR's function table, ``shoal.ir.functions.FUNCTION_NAMES``,
    which the kernel's lowering implements name for name).
    With ``check_sources``, Parquet scans read their files' footers to check that the
    columns exist with the scan's dtypes (missing files raise ``FileNotFoundError``);
    in-memory scans are always checked against their table.

    Raises :class:`shoal.PlanError` naming the first invalid node (children before
    parents), its path (``$.plan.input.left``), the column or expression and the types.
    """
    if functions is None:
        functions = FUNCTION_NAMES
    if not isinstance(plan, PlanNode):
        raise PlanError(f"$.plan: expected a plan node, got {type(plan).__name__}")
    _validate_node(plan, "$.plan", frozenset(functions), check_sources, set())


def _fail(node: PlanNode, path: str, msg: str) -> PlanError:
    return PlanError(f"{node.label} at {path}: {msg}")


def _validate_node(
    node: PlanNode, path: str, functions: frozenset[str], check_sources: bool, seen: set[int]
) -> None:
    if id(node) in seen:  # a shared sub-plan (Polars' cache) is checked once
        return
    seen.add(id(node))
    if not isinstance(getattr(node, "schema", None), Schema):
        raise _fail(node, path, "the node has no schema (a shoal.ir.Schema)")
    for child_path, child in child_nodes(node, path):
        _validate_node(child, child_path, functions, check_sources, seen)
    # Expressions: columns, names, dtypes.
    for expr_path, expr, schema in _node_exprs(node, path):
        if schema is None:
            continue
        check_expr(expr, schema, functions, where=f"{node.label} at {path}", path=expr_path)
    _node_rules(node, path)
    if isinstance(node, Scan):
        _check_scan(node, path, check_sources)
    elif isinstance(node, Sink):  # never built here: building a sink writes files
        _check_sink(node, path)
    elif _carries_code(node):
        _check_udf_schema(node, path)
    else:
        _check_node_schema(node, path)


def _check_sink(node: Sink, path: str) -> None:
    """A sink's schema is :data:`SINK_SCHEMA`; a hive layout names key columns of its
    input; the format is one Polars writes (:data:`~shoal.ir.nodes.SinkFormat`)."""
    if node.schema != SINK_SCHEMA:
        raise _fail(node, path, f"schema {node.schema} should be {SINK_SCHEMA}")
    if node.format not in ("parquet", "csv", "ipc", "ndjson"):
        raise _fail(
            node, path, f"format {node.format!r} is not supported (parquet, csv, ipc, ndjson)"
        )
    if node.layout == "hive" and not node.partition_by:
        raise _fail(node, path, "a hive layout needs at least one key column (partition_by)")
    for i, name in enumerate(node.partition_by):
        if name not in node.input.schema:
            raise _fail(
                node,
                path,
                f"key column {name!r} ({path}.partition_by[{i}]) is not a column of the "
                f"input {list(node.input.schema.names)}",
            )


def _carries_code(node: PlanNode) -> bool:
    """Whether a field of ``node`` holds user code (a UDF): validation never runs it."""
    for f in fields(node):  # type: ignore[arg-type]
        v = getattr(node, f.name)
        if callable(v) and not isinstance(v, PlanNode | Expr | Schema | DataType | type):
            return True
    return False


def _check_udf_schema(node: PlanNode, path: str) -> None:
    """The schema of a node applying a UDF (``UdfProject``): its input's columns with
    ``output`` (of the UDF's return dtype) replacing one of the same name or appended."""
    kids = [c for _, c in child_nodes(node, path)]
    udf, output = getattr(node, "udf", None), getattr(node, "output", None)
    dtype = getattr(udf, "return_dtype", None)
    if len(kids) != 1 or not isinstance(output, str) or not isinstance(dtype, DataType):
        return
    fields_ = list(kids[0].schema.fields)
    names = [n for n, _ in fields_]
    if output in names:
        fields_[names.index(output)] = (output, dtype)
    else:
        fields_.append((output, dtype))
    expected = Schema(tuple(fields_))
    if node.schema != expected:
        raise _fail(
            node,
            path,
            f"schema {node.schema} should be {expected} (the input's columns with "
            f"{output!r}: {dtype})",
        )


def child_nodes(node: PlanNode, path: str) -> Iterator[tuple[str, PlanNode]]:
    """The direct inputs of ``node`` with their JSON paths (``path.input``,
    ``path.inputs[1]``), in field order."""
    for f in fields(node):  # type: ignore[arg-type]
        v = getattr(node, f.name)
        if isinstance(v, PlanNode):
            yield f"{path}.{f.name}", v
        elif isinstance(v, tuple):
            for i, x in enumerate(v):
                if isinstance(x, PlanNode):
                    yield f"{path}.{f.name}[{i}]", x


def _node_exprs(node: PlanNode, path: str) -> Iterator[tuple[str, Expr, Schema | None]]:
    """Every top-level expression of ``node`` with its path and the schema it reads."""
    kids = [c for _, c in child_nodes(node, path)]
    for f in fields(node):  # type: ignore[arg-type]
        v = getattr(node, f.name)
        if isinstance(node, Scan):
            schema: Schema | None = node.schema
        elif isinstance(node, Join | AsofJoin):
            schema = node.left.schema if f.name == "left_on" else node.right.schema
        else:
            schema = kids[0].schema if len(kids) == 1 else None
        items = list(enumerate(v)) if isinstance(v, tuple) else [(None, v)]
        for i, x in items:
            p = f"{path}.{f.name}" + ("" if i is None else f"[{i}]")
            if isinstance(x, NamedExpr):
                yield f"{p}.expr", x.expr, schema
            elif isinstance(x, Expr):
                yield p, x, schema


def _expr_children(expr: Expr, path: str) -> Iterator[tuple[str, Expr]]:
    if not is_dataclass(expr):
        return
    for f in fields(expr):
        v = getattr(expr, f.name)
        if isinstance(v, Expr):
            yield f"{path}.{f.name}", v
        elif isinstance(v, tuple):
            for i, x in enumerate(v):
                if isinstance(x, Expr):
                    yield f"{path}.{f.name}[{i}]", x


def _subexprs(expr: Expr, path: str) -> Iterator[tuple[str, Expr]]:
    """``expr`` and its descendants with their paths, children first (post-order)."""
    for p, c in _expr_children(expr, path):
        yield from _subexprs(c, p)
    yield path, expr


def check_expr(
    expr: Expr,
    schema: Schema,
    functions: Collection[str] | None = None,
    *,
    where: str = "expression",
    path: str = "$",
) -> None:
    """Check one expression against the ``schema`` it reads: columns exist with the dtype
    they claim, operators, functions and aggregates are known, and every sub-expression's
    ``dtype`` is the one Polars infers. Raises :class:`shoal.PlanError` naming ``where``
    (e.g. ``"Filter at $.plan.input"``), the sub-expression's path and the types."""
    if functions is None:
        functions = FUNCTION_NAMES
    subs = list(_subexprs(expr, path))
    for p, e in subs:
        if not isinstance(getattr(e, "dtype", None), DataType):
            raise PlanError(f"{where}: expression at {p} ({type(e).__name__}) has no dtype")
        if isinstance(e, Col):
            if e.name not in schema:
                raise PlanError(
                    f"{where}: column {e.name!r} (at {p}) is not in the input schema {schema}"
                )
            if schema[e.name] != e.dtype:
                raise PlanError(
                    f"{where}: column {e.name!r} (at {p}) claims dtype {e.dtype} but the input "
                    f"has {schema[e.name]}"
                )
        elif isinstance(e, BinaryOp) and e.op not in BINARY_OPS:
            raise PlanError(f"{where}: unknown binary operator {e.op!r} at {p}")
        elif isinstance(e, Function) and e.name not in functions:
            raise PlanError(
                f"{where}: function {e.name!r} at {p} is not in the IR's function table"
            )
        elif isinstance(e, Function) and arity_error(e.name, len(e.args)) is not None:
            raise PlanError(
                f"{where}: function {e.name!r} at {p} {arity_error(e.name, len(e.args))} "
                f"(called with {len(e.args)} arguments; its signature in the IR's function "
                "table)"
            )
        elif isinstance(e, Agg):
            if e.name not in AGG_FUNCTIONS:
                raise PlanError(f"{where}: unknown aggregate function {e.name!r} at {p}")
            if (e.arg is None) != (e.name == "len"):
                raise PlanError(
                    f"{where}: aggregate {e.name!r} at {p} "
                    + ("takes no argument" if e.name == "len" else "needs an argument")
                )
    if len(subs) > LEVEL_TYPING_ABOVE:
        inferred = _infer_by_levels(subs, schema, where)
    else:
        inferred = infer_dtypes(
            [e for _, e in subs], schema, where=where, paths=[p for p, _ in subs]
        )
    for (p, e), got in zip(subs, inferred, strict=True):
        if got != e.dtype:
            raise PlanError(
                f"{where}: expression {e} at {p} claims dtype {e.dtype} but Polars gives {got}"
                + input_types(e, schema)
            )


#: Expressions with more sub-expressions than this are typed level by level
#: (:func:`_infer_by_levels`): typing every sub-expression in one ``select`` costs Polars
#: time cubic in the depth (a 300-level sum took 5 s to read back from JSON).
LEVEL_TYPING_ABOVE = 64


def _infer_by_levels(subs: list[tuple[str, Expr]], schema: Schema, where: str) -> list[DataType]:
    """The Polars dtypes of ``subs`` (an expression's sub-expressions, children first),
    computed one height at a time: each node is typed with its non-literal children
    replaced by placeholder columns of the children's (already inferred) dtypes, so every
    node is lowered and typed once and the cost grows with the number of nodes. Literal
    and column children stay as they are (a literal's dtype rules differ from a column's).
    Raises :class:`shoal.PlanError` like :func:`infer_dtypes`, naming the failing path."""
    height: dict[int, int] = {}
    typed: dict[int, DataType] = {}
    levels: dict[int, list[tuple[str, Expr]]] = {}
    for p, e in subs:
        if id(e) in height:
            continue
        h = max(
            (height[id(c)] + 1 for c in e.children() if not isinstance(c, (Lit, Col))),
            default=0,
        )
        height[id(e)] = h
        levels.setdefault(h, []).append((p, e))
    for h in sorted(levels):
        extra: dict[str, DataType] = {}

        def placeholder(c: Expr, extra: dict[str, DataType] = extra) -> Expr:
            if isinstance(c, (Lit, Col)):
                return c
            name = f"__shoal_t{id(c)}"
            extra[name] = typed[id(c)]
            return Col(name, typed[id(c)])

        shallow = [e.map_children(placeholder) for _, e in levels[h]]
        level_schema = Schema.of([*schema.items(), *extra.items()])
        got = infer_dtypes(shallow, level_schema, where=where, paths=[p for p, _ in levels[h]])
        for (_, e), dtype in zip(levels[h], got, strict=True):
            typed[id(e)] = dtype
    return [typed[id(e)] for _, e in subs]


# ---------------------------------------------------------------- node rules


def _node_rules(node: PlanNode, path: str) -> None:
    kids = [c for _, c in child_nodes(node, path)]
    pred = getattr(node, "predicate", None)
    if isinstance(pred, Expr) and pred.dtype != BOOL:
        raise _fail(
            node,
            path,
            f"predicate {pred} (at {path}.predicate) has dtype {pred.dtype}, not Boolean"
            + input_types(pred, kids[0].schema if kids else node.schema),
        )
    if isinstance(node, Join):
        if node.how == "cross":
            if node.left_on or node.right_on:
                raise _fail(node, path, "a cross join takes no keys")
        else:
            if len(node.left_on) != len(node.right_on) or not node.left_on:
                raise _fail(
                    node,
                    path,
                    f"needs the same number of left and right keys, at least one "
                    f"(got {len(node.left_on)} and {len(node.right_on)})",
                )
            for i, (a, b) in enumerate(zip(node.left_on, node.right_on, strict=True)):
                if a.dtype != b.dtype:
                    raise _fail(
                        node,
                        path,
                        f"join key {i} has different types: left {a} ({path}.left_on[{i}]) is "
                        f"{a.dtype}, right {b} ({path}.right_on[{i}]) is {b.dtype}",
                    )
    if isinstance(node, AsofJoin):
        _asof_rules(node, path)
    if isinstance(node, SqlMap):
        _sql_map_rules(node, path)
    sort_by = getattr(node, "by", None)
    if isinstance(sort_by, tuple) and hasattr(node, "descending") and hasattr(node, "nulls_last"):
        n = len(sort_by)
        if not n or len(node.descending) != n or len(node.nulls_last) != n:  # type: ignore[attr-defined]
            raise _fail(
                node,
                path,
                f"needs at least one sort key and one descending and nulls_last flag per key "
                f"(got {n} keys, {len(node.descending)} and {len(node.nulls_last)} flags)",  # type: ignore[attr-defined]
            )
    # A negative Slice offset counts from the end, as in Polars (``tail``): allowed.
    if isinstance(node, Slice) and node.length is not None and node.length < 0:
        raise _fail(node, path, f"length must be None or >= 0, got {node.length}")
    if isinstance(node, Union):
        for i, k in enumerate(kids):
            if k.schema != node.schema:
                raise _fail(
                    node,
                    path,
                    f"input {path}.inputs[{i}] has schema {k.schema}, not the node's schema "
                    f"{node.schema}",
                )
    if len(kids) == 1:
        for f in fields(node):  # type: ignore[arg-type]
            if f.name not in _COLUMN_LIST_FIELDS:
                continue
            names = getattr(node, f.name)
            if not isinstance(names, tuple):
                continue
            for i, name in enumerate(names):
                if isinstance(name, str) and name not in kids[0].schema:
                    raise _fail(
                        node,
                        path,
                        f"column {name!r} ({path}.{f.name}[{i}]) is not in the input schema "
                        f"{kids[0].schema}",
                    )


def _sql_map_rules(node: SqlMap, path: str) -> None:
    """A SqlMap names a known dialect, has SQL, and its schema is its input's columns
    followed by at least one computed column. (Its output types are checked by running
    the SQL over an empty input: :func:`_check_node_schema`.)"""
    if node.dialect != "duckdb":
        raise _fail(node, path, f"SQL dialect {node.dialect!r} is not supported (duckdb is)")
    if not node.sql.strip():
        raise _fail(node, path, "the SQL text is empty")
    n = len(node.input.schema)
    if node.schema.fields[:n] != node.input.schema.fields or len(node.schema) == n:
        raise _fail(
            node,
            path,
            f"schema {node.schema} should be the input's columns {node.input.schema} followed "
            "by the columns the SQL computes",
        )


def _asof_rules(node: AsofJoin, path: str) -> None:
    """By-columns exist on their side, pair up, and have one type per pair; the keys have
    one type."""
    if len(node.left_by) != len(node.right_by):
        raise _fail(
            node,
            path,
            f"needs as many left as right by-columns (got {list(node.left_by)} and "
            f"{list(node.right_by)})",
        )
    for side, names, schema in (
        ("left", node.left_by, node.left.schema),
        ("right", node.right_by, node.right.schema),
    ):
        for i, name in enumerate(names):
            if name not in schema:
                raise _fail(
                    node,
                    path,
                    f"by-column {name!r} ({path}.{side}_by[{i}]) is not in the {side} input "
                    f"schema {schema}",
                )
    if node.left_on.dtype != node.right_on.dtype:
        raise _fail(
            node,
            path,
            f"as-of keys have different types: left {node.left_on} is {node.left_on.dtype}, "
            f"right {node.right_on} is {node.right_on.dtype}",
        )


def _check_scan(node: Scan, path: str, check_sources: bool) -> None:
    source = node.source
    if isinstance(source, InMemorySource):
        have = Schema.from_arrow(source.table.schema)
        _same_columns(node, path, have, "the in-memory table")
    elif isinstance(source, ParquetSource):
        if not source.paths:
            raise _fail(node, path, "a Parquet scan needs at least one path")
        if check_sources:
            import pyarrow.parquet as pq

            for p in source.paths:
                _same_columns(node, path, Schema.from_arrow(pq.read_schema(p)), f"file {p}")
    elif not isinstance(source, FileSource):
        raise _fail(node, path, f"unknown scan source {type(source).__name__}")


def _same_columns(node: Scan, path: str, have: Schema, what: str) -> None:
    for i, (name, dtype) in enumerate(node.schema.fields):
        if name not in have:
            raise _fail(node, path, f"column {name!r} ({path}.schema[{i}]) is not in {what} {have}")
        if have[name] != dtype:
            raise _fail(
                node,
                path,
                f"column {name!r} ({path}.schema[{i}]) is {dtype} in the plan but "
                f"{have[name]} in {what}",
            )


def _check_node_schema(node: PlanNode, path: str) -> None:
    """Lower ``node`` over empty inputs as the kernel does (:mod:`shoal.lowering.plan`)
    and compare the schema Polars gives with ``node.schema``."""
    from shoal.ir.nodes import StageInput

    kids = [c for _, c in child_nodes(node, path)]
    leaves = tuple(StageInput(i, k.schema) for i, k in enumerate(kids))
    frames = [pl.DataFrame(schema=k.schema.to_polars()) for k in kids]
    try:
        shell = node.with_children(leaves) if kids else node
        got = lower_plan(shell, frames, no_scan).collect_schema()
    except UnsupportedError as exc:
        raise _fail(node, path, f"the kernel cannot run this node: {exc}") from exc
    except (pl.exceptions.PolarsError, TypeError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _fail(node, path, f"Polars cannot build this node: {reason}") from exc
    try:
        produced = Schema.from_polars(got)
    except PlanError as exc:  # pragma: no cover - an output dtype without Arrow form
        raise _fail(node, path, str(exc)) from exc
    if produced == node.schema:
        return
    claimed = node.schema
    for i, (name, dtype) in enumerate(claimed.fields):
        if name not in produced:
            raise _fail(
                node,
                path,
                f"schema column {name!r} ({path}.schema[{i}]) is not produced; the node "
                f"produces {produced}",
            )
        if produced[name] != dtype:
            raise _fail(
                node,
                path,
                f"schema column {name!r} ({path}.schema[{i}]) claims {dtype} but the node "
                f"produces {produced[name]}",
            )
    extra = [n for n in produced.names if n not in claimed]
    if extra:
        raise _fail(node, path, f"the node also produces columns {extra} missing from its schema")
    raise _fail(
        node,
        path,
        f"schema column order {list(claimed.names)} differs from the produced "
        f"order {list(produced.names)}",
    )


serde.register_validator(validate)
