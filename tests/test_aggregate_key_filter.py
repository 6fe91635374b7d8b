"""An inner join of an aggregation with a small side on group keys reduces the aggregation's
input to the keys the small side has first (``aggregate_key_filter``,
``shoal.planner.keyfilter``). Each query is checked against Polars' in-memory engine on
data in several Parquet files (one empty, one with most rows of one key), with null and
duplicate keys, and its physical plan is checked for the reduction where the rule allows
it and for its absence where it does not (float keys, the setting off).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal_polars import DistEngine

#: Distributed plans: the small-query path off, a few KiB per scan partition.
ON = shoal.Config(runner="local", small_query_bytes=0, target_partition_bytes=2048)
OFF = shoal.Config(
    runner="local", small_query_bytes=0, target_partition_bytes=2048, aggregate_key_filter=False
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``facts``: 3,000 rows in four files (the third empty, the last mostly key 7) with null
    and duplicate keys; ``dims``: a few keys, some absent from facts, a null, a duplicate."""
    root = tmp_path_factory.mktemp("keyfilter")
    n = 3000
    k = [None if i % 97 == 0 else (7 if i >= 2200 else i % 50) for i in range(n)]
    facts = pl.DataFrame(
        {
            "k": pl.Series(k, dtype=pl.Int64),
            "s": [None if i % 89 == 0 else f"s{i % 3}" for i in range(n)],
            "f": [float("nan") if i % 31 == 0 else (-0.0 if i % 2 else 0.0) for i in range(n)],
            "v": [(i * 7) % 101 - 50 for i in range(n)],
            "x": [None if i % 13 == 0 else i / 4 for i in range(n)],
        }
    )
    (root / "facts").mkdir()
    facts.slice(0, 1000).write_parquet(root / "facts" / "f0.parquet", row_group_size=250)
    facts.slice(1000, 1000).write_parquet(root / "facts" / "f1.parquet", row_group_size=250)
    facts.clear().write_parquet(root / "facts" / "f2.parquet")
    facts.slice(2000).write_parquet(root / "facts" / "f3.parquet", row_group_size=250)
    dims = pl.DataFrame(
        {
            "dk": pl.Series([3, 7, 7, 11, None, 999], dtype=pl.Int64),
            "ds": ["s1", "s0", "s2", None, "s1", "s2"],
            "df": [0.0, -0.0, float("nan"), 1.0, 0.0, 2.0],
            "w": [1, 2, 3, 4, 5, 6],
        }
    )
    dims.write_parquet(root / "dims.parquet")
    return root


def _facts(root: Path) -> pl.LazyFrame:
    return pl.scan_parquet(sorted((root / "facts").glob("*.parquet")))


def _dims(root: Path) -> pl.LazyFrame:
    return pl.scan_parquet(root / "dims.parquet")


def _sums(root: Path, by: list[str]) -> pl.LazyFrame:
    return (
        _facts(root)
        .group_by(by)
        .agg(pl.col("v").sum().alias("total"), pl.len().alias("n"), pl.col("x").max())
    )


QUERIES: dict[str, tuple[Callable[[Path], pl.LazyFrame], bool]] = {
    # name: (query, whether the reduction applies)
    "one_key_agg_left": (
        lambda r: _sums(r, ["k"]).join(_dims(r), left_on="k", right_on="dk"),
        True,
    ),
    "one_key_agg_right": (
        lambda r: (
            _dims(r).filter(pl.col("w") < 6).join(_sums(r, ["k"]), left_on="dk", right_on="k")
        ),
        True,
    ),
    "subset_of_group_keys": (
        lambda r: _sums(r, ["k", "s"]).join(_dims(r).select("dk", "w"), left_on="k", right_on="dk"),
        True,
    ),
    "two_keys": (
        lambda r: _sums(r, ["k", "s"]).join(_dims(r), left_on=["k", "s"], right_on=["dk", "ds"]),
        True,
    ),
    "nulls_equal": (
        lambda r: _sums(r, ["k"]).join(_dims(r), left_on="k", right_on="dk", nulls_equal=True),
        True,
    ),
    "count_after_join": (
        lambda r: _sums(r, ["k"]).join(_dims(r), left_on="k", right_on="dk").select(pl.len()),
        True,
    ),
    "literal_after_join": (
        lambda r: (
            _sums(r, ["s"])
            .join(_dims(r), left_on="s", right_on="ds")
            .select(pl.lit(1).alias("one"), "total")
        ),
        True,
    ),
    "float_key": (
        lambda r: _sums(r, ["f"]).join(_dims(r), left_on="f", right_on="df"),
        False,
    ),
    "left_join": (
        lambda r: _sums(r, ["k"]).join(_dims(r), left_on="k", right_on="dk", how="left"),
        False,
    ),
    "key_is_an_aggregate": (
        lambda r: _sums(r, ["k"]).join(_dims(r), left_on="n", right_on="w"),
        False,
    ),
}


def _explain(lf: pl.LazyFrame, config: shoal.Config) -> str:
    return shoal.explain(lf, config=config)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_join_of_an_aggregation_with_a_small_side(data: Path, name: str) -> None:
    make, applies = QUERIES[name]
    lf = make(data)
    want = lf.collect(engine="in-memory")
    got = lf.collect(engine=DistEngine(config=ON, raise_on_fail=True))
    assert_frame_equal(got, want, check_row_order=False, check_exact=True)
    plan = _explain(lf, ON)
    assert ("+key-filter" in plan) == applies, plan
    off = lf.collect(engine=DistEngine(config=OFF, raise_on_fail=True))
    assert_frame_equal(off, want, check_row_order=False, check_exact=True)
    assert "+key-filter" not in _explain(lf, OFF)


def test_the_reduced_aggregation_shuffles_only_the_kept_groups(data: Path) -> None:
    from shoal.runners.session import last_query

    lf = QUERIES["one_key_agg_left"][0](data)
    rows = {}
    for label, config in (("on", ON), ("off", OFF)):
        lf.collect(engine=DistEngine(config=config, raise_on_fail=True))
        report = last_query()
        assert report is not None
        partial = [s.id for s in report.physical.stages if "partial-agg" in s.name]
        rows[label] = sum(
            st.rows_out for (sid, _), st in report.task_stats.items() if sid in partial
        )
    # Keys 3, 7 and 11 of the 50 (and no null: nulls_equal is off) are aggregated.
    assert 0 < rows["on"] < rows["off"] / 4, rows
