"""What one task is given: where its scan rows come from and how to partition its output.

These small frozen records travel with every task (pickled by Ray); they hold no data
except :class:`MemoryPiece`, whose table the Ray runner moves through the object store.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from shoal.ir.expr import Expr
from shoal.ir.nodes import PlanNode, Scan


@dataclass(frozen=True)
class ParquetPiece:
    """Rows ``offset`` to ``offset + rows`` of one Parquet file (row-group aligned where
    the target partition size allows)."""

    path: str
    offset: int
    rows: int
    #: Columns stored with Arrow's Null type in this file (pyarrow writes an empty or
    #: all-null untyped column so) that the scan reads with another type: the kernel casts
    #: them, as Polars does for every file after the first.
    null_columns: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScanPartition:
    """One partition of a Parquet scan: pieces read in order and concatenated."""

    pieces: tuple[ParquetPiece, ...]

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.pieces)


@dataclass(frozen=True)
class FilePartition:
    """One partition of a CSV, NDJSON or IPC scan: one whole file."""

    path: str


@dataclass(frozen=True, eq=False)
class MemoryPiece:
    """One partition of an in-memory scan: a row range of the source table, in the form
    tables travel between tasks (:func:`to_wire`; the kernel reads the scan's columns)."""

    table: pa.Table


#: Name of the single column that carries the row count of a table without columns
#: between tasks (see :func:`to_wire`).
HEIGHT_COLUMN = "__shoal_height"


def to_wire(table: pa.Table) -> pa.Table:
    """``table`` in the form it travels between tasks and to the driver: unchanged when it
    has columns; a table without columns becomes one column ``HEIGHT_COLUMN`` of type
    null and the same number of rows (no buffers: zero bytes).

    A table of ``n`` rows and no columns (what a count after a filter reads once Polars has
    pruned every column) loses its rows on the way otherwise: pyarrow pickles a table as
    its columns (Ray's object store and the local worker processes pickle), and
    ``pyarrow.concat_tables`` counts rows by column; both give 0 rows. :func:`from_wire`
    undoes this."""
    if table.num_columns or not table.num_rows:
        return table
    return pa.table({HEIGHT_COLUMN: pa.nulls(table.num_rows)})


def from_wire(table: pa.Table) -> pa.Table:
    """The table :func:`to_wire` was given: a table whose only column is ``HEIGHT_COLUMN``
    of type null becomes a table of as many rows and no columns."""
    if (
        table.num_columns == 1
        and table.column_names[0] == HEIGHT_COLUMN
        and pa.types.is_null(table.schema.field(0).type)
    ):
        return table.select([])
    return table


@dataclass(frozen=True, eq=False)
class ScanSet:
    """What the one task of a small-query plan reads: every scan of its fragment whole.

    ``parts[i]`` is for the ``i``-th distinct :class:`~shoal.ir.nodes.Scan` node of the
    fragment in :func:`scans_of` order: one partition holding all of the scan's rows (a
    Parquet scan's pieces, already pruned by the footers' statistics; an in-memory table),
    or a tuple of whole files read in order and concatenated (CSV, NDJSON, IPC).
    """

    parts: tuple[ScanPartition | MemoryPiece | tuple[FilePartition, ...], ...]

    @property
    def rows(self) -> int:
        """Rows the task reads from Parquet and in-memory scans (files are not counted)."""
        total = 0
        for p in self.parts:
            if isinstance(p, ScanPartition):
                total += p.rows
            elif isinstance(p, MemoryPiece):
                total += p.table.num_rows
        return total


def scans_of(fragment: PlanNode) -> list[Scan]:
    """The distinct :class:`~shoal.ir.nodes.Scan` nodes of ``fragment`` (by identity: a
    sub-plan shared by two parents counts once), in depth-first order, root first. Pickling
    keeps shared nodes shared, so a task computes the same list as the planner did."""
    seen: set[int] = set()
    out: list[Scan] = []
    for node in fragment.walk():
        if isinstance(node, Scan) and id(node) not in seen:
            seen.add(id(node))
            out.append(node)
    return out


#: What a scan task reads: Parquet pieces, an in-memory row range, one whole file, or (the
#: small-query path) every scan of the fragment whole.
ScanInput = ScanPartition | MemoryPiece | FilePartition | ScanSet


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
    """The task splits its result into ``n`` tables by the sort order of ``by``.

    ``boundaries`` holds ``n - 1`` rows of sort keys (columns ``__k0``, ``__k1``, ...),
    chosen by the runner from samples once the upstream stage is done (None until then).
    Table ``i`` holds the rows that sort after boundary ``i - 1`` and not after boundary
    ``i``, so concatenating the tables in order, each sorted, gives a sorted whole.
    """

    by: tuple[Expr, ...]
    descending: tuple[bool, ...]
    nulls_last: tuple[bool, ...]
    n: int
    boundaries: pa.Table | None = None

    @property
    def num_outputs(self) -> int:
        return self.n


OutputSpec = SingleOutput | HashOutput | RangeOutput
