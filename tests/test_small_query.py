"""The small-query path (``small_query_bytes``): a query whose scans are small runs as one
task with no exchange, and gives the answer native Polars gives, as the distributed plan
of the same query does (order-dependent operators, ``maintain_order``, NaN, -0.0, nulls,
an empty file). Each query runs with the path forced on and forced off at several
partition counts, on the local runner, against ``collect(engine="in-memory")``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.runners.session import last_query
from shoal_polars import DistEngine

from .conftest import task_plans

#: Above every input here: the one-task plan.
ON = shoal.Config(runner="local", small_query_bytes=1 << 40)
#: Distributed plans: the path off, in-memory frames in 1, 3 or 5 partitions.
OFF = [
    shoal.Config(runner="local", small_query_bytes=0, default_partitions=n, shuffle_partitions=3)
    for n in (1, 3, 5)
] + [shoal.Config(runner="local", small_query_bytes=0, target_partition_bytes=64)]


def _frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "k": pl.Series([1, 2, 2, None, 3, 1, 2, 3], dtype=pl.Int32),
            "x": [1, -2, 3, None, 5, -6, 3, 7],
            "y": [1.0, None, float("nan"), 2.0, -0.0, 3.0, float("nan"), 0.0],
            "s": ["a", "b", None, "a", "c", "b", "b", "d"],
        }
    )


def _other() -> pl.DataFrame:
    return pl.DataFrame({"k": pl.Series([2, 3, None, 2], dtype=pl.Int32), "z": [10, 20, 30, 40]})


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The frame as three Parquet files (the middle one empty) and two CSV files."""
    root = tmp_path_factory.mktemp("small")
    df = _frame()
    df.head(3).write_parquet(root / "p0.parquet")
    df.clear().write_parquet(root / "p1.parquet")
    df.slice(3).write_parquet(root / "p2.parquet", row_group_size=2)
    df.head(4).write_csv(root / "c0.csv")
    df.slice(4).write_csv(root / "c1.csv")
    return root


def _sources(files: Path) -> dict[str, Callable[[], pl.LazyFrame]]:
    return {
        "memory": lambda: _frame().lazy(),
        "parquet": lambda: pl.scan_parquet(sorted(files.glob("p*.parquet"))),
        "csv": lambda: pl.scan_csv(sorted(files.glob("c*.csv"))).cast({"k": pl.Int32}),
    }


#: Queries whose row order Polars defines (compared row for row).
ORDERED: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "row_index": lambda lf: lf.with_row_index("i", offset=3),
    "cum_sum": lambda lf: lf.select(pl.col("x").cum_sum(), pl.col("y").cum_sum()),
    "group_by_ordered": lambda lf: lf.group_by("k", maintain_order=True).agg(
        pl.col("x").sum(), pl.col("y").first(), pl.col("s").n_unique(), pl.len()
    ),
    "sort_nulls_desc": lambda lf: lf.sort(
        ["k", "y"], descending=[True, False], nulls_last=[False, True], maintain_order=True
    ),
    "sort_nan_zero": lambda lf: lf.sort("y", maintain_order=True),
    "unique_first": lambda lf: lf.unique(subset="k", keep="first", maintain_order=True),
    "unique_last": lambda lf: lf.unique(subset="s", keep="last", maintain_order=True),
    "join_left_ordered": lambda lf: lf.join(
        _other().lazy(),
        on="k",
        how="left",
        maintain_order="left_right",  # fully defined order
    ),
    "head": lambda lf: lf.head(3),
    "tail": lambda lf: lf.tail(2),
    "slice": lambda lf: lf.slice(2, 3),
    "top_k": lambda lf: lf.sort("x", descending=True, nulls_last=True, maintain_order=True).head(3),
    "window": lambda lf: lf.with_columns(
        r=pl.col("x").rank("ordinal").over("k"), sh=pl.col("y").shift(1)
    ),
    "filtered_count": lambda lf: lf.filter(pl.col("x") > 0).select(pl.len()),
    "concat": lambda lf: pl.concat([lf, lf.filter(pl.col("k") == 2)]),
    "shared": lambda lf: (lambda g: pl.concat([g, g.select(pl.col("k"), pl.col("x") * 2)]))(
        lf.group_by("k", maintain_order=True).agg(pl.col("x").max())
    ),
    "unpivot": lambda lf: lf.unpivot(index="k", on=["x"]),
    "global_agg": lambda lf: lf.select(
        pl.col("x").sum(), pl.col("y").min().alias("lo"), pl.col("y").max(), pl.col("s").first()
    ),
}

#: Queries whose row order Polars leaves open (compared after sorting).
UNORDERED: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "group_by": lambda lf: lf.group_by("k").agg(pl.col("x").sum(), pl.col("y").mean()),
    "inner_join": lambda lf: lf.join(_other().lazy(), on="k"),
    "distinct": lambda lf: lf.select("k", "s").unique(),
}


def _check(lf: pl.LazyFrame, sort: bool) -> None:
    expected = lf.collect(engine="in-memory")
    for config in [ON, *OFF]:
        got = lf.collect(engine=DistEngine(config=config, raise_on_fail=True))
        report = last_query()
        assert report is not None
        stages = report.physical.stages
        if config is ON:
            assert len(stages) == 1 and stages[0].num_tasks == 1, report.physical.explain()
        if sort:
            got, want = (
                got.sort(pl.all(), nulls_last=True),
                expected.sort(pl.all(), nulls_last=True),
            )
        else:
            want = expected
        assert_frame_equal(got, want, check_exact=True)


@pytest.mark.parametrize("source", ["memory", "parquet", "csv"])
@pytest.mark.parametrize("name", sorted(ORDERED))
def test_ordered_queries_same_answer_on_and_off(files: Path, source: str, name: str) -> None:
    _check(ORDERED[name](_sources(files)[source]()), sort=False)


@pytest.mark.parametrize("source", ["memory", "parquet"])
@pytest.mark.parametrize("name", sorted(UNORDERED))
def test_unordered_queries_same_answer_on_and_off(files: Path, source: str, name: str) -> None:
    _check(UNORDERED[name](_sources(files)[source]()), sort=True)


def test_parquet_predicate_prunes_row_groups_in_the_one_task(files: Path) -> None:
    """Row groups the footers rule out are left out of the one task's pieces too."""
    lf = pl.scan_parquet(sorted(files.glob("p*.parquet"))).filter(pl.col("x") > 4)
    _check(lf, sort=False)
    got = lf.collect(engine=DistEngine(config=ON, raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"))
    report = last_query()
    assert report is not None and report.physical.row_groups_pruned > 0
    assert len(report.physical.stages) == 1


def test_explain_says_one_task_with_the_estimate() -> None:
    lf = _frame().lazy().group_by("k").agg(pl.col("x").sum())
    text = shoal.explain(lf, config=ON)
    nbytes = _frame().select("k", "x").to_arrow().nbytes
    assert (
        f"small-query path: one task (estimated 8 rows / {nbytes:,} bytes < threshold "
        f"{ON.target_partition_bytes:,})"
    ) in text
    assert "Stage 1" not in text


def test_explain_says_why_not() -> None:
    lf = _frame().lazy().group_by("k").agg(pl.col("x").sum())
    small = shoal.Config(runner="local", small_query_bytes=10)
    assert "small-query path: not taken (estimated 8 rows / " in shoal.explain(lf, config=small)
    assert ">= threshold 10)" in shoal.explain(lf, config=small)
    parts = shoal.Config(runner="local", small_query_bytes=1 << 40, default_partitions=3)
    text = shoal.explain(lf, config=parts)
    assert "small-query path: not taken (default_partitions=3 asks for partitions)" in text
    assert "small-query path" not in shoal.explain(
        lf, config=shoal.Config(runner="local", small_query_bytes=0)
    )


def test_default_setting_takes_small_inputs_and_leaves_big_ones() -> None:
    """The default threshold plans a small frame as one task, and a frame above it (made
    to look big by a small target_partition_bytes, which caps the threshold) as several."""
    lf = _frame().lazy().group_by("k").agg(pl.col("x").sum())
    got = lf.collect(engine=DistEngine(config=shoal.Config(runner="local")))
    report = last_query()
    assert report is not None and len(report.physical.stages) == 1
    assert_frame_equal(got.sort("k"), lf.collect().sort("k"))
    tiny = shoal.Config(runner="local", target_partition_bytes=16)
    got = lf.collect(engine=DistEngine(config=tiny))
    report = last_query()
    assert report is not None and len(report.physical.stages) > 1
    assert_frame_equal(got.sort("k"), lf.collect().sort("k"))


def test_stateful_udf_keeps_its_actor_pool() -> None:
    """A stateful user function runs on an actor pool stage: not on the small-query path."""

    @shoal.udf(return_dtype=pl.Int64)
    class Double:
        def __call__(self, s: pl.Series) -> pl.Series:
            return s * 2

    lf = _frame().lazy().shoal.with_udf(Double, inputs=["x"], output="x2")
    text = shoal.explain(lf, config=ON)
    assert "small-query path: not taken (user function" in text


@pytest.mark.usefixtures("ray_runner")
def test_one_ray_task_same_answer(files: Path) -> None:
    """On Ray the one task travels pickled: its ScanSet (Parquet pieces, an in-memory
    table, a zero-column count) still finds every scan, also in a shared sub-plan."""
    on = shoal.Config(small_query_bytes=1 << 40)
    parquet = pl.scan_parquet(sorted(files.glob("p*.parquet")))
    shared = _frame().lazy().group_by("k", maintain_order=True).agg(pl.col("x").max())
    for lf in (
        parquet.join(_frame().lazy(), on="k", how="left", maintain_order="left"),
        pl.concat([shared, shared.select(pl.col("k"), pl.col("x") * 2)]),
        parquet.filter(pl.col("x") > 0).select(pl.len()),
        parquet.with_row_index().sort("y", maintain_order=True),
    ):
        got = lf.collect(engine=DistEngine(config=on, raise_on_fail=True))
        report = last_query()
        assert report is not None and report.runner == "ray"
        assert len(report.physical.stages) == 1
        assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)


def test_the_one_task_reads_parquet_files_whole_under_the_predicate(
    files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one task reads each Parquet file whole, the scan's predicate above the read,
    which Polars pushes into its reader (row groups skipped by statistics, late
    materialisation); the row slices of the distributed plan's partitions kept every read
    below the predicate. The answer stays native Polars' (row groups the footers ruled out
    hold no row that passes the predicate)."""
    plans = task_plans(monkeypatch)
    lf = pl.scan_parquet(sorted(files.glob("p*.parquet"))).filter(pl.col("x") > 4)
    got = lf.collect(engine=DistEngine(config=ON, raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)
    report = last_query()
    assert report is not None and report.physical.row_groups_pruned > 0
    assert "SLICE" not in plans[-1], plans[-1]
    assert "SELECTION" in plans[-1], plans[-1]


def test_files_with_an_extra_column_read_as_the_scan_asks(tmp_path: Path) -> None:
    """A later file with a column the first lacks (``extra_columns="ignore"``): the adapter
    applied the user's policy, so the task's multi-file scan ignores extra columns (Polars'
    default check would raise on it)."""
    pl.DataFrame({"k": [1, 2, None]}).write_parquet(tmp_path / "a.parquet")
    pl.DataFrame({"k": [3, 4], "extra": ["x", "y"]}).write_parquet(tmp_path / "b.parquet")
    paths = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    lf = pl.scan_parquet(paths, extra_columns="ignore").filter(pl.col("k") > 1)
    _check(lf, sort=False)


def test_files_read_together_keep_each_file_s_types(tmp_path: Path) -> None:
    """The small-query task reads a scan's files with one multi-file scan, where the first
    file read gives the types: a file whose column pyarrow wrote untyped (Null) must not
    give its type to the files after it, also when the statistics rule out the scan's
    first file (so the Null-typed file is the first one read), and a later file's extra
    column is no error when the user allowed it."""
    pq.write_table(pa.table({"k": pa.array([1, 2], pa.int64()), "x": [1.0, 2.0]}),
                   tmp_path / "0.parquet")  # fmt: skip
    pq.write_table(pa.table({"k": pa.array([10, 11], pa.int64()), "x": pa.nulls(2)}),
                   tmp_path / "1.parquet")  # fmt: skip
    pq.write_table(pa.table({"x": [-0.0, float("nan")], "k": pa.array([12, 13], pa.int64()),
                             "extra": ["a", "b"]}), tmp_path / "2.parquet")  # fmt: skip
    pq.write_table(pa.table({"k": pa.array([14], pa.int64()), "x": pa.nulls(1)}),
                   tmp_path / "3.parquet")  # fmt: skip
    paths = sorted(tmp_path.glob("*.parquet"))
    scan = pl.scan_parquet(paths, extra_columns="ignore")
    for lf in (
        scan,
        scan.filter(pl.col("k") > 5),  # prunes the first file: the Null-typed one is read first
        scan.filter(pl.col("k") > 11).select(pl.col("x").sum(), pl.len()),
        scan.filter(pl.col("k") > 5).with_row_index(),
    ):
        _check(lf, sort=False)


@pytest.mark.usefixtures("ray_runner")
def test_ray_small_query_runs_in_the_driver_unless_told_otherwise(files: Path) -> None:
    """On Ray the one task runs in the driver process by default (``small_query_where``);
    ``"worker"`` sends it to a Ray worker. Both give native Polars' answer, and explain and
    the query report say where it ran."""
    import os

    lf = (
        pl.scan_parquet(sorted(files.glob("p*.parquet")))
        .filter(pl.col("x") > -3)
        .join(_other().lazy(), on="k", how="left", maintain_order="left_right")
    )
    want = lf.collect(engine="in-memory")
    for where, in_driver in (("driver", True), ("worker", False)):
        config = shoal.Config(small_query_where=where)
        got = lf.collect(engine=DistEngine(config=config, raise_on_fail=True))
        assert_frame_equal(got, want, check_exact=True)
        report = last_query()
        assert report is not None and report.runner == "ray"
        assert report.physical.small_query_in_driver is in_driver
        pids = [s.pid for s in report.task_stats.values()]
        assert len(pids) == 1 and (pids[0] == os.getpid()) is in_driver
        text = shoal.explain(lf, config=config)
        line = next(x for x in text.splitlines() if x.startswith("small-query path"))
        if in_driver:
            assert line.endswith("; runs in the driver process"), line
        else:
            assert line.endswith("; runs on a Ray worker (small_query_where='worker')"), line


def _typed_frame() -> pl.DataFrame:
    """Columns of the types whose trip through Arrow Polars respells or rebuilds: an
    Enum, a Categorical, 128-bit integers, decimals, a zoned datetime, nested types;
    with nulls, NaN and -0.0."""
    return pl.DataFrame(
        {
            "k": pl.Series([1, 2, 2, None, 3], dtype=pl.Int32),
            "e": pl.Series(["lo", "hi", None, "lo", "hi"], dtype=pl.Enum(["lo", "hi"])),
            "c": pl.Series(["a", None, "b", "a", "c"], dtype=pl.Categorical),
            "w": pl.Series([2**100, -1, None, 0, 7], dtype=pl.Int128),
            "d": pl.Series(["1.25", None, "-0.50", "3.00", "0.01"], dtype=pl.Decimal(10, 2)),
            "t": pl.Series([1, 2, None, 4, 5], dtype=pl.Datetime("ms", "Europe/Berlin")),
            "y": [1.0, float("nan"), -0.0, None, 2.5],
            "l": [[1, 2], None, [], [None], [3]],
            "st": [{"a": 1, "b": "x"}, None, {"a": None, "b": "y"}, {"a": 4, "b": None}, None],
            "arr": pl.Series(
                [[1, 2], [3, 4], None, [5, None], [0, 0]], dtype=pl.Array(pl.Int64, 2)
            ),
        }
    )


_TYPED_QUERIES: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "all columns": lambda lf: lf.filter(pl.col("k").is_not_null() | pl.col("y").is_nan()),
    "no rows": lambda lf: lf.filter(pl.col("k") > 100),
    "aggregate": lambda lf: lf.group_by("e", maintain_order=True).agg(
        pl.col("w").sum(), pl.col("d").max(), pl.col("t").min(), pl.len()
    ),
    "count": lambda lf: lf.select(pl.len()),
    "no columns": lambda lf: lf.select([]),
}


@pytest.mark.usefixtures("ray_runner")
@pytest.mark.parametrize("name", list(_TYPED_QUERIES))
def test_ray_driver_result_of_every_type_reaches_polars_as_polars_computed_it(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small query run in the driver hands the Polars frame its task computed to the
    Polars frontend (``shoal.api.execute``'s ``polars_ok``) without converting it to Arrow
    and back, and the answer is native Polars' for every type, an empty result and a
    result of no columns; ``shoal.api.execute`` without ``polars_ok`` still gives the
    Arrow table."""
    from shoal.execution import kernel
    from shoal_polars.engine import to_ir

    lf = _TYPED_QUERIES[name](_typed_frame().lazy())
    want = lf.collect(engine="in-memory")
    calls: list[pl.DataFrame] = []
    real = kernel.frame_to_arrow
    monkeypatch.setattr(kernel, "frame_to_arrow", lambda df: calls.append(df) or real(df))
    got = lf.collect(engine=DistEngine(raise_on_fail=True))
    assert_frame_equal(got, want, check_exact=True)
    report = last_query()
    assert report is not None and report.physical.small_query_in_driver
    if name != "no columns":  # a frame of no columns keeps its height as Arrow
        assert calls == [], "the result went through Arrow"
    table = shoal.api.execute(to_ir(lf))
    assert isinstance(table, pa.Table) and table.num_rows == want.height


@pytest.mark.usefixtures("ray_runner")
def test_ray_collect_all_with_a_distributed_query_keeps_the_small_one_on_a_worker() -> None:
    """``collect_all`` of a small query and one above the threshold: one plan, which runs
    on Ray; the small query's task runs beside the distributed stages as a Ray task."""
    small = _frame().lazy().group_by("k", maintain_order=True).agg(pl.col("x").sum())
    big_frame = pl.DataFrame({"k": [i % 7 for i in range(20_000)], "v": range(20_000)})
    big = big_frame.lazy().group_by("k").agg(pl.col("v").sum()).sort("k")
    engine = DistEngine(config=shoal.Config(small_query_bytes=50_000), raise_on_fail=True)
    got = pl.collect_all([small, big], engine=engine)
    assert_frame_equal(got[0], small.collect(engine="in-memory"), check_exact=True)
    assert_frame_equal(got[1], big.collect(engine="in-memory"), check_exact=True)
    report = last_query()
    assert report is not None and not report.physical.small_query_in_driver
    assert "runs on a Ray worker (the other queries of the plan run distributed)" in (
        report.physical.small_query
    )
    assert any(st.name == "small-query" for st in report.physical.stages)
    assert any(st.name != "small-query" for st in report.physical.stages)


@pytest.mark.usefixtures("ray_runner")
def test_ray_driver_path_still_refuses_task_cpus_the_cluster_lacks() -> None:
    """A setting the cluster cannot run fails a small query too, although its task runs in
    the driver: every query fails alike."""
    lf = _frame().lazy().select(pl.col("x").sum())
    with pytest.raises(shoal.ShoalError, match=r"task_cpus=64 .*the largest has"):
        lf.collect(engine=DistEngine(config=shoal.Config(task_cpus=64), raise_on_fail=True))


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("ray_runner")
def test_ray_driver_task_ctrl_c_returns_at_once(tmp_path: Path) -> None:
    """Ctrl-C during a small query whose one task runs in the driver: the query raises
    ``KeyboardInterrupt`` before its task has ended (the task's thread finishes its batches
    in the background, as on the local runner), and the next query runs."""
    import os
    import signal
    import threading
    import time

    marker = tmp_path / "started"
    batches: list[int] = []

    @shoal.udf(return_dtype=pl.Int64, name="slow_in_driver")
    def slow(a: pl.Series) -> pl.Series:
        batches.append(a.len())
        marker.touch()
        time.sleep(0.2)
        return a * 2

    sent: dict[str, float] = {}  # when SIGINT was sent

    def interrupt() -> None:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        sent["at"] = time.monotonic()
        os.kill(os.getpid(), signal.SIGINT)

    # 20 batches of 0.2 s: 4 s run to the end.
    lf = pl.LazyFrame({"a": range(2000)}).shoal.with_udf(slow, "a", "b")
    engine = DistEngine(config=shoal.Config(udf_batch_size=100), raise_on_fail=True)
    t = threading.Thread(target=interrupt, daemon=True)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        lf.collect(engine=engine)
    began = len(batches)
    t.join()
    assert "at" in sent and began < 20, f"the query returned after {began} of 20 batches"
    small = _frame().lazy().select(pl.col("x").sum())
    assert_frame_equal(small.collect(engine=engine), small.collect(engine="in-memory"))
    report = last_query()
    assert report is not None and report.physical.small_query_in_driver


def test_a_file_listed_twice_is_read_twice(tmp_path: Path) -> None:
    """A Parquet file the scan lists twice gives its rows twice, as Polars reads it
    (the small-query path read each path once). Several row groups, a filter that keeps
    rows of the later ones only, and a second file between two listings."""
    a = tmp_path / "d.parquet"
    b = tmp_path / "e.parquet"
    pl.DataFrame({"a": list(range(10)), "x": [0.5 * i for i in range(10)]}).write_parquet(
        a, row_group_size=4
    )
    pl.DataFrame({"a": [None, 3, -1], "x": [float("nan"), -0.0, None]}).write_parquet(b)
    engine = shoal.DistEngine(runner="local", raise_on_fail=True)
    for paths in ([a, a], [a, b, a], [b, a, a, b]):
        for lf in (
            pl.scan_parquet(paths),
            pl.scan_parquet(paths).filter(pl.col("a") > 5),
            pl.scan_parquet(paths).select(pl.len()),
        ):
            got = lf.collect(engine=engine)
            assert_frame_equal(got, lf.collect())
            report = last_query()
            assert report is not None and report.physical.small_query.startswith(
                "small-query path: one task"
            )
