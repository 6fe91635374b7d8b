"""DuckDB bound expressions (``json_serialize_plan`` JSON) -> shoal IR expressions.

Every IR expression carries the type DuckDB's binder gave it (``return_type``). Where
DuckDB's rules differ from Polars' (the kernel's), the difference is made explicit here,
with DuckDB's documented behaviour as the rule:

* ``/`` on numbers is floating-point division (both sides cast to DOUBLE); ``//`` on
  integers truncates toward zero and ``%`` takes the sign of the dividend (C semantics);
* DECIMAL arithmetic is exact at the scale DuckDB's result type says (Polars would round
  a product to the larger input scale, so both factors are widened first);
* casts round half away from zero (DOUBLE or DECIMAL to an integer, DECIMAL to a smaller
  scale) where Polars would truncate;
* ``SUM`` widens: integers sum into HUGEINT (``decimal128(38, 0)``), DECIMAL(w, s) into
  DECIMAL(38, s), and the sum of no (non-null) values is NULL, not 0;
* ``AVG`` of integers and decimals divides the exact sum by the count in DOUBLE;
* ``count(*)`` counts rows, ``count(x)`` non-null values; ``count(DISTINCT x)`` ignores
  NULL;
* ``LIKE``/``ILIKE`` patterns become prefix/suffix/substring tests or an anchored regular
  expression in which ``%`` and ``_`` match any characters, newlines included;
* ``concat`` skips NULL arguments while ``||`` propagates them; ``trim`` strips spaces only;
* ``x IN (...)`` with a NULL in the list is NULL rather than false when nothing matches;
* ``DATE + INTEGER`` adds days; ``DATE - DATE`` is a BIGINT number of days; adding an
  INTERVAL gives a TIMESTAMP (months first, clamped to the month's end, then days, then
  microseconds).

* integer ``+``, ``-`` and ``*`` are computed exactly in a wider type and cast back
  strictly, so that an overflow fails the query as it does in DuckDB (with the kernel's
  error, not DuckDB's ``OutOfRangeException``).

* integer division and modulo by zero (and ``//`` on doubles) fail the query, or give NULL
  when the connection has ``error_on_division_by_zero`` off; DuckDB's ``error()`` (a
  scalar subquery with several rows) fails the query where it is reached.

Errors are raised by the kernel with DuckDB's message inside its own (a strict cast of the
message that cannot succeed: the kernel has no other way to raise).
"""

from __future__ import annotations

import datetime
import decimal
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from shoal.errors import UnsupportedError
from shoal.ir.expr import Agg, BinaryOp, Cast, Col, Expr, Function, Lit, Ternary
from shoal.ir.expr import replace as replace_expr
from shoal.ir.functions import lookup as lookup_function
from shoal.ir.types import BOOL, DATE, FLOAT64, INT64, STRING, DataType
from shoal_duckdb.types import (
    Interval,
    RawTemporal,
    dtype_of,
    known_zone,
    type_name,
    value_of,
)

if TYPE_CHECKING:
    from shoal_duckdb.fragment import ForeignColumns
    from shoal_duckdb.reasons import SourceText

INT8 = DataType(pa.int8())
INT16 = DataType(pa.int16())
INT32 = DataType(pa.int32())
TIMESTAMP_US = DataType(pa.timestamp("us"))
HUGEINT = DataType(pa.decimal128(38, 0))
IDX = DataType.from_polars(pl.get_index_type())


class Unsupported(Exception):
    """An expression shoal cannot translate; the message says what and why.

    ``snippet`` is the user's text of the innermost expression around the problem that
    the plan locates in the query (set while the error passes up through
    :meth:`ExprTranslator.expr`); ``function`` the DuckDB function shoal does not know,
    when that is the problem (it may be one the user never wrote: DuckDB's macros and
    rewrites call functions of their own)."""

    def __init__(self, message: str, *, function: str | None = None) -> None:
        super().__init__(message)
        self.snippet: str | None = None
        self.function = function

    def explained(self) -> str:
        """The reason, in the words of the user's query where the plan allows."""
        reason = str(self)
        if self.snippet is None:
            from shoal_duckdb.reasons import internal_function_words

            words = internal_function_words(self.function or "")
            if words is not None:
                return (
                    f"{words}: not supported (DuckDB computes it with its function "
                    f"{self.function}(), which shoal does not support)"
                )
            return reason
        if self.function and self.function.lower() not in self.snippet.lower():
            return (
                f"{self.snippet}: not supported (DuckDB computes it with its function "
                f"{self.function}(), which shoal does not support)"
            )
        return f"{self.snippet}: {reason}"


# ---------------------------------------------------------------- constructors


def lit(value: Any, dtype: DataType) -> Lit:
    """A literal of ``dtype``."""
    return Lit(value, dtype)


def cast(e: Expr, dtype: DataType, strict: bool = True) -> Expr:
    """``e`` cast to ``dtype`` (``e`` itself when it has that type already)."""
    if e.dtype == dtype:
        return e
    if isinstance(e, Lit) and e.value is None:
        return Lit(None, dtype)
    return Cast(e, dtype, strict)


def fn(name: str, args: Sequence[Expr], dtype: DataType, **options: Any) -> Function:
    """IR function ``name`` (an entry of the IR's function table,
    :data:`shoal.ir.functions.FUNCTION_TABLE`). Raises ``KeyError`` naming the function
    when the table has no such name, and :class:`Unsupported` when the table's signature
    takes another number of arguments."""
    low, high = lookup_function(name).arity()
    if len(args) < low or (high is not None and len(args) > high):
        raise Unsupported(f"IR function {name!r} with {len(args)} arguments")
    return Function(name, tuple(args), tuple(sorted(options.items())), dtype)


def struct_field(e: Expr, index: int) -> Function:
    """Field number ``index`` (from 0) of struct ``e``, with the field's own type.

    Raises :class:`Unsupported` when ``e`` is not a struct or has no such field."""
    arrow = e.dtype.arrow
    if not pa.types.is_struct(arrow) or not 0 <= index < arrow.num_fields:
        raise Unsupported(f"field #{index + 1} of a value of type {e.dtype}")
    field = arrow.field(index)
    return Function("struct.field", (e,), (("name", field.name),), DataType(field.type))


def binop(op: str, a: Expr, b: Expr, dtype: DataType) -> BinaryOp:
    return BinaryOp(op, a, b, dtype)


def and_all(parts: Sequence[Expr]) -> Expr:
    """The conjunction of ``parts`` (true when empty)."""
    if not parts:
        return lit(True, BOOL)
    out = parts[0]
    for p in parts[1:]:
        out = binop("and", out, p, BOOL)
    return out


def or_all(parts: Sequence[Expr]) -> Expr:
    out = parts[0]
    for p in parts[1:]:
        out = binop("or", out, p, BOOL)
    return out


def not_(e: Expr) -> Expr:
    return fn("not", [e], BOOL)


def is_null(e: Expr) -> Expr:
    return fn("is_null", [e], BOOL)


def is_not_null(e: Expr) -> Expr:
    return fn("is_not_null", [e], BOOL)


def _decimal(width: int, scale: int) -> DataType:
    return DataType(pa.decimal128(width, scale))


def _scale(dtype: DataType) -> int:
    return int(dtype.arrow.scale) if dtype.is_decimal else 0


def round_half_away(e: Expr, decimals: int, dtype: DataType) -> Expr:
    """``e`` rounded half away from zero to ``decimals`` places (DuckDB's rounding)."""
    if dtype.is_decimal:  # Polars widens a rounded DECIMAL by one digit
        dtype = _decimal(min(38, int(dtype.arrow.precision) + 1), _scale(dtype))
    return fn("round", [e], dtype, decimals=decimals, mode="half_away_from_zero")


def duck_cast(
    e: Expr, target: DataType, try_cast: bool = False, source_column: str | None = None
) -> Expr:
    """A DuckDB cast of ``e`` to ``target``, rounding as DuckDB does: floating point to an
    integer half to even, to a DECIMAL half away from zero; DECIMAL to an integer or to a
    smaller scale half away from zero (Polars would truncate).

    A value that does not convert fails the query with DuckDB's ``ConversionException``
    and message (``source_column``, the column the value comes from, is named in it as
    DuckDB does); ``TRY_CAST`` gives NULL instead.

    Raises :class:`Unsupported` for casts whose text form differs between DuckDB and the
    kernel (floating point to VARCHAR)."""
    src = e.dtype
    if src == target:
        return e
    if src.is_enum or target.is_enum:
        return _enum_cast(e, target, try_cast, source_column)
    if is_tstz(src) or is_tstz(target):
        return _tstz_cast(e, target, not try_cast)
    if target.is_string and src.is_float:
        raise Unsupported("cast of a floating-point number to VARCHAR (DuckDB's number format)")
    if target.is_string and pa.types.is_null(src.arrow):
        return lit(None, target)
    if target.is_string and _is_nested(src):
        raise Unsupported("cast of a LIST or STRUCT to VARCHAR (DuckDB's text form)")
    if _moves_fields(src.arrow, target.arrow):
        # DuckDB matches STRUCT fields by name; the kernel's cast by position refuses
        # other names (or fields in another order with other types).
        raise Unsupported("a STRUCT cast that reorders or renames fields")
    if not pa.types.is_null(src.arrow) and _shape(src) != _shape(target):
        # Text parsed as a LIST or STRUCT literal, or a value DuckDB refuses to cast
        # (a number or a STRUCT to a LIST: ConversionException): the kernel has neither;
        # DuckDB computes it in the tasks.
        raise Unsupported(f"cast of {physical_name(src)} to {physical_name(target)}")
    if target.is_string and (_is_timestamp(e) or pa.types.is_time(src.arrow)):
        return _temporal_text(e)
    if _is_timestamp(e) and pa.types.is_timestamp(target.arrow):
        if target.arrow.unit == "ns" and src.arrow.unit != "ns":
            return _to_nanoseconds(e, target, try_cast)
        return _round_timestamp(e, target)
    if src.is_string and pa.types.is_time(target.arrow):
        # Polars cannot cast text to TIME at all (and its TIME ends before DuckDB's
        # '24:00:00'): DuckDB computes it in the tasks where it can.
        raise Unsupported("cast of text to TIME")
    value = e  # what DuckDB's message shows
    if src.is_string and (target.is_numeric or pa.types.is_boolean(target.arrow)):
        out = _from_text(e, target)
    elif src.is_string and (pa.types.is_date32(target.arrow) or _is_naive_timestamp(target)):
        if pa.types.is_timestamp(target.arrow) and target.arrow.unit == "ns":
            raise Unsupported("cast of text to TIMESTAMP_NS")  # (parsed in microseconds)
        if try_cast:
            # shoal reads fewer text forms than DuckDB: NULL would be a wrong answer.
            raise Unsupported(f"TRY_CAST of text to {physical_name(target)}")
        out = _temporal_from_text(e, target)
    elif target.is_integer and src.is_float:  # C's nearbyint: half to even
        out = cast(fn("round", [e], src, decimals=0, mode="half_to_even"), target, False)
    elif target.is_integer and src.is_decimal:
        value = round_half_away(e, 0, src)
        out = cast(value, target, False)
    elif (target.is_decimal and src.is_float) or (
        target.is_decimal and src.is_decimal and _scale(target) < _scale(src)
    ):
        out = _to_decimal(round_half_away(e, _scale(target), src), target)
    elif target.is_decimal and src.is_numeric:
        out = _to_decimal(e, target)
    else:
        out = cast(e, target, False)
    if try_cast or not _cast_can_fail(src, target):
        return out
    failed = and_all([is_null(out), is_not_null(e)])
    parts = ["Conversion Error: ", *_cast_message(src, target, value)]
    if source_column:
        parts.append(f" when casting from source column {source_column}")
    return Ternary(failed, fail_where(failed, parts, target), out, target)


def _shape(dtype: DataType) -> str:
    """``struct``, ``list`` or ``scalar``: casts between different shapes are DuckDB's
    (text parsed as a LIST or STRUCT) or fail there (ConversionException)."""
    if pa.types.is_struct(dtype.arrow):
        return "struct"
    return "list" if _is_nested(dtype) else "scalar"


def _moves_fields(src: pa.DataType, target: pa.DataType) -> bool:
    """Whether a cast of ``src`` to ``target`` pairs STRUCT fields of different names
    (at any depth: inside LISTs and STRUCTs too)."""
    if pa.types.is_struct(src) and pa.types.is_struct(target):
        if [f.name for f in src] != [f.name for f in target]:
            return True
        return any(_moves_fields(a.type, b.type) for a, b in zip(src, target, strict=True))
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    if any(k(src) for k in lists) and any(k(target) for k in lists):
        return _moves_fields(src.value_type, target.value_type)
    return False


def _enum_name(dtype: DataType) -> str:
    """DuckDB's name of an ENUM type: ``ENUM('a', 'b')``."""
    quoted = ", ".join("'" + c.replace("'", "''") + "'" for c in dtype.categories or ())
    return f"ENUM({quoted})"


def _enum_cast(e: Expr, target: DataType, try_cast: bool, source_column: str | None) -> Expr:
    """Casts to and from ENUM: to VARCHAR its category; from VARCHAR (or another ENUM,
    through its text) the category of that name, a ``ConversionException`` with DuckDB's
    message when there is none (NULL for ``TRY_CAST``). Other casts are refused."""
    src = e.dtype
    if src.is_enum and target.is_string:
        return cast(e, target)
    if src.is_enum and target.is_enum:
        e, src = cast(e, STRING), STRING
    if pa.types.is_null(src.arrow) and target.is_enum:
        return lit(None, target)
    if not (src.is_string and target.is_enum):
        raise Unsupported(f"cast of {type_name_of(src)} to {type_name_of(target)} (ENUM)")
    out = cast(e, target, False)  # a name that is no category becomes NULL
    if try_cast:
        return out
    failed = and_all([is_null(out), is_not_null(e)])
    parts: list[Expr | str] = [
        "Conversion Error: Could not convert string '",
        e,
        f"' to {_enum_name(target)}",
    ]
    if source_column:
        parts.append(f" when casting from source column {source_column}")
    return Ternary(failed, fail_where(failed, parts, target), out, target)


_WHITESPACE = " \t\n\r\x0b\x0c"
_TRUE = ["true", "t", "yes", "y", "1"]
_FALSE = ["false", "f", "no", "n", "0"]


def _from_text(s: Expr, target: DataType) -> Expr:
    """Text to a number or BOOLEAN as DuckDB reads it, NULL where it cannot: numbers with
    surrounding whitespace; integers also from decimal or exponent forms, rounded half
    away from zero (``'2.5'`` is 3, ``'1e3'`` 1000); booleans from true/t/yes/y/1 and
    false/f/no/n/0 in any case."""
    if pa.types.is_boolean(target.arrow):
        low = fn("str.to_lowercase_simple", [s], STRING)
        list_type = DataType(pa.large_list(pa.large_string()))
        is_true = fn("is_in", [low, lit(_TRUE, list_type)], BOOL)
        is_false = fn("is_in", [low, lit(_FALSE, list_type)], BOOL)
        return Ternary(
            is_true,
            lit(True, BOOL),
            Ternary(is_false, lit(False, BOOL), lit(None, BOOL), BOOL),
            BOOL,
        )
    text: Expr = fn("str.strip_chars", [s, lit(_WHITESPACE, STRING)], STRING)
    # Digits may be grouped with single underscores (1_000), as DuckDB reads them.
    grouped = fn("str.contains", [text, lit(r"^[+-]?[0-9]+(_[0-9]+)+(\.[0-9]*)?$", STRING)], BOOL)
    plain = fn("str.replace", [text, lit("_", STRING), lit("", STRING)], STRING, literal=True, n=-1)
    text = Ternary(grouped, plain, text, STRING)
    out = cast(text, target, False)
    if target.is_integer:
        # 0x1F and 0b101: hexadecimal and binary integers (DuckDB: not after whitespace).
        for prefix, base in (("0[xX]", 16), ("0[bB]", 2)):
            digits = fn("str.replace", [s, lit(f"^{prefix}", STRING), lit("", STRING)], STRING, n=1)
            has = fn("str.contains", [s, lit(f"^{prefix}[0-9a-fA-F]+$", STRING)], BOOL)
            value = Function(
                "str.to_integer",
                (digits, lit(base, INT64)),
                (("dtype", INT64), ("strict", False)),
                INT64,
            )
            out = Ternary(has, cast(value, target, False), out, target)
    if not target.is_integer:
        return out
    number = cast(text, FLOAT64, False)
    finite = fn("is_finite", [number], BOOL)
    safe = Ternary(finite, number, lit(0.0, FLOAT64), FLOAT64)
    rounded = round_half_away(safe, 0, FLOAT64)
    lo, hi = _integer_range(target)
    fits = and_all(
        [
            finite,
            compare("ge", rounded, lit(float(lo), FLOAT64)),
            compare("le", rounded, lit(float(hi), FLOAT64)),
        ]
    )
    via_float = Ternary(fits, cast(rounded, target, False), lit(None, target), target)
    return fn("coalesce", [out, via_float], target)


#: The text forms of a TIMESTAMP shoal reads (DuckDB reads more: other separators,
#: time zone offsets; those fail with DuckDB's ConversionException).
_TIMESTAMP_FORMATS = (
    "%Y-%m-%d %H:%M:%S%.f",
    "%Y-%m-%dT%H:%M:%S%.f",
    "%Y-%m-%d %H:%M",
    "%Y-%m-%dT%H:%M",
    "%Y-%m-%d",
)


def _is_naive_timestamp(dtype: DataType) -> bool:
    return pa.types.is_timestamp(dtype.arrow) and dtype.arrow.tz is None


def _temporal_from_text(s: Expr, target: DataType) -> Expr:
    """ISO text to a TIMESTAMP (``YYYY-MM-DD[( |T)HH:MM[:SS[.fraction]]]``) or a DATE
    (``YYYY-MM-DD`` with surrounding whitespace, or a timestamp's date), NULL where it does
    not parse."""
    work = DataType(pa.timestamp("us"))
    parsed: list[Expr] = [_strptime(s, work, f) for f in _TIMESTAMP_FORMATS]
    timestamp = fn("coalesce", parsed, work)
    if pa.types.is_date32(target.arrow):
        # A DATE also from a timestamp's text (its date), as DuckDB reads it.
        text = fn("str.strip_chars", [s, lit(_WHITESPACE, STRING)], STRING)
        return fn(
            "coalesce", [_strptime(text, target, "%Y-%m-%d"), cast(timestamp, target)], target
        )
    return cast(timestamp, target)


def _strptime(s: Expr, dtype: DataType, fmt: str) -> Expr:
    """Kernel ``str.strptime`` of ``s`` in format ``fmt`` to ``dtype``, NULL where it does
    not parse."""
    options = {"dtype": dtype, "format": fmt, "strict": False}
    return Function("str.strptime", (s,), tuple(sorted(options.items())), dtype)


def _temporal_text(x: Expr) -> Expr:
    """A TIMESTAMP or TIME as DuckDB writes it: the fraction of a second only when it is
    not zero, without trailing zeros (``2020-01-01 01:23:45.12``)."""
    base = "%H:%M:%S" if pa.types.is_time(x.dtype.arrow) else "%Y-%m-%d %H:%M:%S"
    text = fn("dt.to_string", [x], STRING, format=base + "%.f")  # %.f: nothing for zero
    return fn("str.replace", [text, lit(r"(\.[0-9]*?)0+$", STRING), lit("${1}", STRING)], STRING)


_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _round_timestamp(x: Expr, target: DataType) -> Expr:
    """A TIMESTAMP to a coarser one, rounded half away from zero (of the epoch) as DuckDB
    does (``45.5 s`` after the epoch is 46 s, before it 45 s); finer: as it is."""
    have, want = _PER_SECOND[x.dtype.arrow.unit], _PER_SECOND[target.arrow.unit]
    if want >= have:
        return cast(x, target)
    # The kernel keeps TIMESTAMP_S in milliseconds: work in its own unit.
    stored = _PER_SECOND[str(getattr(x.dtype.to_polars(), "time_unit", "us"))]
    factor = stored // want
    v = cast(x, INT64)
    q = binop(
        "floordiv",
        binop("add", fn("abs", [v], INT64), lit(factor // 2, INT64), INT64),
        lit(factor, INT64),
        INT64,
    )
    magnitude = binop("mul", q, lit(factor, INT64), INT64)
    rounded = Ternary(
        compare("lt", v, lit(0, INT64)), fn("neg", [magnitude], INT64), magnitude, INT64
    )
    return cast(cast(rounded, x.dtype), target)


def _to_nanoseconds(x: Expr, target: DataType, try_cast: bool) -> Expr:
    """A TIMESTAMP (seconds to microseconds) as TIMESTAMP_NS, whose 64-bit nanoseconds end
    in 1677 and 2262: beyond them DuckDB raises ``ConversionException`` (``TRY_CAST``:
    NULL)."""
    stored = _PER_SECOND[str(getattr(x.dtype.to_polars(), "time_unit", "us"))]
    limit = (2**63 - 1) // (_PER_SECOND["ns"] // stored)
    over = compare("gt", fn("abs", [cast(x, INT64)], INT64), lit(limit, INT64))
    widened = cast(x, target, strict=False)
    if try_cast:
        return Ternary(over, lit(None, target), widened, target)
    message = ["Conversion Error: Could not convert Timestamp to higher precision."]
    return Ternary(over, fail_where(over, message, target), widened, target)


def _integer_digits(dtype: DataType) -> int | None:
    """How many digits the integer part of a ``dtype`` value can have (None: unbounded,
    floating point)."""
    if dtype.is_decimal:
        return int(dtype.arrow.precision) - _scale(dtype)
    if dtype.is_integer:
        lo, hi = _integer_range(dtype)
        return max(len(str(lo)) - (lo < 0), len(str(hi)))
    return None


def _to_decimal(x: Expr, target: DataType) -> Expr:
    """``x`` (a number) as DECIMAL ``target``, NULL where it does not fit (Polars raises
    even in a non-strict cast there, so those values are replaced before the cast); NaN
    and infinities do not fit."""
    digits = int(target.arrow.precision) - _scale(target)
    have = _integer_digits(x.dtype)
    if have is not None and have <= digits:
        return cast(x, target, False)  # every value fits
    bound = decimal.Decimal(10) ** digits
    if x.dtype.is_float:
        work, limit, zero = FLOAT64, lit(float(bound), FLOAT64), lit(0.0, FLOAT64)
    else:
        work = _decimal(38, _scale(x.dtype))  # holds x, and so 10**digits (fewer digits)
        limit, zero = lit(bound, work), lit(0, work)
    wide = cast(x, work, strict=False)
    fits = compare("lt", fn("abs", [wide], work), limit)
    if x.dtype.is_float:
        fits = and_all([fits, not_(fn("is_nan", [x], BOOL))])
    safe = Ternary(fits, wide, zero, work)
    return Ternary(fits, cast(safe, target, False), lit(None, target), target)


def _cast_can_fail(src: DataType, target: DataType) -> bool:
    """Whether a cast from ``src`` to ``target`` can meet a value it cannot convert."""
    if target.is_string:
        return False
    if src.is_string:
        return True  # (numbers, BOOLEAN, DATE, TIMESTAMP: the only text casts translated)
    if target.is_decimal:
        return src.is_numeric
    if target.is_integer:
        if src.is_float or src.is_decimal:
            return True
        if src.is_integer:
            lo, hi = _integer_range(src)
            tlo, thi = _integer_range(target)
            return lo < tlo or hi > thi
    return False


def _cast_message(src: DataType, target: DataType, value: Expr) -> list[Expr | str]:
    """DuckDB's words for a value of ``src`` that does not convert to ``target``."""
    name = physical_name(target)
    if src.is_string and pa.types.is_date32(target.arrow):
        return ['invalid date field format: "', value, '", expected format is (YYYY-MM-DD)']
    if src.is_string and pa.types.is_timestamp(target.arrow):
        return [
            'invalid timestamp field format: "',
            value,
            '", expected format is (YYYY-MM-DD HH:MM[:SS[.US]][±HH[:MM[:SS]]| ZONE])',
        ]
    if src.is_string:
        if target.is_decimal:
            return ['Could not convert string "', value, f'" to {name}']
        return ["Could not convert string '", value, f"' to {name}"]
    if target.is_integer and src.is_decimal and src != HUGEINT:
        return ["Failed to cast decimal value ", value, f" to type {name}"]
    if target.is_integer:
        return [
            f"Type {physical_name(src)} with value ",
            value,
            f" can't be cast because the value is out of range for the destination type {name}",
        ]
    if target.is_decimal and src.is_decimal:
        return ['Casting value "', value, f'" to type {name} failed: value is out of range!']
    return ["Could not cast value ", value, f" to {name}"]


# ---------------------------------------------------------------- time zones


def is_tstz(dtype: DataType) -> bool:
    """Whether ``dtype`` is a TIMESTAMP WITH TIME ZONE (an Arrow timestamp with a zone)."""
    return pa.types.is_timestamp(dtype.arrow) and dtype.arrow.tz is not None


def _naive(dtype: DataType) -> DataType:
    return DataType(pa.timestamp(dtype.arrow.unit))


def local_time(x: Expr) -> Expr:
    """The wall-clock time (a TIMESTAMP) at which the instants of TIMESTAMPTZ ``x`` are
    shown in its zone: DuckDB's ``CAST(x AS TIMESTAMP)``, and what its calendar functions
    (date parts, ``date_trunc``, ``strftime``) read."""
    return fn("dt.replace_time_zone", [x], _naive(x.dtype), time_zone=None)


def utc_offset(x: Expr) -> Expr:
    """The UTC offset (microseconds, BIGINT) in effect at the instants of TIMESTAMPTZ ``x``."""
    local = fn("dt.timestamp", [local_time(x)], INT64, time_unit="us")
    return binop("sub", local, fn("dt.timestamp", [x], INT64, time_unit="us"), INT64)


def from_local(x: Expr, dtype: DataType, prefer_offset: Expr | None = None) -> Expr:
    """The instants (TIMESTAMPTZ ``dtype``) at which the wall-clock times ``x`` (TIMESTAMP)
    are shown in ``dtype``'s zone: DuckDB's ``CAST(x AS TIMESTAMPTZ)``.

    Where a time zone transition makes a wall-clock time ambiguous or skips it, DuckDB (ICU,
    ``UCAL_WALLTIME_LAST`` for both) takes the later of the two readings: a repeated time is
    read with the offset after the transition (``2024-11-03 01:30`` in New York is 06:30
    UTC), a skipped one with the offset before it (``2024-03-10 02:30`` is 07:30 UTC, shown
    as 03:30). The kernel gives the first directly (``ambiguous='latest'``); a skipped time
    comes out NULL there and is read instead as the time one day earlier, plus 24 hours
    (transitions are never a day apart).

    ``prefer_offset`` (microseconds): a repeated time is read with this offset where it is
    one of its two readings (ICU's ``add`` of days keeps the offset it started from).
    """
    zone = dtype.arrow.tz
    x = cast(x, _naive(dtype))
    ambiguous: Expr = lit("latest", STRING)
    if prefer_offset is not None:
        earliest = fn(
            "dt.replace_time_zone",
            [x, lit("earliest", STRING)],
            dtype,
            time_zone=zone,
            non_existent="null",
        )
        earliest_offset = binop(
            "sub",
            fn("dt.timestamp", [x], INT64, time_unit="us"),
            fn("dt.timestamp", [earliest], INT64, time_unit="us"),
            INT64,
        )
        ambiguous = Ternary(
            compare("eq", earliest_offset, prefer_offset),
            lit("earliest", STRING),
            lit("latest", STRING),
            STRING,
        )
    direct = fn("dt.replace_time_zone", [x, ambiguous], dtype, time_zone=zone, non_existent="null")
    day_before = fn("dt.offset_by", [x], x.dtype, by="-1d")
    earlier = fn(
        "dt.replace_time_zone",
        [day_before, lit("latest", STRING)],
        dtype,
        time_zone=zone,
        non_existent="null",
    )
    return fn("coalesce", [direct, fn("dt.offset_by", [earlier], dtype, by="24h")], dtype)


def add_interval_tstz(x: Expr, iv: Interval) -> Expr:
    """TIMESTAMPTZ ``x`` plus the interval ``iv``, as DuckDB's ICU arithmetic does it.

    Months move the wall-clock time in the session's zone (clamped to the month's end) and
    are read back as :func:`from_local` does; days move the wall-clock time too but keep
    the UTC offset the time had where the new time is repeated (ICU's ``add`` of days);
    hours and smaller units move the instant. DuckDB 2.0 adds months, then days, then the
    rest when no part is negative; when one is, the rest first, then months, then days (seen
    in DuckDB 2.0.1: from 2024-01-30 23:30 UTC, ``+ INTERVAL '1 month 1 day -1 hour'`` is
    2024-03-01 22:30).
    """

    def months(v: Expr) -> Expr:
        moved = fn("dt.offset_by", [local_time(v)], _naive(v.dtype), by=f"{iv.months}mo")
        return from_local(moved, v.dtype)

    def days(v: Expr) -> Expr:
        moved = fn("dt.offset_by", [local_time(v)], _naive(v.dtype), by=f"{iv.days}d")
        return from_local(moved, v.dtype, prefer_offset=utc_offset(v))

    def micros(v: Expr) -> Expr:
        return fn("dt.offset_by", [v], v.dtype, by=f"{iv.micros}us")

    steps = [(iv.months, months), (iv.days, days), (iv.micros, micros)]
    if min(iv.months, iv.days, iv.micros) < 0:
        steps = [steps[2], steps[0], steps[1]]
    out = x
    for amount, step in steps:
        if amount:
            out = step(out)
    return out


def _infinity(dtype: DataType) -> int:
    """DuckDB's ``infinity`` of DATE (days) or of a TIMESTAMP type (in its unit); its
    ``-infinity`` is the negation."""
    return 2**31 - 1 if pa.types.is_date32(dtype.arrow) else 2**63 - 1


def _keep_infinities(e: Expr, target: DataType, convert: Callable[[Expr], Expr]) -> Expr:
    """``convert(e)`` (a cast between DATE / TIMESTAMP types and TIMESTAMPTZ) where ``e``
    is finite; DuckDB's ``infinity`` and ``-infinity`` of ``e`` become those of ``target``
    (a cast keeps them; read as numbers they are instants beyond the kernel's calendar)."""
    top = _infinity(e.dtype)
    raw = cast(e, INT64)
    pos = compare("eq", raw, lit(top, INT64))
    neg = compare("eq", raw, lit(-top, INT64))
    finite = Ternary(or_all([pos, neg]), lit(None, e.dtype), e, e.dtype)
    out = convert(finite)
    target_top = _infinity(target)
    below = cast(lit(-target_top, INT64), target)
    return Ternary(
        pos, cast(lit(target_top, INT64), target), Ternary(neg, below, out, target), target
    )


def _tstz_cast(e: Expr, target: DataType, strict: bool) -> Expr:
    """DuckDB's casts from and to TIMESTAMPTZ: to TIMESTAMP and DATE through the
    wall-clock time in the session's zone, from them by :func:`from_local`."""
    src = e.dtype
    if is_tstz(src) and is_tstz(target):  # one zone per plan; only the unit may differ
        return cast(e, target, strict)
    if is_tstz(src):
        if pa.types.is_timestamp(target.arrow) or pa.types.is_date32(target.arrow):
            # the wall-clock time, then DuckDB's TIMESTAMP cast (coarser units rounded)
            return _keep_infinities(
                e, target, lambda v: duck_cast(local_time(v), target, not strict)
            )
        raise Unsupported(f"cast of TIMESTAMP WITH TIME ZONE to {target}")
    if pa.types.is_timestamp(src.arrow) or pa.types.is_date32(src.arrow):
        return _keep_infinities(
            # the TIMESTAMP cast rounds finer units as DuckDB does (.123456789 -> .123457)
            e,
            target,
            lambda v: from_local(duck_cast(v, _naive(target), not strict), target),
        )
    if pa.types.is_null(src.arrow):
        return lit(None, target)
    raise Unsupported(f"cast of {src} to TIMESTAMP WITH TIME ZONE")


# ---------------------------------------------------------------- translation


Ref = Callable[[int], Col]


class ExprTranslator:
    """Translates one operator's expressions; ``cols`` are the operator input's columns in
    DuckDB's positional order (``BOUND_REF`` index ``i`` reads ``cols[i]``)."""

    def __init__(
        self,
        cols: Sequence[Expr],
        error_on_division_by_zero: bool = True,
        source: SourceText | None = None,
        ieee_floating_point_ops: bool = True,
        foreign: ForeignColumns | None = None,
    ) -> None:
        self.cols = cols
        #: Where an expression over ``cols`` cannot be translated, DuckDB may compute it
        #: in the tasks instead (:mod:`shoal_duckdb.fragment`): None when it may not.
        self.foreign = foreign
        #: DuckDB's setting of that name: when false, floating-point division by zero,
        #: logarithms of zero or negative numbers, square roots of negative numbers and
        #: zero to a negative power raise instead of giving inf or NaN.
        self.ieee = ieee_floating_point_ops
        #: DuckDB's setting of that name: integer (and ``//``) division by zero raises
        #: when true, gives NULL when false.
        self.error_on_division_by_zero = error_on_division_by_zero
        #: The query text, to quote the user's expression in an :class:`Unsupported`.
        self.source = source

    # -- entry points ------------------------------------------------------------------

    def expr(self, e: dict[str, Any]) -> Expr:
        """Translate a scalar expression (raises :class:`Unsupported`).

        With :attr:`foreign` set, an expression that cannot be translated becomes a column
        that DuckDB computes in the tasks where it can (the innermost such expression
        whose type the IR carries; see :mod:`shoal_duckdb.fragment`)."""
        mark = self.foreign.mark() if self.foreign is not None else 0
        try:
            cls = e.get("expression_class")
            handler = _CLASSES.get(str(cls))
            if handler is None:
                raise Unsupported(f"expression {cls} is not supported")
            out = handler(self, e)
            if isinstance(out, Lit) and isinstance(out.value, Interval):
                raise Unsupported("an INTERVAL value outside date arithmetic")
            return out
        except Unsupported as exc:
            if self.foreign is not None:
                self.foreign.reset(mark)  # computed whole, if at all
                computed = self.foreign.compute(e)
                if computed is not None:
                    return computed
            self.locate(exc, e)
            raise

    def locate(self, exc: Unsupported, e: dict[str, Any]) -> None:
        """Give ``exc`` the user's text of ``e`` when it has none yet (the innermost
        expression that the plan locates in the query wins), or the column's name."""
        if exc.snippet is not None:
            return
        if self.source is not None:
            exc.snippet = self.source.quote(e)
        if exc.snippet is None and e.get("expression_class") == "BOUND_REF" and e.get("alias"):
            exc.snippet = f"column {e['alias']}"

    def raw(self, e: dict[str, Any]) -> Expr:
        """Like :meth:`expr` but lets an INTERVAL constant through (for date arithmetic)."""
        if e.get("expression_class") == "BOUND_CONSTANT":
            return _constant(self, e)
        return self.expr(e)

    # -- pieces -------------------------------------------------------------------------

    def ref(self, index: int) -> Expr:
        if not 0 <= index < len(self.cols):
            raise Unsupported(f"column reference #{index} out of range")
        return self.cols[index]


def rtype(e: dict[str, Any]) -> DataType:
    """The IR type of a DuckDB expression's ``return_type``."""
    try:
        return dtype_of(e["return_type"])
    except UnsupportedError as exc:
        raise Unsupported(str(exc)) from None


def _ref(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    col = t.ref(int(e["index"]))
    want = rtype(e)
    if _moves_fields(col.dtype.arrow, want.arrow):
        # DuckDB's optimizer typed the column as a STRUCT with fields in another order
        # (a cast it folded in): matched by name, as duck_cast does.
        return duck_cast(col, want)
    return col if col.dtype == want else cast(col, want)


def _constant(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    v = e["value"]
    try:
        value = value_of(v)
    except UnsupportedError as exc:
        raise Unsupported(str(exc)) from None
    if isinstance(value, Interval):
        return Lit(value, FLOAT64)  # marker; only date arithmetic consumes it
    try:
        dtype = dtype_of(v["type"])
    except UnsupportedError as exc:
        raise Unsupported(str(exc)) from None
    if isinstance(value, RawTemporal):  # beyond Python's years 1..9999: the number, cast
        return Cast(Lit(value.value, INT32 if _is_date_type(dtype) else INT64), dtype, True)
    return lit(value, dtype)


def _is_date_type(dtype: DataType) -> bool:
    return pa.types.is_date32(dtype.arrow)


def _conjunction(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    parts = [t.expr(c) for c in e["children"]]
    if e["type"] == "CONJUNCTION_AND":
        return and_all(parts)
    if e["type"] == "CONJUNCTION_OR":
        return or_all(parts)
    raise Unsupported(f"conjunction {e['type']}")


def _case(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    dtype = rtype(e)
    out = cast(t.expr(e["else_expr"]), dtype)
    for check in reversed(e["case_checks"]):
        when = t.expr(check["when_expr"])
        message = _error_message(t, check["then_expr"])
        if message is not None:
            then = raise_where(when, message, dtype)
        else:
            # a branch's errors count only where it is taken (DuckDB evaluates it there)
            then = only_where(cast(t.expr(check["then_expr"]), dtype), when)
        out = Ternary(
            when, then, only_where(out, not_(fn("coalesce", [when, lit(False, BOOL)], BOOL))), dtype
        )
    return out


def _error_message(t: ExprTranslator, e: dict[str, Any]) -> Expr | None:
    """The message of DuckDB's ``error(message)`` (as its binder writes for a scalar
    subquery that returns several rows), or None for any other expression."""
    if e.get("expression_class") != "BOUND_FUNCTION":
        return None
    if str(e.get("qname", {}).get("path", [""])[-1]).lower() != "error":
        return None
    # DuckDB's error() raises an InvalidInputException.
    text = cast(t.expr(e["children"][0]), STRING)
    return fn(
        "str.concat", [lit("Invalid Input Error: ", STRING), text], STRING, ignore_nulls=False
    )


def only_where(e: Expr, needed: Expr) -> Expr:
    """``e`` whose errors (:func:`raise_where`) fail the query only on rows where
    ``needed`` is true: DuckDB evaluates the later arguments of COALESCE and the branches
    of CASE only where they are needed, the kernel every value of each."""

    def guard(x: Expr) -> Expr | None:
        if (
            isinstance(x, Cast)
            and x.strict
            and x.dtype == INT64
            and isinstance(x.expr, Ternary)
            and x.expr.dtype == STRING
            and isinstance(x.expr.otherwise, Lit)
            and x.expr.otherwise.value is None
        ):
            inner = x.expr
            condition = and_all([inner.predicate, needed])
            return Cast(Ternary(condition, inner.then, inner.otherwise, STRING), INT64, True)
        return None

    return replace_expr(e, guard)


def raise_where(condition: Expr, message: Expr, dtype: DataType) -> Expr:
    """An expression of ``dtype`` that is NULL where ``condition`` is not true and fails
    the query where it is, with ``message`` in the error (a strict cast of the message to
    a number: the kernel has no other way to raise; Polars evaluates both branches of a
    conditional, so the message is masked by the condition first)."""
    masked = Ternary(condition, message, lit(None, STRING), STRING)
    return Cast(Cast(masked, INT64, strict=True), dtype, strict=False)


#: The error kinds DuckDB's messages start with -> DuckDB's exception class names.
DUCKDB_ERRORS: dict[str, str] = {
    "Conversion Error": "ConversionException",
    "Out of Range Error": "OutOfRangeException",
    "Invalid Input Error": "InvalidInputException",
}


def fail_where(condition: Expr, parts: Sequence[Expr | str], dtype: DataType) -> Expr:
    """:func:`raise_where` with DuckDB's message made of ``parts`` (text, and values
    written as text). The message must start with one of :data:`DUCKDB_ERRORS`: the
    DuckDB adapter raises the matching DuckDB exception class when the query fails
    (:func:`shoal_duckdb.errors.duckdb_error`)."""
    assert isinstance(parts[0], str) and parts[0].split(":")[0] in DUCKDB_ERRORS
    pieces = [lit(p, STRING) if isinstance(p, str) else _as_text(p) for p in parts]
    message = fn("str.concat", pieces, STRING, ignore_nulls=False)
    return raise_where(condition, message, dtype)


def _as_text(x: Expr) -> Expr:
    """A value as text for an error message (``NULL`` for NULL)."""
    if x.dtype.is_string:
        text = x
    elif pa.types.is_floating(x.dtype.arrow):
        text = cast(cast(x, FLOAT64), STRING, strict=False)
    else:
        text = cast(x, STRING, strict=False)
    return fn("coalesce", [text, lit("NULL", STRING)], STRING)


def physical_name(dtype: DataType) -> str:
    """DuckDB's name of a type in its error messages (``INT32``, ``DOUBLE``,
    ``DECIMAL(18,2)``)."""
    arrow = dtype.arrow
    if dtype.is_decimal and dtype == HUGEINT:
        return "INT128"
    if dtype.is_decimal:
        return f"DECIMAL({arrow.precision},{arrow.scale})"
    if pa.types.is_integer(arrow):
        sign = "INT" if pa.types.is_signed_integer(arrow) else "UINT"
        return f"{sign}{arrow.bit_width}"
    if pa.types.is_float32(arrow):
        return "FLOAT"
    if pa.types.is_float64(arrow):
        return "DOUBLE"
    if pa.types.is_boolean(arrow):
        return "BOOL"
    if pa.types.is_date32(arrow):
        return "DATE"
    if pa.types.is_timestamp(arrow):
        return "TIMESTAMP"
    return str(arrow).upper()


def _between(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    x = t.expr(e["input"])
    lo = t.expr(e["lower"])
    hi = t.expr(e["upper"])
    lower = compare("ge" if e.get("lower_inclusive", True) else "gt", x, lo)
    upper = compare("le" if e.get("upper_inclusive", True) else "lt", x, hi)
    return and_all([lower, upper])


def _source_column(child: dict[str, Any]) -> str | None:
    """The column a cast reads, as DuckDB names it in a conversion error."""
    if child.get("expression_class") in ("BOUND_REF", "BOUND_COLUMN_REF"):
        alias = child.get("alias")
        return str(alias) if alias else None
    return None


def _cast_expr(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    child = e.get("child") or e["children"][0]
    try_cast = bool(e.get("try_cast", False))
    return _user_cast(t.expr(child), rtype(e), try_cast, _source_column(child))


def _user_cast(x: Expr, target: DataType, try_cast: bool, source_column: str | None = None) -> Expr:
    """A cast the query spells out (``CAST``, ``::``, or one DuckDB's binder adds, such as
    the BIGINT of ``LIMIT <expr>``): :func:`duck_cast`, except that a cast DuckDB does not
    implement (a DATE, TIME or TIMESTAMP to a number: ``ConversionException: Unimplemented
    type for cast (DATE -> BIGINT)``) is refused rather than read as the kernel's
    day / microsecond count."""
    if x.dtype.is_temporal and (target.is_numeric or pa.types.is_boolean(target.arrow)):
        raise Unsupported(f"cast of {x.dtype} to {target} (DuckDB has no such cast)")
    return duck_cast(x, target, try_cast, source_column)


_COMPARISONS = {
    "COMPARE_EQUAL": "eq",
    "COMPARE_NOTEQUAL": "ne",
    "COMPARE_LESSTHAN": "lt",
    "COMPARE_GREATERTHAN": "gt",
    "COMPARE_LESSTHANOREQUALTO": "le",
    "COMPARE_GREATERTHANOREQUALTO": "ge",
    "COMPARE_DISTINCT_FROM": "ne_missing",
    "COMPARE_NOT_DISTINCT_FROM": "eq_missing",
}


def compare(op: str, a: Expr, b: Expr) -> Expr:
    """A comparison (``op`` an IR comparison operator). Both sides get one type first.

    ``<``, ``<=``, ``>``, ``>=`` of STRUCT values compare field by field, a NULL inside
    above every value, as DuckDB orders them (the kernel cannot compare structs); of LIST
    values they raise :class:`Unsupported`."""
    if a.dtype != b.dtype:
        a, b = _common(a, b)
    if op in ("lt", "le", "gt", "ge") and _is_nested(a.dtype):
        left, right = (a, b) if op in ("lt", "le") else (b, a)
        out = _nested_less(left, right, or_equal=op in ("le", "ge"))
        either_null = or_all([is_null(a), is_null(b)])
        return Ternary(either_null, lit(None, BOOL), out, BOOL)
    return binop(op, a, b, BOOL)


def _is_nested(dtype: DataType) -> bool:
    arrow = dtype.arrow
    return pa.types.is_struct(arrow) or pa.types.is_list(arrow) or pa.types.is_large_list(arrow)


def _nested_less(a: Expr, b: Expr, or_equal: bool) -> Expr:
    """``a < b`` (``<=`` with ``or_equal``) for two non-NULL structs, field by field:
    the first field that differs decides, a NULL field above any value."""
    arrow = a.dtype.arrow
    if not pa.types.is_struct(arrow):
        raise Unsupported(f"ordering comparison of {type_name_of(a.dtype)} values")
    decided: list[Expr] = []
    same_so_far: list[Expr] = []
    for i in range(arrow.num_fields):
        x, y = struct_field(a, i), struct_field(b, i)
        decided.append(and_all([*same_so_far, _less_with_nulls_last(x, y)]))
        same_so_far.append(binop("eq_missing", x, y, BOOL))
    if or_equal:
        decided.append(and_all(same_so_far))
    return or_all(decided) if decided else lit(or_equal, BOOL)


def _less_with_nulls_last(x: Expr, y: Expr) -> Expr:
    """``x < y`` for values inside a struct: never NULL, a NULL above every value."""
    if _is_nested(x.dtype):
        inner = _nested_less(x, y, or_equal=False)
    else:
        inner = binop("lt", x, y, BOOL)
    when_y_null = Ternary(is_null(y), lit(True, BOOL), inner, BOOL)
    return Ternary(is_null(x), lit(False, BOOL), when_y_null, BOOL)


def type_name_of(dtype: DataType) -> str:
    """DuckDB's name of the kind of a nested type (``STRUCT``, ``LIST``)."""
    return "STRUCT" if pa.types.is_struct(dtype.arrow) else "LIST"


def comparison_op(kind: str) -> str:
    """IR operator of a DuckDB comparison type (``COMPARE_LESSTHAN`` -> ``lt``)."""
    op = _COMPARISONS.get(kind)
    if op is None:
        raise Unsupported(f"comparison {kind}")
    return op


def _common(a: Expr, b: Expr) -> tuple[Expr, Expr]:
    # DuckDB's binder already gives both sides one type; this covers literals whose
    # serialised type is narrower (e.g. an INTEGER constant against a BIGINT column).
    if isinstance(b, Lit):
        return a, cast(b, a.dtype)
    if isinstance(a, Lit):
        return cast(a, b.dtype), b
    if a.dtype.is_numeric and b.dtype.is_numeric:
        return cast(a, FLOAT64), cast(b, FLOAT64)
    return a, cast(b, a.dtype)


def _operator(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    kind = e["type"]
    kids = e.get("children", [])
    if kind == "OPERATOR_NOT":
        return not_(t.expr(kids[0]))
    if kind == "OPERATOR_IS_NULL":
        return is_null(t.expr(kids[0]))
    if kind == "OPERATOR_IS_NOT_NULL":
        return is_not_null(t.expr(kids[0]))
    if kind == "OPERATOR_COALESCE":
        dtype = rtype(e)
        args = [cast(t.expr(k), dtype) for k in kids]
        # DuckDB evaluates an argument only where the ones before it are NULL: its
        # errors (a failed cast) count only there.
        guarded = [
            a if i == 0 else only_where(a, and_all([is_null(b) for b in args[:i]]))
            for i, a in enumerate(args)
        ]
        return fn("coalesce", guarded, dtype)
    if kind in ("COMPARE_IN", "COMPARE_NOT_IN"):
        out = _in(t, kids)
        return not_(out) if kind == "COMPARE_NOT_IN" else out
    raise Unsupported(f"operator {kind}")


def _in(t: ExprTranslator, kids: list[dict[str, Any]]) -> Expr:
    x = t.expr(kids[0])
    items = [t.expr(k) for k in kids[1:]]
    if x.dtype.is_enum and all(isinstance(i, Lit) and i.dtype == x.dtype for i in items):
        # the categories by name (the kernel's list of Enum values is no Enum list)
        x = cast(x, STRING)
        items = [lit(i.value, STRING) if isinstance(i, Lit) else i for i in items]
    if all(isinstance(i, Lit) for i in items):
        values = [_value_as(i, x.dtype) for i in items if isinstance(i, Lit)]
        has_null = any(v is None for v in values)
        present = [v for v in values if v is not None]
        if x.dtype.is_decimal:  # a HUGEINT constant is an int: one kind for the list
            present = [decimal.Decimal(v) if isinstance(v, int) else v for v in present]
        list_type = DataType(pa.large_list(x.dtype.arrow))
        found = fn("is_in", [x, lit(present, list_type)], BOOL)
        if has_null:
            # SQL: no match against a list holding NULL is NULL, not false.
            return Ternary(found, lit(True, BOOL), lit(None, BOOL), BOOL)
        return found
    return or_all([compare("eq", x, i) for i in items])


def _value_as(x: Lit, dtype: DataType) -> Any:
    """The value of literal ``x`` converted to ``dtype`` (Arrow's cast)."""
    if x.dtype == dtype or x.value is None:
        return x.value
    try:
        return pa.array([x.value], type=x.dtype.arrow).cast(dtype.arrow)[0].as_py()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
        raise Unsupported(f"IN list value {x.value!r} as {dtype}: {exc}") from None


def _function(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    kind = e.get("type", "")
    if kind in _COMPARISONS and e.get("is_operator"):
        kids = e["children"]
        if any(_is_interval(k) for k in kids):
            return compare(
                _COMPARISONS[kind], interval_micros(t, kids[0]), interval_micros(t, kids[1])
            )
        return compare(_COMPARISONS[kind], t.expr(kids[0]), t.expr(kids[1]))
    if kind == "OPERATOR_CAST":
        child = e["children"][0]
        try_cast = bool((e.get("function_data") or {}).get("try_cast", False))
        return _user_cast(t.expr(child), rtype(e), try_cast, _source_column(child))
    name = str(e["qname"]["path"][-1]).lower()
    handler = SCALAR_FUNCTIONS.get(name)
    if name == "array_extract" and (e["children"][0].get("return_type") or {}).get("id") in (
        "STRUCT",
        "TUPLE",
    ):
        handler = _struct_extract  # m['f'] binds to array_extract when the case differs
    if handler is None:
        raise Unsupported(f"function {name}() is not supported", function=name)
    return handler(t, e, rtype(e))


_CLASSES: dict[str, Callable[[ExprTranslator, dict[str, Any]], Expr]] = {
    "BOUND_REF": _ref,
    "BOUND_CONSTANT": _constant,
    "BOUND_CONJUNCTION": _conjunction,
    "BOUND_CASE": _case,
    "BOUND_BETWEEN": _between,
    "BOUND_CAST": _cast_expr,
    "BOUND_OPERATOR": _operator,
    "BOUND_FUNCTION": _function,
    "BOUND_COMPARISON": lambda t, e: _comparison(t, e),
}


def _comparison(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    op = comparison_op(e["type"])
    if _is_interval(e["left"]) or _is_interval(e["right"]):
        return compare(op, interval_micros(t, e["left"]), interval_micros(t, e["right"]))
    return compare(op, t.expr(e["left"]), t.expr(e["right"]))


def _is_interval(e: dict[str, Any]) -> bool:
    """Whether a serialised expression is of DuckDB type INTERVAL."""
    t = e.get("return_type") or (e.get("value") or {}).get("type") or {}
    return t.get("id") == "INTERVAL"


_MICROS_PER_DAY = 86_400_000_000


def interval_micros(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    """An INTERVAL expression as DuckDB compares intervals: normalised, a month as 30 days
    and a day as 24 hours, i.e. one number of microseconds (BIGINT). Intervals shoal can
    compute that way: constants, ``TIMESTAMP - TIMESTAMP`` (the exact difference) and
    DuckDB's ``normalized_interval()`` around them; other INTERVAL expressions raise
    :class:`Unsupported` (INTERVAL columns are not carried)."""
    cls = e.get("expression_class")
    if cls == "BOUND_CONSTANT":
        value = value_of(e["value"])
        if value is None:
            return lit(None, INT64)
        if not isinstance(value, Interval):
            raise Unsupported(f"an INTERVAL comparison with {type(value).__name__}")
        total = (value.months * 30 + value.days) * _MICROS_PER_DAY + value.micros
        return lit(total, INT64)
    if cls == "BOUND_FUNCTION":
        name = str(e["qname"]["path"][-1]).lower()
        kids = e.get("children", [])
        if name == "normalized_interval" and len(kids) == 1:
            return interval_micros(t, kids[0])
        if name in ("-", "subtract") and len(kids) == 2:
            a, b = t.expr(kids[0]), t.expr(kids[1])
            naive = all(_is_timestamp(x) and not is_tstz(x.dtype) for x in (a, b))
            if naive:  # DuckDB's difference is exact (days and microseconds)
                return binop("sub", epoch_micros(a), epoch_micros(b), INT64)
        raise Unsupported(f"an INTERVAL from {name}() in a comparison")
    raise Unsupported("an INTERVAL value outside date arithmetic")


# ---------------------------------------------------------------- scalar functions

FunctionHandler = Callable[[ExprTranslator, dict[str, Any], DataType], Expr]
SCALAR_FUNCTIONS: dict[str, FunctionHandler] = {}


def _register(*names: str) -> Callable[[FunctionHandler], FunctionHandler]:
    def deco(f: FunctionHandler) -> FunctionHandler:
        for n in names:
            SCALAR_FUNCTIONS[n] = f
        return f

    return deco


def _args(t: ExprTranslator, e: dict[str, Any]) -> list[Expr]:
    return [t.expr(c) for c in e["children"]]


def _const(x: Expr, what: str) -> Any:
    if not isinstance(x, Lit):
        raise Unsupported(f"{what} must be a constant")
    return x.value


# -- arithmetic


def _is_date(x: Expr) -> bool:
    return pa.types.is_date32(x.dtype.arrow)


def _is_timestamp(x: Expr) -> bool:
    return pa.types.is_timestamp(x.dtype.arrow)


def _interval(x: Expr) -> Interval | None:
    return x.value if isinstance(x, Lit) and isinstance(x.value, Interval) else None


def _days(x: Expr) -> Expr:
    """A DATE as its number of days since 1970-01-01 (INT32)."""
    return cast(x, INT32)


def add_interval(x: Expr, iv: Interval, sign: int, dtype: DataType) -> Expr:
    """``x`` (DATE, TIMESTAMP or TIMESTAMPTZ) plus ``sign`` times the interval, as ``dtype``.

    A TIMESTAMPTZ follows DuckDB's ICU arithmetic (:func:`add_interval_tstz`)."""
    out = cast(x, TIMESTAMP_US) if _is_date(x) else x
    if is_tstz(out.dtype):
        signed = Interval(sign * iv.months, sign * iv.days, sign * iv.micros)
        return cast(add_interval_tstz(out, signed), dtype)
    for amount, unit in ((iv.months, "mo"), (iv.days, "d"), (iv.micros, "us")):
        if amount:
            out = fn("dt.offset_by", [out], out.dtype, by=f"{sign * amount}{unit}")
    return cast(out, dtype)


def _checked_width(dtype: DataType) -> DataType:
    """A type wide enough for the exact sum, difference or product of two ``dtype`` values."""
    if dtype.arrow.bit_width <= 32:
        return INT64
    return HUGEINT


_OP_WORDS = {"add": ("addition", "+"), "sub": ("subtraction", "-"), "mul": ("multiplication", "*")}


def _integer_range(dtype: DataType) -> tuple[int, int]:
    bits = dtype.arrow.bit_width
    if pa.types.is_signed_integer(dtype.arrow):
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def _arith(op: str, a: Expr, b: Expr, dtype: DataType) -> Expr:
    """``a op b`` in ``dtype``, computed exactly in a wider type; where the result does
    not fit, the query fails with DuckDB's ``OutOfRangeException`` and message."""
    if dtype.is_decimal:
        # Exact at the result's scale: Polars rounds products to the larger input scale,
        # so both sides are widened to the result scale first.
        wide = _decimal(38, _scale(dtype))
        exact = binop(op, cast(a, wide), cast(b, wide), wide)
        digits = int(dtype.arrow.precision) - _scale(dtype)
        if digits >= 38 - _scale(dtype):
            # The result is the kernel's DECIMAL(38): Polars raises where it overflows
            # (errors.py maps that to DuckDB's OutOfRangeException). An operand with more
            # integer digits than the result's must not fail its widening cast first.
            return _guard_widening(op, a, b, dtype)
        bound = lit(decimal.Decimal(10) ** digits, wide)
        over = compare("ge", fn("abs", [exact], wide), bound)
        word, sym = _OP_WORDS[op]
        width = int(dtype.arrow.precision)
        fail = fail_where(
            over,
            [
                f"Out of Range Error: Overflow in {word} of DECIMAL({width}) (",
                a,
                f" {sym} ",
                b,
                "). You might want to add an explicit cast to a bigger decimal.",
            ],
            dtype,
        )
        return Ternary(over, fail, cast(exact, dtype, strict=False), dtype)
    if dtype.is_integer:
        wide = _checked_width(dtype)
        exact = binop(op, cast(a, wide), cast(b, wide), wide)
        lo, hi = _integer_range(dtype)
        if wide == HUGEINT and dtype.arrow.bit_width >= 64:
            lo_lit, hi_lit = lit(decimal.Decimal(lo), wide), lit(decimal.Decimal(hi), wide)
        else:
            lo_lit, hi_lit = lit(lo, wide), lit(hi, wide)
        over = or_all([compare("lt", exact, lo_lit), compare("gt", exact, hi_lit)])
        word, sym = _OP_WORDS[op]
        fail = fail_where(
            over,
            [
                f"Out of Range Error: Overflow in {word} of {physical_name(dtype)} (",
                a,
                f" {sym} ",
                b,
                ")!",
            ],
            dtype,
        )
        return Ternary(over, fail, cast(exact, dtype, strict=False), dtype)
    return binop(op, cast(a, dtype), cast(b, dtype), dtype)


def _guard_widening(op: str, a: Expr, b: Expr, dtype: DataType) -> Expr:
    """``a op b`` in the DECIMAL(38) ``dtype``: both sides widened to its scale, where
    Polars raises on overflow (``errors.py`` maps that to DuckDB's OutOfRangeException).

    Raises :class:`Unsupported` (DuckDB computes it in the tasks) when an operand has
    more integer digits than ``dtype`` holds: its widening could fail where DuckDB's
    product does not (``10**36 * 0.01``)."""
    room = 38 - _scale(dtype)
    for x in (a, b):
        if x.dtype.is_decimal and int(x.dtype.arrow.precision) - _scale(x.dtype) > room:
            raise Unsupported(f"DECIMAL(38) {_OP_WORDS[op][0]} of {x.dtype} into {dtype}")
    wide = _decimal(38, _scale(dtype))
    return cast(binop(op, cast(a, wide), cast(b, wide), wide), dtype)


@_register("+", "add")
def _plus(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    kids = [t.raw(c) for c in e["children"]]
    if len(kids) == 1:
        return cast(kids[0], dtype)
    a, b = kids
    if _interval(a) is not None:
        a, b = b, a
    iv = _interval(b)
    if iv is not None:
        if not (_is_date(a) or _is_timestamp(a)):
            raise Unsupported(f"{type_name(e['return_type'])} + INTERVAL")
        return add_interval(a, iv, 1, dtype)
    if _is_date(b) and b.dtype != a.dtype:
        a, b = b, a
    if _is_date(a) and b.dtype.is_integer:
        return cast(binop("add", _days(a), cast(b, INT32), INT32), DATE)
    if a.dtype.is_temporal or b.dtype.is_temporal:
        raise Unsupported(f"+ on {a.dtype} and {b.dtype}")
    return _arith("add", a, b, dtype)


@_register("-", "subtract")
def _minus(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    kids = [t.raw(c) for c in e["children"]]
    if len(kids) == 1:
        x = kids[0]
        if dtype.is_decimal:
            return cast(fn("neg", [x], x.dtype), dtype)
        x = cast(x, dtype)
        if pa.types.is_signed_integer(dtype.arrow):
            # -(smallest value) does not fit: DuckDB raises.
            over = compare("eq", x, lit(_integer_range(dtype)[0], dtype))
            fail = fail_where(
                over, ["Out of Range Error: Overflow in negation of numeric value!"], dtype
            )
            return Ternary(over, fail, fn("neg", [x], dtype), dtype)
        return fn("neg", [x], dtype)
    a, b = kids
    iv = _interval(b)
    if iv is not None:
        if not (_is_date(a) or _is_timestamp(a)):
            raise Unsupported(f"{a.dtype} - INTERVAL")
        return add_interval(a, iv, -1, dtype)
    if _is_date(a) and _is_date(b):
        return cast(binop("sub", _days(a), _days(b), INT32), dtype)
    if _is_date(a) and b.dtype.is_integer:
        return cast(binop("sub", _days(a), cast(b, INT32), INT32), DATE)
    if a.dtype.is_temporal or b.dtype.is_temporal:
        raise Unsupported(f"- on {a.dtype} and {b.dtype}")
    return _arith("sub", a, b, dtype)


@_register("*", "multiply")
def _times(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    a, b = _args(t, e)
    return _arith("mul", a, b, dtype)


def trunc_div(a: Expr, b: Expr, dtype: DataType) -> Expr:
    """Integer division truncating toward zero (DuckDB's ``//`` on integers): Polars'
    floor division, plus one where the remainder is not zero and the signs differ. The
    one quotient that does not fit (the smallest value divided by -1) fails the query
    with DuckDB's ``OutOfRangeException``."""
    a, b = cast(a, dtype), cast(b, dtype)
    q = binop("floordiv", a, b, dtype)
    r = binop("mod", a, b, dtype)
    if not pa.types.is_signed_integer(dtype.arrow):
        return q
    signs_differ = binop(
        "xor", compare("lt", a, lit(0, dtype)), compare("lt", b, lit(0, dtype)), BOOL
    )
    inexact = and_all([signs_differ, compare("ne", r, lit(0, dtype))])
    out = Ternary(inexact, binop("add", q, lit(1, dtype), dtype), q, dtype)
    lo, _ = _integer_range(dtype)
    over = and_all([compare("eq", a, lit(lo, dtype)), compare("eq", b, lit(-1, dtype))])
    fail = fail_where(over, ["Out of Range Error: Overflow in division of ", a, " / ", b], dtype)
    return Ternary(over, fail, out, dtype)


def c_mod(a: Expr, b: Expr, dtype: DataType) -> Expr:
    """Remainder with the sign of the dividend (DuckDB's ``%``)."""
    if dtype.is_decimal:
        wide = _decimal(38, _scale(dtype))
        a, b = cast(a, wide), cast(b, wide)
        r = binop("mod", fn("abs", [a], wide), fn("abs", [b], wide), wide)
        out = Ternary(compare("lt", a, lit(0, wide)), fn("neg", [r], wide), r, wide)
        return cast(out, dtype)
    a, b = cast(a, dtype), cast(b, dtype)
    if not dtype.is_integer:
        r = binop("mod", fn("abs", [a], dtype), fn("abs", [b], dtype), dtype)
        return Ternary(compare("lt", a, lit(0, dtype)), fn("neg", [r], dtype), r, dtype)
    # Polars' remainder has the sign of the divisor: take b back where the signs differ.
    r = binop("mod", a, b, dtype)
    if not pa.types.is_signed_integer(dtype.arrow):
        return r
    signs_differ = binop(
        "xor", compare("lt", a, lit(0, dtype)), compare("lt", b, lit(0, dtype)), BOOL
    )
    inexact = and_all([signs_differ, compare("ne", r, lit(0, dtype))])
    return Ternary(inexact, binop("sub", r, b, dtype), r, dtype)


def by_zero(t: ExprTranslator, a: Expr, b: Expr, out: Expr, dtype: DataType, op: str) -> Expr:
    """``out`` where the divisor ``b`` is not zero; where it is (and ``a`` is not NULL),
    DuckDB's rule: an error, or NULL with ``error_on_division_by_zero`` off."""
    zero = and_all([compare("eq", b, lit(0, b.dtype)), is_not_null(a)])
    if t.error_on_division_by_zero:
        # DuckDB writes the expression; shoal the values (its expressions have no text).
        fail = fail_where(
            zero,
            [
                "Invalid Input Error: Division by zero in expression (",
                a,
                f" {op} ",
                b,
                "). Use TRY(...) to return NULL for this expression, or SET "
                "error_on_division_by_zero=false to return NULL for all divisions by zero.",
            ],
            dtype,
        )
        return Ternary(zero, fail, out, dtype)
    return Ternary(zero, lit(None, dtype), out, dtype)


@_register("/", "divide")
def _divide(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    a, b = _args(t, e)
    if dtype.is_float:
        out = cast(float_divide(cast(a, FLOAT64), cast(b, FLOAT64)), dtype)
        return out if t.ieee else by_zero(t, a, b, out, dtype, "/")
    if dtype.is_integer:  # SET integer_division = true
        return by_zero(t, a, b, trunc_div(a, b, dtype), dtype, "/")
    raise Unsupported(f"/ with result type {dtype}")


@_register("fdiv")
def _fdiv(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """DuckDB's ``fdiv(a, b)``: ``floor(a / b)`` in DOUBLE (``//`` divides instead)."""
    a, b = (cast(x, FLOAT64) for x in _args(t, e))
    out = cast(fn("floor", [float_divide(a, b)], FLOAT64), dtype)
    return out if t.ieee else by_zero(t, a, b, out, dtype, "/")


@_register("fmod")
def _fmod(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """DuckDB's ``fmod(a, b)``: ``a - floor(a / b) * b`` in DOUBLE, with the sign of
    ``b`` (Polars' ``%`` on floats; ``%`` in DuckDB takes the dividend's sign)."""
    a, b = (cast(x, FLOAT64) for x in _args(t, e))
    out = cast(binop("mod", a, b, FLOAT64), dtype)
    if t.ieee:
        return out
    zero = and_all([compare("eq", b, lit(0.0, FLOAT64)), is_not_null(a)])
    if not t.error_on_division_by_zero:
        return Ternary(zero, lit(None, dtype), out, dtype)
    fail = fail_where(
        zero,
        [
            "Invalid Input Error: Division by zero in expression fmod(",
            a,
            ", ",
            b,
            "). Use TRY(...) to return NULL for this expression, or SET "
            "error_on_division_by_zero=false to return NULL for all divisions by zero.",
        ],
        dtype,
    )
    return Ternary(zero, fail, out, dtype)


@_register("//")
def _int_divide(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    a, b = _args(t, e)
    if dtype.is_integer:
        return by_zero(t, a, b, trunc_div(a, b, dtype), dtype, "//")
    if dtype.is_float:
        out = cast(float_divide(cast(a, FLOAT64), cast(b, FLOAT64)), dtype)
        return by_zero(t, a, b, out, dtype, "//")
    raise Unsupported(f"// with result type {dtype}")


@_register("%", "mod")
def _modulo(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    a, b = _args(t, e)
    if not dtype.is_numeric:
        raise Unsupported(f"% with result type {dtype}")
    if dtype.is_float and t.ieee:  # x % 0.0 is NaN
        return c_mod(a, b, dtype)
    return by_zero(t, a, b, c_mod(a, b, dtype), dtype, "%")


# -- numbers


def _unary(name: str, work: DataType | None = None) -> FunctionHandler:
    def handler(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
        (x,) = _args(t, e)
        w = work or dtype
        return cast(fn(name, [cast(x, w)], w), dtype)

    return handler


@_register("abs", "@")
def _abs(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``abs``; of the smallest value of a signed integer type, DuckDB's
    ``OutOfRangeException`` (Polars would give the value back unchanged)."""
    (x,) = _args(t, e)
    x = cast(x, dtype)
    out = fn("abs", [x], dtype)
    if not pa.types.is_signed_integer(dtype.arrow):
        return out
    over = compare("eq", x, lit(_integer_range(dtype)[0], dtype))
    fail = fail_where(over, ["Out of Range Error: Overflow on abs(", x, ")"], dtype)
    return Ternary(over, fail, out, dtype)


@_register("sign")
def _sign(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """DuckDB's ``sign``: 1, -1, or 0 for zero, -0.0 and NaN (Polars' ``sign`` gives NaN
    for NaN, and the TINYINT result cannot hold it); computed in the input's own type."""
    (x,) = _args(t, e)
    positive = compare("gt", x, lit(0, x.dtype))
    if x.dtype.is_float:  # NaN sorts above every number in the kernel's comparisons
        positive = and_all([positive, not_(fn("is_nan", [x], BOOL))])
    out = Ternary(
        positive,
        lit(1, dtype),
        Ternary(compare("lt", x, lit(0, x.dtype)), lit(-1, dtype), lit(0, dtype), dtype),
        dtype,
    )
    return Ternary(is_null(x), lit(None, dtype), out, dtype)


for _name, _impl in (("cbrt", "cbrt"), ("exp", "exp")):
    SCALAR_FUNCTIONS[_name] = _unary(_impl, FLOAT64)


def _domain(t: ExprTranslator, out: Expr, checks: list[tuple[Expr, str]]) -> Expr:
    """``out``, failing with DuckDB's ``OutOfRangeException`` where a condition of
    ``checks`` holds (the first that holds gives the message), when the connection has
    ``ieee_floating_point_ops`` off; ``out`` itself (inf or NaN there) when it is on."""
    if t.ieee:
        return out
    for condition, message in reversed(checks):
        fail = fail_where(condition, [f"Out of Range Error: {message}"], out.dtype)
        out = Ternary(condition, fail, out, out.dtype)
    return out


def _log_checks(x: Expr) -> list[tuple[Expr, str]]:
    return [
        (compare("eq", x, lit(0.0, FLOAT64)), "cannot take logarithm of zero"),
        (compare("lt", x, lit(0.0, FLOAT64)), "cannot take logarithm of a negative number"),
    ]


@_register("sqrt")
def _sqrt(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    x = cast(x, FLOAT64)
    negative = compare("lt", x, lit(0.0, FLOAT64))
    out = cast(fn("sqrt", [x], FLOAT64), dtype)
    return _domain(t, out, [(negative, "cannot take square root of a negative number")])


@_register("floor", "ceil", "ceiling")
def _floor_ceil(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    name = "floor" if e["qname"]["path"][-1].lower() == "floor" else "ceil"
    if x.dtype.is_integer:
        return cast(x, dtype)
    if x.dtype.is_decimal:
        raise Unsupported(f"{name}() of a DECIMAL")
    return cast(fn(name, [cast(x, FLOAT64)], FLOAT64), dtype)


@_register("round")
def _round(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    args = _args(t, e)
    x = args[0]
    places = int(_const(args[1], "round()'s precision")) if len(args) > 1 else 0
    if x.dtype.is_integer:
        if places >= 0:
            return cast(x, dtype)
        raise Unsupported("round() of an integer to negative places")
    if places < 0:
        raise Unsupported("round() to negative places")
    return cast(round_half_away(x, places, x.dtype), dtype)


@_register("ln")
def _ln(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    x = cast(x, FLOAT64)
    out = fn("log", [x, lit(2.718281828459045, FLOAT64)], dtype)
    return _domain(t, out, _log_checks(x))


@_register("log10", "log", "log2")
def _log(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    name = e["qname"]["path"][-1].lower()
    args = _args(t, e)
    if name == "log" and len(args) == 2:  # log(b, x)
        base, x = cast(args[0], FLOAT64), cast(args[1], FLOAT64)
        out = fn("log", [x, base], dtype)
        one = compare("eq", base, lit(1.0, FLOAT64))
        return _domain(
            t,
            out,
            [*_log_checks(base), *_log_checks(x), (one, "division by zero in based logarithm")],
        )
    base_value = 2.0 if name == "log2" else 10.0  # DuckDB's log(x) is log10
    x = cast(args[0], FLOAT64)
    out = fn("log", [x, lit(base_value, FLOAT64)], dtype)
    return _domain(t, out, _log_checks(x))


@_register("pow", "power", "**", "^")
def _pow(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    a, b = (cast(x, FLOAT64) for x in _args(t, e))
    out = fn("pow", [a, b], dtype)
    zero_to_negative = and_all(
        [compare("eq", a, lit(0.0, FLOAT64)), compare("lt", b, lit(0.0, FLOAT64))]
    )
    return _domain(t, out, [(zero_to_negative, "zero raised to a negative power is undefined")])


@_register("greatest", "least")
def _greatest(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    name = "max_horizontal" if e["qname"]["path"][-1].lower() == "greatest" else "min_horizontal"
    return fn(name, [cast(a, dtype) for a in _args(t, e)], dtype)


@_register("constant_or_null")
def _constant_or_null(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    # DuckDB's optimizer: the constant, or NULL where any other argument is NULL.
    args = _args(t, e)
    value = cast(args[0], dtype)
    if len(args) == 1:
        return value
    any_null = or_all([is_null(a) for a in args[1:]])
    return Ternary(any_null, lit(None, dtype), value, dtype)


@_register("isnan")
def _isnan(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    return fn("is_nan", [x], BOOL)


@_register("isinf")
def _isinf(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    return fn("is_infinite", [x], BOOL)


@_register("isfinite")
def _isfinite(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    return fn("is_finite", [x], BOOL)


# -- structs


@_register("struct_extract", "struct_extract_at")
def _struct_extract(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``m.f``, ``m['f']``, ``struct_extract(m, 'f')`` (field names match without regard to
    case, as DuckDB binds them), ``struct_extract(m, i)`` and ``struct_extract_at(m, i)``
    (``i`` from 1)."""
    x, key = _args(t, e)
    which = _const(key, "the struct field")
    arrow = x.dtype.arrow
    if not pa.types.is_struct(arrow):
        raise Unsupported(f"struct_extract() of {x.dtype}")
    if isinstance(which, str):
        names = [arrow.field(i).name.lower() for i in range(arrow.num_fields)]
        if which.lower() not in names:
            raise Unsupported(f"struct field {which!r} not found")
        index = names.index(which.lower())
    else:
        index = int(which) - 1
    return cast(struct_field(x, index), dtype)


@_register("struct_pack", "row")
def _struct_pack(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``{'a': x, 'b': y}`` and ``struct_pack(a := x, b := y)``: the field names and types
    are those DuckDB bound (the result type)."""
    arrow = dtype.arrow
    args = _args(t, e)
    if not pa.types.is_struct(arrow) or arrow.num_fields != len(args):
        raise Unsupported(f"struct_pack() into {dtype}")
    fields = tuple(arrow.field(i).name for i in range(arrow.num_fields))
    if any(not f for f in fields) or len({f.lower() for f in fields}) != len(fields):
        raise Unsupported("a struct with unnamed or duplicate field names")
    parts = [cast(a, DataType(arrow.field(i).type)) for i, a in enumerate(args)]
    return fn("as_struct", parts, dtype, fields=fields)


# -- strings


def _str_unary(name: str) -> FunctionHandler:
    def handler(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
        (x,) = _args(t, e)
        if _is_list(x) and name == "str.len_chars":  # length(list): its number of elements
            return cast(fn("list.len", [x], IDX), dtype)
        return cast(fn(name, [x], x.dtype if name.startswith("str.to_") else IDX), dtype)

    return handler


for _name in ("lower", "lcase"):
    SCALAR_FUNCTIONS[_name] = _str_unary("str.to_lowercase_simple")
for _name in ("upper", "ucase"):
    SCALAR_FUNCTIONS[_name] = _str_unary("str.to_uppercase_simple")
for _name in ("length", "len", "char_length", "character_length", "array_length"):
    SCALAR_FUNCTIONS[_name] = _str_unary("str.len_chars")
for _name in ("strlen", "octet_length"):
    SCALAR_FUNCTIONS[_name] = _str_unary("str.len_bytes")


@_register("concat")
def _concat(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    if not dtype.is_string:
        raise Unsupported(f"concat() of {type_name(e['return_type'])}")
    args = [cast(a, STRING) for a in _args(t, e)]
    return fn("str.concat", args, STRING, ignore_nulls=True)  # DuckDB skips NULLs


@_register("||")
def _concat_op(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    if not dtype.is_string:
        raise Unsupported(f"|| on {type_name(e['return_type'])}")
    args = [cast(a, STRING) for a in _args(t, e)]
    return fn("str.concat", args, STRING, ignore_nulls=False)


@_register("substring", "substr")
def _substring(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    args = _args(t, e)
    s = args[0]
    start = int(_const(args[1], "substring()'s start"))
    given = int(_const(args[2], "substring()'s length")) if len(args) > 2 else None
    # DuckDB's limits on both (an OutOfRangeException on every row).
    for what, value in (("offset", start), ("length", given)):
        if value is not None and not -(2**32) <= value <= 2**32 - 1:
            bound = "> 4294967295" if value > 0 else "< -4294967296"
            message = f"Out of Range Error: Substring {what} outside of supported range ({bound})"
            return fail_where(lit(True, BOOL), [message], dtype)
    if start < 1:
        raise Unsupported("substring() with a start below 1")
    length = 2**31 - 1 if given is None else given
    if length < 0:
        raise Unsupported("substring() with a negative length")
    return fn("str.slice", [s, lit(start - 1, INT64), lit(length, INT64)], dtype)


@_register("left")
def _left(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    s, n = _args(t, e)
    count = int(_const(n, "left()'s count"))
    if count < 0:
        raise Unsupported("left() with a negative count")
    return fn("str.head", [s, lit(count, INT64)], dtype)


@_register("right")
def _right(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    s, n = _args(t, e)
    count = int(_const(n, "right()'s count"))
    if count < 0:
        raise Unsupported("right() with a negative count")
    return fn("str.tail", [s, lit(count, INT64)], dtype)


@_register("trim", "ltrim", "rtrim")
def _trim(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    name = e["qname"]["path"][-1].lower()
    args = _args(t, e)
    chars = args[1] if len(args) > 1 else lit(" ", STRING)  # DuckDB trims spaces only
    impl = {
        "trim": "str.strip_chars",
        "ltrim": "str.strip_chars_start",
        "rtrim": "str.strip_chars_end",
    }[name]
    out = fn(impl, [args[0], chars], dtype)
    if isinstance(chars, Lit):
        return out if chars.value is not None else lit(None, dtype)
    # NULL characters give NULL (Polars would strip whitespace).
    return Ternary(is_null(chars), lit(None, dtype), out, dtype)


@_register("replace")
def _replace(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    s, old, new = _args(t, e)
    return fn("str.replace", [s, old, new], dtype, literal=True, n=-1)


@_register("reverse")
def _reverse(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (s,) = _args(t, e)
    return fn("str.reverse", [s], dtype)


@_register("prefix", "starts_with", "^@")
def _prefix(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    s, p = _args(t, e)
    return fn("str.starts_with", [s, p], BOOL)


@_register("suffix", "ends_with")
def _suffix(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    s, p = _args(t, e)
    return fn("str.ends_with", [s, p], BOOL)


@_register("contains")
def _contains(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    s, p = _args(t, e)
    if not s.dtype.is_string:
        raise Unsupported("contains() on a non-string")
    return fn("str.contains", [s, p], BOOL, literal=True)


@_register("regexp_matches", "regexp_full_match")
def _regexp(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    args = _args(t, e)
    if len(args) != 2:
        raise Unsupported("regular expression options")
    pattern = str(_const(args[1], "the regular expression"))
    _check_pattern(pattern)
    if e["qname"]["path"][-1].lower() == "regexp_full_match":
        pattern = f"^(?:{pattern})$"
    return fn("str.contains", [args[0], lit(pattern, STRING)], BOOL)


def _check_pattern(pattern: str) -> None:
    """Refuse (:class:`Unsupported`) a constant regular expression the kernel cannot parse
    (``'*'``): DuckDB raises InvalidInputException for it, the kernel a ComputeError in
    the tasks; the fallback gives DuckDB's own error."""
    try:
        pl.select(pl.lit("").str.contains(pattern))
    except pl.exceptions.PolarsError:
        raise Unsupported(f"regular expression {pattern!r} that does not parse") from None


#: Characters with a meaning in the kernel's (Rust) regular expression syntax.
_REGEX_META = set("\\.+*?()|[]{}^$#&-~")


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


def like(s: Expr, pattern: str, escape: str | None = None, ignore_case: bool = False) -> Expr:
    """``s LIKE pattern`` (``ILIKE`` with ``ignore_case``): ``%`` matches any characters,
    ``_`` any one character, ``escape`` makes the next character literal.

    Simple patterns become equality, prefix, suffix or substring tests; others an anchored
    regular expression."""
    tokens: list[str] = []  # "%", "_" or one literal character prefixed by "="
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape and c == escape:
            if i + 1 >= len(pattern):
                raise Unsupported("LIKE pattern ends with the escape character")
            tokens.append("=" + pattern[i + 1])
            i += 2
            continue
        tokens.append(c if c in "%_" else "=" + c)
        i += 1
    if not ignore_case and "_" not in tokens:
        pieces: list[str] = []
        current = ""
        for tok in tokens:
            if tok == "%":
                pieces.append(current)
                current = ""
            else:
                current += tok[1:]
        pieces.append(current)
        if len(pieces) == 1:
            return compare("eq", s, lit(pieces[0], STRING))
        inner = pieces[1:-1]
        if not inner or all(p == "" for p in inner):
            parts: list[Expr] = []
            head, tail = pieces[0], pieces[-1]
            if head:
                parts.append(fn("str.starts_with", [s, lit(head, STRING)], BOOL))
            if tail:
                parts.append(fn("str.ends_with", [s, lit(tail, STRING)], BOOL))
            if head and tail:
                n = len(head) + len(tail)
                parts.append(compare("ge", fn("str.len_chars", [s], IDX), lit(n, IDX)))
            if not parts:  # '%' alone: any non-null string
                return Ternary(is_null(s), lit(None, BOOL), lit(True, BOOL), BOOL)
            return and_all(parts)
        if len(pieces) == 3 and not pieces[0] and not pieces[2]:
            return fn("str.contains", [s, lit(pieces[1], STRING)], BOOL, literal=True)
    regex = "".join(
        ".*" if tok == "%" else "." if tok == "_" else _regex_escape(tok[1:]) for tok in tokens
    )
    flags = "(?si)" if ignore_case else "(?s)"
    return fn("str.contains", [s, lit(f"{flags}^{regex}$", STRING)], BOOL)


def _like_handler(negate: bool, ignore_case: bool, with_escape: bool) -> FunctionHandler:
    def handler(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
        args = _args(t, e)
        pattern = _const(args[1], "the LIKE pattern")
        if pattern is None:
            return lit(None, BOOL)
        escape = None
        if with_escape:
            escape = _const(args[2], "the LIKE escape character")
            if escape is not None and len(str(escape)) != 1:
                raise Unsupported("a LIKE escape of more than one character")
        out = like(args[0], str(pattern), escape, ignore_case)
        return not_(out) if negate else out

    return handler


SCALAR_FUNCTIONS.update(
    {
        "~~": _like_handler(False, False, False),
        "!~~": _like_handler(True, False, False),
        "~~*": _like_handler(False, True, False),
        "!~~*": _like_handler(True, True, False),
        "like_escape": _like_handler(False, False, True),
        "not_like_escape": _like_handler(True, False, True),
        "ilike_escape": _like_handler(False, True, True),
        "not_ilike_escape": _like_handler(True, True, True),
    }
)


# -- lists


def _is_list(x: Expr | DataType) -> bool:
    dtype = x if isinstance(x, DataType) else x.dtype
    return pa.types.is_large_list(dtype.arrow)


def _absent(x: Expr) -> bool:
    """A slice bound left out (``l[:2]``): DuckDB binds it as an empty list constant."""
    return isinstance(x, Lit) and isinstance(x.value, list) and not x.value


def _when(cond: Expr, then: Expr, otherwise: Expr) -> Expr:
    return Ternary(cond, then, otherwise, then.dtype)


def _null_if_any_null(parts: Sequence[Expr], out: Expr) -> Expr:
    """``out``, NULL where any of ``parts`` is NULL."""
    checks = [is_null(p) for p in parts if not (isinstance(p, Lit) and p.value is not None)]
    if any(isinstance(p, Lit) and p.value is None for p in parts):
        return lit(None, out.dtype)
    return Ternary(or_all(checks), lit(None, out.dtype), out, out.dtype) if checks else out


@_register("array_extract", "list_extract", "list_element")
def _array_extract(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``l[i]``: the ``i``-th element (1-based; negative counts from the end); NULL out of
    range or for ``i = 0``. On a string, the ``i``-th character ('' out of range)."""
    x, i = _args(t, e)
    if x.dtype.is_string:
        index = _const(i, "the index of a string")
        if index is None:
            return lit(None, dtype)
        index = int(index)
        if abs(index) >= 2**31:
            # DuckDB raises OutOfRangeException past 2**32 - 1; refused well before it.
            raise Unsupported(f"a string index {index} out of DuckDB's supported range")
        if index == 0:
            return _null_if_any_null([x], lit("", STRING))
        start = index - 1 if index > 0 else index
        return fn("str.slice", [x, lit(start, INT64), lit(1, INT64)], dtype)
    if not _is_list(x):
        raise Unsupported(f"array_extract() on {x.dtype}")
    i = cast(i, INT64)
    # Polars' list.get counts from 0, and from the end for negative indexes, as DuckDB
    # does from 1; index 0 is out of range in DuckDB.
    position = _when(compare("gt", i, lit(0, INT64)), binop("sub", i, lit(1, INT64), INT64), i)
    position = _when(compare("eq", i, lit(0, INT64)), lit(None, INT64), position)
    element = DataType(x.dtype.arrow.value_type)
    return cast(fn("list.get", [x, position], element, null_on_oob=True), dtype)


@_register("array_slice", "list_slice")
def _array_slice(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``l[b:e]`` / ``array_slice(l, b, e)``: elements ``b`` to ``e`` inclusive (1-based;
    negative bounds count from the end; 0 and bounds past either end are clamped; empty
    when ``b > e``); NULL when a bound is NULL. Strings slice by characters."""
    args = _args(t, e)
    if len(args) == 4 and not (isinstance(args[3], Lit) and args[3].value == 1):
        raise Unsupported("array_slice() with a step other than 1")
    x, begin, end = args[:3]
    if _is_list(x):
        length: Expr = cast(fn("list.len", [x], IDX), INT64)
    elif x.dtype.is_string:
        length = cast(fn("str.len_chars", [x], IDX), INT64)
    else:
        raise Unsupported(f"array_slice() on {x.dtype}")
    zero, one = lit(0, INT64), lit(1, INT64)
    if _absent(begin):
        offset: Expr = zero
    else:
        b = cast(begin, INT64)
        from_end = fn("max_horizontal", [binop("add", length, b, INT64), zero], INT64)
        offset = _when(
            compare("gt", b, zero),
            binop("sub", b, one, INT64),
            _when(compare("eq", b, zero), zero, from_end),
        )
    if _absent(end):
        stop: Expr = length
    else:
        en = cast(end, INT64)
        stop = _when(
            compare("ge", en, zero),
            fn("min_horizontal", [en, length], INT64),
            binop("add", binop("add", length, en, INT64), one, INT64),
        )
    count = fn("max_horizontal", [binop("sub", stop, offset, INT64), zero], INT64)
    name = "list.slice" if _is_list(x) else "str.slice"
    out = cast(fn(name, [x, offset, count], x.dtype), dtype)
    bounds = [b for b in (begin, end) if not _absent(b)]
    return _null_if_any_null(bounds, out)


@_register("list_value", "list_pack")
def _list_value(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``list_value(a, b, ...)`` / ``[a, b, ...]`` of expressions: one list per row, NULL
    arguments kept as NULL elements."""
    args = _args(t, e)
    if not _is_list(dtype) or not args:
        raise Unsupported(f"list_value() of type {dtype}")
    element = DataType(dtype.arrow.value_type)
    if _is_list(element):  # the kernel's concat_list would concatenate them
        raise Unsupported("list_value() of lists")
    return fn("concat_list", [cast(a, element) for a in args], dtype)


@_register("list_aggr", "list_aggregate", "array_aggr", "array_aggregate")
def _list_aggr(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``list_aggr(l, 'name'[, arg])`` (and the ``list_<name>`` macros DuckDB rewrites to
    it) for ``count`` (non-NULL elements), ``first``/``last`` (NULL elements count),
    ``string_agg`` (NULLs skipped; NULL for none), ``sum`` of integers and decimals (exact,
    NULL for none) and ``min``/``max`` of integers; NULL for a NULL list."""
    args = _args(t, e)
    x = args[0]
    name = _const(args[1], "list_aggr()'s function name") if len(args) > 1 else None
    if not _is_list(x) or not isinstance(name, str):
        raise Unsupported("list_aggr() of a non-list or with a computed function name")
    name = name.lower()
    element = DataType(x.dtype.arrow.value_type)
    present = fn("list.drop_nulls", [x], x.dtype)
    count = cast(fn("list.len", [present], IDX), INT64)
    none = compare("eq", count, lit(0, INT64))
    if name == "count":
        return cast(count, dtype)
    if name in ("first", "last", "arbitrary"):
        at = 0 if name in ("first", "arbitrary") else -1
        return cast(fn("list.get", [x, lit(at, INT64)], element, null_on_oob=True), dtype)
    if name in ("string_agg", "group_concat", "listagg"):
        sep = _const(args[2], "the separator") if len(args) > 2 else ","
        if sep is None:
            return lit(None, dtype)
        joined = fn(
            "list.join",
            [cast(x, DataType(pa.large_list(STRING.arrow))), lit(str(sep), STRING)],
            STRING,
            ignore_nulls=True,
        )
        return cast(Ternary(none, lit(None, STRING), joined, STRING), dtype)
    if name == "sum" and (element.is_integer or element.is_decimal):
        wide = _decimal(38, _scale(element))
        total = fn("list.sum", [cast(x, DataType(pa.large_list(wide.arrow)))], wide)
        return cast(Ternary(none, lit(None, wide), total, wide), dtype)
    if name in ("min", "max") and element.is_integer:
        return cast(fn(f"list.{name}", [x], element), dtype)
    raise Unsupported(f"list_aggr(..., '{name}') of {element}")


@_register("list_contains", "list_has", "array_contains", "array_has")
def _list_contains(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """Whether the list holds the value (NaN equals NaN, -0.0 equals 0.0; NULL elements
    never match); NULL when the list is NULL, or when the value is NULL and the list is
    not empty (an empty list holds nothing: false)."""
    x, item = _args(t, e)
    if not _is_list(x):
        raise Unsupported(f"list_contains() on {x.dtype}")
    item = cast(item, DataType(x.dtype.arrow.value_type))
    found = fn("list.contains", [x, item], BOOL, nulls_equal=False)
    empty = compare("eq", fn("list.len", [x], IDX), lit(0, IDX))
    return _null_if_any_null([x], _when(empty, lit(False, BOOL), _null_if_any_null([item], found)))


@_register("string_split", "str_split", "string_to_array", "split")
def _string_split(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """The pieces of a string between the (literal) separator; an empty separator splits
    into characters; a NULL separator gives the whole string as one piece."""
    x, sep = _args(t, e)
    if not x.dtype.is_string:
        raise Unsupported(f"string_split() on {x.dtype}")
    if isinstance(sep, Lit) and sep.value is None:
        return cast(fn("concat_list", [x], DataType(pa.large_list(STRING.arrow))), dtype)
    pieces = fn("str.split", [x, cast(sep, STRING)], DataType(pa.large_list(STRING.arrow)))
    return cast(pieces, dtype)


# -- regular expressions


def re2_rewrite(replacement: str) -> str:
    """A DuckDB (RE2) replacement string in the kernel's (Rust ``regex``) syntax: ``\\N``
    is group N, ``\\\\`` a backslash, ``$`` a plain character."""
    out: list[str] = []
    i = 0
    while i < len(replacement):
        c = replacement[i]
        if c == "\\":
            nxt = replacement[i + 1 : i + 2]
            if nxt.isdigit():
                out.append("${" + nxt + "}")
            elif nxt == "\\":
                out.append("\\")
            else:
                raise Unsupported(f"regexp_replace() replacement {replacement!r} (RE2 rewrite)")
            i += 2
            continue
        out.append("$$" if c == "$" else c)
        i += 1
    return "".join(out)


def _check_groups(pattern: str, replacement: str) -> None:
    """Refuse (:class:`Unsupported`) a replacement that names a group ``\\N`` the pattern
    does not have (DuckDB raises InvalidInputException for it; the kernel would put an
    empty string), or a pattern whose groups cannot be counted here."""
    named = [int(m.group(1)) for m in re.finditer(r"\\(\\|\d)", replacement) if m.group(1) != "\\"]
    if not named:
        return
    try:  # inline flags (?m) capture nothing; Python only takes them at the start
        groups = re.compile(re.sub(r"\(\?[a-zA-Z]+\)", "", pattern)).groups
    except re.error:
        raise Unsupported(f"regexp_replace() pattern {pattern!r} with groups named") from None
    for n in named:
        if n > groups:
            raise Unsupported(
                f"regexp_replace() replacement {replacement!r} names group {n},"
                f" the pattern has {groups}"
            )


@_register("regexp_replace")
def _regexp_replace(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``regexp_replace(s, pattern, replacement[, options])``: the first match replaced, or
    every match with option ``g``; ``i`` ignores case, ``c`` respects it. The pattern and
    replacement must be constants (RE2 and Rust's ``regex`` agree on the usual syntax)."""
    args = _args(t, e)
    s, pattern, replacement = args[:3]
    options = str(_const(args[3], "regexp_replace()'s options") or "") if len(args) > 3 else ""
    pat = _const(pattern, "regexp_replace()'s pattern")
    rep = _const(replacement, "regexp_replace()'s replacement")
    if pat is None or rep is None:
        return lit(None, dtype)
    _check_pattern(str(pat))
    if set(options) - set("gic"):
        raise Unsupported(f"regexp_replace() options {options!r}")
    _check_groups(str(pat), str(rep))
    flags = ""
    for c in options:  # the last of i and c wins
        if c in "ic":
            flags = "(?i)" if c == "i" else ""
    n = -1 if "g" in options else 1
    out = fn(
        "str.replace",
        [s, lit(flags + str(pat), STRING), lit(re2_rewrite(str(rep)), STRING)],
        STRING,
        literal=False,
        n=n,
    )
    return cast(out, dtype)


# -- dates and times

#: DuckDB date part -> (kernel function, post-processing).
_PARTS: dict[str, str] = {
    "year": "dt.year",
    "month": "dt.month",
    "day": "dt.day",
    "quarter": "dt.quarter",
    "hour": "dt.hour",
    "minute": "dt.minute",
    "second": "dt.second",
    "week": "dt.week",
    "weekofyear": "dt.week",
    "dayofyear": "dt.ordinal_day",
    "doy": "dt.ordinal_day",
    "isodow": "dt.weekday",
    "dayofweek": "dt.weekday",
    "dow": "dt.weekday",
    "dayofmonth": "dt.day",
}


#: Parts of the time under a minute, with the multiplier of whole seconds (DuckDB's
#: ``millisecond`` and ``microsecond`` count from the start of the minute).
_SUBMINUTE = {
    "millisecond": ("dt.millisecond", 1000),
    "milliseconds": ("dt.millisecond", 1000),
    "ms": ("dt.millisecond", 1000),
    "microsecond": ("dt.microsecond", 1_000_000),
    "microseconds": ("dt.microsecond", 1_000_000),
    "us": ("dt.microsecond", 1_000_000),
}


def epoch_micros(x: Expr) -> Expr:
    """Microseconds since 1970-01-01 (UTC for a TIMESTAMPTZ: the instant; the wall-clock
    time read as UTC for a TIMESTAMP; midnight for a DATE), as BIGINT."""
    if _is_date(x):
        x = cast(x, TIMESTAMP_US)
    if not _is_timestamp(x):
        raise Unsupported(f"epoch of {x.dtype}")
    return fn("dt.timestamp", [x], INT64, time_unit="us")


def exact_divide(x: Expr, divisor: float) -> Expr:
    """``x / divisor`` (DOUBLE) rounded correctly, as DuckDB divides.

    Polars 2.1 divides a float column by a scalar as a multiplication by its reciprocal
    (``1709990042002000.0 / 1e6`` gives ``1709990042.0019999``, not ``.002``) except in
    the remainder of its SIMD loop; a divisor that is a column of the same length is
    divided element by element, which IEEE 754 rounds correctly."""
    return float_divide(x, lit(divisor, FLOAT64))


def float_divide(a: Expr, b: Expr) -> Expr:
    """``a / b`` (both DOUBLE) rounded correctly, as DuckDB divides: where ``b`` is a
    constant, it is turned into a column of ``a``'s length (``b + (a IS NULL)``, which is
    ``b`` wherever ``a`` is not NULL) so that the kernel divides element by element
    instead of multiplying by ``1 / b`` (see :func:`exact_divide`; a ``CASE`` over the
    constant is folded back into it by the kernel's optimizer)."""
    if not b.columns() and not b.has_agg() and a.columns():
        b = binop("add", b, cast(is_null(a), FLOAT64), FLOAT64)
    return binop("truediv", a, b, FLOAT64)


def date_part(part: str, x: Expr, dtype: DataType) -> Expr:
    """DuckDB ``date_part(part, x)`` for the parts in :data:`_PARTS`, ``epoch`` (seconds
    since 1970-01-01 as DOUBLE) and the sub-minute ``millisecond``/``microsecond``. The
    calendar parts of a TIMESTAMPTZ are those of its wall-clock time in the session's zone."""
    p = part.lower()
    if not x.dtype.is_temporal:
        raise Unsupported(f"date part of {x.dtype}")
    if p == "epoch":
        return cast(exact_divide(cast(epoch_micros(x), FLOAT64), 1e6), dtype)
    if is_tstz(x.dtype):
        x = local_time(x)
    if _is_date(x) and (p in _SUBMINUTE or p in ("hour", "minute", "second")):
        x = cast(x, TIMESTAMP_US)  # a DATE's time parts are those of its midnight: 0
    if p in _SUBMINUTE:
        sub, scale = _SUBMINUTE[p]
        whole = binop("mul", cast(fn("dt.second", [x], INT8), INT64), lit(scale, INT64), INT64)
        frac = cast(fn(sub, [x], INT32), INT64)
        return cast(binop("add", whole, frac, INT64), dtype)
    impl = _PARTS.get(p)
    if impl is None:
        raise Unsupported(f"date part {part!r}")
    kernel_type = {"dt.year": INT32, "dt.ordinal_day": INT16}.get(impl, INT8)
    out: Expr = cast(fn(impl, [x], kernel_type), INT64)
    if p in ("dayofweek", "dow"):  # DuckDB: Sunday 0 .. Saturday 6
        out = binop("mod", out, lit(7, INT64), INT64)
    return cast(out, dtype)


@_register("epoch")
def _epoch(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    return date_part("epoch", x, dtype)


@_register("epoch_ms", "epoch_us")
def _epoch_int(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    if not x.dtype.is_temporal:  # epoch_ms(BIGINT) is the inverse: a TIMESTAMP
        raise Unsupported(f"{e['qname']['path'][-1]}() of {x.dtype}")
    micros = epoch_micros(x)
    if e["qname"]["path"][-1].lower() == "epoch_ms":  # floored, as DuckDB does
        micros = binop("floordiv", micros, lit(1000, INT64), INT64)
    return cast(micros, dtype)


def _part_function(part: str) -> FunctionHandler:
    def handler(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
        (x,) = _args(t, e)
        return date_part(part, x, dtype)

    return handler


for _part in (*_PARTS, "millisecond", "microsecond"):
    SCALAR_FUNCTIONS.setdefault(_part, _part_function(_part))


@_register("date_part", "datepart", "extract")
def _date_part(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    part, x = _args(t, e)
    return date_part(str(_const(part, "the date part")), x, dtype)


_TRUNC = {
    "year": "1y",
    "quarter": "1q",
    "month": "1mo",
    "week": "1w",
    "day": "1d",
    "hour": "1h",
    "minute": "1m",
    "second": "1s",
}


@_register("date_trunc", "datetrunc")
def _date_trunc(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    part, x = _args(t, e)
    every = _TRUNC.get(str(_const(part, "the date part")).lower())
    if every is None:
        raise Unsupported(f"date_trunc to {part}")
    if _is_date(x) and pa.types.is_timestamp(dtype.arrow):
        x = cast(x, TIMESTAMP_US)
    if is_tstz(x.dtype):
        # The wall-clock time truncated, read back in the zone (so that a truncation into
        # a repeated hour lands where DuckDB's does: see from_local).
        local = local_time(x)
        truncated = fn("dt.truncate", [local, lit(every, STRING)], local.dtype)
        if is_tstz(dtype):
            return from_local(truncated, dtype)
        return cast(truncated, dtype)
    return cast(fn("dt.truncate", [x, lit(every, STRING)], x.dtype), dtype)


@_register("timezone")
def _timezone(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``timezone(zone, x)`` (``x AT TIME ZONE zone``): the wall-clock time in ``zone`` of
    a TIMESTAMPTZ (a TIMESTAMP), or the instant at which a TIMESTAMP is shown in ``zone``."""
    args = _args(t, e)
    if len(args) != 2:
        raise Unsupported("timezone() with one argument")
    zone, x = args
    name = _const(zone, "timezone()'s zone")
    if name is None:
        return lit(None, dtype)
    there = DataType(pa.timestamp("us", tz=str(name)))
    if not known_zone(str(name)):
        raise Unsupported(f"time zone {name!r} is not one the kernel (Polars) knows")
    if is_tstz(x.dtype):
        return cast(local_time(cast(x, there)), dtype)
    if _is_timestamp(x) or _is_date(x):
        return cast(from_local(cast(x, TIMESTAMP_US), there), dtype)
    raise Unsupported(f"timezone() of {x.dtype}")


#: time_bucket's default origins: 2000-01-03 (a Monday) for widths in days and smaller,
#: 2000-01-01 for widths in months (microseconds since 1970-01-01, and months since year 0).
_BUCKET_ORIGIN_US = 946_857_600_000_000
_BUCKET_ORIGIN_MONTHS = 2000 * 12


@_register("time_bucket")
def _time_bucket(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    """``time_bucket(width, x[, origin])`` of a DATE or TIMESTAMP: the start of the bucket
    of ``width`` (a constant INTERVAL of days and smaller units, or of months only) that
    holds ``x``, buckets counted from ``origin`` (a DATE/TIMESTAMP constant, or an INTERVAL
    offset from the default origin). Computed on integers: ``origin + floor((x - origin) /
    width) * width``."""
    kids = e["children"]
    width = t.raw(kids[0])
    x = t.expr(kids[1])
    iv = _interval(width)
    if iv is None or not (_is_date(x) or (_is_timestamp(x) and not is_tstz(x.dtype))):
        raise Unsupported("time_bucket() of a non-constant width or of TIMESTAMPTZ")
    origin = t.raw(kids[2]) if len(kids) > 2 else None
    offset = _interval(origin) if origin is not None else None
    if iv.months and (iv.days or iv.micros):
        raise Unsupported("time_bucket() of a width mixing months and days")
    if iv.months < 0:
        raise Unsupported("time_bucket() of a width that is not positive")
    if iv.months:
        return _month_bucket(x, iv.months, origin, offset, dtype)
    step = iv.days * _MICROS_PER_DAY + iv.micros
    if step <= 0:
        raise Unsupported("time_bucket() of a width that is not positive")
    start = _BUCKET_ORIGIN_US
    if offset is not None:
        if offset.months:
            raise Unsupported("time_bucket() offset in months")
        start += offset.days * _MICROS_PER_DAY + offset.micros
    elif origin is not None:
        start = _origin_micros(origin)
    micros = epoch_micros(x)
    since = binop("sub", micros, lit(start, INT64), INT64)
    buckets = binop("floordiv", since, lit(step, INT64), INT64)
    begin = binop("add", binop("mul", buckets, lit(step, INT64), INT64), lit(start, INT64), INT64)
    out: Expr = cast(begin, TIMESTAMP_US)
    return cast(out, dtype)


def _origin_micros(origin: Expr) -> int:
    value = origin.value if isinstance(origin, Lit) else None
    if isinstance(value, datetime.datetime) and value.tzinfo is None:
        return (value - datetime.datetime(1970, 1, 1)) // datetime.timedelta(microseconds=1)
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return (value - datetime.date(1970, 1, 1)).days * _MICROS_PER_DAY
    raise Unsupported("time_bucket() origin that is not a DATE or TIMESTAMP constant")


def _month_bucket(
    x: Expr, width: int, origin: Expr | None, offset: Interval | None, dtype: DataType
) -> Expr:
    """time_bucket by ``width`` months: the month start ``(m - origin) mod width`` months
    before ``x``'s month start (origin: 2000-01, or a first-of-month constant)."""
    if width > 48:
        raise Unsupported("time_bucket() of more than 48 months")
    start = _BUCKET_ORIGIN_MONTHS
    if offset is not None:
        if offset.days or offset.micros:
            raise Unsupported("time_bucket() by months with an offset in days")
        if abs(offset.months) > 12 * 10_000:  # DuckDB may raise: the origin is out of range
            raise Unsupported("time_bucket() offset of more than 10000 years")
        start += offset.months
    elif origin is not None:
        value = origin.value if isinstance(origin, Lit) else None
        if not isinstance(value, datetime.date) or value.day != 1:
            raise Unsupported("time_bucket() by months from an origin not on a month's first day")
        if isinstance(value, datetime.datetime) and value.time() != datetime.time(0):
            raise Unsupported("time_bucket() by months from an origin not at midnight")
        start = value.year * 12 + value.month - 1
    ts = cast(x, TIMESTAMP_US)
    month_start = fn("dt.truncate", [ts, lit("1mo", STRING)], TIMESTAMP_US)
    months = binop(
        "add",
        binop("mul", cast(fn("dt.year", [ts], INT32), INT64), lit(12, INT64), INT64),
        binop("sub", cast(fn("dt.month", [ts], INT8), INT64), lit(1, INT64), INT64),
        INT64,
    )
    back = binop("mod", binop("sub", months, lit(start, INT64), INT64), lit(width, INT64), INT64)
    out: Expr = month_start
    for k in range(1, width):
        earlier = fn("dt.offset_by", [month_start], TIMESTAMP_US, by=f"-{k}mo")
        out = Ternary(compare("eq", back, lit(k, INT64)), earlier, out, TIMESTAMP_US)
    return cast(out, dtype)


@_register("last_day")
def _last_day(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    (x,) = _args(t, e)
    return cast(fn("dt.month_end", [x], x.dtype), dtype)


#: DuckDB strftime specifiers whose meaning differs in chrono (the kernel's formatter).
_STRFTIME = {
    "x": "%Y-%m-%d",  # chrono: the locale's date (08/09/20)
    "X": "%H:%M:%S",
    "c": "%Y-%m-%d %H:%M:%S",
    "f": "%6f",  # DuckDB: microseconds, 6 digits; chrono: nanoseconds, 9
    "g": "%3f",  # milliseconds
    "n": "%9f",  # nanoseconds
}


def strftime_format(fmt: str) -> str:
    """A DuckDB ``strftime`` format as chrono's (the specifiers of :data:`_STRFTIME`
    translated, the others kept)."""
    out: list[str] = []
    i = 0
    while i < len(fmt):
        if fmt[i] == "%" and i + 1 < len(fmt):
            spec = fmt[i + 1]
            out.append(_STRFTIME.get(spec, "%" + spec))
            i += 2
        else:
            out.append(fmt[i])
            i += 1
    return "".join(out)


@_register("strftime")
def _strftime(t: ExprTranslator, e: dict[str, Any], dtype: DataType) -> Expr:
    x, f = _args(t, e)
    raw_format = str(_const(f, "the strftime format"))
    if "%z" in raw_format or "%Z" in raw_format:
        # A zone: DuckDB's text for naive values (an empty zone) and for TIMESTAMPTZ
        # differs from the kernel's, which refuses naive values.
        raise Unsupported("strftime() with %z or %Z")
    if is_tstz(x.dtype):
        x = local_time(x)
    if _is_date(x):  # DuckDB formats a DATE as its midnight (%H is 00)
        x = cast(x, TIMESTAMP_US)
    fmt = strftime_format(raw_format)
    return fn("dt.to_string", [x], STRING, format=fmt)


# ---------------------------------------------------------------- aggregates


def aggregate(t: ExprTranslator, e: dict[str, Any]) -> Expr:
    """Translate a ``BOUND_AGGREGATE`` into an IR expression over aggregates (raises
    :class:`Unsupported`)."""
    name = str(e["qname"]["path"][-1]).lower()
    if str(e.get("state_export") or "NONE") != "NONE":
        # DuckDB's internal state, not the aggregate's value (cast to a STRUCT, it was
        # read as the value).
        raise Unsupported(f"{name}(...) EXPORT_STATE (DuckDB's aggregate state)")
    dtype = rtype(e)
    distinct = e.get("aggregate_type") == "DISTINCT"
    order: list[tuple[Expr, bool, bool]] = []
    if e.get("order_bys") and name not in _ORDER_INSENSITIVE:
        if name not in _ORDERED:
            raise Unsupported(f"{name}() with ORDER BY inside the aggregate")
        order = [agg_order_key(t, o) for o in e["order_bys"]["orders"]]
    args = [t.expr(c) for c in e.get("children", [])]
    if e.get("order_bys") and name in _FLOAT_ORDER and any(a.dtype.is_float for a in args):
        # The order of a floating-point sum changes its rounding: DuckDB sums in the order
        # given, shoal in partition order.
        raise Unsupported(f"{name}() of floating-point values with ORDER BY")
    if name == "count" and not args:
        name = "count_star"  # count() without arguments, as windows write count(*)
    if name in _ORDERED:
        if distinct:
            raise Unsupported(f"{name}(DISTINCT ...)")
        keep = t.expr(e["filter"]) if e.get("filter") else None
        return _ORDERED[name](args, dtype, order, keep)
    if name in _REFUSED_AGGREGATES:
        raise Unsupported(f"{name}(): {_REFUSED_AGGREGATES[name]}")
    if e.get("filter"):
        keep = t.expr(e["filter"])
        if name == "count_star":
            name, args = "count", [Ternary(keep, lit(1, INT32), lit(None, INT32), INT32)]
        else:
            args = [Ternary(keep, a, lit(None, a.dtype), a.dtype) for a in args]
    handler = _AGGREGATES.get(name)
    if handler is None:
        raise Unsupported(f"aggregate function {name}() is not supported")
    if distinct and name in ("sum", "sum_no_overflow", "avg", "mean") and len(args) == 1:
        # Each distinct value once (NULL stays one NULL, which the sum skips).
        args = [fn("unique", [args[0]], args[0].dtype)]
        distinct = False
    if distinct and name not in (
        "count",
        "min",
        "max",
        "any_value",
        "arbitrary",
        "bool_and",
        "bool_or",
    ):
        raise Unsupported(f"{name}(DISTINCT ...)")
    if name in _QUANTILES:
        return _quantile(name, args, dtype, e.get("function_data") or {})
    return handler(args, dtype, distinct)


_REFUSED_AGGREGATES = {
    # DuckDB's HyperLogLog estimate (over ~15-30 distinct values it is not the exact
    # count: approx_count_distinct over range(32) is 33), which the kernel cannot
    # reproduce; an exact count would be a different answer, so DuckDB computes it.
    "approx_count_distinct": "DuckDB's HyperLogLog estimate is not reproducible by the "
    "kernel (an exact count would differ from DuckDB's answer)",
}


def agg_order_key(t: ExprTranslator, o: dict[str, Any]) -> tuple[Expr, bool, bool]:
    """One ``ORDER BY`` key inside an aggregate: (expression, descending, nulls last)."""
    descending = o.get("type") in ("DESCENDING", "ORDER_DESCENDING")
    nulls = str(o.get("null_order", "NULLS LAST"))
    return t.expr(o["expression"]), descending, "LAST" in nulls or nulls == "ORDER_DEFAULT"


def ordered_values(
    x: Expr, order: list[tuple[Expr, bool, bool]], keep: Expr | None, dtype: DataType
) -> Expr:
    """The group's values of ``x`` (only the rows ``keep`` holds for), sorted by the
    aggregate's ORDER BY keys (ties in input order)."""
    keys = [k for k, _, _ in order]
    if keep is not None:
        x = fn("filter", [x, keep], x.dtype)
        keys = [fn("filter", [k, keep], k.dtype) for k in keys]
    if not order:
        return x
    return fn(
        "sort_by",
        [x, *keys],
        x.dtype,
        descending=tuple(d for _, d, _ in order),
        nulls_last=tuple(n for _, _, n in order),
        maintain_order=True,
    )


def _kept_count(x: Expr | None, keep: Expr | None) -> Expr:
    """The number of rows (``x`` None) or non-NULL values of ``x`` the FILTER keeps."""
    one = lit(1, INT32)
    base: Expr = one if x is None else x
    if keep is not None:
        base = Ternary(keep, base, lit(None, base.dtype), base.dtype)
    if x is None and keep is None:
        return Agg("len", None, IDX)
    if x is None:
        return Agg("count", base, IDX)
    return Agg("count", base, IDX)


def _string_agg(
    args: list[Expr], dtype: DataType, order: list[tuple[Expr, bool, bool]], keep: Expr | None
) -> Expr:
    """``string_agg(x, sep ORDER BY ...)``: the non-NULL values joined by ``sep`` in the
    given order (input order without one); NULL when there are none."""
    x = cast(args[0], STRING)
    sep = _const(args[1], "string_agg()'s separator") if len(args) > 1 else ","
    if sep is None:
        return lit(None, dtype)
    values = Agg(
        "implode", ordered_values(x, order, keep, STRING), DataType(pa.large_list(STRING.arrow))
    )
    joined = fn("list.join", [values, lit(str(sep), STRING)], STRING, ignore_nulls=True)
    empty = compare("eq", _kept_count(x, keep), lit(0, IDX))
    return cast(Ternary(empty, lit(None, STRING), joined, STRING), dtype)


def _list_agg(
    args: list[Expr], dtype: DataType, order: list[tuple[Expr, bool, bool]], keep: Expr | None
) -> Expr:
    """``list(x ORDER BY ...)`` / ``array_agg``: every value, NULLs included, in order;
    NULL for no rows."""
    (x,) = args
    values = Agg(
        "implode", ordered_values(x, order, keep, x.dtype), DataType(pa.large_list(x.dtype.arrow))
    )
    empty = compare("eq", _kept_count(None, keep), lit(0, IDX))
    return cast(Ternary(empty, lit(None, values.dtype), values, values.dtype), dtype)


def _first_last(which: str) -> Callable[..., Expr]:
    def handler(
        args: list[Expr], dtype: DataType, order: list[tuple[Expr, bool, bool]], keep: Expr | None
    ) -> Expr:
        (x,) = args
        return cast(Agg(which, ordered_values(x, order, keep, x.dtype), x.dtype), dtype)

    return handler


def _arg_extreme(largest: bool, null_args: bool = False) -> Callable[..., Expr]:
    def handler(
        args: list[Expr], dtype: DataType, order: list[tuple[Expr, bool, bool]], keep: Expr | None
    ) -> Expr:
        """``arg_max(x, by)`` (``arg_min``): ``x`` at the row with the largest (smallest)
        ``by``, NaN above every number; rows where ``x`` or ``by`` is NULL are skipped;
        ties give the first such row in input order; NULL when no row is left.
        ``arg_max_null``/``arg_min_null`` (``null_args``) skip only the rows whose ``by``
        is NULL: a NULL ``x`` at the extreme row is the answer (DuckDB's documentation of
        those functions)."""
        if len(args) != 2:
            raise Unsupported("arg_max()/arg_min() with a count (the list form)")
        x, by = args
        skip = is_null(by) if null_args else or_all([is_null(x), is_null(by)])
        if keep is not None:
            skip = or_all([skip, not_(fn("coalesce", [keep, lit(False, BOOL)], BOOL))])
        ranked = Ternary(skip, lit(None, by.dtype), by, by.dtype)
        best = fn(
            "sort_by",
            [x, ranked],
            x.dtype,
            descending=(largest,),
            nulls_last=(True,),
            maintain_order=True,
        )
        out = Ternary(
            compare("eq", Agg("count", ranked, IDX), lit(0, IDX)),
            lit(None, x.dtype),
            Agg("first", best, x.dtype),
            x.dtype,
        )
        return cast(out, dtype)

    return handler


def _arg_extreme_nulls_last(largest: bool) -> Callable[..., Expr]:
    def handler(
        args: list[Expr], dtype: DataType, order: list[tuple[Expr, bool, bool]], keep: Expr | None
    ) -> Expr:
        """``arg_max_nulls_last(x, by)`` (``arg_min_nulls_last``): ``x`` at the first row
        of the group sorted by ``by`` (descending for max), NaN above every number and NULL
        ``by`` after every value, no row skipped (a NULL ``x`` is an answer); ties give the
        first such row in input order; NULL for no row. The list form (a count) is
        refused: DuckDB's heap orders ties its own way."""
        if len(args) != 2:
            raise Unsupported("arg_max_nulls_last()/arg_min_nulls_last() with a count")
        x, by = args
        keys: list[Expr] = [by]
        descending: tuple[bool, ...] = (largest,)
        if keep is not None:  # rows the FILTER drops sort after every kept row
            dropped = not_(fn("coalesce", [keep, lit(False, BOOL)], BOOL))
            keys, descending = [dropped, by], (False, largest)
        best = fn(
            "sort_by",
            [x, *keys],
            x.dtype,
            descending=descending,
            nulls_last=(True,) * len(keys),
            maintain_order=True,
        )
        out = Ternary(
            compare("eq", _kept_count(None, keep), lit(0, IDX)),
            lit(None, x.dtype),
            Agg("first", best, x.dtype),
            x.dtype,
        )
        return cast(out, dtype)

    return handler


_ORDERED: dict[str, Callable[..., Expr]] = {
    "string_agg": _string_agg,
    "group_concat": _string_agg,
    "listagg": _string_agg,
    "list": _list_agg,
    "array_agg": _list_agg,
    "arg_max": _arg_extreme(True),
    "argmax": _arg_extreme(True),
    "max_by": _arg_extreme(True),
    "arg_min": _arg_extreme(False),
    "argmin": _arg_extreme(False),
    "min_by": _arg_extreme(False),
    "arg_max_null": _arg_extreme(True, null_args=True),
    "arg_min_null": _arg_extreme(False, null_args=True),
    "arg_max_nulls_last": _arg_extreme_nulls_last(True),
    "arg_min_nulls_last": _arg_extreme_nulls_last(False),
}

_QUANTILES = frozenset({"quantile_cont", "quantile_disc", "quantile", "median"})


def _quantile(name: str, args: list[Expr], dtype: DataType, data: dict[str, Any]) -> Expr:
    """``quantile_cont(x, q)``: linear interpolation between the values around position
    ``(n - 1) * q`` of the sorted non-NULL values (NaN largest); ``quantile_disc`` and
    ``quantile``: one of the values (:func:`_discrete_quantile`); ``median``:
    ``quantile_cont(x, 0.5)``."""
    x = args[0]
    descending = False
    if name == "median":
        q = 0.5
    else:
        quantiles = data.get("quantiles") or []
        if len(args) < 2 or not quantiles:
            raise Unsupported(f"{name}() without quantiles")
        qs = [float(value_of(v)) for v in quantiles]
        # DuckDB reads a negative quantile (and WITHIN GROUP (ORDER BY x DESC), which its
        # binder turns into one) as the position |q| in the descending order (NaN first);
        # its binder refuses quantiles of both signs.
        descending = bool(data.get("desc")) or any(v < 0 for v in qs)
        qs = [abs(v) for v in qs]
        if _is_list(args[1]):
            # A list of quantiles: the list of their values (NULL for no values).
            if not (x.dtype.is_float or x.dtype.is_integer) or not x.columns():
                raise Unsupported(f"{name}() of a list of quantiles of {x.dtype}")
            inner = DataType(dtype.arrow.value_type)
            one = "quantile_disc" if name in ("quantile_disc", "quantile") else "quantile_cont"
            each = [_quantile_of(one, x, v, inner, descending) for v in qs]
            values = fn("concat_list", each, dtype)
            none = compare("eq", Agg("count", x, IDX), lit(0, IDX))
            return Ternary(none, lit(None, dtype), values, dtype)
        if len(qs) != 1:
            raise Unsupported(f"{name}() of a list of quantiles")
        q = qs[0]
    if not (x.dtype.is_float or x.dtype.is_integer):
        raise Unsupported(f"{name}() of {x.dtype}")
    if not x.columns():
        if not isinstance(x, Lit):
            raise Unsupported(f"{name}() of a constant expression")
        # every value is the constant: it, or NULL for no rows (or a NULL constant)
        rows = cast(Agg("len", None, IDX), INT64)
        return Ternary(compare("gt", rows, lit(0, INT64)), cast(x, dtype), lit(None, dtype), dtype)
    return _quantile_of(name, x, q, dtype, descending)


def _quantile_of(name: str, x: Expr, q: float, dtype: DataType, descending: bool = False) -> Expr:
    """One quantile ``q`` of the column ``x`` as ``dtype``: continuous for
    ``quantile_cont`` and ``median``, else discrete; positions in the descending order
    of the values with ``descending``."""
    if name in ("quantile_cont", "median"):
        return cast(_continuous_quantile(cast(x, FLOAT64), q, descending), dtype)
    return cast(_discrete_quantile(x, q, descending), dtype)


def _mad(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
    """``mad(x)`` of integers or DOUBLE: the median (``quantile_cont(0.5)``, DuckDB's
    interpolation) of the absolute deviations from the median, as DOUBLE; NULL for no
    values. Other input types (DECIMAL, FLOAT, temporal) are refused: DuckDB keeps their
    type through the computation."""
    (x,) = args
    if not (x.dtype.is_integer or x.dtype == FLOAT64) or dtype != FLOAT64:
        raise Unsupported(f"mad() of {type_name_of(x.dtype)}")
    if not x.columns():
        if not isinstance(x, Lit):
            raise Unsupported("mad() of a constant expression")
        rows = cast(Agg("len", None, IDX), INT64)
        value = lit(None if x.value is None else 0.0, FLOAT64)
        return Ternary(compare("gt", rows, lit(0, INT64)), value, lit(None, FLOAT64), FLOAT64)
    v = cast(x, FLOAT64)
    deviation = fn("abs", [binop("sub", v, _median_of(v), FLOAT64)], FLOAT64)
    return _median_of(deviation)


def _median_of(x: Expr) -> Expr:
    """``quantile_cont(x, 0.5)`` of DOUBLE ``x`` (see :func:`_continuous_quantile`) in a
    smaller expression: with ``d`` 0 or 0.5, DuckDB's ``fma(lo, 1 - d, hi * d)`` is
    ``lo * 0.5 + hi * 0.5`` rounded once, which the halvings (exact) leave to the sum."""
    n = cast(Agg("count", x, IDX), INT64)
    rn = binop(
        "mul", cast(binop("sub", n, lit(1, INT64), INT64), FLOAT64), lit(0.5, FLOAT64), FLOAT64
    )
    none = compare("eq", n, lit(0, INT64))
    lo_at = Ternary(none, lit(None, INT64), cast(fn("floor", [rn], FLOAT64), INT64), INT64)
    hi_at = Ternary(none, lit(None, INT64), cast(fn("ceil", [rn], FLOAT64), INT64), INT64)
    ordered = fn(
        "sort", [fn("drop_nulls", [x], FLOAT64)], FLOAT64, descending=False, nulls_last=True
    )
    lo = fn("gather", [ordered, lo_at], FLOAT64, scalar=True)
    hi = fn("gather", [ordered, hi_at], FLOAT64, scalar=True)
    half = lit(0.5, FLOAT64)
    mixed = binop("add", binop("mul", lo, half, FLOAT64), binop("mul", hi, half, FLOAT64), FLOAT64)
    return Ternary(compare("eq", lo_at, hi_at), lo, mixed, FLOAT64)


def _product(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
    """``product(x)``: the product of the non-NULL values as DOUBLE; NULL for none."""
    (x,) = args
    if not (x.dtype.is_float or x.dtype.is_integer or x.dtype.is_decimal):
        raise Unsupported(f"product() of {x.dtype}")
    total = Agg("product", cast(fn("drop_nulls", [x], x.dtype), FLOAT64), FLOAT64)
    none = compare("eq", _count(x), lit(0, IDX))
    return cast(Ternary(none, lit(None, FLOAT64), total, FLOAT64), dtype)


def _continuous_quantile(x: Expr, q: float, descending: bool = False) -> Expr:
    """DuckDB's ``quantile_cont`` of DOUBLE ``x``: with ``rn = (n - 1) * q`` over the ``n``
    sorted non-NULL values (NaN largest), ``lo * (1 - d) + hi * d`` where ``lo`` and ``hi``
    are the values at ``floor(rn)`` and ``ceil(rn)`` and ``d = rn - floor(rn)`` (DuckDB's
    own formula; Polars' linear interpolation rounds differently); the value itself when
    ``rn`` is whole; NULL for no values. With ``descending`` the values are sorted the
    other way (NaN first)."""
    n = cast(Agg("count", x, IDX), INT64)
    rn = binop(
        "mul", cast(binop("sub", n, lit(1, INT64), INT64), FLOAT64), lit(q, FLOAT64), FLOAT64
    )
    none = compare("eq", n, lit(0, INT64))
    lo_at = Ternary(none, lit(None, INT64), cast(fn("floor", [rn], FLOAT64), INT64), INT64)
    hi_at = Ternary(none, lit(None, INT64), cast(fn("ceil", [rn], FLOAT64), INT64), INT64)
    ordered = fn(
        "sort", [fn("drop_nulls", [x], FLOAT64)], FLOAT64, descending=descending, nulls_last=True
    )
    lo = fn("gather", [ordered, lo_at], FLOAT64, scalar=True)
    hi = fn("gather", [ordered, hi_at], FLOAT64, scalar=True)
    d = binop("sub", rn, fn("floor", [rn], FLOAT64), FLOAT64)
    one = lit(1.0, FLOAT64)
    # DuckDB 2.0.1's build contracts lo * (1 - d) + hi * d into fma(lo, 1 - d, hi * d).
    mixed = fused_multiply_add(lo, binop("sub", one, d, FLOAT64), binop("mul", hi, d, FLOAT64))
    return Ternary(compare("eq", lo_at, hi_at), lo, mixed, FLOAT64)


def fused_multiply_add(a: Expr, b: Expr, c: Expr) -> Expr:
    """``a * b + c`` (DOUBLE) with one rounding, as a fused multiply-add instruction gives
    it: the product is split exactly into a rounded part and its error (Dekker's product
    with Veltkamp's split), the sum into a rounded part and its error (Knuth's two-sum),
    and the errors are added back last. The kernel has no FMA; this agrees with one except
    where the final addition rounds a tie differently (rare; no overflow checks)."""

    def mul(x: Expr, y: Expr) -> Expr:
        return binop("mul", x, y, FLOAT64)

    def add(x: Expr, y: Expr) -> Expr:
        return binop("add", x, y, FLOAT64)

    def sub(x: Expr, y: Expr) -> Expr:
        return binop("sub", x, y, FLOAT64)

    def split(x: Expr) -> tuple[Expr, Expr]:
        t = mul(lit(134217729.0, FLOAT64), x)  # 2**27 + 1
        high = sub(t, sub(t, x))
        return high, sub(x, high)

    p = mul(a, b)
    ah, al = split(a)
    bh, bl = split(b)
    product_error = add(add(add(sub(mul(ah, bh), p), mul(ah, bl)), mul(al, bh)), mul(al, bl))
    s = add(p, c)
    bb = sub(s, p)
    sum_error = add(sub(p, sub(s, bb)), sub(c, bb))
    return add(s, add(sum_error, product_error))


def _discrete_quantile(x: Expr, q: float, descending: bool = False) -> Expr:
    """The value at position ``ceil(n * q) - 1`` (0-based, at least 0) of the sorted
    non-NULL values (NaN largest; sorted the other way with ``descending``): DuckDB's
    ``quantile_disc``; NULL for no values."""
    n = cast(Agg("count", x, IDX), INT64)
    scaled = fn("ceil", [binop("mul", cast(n, FLOAT64), lit(q, FLOAT64), FLOAT64)], FLOAT64)
    position: Expr = fn(
        "max_horizontal",
        [binop("sub", cast(scaled, INT64), lit(1, INT64), INT64), lit(0, INT64)],
        INT64,
    )
    position = Ternary(compare("eq", n, lit(0, INT64)), lit(None, INT64), position, INT64)
    ordered = fn(
        "sort", [fn("drop_nulls", [x], x.dtype)], x.dtype, descending=descending, nulls_last=True
    )
    return fn("gather", [ordered, position], x.dtype, scalar=True)


#: Aggregates whose result on floating-point values depends on the order of the values.
_FLOAT_ORDER = frozenset({"sum", "sum_no_overflow", "avg", "mean"})

_ORDER_INSENSITIVE = frozenset(
    {
        "count",
        "count_star",
        "sum",
        "sum_no_overflow",
        "avg",
        "mean",
        "min",
        "max",
        "bool_and",
        "bool_or",
    }
)


def _count(x: Expr) -> Expr:
    return Agg("count", x, IDX)


def _sum(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
    (x,) = args
    if pa.types.is_boolean(x.dtype.arrow):  # DuckDB counts the trues (the kernel cannot
        x = cast(x, INT64)  # cast a Boolean to a DECIMAL directly)
    if dtype.is_decimal:
        total: Expr = Agg("sum", cast(x, _decimal(38, _scale(dtype))), _decimal(38, _scale(dtype)))
        total = cast(total, dtype)
    elif dtype.is_float or dtype.is_integer:
        total = Agg("sum", cast(x, dtype), dtype)
    else:
        raise Unsupported(f"sum() into {dtype}")
    # DuckDB: the sum of no (non-null) values is NULL.
    return Ternary(compare("eq", _count(x), lit(0, IDX)), lit(None, dtype), total, dtype)


def _avg(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
    (x,) = args
    if x.dtype.is_float:
        return cast(Agg("mean", x, FLOAT64), dtype)
    if not (x.dtype.is_integer or x.dtype.is_decimal):
        raise Unsupported(f"avg() of {x.dtype}")
    wide = _decimal(38, _scale(x.dtype))
    total = Agg("sum", cast(x, wide), wide)
    n = _count(x)
    mean = binop("truediv", cast(total, FLOAT64, strict=False), cast(n, FLOAT64), FLOAT64)
    out = Ternary(compare("eq", n, lit(0, IDX)), lit(None, FLOAT64), mean, FLOAT64)
    return cast(out, dtype)


def _count_agg(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
    (x,) = args
    if distinct:
        has_null = cast(compare("gt", Agg("null_count", x, IDX), lit(0, IDX)), INT64)
        return cast(binop("sub", cast(Agg("n_unique", x, IDX), INT64), has_null, INT64), dtype)
    return cast(_count(x), dtype)


def _count_star(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
    return cast(Agg("len", None, IDX), dtype)


def _minmax(name: str) -> Callable[[list[Expr], DataType, bool], Expr]:
    def handler(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
        if len(args) != 1:
            raise Unsupported(f"{name}() with a count (the list form)")
        (x,) = args
        if name in ("min", "max") and _is_nested(x.dtype):
            raise Unsupported(f"{name}() of {type_name_of(x.dtype)} values")
        return cast(Agg(name, x, x.dtype), dtype)

    return handler


def _max(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
    """DuckDB orders NaN above every number, so the max of floats with a NaN is NaN;
    Polars' ``max`` skips NaN, ``nan_max`` does not."""
    if len(args) != 1:
        raise Unsupported("max() with a count (the list form)")
    (x,) = args
    if _is_nested(x.dtype):
        raise Unsupported(f"max() of {type_name_of(x.dtype)} values")
    return cast(Agg("nan_max" if x.dtype.is_float else "max", x, x.dtype), dtype)


def _moment(name: str, ddof: int) -> Callable[[list[Expr], DataType, bool], Expr]:
    def handler(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
        (x,) = args
        return cast(Agg(name, cast(x, FLOAT64), FLOAT64, (("ddof", ddof),)), dtype)

    return handler


def _median(args: list[Expr], dtype: DataType, distinct: bool) -> Expr:
    (x,) = args
    if not dtype.is_float:
        raise Unsupported(f"median() into {dtype}")
    return cast(Agg("median", cast(x, FLOAT64), FLOAT64), dtype)


_AGGREGATES: dict[str, Callable[[list[Expr], DataType, bool], Expr]] = {
    "sum": _sum,
    "sum_no_overflow": _sum,
    "avg": _avg,
    "mean": _avg,
    "count": _count_agg,
    "count_star": _count_star,
    "min": _minmax("min"),
    "max": _max,
    # DuckDB: any_value is the first non-NULL value, arbitrary the first value (NULL or
    # not), in input order (the planner keeps the input order of a group's rows).
    "any_value": _minmax("first_non_null"),
    "arbitrary": _minmax("first"),
    # The first (last) value in input order, NULL included: DuckDB's first()/last()
    # without ORDER BY; the order is defined when the input is (a scalar subquery's LIMIT).
    "first": _minmax("first"),
    "last": _minmax("last"),
    "bool_and": _minmax("min"),
    "bool_or": _minmax("max"),
    "stddev_samp": _moment("std", 1),
    "stddev": _moment("std", 1),
    "stddev_pop": _moment("std", 0),
    "var_samp": _moment("var", 1),
    "variance": _moment("var", 1),
    "var_pop": _moment("var", 0),
    "median": _median,
    "product": _product,
    "mad": _mad,
    "quantile_cont": _median,
    "quantile_disc": _median,
    "quantile": _median,
}


def python_value(x: Expr) -> Any:
    """The Python value of a literal (for VALUES lists); a DATE or TIMESTAMP Python cannot
    hold as a :class:`~shoal_duckdb.types.RawTemporal`."""
    if isinstance(x, Cast) and isinstance(x.expr, Lit) and x.dtype.is_temporal:
        return RawTemporal(int(x.expr.value))
    if not isinstance(x, Lit):
        raise Unsupported("a non-constant value in a VALUES list")
    if isinstance(x.value, Interval):
        raise Unsupported("an INTERVAL value")
    return x.value


__all__ = ["ExprTranslator", "SCALAR_FUNCTIONS", "Unsupported", "aggregate", "compare", "like"]
