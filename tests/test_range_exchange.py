"""The range exchange of a distributed sort (issue 17): boundaries from samples weighted by
the rows each partition holds, so skewed partitions still give balanced ranges; a single
sort key bucketed by binary search. Answers against native Polars (stable sorts, so the
order is fully defined) at several partition counts, on the local runner.
"""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.runners.session import last_query
from shoal_polars import DistEngine


def _config(partitions: int, **more: object) -> shoal.Config:
    settings: dict[str, object] = {
        "runner": "local",
        "small_query_bytes": 0,
        "default_partitions": partitions,
        "shuffle_partitions": partitions,
        # Every range bucket its own task, as planned (adaptive execution skips empty ones):
        # the tests read each bucket's rows from its task.
        "adaptive": False,
        **more,
    }
    return shoal.Config(**settings)  # type: ignore[arg-type]


def _sort_stage_rows() -> list[int]:
    """Rows read by each task of the last query's final sort stage (its range buckets)."""
    report = last_query()
    assert report is not None
    stage = next(s for s in reversed(report.physical.stages) if s.name == "sort")
    return [report.task_stats[(stage.id, p)].rows_in for p in range(stage.num_tasks)]


def test_skewed_partitions_give_balanced_ranges() -> None:
    """Twenty partitions of 5 rows and two of 50,000 (ten small frames and a big one, two
    partitions each), sampled at up to 20 rows each: unweighted, the 140 sample rows put two
    boundaries among the small partitions' values and one range got 88,000 rows; weighted
    by rows, the four ranges hold about 25,000 each."""
    small = [pl.DataFrame({"a": [float(i * 10 + j) for j in range(10)]}) for i in range(10)]
    big = pl.DataFrame({"a": pl.int_range(1000, 101_000, eager=True).cast(pl.Float64)})
    lf = pl.concat([f.lazy() for f in [*small, big]])
    q = lf.sort("a", descending=True)
    config = _config(2, shuffle_partitions=4, sort_sample_rows=20)
    got = q.collect(engine=DistEngine(config=config, raise_on_fail=True))
    assert_frame_equal(got, q.collect())
    rows = _sort_stage_rows()
    assert len(rows) == 4 and sum(rows) == 100_100
    assert max(rows) <= 1.2 * 100_100 / 4, rows


def _frame() -> pl.DataFrame:
    floats = [0.0, -0.0, float("nan"), None, 1.5, -2.0, float("inf"), 0.0, None, -0.0, 3.0]
    n = len(floats) * 9
    return pl.DataFrame(
        {
            "f": floats * 9,
            "i": pl.Series([None if k % 7 == 0 else (k * 5) % 13 - 6 for k in range(n)]),
            "s": pl.Series([None if k % 5 == 0 else "abcde"[k % 5] * (k % 3) for k in range(n)]),
            "row": range(n),
        }
    )


@pytest.mark.parametrize("partitions", [2, 3, 7])
@pytest.mark.parametrize("key", ["f", "i", "s"])
@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("nulls_last", [False, True])
def test_single_key_sort_is_exact(
    partitions: int, key: str, descending: bool, nulls_last: bool
) -> None:
    q = _frame().lazy().sort(key, descending=descending, nulls_last=nulls_last, maintain_order=True)
    got = q.collect(engine=DistEngine(config=_config(partitions), raise_on_fail=True))
    assert len(_sort_stage_rows()) == partitions
    assert_frame_equal(got, q.collect(engine="in-memory"), check_exact=True)


@pytest.mark.parametrize("partitions", [2, 5])
def test_two_key_sort_is_exact(partitions: int) -> None:
    q = (
        _frame()
        .lazy()
        .sort(["s", "f"], descending=[True, False], nulls_last=[False, True], maintain_order=True)
    )
    got = q.collect(engine=DistEngine(config=_config(partitions), raise_on_fail=True))
    assert_frame_equal(got, q.collect(engine="in-memory"), check_exact=True)
