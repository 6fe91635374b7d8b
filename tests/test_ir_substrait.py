"""Substrait exchange (shoal.plan.substrait): round trips, foreign plans, unsupported parts."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import hypothesis.strategies as st
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given

pytest.importorskip("substrait")

from substrait import algebra_pb2 as stalg  # noqa: E402
from substrait import plan_pb2 as stp  # noqa: E402
from substrait import type_pb2 as stt  # noqa: E402
from substrait.extensions import extensions_pb2 as ste  # noqa: E402

from shoal import ir  # noqa: E402
from shoal.errors import PlanError, UnsupportedError  # noqa: E402
from shoal.ir.nodes import Aggregate, PlanNode, Project  # noqa: E402
from shoal.plan.substrait import (  # noqa: E402
    ARITHMETIC,
    SHOAL_AGGREGATES,
    SHOAL_FUNCTIONS,
    from_substrait,
    to_substrait,
)
from tests.test_ir_builder import PROPERTY, assert_same, random_plan, run  # noqa: E402


def _tables(plan: PlanNode) -> dict[str, pa.Table]:
    out: dict[str, pa.Table] = {}
    for n in plan.walk():
        src = getattr(n, "source", None)
        if isinstance(src, ir.InMemorySource) and all(t is not src.table for t in out.values()):
            out[f"t{len(out)}"] = src.table
    return out


def roundtrip(plan: PlanNode) -> PlanNode:
    tables = _tables(plan)
    data = to_substrait(plan, tables=tables).SerializeToString()
    back = from_substrait(data, tables=tables)
    assert to_substrait(back, tables=tables).SerializeToString() == data  # a fixpoint
    return back


def _same_ir(a: PlanNode, b: PlanNode) -> bool:
    """Equal plans; a plan with a NaN literal (never equal to itself) is compared through
    its JSON instead."""
    tables = _tables(a)
    text = ir.to_json(a, tables=tables)
    if '"$float": "nan"' in text:
        return text == ir.to_json(b, tables=tables)
    return a == b


@pytest.fixture
def frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "k": [1, 2, None, 2, 1],
            "i8": pl.Series([1, 2, 3, 4, 5], dtype=pl.Int8),
            "x": [1.5, None, float("nan"), 2.0, -1.0],
            "s": ["a", "b", "a", None, "b"],
            "d": [datetime.date(2024, 1, i) for i in range(1, 6)],
            "t": [datetime.datetime(2024, 1, 1, 12, i) for i in range(5)],
            "m": pl.Series([decimal.Decimal("1.10")] * 4 + [None], dtype=pl.Decimal(10, 2)),
        }
    )


def test_plan_round_trips_exactly(frame: pl.DataFrame) -> None:
    f = ir.from_polars(frame)
    other = ir.from_polars(pl.DataFrame({"k": [1, 2, 2], "w": [10, 20, 30]}))
    q = (
        f.filter(
            (ir.col("k") > 1) | ir.col("s").is_null(),
            ir.col("d") < datetime.date(2024, 1, 5),
            ir.col("t") >= datetime.datetime(2024, 1, 1, 12, 1),
        )
        .with_columns(
            a=ir.col("i8") + 1,
            b=ir.col("k") / ir.col("i8"),
            c=ir.col("k") // 2,
            e=ir.col("m") * 2,
            u=ir.col("s").str.to_uppercase(),
            w=ir.when(ir.col("x") > 0.0).then(ir.col("x")).otherwise(None),
            z=ir.col("k").is_in([1, 2]),
            dec=ir.lit(decimal.Decimal("-1.25")),
            cast=ir.col("i8").cast(pl.Float32, strict=False),
        )
        .join(other, on="k", how="left")
        .group_by("s", "d")
        .agg(
            ir.col("k").sum(),
            ir.col("x").mean(),
            ir.col("m").mean().alias("mm"),
            ir.col("w").max(),
            ir.col("s").count().alias("cnt"),
            ir.col("u").min(),
            ir.col("b").std(),
            ir.len(),
        )
        .filter(ir.col("len") > 1)
        .sort("s", "d", descending=[True, False], nulls_last=True)
        .slice(1, 5)
    )
    back = roundtrip(q.plan)
    assert back == q.plan
    assert_same(run(back), run(q.plan))


def test_shoal_extensions_and_standard_functions(frame: pl.DataFrame) -> None:
    q = ir.from_polars(frame).select(
        (ir.col("k") + ir.col("i8")).alias("std"), (ir.col("k") // 2).alias("ext")
    )
    plan = to_substrait(q.plan, tables=_tables(q.plan))
    urns = {u.urn for u in plan.extension_urns}
    names = {d.extension_function.name for d in plan.extensions}
    assert ARITHMETIC in urns and "add:i64_i64" in names
    assert "extension:dev.shoal:binary_operators" in urns and "floordiv:i64_i64" in names
    # The Int8 column is cast to Int64 explicitly, as an implicit (unspecified) cast.
    add = plan.relations[0].root.input.project.expressions[0].scalar_function
    assert add.arguments[1].value.cast.failure_behavior == 0
    assert roundtrip(q.plan) == q.plan


def test_compound_aggregations_become_aggregate_and_project(frame: pl.DataFrame) -> None:
    q = ir.from_polars(frame).group_by("s").agg(r=ir.col("k").sum() / ir.col("k").count())
    back = roundtrip(q.plan)
    assert isinstance(back, Project) and isinstance(back.input, Aggregate)
    assert_same(run(back), run(q.plan))


def test_parquet_reads_and_unions(tmp_path: Path, frame: pl.DataFrame) -> None:
    frame.write_parquet(tmp_path / "a.parquet")
    f = ir.scan_parquet(tmp_path / "a.parquet")
    q = f.union(f.filter(ir.col("k") == 1)).select("k", "s")
    plan = to_substrait(q.plan)
    read = plan.relations[0].root.input.project.input.set.inputs[0].read
    assert read.local_files.items[0].uri_file == f"file://{tmp_path / 'a.parquet'}"
    assert roundtrip(q.plan) == q.plan


def test_in_memory_tables_need_names(frame: pl.DataFrame) -> None:
    f = ir.from_polars(frame)
    with pytest.raises(PlanError, match=r"in-memory table \(5 rows\) has no name"):
        to_substrait(f.plan)
    data = to_substrait(f.plan, tables={"frame": f.plan.source.table}).SerializeToString()  # type: ignore[attr-defined]
    with pytest.raises(PlanError, match=r"named table 'frame' is not bound"):
        from_substrait(data)


def test_unsupported_nodes_are_named(frame: pl.DataFrame) -> None:
    f = ir.from_polars(frame)
    tables = _tables(f.plan)
    with pytest.raises(UnsupportedError, match=r"plan node Distinct has no Substrait relation"):
        to_substrait(f.unique().plan, tables=tables)
    with pytest.raises(UnsupportedError, match=r"a coalescing full join"):
        to_substrait(f.join(f, on="k", how="full", coalesce=True).plan, tables=tables)
    with pytest.raises(UnsupportedError, match=r"dtype Null has no Substrait type"):
        to_substrait(f.select(ir.lit(None)).plan, tables=tables)


# ---------------------------------------------------------------- foreign plans


def _foreign_plan(measure: str, output: stt.Type, rel_extra: str = "aggregate") -> stp.Plan:
    """``SELECT g, <measure>(v) FROM t GROUP BY g`` as another producer would write it:
    standard URNs, SQL names, an i64 count."""
    i64 = stt.Type(i64=stt.Type.I64(nullability=stt.Type.NULLABILITY_NULLABLE))
    string = stt.Type(string=stt.Type.String(nullability=stt.Type.NULLABILITY_NULLABLE))
    read = stalg.ReadRel(
        base_schema=stt.NamedStruct(names=["g", "v"], struct=stt.Type.Struct(types=[string, i64])),
        named_table=stalg.ReadRel.NamedTable(names=["t"]),
    )

    def field(i: int) -> stalg.Expression:
        E = stalg.Expression
        return E(
            selection=E.FieldReference(
                direct_reference=E.ReferenceSegment(
                    struct_field=E.ReferenceSegment.StructField(field=i)
                ),
                root_reference=E.FieldReference.RootReference(),
            )
        )

    urn = "extension:io.substrait:functions_arithmetic"
    if measure == "count":
        urn = "extension:io.substrait:functions_aggregate_generic"
    agg = stalg.AggregateRel(
        input=stalg.Rel(read=read),
        grouping_expressions=[field(0)],
        groupings=[stalg.AggregateRel.Grouping(expression_references=[0])],
        measures=[
            stalg.AggregateRel.Measure(
                measure=stalg.AggregateFunction(
                    function_reference=1,
                    arguments=[stalg.FunctionArgument(value=field(1))],
                    output_type=output,
                )
            )
        ],
    )
    return stp.Plan(
        extension_urns=[ste.SimpleExtensionURN(extension_urn_anchor=1, urn=urn)],
        extensions=[
            ste.SimpleExtensionDeclaration(
                extension_function=ste.SimpleExtensionDeclaration.ExtensionFunction(
                    extension_urn_reference=1, function_anchor=1, name=f"{measure}:i64"
                )
            )
        ],
        relations=[
            stp.PlanRel(root=stalg.RelRoot(input=stalg.Rel(aggregate=agg), names=["g", "m"]))
        ],
    )


def test_foreign_sum_keeps_sql_semantics() -> None:
    table = pa.table({"g": ["a", "a", "b"], "v": pa.array([1, 2, None], pa.int64())})
    i64 = stt.Type(i64=stt.Type.I64(nullability=stt.Type.NULLABILITY_NULLABLE))
    plan = from_substrait(_foreign_plan("sum", i64), tables={"t": table})
    got = run(plan).sort("g")
    # SQL: the sum of no values is null (Polars' would be 0).
    assert got.to_dict(as_series=False) == {"g": ["a", "b"], "m": [3, None]}
    counted = from_substrait(_foreign_plan("count", i64), tables={"t": table})
    got = run(counted).sort("g")
    assert got.schema["m"] == pl.Int64  # declared i64; Polars counts in UInt32, then a cast
    assert got.to_dict(as_series=False) == {"g": ["a", "b"], "m": [2, 0]}


def test_foreign_unknown_function_is_named() -> None:
    i64 = stt.Type(i64=stt.Type.I64(nullability=stt.Type.NULLABILITY_NULLABLE))
    with pytest.raises(UnsupportedError, match=r"aggregate function 'product'"):
        from_substrait(
            _foreign_plan("product", i64), tables={"t": pa.table({"g": ["a"], "v": [1]})}
        )


def test_unknown_relation_is_named() -> None:
    plan = stp.Plan(
        relations=[stp.PlanRel(root=stalg.RelRoot(input=stalg.Rel(exchange=stalg.ExchangeRel())))]
    )
    with pytest.raises(UnsupportedError, match=r"relation exchange is not supported"):
        from_substrait(plan)
    with pytest.raises(PlanError, match=r"not a serialised Substrait plan"):
        from_substrait(b"\xff\xff\xff")


def test_extension_urns_are_shoal_owned() -> None:
    assert SHOAL_FUNCTIONS.startswith("extension:dev.shoal:")
    assert SHOAL_AGGREGATES.startswith("extension:dev.shoal:")


# ---------------------------------------------------------------- property test


@PROPERTY
@given(st.data())
def test_random_plans_round_trip_through_substrait(data: st.DataObject) -> None:
    """Random builder plans survive IR -> Substrait bytes -> IR unchanged and run to the
    same result as before and as Polars."""
    frame, lf, _ = random_plan(data.draw)
    back = roundtrip(frame.plan)
    assert _same_ir(back, frame.plan)
    expected = lf.collect()
    assert_same(run(back), expected)
