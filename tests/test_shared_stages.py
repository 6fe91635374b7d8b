"""A shared sub-plan that one stage reads partition by partition runs in that stage
(:mod:`shoal.planner.shared`), and the lowering computes a node object used twice once.

Answers are checked against native Polars on Parquet files stored in key order (so that
the two uses of the shared sub-plan join in place), cut into several partitions, with
null keys, duplicates, NaN, -0.0 and an empty file; with the setting on and off.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from shoal.config import Config
from shoal.ir.expr import Col
from shoal.ir.nodes import InMemorySource, Join, Scan
from shoal.ir.types import Schema
from shoal.lowering.plan import lower_plan
from shoal.planner.physical import PhysicalPlan, plan_physical
from shoal_polars.engine import to_ir

from .conftest import collect_as_native

#: Several partitions per scan, the distributed path, the small side broadcast.
CFG = {
    "target_partition_bytes": 2000,
    "small_query_bytes": 0,
    "broadcast_join_threshold_bytes": 4000,
    "broadcast_inline_bytes": 0,
}

#: A small dimension (a null key and a duplicated one).
DIM = pl.DataFrame(
    {"sk": pl.Series([0, 1, 2, 2, None], dtype=pl.Int64), "name": ["a", "b", "c", "c2", "n"]}
)


def _facts(root: Path) -> pl.LazyFrame:
    """Facts in ``k`` order over five files (one empty), 24 rows per row group: null keys
    first, each key three times, values with ties, NaN and -0.0."""
    root.mkdir(parents=True, exist_ok=True)
    bounds = [(0, 20), (20, 20), (20, 45), (45, 70), (70, 90)]
    for i, (lo, hi) in enumerate(bounds):
        keys: list[int | None] = ([None] * 3 if i == 0 else []) + [
            k for k in range(lo, hi) for _ in range(3)
        ]
        n = len(keys)
        values = [float((j * 7) % 4) for j in range(n)]
        for j in range(0, n, 11):
            values[j] = float("nan") if j % 2 else -0.0
        df = pl.DataFrame(
            {
                "k": pl.Series(keys, dtype=pl.Int64),
                "s": pl.Series([j % 5 for j in range(n)], dtype=pl.Int64),
                "v": values,
            }
        )
        pq.write_table(df.to_arrow(), root / f"part-{i:02d}.parquet", row_group_size=24)
    return pl.scan_parquet(sorted(root.glob("*.parquet")))


def _q2_shape(facts: pl.LazyFrame) -> pl.LazyFrame:
    """TPC-H Q2's shape: the facts joined with the dimension, used twice (Polars caches
    it): the rows whose value is the minimum of their key."""
    shared = DIM.lazy().join(facts, left_on="sk", right_on="s")
    low = shared.group_by("k").agg(pl.col("v").min().alias("low"))
    return shared.join(low, on="k").filter(pl.col("v") == pl.col("low")).select("name", "k", "v")


def _plan(q: pl.LazyFrame, **kw: object) -> PhysicalPlan:
    return plan_physical(to_ir(q), Config(**{**CFG, **kw}), 2)  # type: ignore[arg-type]


def test_a_shared_stage_read_by_one_stage_runs_in_it(tmp_path: Path) -> None:
    """Both uses of the shared sub-plan end up in one stage: that stage scans the facts
    itself (no stage of its own for the shared part, nothing held in between); the same
    answer as native Polars, with the setting on and off."""
    q = _q2_shape(_facts(tmp_path / "facts"))
    on, off = _plan(q), _plan(q, inline_shared_stages=False)
    assert any("cache" in s.name for s in off.stages), off.explain()
    assert not any("cache" in s.name for s in on.stages), on.explain()
    assert len(on.stages) == len(off.stages) - 1
    scans = [s for s in on.stages if s.scan_partitions is not None]
    assert any("join-in-place" in s.name for s in scans), on.explain()
    for st in on.stages:  # ids are list positions, every input an earlier stage
        assert on.stage(st.id) is st
        assert all(spec.stage < st.id for spec in st.inputs)
    collect_as_native(q, **CFG)
    collect_as_native(q, **{**CFG, "inline_shared_stages": False})


def test_a_shared_scan_without_a_join_keeps_its_stage(tmp_path: Path) -> None:
    """The same shape over the facts alone (filtered, a column added): no join to save,
    and each use's filters would be pushed into a scan of its own, so the shared part
    stays a stage of its own; the same answer as native Polars."""
    facts = _facts(tmp_path / "facts")
    shared = facts.filter(pl.col("s") != 3).with_columns(w=pl.col("v") * 2)
    low = shared.group_by("k").agg(pl.col("v").min().alias("low"))
    q = shared.join(low, on="k").filter(pl.col("v") == pl.col("low")).select("k", "v", "w")
    plan = _plan(q)
    assert any("cache" in s.name for s in plan.stages), plan.explain()
    collect_as_native(q, **CFG)


def test_a_shared_stage_read_by_two_stages_keeps_its_stage(tmp_path: Path) -> None:
    """TPC-H Q17's shape: the shared sub-plan is read by an aggregation that shuffles and
    by a join in another stage; it stays a stage of its own, computed once."""
    facts = _facts(tmp_path / "facts")
    shared = DIM.lazy().join(facts, left_on="sk", right_on="s")
    avg = shared.group_by("name").agg(a=pl.col("v").mean())
    q = shared.join(avg, on="name").filter(pl.col("v") < pl.col("a")).select("k", "v", "name")
    plan = _plan(q)
    assert any("cache" in s.name for s in plan.stages), plan.explain()
    collect_as_native(q, **CFG)


def test_the_ray_runner_runs_the_fused_stage(tmp_path: Path, ray_runner: None) -> None:
    """The fused fragment travels to Ray workers and gives native Polars' answer there."""
    q = _q2_shape(_facts(tmp_path / "facts"))
    collect_as_native(q, "ray", **CFG)


def test_a_shared_join_is_computed_once() -> None:
    """The lowering computes a node object reached twice that holds a join (a join of a
    scan with a dimension, joined with itself) once: the scan's rows are produced once,
    and the answer is Polars'."""
    df = pl.DataFrame({"k": [1, 2, 2, None], "v": [1.0, float("nan"), -0.0, 3.0]})
    dim = pl.DataFrame({"k": [2, 1, None], "d": ["b", "a", "n"]})
    schema, dim_schema = Schema.from_polars(df.schema), Schema.from_polars(dim.schema)
    facts = Scan(InMemorySource(df.to_arrow()), schema)
    dims = Scan(InMemorySource(dim.to_arrow()), dim_schema)
    key = (Col("k", schema["k"]),)
    joined = df.join(dim, on="k")
    shared = Join(
        facts, dims, key, key, "inner", "_right", False, True,
        Schema.from_polars(joined.schema),
    )  # fmt: skip
    both = joined.join(joined, on="k")
    node = Join(
        shared, shared, key, key, "inner", "_right", False, True,
        Schema.from_polars(both.schema),
    )  # fmt: skip
    produced: list[int] = []

    def count(frame: pl.DataFrame) -> pl.DataFrame:
        produced.append(frame.height)
        return frame

    def scan(n: Scan) -> pl.LazyFrame:
        if n is dims:
            return dim.lazy()
        return df.lazy().map_batches(count, schema=df.schema)

    got = lower_plan(node, [], scan).collect(engine="in-memory")
    assert produced == [df.height]
    order = ["k", "v", "d", "v_right", "d_right"]
    assert got.sort(order).equals(both.sort(order))
