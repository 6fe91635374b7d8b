"""shoal's DuckDB adapter, exposed as ``shoal.duckdb``.

``shoal.duckdb.sql(con, "SELECT ...")`` runs a query on the tables of a DuckDB connection
distributed with shoal and returns a ``duckdb.DuckDBPyRelation`` on that connection holding
the result; ``shoal.duckdb.run(relation)`` does the same for a relation built with DuckDB's
relational API; ``shoal.duckdb.explain(con, query)`` shows the plans without running.

The translation starts from DuckDB's own bound and optimised logical plan
(``json_serialize_plan``), so names, types, join order and subquery decorrelation are
DuckDB's; the semantic differences between DuckDB and the Polars kernel are made explicit
in the IR (see :mod:`shoal_duckdb.exprs` and ``docs/duckdb.md``). Public names:
:func:`sql`, :func:`run`, :func:`explain`, :func:`to_ir`, :class:`DuckDBFallbackWarning`.
"""

from __future__ import annotations

from shoal_duckdb.api import DuckDBFallbackWarning, explain, run, sql, to_ir
from shoal_duckdb.udf import register_udf as register_udf  # user functions (docs/udf.md)

__all__ = ["DuckDBFallbackWarning", "explain", "run", "sql", "to_ir"]
