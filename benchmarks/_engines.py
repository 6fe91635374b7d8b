"""The engines the TPC-H benchmark compares, each behind one small interface.

An :class:`Engine` is created in its own child process (see :mod:`benchmarks._worker`),
started once (imports, connections, a runner or a Ray instance), then asked for one
callable per query that runs the query and returns the answer as a ``polars.DataFrame``.
Only that call is timed. Every engine reads the same Parquet files, except Daft, which
reads a copy with plain strings (:func:`plain_string_copy`).

Engine names (:data:`ENGINES`):

- ``polars``: native Polars, ``LazyFrame.collect()``, which is the streaming engine in
  Polars 2.1. The baseline of every ratio.
- ``polars-in-memory``: native Polars, ``collect(engine="in-memory")``.
- ``duckdb``: native DuckDB, ``con.sql(query).pl()`` over views on the Parquet files.
- ``shoal-local``, ``shoal-ray``: shoal's Polars frontend,
  ``collect(engine=shoal.DistEngine(runner=..., raise_on_fail=True))``.
- ``shoal-duckdb-local``, ``shoal-duckdb-ray``: shoal's DuckDB frontend,
  ``shoal.duckdb.sql(con, query, runner=..., raise_on_fail=True)``.
- ``daft``: Daft SQL (``daft.sql``) over ``daft.read_parquet`` tables, on a local Ray
  instance started like shoal's (or on ``--ray-address``).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar, Literal

import polars as pl

from shoal.tpch.queries import TABLE_NAMES

QueryFn = Callable[[], pl.DataFrame]
"""One run of one query: returns the answer as a Polars DataFrame."""


class EngineUnavailable(Exception):
    """The engine cannot run here (a package is missing, an adapter not written yet)."""


class QueryUnsupported(Exception):
    """The engine cannot run this query (it says so, or the benchmark has no form for it)."""


@dataclass(frozen=True)
class EngineOptions:
    """Settings shared by all engines of one benchmark run."""

    ray_address: str | None = None
    """A Ray cluster for the Ray-based engines (shoal-ray, shoal-duckdb-ray, daft); None
    starts a local instance per engine process."""
    ray_temp_dir: str | None = None
    """Session directory of a local Ray instance started by the engine (keep it short)."""
    daft_path: str | None = None
    """A directory holding the ``daft`` package (installed with ``pip install --no-deps
    --target DIR daft``) when it is not importable from the environment."""


class Engine(ABC):
    """One way of running the TPC-H queries. Subclasses set :attr:`name` and
    :attr:`description` and implement :meth:`start` and :meth:`query`."""

    name: ClassVar[str]
    description: ClassVar[str]
    uses_ray: ClassVar[bool] = False

    def __init__(self, data_dir: Path, options: EngineOptions) -> None:
        self.data_dir = data_dir
        self.options = options

    @abstractmethod
    def start(self) -> None:
        """Import, connect, start runners. Raises :class:`EngineUnavailable` when the
        engine cannot run here."""

    @abstractmethod
    def query(self, number: int) -> QueryFn:
        """A callable running TPC-H query ``number`` once. Raises
        :class:`QueryUnsupported` when the engine has no form of that query."""

    def close(self) -> None:  # noqa: B027 - most engines hold nothing to release
        """Release what :meth:`start` acquired."""

    def versions(self) -> dict[str, str]:
        """Package versions that matter for this engine."""
        return _versions("polars")


def _versions(*packages: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for package in packages:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            module = sys.modules.get(package)
            version = getattr(module, "__version__", None)
            if version:
                found[package] = str(version)
    return found


class PolarsEngine(Engine):
    """Native Polars, streaming engine (``collect()``)."""

    name = "polars"
    description = "native Polars, `collect()` (the streaming engine in Polars 2.1); the baseline"
    collect_engine: ClassVar[Literal["in-memory", "streaming"] | None] = None

    def start(self) -> None:
        from shoal.tpch.queries import scan_tables

        self.tables = scan_tables(self.data_dir)

    def query(self, number: int) -> QueryFn:
        from shoal.tpch.queries import QUERIES

        lazy = QUERIES[number]
        tables = self.tables
        if self.collect_engine is None:
            return lambda: lazy(tables).collect()
        engine = self.collect_engine
        return lambda: lazy(tables).collect(engine=engine)


class PolarsInMemoryEngine(PolarsEngine):
    """Native Polars, in-memory engine."""

    name = "polars-in-memory"
    description = 'native Polars, `collect(engine="in-memory")`'
    collect_engine = "in-memory"


class ShoalPolarsEngine(Engine):
    """shoal's Polars frontend on one runner."""

    runner: ClassVar[str] = "local"

    def start(self) -> None:
        import shoal
        from shoal.tpch.queries import scan_tables

        if self.runner == "ray":
            _configure_shoal_ray(self.options)
        self.tables = scan_tables(self.data_dir)
        self.engine = shoal.DistEngine(runner=self.runner, raise_on_fail=True)  # type: ignore[arg-type]
        # Start the runner now (for Ray: the local instance), so that no query pays for it.
        pl.LazyFrame({"x": [1, 2, 3]}).select(pl.col("x").sum()).collect(engine=self.engine)

    def query(self, number: int) -> QueryFn:
        from shoal.tpch.queries import QUERIES

        lazy = QUERIES[number]
        tables, engine = self.tables, self.engine
        return lambda: _unsupported_as(lambda: lazy(tables).collect(engine=engine))

    def close(self) -> None:
        import shoal

        shoal.shutdown()

    def versions(self) -> dict[str, str]:
        return _versions("shoal", "polars", "ray" if self.runner == "ray" else "pyarrow")


class ShoalLocalEngine(ShoalPolarsEngine):
    name = "shoal-local"
    description = (
        "shoal, Polars frontend, local runner (threads in one process): "
        '`collect(engine=shoal.DistEngine(runner="local", raise_on_fail=True))`'
    )
    runner = "local"


class ShoalRayEngine(ShoalPolarsEngine):
    name = "shoal-ray"
    description = (
        "shoal, Polars frontend, Ray runner (local Ray instance unless --ray-address): "
        '`collect(engine=shoal.DistEngine(runner="ray", raise_on_fail=True))`'
    )
    runner = "ray"
    uses_ray = True


def _configure_shoal_ray(options: EngineOptions) -> None:
    """Point shoal's Ray runner at ``--ray-address`` or a short local session dir."""
    import shoal

    settings: dict[str, Any] = {}
    if options.ray_address:
        settings["ray_address"] = options.ray_address
    elif options.ray_temp_dir and not shoal.get_config().ray_temp_dir:
        settings["ray_temp_dir"] = options.ray_temp_dir
    if settings:
        shoal.set_config(**settings)


def _unsupported_as(run: Callable[[], pl.DataFrame]) -> pl.DataFrame:
    """Run ``run``, turning shoal's ``UnsupportedError`` into :class:`QueryUnsupported`."""
    import shoal

    try:
        return run()
    except shoal.UnsupportedError as exc:
        raise QueryUnsupported(str(exc)) from exc


def _to_polars(answer: Any) -> pl.DataFrame:
    """A query answer (Polars, Arrow, a DuckDB relation) as a ``polars.DataFrame``."""
    if isinstance(answer, pl.DataFrame):
        return answer
    if hasattr(answer, "pl"):  # a DuckDB relation
        return answer.pl()
    if hasattr(answer, "to_arrow_table"):
        return pl.DataFrame(pl.from_arrow(answer.to_arrow_table()))
    return pl.DataFrame(pl.from_arrow(answer))


class DuckDBEngine(Engine):
    """Native DuckDB over views on the Parquet files."""

    name = "duckdb"
    description = "native DuckDB, `con.sql(query).pl()` over views on the same Parquet files"

    def start(self) -> None:
        import duckdb

        from shoal.tpch.sql import register_tpch

        self.con = duckdb.connect()
        register_tpch(self.con, self.data_dir, kind="view")

    def query(self, number: int) -> QueryFn:
        from shoal.tpch.sql import SQL_QUERIES

        text = SQL_QUERIES[number]
        con = self.con
        return lambda: con.sql(text).pl()

    def close(self) -> None:
        self.con.close()

    def versions(self) -> dict[str, str]:
        return _versions("duckdb", "polars")


class ShoalDuckDBEngine(Engine):
    """shoal's DuckDB frontend on one runner."""

    runner: ClassVar[str] = "local"

    def start(self) -> None:
        import duckdb

        import shoal
        from shoal.tpch.sql import register_tpch

        try:
            self.sql = shoal.duckdb.sql
        except (ImportError, AttributeError) as exc:
            raise EngineUnavailable(
                f"shoal's DuckDB frontend is not available: {type(exc).__name__}: {exc}"
            ) from exc
        if self.runner == "ray":
            _configure_shoal_ray(self.options)
        self.con = duckdb.connect()
        register_tpch(self.con, self.data_dir, kind="view")
        # Start the runner now (for Ray: the local instance), so that no query pays for it.
        _to_polars(
            self.sql(self.con, "SELECT max(r_regionkey) AS n FROM region", runner=self.runner)
        )

    def query(self, number: int) -> QueryFn:
        from shoal.tpch.sql import SQL_QUERIES

        text = SQL_QUERIES[number]
        con, sql, runner = self.con, self.sql, self.runner
        return lambda: _unsupported_as(
            lambda: _to_polars(sql(con, text, runner=runner, raise_on_fail=True))
        )

    def close(self) -> None:
        import shoal

        shoal.shutdown()
        self.con.close()

    def versions(self) -> dict[str, str]:
        return _versions("shoal", "duckdb", "ray" if self.runner == "ray" else "pyarrow")


class ShoalDuckDBLocalEngine(ShoalDuckDBEngine):
    name = "shoal-duckdb-local"
    description = (
        "shoal, DuckDB frontend, local runner: "
        '`shoal.duckdb.sql(con, query, runner="local", raise_on_fail=True)`'
    )
    runner = "local"


class ShoalDuckDBRayEngine(ShoalDuckDBEngine):
    name = "shoal-duckdb-ray"
    description = (
        "shoal, DuckDB frontend, Ray runner: "
        '`shoal.duckdb.sql(con, query, runner="ray", raise_on_fail=True)`'
    )
    runner = "ray"
    uses_ray = True


DAFT_REWRITES: dict[int, list[tuple[str, str]]] = {
    # Daft 0.7.26 refuses decimal products and quotients whose exact precision exceeds 38
    # digits: narrow the intermediate, or divide in doubles.
    1: [
        (
            "l_extendedprice * (1 - l_discount) * (1 + l_tax)",
            "CAST(l_extendedprice * (1 - l_discount) AS DECIMAL(15, 4)) * (1 + l_tax)",
        )
    ],
    8: [
        (
            "sum(CASE WHEN nation = 'BRAZIL' THEN volume ELSE 0 END) / sum(volume)",
            "CAST(sum(CASE WHEN nation = 'BRAZIL' THEN volume ELSE CAST(0 AS DECIMAL(38, 4)) "
            "END) AS DOUBLE) / CAST(sum(volume) AS DOUBLE)",
        )
    ],
    9: [
        (
            "l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity",
            "CAST(l_extendedprice * (1 - l_discount) AS DECIMAL(20, 4)) "
            "- CAST(ps_supplycost * l_quantity AS DECIMAL(20, 4))",
        )
    ],
    # Daft's decimal literals are doubles: 0.06 + 0.01 is 0.06999999999999999, which
    # drops the rows with discount 0.07. Spell out the bounds.
    6: [("BETWEEN 0.06 - 0.01 AND 0.06 + 0.01", "BETWEEN 0.05 AND 0.07")],
    # CASE branches must share a type: ELSE 0 is an integer.
    14: [("ELSE 0\n", "ELSE CAST(0 AS DECIMAL(38, 4))\n")],
    # No SUBSTRING(x FROM a FOR b) syntax; Daft's substr() counts from 0, left() is plain.
    22: [("substring(c_phone FROM 1 FOR 2)", "left(c_phone, 2)")],
}
"""Textual edits that turn the DuckDB SQL of a query into SQL Daft 0.7 accepts: each
``(old, new)`` pair replaces every occurrence. A pair whose ``old`` text is absent (the
SQL changed) is skipped, and the query then runs unedited."""


def daft_sql(number: int) -> str:
    """The SQL text of TPC-H query ``number`` for Daft: the DuckDB text with
    :data:`DAFT_REWRITES` applied."""
    from shoal.tpch.sql import SQL_QUERIES

    text = SQL_QUERIES[number]
    for old, new in DAFT_REWRITES.get(number, []):
        text = text.replace(old, new)
    return text


class DaftEngine(Engine):
    """Daft SQL on Ray, over a plain-string copy of the data."""

    name = "daft"
    description = (
        "Daft, `daft.sql(query, **tables).to_arrow()` over `daft.read_parquet` tables, on Ray "
        "(`daft.set_runner_ray`); reads a copy of the data with plain strings (Daft 0.7 cannot "
        "read Utf8View); a few queries edited for Daft's SQL (`DAFT_REWRITES`)"
    )
    uses_ray = True

    def start(self) -> None:
        if self.options.daft_path:
            path = str(Path(self.options.daft_path).resolve())
            sys.path.insert(0, path)
            # Ray workers inherit the environment of the raylet, started by this process.
            os.environ["PYTHONPATH"] = os.pathsep.join(
                p for p in (path, os.environ.get("PYTHONPATH")) if p
            )
        os.environ.setdefault("DAFT_PROGRESS_BAR", "0")
        try:
            import daft
        except ImportError as exc:
            raise EngineUnavailable(
                "Daft is not installed (pip install --no-deps --target DIR daft tqdm, "
                "then --daft-path DIR)"
            ) from exc
        import ray

        import shoal

        if not ray.is_initialized():
            config = shoal.get_config()
            address = self.options.ray_address or config.ray_address
            if address:
                ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
            else:
                ray.init(
                    num_cpus=config.num_cpus,
                    object_store_memory=config.object_store_bytes,
                    _temp_dir=self.options.ray_temp_dir or config.ray_temp_dir,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                )
        daft.set_runner_ray(noop_if_initialized=True)
        root = plain_string_copy(self.data_dir)
        self.tables = {
            name: daft.read_parquet(str(root / name / "*.parquet")) for name in TABLE_NAMES
        }
        self.daft = daft
        # Start Daft's Ray actors now, so that no query pays for them.
        daft.sql("SELECT count(*) AS n FROM region", region=self.tables["region"]).to_arrow()

    def query(self, number: int) -> QueryFn:
        text = daft_sql(number)
        daft, tables = self.daft, self.tables
        return lambda: pl.DataFrame(pl.from_arrow(daft.sql(text, **tables).to_arrow()))

    def close(self) -> None:
        import ray

        ray.shutdown()

    def versions(self) -> dict[str, str]:
        found = _versions("daft", "ray", "pyarrow")
        if "daft" not in found and "daft" in sys.modules:
            found["daft"] = str(getattr(sys.modules["daft"], "__version__", "?"))
        return found


ENGINES: dict[str, type[Engine]] = {
    cls.name: cls
    for cls in (
        PolarsEngine,
        PolarsInMemoryEngine,
        DuckDBEngine,
        ShoalLocalEngine,
        ShoalRayEngine,
        ShoalDuckDBLocalEngine,
        ShoalDuckDBRayEngine,
        DaftEngine,
    )
}
"""Every engine by name, in the order of the report's columns."""

BASELINE = "polars"
"""The engine every ratio is relative to, and whose answers are the expected ones."""


_PLAIN_MARKER = "_PLAIN_STRINGS_COMPLETE.json"


def plain_string_copy(data_dir: Path) -> Path:
    """A copy of the TPC-H Parquet files under ``data_dir`` with ``large_string`` where
    the originals have ``string_view`` (Daft 0.7 cannot read Utf8View).

    Written once to ``<data_dir>-plainstrings`` (row group by row group, so memory stays
    small) and reused while its marker lists the same source files and sizes.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = Path(data_dir)
    target = source.with_name(source.name + "-plainstrings")
    files = sorted(source.glob("*/*.parquet"))
    fingerprint = {str(f.relative_to(source)): f.stat().st_size for f in files}
    marker = target / _PLAIN_MARKER
    try:
        if json.loads(marker.read_text()) == fingerprint:
            return target
    except (OSError, ValueError):
        pass
    for path in files:
        out = target / path.relative_to(source)
        out.parent.mkdir(parents=True, exist_ok=True)
        reader = pq.ParquetFile(path)
        schema = pa.schema(
            [
                field.with_type(pa.large_string()) if pa.types.is_string_view(field.type) else field
                for field in reader.schema_arrow
            ]
        )
        with pq.ParquetWriter(out, schema) as writer:
            for group in range(reader.num_row_groups):
                writer.write_table(reader.read_row_group(group).cast(schema))
    marker.write_text(json.dumps(fingerprint))
    return target
