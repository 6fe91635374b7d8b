"""shoal's DuckDB adapter, exposed as ``shoal.duckdb``.

``shoal.duckdb.sql("SELECT ...", connection=con)`` runs a query on the tables of a DuckDB
connection (DuckDB's default connection when None) distributed with shoal and returns a
lazy :class:`DistRelation` (the query runs when it is first read); ``shoal.duckdb.connect()``
/ ``shoal.duckdb.install(con)`` give a :class:`DistConnection` whose ``sql()``,
``execute()`` and ``table()`` run that way; ``shoal.duckdb.run(relation)`` does the same for
a relation built with DuckDB's relational API; ``shoal.duckdb.explain(con, query)`` shows
the plans without running.

The translation starts from DuckDB's own bound and optimised logical plan
(``json_serialize_plan``), so names, types, join order and subquery decorrelation are
DuckDB's; the semantic differences between DuckDB and the Polars kernel are made explicit
in the IR (see :mod:`shoal_duckdb.exprs` and ``docs/duckdb.md``). Public names:
:func:`sql`, :func:`connect`, :func:`install`, :class:`DistConnection`,
:class:`DistRelation`, :func:`run`, :func:`explain`, :func:`to_ir`, :func:`register_udf`,
:class:`DuckDBFallbackWarning`.
"""

from __future__ import annotations

from shoal_duckdb.api import DuckDBFallbackWarning, explain, run, sql, to_ir
from shoal_duckdb.relation import DistConnection, DistRelation, connect, install
from shoal_duckdb.udf import register_udf  # user functions (docs/udf.md)

__all__ = [
    "DistConnection",
    "DistRelation",
    "DuckDBFallbackWarning",
    "connect",
    "explain",
    "install",
    "register_udf",
    "run",
    "sql",
    "to_ir",
]
