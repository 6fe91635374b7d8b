"""The IR's one table of functions: what each function *is*.

One :class:`FunctionDef` per name that an IR :class:`~shoal.ir.expr.Function` or
:class:`~shoal.ir.expr.Agg` may carry, in :data:`FUNCTION_TABLE`. An entry says:

* its **signature**: the kind of each positional argument (:data:`ARG_KINDS`), how many
  there are (``variadic``: the last kind repeats; ``min_args``: fewer are allowed), and the
  names of the options it reads;
* its **kind**: ``"row"`` (row-wise: each output row from the same input row, any
  partition may evaluate it), ``"aggregate"`` (one value per group: an ``Agg`` node, or a
  ``Function`` node that reads every row of its group, such as ``corr``), ``"window"`` (one
  value per row, read from other rows or from the rows' order: ``cum_sum``, ``shift``,
  ``over``) or ``"order"`` (a column of its own length or order: ``sort``, ``filter``,
  ``repeat``). Window and order functions, and aggregating ``Function`` nodes, are the
  order-dependent ones: the planner evaluates them where all their input rows are, in order;
* its **output type rule** (:data:`TYPE_RULES`, applied by :func:`output_type`): the IR's
  semantics are Polars' semantics, so each rule states Polars' own rule; ``"polars"`` says
  the output type is whatever Polars gives (lowering types it; nothing simpler holds);
* for an aggregate, how it **splits across partitions** (:class:`Split`): the partial
  aggregates computed per partition, the aggregate that merges them after the exchange,
  and the final step; ``None`` when no exact split exists (the planner then aggregates the
  raw rows once, after a hash exchange or a gather);
* its **Substrait name**: the standard extension and function it maps to when its
  semantics are Polars' (``None``: written under shoal's own extension with its IR name).

This module says what a function is; :mod:`shoal.lowering.expressions` says how Polars runs
it (a test checks that both know the same names). The adapters, the builder, the validator,
the planner's aggregate split and the Substrait mapping read this table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from shoal.ir.types import BOOL, FLOAT64, STRING, DataType

Kind = Literal["row", "aggregate", "window", "order"]

#: Argument kinds of a signature: a column (or expression) of that family of types.
#: ``"any"`` accepts every type; ``"num"`` integers and floats; ``"scalar_int"`` and
#: ``"scalar"`` are arguments Polars needs to be one value (a literal in practice).
ARG_KINDS = frozenset(
    {"any", "num", "int", "float", "bool", "str", "temporal", "date", "datetime", "duration",
     "time", "list", "array", "struct", "scalar", "scalar_int", "scalar_str"}
)  # fmt: skip

#: Output type rules (see :func:`output_type`).
TYPE_RULES = frozenset(
    {"same", "bool", "idx", "float", "f64", "i8", "i32", "i64", "u32", "str", "date", "time",
     "list", "sum", "mean", "option_dtype", "polars"}
)  # fmt: skip


@dataclass(frozen=True)
class Split:
    """How an aggregate splits into a per-partition (partial) and a merge step, exactly.

    ``partial``: the aggregates each partition computes (empty: the function itself);
    ``merge``: the aggregate over the partial results, per group, after the exchange;
    ``final``: the expression that turns the merged partials into the result (``None``:
    the merged value is the result; ``"sum/count"``: the mean of the merged sum and count,
    null for no values)."""

    merge: str
    partial: tuple[str, ...] = ()
    final: str | None = None


@dataclass(frozen=True)
class FunctionDef:
    """One IR function: see the module's docstring for each field's meaning.

    ``node`` is ``"agg"`` for the names an :class:`~shoal.ir.expr.Agg` node carries (one
    argument, or none for ``len``), ``"function"`` for :class:`~shoal.ir.expr.Function`."""

    name: str
    kind: Kind
    args: tuple[str, ...]
    out: str
    node: Literal["function", "agg"] = "function"
    variadic: bool = False
    min_args: int | None = None
    options: tuple[str, ...] = ()
    split: Split | None = None
    substrait: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        bad = [a for a in self.args if a not in ARG_KINDS]
        if bad or self.out not in TYPE_RULES:
            raise ValueError(f"function {self.name!r}: unknown argument kind or rule {bad}")

    @property
    def order_dependent(self) -> bool:
        """Whether a plan node evaluating it needs all its input rows in order (a window
        or order function, or an aggregating ``Function`` node)."""
        return self.kind in ("window", "order") or (
            self.kind == "aggregate" and self.node == "function"
        )

    def arity(self) -> tuple[int, int | None]:
        """(fewest, most) positional arguments; most is None for a variadic function."""
        low = len(self.args) if self.min_args is None else self.min_args
        return low, None if self.variadic else len(self.args)


# ------------------------------------------------------------------------ entries

_TABLE: list[FunctionDef] = []


def _add(
    kind: Kind,
    names: str | Sequence[str],
    args: tuple[str, ...],
    out: str,
    **more: Any,
) -> None:
    for name in [names] if isinstance(names, str) else names:
        _TABLE.append(FunctionDef(name, kind, args, out, **more))


def _agg(name: str, args: tuple[str, ...], out: str, **more: Any) -> None:
    _TABLE.append(FunctionDef(name, "aggregate", args, out, node="agg", **more))


_CMP = "functions_comparison"
_ARITH = "functions_arithmetic"
_BOOLEAN = "functions_boolean"
_GENERIC = "functions_aggregate_generic"

# --- aggregates (Agg nodes): Polars' Expr.<name>() over one group
_agg("sum", ("num",), "sum", split=Split("sum"), substrait=(_ARITH, "sum0"))
_agg("mean", ("num",), "mean", split=Split("sum", ("sum", "count"), "sum/count"),
     substrait=(_ARITH, "avg"))  # fmt: skip
_agg("min", ("any",), "same", split=Split("min"), substrait=(_ARITH, "min"))
_agg("max", ("any",), "same", split=Split("max"), substrait=(_ARITH, "max"))
_agg("count", ("any",), "idx", split=Split("sum"), substrait=(_GENERIC, "count"))
_agg("len", (), "idx", split=Split("sum"), substrait=(_GENERIC, "count"))
_agg("null_count", ("any",), "idx", split=Split("sum"))
_agg("nan_min", ("float",), "same", split=Split("nan_min"))
_agg("nan_max", ("float",), "same", split=Split("nan_max"))
_agg("product", ("num",), "polars", split=Split("product"))
for _name in ("first", "last", "first_non_null", "last_non_null", "item"):
    _agg(_name, ("any",), "same", options=("allow_empty",) if _name == "item" else ())
_agg("n_unique", ("any",), "idx")
_agg("median", ("num",), "polars")
_agg("quantile", ("num",), "polars", options=("quantile", "interpolation"))
_agg("std", ("num",), "polars", options=("ddof",))
_agg("var", ("num",), "polars", options=("ddof",))
_agg("implode", ("any",), "list")
_agg("arg_min", ("any",), "idx")
_agg("arg_max", ("any",), "idx")

# --- aggregating functions (Function nodes that read every row of their group)
_add("aggregate", "corr", ("num", "num"), "polars", options=("method", "ddof", "propagate_nans"))
_add("aggregate", "entropy", ("num",), "polars", options=("base", "normalize"))
_add("aggregate", ("value_counts",), ("any",), "polars",
     options=("sort", "parallel", "name", "normalize"))  # fmt: skip
_add("aggregate", "unique_counts", ("any",), "idx")
_add("aggregate", ("bitwise_and", "bitwise_or", "bitwise_xor"), ("int",), "same")
_add("aggregate", ("any", "all"), ("bool",), "bool", options=("ignore_nulls",))
_add("aggregate", "has_nulls", ("any",), "bool")
_add("aggregate", "is_empty", ("any",), "bool", options=("ignore_nulls",))
_add("aggregate", "is_sorted", ("any",), "bool", options=("descending", "nulls_last"))
_add("aggregate", "skew", ("num",), "f64", options=("bias",))
_add("aggregate", "kurtosis", ("num",), "f64", options=("fisher", "bias"))
_add("aggregate", "str.join", ("str",), "str", options=("delimiter", "ignore_nulls"))
_add("aggregate", "index_of", ("any", "scalar"), "polars")
_add("aggregate", ("max_by", "min_by"), ("any", "any"), "same")
_add("aggregate", "search_sorted", ("any", "any"), "idx", options=("side", "descending"))

# --- row-wise: null handling and logic
_add("row", "is_null", ("any",), "bool", substrait=(_CMP, "is_null"))
_add("row", "is_not_null", ("any",), "bool", substrait=(_CMP, "is_not_null"))
_add("row", "is_nan", ("float",), "bool", substrait=(_CMP, "is_nan"))
_add("row", "is_not_nan", ("float",), "bool")
_add("row", "is_finite", ("float",), "bool", substrait=(_CMP, "is_finite"))
_add("row", "is_infinite", ("float",), "bool", substrait=(_CMP, "is_infinite"))
_add("row", "not", ("bool",), "polars", substrait=(_BOOLEAN, "not"))
_add("row", "is_in", ("any", "list"), "bool", options=("nulls_equal",))
_add("row", "is_between", ("any", "any", "any"), "bool", options=("closed",))
_add("row", "is_close", ("num", "num"), "bool", options=("abs_tol", "rel_tol", "nans_equal"))
_add("row", "fill_null", ("any", "any"), "polars")
_add("row", "coalesce", ("any",), "polars", variadic=True, substrait=(_CMP, "coalesce"))
_add("row", ("max_horizontal", "min_horizontal"), ("any",), "polars", variadic=True)
_add("row", ("sum_horizontal", "mean_horizontal"), ("num",), "polars", variadic=True,
     options=("ignore_nulls",))  # fmt: skip
_add("row", "replace", ("any", "any", "any"), "same")
_add("row", "replace_strict", ("any", "any", "any", "any"), "option_dtype", min_args=3,
     options=("dtype",))  # fmt: skip
_add("row", "hash", ("any",), "polars", options=("seed",))
_add("row", "cast_enum", ("str",), "polars", options=("categories", "strict"))
_add("row", "reinterpret", ("int",), "option_dtype", options=("dtype",))
_add("row", "to_physical", ("any",), "polars")
_add("row", "nested_nulls_last", ("any",), "polars", options=("dtype",))
# --- row-wise: numbers
_add("row", "neg", ("num",), "same", substrait=(_ARITH, "negate"))
_add("row", "abs", ("num",), "same", substrait=(_ARITH, "abs"))
_add("row", "sign", ("num",), "polars")
_add("row", "round", ("num",), "same", options=("decimals", "mode"))
_add("row", ("floor", "ceil"), ("num",), "same")
_add("row", ("sqrt", "cbrt", "exp", "log1p"), ("num",), "float")
_add("row", "log", ("num", "num"), "float")
_add("row", "pow", ("num", "num"), "polars")
# integer division rounding toward zero, and its remainder (sign of the dividend): SQL's
# DIV and % in Polars' SQL; NULL for a zero divisor
_add("row", ("truncdiv", "truncrem"), ("int", "int"), "option_dtype", options=("dtype",))
_add("row", "clip", ("num", "num", "num"), "same", min_args=1, options=("has_min", "has_max"))
_add("row", "round_sig_figs", ("num",), "same", options=("digits",))
_add("row", "truncate", ("num",), "same", options=("decimals",))
_add("row", "fused", ("num", "num", "num"), "polars", options=("op",))
_add("row", ("sin", "cos", "tan", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
             "arcsinh", "arccosh", "arctanh", "degrees", "radians"), ("num",), "float")  # fmt: skip
_add("row", "arctan2", ("num", "num"), "polars")
_add("row", ("bitwise_count_ones", "bitwise_count_zeros", "bitwise_leading_ones",
             "bitwise_leading_zeros", "bitwise_trailing_ones", "bitwise_trailing_zeros"),
     ("int",), "u32")  # fmt: skip
_add("row", "cut", ("num",), "polars", options=("breaks", "labels", "left_closed",
                                                 "include_breaks"))  # fmt: skip
# --- row-wise: strings
_add("row", ("str.starts_with", "str.ends_with"), ("str", "str"), "bool")
_add("row", "str.contains", ("str", "str"), "bool", options=("literal", "strict"))
_add("row", "str.contains_any", ("str", "list"), "bool", options=("ascii_case_insensitive",))
_add("row", "str.slice", ("str", "int", "int"), "str")
_add("row", ("str.head", "str.tail"), ("str", "int"), "str")
_add("row", ("str.len_chars", "str.len_bytes"), ("str",), "u32")
_add("row", ("str.to_lowercase", "str.to_uppercase", "str.to_uppercase_simple",
             "str.to_lowercase_simple", "str.to_titlecase", "str.reverse", "str.escape_regex",
             "str.encode_hex", "str.encode_base64"), ("str",), "str")  # fmt: skip
_add("row", ("str.strip_chars", "str.strip_chars_start", "str.strip_chars_end",
             "str.strip_prefix", "str.strip_suffix"), ("str", "str"), "str")  # fmt: skip
_add("row", "str.replace", ("str", "str", "str"), "str", options=("n", "literal"))
_add("row", "str.replace_many", ("str", "list", "list"), "str",
     options=("ascii_case_insensitive", "leftmost"))  # fmt: skip
_add("row", "str.zfill", ("str", "int"), "str")
_add("row", ("str.pad_start", "str.pad_end"), ("str", "scalar_int"), "str", options=("fill_char",))
_add("row", "str.concat", ("any",), "str", variadic=True, options=("separator", "ignore_nulls"))
_add("row", "str.format", ("any",), "str", variadic=True, min_args=0, options=("format",))
_add("row", "str.to_integer", ("str", "int"), "option_dtype", min_args=1,
     options=("dtype", "strict"))  # fmt: skip
_add("row", "str.strptime", ("str", "str"), "option_dtype", min_args=1,
     options=("dtype", "format", "strict", "exact", "cache"))  # fmt: skip
_add("row", "str.count_matches", ("str", "str"), "u32", options=("literal",))
_add("row", "str.extract", ("str", "str"), "str", options=("group_index",))
_add("row", "str.extract_all", ("str", "str"), "list")
_add("row", "str.extract_groups", ("str",), "polars", options=("pattern",))
_add("row", ("str.extract_many",), ("str", "list"), "polars",
     options=("ascii_case_insensitive", "overlapping", "leftmost"))  # fmt: skip
_add("row", ("str.find_many",), ("str", "list"), "polars",
     options=("ascii_case_insensitive", "overlapping", "leftmost"))  # fmt: skip
_add("row", "str.find", ("str", "str"), "u32", options=("literal", "strict"))
_add("row", "str.split", ("str", "str"), "list", options=("inclusive",))
_add("row", ("str.split_exact",), ("str", "str"), "polars", options=("n", "inclusive"))
_add("row", ("str.splitn",), ("str", "str"), "polars", options=("n",))
_add("row", "str.json_decode", ("str",), "option_dtype", options=("dtype", "infer_schema_length"))
_add("row", "str.json_path_match", ("str", "str"), "str")
_add("row", "str.normalize", ("str",), "str", options=("form",))
# --- row-wise: dates and times
_add("row", ("dt.year", "dt.iso_year"), ("temporal",), "i32")
_add("row", ("dt.quarter", "dt.month", "dt.day", "dt.weekday", "dt.week", "dt.days_in_month"),
     ("temporal",), "polars")  # fmt: skip
_add("row", ("dt.hour", "dt.minute", "dt.second"), ("datetime",), "polars")
_add("row", ("dt.millisecond", "dt.microsecond", "dt.nanosecond"), ("datetime",), "i32")
_add("row", ("dt.ordinal_day", "dt.century", "dt.millennium"), ("temporal",), "polars")
_add("row", "dt.is_leap_year", ("temporal",), "bool")
_add("row", "dt.date", ("temporal",), "date")
_add("row", "dt.time", ("datetime",), "time")
_add("row", ("dt.month_start", "dt.month_end"), ("temporal",), "same")
_add("row", ("dt.truncate", "dt.round"), ("temporal", "str"), "same")
_add("row", "dt.offset_by", ("temporal", "str"), "same", min_args=1, options=("by",))
_add("row", "dt.to_string", ("temporal",), "str", options=("format",))
_add("row", ("dt.total_days", "dt.total_hours", "dt.total_minutes", "dt.total_seconds",
             "dt.total_milliseconds", "dt.total_microseconds", "dt.total_nanoseconds"),
     ("duration",), "polars", options=("fractional",))  # fmt: skip
_add("row", "dt.convert_time_zone", ("datetime",), "polars", options=("time_zone",))
_add("row", "dt.replace_time_zone", ("datetime", "str"), "polars", min_args=1,
     options=("time_zone", "non_existent"))  # fmt: skip
_add("row", "dt.cast_time_unit", ("datetime",), "polars", options=("time_unit",))
_add("row", "dt.timestamp", ("temporal",), "i64", options=("time_unit",))
_add("row", "dt.combine", ("temporal", "time"), "polars", options=("time_unit",))
_add("row", "dt.replace", ("temporal", "int", "int", "int", "int", "int", "int", "int", "str"),
     "same")  # fmt: skip
_add("row", "datetime", ("int", "int", "int", "int", "int", "int", "int", "str"), "polars",
     options=("time_unit", "time_zone"))  # fmt: skip
_add("row", "duration", ("int",) * 8, "polars", options=("time_unit",))
# --- row-wise: lists, arrays and structs (each value on its own)
for _c in ("list", "array"):
    _p = "list" if _c == "list" else "arr"
    _add("row", f"{_p}.len", (_c,), "u32")
    _add("row", [f"{_p}.{n}" for n in ("sum", "min", "max", "mean", "median", "std", "var")],
         (_c,), "polars", options=("ddof",))  # fmt: skip
    _add("row", (f"{_p}.arg_min", f"{_p}.arg_max"), (_c,), "u32")
    _add("row", f"{_p}.contains", (_c, "any"), "bool", options=("nulls_equal",))
    _add("row", f"{_p}.join", (_c, "str"), "str", options=("ignore_nulls",))
    _add("row", f"{_p}.get", (_c, "int"), "polars", options=("null_on_oob",))
    _add("row", f"{_p}.sort", (_c,), "same", options=("descending", "nulls_last"))
    _add("row", f"{_p}.shift", (_c, "int"), "same")
    _add("row", f"{_p}.count_matches", (_c, "any"), "u32")
    _add("row", f"{_p}.to_struct", (_c,), "polars", options=("fields",))
_add("row", "list.slice", ("list", "int", "int"), "same")
_add("row", "list.drop_nulls", ("list",), "same")
_add("row", "list.diff", ("list",), "polars", options=("n", "null_behavior"))
_add("row", "list.set_operation", ("list", "list"), "polars", options=("operation",))
_add("row", "list.gather_every", ("list", "int", "int"), "same")
_add("row", "list.gather", ("list", "list"), "same", options=("null_on_oob",))
_add("row", "list.to_array", ("list",), "polars", options=("width",))
_add("row", "arr.to_list", ("array",), "polars")
_add("row", "arr.dot", ("array", "array"), "polars")
_add("row", "list.eval", ("list",), "polars", options=("eval", "element"))
_add("row", "concat_list", ("any",), "polars", variadic=True)
_add("row", "as_list", ("any",), "polars", variadic=True)
_add("row", ("int_ranges",), ("int", "int", "int"), "polars", options=("dtype",))
# (start, end, count), or (start, end) with the count as option ``array_width``
_add("row", "linear_spaces", ("num", "num", "int"), "polars", min_args=2,
     options=("closed", "array_width"))  # fmt: skip
_add("row", ("datetime_ranges", "date_ranges", "time_ranges"), ("temporal", "temporal"),
     "polars", options=("interval", "closed"))  # fmt: skip
_add("row", "struct.field", ("struct",), "polars", options=("name",))
_add("row", "struct.rename_fields", ("struct",), "polars", options=("names",))
_add("row", "struct.with_fields", ("struct", "any"), "polars", variadic=True, min_args=1,
     options=("names",))  # fmt: skip
_add("row", "struct.json_encode", ("struct",), "str")
_add("row", "as_struct", ("any",), "polars", variadic=True, options=("fields",))

# --- window: one value per row, from other rows or the rows' order
_add("window", ("cum_sum", "cum_prod", "cum_min", "cum_max"), ("num",), "polars",
     options=("reverse",))  # fmt: skip
_add("window", "cum_count", ("any",), "idx", options=("reverse",))
_add("window", "shift", ("any", "scalar_int", "scalar"), "same", min_args=2)
_add("window", "diff", ("num", "scalar_int"), "polars", options=("null_behavior",))
_add("window", "pct_change", ("num", "scalar_int"), "polars")
_add("window", "rank", ("any",), "polars", options=("method", "descending", "seed"))
_add("window", "fill_null_strategy", ("any",), "same", options=("strategy", "limit"))
_add("window", "interpolate", ("num",), "polars", options=("method",))
_add("window", ("ewm_mean", "ewm_std", "ewm_var"), ("num",), "polars",
     options=("alpha", "adjust", "bias", "min_samples", "ignore_nulls"))  # fmt: skip
_add("window", "ewm_mean_by", ("num", "temporal"), "polars", options=("half_life",))
_add("window", "rolling", ("num",), "polars",
     options=("function", "window_size", "weights", "min_samples", "center", "ddof",
              "quantile", "interpolation"))  # fmt: skip
_add("window", "rolling_by", ("num", "temporal"), "polars",
     options=("function", "window_size", "min_samples", "closed", "ddof", "quantile",
              "interpolation"))  # fmt: skip
_add("window", "over", ("any", "any"), "polars", variadic=True, min_args=1,
     options=("partitions", "ordered", "descending", "nulls_last", "mapping_strategy"))  # fmt: skip
_add("window", ("is_unique", "is_duplicated", "is_first_distinct", "is_last_distinct"),
     ("any",), "bool")  # fmt: skip
_add("window", "rle_id", ("any",), "u32")
_add("window", ("peak_max", "peak_min"), ("num",), "bool")
_add("window", "cumulative_eval", ("any",), "polars", options=("eval", "element"))
_add("window", "qcut", ("num",), "polars",
     options=("quantiles", "labels", "left_closed", "allow_duplicates", "include_breaks"))  # fmt: skip
_add("window", "shuffle", ("any",), "same", options=("seed",))

# --- order: a column of its own length or order
_add("order", ("sort",), ("any",), "same", options=("descending", "nulls_last"))
_add("order", "sort_by", ("any", "any"), "same", variadic=True,
     options=("descending", "nulls_last", "maintain_order"))  # fmt: skip
_add("order", "arg_sort", ("any",), "idx", options=("descending", "nulls_last"))
_add("order", "arg_unique", ("any",), "idx")
_add("order", "unique", ("any",), "same", options=("maintain_order",))
_add("order", "reverse", ("any",), "same")
_add("order", ("drop_nulls", "drop_nans"), ("any",), "same")
_add("order", "filter", ("any", "bool"), "same")
_add("order", "slice", ("any", "scalar_int", "scalar_int"), "same")
_add("order", "gather", ("any", "int"), "same", options=("scalar",))
_add("order", "gather_every", ("any",), "same", options=("n", "offset"))
_add("order", "explode", ("list",), "polars", options=("empty_as_null", "keep_nulls"))
_add("order", "sample", ("any", "scalar"), "same",
     options=("is_fraction", "with_replacement", "shuffle", "seed"))  # fmt: skip
_add("order", "repeat", ("any", "scalar_int"), "same")
_add("order", "series", (), "polars", options=("values",))
_add("order", "int_range", ("int", "int"), "polars", min_args=0, options=("step", "dtype", "start"))
_add("order", "linear_space", ("num", "num", "scalar_int"), "polars", options=("closed",))
_add("order", ("datetime_range", "date_range", "time_range"), ("temporal", "temporal"), "polars",
     options=("interval", "closed"))  # fmt: skip


def _index(entries: list[FunctionDef]) -> dict[str, FunctionDef]:
    out: dict[str, FunctionDef] = {}
    for e in entries:
        if e.name in out:
            raise ValueError(f"function {e.name!r} is in the table twice")
        out[e.name] = e
    return out


#: Every IR function and aggregate by name.
FUNCTION_TABLE: Mapping[str, FunctionDef] = _index(_TABLE)

#: Names an :class:`~shoal.ir.expr.Agg` node may carry.
AGG_NAMES = frozenset(n for n, f in FUNCTION_TABLE.items() if f.node == "agg")
#: Names a :class:`~shoal.ir.expr.Function` node may carry.
FUNCTION_NAMES = frozenset(n for n, f in FUNCTION_TABLE.items() if f.node == "function")
#: ``Function`` nodes that aggregate (one value per group, or a new set of rows).
AGGREGATING_NAMES = frozenset(n for n in FUNCTION_NAMES if FUNCTION_TABLE[n].kind == "aggregate")
#: ``Function`` nodes whose value on a row depends on other rows or on their order.
ORDER_DEPENDENT_NAMES = frozenset(n for n in FUNCTION_NAMES if FUNCTION_TABLE[n].order_dependent)
#: Aggregates with an exact partial/merge split, by name.
SPLITS: Mapping[str, Split] = {n: f.split for n, f in FUNCTION_TABLE.items() if f.split is not None}


def lookup(name: str) -> FunctionDef:
    """The entry for ``name``. Raises ``KeyError`` naming the function when it is not in
    the table."""
    try:
        return FUNCTION_TABLE[name]
    except KeyError:
        raise KeyError(f"function {name!r} is not in the IR's function table") from None


def arity_error(name: str, count: int) -> str | None:
    """Why ``count`` positional arguments do not fit function ``name``'s signature
    (``"takes 2 arguments, not 1"``), or None when they fit or the table has no such name."""
    f = FUNCTION_TABLE.get(name)
    if f is None:
        return None
    low, high = f.arity()
    if low <= count and (high is None or count <= high):
        return None
    if low == high:
        takes = f"{low} argument{'s' if low != 1 else ''}"
    elif high is None:
        takes = f"at least {low} argument{'s' if low != 1 else ''}"
    else:
        takes = f"{low} to {high} arguments"
    return f"takes {takes}, not {count}"


def output_type(
    f: FunctionDef,
    args: Sequence[DataType],
    options: Mapping[str, Any] | None = None,
    *,
    index_type: DataType | None = None,
) -> DataType | None:
    """The output type ``f``'s rule gives for arguments of types ``args``, or None when the
    rule is ``"polars"`` (Polars decides; see :mod:`shoal.lowering.infer`).

    ``index_type`` is Polars' row index type (``UInt32``, ``UInt64`` with bigidx), the
    type of counts and positions (rule ``"idx"``); default ``UInt32``.
    """
    rule = f.out
    first = args[0] if args else None
    idx = index_type or DataType(pa.uint32())
    fixed = {
        "bool": BOOL,
        "idx": idx,
        "f64": FLOAT64,
        "i8": DataType(pa.int8()),
        "i32": DataType(pa.int32()),
        "i64": DataType(pa.int64()),
        "u32": DataType(pa.uint32()),
        "str": STRING,
        "date": DataType(pa.date32()),
        "time": DataType(pa.time64("ns")),
    }
    if rule in fixed:
        return fixed[rule]
    if rule == "option_dtype":
        dtype = (options or {}).get("dtype")
        return dtype if isinstance(dtype, DataType) else None
    if rule == "polars" or first is None:
        return None
    if rule == "same":
        return first
    if rule == "list":
        return DataType(pa.large_list(first.arrow))
    arrow = first.arrow
    if rule == "float":
        return first if pa.types.is_float32(arrow) else FLOAT64
    if rule == "sum":
        # Polars sums 8- and 16-bit integers in Int64, Booleans in its index type, the
        # rest in their own type.
        if pa.types.is_boolean(arrow):
            return idx
        if pa.types.is_integer(arrow) and arrow.bit_width < 32:
            return DataType(pa.int64())
        return first
    if rule == "mean":
        if pa.types.is_float32(arrow):
            return first
        if pa.types.is_integer(arrow) or pa.types.is_boolean(arrow) or pa.types.is_float64(arrow):
            return FLOAT64
        return None
    return None  # pragma: no cover - TYPE_RULES and this function list the same rules
