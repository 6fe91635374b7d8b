"""TPC-H data generation with ``tpchgen-cli``, cached on disk.

:func:`generate` writes ``<data_dir>/sf<scale>/<table>/<table>.<i>.parquet`` (small tables
get fewer files than large ones) and reuses that directory on later calls. The default
``data_dir`` is ``$SHOAL_DATA_DIR`` or ``~/.cache/shoal/tpch``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq

from shoal.tpch.queries import TABLE_NAMES

MARKER = "_SHOAL_COMPLETE.json"
"""The file written last into a generated directory; its presence means "complete"."""


def default_data_dir() -> Path:
    """``$SHOAL_DATA_DIR`` when set, else ``~/.cache/shoal/tpch``."""
    env = os.environ.get("SHOAL_DATA_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "shoal" / "tpch"


def default_parts(scale: float) -> int:
    """The number of files per table when none is asked for: 4 below scale 1, else 8."""
    return 4 if scale < 1 else 8


def find_tpchgen() -> Path:
    """The ``tpchgen-cli`` executable: next to ``sys.executable`` first, then on ``PATH``.

    Raises ``FileNotFoundError`` (saying how to install it) when there is none.
    """
    beside = Path(sys.executable).parent / "tpchgen-cli"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("tpchgen-cli")
    if found is None:
        raise FileNotFoundError(
            "tpchgen-cli not found next to the Python interpreter or on PATH; "
            "install it with `pip install 'shoal[tpch]'` (or `pip install tpchgen-cli`)"
        )
    return Path(found)


def generate(
    scale: float,
    data_dir: str | Path | None = None,
    parts: int | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Generate TPC-H data at ``scale`` as Parquet, or reuse a complete earlier run.

    Returns ``<data_dir>/sf<scale>``, which holds one directory per table with
    ``<table>.<i>.parquet`` files (``i`` from 1; at most ``parts`` files per table, small
    tables get fewer). ``data_dir`` defaults to :func:`default_data_dir`; ``parts``
    defaults to :func:`default_parts`. An existing directory is reused when its marker says
    it is complete and, if ``parts`` is given, was made with that many parts; otherwise it
    is generated again. Data is written to a temporary directory beside the target and
    renamed into place, so an interrupted run never leaves a half-written cache.

    ``say``, when given, is called with one line before the data is generated (what, where,
    with which ``tpchgen-cli``) and one when it is done (how long it took), or with one
    line saying which cached directory is reused: ``shoal tpch`` prints them, since scale 1
    takes seconds and scale 10 over a minute.

    Raises ``ValueError`` for a scale or parts that is not positive, ``FileNotFoundError``
    when ``tpchgen-cli`` is missing, and ``RuntimeError`` when it fails or writes no data
    for a table.
    """
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if parts is not None and parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    scale_text = f"{scale:g}"
    target = root / f"sf{scale_text}"
    if _is_complete(target, parts):
        if say is not None:
            say(f"using the TPC-H scale {scale_text} data cached in {target}")
        return target

    n_parts = parts if parts is not None else default_parts(scale)
    started = time.monotonic()
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".sf{scale_text}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        tpchgen = find_tpchgen()
        if say is not None:
            say(
                f"generating TPC-H scale {scale_text} data ({n_parts} Parquet files per "
                f"large table) into {target} with {tpchgen} ..."
            )
        command = [
            str(tpchgen),
            "parquet",
            "--scale-factor",
            scale_text,
            "--parts",
            str(n_parts),
            "--output-dir",
            str(tmp),
            "--quiet",
        ]
        proc = subprocess.run(command, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(
                f"tpchgen-cli failed with exit code {proc.returncode}: "
                f"{' '.join(command)}\n{proc.stderr.strip()}"
            )
        missing = [name for name in TABLE_NAMES if not any((tmp / name).glob("*.parquet"))]
        if missing:
            raise RuntimeError(f"tpchgen-cli wrote no Parquet files for tables {missing}")
        (tmp / MARKER).write_text(json.dumps({"scale": scale, "parts": n_parts}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if say is not None:
        say(f"generated in {time.monotonic() - started:.1f} s")
    return target


def _is_complete(path: Path, parts: int | None) -> bool:
    """Whether ``path`` holds a finished generation (with ``parts`` parts, when given)."""
    try:
        info = json.loads((path / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return parts is None or info.get("parts") == parts


def add_empty_partition(data_dir: str | Path) -> list[Path]:
    """Add one zero-row Parquet file to every table directory under ``data_dir``.

    Each file, ``<table>/<table>.empty.parquet``, has the exact Arrow schema of the table's
    existing files, so a scan of ``<table>/*.parquet`` sees one more, empty, partition.
    Returns the paths written. Raises ``FileNotFoundError`` when a table has no Parquet
    file to take the schema from.
    """
    root = Path(data_dir)
    written: list[Path] = []
    for name in TABLE_NAMES:
        existing = sorted((root / name).glob(f"{name}.[0-9]*.parquet"))
        if not existing:
            raise FileNotFoundError(f"no Parquet files for table {name!r} in {root / name}")
        schema = pq.read_schema(existing[0])
        path = root / name / f"{name}.empty.parquet"
        pq.write_table(schema.empty_table(), path)
        written.append(path)
    return written
