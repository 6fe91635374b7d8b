"""The ``--shoal-engine`` pytest plugin (:mod:`tests.plugin_shoal_engine`): a Polars-style
test module run with it runs its queries on shoal; a query shoal cannot translate fails the
test, or falls back with ``--shoal-fallback``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run pytest in a fresh interpreter with the plugin loaded (from the repository)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.plugin_shoal_engine", "-q",
         "-p", "no:cacheprovider", *args],
        cwd=cwd,
        # This checkout's shoal, not whichever one the venv has installed.
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(str(ROOT / d) for d in ("", "backend", "adapters")),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


def test_conformance_module_runs_on_shoal() -> None:
    out = _pytest("--shoal-engine", "tests/test_polars_conformance.py")
    assert out.returncode == 0, out.stdout[-3000:]
    summary = [line for line in out.stdout.splitlines() if line.startswith("shoal engine:")]
    assert summary, out.stdout[-2000:]
    ran = int(summary[0].split()[2])
    assert ran >= 20  # every test of the module collects at least once


def test_unsupported_query_fails_or_falls_back(tmp_path: Path) -> None:
    test_file = tmp_path / "test_udf.py"
    test_file.write_text(
        "import polars as pl\n\n"
        "def test_udf():\n"
        "    lf = pl.LazyFrame({'a': [1, 2]}).select(\n"
        "        pl.col('a').map_batches(lambda s: s * 2, return_dtype=pl.Int64)\n"
        "    )\n"
        "    assert lf.collect()['a'].to_list() == [2, 4]\n"
        "    assert lf.collect(engine='in-memory')['a'].to_list() == [2, 4]\n"
    )
    strict = _pytest("--shoal-engine", "--rootdir", str(tmp_path), str(test_file))
    assert strict.returncode == 1
    assert "UnsupportedError" in strict.stdout and "Python UDFs" in strict.stdout
    fallback = _pytest(
        "--shoal-engine", "--shoal-fallback", "--rootdir", str(tmp_path), str(test_file)
    )
    assert fallback.returncode == 0, fallback.stdout[-3000:]
    assert "PolarsFallbackWarning" in fallback.stdout  # shoal_polars.ShoalFallbackWarning
    assert "shoal engine: 1 LazyFrame.collect() calls ran on shoal" in fallback.stdout


def test_records_selection_and_queries_inside_tasks(tmp_path: Path) -> None:
    """``--shoal-record`` writes one JSON line per test (outcome, error class, collects
    that reached shoal); ``--shoal-only`` runs only the listed tests; a query made inside a
    shoal task (here by a UDF) stays on Polars instead of starting a nested shoal query,
    which on the local runner would wait forever for the pool its own tasks fill."""
    test_file = tmp_path / "test_suite.py"
    test_file.write_text(
        "import polars as pl\n"
        "import shoal\n\n"
        "@shoal.udf(return_dtype=pl.Int64)\n"
        "def plus_len(a: pl.Series) -> pl.Series:\n"
        "    n = pl.LazyFrame({'x': [1, 2, 3]}).select(pl.len()).collect().item()\n"
        "    return a + n\n\n"
        "def test_udf_collects_inside_a_task():\n"
        "    lf = pl.LazyFrame({'a': list(range(12))})\n"
        "    out = lf.shoal.with_udf(plus_len, inputs=['a'], output='b').collect()\n"
        "    assert out['b'].to_list() == [a + 3 for a in range(12)]\n\n"
        "def test_two_collects():\n"
        "    lf = pl.LazyFrame({'a': [3, 1, 2]})\n"
        "    assert lf.sort('a').collect()['a'].to_list() == [1, 2, 3]\n"
        "    assert lf.select(pl.col('a').sum()).collect().item() == 6\n\n"
        "def test_unsupported():\n"
        "    lf = pl.LazyFrame({'a': [1]}).select(pl.col('a').map_batches(lambda s: s))\n"
        "    lf.collect()\n\n"
        "def test_eager_only():\n"
        "    assert pl.DataFrame({'a': [1]}).height == 1\n\n"
        "def test_not_selected():\n"
        "    raise AssertionError('deselected by --shoal-only')\n"
    )
    only = tmp_path / "only.txt"
    only.write_text(
        "".join(
            f"test_suite.py::{name}\n"
            for name in ("test_udf_collects_inside_a_task", "test_two_collects",
                         "test_unsupported", "test_eager_only")
        )
    )  # fmt: skip
    record = tmp_path / "record"
    args = ["--shoal-engine", "--shoal-record", str(record), "--shoal-only", str(only)]
    out = _pytest(*args, "-p", "no:randomly", "--rootdir", str(tmp_path), str(test_file),
                  cwd=tmp_path)  # fmt: skip
    assert out.returncode == 1, out.stdout[-3000:]
    assert "1 failed, 3 passed, 1 deselected" in out.stdout, out.stdout[-3000:]
    lines = (record / "main.jsonl").read_text().splitlines()
    recs = {r["nodeid"].split("::")[1]: r for r in map(json.loads, lines)}
    assert set(recs) == {
        "test_udf_collects_inside_a_task", "test_two_collects", "test_unsupported",
        "test_eager_only",
    }  # fmt: skip
    assert recs["test_udf_collects_inside_a_task"]["outcome"] == "passed"
    assert recs["test_udf_collects_inside_a_task"]["routed"] == 1  # the UDF's stayed on Polars
    assert recs["test_udf_collects_inside_a_task"]["nested"] >= 1
    assert (recs["test_two_collects"]["outcome"], recs["test_two_collects"]["reached"]) == (
        "passed",
        2,
    )
    assert recs["test_eager_only"]["reached"] == 0
    failed = recs["test_unsupported"]
    assert (failed["outcome"], failed["when"]) == ("failed", "call")
    assert failed["error"]["type"] == "shoal.errors.UnsupportedError"
    assert "Python UDFs" in failed["error"]["message"]
