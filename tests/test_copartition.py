"""Joins planned without moving a large side:

* an inner join whose broadcast side is the left one keeps the right (probe) side's
  partitioning: an aggregation by a key the right side's sorted files hold in disjoint
  ranges still completes in place (:func:`shoal.planner.context.carry_hashed`);
* a join of two uses of one cached sub-plan runs in place when its keys carry the same
  hashed column of that sub-plan's stage on both sides (:mod:`shoal.planner.copartition`);
  keys that carry two different hashed columns do not;
* an anti join of a small left side with a large right side reduces the right side to
  the left keys it matches instead of shuffling it (:mod:`shoal.planner.keyreduce`);
* a semi or anti join on one key whose right side is already in the task's memory runs
  as a filter by membership (:func:`shoal.lowering.plan.lower_plan`).

Every answer is checked against native Polars, on files cut into several partitions, with
null keys, duplicates and an empty file.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from shoal.config import Config
from shoal.ir.expr import Col
from shoal.ir.nodes import Join, Scan, StageInput
from shoal.ir.types import Schema
from shoal.lowering.plan import lower_plan, no_scan
from shoal.planner.physical import plan_physical
from shoal_polars.engine import to_ir

from .conftest import collect_as_native, hash_exchanges

#: Several partitions per scan, the distributed path, small sides broadcast.
CFG = {
    "target_partition_bytes": 2000,
    "small_query_bytes": 0,
    "broadcast_join_threshold_bytes": 4000,
    "broadcast_inline_bytes": 0,
}


def _files(root: Path, parts: list[pl.DataFrame]) -> pl.LazyFrame:
    """``parts`` as Parquet files, one row group of 24 rows at most each."""
    root.mkdir(parents=True, exist_ok=True)
    for i, df in enumerate(parts):
        pq.write_table(df.to_arrow(), root / f"part-{i:02d}.parquet", row_group_size=24)
    return pl.scan_parquet(sorted(root.glob("*.parquet")))


def _part(lo: int, hi: int, nulls: int = 0, dup: int = 3, shift: int = 0) -> pl.DataFrame:
    """Keys ``k`` in ``lo..hi`` (each ``dup`` times, in order; ``nulls`` null keys first);
    ``k2`` is ``k + shift`` (sorted too), ``s`` a supplier-like key, ``v`` a value with
    ties."""
    keys: list[int | None] = [None] * nulls + [k for k in range(lo, hi) for _ in range(dup)]
    n = len(keys)
    return pl.DataFrame(
        {
            "k": pl.Series(keys, dtype=pl.Int64),
            "k2": pl.Series([None if k is None else k + shift for k in keys], dtype=pl.Int64),
            "s": pl.Series([i % 5 for i in range(n)], dtype=pl.Int64),
            "v": [float((i * 7) % 4) for i in range(n)],
        }
    )


def _sorted(tmp_path: Path) -> pl.LazyFrame:
    return _files(
        tmp_path / "facts",
        [_part(0, 20, nulls=3), _part(20, 20), _part(20, 45), _part(45, 70, dup=1)],
    )


#: A small dimension, broadcast as the left side of the joins below (a null key and a
#: duplicated one).
DIM = pl.DataFrame(
    {"sk": pl.Series([0, 1, 2, 2, None], dtype=pl.Int64), "name": ["a", "b", "c", "c2", "n"]}
)


def _run(q: pl.LazyFrame, runner: str = "local", **kw: object) -> pl.DataFrame:
    return collect_as_native(q, runner, **{**CFG, **kw})


def _exchanges(q: pl.LazyFrame, **kw: object) -> int:
    return hash_exchanges(q, **{**CFG, **kw})


def _europe(facts: pl.LazyFrame) -> pl.LazyFrame:
    """The facts joined with the dimension, the dimension broadcast as the left side."""
    return DIM.lazy().join(facts, left_on="sk", right_on="s")


def test_a_broadcast_left_side_keeps_the_right_sides_ranges(tmp_path: Path) -> None:
    """Grouped by a sorted column of the probe (right) side, or by its key that the join
    coalesces into the left key: no exchange."""
    facts = _sorted(tmp_path)
    by_k = _europe(facts).group_by("k").agg(pl.col("v").min(), n=pl.len())
    assert _exchanges(by_k) == 0
    _run(by_k)
    # The right key coalesced into the left one: grouped by the left key, which the
    # small side's values decide: not a column the facts' ranges place.
    by_sk = _europe(facts).group_by("sk").agg(pl.col("v").sum())
    assert _exchanges(by_sk) == 1
    _run(by_sk)
    # A facts table joined as the build of a semi join keeps nothing to carry; and a
    # left join of the small side would emit unmatched left rows anywhere.
    left = DIM.lazy().join(facts, left_on="sk", right_on="s", how="left")
    q = left.group_by("k").agg(pl.col("v").sum())
    assert _exchanges(q) >= 1
    _run(q)


def _min_per_key(x: pl.LazyFrame, key: str, other: str) -> pl.LazyFrame:
    """Q2's shape: the rows of ``x`` whose value is the minimum of their ``other`` group,
    ``x`` used twice (Polars caches it)."""
    low = x.group_by(other).agg(pl.col("v").min().alias("low"))
    return (
        x.join(low, left_on=key, right_on=other)
        .filter(pl.col("v") == pl.col("low"))
        .select("name", key, "v", "sk")
    )


@pytest.mark.parametrize("runner", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_a_join_of_a_cached_side_with_its_aggregate_runs_in_place(
    tmp_path: Path, runner: str, request: pytest.FixtureRequest
) -> None:
    """The cached sub-plan is computed once; the aggregation by its sorted key and the
    join back on that key run in the same tasks: no exchange, no broadcast of the
    aggregate."""
    if runner == "ray":
        request.getfixturevalue("ray_runner")
    facts = _sorted(tmp_path)
    q = _min_per_key(_europe(facts), "k", "k")
    assert _exchanges(q) == 0
    # (The cached stage kept apart: by default it runs in the join's stage, see
    # test_shared_stages.py.)
    cfg = Config(**CFG, inline_shared_stages=False)  # type: ignore[arg-type]
    plan = plan_physical(to_ir(q), cfg, 2)
    joined = [s for s in plan.stages if "join-in-place" in s.name]
    # One input: the cached stage's partition, read once for both sides.
    assert len(joined) == 1 and [i.mode for i in joined[0].inputs] == ["pointwise"]
    _run(q, runner=runner)
    # Also with a top-k over it, and with the aggregate on the left.
    _run(q.sort("v", "k", "name", nulls_last=True).head(7), runner=runner)
    x = _europe(facts)
    low = x.group_by("k").agg(pl.col("v").min().alias("low"))
    swapped = low.join(x, on="k").filter(pl.col("v") == pl.col("low"))
    assert _exchanges(swapped) == 0
    _run(swapped, runner=runner)


def test_keys_that_carry_different_sorted_columns_do_not_join_in_place(
    tmp_path: Path,
) -> None:
    """``k`` and ``k2`` are both held in disjoint ranges, but by different partitions
    (``k2`` is ``k`` shifted by a partition's worth): matching rows of ``k == k2`` are in
    different partitions, so the join must move a side."""
    facts = _files(
        tmp_path / "shifted",
        [_part(0, 20, shift=20), _part(20, 40, shift=-20), _part(40, 60, shift=0)],
    )
    x = _europe(facts)
    low = x.group_by("k2").agg(pl.col("v").min().alias("low"))
    q = x.join(low, left_on="k", right_on="k2").filter(pl.col("v") == pl.col("low"))
    plan = plan_physical(to_ir(q), Config(**CFG), 2)  # type: ignore[arg-type]
    assert not any("join-in-place" in s.name for s in plan.stages)
    got = _run(q)
    assert got.height > 0


def _anti_sides(tmp_path: Path) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    small = pl.DataFrame(
        {
            "ck": pl.Series([1, 2, 2, 5, 40, 41, None, 999], dtype=pl.Int64),
            "tag": ["a", "b", "b2", "c", "d", "e", "null", "none"],
        }
    ).lazy()
    big = _files(
        tmp_path / "big",
        [_part(0, 20, nulls=2), _part(20, 20), _part(35, 41), _part(2, 5, dup=30)],
    )
    return small, big


@pytest.mark.parametrize("nulls_equal", [False, True])
@pytest.mark.parametrize("runner", ["local", pytest.param("ray", marks=pytest.mark.slow)])
def test_an_anti_join_reduces_the_large_side_to_matching_keys(
    tmp_path: Path, nulls_equal: bool, runner: str, request: pytest.FixtureRequest
) -> None:
    """The large right side is not shuffled (no hash exchange at all), and the rows kept
    are native Polars' (null keys on both sides, duplicates, an empty file)."""
    if runner == "ray":
        request.getfixturevalue("ray_runner")
    small, big = _anti_sides(tmp_path)
    q = small.join(big, left_on="ck", right_on="k", how="anti", nulls_equal=nulls_equal)
    assert _exchanges(q, broadcast_join_threshold_bytes=300) == 0
    got = _run(q, runner=runner, broadcast_join_threshold_bytes=300)
    assert 0 < got.height < 8
    # Two keys, and a filtered, projected large side.
    two = small.with_columns(s=pl.col("ck") % 5)
    q2 = two.join(
        big.filter(pl.col("v") > 0).select("k", "s"),
        left_on=["ck", "s"],
        right_on=["k", "s"],
        how="anti",
        nulls_equal=nulls_equal,
    )
    assert _exchanges(q2, broadcast_join_threshold_bytes=300) == 0
    _run(q2, runner=runner, broadcast_join_threshold_bytes=300)


def test_an_anti_join_with_a_small_right_side_stays_a_broadcast(tmp_path: Path) -> None:
    small, big = _anti_sides(tmp_path)
    q = big.join(small, left_on="k", right_on="ck", how="anti")
    plan = plan_physical(to_ir(q), Config(**CFG), 2)  # type: ignore[arg-type]
    assert not any("key-semi-join" in s.name for s in plan.stages)
    _run(q)


def _stage_join(
    left: pl.DataFrame, right: pl.DataFrame, key: str, how: str, nulls_equal: bool
) -> Join:
    """A join of stage inputs 0 (``left``) and 1 (``right``) on column ``key``."""
    ls, rs = Schema.from_polars(left.schema), Schema.from_polars(right.schema)
    return Join(
        StageInput(0, ls),
        StageInput(1, rs),
        (Col(key, ls[key]),),
        (Col(key, rs[key]),),
        how,  # type: ignore[arg-type]
        "_right",
        nulls_equal,
        True,
        ls,
    )


@pytest.mark.parametrize("how", ["semi", "anti"])
@pytest.mark.parametrize("nulls_equal", [False, True])
@pytest.mark.parametrize(
    "values",
    [
        pytest.param([3, 1, None, 3, 7, -2, 0], id="int"),
        pytest.param(["b", "a", None, "b", "", "zz", "é"], id="str"),
        pytest.param(
            [datetime.date(2020, 1, d) if d else None for d in (3, 1, 0, 3, 7, 2, 9)], id="date"
        ),
    ],
)
def test_semi_and_anti_joins_of_stage_inputs_filter_by_membership(
    how: str, nulls_equal: bool, values: list[object]
) -> None:
    """A semi or anti join whose right side is in the task's memory runs as a filter by
    membership (no join in the task's Polars query), with the join's answer: the left rows
    in their order, nulls as ``nulls_equal`` says, duplicates on both sides, an empty
    right side."""
    left = pl.DataFrame({"k": values, "i": range(len(values))})
    for right in (
        pl.DataFrame({"k": [values[0], values[0], values[2], values[4]], "x": [1, 2, 3, 4]}),
        pl.DataFrame({"k": [values[5]], "x": [1]}),
        pl.DataFrame({"k": values[:0], "x": []}, schema={"k": left["k"].dtype, "x": pl.Int64}),
    ):
        node = _stage_join(left, right, "k", how, nulls_equal)
        lf = lower_plan(node, [left, right], no_scan)
        assert "JOIN" not in lf.explain()
        want = left.join(right, on="k", how=how, nulls_equal=nulls_equal, maintain_order="left")  # type: ignore[arg-type]
        assert_frame_equal(lf.collect(), want)


def test_a_semi_join_of_floats_or_of_a_scan_stays_a_join() -> None:
    """Floating-point keys (NaN, -0.0) and a right side that scans keep Polars' join."""
    left = pl.DataFrame({"k": [0.0, -0.0, float("nan"), None, 1.5]})
    right = pl.DataFrame({"k": [-0.0, float("nan")]})
    node = _stage_join(left, right, "k", "semi", False)
    lf = lower_plan(node, [left, right], no_scan)
    assert "JOIN" in lf.explain()
    assert_frame_equal(lf.collect(), left.join(right, on="k", how="semi", maintain_order="left"))


@pytest.mark.parametrize("nulls_equal", [False, True])
@pytest.mark.parametrize(
    ("how", "probe_left"),
    [
        ("inner", True),
        ("inner", False),
        ("left", False),
        ("semi", False),
        ("anti", False),
        ("right", True),
        ("left", True),
        ("full", False),
    ],
)
def test_a_join_with_an_in_memory_side_filters_the_scan_first(
    tmp_path: Path, nulls_equal: bool, how: str, probe_left: bool
) -> None:
    """The scanning side is filtered by membership of its keys in the in-memory side's
    keys (Polars pushes it into its Parquet reader) where the join drops its unmatched
    rows, and not where it keeps them (a left join's left side, a full join); the join
    gives native Polars' rows: null keys on both sides, duplicates, two keys, a key pair
    of float type left out of the filter."""
    path = tmp_path / "facts.parquet"
    facts = pl.DataFrame(
        {
            "k": pl.Series([1, 2, None, 2, 5, 7, None, 9], dtype=pl.Int64),
            "s": ["a", "b", "c", None, "e", "a", "b", "z"],
            "f": [0.5, 1.0, 2.0, 1.0, -0.0, 0.5, 2.0, 3.0],
        }
    )
    facts.write_parquet(path)
    scan = next(n for n in to_ir(pl.scan_parquet(path)).walk() if isinstance(n, Scan))
    small = pl.DataFrame(
        {
            "k": pl.Series([2, 2, None, 7, 11], dtype=pl.Int64),
            "s": ["b", None, "c", "a", "q"],
            "f": [1.0, 1.0, 2.0, 0.5, 0.0],
            "w": [10, 20, 30, 40, 50],
        }
    )
    mem = StageInput(0, Schema.from_polars(small.schema))
    for on in (["k"], ["k", "s"], ["k", "f"]):
        lon = tuple(Col(c, scan.schema[c]) for c in on)
        ron = tuple(Col(c, mem.schema[c]) for c in on)
        want_lf = (
            pl.scan_parquet(path).join(
                small.lazy(),
                on=on,
                how=how,
                nulls_equal=nulls_equal,
                suffix="_r",  # type: ignore[arg-type]
            )
            if probe_left
            else small.lazy().join(
                pl.scan_parquet(path),
                on=on,
                how=how,
                nulls_equal=nulls_equal,
                suffix="_r",  # type: ignore[arg-type]
            )
        )
        want = want_lf.collect()
        node = Join(
            scan if probe_left else mem,
            mem if probe_left else scan,
            lon if probe_left else ron,
            ron if probe_left else lon,
            how,  # type: ignore[arg-type]
            "_r",
            nulls_equal,
            how != "full",  # Polars' default
            Schema.from_polars(want.schema),
        )
        lf = lower_plan(node, [small], lambda s: pl.scan_parquet(path))
        plan = lf.explain()
        filters = how != "full" and (how == "inner" or probe_left == (how == "right"))
        assert ("is_in" in plan.split("Parquet SCAN")[1]) == filters  # the reader's selection
        got = lf.collect()
        assert_frame_equal(got.sort(got.columns), want.sort(want.columns))
