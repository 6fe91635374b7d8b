"""How Parquet scans split into partitions (:func:`shoal.planner.partitioning.split_scan`)
and how a task reads its partition (:func:`shoal.execution.kernel._pieces`).

The partitions fill the CPUs evenly: their count is a multiple of the CPUs where that
costs nothing, and the row groups are cut at equal shares of bytes, on file boundaries
where the balance allows (8 files into 4 partitions: 2 whole files each), not greedily
(which left a fifth partition of one row group: a wave of one task). A task reads a file
whose read row groups are all in its partition without a slice (Polars then pushes the
scan's predicate into its reader), and a file's contiguous pieces as one slice.

Answers are checked against native Polars, rows in order, on files of several row groups
with nulls, an empty file, and filters that prune row groups by their statistics.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.config import Config
from shoal.ir.nodes import Scan
from shoal.planner.partitioning import (
    FILE_SNAP,
    MIN_SPLIT_BYTES,
    OVER_TARGET,
    partition_count,
    split_scan,
    whole_split,
)
from shoal.planner.physical import ScanPartition, plan_physical
from shoal_polars.engine import to_ir

from .conftest import task_plans

#: Rows per file and per row group: 7 row groups a file, the last one smaller (as TPC-H's
#: lineitem files are), so that equal shares of bytes are not whole row groups.
FILE_ROWS = 80_000
GROUP_ROWS = 12_000


def _frame(start: int, rows: int) -> pl.DataFrame:
    """Rows ``start .. start + rows``: ``k`` in order (so that statistics prune), ``x``
    with a null every 7th row, a float column and a string column."""
    k = pl.int_range(start, start + rows, eager=True, dtype=pl.Int64)
    return pl.DataFrame({"k": k}).with_columns(
        x=pl.when(pl.col("k") % 7 == 0).then(None).otherwise(pl.col("k") % 1000),
        f=(pl.col("k") % 13).cast(pl.Float64) - 6.0,
        s=(pl.col("k") % 5).cast(pl.String),
    )


@pytest.fixture(scope="module")
def eight(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """8 files of 7 row groups (about 10 MB as the planner estimates it), file ``i`` of
    :func:`_rows` rows: 2 files are not exactly a quarter."""
    root = tmp_path_factory.mktemp("eight")
    paths = []
    start = 0
    for i in range(8):
        path = root / f"part-{i}.parquet"
        pq.write_table(_frame(start, _rows(i)).to_arrow(), path, row_group_size=GROUP_ROWS)
        paths.append(path)
        start += _rows(i)
    return paths


def _rows(i: int) -> int:
    return FILE_ROWS + 500 * i


@pytest.fixture(scope="module")
def with_empty(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """5 files of 7 row groups with an empty file third."""
    root = tmp_path_factory.mktemp("with_empty")
    paths = []
    frames = [_frame(i * FILE_ROWS, FILE_ROWS) for i in range(5)]
    frames.insert(2, _frame(0, 0))
    for i, df in enumerate(frames):
        path = root / f"part-{i}.parquet"
        pq.write_table(df.to_arrow(), path, row_group_size=GROUP_ROWS)
        paths.append(path)
    return paths


def _scan_parts(lf: pl.LazyFrame, cpus: int, **kw: object) -> tuple[ScanPartition, ...]:
    """The partitions of the (one) scan stage of ``lf`` planned for ``cpus`` CPUs."""
    config = Config(small_query_bytes=0, **kw)  # type: ignore[arg-type]
    plan = plan_physical(to_ir(lf), config, cpus)
    parts = [s.scan_partitions for s in plan.stages if s.scan_partitions is not None]
    assert len(parts) == 1
    assert all(isinstance(p, ScanPartition) for p in parts[0])
    return parts[0]  # type: ignore[return-value]


def _files_of(part: ScanPartition) -> list[str]:
    return list(dict.fromkeys(Path(p.path).name for p in part.pieces if p.rows))


def test_eight_files_on_two_cpus_are_two_partitions_of_four_whole_files(
    eight: list[Path],
) -> None:
    """2 CPUs ask for 2 partitions (one per CPU): 4 whole files each."""
    parts = _scan_parts(pl.scan_parquet(eight).select("k", "x"), 2)
    assert [_files_of(p) for p in parts] == [
        [f"part-{i + j}.parquet" for j in range(4)] for i in range(0, 8, 4)
    ]
    assert [p.rows for p in parts] == [sum(_rows(i + j) for j in range(4)) for i in (0, 4)]
    assert all(pc.whole_file for p in parts for pc in p.pieces)


@pytest.mark.parametrize("cpus", [3, 4, 5])
def test_partitions_are_a_multiple_of_the_cpus_and_balanced(eight: list[Path], cpus: int) -> None:
    """One partition per CPU, no partition more than a row group off an equal share of rows
    (the rows of each file and row group in order, each once)."""
    parts = _scan_parts(pl.scan_parquet(eight).select("k", "x", "f"), cpus)
    assert len(parts) == cpus
    share = sum(map(_rows, range(8))) / len(parts)
    assert all(abs(p.rows - share) <= GROUP_ROWS for p in parts), [p.rows for p in parts]
    pieces = [pc for p in parts for pc in p.pieces]
    covered = [(Path(pc.path).name, pc.offset, pc.rows) for pc in pieces]
    expect_at = {f"part-{i}.parquet": 0 for i in range(8)}
    for name, offset, rows in covered:  # every row once, in file order
        assert offset == expect_at[name]
        expect_at[name] += rows
    assert list(expect_at.values()) == [_rows(i) for i in range(8)]
    assert [name for name, _, _ in covered] == sorted(name for name, _, _ in covered)


def test_partition_count_rules() -> None:
    """A count of 5 on 2 CPUs rounds down to 4 where 4 stay within 1.25 x the target, else
    up to 6 where partitions keep MIN_SPLIT_BYTES; min_partitions never cuts below
    MIN_SPLIT_BYTES."""
    mib = MIN_SPLIT_BYTES
    assert partition_count(520 * mib, 100 * mib, 4, 2) == 6  # need 5, 4 too big: up
    assert partition_count(500 * mib, 100 * mib, 4, 2) == 4  # 4 within 1.25 x: down
    assert partition_count(520 * mib, 100 * mib, 4, 1) == 6
    assert partition_count(7 * mib // 2, 128 * mib, 4, 2) == 2  # min rule gives 3: down
    assert partition_count(3 * mib, 128 * mib, 8, 4) == 3  # neither fits: kept
    assert partition_count(mib // 2, 128 * mib, 4, 2) == 1
    assert partition_count(10_000, 2000, 4, 2) == 4  # a tiny target: down only
    assert partition_count(5_500, 2000, 4, 2) == 3  # 2 too big, 4 too small: kept
    assert partition_count(0, 2000, 4, 2) == 1


def test_a_pruned_scan_splits_the_row_groups_it_reads(eight: list[Path]) -> None:
    """A filter that rules out most row groups by statistics: the row groups left are cut
    into 4 runs of about equal rows (not a full partition and a remainder), and a file
    whose read row groups are all in one partition is read whole."""
    lo, hi = FILE_ROWS + 30_000, 6 * FILE_ROWS + 20_000
    lf = pl.scan_parquet(eight).filter(pl.col("k") >= lo, pl.col("k") <= hi).select("k", "x")
    scan = next(n for n in to_ir(lf).walk() if isinstance(n, Scan))
    split = split_scan(scan, 1 << 30, 0, 4, 2)
    assert split.row_groups == 56 and split.row_groups_pruned >= 10
    read = split.row_groups - split.row_groups_pruned
    parts = split.partitions
    assert len(parts) == 4
    assert all(isinstance(p, ScanPartition) for p in parts)
    rows = [p.rows for p in parts]  # type: ignore[union-attr]
    # Each cut within a file boundary's pull or half a row group of its aim.
    share = split.est_rows / 4
    assert all(abs(r - share) <= 2 * max(FILE_SNAP * share, GROUP_ROWS / 2) for r in rows), rows
    assert sum(rows) == split.est_rows
    assert read >= 4
    whole = {
        Path(pc.path).name
        for p in parts
        for pc in p.pieces  # type: ignore[union-attr]
        if pc.whole_file
    }
    homes: dict[str, set[int]] = {}
    for i, p in enumerate(parts):
        for pc in p.pieces:  # type: ignore[union-attr]
            homes.setdefault(Path(pc.path).name, set()).add(i)
    assert whole == {name for name, at in homes.items() if len(at) == 1}


@pytest.mark.parametrize("pruned", [False, True])
def test_a_whole_split_reads_what_the_partitions_read(
    eight: list[Path], with_empty: list[Path], pruned: bool
) -> None:
    """The small-query path's one partition (:func:`whole_split`) holds the row groups that
    :func:`split_scan`'s partitions hold, with its sizes and counts: pruned by a filter,
    an empty file among the files, every row group pruned."""
    lo, hi = FILE_ROWS + 30_000, 6 * FILE_ROWS + 20_000
    lfs = [pl.scan_parquet(eight), pl.scan_parquet(with_empty), pl.scan_parquet(eight)]
    if pruned:
        lfs = [
            lfs[0].filter(pl.col("k") >= lo, pl.col("k") <= hi),
            lfs[1].filter(pl.col("k") > 10),
            lfs[2].filter(pl.col("k") < -5),
        ]
    for lf in lfs:
        scan = next(n for n in to_ir(lf.select("k", "x")).walk() if isinstance(n, Scan))
        split, whole = split_scan(scan, 1 << 30, 0, 4, 2), whole_split(scan)
        assert (whole.est_bytes, whole.est_rows) == (split.est_bytes, split.est_rows)
        assert (whole.row_groups, whole.row_groups_pruned) == (
            split.row_groups,
            split.row_groups_pruned,
        )
        (one,) = whole.partitions
        assert isinstance(one, ScanPartition)

        def rows_by_file(parts: tuple[object, ...]) -> dict[str, int]:
            out: dict[str, int] = {}
            for p in parts:
                for pc in p.pieces:  # type: ignore[attr-defined]
                    out[pc.path] = out.get(pc.path, 0) + pc.rows
            return out

        assert rows_by_file((one,)) == rows_by_file(split.partitions)


def test_an_empty_file_is_a_partition_of_its_own_in_order(with_empty: list[Path]) -> None:
    """The empty file (third) is a partition of its own, after the partition that holds
    the rows before it; the files with rows are cut evenly as if it were not there."""
    parts = _scan_parts(pl.scan_parquet(with_empty).select("k"), 2)
    empty = [i for i, p in enumerate(parts) if p.rows == 0]
    assert len(empty) == 1
    assert [Path(pc.path).name for pc in parts[empty[0]].pieces] == ["part-2.parquet"]
    names = [Path(pc.path).name for p in parts for pc in p.pieces if pc.rows]
    assert names == sorted(names)
    before = [i for i, p in enumerate(parts) if "part-1.parquet" in _files_of(p)]
    assert empty[0] == before[-1] + 1
    rows = [p.rows for p in parts if p.rows]
    assert len(rows) == 2 and abs(rows[0] - rows[1]) <= GROUP_ROWS


QUERIES = {
    "all": lambda lf: lf,
    "pruned": lambda lf: lf.filter(pl.col("k") >= 2 * FILE_ROWS + 5_000, pl.col("k") < 260_000),
    "pruned-and-not": lambda lf: lf.filter(
        (pl.col("k") < 100_000) | (pl.col("k") > 370_000), pl.col("x").is_not_null()
    ),
    "nothing": lambda lf: lf.filter(pl.col("k") < -1),
    "row-index": lambda lf: lf.filter(pl.col("x") > 990).with_row_index("i"),
}


@pytest.mark.parametrize("query", sorted(QUERIES))
@pytest.mark.parametrize(
    "kw",
    [
        pytest.param({}, id="by-cpus"),
        pytest.param({"target_partition_bytes": 1_000_000}, id="1MB"),
        pytest.param({"target_partition_bytes": 300_000}, id="300KB"),
    ],
)
def test_rows_in_order_as_native(with_empty: list[Path], query: str, kw: dict[str, object]) -> None:
    """Native Polars' rows, in its order, whichever split reads them."""
    lf = QUERIES[query](pl.scan_parquet(with_empty))
    engine = shoal.DistEngine(runner="local", raise_on_fail=True, small_query_bytes=0, **kw)  # type: ignore[arg-type]
    got = lf.collect(engine=engine)
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)


def _check_reads(plans: list[str]) -> int:
    """Each task's plan (one per partition of the last query's scan stage) reads each
    file of its partition once (one Parquet scan, or one scan of several whole files where
    Polars fuses them), the scan's predicate pushed into every scan, no cache; one slice
    for each file that is not whole there, none for the others. Returns the whole files."""
    report = shoal.runners.session.last_query()
    assert report is not None
    (stage,) = [s for s in report.physical.stages if s.scan_partitions is not None]
    assert stage.scan_partitions is not None
    want, whole = [], 0
    for part in stage.scan_partitions:
        assert isinstance(part, ScanPartition)
        files = {pc.path: pc.whole_file for pc in part.pieces if pc.rows}
        want.append((len(files), sum(not w for w in files.values())))
        whole += sum(files.values())
    # Polars may fuse the scans of whole files (same schema) into one multi-file scan.
    got = sorted((p.count("Parquet SCAN"), p.count("SLICE")) for p in plans)
    assert len(got) == len(want), plans
    for (scans, slices), (files, cut) in zip(got, sorted(want), strict=True):
        assert slices == cut and cut <= scans <= files, plans
    for plan in plans:
        assert "CACHE" not in plan and plan.count("SELECTION") == plan.count("Parquet SCAN"), plan
    return whole


def test_whole_files_read_without_slices_under_the_predicate(
    eight: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tasks read their whole files without a slice, the filter pushed into the reader
    (8 files of 7 row groups: at most 4 partitions per CPU before a file must be cut);
    native Polars' rows."""
    plans = task_plans(monkeypatch)
    lf = pl.scan_parquet(eight).filter(pl.col("x") > 500, pl.col("s") != "1")
    engine = shoal.DistEngine(runner="local", raise_on_fail=True, small_query_bytes=0)
    got = lf.collect(engine=engine)
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)
    assert _check_reads(plans) >= 2


def test_a_file_cut_between_partitions_is_one_slice_in_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 files of 10 row groups into 2 partitions (1 CPU): the middle file is cut between
    them, each task reads its part as one slice (its row groups merged), the other file
    whole. On the engine (as many partitions as the CPUs ask), every task reads each of
    its files once; native Polars' rows."""
    paths = []
    for i in range(3):
        path = tmp_path / f"p{i}.parquet"
        pq.write_table(_frame(i * FILE_ROWS, FILE_ROWS).to_arrow(), path, row_group_size=8_000)
        paths.append(path)
    lf = pl.scan_parquet(paths).filter(pl.col("x").is_null() | (pl.col("f") > 3.0))
    parts = _scan_parts(lf, 1, target_partition_bytes=5_000_000)
    assert [_files_of(p) for p in parts] == [
        ["p0.parquet", "p1.parquet"],
        ["p1.parquet", "p2.parquet"],
    ]
    assert [[pc.whole_file for pc in p.pieces if pc.path.endswith("1.parquet")] for p in parts] == [
        [False] * 5,
        [False] * 5,
    ]
    plans = task_plans(monkeypatch)
    engine = shoal.DistEngine(
        runner="local", raise_on_fail=True, small_query_bytes=0, target_partition_bytes=5_000_000
    )
    got = lf.collect(engine=engine)
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)
    _check_reads(plans)


def test_a_file_listed_twice_is_read_twice(tmp_path: Path) -> None:
    """A path the scan lists twice is two files to read: neither listing is read whole
    for both (one partition holding both listings read the file once)."""
    path = tmp_path / "d.parquet"
    pq.write_table(_frame(0, 1000).to_arrow(), path, row_group_size=300)
    lf = pl.scan_parquet([path, path]).filter(pl.col("k") > 200, pl.col("x").is_not_null())
    parts = _scan_parts(lf, 1)
    assert len(parts) == 1 and not any(pc.whole_file for pc in parts[0].pieces)
    for kw in ({}, {"target_partition_bytes": 4000}):
        engine = shoal.DistEngine(runner="local", raise_on_fail=True, small_query_bytes=0, **kw)  # type: ignore[arg-type]
        got = lf.collect(engine=engine)
        assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)


def test_partitions_of_row_groups_near_the_target_stay_near_it(eight: list[Path]) -> None:
    """Row groups of 0.7 x the target: equal shares would put two row groups (1.4 x) in
    some partitions; the scan is cut finer instead, as greedy packing kept partitions
    within the target."""
    lf = pl.scan_parquet(eight).select("k", "x")
    scan = next(n for n in to_ir(lf).walk() if isinstance(n, Scan))
    whole = split_scan(scan, 1 << 40)
    group = whole.est_bytes * GROUP_ROWS / whole.est_rows
    target = int(group / 0.7)
    split = split_scan(scan, target)
    width = whole.est_bytes / whole.est_rows
    for part in split.partitions:
        assert isinstance(part, ScanPartition)
        if len(part.pieces) > 1:
            assert part.rows * width <= OVER_TARGET * target, [p.rows for p in part.pieces]
    assert sum(p.rows for p in split.partitions) == whole.est_rows  # type: ignore[union-attr]
