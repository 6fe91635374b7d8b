"""Splitting scans into partitions, and size estimates for planning decisions.

Parquet scans split by file and row group, using sizes from the Parquet footers: a
partition is about ``target_partition_bytes`` of uncompressed data in the scanned columns
(fewer bytes where the CPUs ask for more partitions), the row groups cut into runs of equal
bytes, on file boundaries where the balance allows; a row group larger than a partition is
split into row ranges, and small files are grouped.
In-memory tables split into row ranges the same way.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import itertools
import math
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from shoal import storage
from shoal.errors import PlanError, SchemaMismatchError
from shoal.ir.expr import BinaryOp, Col, Expr, Lit
from shoal.ir.nodes import FileSource, InMemorySource, ParquetSource, Scan
from shoal.ir.types import DataType
from shoal.planner.physical import (
    FilePartition,
    MemoryPiece,
    ParquetPiece,
    ScanInput,
    ScanPartition,
    to_wire,
)


@dataclass(frozen=True)
class ScanSplit:
    """The partitions of one scan and its estimated size (bytes, rows)."""

    partitions: tuple[ScanInput, ...]
    est_bytes: int
    est_rows: int
    #: Parquet row groups of the scan, and how many of them the footers' statistics ruled
    #: out against the scan's predicate (not read by any task).
    row_groups: int = 0
    row_groups_pruned: int = 0
    #: Fraction of the scanned rows that the scan's predicate is estimated to keep from
    #: the footers' min/max statistics (:func:`estimate_selectivity`), counting only its
    #: ``col <op> literal`` terms; None: no term could be estimated. ``unestimated``: the
    #: predicate has terms the statistics say nothing about (the planner's default
    #: selectivity applies to them).
    selectivity: float | None = None
    unestimated: bool = False


def check_paths(source: ParquetSource | FileSource) -> list[int]:
    """The size of every file of ``source`` (bytes), in order, through
    :mod:`shoal.storage` (local paths and object-storage URLs alike).

    Raises ``FileNotFoundError`` naming the first path that does not exist (also a missing
    bucket), ``PermissionError`` naming it when the storage refuses the credentials."""
    kind = "Parquet" if isinstance(source, ParquetSource) else source.format.upper()
    infos = storage.file_infos(source.paths, source.storage_options, kind)
    return [int(i.size or 0) for i in infos]


#: A scan is not cut finer than this to reach ``min_partitions`` (bytes).
MIN_SPLIT_BYTES = 1024 * 1024


def split_scan(
    scan: Scan,
    target_bytes: int,
    default_partitions: int = 0,
    min_partitions: int = 1,
    cpus: int = 1,
) -> ScanSplit:
    """Partitions of ``scan`` of about ``target_bytes`` each (at least one partition).

    Sizes are estimated in memory (Arrow) bytes: the larger of the Parquet footer's
    uncompressed size and rows x the scanned schema's row width. A scan big enough is cut
    into at least ``min_partitions`` partitions (the planner asks for one per CPU) but never
    below :data:`MIN_SPLIT_BYTES` each. An in-memory table splits into
    ``default_partitions`` row ranges when that is set.

    A Parquet scan's count of partitions (:func:`partition_count`) is a multiple of
    ``cpus`` (the CPUs that run its tasks at once) where that keeps partitions of at least
    :data:`MIN_SPLIT_BYTES`, or where fewer partitions stay within ``target_bytes``: a
    count one over a multiple runs a wave of one task after the others. The row groups
    the scan reads, in order, are cut into that many runs of about equal bytes
    (:func:`_cuts`), preferring file boundaries, then row-group boundaries, and cutting
    inside a row group only where no boundary is near enough. A file without rows is a
    partition of its own (placed among the others where its position in the order falls).
    Every piece of a file whose read row groups all fall in one partition is marked
    :attr:`ParquetPiece.whole_file` (the kernel then reads the file without a slice).

    Raises ``FileNotFoundError`` naming a missing path; :class:`shoal.PlanError` naming a
    file whose footer cannot be read, or two files that disagree on a column's type.
    """
    if isinstance(scan.source, InMemorySource):
        return _split_table(scan, target_bytes, default_partitions)
    if isinstance(scan.source, FileSource):
        sizes = check_paths(scan.source)
        parts: tuple[ScanInput, ...] = tuple(FilePartition(p) for p in scan.source.paths)
        return ScanSplit(parts or (FilePartition(""),), sum(sizes), 0)
    assert isinstance(scan.source, ParquetSource)
    groups, pruned, kept = row_groups_read(scan)
    total = sum(g[3] for g in groups)
    rows_total = sum(g[2] for g in groups)
    n = min(partition_count(total, target_bytes, min_partitions, cpus), max(1, rows_total))
    repeated = {p for p, c in Counter(scan.source.paths).items() if c > 1}
    partitions = _partitions(groups, total, n, repeated, target_bytes, cpus)
    n_groups = sum(1 for g in groups if g[2]) + pruned
    selectivity, unestimated = None, False
    if scan.predicate is not None:
        terms = _terms(scan.predicate)
        # Terms the statistics estimate: against a number or a date (``==`` not on floats).
        known = [
            (c, op, v)
            for c, op, v in _conjuncts(scan.predicate)
            if _number(v) is not None and not (op == "eq" and isinstance(v, float))
        ]
        unestimated = len(known) < len(terms)
        if known and rows_total:
            selectivity = sum(r * f for r, f in kept) / max(1, sum(r for r, _ in kept))
        elif known:
            selectivity = 0.0
    return ScanSplit(
        tuple(partitions), total, rows_total, n_groups, pruned, selectivity, unestimated
    )


def whole_split(scan: Scan) -> ScanSplit:
    """The one partition of a Parquet scan read whole (the small-query path): every row
    group its predicate may keep (:func:`row_groups_read`), without cutting them into
    partitions as :func:`split_scan` does (a third of planning a small query's scan went
    there). Sizes, row counts and pruned row groups as :func:`split_scan` gives them.
    Raises as :func:`split_scan`."""
    assert isinstance(scan.source, ParquetSource)
    groups, pruned, _ = row_groups_read(scan)
    pieces: list[ParquetPiece] = []
    for path, offset, rows, _, nulls in groups:
        add_piece(pieces, ParquetPiece(path, offset, rows, nulls, True))
    n_groups = sum(1 for g in groups if g[2]) + pruned
    return ScanSplit(
        (ScanPartition(tuple(pieces)),),
        sum(g[3] for g in groups),
        sum(g[2] for g in groups),
        n_groups,
        pruned,
    )


def add_piece(pieces: list[ParquetPiece], piece: ParquetPiece) -> None:
    """Append ``piece`` (a run of rows of one file) to ``pieces``, or extend the last piece
    when it is the same file's rows just before ``piece``'s (one read instead of two)."""
    last = pieces[-1] if pieces else None
    if last is not None and last.path == piece.path and last.offset + last.rows == piece.offset:
        pieces[-1] = dataclasses.replace(last, rows=last.rows + piece.rows)
    else:
        pieces.append(piece)


class HeldCache:
    """A bounded, thread-safe cache of the most recently used answers by keys that hold
    the ids of objects (footers, plan nodes). Each entry keeps those objects (``held``)
    alive, so an id in a live entry's key is not reused by another object: a hit is the
    answer for the very objects the key names."""

    def __init__(self, size: int = 256) -> None:
        self._items: OrderedDict[Any, tuple[Any, Any]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def lookup(self, key: Any) -> tuple[bool, Any]:
        """``(True, answer)`` for a cached key, else ``(False, None)``."""
        with self._lock:
            got = self._items.get(key)
            if got is None:
                return False, None
            self._items.move_to_end(key)
            return True, got[1]

    def put(self, key: Any, held: Any, answer: Any) -> None:
        """Keep ``answer`` for ``key``, with ``held`` (the objects whose ids it holds)."""
        with self._lock:
            self._items[key] = (held, answer)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


def partition_count(total: int, target_bytes: int, min_partitions: int = 1, cpus: int = 1) -> int:
    """How many partitions a Parquet scan of ``total`` estimated bytes is cut into.

    Enough to keep partitions at ``target_bytes`` (``ceil(total / target_bytes)``), at
    least ``min_partitions`` when each keeps :data:`MIN_SPLIT_BYTES`, then a multiple of
    ``cpus`` where that costs nothing: rounded down where the partitions stay within
    :data:`OVER_TARGET` times ``target_bytes`` (a wave fewer, or the same waves in fewer
    tasks), else up where every partition keeps :data:`MIN_SPLIT_BYTES` (the same waves,
    each task smaller). A count of one stays one. ``total`` of 0 (no rows, or no columns
    read) gives one partition.

    The planner asks for one partition per CPU at least (``min_partitions`` = ``cpus``).
    Two per CPU, asked before, cut TPC-H's medium scans at scale 1 on 2 CPUs into twice
    the tasks of 10-40 ms each, where each task's fixed cost (Ray's dispatch, the task's
    Polars query set up, its output) weighs: one per CPU ran the 22 queries 9 % faster
    (3.78 s -> 3.45 s, medians of 5 interleaved runs), and the same at scale 10, whose
    large scans are cut by ``target_bytes``."""
    if total <= 0:
        return 1
    need = max(1, math.ceil(total / max(1, target_bytes)))
    n = need
    if min_partitions > 1 and total > MIN_SPLIT_BYTES:
        n = max(n, min(min_partitions, total // MIN_SPLIT_BYTES))
    if cpus > 1 and n > 1 and n % cpus:
        up, down = n + cpus - n % cpus, n - n % cpus
        if down and total / down <= OVER_TARGET * target_bytes:
            n = down
        elif total // up >= MIN_SPLIT_BYTES:
            n = up
    return n


def _partitions(
    groups: list[tuple[str, int, int, int, tuple[str, ...]]],
    total: int,
    n: int,
    repeated: set[str],
    target_bytes: int,
    cpus: int = 1,
) -> list[ScanInput]:
    """``groups`` (:func:`row_groups_read`) cut into ``n`` partitions of about ``total / n``
    bytes at the positions :func:`_cuts` chooses, rows in order; each file without rows a
    partition of its own, after the partition that holds the rows before it (grouping it
    changes nothing, keeping it shows that empty partitions flow through every stage, and
    where it falls among the others changes no row's place). Pieces of a
    file whose rows all fall in one partition are marked ``whole_file``, unless the path
    is in ``repeated`` (listed more than once by the scan: each listing is read).

    Cuts on row-group boundaries may leave a partition of two row groups each a little
    under a share: while some partition holding more than one row group is over
    :data:`OVER_TARGET` times ``target_bytes``, more partitions are tried (the next
    multiple of ``cpus``, or 1/16 more), so that partitions stay near the target as greedy
    packing kept them."""
    read = [g for g in groups if g[2]]
    rows_total = sum(g[2] for g in read)
    if not rows_total:
        empties = [ScanPartition((ParquetPiece(g[0], g[1], 0, g[4]),)) for g in groups]
        return list(empties) or [ScanPartition(())]
    cuts = _cuts(read, total, n)
    while n < len(read) and _largest(read, cuts) > OVER_TARGET * target_bytes:
        n += max(cpus - n % cpus, n // 16)  # a few steps on many row groups
        cuts = _cuts(read, total, n)
    parts: list[list[ParquetPiece]] = [[] for _ in range(len(cuts) + 1)]
    after: dict[int, list[ParquetPiece]] = {}
    pos = 0  # rows read before this group
    for path, offset, rows, _size, nulls in groups:
        if not rows:
            k = bisect.bisect_left(cuts, pos) if pos else -1
            after.setdefault(k, []).append(ParquetPiece(path, offset, 0, nulls))
            continue
        start = pos
        while start < pos + rows:
            k = bisect.bisect_right(cuts, start)
            stop = min(pos + rows, cuts[k]) if k < len(cuts) else pos + rows
            parts[k].append(ParquetPiece(path, offset + start - pos, stop - start, nulls))
            start = stop
        pos += rows
    # Files whose rows all fall in one partition: read whole there.
    homes: dict[str, set[int]] = {}
    for k, pieces in enumerate(parts):
        for pc in pieces:
            homes.setdefault(pc.path, set()).add(k)
    out: list[ScanInput] = [ScanPartition((pc,)) for pc in after.get(-1, [])]
    for k, pieces in enumerate(parts):
        marked = tuple(
            dataclasses.replace(pc, whole_file=True)
            if len(homes[pc.path]) == 1 and pc.path not in repeated
            else pc
            for pc in pieces
        )
        out.append(ScanPartition(marked))
        out.extend(ScanPartition((pc,)) for pc in after.get(k, []))
    return out


#: A partition of several row groups may exceed ``target_bytes`` by this factor before
#: the scan is cut into one partition more (:func:`_partitions`).
OVER_TARGET = 1.25


def _largest(read: list[tuple[str, int, int, int, tuple[str, ...]]], cuts: list[int]) -> float:
    """Estimated bytes of the largest partition that holds more than one row group (or
    parts of several) when the rows of ``read`` are cut at ``cuts`` (bytes spread evenly
    over each row group's rows): a partition inside one row group cannot shrink by
    cutting on boundaries."""
    row_at = [0]
    byte_at = [0]
    for g in read:
        row_at.append(row_at[-1] + g[2])
        byte_at.append(byte_at[-1] + g[3])

    def at(row: int) -> tuple[float, int]:  # (bytes before ``row``, its row group)
        i = min(bisect.bisect_right(row_at, row) - 1, len(read) - 1)
        return byte_at[i] + (row - row_at[i]) / read[i][2] * read[i][3], i

    largest = 0.0
    edges = [0, *cuts, row_at[-1]]
    for a, b in itertools.pairwise(edges):
        (lo, i), (hi, j) = at(a), at(b - 1)
        if j > i:
            largest = max(largest, hi + read[j][3] / read[j][2] - lo)
    return largest


#: A cut moves to a file boundary within this share of a partition's bytes of where equal
#: shares put it, else to the nearest row-group boundary when the row group is no larger
#: than a partition or the boundary is within :data:`GROUP_SNAP`, else it falls inside
#: the row group (two tasks each read part of it).
FILE_SNAP = 0.0625
GROUP_SNAP = 0.25


def _cuts(read: list[tuple[str, int, int, int, tuple[str, ...]]], total: int, n: int) -> list[int]:
    """Where to cut the rows of ``read`` (row groups with rows, in order: path, first row,
    rows, bytes, ...) into ``n`` runs of about ``total / n`` bytes each: row positions
    (counted over ``read``), increasing, strictly between 0 and the last row.

    Cut ``k`` aims at ``k * total / n`` bytes. It goes to the nearest file boundary within
    :data:`FILE_SNAP` of a share, else to the nearest boundary of the row group that
    holds the aim when that row group is at most a share or the boundary is within
    :data:`GROUP_SNAP` of a share, else inside the row group at the row where the bytes
    reach the aim (bytes spread evenly over its rows): a row group is cut only where it is
    larger than a partition, as greedy packing cut them. A cut that would not move past
    the previous one is dropped (fewer partitions, never an empty one)."""
    rows_total = sum(g[2] for g in read)
    if n <= 1 or rows_total <= 1:
        return []
    share = total / n
    byte_at = [0]  # bytes before each group, and in all
    row_at = [0]
    for g in read:
        byte_at.append(byte_at[-1] + g[3])
        row_at.append(row_at[-1] + g[2])
    # Group index i is a file boundary when group i starts a new file.
    file_edge = [i in (0, len(read)) or read[i][0] != read[i - 1][0] for i in range(len(read) + 1)]
    cuts: list[int] = []
    for k in range(1, n):
        aim = total * k / n
        i = bisect.bisect_right(byte_at, aim) - 1  # the group holding the aim, or its start
        i = min(max(i, 0), len(read) - 1)
        cut = None
        lo = bisect.bisect_left(byte_at, aim - FILE_SNAP * share)
        hi = bisect.bisect_right(byte_at, aim + FILE_SNAP * share)
        near = [j for j in range(lo, hi) if file_edge[j]]
        if near:
            cut = row_at[min(near, key=lambda j: abs(byte_at[j] - aim))]
        else:
            j = i if aim - byte_at[i] <= byte_at[i + 1] - aim else i + 1
            if read[i][3] <= share or abs(byte_at[j] - aim) <= GROUP_SNAP * share:
                cut = row_at[j]
        if cut is None:
            size = max(1, read[i][3])
            cut = row_at[i] + round((aim - byte_at[i]) / size * read[i][2])
        if 0 < cut < rows_total and (not cuts or cut > cuts[-1]):
            cuts.append(cut)
    return cuts


def row_groups_read(
    scan: Scan,
) -> tuple[list[tuple[str, int, int, int, tuple[str, ...]]], int, list[tuple[int, float]]]:
    """(path, first row, rows, estimated bytes, the file's Null-typed columns to cast)
    of every row group of the scan's files that
    the scan's predicate may keep (see :func:`row_group_may_match`), in order, and how many
    were pruned; a file without row groups gives one entry of 0 rows. Checks the files
    agree. Footers are read through :func:`shoal.storage.read_footers` (parallel, cached),
    and what this reads of them is kept with them (:func:`file_digest`).
    Third: (rows, estimated fraction kept by the predicate's ``col <op> literal`` terms,
    :func:`estimate_selectivity`) of each row group kept."""
    assert isinstance(scan.source, ParquetSource)
    columns = set(scan.schema.names)
    width = scan.schema.row_width()
    out: list[tuple[str, int, int, int, tuple[str, ...]]] = []
    kept: list[tuple[int, float]] = []
    pruned = 0
    first: tuple[str, dict[str, DataType]] | None = None
    conjuncts = _conjuncts(scan.predicate) if scan.predicate is not None else []
    metas = storage.read_footers(scan.source.paths, scan.source.storage_options)
    for path, meta in zip(scan.source.paths, metas, strict=True):
        digest = file_digest(meta)
        if isinstance(digest.types, Exception):
            raise PlanError(
                f"shoal: {path} is not a readable Parquet file (corrupt or truncated): "
                f"{digest.types}"
            ) from digest.types
        types = {n: t for n, t in digest.types.items() if n in columns}
        nulls: tuple[str, ...] = ()
        if first is None:
            first = (path, types)
        else:
            nulls = _check_same_schema(first, (path, types), scan.schema.names)
        offset = 0
        for rg in digest.row_groups:
            size = sum(v for c, v in rg.sizes.items() if c in columns)
            if rg.num_rows and conjuncts and not row_group_may_match(conjuncts, rg, digest.leaf):
                pruned += 1
            else:
                out.append((path, offset, rg.num_rows, max(size, rg.num_rows * width), nulls))
                if conjuncts and rg.num_rows:
                    kept.append((rg.num_rows, estimate_selectivity(conjuncts, rg, digest.leaf)))
            offset += rg.num_rows
        if not digest.row_groups:
            out.append((path, 0, 0, 0, nulls))
    if not out and metas:  # every row group pruned: one empty piece keeps the scan typed
        out.append((scan.source.paths[0], 0, 0, 0, ()))
    return out, pruned, kept


@dataclass(frozen=True)
class ColumnStats:
    """What pruning and selectivity read of one column chunk's Parquet statistics:
    the null count (None: not written), min and max (None: not written), and whether they
    are exact bounds (a writer may truncate long strings)."""

    null_count: int | None
    min: Any
    max: Any
    exact: bool


class RowGroupDigest:
    """One row group of a Parquet footer as planning reads it: its rows, the uncompressed
    bytes of each top-level column, and its columns' statistics (by leaf index, read from
    the footer on first use and kept)."""

    __slots__ = ("_rg", "_stats", "num_rows", "sizes")

    def __init__(self, rg: pq.RowGroupMetaData) -> None:
        self._rg = rg
        self.num_rows: int = rg.num_rows
        sizes: dict[str, int] = {}
        for j in range(rg.num_columns):
            col = rg.column(j)
            top = col.path_in_schema.split(".")[0]
            sizes[top] = sizes.get(top, 0) + col.total_uncompressed_size
        self.sizes = sizes
        self._stats: dict[int, ColumnStats | None] = {}

    def statistics(self, j: int) -> ColumnStats | None:
        """The statistics of leaf column ``j`` (None: the writer wrote none)."""
        if j in self._stats:
            return self._stats[j]
        got = None
        stats = self._rg.column(j).statistics
        if stats is not None:
            lo = hi = None
            if stats.has_min_max:
                lo, hi = stats.min, stats.max
            exact = not (
                getattr(stats, "is_max_value_exact", None) is False
                or getattr(stats, "is_min_value_exact", None) is False
            )
            nulls = stats.null_count if stats.has_null_count else None
            got = ColumnStats(nulls, lo, hi, exact)
        self._stats[j] = got
        return got


@dataclass(frozen=True)
class FileDigest:
    """What planning reads of one Parquet footer: the Arrow types of its top-level columns
    (or the error that reading them raised), each leaf column's index by its path, and the
    row groups (:class:`RowGroupDigest`)."""

    types: dict[str, DataType] | Exception
    leaf: dict[str, int]
    row_groups: tuple[RowGroupDigest, ...]


#: Digests of footers, by the id of the footer object they were made from (held with
#: them, so the id is not reused while the entry lives): :func:`shoal.storage.read_footers`
#: returns the same object for a file that did not change (size, modification time).
_DIGESTS: OrderedDict[int, tuple[pq.FileMetaData, FileDigest]] = OrderedDict()
_DIGESTS_LOCK = threading.Lock()


def file_digest(meta: pq.FileMetaData) -> FileDigest:
    """The :class:`FileDigest` of footer ``meta``, made once per footer object.

    Reading a footer through pyarrow's accessors costs a Python object per column chunk,
    and every query planned over the same files read them all again (about 2.5 ms per
    query for TPC-H's lineitem at scale 0.1, 8 row groups of 16 columns): this keeps the
    plain numbers beside the footer cache of :mod:`shoal.storage`."""
    key = id(meta)
    with _DIGESTS_LOCK:
        got = _DIGESTS.get(key)
        if got is not None and got[0] is meta:
            _DIGESTS.move_to_end(key)
            return got[1]
    types: dict[str, DataType] | Exception
    try:
        types = {f.name: DataType(f.type) for f in meta.schema.to_arrow_schema()}
    except Exception as exc:
        types = exc
    leaf = {meta.schema.column(j).path: j for j in range(meta.num_columns)}
    groups = tuple(RowGroupDigest(meta.row_group(g)) for g in range(meta.num_row_groups))
    digest = FileDigest(types, leaf, groups)
    with _DIGESTS_LOCK:
        _DIGESTS[key] = (meta, digest)
        while len(_DIGESTS) > storage.FOOTER_CACHE_SIZE:
            _DIGESTS.popitem(last=False)
    return digest


# ---------------------------------------------------------------- row-group pruning

#: ``lit <op> col`` read as ``col <flipped op> lit``.
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}


def _terms(pred: Expr) -> list[Expr]:
    """The terms of ``pred``'s top-level AND."""
    if isinstance(pred, BinaryOp) and pred.op == "and":
        return _terms(pred.left) + _terms(pred.right)
    return [pred]


def _conjuncts(pred: Expr) -> list[tuple[str, str, Any]]:
    """The ``col <op> literal`` terms of ``pred``'s top-level AND, as (column, op, value);
    other terms are left out (they never prune)."""
    if isinstance(pred, BinaryOp) and pred.op == "and":
        return _conjuncts(pred.left) + _conjuncts(pred.right)
    if isinstance(pred, BinaryOp) and pred.op in _FLIP:
        left, right, op = pred.left, pred.right, pred.op
        if isinstance(left, Lit) and isinstance(right, Col):
            left, right, op = right, left, _FLIP[op]
        if isinstance(left, Col) and isinstance(right, Lit) and _comparable(left, right):
            return [(left.name, op, right.value)]
    return []


def _comparable(col: Col, lit: Lit) -> bool:
    """Whether the footer statistics of ``col`` compare with ``lit`` as Polars compares
    them: integers, floats, strings and dates, with a literal of the same kind (a float
    NaN literal never: Polars orders NaN above every number)."""
    t, v = col.dtype, lit.value
    if v is None or isinstance(v, bool):
        return False
    if t.is_integer:
        return isinstance(v, int)
    if t.is_float:
        return isinstance(v, int | float) and v == v
    if t.is_string:
        return isinstance(v, str)
    if pa.types.is_date32(t.arrow):
        return isinstance(v, datetime.date) and not isinstance(v, datetime.datetime)
    return False


def row_group_may_match(
    conjuncts: list[tuple[str, str, Any]], rg: RowGroupDigest, leaf: dict[str, int]
) -> bool:
    """False when the row group's min/max statistics prove that some term of
    ``conjuncts`` (``col <op> literal``, ANDed) is false or null for every row, so no row
    passes the predicate (a null compares as null, which a filter drops).

    Floating-point columns: Parquet writers leave NaN out of min/max, and Polars orders NaN
    above every number, so ``>``/``>=`` never prune them (``<``, ``<=``, ``==`` do).
    A column without exact statistics keeps the row group."""
    for name, op, value in conjuncts:
        j = leaf.get(name)
        if j is None:
            continue
        stats = rg.statistics(j)
        if stats is None:
            continue
        if stats.null_count is not None and stats.null_count == rg.num_rows:
            return False  # every value null: the comparison is null for every row
        if stats.min is None or stats.max is None:
            continue
        if not stats.exact:
            continue  # truncated (long strings): not a bound of the values
        lo, hi = stats.min, stats.max
        if isinstance(lo, bytes) or isinstance(hi, bytes):
            continue
        is_float = isinstance(lo, float) or isinstance(hi, float)
        try:
            if op == "eq" and (value < lo or value > hi):
                return False
            if op == "lt" and lo >= value:
                return False
            if op == "le" and lo > value:
                return False
            if op == "gt" and hi <= value and not is_float:
                return False
            if op == "ge" and hi < value and not is_float:
                return False
        except TypeError:
            continue
    return True


def _number(value: Any) -> float | None:
    """``value`` (a footer statistic or a literal) on a number line where differences are
    meaningful: numbers as they are, dates as days; None for anything else (strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return float(value.toordinal())
    return None


def estimate_selectivity(
    conjuncts: list[tuple[str, str, Any]], rg: RowGroupDigest, leaf: dict[str, int]
) -> float:
    """Estimated fraction of the rows of row group ``rg`` that pass ``conjuncts``
    (``col <op> literal``, ANDed), from its min/max statistics: a column's values taken as
    spread evenly between its min and max, so the terms on one column (``a >= x AND
    a < y``: one interval) keep the share of ``[min, max]`` they cover, and ``col == v``
    over integers or dates one of the ``max - min + 1`` values; columns as independent
    (the product). A term on a column without usable statistics, on strings, or ``==`` on
    floats counts as keeping every row: the planner applies its default selectivity to
    what is not estimated. Nulls (the footer's null count) pass no term. The rule is the textbook one of cost-based optimisers (uniform
    values, independent columns)."""
    bounds: dict[str, list[tuple[str, float]]] = {}
    for name, op, value in conjuncts:
        v = _number(value)
        if v is not None:
            bounds.setdefault(name, []).append((op, v))
    fraction = 1.0
    for name, terms in bounds.items():
        j = leaf.get(name)
        stats = rg.statistics(j) if j is not None else None
        if stats is None or stats.min is None or stats.max is None:
            continue
        lo, hi = _number(stats.min), _number(stats.max)
        if lo is None or hi is None or hi < lo or lo != lo or hi != hi:
            continue
        # Integers and dates count values (an interval [a, b] holds b - a + 1 of them);
        # floats measure length. Strict bounds of integers move by one.
        step = 0.0 if isinstance(stats.min, float) else 1.0
        low, high = lo, hi
        for op, v in terms:
            if op == "eq":
                low, high = max(low, v), min(high, v)
            elif op == "ge":
                low = max(low, v)
            elif op == "gt":
                low = max(low, v + step) if step else max(low, v)
            elif op == "le":
                high = min(high, v)
            elif op == "lt":
                high = min(high, v - step) if step else min(high, v)
        if high < low:
            return 0.0
        fraction *= min(1.0, (high - low + step) / (hi - lo + step)) if hi > lo else 1.0
        if stats.null_count is not None and rg.num_rows:  # a null passes no comparison
            fraction *= 1.0 - stats.null_count / rg.num_rows
    return fraction


def _check_same_schema(
    a: tuple[str, dict[str, DataType]],
    b: tuple[str, dict[str, DataType]],
    columns: tuple[str, ...],
) -> tuple[str, ...]:
    """Files of one dataset must agree on every scanned column as Polars reads them: raise
    PlanError naming the two files and the column otherwise. Polars' rules (2.1): the
    first file ``a`` gives the types; a type is compared as Polars reads it (a time zone
    spelled ``+00:00`` is ``UTC``); a later file's column of Arrow's Null type takes the
    first file's type. Returns those Null-typed columns of ``b``."""
    nulls = []
    for col in columns:
        ta, tb = a[1].get(col), b[1].get(col)
        if ta is None and tb is None:
            continue  # e.g. a hive partition column, not stored in the files
        if ta is None or tb is None:
            missing, has = (a[0], b[0]) if ta is None else (b[0], a[0])
            raise SchemaMismatchError(
                f"shoal: Parquet files of one scan disagree: column {col!r} is in {has} "
                f"but not in {missing}"
            )
        if tb.arrow == pa.null() and ta.arrow != pa.null():
            nulls.append(col)
            continue
        if ta != tb and ta.to_polars() != tb.to_polars():
            raise SchemaMismatchError(
                f"shoal: Parquet files of one scan disagree on column {col!r}: {ta} in "
                f"{a[0]} but {tb} in {b[0]}"
            )
    return tuple(nulls)


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
