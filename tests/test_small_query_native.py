"""A small Polars query run in this process is answered by Polars itself
(``small_query_native``): the one task of the small-query path runs the user's own query on
Polars' engine instead of shoal's lowering of it. These tests check that it does (shoal's
lowering is never called, the report says so), that the answer is Polars' own on the data
every feature is tested with (several files, an empty one, nulls, NaN, -0.0, duplicate
keys, zero-column and literal-only projections), that the query's optimisation flags and
errors are Polars', and that a query that is not small, or runs on a Ray worker, or has
the setting off, is lowered as before.

The rest of the suite lowers every small query (``tests/conftest.py``); these tests are
marked ``native_small_query`` to keep the setting as configured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.exceptions import InvalidOperationError
from polars.testing import assert_frame_equal

import shoal
import shoal.execution.kernel as kernel
import shoal_polars.engine as engine_mod
from shoal.runners.session import last_query
from shoal_polars import DistEngine

pytestmark = pytest.mark.native_small_query

LOCAL = shoal.Config(runner="local")
HANDED_BACK = "run as the frontend's own query by Polars'"


def _frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "k": pl.Series([1, 2, 2, None, 3, 1, 2, 3, 3], dtype=pl.Int32),
            "x": [1, -2, 3, None, 5, -6, 3, 7, 7],
            "y": [1.0, None, float("nan"), 2.0, -0.0, 3.0, float("nan"), 0.0, 0.0],
            "s": ["a", "b", None, "a", "c", "b", "b", "d", "d"],
        }
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The frame as three Parquet files, the middle one empty, the last of 2-row groups."""
    root = tmp_path_factory.mktemp("native")
    df = _frame()
    df.head(3).write_parquet(root / "p0.parquet")
    df.clear().write_parquet(root / "p1.parquet")
    df.slice(3).write_parquet(root / "p2.parquet", row_group_size=2)
    return root


@pytest.fixture
def lowered(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times shoal's lowering (the kernel's ``build``) ran, from now on."""
    calls: list[int] = []
    real = kernel.build

    def spy(*args: Any, **kwargs: Any) -> pl.LazyFrame:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(kernel, "build", spy)
    return calls


def _source(files: Path, kind: str) -> pl.LazyFrame:
    if kind == "memory":
        return _frame().lazy()
    return pl.scan_parquet(sorted(files.glob("p*.parquet")))


QUERIES: dict[str, Callable[[pl.LazyFrame], pl.LazyFrame]] = {
    "count_after_filter": lambda lf: lf.filter(pl.col("x") > 2).select(pl.len()),
    "group_by": lambda lf: lf.group_by("k", maintain_order=True).agg(
        pl.col("x").sum(), pl.col("y").max(), pl.col("s").n_unique(), pl.len()
    ),
    "sort_nan_zero": lambda lf: lf.sort(["y", "k"], nulls_last=True, maintain_order=True),
    "self_join": lambda lf: lf.join(
        lf.select("k", z=pl.col("x") * 10), on="k", how="left", maintain_order="left_right"
    ),
    "literal_only": lambda lf: lf.select(pl.lit(7).alias("seven"), pl.lit("a").alias("t")),
    "literal_column": lambda lf: lf.with_columns(one=pl.lit(1)).filter(pl.col("k") == 2),
    "zero_columns": lambda lf: lf.select(),
    "distinct": lambda lf: lf.select("k", "s").unique(maintain_order=True),
}


@pytest.mark.parametrize("kind", ["memory", "parquet"])
@pytest.mark.parametrize("name", sorted(QUERIES))
def test_small_query_is_answered_by_polars(
    files: Path, kind: str, name: str, lowered: list[int]
) -> None:
    lf = QUERIES[name](_source(files, kind))
    got = lf.collect(engine=DistEngine(config=LOCAL, raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)
    assert lowered == []  # shoal's lowering never ran
    report = last_query()
    assert report is not None
    assert HANDED_BACK in report.physical.small_query, report.physical.small_query
    ((stage, _),) = report.task_stats  # one task, whose rows are the result's
    assert report.physical.stage(stage).native is not None
    assert report.task_stats[stage, 0].rows_out == got.height


@pytest.mark.parametrize("name", ["group_by", "self_join", "zero_columns", "literal_only"])
def test_setting_off_lowers_the_small_query(files: Path, name: str, lowered: list[int]) -> None:
    lf = QUERIES[name](_source(files, "parquet"))
    off = shoal.Config(runner="local", small_query_native=False)
    got = lf.collect(engine=DistEngine(config=off, raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)
    assert lowered, "the setting off: shoal's lowering runs the query"
    report = last_query()
    assert report is not None and HANDED_BACK not in report.physical.small_query


@pytest.mark.parametrize(
    "config",
    [
        shoal.Config(runner="local", small_query_bytes=0),
        shoal.Config(runner="local", default_partitions=3),
    ],
    ids=["path_off", "partitions_asked"],
)
def test_a_query_that_is_not_small_is_lowered(
    files: Path, config: shoal.Config, lowered: list[int]
) -> None:
    lf = QUERIES["group_by"](_source(files, "parquet"))
    got = lf.collect(engine=DistEngine(config=config, raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_exact=True)
    assert lowered
    report = last_query()
    assert report is not None and HANDED_BACK not in report.physical.small_query


def test_the_query_s_optimisation_flags_reach_polars(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[pl.QueryOptFlags] = []
    real = engine_mod.native_engine

    class Recording:
        def __init__(self) -> None:
            self.inner = real()
            self.name = self.inner.name

        def collect(self, lf: pl.LazyFrame, *, optimizations: pl.QueryOptFlags) -> Any:
            seen.append(optimizations)
            return self.inner.collect(lf, optimizations=optimizations)

    monkeypatch.setattr(engine_mod, "native_engine", Recording)
    flags = pl.QueryOptFlags(predicate_pushdown=False, projection_pushdown=False)
    lf = _frame().lazy().filter(pl.col("x") > 0).select("k")
    got = lf.collect(engine=DistEngine(config=LOCAL, raise_on_fail=True), optimizations=flags)
    assert_frame_equal(got, lf.collect(engine="in-memory"))
    assert len(seen) == 1
    assert not seen[0].predicate_pushdown and not seen[0].projection_pushdown


def test_polars_errors_reach_the_user_as_polars_raises_them(lowered: list[int]) -> None:
    lf = pl.LazyFrame({"a": [1, 300, None]}).select(pl.col("a").cast(pl.Int8, strict=True))
    with pytest.raises(InvalidOperationError, match="conversion"):
        lf.collect(engine=DistEngine(config=LOCAL))
    assert lowered == []


@pytest.fixture
def dist_affinity() -> Iterator[None]:
    pl.Config.set_engine_affinity(DistEngine(config=LOCAL, raise_on_fail=True))  # type: ignore[arg-type]
    try:
        yield
    finally:
        pl.Config.set_engine_affinity(None)


def test_with_shoal_as_engine_affinity_polars_runs_it_once(
    dist_affinity: None, lowered: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The query handed back runs on Polars' engine, never on shoal again.
    translated: list[int] = []
    import shoal_polars.translate as translate

    real = translate.translate_plan

    def spy(*args: Any, **kwargs: Any) -> Any:
        translated.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(translate, "translate_plan", spy)
    lf = _frame().lazy().group_by("s").agg(pl.col("x").max()).sort("s")
    got = lf.collect()
    assert_frame_equal(got, lf.collect(engine="in-memory"))
    assert translated == [1] and lowered == []


def test_ray_driver_hands_back_and_a_worker_lowers(
    files: Path, ray_runner: None, lowered: list[int]
) -> None:
    lf = QUERIES["group_by"](_source(files, "parquet"))
    want = lf.collect(engine="in-memory")
    got = lf.collect(engine=DistEngine(runner="ray", raise_on_fail=True))
    assert_frame_equal(got, want, check_exact=True)
    report = last_query()
    assert report is not None and HANDED_BACK in report.physical.small_query
    assert lowered == []
    # On a Ray worker the frontend's query is not at hand: the task is lowered there.
    worker = shoal.Config(runner="ray", small_query_where="worker")
    got = lf.collect(engine=DistEngine(config=worker, raise_on_fail=True))
    assert_frame_equal(got, want, check_exact=True)
    report = last_query()
    assert report is not None and HANDED_BACK not in report.physical.small_query


def test_explain_analyze_runs_it_as_collect_does(files: Path, lowered: list[int]) -> None:
    lf = QUERIES["group_by"](_source(files, "parquet"))
    text = shoal.explain(lf, config=LOCAL, analyze=True)
    assert HANDED_BACK in text, text
    assert lowered == []
    plain = shoal.explain(lf, config=LOCAL)  # nothing runs: no task to hand anything to
    assert HANDED_BACK not in plain and "small-query path: one task" in plain


def test_a_shoal_user_function_is_lowered_and_runs_inside_its_task(lowered: list[int]) -> None:
    # Polars would call the function on its own threads, outside the task: without the
    # query's udf_batch_size, and a collect inside it would reach shoal again.
    from shoal.config import get_config
    from shoal.execution.scope import in_task

    seen: list[tuple[int, int | None, bool]] = []

    @shoal.udf(return_dtype=pl.Int64)
    def batch_len(v: pl.Series) -> pl.Series:
        seen.append((len(v), get_config().udf_batch_size, in_task()))
        return pl.Series([len(v)] * len(v), dtype=pl.Int64)

    lf = pl.LazyFrame({"v": list(range(40))}).shoal.with_udf(batch_len, "v", "n")  # type: ignore[attr-defined]
    got = lf.collect(engine=DistEngine(runner="local", udf_batch_size=10, raise_on_fail=True))
    assert got["n"].to_list() == [10] * 40
    assert seen == [(10, 10, True)] * 4
    assert lowered
    report = last_query()
    assert report is not None and HANDED_BACK not in report.physical.small_query
