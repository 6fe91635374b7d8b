"""Columns whose values the partitions of a Parquet scan hold in disjoint ranges.

Data written in the order of a key (an id, a date: TPC-H's ``lineitem`` and ``orders`` by
their order key) splits into partitions that each hold their own range of that key. The
Parquet footers say so without reading a row: every row group stores the min and max of
each column and its null count. When the ranges of the partitions (the union of their
row groups' ranges) do not overlap, every value of the column lives in one partition
only, exactly as after a hash exchange on it: an aggregation whose keys include the
column completes in place, without a partial aggregation, an exchange and a final one
(the planner treats the column as a hash-partitioned column set; see
:class:`shoal.planner.context.OpenFragment`).

Only where the statistics are bounds of the values by construction: signed integer and
date columns (their Parquet order is the numeric order), statistics present and exact in
every row group the partitions read, and nulls (a group of their own) in at most one
partition. A row group cut into several partitions gives each of them its whole range, so
they overlap unless the column is constant there: such a column is not reported.
"""

from __future__ import annotations

import bisect
import datetime
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from shoal import storage
from shoal.ir.nodes import ParquetSource, Scan
from shoal.planner.partitioning import (
    ColumnStats,
    FileDigest,
    HeldCache,
    add_piece,
    file_digest,
    row_groups_read,
)
from shoal.planner.physical import ParquetPiece, ScanInput, ScanPartition


def _eligible(scan: Scan, name: str) -> bool:
    """Whether column ``name`` of ``scan`` has a type whose footer statistics order as its
    values do: a signed integer or a date."""
    t = scan.schema[name].arrow
    return pa.types.is_signed_integer(t) or pa.types.is_date32(t)


def _value(v: Any) -> int | None:
    """A footer statistic as an integer on the column's order (dates as days), or None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, datetime.date) and not isinstance(v, datetime.datetime):
        return v.toordinal()
    return None


#: Answers of :func:`disjoint_columns` by (the ids of the footers read, the column, the
#: partitions), held with the footers.
_CACHE = HeldCache()


def disjoint_columns(
    scan: Scan, partitions: tuple[ScanInput, ...], candidates: Iterable[str]
) -> tuple[str, ...]:
    """The columns of ``candidates`` (read by ``scan``, a Parquet scan split into
    ``partitions``) whose non-null values are in pairwise disjoint ranges across the
    partitions, with null values in at most one partition (see the module docstring).
    Empty for any other source, a single partition, or when a footer lacks what is
    needed. Footers come from :func:`shoal.storage.read_footers` (cached); answers are
    cached too."""
    if not isinstance(scan.source, ParquetSource) or len(partitions) < 2:
        return ()
    names = [c for c in dict.fromkeys(candidates) if c in scan.schema.names and _eligible(scan, c)]
    if not names or not all(isinstance(p, ScanPartition) for p in partitions):
        return ()
    metas = storage.read_footers(scan.source.paths, scan.source.storage_options)
    files: dict[str, FileDigest] = {}
    found = []
    for c in names:
        key = (tuple(map(id, metas)), c, partitions)
        cached, disjoint = _CACHE.lookup(key)
        if not cached:
            if not files:  # the footers as planning reads them, kept with them
                files = dict(zip(scan.source.paths, map(file_digest, metas), strict=True))
            disjoint = _disjoint(c, partitions, files)
            _CACHE.put(key, metas, disjoint)
        if disjoint:
            found.append(c)
    return tuple(found)


def _groups(f: FileDigest, offset: int, rows: int) -> range:
    """The row groups of ``f`` that rows ``offset .. offset + rows`` touch."""
    starts = list(itertools.accumulate((g.num_rows for g in f.row_groups), initial=0))[:-1]
    first = max(0, bisect.bisect_right(starts, offset) - 1)
    return range(first, bisect.bisect_left(starts, offset + rows))


def _partition_range(
    name: str, part: ScanPartition, files: dict[str, FileDigest]
) -> tuple[int | None, int | None, bool] | None:
    """(min, max, has nulls) of column ``name`` over the row groups that partition
    ``part`` reads (min and max None: no non-null value), or None when a footer does not
    say exactly (see :func:`_range`)."""
    lo: int | None = None
    hi: int | None = None
    nulls = False
    for piece in part.pieces:
        if not piece.rows:
            continue
        if name in piece.null_columns:  # an untyped all-null column in this file
            nulls = True
            continue
        f = files.get(piece.path)
        leaf = f.leaf.get(name) if f is not None else None
        if f is None or leaf is None:
            return None
        for g in _groups(f, piece.offset, piece.rows):
            rg = f.row_groups[g]
            if not rg.num_rows:
                continue
            got = _range(rg.statistics(leaf), rg.num_rows)
            if got is None:
                return None
            g_lo, g_hi, g_nulls = got
            nulls = nulls or g_nulls
            if g_lo is not None and g_hi is not None:
                lo = g_lo if lo is None else min(lo, g_lo)
                hi = g_hi if hi is None else max(hi, g_hi)
    return lo, hi, nulls


def _disjoint(name: str, partitions: tuple[ScanInput, ...], files: dict[str, FileDigest]) -> bool:
    ranges: list[tuple[int, int]] = []
    with_nulls = 0
    for part in partitions:
        assert isinstance(part, ScanPartition)
        got = _partition_range(name, part, files)
        if got is None:
            return False
        lo, hi, nulls = got
        with_nulls += nulls
        if lo is not None and hi is not None:
            ranges.append((lo, hi))
    if with_nulls > 1:
        return False
    ranges.sort()
    return all(a[1] < b[0] for a, b in zip(ranges, ranges[1:], strict=False))


def _files(scan: Scan) -> dict[str, FileDigest]:
    assert isinstance(scan.source, ParquetSource)
    metas = storage.read_footers(scan.source.paths, scan.source.storage_options)
    return dict(zip(scan.source.paths, map(file_digest, metas), strict=True))


def key_ranges(
    scan: Scan, partitions: Sequence[ScanPartition], column: str
) -> list[tuple[int, int] | None] | None:
    """For each partition of Parquet scan ``scan``: the (min, max) of the non-null values
    of ``column`` in the row groups it reads (a superset of the values it holds: a row
    group cut between partitions gives each its whole range), or None where it holds no
    non-null value. None when the column's type does not order its footer statistics as
    its values (:func:`_eligible`) or a footer lacks exact statistics."""
    if not isinstance(scan.source, ParquetSource) or not _eligible(scan, column):
        return None
    files = _files(scan)
    out: list[tuple[int, int] | None] = []
    for part in partitions:
        got = _partition_range(column, part, files)
        if got is None:
            return None
        lo, hi, _ = got
        out.append(None if lo is None or hi is None else (lo, hi))
    return out


#: Answers of :func:`aligned_partitions` by (the scan node's id, the column, the ranges),
#: held with the scan node (a join moved down tries the same scan against the same ranges
#: once per place it may go: :mod:`shoal.planner.reassociate`).
_ALIGNED = HeldCache()


def aligned_partitions(
    scan: Scan, column: str, ranges: Sequence[tuple[int, int] | None]
) -> tuple[tuple[ScanPartition, ...], list[int], int] | None:
    """See :func:`_aligned_partitions` (cached here)."""
    key = (id(scan), column, tuple(ranges))
    cached, got = _ALIGNED.lookup(key)
    if not cached:
        got = _aligned_partitions(scan, column, ranges)
        _ALIGNED.put(key, scan, got)
    return None if got is None else (got[0], list(got[1]), got[2])


def _aligned_partitions(
    scan: Scan, column: str, ranges: Sequence[tuple[int, int] | None]
) -> tuple[tuple[ScanPartition, ...], list[int], int] | None:
    """Partitions of Parquet scan ``scan`` cut to ``ranges``: for each range, the row
    groups the scan reads (those its predicate may keep) whose footer statistics of
    ``column`` say they may hold a non-null value in it (none for a range of None), so
    that every row whose ``column`` is in the range is in its partition. A row group
    overlapping several ranges is in each of their partitions. Returns the partitions,
    the estimated bytes each reads, and the bytes of all the row groups the scan reads; None when ``column`` is not eligible (:func:`_eligible`) or a row group lacks
    exact statistics. Pieces of one file that follow each other are one piece; a file
    whose read row groups are all in one partition is marked
    :attr:`~shoal.planner.physical.ParquetPiece.whole_file` (unless the scan lists it
    twice)."""
    if not isinstance(scan.source, ParquetSource) or not _eligible(scan, column):
        return None
    groups, _, _ = row_groups_read(scan)
    files = _files(scan)
    repeated = {p for p in scan.source.paths if scan.source.paths.count(p) > 1}
    bounds: list[tuple[int, int] | None] = []  # per group: its range, None if all null
    for path, offset, rows, _, _ in groups:
        if not rows:
            bounds.append(None)
            continue
        f = files[path]
        leaf = f.leaf.get(column)
        if leaf is None:
            return None
        (g,) = _groups(f, offset, rows)  # one row group
        r = _range(f.row_groups[g].statistics(leaf), rows)
        if r is None:
            return None
        lo, hi, _ = r
        bounds.append(None if lo is None or hi is None else (lo, hi))
    total = sum(g[3] for g in groups)
    read_groups = Counter(g[0] for g in groups if g[2])
    parts: list[ScanPartition] = []
    read: list[int] = []
    for want in ranges:
        chosen = []
        if want is not None:
            chosen = [
                g
                for g, b in zip(groups, bounds, strict=True)
                if b is not None and b[0] <= want[1] and want[0] <= b[1]
            ]
        read.append(sum(g[3] for g in chosen))
        mine = Counter(g[0] for g in chosen)
        pieces: list[ParquetPiece] = []
        for path, offset, rows, _, nulls in chosen:
            whole = path not in repeated and mine[path] == read_groups[path]
            add_piece(pieces, ParquetPiece(path, offset, rows, nulls, whole))
        parts.append(ScanPartition(tuple(pieces)))
    return tuple(parts), read, total


def _range(stats: ColumnStats | None, rows: int) -> tuple[int | None, int | None, bool] | None:
    """(min, max, has nulls) of one row group's column from its statistics; (None, None,
    True) when every value is null; None when the statistics do not say exactly."""
    if stats is None or stats.null_count is None:
        return None
    if stats.null_count == rows:
        return None, None, True
    if stats.min is None or stats.max is None or not stats.exact:
        return None
    lo, hi = _value(stats.min), _value(stats.max)
    if lo is None or hi is None:
        return None
    return lo, hi, stats.null_count > 0
