"""The shoal IR: data types, expressions and plan nodes shared by every frontend."""

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
    Slice,
    Sort,
    StageInput,
    Union,
    Unnest,
    Unpivot,
    transform,
)
from shoal.ir.types import DataType, Schema

__all__ = [
    "AGG_FUNCTIONS", "BINARY_OPS", "Agg", "Aggregate", "Distinct", "Explode", "FileSource",
    "HConcat", "RowIndex", "Union", "Unnest", "Unpivot", "BinaryOp", "Cast", "Col", "DataType",
    "Expr", "Filter", "Function", "InMemorySource", "Join", "Lit", "NamedExpr", "ParquetSource",
    "PlanNode", "Project", "Scan", "Schema", "Slice", "Sort", "StageInput", "Ternary",
    "explain", "transform",
]
