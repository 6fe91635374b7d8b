"""The TPC-H benchmark harness (benchmarks/tpch.py): a smoke run and its parts.

The smoke run is small on purpose (scale 0.01, one query, native Polars and shoal's local
runner, no Ray, no Daft): it checks that the harness runs end to end and writes a report
that parses, not any timing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from benchmarks import tpch
from benchmarks._check import check_result
from benchmarks._engines import DAFT_REWRITES, daft_sql, plain_string_copy
from benchmarks._memory import TreeSampler, data_pss_bytes, process_tree, tree_pss_available
from benchmarks._report import parse_markdown_tables

from shoal.tpch.sql import SQL_QUERIES

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


def test_smoke_run_writes_a_report_that_parses(tpch_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = ["--scale", "0.01", "--queries", "6", "--engines", "polars,shoal-local"]
    argv += ["--runs", "2", "--data-dir", str(tpch_dir.parent), "--out", str(out)]
    assert tpch.main(argv) == 0

    [md] = out.glob("*-sf0.01.md")
    text = md.read_text()
    assert "python -m benchmarks.tpch --scale 0.01 --queries 6" in text
    times, memory = parse_markdown_tables(text)
    assert times[0] == ["query", "polars", "shoal-local"]
    q6 = next(row for row in times if row[0] == "Q6")
    float(q6[1])  # the baseline: seconds only
    seconds, ratio = q6[2].split(" ")  # shoal: "seconds (ratio)", no mark: answer right
    assert float(seconds) > 0 and ratio.startswith("(") and ratio.endswith("x)")
    assert times[-1] == ["queries answered right / asked", "1/1", "1/1"]
    assert [row[0] for row in memory[1:]] == ["polars", "shoal-local"]
    assert all(float(cell.replace(",", "")) > 0 for row in memory[1:] for cell in row[2:4])

    record = json.loads(md.with_suffix(".json").read_text())
    cell = record["results"]["shoal-local"]["6"]
    assert cell["status"] == "ok" and len(cell["times_s"]) == 2 and cell["rows"] == 1
    assert record["results"]["polars"]["6"]["status"] == "baseline"
    assert record["engines"]["shoal-local"]["driver_peak_rss_bytes"] > 10 * 2**20
    assert md.with_suffix(".png").exists() == HAS_MATPLOTLIB

    # The report can be drawn again from the JSON alone.
    md.unlink()
    assert tpch.main(["--from-json", str(md.with_suffix(".json")), "--no-chart"]) == 0
    assert parse_markdown_tables(md.read_text())[0] == times


def test_check_result_compares_values_across_engine_types() -> None:
    expected = pl.DataFrame(
        {"k": ["a", "b"], "n": pl.Series([3, 4], dtype=pl.UInt32), "v": [1.5, 2.25]}
    ).with_columns(pl.col("v").cast(pl.Decimal(15, 2)))
    # DuckDB-like: other names, Int64 counts, doubles.
    other = pl.DataFrame({"key": ["a", "b"], "count": [3, 4], "value": [1.5, 2.25]})
    verdict, detail = check_result(other, expected, [("k", False)])
    assert verdict == "ok" and "renamed" in detail
    assert check_result(other.with_columns(pl.col("value") * 1.0001), expected, None)[0] == "close"
    assert check_result(other.with_columns(pl.col("value") * 1.1), expected, None)[0] == "mismatch"
    # Integers stay exact: a count off by one is wrong, however large the count.
    assert check_result(other.with_columns(pl.col("count") + 1), expected, None)[0] == "mismatch"
    assert check_result(other.reverse(), expected, [("k", False)])[0] == "mismatch"
    assert check_result(other.drop("count"), expected, None)[0] == "mismatch"


def test_markdown_tables_parse_back() -> None:
    from benchmarks._report import markdown_table

    rows = [["query", "a|b"], ["Q1", "0.1 (2.00x) ≈"], ["total", "-"]]
    assert parse_markdown_tables("text\n\n" + markdown_table(rows) + "\n\nmore") == [rows]
    with pytest.raises(ValueError, match="widths"):
        parse_markdown_tables("| a | b |\n|---|---|\n| 1 |\n")


@contextlib.contextmanager
def _child_holding_64_mib() -> Iterator[subprocess.Popen[bytes]]:
    """A child process that holds 64 MiB of its own memory (waited for), killed after."""
    code = "import time; b = bytearray(64 * 2**20); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while data_pss_bytes(child.pid) < 64 * 2**20 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield child
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not tree_pss_available(), reason="needs /proc/<pid>/smaps_rollup (Linux)")
def test_a_paused_memory_sampler_samples_only_when_asked() -> None:
    # The benchmark pauses the sampler during timed runs: a sample costs CPU.
    sampler = TreeSampler(interval_s=0.02).start()
    sampler.pause()
    base = sampler.sample()
    assert base is not None
    try:
        with _child_holding_64_mib():
            time.sleep(0.2)  # ten intervals: a running sampler would have seen the child
            assert (sampler.peak_bytes or 0) < base + 32 * 2**20
            sampler.resume()
            deadline = time.monotonic() + 5
            while (sampler.peak_bytes or 0) < base + 64 * 2**20 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert (sampler.peak_bytes or 0) >= base + 64 * 2**20
    finally:
        sampler.stop()


@pytest.mark.skipif(not tree_pss_available(), reason="needs /proc/<pid>/smaps_rollup (Linux)")
def test_memory_sampler_sees_children() -> None:
    with _child_holding_64_mib() as child:
        assert child.pid in process_tree(os.getpid())
        sampler = TreeSampler(interval_s=0.05).start()
        time.sleep(0.2)
        sampler.stop()
        assert sampler.peak_bytes is not None and sampler.peak_bytes >= 64 * 2**20


def test_daft_rewrites_match_the_sql_they_edit() -> None:
    # A rewrite whose text is gone (the SQL changed) would silently not apply.
    for number, pairs in DAFT_REWRITES.items():
        for old, new in pairs:
            assert old in SQL_QUERIES[number], f"Q{number}: {old!r} not in the SQL any more"
            assert new in daft_sql(number)


def test_plain_string_copy(tpch_dir: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "sf"
    (source / "nation").mkdir(parents=True)
    original = next((tpch_dir / "nation").glob("nation.1.parquet"))
    (source / "nation" / "nation.1.parquet").write_bytes(original.read_bytes())
    copy = plain_string_copy(source)
    table = pq.read_table(copy / "nation" / "nation.1.parquet")
    assert not any(pa.types.is_string_view(f.type) for f in table.schema)
    assert table.to_pylist() == pq.read_table(original).to_pylist()
    assert plain_string_copy(source) == copy  # reused
