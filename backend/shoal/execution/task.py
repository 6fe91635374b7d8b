"""What one task is given: where its scan rows come from and how to partition its output.

These small frozen records travel with every task (pickled by Ray); they hold no data
except :class:`MemoryPiece`, whose table the Ray runner moves through the object store.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from shoal.ir.expr import Expr


@dataclass(frozen=True)
class ParquetPiece:
    """Rows ``offset`` to ``offset + rows`` of one Parquet file (row-group aligned where
    the target partition size allows)."""

    path: str
    offset: int
    rows: int


@dataclass(frozen=True)
class ScanPartition:
    """One partition of a Parquet scan: pieces read in order and concatenated."""

    pieces: tuple[ParquetPiece, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)


@dataclass(frozen=True, eq=False)
class MemoryPiece:
    """One partition of an in-memory scan: a row range of the source table."""

    table: pa.Table


@dataclass(frozen=True)
class SingleOutput:
    """The task returns its result as one table."""

    sample_by: tuple[Expr, ...] = ()
    sample_rows: int = 0

    @property
    def num_outputs(self) -> int:
        return 1


@dataclass(frozen=True)
class HashOutput:
    """The task splits its result into ``n`` tables by hash of ``keys`` (same value, same
    table, on every task of the query: Polars' seeded hash, stable within one version)."""

    keys: tuple[Expr, ...]
    n: int

    @property
    def num_outputs(self) -> int:
        return self.n


@dataclass(frozen=True, eq=False)
class RangeOutput:
    """The task splits its result into ``len(boundaries) + 1`` tables by the sort order of
    ``by``: table i holds rows after boundary i-1 and up to boundary i."""

    by: tuple[Expr, ...]
    descending: tuple[bool, ...]
    nulls_last: tuple[bool, ...]
    boundaries: pa.Table | None

    @property
    def num_outputs(self) -> int:
        return 1 if self.boundaries is None else self.boundaries.num_rows + 1


OutputSpec = SingleOutput | HashOutput | RangeOutput
