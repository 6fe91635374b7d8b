"""shoal.tpch.datagen and the TPC-H queries on native Polars (tiny scales, no Ray)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest

from shoal.tpch import datagen
from shoal.tpch.compare import assert_frames_match
from shoal.tpch.queries import QUERIES, SORT_KEYS, TABLE_NAMES, scan_tables

SCALE = 0.01


@pytest.fixture(scope="module")
def sf001(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TPC-H scale 0.01 with the default number of parts, generated once per module."""
    return datagen.generate(SCALE, tmp_path_factory.mktemp("tpch"))


def test_generate_layout(sf001: Path) -> None:
    assert sf001.name == "sf0.01"
    marker = json.loads((sf001 / datagen.MARKER).read_text())
    assert marker == {"scale": SCALE, "parts": 4}
    for name in TABLE_NAMES:
        files = sorted(p.name for p in (sf001 / name).glob("*.parquet"))
        assert files, name
        assert all(f.startswith(f"{name}.") for f in files)
    assert len(list((sf001 / "lineitem").glob("*.parquet"))) == 4
    assert not [p for p in sf001.parent.iterdir() if p.name.startswith(".")]


def test_generate_reuses_complete_directory(sf001: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_generator() -> Path:
        raise AssertionError("tpchgen-cli must not run for a cached directory")

    monkeypatch.setattr(datagen, "find_tpchgen", no_generator)
    assert datagen.generate(SCALE, sf001.parent) == sf001
    assert datagen.generate(SCALE, sf001.parent, parts=4) == sf001


def test_generate_redoes_other_parts_and_incomplete_dirs(tmp_path: Path) -> None:
    first = datagen.generate(0.001, tmp_path, parts=2)
    assert len(list((first / "lineitem").glob("*.parquet"))) == 2
    again = datagen.generate(0.001, tmp_path, parts=3)
    assert again == first
    assert len(list((again / "lineitem").glob("*.parquet"))) == 3

    (again / datagen.MARKER).unlink()  # as if an older run never finished
    datagen.generate(0.001, tmp_path)
    assert (again / datagen.MARKER).is_file()


def test_interrupted_generation_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(command: list[str], **kwargs: object) -> None:
        out = Path(command[command.index("--output-dir") + 1])
        (out / "lineitem").mkdir()
        (out / "lineitem" / "lineitem.1.parquet").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        datagen.generate(0.001, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_generator_failure_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    false = shutil.which("false")
    assert false is not None
    monkeypatch.setattr(datagen, "find_tpchgen", lambda: Path(false))
    with pytest.raises(RuntimeError, match="tpchgen-cli failed with exit code 1"):
        datagen.generate(0.001, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_generator_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(datagen.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip install tpchgen-cli"):
        datagen.generate(0.001, tmp_path)


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="scale"):
        datagen.generate(0, tmp_path)
    with pytest.raises(ValueError, match="parts"):
        datagen.generate(1, tmp_path, parts=0)


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path))
    assert datagen.default_data_dir() == tmp_path
    monkeypatch.delenv("SHOAL_DATA_DIR")
    assert datagen.default_data_dir() == Path.home() / ".cache" / "shoal" / "tpch"
    assert datagen.default_parts(0.5) == 4
    assert datagen.default_parts(10) == 8


@pytest.mark.parametrize(("number", "rows"), [(1, 4), (3, 10), (5, 5), (6, 1), (10, 20)])
def test_queries_on_native_polars(sf001: Path, number: int, rows: int) -> None:
    tables = scan_tables(sf001)
    streaming = QUERIES[number](tables).collect()
    assert streaming.height == rows
    in_memory = QUERIES[number](tables).collect(engine="in-memory")
    assert_frames_match(in_memory, streaming, SORT_KEYS[number])
    money = [c for c, dtype in streaming.schema.items() if c in ("revenue", "sum_charge")]
    assert money and all(isinstance(streaming.schema[c], pl.Decimal) for c in money)


def test_known_answers_at_scale_001(sf001: Path) -> None:
    """Values checked against DuckDB running the specification's SQL on the same files."""
    tables = scan_tables(sf001)
    q1 = QUERIES[1](tables).collect()
    assert q1["count_order"].to_list() == [14876, 348, 29181, 14902]
    assert str(QUERIES[6](tables).collect().item()) == "1193053.17"
    q5 = QUERIES[5](tables).collect()
    assert q5["n_name"].to_list() == ["VIETNAM", "CHINA", "JAPAN", "INDONESIA", "INDIA"]
    assert QUERIES[3](tables).collect()["l_orderkey"][0] == 47714


def test_empty_partition_changes_no_answer(sf001: Path, tmp_path: Path) -> None:
    copy = shutil.copytree(sf001, tmp_path / "with-empty")
    written = datagen.add_empty_partition(copy)
    assert len(written) == len(TABLE_NAMES)
    for path in written:
        assert pl.read_parquet(path).height == 0
        table = path.parent.name
        assert pl.read_parquet_schema(path) == pl.read_parquet_schema(
            next(path.parent.glob(f"{table}.1.parquet"))
        )
    original, padded = scan_tables(sf001), scan_tables(copy)
    for number, query in QUERIES.items():
        assert_frames_match(query(padded).collect(), query(original).collect(), SORT_KEYS[number])


def test_scan_tables_missing_table(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="region"):
        scan_tables(tmp_path)
