"""Aligned joins (:mod:`shoal.planner.aligned`): two Parquet sides stored in the order of
the join key joined partition by partition, each task reading the other side's row groups
that can match its own. The same answers as native Polars for every join type on data
with null keys, duplicate keys spanning row groups and partitions, NaN and -0.0, an empty
file; taken only where the footers show the keys aligned."""

from __future__ import annotations

import datetime
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.planner.physical import ScanPartition, ScanSet
from shoal.runners.session import last_query

#: Small partitions: the fact table is cut into several, each a few row groups.
TARGET = 48 * 1024


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """orders/ (keys 0..1999 sorted, every 7th key missing, null keys at the end, 3 files
    and an empty one), lines/ (1-4 rows per key, sorted, so a key's rows span row groups
    and files; null keys; NaN, -0.0), shuffled/ (lines in random order), dim/ (a small
    dimension), dates/ (both tables keyed by a date)."""
    root = tmp_path_factory.mktemp("aligned")
    for name in ("orders", "lines", "shuffled", "dim", "dates_o", "dates_l"):
        (root / name).mkdir()
    keys = [k for k in range(2000) if k % 7 != 3]
    orders = pl.DataFrame(
        {
            "ok": [*keys, None, None],
            "cust": [k % 13 for k in keys] + [1, 2],
            "prio": [f"p{k % 5}" for k in keys] + ["pn", "pn"],
            "day": [datetime.date(2020, 1, 1) + datetime.timedelta(days=k // 3) for k in keys]
            + [None, None],
        },
        schema={"ok": pl.Int64, "cust": pl.Int64, "prio": pl.String, "day": pl.Date},
    )
    cuts = [0, 600, 600, 1300, orders.height]
    for f, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        orders[a:b].write_parquet(root / "orders" / f"o{f}.parquet", row_group_size=150)
    rows = []
    for k in range(2050):  # keys 2000..2049 have no order
        for j in range(1 + k % 4):
            x = float("nan") if (k + j) % 29 == 0 else (-0.0 if (k + j) % 17 == 0 else k * 0.25)
            rows.append((k, j, x, j * 10 + k % 3))
    rows += [(None, 9, 1.5, 7), (None, 8, -0.0, 3)]
    lines = pl.DataFrame(
        rows, schema={"lk": pl.Int64, "n": pl.Int64, "x": pl.Float64, "q": pl.Int64}, orient="row"
    )
    lcuts = [0, 1700, 3100, lines.height]
    for f, (a, b) in enumerate(zip(lcuts, lcuts[1:], strict=False)):
        lines[a:b].write_parquet(root / "lines" / f"l{f}.parquet", row_group_size=400)
    shuffled = lines.sample(fraction=1.0, shuffle=True, seed=7)
    shuffled.write_parquet(root / "shuffled" / "s.parquet", row_group_size=400)
    pl.DataFrame({"cust": list(range(13)), "seg": [f"s{i % 3}" for i in range(13)]}).write_parquet(
        root / "dim" / "d.parquet"
    )
    orders.select("day", "prio").drop_nulls().unique("day", keep="first").sort("day").write_parquet(
        root / "dates_o" / "o.parquet", row_group_size=60
    )
    orders.select("day", "ok").drop_nulls().write_parquet(
        root / "dates_l" / "l.parquet", row_group_size=200
    )
    return root


def _engine(runner: str = "local", **kw: object) -> shoal.DistEngine:
    kw.setdefault("small_query_bytes", 0)  # (these queries are small: one task else)
    kw.setdefault("target_partition_bytes", TARGET)
    config = shoal.Config(**kw)  # type: ignore[arg-type]
    return shoal.DistEngine(runner=runner, raise_on_fail=True, config=config)  # type: ignore[arg-type]


def _aligned_stages() -> list[str]:
    rep = last_query()
    assert rep is not None
    return [s.name for s in rep.physical.stages if "aligned-join" in s.name]


def _scan(root: Path, name: str) -> pl.LazyFrame:
    return pl.scan_parquet(root / name / "*.parquet")


def _queries(root: Path) -> dict[str, pl.LazyFrame]:
    orders, lines, dim = _scan(root, "orders"), _scan(root, "lines"), _scan(root, "dim")
    big = orders.filter(pl.col("prio") != "p1")
    return {
        "inner": lines.join(orders, left_on="lk", right_on="ok"),
        "inner-orders-left": orders.join(lines, left_on="ok", right_on="lk"),
        "left": lines.join(orders, left_on="lk", right_on="ok", how="left"),
        # (Each orders task may read at most a partition's bytes of the lines: two columns.)
        "left-orders": orders.join(
            lines.select("lk", "n"), left_on="ok", right_on="lk", how="left"
        ),
        "right": orders.join(lines, left_on="ok", right_on="lk", how="right"),
        "semi": orders.join(
            lines.filter(pl.col("q") > 20), left_on="ok", right_on="lk", how="semi"
        ),
        "anti": orders.join(
            lines.filter(pl.col("q") > 20), left_on="ok", right_on="lk", how="anti"
        ),
        "lines-semi": lines.join(big, left_on="lk", right_on="ok", how="semi"),
        "lines-anti": lines.join(big, left_on="lk", right_on="ok", how="anti"),
        "no-coalesce": lines.join(orders, left_on="lk", right_on="ok", coalesce=False),
        "two-keys": lines.with_columns(c=pl.col("lk") % 13).join(
            orders, left_on=["lk", "c"], right_on=["ok", "cust"]
        ),
        "with-dim": lines.join(
            orders.join(dim.filter(pl.col("seg") != "s1"), on="cust"), left_on="lk", right_on="ok"
        ),
        "pruned": lines.filter(pl.col("lk") > 1500).join(
            orders.filter(pl.col("ok") < 1700), left_on="lk", right_on="ok"
        ),
        "agg-by-key": lines.join(orders, left_on="lk", right_on="ok")
        .group_by("lk")
        .agg(pl.col("x").sum(), pl.len(), pl.col("prio").first()),
        "agg-other": lines.join(orders, left_on="lk", right_on="ok")
        .group_by("prio")
        .agg(pl.col("x").sum(), pl.col("q").max(), pl.len()),
        "zero-columns": lines.join(orders, left_on="lk", right_on="ok", how="semi").select(
            pl.len()
        ),
        "literals": lines.join(orders, left_on="lk", right_on="ok").select(
            pl.lit(1).alias("one"), pl.lit("a").alias("two"), pl.col("n")
        ),
        "dates": _scan(root, "dates_l").join(_scan(root, "dates_o"), on="day"),
        # The other side aggregated by the key (groups are whole in each range).
        "semi-agg": orders.join(
            lines.group_by("lk")
            .agg(pl.col("q").sum().alias("tq"), pl.col("x").max())
            .filter(pl.col("tq") > 40),
            left_on="ok",
            right_on="lk",
            how="semi",
        ),
        "inner-agg": orders.join(
            lines.group_by("lk").agg(pl.col("q").sum().alias("tq"), pl.len()),
            left_on="ok",
            right_on="lk",
        ),
    }


def _check(got: pl.DataFrame, want: pl.DataFrame) -> None:
    assert_frame_equal(got.sort(got.columns), want.sort(want.columns))


ALIGNED = [
    "inner",
    "inner-orders-left",
    "left",
    "left-orders",
    "right",
    "semi",
    "anti",
    "lines-semi",
    "lines-anti",
    "no-coalesce",
    "two-keys",
    "with-dim",
    "pruned",
    "agg-by-key",
    "agg-other",
    "zero-columns",
    "literals",
    "dates",
    "semi-agg",
    "inner-agg",
]


@pytest.mark.parametrize("name", ALIGNED)
def test_aligned_join_matches_native_polars(data: Path, name: str) -> None:
    q = _queries(data)[name]
    # A query reading a column or two needs smaller partitions to be cut into several.
    target = {"zero-columns": TARGET // 4, "dates": TARGET // 4, "literals": TARGET // 2}.get(
        name, TARGET
    )
    got = q.collect(engine=_engine(target_partition_bytes=target))
    assert _aligned_stages(), f"{name}: not planned as an aligned join"
    _check(got, q.collect())
    off = q.collect(engine=_engine(aligned_joins=False, target_partition_bytes=target))
    assert not _aligned_stages()
    _check(off, got)


def test_each_task_reads_only_the_row_groups_that_can_match(data: Path) -> None:
    """The kept side keeps its partitions; the other side's partition of each task is a
    strict part of its row groups, together not much more than all of them once."""
    q = _queries(data)["inner"]
    q.collect(engine=_engine())
    rep = last_query()
    assert rep is not None
    (stage,) = [s for s in rep.physical.stages if "aligned-join" in s.name]
    assert stage.num_tasks > 2
    assert stage.scan_partitions is not None
    orders_rows = []
    for entry in stage.scan_partitions:
        assert isinstance(entry, ScanSet)
        parts = [p for p in entry.parts if isinstance(p, ScanPartition)]
        assert all(entry.partitioned)  # both sides: a partition each
        orders_rows.append(min(p.rows for p in parts))
    total = pl.scan_parquet(data / "orders" / "*.parquet").select(pl.len()).collect().item()
    assert max(orders_rows) < total / 2
    assert sum(orders_rows) <= 1.5 * total


def test_aggregation_by_the_key_completes_in_the_join_stage(data: Path) -> None:
    """The lines' partitions hold disjoint key ranges: grouped by the key after the join,
    no exchange follows (one stage reads the join's output only to gather it)."""
    q = _queries(data)["agg-by-key"]
    got = q.collect(engine=_engine())
    _check(got, q.collect())
    rep = last_query()
    assert rep is not None
    assert not any("shuffle" in s.name or "partial-agg" in s.name for s in rep.physical.stages), [
        s.name for s in rep.physical.stages
    ]


@pytest.mark.parametrize(
    "name",
    ["unsorted", "nulls-equal", "ordered"],
)
def test_not_aligned_where_it_would_not_pay_or_not_be_exact(data: Path, name: str) -> None:
    orders, lines, shuffled = _scan(data, "orders"), _scan(data, "lines"), _scan(data, "shuffled")
    q = {
        # Every partition of the shuffled lines spans all keys: a broadcast in disguise.
        "unsorted": shuffled.join(orders, left_on="lk", right_on="ok"),
        "nulls-equal": lines.join(orders, left_on="lk", right_on="ok", nulls_equal=True),
        "ordered": lines.join(orders, left_on="lk", right_on="ok", maintain_order="left"),
    }[name]
    got = q.collect(engine=_engine())
    assert not _aligned_stages()
    if name == "ordered":
        assert_frame_equal(got, q.collect())
    else:
        _check(got, q.collect())


def test_aligned_join_on_ray(data: Path, ray_runner: None) -> None:
    q = _queries(data)["with-dim"]
    got = q.collect(engine=_engine("ray"))
    assert _aligned_stages()
    _check(got, q.collect())


def test_the_other_side_may_read_a_broadcast(data: Path) -> None:
    """A dimension too big to compute inside each task is broadcast to the orders side;
    the aligned join's tasks read that broadcast too."""
    orders, lines, dim = _scan(data, "orders"), _scan(data, "lines"), _scan(data, "dim")
    q = lines.join(
        orders.join(dim.filter(pl.col("seg") != "s0"), on="cust"), left_on="lk", right_on="ok"
    )
    got = q.collect(engine=_engine(broadcast_inline_bytes=0))
    rep = last_query()
    assert rep is not None
    (stage,) = [s for s in rep.physical.stages if "aligned-join" in s.name]
    assert any(spec.mode == "all" for spec in stage.inputs)
    _check(got, q.collect())


@pytest.mark.parametrize("how", ["semi", "anti", "left"])
def test_a_preserved_side_of_few_partitions_is_cut_finer(data: Path, how: str) -> None:
    """The orders (few partitions) must keep their rows where they are, but each of their
    tasks may read at most a partition's bytes of the lines: the orders scan is cut into
    more partitions for the join."""
    orders, lines = _scan(data, "orders"), _scan(data, "lines")
    small = orders.select("ok", "prio")
    q = small.join(lines.select("lk", "n"), left_on="ok", right_on="lk", how=how)  # type: ignore[arg-type]
    target = 24 * 1024
    plain = q.collect(engine=_engine(target_partition_bytes=target, aligned_joins=False))
    scans = last_query()
    assert scans is not None
    orders_tasks = min(s.num_tasks for s in scans.physical.stages if s.scan_partitions)
    got = q.collect(engine=_engine(target_partition_bytes=target))
    rep = last_query()
    assert rep is not None
    (stage,) = [s for s in rep.physical.stages if "aligned-join" in s.name]
    assert stage.num_tasks > orders_tasks
    _check(got, q.collect())
    _check(plain, got)
