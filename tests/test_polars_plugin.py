"""The ``--shoal-engine`` pytest plugin (:mod:`tests.plugin_shoal_engine`): a Polars-style
test module run with it runs its queries on shoal; a query shoal cannot translate fails the
test, or falls back with ``--shoal-fallback``."""

from __future__ import annotations

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
        env={**os.environ, "PYTHONPATH": str(ROOT)},
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
    assert "ShoalFallbackWarning" in fallback.stdout
    assert "shoal engine: 1 LazyFrame.collect() calls ran on shoal" in fallback.stdout
