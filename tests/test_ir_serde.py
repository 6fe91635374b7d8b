"""The JSON form of the IR (shoal.ir.serde): round trips, the schema file, errors."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import inspect
import json
import math
import typing
from pathlib import Path
from typing import Any, Literal

import hypothesis.strategies as st
import jsonschema
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given

from shoal import ir
from shoal.errors import PlanError
from shoal.ir import expr as expr_module
from shoal.ir import nodes as nodes_module
from shoal.ir import serde
from shoal.ir.expr import BinaryOp, Col, Expr, Function, Lit, NamedExpr
from shoal.ir.nodes import Filter, ParquetSource, PlanNode, Project, Scan, StorageOptions
from shoal.ir.types import BOOL, INT64, DataType, Schema
from tests.test_ir_builder import PROPERTY, assert_same, random_plan, run

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_VALIDATOR = jsonschema.Draft202012Validator(serde.json_schema())
SCHEMA_FILE = ROOT / "docs" / "ir-schema.json"


def roundtrip(plan: PlanNode, tables: dict[str, pa.Table] | None = None) -> PlanNode:
    text = ir.to_json(plan, tables=tables)
    back = ir.from_json(text, tables=tables)
    assert ir.to_json(back, tables=tables) == text  # a fixpoint, NaN literals included
    return back


def _has_nan(plan: PlanNode) -> bool:
    text = ir.to_json(plan, tables=_all_tables(plan))
    return '"$float": "nan"' in text


def _all_tables(plan: PlanNode) -> dict[str, pa.Table]:
    out = {}
    for n in plan.walk():
        if isinstance(n, Scan) and isinstance(n.source, ir.InMemorySource):
            out[f"t{len(out)}"] = n.source.table
    return out


# ---------------------------------------------------------------- coverage of IR classes


def _module_classes(module: Any, base: type) -> list[type]:
    return [
        c
        for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == module.__name__
        and dataclasses.is_dataclass(c)
        and (issubclass(c, base) or c in typing.get_args(nodes_module.Source) or c is NamedExpr)
    ]


IR_CLASSES = _module_classes(nodes_module, PlanNode) + _module_classes(expr_module, Expr)


def test_every_ir_class_is_registered_and_serialisable() -> None:
    """Fails when a class added to nodes.py or expr.py is not registered, or has a field
    whose type the JSON form cannot carry: extend shoal.ir.serde, then regenerate
    docs/ir-schema.json."""
    reg = serde.registry()
    missing = [c.__name__ for c in IR_CLASSES if reg.get(c.__name__) is not c]
    assert not missing, f"IR classes not registered for JSON: {missing}"
    assert serde.unsupported_fields() == []
    defs = serde.json_schema()["$defs"]
    assert not [c.__name__ for c in IR_CLASSES if c.__name__ not in defs]


_SAMPLE_SCHEMA = Schema.of([("a", INT64), ("s", DataType(pa.large_string()))])
_SAMPLE_TABLE = pa.table({"a": pa.array([1], pa.int64()), "s": ["x"]})


def _sample(hint: Any, depth: int = 0) -> Any:
    """A value of the field type ``hint`` (for building one instance of every class)."""
    inner, optional = serde._strip_optional(hint)
    if optional and depth > 2:
        return None
    if inner is Any:
        return 1
    if inner is str:
        return "a"
    if inner is int:
        return 1
    if inner is bool:
        return True
    if inner is float:
        return 0.5
    if inner is DataType:
        return INT64
    if inner is Schema:
        return _SAMPLE_SCHEMA
    if inner is pa.Table:
        return _SAMPLE_TABLE
    if inner is StorageOptions:
        return StorageOptions({"aws_region": "eu-west-1"})  # no credential: round-trips
    if inner is PlanNode:
        return Scan(ParquetSource(("/x.parquet",)), _SAMPLE_SCHEMA)
    if inner is Expr:
        return Col("a", INT64)
    origin = typing.get_origin(inner)
    if origin is Literal:
        return typing.get_args(inner)[0]
    if origin is tuple:
        args = typing.get_args(inner)
        if len(args) == 2 and args[1] is Ellipsis:
            return (_sample(args[0], depth + 1),)
        return tuple(_sample(a, depth + 1) for a in args)
    union = serde._union_classes(inner)
    if union:
        return _instance(union[0], depth + 1)
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        return _instance(inner, depth + 1)
    raise AssertionError(f"no sample for {hint}")


def _instance(cls: type, depth: int = 0) -> Any:
    hints = serde._hints(cls)
    return cls(**{f.name: _sample(hints[f.name], depth) for f in dataclasses.fields(cls) if f.init})


@pytest.mark.parametrize("cls", IR_CLASSES, ids=lambda c: c.__name__)
def test_every_ir_class_round_trips(cls: type) -> None:
    obj = _instance(cls)
    enc = serde._Encoder({"t": _SAMPLE_TABLE}, set())
    j = enc.value(obj, cls, "$.x")
    back = serde._Decoder({"t": _SAMPLE_TABLE}).value(json.loads(json.dumps(j)), cls, "$.x")
    assert back == obj
    assert type(back) is cls


def test_schema_file_is_generated() -> None:
    """docs/ir-schema.json is what json_schema() generates (regenerate with
    ``python -m shoal.ir.serde > docs/ir-schema.json``)."""
    assert json.loads(SCHEMA_FILE.read_text()) == serde.json_schema()
    assert SCHEMA_FILE.read_text() == serde.json_schema_text()


# ---------------------------------------------------------------- values and dtypes


@pytest.mark.parametrize(
    "dtype",
    [
        pa.null(),
        pa.bool_(),
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.uint8(),
        pa.uint16(),
        pa.uint32(),
        pa.uint64(),
        pa.float16(),
        pa.float32(),
        pa.float64(),
        pa.large_string(),
        pa.large_binary(),
        pa.date32(),
        pa.date64(),
        pa.time32("ms"),
        pa.time64("us"),
        pa.time64("ns"),
        pa.timestamp("us"),
        pa.timestamp("ns", "UTC"),
        pa.timestamp("ms", "Europe/Paris"),
        pa.timestamp("s", "+05:30"),
        pa.duration("ms"),
        pa.decimal128(15, 2),
        pa.decimal128(38, 0),
        pa.decimal256(50, 10),
        pa.binary(4),
        pa.large_list(pa.int64()),
        pa.list_(pa.float64(), 3),
        pa.struct([("a", pa.int64()), ("b, c", pa.large_list(pa.large_string()))]),
        pa.dictionary(pa.uint32(), pa.large_string()),
    ],
    ids=str,
)
def test_dtypes_round_trip(dtype: pa.DataType) -> None:
    t = DataType(dtype)
    j = serde.dtype_to_json(t)
    assert serde.dtype_from_json(json.loads(json.dumps(j))) == t


@pytest.mark.parametrize("dtype", [pl.Int128, pl.UInt128])
def test_128_bit_integers_round_trip(dtype: type[pl.DataType]) -> None:
    """Polars' 128-bit integers travel as decimal128(38, 0) and stay themselves in JSON."""
    t = DataType.from_polars(dtype)
    back = serde.dtype_from_json(json.loads(json.dumps(serde.dtype_to_json(t))))
    assert back == t and back != DataType(pa.decimal128(38, 0))
    assert back.to_polars() == dtype


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -(2**63),
        2**64,
        1.5,
        -0.0,
        1e300,
        float("inf"),
        float("-inf"),
        "text",
        "",
        decimal.Decimal("1.50"),
        decimal.Decimal("-1E+5"),
        datetime.date(2024, 2, 29),
        datetime.datetime(2024, 1, 2, 3, 4, 5, 678901),
        datetime.datetime(2024, 1, 2, 3, 4, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
        datetime.time(12, 30, 0, 5),
        datetime.timedelta(days=-1, microseconds=3),
        b"\x00\xff",
        [1, None, 2],
        [],
        (1, "a"),
        {"a": 1},
        INT64,
    ],
    ids=repr,
)
def test_values_round_trip(value: Any) -> None:
    j = json.loads(json.dumps(serde.value_to_json(value), allow_nan=False))
    back = serde.value_from_json(j)
    assert back == value and type(back) is type(value)
    if isinstance(value, float):
        assert math.copysign(1, back) == math.copysign(1, value)


def test_nan_literal_round_trips() -> None:
    back = serde.value_from_json(json.loads(json.dumps(serde.value_to_json(float("nan")))))
    assert isinstance(back, float) and math.isnan(back)


# ---------------------------------------------------------------- plans


def test_document_shape_and_schema(tmp_path: Path) -> None:
    df = pl.DataFrame({"a": [1, 2, 3], "d": [datetime.date(2024, 1, i) for i in (1, 2, 3)]})
    df.write_parquet(tmp_path / "t.parquet")
    f = ir.scan_parquet(tmp_path / "t.parquet")
    plan = (
        f.filter(ir.col("d") >= datetime.date(2024, 1, 2))
        .with_columns(m=ir.lit(decimal.Decimal("1.25")), x=ir.col("a") / 2)
        .group_by("d")
        .agg(ir.col("a").sum(), ir.col("x").mean(), ir.len())
        .sort("d", descending=True)
        .limit(5)
        .plan
    )
    doc = json.loads(ir.to_json(plan))
    assert doc["shoal_ir_version"] == ir.IR_VERSION == 1
    assert doc["plan"]["kind"] == "Slice"
    SCHEMA_VALIDATOR.validate(doc)
    back = roundtrip(plan)
    assert back == plan
    assert run(back).equals(run(plan))


def test_shared_subplans_stay_shared() -> None:
    base = ir.from_polars(pl.DataFrame({"k": [1, 2, 2], "v": [1, 2, 3]})).filter(ir.col("v") > 0)
    joined = base.join(base.group_by("k").agg(ir.col("v").sum().alias("s")), on="k")
    tables = _all_tables(joined.plan)
    doc = json.loads(ir.to_json(joined.plan, tables=tables))
    assert doc["plan"]["right"]["input"] == {"@ref": 0} and doc["plan"]["left"]["@id"] == 0
    back = ir.from_json(json.dumps(doc), tables=tables)
    assert back == joined.plan
    assert back.right.input is back.left  # type: ignore[attr-defined]


def test_in_memory_tables_are_bound_by_name() -> None:
    table = pa.table({"a": [1, 2]})
    plan = ir.from_arrow(table).filter(ir.col("a") > 1).plan
    with pytest.raises(
        PlanError,
        match=r"\$\.plan\.input\.source\.table: an in-memory table \(2 rows\) cannot be serialised",
    ):
        ir.to_json(plan)
    text = ir.to_json(plan, tables={"numbers": table})
    assert json.loads(text)["plan"]["input"]["source"] == {
        "kind": "InMemorySource",
        "table": "numbers",
        "origin": "",
    }
    with pytest.raises(
        PlanError, match=r"\$\.plan\.input\.source\.table: in-memory table 'numbers' is not bound"
    ):
        ir.from_json(text)
    assert ir.from_json(text, tables={"numbers": table}) == plan


def test_callables_are_never_serialised() -> None:
    scan = Scan(ParquetSource(("/x.parquet",)), Schema.of([("a", INT64)]))
    plan = Project(
        scan,
        (NamedExpr("a", Function("abs", (Col("a", INT64),), (("fn", len),), INT64)),),
        scan.schema,
    )
    with pytest.raises(
        PlanError,
        match=r"\$\.plan\.exprs\[0\]\.expr\.options\[0\]\[1\]: cannot serialise the Python callable .*registered name",
    ):
        ir.to_json(plan)


def _doc() -> dict[str, Any]:
    scan = Scan(ParquetSource(("/x.parquet",)), Schema.of([("a", INT64)]))
    plan = Filter(scan, BinaryOp("gt", Col("a", INT64), Lit(1, INT64), BOOL), scan.schema)
    return json.loads(ir.to_json(plan))


def _set(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parts, last = path.split(".")
    obj: Any = doc
    for p in parts:
        obj = obj[int(p)] if p.isdigit() else obj[p]
    if value is KeyError:
        del obj[last]
    else:
        obj[int(last) if last.isdigit() else last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (
            "shoal_ir_version",
            2,
            r"\$\.shoal_ir_version: unsupported version 2; this shoal reads version 1",
        ),
        ("shoal_ir_version", KeyError, r"\$\.shoal_ir_version: missing"),
        ("shoal_ir_version", "1", r"\$\.shoal_ir_version: expected an integer"),
        ("extra", 1, r"\$: unknown key 'extra'"),
        ("plan", KeyError, r"\$\.plan: missing"),
        ("plan.kind", "Frobnicate", r"\$\.plan\.kind: unknown kind 'Frobnicate'"),
        ("plan.kind", "Col", r"\$\.plan\.kind: a Col is not a PlanNode"),
        (
            "plan.predicate.left.kind",
            "Filter",
            r"\$\.plan\.predicate\.left\.kind: a Filter is not a Expr",
        ),
        ("plan.predicate.left", 5, r"\$\.plan\.predicate\.left: expected an object, got 5"),
        (
            "plan.predicate.left.dtype",
            "int65",
            r"\$\.plan\.predicate\.left\.dtype: unknown dtype 'int65'",
        ),
        (
            "plan.predicate.left.name",
            KeyError,
            r"\$\.plan\.predicate\.left\.name: missing field of Col",
        ),
        (
            "plan.predicate.left.nmae",
            "a",
            r"\$\.plan\.predicate\.left: unknown field 'nmae' for Col",
        ),
        ("plan.predicate.op", 3, r"\$\.plan\.predicate\.op: expected str, got 3"),
        (
            "plan.predicate.right.value",
            {"$date": "2024-13-01"},
            r"\$\.plan\.predicate\.right\.value\.\$date: month must be in 1\.\.12",
        ),
        (
            "plan.predicate.right.value",
            {"$when": 1},
            r"\$\.plan\.predicate\.right\.value: unknown value tag '\$when'",
        ),
        (
            "plan.input.source.paths",
            "/x.parquet",
            r"\$\.plan\.input\.source\.paths: expected an array",
        ),
        (
            "plan.input.source.kind",
            "Scan",
            r"\$\.plan\.input\.source\.kind: a Scan is not a ParquetSource or InMemorySource",
        ),
        (
            "plan.input.schema.0.dtype",
            {"list": "nope"},
            r"\$\.plan\.input\.schema\[0\]\.dtype\.list: unknown dtype 'nope'",
        ),
        (
            "plan.schema",
            [{"name": "a", "dtype": "int64"}, {"name": "a", "dtype": "int64"}],
            r"\$\.plan\.schema: duplicate column name 'a'",
        ),
        ("plan.input", {"@ref": 3}, r"\$\.plan\.input\.@ref: no earlier node has '@id': 3"),
        # Well-formed but invalid plans: validation names the node, the path and the column.
        (
            "plan.predicate.left.name",
            "b",
            r"Filter at \$\.plan: column 'b' \(at \$\.plan\.predicate\.left\) is not in the input schema",
        ),
        (
            "plan.predicate.left.dtype",
            "int32",
            r"Filter at \$\.plan: column 'a' \(at \$\.plan\.predicate\.left\) claims dtype Int32 but the input has Int64",
        ),
        (
            "plan.predicate.op",
            "add",
            r"Filter at \$\.plan: .*claims dtype Boolean but Polars gives Int64",
        ),
    ],
)
def test_malformed_documents_name_the_json_path(path: str, value: Any, match: str) -> None:
    doc = _set(_doc(), path, value)
    with pytest.raises(PlanError, match=match):
        ir.from_json(json.dumps(doc))


def test_not_json() -> None:
    with pytest.raises(PlanError, match=r"\$: not valid JSON"):
        ir.from_json("{")
    with pytest.raises(PlanError, match=r"\$: expected a JSON object"):
        ir.from_json("[]")


# ---------------------------------------------------------------- property tests


@PROPERTY
@given(st.data())
def test_random_plans_round_trip_and_run_the_same(data: st.DataObject) -> None:
    """Random builder plans survive the JSON round trip unchanged and run to the same
    result before and after it, and to Polars' own result."""
    frame, lf, tables = random_plan(data.draw)
    plan = frame.plan
    back = roundtrip(plan, tables)
    if not _has_nan(plan):  # Lit(nan) != Lit(nan): float NaN is not equal to itself
        assert back == plan
    expected = lf.collect()
    before = run(plan)
    assert_same(before, expected)
    assert_same(run(back), before)
    SCHEMA_VALIDATOR.validate(json.loads(ir.to_json(plan, tables=tables)))


@PROPERTY
@given(st.data())
def test_random_plans_with_a_bad_column_raise(data: st.DataObject) -> None:
    """A reference to a missing column, anywhere in a random plan, raises PlanError naming
    the node and the column, from the builder and from the JSON reader."""
    frame, _, tables = random_plan(data.draw)
    with pytest.raises(PlanError, match=r"Filter: column 'no_such_col' is not in the input schema"):
        frame.filter(ir.col("no_such_col") > 1)
    # Rename one column reference in the JSON document: the reader's validation names it.
    doc = json.loads(ir.to_json(frame.plan, tables=tables))
    refs: list[dict[str, Any]] = []

    def find(obj: Any) -> None:
        if isinstance(obj, dict):
            if obj.get("kind") == "Col":
                refs.append(obj)
            for v in obj.values():
                find(v)
        elif isinstance(obj, list):
            for v in obj:
                find(v)

    find(doc)
    if not refs:
        return
    target = data.draw(st.sampled_from(refs))
    target["name"] = "no_such_col"
    with pytest.raises(
        PlanError,
        match=r"at \$\.plan[^:]*: column 'no_such_col' \(at \$\.plan[^)]*\) is not in the input schema",
    ):
        ir.from_json(json.dumps(doc), tables=tables)


def test_udfs_are_written_by_registered_name() -> None:
    udf_module = pytest.importorskip("shoal.udf")
    if not hasattr(udf_module, "project"):
        pytest.skip("shoal.udf has no project()")

    @udf_module.udf(return_dtype=pl.Int64, name="test_ir_serde_double")
    def double(s: pl.Series) -> pl.Series:
        return s * 2

    base = ir.from_polars(pl.DataFrame({"a": [1, 2, 3]}))
    plan = udf_module.project(base.plan, double, ["a"], "b")
    tables = _all_tables(plan)
    text = ir.to_json(plan, tables=tables)
    assert '{"$udf": "test_ir_serde_double"}' in text
    back = ir.from_json(text, tables=tables)
    assert back == plan and back.udf is udf_module.lookup("test_ir_serde_double")  # type: ignore[attr-defined]
    assert run(back).to_dict(as_series=False) == {"a": [1, 2, 3], "b": [2, 4, 6]}
    missing = text.replace("test_ir_serde_double", "no_such_udf")
    with pytest.raises(
        PlanError, match=r"\$\.plan\.udf\.\$udf: no UDF is registered under the name 'no_such_udf'"
    ):
        ir.from_json(missing, tables=tables)
