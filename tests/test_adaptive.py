"""Adaptive execution (``Config.adaptive``, :mod:`shoal.runners.adaptive`): stages re-planned
from what their inputs produced (empty stages and buckets skipped, small shuffle buckets
coalesced into fewer tasks).

Every query is checked against native Polars (or DuckDB) on data split into several
partitions, with nulls, duplicate and skewed keys and buckets left empty; the re-planning
itself is checked through the query's report (what changed, and the tasks that ran).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.runners import adaptive
from shoal.runners.profile import analyze_text
from shoal.runners.session import QueryReport, last_query

#: Sizes of a coalesced task: every bucket alone, a few buckets a task, one task.
TARGETS = [1, 12_000, 10**9]


def _config(target: int, **more: object) -> dict[str, object]:
    """The distributed path on 6 partitions per table, hash joins, ``target`` bytes."""
    base: dict[str, object] = dict(
        runner="local",
        small_query_bytes=0,
        default_partitions=6,
        broadcast_join_threshold_bytes=0,
        target_partition_bytes=target,
    )
    base.update(more)
    return base


def _facts(rows: int = 3000, seed: int = 0) -> pl.DataFrame:
    """Key 1 holds most rows (skew); some keys null; values with NaN and duplicates."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 40, rows)
    keys[rng.random(rows) < 0.6] = 1
    k = pl.Series("k", keys).cast(pl.Int64)
    k = pl.when(pl.int_range(rows) % 17 == 0).then(None).otherwise(k)
    return (
        pl.DataFrame({"i": range(rows)})
        .with_columns(
            k=k,
            v=pl.Series(rng.integers(-50, 50, rows)).cast(pl.Float64),
            s=pl.Series([f"s{x % 7}" for x in range(rows)]),
        )
        .with_columns(v=pl.when(pl.col("i") % 23 == 0).then(float("nan")).otherwise(pl.col("v")))
    )


def _dims() -> pl.DataFrame:
    """Few keys (most hash buckets of this side stay empty), one twice, and a null."""
    return pl.DataFrame({"k": [1, 3, 3, 5, None, 77], "name": ["a", "b", "bb", "c", "n", "z"]})


def _run(q: pl.LazyFrame, cfg: dict[str, object]) -> tuple[pl.DataFrame, QueryReport]:
    got = q.collect(engine=shoal.DistEngine(raise_on_fail=True, **cfg))
    report = last_query()
    assert report is not None
    return got, report


def _same(got: pl.DataFrame, q: pl.LazyFrame, ordered: bool = False) -> None:
    want = q.collect(engine="in-memory")
    if not ordered:
        got, want = got.sort(got.columns, nulls_last=True), want.sort(want.columns, nulls_last=True)
    assert_frame_equal(got, want, check_exact=False)


def _tasks(report: QueryReport) -> int:
    return len(report.task_stats)


JOINS: dict[str, Callable[[pl.LazyFrame, pl.LazyFrame], pl.LazyFrame]] = {
    how: (lambda a, b, how=how: a.join(b, on="k", how=how))  # type: ignore[misc]
    for how in ("inner", "left", "right", "full", "semi", "anti")
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("how", sorted(JOINS))
def test_hash_joins_with_empty_and_coalesced_buckets(how: str, target: int) -> None:
    a, b = _facts().lazy(), _dims().lazy()
    q = JOINS[how](a, b)
    got, report = _run(q, _config(target))
    _same(got, q)
    if how in ("inner", "semi") and target == 1:  # buckets with no dims key: not run
        assert any("empty bucket(s) skipped" in line for line in report.adaptive)


@pytest.mark.parametrize("target", TARGETS)
def test_join_then_group_by_with_and_without_keys(target: int) -> None:
    a, b = _facts().lazy(), _dims().lazy()
    joined = a.join(b, on="k")
    keyed = joined.group_by("name", "s").agg(pl.len(), pl.col("v").sum(), vmax=pl.col("v").max())
    keyless = joined.select(pl.len(), pl.col("v").sum(), pl.col("i").min())
    for q in (keyed, keyless):
        got, _ = _run(q, _config(target))
        _same(got, q)


def test_coalescing_runs_fewer_tasks_with_the_same_answer() -> None:
    q = _facts().lazy().group_by("k").agg(pl.col("v").sum(), pl.len())
    got, report = _run(q, _config(10**9))
    _same(got, q)
    assert any("coalesced into 1 task" in line for line in report.adaptive), report.adaptive
    off, plain = _run(q, _config(10**9, adaptive=False))
    _same(off, q)
    assert plain.adaptive == ()
    assert _tasks(report) < _tasks(plain)
    text = analyze_text(report)
    assert "Adaptive execution:" in text and "coalesced" in text
    explained = shoal.explain(q, config=shoal.Config(**_config(10**9)), analyze=True)  # type: ignore[arg-type]
    assert "Adaptive execution:" in explained and "coalesced into 1 task" in explained


def test_the_trace_marks_each_change(tmp_path: Path) -> None:
    q = _facts().lazy().join(_dims().lazy(), on="k").group_by("name").agg(pl.len())
    trace = tmp_path / "q.json"
    got, report = _run(q, _config(12_000, trace=str(trace)))
    _same(got, q)
    events = json.loads(trace.read_text())["traceEvents"]
    marks = [e["args"] for e in events if e.get("name") == "adaptive plan"]
    assert marks and all(m["tasks"] < m["tasks_planned"] for m in marks), marks
    assert {m["stage"] for m in marks} <= {s.id for s in report.physical.stages}


def test_explicit_shuffle_partitions_are_not_coalesced() -> None:
    q = _facts().lazy().group_by("k").agg(pl.col("v").sum())
    got, report = _run(q, _config(10**9, shuffle_partitions=5))
    _same(got, q)
    assert not any("coalesced" in line for line in report.adaptive)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    "sort",
    [
        dict(by=["k", "i"]),
        dict(by=["k", "v", "i"], descending=[True, False, True], nulls_last=True),
        dict(by="s", maintain_order=True),
    ],
    ids=["asc", "desc-nulls-last", "stable"],
)
def test_sorts_keep_their_order_across_coalesced_ranges(
    sort: dict[str, object], target: int
) -> None:
    q = _facts().lazy().sort(**sort)  # type: ignore[arg-type]
    got, _ = _run(q, _config(target))
    _same(got, q, ordered=True)


def test_group_by_then_sort_then_cumulative_sum() -> None:
    """The sort's stage is read pointwise beside a shuffle (the prefix plan): it keeps its
    tasks, and the answer its order."""
    q = (
        _facts()
        .lazy()
        .group_by("k")
        .agg(pl.col("i").sum())
        .sort("k")
        .with_columns(c=pl.col("i").cum_sum())
        .with_row_index()
    )
    got, _ = _run(q, _config(12_000))
    _same(got, q, ordered=True)


def test_window_over_keys_keeps_row_order() -> None:
    q = _facts().lazy().with_columns(w=pl.col("v").sum().over("k"), m=pl.col("i").max().over("k"))
    got, report = _run(q, _config(10**9))
    _same(got, q, ordered=True)
    assert any("not coalesced" in line for line in report.adaptive), report.adaptive


def test_distinct_after_shuffle() -> None:
    q = _facts().lazy().select("k", "s").unique()
    got, _ = _run(q, _config(12_000))
    _same(got, q)


def test_an_empty_join_side_skips_the_stage_but_keyless_aggregates_keep_their_row() -> None:
    a = _facts().lazy()
    nothing = _dims().lazy().filter(pl.col("k") > 1000)
    inner = a.join(nothing, on="k")
    keyed = inner.group_by("s").agg(pl.len(), pl.col("v").sum())
    got, report = _run(keyed, _config(1))
    _same(got, keyed)
    assert any("skipped" in line for line in report.adaptive), report.adaptive
    # Without keys the partial aggregate above the join emits a row per task: not skipped.
    q = inner.select(pl.len(), pl.col("v").sum(), vmin=pl.col("v").min(), smax=pl.col("s").max())
    got, _ = _run(q, _config(1))
    _same(got, q)
    assert got.height == 1
    for how in ("left", "anti", "full"):  # an empty right side keeps every left row
        q2 = a.join(nothing, on="k", how=how).group_by("s").agg(pl.len())  # type: ignore[arg-type]
        got2, _ = _run(q2, _config(1))
        _same(got2, q2)


def test_an_empty_broadcast_side_skips_the_probe_scan() -> None:
    a = _facts().lazy()
    nothing = _dims().lazy().filter(pl.col("k") > 1000)
    q = a.join(nothing, on="k").select("i", "name")
    got, report = _run(q, _config(1, broadcast_join_threshold_bytes=10**9))
    _same(got, q)
    skipped = [line for line in report.adaptive if "skipped" in line]
    assert skipped and "scan" in skipped[0], report.adaptive
    left = a.join(nothing, on="k", how="left")  # every probe row stays: nothing skipped
    got, report = _run(left, _config(1, broadcast_join_threshold_bytes=10**9))
    _same(got, left)
    assert not any("skipped" in line for line in report.adaptive)


def test_duckdb_join_group_by_order_by() -> None:
    con = duckdb.connect()
    con.register("f", _facts().to_arrow())
    con.register("d", _dims().to_arrow())
    con.execute("CREATE TABLE facts AS SELECT * FROM f").fetchall()
    con.execute("CREATE TABLE dims AS SELECT * FROM d").fetchall()
    cfg = shoal.Config(**_config(12_000))  # type: ignore[arg-type]
    for query in (
        "SELECT name, s, count(*) AS n, sum(v) AS v FROM facts JOIN dims USING (k) "
        "GROUP BY ALL ORDER BY name, s",
        "SELECT k, count(*) AS n FROM facts LEFT JOIN dims USING (k) GROUP BY k "
        "ORDER BY k NULLS FIRST",
        "SELECT i, k, v FROM facts WHERE k IN (SELECT k FROM dims) ORDER BY i DESC",
    ):
        got = shoal.duckdb.sql(con, query, raise_on_fail=True, config=cfg).pl()
        want = con.sql(query).pl()
        assert_frame_equal(got, want, check_exact=False)


def test_group_buckets_and_targets() -> None:
    assert adaptive.group_buckets([5, 5, 5, 5], [False] * 4, 10) == [[0, 1], [2, 3]]
    assert adaptive.group_buckets([5, 50, 5, 0], [False, False, False, True], 10) == [
        [0],
        [1],
        [2],
    ]
    assert adaptive.group_buckets([1, 1], [False, False], None) == [[0], [1]]
    assert adaptive.group_buckets([1, 1], [True, True], 10) == []
    # Equal shares, not groups filled in turn (TPC-H Q16 at scale 10: three tasks, a
    # second wave of one on two CPUs); a multiple of the CPUs.
    assert adaptive.group_buckets([161, 160, 159, 160], [False] * 4, 320, 2) == [[0, 1], [2, 3]]
    nine = adaptive.group_buckets([10] * 9, [False] * 9, 30, 2)
    assert nine == [[0, 1], [2, 3], [4, 5, 6], [7, 8]]
    assert adaptive.group_buckets([0, 0, 0], [False] * 3, 10) == [[0, 1, 2]]
    mib = 1024 * 1024
    assert adaptive.coalesce_target(100 * mib, 4, 128 * mib) == 25 * mib
    assert adaptive.coalesce_target(mib, 4, 128 * mib) == adaptive.MIN_TASK_BYTES
    assert adaptive.coalesce_target(10**12, 2, 128 * mib) == 128 * mib


def test_window_over_a_coalesced_group_by() -> None:
    """The window's shuffle stage follows a coalesced aggregation: its rows are routed back
    to the partitions that ran, in order."""
    q = (
        _facts()
        .lazy()
        .group_by("k", "s")
        .agg(pl.col("v").sum())
        .with_columns(w=pl.col("v").sum().over("k"), r=pl.col("v").rank().over("k"))
    )
    got, report = _run(q, _config(12_000))
    _same(got, q)
    assert any("coalesced" in line for line in report.adaptive), report.adaptive


@pytest.mark.parametrize("how", ["inner", "left", "semi", "anti", "right", "full"])
def test_a_hash_join_whose_filtered_side_turns_out_small_runs_as_a_broadcast_join(
    how: str,
) -> None:
    """The filtered side is estimated at a fifth of its table (over the threshold), and
    holds a few rows: its join runs in the other side's partitions, never shuffled. A full
    join cannot broadcast either side: it stays a hash join."""
    probe = _facts(seed=1).lazy()
    small = _facts(seed=2).lazy().filter(pl.col("i") % 97 == 3).select("k", w="v")
    left, right = (small, probe) if how == "right" else (probe, small)
    q = left.join(right, on="k", how=how)  # type: ignore[arg-type]
    cfg = _config(12_000, broadcast_join_threshold_bytes=8_000)
    got, report = _run(q, cfg)
    _same(got, q)
    switched = [line for line in report.adaptive if "run as a broadcast join" in line]
    assert bool(switched) == (how != "full"), report.adaptive
    if switched:
        skipped = [s for s in report.physical.stages if s.num_tasks == 0]
        assert len(skipped) == 1 and "shuffle" in skipped[0].name
    off, plain = _run(q, {**cfg, "adaptive": False})
    _same(off, q)
    assert plain.adaptive == ()


def test_a_broadcast_switch_under_aggregation_and_sort() -> None:
    probe = _facts(seed=1).lazy()
    small = _facts(seed=2).lazy().filter(pl.col("i") < 40).group_by("k").agg(n=pl.len())
    q = (
        probe.join(small, on="k")
        .group_by("s")
        .agg(pl.col("n").sum(), pl.col("v").mean(), c=pl.len())
        .sort("s")
    )
    got, report = _run(q, _config(12_000, broadcast_join_threshold_bytes=4_000))
    _same(got, q, ordered=True)
    assert any("run as a broadcast join" in line for line in report.adaptive), report.adaptive


def test_a_large_side_stays_a_hash_join() -> None:
    probe = _facts(seed=1).lazy()
    big = _facts(seed=2).lazy().filter(pl.col("i") % 2 == 0).select("k", w="v")
    q = probe.join(big, on="k").group_by("s").agg(pl.len(), pl.col("w").sum())
    got, report = _run(q, _config(12_000, broadcast_join_threshold_bytes=8_000))
    _same(got, q)
    assert any("stays a hash join" in line for line in report.adaptive), report.adaptive


def test_an_aggregation_completed_in_the_join_buckets_is_never_switched_to_broadcast() -> None:
    """A group-by on the join key completes in the hash join's buckets (no second exchange:
    each key is in one bucket). Run as a broadcast join in the probe side's partitions, a
    key would span tasks and its group would come out once per task: the switch must not
    happen, however small the other side turns out."""
    probe = _facts(seed=1).lazy()
    small = _facts(seed=2).lazy().filter(pl.col("i") % 97 == 3).select("k", w="v")
    q = probe.join(small, on="k").group_by("k").agg(pl.len(), pl.col("w").sum())
    got, report = _run(q, _config(12_000, broadcast_join_threshold_bytes=8_000))
    _same(got, q)
    assert not any("broadcast join" in line for line in report.adaptive), report.adaptive


REGROUPED: dict[str, Callable[[pl.LazyFrame, pl.LazyFrame], pl.LazyFrame]] = {
    # A top-k over the groups: the join stage's per-bucket top-k is gathered by one task.
    "top-k": lambda probe, small: (
        probe.join(small, on="k", how="left")
        .group_by("k")
        .agg(pl.len(), pl.col("w").sum(), m=pl.col("v").mean(), lo=pl.col("v").min())
        .sort("len", "k", descending=[True, False], nulls_last=True)
        .head(4)
    ),
    # Keys beyond the join key (renamed), a filter and a projection over the aggregation,
    # a limit larger than the result (every group comes out).
    "limit": lambda probe, small: (
        probe.join(small, on="k")
        .group_by(pl.col("k").alias("key"), "s")
        .agg(n=pl.len(), t=pl.col("v").sum(), w=pl.col("w").max())
        .filter(pl.col("n") > 1)
        .with_columns(avg=pl.col("t") / pl.col("n"))
        .head(10_000)
    ),
}


@pytest.mark.parametrize("name", sorted(REGROUPED))
@pytest.mark.parametrize("target", TARGETS)
def test_an_aggregation_completed_in_the_join_buckets_moves_to_its_gather_at_a_switch(
    name: str, target: int
) -> None:
    """An aggregation that completes in place in a hash join's buckets (each key in one
    bucket), under a top-k or limit gathered by one task (TPC-H Q18's plan): when the other
    side turns out small, the join runs as a broadcast join in the probe side's partitions
    (a key's rows then span tasks, null keys too), so the join stage computes partial
    aggregates and the gathering task the final ones. Same answer as native Polars, with
    and without the switch."""
    probe = _facts(seed=1).lazy()
    small = _facts(seed=2).lazy().filter(pl.col("i") % 97 == 3).select("k", w="v")
    q = REGROUPED[name](probe, small)
    cfg = _config(target, broadcast_join_threshold_bytes=8_000)
    got, report = _run(q, cfg)
    _same(got, q, ordered=name == "top-k")
    switched = [line for line in report.adaptive if "run as a broadcast join" in line]
    assert switched and "completes in stage" in switched[0], report.adaptive
    skipped = [s for s in report.physical.stages if s.num_tasks == 0]
    assert len(skipped) == 1 and "shuffle" in skipped[0].name  # the probe side's shuffle
    off, _ = _run(q, {**cfg, "adaptive": False})
    _same(off, q, ordered=name == "top-k")


def test_an_aggregation_that_does_not_split_keeps_its_hash_join() -> None:
    """``n_unique`` has no partial form: its aggregation stays in the join buckets and the
    join stays a hash join, however small the other side."""
    probe = _facts(seed=1).lazy()
    small = _facts(seed=2).lazy().filter(pl.col("i") % 97 == 3).select("k", w="v")
    q = (
        probe.join(small, on="k")
        .group_by("k")
        .agg(u=pl.col("s").n_unique(), n=pl.len())
        .sort("n", "k", descending=True)
        .head(3)
    )
    got, report = _run(q, _config(12_000, broadcast_join_threshold_bytes=8_000))
    _same(got, q, ordered=True)
    assert not any("broadcast join" in line for line in report.adaptive), report.adaptive


GATHERED: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "top-k": lambda f: (
        f.group_by("k", "s")
        .agg(pl.col("v").sum(), n=pl.len())
        .sort("n", "k", "s", descending=[True, False, False], nulls_last=True)
        .head(7)
    ),
    "keyless": lambda f: f.group_by("k").agg(n=pl.len()).select(pl.col("n").max(), c=pl.len()),
    "limit-all": lambda f: f.group_by("k").agg(pl.col("v").max()).head(1_000),
    "nothing": lambda f: (
        f.filter(pl.col("i") < 0).group_by("k").agg(pl.col("v").sum()).sort("k").head(3)
    ),
}


@pytest.mark.parametrize("name", sorted(GATHERED))
def test_a_coalesced_final_aggregation_runs_in_the_task_that_gathers_it(name: str) -> None:
    """A final aggregation whose buckets fit one task, read whole by one task (a top-k's
    or a limit's gather, an aggregation without keys): the gathering task runs it itself,
    one task fewer, the same answer as native Polars."""
    q = GATHERED[name](_facts().lazy())
    got, report = _run(q, _config(10**9))
    _same(got, q, ordered=name == "top-k")
    fused = [line for line in report.adaptive if "the one task that gathers it" in line]
    assert bool(fused) == (name != "nothing"), report.adaptive
    planned = shoal.explain(q, config=shoal.Config(**_config(10**9)))  # type: ignore[arg-type]
    assert "top-k" in planned or "final-agg" in planned
    off, plain = _run(q, {**_config(10**9), "adaptive": False})
    _same(off, q, ordered=name == "top-k")
    if fused:
        # 6 final tasks coalesced into one, which runs in the gathering task
        assert _tasks(report) == _tasks(plain) - 6


@pytest.mark.parametrize("target", TARGETS)
def test_small_partitions_read_pointwise_run_as_one_task(target: int) -> None:
    """A shared sub-plan (Polars' cache: a join and a filter of the facts, read by an
    aggregation and by a join against that aggregation, TPC-H Q17's shape) is one stage
    that later stages read partition by partition; when those partitions are small, each
    reading stage runs one task over all of them, in partition order (and a final
    aggregation that one task gathers runs in it). Nulls, NaN and duplicate keys; the same
    answer as native Polars, and with adaptive execution off."""
    f = _facts().lazy().join(_dims().lazy(), on="k", how="left").filter(pl.col("i") % 5 != 0)
    avg = f.group_by("k").agg(a=pl.col("v").mean(), n=pl.len())
    q = (
        f.join(avg, on="k", nulls_equal=True)
        .filter(pl.col("v") < pl.col("a"))
        .group_by("name")
        .agg(pl.col("v").sum(), c=pl.len(), m=pl.col("n").max())
    )
    cfg = _config(target, broadcast_join_threshold_bytes=10**9)
    got, report = _run(q, cfg)
    _same(got, q)
    one = [line for line in report.adaptive if "partitions" in line and "read by 1 task" in line]
    assert len(one) == 2, report.adaptive
    off, plain = _run(q, {**cfg, "adaptive": False})
    _same(off, q)
    assert _tasks(report) < _tasks(plain)


def _q17_shape() -> pl.LazyFrame:
    """TPC-H Q17's shape: a shared join and filter of the facts, aggregated by key, joined
    back to itself on that key and aggregated again."""
    f = _facts().lazy().join(_dims().lazy(), on="k", how="left").filter(pl.col("i") % 5 != 0)
    avg = f.group_by("k").agg(a=pl.col("v").mean(), n=pl.len(), u=pl.col("s").max())
    return (
        f.join(avg, on="k", nulls_equal=True)
        .filter(pl.col("v") < pl.col("a"))
        .group_by("name")
        .agg(pl.col("v").sum(), c=pl.len(), m=pl.col("n").max(), u=pl.col("u").min())
    )


def test_a_one_task_stage_runs_in_the_task_that_reads_its_small_shuffle() -> None:
    """A stage that runs as one task (a partial aggregation over small partitions) and is
    read by bucket by a final aggregation that would coalesce into one task: the final
    aggregation's task runs it too, one task and one round trip fewer; the same answer as
    native Polars and as without adaptive execution."""
    q = _q17_shape()
    # The plan as written: the aggregation's input not first reduced to the broadcast
    # side's keys (aggregate_key_filter), which would leave no shuffle to fuse with.
    cfg = _config(10**9, broadcast_join_threshold_bytes=10**9, aggregate_key_filter=False)
    got, report = _run(q, cfg)
    _same(got, q)
    fused = [line for line in report.adaptive if "1 task over its shuffle" in line]
    assert fused, report.adaptive
    assert "partial-agg+final-agg" in fused[0], fused
    off, plain = _run(q, {**cfg, "adaptive": False})
    _same(off, q)
    assert _tasks(report) < _tasks(plain)


def test_a_shuffle_too_large_for_one_task_is_not_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same query when one task may read only 1 KiB: the final aggregation keeps its
    own tasks (fusing would put more than that in one task); the same answer."""
    monkeypatch.setattr(adaptive, "MIN_TASK_BYTES", 1024)
    q = _q17_shape()
    got, report = _run(q, _config(2_000, broadcast_join_threshold_bytes=10**9))
    _same(got, q)
    assert not [line for line in report.adaptive if "over its shuffle" in line], report.adaptive


def test_every_piece_is_released_after_adaptive_changes() -> None:
    """The ledger ends at zero: skipped buckets, coalesced reads, a broadcast switch and a
    skipped stage each release what no task reads any more."""
    from shoal.planner.physical import plan_physical
    from shoal.runners.dispatch import DispatchLoop
    from shoal.runners.local import LocalBackend
    from shoal.runners.session import conform
    from shoal_polars.engine import to_ir

    probe = _facts(seed=1).lazy()
    small = _facts(seed=2).lazy().filter(pl.col("i") % 97 == 3).select("k", w="v")
    nothing = _dims().lazy().filter(pl.col("k") > 1000)
    queries = [  # (query, broadcast_join_threshold_bytes)
        (probe.join(small, on="k").group_by("s").agg(pl.len()).sort("s"), 8_000),
        (probe.join(_dims().lazy(), on="k", how="semi").sort("i"), 0),
        (probe.join(nothing, on="k").select("i", "name"), 10**9),
    ]
    backend = LocalBackend(2)
    try:
        for q, threshold in queries:
            cfg = shoal.Config(**_config(12_000, broadcast_join_threshold_bytes=threshold))  # type: ignore[arg-type]
            plan = to_ir(q)
            loop = DispatchLoop(
                plan_physical(plan, cfg, 2), backend, 4, cfg, adaptive=True, coalesce_bytes=12_000
            )
            got = pl.DataFrame(conform(backend.fetch(loop.run()), plan))
            _same(got, q, ordered=True)
            assert loop.adaptations, q
            assert loop.ledger.held == 0, loop.adaptations
    finally:
        backend.close()


def test_duckdb_filtered_side_turns_into_a_broadcast_join() -> None:
    con = duckdb.connect()
    con.register("f1", _facts(seed=1).to_arrow())
    con.register("f2", _facts(seed=2).to_arrow())
    con.execute("CREATE TABLE big AS SELECT * FROM f1").fetchall()
    con.execute("CREATE TABLE other AS SELECT * FROM f2").fetchall()
    cfg = shoal.Config(**_config(12_000, broadcast_join_threshold_bytes=8_000))  # type: ignore[arg-type]
    query = (
        "SELECT b.i, b.k, o.v AS w FROM big b LEFT JOIN (SELECT k, v FROM other "
        "WHERE i % 97 = 3) o ON b.k = o.k ORDER BY b.i, w NULLS FIRST"
    )
    got = shoal.duckdb.sql(con, query, raise_on_fail=True, config=cfg).pl()
    assert_frame_equal(got, con.sql(query).pl(), check_exact=False)
    report = last_query()
    assert report is not None
    assert any("run as a broadcast join" in line for line in report.adaptive), report.adaptive


def _agg() -> pl.LazyFrame:
    return (
        _facts().lazy().group_by("k", "s").agg(pl.col("v").sum(), n=pl.len(), i=pl.col("i").min())
    )


#: Sorts whose input turns out small: after an aggregation of a few groups, after a join,
#: over nothing, with NaN / null keys, descending, nulls last, ties kept in input order,
#: and what follows the sort in its stage or after it (a projection, a slice, a tail).
SMALL_SORTS: dict[str, Callable[[], pl.LazyFrame]] = {
    "agg-asc": lambda: _agg().sort("k", "s"),
    "agg-desc-nulls-last": lambda: _agg().sort(
        ["v", "k", "s"], descending=[True, False, True], nulls_last=True
    ),
    "agg-nulls-first-desc": lambda: _agg().sort(["k", "s"], descending=True),
    "agg-ties-stable": lambda: _agg().sort("s", maintain_order=True),
    "agg-ties-desc-stable": lambda: _agg().sort("n", descending=True, maintain_order=True),
    "agg-then-project": lambda: _agg().sort("k", "s").with_columns(w=pl.col("v") * 2),
    "agg-then-slice": lambda: _agg().sort("i").slice(3),
    "agg-then-tail": lambda: _agg().sort("i").tail(4),
    "join": lambda: (
        _facts()
        .lazy()
        .filter(pl.col("i") % 10 == 0)
        .join(_dims().lazy(), on="k")
        .sort(["name", "v", "i"], nulls_last=True)
    ),
    "join-stable-ties": lambda: (
        _facts()
        .lazy()
        .filter(pl.col("i") % 10 == 0)
        .join(_dims().lazy(), on="k")
        .sort("name", maintain_order=True)
    ),
    "filter-nan-desc": lambda: (
        _facts()
        .lazy()
        .filter(pl.col("i") % 7 == 0)
        .sort(["v", "i"], descending=[True, False], nulls_last=[True, False])
    ),
}


#: Sorts with tied keys after an aggregation or a join (whose row order Polars leaves open,
#: so a stable sort's ties are in no defined order): only the key column's order is fixed.
TIED_KEYS = {"agg-ties-stable": "s", "agg-ties-desc-stable": "n", "join-stable-ties": "name"}


def _same_sorted(got: pl.DataFrame, q: pl.LazyFrame, key: str | None) -> None:
    """Rows and order as native; with tied ``key`` values only that column's order."""
    if key is None:
        _same(got, q, ordered=True)
        return
    _same(got, q)
    assert got[key].equals(q.collect(engine="in-memory")[key])


@pytest.mark.parametrize("name", sorted(SMALL_SORTS))
def test_a_small_sort_runs_as_one_task_without_a_range_split(name: str) -> None:
    """The sampled stage gave a few KiB: the range split runs no task and the sort stage
    one, reading every piece of the sampled stage in order; rows and order as native."""
    q = SMALL_SORTS[name]()
    got, report = _run(q, _config(10**9))
    _same_sorted(got, q, TIED_KEYS.get(name))
    lines = [line for line in report.adaptive if "range split" in line]
    assert len(lines) == 1, report.adaptive
    # After an aggregation, its final step runs in the sort's task too: no sample taken.
    assert ("no sample" in lines[0]) == name.startswith("agg"), lines
    stages = {s.name: s.num_tasks for s in report.physical.stages}
    sorts = [n for n in stages if n.endswith("sort")]
    assert stages["range-split"] == 0 and [stages[n] for n in sorts] == [1], stages
    assert not any(
        sid == s.id
        for s in report.physical.stages
        if s.name == "range-split"
        for sid, _ in report.task_stats
    )
    off, plain = _run(q, _config(10**9, adaptive=False))
    _same_sorted(off, q, TIED_KEYS.get(name))
    assert _tasks(report) < _tasks(plain)


def test_a_small_sort_over_nothing() -> None:
    q = _facts().lazy().filter(pl.col("i") < 0).group_by("k").agg(pl.len()).sort("k")
    got, _ = _run(q, _config(10**9))
    _same(got, q, ordered=True)
    assert got.height == 0


def test_a_small_sort_is_reported_by_explain_analyze() -> None:
    q = _agg().sort("k", "s", nulls_last=True)
    text = shoal.explain(q, config=shoal.Config(**_config(10**9)), analyze=True)  # type: ignore[arg-type]
    assert "Adaptive execution:" in text and "range split" in text, text


def test_a_sort_over_more_than_one_task_keeps_its_range_split() -> None:
    """Over the coalescing target (here 1 byte a task) the range exchange runs as planned;
    with ``shuffle_partitions`` set (no coalescing) too."""
    q = _agg().sort("k", "s")
    for cfg in (_config(1), _config(10**9, shuffle_partitions=4)):
        got, report = _run(q, cfg)
        _same(got, q, ordered=True)
        assert not any("range split" in line for line in report.adaptive), report.adaptive
        stages = {s.name: s.num_tasks for s in report.physical.stages}
        assert stages["range-split"] > 0, stages


# ------------------------------------------- found by trying to break the seventh session


def _keys_frame(rows: int, mod: int, col: str) -> pl.DataFrame:
    return pl.DataFrame({"k": [i % mod for i in range(rows)], col: range(rows)})


def test_a_held_stage_runs_when_its_readers_other_input_is_skipped() -> None:
    """A one-task final aggregation held back for the join that reads it, whose other
    input (an aggregation of a side filtered to nothing) is skipped as empty late in the
    same dispatch pass: the loop looks again instead of reporting a stall (it raised
    "dispatch loop stalled" 5 runs in 5)."""
    a, b = _keys_frame(600, 40, "i").lazy(), _keys_frame(200, 45, "j").lazy()
    nothing = b.filter(pl.col("j") < 0).group_by("k").agg(pl.col("j").sum())
    for how in ("inner", "left", "semi", "anti", "full"):
        q = a.group_by("k").agg(pl.col("i").sum()).join(nothing, on="k", how=how)  # type: ignore[arg-type]
        for _ in range(3):
            got, _report = _run(q, _config(20_000, default_partitions=3, broadcast_inline_bytes=0))
            _same(got, q)


def test_a_count_over_a_skipped_shared_stage_gives_its_row() -> None:
    """A shared sub-plan that is certainly empty (a filter of nothing) is skipped; the
    stage that follows its partitions counts rows without keys (``select(pl.len())``):
    it must still run and give one row, 0 (it gave no row)."""
    a = pl.DataFrame({"k": [1, 2, 2, 3] * 50, "i": range(200)}).lazy()
    b = pl.DataFrame({"k": [1, 2, 3, 4], "w": [5, 6, 7, 8]}).lazy()
    x = a.join(b, on="k").filter(pl.lit(False))
    for q in (
        x.join(x.group_by("k").agg(pl.len().alias("n")), on="k").select(pl.len()),
        x.join(x.group_by("k").agg(pl.len().alias("n")), on="k", how="semi").select(pl.len()),
        x.join(x.group_by("k").agg(pl.len().alias("n")), on="k", how="left").select(
            pl.col("n").sum(), c=pl.len()
        ),
    ):
        got = q.collect(
            engine=shoal.DistEngine(raise_on_fail=True, runner="local", small_query_bytes=0)
        )
        assert_frame_equal(got, q.collect(engine="in-memory"))


def test_chained_broadcast_switches_do_not_rewrite_a_stage_twice() -> None:
    """Two planned hash joins that may each become a broadcast join, the second reading
    the first's probe stage: once the first switch runs that stage inside its join, the
    second is left as planned (it raised KeyError in about 3 runs in 8, by which build
    side finished first)."""
    rng = np.random.default_rng(7)
    keys = pl.Series(rng.integers(0, 40, 600)).cast(pl.Int64)
    keys = pl.when(pl.int_range(600) % 41 == 0).then(None).otherwise(keys)
    a = pl.DataFrame({"i": range(600)}).with_columns(
        k=keys,
        g=pl.Series(rng.integers(0, 6, 600)),
        d=pl.date(2020, 1, 1) + pl.duration(days=pl.Series(rng.integers(0, 50, 600))),
    )
    b = pl.DataFrame({"k": pl.Series(rng.integers(0, 45, 200)).cast(pl.Int64)})
    x = a.lazy().join(b.lazy(), on="k", how="left")
    q = (
        x.join(x.group_by("d").agg(pl.len().alias("n")), on="d")
        .join(x.group_by("g").agg(pl.len().alias("m")), on="g", how="left")
        .select(pl.len())
    )
    cfg = _config(
        2000, default_partitions=3, broadcast_join_threshold_bytes=4000, broadcast_inline_bytes=0
    )
    for _ in range(8):
        got, _report = _run(q, cfg)
        _same(got, q)


def test_a_switch_whose_build_side_is_skipped_releases_its_probe_on_ray(
    tmp_path: Path, ray_runner: None
) -> None:
    """On Ray, tasks started early find their input empty; the build side of a planned
    broadcast switch is then skipped in a pass that had already passed the held probe
    side: the next pass decides the switch and releases it (it stalled: "dispatch loop
    stalled")."""
    import random

    import pyarrow.parquet as pq

    rand = random.Random(7)

    def write(name: str, df: pl.DataFrame, files: int) -> pl.LazyFrame:
        root = tmp_path / name
        root.mkdir()
        df = df.sort("k", nulls_last=True)
        step = -(-df.height // files)
        for i in range(files):
            pq.write_table(
                df.slice(i * step, step).to_arrow(), root / f"{i}.parquet", row_group_size=24
            )
        pq.write_table(df.head(0).to_arrow(), root / f"{files}.parquet")  # one empty file
        return pl.scan_parquet(sorted(root.glob("*.parquet")))

    def frame(n: int, top: int, col: str, text: str, letters: str) -> pl.DataFrame:
        keys = [rand.choice([None, *range(top)]) for _ in range(n)]
        return pl.DataFrame(
            {"k": keys, col: range(n), text: [rand.choice(letters) for _ in range(n)]}
        )

    a = write("a", frame(600, 40, "i", "s", "xyz"), 4)
    b = write("b", frame(200, 45, "j", "t", "xyq"), 3)
    x = a.join(b, on="k").filter(pl.col("i") < 0)
    q = x.join(x.group_by("k").agg(pl.len().alias("n")), on="k")
    engine = shoal.DistEngine(
        runner="ray",
        raise_on_fail=True,
        small_query_bytes=0,
        target_partition_bytes=2000,
        broadcast_join_threshold_bytes=4000,
        broadcast_inline_bytes=0,
    )
    _same(q.collect(engine=engine), q)
