"""User functions in DuckDB queries: :func:`register_udf`.

``shoal.duckdb.register_udf(con, f)`` registers the shoal UDF ``f`` (made with
``@shoal.udf``) twice under its name:

* with DuckDB (``con.create_function``, an Arrow UDF), so that native DuckDB runs it: each
  call receives DuckDB's vectors as Arrow arrays and applies ``f`` in this process (a class
  UDF: one instance per process, made on first use);
* with shoal (:func:`shoal.udf.register`), so that a shoal translation of a DuckDB plan can
  recognise the call by name: it shows as a ``BOUND_FUNCTION`` whose ``qname`` ends with the
  name. :func:`lookup_udf` finds it and :func:`udf_project_for` builds the IR for it (a
  :class:`~shoal.ir.nodes.UdfProject`, after a projection of argument expressions that are
  not plain columns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from shoal.ir.expr import Col, Expr, NamedExpr
from shoal.ir.nodes import PlanNode, Project
from shoal.ir.types import DataType, Schema
from shoal.udf import UDF, lookup, project, register

_SIMPLE = {
    pa.bool_(): "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.uint8(): "UTINYINT",
    pa.uint16(): "USMALLINT",
    pa.uint32(): "UINTEGER",
    pa.uint64(): "UBIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.large_string(): "VARCHAR",
    pa.large_binary(): "BLOB",
    pa.date32(): "DATE",
    pa.time64("us"): "TIME",
}


def duckdb_type_name(dtype: DataType | pa.DataType) -> str:
    """The DuckDB SQL type of an IR or Arrow type (``BIGINT``, ``DOUBLE[]``,
    ``STRUCT("a" INTEGER)``, ...). Raises ``ValueError`` for a type without one."""
    t = dtype.arrow if isinstance(dtype, DataType) else DataType(dtype).arrow
    if t in _SIMPLE:
        return _SIMPLE[t]
    if pa.types.is_timestamp(t):
        return (
            "TIMESTAMPTZ"
            if t.tz
            else {
                "s": "TIMESTAMP_S",
                "ms": "TIMESTAMP_MS",
                "us": "TIMESTAMP",
                "ns": "TIMESTAMP_NS",
            }[t.unit]
        )
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision}, {t.scale})"
    if pa.types.is_fixed_size_list(t):
        return f"{duckdb_type_name(t.value_type)}[{t.list_size}]"
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return f"{duckdb_type_name(t.value_type)}[]"
    if pa.types.is_struct(t):
        inner = ", ".join(f'"{f.name}" {duckdb_type_name(f.type)}' for f in t)
        return f"STRUCT({inner})"
    raise ValueError(f"no DuckDB type for {t}; pass return_type= to register_udf")


def register_udf(
    con: Any, udf: UDF, *, parameters: Sequence[Any] | None = None, return_type: Any = None
) -> UDF:
    """Register ``udf`` with the DuckDB connection ``con`` and with shoal, under
    ``udf.name``; return ``udf``.

    ``parameters`` are the DuckDB argument types (type names or ``duckdb.sqltype``
    objects; None: any arguments); ``return_type`` the DuckDB result type (None: from the
    UDF's ``return_dtype``). Raises ``TypeError`` when ``udf`` is not a shoal UDF, and
    ``ValueError`` when its return type has no DuckDB equivalent and none is given.
    DuckDB's own errors (a name already taken, say) propagate.
    """
    import duckdb
    import polars as pl

    if not isinstance(udf, UDF):
        raise TypeError(f"register_udf needs a shoal UDF (made with @shoal.udf), got {udf!r}")
    ret = return_type if return_type is not None else duckdb_type_name(udf.return_dtype)
    ret_type = duckdb.sqltype(ret) if isinstance(ret, str) else ret
    params = None
    if parameters is not None:
        params = [duckdb.sqltype(p) if isinstance(p, str) else p for p in parameters]
    arrow_type = udf.return_dtype.arrow

    def call(*arrays: Any) -> pa.Array:
        cols = [
            pl.Series(a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a) for a in arrays
        ]
        out = udf.apply(cols).to_arrow()
        return out.cast(arrow_type) if out.type != arrow_type else out

    con.create_function(
        udf.name,
        call,
        params,
        ret_type,
        type="arrow",
        null_handling="special",
        side_effects=udf.is_stateful,
    )
    register(udf)
    return udf


def lookup_udf(name: str) -> UDF | None:
    """The shoal UDF registered under ``name`` (DuckDB's function name; case-insensitive
    as DuckDB's), or None."""
    found = lookup(name)
    if found is not None:
        return found
    from shoal.udf import _registry, _registry_lock

    with _registry_lock:
        for key, u in _registry.items():
            if key.lower() == name.lower():
                return u
    return None


def udf_project_for(input: PlanNode, udf: UDF, args: Sequence[Expr], output: str) -> PlanNode:
    """The IR of ``udf(*args) AS output`` over ``input``: ``input``'s columns plus
    ``output``. Arguments that are not plain columns are first computed into columns
    ``__shoal_udf_arg<i>`` by a projection, and dropped again after the UDF.

    Raises :class:`shoal.PlanError` when an argument reads a column ``input`` lacks.
    """
    names = list(input.schema.names)
    inputs: list[str] = []
    extra: list[NamedExpr] = []
    for i, a in enumerate(args):
        if isinstance(a, Col):
            inputs.append(a.name)
        else:
            tmp = f"__shoal_udf_arg{i}"
            extra.append(NamedExpr(tmp, a))
            inputs.append(tmp)
    node = input
    if extra:
        keep = tuple(NamedExpr(n, Col(n, input.schema[n])) for n in names)
        fields = [*input.schema.fields, *((e.name, e.dtype) for e in extra)]
        node = Project(input, keep + tuple(extra), Schema(tuple(fields)))
    node = project(node, udf, inputs, output)
    if extra:
        final = [n for n in node.schema.names if not n.startswith("__shoal_udf_arg")]
        node = Project(
            node,
            tuple(NamedExpr(n, Col(n, node.schema[n])) for n in final),
            Schema(tuple((n, node.schema[n]) for n in final)),
        )
    return node
