"""The IR's function table (``shoal.ir.functions``) against native Polars.

Every entry is walked: its inputs are generated from its signature (columns with nulls,
NaN, -0.0 and duplicates; a filter that empties the first partition), the native Polars
expression is the one the kernel's lowering writes for it (``lowering.expressions``: how
Polars runs the function), and shoal's distributed answer is compared with native Polars'
``collect()`` of the same query:

* row-wise, window and order functions in a ``select``; aggregates and aggregating
  functions in a ``group_by(k).agg(...)`` (for splittable aggregates, the planner's
  two-phase split) and in a ``select`` without keys;
* through the Polars frontend (``DistEngine(raise_on_fail=True)``: the adapter's translation
  is checked too) where Polars' plan translates back to the function, else with the IR
  built directly (``shoal.execute``);
* at 3 partitions by default, and 1 and 7 partitions with ``-m slow``;
* the output dtype Polars gives is the one the table's type rule declares.

An entry the walk cannot generate inputs for is listed in :data:`NOT_WALKED` with the
reason; a new entry must be walked or listed.
"""

from __future__ import annotations

import ast
import datetime
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.errors import UnsupportedError
from shoal.ir.expr import Agg, Col, Expr, Function, Lit, NamedExpr
from shoal.ir.functions import (
    AGG_NAMES,
    FUNCTION_NAMES,
    FUNCTION_TABLE,
    SPLITS,
    FunctionDef,
    output_type,
)
from shoal.ir.nodes import Aggregate, Filter, InMemorySource, Project, Scan
from shoal.ir.types import DataType, Schema
from shoal.lowering.expressions import FUNCTIONS, _agg, to_polars
from shoal.lowering.infer import infer_dtypes

ROOT = Path(__file__).resolve().parent.parent
NAN = float("nan")

# ------------------------------------------------------------------ names agree


def test_lowering_implements_every_table_entry_and_nothing_else() -> None:
    """The table says what a function is, the lowering how Polars runs it: the same names."""
    assert set(FUNCTIONS) - FUNCTION_NAMES == set(), "lowered but not in the table"
    assert FUNCTION_NAMES - set(FUNCTIONS) == set(), "in the table but not lowered"
    x = pl.col("x")
    for name in sorted(AGG_NAMES):
        options = {"quantile": 0.5} if name == "quantile" else {}
        assert isinstance(_agg(name, None if name == "len" else x, options), pl.Expr), name


def _literal_names(path: Path, callee: str) -> set[str]:
    """First arguments that are string literals of calls to ``callee`` in ``path``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == callee
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out.add(node.args[0].value)
    return out


def test_adapters_and_planner_emit_only_table_names() -> None:
    """Every IR function or aggregate name the adapters, the planner and the builder write
    (string literals in ``Function(...)``, ``fn(...)``, ``Agg(...)`` calls, and the Polars
    adapter's ``SCALAR_FUNCTIONS``) is an entry of the table."""
    from shoal_polars.functions import SCALAR_FUNCTIONS

    unknown = [
        f"{name} (shoal_polars.functions)"
        for name, _ in SCALAR_FUNCTIONS.values()
        if name not in FUNCTION_NAMES
    ]
    sources = [
        *(ROOT / "adapters" / "shoal_polars").glob("*.py"),
        *(ROOT / "adapters" / "shoal_duckdb").glob("*.py"),
        *(ROOT / "backend" / "shoal" / "planner").glob("*.py"),
        *(ROOT / "backend" / "shoal" / "plan").glob("*.py"),
    ]
    for path in sources:
        for callee, known in (
            ("Function", FUNCTION_NAMES),
            ("fn", FUNCTION_NAMES),
            ("Agg", AGG_NAMES),
        ):
            unknown += [
                f"{n} ({path.name})" for n in _literal_names(path, callee) if n not in known
            ]
    assert not unknown, f"names not in the IR's function table: {sorted(unknown)}"


def test_substrait_standard_names_come_from_the_table() -> None:
    pytest.importorskip("substrait")
    from shoal.plan import substrait

    for name, (urn, std) in {**substrait._STD_FUNCTIONS, **substrait._STD_AGGS}.items():
        assert FUNCTION_TABLE[name].substrait == (urn.rsplit(":", 1)[1], std)


def test_planner_splits_what_the_table_splits() -> None:
    from shoal.planner import aggregate

    assert frozenset(SPLITS) == aggregate.DECOMPOSABLE
    for name, merge in aggregate._FINAL.items():
        assert SPLITS[name].merge == merge


# ------------------------------------------------------------------ the walk

#: 12 rows; ``keep`` is false on the first 4, so a filter empties the first partition (3
#: or 7 partitions of 4 or 2 rows) and part of a second. The kept rows have a group whose
#: ``i`` are all null (k=2), groups whose ``f`` are -0.0 in two partitions (k=1) or one
#: (k=4), a group of NaN only (k=null), duplicates in every column.
DATA = pl.DataFrame(
    {
        "k": [1, 1, 2, None, 1, 2, 3, 3, None, 2, 1, 4],
        "i": [3, None, -2, 3, 0, None, -2, None, 5, None, 1, -1],
        "f": [1.5, None, NAN, -0.0, -0.0, 2.5, -0.0, -3.0, NAN, None, -0.0, -0.0],
        "b": [True, None, False, True, True, False, None, True, False, False, True, None],
        "s": ["a", None, "Bb", "a", "", "ßx", "cc", None, "a1", "Bb", " d ", "a"],
        "dt": [
            None if j in (1, 7) else datetime.datetime(2024, 1 + j, 2 * j + 1, j, 2 * j)
            for j in range(12)
        ],
        "d": [None if j == 5 else datetime.date(2023, 12 - j, 1 + 2 * j) for j in range(12)],
        "du": [None if j == 2 else datetime.timedelta(hours=j - 5, minutes=j) for j in range(12)],
        "t": [None if j == 4 else datetime.time(j, 5 * j) for j in range(12)],
        "l": [[1, 2], None, [], [3, None], [1, 2], [5], [0, -1, 2], None, [4], [], [2, 2], [7]],
        "st": [{"x": j % 3, "y": f"v{j % 4}"} if j != 6 else None for j in range(12)],
        "keep": [False] * 4 + [True] * 8,
    },
    schema_overrides={"dt": pl.Datetime("us"), "du": pl.Duration("us")},
).with_columns(a=pl.Series([[j, j - 1] for j in range(12)], dtype=pl.Array(pl.Int64, 2)))

#: The column each argument kind reads first (several for ``any`` and ``num``).
COLUMNS: dict[str, tuple[str, ...]] = {
    "any": ("i", "s"),
    "num": ("i", "f"),
    "int": ("i",),
    "float": ("f",),
    "bool": ("b",),
    "str": ("s",),
    "temporal": ("dt", "d"),
    "date": ("d",),
    "datetime": ("dt",),
    "duration": ("du",),
    "time": ("t",),
    "list": ("l",),
    "array": ("a",),
    "struct": ("st",),
}

#: Arguments other than one column per kind: IR-side literals (value, Polars dtype) or
#: column names, by function.
ARGS: dict[str, list[Any]] = {
    "is_in": ["i", ([3, 5], pl.List(pl.Int64))],
    "str.contains_any": ["s", (["a", "x"], pl.List(pl.String))],
    "str.replace_many": ["s", (["a"], pl.List(pl.String)), (["A"], pl.List(pl.String))],
    "str.extract_many": ["s", (["a", "b"], pl.List(pl.String))],
    "str.find_many": ["s", (["a", "b"], pl.List(pl.String))],
    "str.slice": ["s", (1, pl.Int64), (2, pl.UInt64)],
    "str.head": ["s", (2, pl.Int64)],
    "str.tail": ["s", (2, pl.Int64)],
    "str.zfill": ["s", (4, pl.Int64)],
    "str.pad_start": ["s", (4, pl.Int64)],
    "str.pad_end": ["s", (4, pl.Int64)],
    "str.contains": ["s", ("a", pl.String)],
    "str.starts_with": ["s", ("a", pl.String)],
    "str.ends_with": ["s", ("b", pl.String)],
    "str.strip_chars": ["s", (" a", pl.String)],
    "str.strip_chars_start": ["s", (" a", pl.String)],
    "str.strip_chars_end": ["s", (" d", pl.String)],
    "str.strip_prefix": ["s", ("a", pl.String)],
    "str.strip_suffix": ["s", ("b", pl.String)],
    "str.replace": ["s", ("a", pl.String), ("z", pl.String)],
    "str.count_matches": ["s", ("a", pl.String)],
    "str.extract": ["s", ("(a)", pl.String)],
    "str.extract_all": ["s", ("[ab]", pl.String)],
    "str.find": ["s", ("b", pl.String)],
    "str.split": ["s", ("a", pl.String)],
    "str.split_exact": ["s", ("a", pl.String)],
    "str.splitn": ["s", ("a", pl.String)],
    "str.json_path_match": ["s", ("$.a", pl.String)],
    "str.to_integer": ["s"],
    "str.strptime": ["s"],
    "str.concat": ["s", "i"],
    "str.format": ["s", "i"],
    "dt.truncate": ["dt", ("1mo", pl.String)],
    "dt.round": ["dt", ("1h", pl.String)],
    "dt.offset_by": ["dt", ("1mo", pl.String)],
    "dt.combine": ["d", "t"],
    "log": ["f", (2.0, pl.Float64)],
    "pow": ["i", (2, pl.Int64)],
    "clip": ["f", (-1.0, pl.Float64), (2.0, pl.Float64)],
    "is_between": ["i", (0, pl.Int64), (3, pl.Int64)],
    "fill_null": ["i", (0, pl.Int64)],
    "replace": ["i", (3, pl.Int64), (30, pl.Int64)],
    "replace_strict": ["i", ([3], pl.List(pl.Int64)), ([30], pl.List(pl.Int64)), (0, pl.Int64)],
    "is_close": ["f", "f"],
    "list.contains": ["l", (2, pl.Int64)],
    "list.join": ["s_list", ("-", pl.String)],
    "list.get": ["l", (0, pl.Int64)],
    "list.slice": ["l", (0, pl.Int64), (1, pl.Int64)],
    "list.shift": ["l", (1, pl.Int64)],
    "list.count_matches": ["l", (2, pl.Int64)],
    "list.set_operation": ["l", "l"],
    "list.gather_every": ["l", (1, pl.Int64), (0, pl.Int64)],
    "list.gather": ["l", ([0], pl.List(pl.Int64))],
    "arr.contains": ["a", (2, pl.Int64)],
    "arr.join": ["a_str", ("-", pl.String)],
    "arr.get": ["a", (0, pl.Int64)],
    "arr.shift": ["a", (1, pl.Int64)],
    "arr.count_matches": ["a", (2, pl.Int64)],
    "arr.dot": ["a", "a"],
    "corr": ["f", "i"],
    "index_of": ["i", (3, pl.Int64)],
    "max_by": ["s", "i"],
    "min_by": ["s", "i"],
    "search_sorted": ["i", (3, pl.Int64)],
    "shift": ["i", (1, pl.Int64)],
    "diff": ["i", (1, pl.Int64)],
    "pct_change": ["f", (1, pl.Int64)],
    "filter": ["i", "b"],
    "slice": ["i", (1, pl.Int64), (3, pl.Int64)],
    "repeat": [(5, pl.Int64), (2, pl.Int64)],
    "sort_by": ["s", "i"],
    "ewm_mean_by": ["f", "dt"],
    "rolling_by": ["f", "dt"],
    "str.join": ["s"],
    "struct.with_fields": ["st", "i"],
    "as_struct": ["i", "s"],
    "coalesce": ["i", (0, pl.Int64)],
    "max_horizontal": ["i", "f"],
    "min_horizontal": ["i", "f"],
    "sum_horizontal": ["i", "f"],
    "mean_horizontal": ["i", "f"],
    "concat_list": ["i", "i"],
    "as_list": ["i", "s"],
    "fused": ["f", "f", (2.0, pl.Float64)],
    "arctan2": ["f", "i"],
    "list.to_array": ["a_list"],
    "str.json_decode": ["js"],
    "reinterpret": ["i"],
    "gather": ["i", (2, pl.Int64)],
    "sample": ["i", (3, pl.Int64)],
    "to_physical": ["d"],
    "nested_nulls_last": ["l"],
    "datetime": ["yr", *[(v, pl.Int64) for v in (2, 3, 4, 5, 6, 7)], ("raise", pl.String)],
    "duration": ["i", *[(v, pl.Int64) for v in (1, 2, 3, 4, 5, 6, 7)]],
    "dt.replace": ["dt", "yr", *[(v, pl.Int64) for v in (2, 3, 4, 5, 6, 7)], ("raise", pl.String)],
    "int_ranges": ["i", (5, pl.Int64), (1, pl.Int64)],
    "linear_spaces": ["f", (5.0, pl.Float64), (3, pl.Int64)],
    "date_ranges": ["d", (datetime.date(2024, 3, 1), pl.Date)],
    "datetime_ranges": ["dt", (datetime.datetime(2025, 1, 1), pl.Datetime("us"))],
    "time_ranges": ["t", (datetime.time(23), pl.Time)],
    "int_range": [(0, pl.Int64), (5, pl.Int64)],
    "linear_space": [(0.0, pl.Float64), (1.0, pl.Float64), (5, pl.Int64)],
    "date_range": [(datetime.date(2024, 1, 1), pl.Date), (datetime.date(2024, 5, 1), pl.Date)],
    "datetime_range": [
        (datetime.datetime(2024, 1, 1), pl.Datetime("us")),
        (datetime.datetime(2024, 1, 2), pl.Datetime("us")),
    ],
    "time_range": [(datetime.time(1), pl.Time), (datetime.time(9), pl.Time)],
    "series": [],
    "explode": ["l"],
}

#: More argument lists, beyond the signature's own (Booleans, strings and dates where
#: Polars accepts them: their aggregation merges by other rules).
MORE_ARGS: dict[str, list[list[Any]]] = {
    **{n: [["b"]] for n in ("bitwise_and", "bitwise_or", "bitwise_xor", "sum", "mean")},
    **{n: [["s"], ["b"], ["dt"], ["du"]] for n in ("min", "max", "first", "last")},
    "count": [["f"], ["s"]],
    "null_count": [["f"], ["s"]],
    "n_unique": [["f"], ["b"]],
    "product": [["b"]],
    "median": [["b"], ["du"]],
    "arg_min": [["f"], ["s"]],
    "arg_max": [["f"], ["s"]],
    "implode": [["f"]],
    "cum_sum": [["b"]],
    "cum_max": [["s"]],
    "rank": [["f"], ["s"]],
}

#: Options for functions that need some (IR option names).
OPTIONS: dict[str, dict[str, Any]] = {
    "quantile": {"quantile": 0.5, "interpolation": "linear"},
    "std": {"ddof": 1},
    "var": {"ddof": 0},
    "kurtosis": {"fisher": True, "bias": True},
    "str.join": {"delimiter": ",", "ignore_nulls": True},
    "entropy": {"normalize": True},
    "value_counts": {"sort": True, "name": "n"},
    "is_close": {"abs_tol": 0.0, "rel_tol": 1e-9, "nans_equal": False},
    "dt.to_string": {"format": "%Y-%m-%d"},
    "str.to_integer": {"dtype": DataType(pa.int64()), "strict": False},
    "str.strptime": {"dtype": DataType(pa.date32()), "format": "%Y", "strict": False},
    "str.split_exact": {"n": 1},
    "str.splitn": {"n": 2},
    "str.format": {"format": "{}-{}"},
    "str.replace_many": {"ascii_case_insensitive": False, "leftmost": False},
    "str.extract_many": {"ascii_case_insensitive": False, "overlapping": False, "leftmost": False},
    "str.find_many": {"ascii_case_insensitive": False, "overlapping": False, "leftmost": False},
    "str.normalize": {"form": "NFKC"},
    "replace_strict": {"dtype": DataType(pa.int64())},
    "round_sig_figs": {"digits": 2},
    "dt.convert_time_zone": {"time_zone": "Europe/Paris"},
    "dt.replace_time_zone": {"time_zone": "UTC"},
    "dt.cast_time_unit": {"time_unit": "ms"},
    "list.std": {"ddof": 1},
    "list.var": {"ddof": 1},
    "arr.std": {"ddof": 1},
    "arr.var": {"ddof": 1},
    "list.diff": {"n": 1, "null_behavior": "ignore"},
    "list.set_operation": {"operation": "union"},
    "list.gather": {"null_on_oob": True},
    "list.get": {"null_on_oob": True},
    "arr.get": {"null_on_oob": True},
    "arr.contains": {"nulls_equal": True},
    "list.to_struct": {"fields": ("p", "q")},
    "arr.to_struct": {"fields": ("p", "q")},
    "list.to_array": {"width": 2},
    "struct.field": {"name": "x"},
    "struct.rename_fields": {"names": ("p", "q")},
    "struct.with_fields": {"names": ("z",)},
    "as_struct": {"fields": ("p", "q")},
    "fused": {"op": "fma"},
    "hash": {"seed": 0},
    "cut": {"breaks": (0.0, 1.0), "labels": None, "left_closed": False, "include_breaks": False},
    "qcut": {
        "quantiles": (0.5,),
        "labels": None,
        "left_closed": False,
        "allow_duplicates": True,
        "include_breaks": False,
    },
    "fill_null_strategy": {"strategy": "forward"},
    "rank": {"method": "min"},
    "ewm_mean": {"alpha": 0.5, "adjust": True, "min_samples": 1, "ignore_nulls": False},
    "ewm_std": {
        "alpha": 0.5,
        "adjust": True,
        "min_samples": 1,
        "ignore_nulls": False,
        "bias": False,
    },  # fmt: skip
    "ewm_var": {
        "alpha": 0.5,
        "adjust": True,
        "min_samples": 1,
        "ignore_nulls": False,
        "bias": False,
    },  # fmt: skip
    "ewm_mean_by": {"half_life": "1d"},
    "rolling": {"function": "sum", "window_size": 2},
    "rolling_by": {"function": "sum", "window_size": "3d", "min_samples": 1, "closed": "right"},
    "gather_every": {"n": 2},
    "shuffle": {"seed": 1},
    "sample": {"seed": 1, "is_fraction": False, "with_replacement": False, "shuffle": True},
    "skew": {"bias": True},
    "item": {"allow_empty": True},
    "truncate": {"decimals": 0},
    "sort_by": {"descending": (False,), "nulls_last": (False,), "maintain_order": True},
    "arr.join": {"ignore_nulls": True},
    "list.join": {"ignore_nulls": True},
    "unique": {"maintain_order": True},
    "arr.sort": {"descending": False, "nulls_last": False},
    "str.json_decode": {"dtype": DataType(pa.struct([("a", pa.int64())]))},
    "str.extract_groups": {"pattern": r"(?<first>[a-z])(?<rest>.*)"},
    "cast_enum": {"categories": ("a", "Bb", "cc"), "strict": False},
    "reinterpret": {"dtype": DataType(pa.uint64())},
    "truncdiv": {"dtype": DataType(pa.int64())},
    "truncrem": {"dtype": DataType(pa.int64())},
    "gather": {"scalar": False},
    "nested_nulls_last": {"dtype": DataType(pa.large_list(pa.int64()))},
    "datetime": {"time_unit": "us", "time_zone": None},
    "duration": {"time_unit": "us"},
    "int_ranges": {"dtype": DataType(pa.int64())},
    "linear_spaces": {"closed": "both", "array_width": None},
    "date_ranges": {"interval": "1mo", "closed": "both"},
    "datetime_ranges": {"interval": "1mo", "closed": "left"},
    "time_ranges": {"interval": "2h", "closed": "both"},
    "int_range": {"step": 1, "dtype": DataType(pa.int64())},
    "linear_space": {"closed": "both"},
    "date_range": {"interval": "1mo", "closed": "both"},
    "datetime_range": {"interval": "5h", "closed": "right"},
    "time_range": {"interval": "90m", "closed": "both"},
    "series": {"values": (1, 2, None)},
    "explode": {"empty_as_null": True, "keep_nulls": True},
}

#: Entries the walk does not generate inputs for, with the reason (each is covered by the
#: adapters' own tests against native Polars or DuckDB).
NOT_WALKED: dict[str, str] = {
    "over": "wraps another expression: walked by tests/test_polars_windows.py",
    "list.eval": "its body is Polars' serialised expression, made by the Polars adapter",
    "cumulative_eval": "its body is Polars' serialised expression, made by the Polars adapter",
    "item": "raises unless each group has one value (tests/test_polars_coverage2)",
}


def _column(kind: str, pick: int = 0) -> str:
    cols = COLUMNS[kind]
    return cols[pick % len(cols)]


def _variants(f: FunctionDef) -> list[list[Any]]:
    """The argument lists the walk tries for ``f``: column names or (value, dtype)."""
    if f.name in ARGS:
        return [ARGS[f.name], *MORE_ARGS.get(f.name, [])]
    low, _ = f.arity()
    kinds = list(f.args[: max(low, 1)]) if f.args else []
    if not kinds:
        return [[]]
    picks = max(len(COLUMNS.get(kinds[0], ("",))), 1)
    out = []
    for p in range(picks):
        args: list[Any] = []
        for j, kind in enumerate(kinds):
            if kind.startswith("scalar"):
                args.append((1, pl.Int64))
            else:
                args.append(_column(kind, p if j == 0 else 0))
        out.append(args)
    return out + MORE_ARGS.get(f.name, [])


def _frame() -> pl.DataFrame:
    return DATA.with_columns(
        s_list=pl.col("l").list.eval(pl.element().cast(pl.String)),
        a_str=pl.col("a").arr.eval(pl.element().cast(pl.String)),
        a_list=pl.col("a").arr.to_list(),
        yr=pl.col("i") + 2000,
        js=pl.format('{{"a": {}}}', pl.col("i")),
    )


def _polars_arg(a: Any) -> pl.Expr:
    if isinstance(a, str):
        return pl.col(a)
    value, dtype = a
    return pl.lit(value, dtype=dtype)


def _ir_arg(a: Any, schema: Schema) -> Expr:
    if isinstance(a, str):
        return Col(a, schema[a])
    value, dtype = a
    return Lit(value, DataType.from_polars(dtype))


def _native(f: FunctionDef, args: list[Any]) -> pl.Expr:
    """The Polars expression the lowering writes for ``f`` (how Polars runs it)."""
    options = OPTIONS.get(f.name, {})
    pargs = [_polars_arg(a) for a in args]
    if f.node == "agg":
        return _agg(f.name, pargs[0] if pargs else None, options)
    return FUNCTIONS[f.name](pargs, options)


def _ir(f: FunctionDef, args: list[Any], schema: Schema) -> Expr:
    options = tuple(sorted(OPTIONS.get(f.name, {}).items()))
    iargs = [_ir_arg(a, schema) for a in args]
    e: Expr
    if f.node == "agg":
        e = Agg(f.name, iargs[0] if iargs else None, DataType(pa.null()), options)
    else:
        e = Function(f.name, tuple(iargs), options, DataType(pa.null()))
    (dtype,) = infer_dtypes([e], schema)
    if isinstance(e, Agg):
        return Agg(e.name, e.arg, dtype, e.options)
    return Function(e.name, e.args, e.options, dtype)  # type: ignore[attr-defined]


def _config(n: int) -> shoal.Config:
    return shoal.Config(
        runner="local", default_partitions=n, shuffle_partitions=n, small_query_bytes=0
    )


def _sorted(df: pl.DataFrame) -> pl.DataFrame:
    return df.sort("k", nulls_last=False, maintain_order=True) if "k" in df.columns else df


def _shoal_ir(
    f: FunctionDef, args: list[Any], grouped: bool, n: int, df: pl.DataFrame
) -> pl.DataFrame:
    """shoal's answer with the IR built directly: Scan -> Filter(keep) -> Project/Aggregate."""
    table = df.to_arrow()
    schema = Schema.from_arrow(table.schema)
    node: Any = Filter(Scan(InMemorySource(table), schema), Col("keep", schema["keep"]), schema)
    e = _ir(f, args, schema)
    if f.kind == "aggregate":
        keys = (NamedExpr("k", Col("k", schema["k"])),) if grouped else ()
        out = Schema.of([*((("k", schema["k"]),) if grouped else ()), ("out", e.dtype)])
        node = Aggregate(node, keys, (NamedExpr("out", e),), False, out)
    else:
        node = Project(node, (NamedExpr("out", e),), Schema.of([("out", e.dtype)]))
    result = shoal.execute(node, config=_config(n))
    return pl.from_arrow(result)  # type: ignore[return-value]


def _query(f: FunctionDef, args: list[Any], grouped: bool, df: pl.DataFrame) -> pl.LazyFrame:
    lf = df.lazy().filter(pl.col("keep"))
    expr = _native(f, args).alias("out")
    if f.kind == "aggregate" and grouped:
        return lf.group_by("k").agg(expr)
    return lf.select(expr)


def _walk(f: FunctionDef, args: list[Any], grouped: bool, n: int) -> None:
    df = _frame()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            want = _query(f, args, grouped, df).collect(engine="in-memory")
        except pl.exceptions.PolarsError as exc:
            pytest.fail(f"{f.name}{args}: native Polars refuses the walk's inputs: {exc}")
        engine = shoal.DistEngine(raise_on_fail=True, config=_config(n))
        try:
            got = _query(f, args, grouped, df).collect(engine=engine)
            how = "Polars frontend"
        except UnsupportedError:
            got = _shoal_ir(f, args, grouped, n, df)
            how = "IR"
    what = f"{f.name}({', '.join(map(str, args))}) {'per group' if grouped else ''} at {n} partitions via {how}"
    order_free = f.kind == "aggregate" and grouped
    (
        assert_frame_equal(
            _sorted(got) if order_free else got,
            _sorted(want) if order_free else want,
            check_exact=False,
            rel_tol=1e-9,
            abs_tol=1e-12,
            check_dtypes=True,
        ),
        what,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        streaming = _query(f, args, grouped, df).collect(engine="streaming")
    _same_zero_signs(
        _sorted(got) if order_free else got,
        [_sorted(w) if order_free else w for w in (want, streaming)],
        what,
    )
    schema = Schema.from_polars(df.schema)
    arg_types = [schema[a] if isinstance(a, str) else DataType.from_polars(a[1]) for a in args]
    declared = output_type(
        f, arg_types, OPTIONS.get(f.name), index_type=DataType.from_polars(pl.get_index_type())
    )
    native_type = want.schema["out"]
    if f.kind == "aggregate" and grouped and f.node == "function":
        return  # an aggregating function per group may give a list
    if declared is not None:
        assert DataType.from_polars(native_type) == declared, (
            f"{what}: Polars gives {native_type}, the table's rule {f.out!r} says {declared}"
        )


def _same_zero_signs(got: pl.DataFrame, wants: list[pl.DataFrame], what: str) -> None:
    """Float columns hold -0.0 where one of native Polars' engines does
    (``assert_frame_equal`` takes -0.0 and 0.0 as equal). The engines disagree: the sum
    and mean of a group whose only value is -0.0 are -0.0 in memory and 0.0 streaming
    (docs/polars.md, "Where Polars' engines disagree")."""
    for name, dtype in got.schema.items():
        if not dtype.is_float():
            continue
        g = np.signbit(got[name].to_numpy())
        if not any(
            (np.signbit(w[name].to_numpy()) == g)[w[name].to_numpy() == 0].all() for w in wants
        ):
            raise AssertionError(
                f"{what}: the sign of zero differs in {name}: {got[name]} vs {wants[0][name]}"
            )


def _cases() -> list[Any]:
    out = []
    for name in sorted(FUNCTION_TABLE):
        if name in NOT_WALKED:
            continue
        f = FUNCTION_TABLE[name]
        for args in _variants(f):
            for grouped in (True, False) if f.kind == "aggregate" else (False,):
                label = f"{name}-{'-'.join(a if isinstance(a, str) else 'lit' for a in args)}"
                out.append(
                    pytest.param(f, args, grouped, id=label + ("-grouped" if grouped else ""))
                )
    return out


CASES = _cases()


def test_every_entry_is_walked_or_excused() -> None:
    walked = {c.values[0].name for c in CASES}
    assert set(FUNCTION_TABLE) - walked - set(NOT_WALKED) == set()
    assert set(NOT_WALKED) <= set(FUNCTION_TABLE), "excused names that are not entries"


@pytest.mark.parametrize(("f", "args", "grouped"), CASES)
def test_entry_against_native_polars(f: FunctionDef, args: list[Any], grouped: bool) -> None:
    """shoal's answer at 3 partitions (an empty one included) is native Polars' answer, and
    Polars' output type is the table's rule."""
    _walk(f, args, grouped, 3)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize(("f", "args", "grouped"), CASES)
def test_entry_against_native_polars_more_partitions(
    f: FunctionDef, args: list[Any], grouped: bool, n: int
) -> None:
    _walk(f, args, grouped, n)


def test_the_ir_path_lowers_a_table_entry() -> None:
    """The walk's IR path types and lowers an entry (``abs`` of an integer column)."""
    schema = Schema.from_polars(_frame().schema)
    e = _ir(FUNCTION_TABLE["abs"], ["i"], schema)
    assert isinstance(to_polars(e), pl.Expr)


@pytest.mark.parametrize(
    ("name", "args"),
    [("log", 0), ("abs", 1), ("str.slice", 1), ("is_between", 3), ("fused", 4)],
)
def test_builder_and_validator_check_the_table_arity(name: str, args: int) -> None:
    """A function called with more or fewer arguments than its table signature allows is a
    :class:`shoal.PlanError` naming the function, from the builder and from the validator
    (it was an ``IndexError`` from the lowering for too few, and the extra arguments were
    dropped silently for too many)."""
    from shoal.errors import PlanError
    from shoal.ir import col, from_polars, validate

    frame = from_polars(pl.DataFrame({"x": [1.0, -2.0]}))
    extra = [col("x")] * args
    with pytest.raises(PlanError, match=rf"function {name!r} .*{args + 1} argument"):
        frame.select(col("x").fn(name, *extra).alias("y"))
    schema = Schema.from_polars({"x": pl.Float64})
    x = Col("x", schema["x"])
    scan = Scan(InMemorySource(pl.DataFrame({"x": [1.0]}).to_arrow()), schema)
    bad = Function(name, (x, *[x] * args), (), schema["x"])
    plan = Project(scan, (NamedExpr("y", bad),), Schema.of([("y", schema["x"])]))
    with pytest.raises(PlanError, match=rf"function {name!r} .*{args + 1} argument"):
        validate(plan)
