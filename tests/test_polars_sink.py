"""lf.sink_parquet(..., engine=DistEngine): each task writes its own partition's files, in
Polars 2.1's layouts; the files read back equal native Polars (rows and order)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

import shoal
from shoal.errors import PlanError, UnsupportedError
from shoal.ir import from_json, to_json
from shoal.ir.explain import explain
from shoal.ir.nodes import SINK_SCHEMA, Sink
from shoal.runners.session import last_query
from shoal_polars.engine import ShoalFallbackWarning, to_ir


@pytest.fixture(params=["local", "ray"])
def runner(request: pytest.FixtureRequest) -> str:
    if request.param == "ray":
        request.getfixturevalue("ray_runner")
    return str(request.param)


def engine(runner: str, **kw: object) -> shoal.DistEngine:
    cfg = shoal.Config(runner=runner, default_partitions=4, shuffle_partitions=3)  # type: ignore[arg-type]
    return shoal.DistEngine(runner=runner, raise_on_fail=True, config=cfg, **kw)  # type: ignore[arg-type]


@pytest.fixture
def source() -> pl.LazyFrame:
    """600 rows in four partitions of 150 (``default_partitions=4``): nulls, NaN, duplicate
    rows, and a second partition whose rows :func:`query` filters out (an empty
    partition)."""
    n = 450
    df = pl.DataFrame(
        {
            "k": [None if i % 13 == 0 else f"k{i % 5}" for i in range(n)],
            "v": [float("nan") if i % 17 == 0 else (i % 50) / 4 for i in range(n)],
            "i": [None if i % 11 == 0 else i % 200 for i in range(n)],
        }
    )
    dropped = pl.DataFrame({"k": ["x"] * 150, "v": [1.0] * 150, "i": [5] * 150})
    return pl.concat([df[:150], dropped, df[150:]]).lazy()


def query(source: pl.LazyFrame) -> pl.LazyFrame:
    return source.filter(pl.col("i").is_null() | (pl.col("i") > 20)).with_columns(w=pl.col("v") * 2)


def sink_stage_tasks(runner: str) -> tuple[int, set[int]]:
    """Tasks of the last query's root (sink) stage, and the pids that ran them."""
    report = last_query()
    assert report is not None and report.runner == runner
    root = report.physical.root
    assert root.operators[0] == "Sink"
    pids = {s.pid for (sid, _), s in report.task_stats.items() if sid == root.id}
    return root.num_tasks, pids


def test_single_file_has_polars_rows_in_polars_order(
    runner: str, source: pl.LazyFrame, tmp_path: Path
) -> None:
    lf = query(source)
    native = lf.collect()
    assert native.height > 100 and native["v"].is_nan().any() and native["k"].null_count()
    got: list[object] = []
    out = tmp_path / "out" / "one.parquet"
    lf.sink_parquet(
        out,
        engine=engine(runner),
        mkdir=True,
        compression="snappy",
        statistics=False,
        row_group_size=100,
        sinked_paths_callback=got.append,
    )
    assert pl.read_parquet(out).equals(native)
    tasks, pids = sink_stage_tasks(runner)
    assert tasks == 1
    if runner == "ray":
        assert pids and os.getpid() not in pids  # a worker wrote it, not the driver
    report = last_query()
    assert report is not None and report.physical.stages[0].num_tasks == 4  # four partitions
    assert report.task_stats[(0, 1)].rows_out == 0  # one of them empty
    # The writer options are Polars' own: same row groups, codec and statistics.
    lf.sink_parquet(tmp_path / "native.parquet", compression="snappy", statistics=False,
                    row_group_size=100)  # fmt: skip
    mine, theirs = pq.read_metadata(out), pq.read_metadata(tmp_path / "native.parquet")
    assert mine.num_row_groups == theirs.num_row_groups > 1
    assert mine.row_group(0).column(0).compression == "SNAPPY"
    assert not mine.row_group(0).column(0).is_stats_set
    (args,) = got
    assert [(p.path, p.num_rows) for p in args.paths] == [(str(out), native.height)]  # type: ignore[attr-defined]
    assert args.paths[0].num_bytes == out.stat().st_size  # type: ignore[attr-defined]


def test_sorted_query_to_one_file(runner: str, source: pl.LazyFrame, tmp_path: Path) -> None:
    lf = query(source).sort("v", "i", nulls_last=True, maintain_order=True)
    lf.sink_parquet(tmp_path / "s.parquet", engine=engine(runner))
    assert pl.read_parquet(tmp_path / "s.parquet").equals(lf.collect())


def test_partitioned_by_size_written_in_parallel(
    runner: str, source: pl.LazyFrame, tmp_path: Path
) -> None:
    lf = query(source)
    native = lf.collect()
    got: list[object] = []
    base = tmp_path / "split"
    target = pl.PartitionBy(str(base), max_rows_per_file=40)
    lf.sink_parquet(target, engine=engine(runner), sinked_paths_callback=got.append)
    names = sorted(os.listdir(base))
    assert names == [f"{i:08x}.parquet" for i in range(len(names))]  # Polars' names
    files = [pl.read_parquet(base / n) for n in names]
    assert all(0 < f.height <= 40 for f in files)
    assert pl.concat(files).equals(native)  # in name order: Polars' rows, Polars' order
    tasks, pids = sink_stage_tasks(runner)
    assert tasks == 4  # one writer per partition (one of them empty)
    if runner == "ray":
        assert os.getpid() not in pids
    (args,) = got
    reported = [(p.path, p.num_rows) for p in args.paths]  # type: ignore[attr-defined]
    assert reported == [
        (os.path.join(str(base), n), f.height) for n, f in zip(names, files, strict=True)
    ]


def test_hive_partitions_equal_polars_file_for_file(
    runner: str, source: pl.LazyFrame, tmp_path: Path
) -> None:
    lf = query(source)
    for include_key in (True, False):
        mine, theirs = tmp_path / f"hive-{include_key}", tmp_path / f"native-{include_key}"
        lf.sink_parquet(
            pl.PartitionBy(mine, key="k", include_key=include_key, max_rows_per_file=25),
            engine=engine(runner),
        )
        lf.sink_parquet(
            pl.PartitionBy(theirs, key="k", include_key=include_key, max_rows_per_file=25)
        )
        files = sorted(p.relative_to(mine) for p in mine.rglob("*.parquet"))
        assert files == sorted(p.relative_to(theirs) for p in theirs.rglob("*.parquet"))
        assert any("__HIVE_DEFAULT_PARTITION__" in str(f) for f in files)  # the null key
        assert len(files) > 6
        for f in files:
            assert pl.read_parquet(mine / f).equals(pl.read_parquet(theirs / f)), f
        tasks, _ = sink_stage_tasks(runner)
        assert tasks == 3  # after a hash exchange on the key


def test_empty_result_writes_what_polars_writes(tmp_path: Path, source: pl.LazyFrame) -> None:
    lf = source.filter(pl.col("i") > 10_000)
    eng = engine("local")
    lf.sink_parquet(tmp_path / "e.parquet", engine=eng)
    back = pl.read_parquet(tmp_path / "e.parquet")
    assert back.height == 0 and back.schema == lf.collect_schema()
    lf.sink_parquet(pl.PartitionBy(tmp_path / "es", max_rows_per_file=5), engine=eng)
    lf.sink_parquet(pl.PartitionBy(tmp_path / "en", max_rows_per_file=5))
    assert sorted(os.listdir(tmp_path / "es")) == sorted(os.listdir(tmp_path / "en"))
    lf.sink_parquet(pl.PartitionBy(tmp_path / "hs", key="k"), engine=eng)
    lf.sink_parquet(pl.PartitionBy(tmp_path / "hn", key="k"))
    assert list((tmp_path / "hs").rglob("*.parquet")) == []
    assert list((tmp_path / "hn").rglob("*.parquet")) == []


@pytest.mark.usefixtures("ray_runner")
def test_engine_name_dist(tmp_path: Path, source: pl.LazyFrame) -> None:
    before = last_query()
    query(source).sink_parquet(tmp_path / "d.parquet", engine="dist")
    assert last_query() is not before
    assert pl.read_parquet(tmp_path / "d.parquet").equals(query(source).collect())


def test_bad_targets_are_named_before_any_task_runs(tmp_path: Path, source: pl.LazyFrame) -> None:
    lf = query(source)
    eng = engine("local")
    before = last_query()
    (tmp_path / "adir").mkdir()
    with pytest.raises(IsADirectoryError, match="adir"):
        lf.sink_parquet(tmp_path / "adir", engine=eng)
    with pytest.raises(IsADirectoryError, match="trailing"):
        lf.sink_parquet(str(tmp_path / "trailing") + "/", engine=eng)
    with pytest.raises(FileNotFoundError, match="missing"):
        lf.sink_parquet(tmp_path / "missing" / "x.parquet", engine=eng)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match="afile"):
        lf.sink_parquet(pl.PartitionBy(tmp_path / "afile", max_rows_per_file=3), engine=eng)
    assert last_query() is before  # no query ran
    lf.sink_parquet(tmp_path / "missing" / "x.parquet", engine=eng, mkdir=True)
    assert pl.read_parquet(tmp_path / "missing" / "x.parquet").equals(lf.collect())


def test_what_shoal_cannot_honour_falls_back_to_polars(
    tmp_path: Path, source: pl.LazyFrame
) -> None:
    lf = query(source)
    native = lf.collect()
    buf = io.BytesIO()
    with pytest.warns(ShoalFallbackWarning, match="file-like target"):
        lf.sink_parquet(buf, engine=shoal.DistEngine(runner="local"))
    assert pl.read_parquet(buf.getvalue()).equals(native)
    with pytest.raises(UnsupportedError, match="file-like target"):
        lf.sink_parquet(io.BytesIO(), engine=engine("local"))
    by_expr = pl.PartitionBy(tmp_path / "expr", key=pl.col("i") % 3)
    with pytest.warns(ShoalFallbackWarning, match="PartitionBy key"):
        lf.sink_parquet(by_expr, engine=shoal.DistEngine(runner="local"))
    assert len(list((tmp_path / "expr").rglob("*.parquet"))) == 4  # 0, 1, 2 and null
    opaque = lf.map_batches(lambda df: df)  # a query shoal cannot translate
    with pytest.warns(ShoalFallbackWarning, match="MapFunction"):
        opaque.sink_parquet(tmp_path / "o.parquet", engine=shoal.DistEngine(runner="local"))
    assert pl.read_parquet(tmp_path / "o.parquet").equals(native)


def test_sink_node_serialises_explains_and_validates(source: pl.LazyFrame) -> None:
    plan = to_ir(query(source))
    (table,) = [n.source.table for n in plan.walk() if hasattr(n, "source")]
    tables = {"t": table}
    sink = Sink(
        plan,
        "parquet",
        "/tmp/out",
        "hive",
        SINK_SCHEMA,
        partition_by=("k",),
        max_rows_per_file=10,
        options=(("compression", "zstd"), ("statistics", (("min", True),))),
    )
    assert from_json(to_json(sink, tables=tables), tables=tables) == sink
    assert "SINK PARQUET HIVE '/tmp/out' BY ['k'] MAX ROWS 10" in explain(sink)
    bad = Sink(plan, "parquet", "/tmp/out", "hive", SINK_SCHEMA, partition_by=("nope",))
    with pytest.raises(PlanError, match="key column 'nope'"):
        from_json(to_json(bad, tables=tables), tables=tables)
    with pytest.raises(PlanError, match="shoal.execute"):
        next(shoal.execute_batches(sink, runner="local"))


@pytest.mark.parametrize("layout", ["hive", "split"])
def test_a_failed_partitioned_sink_leaves_nothing(
    layout: str, source: pl.LazyFrame, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All or nothing per query: one task's writer fails after the others (and itself)
    have written files; the target must hold none of them afterwards, and a query that
    succeeds then writes what native Polars writes."""
    from shoal.execution import sink as sink_mod

    real = sink_mod.write_partition
    calls: list[int] = []

    def flaky_writer(df: pl.DataFrame, node: Sink) -> pl.DataFrame:
        written = real(df, node)  # the files are on disk now
        calls.append(df.height)
        if len(calls) == 2:
            raise OSError(f"disk full after writing {written.height} files")
        return written

    base = tmp_path / layout
    keys = {"key": "k"} if layout == "hive" else {}
    target = pl.PartitionBy(base, max_rows_per_file=25, **keys)  # type: ignore[arg-type]
    monkeypatch.setattr(sink_mod, "write_partition", flaky_writer)
    with pytest.raises(OSError, match="disk full"):
        query(source).sink_parquet(target, engine=engine("local"))
    assert len(calls) >= 2
    assert list(base.rglob("*.parquet")) == []
    assert not [p for p in base.iterdir() if p.name.startswith(".shoal-staging")]
    monkeypatch.setattr(sink_mod, "write_partition", real)
    query(source).sink_parquet(target, engine=engine("local"))
    native = tmp_path / f"native-{layout}"
    query(source).sink_parquet(pl.PartitionBy(native, max_rows_per_file=25, **keys))  # type: ignore[arg-type]
    mine = sorted(p.relative_to(base) for p in base.rglob("*.parquet"))
    theirs = sorted(p.relative_to(native) for p in native.rglob("*.parquet"))
    if layout == "hive":
        assert mine == theirs
        for f in mine:
            assert pl.read_parquet(base / f).equals(pl.read_parquet(native / f)), f
    else:  # shoal may write more files than Polars (each task cuts its own rows)
        assert [f.name for f in mine] == [f"{i:08x}.parquet" for i in range(len(mine))]
        assert len(mine) > 16  # past 0000000f: Polars numbers files in hexadecimal
        got = pl.concat([pl.read_parquet(base / f) for f in mine])
        assert got.equals(pl.concat([pl.read_parquet(native / f) for f in theirs]))
