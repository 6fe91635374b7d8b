"""Order-dependent work without a gather, against native Polars: ``over()`` windows by a hash
exchange on the window keys; ``with_row_index`` and integer cumulative functions by prefix
carries.

The data: three Parquet files of 40 rows (row groups of 8 rows) plus an empty file, cut
into many small partitions (one of them empty); keys with nulls, duplicates and one
skewed key (``"hot"``, about 60% of the rows), values with nulls, NaN and ties. Every
construct runs on the local and the Ray runner and is compared with Polars' in-memory
engine, row order included; the plan it ran is checked too: a hash-window plan (no task
sees all rows) where the windows allow it, a gather where they do not.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable
from pathlib import Path

import duckdb
import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.config import Config, RunnerKind
from shoal.ir.nodes import StageInput
from shoal.planner.physical import HashOutput, PhysicalPlan, RangeOutput
from shoal.planner.windows import PART_TAG
from shoal.runners.session import last_query
from shoal.tpch.compare import assert_frames_match
from shoal_polars import DistEngine

pytestmark = pytest.mark.usefixtures("ray_runner")

#: Small partitions: each 8-row row group is cut into pieces.
PARTITION_BYTES = 200


def _frame(seed: int, rows: int) -> pl.DataFrame:
    rnd = random.Random(seed)
    g = [rnd.choice(["hot"] * 6 + ["a", "b", "c", None]) for _ in range(rows)]
    k = [rnd.choice([1, 2, 2, 3, None]) for _ in range(rows)]
    v = [rnd.choice([1.5, -2.0, 2.0, 2.0, float("nan"), None, 0.0, -0.0]) for _ in range(rows)]
    n = [rnd.randrange(8) if rnd.random() > 0.1 else None for _ in range(rows)]
    d = [
        dt.date(2024, 1, 1) + dt.timedelta(days=rnd.randrange(6)) if rnd.random() > 0.1 else None
        for _ in range(rows)
    ]
    return pl.DataFrame(
        {"g": g, "k": k, "v": v, "n": n, "d": d},
        schema={"g": pl.String, "k": pl.Int32, "v": pl.Float64, "n": pl.Int64, "d": pl.Date},
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("windows")
    for i in range(3):
        _frame(i, 40).write_parquet(root / f"part-{i}.parquet", row_group_size=8)
    _frame(9, 0).write_parquet(root / "part-3.parquet")
    return root


Query = Callable[[pl.LazyFrame], pl.LazyFrame]

#: name -> (query, whether its windows run per hash bucket).
CASES: dict[str, tuple[Query, bool]] = {
    "aggregates": (
        lambda lf: lf.with_columns(
            pl.col("n").sum().alias("sum").over("g"),
            pl.col("v").mean().over("g").alias("mean"),
            pl.col("v").max().over("g").alias("max"),
            pl.col("n").first().over("g").alias("first"),
            pl.col("n").last().over("g").alias("last"),
            pl.col("v").n_unique().over("g").alias("n_unique"),
            pl.len().over("g").alias("len"),
            pl.col("n").count().over("g").alias("count"),
        ),
        True,
    ),
    "cumulative": (
        lambda lf: lf.with_columns(
            pl.col("n").cum_sum().over("g").alias("cum_sum"),
            pl.col("v").cum_max().over("g").alias("cum_max"),
            pl.col("n").cum_count().over("g").alias("cum_count"),
            pl.col("n").cum_min(reverse=True).over("g").alias("cum_min_rev"),
        ),
        True,
    ),
    "shift-diff": (
        lambda lf: lf.with_columns(
            pl.col("n").shift(1).over("g").alias("prev"),
            pl.col("v").shift(-2, fill_value=0.0).over("g").alias("next2"),
            pl.col("n").diff().over("g").alias("diff"),
            pl.col("n").forward_fill().over("g").alias("ffill"),
        ),
        True,
    ),
    "rank": (
        lambda lf: lf.with_columns(
            pl.col("n").rank("ordinal").over("g").alias("ordinal"),
            pl.col("v").rank("dense", descending=True).over("g").alias("dense"),
            pl.col("n").rank("min").over("g").alias("min"),
            pl.col("n").rank("average").over("g").alias("average"),
        ),
        True,
    ),
    "order_by": (
        lambda lf: lf.with_columns(
            pl.col("n").cum_sum().over("g", order_by="d").alias("running"),
            pl.col("n")
            .shift(1)
            .over("g", order_by="v", descending=True, nulls_last=True)
            .alias("s"),
            pl.col("n").rank("ordinal").over("g", order_by="k").alias("r"),
            pl.int_range(pl.len()).over("g", order_by="d").alias("i"),
        ),
        True,
    ),
    "rolling": (
        lambda lf: lf.with_columns(pl.col("n").rolling_sum(2).over("g").alias("roll")),
        True,
    ),
    "mapping-join": (
        lambda lf: lf.select("g", "n", pl.col("n").over("g", mapping_strategy="join").alias("all")),
        True,
    ),
    "two-keys-and-one": (
        lambda lf: lf.with_columns(
            pl.col("n").max().over("g", "k").alias("gk"),
            pl.col("v").sum().over("g").alias("g_sum"),
        ),
        True,
    ),
    "expression-key": (
        lambda lf: lf.with_columns(pl.col("n").cum_sum().over(pl.col("k") % 2).alias("by_parity")),
        True,
    ),
    "float-key-with-nan": (
        lambda lf: lf.with_columns(pl.col("n").sum().over("v").alias("by_v")),
        True,
    ),
    "row-wise-around-the-window": (
        lambda lf: lf.select(
            "n",
            (pl.col("n") - pl.col("n").mean().over("g")).alias("centred"),
            (pl.col("v").sum().over("k") * 2 + pl.col("n")).alias("mixed"),
            pl.lit(7).alias("seven"),
        ),
        False,  # two windows without a common key: g and k
    ),
    "filter-by-window": (
        lambda lf: lf.filter(pl.col("n") == pl.col("n").max().over("g")),
        True,
    ),
    "window-then-more": (
        lambda lf: (
            lf.with_columns(pl.col("n").cum_sum().over("k").alias("c"))
            .filter(pl.col("c") > 3)
            .with_columns(pl.col("c").rank("ordinal").over("k").alias("r"))
        ),
        True,
    ),
    # Not eligible: these gather.
    "mapping-explode": (
        lambda lf: lf.select(
            pl.col("n").sort(descending=True).over("g", mapping_strategy="explode")
        ),
        False,
    ),
    "different-keys": (
        lambda lf: lf.with_columns(
            pl.col("n").sum().over("g").alias("by_g"), pl.col("n").sum().over("k").alias("by_k")
        ),
        False,
    ),
    "window-and-plain-cumulative": (
        lambda lf: lf.with_columns(
            pl.col("n").sum().over("g").alias("by_g"), pl.col("n").cum_sum().alias("all")
        ),
        False,
    ),
    "without-partition-by": (
        lambda lf: lf.with_columns(pl.col("n").cum_sum().over(order_by="d").alias("c")),
        False,
    ),
}


def _run(lf: pl.LazyFrame, runner: RunnerKind, shuffle: int = 0) -> pl.DataFrame:
    config = Config(target_partition_bytes=PARTITION_BYTES, shuffle_partitions=shuffle)
    return lf.collect(engine=DistEngine(runner=runner, config=config, raise_on_fail=True))


def _uses_hash_window(plan: PhysicalPlan) -> bool:
    return any(
        isinstance(n, StageInput) and n.source_column == PART_TAG
        for st in plan.stages
        for n in st.fragment.walk()
    )


def _gathers(plan: PhysicalPlan) -> bool:
    """Some stage reads every row of a multi-task stage in one task (the summaries of a
    row index or cumulative function, one row per partition, are not rows of the data)."""
    return any(
        st.num_tasks == 1
        and any(
            i.mode == "all"
            and plan.stage(i.stage).num_tasks > 1
            and not plan.stage(i.stage).name.endswith("-summary")
            for i in st.inputs
        )
        for st in plan.stages
    )


@pytest.mark.parametrize("runner", ["local", "ray"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_window_matches_polars(data: Path, name: str, runner: RunnerKind) -> None:
    query, hashed = CASES[name]
    lf = query(pl.scan_parquet(data / "*.parquet"))
    expected = lf.collect(engine="in-memory")
    got = _run(lf, runner)
    assert_frame_equal(got, expected)
    report = last_query()
    assert report is not None and report.runner == runner
    scans = [st for st in report.physical.stages if st.scan_partitions is not None]
    rows = [report.task_stats[(st.id, p)].scan_rows for st in scans for p in range(st.num_tasks)]
    assert 0 in rows and sum(r > 0 for r in rows) >= 4, rows
    assert _uses_hash_window(report.physical) == hashed
    assert _gathers(report.physical) != hashed


@pytest.mark.parametrize("shuffle", [1, 3, 64])
@pytest.mark.parametrize("name", ["order_by", "filter-by-window", "window-then-more"])
def test_window_answer_does_not_depend_on_the_buckets(data: Path, name: str, shuffle: int) -> None:
    """1 bucket (all rows in one evaluate task), a few, and more buckets than keys."""
    lf = CASES[name][0](pl.scan_parquet(data / "*.parquet"))
    assert_frame_equal(_run(lf, "local", shuffle), lf.collect(engine="in-memory"))


def test_hash_window_plan_shape(data: Path) -> None:
    """Tag and shuffle on the window key, evaluate per bucket, route each row back to its
    input partition (range exchange on the partition tag), sort by the row tag: the input's
    partitions come out in order and no stage reads all rows in one task."""
    lf = CASES["cumulative"][0](pl.scan_parquet(data / "*.parquet"))
    _run(lf, "local", shuffle=3)
    report = last_query()
    assert report is not None
    plan = report.physical
    scan = next(st for st in plan.stages if st.scan_partitions is not None)
    assert isinstance(scan.output, HashOutput) and scan.output.n == 3
    assert [str(k) for k in scan.output.keys] == ["col('g')"]
    evaluate = next(st for st in plan.stages if st.name == "window-evaluate")
    assert evaluate.num_tasks == 3 and evaluate.inputs[0].mode == "bucket"
    assert isinstance(evaluate.output, RangeOutput) and evaluate.output.n == scan.num_tasks
    assert plan.root.num_tasks == scan.num_tasks and plan.root.inputs[0].mode == "bucket"
    assert not _gathers(plan)
    # Each output partition is its input partition: same rows, in order.
    rows_in = [report.task_stats[(scan.id, p)].scan_rows for p in range(scan.num_tasks)]
    rows_out = [report.task_stats[(plan.root.id, p)].rows_out for p in range(scan.num_tasks)]
    assert rows_in == rows_out
    text = shoal.explain(lf, config=Config(target_partition_bytes=PARTITION_BYTES))
    assert "window-evaluate" in text and "TAGGED '__shoal_part'" in text


def test_gather_plan_when_keys_differ(data: Path) -> None:
    lf = CASES["different-keys"][0](pl.scan_parquet(data / "*.parquet"))
    text = shoal.explain(lf, config=Config(target_partition_bytes=PARTITION_BYTES))
    assert "window-evaluate" not in text


@pytest.mark.parametrize("runner", ["local", "ray"])
def test_duckdb_windows_run_per_hash_bucket(runner: RunnerKind) -> None:
    """DuckDB's PARTITION BY windows become the same IR windows: per hash bucket too."""
    frame = pl.concat([_frame(i, 40) for i in range(3)]).with_row_index("id")  # noqa: F841
    con = duckdb.connect()
    con.execute("CREATE TABLE w AS SELECT * FROM frame")
    query = (
        "SELECT id, g, n, row_number() OVER (PARTITION BY g ORDER BY n DESC, id) AS rn, "
        "rank() OVER (PARTITION BY g ORDER BY v) AS r, sum(n) OVER (PARTITION BY g) AS s, "
        "lag(v) OVER (PARTITION BY g ORDER BY id) AS prev, "
        "max(n) OVER (PARTITION BY g ORDER BY id) AS running_max FROM w"
    )
    config = Config(runner=runner, default_partitions=5, target_partition_bytes=256)
    got = shoal.duckdb.sql(con, query, raise_on_fail=True, config=config).pl()
    assert_frames_match(got, con.sql(query).pl())
    report = last_query()
    assert report is not None and _uses_hash_window(report.physical)


def test_a_column_named_like_a_tag_gathers(data: Path) -> None:
    lf = pl.scan_parquet(data / "*.parquet").with_columns(
        pl.col("n").cum_sum().over("g").alias("__shoal_row")
    )
    assert_frame_equal(_run(lf, "local"), lf.collect(engine="in-memory"))
    report = last_query()
    assert report is not None
    assert not _uses_hash_window(report.physical) and _gathers(report.physical)


def test_consecutive_windows_over_one_key_share_one_round_trip(data: Path) -> None:
    """A window step, a filter by a window and another window step over the same key:
    one hash exchange and one evaluate stage for all three."""
    lf = CASES["window-then-more"][0](pl.scan_parquet(data / "*.parquet"))
    lf = lf.filter(pl.col("c") < pl.col("c").max().over("k"))
    assert_frame_equal(_run(lf, "local", shuffle=3), lf.collect(engine="in-memory"))
    report = last_query()
    assert report is not None
    plan = report.physical
    assert [st.name for st in plan.stages].count("window-evaluate") == 1
    assert sum(isinstance(st.output, HashOutput) for st in plan.stages) == 1
    # A window over another key after it needs its own exchange.
    lf = lf.with_columns(pl.col("n").sum().over("g").alias("by_g"))
    assert_frame_equal(_run(lf, "local", shuffle=3), lf.collect(engine="in-memory"))
    report = last_query()
    assert report is not None
    assert [st.name for st in report.physical.stages].count("window-evaluate") == 2


# ---------------------------------------------------------------- row index by prefix offsets

ROW_INDEX: dict[str, Query] = {
    "plain": lambda lf: lf.with_row_index(),
    "offset": lambda lf: lf.with_row_index("i", offset=1000),
    "after-a-filter": lambda lf: lf.filter(pl.col("n") > 2).with_row_index("i"),
    "then-a-window": lambda lf: lf.with_row_index("i").with_columns(
        pl.col("i").rank("ordinal", descending=True).over("g").alias("r")
    ),
    "twice": lambda lf: lf.with_row_index("a").filter(pl.col("g") == "hot").with_row_index("b"),
}


@pytest.mark.parametrize("runner", ["local", "ray"])
@pytest.mark.parametrize("name", sorted(ROW_INDEX))
def test_row_index_matches_polars(data: Path, name: str, runner: RunnerKind) -> None:
    lf = ROW_INDEX[name](pl.scan_parquet(data / "*.parquet"))
    assert_frame_equal(_run(lf, runner), lf.collect(engine="in-memory"))
    report = last_query()
    assert report is not None and not _gathers(report.physical)
    assert "row-index-carry" in [st.name for st in report.physical.stages]


def test_scan_row_index_runs_by_prefix_offsets(data: Path) -> None:
    lf = pl.scan_parquet(data / "*.parquet", row_index_name="r", row_index_offset=7)
    lf = lf.filter(pl.col("k") == 2)
    assert_frame_equal(_run(lf, "local", 3), lf.collect(engine="in-memory"))
    report = last_query()
    assert report is not None and not _gathers(report.physical)


def test_row_index_plan_shape(data: Path) -> None:
    """A count per partition, one small task for the offsets, and the numbering in the
    input's own partitions: no task reads another partition's rows."""
    lf = ROW_INDEX["after-a-filter"](pl.scan_parquet(data / "*.parquet"))
    _run(lf, "local")
    report = last_query()
    assert report is not None
    plan = report.physical
    scan = next(st for st in plan.stages if st.scan_partitions is not None)
    names = [st.name for st in plan.stages]
    assert names[1:] == ["row-index-summary", "row-index-carry", "row-index"], names
    offsets = plan.stage(names.index("row-index-carry"))
    assert offsets.num_tasks == 1 and isinstance(offsets.output, RangeOutput)
    assert plan.root.num_tasks == scan.num_tasks
    assert [i.mode for i in plan.root.inputs] == ["pointwise", "bucket"]
    assert max(report.task_stats[(plan.root.id, p)].rows_in for p in range(scan.num_tasks)) < 40


# ---------------------------------------------------------------- cumulative functions by carries

#: name -> (query, whether it runs by carries; otherwise it gathers).
CUMULATIVE: dict[str, tuple[Query, bool]] = {
    "integers": (
        lambda lf: lf.with_columns(
            pl.col("n").cum_sum().alias("cs"),
            pl.col("n").cum_count().alias("cc"),
            pl.col("k").cum_min().alias("cmin"),
            pl.col("k").cum_max().alias("cmax"),
            (pl.col("n") > 3).cum_sum().alias("bools"),
            pl.col("v").cum_count().alias("float-count"),
        ),
        True,
    ),
    "wrapping": (
        lambda lf: lf.select(
            (pl.col("k") * 900_000_000).cum_sum().alias("i32"),
            (pl.col("n") * 2**61).cum_sum().alias("i64"),
            pl.col("n").cast(pl.UInt8).cum_sum().alias("u8-widened"),
        ),
        True,
    ),
    "inside-expressions": (
        lambda lf: lf.select(
            "n", (pl.col("n").cum_sum() * 2 - pl.col("n").cum_max()).alias("x"), pl.lit(1)
        ),
        True,
    ),
    "filter": (lambda lf: lf.filter(pl.col("n").cum_sum() % 3 == 0), True),
    "row-index-then-running-count": (
        lambda lf: lf.with_row_index("i").with_columns(pl.col("g").cum_count().alias("c")),
        True,
    ),
    "floats-gather": (lambda lf: lf.with_columns(pl.col("v").cum_sum().alias("c")), False),
    "reverse-gathers": (
        lambda lf: lf.with_columns(pl.col("n").cum_sum(reverse=True).alias("c")),
        False,
    ),
    "with-a-shift-gathers": (
        lambda lf: lf.with_columns(pl.col("n").cum_sum().alias("c"), pl.col("n").shift(1)),
        False,
    ),
}


@pytest.mark.parametrize("runner", ["local", "ray"])
@pytest.mark.parametrize("name", sorted(CUMULATIVE))
def test_cumulative_matches_polars(data: Path, name: str, runner: RunnerKind) -> None:
    query, carried = CUMULATIVE[name]
    lf = query(pl.scan_parquet(data / "*.parquet"))
    assert_frame_equal(_run(lf, runner), lf.collect(engine="in-memory"))
    report = last_query()
    assert report is not None
    assert ("cumulative-carry" in [st.name for st in report.physical.stages]) == carried
    assert _gathers(report.physical) != carried
