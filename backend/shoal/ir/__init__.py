"""The shoal IR: data types, expressions and plan nodes shared by every frontend.

The bottom floor of the engine: it imports nothing of shoal but ``errors``
(tests/test_layers.py).
"""

from shoal.ir.explain import explain
from shoal.ir.expr import (
    AGG_FUNCTIONS,
    BINARY_OPS,
    Agg,
    BinaryOp,
    Cast,
    Col,
    Expr,
    Function,
    Lit,
    NamedExpr,
    Ternary,
)
from shoal.ir.nodes import (
    Aggregate,
    AsofJoin,
    Distinct,
    DynamicGroupBy,
    Explode,
    FileSource,
    Filter,
    HConcat,
    InMemorySource,
    Join,
    MergeSorted,
    ParquetSource,
    PlanNode,
    Project,
    RollingGroupBy,
    RowIndex,
    Scan,
    Slice,
    Sort,
    SqlMap,
    StageInput,
    StorageOptions,
    Union,
    Unnest,
    Unpivot,
    transform,
)
from shoal.ir.types import DataType, Schema

__all__ = [
    "AGG_FUNCTIONS",
    "BINARY_OPS",
    "Agg",
    "Aggregate",
    "AsofJoin",
    "Distinct",
    "DynamicGroupBy",
    "MergeSorted",
    "RollingGroupBy",
    "Explode",
    "FileSource",
    "HConcat",
    "RowIndex",
    "Union",
    "Unnest",
    "Unpivot",
    "BinaryOp",
    "Cast",
    "Col",
    "DataType",
    "Expr",
    "Filter",
    "Function",
    "InMemorySource",
    "Join",
    "Lit",
    "NamedExpr",
    "ParquetSource",
    "StorageOptions",
    "PlanNode",
    "Project",
    "Scan",
    "Schema",
    "Slice",
    "Sort",
    "SqlMap",
    "StageInput",
    "Ternary",
    "explain",
    "transform",
]

# The JSON form (docs/ir.md). The rest of the public interface for library authors, the
# builder (col, lit, when, Frame, ...) and validate, types expressions by lowering them to
# Polars, a floor above the IR: it lives in shoal.plan, which adds those names to this
# namespace when it is imported (``import shoal`` does; the IR itself imports nothing of
# shoal but errors). Substrait exchange lives in shoal.plan.substrait (imported on demand).
from shoal.ir.serde import IR_VERSION, from_json, json_schema, to_json  # noqa: E402

__all__ += ["IR_VERSION", "from_json", "json_schema", "to_json"]
