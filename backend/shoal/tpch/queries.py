"""TPC-H queries written with the Polars lazy API.

Each query follows the query text of the TPC-H specification (revision 3) with its
validation substitution parameters, and has the same shape::

    def qN(tables: Tables) -> pl.LazyFrame

``tables`` maps a table name (``"lineitem"``, ``"orders"``, ...) to a ``LazyFrame``, as
:func:`scan_tables` returns. Money columns stay ``Decimal`` (never cast to float), so that a
distributed run can be compared exactly with native Polars. To add a query, write its
function, then add it to :data:`QUERIES` and its ORDER BY to :data:`SORT_KEYS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TypeAlias

import polars as pl

Tables: TypeAlias = Mapping[str, pl.LazyFrame]
"""A LazyFrame per TPC-H table name."""

Query: TypeAlias = Callable[[Tables], pl.LazyFrame]

TABLE_NAMES: tuple[str, ...] = (
    "region",
    "nation",
    "supplier",
    "customer",
    "part",
    "partsupp",
    "orders",
    "lineitem",
)
"""The eight TPC-H tables."""


def scan_tables(data_dir: str | Path) -> dict[str, pl.LazyFrame]:
    """Scan every TPC-H table under ``data_dir``.

    Each table is read lazily from all files matching ``data_dir/<table>/*.parquet``
    with :func:`polars.scan_parquet`.

    Raises ``FileNotFoundError`` when a table has no Parquet file there.
    """
    root = Path(data_dir)
    tables: dict[str, pl.LazyFrame] = {}
    for name in TABLE_NAMES:
        if not any((root / name).glob("*.parquet")):
            raise FileNotFoundError(f"no Parquet files for table {name!r} in {root / name}")
        tables[name] = pl.scan_parquet(root / name / "*.parquet")
    return tables


def _revenue() -> pl.Expr:
    """``l_extendedprice * (1 - l_discount)``, the discounted price of a line item."""
    return pl.col("l_extendedprice") * (1 - pl.col("l_discount"))


def q1(tables: Tables) -> pl.LazyFrame:
    """Q1, pricing summary report (DELTA = 90 days)."""
    ship_cutoff = date(1998, 12, 1) - timedelta(days=90)
    return (
        tables["lineitem"]
        .filter(pl.col("l_shipdate") <= ship_cutoff)
        .group_by("l_returnflag", "l_linestatus")
        .agg(
            pl.col("l_quantity").sum().alias("sum_qty"),
            pl.col("l_extendedprice").sum().alias("sum_base_price"),
            _revenue().sum().alias("sum_disc_price"),
            (_revenue() * (1 + pl.col("l_tax"))).sum().alias("sum_charge"),
            pl.col("l_quantity").mean().alias("avg_qty"),
            pl.col("l_extendedprice").mean().alias("avg_price"),
            pl.col("l_discount").mean().alias("avg_disc"),
            pl.len().alias("count_order"),
        )
        .sort("l_returnflag", "l_linestatus")
    )


def q3(tables: Tables) -> pl.LazyFrame:
    """Q3, shipping priority (SEGMENT = BUILDING, DATE = 1995-03-15), first 10 rows."""
    segment = "BUILDING"
    day = date(1995, 3, 15)
    customer = tables["customer"].filter(pl.col("c_mktsegment") == segment)
    orders = tables["orders"].filter(pl.col("o_orderdate") < day)
    lineitem = tables["lineitem"].filter(pl.col("l_shipdate") > day)
    return (
        customer.join(orders, left_on="c_custkey", right_on="o_custkey")
        .join(lineitem, left_on="o_orderkey", right_on="l_orderkey")
        .group_by("o_orderkey", "o_orderdate", "o_shippriority")
        .agg(_revenue().sum().alias("revenue"))
        .select(
            pl.col("o_orderkey").alias("l_orderkey"),
            "revenue",
            "o_orderdate",
            "o_shippriority",
        )
        .sort(["revenue", "o_orderdate"], descending=[True, False])
        .head(10)
    )


def q5(tables: Tables) -> pl.LazyFrame:
    """Q5, local supplier volume (REGION = ASIA, DATE = 1994-01-01)."""
    region = "ASIA"
    start = date(1994, 1, 1)
    end = date(1995, 1, 1)  # start + 1 year
    orders = tables["orders"].filter(pl.col("o_orderdate") >= start, pl.col("o_orderdate") < end)
    return (
        tables["region"]
        .filter(pl.col("r_name") == region)
        .join(tables["nation"], left_on="r_regionkey", right_on="n_regionkey")
        .join(tables["customer"], left_on="n_nationkey", right_on="c_nationkey")
        .join(orders, left_on="c_custkey", right_on="o_custkey")
        .join(tables["lineitem"], left_on="o_orderkey", right_on="l_orderkey")
        .join(
            tables["supplier"],
            left_on=["l_suppkey", "n_nationkey"],
            right_on=["s_suppkey", "s_nationkey"],
        )
        .group_by("n_name")
        .agg(_revenue().sum().alias("revenue"))
        .sort("revenue", descending=True)
    )


def q6(tables: Tables) -> pl.LazyFrame:
    """Q6, forecasting revenue change (DATE = 1994-01-01, DISCOUNT = 0.06, QUANTITY = 24)."""
    start = date(1994, 1, 1)
    end = date(1995, 1, 1)  # start + 1 year
    discount = Decimal("0.06")
    quantity = 24
    return (
        tables["lineitem"]
        .filter(
            pl.col("l_shipdate") >= start,
            pl.col("l_shipdate") < end,
            pl.col("l_discount").is_between(discount - Decimal("0.01"), discount + Decimal("0.01")),
            pl.col("l_quantity") < quantity,
        )
        .select((pl.col("l_extendedprice") * pl.col("l_discount")).sum().alias("revenue"))
    )


def q10(tables: Tables) -> pl.LazyFrame:
    """Q10, returned item reporting (DATE = 1993-10-01), first 20 rows."""
    start = date(1993, 10, 1)
    end = date(1994, 1, 1)  # start + 3 months
    orders = tables["orders"].filter(pl.col("o_orderdate") >= start, pl.col("o_orderdate") < end)
    lineitem = tables["lineitem"].filter(pl.col("l_returnflag") == "R")
    return (
        tables["customer"]
        .join(orders, left_on="c_custkey", right_on="o_custkey")
        .join(lineitem, left_on="o_orderkey", right_on="l_orderkey")
        .join(tables["nation"], left_on="c_nationkey", right_on="n_nationkey")
        .group_by("c_custkey", "c_name", "c_acctbal", "c_phone", "n_name", "c_address", "c_comment")
        .agg(_revenue().sum().alias("revenue"))
        .select(
            "c_custkey",
            "c_name",
            "revenue",
            "c_acctbal",
            "n_name",
            "c_address",
            "c_phone",
            "c_comment",
        )
        .sort("revenue", descending=True)
        .head(20)
    )


QUERIES: dict[int, Query] = {1: q1, 3: q3, 5: q5, 6: q6, 10: q10}
"""The implemented queries, by TPC-H query number."""

SORT_KEYS: dict[int, list[tuple[str, bool]]] = {
    1: [("l_returnflag", False), ("l_linestatus", False)],
    3: [("revenue", True), ("o_orderdate", False)],
    5: [("revenue", True)],
    6: [],
    10: [("revenue", True)],
}
"""The ORDER BY of each query: ``(column, descending)`` pairs, outermost first."""
