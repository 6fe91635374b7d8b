"""Translating and walking the IR cheaply, with the same answers: ``children`` of plan
nodes and expressions looks only at the fields whose annotation can hold a child
(:func:`shoal.ir.expr.child_fields`) and must find every child that a look at every field
finds (any field holding a node, or a non-empty tuple of nodes); ``DataType.from_polars``
answers dtypes without parameters by class; a literal lowers to the expression Polars
makes of it with its dtype, made without the dtype where that is the same."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.ir.expr import Expr
from shoal.ir.nodes import PlanNode
from shoal.ir.types import DataType
from shoal_polars.engine import to_ir


def _every_field_children(obj: Any, base: type) -> tuple[Any, ...]:
    out: list[Any] = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, base):
            out.append(v)
        elif isinstance(v, tuple) and v and all(isinstance(x, base) for x in v):
            out.extend(v)
    return tuple(out)


def _queries() -> list[pl.LazyFrame]:
    a = pl.LazyFrame(
        {"k": [1, 2, None, 2], "t": [1, 2, 3, 4], "x": [1.0, float("nan"), -0.0, None]}
    )
    b = pl.LazyFrame({"k": [2, 3, None], "t": [0, 2, 5], "s": ["a", None, "c"]})
    return [
        a.join(b, on="k", how="left").group_by("k").agg(pl.col("x").sum(), pl.len()),
        pl.concat([a.select("k"), b.select("k")]).unique().sort("k"),
        a.sort("t").join_asof(b.sort("t"), on="t", tolerance=2),
        a.with_columns(
            y=pl.when(pl.col("x") > 0).then(pl.col("x").cast(pl.Int64)).otherwise(None),
            r=pl.col("t").rank().over("k"),
        ).filter(pl.col("k").is_in([1, 2])),
        pl.concat([a.select("k"), b.select("s")], how="horizontal"),
        a.explode("k").unpivot(index="k").head(3),
    ]


def test_children_are_every_node_a_field_holds() -> None:
    for lf in _queries():
        plan = to_ir(lf)
        nodes = list(plan.walk())
        assert len(nodes) > 1
        for node in nodes:
            assert node.children() == _every_field_children(node, PlanNode), node.label
            for e in _exprs(node):
                for sub in e.walk():
                    assert sub.children() == _every_field_children(sub, Expr), sub


def _exprs(node: PlanNode) -> list[Expr]:
    out: list[Expr] = []
    for f in dataclasses.fields(node):  # type: ignore[arg-type]
        v = getattr(node, f.name)
        for x in v if isinstance(v, tuple) else (v,):
            x = getattr(x, "expr", x)
            if isinstance(x, Expr):
                out.append(x)
    return out


def test_udf_and_sink_nodes_keep_their_input() -> None:
    """Nodes with open fields (a user function, sink options) still have their input."""

    @shoal.udf(return_dtype=pl.Int64, name="twice_children")
    def twice(a: pl.Series) -> pl.Series:
        return a * 2

    plan = to_ir(pl.LazyFrame({"a": [1, 2]}).shoal.with_udf(twice, "a", "b"))
    for node in plan.walk():
        assert node.children() == _every_field_children(node, PlanNode), node.label
    assert any(type(n).__name__ == "UdfProject" for n in plan.walk())


def test_plain_dtypes_convert_as_every_dtype_does() -> None:
    """The per-class answers of ``DataType.from_polars`` (dtypes without parameters) are
    what the conversion itself gives, for a class and an instance alike; a parametric
    dtype still keeps its parameters."""
    from shoal.ir.types import _PLAIN, _from_polars

    for cls, got in _PLAIN.items():
        assert DataType.from_polars(cls) == DataType.from_polars(cls()) == _from_polars(cls())
        assert got.to_polars() == cls()
    for dt in (pl.Datetime("ns", "UTC"), pl.Datetime("us"), pl.Decimal(12, 3), pl.Duration("ms")):
        assert DataType.from_polars(dt).to_polars() == dt


@pytest.mark.parametrize(
    ("value", "dtype"),
    [
        ("abc", pl.String()),
        ("", pl.String()),
        ("lo", pl.Enum(["lo", "hi"])),
        ("a", pl.Categorical()),
        (True, pl.Boolean()),
        (False, pl.Boolean()),
        (Decimal("0.06"), pl.Decimal(38, 2)),
        (Decimal("24"), pl.Decimal(38, 0)),
        (Decimal("-1.2500"), pl.Decimal(38, 4)),
        (Decimal("0.060"), pl.Decimal(38, 2)),
        (Decimal("0.06"), pl.Decimal(15, 2)),
        (Decimal("1E+2"), pl.Decimal(38, 0)),
        (Decimal("12345678901234567890.123456789012345678"), pl.Decimal(38, 18)),
        (3, pl.Int32()),
        (0.5, pl.Float64()),
        (None, pl.String()),
        (["a", "b"], pl.List(pl.String())),
    ],
)
def test_literals_lower_to_the_literal_polars_makes_with_their_dtype(
    value: Any, dtype: Any
) -> None:
    """A literal lowers to exactly ``pl.lit(value, dtype=...)`` (the same serialised
    expression), where it is made without the dtype (a string, a bool, a decimal of its
    own scale) as where it is not."""
    from shoal.ir.expr import Lit
    from shoal.lowering.expressions import to_polars

    got = to_polars(Lit(value, DataType.from_polars(dtype)))
    want = pl.lit(value, dtype=dtype)
    assert got.meta.serialize(format="json") == want.meta.serialize(format="json")
    assert_frame_equal(pl.select(got), pl.select(want))


def test_column_types_are_the_types_of_the_rows_read() -> None:
    """A column reference takes its type from the schema of the node whose rows it reads
    (the translator no longer asks Polars per expression): a select that replaces ``a``
    by a cast of it and also reads ``a`` reads the Int64 column, as Polars runs it."""
    from shoal.ir.expr import Col

    lf = pl.LazyFrame({"a": [1, None, 3], "s": ["x", None, "y"]}).select(
        pl.col("a").cast(pl.Float64).alias("a"),
        (pl.col("a") + 1).alias("b"),
        pl.col("s").str.len_chars().alias("s"),
    )
    plan = to_ir(lf)
    cols = {
        (c.name, str(c.dtype))
        for node in plan.walk()
        for e in _exprs(node)
        for c in e.walk()
        if isinstance(c, Col)
    }
    assert cols == {("a", "Int64"), ("s", "String")}
    got = lf.collect(engine=shoal.DistEngine(runner="local", raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"))


def test_comparisons_are_boolean_and_arithmetic_keeps_its_operand_types() -> None:
    """Comparisons and arithmetic over columns and casts (whose operand types come from
    the schema read) give native Polars' answer: nulls, NaN, -0.0, lists, a comparison
    with a null literal."""
    from shoal.ir.expr import BinaryOp

    lf = pl.LazyFrame(
        {
            "a": [1, None, 3, 3],
            "x": [0.5, float("nan"), -0.0, None],
            "l": [[1], None, [2, 3], []],
            "i": pl.Series([1, 2, None, 4], dtype=pl.Int16),
        }
    ).select(
        (pl.col("a") > pl.col("x")).alias("gt"),
        (pl.col("a") == pl.lit(None, pl.Int64)).alias("eq_null"),
        pl.col("a").eq_missing(None).alias("eq_missing"),
        (pl.col("l") == pl.col("l")).alias("list_eq"),
        (pl.col("x") <= 0.0).alias("le"),
        (pl.col("a") * pl.col("i")).alias("mul"),
        (pl.col("i").cast(pl.Float32) / pl.col("a")).alias("div"),
        (pl.col("i") + 1).alias("add"),
    )
    plan = to_ir(lf)
    ops = [e for n in plan.walk() for x in _exprs(n) for e in x.walk() if isinstance(e, BinaryOp)]
    assert {str(e.dtype) for e in ops if e.op in ("gt", "eq", "le", "eq_missing")} == {"Boolean"}
    got = lf.collect(engine=shoal.DistEngine(runner="local", raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"))
