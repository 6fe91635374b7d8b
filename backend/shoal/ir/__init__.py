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
    Filter,
    InMemorySource,
    Join,
    ParquetSource,
    PlanNode,
    Project,
    Scan,
    Slice,
    Sort,
    StageInput,
    transform,
)
from shoal.ir.types import DataType, Schema

__all__ = [
    "AGG_FUNCTIONS", "BINARY_OPS", "Agg", "Aggregate", "BinaryOp", "Cast", "Col", "DataType",
    "Expr", "Filter", "Function", "InMemorySource", "Join", "Lit", "NamedExpr", "ParquetSource",
    "PlanNode", "Project", "Scan", "Schema", "Slice", "Sort", "StageInput", "Ternary",
    "explain", "transform",
]
