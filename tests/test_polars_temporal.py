"""Temporal and ordered operators (``join_asof``, ``group_by_dynamic``, ``rolling``,
``merge_sorted``) on shoal against native Polars.

Inputs are split into several partitions (in-memory frames by ``default_partitions``, with
more partitions than rows in one case so that some are empty; Parquet as three files and an
empty one), with nulls and NaN in value columns, duplicate index values, several groups
(a null group among them), an integer index and a datetime index with a time zone (over a
daylight saving change). Row order is compared exactly: Polars defines it for all four.
Every query runs with ``raise_on_fail=True``, so a fallback to Polars fails the test.
"""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from shoal.config import Config
from shoal.errors import ShoalError, TaskError
from shoal.ir import serde
from shoal.ir.nodes import AsofJoin, DynamicGroupBy, MergeSorted, RollingGroupBy
from shoal.plan.validate import validate
from shoal.planner.physical import HashOutput
from shoal.runners.session import last_query
from shoal_polars import DistEngine, to_ir

Query = Callable[[pl.LazyFrame, pl.LazyFrame], pl.LazyFrame]

#: Partitions per in-memory frame: several, and more than the frames have rows.
PARTITIONS = (4, 45)

_TZ = "Europe/Amsterdam"


def _left() -> pl.DataFrame:
    """40 rows sorted by ``t`` (with duplicates) and by ``ts`` (hours across the change to
    summer time on 2024-03-31), groups ``g`` (with nulls) and ``h``, values with nulls/NaN."""
    n = 40
    t = [i // 3 * 2 + (i % 3 == 2) for i in range(n)]  # 0,0,1,2,2,3,...: duplicates
    start = dt.datetime(2024, 3, 30, 20, tzinfo=dt.UTC)
    ts = [start + dt.timedelta(minutes=35 * (i // 2)) for i in range(n)]
    return pl.DataFrame(
        {
            "t": t,
            "d": [dt.date(2024, 1, 1) + dt.timedelta(days=x) for x in t],
            "ts": pl.Series(ts).dt.convert_time_zone(_TZ),
            "g": [("a", "b", None, "c", "b")[i % 5] for i in range(n)],
            "h": [i % 3 for i in range(n)],
            "v": [None if i % 7 == 3 else (float("nan") if i % 11 == 5 else i * 1.5) for i in range(n)],
            "x": [None if i % 4 == 1 else 100 - i for i in range(n)],
        }
    )  # fmt: skip


def _right() -> pl.DataFrame:
    """23 rows sorted by ``t`` and ``ts``, interleaving the left's keys."""
    n = 23
    start = dt.datetime(2024, 3, 30, 19, 50, tzinfo=dt.UTC)
    t = [i * 3 - 2 + (i % 2) for i in range(n)]
    return pl.DataFrame(
        {
            "t": t,
            "d": [dt.date(2024, 1, 1) + dt.timedelta(days=x) for x in t],
            "ts": pl.Series([start + dt.timedelta(minutes=55 * i) for i in range(n)]).dt.convert_time_zone(_TZ),
            "g": [("b", "a", "c", None)[i % 4] for i in range(n)],
            "w": [None if i % 5 == 2 else float(i) for i in range(n)],
        }
    )  # fmt: skip


ASOF: dict[str, Query] = {
    "backward": lambda a, b: a.join_asof(b, on="t"),
    "backward_by": lambda a, b: a.join_asof(b, on="t", by="g", tolerance=3),
    "forward_by_no_exact": lambda a, b: a.join_asof(
        b, on="t", by="g", strategy="forward", allow_exact_matches=False
    ),
    "nearest_unchecked": lambda a, b: a.join_asof(
        b, on="t", strategy="nearest", check_sortedness=False
    ),
    "nearest_by": lambda a, b: a.join_asof(b, on="t", by="g", strategy="nearest", tolerance=4),
    "datetime_tz_by": lambda a, b: a.drop("t").join_asof(
        b.drop("t"), on="ts", by="g", tolerance="50m"
    ),
    "datetime_forward_timedelta": lambda a, b: a.drop("t").join_asof(
        b.drop("t"), on="ts", strategy="forward", tolerance=dt.timedelta(hours=1)
    ),
    "left_right_on_no_coalesce": lambda a, b: a.join_asof(
        b.rename({"t": "rt"}),
        left_on="t",
        right_on="rt",
        by_left="g",
        by_right="g",
        coalesce=False,
        suffix="_r",
    ),
}

_AGGS = (
    pl.col("v").sum().alias("v_sum"),
    pl.col("v").mean().alias("v_mean"),
    pl.col("x").max().alias("x_max"),
    pl.col("x").first().alias("x_first"),
    pl.len().alias("n"),
)

DYNAMIC: dict[str, Query] = {
    "int": lambda a, _: a.group_by_dynamic("t", every="5i").agg(*_AGGS),
    "int_by_both_right_bounds": lambda a, _: a.group_by_dynamic(
        "t",
        every="4i",
        period="6i",
        offset="-2i",
        closed="both",
        label="right",
        include_boundaries=True,
        group_by="g",
    ).agg(*_AGGS),
    "int_by_none_datapoint": lambda a, _: a.group_by_dynamic(
        "t", every="3i", closed="none", label="datapoint", group_by="g", start_by="datapoint"
    ).agg(*_AGGS),
    "int_two_keys": lambda a, _: a.group_by_dynamic("t", every="7i", group_by=["h", "g"]).agg(
        *_AGGS
    ),
    "datetime_tz": lambda a, _: a.group_by_dynamic("ts", every="2h", period="3h").agg(*_AGGS),
    "datetime_tz_by": lambda a, _: a.group_by_dynamic(
        "ts", every="90m", offset="10m", closed="right", group_by="g", include_boundaries=True
    ).agg(*_AGGS),
    "datetime_monday": lambda a, _: a.group_by_dynamic(
        "ts", every="1d", start_by="monday", group_by="h"
    ).agg(*_AGGS),
}

ROLLING: dict[str, Query] = {
    "int": lambda a, _: a.rolling("t", period="3i").agg(*_AGGS),
    "int_by_both": lambda a, _: a.rolling(
        "t", period="4i", offset="-1i", closed="both", group_by="g"
    ).agg(*_AGGS),
    "int_two_keys_left": lambda a, _: a.rolling(
        "t", period="5i", closed="left", group_by=["g", "h"]
    ).agg(*_AGGS),
    "datetime_tz_by": lambda a, _: a.rolling("ts", period="2h", closed="none", group_by="g").agg(
        *_AGGS
    ),
    "datetime_tz": lambda a, _: a.rolling("ts", period="1h30m").agg(*_AGGS),
}

MERGE: dict[str, Query] = {
    "int": lambda a, b: a.select("t", "g", pl.col("v").alias("w")).merge_sorted(
        b.select("t", "g", "w"), key="t"
    ),
    "datetime_tz": lambda a, b: a.select("ts", "g").merge_sorted(b.select("ts", "g"), key="ts"),
}

#: Around the operators: empty inputs, slices Polars pushes into them, keys that are
#: expressions or of other types (gathered or distributed), chains of them.
COMBINED: dict[str, Query] = {
    "empty_rolling_by": lambda a, _: (
        a.filter(pl.col("t") < 0).rolling("t", period="2i", group_by="g").agg(*_AGGS)
    ),
    "empty_right_asof_by": lambda a, b: a.join_asof(b.filter(pl.col("t") < -100), on="t", by="g"),
    "rolling_by_head": lambda a, _: a.rolling("t", period="2i", group_by="g").agg(*_AGGS).head(7),
    "dynamic_by_slice": lambda a, _: (
        a.group_by_dynamic("t", every="3i", group_by="g").agg(*_AGGS).slice(2, 5)
    ),
    "rolling_expression_key": lambda a, _: a.rolling(
        "t", period="2i", group_by=pl.col("g").str.to_uppercase().alias("G")
    ).agg(*_AGGS),
    "rolling_categorical_key": lambda a, _: (
        a.with_columns(pl.col("g").cast(pl.Categorical))
        .rolling("t", period="2i", group_by="g")
        .agg(*_AGGS)
    ),
    "dynamic_bool_and_date_keys": lambda a, _: (
        a.with_columns(bk=pl.col("h") > 0, d=pl.col("ts").dt.date())
        .group_by_dynamic("t", every="4i", group_by=["bk", "d"])
        .agg(*_AGGS)
    ),
    "asof_two_by_then_filter": lambda a, b: a.join_asof(
        b.with_columns(h=pl.col("t") % 3), on="t", by=["g", "h"]
    ).filter(pl.col("w") > 3),
    "asof_then_rolling": lambda a, b: (
        a.join_asof(b, on="t", by="g")
        .rolling("t", period="3i", group_by="g")
        .agg(pl.col("w").max())
    ),
    "asof_date_tolerance_by": lambda a, b: a.join_asof(b, on="d", by="g", tolerance="2d"),
    "asof_float_key_tolerance": lambda a, b: a.with_columns(f=pl.col("t") * 0.5).join_asof(
        b.with_columns(f=pl.col("t") * 0.5), on="f", tolerance=0.6, check_sortedness=False
    ),
    "asof_by_names_expression_key": lambda a, b: a.join_asof(
        b.rename({"g": "g2"}), left_on=pl.col("t") + 1, right_on="t", by_left="g", by_right="g2"
    ),
    "dynamic_date_week_by": lambda a, _: a.group_by_dynamic("d", every="1w", group_by="g").agg(
        *_AGGS
    ),
    "rolling_date": lambda a, _: a.rolling("d", period="3d").agg(*_AGGS),
    "merge_sorted_strings": lambda a, b: (
        a.select(pl.col("g").fill_null("z"))
        .sort("g")
        .merge_sorted(b.select(pl.col("g").fill_null("z")).sort("g"), key="g")
    ),
    "merge_sorted_then_dynamic": lambda a, b: (
        a.select("t", "g")
        .merge_sorted(b.select("t", "g"), key="t")
        .group_by_dynamic("t", every="5i")
        .agg(pl.len())
    ),
}

QUERIES: dict[str, Query] = {
    **{f"asof_{k}": q for k, q in ASOF.items()},
    **{f"dynamic_{k}": q for k, q in DYNAMIC.items()},
    **{f"rolling_{k}": q for k, q in ROLLING.items()},
    **{f"merge_sorted_{k}": q for k, q in MERGE.items()},
    **COMBINED,
}


def _native(query: Query, a: pl.LazyFrame, b: pl.LazyFrame) -> pl.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Polars: sortedness with by-groups
        return query(a, b).collect(engine="in-memory")


def _shoal(query: Query, a: pl.LazyFrame, b: pl.LazyFrame, config: Config) -> pl.DataFrame:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return query(a, b).collect(engine=DistEngine(config=config, raise_on_fail=True))


def _local(partitions: int) -> Config:
    return Config(runner="local", default_partitions=partitions)


@pytest.mark.parametrize("partitions", PARTITIONS)
@pytest.mark.parametrize("name", list(QUERIES))
def test_in_memory_local(name: str, partitions: int) -> None:
    a, b = _left().lazy(), _right().lazy()
    got = _shoal(QUERIES[name], a, b, _local(partitions))
    assert_frame_equal(got, _native(QUERIES[name], a, b))
    report = last_query()
    assert report is not None
    scans = [s for s in report.physical.stages if s.scan_partitions is not None]
    assert all(s.num_tasks == partitions for s in scans)


@pytest.fixture(scope="module")
def parquet_inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], list[str]]:
    """The left frame as three Parquet files and an empty one (in the middle), the right
    frame as two files: their concatenation, in order, is the frame."""
    root = tmp_path_factory.mktemp("temporal")
    left, right = _left(), _right()
    lefts = [left.slice(0, 13), left.slice(13, 0), left.slice(13, 14), left.slice(27)]
    rights = [right.slice(0, 10), right.slice(10)]
    paths: tuple[list[str], list[str]] = ([], [])
    for side, frames in ((0, lefts), (1, rights)):
        for i, frame in enumerate(frames):
            path = root / f"{'lr'[side]}{i}.parquet"
            frame.write_parquet(path, row_group_size=5)
            paths[side].append(str(path))
    return paths


@pytest.mark.parametrize("name", list(QUERIES))
def test_parquet_local(name: str, parquet_inputs: tuple[list[str], list[str]]) -> None:
    a = pl.scan_parquet(parquet_inputs[0])
    b = pl.scan_parquet(parquet_inputs[1])
    config = Config(runner="local", target_partition_bytes=256)
    got = _shoal(QUERIES[name], a, b, config)
    assert_frame_equal(got, _native(QUERIES[name], a, b))
    report = last_query()
    assert report is not None
    plan = report.physical
    if plan.row_groups and plan.row_groups_pruned == plan.row_groups:
        return  # the filter's statistics ruled out every row group: one empty task is right
    assert max(s.num_tasks for s in plan.stages) > 1


#: A subset on Ray: each strategy once (distributed and gathered plans).
RAY_QUERIES = (
    "asof_backward",
    "asof_nearest_by",
    "asof_datetime_tz_by",
    "dynamic_int_by_both_right_bounds",
    "dynamic_datetime_tz",
    "rolling_int_two_keys_left",
    "rolling_datetime_tz",
    "merge_sorted_int",
    "asof_then_rolling",
)


@pytest.mark.parametrize("name", RAY_QUERIES)
def test_ray(name: str, ray_runner: None, parquet_inputs: tuple[list[str], list[str]]) -> None:
    a, b = _left().lazy(), _right().lazy()
    config = Config(runner="ray", default_partitions=4)
    assert_frame_equal(_shoal(QUERIES[name], a, b, config), _native(QUERIES[name], a, b))
    pa_, pb = pl.scan_parquet(parquet_inputs[0]), pl.scan_parquet(parquet_inputs[1])
    config = Config(runner="ray", target_partition_bytes=256)
    assert_frame_equal(_shoal(QUERIES[name], pa_, pb, config), _native(QUERIES[name], pa_, pb))


# ---------------------------------------------------------------- plans


def _stages(query: Query, partitions: int = 4) -> list[object]:
    _shoal(query, _left().lazy(), _right().lazy(), _local(partitions))
    report = last_query()
    assert report is not None
    return list(report.physical.stages)


def test_asof_by_is_distributed_with_the_right_side_broadcast() -> None:
    stages = _stages(ASOF["backward_by"])
    root = stages[-1]
    assert isinstance(root.fragment, AsofJoin)  # type: ignore[attr-defined]
    assert root.num_tasks == 4  # type: ignore[attr-defined]
    assert [i.mode for i in root.inputs] == ["all"]  # type: ignore[attr-defined]


def test_asof_checked_without_by_runs_in_one_task() -> None:
    # Polars checks the whole left key for sortedness: one task sees all of it.
    assert _stages(ASOF["backward"])[-1].num_tasks == 1  # type: ignore[attr-defined]


def test_asof_with_a_large_right_side_runs_in_one_task() -> None:
    config = Config(runner="local", default_partitions=4, broadcast_join_threshold_bytes=1)
    q = ASOF["backward_by"]
    a, b = _left().lazy(), _right().lazy()
    assert_frame_equal(_shoal(q, a, b, config), _native(q, a, b))
    report = last_query()
    assert report is not None
    assert report.physical.stages[-1].num_tasks == 1


@pytest.mark.parametrize("name", ["dynamic_int_by_both_right_bounds", "rolling_int_two_keys_left"])
def test_window_group_by_with_keys_is_hash_partitioned(name: str) -> None:
    stages = _stages(QUERIES[name])
    hashed = [s for s in stages if isinstance(s.output, HashOutput)]  # type: ignore[attr-defined]
    assert len(hashed) == 1
    windowed = [
        s
        for s in stages
        if isinstance(s.fragment, DynamicGroupBy | RollingGroupBy)  # type: ignore[attr-defined]
    ]
    assert len(windowed) == 1 and windowed[0].num_tasks > 1  # type: ignore[attr-defined]


def test_window_group_by_on_float_key_is_gathered() -> None:
    # NaN keys: the group order is not restored by a join; one task computes it all.
    q: Query = lambda a, _: a.rolling("t", period="3i", group_by="v").agg(pl.len())  # noqa: E731
    stages = _stages(q)
    assert not [s for s in stages if isinstance(s.output, HashOutput)]  # type: ignore[attr-defined]
    a, b = _left().lazy(), _right().lazy()
    assert_frame_equal(_shoal(q, a, b, _local(4)), _native(q, a, b))


# ---------------------------------------------------------------- IR


@pytest.mark.parametrize("name", list(QUERIES))
def test_ir_round_trips_through_json(name: str) -> None:
    a, b = _left().lazy(), _right().lazy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        plan = to_ir(QUERIES[name](a, b))
    kinds = (AsofJoin, DynamicGroupBy, RollingGroupBy, MergeSorted)
    assert any(isinstance(n, kinds) for n in plan.walk())
    tables = {}
    for n in plan.walk():
        source = getattr(n, "source", None)
        if source is not None and hasattr(source, "table"):
            tables[f"t{len(tables)}"] = source.table
    text = serde.to_json(plan, tables=tables)
    back = serde.from_json(text, tables=tables)
    assert back == plan
    validate(back)


def test_durations_and_options_are_carried() -> None:
    q = (
        _left()
        .lazy()
        .group_by_dynamic(
            "ts", every="1mo2w", period="3d4h", offset="-1h", label="datapoint", start_by="sunday"
        )
    )
    plan = to_ir(q.agg(pl.len()))
    assert isinstance(plan, DynamicGroupBy)
    assert (plan.every, plan.period, plan.offset) == (
        "1mo2w",
        "3d14400000000000ns",
        "-3600000000000ns",
    )
    assert (plan.window_label, plan.start_by, plan.closed) == ("datapoint", "sunday", "left")
    asof = to_ir(ASOF["nearest_by"](_left().lazy(), _right().lazy()))
    assert isinstance(asof, AsofJoin)
    assert (asof.strategy, asof.tolerance, asof.left_by) == ("nearest", 4, ("g",))


def test_validate_names_a_missing_by_column() -> None:
    plan = to_ir(ASOF["backward_by"](_left().lazy(), _right().lazy()))
    assert isinstance(plan, AsofJoin)
    from dataclasses import replace

    with pytest.raises(ShoalError, match=r"by-column 'nope' \(\$\.plan\.right_by\[0\]\)"):
        validate(replace(plan, right_by=("nope",)))


# ---------------------------------------------------------------- bad input


def _unsorted() -> pl.LazyFrame:
    return pl.DataFrame({"t": [3, 1, 2, 5, 4, 6], "g": ["a"] * 6, "v": [1, 2, 3, 4, 5, 6]}).lazy()


@pytest.mark.parametrize(
    ("query", "error"),
    [
        (lambda lf: lf.rolling("t", period="2i").agg(pl.col("v").sum()), "not sorted"),
        (lambda lf: lf.group_by_dynamic("t", every="2i").agg(pl.col("v").sum()), "not sorted"),
        (
            lambda lf: lf.group_by_dynamic("t", every="2i", group_by="g").agg(pl.col("v").sum()),
            "not sorted",
        ),
        (lambda lf: lf.join_asof(lf, on="t"), "not sorted"),
    ],
)
def test_unsorted_index_raises_as_polars_does(
    query: Callable[[pl.LazyFrame], pl.LazyFrame], error: str
) -> None:
    """Sortedness is a property of the data: the task running the operator finds it, and
    the query fails with a :class:`shoal.errors.TaskError` naming Polars' error class."""
    lf = _unsorted()
    with pytest.raises(pl.exceptions.PolarsError, match=error) as native:
        query(lf).collect(engine="in-memory")
    with pytest.raises(TaskError, match=f"{native.type.__name__}: .*{error}"):
        query(lf).collect(engine=DistEngine(runner="local", raise_on_fail=True, config=_local(3)))


def test_parquet_missing_file_is_named_before_any_task(tmp_path: Path) -> None:
    missing = tmp_path / "gone.parquet"
    _left().write_parquet(missing)
    lf = pl.scan_parquet(missing).rolling("t", period="2i").agg(pl.len())
    missing.unlink()
    with pytest.raises((FileNotFoundError, pl.exceptions.PolarsError), match="gone.parquet"):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))
