"""Results into Ray Data and Arrow streams, on the Ray runner (one Ray instance for the
module): ``shoal.to_ray_dataset``, ``lf.execute(engine=...)`` results,
``shoal.execute_batches`` as a ``RecordBatchReader`` read by DuckDB and Polars, and a
DuckDB relation's ``to_ray_dataset``. Each is compared with the native engine's answer."""

from __future__ import annotations

from typing import Any

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import shoal

pytest.importorskip("ray.data")

CONFIG = shoal.Config(default_partitions=3, shuffle_partitions=3)


def _frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "k": [1, 2, 2, None, 3, 1, 4, 2, 5, 5, 6, 7],
            "v": [1.5, float("nan"), 2.0, None, -0.0, 2.0, 7.0, -3.0, 0.25, 1e10, 3.0, 3.0],
            "s": ["a", "b", None, "d", "e", "a", "g", "b", "", "z", "y", "x"],
        }
    )


def _query() -> pl.LazyFrame:
    return _frame().lazy().filter(pl.col("k") > 1).sort("v", "s", nulls_last=True)


def _dataset_frame(ds: Any) -> pl.DataFrame:
    """A Ray dataset's rows in block order, as one Polars frame."""
    import ray

    tables = ray.get(ds.to_arrow_refs())
    out = pl.from_arrow(pa.concat_tables(tables))
    assert isinstance(out, pl.DataFrame)
    return out


@pytest.fixture
def no_driver_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails any fetch of result tables to the driver by the Ray runner."""
    from shoal.runners.ray_runner import RayBackend

    def refuse(self: Any, refs: Any) -> Any:
        raise AssertionError("the result passed through the driver")

    monkeypatch.setattr(RayBackend, "fetch", refuse)


def test_to_ray_dataset_reads_the_object_store(ray_runner: None, no_driver_fetch: None) -> None:
    lf = _query()
    ds = shoal.to_ray_dataset(lf, runner="ray", config=CONFIG)
    assert ds.count() == lf.collect(engine="in-memory").height
    native = lf.collect(engine="in-memory")
    got = _dataset_frame(ds)
    assert_frame_equal(got, native)  # sorted: the blocks keep the partitions' order


def test_to_ray_dataset_of_an_ir_plan_and_an_empty_result(ray_runner: None) -> None:
    empty = _frame().lazy().filter(pl.col("k") > 100)
    ds = shoal.to_ray_dataset(empty, runner="ray", config=CONFIG)
    assert ds.count() == 0
    assert ds.schema().names == ["k", "v", "s"]


def test_execute_result_stays_in_the_object_store_until_read(ray_runner: None) -> None:
    lf = _query()
    native = lf.collect(engine="in-memory")
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=CONFIG)
    result = lf.execute(engine=engine)
    assert result.n_rows_total == native.height
    assert_frame_equal(result.head, native.head())
    assert_frame_equal(result.lazy().collect(), native)
    assert_frame_equal(_dataset_frame(result.to_ray_dataset()), native)
    assert_frame_equal(pl.DataFrame(result), native)


def test_execute_batches_is_a_reader_for_duckdb_and_polars(ray_runner: None) -> None:
    plan = shoal.ir.Scan(
        shoal.ir.InMemorySource(_frame().to_arrow()),
        shoal.ir.Schema.from_arrow(_frame().to_arrow().schema),
    )
    reader = shoal.execute_batches(plan, runner="ray", config=CONFIG)
    assert isinstance(reader, pa.RecordBatchReader)
    native = _frame().to_arrow()  # noqa: F841 - read by DuckDB by name
    query = (
        "SELECT count(*), count(k), sum(k), count(v), min(v), string_agg(s, '|' ORDER BY s) FROM {}"
    )
    assert (
        duckdb.sql(query.format("reader")).fetchall()
        == duckdb.sql(query.format("native")).fetchall()
    )
    got = pl.DataFrame(shoal.execute_batches(plan, runner="ray", config=CONFIG))
    assert_frame_equal(got, _frame())


def test_duckdb_relation_to_ray_dataset(ray_runner: None) -> None:
    con = duckdb.connect()
    con.register("f", _frame().to_arrow())
    query = "SELECT k, sum(v) AS total, count(*) AS n FROM f GROUP BY k ORDER BY k NULLS FIRST"
    rel = shoal.duckdb.sql(query, connection=con, runner="ray", raise_on_fail=True, config=CONFIG)
    got = _dataset_frame(rel.to_ray_dataset())
    assert_frame_equal(got, con.sql(query).pl(), check_dtypes=False)
    assert repr(rel.fetchall()) == repr(con.sql(query).fetchall())  # the same result, read again


def test_local_runner_results_go_to_ray_data_too(ray_runner: None) -> None:
    lf = _query()
    ds = shoal.to_ray_dataset(lf, runner="local", config=CONFIG)
    assert_frame_equal(_dataset_frame(ds), lf.collect(engine="in-memory"))
