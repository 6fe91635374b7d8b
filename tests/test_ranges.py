"""Scan partitions that hold disjoint ranges of a column (:mod:`shoal.planner.ranges`): an
aggregation grouped by that column completes in place, with no exchange, when the Parquet
footers prove that each value lives in one partition; in every other case (overlapping
ranges, nulls in two partitions, a row group cut into several partitions, a string column,
missing statistics) it is planned in two phases as before.

Every answer is checked against native Polars, on files cut into several partitions, with
null keys, duplicates and an empty file.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.ir.nodes import Scan
from shoal.planner.partitioning import split_scan
from shoal.planner.physical import HashOutput
from shoal.planner.ranges import disjoint_columns
from shoal_polars.engine import to_ir

from .conftest import collect_as_native, hash_exchanges

#: Several partitions per scan (one per file or two), the distributed path, hash joins.
CFG = {"target_partition_bytes": 2000, "small_query_bytes": 0, "broadcast_join_threshold_bytes": 0}


def _files(root: Path, parts: list[pl.DataFrame], row_group_size: int = 24) -> pl.LazyFrame:
    """``parts`` as Parquet files (row groups of ``row_group_size`` rows, a multiple of the
    keys' repetitions, so that no key spans two row groups)."""
    root.mkdir(parents=True, exist_ok=True)
    for i, df in enumerate(parts):
        pq.write_table(df.to_arrow(), root / f"part-{i}.parquet", row_group_size=row_group_size)
    return pl.scan_parquet(sorted(root.glob("*.parquet")))


def _part(lo: int, hi: int, nulls: int = 0, dup: int = 3, step: int = 1) -> pl.DataFrame:
    """Keys ``lo..hi`` by ``step`` (each ``dup`` times, in order), ``nulls`` null keys
    first."""
    keys: list[int | None] = [None] * nulls + [k for k in range(lo, hi, step) for _ in range(dup)]
    n = len(keys)
    return pl.DataFrame(
        {
            "k": pl.Series(keys, dtype=pl.Int64),
            "d": [datetime.date(2020, 1, 1) + datetime.timedelta(days=(k or 0)) for k in keys],
            "s": [f"s{(k or 0):05d}" for k in keys],
            "v": [float(i % 7) - 2.5 for i in range(n)],
        }
    )


def _run(q: pl.LazyFrame, **kw: object) -> pl.DataFrame:
    return collect_as_native(q, **{**CFG, **kw})


def _exchanges(q: pl.LazyFrame, **kw: object) -> int:
    return hash_exchanges(q, **{**CFG, **kw})


def _group(lf: pl.LazyFrame, key: str) -> pl.LazyFrame:
    return lf.group_by(key).agg(n=pl.len(), t=pl.col("v").sum(), u=pl.col("v").n_unique())


@pytest.mark.parametrize("key", ["k", "d"])
def test_sorted_files_aggregate_in_place(tmp_path: Path, key: str) -> None:
    """Files written in key order (nulls in the first file only, an empty file): no
    exchange, the same groups as native Polars."""
    lf = _files(
        tmp_path,
        [_part(0, 20, nulls=3), _part(20, 20), _part(20, 45), _part(45, 80, dup=1)],
    )
    q = _group(lf, key)
    assert _exchanges(q) == 0
    _run(q)
    # Through a filter and a projection that renames the key, then a top-k.
    q2 = (
        lf.filter(pl.col("v") > -2)
        .select(key2=pl.col(key), w="v")
        .group_by("key2")
        .agg(pl.col("w").sum(), c=pl.len())
        .sort("c", "key2", descending=True, nulls_last=True)
        .head(5)
    )
    assert _exchanges(q2) == 0
    _run(q2)


@pytest.mark.parametrize(
    "parts",
    [
        pytest.param([_part(0, 60, step=2), _part(1, 61, step=2)], id="interleaved"),
        pytest.param([_part(0, 20, nulls=3), _part(20, 40, nulls=3)], id="nulls-in-two"),
        pytest.param([_part(30, 60), _part(0, 30), _part(45, 46)], id="shared-value"),
    ],
)
def test_ranges_that_meet_keep_the_exchange(tmp_path: Path, parts: list[pl.DataFrame]) -> None:
    """A value (or null) in two partitions (one row group each): the aggregation keeps its
    exchange, and the answer stays native Polars'."""
    q = _group(_files(tmp_path, parts), "k")
    assert _exchanges(q, target_partition_bytes=600) == 1
    _run(q, target_partition_bytes=600)


def test_out_of_order_files_still_aggregate_in_place(tmp_path: Path) -> None:
    """Disjoint ranges need not come in file order."""
    q = _group(_files(tmp_path, [_part(50, 70), _part(0, 20), _part(20, 50)]), "k")
    assert _exchanges(q, target_partition_bytes=600) == 0
    _run(q, target_partition_bytes=600)
    # A partition that holds the end of one file and the start of the next gets a range
    # over both, which overlaps the others here: planned in two phases.
    assert _exchanges(q, target_partition_bytes=2000) == 1
    _run(q, target_partition_bytes=2000)


def test_strings_and_split_row_groups_keep_the_exchange(tmp_path: Path) -> None:
    """A string key (truncated statistics are possible) is never used; one row group cut
    into several partitions gives each its whole range, so they overlap."""
    lf = _files(tmp_path / "a", [_part(0, 30), _part(30, 60)])
    q = _group(lf, "s")
    assert _exchanges(q) == 1
    _run(q)
    big = _files(tmp_path / "b", [_part(0, 200)], row_group_size=10_000)
    q = _group(big, "k")
    assert _exchanges(q) == 1
    _run(q)


def test_files_without_statistics_keep_the_exchange(tmp_path: Path) -> None:
    root = tmp_path / "nostats"
    root.mkdir()
    for i, df in enumerate([_part(0, 30), _part(30, 60)]):
        pq.write_table(df.to_arrow(), root / f"p{i}.parquet", write_statistics=False)
    q = _group(pl.scan_parquet(sorted(root.glob("*.parquet"))), "k")
    assert _exchanges(q) == 1
    _run(q)


def test_disjoint_columns_reads_every_column_asked(tmp_path: Path) -> None:
    lf = _files(tmp_path, [_part(0, 20), _part(20, 40)])
    scan = next(n for n in to_ir(lf.select("k", "d", "s", "v")).walk() if isinstance(n, Scan))
    split = split_scan(scan, 2000)
    assert len(split.partitions) > 1
    assert disjoint_columns(scan, split.partitions, ["k", "d", "s", "v", "nope"]) == ("k", "d")
    assert disjoint_columns(scan, split.partitions[:1], ["k"]) == ()


def test_a_shared_scan_keeps_its_ranges_through_the_cache(tmp_path: Path) -> None:
    """A filtered scan read by two plans of ``collect_all`` is one cached stage; both
    aggregations over it complete in place, each with native Polars' answer."""
    lf = _files(tmp_path, [_part(0, 20, nulls=3), _part(20, 45), _part(45, 60)])
    base = lf.filter(pl.col("v") > -2)
    a = base.group_by("k").agg(pl.len())
    b = base.group_by("k").agg(pl.col("v").max())
    engine = shoal.DistEngine(runner="local", raise_on_fail=True, **CFG)  # type: ignore[arg-type]
    got = pl.collect_all([a, b], engine=engine)  # type: ignore[call-overload]
    for g, q in zip(got, (a, b), strict=True):
        want = q.collect(engine="in-memory")
        assert_frame_equal(g.sort("k"), want.sort("k"))
    report = shoal.runners.session.last_query()
    assert report is not None
    assert not any(isinstance(s.output, HashOutput) for s in report.physical.stages)


def test_arrow_types_of_statistics_are_what_the_check_expects(tmp_path: Path) -> None:
    """pyarrow gives integer statistics as int and date32 as datetime.date."""
    t = pa.table({"k": pa.array([3, 1], pa.int64()), "d": pa.array([5, 2], pa.date32())})
    pq.write_table(t, tmp_path / "x.parquet")
    st = pq.ParquetFile(tmp_path / "x.parquet").metadata.row_group(0)
    assert isinstance(st.column(0).statistics.min, int)
    assert isinstance(st.column(1).statistics.min, datetime.date)
