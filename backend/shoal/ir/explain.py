"""Readable text of IR plans (``explain()``)."""

from __future__ import annotations

from shoal.ir.nodes import (
    Aggregate,
    AsofJoin,
    Distinct,
    DynamicGroupBy,
    Explode,
    Filter,
    HConcat,
    Join,
    MergeSorted,
    PlanNode,
    Project,
    RestoreGroupOrder,
    RollingGroupBy,
    RowIndex,
    Scan,
    Sink,
    Slice,
    Sort,
    SqlMap,
    StageInput,
    UdfProject,
    Union,
    Unnest,
    Unpivot,
)


def describe(node: PlanNode) -> str:
    """One line for ``node`` without its inputs."""
    if isinstance(node, Scan):
        pred = f" WHERE {node.predicate}" if node.predicate is not None else ""
        return f"SCAN {node.source.describe()} COLUMNS {list(node.schema.names)}{pred}"
    if isinstance(node, Project):
        keep = " KEEP HEIGHT" if node.keep_height else ""
        return "PROJECT " + ", ".join(map(str, node.exprs)) + keep
    if isinstance(node, Filter):
        return f"FILTER {node.predicate}"
    if isinstance(node, Aggregate):
        keys = ", ".join(map(str, node.keys))
        aggs = ", ".join(map(str, node.aggs))
        mo = " MAINTAIN ORDER" if node.maintain_order else ""
        return f"AGGREGATE BY [{keys}] [{aggs}]{mo}"
    if isinstance(node, Join):
        on = ", ".join(f"{a} = {b}" for a, b in zip(node.left_on, node.right_on, strict=True))
        mo = "" if node.maintain_order == "none" else f" MAINTAIN ORDER {node.maintain_order}"
        return f"JOIN {node.how.upper()} ON {on}{mo}"
    if isinstance(node, Sort):
        keys = ", ".join(
            f"{e}{' DESC' if d else ''}{' NULLS LAST' if n else ''}"
            for e, d, n in zip(node.by, node.descending, node.nulls_last, strict=True)
        )
        return f"SORT {keys}{' STABLE' if node.stable else ''}"
    if isinstance(node, Slice):
        return f"SLICE offset={node.offset} length={node.length}"
    if isinstance(node, Distinct):
        subset = "all columns" if node.subset is None else list(node.subset)
        mo = " MAINTAIN ORDER" if node.maintain_order else ""
        return f"DISTINCT ON {subset} KEEP {node.keep.upper()}{mo}"
    if isinstance(node, Union):
        return f"UNION ALL ({len(node.inputs)} inputs)"
    if isinstance(node, HConcat):
        unit = " BROADCAST UNIT LENGTH" if node.broadcast else ""
        return f"HCONCAT ({len(node.inputs)} inputs){unit}"
    if isinstance(node, Explode):
        return f"EXPLODE {list(node.columns)}"
    if isinstance(node, Unnest):
        return f"UNNEST {list(node.columns)}"
    if isinstance(node, Unpivot):
        return f"UNPIVOT ON {list(node.on)} INDEX {list(node.index)}"
    if isinstance(node, RowIndex):
        return f"ROW INDEX {node.name!r} FROM {node.offset}"
    if isinstance(node, Sink):
        return (
            f"SINK {node.format.upper()} {node.layout.upper()} {node.path!r}{_sink_details(node)}"
        )
    if isinstance(node, StageInput):
        tag = f" TAGGED {node.source_column!r}" if node.source_column else ""
        return f"STAGE INPUT #{node.index}{tag}"
    if isinstance(node, AsofJoin | DynamicGroupBy | RollingGroupBy | MergeSorted):
        return _describe_temporal(node)
    if isinstance(node, RestoreGroupOrder):
        return f"RESTORE GROUP ORDER OF {node.operator.upper()} BY {list(node.keys)}"
    if isinstance(node, UdfProject):
        u = node.udf
        where = "ACTOR POOL" if getattr(u, "needs_actor_pool", False) else "IN TASK"
        res = u.resources.describe() if hasattr(u, "resources") else ""
        return (
            f"UDF {node.udf_name}({', '.join(node.inputs)}) AS {node.output} "
            f"[{where}{', ' + res if res else ''}]"
        )
    if isinstance(node, SqlMap):
        settings = ", ".join(f"{k}={v!r}" for k, v in node.settings)
        with_settings = f" WITH {settings}" if settings else ""
        return (
            f"SQL MAP [{node.dialect}] {list(node.outputs)} READS {list(node.inputs)}: "
            f"{node.sql}{with_settings}"
        )
    return node.label


def _describe_temporal(node: AsofJoin | DynamicGroupBy | RollingGroupBy | MergeSorted) -> str:
    if isinstance(node, MergeSorted):
        return f"MERGE SORTED BY {', '.join(node.key)}"
    if isinstance(node, AsofJoin):
        by = f" BY {list(node.left_by)} = {list(node.right_by)}" if node.left_by else ""
        tol = "" if node.tolerance is None else f" TOLERANCE {node.tolerance}"
        exact = "" if node.allow_exact_matches else " NO EXACT MATCHES"
        return (
            f"ASOF JOIN {node.strategy.upper()} ON {node.left_on} ~ {node.right_on}{by}{tol}{exact}"
        )
    keys = f" BY [{', '.join(map(str, node.keys))}]" if node.keys else ""
    aggs = ", ".join(map(str, node.aggs))
    if isinstance(node, RollingGroupBy):
        return (
            f"ROLLING {node.index_column} PERIOD {node.period} OFFSET {node.offset} "
            f"CLOSED {node.closed}{keys} [{aggs}]"
        )
    return (
        f"GROUP BY DYNAMIC {node.index_column} EVERY {node.every} PERIOD {node.period} "
        f"OFFSET {node.offset} CLOSED {node.closed} LABEL {node.window_label} "
        f"START BY {node.start_by}{' BOUNDARIES' if node.include_boundaries else ''}"
        f"{keys} [{aggs}]"
    )


def _sink_details(node: Sink) -> str:
    out = f" BY {list(node.partition_by)}" if node.partition_by else ""
    if node.max_rows_per_file is not None:
        out += f" MAX ROWS {node.max_rows_per_file}"
    if node.max_bytes_per_file is not None:
        out += f" MAX BYTES {node.max_bytes_per_file}"
    return out


def explain(node: PlanNode, *, schema: bool = False) -> str:
    """The plan as an indented tree, root first; ``schema`` adds each node's schema."""
    lines: list[str] = []

    def rec(n: PlanNode, depth: int) -> None:
        line = "  " * depth + describe(n)
        if schema:
            line += f"  :: {n.schema}"
        lines.append(line)
        for c in n.children():
            rec(c, depth + 1)

    rec(node, 0)
    return "\n".join(lines)
