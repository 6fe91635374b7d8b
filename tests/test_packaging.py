"""Packaging (issue 18): ``pip install shoal`` is the Polars frontend on Ray; DuckDB,
Substrait, GPU discovery and TPC-H generation are extras, and a missing extra is named."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Modules of the extras, hidden from the interpreter (``sys.modules[m] = None`` makes
#: importing them raise ModuleNotFoundError, as if they were not installed).
EXTRAS_MODULES = ("duckdb", "substrait", "pynvml")


def _run(code: str) -> subprocess.CompletedProcess[str]:
    hide = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in EXTRAS_MODULES)
    return subprocess.run(
        [sys.executable, "-c", hide + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("SHOAL_")},
    )


def test_core_dependencies_are_polars_and_ray() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("=")[0].split("[")[0].strip() for d in project["dependencies"]}
    assert {"ray", "polars", "pyarrow"} <= names
    assert not names & {"duckdb", "substrait", "nvidia-ml-py", "tpchgen-cli"}
    extras = project["optional-dependencies"]
    assert {"duckdb", "substrait", "gpu", "tpch", "data", "notebook", "test"} <= set(extras)


def test_polars_query_runs_without_the_extras_and_duckdb_names_its_extra() -> None:
    out = _run(
        """
        import polars as pl
        import shoal
        lf = pl.LazyFrame({"k": [1, 2, 2, None], "v": [1.5, None, -0.0, 2.0]})
        q = lf.group_by("k").agg(pl.col("v").sum()).sort("k")
        eng = shoal.DistEngine(runner="local", raise_on_fail=True,
                               config=shoal.Config(default_partitions=2))
        assert q.collect(engine=eng).equals(q.collect())
        print("POLARS OK")
        try:
            import shoal.duckdb
        except ModuleNotFoundError as exc:
            print("DUCKDB:", exc)
        try:
            import shoal.plan.substrait
        except ModuleNotFoundError as exc:
            print("SUBSTRAIT:", exc)
        """
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "POLARS OK" in out.stdout
    assert "DUCKDB: shoal.duckdb needs duckdb" in out.stdout
    assert "pip install 'shoal[duckdb]'" in out.stdout
    assert "pip install 'shoal[substrait]'" in out.stdout


@pytest.mark.slow
def test_pip_install_without_extras_runs_a_polars_query_on_ray(tmp_path: Path) -> None:
    """A fresh virtual environment, ``pip install .`` (no extras: downloads Ray, Polars and
    pyarrow), then a Polars query on a local Ray instance."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(ROOT)], check=True, timeout=1500)
    code = textwrap.dedent(
        """
        import importlib.util
        import polars as pl
        import shoal
        assert importlib.util.find_spec("duckdb") is None
        lf = pl.LazyFrame({"a": [1, 2, 3, None]}).select(pl.col("a").sum())
        print("SUM", lf.collect(engine=shoal.DistEngine(runner="ray", raise_on_fail=True)).item())
        shoal.shutdown()
        """
    )
    out = subprocess.run(
        [str(py), "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SUM 6" in out.stdout
