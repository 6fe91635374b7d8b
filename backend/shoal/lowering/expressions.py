"""IR expressions -> Polars expressions (the kernel's expression half).

One entry per IR function name in :data:`FUNCTIONS`; an IR expression whose function is not
in the table raises :class:`shoal.UnsupportedError` naming the function.
"""

from __future__ import annotations

import contextlib
import contextvars
import decimal
import io
import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from shoal.errors import UnsupportedError
from shoal.ir.expr import Agg, BinaryOp, Cast, Col, Expr, Function, Lit, Ternary
from shoal.ir.types import BOOL

FunctionImpl = Callable[[list[pl.Expr], dict[str, Any]], pl.Expr]


#: IR function name -> builder from (Polars argument expressions, options) to a Polars expr.
#: Names and options follow Polars' own functions (``str.slice`` is ``Expr.str.slice``).
def _ewm(name: str) -> Callable[[list[pl.Expr], dict[str, Any]], pl.Expr]:
    """Polars' ``Expr.<name>`` (ewm_mean/std/var) with the options Polars showed (alpha,
    adjust, min_samples, ignore_nulls, and bias, which ewm_mean does not take)."""
    keys: tuple[str, ...] = ("alpha", "adjust", "min_samples", "ignore_nulls")
    if name != "ewm_mean":
        keys += ("bias",)
    return lambda a, o: getattr(a[0], name)(**{k: o[k] for k in keys})


#: Polars' ``Expr.bitwise_<op>`` methods: aggregations (and, or, xor) and bit counts.
_BITWISE = (
    "and",
    "or",
    "xor",
    "count_ones",
    "count_zeros",
    "leading_ones",
    "leading_zeros",
    "trailing_ones",
    "trailing_zeros",
)


def _bitwise(op: str) -> Callable[[list[pl.Expr], dict[str, Any]], pl.Expr]:
    return lambda a, o: getattr(a[0], f"bitwise_{op}")()


#: Polars' fused arithmetic: fma a*b+c, fsm a-b*c, fms a*b-c.
_FUSED: dict[str, Callable[[pl.Expr, pl.Expr, pl.Expr], pl.Expr]] = {
    "fma": lambda a, b, c: a * b + c,
    "fsm": lambda a, b, c: a - b * c,
    "fms": lambda a, b, c: a * b - c,
}


def _method(name: str) -> FunctionImpl:
    """``Expr.<name>()``, no arguments."""
    return lambda a, o: getattr(a[0], name)()


def _dt_method(name: str) -> FunctionImpl:
    """``Expr.dt.<name>()``, no arguments."""
    return lambda a, o: getattr(a[0].dt, name)()


FUNCTIONS: dict[str, FunctionImpl] = {
    # boolean and null handling
    "is_null": lambda a, o: a[0].is_null(),
    "is_not_null": lambda a, o: a[0].is_not_null(),
    "is_nan": lambda a, o: a[0].is_nan(),
    "is_not_nan": lambda a, o: a[0].is_not_nan(),
    "is_finite": lambda a, o: a[0].is_finite(),
    "is_infinite": lambda a, o: a[0].is_infinite(),
    "not": lambda a, o: a[0].not_(),
    "is_in": lambda a, o: a[0].is_in(a[1], nulls_equal=o.get("nulls_equal", False)),
    "is_between": lambda a, o: a[0].is_between(a[1], a[2], closed=o.get("closed", "both")),
    "fill_null": lambda a, o: a[0].fill_null(a[1]),
    "coalesce": lambda a, o: pl.coalesce(a),
    # numeric
    "neg": lambda a, o: -a[0],
    "abs": lambda a, o: a[0].abs(),
    "sign": lambda a, o: a[0].sign(),
    "round": lambda a, o: a[0].round(o.get("decimals", 0), mode=o.get("mode", "half_to_even")),
    "floor": lambda a, o: a[0].floor(),
    "ceil": lambda a, o: a[0].ceil(),
    "sqrt": lambda a, o: a[0].sqrt(),
    "cbrt": lambda a, o: a[0].cbrt(),
    "exp": lambda a, o: a[0].exp(),
    "log": lambda a, o: a[0].log(a[1]),
    "log1p": lambda a, o: a[0].log1p(),
    "pow": lambda a, o: a[0].pow(a[1]),
    "clip": lambda a, o: _clip(a, o),
    "max_horizontal": lambda a, o: pl.max_horizontal(a),
    "min_horizontal": lambda a, o: pl.min_horizontal(a),
    "sum_horizontal": lambda a, o: pl.sum_horizontal(a, ignore_nulls=o.get("ignore_nulls", True)),
    "mean_horizontal": lambda a, o: pl.mean_horizontal(a, ignore_nulls=o.get("ignore_nulls", True)),
    # strings
    "str.starts_with": lambda a, o: a[0].str.starts_with(a[1]),
    "str.ends_with": lambda a, o: a[0].str.ends_with(a[1]),
    "str.contains": lambda a, o: a[0].str.contains(
        a[1], literal=o.get("literal", False), strict=o.get("strict", True)
    ),
    "str.slice": lambda a, o: a[0].str.slice(a[1], a[2]),
    "str.head": lambda a, o: a[0].str.head(a[1]),
    "str.tail": lambda a, o: a[0].str.tail(a[1]),
    "str.len_chars": lambda a, o: a[0].str.len_chars(),
    "str.len_bytes": lambda a, o: a[0].str.len_bytes(),
    "str.to_lowercase": lambda a, o: a[0].str.to_lowercase(),
    "str.to_uppercase": lambda a, o: a[0].str.to_uppercase(),
    # Unicode *simple* (one-to-one) case mapping, as utf8proc gives it (DuckDB's upper/lower,
    # Arrow's utf8_upper/utf8_lower): 'ß' -> 'ẞ', final sigma stays 'σ'. Polars' own
    # to_uppercase/to_lowercase use the full mapping ('ß' -> 'SS').
    "str.to_uppercase_simple": lambda a, o: _arrow_string_fn(a[0], "utf8_upper"),
    "str.to_lowercase_simple": lambda a, o: _arrow_string_fn(a[0], "utf8_lower"),
    "str.strip_chars": lambda a, o: a[0].str.strip_chars(a[1]),
    "str.strip_chars_start": lambda a, o: a[0].str.strip_chars_start(a[1]),
    "str.strip_chars_end": lambda a, o: a[0].str.strip_chars_end(a[1]),
    "str.strip_prefix": lambda a, o: a[0].str.strip_prefix(a[1]),
    "str.strip_suffix": lambda a, o: a[0].str.strip_suffix(a[1]),
    "str.replace": lambda a, o: _replace(a, o),
    "str.zfill": lambda a, o: a[0].str.zfill(a[1]),
    "str.pad_start": lambda a, o: a[0].str.pad_start(a[1], o.get("fill_char", " ")),
    "str.pad_end": lambda a, o: a[0].str.pad_end(a[1], o.get("fill_char", " ")),
    "str.reverse": lambda a, o: a[0].str.reverse(),
    "str.concat": lambda a, o: pl.concat_str(
        a, separator=o.get("separator", ""), ignore_nulls=o.get("ignore_nulls", False)
    ),
    # temporal
    "dt.year": lambda a, o: a[0].dt.year(),
    "dt.quarter": lambda a, o: a[0].dt.quarter(),
    "dt.month": lambda a, o: a[0].dt.month(),
    "dt.day": lambda a, o: a[0].dt.day(),
    "dt.hour": lambda a, o: a[0].dt.hour(),
    "dt.minute": lambda a, o: a[0].dt.minute(),
    "dt.second": lambda a, o: a[0].dt.second(),
    "dt.millisecond": lambda a, o: a[0].dt.millisecond(),
    "dt.microsecond": lambda a, o: a[0].dt.microsecond(),
    "dt.weekday": lambda a, o: a[0].dt.weekday(),
    "dt.week": lambda a, o: a[0].dt.week(),
    "dt.ordinal_day": lambda a, o: a[0].dt.ordinal_day(),
    "dt.date": lambda a, o: a[0].dt.date(),
    "dt.month_start": lambda a, o: a[0].dt.month_start(),
    "dt.month_end": lambda a, o: a[0].dt.month_end(),
    "dt.truncate": lambda a, o: a[0].dt.truncate(a[1]),
    "dt.to_string": lambda a, o: a[0].dt.to_string(o["format"]),
    "dt.total_days": lambda a, o: a[0].dt.total_days(fractional=o.get("fractional", False)),
    "dt.total_hours": lambda a, o: a[0].dt.total_hours(fractional=o.get("fractional", False)),
    "dt.total_minutes": lambda a, o: a[0].dt.total_minutes(fractional=o.get("fractional", False)),
    "dt.total_seconds": lambda a, o: a[0].dt.total_seconds(fractional=o.get("fractional", False)),
    "dt.total_milliseconds": lambda a, o: a[0].dt.total_milliseconds(
        fractional=o.get("fractional", False)
    ),
    "dt.total_microseconds": lambda a, o: a[0].dt.total_microseconds(
        fractional=o.get("fractional", False)
    ),
    "dt.convert_time_zone": lambda a, o: a[0].dt.convert_time_zone(o["time_zone"]),
    # args: the datetimes, then ``ambiguous`` (an expression, "raise" by default)
    "dt.replace_time_zone": lambda a, o: a[0].dt.replace_time_zone(
        o["time_zone"],
        ambiguous=a[1] if len(a) > 1 else "raise",
        non_existent=o.get("non_existent", "raise"),
    ),
    # strings: args are the strings, then the pattern / base / ambiguous expression
    "str.to_integer": lambda a, o: a[0].str.to_integer(
        base=a[1] if len(a) > 1 else 10, dtype=o["dtype"].to_polars(), strict=o.get("strict", True)
    ),
    "str.strptime": lambda a, o: a[0].str.strptime(
        o["dtype"].to_polars(),
        o.get("format"),
        strict=o.get("strict", True),
        exact=o.get("exact", True),
        cache=o.get("cache", True),
        ambiguous=a[1] if len(a) > 1 else "raise",
    ),
    "str.count_matches": lambda a, o: a[0].str.count_matches(a[1], literal=o.get("literal", False)),
    "str.extract": lambda a, o: a[0].str.extract(a[1], o.get("group_index", 1)),
    "str.split": lambda a, o: a[0].str.split(a[1], inclusive=o.get("inclusive", False)),
    "str.split_exact": lambda a, o: a[0].str.split_exact(
        a[1], o["n"], inclusive=o.get("inclusive", False)
    ),
    "str.contains_any": lambda a, o: a[0].str.contains_any(
        a[1], ascii_case_insensitive=o.get("ascii_case_insensitive", False)
    ),
    "str.extract_all": lambda a, o: a[0].str.extract_all(a[1]),
    "str.find": lambda a, o: a[0].str.find(
        a[1], literal=o.get("literal", False), strict=o.get("strict", True)
    ),
    "str.json_decode": lambda a, o: a[0].str.json_decode(o["dtype"].to_polars()),
    "dt.round": lambda a, o: a[0].dt.round(a[1]),
    "dt.timestamp": lambda a, o: a[0].dt.timestamp(o.get("time_unit", "us")),
    # args: the dates or datetimes, then the times of day
    "dt.combine": lambda a, o: a[0].dt.combine(a[1], o.get("time_unit", "us")),
    # lists and structs
    "list.len": lambda a, o: a[0].list.len(),
    "list.sum": lambda a, o: a[0].list.sum(),
    "list.min": lambda a, o: a[0].list.min(),
    "list.max": lambda a, o: a[0].list.max(),
    "list.mean": lambda a, o: a[0].list.mean(),
    "list.contains": lambda a, o: a[0].list.contains(a[1], nulls_equal=o.get("nulls_equal", True)),
    "list.join": lambda a, o: a[0].list.join(a[1], ignore_nulls=o.get("ignore_nulls", True)),
    "list.get": lambda a, o: a[0].list.get(a[1], null_on_oob=o.get("null_on_oob", False)),
    "list.sort": lambda a, o: a[0].list.sort(
        descending=o.get("descending", False), nulls_last=o.get("nulls_last", False)
    ),
    "list.slice": lambda a, o: a[0].list.slice(a[1], a[2]),
    "list.drop_nulls": lambda a, o: a[0].list.drop_nulls(),
    "concat_list": lambda a, o: pl.concat_list(a),
    "list.to_array": lambda a, o: a[0].list.to_array(o["width"]),
    # Polars' own ``Eval`` over the list argument: option ``eval`` is Polars' JSON of the
    # expression with its input left out (``list.eval``, ``arr.eval``-like lowerings such as
    # ``list.unique``/``arr.unique``: row by row, each list on its own), ``element`` the
    # element expression as text (for explain)
    "list.eval": lambda a, o: _polars_eval(o["eval"], a[0]),
    # the same for ``Expr.cumulative_eval`` (order-dependent: every row reads the rows
    # before it)
    "cumulative_eval": lambda a, o: _polars_eval(o["eval"], a[0]),
    # one list per row: int_ranges(start, end, step) of the items' dtype
    "int_ranges": lambda a, o: pl.int_ranges(a[0], a[1], a[2], dtype=o["dtype"].to_polars()),
    # one list per row from start, end and a count: Polars' linear_spaces (an Array of
    # ``array_width`` items when the width is set, the count being fixed)
    "linear_spaces": lambda a, o: (
        pl.linear_spaces(a[0], a[1], a[2], closed=o.get("closed", "both"))
        if o.get("array_width") is None
        else pl.linear_spaces(a[0], a[1], o["array_width"], closed=o["closed"], as_array=True)
    ),
    # one list per row from start, end and an interval ("1mo2w3d4ns"); start and end come
    # in the output's unit and zone
    "datetime_ranges": lambda a, o: pl.datetime_ranges(
        a[0], a[1], o["interval"], closed=o.get("closed", "both")
    ),
    "date_ranges": lambda a, o: pl.date_ranges(
        a[0], a[1], o["interval"], closed=o.get("closed", "both")
    ),
    # pl.datetime(year, month, day, hour, minute, second, microsecond, ambiguous)
    "datetime": lambda a, o: pl.datetime(
        *a[:7], time_unit=o.get("time_unit", "us"), time_zone=o.get("time_zone"), ambiguous=a[7]
    ),
    # trigonometry and conversions
    **{
        name: _method(name)
        for name in (
            "sin",
            "cos",
            "tan",
            "cot",
            "arcsin",
            "arccos",
            "arctan",
            "sinh",
            "cosh",
            "tanh",
            "arcsinh",
            "arccosh",
            "arctanh",
            "degrees",
            "radians",
            "to_physical",
        )
    },  # fmt: skip
    "arctan2": lambda a, o: pl.arctan2(a[0], a[1]),
    # Polars' fused arithmetic, written out (Polars fuses it again; the same IEEE
    # operations in the same order, so the same bits)
    "fused": lambda a, o: _FUSED[o["op"]](a[0], a[1], a[2]),
    "as_list": lambda a, o: pl.list(*a),
    "arr.dot": lambda a, o: a[0].arr.dot(a[1]),
    "reinterpret": lambda a, o: a[0].reinterpret(dtype=o["dtype"].to_polars()),
    "truncdiv": lambda a, o: a[0].truncdiv(a[1]).cast(o["dtype"].to_polars()),
    "truncrem": lambda a, o: _truncrem(a[0], a[1]).cast(o["dtype"].to_polars()),
    "time_ranges": lambda a, o: pl.time_ranges(
        a[0], a[1], o["interval"], closed=o.get("closed", "both")
    ),
    # a column of its own length (order-dependent)
    "time_range": lambda a, o: pl.time_range(
        a[0], a[1], o["interval"], closed=o.get("closed", "both")
    ),
    "duration": lambda a, o: pl.duration(
        weeks=a[0],
        days=a[1],
        hours=a[2],
        minutes=a[3],
        seconds=a[4],
        milliseconds=a[5],
        microseconds=a[6],
        nanoseconds=a[7],
        time_unit=o.get("time_unit", "us"),
    ),  # fmt: skip
    "str.format": lambda a, o: pl.format(o["format"], *a),
    # the user's cut/qcut (deprecated in Polars 2.1 for bin_*, which Polars shows
    # differently); qcut is order-dependent: the quantiles of every row, after a gather
    "cut": lambda a, o: _binning("cut", a, o),
    "qcut": lambda a, o: _binning("qcut", a, o),
    "rolling_by": lambda a, o: _rolling_by(a, o),
    "ewm_mean_by": lambda a, o: a[0].ewm_mean_by(a[1], half_life=o["half_life"]),
    "is_close": lambda a, o: a[0].is_close(
        a[1], abs_tol=o["abs_tol"], rel_tol=o["rel_tol"], nans_equal=o["nans_equal"]
    ),
    # aggregating (AGGREGATING_FUNCTIONS): one value per group, on its rows in order
    "any": lambda a, o: a[0].any(ignore_nulls=o.get("ignore_nulls", True)),
    "all": lambda a, o: a[0].all(ignore_nulls=o.get("ignore_nulls", True)),
    "has_nulls": lambda a, o: a[0].has_nulls(),
    "is_empty": lambda a, o: a[0].is_empty(ignore_nulls=o.get("ignore_nulls", False)),
    "is_sorted": lambda a, o: a[0].is_sorted(
        descending=o.get("descending", False), nulls_last=o.get("nulls_last", False)
    ),
    "skew": lambda a, o: a[0].skew(bias=o.get("bias", True)),
    "kurtosis": lambda a, o: a[0].kurtosis(fisher=o["fisher"], bias=o["bias"]),
    "str.join": lambda a, o: a[0].str.join(o["delimiter"], ignore_nulls=o["ignore_nulls"]),
    "index_of": lambda a, o: a[0].index_of(a[1]),
    "max_by": lambda a, o: a[0].max_by(a[1]),
    "min_by": lambda a, o: a[0].min_by(a[1]),
    "search_sorted": lambda a, o: a[0].search_sorted(
        a[1], o.get("side", "any"), descending=o.get("descending", False)
    ),
    # order-dependent (the planner gathers their input)
    "peak_max": lambda a, o: a[0].peak_max(),
    "peak_min": lambda a, o: a[0].peak_min(),
    "arg_unique": lambda a, o: a[0].arg_unique(),
    "explode": lambda a, o: a[0].explode(
        empty_as_null=o.get("empty_as_null", True), keep_nulls=o.get("keep_nulls", True)
    ),
    # strings
    "str.to_titlecase": lambda a, o: a[0].str.to_titlecase(),
    "str.encode_hex": lambda a, o: a[0].str.encode("hex"),
    "str.encode_base64": lambda a, o: a[0].str.encode("base64"),
    "str.json_path_match": lambda a, o: a[0].str.json_path_match(a[1]),
    "str.splitn": lambda a, o: a[0].str.splitn(a[1], o["n"]),
    "str.replace_many": lambda a, o: a[0].str.replace_many(
        a[1], a[2], ascii_case_insensitive=o["ascii_case_insensitive"], leftmost=o["leftmost"]
    ),
    "str.escape_regex": lambda a, o: a[0].str.escape_regex(),
    "str.normalize": lambda a, o: a[0].str.normalize(str(o["form"]).upper()),  # type: ignore[arg-type]
    "str.extract_groups": lambda a, o: a[0].str.extract_groups(o["pattern"]),
    "str.extract_many": lambda a, o: a[0].str.extract_many(
        a[1],
        ascii_case_insensitive=o["ascii_case_insensitive"],
        overlapping=o["overlapping"],
        leftmost=o["leftmost"],
    ),
    "str.find_many": lambda a, o: a[0].str.find_many(
        a[1],
        ascii_case_insensitive=o["ascii_case_insensitive"],
        overlapping=o["overlapping"],
        leftmost=o["leftmost"],
    ),
    # temporal
    **{
        f"dt.{name}": _dt_method(name)
        for name in (
            "nanosecond",
            "microsecond",
            "millisecond",
            "is_leap_year",
            "days_in_month",
            "iso_year",
            "century",
            "millennium",
        )
    },  # fmt: skip
    "dt.cast_time_unit": lambda a, o: a[0].dt.cast_time_unit(o["time_unit"]),
    "dt.total_nanoseconds": lambda a, o: a[0].dt.total_nanoseconds(
        fractional=o.get("fractional", False)
    ),
    "dt.replace": lambda a, o: a[0].dt.replace(
        year=a[1],
        month=a[2],
        day=a[3],
        hour=a[4],
        minute=a[5],
        second=a[6],
        microsecond=a[7],
        ambiguous=a[8],
    ),  # fmt: skip
    # lists (each list on its own)
    "list.median": lambda a, o: a[0].list.median(),
    "list.std": lambda a, o: a[0].list.std(ddof=o["ddof"]),
    "list.var": lambda a, o: a[0].list.var(ddof=o["ddof"]),
    "list.arg_min": lambda a, o: a[0].list.arg_min(),
    "list.arg_max": lambda a, o: a[0].list.arg_max(),
    "list.shift": lambda a, o: a[0].list.shift(a[1]),
    "list.count_matches": lambda a, o: a[0].list.count_matches(a[1]),
    # Polars 2.1's streaming engine panics on list.diff of some row ranges ([None, [3,
    # None]]: "type Int64 is incompatible with expected type Null"); the same diff of each
    # list as an element expression gives the same values
    "list.diff": lambda a, o: a[0].list.eval(
        pl.element().diff(o["n"], null_behavior=o["null_behavior"])
    ),
    "list.set_operation": lambda a, o: getattr(a[0].list, f"set_{o['operation']}")(a[1]),
    "list.gather_every": lambda a, o: a[0].list.gather_every(a[1], a[2]),
    "list.gather": lambda a, o: a[0].list.gather(a[1], null_on_oob=o["null_on_oob"]),
    "list.to_struct": lambda a, o: a[0].list.to_struct(fields=list(o["fields"])),
    # arrays (each array on its own)
    "arr.len": lambda a, o: a[0].arr.len(),
    "arr.sum": lambda a, o: a[0].arr.sum(),
    "arr.max": lambda a, o: a[0].arr.max(),
    "arr.min": lambda a, o: a[0].arr.min(),
    "arr.mean": lambda a, o: a[0].arr.mean(),
    "arr.median": lambda a, o: a[0].arr.median(),
    "arr.std": lambda a, o: a[0].arr.std(ddof=o["ddof"]),
    "arr.var": lambda a, o: a[0].arr.var(ddof=o["ddof"]),
    "arr.get": lambda a, o: a[0].arr.get(a[1], null_on_oob=o["null_on_oob"]),
    "arr.arg_min": lambda a, o: a[0].arr.arg_min(),
    "arr.arg_max": lambda a, o: a[0].arr.arg_max(),
    "arr.count_matches": lambda a, o: a[0].arr.count_matches(a[1]),
    "arr.to_list": lambda a, o: a[0].arr.to_list(),
    "arr.contains": lambda a, o: a[0].arr.contains(a[1], nulls_equal=o["nulls_equal"]),
    "arr.to_struct": lambda a, o: a[0].arr.to_struct(list(o["fields"])),
    "arr.join": lambda a, o: a[0].arr.join(a[1], ignore_nulls=o["ignore_nulls"]),
    "arr.sort": lambda a, o: a[0].arr.sort(descending=o["descending"], nulls_last=o["nulls_last"]),
    "arr.shift": lambda a, o: a[0].arr.shift(a[1]),
    "struct.json_encode": lambda a, o: a[0].struct.json_encode(),
    # a sort key of a list (or struct) in which NULLs nested inside sort after every value,
    # as SQL engines order them (DuckDB); option ``dtype``: the input's type, the result's
    # type is nested_nulls_last_type(dtype)
    "nested_nulls_last": lambda a, o: _nested_nulls_last(a[0], o["dtype"].arrow),
    "struct.field": lambda a, o: a[0].struct.field(o["name"]),
    "struct.rename_fields": lambda a, o: a[0].struct.rename_fields(list(o["names"])),
    # args: the struct, then one expression per new or replaced field (option ``names``)
    "struct.with_fields": lambda a, o: a[0].struct.with_fields(
        [x.alias(n) for x, n in zip(a[1:], o["names"], strict=True)]
    ),
    "as_struct": lambda a, o: pl.struct([x.alias(n) for x, n in zip(a, o["fields"], strict=True)]),
    "replace": lambda a, o: a[0].replace(a[1], a[2]),
    # args: values, old, new, then default; without a default an unmapped value raises
    # Polars' InvalidOperationError (as native Polars does)
    "replace_strict": lambda a, o: _replace_strict(a, o),
    "round_sig_figs": lambda a, o: a[0].round_sig_figs(o["digits"]),
    # toward zero at ``decimals`` places (floats and decimals)
    "truncate": lambda a, o: a[0].truncate(o.get("decimals", 0)),
    "hash": lambda a, o: a[0].hash(o.get("seed", 0)),
    # aggregating functions (AGGREGATING_FUNCTIONS: the planner gives them all rows of a group)
    "corr": lambda a, o: _corr(a, o),
    **{f"bitwise_{op}": _bitwise(op) for op in _BITWISE},
    "drop_nulls": lambda a, o: a[0].drop_nulls(),
    "drop_nans": lambda a, o: a[0].drop_nans(),
    "dt.time": lambda a, o: a[0].dt.time(),
    "entropy": lambda a, o: a[0].entropy(
        o.get("base", 2.718281828459045), normalize=o["normalize"]
    ),
    "value_counts": lambda a, o: a[0].value_counts(
        sort=o.get("sort", False),
        parallel=o.get("parallel", False),
        name=o.get("name"),
        normalize=o.get("normalize", False),
    ),
    "unique_counts": lambda a, o: a[0].unique_counts(),
    # Polars' cast to Enum(categories), strict or not (a value outside the categories
    # raises InvalidOperationError, or becomes null)
    "cast_enum": lambda a, o: a[0].cast(
        pl.Enum(list(o["categories"])), strict=o.get("strict", True)
    ),
    # calendar offset ("1mo", "-3d", "5us"); months clamp to the last day of the month
    "dt.offset_by": lambda a, o: a[0].dt.offset_by(a[1] if len(a) > 1 else o["by"]),
    # Polars' int_range(start, end, step, dtype) when given arguments; without arguments
    # row numbers start, start + 1, ... (per group inside ``over``); order-dependent
    "int_range": lambda a, o: _int_range(a, o),
    # order-dependent (ORDER_DEPENDENT_FUNCTIONS: the planner gathers their input first)
    "cum_sum": lambda a, o: a[0].cum_sum(reverse=o.get("reverse", False)),
    "cum_prod": lambda a, o: a[0].cum_prod(reverse=o.get("reverse", False)),
    "cum_min": lambda a, o: a[0].cum_min(reverse=o.get("reverse", False)),
    "cum_max": lambda a, o: a[0].cum_max(reverse=o.get("reverse", False)),
    "cum_count": lambda a, o: a[0].cum_count(reverse=o.get("reverse", False)),
    "shift": lambda a, o: a[0].shift(a[1], fill_value=a[2] if len(a) > 2 else None),
    "diff": lambda a, o: a[0].diff(a[1], null_behavior=o.get("null_behavior", "ignore")),
    "pct_change": lambda a, o: a[0].pct_change(a[1]),
    "rank": lambda a, o: a[0].rank(
        o.get("method", "average"), descending=o.get("descending", False), seed=o.get("seed")
    ),
    "fill_null_strategy": lambda a, o: a[0].fill_null(strategy=o["strategy"], limit=o.get("limit")),
    "reverse": lambda a, o: a[0].reverse(),
    # columns of their own length (order-dependent: evaluated once, after a gather)
    "repeat": lambda a, o: pl.repeat(a[0], a[1]),
    "linear_space": lambda a, o: pl.linear_space(a[0], a[1], a[2], closed=o.get("closed", "both")),
    "datetime_range": lambda a, o: pl.datetime_range(
        a[0], a[1], o["interval"], closed=o.get("closed", "both")
    ),
    "date_range": lambda a, o: pl.date_range(
        a[0], a[1], o["interval"], closed=o.get("closed", "both")
    ),
    # seeded draws over the whole column (group): Polars' own, on the gathered rows
    "shuffle": lambda a, o: a[0].shuffle(o["seed"]),
    "sample": lambda a, o: (
        a[0].sample(
            fraction=a[1],
            with_replacement=o["with_replacement"],
            shuffle=o["shuffle"],
            seed=o["seed"],
        )
        if o["is_fraction"]
        else a[0].sample(
            n=a[1], with_replacement=o["with_replacement"], shuffle=o["shuffle"], seed=o["seed"]
        )
    ),
    **{name: _ewm(name) for name in ("ewm_mean", "ewm_std", "ewm_var")},
    # ``series``: a column of literal values (dtype from the IR node: see to_polars).
    "series": lambda a, o: pl.lit(pl.Series(list(o["values"]))),
    "gather": lambda a, o: a[0].get(a[1]) if o.get("scalar") else a[0].gather(a[1]),
    "is_unique": lambda a, o: a[0].is_unique(),
    "is_duplicated": lambda a, o: a[0].is_duplicated(),
    "is_first_distinct": lambda a, o: a[0].is_first_distinct(),
    "is_last_distinct": lambda a, o: a[0].is_last_distinct(),
    "rle_id": lambda a, o: a[0].rle_id(),
    "interpolate": lambda a, o: a[0].interpolate(o.get("method", "linear")),
    "gather_every": lambda a, o: a[0].gather_every(o["n"], o.get("offset", 0)),
    "filter": lambda a, o: a[0].filter(a[1]),
    "slice": lambda a, o: a[0].slice(a[1], a[2]),
    "sort": lambda a, o: a[0].sort(
        descending=o.get("descending", False), nulls_last=o.get("nulls_last", False)
    ),
    "sort_by": lambda a, o: a[0].sort_by(
        a[1:],
        descending=list(o["descending"]),
        nulls_last=list(o["nulls_last"]),
        maintain_order=o.get("maintain_order", False),
    ),
    "unique": lambda a, o: a[0].unique(maintain_order=o.get("maintain_order", False)),
    "arg_sort": lambda a, o: a[0].arg_sort(
        descending=o.get("descending", False), nulls_last=o.get("nulls_last", False)
    ),
    "over": lambda a, o: _over(a, o),
    "rolling": lambda a, o: _rolling(a, o),
}


def _polars_eval(template: str, arg: pl.Expr) -> pl.Expr:
    """Polars' ``Eval`` expression whose JSON (Polars' serialised form, ``"expr": null``) is
    ``template``, over ``arg``: the expression Polars itself would run."""
    with warnings.catch_warnings():
        # Polars 2.1 deprecates (UserWarning) the JSON form, which a program can edit.
        warnings.filterwarnings("ignore", message=".*serializ.*format")
        body = json.loads(template)
        body["Eval"]["expr"] = json.loads(arg.meta.serialize(format="json"))
        return pl.Expr.deserialize(io.StringIO(json.dumps(body)), format="json")


def _int_range(a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """``int_range(a[0], a[1], step, dtype)``, or one number per row from ``start``."""
    if a:
        return pl.int_range(a[0], a[1], o.get("step", 1), dtype=o["dtype"].to_polars())
    start = o.get("start", 0)
    return pl.int_range(start, pl.len() + start, dtype=pl.Int64)


def nested_nulls_last_type(arrow: pa.DataType) -> pa.DataType:
    """The Arrow type of ``nested_nulls_last`` of a value of type ``arrow``: each value
    inside a list or struct becomes ``struct<n: bool, v: ...>`` (``n``: it is NULL, which
    sorts after false; ``v``: the value, the same way), so that Polars' ordering of lists
    and structs (NULLs nested inside first) puts nested NULLs last ascending and first
    descending."""
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return pa.large_list(_keyed_type(arrow.value_type))
    if pa.types.is_struct(arrow):
        return pa.struct([pa.field(f.name, _keyed_type(f.type)) for f in arrow])
    return arrow


def _keyed_type(arrow: pa.DataType) -> pa.DataType:
    return pa.struct([pa.field("n", pa.bool_()), pa.field("v", nested_nulls_last_type(arrow))])


def _nested_nulls_last(x: pl.Expr, arrow: pa.DataType) -> pl.Expr:
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return x.list.eval(_keyed(pl.element(), arrow.value_type))
    if pa.types.is_struct(arrow):
        return pl.struct([_keyed(x.struct.field(f.name), f.type).alias(f.name) for f in arrow])
    return x


def _keyed(x: pl.Expr, arrow: pa.DataType) -> pl.Expr:
    return pl.struct(x.is_null().alias("n"), _nested_nulls_last(x, arrow).alias("v"))


def _replace_strict(a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """``replace_strict(old, new, default=, return_dtype=)``; ``a[3]``, when present, is
    the default."""
    dtype = o["dtype"].to_polars()
    if len(a) > 3:
        return a[0].replace_strict(a[1], a[2], default=a[3], return_dtype=dtype)
    return a[0].replace_strict(a[1], a[2], return_dtype=dtype)


def _corr(a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """``pl.corr`` (Pearson, Spearman rank) or ``pl.cov``, by option ``method``."""
    method = o.get("method", "pearson")
    if method == "covariance":
        return pl.cov(a[0], a[1], ddof=o.get("ddof", 1))
    if method == "spearman_rank":
        return pl.corr(a[0], a[1], method="spearman", propagate_nans=o.get("propagate_nans", False))
    return pl.corr(a[0], a[1], method="pearson")


def _rolling(a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """``rolling_<function>`` over a fixed window of rows."""
    extra = {k: o[k] for k in ("ddof", "quantile", "interpolation") if k in o}
    weights = o.get("weights")
    return getattr(a[0], f"rolling_{o['function']}")(
        window_size=o["window_size"],
        weights=None if weights is None else list(weights),
        min_samples=o.get("min_samples"),
        center=o.get("center", False),
        **extra,
    )


def _binning(name: str, a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """``cut(breaks, ...)`` or ``qcut(quantiles, ...)`` as the user called it (Polars 2.1
    warns that both are deprecated; the warning was the user's, not the task's)."""
    labels = None if o.get("labels") is None else list(o["labels"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if name == "cut":
            return a[0].cut(
                list(o["breaks"]),
                labels=labels,
                left_closed=o["left_closed"],
                include_breaks=o["include_breaks"],
            )
        return a[0].qcut(
            list(o["quantiles"]),
            labels=labels,
            left_closed=o["left_closed"],
            allow_duplicates=o["allow_duplicates"],
            include_breaks=o["include_breaks"],
        )


def _rolling_by(a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """``rolling_<function>_by(by, window_size, min_samples=, closed=)``: ``a`` is (values,
    by)."""
    extra = {k: o[k] for k in ("ddof", "quantile", "interpolation") if k in o}
    return getattr(a[0], f"rolling_{o['function']}_by")(
        a[1],
        window_size=o["window_size"],
        min_samples=o["min_samples"],
        closed=o["closed"],
        **extra,
    )


def _over(a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """A window: ``a`` is the function, then ``o["partitions"]`` partition keys, then the
    ``order_by`` key when ``o["ordered"]``."""
    n = o["partitions"]
    keys = a[1 : 1 + n]
    order_by = a[1 + n] if o.get("ordered") else None
    return a[0].over(
        keys or None,
        order_by=order_by,
        descending=o.get("descending", False),
        nulls_last=o.get("nulls_last", False),
        mapping_strategy=o.get("mapping_strategy", "group_to_rows"),
    )


def _clip(a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """``clip`` with the bounds Polars' options say are present, in order (min, max)."""
    rest = iter(a[1:])
    lower = next(rest) if o.get("has_min", True) else None
    upper = next(rest) if o.get("has_max", True) else None
    return a[0].clip(lower, upper)


def _replace(a: list[pl.Expr], o: dict[str, Any]) -> pl.Expr:
    """``str.replace`` (``n`` matches) or ``str.replace_all`` (``n == -1``)."""
    literal = o.get("literal", False)
    n = o.get("n", 1)
    if n == -1:
        return a[0].str.replace_all(a[1], a[2], literal=literal)
    return a[0].str.replace(a[1], a[2], literal=literal, n=n)


_BINARY: dict[str, Callable[[pl.Expr, pl.Expr], pl.Expr]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "truediv": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq_missing": lambda a, b: a.eq_missing(b),
    "ne_missing": lambda a, b: a.ne_missing(b),
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
}


def _arrow_string_fn(arg: pl.Expr, name: str) -> pl.Expr:
    """``arg`` (a String column) through Arrow's compute function ``name``, row by row."""

    def apply(s: pl.Series) -> pl.Series:
        out = pc.call_function(name, [s.to_arrow().cast(pa.large_string())])
        return pl.Series(s.name, out, dtype=pl.String)

    return arg.map_batches(apply, return_dtype=pl.String, is_elementwise=True)


def _truncrem(a: pl.Expr, b: pl.Expr) -> pl.Expr:
    """The remainder of integer division rounding toward zero (the sign of ``a``; C's and
    Rust's ``%``, Polars' ``trunc_rem``): ``a - b * truncdiv(a, b)``, exact for integers
    (NULL for ``b`` 0, as the division gives); ``b`` -1 gives 0 without the division, which
    overflows for the type's minimum (Polars' ``trunc_rem`` gives 0 there too)."""
    return pl.when(b == -1).then(a * 0).otherwise(a - b * a.truncdiv(b))


def _agg(name: str, arg: pl.Expr | None, options: dict[str, Any]) -> pl.Expr:
    if name == "len":
        return pl.len()
    assert arg is not None
    if name in (
        "sum",
        "mean",
        "min",
        "max",
        "count",
        "n_unique",
        "first",
        "last",
        "median",
        "null_count",
    ):
        return getattr(arg, name)()
    if name in ("std", "var"):
        ddof = options.get("ddof", 1)
        # As Polars' in-memory engine gives it. Null unless more than ddof values are
        # valid: its streaming engine (the kernel's collect()) gives 0.0 for a one-row group
        # whose value is null with ddof=0. One valid value (ddof=0): (x - x)^2, NaN for a
        # NaN or an infinity; the streaming engine gives 0.0 when the whole frame is that
        # one row (a hash bucket can hold one group of one row), the in-memory engine NaN.
        one = ((arg - arg.mean()) ** 2).sum()
        return (
            pl.when(arg.count() <= ddof)
            .then(None)
            .when(arg.count() == 1)
            .then(one.sqrt() if name == "std" else one)
            .otherwise(getattr(arg, name)(ddof=ddof))
        )
    if name in ("nan_min", "nan_max", "implode", "product", "arg_min", "arg_max"):
        return getattr(arg, name)()
    if name == "item":
        # the group's only value (null for no value with ``allow_empty``); more values
        # raise Polars' ComputeError in the task
        return arg.item(allow_empty=options.get("allow_empty", False))
    if name in ("first_non_null", "last_non_null"):
        return getattr(arg, name.removesuffix("_non_null"))(ignore_nulls=True)
    if name == "quantile":
        return arg.quantile(options["quantile"], options.get("interpolation", "nearest"))
    raise UnsupportedError(f"aggregate function {name!r} is not supported by the kernel")


#: While :func:`shared_lowering` is open: each IR expression node's Polars expression, by
#: ``id`` of the node, so that lowering many overlapping sub-expressions (the validator
#: types every sub-expression of a tree) costs one lowering per node, not one per subtree.
_MEMO: contextvars.ContextVar[dict[int, pl.Expr] | None] = contextvars.ContextVar(
    "shoal_lowering_memo", default=None
)


@contextlib.contextmanager
def shared_lowering() -> Iterator[None]:
    """Within the block, :func:`to_polars` lowers each IR node once and reuses the result
    for every tree that contains it. The caller keeps the IR nodes alive for the block
    (the memo is keyed by ``id``)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def to_polars(expr: Expr) -> pl.Expr:
    """Translate an IR expression into an equivalent Polars expression.

    Raises :class:`shoal.UnsupportedError` for a function the kernel does not know.
    """
    memo = _MEMO.get()
    if memo is None:
        return _to_polars(expr)
    got = memo.get(id(expr))
    if got is None:
        got = memo[id(expr)] = _to_polars(expr)
    return got


def _natural_literal(lit: Lit) -> bool:
    """Whether ``pl.lit(value)`` is already the literal ``pl.lit(value, dtype=...)`` makes of
    ``lit`` (the same expression, as ``Expr.meta.serialize`` shows): a string as String, a
    bool as Boolean, a decimal as ``Decimal(38, s)`` where ``s`` is the value's own
    number of decimal places. Given a dtype, Polars builds a Series of the value and casts
    it (10-35 microseconds; a TPC-H query has up to 40 literals), without one it makes
    the scalar at once (2-4)."""
    value, dtype = lit.value, lit.dtype
    kind = type(value)
    if kind is str:
        return dtype.is_string
    if kind is bool:
        return dtype == BOOL
    if kind is decimal.Decimal and dtype.is_decimal and value.is_finite():
        exponent = value.as_tuple().exponent
        arrow = dtype.arrow
        return (
            isinstance(exponent, int)
            and isinstance(arrow, pa.Decimal128Type)
            and arrow.precision == 38
            and arrow.scale == -exponent
            and len(value.as_tuple().digits) <= 38
        )
    return False


def _to_polars(expr: Expr) -> pl.Expr:
    if isinstance(expr, Col):
        return pl.col(expr.name)
    if isinstance(expr, Lit):
        if _natural_literal(expr):
            return pl.lit(expr.value)
        return pl.lit(expr.value, dtype=expr.dtype.to_polars())
    if isinstance(expr, BinaryOp):
        return _BINARY[expr.op](to_polars(expr.left), to_polars(expr.right))
    if isinstance(expr, Cast):
        if expr.wrap:
            return to_polars(expr.expr).cast(expr.dtype.to_polars(), wrap_numerical=True)
        return to_polars(expr.expr).cast(expr.dtype.to_polars(), strict=expr.strict)
    if isinstance(expr, Ternary):
        return (
            pl.when(to_polars(expr.predicate))
            .then(to_polars(expr.then))
            .otherwise(to_polars(expr.otherwise))
        )
    if isinstance(expr, Function) and expr.name == "series":
        values = pl.Series(list(expr.option("values")), dtype=expr.dtype.to_polars())
        return pl.lit(values)
    if isinstance(expr, Function):
        impl = FUNCTIONS.get(expr.name)
        if impl is None:
            raise UnsupportedError(f"function {expr.name!r} is not supported by the kernel")
        return impl([to_polars(a) for a in expr.args], dict(expr.options))
    if isinstance(expr, Agg):
        return _agg(
            expr.name, None if expr.arg is None else to_polars(expr.arg), dict(expr.options)
        )
    raise UnsupportedError(f"expression {type(expr).__name__} is not supported by the kernel")
