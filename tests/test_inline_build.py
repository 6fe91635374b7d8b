"""A small broadcast join's build side computed inside each task of the other side
(``broadcast_inline_bytes``): the same answers as native Polars, one stage fewer, and only
where it is exact and cheap (file scans only, no stage input, no scan shared with the
probe side)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.planner.physical import ScanSet
from shoal.runners.session import last_query

#: The fact table's partitions are about this big: it is cut into several, the dimension
#: tables are one partition each and read whole by every fact task well under it.
TARGET = 64 * 1024


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fact/ (4 files, one empty, several row groups each) and dim/, sub/ (3 files each,
    one empty), with nulls, NaN, -0.0 and duplicate keys; csv/ a CSV dimension."""
    root = tmp_path_factory.mktemp("inline")
    for name in ("fact", "dim", "sub", "csv"):
        (root / name).mkdir()
    n = 6000
    fact = pl.DataFrame(
        {
            "k": [None if i % 97 == 0 else i % 50 for i in range(n)],
            "j": [i % 7 for i in range(n)],
            "x": [
                float("nan") if i % 31 == 0 else (-0.0 if i % 13 == 0 else i * 0.5)
                for i in range(n)
            ],
            "s": [f"s{i % 11}" for i in range(n)],
        },
        schema={"k": pl.Int64, "j": pl.Int64, "x": pl.Float64, "s": pl.String},
    )
    for f, part in enumerate((fact[:2500], fact[2500:2500], fact[2500:4000], fact[4000:])):
        part.write_parquet(root / "fact" / f"f{f}.parquet", row_group_size=700)
    dim = pl.DataFrame(
        {
            # 0..39 with 3 and 5 twice (duplicates), a null key; no key 40..49.
            "k": [*range(40), 3, 5, None],
            "name": [f"d{i}" for i in range(40)] + ["dup3", "dup5", "nullkey"],
            "w": [None if i % 9 == 0 else float(i) for i in range(43)],
        }
    )
    dim[:20].write_parquet(root / "dim" / "d0.parquet")
    dim[20:20].write_parquet(root / "dim" / "d1.parquet")
    dim[20:].write_parquet(root / "dim" / "d2.parquet")
    sub = pl.DataFrame({"j": [0, 1, 2, 3, 4, 5, 6], "grp": ["a", "b", "a", None, "c", "b", "a"]})
    sub[:3].write_parquet(root / "sub" / "s0.parquet")
    sub[3:3].write_parquet(root / "sub" / "s1.parquet")
    sub[3:].write_parquet(root / "sub" / "s2.parquet")
    dim.write_csv(root / "csv" / "dim.csv")
    return root


def _engine(runner: str = "local", **kw: object) -> shoal.DistEngine:
    kw.setdefault("small_query_bytes", 0)  # (these queries are small: one task else)
    config = shoal.Config(target_partition_bytes=TARGET, **kw)  # type: ignore[arg-type]
    return shoal.DistEngine(runner=runner, raise_on_fail=True, config=config)  # type: ignore[arg-type]


def _scans(root: Path) -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame]:
    return (
        pl.scan_parquet(root / "fact" / "*.parquet"),
        pl.scan_parquet(root / "dim" / "*.parquet"),
        pl.scan_parquet(root / "sub" / "*.parquet"),
    )


def _inlined_stages() -> list[str]:
    rep = last_query()
    assert rep is not None
    return [s.name for s in rep.physical.stages if "inline-join" in s.name]


def _queries(root: Path) -> dict[str, tuple[pl.LazyFrame, bool]]:
    """name -> (query, whether its row order is defined)."""
    fact, dim, sub = _scans(root)
    small = dim.filter(pl.col("w").is_not_null() | pl.col("k").is_null())
    chain = dim.join(sub, left_on="k", right_on="j", how="inner")  # a join inside the build
    return {
        "inner": (fact.join(dim, on="k"), False),
        "inner-nulls-equal": (fact.join(dim, on="k", nulls_equal=True), False),
        "left": (fact.join(small, on="k", how="left"), False),
        "semi": (fact.join(small, on="k", how="semi"), False),
        "anti": (fact.join(small, on="k", how="anti"), False),
        "build-left": (dim.join(fact, on="k", how="inner"), False),
        "left-ordered": (fact.join(dim, on="k", how="left", maintain_order="left_right"), True),
        "two-builds": (fact.join(dim, on="k").join(sub, on="j", how="left"), False),
        "chain": (fact.join(chain, on="k"), False),
        "agg-after": (
            fact.join(dim, on="k")
            .join(sub, on="j")
            .group_by("grp", "name")
            .agg(pl.col("x").sum(), pl.len(), pl.col("w").max()),
            False,
        ),
        "zero-columns": (fact.join(dim, on="k", how="semi").select(pl.len()), True),
        "literal-only": (fact.join(dim, on="k").select(pl.lit(1).alias("one")), True),
        "filter-pruned": (fact.join(dim.filter(pl.col("k") > 1000), on="k", how="left"), False),
    }


def _check(got: pl.DataFrame, want: pl.DataFrame, ordered: bool) -> None:
    if ordered:
        assert_frame_equal(got, want)
    else:
        assert_frame_equal(got.sort(got.columns), want.sort(want.columns))


@pytest.mark.parametrize(
    "name",
    [
        "inner",
        "inner-nulls-equal",
        "left",
        "semi",
        "anti",
        "build-left",
        "left-ordered",
        "two-builds",
        "chain",
        "agg-after",
        "zero-columns",
        "literal-only",
        "filter-pruned",
    ],
)
def test_answers_as_native_and_inlines(data: Path, name: str) -> None:
    lf, ordered = _queries(data)[name]
    want = lf.collect()
    got = lf.collect(engine=_engine())
    _check(got, want, ordered)
    if name == "literal-only":  # Polars' optimiser drops the join: nothing to inline
        return
    assert _inlined_stages(), name
    rep = last_query()
    assert rep is not None
    fact_stage = next(s for s in rep.physical.stages if "inline-join" in s.name)
    assert fact_stage.num_tasks > 1  # the fact side stays partitioned
    assert all(isinstance(p, ScanSet) and p.partitioned for p in fact_stage.scan_partitions or ())
    # The same query without inlining: a broadcast stage more, the same answer.
    stages = len(rep.physical.stages)
    off = lf.collect(engine=_engine(broadcast_inline_bytes=0))
    _check(off, want, ordered)
    assert not _inlined_stages()
    rep_off = last_query()
    assert rep_off is not None and len(rep_off.physical.stages) > stages


def test_a_hash_join_stage_is_not_given_scans(data: Path) -> None:
    """A small dimension joined to a hash join's output stays a broadcast: the hash-join
    stage scans nothing, so adaptive execution may still switch its join to a broadcast
    join when a side turns out small, and coalesce its buckets (an inlined build made it a
    scanning stage: TPC-H Q5 at scale 10 shuffled all of lineitem)."""
    fact, dim, sub = _scans(data)
    other = fact.select(pl.col("j").alias("j2"), pl.col("k").alias("k2"), "s")
    lf = fact.join(other, left_on="k", right_on="k2").join(sub, on="j", how="left")
    engine = _engine(broadcast_join_threshold_bytes=4096, adaptive=False)
    _check(lf.collect(engine=engine), lf.collect(), False)
    rep = last_query()
    assert rep is not None
    joins = [s for s in rep.physical.stages if s.name.startswith("hash-join")]
    assert joins and all(s.scan_partitions is None for s in joins), [
        s.name for s in rep.physical.stages
    ]


def test_csv_build_side(data: Path) -> None:
    fact = pl.scan_parquet(data / "fact" / "*.parquet")
    dim = pl.scan_csv(data / "csv" / "dim.csv")
    lf = fact.join(dim, on="k", how="left")
    _check(lf.collect(engine=_engine()), lf.collect(), False)
    assert _inlined_stages()


def test_not_inlined_where_it_would_not_pay_or_not_hold(data: Path) -> None:
    fact, dim, sub = _scans(data)
    # Over the setting: a broadcast stage as before.
    lf = fact.join(dim, on="k")
    _check(lf.collect(engine=_engine(broadcast_inline_bytes=16)), lf.collect(), False)
    assert not _inlined_stages()
    # A build side with an aggregation (an exchange of its own): broadcast.
    agg = dim.group_by("k").agg(pl.col("w").sum())
    lf = fact.join(agg, on="k")
    _check(lf.collect(engine=_engine()), lf.collect(), False)
    assert not _inlined_stages()
    # An in-memory build side: every task would carry a copy.
    mem = dim.collect().lazy()
    lf = fact.join(mem, on="k")
    _check(lf.collect(engine=_engine()), lf.collect(), False)
    assert not _inlined_stages()


def test_ray_runner_in_memory_probe(data: Path, ray_runner: None) -> None:
    """On Ray the scan set travels with its partition flags; the probe side here is an
    in-memory frame (its partitions travel as task arguments beside the scan set)."""
    fact = pl.read_parquet(data / "fact" / "*.parquet").lazy()
    dim = pl.scan_parquet(data / "dim" / "*.parquet")
    sub = pl.scan_parquet(data / "sub" / "*.parquet")
    lf = fact.join(dim, on="k").join(sub, on="j", how="left")
    got = lf.collect(engine=_engine("ray", default_partitions=3))
    _check(got, lf.collect(), False)
    assert _inlined_stages()
    lf2 = pl.scan_parquet(data / "fact" / "*.parquet").join(dim, on="k", how="semi")
    _check(lf2.collect(engine=_engine("ray")), lf2.collect(), False)
    assert _inlined_stages()


@pytest.fixture(scope="module")
def facts_and_wide_dim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """events/ (3 files; ``t`` spread evenly over every row group, so the footers say a
    range predicate keeps few rows but prune none) and wide/ (one file of 200 rows with a long string column and a null key):
    the filtered events are estimated smaller than wide/, wide/ small enough to be read
    by each events task."""
    root = tmp_path_factory.mktemp("inline-choice")
    (root / "events").mkdir()
    (root / "wide").mkdir()
    n = 9000
    events = pl.DataFrame(
        {
            "t": [(i * 7919) % n for i in range(n)],  # each row group spans all values
            "k": [None if i % 101 == 0 else (i * 7) % 200 for i in range(n)],
            "x": [
                float("nan") if i % 37 == 0 else (-0.0 if i % 11 == 0 else i / 4) for i in range(n)
            ],
        },
        schema={"t": pl.Int64, "k": pl.Int64, "x": pl.Float64},
    )
    for f in range(3):
        events[f * 3000 : (f + 1) * 3000].write_parquet(
            root / "events" / f"e{f}.parquet", row_group_size=250
        )
    pl.DataFrame(
        {
            "k": [*range(199), None],
            "label": [f"label-{i:05d}-" + "z" * 40 for i in range(200)],
        }
    ).write_parquet(root / "wide" / "w.parquet")
    return root


def test_an_inlinable_build_side_wins_over_a_smaller_one_that_needs_a_stage(
    facts_and_wide_dim: Path,
) -> None:
    """The filtered events are estimated smaller than the dimension (the footers say the
    filter keeps ~3 % of rows), but broadcasting them needs a stage of their own; the
    dimension is computed inside each events task instead: one stage fewer, same answer."""
    events = pl.scan_parquet(facts_and_wide_dim / "events" / "*.parquet")
    wide = pl.scan_parquet(facts_and_wide_dim / "wide" / "*.parquet")
    q = (
        events.filter(pl.col("t") < 100)
        .join(wide, on="k")
        .group_by("label")
        .agg(pl.col("x").sum(), pl.len())
    )
    got = q.collect(engine=_engine())
    _check(got, q.collect(), ordered=False)
    rep = last_query()
    assert rep is not None
    names = [s.name for s in rep.physical.stages]
    assert _inlined_stages(), names
    assert not any("broadcast" in n for n in names), names
