"""Splitting scans into partitions, and size estimates for planning decisions.

Parquet scans split by file and row group, using sizes from the Parquet footers: a
partition is about ``target_partition_bytes`` of uncompressed data in the scanned columns;
a row group larger than that is split into row ranges, and small files are grouped.
In-memory tables split into row ranges the same way.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import pyarrow.parquet as pq

from shoal.errors import PlanError
from shoal.execution.task import (
    FilePartition,
    MemoryPiece,
    ParquetPiece,
    ScanInput,
    ScanPartition,
    to_wire,
)
from shoal.ir.nodes import FileSource, InMemorySource, ParquetSource, Scan
from shoal.ir.types import DataType


@dataclass(frozen=True)
class ScanSplit:
    """The partitions of one scan and its estimated size (bytes, rows)."""

    partitions: tuple[ScanInput, ...]
    est_bytes: int
    est_rows: int


def check_paths(source: ParquetSource | FileSource) -> None:
    """Raise ``FileNotFoundError`` naming the first path that does not exist."""
    for path in source.paths:
        if not os.path.exists(path):
            kind = "Parquet" if isinstance(source, ParquetSource) else source.format.upper()
            raise FileNotFoundError(2, f"shoal: {kind} file not found: {path}", path)


#: A scan is not cut finer than this to reach ``min_partitions`` (bytes).
MIN_SPLIT_BYTES = 1024 * 1024


def split_scan(
    scan: Scan, target_bytes: int, default_partitions: int = 0, min_partitions: int = 1
) -> ScanSplit:
    """Partitions of ``scan`` of about ``target_bytes`` each (at least one partition).

    Sizes are estimated in memory (Arrow) bytes: the larger of the Parquet footer's
    uncompressed size and rows x the scanned schema's row width. A scan big enough is cut
    into at least ``min_partitions`` partitions (the planner asks for 2 per CPU) but never
    below :data:`MIN_SPLIT_BYTES` each. An in-memory table splits into
    ``default_partitions`` row ranges when that is set.

    Raises ``FileNotFoundError`` naming a missing path; :class:`shoal.PlanError` naming a
    file whose footer cannot be read, or two files that disagree on a column's type.
    """
    if isinstance(scan.source, InMemorySource):
        return _split_table(scan, target_bytes, default_partitions)
    if isinstance(scan.source, FileSource):
        check_paths(scan.source)
        sizes = [os.path.getsize(p) for p in scan.source.paths]
        parts: tuple[ScanInput, ...] = tuple(FilePartition(p) for p in scan.source.paths)
        return ScanSplit(parts or (FilePartition(""),), sum(sizes), 0)
    assert isinstance(scan.source, ParquetSource)
    check_paths(scan.source)
    groups = _row_groups(scan)
    total = sum(size for *_, size in groups)
    if min_partitions > 1 and total > MIN_SPLIT_BYTES:
        target_bytes = min(target_bytes, max(MIN_SPLIT_BYTES, total // min_partitions))
    units: list[tuple[ParquetPiece, int]] = []  # (piece, bytes)
    for path, offset, rows, size in groups:
        pieces = max(1, math.ceil(size / target_bytes)) if rows else 1
        step = math.ceil(rows / pieces) if rows else 0
        start = 0
        while True:
            n = min(step, rows - start)
            units.append((ParquetPiece(path, offset + start, n), size * n // max(rows, 1)))
            start += n
            if start >= rows:
                break
    partitions: list[ScanInput] = []
    current: list[ParquetPiece] = []
    current_bytes = 0
    for piece, size in units:
        # A file without rows stays a partition of its own: grouping it changes nothing,
        # and keeping it shows that empty partitions flow through every stage.
        if current and (
            current_bytes + size > target_bytes or piece.rows == 0 or current[-1].rows == 0
        ):
            partitions.append(ScanPartition(tuple(current)))
            current, current_bytes = [], 0
        current.append(piece)
        current_bytes += size
    if current or not partitions:
        partitions.append(ScanPartition(tuple(current)))
    rows_total = sum(p.rows for p, _ in units)
    return ScanSplit(tuple(partitions), total, rows_total)


def _row_groups(scan: Scan) -> list[tuple[str, int, int, int]]:
    """(path, first row, rows, estimated bytes) of every row group of the scan's files, in
    order; a file without row groups gives one entry of 0 rows. Checks the files agree."""
    assert isinstance(scan.source, ParquetSource)
    columns = set(scan.schema.names)
    width = scan.schema.row_width()
    out: list[tuple[str, int, int, int]] = []
    first: tuple[str, dict[str, DataType]] | None = None
    for path in scan.source.paths:
        try:
            meta = pq.read_metadata(path)
            arrow_schema = meta.schema.to_arrow_schema()
        except Exception as exc:
            raise PlanError(
                f"shoal: {path} is not a readable Parquet file (corrupt or truncated): {exc}"
            ) from exc
        types = {f.name: DataType(f.type) for f in arrow_schema if f.name in columns}
        if first is None:
            first = (path, types)
        else:
            _check_same_schema(first, (path, types), scan.schema.names)
        offset = 0
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            size = 0
            for j in range(rg.num_columns):
                col = rg.column(j)
                if col.path_in_schema.split(".")[0] in columns:
                    size += col.total_uncompressed_size
            out.append((path, offset, rg.num_rows, max(size, rg.num_rows * width)))
            offset += rg.num_rows
        if meta.num_row_groups == 0:
            out.append((path, 0, 0, 0))
    return out


def _check_same_schema(
    a: tuple[str, dict[str, DataType]],
    b: tuple[str, dict[str, DataType]],
    columns: tuple[str, ...],
) -> None:
    """Files of one dataset must agree on every scanned column: raise PlanError naming the
    two files and the column otherwise."""
    for col in columns:
        ta, tb = a[1].get(col), b[1].get(col)
        if ta is None and tb is None:
            continue  # e.g. a hive partition column, not stored in the files
        if ta is None or tb is None:
            missing, has = (a[0], b[0]) if ta is None else (b[0], a[0])
            raise PlanError(
                f"shoal: Parquet files of one scan disagree: column {col!r} is in {has} "
                f"but not in {missing}"
            )
        if ta != tb:
            raise PlanError(
                f"shoal: Parquet files of one scan disagree on column {col!r}: {ta} in "
                f"{a[0]} but {tb} in {b[0]}"
            )


def _split_table(scan: Scan, target_bytes: int, default_partitions: int) -> ScanSplit:
    assert isinstance(scan.source, InMemorySource)
    table = scan.source.table.select(list(scan.schema.names))
    nbytes = table.nbytes
    if default_partitions:
        n = default_partitions
    else:
        n = min(max(1, math.ceil(nbytes / target_bytes)), max(1, table.num_rows))
    rows = table.num_rows
    parts: list[ScanInput] = []
    for i in range(n):
        start, stop = i * rows // n, (i + 1) * rows // n
        parts.append(MemoryPiece(to_wire(table.slice(start, stop - start))))
    return ScanSplit(tuple(parts), nbytes, table.num_rows)
