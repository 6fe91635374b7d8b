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


@dataclass(frozen=True)
class DataType:
    """One column type. ``arrow`` is the normalised ``pyarrow.DataType``. ``categories``
    is set for a Polars ``Enum`` only: its categories in order (the Arrow form, a
    dictionary, is the same as a ``Categorical``'s; Polars keeps the categories in the
    Arrow field's metadata, which :meth:`Schema.from_arrow` reads). An Enum nested in a
    list or struct is carried as a Categorical."""

    arrow: pa.DataType
    categories: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrow", _normalise(self.arrow))
        if self.categories is not None:
            object.__setattr__(self, "categories", tuple(self.categories))

    @staticmethod
    def from_polars(dtype: Any) -> DataType:
        """Convert a Polars dtype (class or instance). Raises ``PlanError`` if Arrow has no
        equivalent."""
        return _from_polars(dtype if not isinstance(dtype, type) else dtype())

    def to_polars(self) -> pl.DataType:
        """The Polars dtype the kernel uses for this type."""
        if self.categories is not None:
            return pl.Enum(list(self.categories))
        return _to_polars(self.arrow)

    @property
    def is_enum(self) -> bool:
        return self.categories is not None

    @property
    def is_numeric(self) -> bool:
        return (
            pa.types.is_integer(self.arrow) or pa.types.is_floating(self.arrow) or self.is_decimal
        )

    @property
    def is_integer(self) -> bool:
        return pa.types.is_integer(self.arrow)

    @property
    def is_float(self) -> bool:
        return pa.types.is_floating(self.arrow)

    @property
    def is_decimal(self) -> bool:
        return pa.types.is_decimal(self.arrow)

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
    try:
        arrow = pl.Series([], dtype=dtype).to_arrow().type
    except Exception as exc:  # exotic dtypes: Int128, UInt128
        raise PlanError(
            f"Polars dtype {dtype} has no Arrow equivalent (shoal carries every column as "
            f"Arrow; pyarrow: {exc})"
        ) from exc
    if isinstance(dtype, pl.Enum):
        return DataType(arrow, tuple(dtype.categories.to_list()))
    return DataType(arrow)


@lru_cache(maxsize=512)
def _to_polars(arrow: pa.DataType) -> pl.DataType:
    return pl.from_arrow(pa.array([], type=arrow)).dtype  # type: ignore[union-attr]


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
        fields = [(f.name, DataType(f.type)) for f in schema]
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
        return pa.schema([pa.field(n, t.arrow) for n, t in self.fields])

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
