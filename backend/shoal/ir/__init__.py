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
    "AGG_FUNCTIONS",
    "BINARY_OPS",
    "Agg",
    "Aggregate",
    "Distinct",
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
    "PlanNode",
    "Project",
    "Scan",
    "Schema",
    "Slice",
    "Sort",
    "StageInput",
    "Ternary",
    "explain",
    "transform",
]

# The public interface for library authors: the builder, validation and the JSON form
# (docs/ir.md). Substrait exchange lives in shoal.ir.substrait (imported on demand).
from shoal.ir.builder import (  # noqa: E402
    ExprBuilder,
    Frame,
    GroupBy,
    col,
    from_arrow,
    from_polars,
    lit,
    scan_parquet,
    when,
)
from shoal.ir.builder import len_ as len  # noqa: E402
from shoal.ir.serde import IR_VERSION, from_json, json_schema, to_json  # noqa: E402
from shoal.ir.validate import validate  # noqa: E402

__all__ += [
    "IR_VERSION",
    "ExprBuilder",
    "Frame",
    "GroupBy",
    "col",
    "from_arrow",
    "from_json",
    "from_polars",
    "json_schema",
    "len",
    "lit",
    "scan_parquet",
    "to_json",
    "validate",
    "when",
]
