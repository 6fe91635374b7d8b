"""Each public package can be imported first, alone, in a fresh interpreter, and works.

Regression: ``from shoal_polars import to_ir`` without importing ``shoal`` first failed at the
first translation (``shoal_polars.translate`` imported ``shoal``, whose facade imported
``shoal_polars.udf``, which imported the half-initialised translator).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

FIRST_IMPORTS = {
    "shoal_polars.to_ir": "from shoal_polars import to_ir\n"
    "print(type(to_ir(pl.LazyFrame({'k': [1]}))).__name__)",
    "shoal_polars.translate": "import shoal_polars.translate\nprint('ok')",
    "engine dist": "import shoal_polars\n"
    "print(pl.LazyFrame({'k': [1]}).collect(engine='dist').height)",
    "shoal_duckdb.to_ir": "import duckdb\nfrom shoal_duckdb import to_ir\n"
    "print(type(to_ir(duckdb.connect(), 'SELECT 1 AS x')).__name__)",
    "shoal.ir": "from shoal.ir import Frame, col, validate\n"
    "print(type(Frame).__name__, type(col('a')).__name__, validate.__name__)",
    "shoal.plan": "from shoal.plan import builder\nprint('ok')",
    "shoal.lowering": "from shoal.lowering import expressions\nprint('ok')",
    "import shoal.duckdb": "import duckdb\nimport shoal.duckdb\n"
    "print(shoal.duckdb.sql(duckdb.connect(), 'SELECT 41 + 1 AS x').fetchall()[0][0])",
    "from shoal.duckdb import sql": "from shoal.duckdb import sql\nprint(sql.__module__)",
    "shoal leaves duckdb unimported": "import sys\nimport shoal\n"
    "print('shoal_duckdb' in sys.modules, 'duckdb' in sys.modules)",
    "shoal.execution.kernel": "from shoal.execution import kernel\nprint('ok')",
}

EXPECTED = {
    "shoal_polars.to_ir": "Scan",
    "shoal_polars.translate": "ok",
    "engine dist": "1",
    "shoal_duckdb.to_ir": "Project",
    "shoal.ir": "type ExprBuilder validate",
    "shoal.plan": "ok",
    "shoal.lowering": "ok",
    "import shoal.duckdb": "42",
    "from shoal.duckdb import sql": "shoal_duckdb.api",
    "shoal leaves duckdb unimported": "False False",
    "shoal.execution.kernel": "ok",
}


@pytest.mark.parametrize("name", sorted(FIRST_IMPORTS))
def test_package_imported_first_works(name: str) -> None:
    code = "import polars as pl\n" + FIRST_IMPORTS[name]
    env_code = "import os; os.environ['SHOAL_RUNNER'] = 'local'\n" + code
    done = subprocess.run(
        [sys.executable, "-c", env_code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == EXPECTED[name]
