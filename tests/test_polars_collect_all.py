"""``pl.collect_all([...], engine=DistEngine())``: the queries run as one shoal query, in
one physical plan where the sub-plans they share (Polars' common sub-plan elimination across
the queries) are computed once.

Each call is compared with Polars' own ``pl.collect_all`` on Parquet files of several row
groups (one partition each, one of them emptied by the filter) and in-memory frames split
into three partitions, with nulls, NaN, -0.0 and duplicates. "Once" is checked on what ran:
the stages of the physical plan and the rows each scan task read.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.ir.nodes import Scan
from shoal.runners.session import QueryReport, last_query
from shoal_polars.engine import optimised_plans

ENGINE = shoal.DistEngine(
    runner="local",
    raise_on_fail=True,
    default_partitions=3,
    shuffle_partitions=3,
    target_partition_bytes=500,  # a Parquet file below: one partition per row group
)
ROWS = 30


def _frame() -> pl.DataFrame:
    # Row group 0 (rows 0-9) has no even k (which its statistics cannot tell): the first
    # partition of a scan filtered on even k is empty.
    k = [1, 3, None, 1, 5, None, 3, 1, 7, None] + [2, 3, 3, None, 4, 2, 5, 5, 2, 7] * 2
    v = [1.5, float("nan"), -0.0, None, 0.0, 2.0, -3.0, 1e10, 0.25, 7.0] * 3
    s = ["a", "b", None, "d", "a", "", "z", "b", None, "q"] * 3
    return pl.DataFrame({"k": k, "v": v, "s": s})


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("collect_all")
    out = {}
    for name, df in (("a", _frame()), ("b", _frame().with_columns(pl.col("k") * 10))):
        path = root / f"{name}.parquet"
        df.write_parquet(path, row_group_size=10)
        out[name] = str(path)
    return out


def _run(queries: list[pl.LazyFrame], engine: Any = ENGINE) -> list[pl.DataFrame]:
    """``pl.collect_all`` on shoal, compared with Polars' own; checks that it ran as one
    shoal query and warned nothing."""
    before = last_query()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = pl.collect_all(queries, engine=engine)
    assert last_query() is not before, "did not run on shoal"
    expected = pl.collect_all(queries, engine="in-memory")
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert_frame_equal(g, e)
    return got


def _report() -> QueryReport:
    report = last_query()
    assert report is not None
    return report


def _scan_stages(report: QueryReport, path: str) -> list[int]:
    """Stages whose fragment scans ``path``."""
    return [
        st.id
        for st in report.physical.stages
        if any(isinstance(n, Scan) and path in str(n.source) for n in st.fragment.walk())
    ]


def _rows_scanned(report: QueryReport, stage_ids: list[int]) -> int:
    return sum(s.scan_rows for (sid, _), s in report.task_stats.items() if sid in stage_ids)


def test_a_shared_filtered_scan_runs_once(files: dict[str, str]) -> None:
    lf = pl.scan_parquet(files["a"])
    shared = lf.filter(pl.col("k") % 2 == 0)
    queries = [
        shared.group_by("k").agg(pl.col("v").sum(), pl.len()).sort("k"),
        shared.select(pl.col("v").sum(), pl.col("s").n_unique()),
        shared.sort("v", "s", "k", nulls_last=True),  # (v, s) has ties: k orders them
    ]
    _run(queries)
    report = _report()
    scans = _scan_stages(report, files["a"])
    assert len(scans) == 1, report.physical.explain()
    # Several partitions (three row groups over a tiny target: at least one each; the
    # split rounds to a multiple of the CPUs).
    assert report.physical.stage(scans[0]).num_tasks >= 3
    assert _rows_scanned(report, scans) == ROWS  # every row group read once, not per query
    results = report.physical.results
    assert len(results) == 3 and len(set(results)) == 3
    # Each query's first stage reads the shared stage pointwise.
    readers = [st for st in report.physical.stages if any(scans[0] in i.stages for i in st.inputs)]
    assert len(readers) == 3 and all(i.mode == "pointwise" for st in readers for i in st.inputs)


def test_unshared_queries_run_side_by_side_in_one_plan(files: dict[str, str]) -> None:
    a = pl.scan_parquet(files["a"]).filter(pl.col("v") > 0)
    b = pl.scan_parquet(files["b"]).filter(pl.col("k") < 40)
    queries = [
        a.group_by("s").agg(pl.col("k").max()).sort("s", nulls_last=True),
        b.join(a, on="s", how="inner").sort("k", "v", "k_right", "v_right", nulls_last=True),
        pl.scan_parquet(files["b"]).select(pl.len(), pl.col("v").min()),
    ]
    _run(queries)
    report = _report()
    assert len(set(report.physical.results)) == 3
    # The two different filters on b are not one sub-plan: each scans b itself.
    assert len(_scan_stages(report, files["b"])) == 2
    assert len(_scan_stages(report, files["a"])) == 1  # a's filtered scan is shared


def test_a_query_that_another_one_builds_on(files: dict[str, str]) -> None:
    """One query's whole result is a sub-plan of another: its stage is both a result and
    an input; the same query twice gives one result stage."""
    base = pl.scan_parquet(files["a"]).filter(pl.col("k") > 1).with_columns(w=pl.col("v") * 2)
    on_top = base.group_by("s").agg(pl.col("w").sum()).sort("s", nulls_last=True)
    _run([base, on_top, base])
    report = _report()
    first, second, third = report.physical.results
    assert first == third and first != second
    assert any(first in i.stages for st in report.physical.stages for i in st.inputs)


def test_shared_in_memory_frame_and_expressions() -> None:
    df = _frame()
    base = df.lazy().with_columns(r=pl.col("v").round(1)).filter(pl.col("s").is_not_null())
    queries = [
        base.group_by("k").agg(pl.col("r").mean()).sort("k", nulls_last=True),
        base.select(pl.col("r").sum(), pl.col("k").null_count()),
        df.lazy().select(pl.col("v").max()),
    ]
    _run(queries)
    report = _report()
    cached = [st for st in report.physical.stages if st.name.endswith("+cache")]
    assert len(cached) == 1, report.physical.explain()


def test_one_query_falls_back_and_the_others_run_together(files: dict[str, str]) -> None:
    shared = pl.scan_parquet(files["a"]).filter(pl.col("k") > 1)
    opaque = shared.map_batches(lambda d: d.with_columns(pl.col("k") * 2))
    queries = [shared.select(pl.col("v").sum()), opaque, shared.group_by("k").len().sort("k")]
    engine = shoal.DistEngine(runner="local", default_partitions=3, target_partition_bytes=500)
    with pytest.warns(pl.exceptions.PerformanceWarning, match="falling back"):
        got = pl.collect_all(queries, engine=engine)
    for g, e in zip(got, pl.collect_all(queries, engine="in-memory"), strict=True):
        assert_frame_equal(g, e)
    report = _report()
    assert len(report.physical.results) == 2  # the two shoal queries, in one plan
    assert len(_scan_stages(report, files["a"])) == 1
    assert optimised_plans(queries)[1] is None
    with pytest.raises(shoal.UnsupportedError, match="MapFunction"):
        pl.collect_all(queries, engine=ENGINE)


def test_plans_share_node_objects_only_where_polars_caches(files: dict[str, str]) -> None:
    lf = pl.scan_parquet(files["a"])
    q1 = lf.filter(pl.col("k") > 1).select("v")
    q2 = lf.filter(pl.col("k") > 1).select("s")
    q3 = lf.filter(pl.col("k") > 2).select("s")
    found = optimised_plans([q1, q2, q3])
    assert all(f is not None for f in found)
    scans = [[n for n in f[0].walk() if isinstance(n, Scan)] for f in found]  # type: ignore[index]
    assert scans[0][0] is scans[1][0]  # one object: Polars cached it, with both columns
    assert {"v", "s"} <= set(scans[0][0].schema.names)
    assert scans[2][0] is not scans[0][0]


def test_collect_all_async_shares_too(files: dict[str, str]) -> None:
    import asyncio

    shared = pl.scan_parquet(files["a"]).filter(pl.col("k") > 1)
    queries = [shared.select(pl.col("v").sum()), shared.group_by("s").len().sort("s")]

    async def every() -> list[pl.DataFrame]:
        return await pl.collect_all_async(queries, engine=ENGINE)

    before = last_query()
    got = asyncio.run(every())
    assert last_query() is not before
    for g, e in zip(got, pl.collect_all(queries, engine="in-memory"), strict=True):
        assert_frame_equal(g, e)
    report = _report()
    assert len(report.physical.results) == 2  # one plan for both
    assert len(_scan_stages(report, files["a"])) == 1


def test_small_queries_each_run_as_one_task(files: dict[str, str]) -> None:
    """With the small-query path on (the default), each small query is one task of its
    own, shared parts included, in the same plan."""
    shared = pl.scan_parquet(files["a"]).filter(pl.col("k") > 1)
    queries = [shared.select(pl.col("v").sum()), shared.group_by("s").len().sort("s")]
    _run(queries, shoal.DistEngine(runner="local", raise_on_fail=True))
    report = _report()
    assert [st.name for st in report.physical.stages] == ["small-query", "small-query"]
    assert report.physical.results == (0, 1)


def test_collect_all_on_ray(ray_runner: None, files: dict[str, str]) -> None:
    shared = pl.scan_parquet(files["a"]).filter(pl.col("k") > 1)
    queries = [
        shared.group_by("k").agg(pl.col("v").sum()).sort("k"),
        shared.select(pl.col("s").n_unique()),
        shared.sort("v", "s", "k", nulls_last=True),  # (v, s) has ties: k orders them
    ]
    engine = shoal.DistEngine(
        runner="ray",
        raise_on_fail=True,
        default_partitions=3,
        shuffle_partitions=3,
        target_partition_bytes=500,
    )
    _run(queries, engine)
    report = _report()
    assert report.runner == "ray"
    scans = _scan_stages(report, files["a"])
    assert len(scans) == 1 and _rows_scanned(report, scans) == ROWS


def test_collect_all_of_one_and_of_none(tmp_path: Path) -> None:
    lf = _frame().lazy().filter(pl.col("k") > 1)
    (got,) = _run([lf])
    assert_frame_equal(got, lf.collect(engine="in-memory"))
    assert pl.collect_all([], engine=ENGINE) == []
