"""Polars ``Function`` expression nodes -> shoal IR function names.

A Polars ``Function`` node (NodeTraverser version (16, 0)) carries ``function_data``: a
tuple whose first element names the function (an enum such as
``StringFunction.StartsWith``, or a plain string such as ``"abs"``) and whose other elements
are the function's parameters. :data:`SCALAR_FUNCTIONS` maps that name to the IR function
name and names the parameters, which become the IR ``Function.options`` in order. Every IR
name emitted here is an entry of the IR's function table
(:data:`shoal.ir.functions.FUNCTION_TABLE`, which says its signature, kind and type rule;
``shoal.lowering.expressions.FUNCTIONS`` runs it). Functions whose value on a row depends on
other rows (``cum_sum``, ``shift``, ``rank``, ...) are window or order functions there,
which the planner evaluates after gathering their input in order, as Polars defines them.
"""

from __future__ import annotations

from typing import Any

from shoal.ir.functions import FUNCTION_TABLE

#: Polars' trigonometric and angle functions (one IR function each, Polars' name).
_TRIGONOMETRY = (
    "sin", "cos", "tan", "cot", "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh",
    "arcsinh", "arccosh", "arctanh", "degrees", "radians",
)  # fmt: skip

#: Polars function key -> (IR function name, names of the extra ``function_data`` items).
SCALAR_FUNCTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    # boolean
    "BooleanFunction.Not": ("not", ()),
    "BooleanFunction.IsNull": ("is_null", ()),
    "BooleanFunction.IsNotNull": ("is_not_null", ()),
    "BooleanFunction.IsNan": ("is_nan", ()),
    "BooleanFunction.IsNotNan": ("is_not_nan", ()),
    "BooleanFunction.IsFinite": ("is_finite", ()),
    "BooleanFunction.IsInfinite": ("is_infinite", ()),
    "BooleanFunction.IsIn": ("is_in", ("nulls_equal",)),
    "BooleanFunction.IsBetween": ("is_between", ("closed",)),
    # strings
    "StringFunction.StartsWith": ("str.starts_with", ()),
    "StringFunction.EndsWith": ("str.ends_with", ()),
    "StringFunction.Contains": ("str.contains", ("literal", "strict")),
    "StringFunction.Slice": ("str.slice", ()),
    "StringFunction.Head": ("str.head", ()),
    "StringFunction.Tail": ("str.tail", ()),
    "StringFunction.LenChars": ("str.len_chars", ()),
    "StringFunction.LenBytes": ("str.len_bytes", ()),
    "StringFunction.Lowercase": ("str.to_lowercase", ()),
    "StringFunction.Uppercase": ("str.to_uppercase", ()),
    "StringFunction.StripChars": ("str.strip_chars", ()),
    "StringFunction.StripCharsStart": ("str.strip_chars_start", ()),
    "StringFunction.StripCharsEnd": ("str.strip_chars_end", ()),
    "StringFunction.StripPrefix": ("str.strip_prefix", ()),
    "StringFunction.StripSuffix": ("str.strip_suffix", ()),
    "StringFunction.Replace": ("str.replace", ("n", "literal")),
    "StringFunction.ZFill": ("str.zfill", ()),
    "StringFunction.PadStart": ("str.pad_start", ("fill_char",)),
    "StringFunction.PadEnd": ("str.pad_end", ("fill_char",)),
    "StringFunction.Reverse": ("str.reverse", ()),
    "StringFunction.ConcatHorizontal": ("str.concat", ("separator", "ignore_nulls")),
    # temporal
    "TemporalFunction.Year": ("dt.year", ()),
    "TemporalFunction.Quarter": ("dt.quarter", ()),
    "TemporalFunction.Month": ("dt.month", ()),
    "TemporalFunction.Day": ("dt.day", ()),
    "TemporalFunction.Hour": ("dt.hour", ()),
    "TemporalFunction.Minute": ("dt.minute", ()),
    "TemporalFunction.Second": ("dt.second", ()),
    "TemporalFunction.WeekDay": ("dt.weekday", ()),
    "TemporalFunction.Week": ("dt.week", ()),
    "TemporalFunction.OrdinalDay": ("dt.ordinal_day", ()),
    "TemporalFunction.Date": ("dt.date", ()),
    "TemporalFunction.MonthStart": ("dt.month_start", ()),
    "TemporalFunction.MonthEnd": ("dt.month_end", ()),
    "TemporalFunction.Truncate": ("dt.truncate", ()),
    "TemporalFunction.ToString": ("dt.to_string", ("format",)),
    "TemporalFunction.TotalDays": ("dt.total_days", ("fractional",)),
    "TemporalFunction.TotalHours": ("dt.total_hours", ("fractional",)),
    "TemporalFunction.TotalMinutes": ("dt.total_minutes", ("fractional",)),
    "TemporalFunction.TotalSeconds": ("dt.total_seconds", ("fractional",)),
    "TemporalFunction.TotalMilliseconds": ("dt.total_milliseconds", ("fractional",)),
    "TemporalFunction.TotalMicroseconds": ("dt.total_microseconds", ("fractional",)),
    "TemporalFunction.ConvertTimeZone": ("dt.convert_time_zone", ("time_zone",)),
    "TemporalFunction.ReplaceTimeZone": ("dt.replace_time_zone", ("time_zone", "non_existent")),
    # strings (continued): the output dtype of to_integer and strptime is the function's
    "StringFunction.ToInteger": ("str.to_integer", ("strict",)),
    "StringFunction.Strptime": ("str.strptime", ("format", "strict", "exact", "cache")),
    "StringFunction.CountMatches": ("str.count_matches", ("literal",)),
    "StringFunction.Extract": ("str.extract", ("group_index",)),
    "StringFunction.Split": ("str.split", ("inclusive",)),
    "StringFunction.SplitExact": ("str.split_exact", ("n", "inclusive")),
    "StringFunction.ContainsAny": ("str.contains_any", ("ascii_case_insensitive",)),
    "StringFunction.ExtractAll": ("str.extract_all", ()),
    "StringFunction.Find": ("str.find", ("literal", "strict")),
    # the target dtype is the function's own; the parameter is infer_schema_length
    "StringFunction.JsonDecode": ("str.json_decode", ("infer_schema_length",)),
    # temporal (continued)
    "TemporalFunction.Round": ("dt.round", ()),
    "TemporalFunction.TimeStamp": ("dt.timestamp", ("time_unit",)),
    "TemporalFunction.Combine": ("dt.combine", ("time_unit",)),
    # lists and structs
    "ListFunction.Length": ("list.len", ()),
    "ListFunction.Sum": ("list.sum", ()),
    "ListFunction.Min": ("list.min", ()),
    "ListFunction.Max": ("list.max", ()),
    "ListFunction.Mean": ("list.mean", ()),
    "ListFunction.Contains": ("list.contains", ("nulls_equal",)),
    "ListFunction.Join": ("list.join", ("ignore_nulls",)),
    "ListFunction.Get": ("list.get", ("null_on_oob",)),
    "ListFunction.Sort": ("list.sort", ("descending", "nulls_last")),
    "ListFunction.Slice": ("list.slice", ()),
    "ListFunction.Concat": ("concat_list", ()),
    "ListFunction.ToArray": ("list.to_array", ("width",)),
    "StructFunction.FieldByName": ("struct.field", ("name",)),
    "StructFunction.RenameFields": ("struct.rename_fields", ("names",)),
    # numeric and general
    "abs": ("abs", ()),
    "negate": ("neg", ()),
    "sign": ("sign", ()),
    "round": ("round", ("decimals", "mode")),
    "floor": ("floor", ()),
    "ceil": ("ceil", ()),
    "sqrt": ("sqrt", ()),
    "cbrt": ("cbrt", ()),
    "exp": ("exp", ()),
    "log": ("log", ()),
    "log1p": ("log1p", ()),
    "pow": ("pow", ()),
    "clip": ("clip", ("has_min", "has_max")),
    "fill_null": ("fill_null", ()),
    "replace": ("replace", ()),
    "coalesce": ("coalesce", ()),
    "max_horizontal": ("max_horizontal", ()),
    "min_horizontal": ("min_horizontal", ()),
    "sum_horizontal": ("sum_horizontal", ("ignore_nulls",)),
    "mean_horizontal": ("mean_horizontal", ("ignore_nulls",)),
    "round_sig_figs": ("round_sig_figs", ("digits",)),
    "truncate": ("truncate", ("decimals",)),
    # Polars' hash of one value with ``seed``: the same for one Polars version and seed
    "hash": ("hash", ("seed",)),
    # args: values, old, new, then default when given; unmapped values without a default
    # raise Polars' InvalidOperationError in the task
    "replace_strict": ("replace_strict", ()),
    # aggregating functions (AGGREGATING_FUNCTIONS: their rows are gathered or hash-exchanged
    # by group key and aggregated once, which is exact)
    "entropy": ("entropy", ("base", "normalize")),
    # bitwise aggregations (one value per group, on the raw rows) and bit counts (per row)
    "BitwiseFunction.And": ("bitwise_and", ()),
    "BitwiseFunction.Or": ("bitwise_or", ()),
    "BitwiseFunction.Xor": ("bitwise_xor", ()),
    "BitwiseFunction.CountOnes": ("bitwise_count_ones", ()),
    "BitwiseFunction.CountZeros": ("bitwise_count_zeros", ()),
    "BitwiseFunction.LeadingOnes": ("bitwise_leading_ones", ()),
    "BitwiseFunction.LeadingZeros": ("bitwise_leading_zeros", ()),
    "BitwiseFunction.TrailingOnes": ("bitwise_trailing_ones", ()),
    "BitwiseFunction.TrailingZeros": ("bitwise_trailing_zeros", ()),
    # values without nulls / NaN (the column gets shorter: order-dependent)
    "drop_nulls": ("drop_nulls", ()),
    "drop_nans": ("drop_nans", ()),
    "TemporalFunction.Time": ("dt.time", ()),
    "value_counts": ("value_counts", ("sort", "parallel", "name", "normalize")),
    "unique_counts": ("unique_counts", ()),
    # order-dependent: the value on a row depends on other rows (the planner gathers first)
    "cum_sum": ("cum_sum", ("reverse",)),
    "cum_prod": ("cum_prod", ("reverse",)),
    "cum_min": ("cum_min", ("reverse",)),
    "cum_max": ("cum_max", ("reverse",)),
    "cum_count": ("cum_count", ("reverse",)),
    "shift": ("shift", ()),
    "shift_and_fill": ("shift", ()),
    "diff": ("diff", ("null_behavior",)),
    "pct_change": ("pct_change", ()),
    "rank": ("rank", ("method", "descending", "seed")),
    "fill_null_with_strategy": ("fill_null_strategy", ("strategy", "limit")),
    "reverse": ("reverse", ()),
    "unique": ("unique", ("maintain_order",)),
    "rle_id": ("rle_id", ()),
    "interpolate": ("interpolate", ("method",)),
    "gather_every": ("gather_every", ("offset", "n")),
    # exponentially weighted (Polars gives ``com``/``span``/``half_life`` as ``alpha``)
    "EwmFunction.Mean": ("ewm_mean", ("alpha", "adjust", "bias", "min_samples", "ignore_nulls")),
    "EwmFunction.Std": ("ewm_std", ("alpha", "adjust", "bias", "min_samples", "ignore_nulls")),
    "EwmFunction.Var": ("ewm_var", ("alpha", "adjust", "bias", "min_samples", "ignore_nulls")),
    # ranges: one list (or array of ``array_width``) per row; a single range is a column
    # of its own length (order-dependent, like int_range)
    "RangeFunction.LinearSpaces": ("linear_spaces", ("closed", "array_width")),
    "RangeFunction.LinearSpace": ("linear_space", ("closed",)),
    # pl.repeat(value, n): a column of n rows (order-dependent: the planner gathers)
    "repeat": ("repeat", ()),
    # pl.datetime(year, month, day, hour, minute, second, microsecond, ambiguous)
    "TemporalFunction.DatetimeFunction": ("datetime", ("time_unit", "time_zone")),
    # seeded random permutations and samples of the whole column (or group): Polars'
    # draw for a seed depends only on the values in order, so the planner gathers them and
    # one task draws exactly Polars' permutation (without a seed, a draw of the same
    # distribution as Polars')
    "shuffle": ("shuffle", ("seed",)),
    "sample": ("sample", ("is_fraction", "with_replacement", "shuffle", "seed")),
    # trigonometry and conversions (row by row)
    **{name: (name, ()) for name in _TRIGONOMETRY},
    "to_physical": ("to_physical", ()),
    "atan2": ("arctan2", ()),
    # Polars' optimiser fuses a*b+c ("fma"), a-b*c ("fsm"), a*b-c ("fms")
    "fused": ("fused", ("op",)),
    # pl.list(x, y, ...): the values of each row as one list, a list value as one element
    "as_list": ("as_list", ()),
    "ArrayFunction.Dot": ("arr.dot", ()),
    # pl.duration(weeks, days, hours, minutes, seconds, milliseconds, microseconds,
    # nanoseconds) of columns
    "TemporalFunction.Duration": ("duration", ("time_unit",)),
    # cut by fixed breaks (row by row); qcut by the column's quantiles (order-dependent:
    # the quantiles are those of every row, so the planner gathers)
    "cut": ("cut", ("breaks", "labels", "left_closed", "include_breaks")),
    "qcut": ("qcut", ("quantiles", "labels", "left_closed", "allow_duplicates", "include_breaks")),
    "BooleanFunction.IsClose": ("is_close", ("abs_tol", "rel_tol", "nans_equal")),
    # aggregating (AGGREGATING_FUNCTIONS: one value per group, on the raw rows in order)
    "BooleanFunction.Any": ("any", ("ignore_nulls",)),
    "BooleanFunction.All": ("all", ("ignore_nulls",)),
    "BooleanFunction.HasNulls": ("has_nulls", ()),
    "BooleanFunction.IsEmpty": ("is_empty", ("ignore_nulls",)),
    "BooleanFunction.IsSorted": ("is_sorted", ("descending", "nulls_last")),
    "skew": ("skew", ("bias",)),
    "kurtosis": ("kurtosis", ("fisher", "bias")),
    "StringFunction.ConcatVertical": ("str.join", ("delimiter", "ignore_nulls")),
    "index_of": ("index_of", ()),
    "max_by": ("max_by", ()),
    "min_by": ("min_by", ()),
    "search_sorted": ("search_sorted", ("side", "descending")),
    # order-dependent (the planner gathers their input first)
    "peak_max": ("peak_max", ()),
    "peak_min": ("peak_min", ()),
    "arg_unique": ("arg_unique", ()),
    # strings (row by row)
    "StringFunction.Titlecase": ("str.to_titlecase", ()),
    "StringFunction.HexEncode": ("str.encode_hex", ()),
    "StringFunction.Base64Encode": ("str.encode_base64", ()),
    "StringFunction.JsonPathMatch": ("str.json_path_match", ()),
    "StringFunction.SplitN": ("str.splitn", ("n",)),
    "StringFunction.ReplaceMany": ("str.replace_many", ("ascii_case_insensitive", "leftmost")),
    "StringFunction.EscapeRegex": ("str.escape_regex", ()),
    "StringFunction.Normalize": ("str.normalize", ("form",)),
    "StringFunction.ExtractMany": (
        "str.extract_many",
        ("ascii_case_insensitive", "overlapping", "leftmost"),
    ),
    "StringFunction.FindMany": (
        "str.find_many",
        ("ascii_case_insensitive", "overlapping", "leftmost"),
    ),
    # temporal (row by row)
    "TemporalFunction.Nanosecond": ("dt.nanosecond", ()),
    "TemporalFunction.Microsecond": ("dt.microsecond", ()),
    "TemporalFunction.Millisecond": ("dt.millisecond", ()),
    "TemporalFunction.IsLeapYear": ("dt.is_leap_year", ()),
    "TemporalFunction.DaysInMonth": ("dt.days_in_month", ()),
    "TemporalFunction.IsoYear": ("dt.iso_year", ()),
    "TemporalFunction.Century": ("dt.century", ()),
    "TemporalFunction.Millennium": ("dt.millennium", ()),
    "TemporalFunction.CastTimeUnit": ("dt.cast_time_unit", ("time_unit",)),
    "TemporalFunction.TotalNanoseconds": ("dt.total_nanoseconds", ("fractional",)),
    # args: the datetimes, year, month, day, hour, minute, second, microsecond, ambiguous
    "TemporalFunction.Replace": ("dt.replace", ()),
    # lists (row by row: each list on its own)
    "ListFunction.Median": ("list.median", ()),
    "ListFunction.Std": ("list.std", ("ddof",)),
    "ListFunction.Var": ("list.var", ("ddof",)),
    "ListFunction.ArgMin": ("list.arg_min", ()),
    "ListFunction.ArgMax": ("list.arg_max", ()),
    "ListFunction.Shift": ("list.shift", ()),
    "ListFunction.CountMatches": ("list.count_matches", ()),
    "ListFunction.DropNulls": ("list.drop_nulls", ()),
    "ListFunction.Diff": ("list.diff", ("n", "null_behavior")),
    "ListFunction.SetOperation": ("list.set_operation", ("operation",)),
    "ListFunction.GatherEvery": ("list.gather_every", ()),
    "ListFunction.Gather": ("list.gather", ("null_on_oob",)),
    "ListFunction.ToStruct": ("list.to_struct", ("fields",)),
    # arrays (row by row)
    "ArrayFunction.Length": ("arr.len", ()),
    "ArrayFunction.Sum": ("arr.sum", ()),
    "ArrayFunction.Max": ("arr.max", ()),
    "ArrayFunction.Min": ("arr.min", ()),
    "ArrayFunction.Mean": ("arr.mean", ()),
    "ArrayFunction.Median": ("arr.median", ()),
    "ArrayFunction.Std": ("arr.std", ("ddof",)),
    "ArrayFunction.Var": ("arr.var", ("ddof",)),
    "ArrayFunction.Get": ("arr.get", ("null_on_oob",)),
    "ArrayFunction.ArgMin": ("arr.arg_min", ()),
    "ArrayFunction.ArgMax": ("arr.arg_max", ()),
    "ArrayFunction.CountMatches": ("arr.count_matches", ()),
    "ArrayFunction.ToList": ("arr.to_list", ()),
    "ArrayFunction.Contains": ("arr.contains", ("nulls_equal",)),
    "ArrayFunction.ToStruct": ("arr.to_struct", ("fields",)),
    "ArrayFunction.Join": ("arr.join", ("ignore_nulls",)),
    "ArrayFunction.Sort": ("arr.sort", ("descending", "nulls_last")),
    "ArrayFunction.Shift": ("arr.shift", ()),
    "StructFunction.JsonEncode": ("struct.json_encode", ()),
    "BooleanFunction.IsUnique": ("is_unique", ()),
    "BooleanFunction.IsDuplicated": ("is_duplicated", ()),
    "BooleanFunction.IsFirstDistinct": ("is_first_distinct", ()),
    "BooleanFunction.IsLastDistinct": ("is_last_distinct", ()),
}

#: Functions shoal does not run, with the reason.
UNSUPPORTED_FUNCTIONS: dict[str, str] = {
    "mode": "the order of tied modes is not defined",
    "top_k": "the output order of top_k and bottom_k is not defined",
    "rle": "rle is not supported",
    "approx_n_unique": "Polars' HyperLogLog estimate is not reproduced exactly "
    "(n_unique gives the exact count)",
}


def function_key(head: Any) -> str:
    """The key of ``function_data[0]``: ``"StringFunction.StartsWith"`` for an enum value,
    the string itself for a plain name."""
    return head if isinstance(head, str) else str(head)


def lookup(key: str, extra: tuple[Any, ...]) -> tuple[str, tuple[tuple[str, Any], ...]] | str:
    """The IR name and options for Polars function ``key`` with parameters ``extra``, or the
    reason why shoal cannot run it (a string)."""
    spec = SCALAR_FUNCTIONS.get(key)
    if spec is None:
        return UNSUPPORTED_FUNCTIONS.get(key, "no shoal function for it yet")
    name, option_names = spec
    if name not in FUNCTION_TABLE:
        return f"IR function {name!r} is not in the IR's function table"
    if len(extra) != len(option_names):
        return (
            f"expected parameters {list(option_names)}, got {list(extra)!r} "
            "(a NodeTraverser change?)"
        )
    return name, tuple(zip(option_names, map(_frozen, extra), strict=True))


def _frozen(value: Any) -> Any:
    """A parameter as an IR option: lists (``rename_fields`` names) become tuples, so that
    IR expressions stay hashable."""
    return tuple(value) if isinstance(value, list) else value
