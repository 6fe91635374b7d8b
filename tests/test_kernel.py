"""The kernel's range exchange: bucketing by sampled boundaries keeps a global order."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.execution.kernel import choose_boundaries, range_buckets


@settings(max_examples=60, deadline=None)
@given(
    a=st.lists(st.one_of(st.none(), st.integers(-5, 5)), min_size=0, max_size=60),
    b=st.lists(
        st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=False, width=32)),
        min_size=60,
        max_size=60,
    ),
    desc=st.tuples(st.booleans(), st.booleans()),
    nulls_last=st.tuples(st.booleans(), st.booleans()),
    n=st.integers(1, 6),
)
def test_range_buckets_give_a_global_sort(a, b, desc, nulls_last, n):
    df = pl.DataFrame(
        {"__k0": a, "__k1": b[: len(a)]}, schema={"__k0": pl.Int64, "__k1": pl.Float64}
    )
    bounds = choose_boundaries([df.to_arrow()], desc, nulls_last, n)
    expected = df.sort(["__k0", "__k1"], descending=list(desc), nulls_last=list(nulls_last))
    if bounds is None:
        return
    assert bounds.num_rows == n - 1
    bucket = range_buckets(df, pl.from_arrow(bounds), desc, nulls_last)
    assert bucket.len() == df.height
    assert bucket.max() is None or bucket.max() <= n - 1
    pieces = [
        df.filter(bucket == i).sort(
            ["__k0", "__k1"], descending=list(desc), nulls_last=list(nulls_last)
        )
        for i in range(n)
    ]
    got = pl.concat(pieces)
    assert got.equals(expected)


def test_choose_boundaries_without_samples_is_none():
    assert choose_boundaries([], [False], [False], 4) is None
    one = pl.DataFrame({"__k0": [1, 2, 3]}).to_arrow()
    assert choose_boundaries([one], [False], [False], 1) is None
