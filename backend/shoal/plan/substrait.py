"""Substrait exchange: :func:`to_substrait` (IR -> Substrait plan) and
:func:`from_substrait` (Substrait plan -> IR), with the protobuf classes of the
``substrait`` package.

What maps (docs/ir.md has the full table):

* Relations: ``Scan`` of Parquet files <-> ``ReadRel`` with ``local_files`` (Parquet);
  ``Scan`` of an in-memory table <-> ``ReadRel`` with a ``named_table`` (tables are bound
  by name, as in the JSON form); ``Filter`` <-> ``FilterRel``; ``Project`` <-> ``ProjectRel``
  with an emit; ``Aggregate`` <-> ``AggregateRel`` (plus a ``ProjectRel`` when an
  aggregation combines aggregates); inner/left/right/full/semi/anti ``Join`` on columns <->
  ``JoinRel`` (cross <-> ``CrossRel``); ``Sort`` <-> ``SortRel``; ``Slice`` <-> ``FetchRel``;
  ``Union`` <-> ``SetRel`` (UNION ALL). Other nodes raise :class:`shoal.UnsupportedError`.
* Expressions: columns, literals, casts, when/then/otherwise (``IfThen``); arithmetic,
  comparison and boolean operators and ``is_null``-style functions map to the standard
  extensions where their semantics are Polars' (with implicit casts made explicit);
  ``sum``/``mean``/``min``/``max``/``count``/``len`` map to ``sum0``/``avg``/``min``/``max``/
  ``count``. Every other IR function, operator and aggregate is written under shoal's own
  extension URNs (``extension:dev.shoal:*``) with its IR name and options, so a plan always
  round-trips; other consumers will not know those functions.
* Types: signed and unsigned integers (unsigned as the ``unsigned_integers`` extension
  types), floats, boolean, string, binary, date, timestamps (naive or UTC), durations,
  decimals and lists. Nullability is not tracked by the IR: every type is written nullable.

Names travel in ``RelCommon.hint.output_names`` and shoal-only details (sort stability,
``maintain_order``, a join's suffix) as an optimization extension (a
``google.protobuf.Struct`` under the key ``"shoal"``) that other consumers may ignore.
Importing a plan from another producer re-derives every dtype with Polars' rules and casts
where the plan declares another type; what has no IR equivalent raises
:class:`shoal.UnsupportedError` naming the relation, expression or function.
"""

from __future__ import annotations

import datetime
import decimal
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import polars as pl
import pyarrow as pa

try:
    from google.protobuf import any_pb2, struct_pb2
    from substrait import algebra_pb2 as stalg
    from substrait import plan_pb2 as stp
    from substrait import type_pb2 as stt
    from substrait.extensions import extensions_pb2 as ste
except ModuleNotFoundError as _missing:  # pragma: no cover - the extra is not installed
    raise ModuleNotFoundError(
        "shoal.plan.substrait needs the substrait package, an extra of shoal: "
        "pip install 'shoal[substrait]'",
        name=_missing.name,
    ) from _missing

from shoal.errors import PlanError, UnsupportedError
from shoal.ir.expr import (
    AGGREGATING_FUNCTIONS,
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
from shoal.ir.functions import FUNCTION_TABLE
from shoal.ir.nodes import (
    Aggregate,
    InMemorySource,
    Join,
    ParquetSource,
    PlanNode,
    Project,
    Scan,
    Slice,
    Sort,
    StageInput,
    Union,
)
from shoal.ir.nodes import Filter as FilterNode
from shoal.ir.serde import value_from_json, value_to_json
from shoal.ir.types import BOOL, NULL, DataType, Schema
from shoal.lowering.infer import empty_frame, infer_dtypes

ARITHMETIC = "extension:io.substrait:functions_arithmetic"
COMPARISON = "extension:io.substrait:functions_comparison"
BOOLEAN = "extension:io.substrait:functions_boolean"
AGGREGATE_GENERIC = "extension:io.substrait:functions_aggregate_generic"
UNSIGNED = "extension:io.substrait:unsigned_integers"
#: shoal's own extensions: IR operators, functions and aggregates by their IR names.
SHOAL_BINARY = "extension:dev.shoal:binary_operators"
SHOAL_FUNCTIONS = "extension:dev.shoal:functions"
SHOAL_AGGREGATES = "extension:dev.shoal:aggregates"

_N = stt.Type.NULLABILITY_NULLABLE
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_TZ = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_UNIT_PRECISION = {"s": 0, "ms": 3, "us": 6, "ns": 9}
_PRECISION_UNIT = {v: k for k, v in _UNIT_PRECISION.items()}

#: IR binary operators -> standard Substrait functions (same semantics as Polars).
_STD_BINARY: dict[str, tuple[str, str]] = {
    "add": (ARITHMETIC, "add"),
    "sub": (ARITHMETIC, "subtract"),
    "mul": (ARITHMETIC, "multiply"),
    "truediv": (ARITHMETIC, "divide"),
    "eq": (COMPARISON, "equal"),
    "ne": (COMPARISON, "not_equal"),
    "lt": (COMPARISON, "lt"),
    "le": (COMPARISON, "lte"),
    "gt": (COMPARISON, "gt"),
    "ge": (COMPARISON, "gte"),
    "eq_missing": (COMPARISON, "is_not_distinct_from"),
    "ne_missing": (COMPARISON, "is_distinct_from"),
    "and": (BOOLEAN, "and"),
    "or": (BOOLEAN, "or"),
    "xor": (BOOLEAN, "xor"),
}
#: IR scalar functions and aggregates -> standard Substrait functions: the ``substrait``
#: names of the IR's function table (:mod:`shoal.ir.functions`).
_STD_FUNCTIONS: dict[str, tuple[str, str]] = {
    name: (f"extension:io.substrait:{ext}", fn)
    for name, f in FUNCTION_TABLE.items()
    if f.node == "function" and f.substrait is not None
    for ext, fn in [f.substrait]
}
_STD_AGGS: dict[str, tuple[str, str]] = {
    name: (f"extension:io.substrait:{ext}", fn)
    for name, f in FUNCTION_TABLE.items()
    if f.node == "agg" and f.substrait is not None
    for ext, fn in [f.substrait]
}
_FROM_STD_BINARY = {name: op for op, (_, name) in _STD_BINARY.items()}
_FROM_STD_FUNCTIONS = {name: fn for fn, (_, name) in _STD_FUNCTIONS.items()}
#: Standard aggregates of one argument -> IR aggregates (``count`` is read on its own: with
#: no argument it is ``len``); SQL's ``sum`` (null for no values) is read as ``sum`` too.
_FROM_STD_AGGS = {name: agg for agg, (_, name) in _STD_AGGS.items() if name != "count"} | {
    "sum": "sum"
}

_JOIN_TYPES = {
    "inner": stalg.JoinRel.JOIN_TYPE_INNER,
    "left": stalg.JoinRel.JOIN_TYPE_LEFT,
    "right": stalg.JoinRel.JOIN_TYPE_RIGHT,
    "full": stalg.JoinRel.JOIN_TYPE_OUTER,
    "semi": stalg.JoinRel.JOIN_TYPE_LEFT_SEMI,
    "anti": stalg.JoinRel.JOIN_TYPE_LEFT_ANTI,
}
_FROM_JOIN_TYPES = {v: k for k, v in _JOIN_TYPES.items()}
_SORT = stalg.SortField


def _aggregating_function_error(e: Function) -> UnsupportedError:
    """The error for an IR function of ``AGGREGATING_FUNCTIONS`` (``corr``, ``entropy``,
    ``value_counts``, ``unique_counts``): shoal maps no Substrait function to them."""
    return UnsupportedError(
        f"Substrait export: aggregating function {e.name!r} ({e}) has no Substrait mapping in shoal"
    )


def substrait_version() -> tuple[int, int, int]:
    """The Substrait specification version of the installed protobuf definitions."""
    try:
        parts = version("substrait-protobuf").split(".")
        return int(parts[0]), int(parts[1]), int(parts[2].split("+")[0])
    except (PackageNotFoundError, ValueError, IndexError):  # pragma: no cover
        return (0, 0, 0)


# ---------------------------------------------------------------- small helpers


def _supertype(a: DataType, b: DataType) -> DataType | None:
    """Polars' supertype of ``a`` and ``b`` (None when there is none)."""
    if a == b:
        return a
    schema = Schema.of([("a", a), ("b", b)])
    try:
        got = empty_frame(schema).select(pl.coalesce("a", "b").alias("s")).collect_schema()
        return DataType.from_polars(got["s"])
    except Exception:
        return None


def _implicit_ok(src: DataType, dst: DataType) -> bool:
    """A cast Polars makes implicitly without changing values: a wider integer, an integer
    or decimal to a float, a wider float, a decimal with room for every value."""
    a, b = src.arrow, dst.arrow
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        if pa.types.is_signed_integer(a) == pa.types.is_signed_integer(b):
            return b.bit_width >= a.bit_width
        return pa.types.is_unsigned_integer(a) and b.bit_width > a.bit_width
    if (pa.types.is_integer(a) or pa.types.is_decimal(a)) and pa.types.is_floating(b):
        return True
    if pa.types.is_decimal(a) and pa.types.is_decimal(b):
        return b.scale >= a.scale and b.precision - b.scale >= a.precision - a.scale
    return pa.types.is_floating(a) and pa.types.is_floating(b) and b.bit_width >= a.bit_width


def _signed_numeric(t: DataType) -> bool:
    a = t.arrow
    return pa.types.is_signed_integer(a) or pa.types.is_floating(a) or pa.types.is_decimal(a)


def _struct_extras(data: dict[str, Any]) -> any_pb2.Any:
    s = struct_pb2.Struct()
    s.update({"shoal": data})
    out = any_pb2.Any()
    out.Pack(s)
    return out


def _read_extras(common: stalg.RelCommon) -> dict[str, Any]:
    for a in common.advanced_extension.optimization:
        if a.Is(struct_pb2.Struct.DESCRIPTOR):
            s = struct_pb2.Struct()
            a.Unpack(s)
            data = dict(s).get("shoal")
            if isinstance(data, struct_pb2.Struct):
                return {k: v for k, v in data.items()}
    return {}


def _signature_name(t: DataType) -> str:
    a = t.arrow
    simple = {
        pa.bool_(): "bool",
        pa.int8(): "i8",
        pa.int16(): "i16",
        pa.int32(): "i32",
        pa.int64(): "i64",
        pa.float32(): "fp32",
        pa.float64(): "fp64",
        pa.large_string(): "str",
        pa.large_binary(): "vbin",
        pa.date32(): "date",
        pa.uint8(): "u!u8",
        pa.uint16(): "u!u16",
        pa.uint32(): "u!u32",
        pa.uint64(): "u!u64",
    }
    if a in simple:
        return simple[a]
    if pa.types.is_decimal(a):
        return "dec"
    if pa.types.is_timestamp(a):
        return "pts" if a.tz is None else "ptstz"
    if pa.types.is_large_list(a):
        return "list"
    if pa.types.is_duration(a):
        return "iday"
    return "any"


# ---------------------------------------------------------------- export


class _Exporter:
    def __init__(self, tables: Mapping[str, pa.Table] | None) -> None:
        self.table_names = {id(t): n for n, t in (tables or {}).items()}
        self.urns: dict[str, int] = {}
        self.functions: dict[tuple[str, str], int] = {}
        self.types: dict[str, int] = {}
        self.declarations: list[ste.SimpleExtensionDeclaration] = []

    # ---------------------------------------------------- extensions

    def urn(self, urn: str) -> int:
        if urn not in self.urns:
            self.urns[urn] = len(self.urns) + 1
        return self.urns[urn]

    def function(self, urn: str, name: str, args: Sequence[DataType]) -> int:
        compound = f"{name}:{'_'.join(_signature_name(a) for a in args)}" if args else name
        key = (urn, compound)
        if key not in self.functions:
            anchor = len(self.functions) + 1
            self.functions[key] = anchor
            self.declarations.append(
                ste.SimpleExtensionDeclaration(
                    extension_function=ste.SimpleExtensionDeclaration.ExtensionFunction(
                        extension_urn_reference=self.urn(urn),
                        function_anchor=anchor,
                        name=compound,
                    )
                )
            )
        return self.functions[key]

    def unsigned_type(self, name: str) -> int:
        if name not in self.types:
            anchor = len(self.types) + 1
            self.types[name] = anchor
            self.declarations.append(
                ste.SimpleExtensionDeclaration(
                    extension_type=ste.SimpleExtensionDeclaration.ExtensionType(
                        extension_urn_reference=self.urn(UNSIGNED), type_anchor=anchor, name=name
                    )
                )
            )
        return self.types[name]

    # ---------------------------------------------------- types and literals

    def type(self, dtype: DataType) -> stt.Type:
        a = dtype.arrow
        T = stt.Type
        if pa.types.is_boolean(a):
            return T(bool=T.Boolean(nullability=_N))
        for width, field, cls in (
            (8, "i8", T.I8),
            (16, "i16", T.I16),
            (32, "i32", T.I32),
            (64, "i64", T.I64),
        ):
            if pa.types.is_signed_integer(a) and a.bit_width == width:
                return T(**{field: cls(nullability=_N)})
        if pa.types.is_unsigned_integer(a):
            ref = self.unsigned_type(f"u{a.bit_width}")
            return T(user_defined=T.UserDefined(type_reference=ref, nullability=_N))
        if pa.types.is_float32(a):
            return T(fp32=T.FP32(nullability=_N))
        if pa.types.is_float64(a):
            return T(fp64=T.FP64(nullability=_N))
        if pa.types.is_large_string(a):
            return T(string=T.String(nullability=_N))
        if pa.types.is_large_binary(a):
            return T(binary=T.Binary(nullability=_N))
        if pa.types.is_date32(a):
            return T(date=T.Date(nullability=_N))
        if pa.types.is_timestamp(a):
            p = _UNIT_PRECISION[a.unit]
            if a.tz is None:
                return T(precision_timestamp=T.PrecisionTimestamp(precision=p, nullability=_N))
            if a.tz in ("UTC", "+00:00"):
                return T(precision_timestamp_tz=T.PrecisionTimestampTZ(precision=p, nullability=_N))
        if pa.types.is_duration(a):
            return T(interval_day=T.IntervalDay(precision=_UNIT_PRECISION[a.unit], nullability=_N))
        if pa.types.is_decimal128(a):
            return T(decimal=T.Decimal(precision=a.precision, scale=a.scale, nullability=_N))
        if pa.types.is_large_list(a):
            return T(list=T.List(type=self.type(DataType(a.value_type)), nullability=_N))
        raise UnsupportedError(f"Substrait export: dtype {dtype} has no Substrait type in shoal")

    def literal(self, value: Any, dtype: DataType) -> stalg.Expression.Literal:
        L = stalg.Expression.Literal
        a = dtype.arrow
        if value is None:
            return L(null=self.type(dtype), nullable=True)
        try:
            if pa.types.is_boolean(a):
                return L(boolean=bool(value))
            if pa.types.is_signed_integer(a):
                field = {8: "i8", 16: "i16", 32: "i32", 64: "i64"}[a.bit_width]
                return L(**{field: int(value)})
            if pa.types.is_unsigned_integer(a):
                self.type(dtype)
                ref = self.types[f"u{a.bit_width}"]
                return L(
                    user_defined=L.UserDefined(
                        type_reference=ref, struct=L.Struct(fields=[L(string=str(int(value)))])
                    )
                )
            if pa.types.is_float32(a):
                return L(fp32=float(value))
            if pa.types.is_float64(a):
                return L(fp64=float(value))
            if pa.types.is_large_string(a):
                return L(string=str(value))
            if pa.types.is_large_binary(a):
                return L(binary=bytes(value))
            if pa.types.is_date32(a) and isinstance(value, datetime.date):
                day = value.date() if isinstance(value, datetime.datetime) else value
                return L(date=(day - datetime.date(1970, 1, 1)).days)
            if pa.types.is_timestamp(a) and isinstance(value, datetime.datetime):
                self.type(dtype)  # raises for time zones other than UTC
                epoch = _EPOCH if value.tzinfo is None else _EPOCH_TZ
                micros = (value - epoch) // datetime.timedelta(microseconds=1)
                p = _UNIT_PRECISION[a.unit]
                units = micros * 10 ** (p - 6) if p >= 6 else micros // 10 ** (6 - p)
                ts = L.PrecisionTimestamp(precision=p, value=units)
                if a.tz is None:
                    return L(precision_timestamp=ts)
                return L(precision_timestamp_tz=ts)
            if pa.types.is_duration(a) and isinstance(value, datetime.timedelta):
                return L(
                    interval_day_to_second=L.IntervalDayToSecond(
                        days=value.days,
                        seconds=value.seconds,
                        subseconds=value.microseconds,
                        precision=6,
                    )
                )
            if pa.types.is_decimal128(a):
                d = decimal.Decimal(value)
                unscaled = d.scaleb(a.scale)
                if unscaled != unscaled.to_integral_value():
                    raise ValueError(f"{value} has more than {a.scale} decimal places")
                raw = int(unscaled).to_bytes(16, "little", signed=True)
                return L(decimal=L.Decimal(value=raw, precision=a.precision, scale=a.scale))
            if pa.types.is_large_list(a) and isinstance(value, list | tuple):
                inner = DataType(a.value_type)
                if not value:
                    return L(empty_list=stt.Type.List(type=self.type(inner), nullability=_N))
                return L(list=L.List(values=[self.literal(v, inner) for v in value]))
        except (TypeError, ValueError, OverflowError) as exc:
            raise PlanError(
                f"Substrait export: literal {value!r} does not fit {dtype}: {exc}"
            ) from exc
        raise UnsupportedError(
            f"Substrait export: literal {value!r} of dtype {dtype} has no Substrait form in shoal"
        )

    # ---------------------------------------------------- expressions

    def expr(self, e: Expr, ref: Callable[[str], int]) -> stalg.Expression:
        E = stalg.Expression
        if isinstance(e, Col):
            return E(
                selection=E.FieldReference(
                    direct_reference=E.ReferenceSegment(
                        struct_field=E.ReferenceSegment.StructField(field=ref(e.name))
                    ),
                    root_reference=E.FieldReference.RootReference(),
                )
            )
        if isinstance(e, Lit):
            return E(literal=self.literal(e.value, e.dtype))
        if isinstance(e, Cast):
            if getattr(e, "wrap", False):
                raise UnsupportedError(
                    f"Substrait export: the wrapping (overflowing) cast {e} has no Substrait form"
                )
            behaviour = (
                E.Cast.FAILURE_BEHAVIOR_THROW_EXCEPTION
                if e.strict
                else E.Cast.FAILURE_BEHAVIOR_RETURN_NULL
            )
            return E(
                cast=E.Cast(
                    type=self.type(e.dtype),
                    input=self.expr(e.expr, ref),
                    failure_behavior=behaviour,
                )
            )
        if isinstance(e, Ternary):
            return E(
                if_then=E.IfThen(
                    ifs=[
                        E.IfThen.IfClause(
                            **{"if": self.expr(e.predicate, ref), "then": self.expr(e.then, ref)}
                        )
                    ],
                    **{"else": self.expr(e.otherwise, ref)},
                )
            )
        if isinstance(e, BinaryOp):
            return self.binary(e, ref)
        if isinstance(e, Function) and e.name in AGGREGATING_FUNCTIONS:
            # A Substrait scalar function is evaluated row by row: these read every row.
            raise _aggregating_function_error(e)
        if isinstance(e, Function):
            return self.scalar_function(e, ref)
        if isinstance(e, Agg):
            raise PlanError(f"Substrait export: aggregate {e} outside an aggregation")
        raise UnsupportedError(
            f"Substrait export: expression {type(e).__name__} has no Substrait form in shoal"
        )

    def implicit_cast(
        self, e: Expr, dtype: DataType, ref: Callable[[str], int]
    ) -> stalg.Expression:
        """``e`` cast to ``dtype`` as Polars does implicitly (failure behaviour unspecified,
        which the importer reads as implicit)."""
        if e.dtype == dtype:
            return self.expr(e, ref)
        E = stalg.Expression
        return E(cast=E.Cast(type=self.type(dtype), input=self.expr(e, ref)))

    def call(
        self,
        urn: str,
        name: str,
        args: Sequence[stalg.Expression],
        arg_types: Sequence[DataType],
        out: DataType,
        options: Sequence[tuple[str, Any]] = (),
    ) -> stalg.Expression:
        E = stalg.Expression
        return E(
            scalar_function=E.ScalarFunction(
                function_reference=self.function(urn, name, arg_types),
                arguments=[stalg.FunctionArgument(value=a) for a in args],
                options=self.options(options),
                output_type=self.type(out),
            )
        )

    @staticmethod
    def options(options: Sequence[tuple[str, Any]]) -> list[stalg.FunctionOption]:
        return [
            stalg.FunctionOption(name=k, preference=[json.dumps(value_to_json(v))])
            for k, v in options
        ]

    def binary(self, e: BinaryOp, ref: Callable[[str], int]) -> stalg.Expression:
        std = _STD_BINARY.get(e.op)
        if std is not None:
            common = _supertype(e.left.dtype, e.right.dtype)
            ok = common is not None
            if ok and e.op in ("add", "sub", "mul"):
                ok = _signed_numeric(common) and e.dtype == common  # type: ignore[arg-type]
            elif ok and e.op == "truediv":
                ok = e.dtype.is_float and pa.types.is_floating(e.dtype.arrow)
                common = e.dtype
            elif ok and e.op in ("and", "or", "xor"):
                ok = e.left.dtype == BOOL and e.right.dtype == BOOL
            if ok:
                assert common is not None
                args = [
                    self.implicit_cast(e.left, common, ref),
                    self.implicit_cast(e.right, common, ref),
                ]
                return self.call(std[0], std[1], args, [common, common], e.dtype)
        return self.call(
            SHOAL_BINARY,
            e.op,
            [self.expr(e.left, ref), self.expr(e.right, ref)],
            [e.left.dtype, e.right.dtype],
            e.dtype,
        )

    def scalar_function(self, e: Function, ref: Callable[[str], int]) -> stalg.Expression:
        std = _STD_FUNCTIONS.get(e.name)
        if std is not None and not e.options:
            if e.name == "coalesce":
                args = [self.implicit_cast(a, e.dtype, ref) for a in e.args]
                return self.call(std[0], std[1], args, [e.dtype] * len(args), e.dtype)
            if e.name not in ("neg", "abs") or all(_signed_numeric(a.dtype) for a in e.args):
                return self.call(
                    std[0],
                    std[1],
                    [self.expr(a, ref) for a in e.args],
                    [a.dtype for a in e.args],
                    e.dtype,
                )
        return self.call(
            SHOAL_FUNCTIONS,
            e.name,
            [self.expr(a, ref) for a in e.args],
            [a.dtype for a in e.args],
            e.dtype,
            e.options,
        )

    def measure(self, e: Agg, ref: Callable[[str], int]) -> stalg.AggregateRel.Measure:
        std = _STD_AGGS.get(e.name)
        arg = e.arg
        args: list[stalg.Expression] = []
        types: list[DataType] = []
        urn, name = SHOAL_AGGREGATES, e.name
        if (
            std is not None
            and not e.options
            and (arg is None or e.name == "count" or _signed_numeric(arg.dtype))
        ):
            urn, name = std
            if arg is not None:
                target = e.dtype if e.name == "mean" else arg.dtype
                args, types = [self.implicit_cast(arg, target, ref)], [target]
        elif arg is not None:
            args, types = [self.expr(arg, ref)], [arg.dtype]
        return stalg.AggregateRel.Measure(
            measure=stalg.AggregateFunction(
                function_reference=self.function(urn, name, types),
                arguments=[stalg.FunctionArgument(value=a) for a in args],
                options=self.options(e.options) if urn == SHOAL_AGGREGATES else [],
                output_type=self.type(e.dtype),
                phase=stalg.AGGREGATION_PHASE_INITIAL_TO_RESULT,
                invocation=stalg.AggregateFunction.AGGREGATION_INVOCATION_ALL,
            )
        )

    # ---------------------------------------------------- relations

    @staticmethod
    def refs(schema: Schema) -> Callable[[str], int]:
        index = {n: i for i, n in enumerate(schema.names)}

        def ref(name: str) -> int:
            if name not in index:
                raise PlanError(f"Substrait export: column {name!r} is not in {schema}")
            return index[name]

        return ref

    def common(
        self,
        schema: Schema,
        extras: dict[str, Any] | None = None,
        emit: Sequence[int] | None = None,
    ) -> stalg.RelCommon:
        c = stalg.RelCommon(hint=stalg.RelCommon.Hint(output_names=list(schema.names)))
        if emit is not None:
            c.emit.output_mapping.extend(emit)
        else:
            c.direct.SetInParent()
        if extras:
            c.advanced_extension.optimization.append(_struct_extras(extras))
        return c

    def named_struct(self, schema: Schema) -> stt.NamedStruct:
        return stt.NamedStruct(
            names=list(schema.names),
            struct=stt.Type.Struct(
                types=[self.type(t) for _, t in schema.fields],
                nullability=stt.Type.NULLABILITY_REQUIRED,
            ),
        )

    def rel(self, node: PlanNode) -> stalg.Rel:
        label = node.label
        if isinstance(node, Scan):
            return self.scan(node)
        if isinstance(node, FilterNode):
            return stalg.Rel(
                filter=stalg.FilterRel(
                    common=self.common(node.schema),
                    input=self.rel(node.input),
                    condition=self.expr(node.predicate, self.refs(node.input.schema)),
                )
            )
        if isinstance(node, Project):
            ref = self.refs(node.input.schema)
            n_in = len(node.input.schema)
            common = self.common(node.schema, emit=range(n_in, n_in + len(node.exprs)))
            child = self.rel(node.input)  # (before the expressions: extension anchors)
            expressions = [self.expr(ne.expr, ref) for ne in node.exprs]
            if not node.keep_height and not any(
                ne.expr.columns() and ne.expr.is_row_local() for ne in node.exprs
            ):
                # A ProjectRel computes its expressions once per input row.
                raise UnsupportedError(
                    "Substrait export: a projection of scalars alone (one row, Polars' "
                    "select) has no ProjectRel form"
                )
            return stalg.Rel(
                project=stalg.ProjectRel(common=common, input=child, expressions=expressions)
            )
        if isinstance(node, Aggregate):
            return self.aggregate(node)
        if isinstance(node, Join):
            return self.join(node)
        if isinstance(node, Sort):
            ref = self.refs(node.input.schema)
            sorts = []
            for e, desc, last in zip(node.by, node.descending, node.nulls_last, strict=True):
                direction = (
                    (
                        _SORT.SORT_DIRECTION_DESC_NULLS_LAST
                        if last
                        else _SORT.SORT_DIRECTION_DESC_NULLS_FIRST
                    )
                    if desc
                    else (
                        _SORT.SORT_DIRECTION_ASC_NULLS_LAST
                        if last
                        else _SORT.SORT_DIRECTION_ASC_NULLS_FIRST
                    )
                )
                sorts.append(stalg.SortField(expr=self.expr(e, ref), direction=direction))
            extras = {"stable": True} if node.stable else None
            return stalg.Rel(
                sort=stalg.SortRel(
                    common=self.common(node.schema, extras), input=self.rel(node.input), sorts=sorts
                )
            )
        if isinstance(node, Slice):
            i64 = DataType(pa.int64())
            fetch = stalg.FetchRel(
                common=self.common(node.schema),
                input=self.rel(node.input),
                offset_expr=self.expr(Lit(node.offset, i64), self.refs(node.schema)),
            )
            if node.length is not None:
                fetch.count_expr.CopyFrom(self.expr(Lit(node.length, i64), self.refs(node.schema)))
            return stalg.Rel(fetch=fetch)
        if isinstance(node, Union):
            return stalg.Rel(
                set=stalg.SetRel(
                    common=self.common(node.schema),
                    inputs=[self.rel(i) for i in node.inputs],
                    op=stalg.SetRel.SET_OP_UNION_ALL,
                )
            )
        raise UnsupportedError(
            f"Substrait export: plan node {label} has no Substrait relation in shoal's mapping"
        )

    def scan(self, node: Scan) -> stalg.Rel:
        read = stalg.ReadRel(
            common=self.common(node.schema), base_schema=self.named_struct(node.schema)
        )
        src = node.source
        if isinstance(src, ParquetSource):
            LF = stalg.ReadRel.LocalFiles
            read.local_files.CopyFrom(
                LF(
                    items=[
                        LF.FileOrFiles(
                            uri_file="file://" + p, parquet=LF.FileOrFiles.ParquetReadOptions()
                        )
                        for p in src.paths
                    ]
                )
            )
        elif isinstance(src, InMemorySource):
            name = self.table_names.get(id(src.table))
            if name is None:
                raise PlanError(
                    f"Substrait export: an in-memory table ({src.table.num_rows} rows) has no "
                    "name: pass tables={name: table} (a ReadRel names it as a named table)"
                )
            read.named_table.CopyFrom(stalg.ReadRel.NamedTable(names=[name]))
        else:
            raise UnsupportedError(
                f"Substrait export: scan source {type(src).__name__} has no Substrait form in shoal"
            )
        if node.predicate is not None:
            read.filter.CopyFrom(self.expr(node.predicate, self.refs(node.schema)))
        return stalg.Rel(read=read)

    def aggregate(self, node: Aggregate) -> stalg.Rel:
        for a in node.aggs:
            for e in a.expr.walk():
                if isinstance(e, Function) and e.name in AGGREGATING_FUNCTIONS:
                    raise _aggregating_function_error(e)
        ref = self.refs(node.input.schema)
        extras = {"maintain_order": True} if node.maintain_order else None
        keys = [self.expr(k.expr, ref) for k in node.keys]
        groupings = (
            [stalg.AggregateRel.Grouping(expression_references=range(len(keys)))] if keys else []
        )
        simple = all(
            isinstance(a.expr, Agg) and not (a.expr.arg and a.expr.arg.has_agg()) for a in node.aggs
        )
        if simple:
            return stalg.Rel(
                aggregate=stalg.AggregateRel(
                    common=self.common(node.schema, extras),
                    input=self.rel(node.input),
                    grouping_expressions=keys,
                    groupings=groupings,
                    measures=[self.measure(a.expr, ref) for a in node.aggs],  # type: ignore[arg-type]
                )
            )
        # Aggregations that combine aggregates: one measure per distinct aggregate, then a
        # projection computing each aggregation over the keys and the measures.
        measures: dict[Agg, str] = {}
        for a in node.aggs:
            for e in a.expr.walk():
                if isinstance(e, Agg) and e not in measures:
                    if e.arg is not None and e.arg.has_agg():
                        raise UnsupportedError(f"Substrait export: nested aggregate {e}")
                    measures[e] = f"__m{len(measures)}"
        inner_schema = Schema.of(
            [(k.name, k.dtype) for k in node.keys] + [(n, e.dtype) for e, n in measures.items()]
        )
        agg_rel = stalg.Rel(
            aggregate=stalg.AggregateRel(
                common=self.common(inner_schema, extras),
                input=self.rel(node.input),
                grouping_expressions=keys,
                groupings=groupings,
                measures=[self.measure(e, ref) for e in measures],
            )
        )
        from shoal.ir.expr import replace as replace_expr

        inner_ref = self.refs(inner_schema)
        exprs = [self.expr(Col(k.name, k.dtype), inner_ref) for k in node.keys]
        for a in node.aggs:
            rewritten = replace_expr(
                a.expr, lambda e: Col(measures[e], e.dtype) if isinstance(e, Agg) else None
            )
            exprs.append(self.expr(rewritten, inner_ref))
        n_in = len(inner_schema)
        return stalg.Rel(
            project=stalg.ProjectRel(
                common=self.common(node.schema, emit=range(n_in, n_in + len(exprs))),
                input=agg_rel,
                expressions=exprs,
            )
        )

    def join(self, node: Join) -> stalg.Rel:
        left, right = node.left.schema, node.right.schema
        extras: dict[str, Any] = {"suffix": node.suffix, "coalesce": node.coalesce}
        order = getattr(node, "maintain_order", "none")
        if order != "none":
            extras["maintain_order"] = order
        if node.how == "cross":
            return stalg.Rel(
                cross=stalg.CrossRel(
                    common=self.common(node.schema, extras),
                    left=self.rel(node.left),
                    right=self.rel(node.right),
                )
            )
        if not all(isinstance(k, Col) for k in (*node.left_on, *node.right_on)):
            raise UnsupportedError("Substrait export: a Join on expressions (not columns)")
        if node.coalesce and node.how in ("right", "full"):
            raise UnsupportedError(
                f"Substrait export: a coalescing {node.how} join (Polars merges the key columns)"
            )
        lref, rref = self.refs(left), self.refs(right)
        n_left = len(left)
        fn = "is_not_distinct_from" if node.nulls_equal else "equal"
        cond: stalg.Expression | None = None
        for a, b in zip(node.left_on, node.right_on, strict=True):
            eq = self.call(
                COMPARISON,
                fn,
                [self.expr(a, lref), self.expr(b, lambda n: rref(n) + n_left)],
                [a.dtype, b.dtype],
                BOOL,
            )
            cond = eq if cond is None else self.call(BOOLEAN, "and", [cond, eq], [BOOL, BOOL], BOOL)
        emit = None
        if node.how in ("inner", "left") and node.coalesce:
            right_keys = {k.name for k in node.right_on}  # type: ignore[attr-defined]
            emit = list(range(n_left)) + [
                n_left + i for i, n in enumerate(right.names) if n not in right_keys
            ]
        if node.how not in ("semi", "anti"):
            count = len(emit) if emit is not None else n_left + len(right)
            if count != len(node.schema):
                raise UnsupportedError(
                    f"Substrait export: Join output {node.schema} does not follow Polars' rules"
                )
        return stalg.Rel(
            join=stalg.JoinRel(
                common=self.common(node.schema, extras, emit),
                left=self.rel(node.left),
                right=self.rel(node.right),
                expression=cond,
                type=_JOIN_TYPES[node.how],
            )
        )

    def plan(self, node: PlanNode) -> stp.Plan:
        root = stalg.RelRoot(input=self.rel(node), names=list(node.schema.names))
        major, minor, patch = substrait_version()
        return stp.Plan(
            version=stp.Version(
                major_number=major, minor_number=minor, patch_number=patch, producer="shoal"
            ),
            extension_urns=[
                ste.SimpleExtensionURN(extension_urn_anchor=a, urn=u) for u, a in self.urns.items()
            ],
            extensions=self.declarations,
            relations=[stp.PlanRel(root=root)],
        )


def to_substrait(plan: PlanNode, *, tables: Mapping[str, pa.Table] | None = None) -> stp.Plan:
    """The Substrait plan (a ``substrait.plan_pb2.Plan``) of ``plan``;
    ``.SerializeToString()`` gives its bytes.

    ``tables`` names the in-memory tables (matched by identity), which become named-table
    reads. Raises :class:`shoal.UnsupportedError` naming the node, expression, function or
    dtype that has no Substrait form in shoal's mapping, and :class:`shoal.PlanError` for an
    unnamed in-memory table.
    """
    if not isinstance(plan, PlanNode):
        raise PlanError(f"expected a plan node, got {type(plan).__name__}")
    if any(isinstance(n, StageInput) for n in plan.walk()):
        raise UnsupportedError("Substrait export: physical plans (StageInput) are not exported")
    return _Exporter(tables).plan(plan)


# ---------------------------------------------------------------- import


class _Importer:
    def __init__(self, plan: stp.Plan, tables: Mapping[str, pa.Table] | None) -> None:
        self.tables = dict(tables or {})
        self.implicit: dict[int, Expr] = {}  # casts written as implicit, by id (kept alive)
        urns = {u.extension_urn_anchor: u.urn for u in plan.extension_urns}
        self.functions: dict[int, tuple[str, str]] = {}
        self.types: dict[int, str] = {}
        for d in plan.extensions:
            kind = d.WhichOneof("mapping_type")
            if kind == "extension_function":
                f = d.extension_function
                self.functions[f.function_anchor] = (
                    urns.get(f.extension_urn_reference, ""),
                    f.name.split(":")[0],
                )
            elif kind == "extension_type":
                t = d.extension_type
                self.types[t.type_anchor] = (
                    t.name if urns.get(t.extension_urn_reference) == UNSIGNED else ""
                )

    # ---------------------------------------------------- types and literals

    def type(self, t: stt.Type) -> DataType:
        kind = t.WhichOneof("kind")
        simple = {
            "bool": pa.bool_(),
            "i8": pa.int8(),
            "i16": pa.int16(),
            "i32": pa.int32(),
            "i64": pa.int64(),
            "fp32": pa.float32(),
            "fp64": pa.float64(),
            "string": pa.large_string(),
            "varchar": pa.large_string(),
            "fixed_char": pa.large_string(),
            "binary": pa.large_binary(),
            "fixed_binary": pa.large_binary(),
            "date": pa.date32(),
        }
        if kind in simple:
            return DataType(simple[kind])
        if kind in ("precision_timestamp", "precision_timestamp_tz"):
            p = getattr(t, kind).precision
            if p not in _PRECISION_UNIT:
                raise UnsupportedError(f"Substrait import: timestamp precision {p}")
            return DataType(
                pa.timestamp(_PRECISION_UNIT[p], None if kind == "precision_timestamp" else "UTC")
            )
        if kind == "interval_day":
            p = t.interval_day.precision
            return DataType(pa.duration(_PRECISION_UNIT.get(p, "us")))
        if kind == "decimal":
            return DataType(pa.decimal128(t.decimal.precision, t.decimal.scale))
        if kind == "list":
            return DataType(pa.large_list(self.type(t.list.type).arrow))
        if kind == "user_defined":
            name = self.types.get(t.user_defined.type_reference, "")
            if name in ("u8", "u16", "u32", "u64"):
                return DataType(
                    {"u8": pa.uint8(), "u16": pa.uint16(), "u32": pa.uint32(), "u64": pa.uint64()}[
                        name
                    ]
                )
        raise UnsupportedError(f"Substrait import: type {kind} is not supported by shoal")

    def literal(self, lit: stalg.Expression.Literal) -> Lit:
        kind = lit.WhichOneof("literal_type")
        ints = {"i8": pa.int8(), "i16": pa.int16(), "i32": pa.int32(), "i64": pa.int64()}
        if kind == "null":
            return Lit(None, self.type(lit.null))
        if kind == "boolean":
            return Lit(lit.boolean, BOOL)
        if kind in ints:
            return Lit(int(getattr(lit, kind)), DataType(ints[kind]))
        if kind == "fp32":
            return Lit(float(lit.fp32), DataType(pa.float32()))
        if kind == "fp64":
            return Lit(float(lit.fp64), DataType(pa.float64()))
        if kind in ("string", "fixed_char"):
            return Lit(str(getattr(lit, kind)), DataType(pa.large_string()))
        if kind == "var_char":
            return Lit(lit.var_char.value, DataType(pa.large_string()))
        if kind in ("binary", "fixed_binary"):
            return Lit(bytes(getattr(lit, kind)), DataType(pa.large_binary()))
        if kind == "date":
            return Lit(
                datetime.date(1970, 1, 1) + datetime.timedelta(days=lit.date), DataType(pa.date32())
            )
        if kind in ("precision_timestamp", "precision_timestamp_tz"):
            ts = getattr(lit, kind)
            if ts.precision not in _PRECISION_UNIT:
                raise UnsupportedError(f"Substrait import: timestamp precision {ts.precision}")
            p = ts.precision
            micros = ts.value * 10 ** (6 - p) if p <= 6 else ts.value // 10 ** (p - 6)
            tz = None if kind == "precision_timestamp" else "UTC"
            epoch = _EPOCH if tz is None else _EPOCH_TZ
            return Lit(
                epoch + datetime.timedelta(microseconds=micros),
                DataType(pa.timestamp(_PRECISION_UNIT[p], tz)),
            )
        if kind == "interval_day_to_second":
            iv = lit.interval_day_to_second
            p = iv.precision if iv.precision else 6
            sub = iv.subseconds * 10 ** (6 - p) if p <= 6 else iv.subseconds // 10 ** (p - 6)
            value = datetime.timedelta(days=iv.days, seconds=iv.seconds, microseconds=sub)
            return Lit(value, DataType(pa.duration("us")))
        if kind == "decimal":
            d = lit.decimal
            unscaled = int.from_bytes(d.value, "little", signed=True)
            return Lit(
                decimal.Decimal(unscaled).scaleb(-d.scale),
                DataType(pa.decimal128(d.precision, d.scale)),
            )
        if kind == "list":
            values = [self.literal(v) for v in lit.list.values]
            inner = next((v.dtype for v in values if v.value is not None), values[0].dtype)
            return Lit([v.value for v in values], DataType(pa.large_list(inner.arrow)))
        if kind == "empty_list":
            return Lit([], DataType(pa.large_list(self.type(lit.empty_list.type).arrow)))
        if kind == "user_defined":
            ud = lit.user_defined
            name = self.types.get(ud.type_reference, "")
            if name in ("u8", "u16", "u32", "u64") and ud.WhichOneof("val") == "struct":
                dtype = self.type(
                    stt.Type(user_defined=stt.Type.UserDefined(type_reference=ud.type_reference))
                )
                return Lit(int(ud.struct.fields[0].string), dtype)
        raise UnsupportedError(f"Substrait import: literal {kind} is not supported by shoal")

    # ---------------------------------------------------- expressions

    def typed(self, e: Expr, schema: Schema, declared: DataType | None = None) -> Expr:
        (dtype,) = infer_dtypes([e], schema, where="Substrait import")
        out = replace(e, dtype=dtype)  # type: ignore[type-var]
        if declared is not None and declared != dtype:
            return Cast(out, declared, True)
        return out

    def expr(self, e: stalg.Expression, schema: Schema) -> Expr:
        kind = e.WhichOneof("rex_type")
        if kind == "selection":
            sel = e.selection
            if (
                sel.WhichOneof("root_type") != "root_reference"
                or sel.WhichOneof("reference_type") != "direct_reference"
            ):
                raise UnsupportedError(
                    "Substrait import: field references other than direct references to the input"
                )
            seg = sel.direct_reference
            if seg.WhichOneof("reference_type") != "struct_field" or seg.struct_field.HasField(
                "child"
            ):
                raise UnsupportedError("Substrait import: nested field references")
            i = seg.struct_field.field
            if not 0 <= i < len(schema):
                raise PlanError(f"Substrait import: field {i} is out of range for {schema}")
            name, dtype = schema.fields[i]
            return Col(name, dtype)
        if kind == "literal":
            return self.literal(e.literal)
        if kind == "cast":
            behaviour = e.cast.failure_behavior
            strict = behaviour != stalg.Expression.Cast.FAILURE_BEHAVIOR_RETURN_NULL
            cast = self.typed(
                Cast(self.expr(e.cast.input, schema), self.type(e.cast.type), strict), schema
            )
            if behaviour == stalg.Expression.Cast.FAILURE_BEHAVIOR_UNSPECIFIED:
                self.implicit[id(cast)] = cast
            return cast
        if kind == "if_then":
            otherwise = self.expr(getattr(e.if_then, "else"), schema)
            for clause in reversed(e.if_then.ifs):
                pred = self.expr(getattr(clause, "if"), schema)
                then = self.expr(clause.then, schema)
                otherwise = self.typed(Ternary(pred, then, otherwise, NULL), schema)
            return otherwise
        if kind == "scalar_function":
            return self.scalar_function(e.scalar_function, schema)
        raise UnsupportedError(f"Substrait import: expression {kind} is not supported by shoal")

    def args(
        self, arguments: Sequence[stalg.FunctionArgument], schema: Schema, what: str
    ) -> list[Expr]:
        out = []
        for a in arguments:
            if a.WhichOneof("arg_type") != "value":
                raise UnsupportedError(f"Substrait import: {what} with a non-value argument")
            out.append(self.expr(a.value, schema))
        return out

    @staticmethod
    def options(options: Sequence[stalg.FunctionOption], what: str) -> tuple[tuple[str, Any], ...]:
        out = []
        for o in options:
            if len(o.preference) != 1:
                raise PlanError(f"Substrait import: option {o.name!r} of {what} needs one value")
            try:
                out.append((o.name, value_from_json(json.loads(o.preference[0]))))
            except ValueError as exc:
                raise PlanError(f"Substrait import: option {o.name!r} of {what}: {exc}") from exc
        return tuple(out)

    def scalar_function(self, f: stalg.Expression.ScalarFunction, schema: Schema) -> Expr:
        urn, name = self.functions.get(f.function_reference, ("", ""))
        if not name:
            raise PlanError(
                f"Substrait import: function anchor {f.function_reference} is not declared"
            )
        declared = self.type(f.output_type) if f.HasField("output_type") else None
        args = self.args(f.arguments, schema, f"function {name!r}")
        if urn == SHOAL_BINARY:
            if name not in BINARY_OPS or len(args) != 2:
                raise PlanError(f"Substrait import: unknown shoal operator {name!r}")
            return self.typed(BinaryOp(name, args[0], args[1], NULL), schema, declared)
        if urn == SHOAL_FUNCTIONS:
            node = Function(name, tuple(args), self.options(f.options, name), NULL)
            return self.typed(node, schema, declared)
        op = _FROM_STD_BINARY.get(name)
        if op is not None and len(args) == 2:
            if op == "truediv" and declared is not None and not declared.is_float:
                raise UnsupportedError(
                    "Substrait import: function divide on integers (truncating division)"
                )
            return self.standard(lambda a: BinaryOp(op, a[0], a[1], NULL), args, schema, declared)
        if op is not None and op in ("and", "or") and len(args) > 2:
            out = args[0]
            for a in args[1:]:
                out = self.typed(BinaryOp(op, out, a, NULL), schema)
            return out
        fn = _FROM_STD_FUNCTIONS.get(name)
        if fn is not None:
            return self.standard(lambda a: Function(fn, tuple(a), (), NULL), args, schema, declared)
        raise UnsupportedError(
            f"Substrait import: function {name!r} ({urn or 'no URN'}) is not supported by shoal"
        )

    def standard(
        self,
        make: Callable[[list[Expr]], Expr],
        args: list[Expr],
        schema: Schema,
        declared: DataType | None,
    ) -> Expr:
        """A standard function: implicit casts (failure behaviour unspecified, widening) on
        its arguments are left to Polars when that gives the declared type."""
        stripped = [self.strip_implicit(a) for a in args]
        if stripped != args:
            try:
                candidate = self.typed(make(stripped), schema)
            except PlanError:
                candidate = None
            if candidate is not None and (declared is None or candidate.dtype == declared):
                return candidate
        return self.typed(make(args), schema, declared)

    def strip_implicit(self, e: Expr) -> Expr:
        """``e`` without an implicit (unspecified failure behaviour), value-preserving cast."""
        if id(e) in self.implicit and isinstance(e, Cast) and _implicit_ok(e.expr.dtype, e.dtype):
            return e.expr
        return e

    def measure(self, m: stalg.AggregateRel.Measure, schema: Schema) -> Expr:
        f = m.measure
        urn, name = self.functions.get(f.function_reference, ("", ""))
        if not name:
            raise PlanError(
                f"Substrait import: function anchor {f.function_reference} is not declared"
            )
        if m.HasField("filter"):
            raise UnsupportedError(f"Substrait import: aggregate {name!r} with a filter")
        if f.invocation == stalg.AggregateFunction.AGGREGATION_INVOCATION_DISTINCT:
            raise UnsupportedError(f"Substrait import: aggregate {name!r} over DISTINCT values")
        if f.sorts:
            raise UnsupportedError(f"Substrait import: aggregate {name!r} with an ordering")
        declared = self.type(f.output_type) if f.HasField("output_type") else None
        args = self.args(f.arguments, schema, f"aggregate {name!r}")
        if urn == SHOAL_AGGREGATES:
            return self.typed(
                Agg(name, args[0] if args else None, NULL, self.options(f.options, name)),
                schema,
                declared,
            )
        if len(args) > 1:
            raise UnsupportedError(
                f"Substrait import: aggregate {name!r} with {len(args)} arguments"
            )
        arg = args[0] if args else None
        if name == "count":
            agg = Agg("len", None, NULL) if arg is None else Agg("count", arg, NULL)
            return self.typed(agg, schema, declared)
        ir_name = _FROM_STD_AGGS.get(name)
        if ir_name is None or arg is None:
            raise UnsupportedError(
                f"Substrait import: aggregate function {name!r} ({urn}) is not supported by shoal"
            )
        plain = self.strip_implicit(arg) if ir_name == "mean" else arg
        out = self.typed(Agg(ir_name, plain, NULL), schema)
        if plain is not arg and declared is not None and out.dtype != declared:
            out = self.typed(Agg(ir_name, arg, NULL), schema)
        if name == "sum":
            # SQL's sum of no values is null; Polars' (and the IR's) is 0.
            count = self.typed(Agg("count", arg, NULL), schema)
            zero = self.typed(BinaryOp("eq", count, Lit(0, count.dtype), NULL), schema)
            out = self.typed(Ternary(zero, Lit(None, out.dtype), out, NULL), schema)
        if declared is not None and out.dtype != declared:
            out = Cast(out, declared, True)
        return out

    # ---------------------------------------------------- relations

    def rel(self, rel: stalg.Rel) -> PlanNode:
        kind = rel.WhichOneof("rel_type")
        handler = getattr(self, f"rel_{kind}", None)
        if handler is None:
            raise UnsupportedError(f"Substrait import: relation {kind} is not supported by shoal")
        node: PlanNode
        common: stalg.RelCommon
        node, common, emitted = handler(getattr(rel, kind))
        if not emitted and common.WhichOneof("emit_kind") == "emit":
            mapping = list(common.emit.output_mapping)
            if mapping != list(range(len(node.schema))):
                exprs = []
                for i in mapping:
                    if not 0 <= i < len(node.schema):
                        raise PlanError(
                            f"Substrait import: {kind} emits field {i} of {node.schema}"
                        )
                    n, t = node.schema.fields[i]
                    exprs.append(NamedExpr(n, Col(n, t)))
                node = self.project(node, exprs)
        return self.rename(node, list(common.hint.output_names))

    @staticmethod
    def project(node: PlanNode, exprs: list[NamedExpr]) -> PlanNode:
        seen: dict[str, int] = {}
        out = []
        for ne in exprs:
            name = ne.name
            while name in seen:
                seen[ne.name] += 1
                name = f"{ne.name}_{seen[ne.name]}"
            seen.setdefault(name, 0)
            out.append(NamedExpr(name, ne.expr))
        # A Substrait projection (and an emit) is row by row: the input's height.
        schema = Schema.of([(ne.name, ne.dtype) for ne in out])
        return Project(node, tuple(out), schema, keep_height=True)

    def rename(self, node: PlanNode, names: list[str]) -> PlanNode:
        if not names or names == list(node.schema.names):
            return node
        if len(names) != len(node.schema):
            raise PlanError(f"Substrait import: {len(names)} output names for {node.schema}")
        return self.project(
            node,
            [
                NamedExpr(new, Col(n, t))
                for new, (n, t) in zip(names, node.schema.fields, strict=True)
            ],
        )

    def rel_read(self, r: stalg.ReadRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        names = list(r.base_schema.names)
        types = [self.type(t) for t in r.base_schema.struct.types]
        if len(names) != len(types):
            raise UnsupportedError("Substrait import: a ReadRel whose schema has nested names")
        schema = Schema.of(list(zip(names, types, strict=True)))
        kind = r.WhichOneof("read_type")
        if kind == "named_table":
            name = ".".join(r.named_table.names)
            if name not in self.tables:
                raise PlanError(
                    f"Substrait import: named table {name!r} is not bound: pass "
                    f"tables={{{name!r}: table}}"
                )
            source: Any = InMemorySource(self.tables[name])
        elif kind == "local_files":
            paths = []
            for item in r.local_files.items:
                if item.WhichOneof("file_format") != "parquet":
                    raise UnsupportedError(
                        f"Substrait import: local files in format "
                        f"{item.WhichOneof('file_format')} (Parquet only)"
                    )
                where = item.WhichOneof("path_type")
                if where not in ("uri_file", "uri_path") or item.length or item.start:
                    raise UnsupportedError(
                        f"Substrait import: local files by {where} or byte range"
                    )
                uri = getattr(item, where)
                paths.append(uri[len("file://") :] if uri.startswith("file://") else uri)
            source = ParquetSource(tuple(paths))
        else:
            raise UnsupportedError(f"Substrait import: ReadRel of {kind} is not supported by shoal")
        predicate = self.expr(r.filter, schema) if r.HasField("filter") else None
        node: PlanNode = Scan(source, schema, predicate)
        if r.HasField("projection"):
            items = r.projection.select.struct_items
            if any(i.HasField("child") for i in items):
                raise UnsupportedError("Substrait import: a ReadRel projection of nested fields")
            cols = [schema.fields[i.field] for i in items]
            node = self.project(node, [NamedExpr(n, Col(n, t)) for n, t in cols])
        return node, r.common, False

    def rel_filter(self, r: stalg.FilterRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        child = self.rel(r.input)
        pred = self.expr(r.condition, child.schema)
        return FilterNode(child, pred, child.schema), r.common, False

    def rel_project(self, r: stalg.ProjectRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        child = self.rel(r.input)
        candidates = [NamedExpr(n, Col(n, t)) for n, t in child.schema.fields]
        for i, e in enumerate(r.expressions):
            candidates.append(NamedExpr(f"expr_{i}", self.expr(e, child.schema)))
        if r.common.WhichOneof("emit_kind") == "emit":
            chosen = [candidates[i] for i in r.common.emit.output_mapping]
        else:
            chosen = candidates
        names = list(r.common.hint.output_names)
        if len(names) == len(chosen):
            chosen = [NamedExpr(n, ne.expr) for n, ne in zip(names, chosen, strict=True)]
        return self.project(child, chosen), r.common, True

    def rel_aggregate(self, r: stalg.AggregateRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        child = self.rel(r.input)
        if len(r.groupings) > 1:
            raise UnsupportedError("Substrait import: AggregateRel with grouping sets")
        key_exprs = [self.expr(e, child.schema) for e in r.grouping_expressions]
        if r.groupings:
            key_exprs = [key_exprs[i] for i in r.groupings[0].expression_references]
        aggs = [self.measure(m, child.schema) for m in r.measures]
        names = list(r.common.hint.output_names)
        if len(names) != len(key_exprs) + len(aggs):
            names = [k.name if isinstance(k, Col) else f"key_{i}" for i, k in enumerate(key_exprs)]
            names += [f"measure_{i}" for i in range(len(aggs))]
        keys = tuple(NamedExpr(n, e) for n, e in zip(names, key_exprs, strict=False))
        agg_items = tuple(NamedExpr(n, e) for n, e in zip(names[len(keys) :], aggs, strict=True))
        extras = _read_extras(r.common)
        schema = Schema.of([(ne.name, ne.dtype) for ne in (*keys, *agg_items)])
        node = Aggregate(child, keys, agg_items, bool(extras.get("maintain_order", False)), schema)
        return node, r.common, False

    def rel_sort(self, r: stalg.SortRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        child = self.rel(r.input)
        by, desc, last = [], [], []
        for s in r.sorts:
            if s.WhichOneof("sort_kind") != "direction" or s.direction in (
                _SORT.SORT_DIRECTION_UNSPECIFIED,
                _SORT.SORT_DIRECTION_CLUSTERED,
            ):
                raise UnsupportedError(
                    "Substrait import: a sort by comparison function or clustered"
                )
            by.append(self.expr(s.expr, child.schema))
            desc.append(
                s.direction
                in (_SORT.SORT_DIRECTION_DESC_NULLS_FIRST, _SORT.SORT_DIRECTION_DESC_NULLS_LAST)
            )
            last.append(
                s.direction
                in (_SORT.SORT_DIRECTION_ASC_NULLS_LAST, _SORT.SORT_DIRECTION_DESC_NULLS_LAST)
            )
        stable = bool(_read_extras(r.common).get("stable", False))
        return (
            Sort(child, tuple(by), tuple(desc), tuple(last), stable, child.schema),
            r.common,
            False,
        )

    def rel_fetch(self, r: stalg.FetchRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        child = self.rel(r.input)

        def number(e: stalg.Expression, what: str) -> int:
            lit = self.expr(e, child.schema)
            if not isinstance(lit, Lit) or not isinstance(lit.value, int):
                raise UnsupportedError(
                    f"Substrait import: a FetchRel {what} that is not an integer literal"
                )
            return lit.value

        offset = number(r.offset_expr, "offset") if r.HasField("offset_expr") else 0
        length = number(r.count_expr, "count") if r.HasField("count_expr") else None
        if length is not None and length < 0:
            length = None
        return Slice(child, offset, length, child.schema), r.common, False

    def rel_set(self, r: stalg.SetRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        if r.op != stalg.SetRel.SET_OP_UNION_ALL:
            raise UnsupportedError(
                f"Substrait import: set operation {stalg.SetRel.SetOp.Name(r.op)} (UNION ALL only)"
            )
        inputs = [self.rel(i) for i in r.inputs]
        schema = inputs[0].schema
        fixed = [
            i if i.schema.names == schema.names else self.rename(i, list(schema.names))
            for i in inputs
        ]
        return Union(tuple(fixed), schema), r.common, False

    def rel_cross(self, r: stalg.CrossRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        left, right = self.rel(r.left), self.rel(r.right)
        extras = _read_extras(r.common)
        coalesce = bool(extras.get("coalesce", True))
        return (
            self.make_join(left, right, (), (), "cross", extras, False, coalesce),
            r.common,
            False,
        )

    def rel_join(self, r: stalg.JoinRel) -> tuple[PlanNode, stalg.RelCommon, bool]:
        left, right = self.rel(r.left), self.rel(r.right)
        how = _FROM_JOIN_TYPES.get(r.type)
        if how is None:
            raise UnsupportedError(
                f"Substrait import: join type {stalg.JoinRel.JoinType.Name(r.type)}"
            )
        if r.HasField("post_join_filter"):
            raise UnsupportedError("Substrait import: a join with a post-join filter")
        both = Schema(
            left.schema.fields + tuple((f"__right_{n}", t) for n, t in right.schema.fields)
        )
        n_left = len(left.schema)
        pairs: list[tuple[int, int]] = []
        nulls_equal: set[bool] = set()

        def collect(e: stalg.Expression) -> None:
            if e.WhichOneof("rex_type") != "scalar_function":
                raise UnsupportedError(
                    "Substrait import: a join condition other than equalities of columns"
                )
            f = e.scalar_function
            _, name = self.functions.get(f.function_reference, ("", ""))
            args = [a.value for a in f.arguments]
            if name == "and":
                for a in args:
                    collect(a)
                return
            if name not in ("equal", "is_not_distinct_from") or len(args) != 2:
                raise UnsupportedError(f"Substrait import: join condition function {name!r}")
            refs = [self.expr(a, both) for a in args]
            if not all(isinstance(x, Col) for x in refs):
                raise UnsupportedError("Substrait import: a join on expressions (not columns)")
            idx = sorted(both.names.index(x.name) for x in refs)  # type: ignore[attr-defined]
            if not (idx[0] < n_left <= idx[1]):
                raise UnsupportedError("Substrait import: a join condition not between the sides")
            pairs.append((idx[0], idx[1] - n_left))
            nulls_equal.add(name == "is_not_distinct_from")

        collect(r.expression)
        if len(nulls_equal) > 1:
            raise UnsupportedError("Substrait import: a join mixing = and IS NOT DISTINCT FROM")
        left_on = tuple(Col(*left.schema.fields[i]) for i, _ in pairs)
        right_on = tuple(Col(*right.schema.fields[j]) for _, j in pairs)
        extras = _read_extras(r.common)
        emit = (
            list(r.common.emit.output_mapping)
            if r.common.WhichOneof("emit_kind") == "emit"
            else None
        )
        coalesce = bool(extras.get("coalesce", how not in ("full", "right")))
        right_keys = {j for _, j in pairs}
        dropped = list(range(n_left)) + [
            n_left + j for j in range(len(right.schema)) if j not in right_keys
        ]
        if how in ("semi", "anti"):
            emitted = emit is None
        elif emit == dropped and how in ("inner", "left"):
            coalesce, emitted = True, True
        else:
            coalesce, emitted = False, False
        node = self.make_join(
            left, right, left_on, right_on, how, extras, nulls_equal == {True}, coalesce
        )
        return node, r.common, emitted

    @staticmethod
    def make_join(
        left: PlanNode,
        right: PlanNode,
        left_on: tuple[Expr, ...],
        right_on: tuple[Expr, ...],
        how: Any,
        extras: dict[str, Any],
        nulls_equal: bool,
        coalesce: bool = True,
    ) -> PlanNode:
        from shoal.plan.builder import _kernel_schema

        options: dict[str, Any] = dict(
            left_on=left_on,
            right_on=right_on,
            how=how,
            suffix=str(extras.get("suffix", "_right")),
            nulls_equal=nulls_equal,
            coalesce=coalesce,
        )
        if extras.get("maintain_order", "none") != "none":
            options["maintain_order"] = extras["maintain_order"]
        shell = Join(
            left=StageInput(0, left.schema),
            right=StageInput(1, right.schema),
            schema=Schema(()),
            **options,
        )
        schema = _kernel_schema(
            shell, [left.schema, right.schema], f"Substrait import: Join ({how})"
        )
        return Join(left=left, right=right, schema=schema, **options)

    def plan(self, plan: stp.Plan) -> PlanNode:
        roots = [r for r in plan.relations]
        if len(roots) != 1:
            raise UnsupportedError(
                f"Substrait import: a plan with {len(roots)} relations (one only)"
            )
        r = roots[0]
        if r.WhichOneof("rel_type") == "root":
            node = self.rel(r.root.input)
            return self.rename(node, list(r.root.names))
        return self.rel(r.rel)


def from_substrait(
    plan: stp.Plan | bytes,
    *,
    tables: Mapping[str, pa.Table] | None = None,
    validate: bool = True,
) -> PlanNode:
    """The IR of a Substrait plan (a ``substrait.plan_pb2.Plan`` or its serialised bytes).

    ``tables`` binds named-table reads to in-memory Arrow tables. Dtypes are derived with
    Polars' rules; where the plan declares another output type, a cast to it is added. With
    ``validate`` (the default) the result is checked with :func:`shoal.plan.validate.validate`.
    Raises :class:`shoal.UnsupportedError` naming the relation, expression, function or type
    shoal does not map, and :class:`shoal.PlanError` for a malformed plan or an unbound
    table.
    """
    if isinstance(plan, bytes | bytearray):
        parsed = stp.Plan()
        try:
            parsed.ParseFromString(bytes(plan))
        except Exception as exc:
            raise PlanError(f"Substrait import: not a serialised Substrait plan: {exc}") from exc
        plan = parsed
    if not isinstance(plan, stp.Plan):
        raise PlanError(f"Substrait import: expected a substrait Plan, got {type(plan).__name__}")
    node = _Importer(plan, tables).plan(plan)
    if validate:
        from shoal.plan.validate import validate as check

        check(node)
    return node


__all__ = [
    "SHOAL_AGGREGATES",
    "SHOAL_BINARY",
    "SHOAL_FUNCTIONS",
    "from_substrait",
    "substrait_version",
    "to_substrait",
]
