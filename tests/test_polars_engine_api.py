"""Polars' whole Engine API on shoal: ``collect_batches``, ``collect_async``,
``collect_all(_async)``, ``execute``, ``sink_csv``/``sink_ipc``/``sink_ndjson``, keyword
settings on ``DistEngine``, the fallback warning's classes and ``POLARS_VERBOSE``.

Each call is compared with the same call on Polars' own engine, on data split into three
partitions with nulls, NaN, -0.0 and duplicates; each checks that the query ran on shoal
(a new ``last_query()``) and warned nothing.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.runners.session import last_query

ENGINE = shoal.DistEngine(
    runner="local", raise_on_fail=True, default_partitions=3, shuffle_partitions=3
)


def _data() -> pl.LazyFrame:
    return pl.LazyFrame(
        {
            "k": [1, 2, 2, None, 3, 1, 4, 2, 5, 5],
            "v": [1.5, float("nan"), 2.0, None, -0.0, 2.0, 7.0, -3.0, 0.25, 1e10],
            "s": ["a", "b", None, "d", "e,f", "a", 'g"h', "b", "", "z"],
        }
    )


def _queries() -> dict[str, pl.LazyFrame]:
    lf = _data()
    return {
        "group_by": lf.group_by("k").agg(pl.col("v").sum(), pl.len()).sort("k"),
        "filter": lf.filter(pl.col("k") > 1).with_row_index(),
        "sort": lf.sort("v", "s", nulls_last=True),
    }


def _on_shoal(call: Any) -> Any:
    """``call()``, checking that it ran a shoal query and warned nothing."""
    before = last_query()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = call()
    assert last_query() is not before, "did not run on shoal"
    return out


def _unsupported() -> pl.LazyFrame:
    return _data().map_batches(lambda df: df.with_columns(pl.col("k") * 2)).sort("k")


@pytest.mark.parametrize("name", list(_queries()))
def test_collect_batches_streams_the_result_in_order(name: str) -> None:
    lf = _queries()[name]
    expected = lf.collect(engine="in-memory")
    batches = _on_shoal(lambda: list(lf.collect_batches(engine=ENGINE)))
    assert len(batches) > 1 or expected.height <= 1
    assert_frame_equal(pl.concat(batches), expected)
    chunked = _on_shoal(lambda: list(lf.collect_batches(engine=ENGINE, chunk_size=3)))
    assert [b.height for b in chunked[:-1]] == [3] * (len(chunked) - 1)
    assert_frame_equal(pl.concat(chunked), expected)


def test_collect_batches_is_an_arrow_stream_and_falls_back_with_a_warning() -> None:
    lf = _queries()["sort"]
    got = _on_shoal(lambda: pl.DataFrame(lf.collect_batches(engine=ENGINE)))
    assert_frame_equal(got, lf.collect(engine="in-memory"))
    fallback = shoal.DistEngine(runner="local", default_partitions=3)
    with pytest.warns(pl.exceptions.PerformanceWarning, match="collect_batches falls back"):
        batches = list(_unsupported().collect_batches(engine=fallback))
    assert_frame_equal(pl.concat(batches), _unsupported().collect(engine="in-memory"))


def test_collect_async_and_collect_all_async_run_on_shoal() -> None:
    queries = _queries()

    async def one() -> pl.DataFrame:
        return await queries["group_by"].collect_async(engine=ENGINE)

    got = _on_shoal(lambda: asyncio.run(one()))
    assert_frame_equal(got, queries["group_by"].collect(engine="in-memory"))

    async def every() -> list[pl.DataFrame]:
        return await pl.collect_all_async(list(queries.values()), engine=ENGINE)

    frames = _on_shoal(lambda: asyncio.run(every()))
    for df, lf in zip(frames, queries.values(), strict=True):
        assert_frame_equal(df, lf.collect(engine="in-memory"))


def test_collect_async_raises_the_querys_error() -> None:
    lf = _data().select(pl.col("s").cast(pl.Int64, strict=True))

    async def run() -> pl.DataFrame:
        return await lf.collect_async(engine=ENGINE)

    with pytest.raises(pl.exceptions.InvalidOperationError):
        asyncio.run(run())


def test_collect_all_runs_each_on_shoal_and_falls_back_one_by_one() -> None:
    queries = list(_queries().values())
    frames = _on_shoal(lambda: pl.collect_all(queries, engine=ENGINE))
    for df, lf in zip(frames, queries, strict=True):
        assert_frame_equal(df, lf.collect(engine="in-memory"))
    mixed = [queries[0], _unsupported()]
    engine = shoal.DistEngine(runner="local", default_partitions=3)
    with pytest.warns(shoal.ShoalFallbackWarning):
        got = pl.collect_all(mixed, engine=engine)
    assert_frame_equal(got[1], _unsupported().collect(engine="in-memory"))


def test_execute_leaves_the_result_until_read() -> None:
    lf = _queries()["sort"]
    expected = lf.collect(engine="in-memory")
    result = _on_shoal(lambda: lf.execute(engine=ENGINE))
    assert result.n_rows_total == expected.height
    assert_frame_equal(result.head, expected.head())
    assert_frame_equal(result.lazy().collect(), expected)
    pushed = result.lazy().filter(pl.col("k") > 1).select("s", "k").head(3)
    assert_frame_equal(pushed.collect(), expected.filter(pl.col("k") > 1).select("s", "k").head(3))
    assert_frame_equal(result.collect(), expected)
    assert_frame_equal(pl.DataFrame(result), expected)
    assert "QueryResult" in repr(result)


def test_execute_falls_back_to_polars_query_result() -> None:
    engine = shoal.DistEngine(runner="local", default_partitions=3)
    with pytest.warns(shoal.ShoalFallbackWarning, match="execute falls back"):
        result = _unsupported().execute(engine=engine)
    assert_frame_equal(result.lazy().collect(), _unsupported().collect(engine="in-memory"))


# -- sinks -------------------------------------------------------------------------------

CSV_OPTIONS: dict[str, Any] = {
    "separator": ";",
    "null_value": "NA",
    "float_precision": 3,
    "quote_style": "always",
    "include_header": True,
}


@pytest.mark.parametrize(
    ("fmt", "options"),
    [
        ("csv", {}),
        ("csv", CSV_OPTIONS),
        ("ndjson", {}),
        ("ipc", {}),
        ("ipc", {"compression": "zstd"}),
    ],
    ids=["csv", "csv-options", "ndjson", "ipc", "ipc-zstd"],
)
def test_sink_file_is_byte_for_byte_polars(
    fmt: str, options: dict[str, Any], tmp_path: Path
) -> None:
    lf = _queries()["sort"]
    native, ours = tmp_path / f"native.{fmt}", tmp_path / f"shoal.{fmt}"
    getattr(lf, f"sink_{fmt}")(native, engine="streaming", **options)
    _on_shoal(lambda: getattr(lf, f"sink_{fmt}")(ours, engine=ENGINE, **options))
    if fmt == "ipc":  # IPC files carry no bytes that depend on the writer's chunking
        assert_frame_equal(pl.read_ipc(ours), pl.read_ipc(native))
    else:
        assert ours.read_bytes() == native.read_bytes()


@pytest.mark.parametrize("fmt", ["csv", "ipc", "ndjson"])
def test_partitioned_sinks_write_polars_layouts(fmt: str, tmp_path: Path) -> None:
    lf = _queries()["sort"]
    read = {"csv": pl.scan_csv, "ipc": pl.scan_ipc, "ndjson": pl.scan_ndjson}[fmt]
    for name, target in [
        ("split", lambda base: pl.PartitionBy(base, max_rows_per_file=4)),
        ("hive", lambda base: pl.PartitionBy(base, key="k")),
    ]:
        native, ours = tmp_path / f"native-{name}", tmp_path / f"shoal-{name}"
        getattr(lf, f"sink_{fmt}")(target(native), engine="streaming")
        sink = getattr(lf, f"sink_{fmt}")
        mine = target(ours)
        _on_shoal(lambda: sink(mine, engine=ENGINE))  # noqa: B023

        def files(root: Path) -> list[str]:
            return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

        if name == "hive":  # one file per key: the same files with the same rows
            assert files(ours) == files(native)
            for rel in files(native):
                got = read(ours / rel).collect()
                assert_frame_equal(got, read(native / rel).collect(), check_dtypes=fmt == "ipc")
            continue
        # split: each task cuts its own rows into files of at most 4 rows (the boundaries
        # differ from Polars'); in name order the files hold Polars' rows in order.
        ours_files = files(ours)
        assert ours_files == [
            f"{i:08x}.{Path(files(native)[0]).suffix[1:]}" for i in range(len(ours_files))
        ]
        parts = [read(ours / rel).collect() for rel in ours_files]
        assert all(0 < p.height <= 4 for p in parts)
        natives = pl.concat([read(native / rel).collect() for rel in files(native)])
        assert_frame_equal(pl.concat(parts), natives, check_dtypes=fmt == "ipc")


def test_sink_ipc_reports_its_files_and_unsupported_targets_fall_back(tmp_path: Path) -> None:
    lf = _queries()["sort"]
    seen: list[Any] = []
    _on_shoal(
        lambda: lf.sink_ipc(
            pl.PartitionBy(tmp_path / "out", max_rows_per_file=4),
            engine=ENGINE,
            sinked_paths_callback=lambda args: seen.extend(args.paths),
        )
    )
    assert sum(p.num_rows for p in seen) == 10
    assert sorted(os.path.basename(p.path) for p in seen) == [f"0000000{i}.ipc" for i in range(3)]
    engine = shoal.DistEngine(runner="local", default_partitions=3)
    with pytest.warns(pl.exceptions.PerformanceWarning, match="sink_csv falls back"):
        lf.sink_csv(tmp_path / "x.csv", engine=engine, credential_provider=lambda: ({}, None))
    assert_frame_equal(pl.read_csv(tmp_path / "x.csv"), pl.read_csv(_csv_native(lf, tmp_path)))


def _csv_native(lf: pl.LazyFrame, tmp_path: Path) -> Path:
    path = tmp_path / "native.csv"
    lf.sink_csv(path, engine="streaming")
    return path


# -- DistEngine settings as keywords ---------------------------------------------------------


def test_engine_keywords_are_settings() -> None:
    engine = shoal.DistEngine(runner="local", default_partitions=4, shuffle_partitions=2)
    lf = _queries()["group_by"]
    _on_shoal(lambda: lf.collect(engine=engine))
    report = last_query()
    assert report is not None
    assert max(st.num_tasks for st in report.physical.stages) == 4
    assert "default_partitions=4" in repr(engine)
    base = shoal.Config(shuffle_partitions=5, raise_on_fail=True)
    both = shoal.DistEngine(runner="local", config=base, default_partitions=2)
    assert both._config() == base.replace(default_partitions=2)


def test_engine_refuses_unknown_or_bad_settings() -> None:
    with pytest.raises(TypeError, match="'default_partitons'.*did you mean 'default_partitions'"):
        shoal.DistEngine(default_partitons=3)
    with pytest.raises(ValueError, match="default_partitions"):
        shoal.DistEngine(default_partitions=-1)
    with pytest.raises(ValueError, match="raise_on_fail"):
        shoal.DistEngine(raise_on_fail="no")  # type: ignore[arg-type]


# -- warnings ------------------------------------------------------------------------------


def test_fallback_warning_classes() -> None:
    from shoal_duckdb import DuckDBFallbackWarning
    from shoal_polars import PolarsFallbackWarning, ShoalFallbackWarning

    assert ShoalFallbackWarning is PolarsFallbackWarning  # the name it had before
    assert issubclass(PolarsFallbackWarning, pl.exceptions.PerformanceWarning)
    assert issubclass(PolarsFallbackWarning, shoal.ShoalFallbackWarning)
    assert issubclass(DuckDBFallbackWarning, shoal.ShoalFallbackWarning)
    assert issubclass(shoal.ShoalFallbackWarning, shoal.ShoalWarning)
    engine = shoal.DistEngine(runner="local")
    with pytest.warns(pl.exceptions.PerformanceWarning, match="falling back"):
        _unsupported().collect(engine=engine)


def test_polars_verbose_says_what_ran_and_why_it_fell_back(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    engine = shoal.DistEngine(runner="local", default_partitions=3)
    _queries()["group_by"].collect(engine=engine)
    assert "shoal" not in capfd.readouterr().err
    monkeypatch.setenv("POLARS_VERBOSE", "1")
    _queries()["group_by"].collect(engine=engine)
    err = capfd.readouterr().err
    assert "shoal: the query ran with shoal on the local runner" in err
    with pytest.warns(shoal.ShoalFallbackWarning):
        _unsupported().collect(engine=engine)
    err = capfd.readouterr().err
    assert "shoal: falling back to Polars' streaming engine" in err
    assert "map" in err.lower()


def test_record_batch_reader_from_execute_batches_is_read_by_duckdb_and_polars() -> None:
    import duckdb

    plan = shoal.ir.Scan(
        shoal.ir.InMemorySource(_data().collect().to_arrow()),
        shoal.ir.Schema.from_arrow(_data().collect().to_arrow().schema),
    )
    config = shoal.Config(default_partitions=3)
    reader = shoal.execute_batches(plan, runner="local", config=config)
    assert isinstance(reader, pa.RecordBatchReader)
    native = _data().collect().to_arrow()  # noqa: F841 - read by DuckDB by name
    query = (
        "SELECT count(*), count(k), sum(k), count(v), min(v), string_agg(s, '|' ORDER BY s) FROM {}"
    )
    got = duckdb.sql(query.format("reader")).fetchall()
    assert got == duckdb.sql(query.format("native")).fetchall()
    frame = pl.DataFrame(shoal.execute_batches(plan, runner="local", config=config))
    assert_frame_equal(frame, _data().collect())


def test_engine_affinity_sends_the_whole_engine_api_to_shoal(tmp_path: Path) -> None:
    """Under ``pl.Config.set_engine_affinity(DistEngine(...))`` the calls without an
    engine run on shoal too."""
    lf = _queries()["sort"]
    expected = lf.collect(engine="in-memory")
    pl.Config.set_engine_affinity(ENGINE)
    try:
        assert_frame_equal(_on_shoal(lambda: pl.concat(list(lf.collect_batches()))), expected)
        assert_frame_equal(_on_shoal(lambda: lf.execute().lazy().collect()), expected)
        assert_frame_equal(_on_shoal(lambda: pl.collect_all([lf])[0]), expected)
        _on_shoal(lambda: lf.sink_ndjson(tmp_path / "a.jsonl"))
    finally:
        pl.Config.set_engine_affinity(None)
    lf.sink_ndjson(tmp_path / "native.jsonl", engine="streaming")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "native.jsonl").read_bytes()


def test_collect_batches_starts_at_once_unless_lazy_and_stops_when_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``lazy=False`` (Polars' default) starts the query in the background at once;
    ``lazy=True`` waits for the first request; closing or dropping the iterator early
    stops the query (its dispatch loop closes) and reports nothing."""
    import gc
    import threading

    from shoal.runners.dispatch import DispatchLoop

    lf = _queries()["sort"]
    expected = lf.collect(engine="in-memory")
    started = threading.Event()
    real_stream = DispatchLoop.stream

    def stream(self: DispatchLoop) -> Any:
        started.set()
        return (yield from real_stream(self))

    monkeypatch.setattr(DispatchLoop, "stream", stream)
    lazy = lf.collect_batches(engine=ENGINE, lazy=True)
    assert not started.is_set()
    assert_frame_equal(pl.concat(list(lazy)), expected)
    started.clear()
    eager = lf.collect_batches(engine=ENGINE)
    assert started.wait(60), "the query did not start before the first request"
    assert_frame_equal(pl.concat(list(eager)), expected)

    stopped: list[bool] = []
    real_close = DispatchLoop.close_pools

    def close_pools(self: DispatchLoop) -> None:
        stopped.append(True)
        real_close(self)

    monkeypatch.setattr(DispatchLoop, "close_pools", close_pools)
    # A query of 8 result partitions (no exchange, no single-task path): the background
    # thread runs at most 3 partitions ahead of the caller (2 queued, 1 waiting to be), so
    # after one ``next`` the query cannot have reached its end when it is closed, however
    # fast the machine (with 3 partitions it could, and then rightly reported itself).
    many = shoal.DistEngine(
        runner="local", raise_on_fail=True, default_partitions=8, small_query_bytes=0
    )
    lf = _data().with_columns(w=pl.col("v") * 2)
    assert len(list(lf.collect_batches(engine=many))) == 8
    before = last_query()
    eager = lf.collect_batches(engine=many)
    next(eager)
    eager.close()
    assert stopped and last_query() is before
    stopped.clear()
    dropped = lf.collect_batches(engine=many, lazy=True)
    next(dropped)
    del dropped
    gc.collect()
    assert stopped and last_query() is before
