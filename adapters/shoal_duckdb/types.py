"""DuckDB logical types and constant values, as ``json_serialize_plan`` writes them.

:func:`dtype_of` maps a serialised DuckDB type (``{"id": "DECIMAL", "type_info": {...}}``)
to a shoal :class:`~shoal.ir.types.DataType` through the Arrow type that DuckDB itself
exports for it (DuckDB's Arrow conversion is the reference: ``HUGEINT`` becomes
``decimal128(38, 0)``, ``VARCHAR`` a string, ``TIMESTAMP`` microseconds). :func:`value_of`
turns a serialised constant into the Python value that the IR's ``Lit`` carries.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import decimal
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa

from shoal.errors import UnsupportedError
from shoal.ir.types import DataType

_SIMPLE: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(),
    "SMALLINT": pa.int16(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "UTINYINT": pa.uint8(),
    "USMALLINT": pa.uint16(),
    "UINTEGER": pa.uint32(),
    "UBIGINT": pa.uint64(),
    # DuckDB exports HUGEINT as decimal128(38, 0); Polars' Int128 has no Arrow form.
    "HUGEINT": pa.decimal128(38, 0),
    "FLOAT": pa.float32(),
    "DOUBLE": pa.float64(),
    "VARCHAR": pa.large_string(),
    "BLOB": pa.large_binary(),
    "DATE": pa.date32(),
    "TIME": pa.time64("us"),
    "TIMESTAMP": pa.timestamp("us"),
    "TIMESTAMP_S": pa.timestamp("s"),
    "TIMESTAMP_MS": pa.timestamp("ms"),
    "TIMESTAMP_NS": pa.timestamp("ns"),
    "NULL": pa.null(),
    "SQLNULL": pa.null(),
}

_US_PER_DAY = 86_400_000_000
#: Enough digits for any DECIMAL or HUGEINT value (39 digits) to stay exact.
_EXACT = decimal.Context(prec=100)

_EPOCH = datetime.date(1970, 1, 1)
_EPOCH_TS = datetime.datetime(1970, 1, 1)

#: The connection's ``TimeZone`` setting while a plan is translated (see :func:`time_zone`),
#: or the reason TIMESTAMPTZ cannot be carried (an unknown zone, a non-Gregorian calendar).
_TIME_ZONE: contextvars.ContextVar[tuple[str | None, str]] = contextvars.ContextVar(
    "shoal_duckdb_time_zone", default=(None, "no TimeZone setting (outside a translation)")
)


@contextlib.contextmanager
def time_zone(zone: str, calendar: str = "gregorian") -> Iterator[None]:
    """Translate with ``zone`` (the connection's ``TimeZone`` setting) as the zone of
    ``TIMESTAMP WITH TIME ZONE``; ``calendar`` is its ``Calendar`` setting.

    DuckDB stores a TIMESTAMPTZ as an instant (microseconds since 1970-01-01 UTC) and
    applies the session's ``TimeZone`` wherever a calendar is needed: casts to and from
    TIMESTAMP and DATE, date parts, ``date_trunc``, interval arithmetic, display. Its Arrow
    export is ``timestamp[us, tz=<TimeZone>]``; shoal's IR type is the same, so the zone is
    explicit in every TIMESTAMPTZ type of the plan, and the kernel's calendar functions on
    it work in that zone. A zone the kernel (Polars, the IANA database) does not know, or a
    calendar other than the Gregorian, makes TIMESTAMPTZ unsupported.
    """
    reason = ""
    if calendar.lower() != "gregorian":
        reason = f"Calendar setting {calendar!r} (shoal computes in the Gregorian calendar)"
    elif not known_zone(zone):
        reason = f"TimeZone setting {zone!r} is not a zone the kernel (Polars) knows"
    token = _TIME_ZONE.set((None if reason else zone, reason))
    try:
        yield
    finally:
        _TIME_ZONE.reset(token)


@functools.lru_cache(maxsize=64)
def known_zone(zone: str) -> bool:
    """Whether the kernel (Polars' IANA time zone database) knows ``zone``."""
    try:
        pl.Series([0], dtype=pl.Int64).cast(pl.Datetime("us", zone))
    except Exception:
        return False
    return True


def session_time_zone() -> str:
    """The zone set by :func:`time_zone`; raises :class:`shoal.UnsupportedError` (with the
    reason) when TIMESTAMPTZ cannot be carried."""
    zone, reason = _TIME_ZONE.get()
    if zone is None:
        raise UnsupportedError(f"TIMESTAMP WITH TIME ZONE: {reason}")
    return zone


def type_name(t: dict[str, Any]) -> str:
    """A short readable name of a serialised DuckDB type (``DECIMAL(15,2)``, ``INTEGER[]``)."""
    tid = t.get("id", "?")
    info = t.get("type_info") or {}
    if tid == "DECIMAL":
        return f"DECIMAL({info.get('width')},{info.get('scale')})"
    if tid == "LIST":
        return f"{type_name(info.get('child_type', {}))}[]"
    alias = info.get("alias")
    return f"{tid} ({alias})" if alias else str(tid)


def arrow_of(t: dict[str, Any]) -> pa.DataType:
    """The Arrow type of a serialised DuckDB type.

    Raises :class:`shoal.UnsupportedError` naming the type when shoal cannot carry it
    (intervals, enums, UUIDs, time zones, maps, unions, bit strings, UHUGEINT, VARCHAR with
    a collation, user-defined aliases of other types).
    """
    tid = t.get("id")
    info = t.get("type_info") or {}
    if info.get("alias") == "AGGREGATE_STATE":
        # DuckDB's internal state of an aggregate (EXPORT_STATE): its layout is DuckDB's
        # own (a STRUCT or a value whose NULL means something else), not a plain value.
        raise UnsupportedError(
            "aggregate state export (EXPORT_STATE, AGGREGATE_STATE values) is not supported"
        )
    if info.get("collation"):
        raise UnsupportedError(
            f"type VARCHAR COLLATE {info['collation']}: collations change comparisons"
        )
    if tid in _SIMPLE:
        return _SIMPLE[tid]
    if tid == "DECIMAL":
        width, scale = int(info["width"]), int(info["scale"])
        return pa.decimal128(width, scale)
    if tid == "TIMESTAMP WITH TIME ZONE":
        return pa.timestamp("us", tz=session_time_zone())
    if tid == "LIST":
        return pa.large_list(arrow_of(info["child_type"]))
    if tid == "STRUCT":
        return pa.struct([pa.field(c["first"], arrow_of(c["second"])) for c in info["child_types"]])
    if tid == "TUPLE" and info.get("child_types"):
        # An unnamed STRUCT (``(1, 'a')``, ``row(...)``): DuckDB's Arrow export names the
        # fields element1, element2, ... and reads such a STRUCT back as the TUPLE.
        return pa.struct(
            [
                pa.field(f"element{i}", arrow_of(c["second"]))
                for i, c in enumerate(info["child_types"], start=1)
            ]
        )
    raise UnsupportedError(f"DuckDB type {type_name(t)} is not supported by shoal")


def dtype_of(t: dict[str, Any]) -> DataType:
    """The shoal IR type of a serialised DuckDB type (see :func:`arrow_of` for errors).

    A top-level ENUM is the IR's Enum with DuckDB's categories in their order (which is
    its sort order, as in DuckDB); an ENUM inside a LIST or STRUCT is refused."""
    categories = enum_categories(t)
    if categories is not None:
        return DataType.from_polars(pl.Enum(list(categories)))
    return DataType(arrow_of(t))


def enum_categories(t: dict[str, Any]) -> tuple[str, ...] | None:
    """The categories of a serialised DuckDB ENUM type, in order (None: not an ENUM)."""
    if t.get("id") != "ENUM":
        return None
    info = t.get("type_info") or {}
    values = info.get("values")
    if not isinstance(values, list) or info.get("alias") == "AGGREGATE_STATE":
        return None
    return tuple(str(v) for v in values)


def is_type(t: dict[str, Any], *ids: str) -> bool:
    """Whether ``t`` is one of the DuckDB type ids ``ids``."""
    return t.get("id") in ids


def _hugeint(v: Any) -> int:
    if isinstance(v, dict):
        return int(v["upper"]) * (1 << 64) + int(v["lower"])
    return int(v)


@dataclass(frozen=True)
class Interval:
    """A DuckDB INTERVAL constant: months, days and microseconds, applied in that order."""

    months: int
    days: int
    micros: int


@dataclass(frozen=True)
class RawTemporal:
    """A DATE (days) or TIMESTAMP (microseconds, or milliseconds for TIMESTAMP_MS) constant
    since 1970-01-01 that Python's ``datetime`` cannot hold (beyond the years 1 to 9999);
    the IR carries it as that number cast to the type."""

    value: int


#: DuckDB's raw values of infinity and -infinity (DATE, then the TIMESTAMP types).
_INFINITIES = {2**31 - 1, -(2**31 - 1), 2**63 - 1, -(2**63 - 1)}


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year)."""
    year -= month <= 2
    era = (year if year >= 0 else year - 399) // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


#: The kernel's calendar (chrono) spans the years -262144 to 262143: its date functions
#: give NULL beyond, where DuckDB still answers.
_KERNEL_DAYS = (_days_from_civil(-262144, 1, 1), _days_from_civil(262143, 12, 31))


def _temporal(raw: int, make: Any, per_day: int = 1) -> Any:
    if raw in _INFINITIES:
        raise UnsupportedError("infinite DATE or TIMESTAMP constants ('infinity')")
    try:
        return make(raw)
    except OverflowError:
        lo, hi = _KERNEL_DAYS
        if not lo * per_day <= raw <= hi * per_day:
            raise UnsupportedError(
                "a DATE or TIMESTAMP constant beyond the years -262144..262143"
            ) from None
        return RawTemporal(raw)


def value_of(v: dict[str, Any]) -> Any:
    """The Python value of a serialised DuckDB constant (``{"type", "is_null", "value"}``).

    Integers, floats, strings and booleans as such; DECIMAL as ``decimal.Decimal``; HUGEINT
    as ``int``; DATE, TIME and TIMESTAMP as ``datetime`` objects; INTERVAL as
    :class:`Interval`; LIST as a Python list. Raises :class:`shoal.UnsupportedError` for
    other types.
    """
    t = v["type"]
    if v.get("is_null"):
        return None
    raw: Any = v["value"]
    tid = t.get("id")
    if tid in ("BOOLEAN",):
        return bool(raw)
    if tid in (
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "UBIGINT",
    ):
        return int(raw)
    if tid == "HUGEINT":
        value = _hugeint(raw)
        if abs(value) >= 10**38:  # the table check of translate._beyond_precision
            raise UnsupportedError(
                "a HUGEINT constant of 39 digits (the kernel's DECIMAL(38) cannot hold it)"
            )
        return value
    if tid in ("FLOAT", "DOUBLE"):
        return float(raw)
    if tid == "DECIMAL":
        scale = int(t["type_info"]["scale"])
        # Exactly (scaleb would round to the default context's 28 digits; DECIMAL has 38).
        return decimal.Decimal(_hugeint(raw)).scaleb(-scale, _EXACT)
    if tid == "VARCHAR":
        arrow_of(t)  # refuses collations
        return str(raw)
    categories = enum_categories(t) if tid == "ENUM" else None
    if categories is not None:  # the category's position, or its name
        if isinstance(raw, str):
            return raw
        if isinstance(raw, int) and 0 <= raw < len(categories):
            return categories[raw]
    if tid == "DATE":
        return _temporal(int(raw), lambda r: _EPOCH + datetime.timedelta(days=r))
    if tid == "TIME":
        micros = int(raw)
        if micros >= _US_PER_DAY:  # Python's and the kernel's TIME end at 23:59:59.999999
            raise UnsupportedError("TIME '24:00:00' (the kernel's TIME cannot hold it)")
        return (datetime.datetime.min + datetime.timedelta(microseconds=micros)).time()
    if tid == "TIMESTAMP":
        return _temporal(
            int(raw), lambda r: _EPOCH_TS + datetime.timedelta(microseconds=r), _US_PER_DAY
        )
    if tid == "TIMESTAMP_MS":
        return _temporal(
            int(raw), lambda r: _EPOCH_TS + datetime.timedelta(milliseconds=r), 86_400_000
        )
    if tid == "TIMESTAMP_S":
        return _EPOCH_TS + datetime.timedelta(seconds=int(raw))
    if tid == "TIMESTAMP WITH TIME ZONE":  # an instant: microseconds since the epoch, UTC
        utc = (_EPOCH_TS + datetime.timedelta(microseconds=int(raw))).replace(tzinfo=datetime.UTC)
        return utc.astimezone(_zoneinfo(session_time_zone()))
    if tid == "INTERVAL":
        return Interval(int(raw["months"]), int(raw["days"]), int(raw["micros"]))
    if tid == "LIST":
        child = t["type_info"]["child_type"]
        items = [value_of({"type": child, **c}) for c in raw["children"]]
        if child.get("id") == "HUGEINT":  # elements of a DECIMAL(38, 0) list: as DECIMAL
            return [None if x is None else decimal.Decimal(x) for x in items]
        return items
    raise UnsupportedError(f"constant of DuckDB type {type_name(t)} is not supported by shoal")


def _zoneinfo(zone: str) -> datetime.tzinfo:
    import zoneinfo

    try:
        return zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise UnsupportedError(f"time zone {zone!r} (TimeZone setting) is not known") from None


_SPECIAL_FLOATS = re.compile(r'"(?:\\.|[^"\\])*"|(-?)\b(nan|inf(?:inity)?)\b', re.IGNORECASE)


def loads_plan_json(text: str) -> Any:
    """Parse DuckDB's plan JSON, which writes non-finite doubles as bare ``NAN``/``INF``
    tokens (not valid JSON)."""

    def fix(m: re.Match[str]) -> str:
        if m.group(2) is None:
            return m.group(0)
        word = "NaN" if m.group(2).lower() == "nan" else "Infinity"
        return ("-" if m.group(1) and word != "NaN" else "") + word

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(_SPECIAL_FLOATS.sub(fix, text))
