"""Arrow-based data types and schemas of the shoal IR.

A :class:`DataType` wraps a ``pyarrow.DataType``; it is hashable, picklable and converts
to and from Polars dtypes (the kernel runs on Polars). String columns are normalised to
``large_string`` whatever their physical Arrow form (``string``, ``string_view``), since
Polars reads all three as ``String``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import polars as pl
import pyarrow as pa

from shoal.errors import PlanError


def _normalise(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary(t) or pa.types.is_binary_view(t):
        return pa.large_binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.large_list(_normalise(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _normalise(f.type)) for f in t])
    return t


#: Polars' 128-bit integer dtypes, by name. Arrow (pyarrow) has no 128-bit integer type.
WIDE_INTEGERS = ("Int128", "UInt128")

#: The Arrow type a Polars ``Int128``/``UInt128`` column travels as: the 16 bytes of each
#: value (two's complement, little-endian; a UInt128 reinterpreted as signed), which is the
#: layout of a ``decimal128``. The precision (38) is not checked by Arrow or Polars when
#: the bits are moved, so every value travels exactly, those beyond 10**38 too.
WIDE_INTEGER_STORAGE = pa.decimal128(38, 0)

#: Arrow field metadata key naming the Polars dtype of a column carried as
#: :data:`WIDE_INTEGER_STORAGE`.
WIDE_INTEGER_KEY = b"shoal.polars_dtype"


@dataclass(frozen=True)
class DataType:
    """One column type. ``arrow`` is the normalised ``pyarrow.DataType``. ``categories``
    is set for a Polars ``Enum`` only: its categories in order (the Arrow form, a
    dictionary, is the same as a ``Categorical``'s; Polars keeps the categories in the
    Arrow field's metadata, which :meth:`Schema.from_arrow` reads). An Enum nested in a
    list or struct is carried as a Categorical. ``wide`` is set for Polars' 128-bit
    integers only (``"Int128"``, ``"UInt128"``, a top-level column's type): ``arrow`` is
    then :data:`WIDE_INTEGER_STORAGE`, how the values travel (:func:`frame_to_arrow`)."""

    arrow: pa.DataType
    categories: tuple[str, ...] | None = None
    wide: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrow", _normalise(self.arrow))
        if self.categories is not None:
            object.__setattr__(self, "categories", tuple(self.categories))

    @staticmethod
    def from_polars(dtype: Any) -> DataType:
        """Convert a Polars dtype (class or instance). Raises ``PlanError`` if Arrow has no
        equivalent."""
        got = _PLAIN.get(type(dtype))
        if got is not None:
            return got
        return _from_polars(dtype if not isinstance(dtype, type) else dtype())

    def to_polars(self) -> pl.DataType:
        """The Polars dtype the kernel uses for this type."""
        if self.categories is not None:
            return pl.Enum(list(self.categories))
        if self.wide is not None:
            return pl.Int128() if self.wide == "Int128" else pl.UInt128()
        return _to_polars(self.arrow)

    @property
    def is_enum(self) -> bool:
        return self.categories is not None

    @property
    def is_numeric(self) -> bool:
        return self.is_integer or pa.types.is_floating(self.arrow) or self.is_decimal

    @property
    def is_integer(self) -> bool:
        return pa.types.is_integer(self.arrow) or self.wide is not None

    @property
    def is_float(self) -> bool:
        return pa.types.is_floating(self.arrow)

    @property
    def is_decimal(self) -> bool:
        return pa.types.is_decimal(self.arrow) and self.wide is None

    @property
    def is_string(self) -> bool:
        return pa.types.is_large_string(self.arrow)

    @property
    def is_temporal(self) -> bool:
        return pa.types.is_temporal(self.arrow)

    @property
    def byte_width(self) -> int:
        """Estimated bytes per value (fixed width, or 16 for variable-width types)."""
        try:
            return max(1, self.arrow.bit_width // 8)
        except ValueError:
            return 16

    def __str__(self) -> str:
        return str(self.to_polars())

    def __repr__(self) -> str:
        return f"DataType({self})"


@lru_cache(maxsize=512)
def _from_polars(dtype: pl.DataType) -> DataType:
    if isinstance(dtype, pl.Object):
        # pyarrow would take the objects' addresses as bytes: never data.
        raise PlanError("Polars dtype Object holds Python objects, which shoal cannot carry")
    if isinstance(dtype, pl.Int128 | pl.UInt128):
        return DataType(WIDE_INTEGER_STORAGE, wide=str(dtype))
    try:
        arrow = pl.Series([], dtype=dtype).to_arrow().type
    except Exception as exc:
        if any(w in str(dtype) for w in WIDE_INTEGERS):
            raise PlanError(
                f"Polars dtype {dtype}: a 128-bit integer inside a list, array or struct has "
                "no Arrow form shoal carries (pyarrow has no 128-bit integer; shoal carries "
                "Int128 and UInt128 columns as the 16 bytes of a decimal128, not nested)"
            ) from exc
        raise PlanError(
            f"Polars dtype {dtype} has no Arrow equivalent (shoal carries every column as "
            f"Arrow; pyarrow: {exc})"
        ) from exc
    if isinstance(dtype, pl.Enum):
        return DataType(arrow, tuple(dtype.categories.to_list()))
    return DataType(arrow)


#: The IR type of each Polars dtype class without parameters (every instance is the same
#: type), looked up by class: a lookup in ``_from_polars``'s cache hashes and compares
#: the dtype in Python (about 1 microsecond; translating a query asks for the types of
#: every node's columns and of every expression, about 80 per TPC-H query).
_PLAIN: dict[type, DataType] = {
    cls: _from_polars(cls())
    for cls in (pl.Boolean, pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16,
                pl.UInt32, pl.UInt64, pl.Float32, pl.Float64, pl.String, pl.Binary, pl.Date,
                pl.Time, pl.Null)
}  # fmt: skip


@lru_cache(maxsize=512)
def _to_polars(arrow: pa.DataType) -> pl.DataType:
    # pa.nulls, not pa.array: pyarrow.array imports pandas on its first call (about 1 s).
    return pl.from_arrow(pa.nulls(0, type=arrow)).dtype  # type: ignore[union-attr]


BOOL = DataType(pa.bool_())
INT64 = DataType(pa.int64())
UINT32 = DataType(pa.uint32())
FLOAT64 = DataType(pa.float64())
STRING = DataType(pa.large_string())
DATE = DataType(pa.date32())
NULL = DataType(pa.null())


@dataclass(frozen=True)
class Schema(Mapping[str, DataType]):
    """An ordered set of named columns. Behaves as a read-only mapping name -> DataType."""

    fields: tuple[tuple[str, DataType], ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for name, _ in self.fields:
            if name in seen:
                raise PlanError(f"duplicate column name {name!r} in schema")
            seen.add(name)

    @staticmethod
    def of(items: Iterable[tuple[str, DataType]] | Mapping[str, DataType]) -> Schema:
        pairs = items.items() if isinstance(items, Mapping) else items
        return Schema(tuple((str(n), t) for n, t in pairs))

    @staticmethod
    def from_arrow(schema: pa.Schema) -> Schema:
        """The schema of Arrow data; a column that Polars wrote as an ``Enum`` (its
        categories in the field's metadata) is an Enum here too."""
        fields = [(f.name, _field_type(f)) for f in schema]
        if any(pa.types.is_dictionary(f.type) and f.metadata for f in schema):
            polars = pl.from_arrow(schema.empty_table())
            assert isinstance(polars, pl.DataFrame)
            for i, dtype in enumerate(polars.dtypes):
                if isinstance(dtype, pl.Enum):
                    fields[i] = (fields[i][0], DataType.from_polars(dtype))
        return Schema(tuple(fields))

    @staticmethod
    def from_polars(schema: Mapping[str, Any]) -> Schema:
        return Schema(tuple((n, DataType.from_polars(t)) for n, t in schema.items()))

    def to_arrow(self) -> pa.Schema:
        return pa.schema([_arrow_field(n, t) for n, t in self.fields])

    def to_polars(self) -> pl.Schema:
        return pl.Schema({n: t.to_polars() for n, t in self.fields})

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.fields)

    def __getitem__(self, name: str) -> DataType:
        for n, t in self.fields:
            if n == name:
                return t
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.fields)

    def __hash__(self) -> int:
        return hash(self.fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fields == other.fields

    def row_width(self) -> int:
        """Estimated bytes per row."""
        return sum(t.byte_width for _, t in self.fields)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{n}: {t}" for n, t in self.fields) + "}"


def _arrow_field(name: str, dtype: DataType) -> pa.Field:
    if dtype.wide is not None:
        return pa.field(name, dtype.arrow, metadata={WIDE_INTEGER_KEY: dtype.wide.encode()})
    return pa.field(name, dtype.arrow)


def _field_type(field: pa.Field) -> DataType:
    wide = (field.metadata or {}).get(WIDE_INTEGER_KEY)
    if wide is not None and field.type == WIDE_INTEGER_STORAGE:
        return DataType(field.type, wide=wide.decode())
    return DataType(field.type)


def frame_to_arrow(df: pl.DataFrame) -> pa.Table:
    """``df.to_arrow()``, except that each ``Int128``/``UInt128`` column (which pyarrow
    cannot import) becomes :data:`WIDE_INTEGER_STORAGE` holding each value's 16 bytes,
    its field marked with :data:`WIDE_INTEGER_KEY`; :func:`frame_from_arrow` undoes it.
    Exact for every value: Polars splits each into its high and low 64 bits (floor
    division and modulo by 2**64), which numpy interleaves into the little-endian words."""
    wide = [i for i, t in enumerate(df.dtypes) if isinstance(t, pl.Int128 | pl.UInt128)]
    if not wide:
        return df.to_arrow()
    names = df.columns
    table = df.drop([names[i] for i in wide]).to_arrow()
    for i in wide:
        column = df.to_series(i)
        field = _arrow_field(names[i], DataType.from_polars(column.dtype))
        table = table.add_column(i, field, _wide_to_arrow(column))
    return table


def _wide_to_arrow(column: pl.Series) -> pa.Array:
    import numpy as np

    signed = column.reinterpret(signed=True) if column.dtype == pl.UInt128 else column
    halves = signed.to_frame("v").select(
        lo=(pl.col("v") % 2**64).cast(pl.UInt64).fill_null(0),
        hi=(pl.col("v") // 2**64).cast(pl.Int64).fill_null(0),
    )
    words = np.empty(2 * len(column), dtype=np.uint64)
    words[0::2] = halves["lo"].to_numpy()
    words[1::2] = halves["hi"].to_numpy().view(np.uint64)
    validity = None
    if column.null_count():
        validity = pa.array(column.is_not_null().to_numpy(), pa.bool_()).buffers()[1]
    return pa.Array.from_buffers(
        WIDE_INTEGER_STORAGE,
        len(column),
        [validity, pa.py_buffer(words)],
        null_count=column.null_count(),
    )


def frame_from_arrow(table: pa.Table | pa.RecordBatch) -> pl.DataFrame:
    """``pl.from_arrow(table)``, with each column :func:`frame_to_arrow` carried as
    :data:`WIDE_INTEGER_STORAGE` back to its ``Int128``/``UInt128`` values (Polars reads
    the decimal's 16 bytes without checking its precision; ``to_physical`` gives them as
    an Int128)."""
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return restore_wide(df, table.schema)


def restore_wide(df: pl.DataFrame, schema: pa.Schema) -> pl.DataFrame:
    """``df`` (read from Arrow data of ``schema``) with its columns marked as 128-bit
    integers (:func:`frame_to_arrow`) turned back into them."""
    fixes = []
    for i, field in enumerate(schema):
        wide = (field.metadata or {}).get(WIDE_INTEGER_KEY)
        if wide is None or field.type != WIDE_INTEGER_STORAGE:
            continue
        physical = pl.nth(i).to_physical()
        fixes.append(physical.reinterpret(signed=False) if wide == b"UInt128" else physical)
    return df.with_columns(fixes) if fixes else df
