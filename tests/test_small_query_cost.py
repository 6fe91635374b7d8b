"""The small-query path's fixed cost per query (issue 17): what it keeps between queries and
what it skips must never change an answer. A file rewritten between two queries is read
again (rows, columns and the column checks follow it), and the driver's result is passed
through unconverted only where converting it would give the same table."""

from __future__ import annotations

import datetime as dt
import decimal
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

import shoal
import shoal.runners.session as session
from shoal.ir.nodes import InMemorySource, Scan
from shoal.ir.types import DataType, Schema
from shoal.runners.session import last_query
from shoal_polars import DistEngine

ON = shoal.Config(runner="local", small_query_bytes=1 << 40)


def _collect(lf: pl.LazyFrame) -> pl.DataFrame:
    got = lf.collect(engine=DistEngine(config=ON, raise_on_fail=True))
    report = last_query()
    assert report is not None and len(report.physical.stages) == 1
    return got


def test_a_file_rewritten_between_queries_is_read_again(tmp_path: Path) -> None:
    """Footers, their digests and the column checks are kept between queries by file (size,
    modification time): each rewrite below changes the answer or the error, as natively."""
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"k": [1, 2], "v": [1.0, 2.0]}), a)
    pq.write_table(pa.table({"k": [3], "v": [3.0]}), b)
    lf = pl.scan_parquet([a, b]).filter(pl.col("k") > 1)
    for _ in range(2):  # the second query reads what the first cached
        assert_frame_equal(_collect(lf), lf.collect(engine="in-memory"), check_exact=True)
    # More rows, other values: the answer follows the file.
    pq.write_table(pa.table({"k": [5, 6, 7, 0], "v": [-0.0, None, float("nan"), 4.0]}), b)
    want = lf.collect(engine="in-memory")
    assert want.height == 4
    assert_frame_equal(_collect(lf), want, check_exact=True)
    # A column the first file lacks: Polars' scan refuses it, and so does shoal.
    pq.write_table(pa.table({"k": [8], "v": [8.0], "extra": ["x"]}), b)
    with pytest.raises(pl.exceptions.SchemaError, match="extra"):
        lf.collect(engine="in-memory")
    with pytest.raises(pl.exceptions.SchemaError, match="extra"):
        _collect(lf)
    # A file that lacks a column the query reads.
    pq.write_table(pa.table({"k": [9, 10, 11]}), b)
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        lf.collect(engine="in-memory")
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        _collect(lf)
    # Back to agreeing files: answers again.
    pq.write_table(pa.table({"k": [12, 13, 14, 15, 16], "v": [1.5] * 5}), b)
    assert_frame_equal(_collect(lf), lf.collect(engine="in-memory"), check_exact=True)


#: Columns of every kind: those Polars imports and exports unchanged, and those it respells.
_COLUMNS = {
    "i8": pa.array([1, None], pa.int8()),
    "u64": pa.array([2**64 - 1, 0], pa.uint64()),
    "f32": pa.array([-0.0, float("nan")], pa.float32()),
    "f64": pa.array([None, -0.0], pa.float64()),
    "b": pa.array([True, None]),
    "s": pa.array(["x", None], pa.large_string()),
    "small_s": pa.array(["x", None], pa.string()),
    "bin": pa.array([b"\x00", None], pa.large_binary()),
    "dec": pa.array([decimal.Decimal("1.20"), None], pa.decimal128(38, 2)),
    "d": pa.array([dt.date(2020, 1, 1), None], pa.date32()),
    "ts": pa.array([dt.datetime(2020, 1, 1, 1), None], pa.timestamp("us", "UTC")),
    "ts_offset": pa.array([dt.datetime(2020, 1, 1), None], pa.timestamp("us", "+00:00")),
    "ts_s": pa.array([dt.datetime(2020, 1, 1), None], pa.timestamp("s")),
    "t": pa.array([dt.time(1, 2), None], pa.time64("ns")),
    "t_us": pa.array([dt.time(1, 2), None], pa.time64("us")),
    "dur": pa.array([dt.timedelta(seconds=1), None], pa.duration("ms")),
    "n": pa.nulls(2),
    "l": pa.array([[1, None], None], pa.large_list(pa.int64())),
    "st": pa.array([{"a": 1}, None], pa.struct([("a", pa.int64())])),
    "cat": pa.array(["a", "b"]).dictionary_encode(),
}


_KEPT = {"i8", "u64", "f32", "f64", "b", "s", "bin", "dec", "d", "ts", "t", "dur", "n"}


@pytest.mark.parametrize("name", sorted(_COLUMNS))
@pytest.mark.parametrize("typed_as", ["own", "int64"])
def test_conform_passes_a_result_through_only_when_converting_changes_nothing(
    monkeypatch: pytest.MonkeyPatch, name: str, typed_as: str
) -> None:
    """``conform`` of one task's table gives what converting it to Polars, casting it to
    the plan's types and back gives, whether or not it takes the shortcut."""
    table = pa.table({name: _COLUMNS[name], "k": pa.array([1, 2], pa.int32())})
    schema = Schema.from_arrow(table.schema)
    if typed_as == "int64":  # the plan asks for another type: a cast is needed
        schema = Schema(((name, schema[name]), ("k", DataType(pa.int64()))))
    plan = Scan(InMemorySource(table, ""), schema, None)
    got = session.conform([table.slice(0, 0), table], plan)
    monkeypatch.setattr(session, "_conformed", lambda *_: False)
    want = session.conform([table], plan)
    assert got.schema.equals(want.schema, check_metadata=True), (got.schema, want.schema)
    # repr tells -0.0 from 0.0 and matches NaN with NaN, which Arrow's equals does not.
    assert repr(got.to_pylist()) == repr(want.to_pylist())
    # The shortcut is taken for the flat types Polars keeps as they are (the TPC-H results).
    assert (got is table) == (typed_as == "own" and name in _KEPT)
