"""Bad input gets a clear error naming the file, column or node, before any task runs."""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.runners.session import last_query


def _scan_ir(paths: list[Path], schema: dict[str, pl.DataType]) -> shoal.ir.PlanNode:
    return shoal.ir.Scan(
        shoal.ir.ParquetSource(tuple(str(p) for p in paths)), shoal.ir.Schema.from_polars(schema)
    )


def _engine() -> shoal.DistEngine:
    return shoal.DistEngine(runner="local", raise_on_fail=True)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    good = tmp_path / "a.parquet"
    pl.DataFrame({"a": [1, 2]}).write_parquet(good)
    missing = tmp_path / "gone.parquet"
    before = last_query()
    with pytest.raises(FileNotFoundError, match="gone.parquet"):
        shoal.execute(_scan_ir([good, missing], {"a": pl.Int64}), runner="local")
    assert last_query() is before


def test_corrupt_parquet_file_names_the_file(tmp_path: Path) -> None:
    good = tmp_path / "a.parquet"
    pl.DataFrame({"a": [1, 2]}).write_parquet(good)
    bad = tmp_path / "b.parquet"
    bad.write_bytes(b"PAR1 this is not parquet at all PAR1")
    before = last_query()
    with pytest.raises(shoal.PlanError, match=r"b\.parquet is not a readable Parquet file"):
        shoal.execute(_scan_ir([good, bad], {"a": pl.Int64}), runner="local")
    # Through Polars: Polars reads the first file's schema; shoal checks every footer.
    with pytest.raises(shoal.PlanError, match=r"b\.parquet"):
        pl.scan_parquet([good, bad]).collect(engine=_engine())
    assert last_query() is before


def test_clashing_schemas_name_both_files_and_the_column(tmp_path: Path) -> None:
    a = tmp_path / "part-0.parquet"
    b = tmp_path / "part-1.parquet"
    pl.DataFrame({"k": [1, 2], "v": [1.0, 2.0]}).write_parquet(a)
    pl.DataFrame({"k": ["x", "y"], "v": [1.0, 2.0]}).write_parquet(b)
    before = last_query()
    with pytest.raises(shoal.PlanError, match=r"column 'k'.*part-0\.parquet.*part-1\.parquet"):
        shoal.execute(_scan_ir([a, b], {"k": pl.Int64, "v": pl.Float64}), runner="local")
    with pytest.raises(shoal.PlanError, match=r"column 'k'"):
        pl.scan_parquet([a, b]).select("k", "v").collect(engine=_engine())
    # A Polars user gets Polars' class too, as native raises for these files.
    with pytest.raises(pl.exceptions.SchemaError):
        pl.scan_parquet([a, b]).select("k", "v").collect()
    with pytest.raises(pl.exceptions.SchemaError, match=r"column 'k'"):
        pl.scan_parquet([a, b]).select("k", "v").collect(engine=_engine())
    assert last_query() is before


def test_unsupported_construct_with_raise_on_fail_names_the_node() -> None:
    lf = pl.LazyFrame({"a": [1, 2, 3]}).map_batches(lambda df: df)
    with pytest.raises(shoal.UnsupportedError, match="MapFunction"):
        lf.collect(engine=_engine())


def test_unreachable_cluster_address_fails_within_the_timeout() -> None:
    import socket

    import ray

    if ray.is_initialized():  # pragma: no cover - another module left Ray running
        pytest.skip("a Ray instance is already connected in this process")
    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = shoal.Config(runner="ray", ray_address=f"127.0.0.1:{port}", ray_connect_timeout_s=2)
    plan = shoal.ir.Scan(
        shoal.ir.InMemorySource(pl.DataFrame({"a": [1]}).to_arrow()),
        shoal.ir.Schema.from_polars({"a": pl.Int64}),
    )
    start = time.monotonic()
    with pytest.raises(shoal.ShoalError, match=f"127.0.0.1:{port}.*unreachable"):
        shoal.execute(plan, config=cfg)
    assert time.monotonic() - start < 5
    assert not ray.is_initialized()


def test_a_port_that_is_not_ray_fails_within_the_timeout() -> None:
    """Issue 19: a port that accepts TCP but is not Ray passed the reachability check and
    ray.init then retried for more than ten minutes."""
    import socket
    import threading

    import ray

    if ray.is_initialized():  # pragma: no cover - another module left Ray running
        pytest.skip("a Ray instance is already connected in this process")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(server.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    cfg = shoal.Config(runner="ray", ray_address=f"127.0.0.1:{port}", ray_connect_timeout_s=2)
    plan = shoal.ir.Scan(
        shoal.ir.InMemorySource(pl.DataFrame({"a": [1]}).to_arrow()),
        shoal.ir.Schema.from_polars({"a": pl.Int64}),
    )
    start = time.monotonic()
    try:
        with pytest.raises(shoal.ShoalError, match=f"127.0.0.1:{port}.*as a Ray cluster"):
            shoal.execute(plan, config=cfg)
    finally:
        server.close()
        for conn in accepted:
            conn.close()
    assert time.monotonic() - start < 60  # the timeout is honoured (Ray alone: > 600 s)
    assert not ray.is_initialized()


@pytest.mark.parametrize("raise_on_fail", [True, False])
def test_multi_file_column_checks_raise_polars_errors(tmp_path: Path, raise_on_fail: bool) -> None:
    """Polars' scan_parquet checks every file's columns against the first file's
    (``extra_columns="raise"``, ``missing_columns="raise"``: its defaults) and raises
    SchemaError / ColumnNotFoundError; shoal answered instead (its tasks read each file's
    needed columns alone). The same query with the policy relaxed answers as Polars."""
    first, extra, short = (tmp_path / f"{n}.parquet" for n in ("first", "extra", "short"))
    pl.DataFrame({"a": [1, None], "b": [2.0, float("nan")]}).write_parquet(first)
    pl.DataFrame({"a": [3], "b": [-0.0], "c": ["x"]}).write_parquet(extra)
    pl.DataFrame({"a": [4, 4]}).write_parquet(short)
    engine = shoal.DistEngine(runner="local", raise_on_fail=raise_on_fail, default_partitions=3)
    cases = [
        (pl.scan_parquet([first, extra]).select("a"), pl.exceptions.SchemaError),
        (pl.scan_parquet([first, short]), pl.exceptions.ColumnNotFoundError),
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without raise_on_fail: the fallback's warning
        for lf, error in cases:
            with pytest.raises(error):
                lf.collect()
            with pytest.raises(error):
                lf.collect(engine=engine)
        for lf in (
            pl.scan_parquet([first, extra], extra_columns="ignore"),
            pl.scan_parquet([first, short]).select("a"),
        ):
            assert_frame_equal(lf.collect(engine=engine), lf.collect())


def test_multi_file_column_checks_see_a_rewritten_file(tmp_path: Path) -> None:
    """The column checks that passed are remembered for the footers they read; a file
    written again (another footer) is checked again: the query that passed now raises as
    Polars does, and passes once the file has its column back."""
    first, second = tmp_path / "first.parquet", tmp_path / "second.parquet"
    pl.DataFrame({"a": [1, None], "b": [2.0, -0.0]}).write_parquet(first)
    pl.DataFrame({"a": [3, 3], "b": [float("nan"), 1.0]}).write_parquet(second)
    engine = shoal.DistEngine(runner="local", raise_on_fail=True)
    lf = pl.scan_parquet([first, second])
    assert_frame_equal(lf.collect(engine=engine), lf.collect())
    assert_frame_equal(lf.collect(engine=engine), lf.collect())  # remembered: same answer
    pl.DataFrame({"a": [4, 5, 6]}).write_parquet(second)  # "b" gone: a new footer
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        pl.scan_parquet([first, second]).collect()
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        pl.scan_parquet([first, second]).collect(engine=engine)
    pl.DataFrame({"a": [7], "b": [8.0]}).write_parquet(second)
    lf = pl.scan_parquet([first, second])
    assert_frame_equal(lf.collect(engine=engine), lf.collect())
