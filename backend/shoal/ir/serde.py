"""The JSON form of shoal IR plans: :func:`to_json`, :func:`from_json`, :func:`json_schema`.

A document is one JSON object::

    {"shoal_ir_version": 1, "plan": {"kind": "Filter", "input": {...}, "predicate": {...},
                                     "schema": [{"name": "a", "dtype": "int64"}]}}

Serialisation is generic over the dataclass fields of the IR classes: every plan node
(subclass of :class:`~shoal.ir.nodes.PlanNode`), expression (subclass of
:class:`~shoal.ir.expr.Expr`) and scan source (a member of ``shoal.ir.nodes.Source``)
defined in a ``shoal`` module is registered by its class name and written as an object
with a ``"kind"`` and one key per field. Fields are read back by their type annotations,
so a new node class serialises without changes here, as long as its fields use the types
below.

* tuples are arrays; ``None`` is ``null``; ``str``/``int``/``bool`` are JSON scalars.
* :class:`~shoal.ir.types.DataType`: the Arrow type string (``"int64"``, ``"large_string"``,
  ``"date32[day]"``, ``"timestamp[us, tz=UTC]"``, ``"decimal128(15, 2)"``) or, for nested
  types, ``{"list": T}``, ``{"array": T, "size": n}``, ``{"struct": [{"name", "dtype"}]}``,
  ``{"dictionary": {"index": T, "value": T, "ordered": b}}``, for a Polars Enum
  ``{"enum": [category, ...]}``, and ``"int128"``/``"uint128"`` for Polars' 128-bit
  integers.
* :class:`~shoal.ir.types.Schema`: ``[{"name": ..., "dtype": ...}, ...]``.
* Values of fields typed ``Any`` (literal values, function options) are typed: JSON scalars
  for None, bool, int, str and finite floats; ``{"$float": "nan" | "inf" | "-inf"}``,
  ``{"$decimal": "1.50"}``, ``{"$date": "2024-01-31"}``, ``{"$datetime": ISO 8601}``,
  ``{"$time": ...}``, ``{"$timedelta_us": n}``, ``{"$bytes": base64}``, arrays for lists,
  ``{"$tuple": [...]}``, ``{"$dict": [[k, v], ...]}``, ``{"$dtype": T}``, and a
  user-defined function as ``{"$udf": name}``, its registered name (:func:`shoal.udf.lookup`
  finds it again when the plan is read, in a process that has imported its definition).
* Storage options (:class:`~shoal.ir.nodes.StorageOptions`) are an object of strings with
  every credential written as ``"***"``: a plan read back names its storage but holds no
  secret, and reading with it fails until the caller supplies the options again.
* In-memory tables are never written: an :class:`~shoal.ir.nodes.InMemorySource` is
  written as the *name* the caller gives its table (``to_json(plan, tables={"t": table})``)
  and bound again by name when read (``from_json(text, tables={"t": table})``); without a
  name, writing raises :class:`shoal.PlanError`. No Python object is ever pickled: a
  callable anywhere in a plan raises ``PlanError``, unless it is a registered UDF.
* A sub-plan that occurs more than once (the same object, as Polars' cache produces) is
  written once with ``"@id": n`` and then as ``{"@ref": n}``; reading restores the sharing.

Reading is strict: an unknown version, an unknown ``kind``, an unknown or missing field or a
value of the wrong type raises :class:`shoal.PlanError` with the JSON path of the fault
(``$.plan.input.predicate.left``). Reading also validates the plan
(:func:`shoal.plan.validate.validate`) unless ``validate=False``.

``docs/ir-schema.json`` is :func:`json_schema`'s output; regenerate it with
``python -m shoal.ir.serde > docs/ir-schema.json``.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import json
import math
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, Literal

import pyarrow as pa

from shoal.errors import PlanError
from shoal.ir import nodes as _nodes
from shoal.ir.expr import Expr, NamedExpr
from shoal.ir.nodes import PlanNode, StorageOptions
from shoal.ir.types import WIDE_INTEGER_STORAGE, DataType, Schema

#: The format version this module writes and reads.
IR_VERSION = 1
VERSION_KEY = "shoal_ir_version"

_KIND = "kind"
_ID = "@id"
_REF = "@ref"
_NONE_TYPE = type(None)


# ---------------------------------------------------------------- the class registry


def _subclasses(base: type) -> list[type]:
    out: list[type] = []
    stack: list[type] = list(base.__subclasses__())
    while stack:
        c = stack.pop()
        stack.extend(c.__subclasses__())
        if dataclasses.is_dataclass(c) and c.__module__.split(".")[0] == "shoal":
            out.append(c)
    return out


def source_classes() -> tuple[type, ...]:
    """The scan source classes (the members of ``shoal.ir.nodes.Source``)."""
    return tuple(typing.get_args(_nodes.Source))


def registry() -> dict[str, type]:
    """Every serialisable IR class by name: plan nodes, expressions, scan sources and
    :class:`~shoal.ir.expr.NamedExpr`. Classes are found by subclassing (only those
    defined in ``shoal`` modules); two classes with one name raise ``PlanError``."""
    out: dict[str, type] = {}
    for c in [*_subclasses(PlanNode), *_subclasses(Expr), *source_classes(), NamedExpr]:
        other = out.setdefault(c.__name__, c)
        if other is not c:
            raise PlanError(
                f"two IR classes are named {c.__name__!r}: {other.__module__} and {c.__module__}"
            )
    return out


@cache
def _hints(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))


def _fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _strip_optional(hint: Any) -> tuple[Any, bool]:
    if _is_union(hint):
        args = [a for a in typing.get_args(hint) if a is not _NONE_TYPE]
        optional = len(args) < len(typing.get_args(hint))
        if len(args) == 1:
            return args[0], optional
        return typing.Union[tuple(args)], optional  # noqa: UP007
    return hint, False


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _union_classes(hint: Any) -> list[type] | None:
    """The classes of a union of (registered) classes, or None if ``hint`` is not one."""
    if not _is_union(hint):
        return None
    args = [a for a in typing.get_args(hint) if a is not _NONE_TYPE]
    if all(isinstance(a, type) and dataclasses.is_dataclass(a) for a in args):
        return args
    return None


def _hint_supported(hint: Any) -> bool:
    if hint is Any or hint in (
        str,
        int,
        bool,
        float,
        _NONE_TYPE,
        DataType,
        Schema,
        pa.Table,
        StorageOptions,
    ):
        return True
    if isinstance(hint, type) and (
        issubclass(hint, PlanNode | Expr) or dataclasses.is_dataclass(hint)
    ):
        return True
    origin = typing.get_origin(hint)
    if origin is Literal:
        return all(isinstance(a, str | int | bool) for a in typing.get_args(hint))
    if origin is tuple or _is_union(hint):
        return all(_hint_supported(a) for a in typing.get_args(hint) if a is not Ellipsis)
    return False


def unsupported_fields() -> list[str]:
    """``Class.field: annotation`` for every field of a registered class whose type the JSON
    form cannot carry (empty when every class serialises)."""
    out = []
    for name, cls in sorted(registry().items()):
        hints = _hints(cls)
        for f in _fields(cls):
            if f.name in (_KIND, _ID, _REF) or not _hint_supported(hints.get(f.name)):
                out.append(f"{name}.{f.name}: {hints.get(f.name)}")
    return out


# ---------------------------------------------------------------- dtypes


_TIMESTAMP = re.compile(r"^timestamp\[(s|ms|us|ns)(?:, tz=(.+))?\]$")
_DECIMAL = re.compile(r"^decimal(128|256)\((\d+), (-?\d+)\)$")
_FIXED_BINARY = re.compile(r"^fixed_size_binary\[(\d+)\]$")


def dtype_to_json(dtype: DataType | pa.DataType) -> Any:
    """The JSON form of a dtype (see the module docs). Raises ``PlanError`` for an Arrow
    type the JSON form does not describe (maps, unions, extension types)."""
    t = dtype.arrow if isinstance(dtype, DataType) else dtype
    if isinstance(dtype, DataType) and dtype.categories is not None:
        return {"enum": list(dtype.categories)}
    if isinstance(dtype, DataType) and dtype.wide is not None:
        return dtype.wide.lower()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return {"list": dtype_to_json(t.value_type)}
    if pa.types.is_fixed_size_list(t):
        return {"array": dtype_to_json(t.value_type), "size": t.list_size}
    if pa.types.is_struct(t):
        return {"struct": [{"name": f.name, "dtype": dtype_to_json(f.type)} for f in t]}
    if pa.types.is_dictionary(t):
        return {
            "dictionary": {
                "index": dtype_to_json(t.index_type),
                "value": dtype_to_json(t.value_type),
                "ordered": bool(t.ordered),
            }
        }
    text = str(t)
    try:
        back = _parse_dtype_text(text)
    except (KeyError, ValueError) as exc:
        raise PlanError(f"dtype {t} has no JSON form") from exc
    if back != t:
        raise PlanError(f"dtype {t} has no JSON form (its text {text!r} reads back as {back})")
    return text


def _parse_dtype_text(text: str) -> pa.DataType:
    m = _TIMESTAMP.match(text)
    if m:
        return pa.timestamp(m.group(1), m.group(2))
    m = _DECIMAL.match(text)
    if m:
        make = pa.decimal128 if m.group(1) == "128" else pa.decimal256
        return make(int(m.group(2)), int(m.group(3)))
    m = _FIXED_BINARY.match(text)
    if m:
        return pa.binary(int(m.group(1)))
    return pa.type_for_alias(text)


def dtype_from_json(value: Any, path: str = "$") -> DataType:
    """Read a dtype written by :func:`dtype_to_json`; ``PlanError`` names ``path``."""
    if isinstance(value, dict) and set(value) == {"enum"}:
        cats = value["enum"]
        if not isinstance(cats, list) or not all(isinstance(c, str) for c in cats):
            raise PlanError(f"{path}.enum: expected a list of strings")
        import polars as pl

        return DataType.from_polars(pl.Enum(cats))
    if value in ("int128", "uint128"):
        return DataType(WIDE_INTEGER_STORAGE, wide={"int128": "Int128"}.get(value, "UInt128"))
    return DataType(_arrow_from_json(value, path))


def _arrow_from_json(value: Any, path: str) -> pa.DataType:
    if isinstance(value, str):
        try:
            return _parse_dtype_text(value)
        except (KeyError, ValueError) as exc:
            raise PlanError(f"{path}: unknown dtype {value!r}") from exc
    if isinstance(value, dict) and len(value) >= 1:
        if set(value) == {"list"}:
            return pa.large_list(_arrow_from_json(value["list"], f"{path}.list"))
        if set(value) == {"array", "size"}:
            size = value["size"]
            if type(size) is not int or size < 0:
                raise PlanError(f"{path}.size: expected an integer >= 0, got {size!r}")
            return pa.list_(_arrow_from_json(value["array"], f"{path}.array"), size)
        if set(value) == {"struct"} and isinstance(value["struct"], list):
            fields = []
            for i, f in enumerate(value["struct"]):
                p = f"{path}.struct[{i}]"
                if not isinstance(f, dict) or set(f) != {"name", "dtype"}:
                    raise PlanError(f"{p}: expected {{'name': ..., 'dtype': ...}}")
                if not isinstance(f["name"], str):
                    raise PlanError(f"{p}.name: expected a string")
                fields.append(pa.field(f["name"], _arrow_from_json(f["dtype"], f"{p}.dtype")))
            return pa.struct(fields)
        if set(value) == {"dictionary"} and isinstance(value["dictionary"], dict):
            d = value["dictionary"]
            p = f"{path}.dictionary"
            if set(d) != {"index", "value", "ordered"} or not isinstance(d["ordered"], bool):
                raise PlanError(f"{p}: expected index, value and ordered (a boolean)")
            return pa.dictionary(
                _arrow_from_json(d["index"], f"{p}.index"),
                _arrow_from_json(d["value"], f"{p}.value"),
                d["ordered"],
            )
    raise PlanError(f"{path}: not a dtype: {_short(value)}")


def _schema_to_json(schema: Schema) -> list[dict[str, Any]]:
    return [{"name": n, "dtype": dtype_to_json(t)} for n, t in schema.fields]


def _schema_from_json(value: Any, path: str) -> Schema:
    if not isinstance(value, list):
        raise PlanError(
            f"{path}: expected a schema (an array of {{name, dtype}}), got {_short(value)}"
        )
    pairs = []
    for i, f in enumerate(value):
        p = f"{path}[{i}]"
        if not isinstance(f, dict) or set(f) != {"name", "dtype"}:
            raise PlanError(f"{p}: expected {{'name': ..., 'dtype': ...}}, got {_short(f)}")
        if not isinstance(f["name"], str):
            raise PlanError(f"{p}.name: expected a string, got {_short(f['name'])}")
        pairs.append((f["name"], dtype_from_json(f["dtype"], f"{p}.dtype")))
    try:
        return Schema(tuple(pairs))
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from exc


# ---------------------------------------------------------------- typed values


def value_to_json(value: Any, path: str = "$") -> Any:
    """The typed JSON form of a Python value (a literal value or an option)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {"$float": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, datetime.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"$date": value.isoformat()}
    if isinstance(value, datetime.time):
        return {"$time": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {"$timedelta_us": value // datetime.timedelta(microseconds=1)}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode("ascii")}
    if isinstance(value, list):
        return [value_to_json(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"$tuple": [value_to_json(v, f"{path}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        return {
            "$dict": [
                [value_to_json(k, path), value_to_json(v, f"{path}[{k!r}]")]
                for k, v in value.items()
            ]
        }
    if isinstance(value, DataType | pa.DataType):
        return {"$dtype": dtype_to_json(value)}
    udf_class = _udf_class()
    if udf_class is not None and isinstance(value, udf_class):
        return {"$udf": getattr(value, "name", None)}
    if callable(value):
        raise PlanError(
            f"{path}: cannot serialise the Python callable {value!r}: plans never carry code; "
            "UDFs are serialised by registered name only"
        )
    raise PlanError(f"{path}: cannot serialise a value of type {type(value).__name__}: {value!r}")


def _udf_class() -> type | None:
    module = sys.modules.get("shoal.udf")  # a plan holds a UDF only once shoal.udf is loaded
    return getattr(module, "UDF", None)


def _lookup_udf(name: str, path: str) -> Any:
    module = sys.modules.get("shoal.udf")  # no UDF is registered before shoal.udf is loaded
    lookup = getattr(module, "lookup", None)
    found = lookup(name) if lookup is not None else None
    if found is None:
        raise PlanError(
            f"{path}: no UDF is registered under the name {name!r} in this process (import "
            "the module that defines it before reading the plan)"
        )
    return found


_VALUE_TAGS = (
    "$float",
    "$decimal",
    "$datetime",
    "$date",
    "$time",
    "$timedelta_us",
    "$bytes",
    "$tuple",
    "$dict",
    "$dtype",
)


def value_from_json(value: Any, path: str = "$") -> Any:
    """Read a value written by :func:`value_to_json`; ``PlanError`` names ``path``."""
    if value is None or isinstance(value, bool | int | str | float):
        return value
    if isinstance(value, list):
        return [value_from_json(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, dict) or len(value) != 1:
        raise PlanError(f"{path}: not a typed value: {_short(value)}")
    ((tag, v),) = value.items()
    p = f"{path}.{tag}"
    try:
        if tag == "$float":
            if v not in ("nan", "inf", "-inf"):
                raise ValueError("expected 'nan', 'inf' or '-inf'")
            return float(v)
        if tag == "$decimal":
            return decimal.Decimal(_need(v, str))
        if tag == "$datetime":
            return datetime.datetime.fromisoformat(_need(v, str))
        if tag == "$date":
            return datetime.date.fromisoformat(_need(v, str))
        if tag == "$time":
            return datetime.time.fromisoformat(_need(v, str))
        if tag == "$timedelta_us":
            return datetime.timedelta(microseconds=_need(v, int))
        if tag == "$bytes":
            return base64.b64decode(_need(v, str), validate=True)
        if tag == "$tuple":
            return tuple(value_from_json(x, f"{p}[{i}]") for i, x in enumerate(_need(v, list)))
        if tag == "$dict":
            out = {}
            for i, kv in enumerate(_need(v, list)):
                if not isinstance(kv, list) or len(kv) != 2:
                    raise ValueError(f"item {i} is not a [key, value] pair")
                key = value_from_json(kv[0], f"{p}[{i}][0]")
                out[key] = value_from_json(kv[1], f"{p}[{i}][1]")
            return out
        if tag == "$dtype":
            return dtype_from_json(v, p)
        if tag == "$udf":
            return _lookup_udf(_need(v, str), p)
    except PlanError:
        raise
    except (ValueError, TypeError, decimal.InvalidOperation, OverflowError) as exc:
        raise PlanError(f"{p}: {exc}") from exc
    raise PlanError(f"{path}: unknown value tag {tag!r} (one of {', '.join(_VALUE_TAGS)})")


def _need(v: Any, t: type) -> Any:
    if type(v) is not t:
        raise ValueError(f"expected {t.__name__}, got {_short(v)}")
    return v


def _short(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- encoding


class _Encoder:
    def __init__(self, tables: Mapping[str, pa.Table] | None, shared: set[int]) -> None:
        self.names = {id(t): n for n, t in (tables or {}).items()}
        self.registry = registry()
        self.shared = shared
        self.ids: dict[int, int] = {}

    def node(self, obj: Any, path: str) -> Any:
        cls: type = type(obj)
        if self.registry.get(cls.__name__) is not cls:
            raise PlanError(f"{path}: {cls.__name__} is not a registered IR class")
        if isinstance(obj, PlanNode) and id(obj) in self.shared:
            if id(obj) in self.ids:
                return {_REF: self.ids[id(obj)]}
            self.ids[id(obj)] = len(self.ids)
        out: dict[str, Any] = {}
        if cls is not NamedExpr:
            out[_KIND] = cls.__name__
        if isinstance(obj, PlanNode) and id(obj) in self.shared:
            out[_ID] = self.ids[id(obj)]
        hints = _hints(cls)
        for f in _fields(cls):
            out[f.name] = self.value(
                getattr(obj, f.name), hints.get(f.name, Any), f"{path}.{f.name}"
            )
        return out

    def value(self, v: Any, hint: Any, path: str) -> Any:
        if hint is Any:
            return value_to_json(v, path)
        if v is None:
            return None
        if isinstance(v, DataType):
            return dtype_to_json(v)
        if isinstance(v, Schema):
            return _schema_to_json(v)
        if isinstance(v, StorageOptions):
            # Credentials are never written: their values become "***".
            return v.redacted()
        if isinstance(v, pa.Table):
            name = self.names.get(id(v))
            if name is None:
                raise PlanError(
                    f"{path}: an in-memory table ({v.num_rows} rows) cannot be serialised; "
                    "pass tables={name: table} to name it (and the same mapping when reading)"
                )
            return name
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return self.node(v, path)
        if isinstance(v, tuple):
            inner, _ = _strip_optional(hint)
            args = typing.get_args(inner)
            out = []
            for i, x in enumerate(v):
                if len(args) == 2 and args[1] is Ellipsis:
                    h = args[0]
                elif i < len(args) and typing.get_origin(inner) is tuple:
                    h = args[i]
                else:
                    h = Any
                out.append(self.value(x, h, f"{path}[{i}]"))
            return out
        if isinstance(v, float):
            return value_to_json(v, path)
        if isinstance(v, bool | int | str):
            return v
        return value_to_json(v, path)  # raises for callables and unknown objects


def _shared_nodes(plan: PlanNode) -> set[int]:
    count: dict[int, int] = {}

    def rec(n: PlanNode) -> None:
        count[id(n)] = count.get(id(n), 0) + 1
        if count[id(n)] == 1:
            for c in n.children():
                rec(c)

    rec(plan)
    return {k for k, c in count.items() if c > 1}


def to_dict(plan: PlanNode, *, tables: Mapping[str, pa.Table] | None = None) -> dict[str, Any]:
    """The JSON document of ``plan`` as Python objects (what :func:`to_json` dumps).

    ``tables`` names the in-memory tables of the plan (matched by identity). Raises
    :class:`shoal.PlanError` naming the path of anything that cannot be written: an
    unnamed in-memory table, a callable, a dtype without JSON form.
    """
    if not isinstance(plan, PlanNode):
        raise PlanError(f"$.plan: expected a plan node, got {type(plan).__name__}")
    enc = _Encoder(tables, _shared_nodes(plan))
    return {VERSION_KEY: IR_VERSION, "plan": enc.node(plan, "$.plan")}


def to_json(
    plan: PlanNode, *, tables: Mapping[str, pa.Table] | None = None, indent: int | None = None
) -> str:
    """The JSON text of ``plan`` (a document with ``"shoal_ir_version": 1``); see
    :func:`to_dict` for ``tables`` and errors. The text is strict JSON (no NaN tokens)."""
    return json.dumps(to_dict(plan, tables=tables), indent=indent, allow_nan=False)


# ---------------------------------------------------------------- decoding


class _Decoder:
    def __init__(self, tables: Mapping[str, pa.Table] | None) -> None:
        self.tables = dict(tables or {})
        self.registry = registry()
        self.shared: dict[int, PlanNode] = {}

    def obj(self, j: Any, hint: Any, path: str) -> Any:
        """A registered dataclass whose class is ``hint`` or one of its subclasses (or one
        member of a union of classes)."""
        if not isinstance(j, dict):
            raise PlanError(f"{path}: expected an object, got {_short(j)}")
        allowed = _union_classes(hint) or [hint]
        if _REF in j:
            if set(j) != {_REF} or type(j[_REF]) is not int:
                raise PlanError(f"{path}: a reference is {{'@ref': <integer>}}")
            found = self.shared.get(j[_REF])
            if found is None:
                raise PlanError(f"{path}.@ref: no earlier node has '@id': {j[_REF]}")
            if not any(isinstance(found, a) for a in allowed):
                raise PlanError(f"{path}.@ref: refers to a {found.label}, not a {_names(allowed)}")
            return found
        kind = j.get(_KIND)
        if kind is None:
            if len(allowed) == 1 and allowed[0] is NamedExpr:
                cls: type = NamedExpr
            else:
                raise PlanError(f"{path}: missing 'kind' (expected a {_names(allowed)})")
        else:
            if not isinstance(kind, str):
                raise PlanError(f"{path}.kind: expected a string, got {_short(kind)}")
            found_cls = self.registry.get(kind)
            if found_cls is None:
                raise PlanError(f"{path}.kind: unknown kind {kind!r}")
            if not any(issubclass(found_cls, a) for a in allowed):
                raise PlanError(f"{path}.kind: a {kind} is not a {_names(allowed)}")
            cls = found_cls
        hints = _hints(cls)
        fields = {f.name: f for f in _fields(cls)}
        extra = sorted(set(j) - set(fields) - {_KIND, _ID})
        if extra:
            raise PlanError(f"{path}: unknown field {extra[0]!r} for {cls.__name__}")
        kwargs: dict[str, Any] = {}
        for name, f in fields.items():
            p = f"{path}.{name}"
            if name not in j:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise PlanError(f"{p}: missing field of {cls.__name__}")
                continue
            kwargs[name] = self.value(j[name], hints.get(name, Any), p)
        try:
            out = cls(**kwargs)
        except PlanError as exc:
            raise PlanError(f"{path}: {exc}") from exc
        except (TypeError, ValueError) as exc:
            raise PlanError(f"{path}: cannot build {cls.__name__}: {exc}") from exc
        if _ID in j:
            if type(j[_ID]) is not int or not isinstance(out, PlanNode):
                raise PlanError(f"{path}.@id: only plan nodes have an integer '@id'")
            if j[_ID] in self.shared:
                raise PlanError(f"{path}.@id: '@id' {j[_ID]} is used twice")
            self.shared[j[_ID]] = out
        return out

    def value(self, j: Any, hint: Any, path: str) -> Any:
        if hint is Any:
            return value_from_json(j, path)
        inner, optional = _strip_optional(hint)
        if j is None:
            if optional or inner is _NONE_TYPE:
                return None
            raise PlanError(f"{path}: must not be null (expected {_describe(inner)})")
        if inner is DataType:
            return dtype_from_json(j, path)
        if inner is Schema:
            return _schema_from_json(j, path)
        if inner is StorageOptions:
            if not isinstance(j, dict) or not all(isinstance(x, str) for x in j.values()):
                raise PlanError(f"{path}: expected an object of strings, got {_short(j)}")
            return StorageOptions(j)
        if inner is pa.Table:
            if not isinstance(j, str):
                raise PlanError(f"{path}: expected the name of an in-memory table, got {_short(j)}")
            if j not in self.tables:
                raise PlanError(
                    f"{path}: in-memory table {j!r} is not bound: pass tables={{{j!r}: table}}"
                )
            return self.tables[j]
        if inner is str or inner is int or inner is bool:
            if type(j) is not inner:
                raise PlanError(f"{path}: expected {inner.__name__}, got {_short(j)}")
            return j
        if inner is float:
            if type(j) in (int, float):
                return float(j)
            v = value_from_json(j, path)
            if not isinstance(v, float):
                raise PlanError(f"{path}: expected a number, got {_short(j)}")
            return v
        origin = typing.get_origin(inner)
        if origin is Literal:
            options = typing.get_args(inner)
            if j not in options or type(j) not in {type(o) for o in options}:
                raise PlanError(f"{path}: expected one of {list(options)}, got {_short(j)}")
            return j
        if origin is tuple:
            if not isinstance(j, list):
                raise PlanError(f"{path}: expected an array, got {_short(j)}")
            args = typing.get_args(inner)
            if len(args) == 2 and args[1] is Ellipsis:
                return tuple(self.value(x, args[0], f"{path}[{i}]") for i, x in enumerate(j))
            if len(j) != len(args):
                raise PlanError(f"{path}: expected an array of {len(args)} items, got {len(j)}")
            return tuple(
                self.value(x, a, f"{path}[{i}]")
                for i, (x, a) in enumerate(zip(j, args, strict=True))
            )
        if (
            _union_classes(inner) is not None
            or (isinstance(inner, type) and dataclasses.is_dataclass(inner))
            or inner in (PlanNode, Expr)
        ):
            return self.obj(j, inner, path)
        raise PlanError(
            f"{path}: the JSON form cannot read fields of type {inner}"
        )  # pragma: no cover


def _names(classes: list[type]) -> str:
    return " or ".join(c.__name__ for c in classes)


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


#: The check :func:`from_dict` runs unless ``validate=False``:
#: :func:`shoal.plan.validate.validate`, registered by that module (validation types
#: expressions by lowering them to Polars, a floor above the IR); ``import shoal`` loads it.
_validator: Callable[[PlanNode], None] | None = None


def register_validator(check: Callable[[PlanNode], None]) -> None:
    """Make ``check`` the validation :func:`from_json` and :func:`from_dict` run (called
    once by :mod:`shoal.plan.validate` when it is imported)."""
    global _validator
    _validator = check


_TOO_DEEP = (
    "$.plan: the plan or an expression in it is nested too deeply to read (over about "
    "half of Python's recursion limit in levels)"
)


def from_dict(
    doc: Any, *, tables: Mapping[str, pa.Table] | None = None, validate: bool = True
) -> PlanNode:
    """Read a document (Python objects as :func:`to_dict` makes them); see
    :func:`from_json`."""
    if not isinstance(doc, dict):
        raise PlanError(f"$: expected a JSON object, got {_short(doc)}")
    if VERSION_KEY not in doc:
        raise PlanError(f"$.{VERSION_KEY}: missing (not a shoal IR document?)")
    version = doc[VERSION_KEY]
    if type(version) is not int:
        raise PlanError(f"$.{VERSION_KEY}: expected an integer, got {_short(version)}")
    if version != IR_VERSION:
        raise PlanError(
            f"$.{VERSION_KEY}: unsupported version {version}; this shoal reads version {IR_VERSION}"
        )
    extra = sorted(set(doc) - {VERSION_KEY, "plan"})
    if extra:
        raise PlanError(f"$: unknown key {extra[0]!r}")
    if "plan" not in doc:
        raise PlanError("$.plan: missing")
    try:
        plan = _Decoder(tables).obj(doc["plan"], PlanNode, "$.plan")
        if validate:
            if _validator is None:  # pragma: no cover - ``import shoal`` registers it
                raise PlanError("$.plan: no validator registered (import shoal.plan first)")
            _validator(plan)
    except RecursionError:
        raise PlanError(_TOO_DEEP) from None
    return plan


def from_json(
    text: str | bytes, *, tables: Mapping[str, pa.Table] | None = None, validate: bool = True
) -> PlanNode:
    """Read a plan from JSON text written by :func:`to_json`.

    ``tables`` binds the names of in-memory tables. With ``validate`` (the default) the
    plan is also checked with :func:`shoal.plan.validate.validate`. Raises
    :class:`shoal.PlanError` with the JSON path of the fault for text that is not JSON,
    an unknown ``shoal_ir_version``, an unknown kind or field, a value of the wrong type,
    an unbound table name, or a plan that does not validate.
    """
    try:
        doc = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise PlanError(f"$: not valid JSON: {exc}") from exc
    except RecursionError:
        raise PlanError(_TOO_DEEP) from None
    return from_dict(doc, tables=tables, validate=validate)


# ---------------------------------------------------------------- JSON Schema


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/$defs/{name}"}


def _hint_schema(hint: Any) -> dict[str, Any]:
    if hint is Any:
        return _ref("Value")
    if hint is str:
        return {"type": "string"}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"anyOf": [{"type": "number"}, _ref("Value")]}
    if hint is _NONE_TYPE:
        return {"type": "null"}
    if hint is DataType:
        return _ref("DataType")
    if hint is Schema:
        return _ref("Schema")
    if hint is StorageOptions:
        return {
            "type": "object",
            "additionalProperties": {"type": "string"},
            "description": "object-storage options; credentials written as ***",
        }
    if hint is pa.Table:
        return {"type": "string", "description": "name of an in-memory table, bound when read"}
    if hint is PlanNode:
        return _ref("PlanNode")
    if hint is Expr:
        return _ref("Expr")
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _ref(hint.__name__)
    origin = typing.get_origin(hint)
    if origin is Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin is tuple:
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _hint_schema(args[0])}
        return {
            "type": "array",
            "prefixItems": [_hint_schema(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    classes = _union_classes(hint)
    if classes and len(classes) == len(typing.get_args(hint)):
        return _dispatch([c.__name__ for c in classes])
    if _is_union(hint):
        return {"anyOf": [_hint_schema(a) for a in typing.get_args(hint)]}
    raise PlanError(f"no JSON Schema for the field type {hint}")


def _dispatch(kinds: list[str], ref: bool = False) -> dict[str, Any]:
    """An object whose ``kind`` picks the definition it must satisfy (``if``/``then``, so
    that a validator checks one branch, not every alternative); with ``ref``, also a
    ``{"@ref": n}`` to a shared node."""
    cases: list[dict[str, Any]] = [
        {"if": {"properties": {_KIND: {"const": k}}, "required": [_KIND]}, "then": _ref(k)}
        for k in kinds
    ]
    out: dict[str, Any] = {"type": "object"}
    if ref:
        out["anyOf"] = [{"required": [_KIND]}, {"required": [_REF]}]
        cases.insert(0, {"if": {"required": [_REF]}, "then": _ref("NodeRef")})
    else:
        out["required"] = [_KIND]
    out["properties"] = {_KIND: {"enum": kinds}}
    out["allOf"] = cases
    return out


def _class_schema(cls: type) -> dict[str, Any]:
    hints = _hints(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    if cls is not NamedExpr:
        props[_KIND] = {"const": cls.__name__}
        required.append(_KIND)
    if issubclass(cls, PlanNode):
        props[_ID] = {"type": "integer", "description": "names a node shared by several parents"}
    for f in _fields(cls):
        props[f.name] = _hint_schema(hints.get(f.name, Any))
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    out: dict[str, Any] = {"type": "object"}
    if doc:
        out["description"] = " ".join(doc.split())
    out.update({"properties": props, "required": required, "additionalProperties": False})
    return out


def _value_schema() -> dict[str, Any]:
    def tagged(tag: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {tag: schema},
            "required": [tag],
            "additionalProperties": False,
        }

    return {
        "description": "A typed Python value (literal values, function options).",
        "anyOf": [
            {"type": ["null", "boolean", "integer", "number", "string"]},
            {"type": "array", "items": _ref("Value")},
            tagged("$float", {"enum": ["nan", "inf", "-inf"]}),
            tagged("$decimal", {"type": "string"}),
            tagged("$datetime", {"type": "string"}),
            tagged("$date", {"type": "string"}),
            tagged("$time", {"type": "string"}),
            tagged("$timedelta_us", {"type": "integer"}),
            tagged("$bytes", {"type": "string", "contentEncoding": "base64"}),
            tagged("$tuple", {"type": "array", "items": _ref("Value")}),
            tagged(
                "$dict",
                {
                    "type": "array",
                    "items": {
                        "type": "array",
                        "prefixItems": [_ref("Value"), _ref("Value")],
                        "minItems": 2,
                        "maxItems": 2,
                    },
                },
            ),
            tagged("$dtype", _ref("DataType")),
            tagged("$udf", {"type": "string", "description": "a registered UDF, by name"}),
        ],
    }


def _dtype_schema() -> dict[str, Any]:
    def one(key: str, schema: dict[str, Any], *more: str) -> dict[str, Any]:
        props = {key: schema}
        return {
            "type": "object",
            "properties": props,
            "required": [key, *more],
            "additionalProperties": False,
        }

    array = one("array", _ref("DataType"), "size")
    array["properties"]["size"] = {"type": "integer", "minimum": 0}
    return {
        "description": "An Arrow type string (int64, large_string, date32[day], "
        "timestamp[us, tz=UTC], decimal128(15, 2), ...) or a nested type.",
        "anyOf": [
            {"type": "string"},
            one("list", _ref("DataType")),
            array,
            one("struct", {"type": "array", "items": _ref("Field")}),
            one(
                "dictionary",
                {
                    "type": "object",
                    "properties": {
                        "index": _ref("DataType"),
                        "value": _ref("DataType"),
                        "ordered": {"type": "boolean"},
                    },
                    "required": ["index", "value", "ordered"],
                    "additionalProperties": False,
                },
            ),
        ],
    }


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the documents :func:`to_json` writes, generated
    from the registered IR classes (``docs/ir-schema.json`` is this, as JSON)."""
    reg = registry()
    nodes = sorted(n for n, c in reg.items() if issubclass(c, PlanNode))
    exprs = sorted(n for n, c in reg.items() if issubclass(c, Expr))
    defs: dict[str, Any] = {
        "PlanNode": {
            "description": "A plan node (by 'kind'), or a reference to a shared one.",
            **_dispatch(nodes, ref=True),
        },
        "NodeRef": {
            "type": "object",
            "properties": {_REF: {"type": "integer"}},
            "required": [_REF],
            "additionalProperties": False,
        },
        "Expr": {"description": "An expression (by 'kind').", **_dispatch(exprs)},
        "Field": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "dtype": _ref("DataType")},
            "required": ["name", "dtype"],
            "additionalProperties": False,
        },
        "Schema": {"type": "array", "items": _ref("Field")},
        "DataType": _dtype_schema(),
        "Value": _value_schema(),
    }
    for name in sorted(reg):
        defs[name] = _class_schema(reg[name])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://shoal.dev/schemas/ir-v1.json",
        "title": f"shoal IR plan, format version {IR_VERSION}",
        "type": "object",
        "properties": {VERSION_KEY: {"const": IR_VERSION}, "plan": _ref("PlanNode")},
        "required": [VERSION_KEY, "plan"],
        "additionalProperties": False,
        "$defs": defs,
    }


def json_schema_text() -> str:
    """:func:`json_schema` as the text of ``docs/ir-schema.json``."""
    return json.dumps(json_schema(), indent=2) + "\n"


if __name__ == "__main__":  # python -m shoal.ir.serde > docs/ir-schema.json
    sys.stdout.write(json_schema_text())
