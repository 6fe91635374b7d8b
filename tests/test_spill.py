"""A shuffle several times larger than the object store spills to disk and completes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

import shoal
from shoal.config import Config
from shoal.ir import Agg, Aggregate, Col, InMemorySource, NamedExpr, Scan, Schema
from shoal.ir.types import DataType

STORE_BYTES = 80 * 1024 * 1024


@pytest.fixture(scope="module")
def small_object_store() -> Iterator[Path]:
    import ray

    shoal.shutdown()
    if ray.is_initialized():  # pragma: no cover
        ray.shutdown()
    spill = Path(f"/tmp/shoal-spill-{os.getpid()}")
    shoal.set_config(
        num_cpus=2,
        ray_temp_dir=f"/tmp/shoal-ray-sp-{os.getpid()}",
        object_store_bytes=STORE_BYTES,
        spill_dir=str(spill),
    )
    try:
        yield spill
    finally:
        shoal.shutdown()
        shoal.set_config(num_cpus=None, ray_temp_dir=None, object_store_bytes=None, spill_dir=None)
        shutil.rmtree(spill, ignore_errors=True)


@pytest.mark.slow  # about 75 s on 2 cores: spilling through Ray's filesystem spill path
def test_shuffle_larger_than_the_object_store_spills_and_completes(
    small_object_store: Path,
) -> None:
    rows = 9_000_000  # 3 x 8-byte columns: ~216 MB, shuffled whole (n_unique is not split)
    i = pl.int_range(rows, eager=True)
    df = pl.DataFrame({"k": i * 7919 % 1000, "v": i % 977, "w": (i % 101).cast(pl.Float64)})
    assert df.estimated_size() > 2 * STORE_BYTES
    table = df.to_arrow()
    schema = Schema.from_arrow(table.schema)
    idx = DataType.from_polars(pl.get_index_type())
    plan = Aggregate(
        Scan(InMemorySource(table), schema),
        (NamedExpr("k", Col("k", schema["k"])),),
        (
            NamedExpr("nv", Agg("n_unique", Col("v", schema["v"]), idx)),
            NamedExpr("sw", Agg("sum", Col("w", schema["w"]), schema["w"])),
        ),
        False,
        Schema.of([("k", schema["k"]), ("nv", idx), ("sw", schema["w"])]),
    )
    expected = df.group_by("k").agg(
        pl.col("v").n_unique().alias("nv"), pl.col("w").sum().alias("sw")
    )
    del df, i
    from shoal.runners.session import last_query, profiling

    with profiling():  # the profile reads Ray's spill counters per stage
        got = pl.from_arrow(shoal.execute(plan, runner="ray", config=Config(default_partitions=24)))
    assert isinstance(got, pl.DataFrame)
    assert got.sort("k").equals(expected.sort("k"))
    spilled = [p for p in small_object_store.rglob("*") if p.is_file()]
    assert small_object_store.exists() and (spilled or _spilled_bytes() > 0)
    report = last_query()
    assert report is not None and report.spill is not None and not report.spill.unknown
    # This module's Ray instance ran only this query: the profile's total is Ray's own.
    assert report.spill.total[0] > 0
    assert report.spill.total[0] >> 20 == _spilled_bytes() >> 20
    assert sum(b for b, *_ in report.spill.by_stage.values()) <= report.spill.total[0]


def _spilled_bytes() -> int:
    """Bytes Ray reports spilled so far (0 when the stat is unavailable)."""
    try:
        import ray
        from ray._private.internal_api import memory_summary

        # This module's Ray instance (another one may run on the machine).
        text = memory_summary(ray.get_runtime_context().gcs_address, stats_only=True)
    except Exception:  # pragma: no cover
        return 0
    for line in text.splitlines():
        if "Spilled" in line and "MiB" in line:
            return int(float(line.split("Spilled")[1].split("MiB")[0].strip(" :")) * 2**20)
    return 0
