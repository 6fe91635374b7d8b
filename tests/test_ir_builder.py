"""The IR builder (shoal.plan.builder) and validation (shoal.plan.validate).

Also home of the random plan generator that the serde and Substrait tests share:
:func:`random_plan` builds the same random query with the builder and with Polars itself,
so that every property test has Polars' answer as its oracle.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from polars.testing import assert_frame_equal

import shoal
from shoal import ir
from shoal.errors import PlanError
from shoal.ir.expr import Agg, BinaryOp, Col, Function, Lit, NamedExpr
from shoal.ir.nodes import Aggregate, Filter, Join, Project, Scan, Slice, Sort
from shoal.ir.types import BOOL, INT64, DataType, Schema
from shoal.plan.validate import validate

CONFIG = shoal.Config(default_partitions=3)

# ---------------------------------------------------------------- shared helpers


def run(plan: ir.PlanNode) -> pl.DataFrame:
    """Run ``plan`` with the local runner on three partitions."""
    out = pl.from_arrow(shoal.execute(plan, runner="local", config=CONFIG))
    assert isinstance(out, pl.DataFrame)
    return out


def canonical(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` sorted by all its columns (results of unordered operations compare as sets)."""
    if df.width == 0 or df.height == 0:
        return df
    return df.sort(df.columns, nulls_last=True)


def assert_same(got: pl.DataFrame, expected: pl.DataFrame) -> None:
    assert got.columns == expected.columns
    assert got.schema == expected.schema, (got.schema, expected.schema)
    assert_frame_equal(canonical(got), canonical(expected), check_exact=False, rel_tol=1e-9)


# ---------------------------------------------------------------- random plans

_VALUE_DTYPES = [pl.Int8, pl.Int32, pl.Int64]
_FLOATS = [0.0, 0.5, -1.25, 2.0, 3.75, float("nan"), None]
_DECIMALS = [decimal.Decimal("1.10"), decimal.Decimal("-2.50"), decimal.Decimal("0"), None]
_DATES = [datetime.date(2024, 1, 1), datetime.date(2024, 2, 29), datetime.date(2023, 12, 31)]


@st.composite
def base_frame(draw: Any) -> pl.DataFrame:
    """A small frame: int keys with duplicates and nulls, strings, ints of a random width,
    floats with NaN, dates and booleans; a random subset of the optional columns."""
    n = draw(st.integers(0, 12))

    def column(values: list[Any]) -> list[Any]:
        return draw(st.lists(st.sampled_from(values), min_size=n, max_size=n))

    data: dict[str, pl.Series] = {"k": pl.Series("k", column([0, 1, 2, 3, None]), pl.Int64)}
    vdt = draw(st.sampled_from(_VALUE_DTYPES))
    optional = {
        "g": lambda: pl.Series("g", column(["a", "b", "c", None]), pl.String),
        "v": lambda: pl.Series("v", column([-5, -1, 0, 2, 3, 5, None]), vdt),
        "x": lambda: pl.Series("x", column(_FLOATS), pl.Float64),
        "d": lambda: pl.Series("d", column([*_DATES, None]), pl.Date),
        "f": lambda: pl.Series("f", column([True, False, None]), pl.Boolean),
        "m": lambda: pl.Series("m", column(_DECIMALS), pl.Decimal(10, 2)),
    }
    for name in draw(st.lists(st.sampled_from(sorted(optional)), unique=True, min_size=1)):
        data[name] = optional[name]()
    order = draw(st.permutations(sorted(data)))
    return pl.DataFrame([data[c] for c in order])


Recipe = Callable[[Any], Any]
"""An expression recipe: given the expression module (``shoal.ir`` or ``polars``), the
expression. One recipe builds the same expression with the builder and with Polars."""


def _pred(draw: Any, schema: dict[str, pl.DataType]) -> Recipe:
    name = draw(st.sampled_from(sorted(schema)))
    dt = schema[name]
    choices: list[Recipe]
    if dt.is_integer():
        choices = [
            lambda F: F.col(name) > 1,
            lambda F: F.col(name) == 2,
            lambda F: F.col(name).is_null(),
            lambda F: F.col(name).is_in([0, 2, 5]),
            lambda F: (F.col(name) % 2) == 0,
            lambda F: F.col(name) <= -1,
        ]
    elif isinstance(dt, pl.Decimal):
        choices = [lambda F: F.col(name) > 0, lambda F: F.col(name).is_null()]
    elif dt.is_float():
        choices = [
            lambda F: F.col(name) < 1.0,
            lambda F: F.col(name).is_nan(),
            lambda F: F.col(name).is_not_null(),
            lambda F: F.col(name) >= 0.5,
        ]
    elif dt == pl.String:
        choices = [
            lambda F: F.col(name) == "a",
            lambda F: F.col(name).is_not_null(),
            lambda F: F.col(name).str.starts_with("b"),
        ]
    elif dt == pl.Date:
        choices = [
            lambda F: F.col(name) >= datetime.date(2024, 1, 1),
            lambda F: F.col(name).is_null(),
        ]
    elif dt == pl.Boolean:
        choices = [lambda F: F.col(name), lambda F: ~F.col(name), lambda F: F.col(name).is_null()]
    else:
        choices = [lambda F: F.col(name).is_null()]
    return draw(st.sampled_from(choices))


def _predicate(draw: Any, schema: dict[str, pl.DataType]) -> Recipe:
    p = _pred(draw, schema)
    how = draw(st.sampled_from(["one", "and", "or"]))
    if how == "one":
        return p
    q = _pred(draw, schema)
    if how == "and":
        return lambda F: p(F) & q(F)
    return lambda F: p(F) | q(F)


def _new_column(draw: Any, schema: dict[str, pl.DataType]) -> Recipe:
    name = draw(st.sampled_from(sorted(schema)))
    dt = schema[name]
    choices: list[Recipe]
    if dt.is_integer():
        choices = [
            lambda F: F.col(name) + 1,
            lambda F: F.col(name) - 3,
            lambda F: F.col(name) * 2,
            lambda F: F.col(name) // 2,
            lambda F: F.col(name) % 3,
            lambda F: F.col(name) / 2,
            lambda F: F.col(name).cast(pl.Float64),
        ]
        if dt.is_signed_integer():
            choices += [lambda F: -F.col(name), lambda F: F.col(name).abs()]
        else:  # counts (UInt32): no negation or subtraction below zero
            choices = [c for i, c in enumerate(choices) if i not in (1,)]
        others = [n for n, t in schema.items() if t.is_signed_integer() and n != name]
        if others:
            o = draw(st.sampled_from(sorted(others)))
            choices += [
                lambda F: F.col(name) + F.col(o),
                lambda F: F.col(name) * F.col(o),
                lambda F: F.when(F.col(name) > F.col(o)).then(F.col(name)).otherwise(F.col(o)),
            ]
    elif isinstance(dt, pl.Decimal):
        choices = [lambda F: F.col(name) * 2, lambda F: F.col(name) + 1, lambda F: -F.col(name)]
    elif dt.is_float():
        choices = [
            lambda F: F.col(name) * 2.0,
            lambda F: F.col(name) + 0.25,
            lambda F: F.when(F.col(name) > 0.0).then(F.col(name)).otherwise(0.0),
        ]
    elif dt == pl.String:
        choices = [lambda F: F.col(name).str.to_uppercase(), lambda F: F.col(name).fill_null("z")]
    elif dt == pl.Date:
        choices = [lambda F: F.col(name).dt.year(), lambda F: F.col(name).dt.month()]
    elif dt == pl.Boolean:
        choices = [
            lambda F: ~F.col(name),
            lambda F: F.col(name) & F.lit(True),
            lambda F: F.col(name).is_not_null(),
        ]
    else:
        choices = [lambda F: F.col(name).is_null()]
    return draw(st.sampled_from(choices))


def _aggs(draw: Any, schema: dict[str, pl.DataType], keys: list[str]) -> list[Recipe]:
    values = [n for n in sorted(schema) if n not in keys]
    out: list[Recipe] = []
    picked = draw(st.lists(st.sampled_from(values), max_size=3)) if values else []
    for i, name in enumerate(picked):
        dt = schema[name]
        fns = ["min", "max", "count", "n_unique"]
        if dt.is_numeric() or dt == pl.Boolean:
            fns += ["sum", "mean"]
        if dt == pl.Boolean:
            fns = [f for f in fns if f not in ("min", "max")]
        fn = draw(st.sampled_from(fns))
        alias = f"{fn}_{name}_{i}"
        out.append(lambda F, name=name, fn=fn, alias=alias: getattr(F.col(name), fn)().alias(alias))
    if not out or draw(st.booleans()):
        out.append(lambda F: F.len().alias("n"))
    return out


OPS = ("filter", "with_columns", "select", "aggregate", "join", "sort_slice")


def random_plan(draw: Any) -> tuple[ir.Frame, pl.LazyFrame, dict[str, pa.Table]]:
    """A random query built twice, with the shoal builder and with Polars: a base frame,
    then one to four operations (filter, with_columns, select, group_by/agg, join, sort by
    every column + slice). Returns the builder frame, the Polars frame and the in-memory
    tables by name (``"left"``, ``"right"``)."""
    df = draw(base_frame())
    keys = draw(st.lists(st.sampled_from([0, 1, 2, None]), max_size=6))
    right = pl.DataFrame({"k": pl.Series(keys, dtype=pl.Int64)}).with_columns(
        w=pl.int_range(pl.len(), dtype=pl.Int64)
    )
    left_tbl, right_tbl = df.to_arrow(), right.to_arrow()
    both: list[Any] = [ir.from_arrow(left_tbl), pl.from_arrow(left_tbl).lazy()]  # type: ignore[union-attr]
    rights: list[Any] = [ir.from_arrow(right_tbl), pl.from_arrow(right_tbl).lazy()]  # type: ignore[union-attr]
    modules = (ir, pl)
    counter = 0
    for _ in range(draw(st.integers(1, 4))):
        schema = dict(both[1].collect_schema())
        op = draw(st.sampled_from(OPS))
        if op == "join" and (schema.get("k") != pl.Int64 or "w" in schema):
            op = "filter"
        if op == "filter":
            recipe = _predicate(draw, schema)
            both = [f.filter(recipe(F)) for f, F in zip(both, modules, strict=True)]
        elif op == "with_columns":
            counter += 1
            name = f"c{counter}"
            recipe = _new_column(draw, schema)
            both = [
                f.with_columns(recipe(F).alias(name)) for f, F in zip(both, modules, strict=True)
            ]
        elif op == "select":
            cols = draw(st.lists(st.sampled_from(sorted(schema)), min_size=1, unique=True))
            both = [f.select(cols) for f in both]
        elif op == "aggregate":
            groupable = sorted(
                n for n, t in schema.items() if t in (pl.Int64, pl.String, pl.Boolean, pl.Date)
            )
            by = (
                draw(st.lists(st.sampled_from(groupable), unique=True, max_size=2))
                if groupable
                else []
            )
            recipes = _aggs(draw, schema, by)
            if by:
                both = [
                    f.group_by(*by).agg(*[r(F) for r in recipes])
                    for f, F in zip(both, modules, strict=True)
                ]
            else:
                both = [
                    f.select(*[r(F) for r in recipes]) for f, F in zip(both, modules, strict=True)
                ]
        elif op == "join":
            how = draw(st.sampled_from(["inner", "left", "semi", "anti"]))
            both = [f.join(r, on="k", how=how) for f, r in zip(both, rights, strict=True)]
        else:
            names = sorted(schema)
            desc = draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
            last = draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
            offset = draw(st.integers(0, 4))
            length = draw(st.none() | st.integers(0, 6))
            both = [
                f.sort(names, descending=desc, nulls_last=last).slice(offset, length) for f in both
            ]
    return both[0], both[1], {"left": left_tbl, "right": right_tbl}


#: Settings for the property tests: a modest number of examples, no deadline.
PROPERTY = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---------------------------------------------------------------- builder basics


@pytest.fixture
def frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "a": [1, 2, None, 4, 2],
            "i8": pl.Series([1, 2, 3, 4, 5], dtype=pl.Int8),
            "x": [1.5, None, float("nan"), 2.0, -1.0],
            "s": ["a", "b", "a", None, "b"],
            "d": [datetime.date(2024, 1, i) for i in range(1, 6)],
            "m": [
                decimal.Decimal("1.10"),
                decimal.Decimal("2.25"),
                None,
                decimal.Decimal("0"),
                decimal.Decimal("-3.5"),
            ],
        },
        schema_overrides={"m": pl.Decimal(10, 2)},
    )


def test_builder_plan_is_typed_ir(frame: pl.DataFrame) -> None:
    f = ir.from_polars(frame)
    out = f.filter(ir.col("a") > 1).with_columns(b=ir.col("i8") + 1)
    plan = out.plan
    assert isinstance(plan, Project) and isinstance(plan.input, Filter)
    assert isinstance(plan.input.input, Scan)
    assert plan.input.predicate == BinaryOp("gt", Col("a", INT64), Lit(1, INT64), BOOL)
    # Dynamic literal: Int8 + 1 stays Int8, as in Polars.
    b = dict((ne.name, ne) for ne in plan.exprs)["b"]
    assert b.dtype == DataType(pa.int8())
    assert out.schema.names == ("a", "i8", "x", "s", "d", "m", "b")
    validate(plan)


def test_dtypes_follow_polars(frame: pl.DataFrame) -> None:
    f = ir.from_polars(frame)
    exprs = {
        "div": ir.col("a") / 2,
        "fdiv": ir.col("i8") // 2,
        "big": ir.col("i8") * 1000,
        "dec": ir.col("m") + 1,
        "decf": ir.col("m") * 1.5,
        "date": ir.col("d") + datetime.timedelta(days=1),
        "cmp": ir.col("d") < datetime.date(2024, 1, 3),
        "when": ir.when(ir.col("a") > 1).then(ir.col("i8")).otherwise(0),
        "cast": ir.col("a").cast(pl.Float32),
        "year": ir.col("d").dt.year(),
        "upper": ir.col("s").str.to_uppercase(),
        "isin": ir.col("a").is_in([1, 4]),
        "nulls": ir.col("a").fill_null(0),
    }
    polars_exprs = {
        "div": pl.col("a") / 2,
        "fdiv": pl.col("i8") // 2,
        "big": pl.col("i8") * 1000,
        "dec": pl.col("m") + 1,
        "decf": pl.col("m") * 1.5,
        "date": pl.col("d") + datetime.timedelta(days=1),
        "cmp": pl.col("d") < datetime.date(2024, 1, 3),
        "when": pl.when(pl.col("a") > 1).then(pl.col("i8")).otherwise(0),
        "cast": pl.col("a").cast(pl.Float32),
        "year": pl.col("d").dt.year(),
        "upper": pl.col("s").str.to_uppercase(),
        "isin": pl.col("a").is_in([1, 4]),
        "nulls": pl.col("a").fill_null(0),
    }
    got = f.select(**exprs)
    expected = frame.lazy().select(**polars_exprs).collect()
    assert got.schema == Schema.from_polars(expected.schema)
    assert_same(run(got.plan), expected)


def test_aggregate_join_sort_slice_match_polars(frame: pl.DataFrame) -> None:
    f = ir.from_polars(frame)
    other = pl.DataFrame({"s": ["a", "b", "c"], "w": [10, 20, 30]})
    q = (
        f.join(ir.from_polars(other), on="s", how="left")
        .group_by("s")
        .agg(ir.col("a").sum(), ir.col("x").mean().alias("mx"), ir.len(), w=ir.col("w").max())
        .sort("s", nulls_last=True)
        .limit(2)
    )
    expected = (
        frame.lazy()
        .join(other.lazy(), on="s", how="left")
        .group_by("s")
        .agg(pl.col("a").sum(), pl.col("x").mean().alias("mx"), pl.len(), w=pl.col("w").max())
        .sort("s", nulls_last=True)
        .limit(2)
        .collect()
    )
    assert isinstance(q.plan, Slice) and isinstance(q.plan.input, Sort)
    assert isinstance(q.plan.input.input, Aggregate)
    assert isinstance(q.plan.input.input.input, Join)
    got = run(q.plan)
    assert_frame_equal(got, expected)


def test_select_of_aggregates_is_a_global_aggregate(frame: pl.DataFrame) -> None:
    q = ir.from_polars(frame).select(ir.col("a").sum(), n=ir.len())
    assert isinstance(q.plan, Aggregate) and q.plan.keys == ()
    assert q.plan.aggs[1] == NamedExpr("n", Agg("len", None, q.schema["n"]))
    assert run(q.plan).to_dicts() == [{"a": 9, "n": 5}]


def test_unique_union_rename_drop(frame: pl.DataFrame) -> None:
    f = ir.from_polars(frame).select("s", "a")
    q = f.union(f).unique().rename({"s": "t"}).drop("a")
    expected = pl.concat([frame.select("s", "a")] * 2).unique().rename({"s": "t"}).drop("a")
    assert_same(run(q.plan), expected)


def test_scan_parquet(tmp_path: Path, frame: pl.DataFrame) -> None:
    for i in range(3):
        frame.with_columns(i=pl.lit(i)).write_parquet(tmp_path / f"part-{i}.parquet")
    q = ir.scan_parquet(tmp_path).filter(ir.col("i") > 0)
    scan = q.plan.input  # type: ignore[attr-defined]
    assert isinstance(scan, Scan)
    assert [Path(p).name for p in scan.source.paths] == [f"part-{i}.parquet" for i in range(3)]
    assert scan.schema == Schema.from_polars(frame.with_columns(i=pl.lit(0)).schema)
    assert run(q.plan).height == 10
    cols = ir.scan_parquet(str(tmp_path / "part-*.parquet"), columns=["a", "s"])
    assert cols.schema.names == ("a", "s")
    validate(cols.plan, check_sources=True)


def test_scan_parquet_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        ir.scan_parquet(missing)
    with pytest.raises(FileNotFoundError, match=r"\*\.parquet"):
        ir.scan_parquet(str(tmp_path / "*.parquet"))
    pq.write_table(pa.table({"a": [1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"a": ["x"]}), tmp_path / "b.parquet")
    with pytest.raises(PlanError, match=r"b\.parquet.*a: String"):
        ir.scan_parquet(tmp_path)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (
            lambda f: f.filter(ir.col("nope") > 1),
            r"Filter: column 'nope' is not in the input schema",
        ),
        (
            lambda f: f.filter(ir.col("a")),
            r"Filter: predicate col\('a'\) has dtype Int64, not Boolean",
        ),
        (
            lambda f: f.with_columns(ir.col("s") + ir.col("d")),
            r"Project \(with_columns\): .*not allowed on str and date.*d: Date, s: String",
        ),
        (lambda f: f.select(ir.col("d") + "x"), r"Project \(select\): .*d: Date"),
        (
            lambda f: f.join(f.select(ir.col("a").cast(pl.Int32)), on="a"),
            r"Join \(inner\): key 0 has different types: left col\('a'\) is Int64, right .* Int32",
        ),
        (
            lambda f: f.join(f, left_on="a", right_on="zz"),
            r"Join \(inner\), right key: column 'zz'",
        ),
        (
            lambda f: f.group_by("s").agg(ir.col("a")),
            r"Aggregate: aggregation 'a' .* reads column 'a' outside",
        ),
        (lambda f: f.group_by("nope").agg(ir.len()), r"Aggregate: column 'nope'"),
        (
            lambda f: f.sort("a", descending=[True, False]),
            r"Sort: 2 descending flags for 1 sort keys",
        ),
        (lambda f: f.sort(ir.col("q")), r"Sort: column 'q'"),
        (lambda f: f.select(ir.col("a").fn("no_such_function")), r"function 'no_such_function'"),
        (lambda f: f.select(ir.col("a"), ir.col("a")), r"column name 'a' appears more than once"),
        (lambda f: f.slice(-1), r"Slice: offset must be an int >= 0"),
        (
            lambda f: f.select(ir.when(ir.col("a")).then(1).otherwise(2)),
            r"when\(\) predicate col\('a'\) has dtype Int64",
        ),
    ],
)
def test_bad_plans_raise_plan_error(
    frame: pl.DataFrame, build: Callable[[ir.Frame], Any], match: str
) -> None:
    with pytest.raises(PlanError, match=match):
        build(ir.from_polars(frame))


def test_expression_builders_are_not_booleans() -> None:
    with pytest.raises(TypeError, match="no truth value"):
        bool(ir.col("a") == 1)
    with pytest.raises(TypeError):
        hash(ir.col("a"))


# ---------------------------------------------------------------- validate


def _scan(**cols: pl.DataType) -> Scan:
    table = pl.DataFrame(schema=cols).to_arrow()
    return Scan(ir.InMemorySource(table), Schema.from_arrow(table.schema))


def test_validate_names_node_path_and_column() -> None:
    scan = _scan(a=pl.Int64, s=pl.String)
    bad_col = Filter(scan, BinaryOp("gt", Col("b", INT64), Lit(1, INT64), BOOL), scan.schema)
    with pytest.raises(
        PlanError,
        match=r"Filter at \$\.plan: column 'b' \(at \$\.plan\.predicate\.left\) is not in",
    ):
        validate(bad_col)
    wrong_dtype = Project(
        Sort(scan, (Col("a", INT64),), (False,), (False,), False, scan.schema),
        (NamedExpr("a", Col("a", DataType(pa.int32()))),),
        Schema.of([("a", DataType(pa.int32()))]),
    )
    with pytest.raises(
        PlanError,
        match=r"Project at \$\.plan: column 'a' \(at \$\.plan\.exprs\[0\]\.expr\) claims dtype Int32 but the input has Int64",
    ):
        validate(wrong_dtype)
    deep = Slice(Slice(bad_col, 0, 1, scan.schema), 0, 1, scan.schema)
    with pytest.raises(PlanError, match=r"Filter at \$\.plan\.input\.input:"):
        validate(deep)


def test_validate_types_and_schemas() -> None:
    scan = _scan(a=pl.Int64, s=pl.String)
    wrong_sum = BinaryOp("add", Col("a", INT64), Lit(1, INT64), BOOL)
    with pytest.raises(PlanError, match=r"claims dtype Boolean but Polars gives Int64"):
        validate(Project(scan, (NamedExpr("x", wrong_sum),), Schema.of([("x", BOOL)])))
    not_bool = Filter(scan, Col("a", INT64), scan.schema)
    with pytest.raises(
        PlanError, match=r"Filter at \$\.plan: predicate col\('a'\) .* has dtype Int64, not Boolean"
    ):
        validate(not_bool)
    bad_schema = Project(scan, (NamedExpr("a", Col("a", INT64)),), Schema.of([("b", INT64)]))
    with pytest.raises(PlanError, match=r"schema column 'b' .* is not produced"):
        validate(bad_schema)
    unknown_fn = Project(
        scan,
        (NamedExpr("a", Function("frobnicate", (Col("a", INT64),), (), INT64)),),
        Schema.of([("a", INT64)]),
    )
    with pytest.raises(PlanError, match=r"function 'frobnicate' .* not in the IR's function table"):
        validate(unknown_fn)
    other = _scan(a=pl.Int32)
    join = Join(
        scan,
        other,
        (Col("a", INT64),),
        (Col("a", DataType(pa.int32())),),
        "inner",
        "_r",
        False,
        True,
        scan.schema,
    )
    with pytest.raises(
        PlanError,
        match=r"Join at \$\.plan: join key 0 has different types: left col\('a'\) .* is Int64, right .* is Int32",
    ):
        validate(join)
    stale = Scan(scan.source, Schema.of([("a", DataType(pa.int32()))]))
    with pytest.raises(
        PlanError,
        match=r"Scan at \$\.plan: column 'a' .* is Int32 in the plan but Int64 in the in-memory table",
    ):
        validate(stale)


def test_validate_accepts_builder_plans_and_irplans() -> None:
    from tests.irplans import agg_sort_plan
    from tests.irplans import frame as irframe

    plan, _ = agg_sort_plan(irframe())
    validate(plan)


@PROPERTY
@given(st.data())
def test_random_builder_plans_validate_and_match_polars(data: st.DataObject) -> None:
    frame, lf, _ = random_plan(data.draw)
    validate(frame.plan)
    expected = lf.collect()
    assert frame.schema == Schema.from_polars(expected.schema)
    assert_same(run(frame.plan), expected)


# ---------------------------------------------------------------- frontends' IR


def test_tpch_ir_validates(tpch_dir: Path) -> None:
    """Every TPC-H query's IR from the Polars adapter passes validation."""
    from shoal.tpch.queries import QUERIES, scan_tables
    from shoal_polars import to_ir

    tables = scan_tables(tpch_dir)
    for query in QUERIES.values():
        validate(to_ir(query(tables)), check_sources=True)


def test_docs_worked_example_runs() -> None:
    """The small frontend of docs/ir.md runs as written."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "ir.md").read_text()
    block = text.split("<!-- example: frontend -->\n```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(block, "docs/ir.md", "exec"), namespace)
    result = namespace["result"]
    got = pl.from_arrow(result).sort("region", nulls_last=True)  # type: ignore[union-attr]
    assert got.to_dict(as_series=False) == {
        "region": ["east", "north", "south", None],
        "total": [7.25, 0.0, 20.5, 3.0],
        "orders": [1, 1, 1, 1],
    }
