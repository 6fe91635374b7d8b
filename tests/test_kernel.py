"""The kernel's range exchange: bucketing by sampled boundaries keeps a global order."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from shoal.execution.kernel import _sort_buckets, choose_boundaries, range_buckets, sample_keys
from shoal.ir.expr import Col
from shoal.ir.types import DataType


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


# -- one key: binary search of the boundaries (issue 17) ------------------------------

_ONE_KEY = {
    "int": st.one_of(st.none(), st.integers(-4, 4)),
    "float": st.one_of(
        st.none(), st.sampled_from([0.0, -0.0, float("nan"), float("inf"), -1.5, 2.0, 1e300])
    ),
    "str": st.one_of(st.none(), st.sampled_from(["", "a", "ab", "b", "é", "Z"])),
    "bool": st.one_of(st.none(), st.booleans()),
}
_DTYPES = {"int": pl.Int16, "float": pl.Float64, "str": pl.String, "bool": pl.Boolean}


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    kind=st.sampled_from(sorted(_ONE_KEY)),
    desc=st.booleans(),
    nulls_last=st.booleans(),
    n=st.integers(2, 7),
)
def test_search_buckets_equal_the_sort_buckets(data, kind, desc, nulls_last, n):
    """The binary search gives every row the bucket the joint sort gives it (NaN, -0.0,
    nulls first and last, descending, rows equal to a boundary)."""
    values = data.draw(st.lists(_ONE_KEY[kind], min_size=1, max_size=40))
    df = pl.DataFrame({"__k0": values}, schema={"__k0": _DTYPES[kind]})
    bounds = choose_boundaries([df.to_arrow()], [desc], [nulls_last], n)
    assert bounds is not None
    frame = pl.from_arrow(bounds)
    fast = range_buckets(df, frame, [desc], [nulls_last])
    slow = _sort_buckets(df, frame, [desc], [nulls_last])
    assert fast.to_list() == slow.to_list()


def test_search_buckets_keep_a_stable_global_sort():
    """-0.0 and 0.0 (equal for sort) and NaN share their bucket, so a stable sort of
    the buckets in order is the stable sort of the whole."""
    v = [0.0, -0.0, float("nan"), None, 1.0, -0.0, 0.0, float("nan"), None, -1.0] * 3
    df = pl.DataFrame({"__k0": v, "i": range(len(v))})
    for desc in (False, True):
        for nulls_last in (False, True):
            bounds = choose_boundaries([df.select("__k0").to_arrow()], [desc], [nulls_last], 4)
            assert bounds is not None
            b = range_buckets(df.select("__k0"), pl.from_arrow(bounds), [desc], [nulls_last])
            opts = {"descending": desc, "nulls_last": nulls_last, "maintain_order": True}
            got = pl.concat([df.filter(b == i).sort("__k0", **opts) for i in range(4)])
            assert got["i"].to_list() == df.sort("__k0", **opts)["i"].to_list()


# -- weighted samples (issue 17) --------------------------------------------------------


def test_weighted_samples_give_balanced_ranges():
    """100 partitions of 10 rows and one of 1,000,000 (each sampled at up to 1,000 rows, as
    tasks do): the boundaries cut the 1,001,000 rows into 4 ranges of about 250,000, where
    unweighted samples gave 500 / 500 / 500,000 / 500,000."""
    small = [pl.DataFrame({"__k0": list(range(i * 10, i * 10 + 10))}) for i in range(100)]
    big = pl.DataFrame({"__k0": pl.int_range(2000, 1_002_000, eager=True)})
    parts = [*small, big]
    samples = [sample_keys(p, [Col("__k0", DataType.from_polars(pl.Int64))], 1000) for p in parts]
    bounds = choose_boundaries(samples, [False], [False], 4, [p.height for p in parts])
    assert bounds is not None
    everything = pl.concat(parts)
    b = range_buckets(everything, pl.from_arrow(bounds), [False], [False])
    counts = b.value_counts().sort(b.name)["count"].to_list()
    assert len(counts) == 4
    assert max(counts) <= 1.1 * everything.height / 4, counts
    assert min(counts) >= 0.9 * everything.height / 4, counts


# -- the hash exchange's split (issue 17: no second pass, one hash per key) --------------


def _hash_parts(df: pl.DataFrame, keys: list[str], n: int) -> list[pl.DataFrame]:
    from shoal.execution.kernel import _split_hash
    from shoal.planner.physical import HashOutput

    spec = HashOutput(tuple(Col(k, DataType.from_polars(df.schema[k])) for k in keys), n)
    return _split_hash(df, spec)


def test_hash_split_keeps_every_row_once_in_order_and_each_key_in_one_bucket():
    """Nulls, NaN, -0.0 and 0.0, duplicates and several keys: the buckets hold every row
    once, each bucket keeps the input order, and rows that Polars' join and group-by treat
    as equal (a group of native ``group_by``) land in one bucket."""
    a = [None, 1, 2, 2, None, 3, 1, 7, 7, 7] * 5
    f = [0.0, -0.0, float("nan"), None, 1.5, -0.0, float("nan"), 0.0, None, 2.5] * 5
    s = ["x", None, "y", "x", "", None, "z", "y", "x", ""] * 5
    df = pl.DataFrame({"a": a, "f": f, "s": s}).with_row_index("i")
    for keys in (["a"], ["f"], ["s"], ["a", "f", "s"], ["s", "a"]):
        for n in (1, 3, 8):
            parts = _hash_parts(df, keys, n)
            assert len(parts) == n
            assert all(p.columns == df.columns for p in parts)
            got = pl.concat(parts)
            assert sorted(got["i"].to_list()) == df["i"].to_list()
            for p in parts:
                assert p["i"].to_list() == sorted(p["i"].to_list())  # input order kept
            bucket = {i: b for b, p in enumerate(parts) for i in p["i"].to_list()}
            groups = df.group_by(keys).agg(pl.col("i"))["i"].to_list()
            for members in groups:
                assert len({bucket[i] for i in members}) == 1, (keys, n, members)


def test_hash_split_matches_join_keys_of_both_sides():
    """A join's two sides, split separately (different row orders, duplicates, an empty
    side), put matching keys in the same bucket: the union of per-bucket joins is the
    native join."""
    left = pl.DataFrame({"k": [1, 2, 3, None, 2, 5, 8, 13, 21, 2], "lv": range(10)})
    right = pl.DataFrame({"k": [2, 21, None, 1, 1, 34, 8, 2], "rv": range(8)})
    want = left.join(right, on="k").sort("lv", "rv")
    for n in (2, 5):
        lp, rp = _hash_parts(left, ["k"], n), _hash_parts(right, ["k"], n)
        got = pl.concat([lpart.join(rpart, on="k") for lpart, rpart in zip(lp, rp, strict=True)])
        assert got.sort("lv", "rv").equals(want)
        empty = _hash_parts(right.clear(), ["k"], n)
        assert [p.height for p in empty] == [0] * n


def test_hash_split_parts_travel_without_their_neighbours_strings():
    """Each part of a hash split pickles (as the object store stores it) at about its own
    size: a slice of a shared string-view buffer would carry the strings of the parts
    before it (the last of 8 parts about 8 times its size)."""
    import pickle

    n = 20_000
    df = pl.DataFrame(
        {
            "k": list(range(n)),
            "s": [f"a string longer than twelve bytes, number {i}" for i in range(n)],
        }
    )
    for part in _hash_parts(df, ["k"], 8):
        table = part.to_arrow()
        buffers: list[pickle.PickleBuffer] = []
        head = pickle.dumps(table, protocol=5, buffer_callback=buffers.append)
        size = len(head) + sum(memoryview(b).nbytes for b in buffers)
        assert size < 1.5 * table.nbytes + 4096, (part.height, table.nbytes, size)
