"""Join reassociation (:mod:`shoal.planner.reassociate`): ``(X ⋈ Y) ⋈ Z`` planned as
``X ⋈ (Y ⋈ Z)`` where Y and Z are scans stored in the order of the second join's key, so
that they meet in an aligned join. The same answers as native Polars on data with null
keys, duplicate keys on every side, NaN and -0.0, an empty file and keys without a match;
not taken where the rewrite would not be exact (clashing names, ordered joins, computed
keys) or would not align."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.ir.expr import Col
from shoal.ir.nodes import Join
from shoal.planner.reassociate import pushdowns
from shoal.runners.session import last_query
from shoal_polars.engine import to_ir

TARGET = 48 * 1024
#: No side broadcast (nor read whole inside the other side's tasks): the customer-orders
#: join shuffles both sides, as at TPC-H scale 10 where customer is too large to broadcast.
NO_BROADCAST = {"broadcast_join_threshold_bytes": 0, "broadcast_inline_bytes": 0}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cust/ (customers 0..3999 in random order, several partitions; a duplicate customer,
    a null key), orders/
    (keys 0..2999 sorted, every 11th missing, null keys and customers, 3 files and an empty
    one), lines/ (0-3 rows per order key, sorted, keys past the last order, null keys, NaN
    and -0.0 among the values)."""
    root = tmp_path_factory.mktemp("reassociate")
    for name in ("cust", "orders", "lines"):
        (root / name).mkdir()
    cust = pl.DataFrame(
        {
            "ck": [*range(4000), 7, None],
            "cname": [f"customer-{i:05d}" for i in range(4000)] + ["c7bis", "cnull"],
            "nat": [i % 5 for i in range(4002)],
        },
        schema={"ck": pl.Int64, "cname": pl.String, "nat": pl.Int64},
    ).sample(fraction=1.0, shuffle=True, seed=3)
    cust.write_parquet(root / "cust" / "c.parquet", row_group_size=500)
    keys = [k for k in range(3000) if k % 11 != 5]
    orders = pl.DataFrame(
        {
            "ok": [*keys, None, None],
            "ocust": [None if k % 97 == 0 else k % 61 for k in keys] + [3, 4],
            "prio": [k % 4 for k in keys] + [0, 1],
        },
        schema={"ok": pl.Int64, "ocust": pl.Int64, "prio": pl.Int64},
    )
    cuts = [0, 900, 900, 2000, orders.height]
    for f, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        orders[a:b].write_parquet(root / "orders" / f"o{f}.parquet", row_group_size=200)
    rows = []
    for k in range(3050):
        for j in range(k % 4):
            x = float("nan") if (k + j) % 31 == 0 else (-0.0 if (k + j) % 19 == 0 else k * 0.5)
            rows.append((k, x, j, f"customer-{(k * 7 + j) % 4100:05d}"))
    rows += [(None, 1.0, 0, None), (None, -0.0, 1, "customer-00007")]
    lines = pl.DataFrame(
        rows,
        schema={"lk": pl.Int64, "x": pl.Float64, "n": pl.Int64, "tag": pl.String},
        orient="row",
    )
    lcuts = [0, 2500, lines.height]
    for f, (a, b) in enumerate(zip(lcuts, lcuts[1:], strict=False)):
        lines[a:b].write_parquet(root / "lines" / f"l{f}.parquet", row_group_size=500)
    return root


def _engine(**kw: object) -> shoal.DistEngine:
    kw.setdefault("small_query_bytes", 0)
    kw.setdefault("target_partition_bytes", TARGET)
    return shoal.DistEngine(runner="local", raise_on_fail=True, config=shoal.Config(**kw))  # type: ignore[arg-type]


def _stage_names() -> list[str]:
    report = last_query()
    assert report is not None
    return [s.name for s in report.physical.stages]


def _scans(root: Path) -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame]:
    return (
        pl.scan_parquet(root / "cust" / "*.parquet"),
        pl.scan_parquet(root / "orders" / "*.parquet"),
        pl.scan_parquet(root / "lines" / "*.parquet"),
    )


def _check(lf: pl.LazyFrame, **kw: object) -> list[str]:
    want = lf.collect()
    got = lf.collect(engine=_engine(**kw))
    assert_frame_equal(got, want, check_row_order=False)
    return _stage_names()


def test_orders_lines_join_first(data: Path) -> None:
    cust, orders, lines = _scans(data)
    q = cust.join(orders, left_on="ck", right_on="ocust").join(lines, left_on="ok", right_on="lk")
    _check(q)  # as the planner chooses
    # Customers too large to broadcast (TPC-H Q10 at scale 10): the customer-orders join
    # shuffles both, so the lines join moves below it.
    names = _check(q, **NO_BROADCAST)
    assert any("reordered" in n and "aligned-join" in n for n in names), names
    # With the aggregation of TPC-H Q10 above it, and filters on both scans.
    q10 = (
        cust.join(orders.filter(pl.col("prio") < 3), left_on="ck", right_on="ocust")
        .join(lines.filter(pl.col("n") != 1), left_on="ok", right_on="lk")
        .group_by("ck", "cname")
        .agg(pl.col("x").sum(), pl.len())
    )
    names = _check(q10, **NO_BROADCAST)
    assert any("reordered" in n for n in names), names


def test_nulls_equal_and_uncoalesced_keys(data: Path) -> None:
    cust, orders, lines = _scans(data)
    q = cust.join(orders, left_on="ck", right_on="ocust", nulls_equal=True).join(
        lines, left_on="ok", right_on="lk", coalesce=False
    )
    assert any("reordered" in n for n in _check(q, **NO_BROADCAST))
    q = cust.join(orders, left_on="ck", right_on="ocust", coalesce=False).join(
        lines, left_on="ok", right_on="lk", nulls_equal=True
    )
    # A null-equal join is never aligned: planned as written, the same answer.
    assert not any("reordered" in n for n in _check(q, **NO_BROADCAST))


def test_empty_and_literal_results(data: Path) -> None:
    cust, orders, lines = _scans(data)
    empty = cust.join(orders.filter(pl.col("ok") < 0), left_on="ck", right_on="ocust").join(
        lines, left_on="ok", right_on="lk"
    )
    _check(empty)
    counted = (
        cust.join(orders, left_on="ck", right_on="ocust")
        .join(lines, left_on="ok", right_on="lk")
        .select(pl.len(), pl.lit("k").alias("lit"))
    )
    _check(counted)


@pytest.mark.parametrize("case", ["clash", "ordered", "computed"])
def test_not_reassociated(data: Path, case: str) -> None:
    cust, orders, lines = _scans(data)
    if case == "clash":  # "n" on two sides: a suffix placed by the first join
        q = (
            cust.with_columns(n=pl.col("nat"))
            .join(orders, left_on="ck", right_on="ocust")
            .join(lines, left_on="ok", right_on="lk")
        )
    elif case == "ordered":  # (Polars drops the second join's order over an unordered one)
        q = cust.join(orders, left_on="ck", right_on="ocust", maintain_order="left").join(
            lines, left_on="ok", right_on="lk", maintain_order="left"
        )
    else:
        q = cust.join(orders, left_on="ck", right_on="ocust").join(
            lines, left_on=pl.col("ok") + 0, right_on="lk"
        )
    names = _check(q, **NO_BROADCAST)
    assert not any("reordered" in n for n in names), names


def test_moved_below_a_hash_join(data: Path) -> None:
    """The orders join moved below a hash join (a string key, no broadcasts) to meet lines
    in an aligned join; an aggregation and a sort above. And a key of the first join's
    left side: moved into that side (customers' ``nat`` against lines' keys 0-4)."""
    cust, orders, lines = _scans(data)
    x_key = cust.join(orders, left_on="ck", right_on="ocust").join(
        lines, left_on="nat", right_on="lk"
    )
    _check(x_key, **NO_BROADCAST)
    q = (
        lines.join(cust, left_on="tag", right_on="cname")
        .join(orders.filter(pl.col("prio") != 2), left_on="lk", right_on="ok")
        .group_by("nat", "prio")
        .agg(pl.col("x").sum(), pl.col("ocust").n_unique())
        .sort("nat", "prio")
    )
    names = _check(q, **NO_BROADCAST)
    assert any("aligned-join+reordered" in n for n in names), names
    assert any("hash-join" in n for n in names), names


def test_pushdowns_schema(data: Path) -> None:
    cust, orders, lines = _scans(data)
    q = cust.join(orders, left_on="ck", right_on="ocust").join(lines, left_on="ok", right_on="lk")
    plan = to_ir(q)
    while not isinstance(plan, Join):
        (plan,) = plan.children()
    moves = pushdowns(plan)
    assert len(moves) == 1  # into the orders side (the customer side lacks the key)
    inner, rewritten = moves[0]
    assert rewritten.schema == plan.schema
    assert inner.schema.names == ("ok", "ocust", "prio", "x", "n", "tag")
    assert isinstance(rewritten, Join)
    assert [k.name for k in rewritten.right_on if isinstance(k, Col)] == ["ocust"]
    # Not when the join is not an inner join.
    assert pushdowns(Join(**{**plan.__dict__, "how": "left"})) == []
