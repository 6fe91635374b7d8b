"""Building and checking IR plans: the builder, the validator, Substrait exchange.

A floor above the IR and its lowering to Polars: the builder and the validator type
expressions by lowering them (:mod:`shoal.lowering.infer`) and check a node's schema by
lowering it as the kernel does (:func:`shoal.lowering.plan.lower_plan`). Importing this package
adds the public names of the builder and :func:`~shoal.plan.validate.validate` to
:mod:`shoal.ir` (``shoal.ir.col``, ``shoal.ir.Frame``, ``shoal.ir.validate``, ...), so
that library authors find the whole interface there (docs/ir.md) while the IR itself
imports nothing above it. ``import shoal`` imports this package.
"""

from shoal import ir as _ir
from shoal.plan.builder import (
    ExprBuilder,
    Frame,
    GroupBy,
    col,
    from_arrow,
    from_polars,
    len_,
    lit,
    scan_parquet,
    when,
)
from shoal.plan.validate import validate

#: The names this package adds to :mod:`shoal.ir`.
IR_NAMES = {
    "ExprBuilder": ExprBuilder,
    "Frame": Frame,
    "GroupBy": GroupBy,
    "col": col,
    "from_arrow": from_arrow,
    "from_polars": from_polars,
    "len": len_,
    "lit": lit,
    "scan_parquet": scan_parquet,
    "validate": validate,
    "when": when,
}
for _name, _value in IR_NAMES.items():
    setattr(_ir, _name, _value)
_ir.__all__ += [n for n in IR_NAMES if n not in _ir.__all__]

__all__ = [
    "ExprBuilder",
    "Frame",
    "GroupBy",
    "IR_NAMES",
    "col",
    "from_arrow",
    "from_polars",
    "len_",
    "lit",
    "scan_parquet",
    "validate",
    "when",
]
