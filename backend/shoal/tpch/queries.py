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


def q2(tables: Tables) -> pl.LazyFrame:
    """Q2, minimum cost supplier (SIZE = 15, TYPE = BRASS, REGION = EUROPE), first 100 rows."""
    size = 15
    type_suffix = "BRASS"
    region = "EUROPE"
    europe = (
        tables["region"]
        .filter(pl.col("r_name") == region)
        .join(tables["nation"], left_on="r_regionkey", right_on="n_regionkey")
        .join(tables["supplier"], left_on="n_nationkey", right_on="s_nationkey")
        .join(tables["partsupp"], left_on="s_suppkey", right_on="ps_suppkey")
    )
    parts = tables["part"].filter(
        pl.col("p_size") == size, pl.col("p_type").str.ends_with(type_suffix)
    )
    candidates = parts.join(europe, left_on="p_partkey", right_on="ps_partkey")
    min_cost = europe.group_by("ps_partkey").agg(pl.col("ps_supplycost").min().alias("min_cost"))
    return (
        candidates.join(min_cost, left_on="p_partkey", right_on="ps_partkey")
        .filter(pl.col("ps_supplycost") == pl.col("min_cost"))
        .select(
            "s_acctbal",
            "s_name",
            "n_name",
            "p_partkey",
            "p_mfgr",
            "s_address",
            "s_phone",
            "s_comment",
        )
        .sort(
            ["s_acctbal", "n_name", "s_name", "p_partkey"], descending=[True, False, False, False]
        )
        .head(100)
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


def q4(tables: Tables) -> pl.LazyFrame:
    """Q4, order priority checking (DATE = 1993-07-01)."""
    start = date(1993, 7, 1)
    end = date(1993, 10, 1)  # start + 3 months
    late_lines = tables["lineitem"].filter(pl.col("l_commitdate") < pl.col("l_receiptdate"))
    return (
        tables["orders"]
        .filter(pl.col("o_orderdate") >= start, pl.col("o_orderdate") < end)
        .join(late_lines, left_on="o_orderkey", right_on="l_orderkey", how="semi")
        .group_by("o_orderpriority")
        .agg(pl.len().alias("order_count"))
        .sort("o_orderpriority")
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


def q7(tables: Tables) -> pl.LazyFrame:
    """Q7, volume shipping (NATION1 = FRANCE, NATION2 = GERMANY)."""
    nation1, nation2 = "FRANCE", "GERMANY"
    nations = tables["nation"].filter(pl.col("n_name").is_in([nation1, nation2]))
    suppliers = tables["supplier"].join(
        nations.select(pl.col("n_nationkey"), pl.col("n_name").alias("supp_nation")),
        left_on="s_nationkey",
        right_on="n_nationkey",
    )
    customers = tables["customer"].join(
        nations.select(pl.col("n_nationkey"), pl.col("n_name").alias("cust_nation")),
        left_on="c_nationkey",
        right_on="n_nationkey",
    )
    lineitem = tables["lineitem"].filter(
        pl.col("l_shipdate").is_between(date(1995, 1, 1), date(1996, 12, 31))
    )
    return (
        lineitem.join(suppliers, left_on="l_suppkey", right_on="s_suppkey")
        .join(tables["orders"], left_on="l_orderkey", right_on="o_orderkey")
        .join(customers, left_on="o_custkey", right_on="c_custkey")
        .filter(
            ((pl.col("supp_nation") == nation1) & (pl.col("cust_nation") == nation2))
            | ((pl.col("supp_nation") == nation2) & (pl.col("cust_nation") == nation1))
        )
        .select(
            "supp_nation",
            "cust_nation",
            pl.col("l_shipdate").dt.year().alias("l_year"),
            _revenue().alias("volume"),
        )
        .group_by("supp_nation", "cust_nation", "l_year")
        .agg(pl.col("volume").sum().alias("revenue"))
        .sort("supp_nation", "cust_nation", "l_year")
    )


def q8(tables: Tables) -> pl.LazyFrame:
    """Q8, national market share (NATION = BRAZIL, REGION = AMERICA,
    TYPE = ECONOMY ANODIZED STEEL)."""
    nation = "BRAZIL"
    region = "AMERICA"
    part_type = "ECONOMY ANODIZED STEEL"
    customers = (
        tables["region"]
        .filter(pl.col("r_name") == region)
        .join(tables["nation"], left_on="r_regionkey", right_on="n_regionkey")
        .join(tables["customer"], left_on="n_nationkey", right_on="c_nationkey")
        .select("c_custkey")
    )
    suppliers = tables["supplier"].join(
        tables["nation"].select("n_nationkey", pl.col("n_name").alias("nation")),
        left_on="s_nationkey",
        right_on="n_nationkey",
    )
    orders = tables["orders"].filter(
        pl.col("o_orderdate").is_between(date(1995, 1, 1), date(1996, 12, 31))
    )
    volume = _revenue()
    return (
        tables["part"]
        .filter(pl.col("p_type") == part_type)
        .join(tables["lineitem"], left_on="p_partkey", right_on="l_partkey")
        .join(suppliers, left_on="l_suppkey", right_on="s_suppkey")
        .join(orders, left_on="l_orderkey", right_on="o_orderkey")
        .join(customers, left_on="o_custkey", right_on="c_custkey")
        .group_by(pl.col("o_orderdate").dt.year().alias("o_year"))
        .agg(
            (
                pl.when(pl.col("nation") == nation).then(volume).otherwise(0).sum() / volume.sum()
            ).alias("mkt_share")
        )
        .sort("o_year")
    )


def q9(tables: Tables) -> pl.LazyFrame:
    """Q9, product type profit measure (COLOR = green)."""
    color = "green"
    amount = _revenue() - pl.col("ps_supplycost") * pl.col("l_quantity")
    return (
        tables["part"]
        .filter(pl.col("p_name").str.contains(color, literal=True))
        .join(tables["lineitem"], left_on="p_partkey", right_on="l_partkey")
        .join(
            tables["partsupp"],
            left_on=["p_partkey", "l_suppkey"],
            right_on=["ps_partkey", "ps_suppkey"],
        )
        .join(tables["supplier"], left_on="l_suppkey", right_on="s_suppkey")
        .join(tables["orders"], left_on="l_orderkey", right_on="o_orderkey")
        .join(tables["nation"], left_on="s_nationkey", right_on="n_nationkey")
        .group_by(pl.col("n_name").alias("nation"), pl.col("o_orderdate").dt.year().alias("o_year"))
        .agg(amount.sum().alias("sum_profit"))
        .sort(["nation", "o_year"], descending=[False, True])
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


def q11(tables: Tables) -> pl.LazyFrame:
    """Q11, important stock identification (NATION = GERMANY, FRACTION = 0.0001)."""
    nation = "GERMANY"
    fraction = Decimal("0.0001")
    stock = (
        tables["nation"]
        .filter(pl.col("n_name") == nation)
        .join(tables["supplier"], left_on="n_nationkey", right_on="s_nationkey")
        .join(tables["partsupp"], left_on="s_suppkey", right_on="ps_suppkey")
        .select("ps_partkey", (pl.col("ps_supplycost") * pl.col("ps_availqty")).alias("value"))
    )
    threshold = stock.select((pl.col("value").sum() * fraction).alias("threshold"))
    return (
        stock.group_by("ps_partkey")
        .agg(pl.col("value").sum())
        .join(threshold, how="cross")
        .filter(pl.col("value") > pl.col("threshold"))
        .select("ps_partkey", "value")
        .sort("value", descending=True)
    )


def q12(tables: Tables) -> pl.LazyFrame:
    """Q12, shipping modes and order priority (SHIPMODE1 = MAIL, SHIPMODE2 = SHIP,
    DATE = 1994-01-01)."""
    modes = ["MAIL", "SHIP"]
    start = date(1994, 1, 1)
    end = date(1995, 1, 1)  # start + 1 year
    high = pl.col("o_orderpriority").is_in(["1-URGENT", "2-HIGH"])
    return (
        tables["orders"]
        .join(tables["lineitem"], left_on="o_orderkey", right_on="l_orderkey")
        .filter(
            pl.col("l_shipmode").is_in(modes),
            pl.col("l_commitdate") < pl.col("l_receiptdate"),
            pl.col("l_shipdate") < pl.col("l_commitdate"),
            pl.col("l_receiptdate") >= start,
            pl.col("l_receiptdate") < end,
        )
        .group_by("l_shipmode")
        .agg(
            pl.when(high).then(1).otherwise(0).sum().alias("high_line_count"),
            pl.when(~high).then(1).otherwise(0).sum().alias("low_line_count"),
        )
        .sort("l_shipmode")
    )


def q13(tables: Tables) -> pl.LazyFrame:
    """Q13, customer distribution (WORD1 = special, WORD2 = requests)."""
    pattern = "special.*requests"
    orders = tables["orders"].filter(~pl.col("o_comment").str.contains(pattern))
    return (
        tables["customer"]
        .join(orders, left_on="c_custkey", right_on="o_custkey", how="left")
        .group_by("c_custkey")
        .agg(pl.col("o_orderkey").count().alias("c_count"))
        .group_by("c_count")
        .agg(pl.len().alias("custdist"))
        .sort(["custdist", "c_count"], descending=[True, True])
    )


def q14(tables: Tables) -> pl.LazyFrame:
    """Q14, promotion effect (DATE = 1995-09-01)."""
    start = date(1995, 9, 1)
    end = date(1995, 10, 1)  # start + 1 month
    promo = pl.when(pl.col("p_type").str.starts_with("PROMO")).then(_revenue()).otherwise(0)
    return (
        tables["lineitem"]
        .filter(pl.col("l_shipdate") >= start, pl.col("l_shipdate") < end)
        .join(tables["part"], left_on="l_partkey", right_on="p_partkey")
        .select((100 * promo.sum() / _revenue().sum()).alias("promo_revenue"))
    )


def q15(tables: Tables) -> pl.LazyFrame:
    """Q15, top supplier (DATE = 1996-01-01)."""
    start = date(1996, 1, 1)
    end = date(1996, 4, 1)  # start + 3 months
    revenue = (
        tables["lineitem"]
        .filter(pl.col("l_shipdate") >= start, pl.col("l_shipdate") < end)
        .group_by(pl.col("l_suppkey").alias("supplier_no"))
        .agg(_revenue().sum().alias("total_revenue"))
    )
    return (
        revenue.filter(pl.col("total_revenue") == pl.col("total_revenue").max())
        .join(tables["supplier"], left_on="supplier_no", right_on="s_suppkey")
        .select(
            pl.col("supplier_no").alias("s_suppkey"),
            "s_name",
            "s_address",
            "s_phone",
            "total_revenue",
        )
        .sort("s_suppkey")
    )


def q16(tables: Tables) -> pl.LazyFrame:
    """Q16, parts/supplier relationship (BRAND = Brand#45, TYPE = MEDIUM POLISHED,
    SIZES = 49, 14, 23, 45, 19, 3, 36, 9)."""
    brand = "Brand#45"
    type_prefix = "MEDIUM POLISHED"
    sizes = [49, 14, 23, 45, 19, 3, 36, 9]
    complaints = tables["supplier"].filter(pl.col("s_comment").str.contains("Customer.*Complaints"))
    return (
        tables["part"]
        .filter(
            pl.col("p_brand") != brand,
            ~pl.col("p_type").str.starts_with(type_prefix),
            pl.col("p_size").is_in(sizes),
        )
        .join(tables["partsupp"], left_on="p_partkey", right_on="ps_partkey")
        .join(complaints, left_on="ps_suppkey", right_on="s_suppkey", how="anti")
        .group_by("p_brand", "p_type", "p_size")
        .agg(pl.col("ps_suppkey").n_unique().alias("supplier_cnt"))
        .sort(
            ["supplier_cnt", "p_brand", "p_type", "p_size"], descending=[True, False, False, False]
        )
    )


def q17(tables: Tables) -> pl.LazyFrame:
    """Q17, small-quantity-order revenue (BRAND = Brand#23, CONTAINER = MED BOX)."""
    brand = "Brand#23"
    container = "MED BOX"
    lines = (
        tables["part"]
        .filter(pl.col("p_brand") == brand, pl.col("p_container") == container)
        .join(tables["lineitem"], left_on="p_partkey", right_on="l_partkey")
    )
    threshold = lines.group_by("p_partkey").agg(
        (0.2 * pl.col("l_quantity").mean()).alias("avg_quantity")
    )
    return (
        lines.join(threshold, on="p_partkey")
        .filter(pl.col("l_quantity") < pl.col("avg_quantity"))
        .select((pl.col("l_extendedprice").sum() / 7.0).alias("avg_yearly"))
    )


def q18(tables: Tables) -> pl.LazyFrame:
    """Q18, large volume customer (QUANTITY = 300), first 100 rows."""
    quantity = 300
    large = (
        tables["lineitem"]
        .group_by("l_orderkey")
        .agg(pl.col("l_quantity").sum().alias("sum_quantity"))
        .filter(pl.col("sum_quantity") > quantity)
    )
    return (
        tables["orders"]
        .join(large, left_on="o_orderkey", right_on="l_orderkey", how="semi")
        .join(tables["customer"], left_on="o_custkey", right_on="c_custkey")
        .join(tables["lineitem"], left_on="o_orderkey", right_on="l_orderkey")
        .group_by(
            pl.col("c_name"),
            pl.col("o_custkey").alias("c_custkey"),
            "o_orderkey",
            "o_orderdate",
            "o_totalprice",
        )
        .agg(pl.col("l_quantity").sum().alias("sum_qty"))
        .sort(["o_totalprice", "o_orderdate"], descending=[True, False])
        .head(100)
    )


def q19(tables: Tables) -> pl.LazyFrame:
    """Q19, discounted revenue (QUANTITY1 = 1, QUANTITY2 = 10, QUANTITY3 = 20,
    BRAND1 = Brand#12, BRAND2 = Brand#23, BRAND3 = Brand#34)."""

    def branch(brand: str, containers: list[str], quantity: int, max_size: int) -> pl.Expr:
        return (
            (pl.col("p_brand") == brand)
            & pl.col("p_container").is_in(containers)
            & pl.col("l_quantity").is_between(quantity, quantity + 10)
            & pl.col("p_size").is_between(1, max_size)
        )

    return (
        tables["lineitem"]
        .filter(
            pl.col("l_shipmode").is_in(["AIR", "AIR REG"]),
            pl.col("l_shipinstruct") == "DELIVER IN PERSON",
        )
        .join(tables["part"], left_on="l_partkey", right_on="p_partkey")
        .filter(
            branch("Brand#12", ["SM CASE", "SM BOX", "SM PACK", "SM PKG"], 1, 5)
            | branch("Brand#23", ["MED BAG", "MED BOX", "MED PKG", "MED PACK"], 10, 10)
            | branch("Brand#34", ["LG CASE", "LG BOX", "LG PACK", "LG PKG"], 20, 15)
        )
        .select(_revenue().sum().alias("revenue"))
    )


def q20(tables: Tables) -> pl.LazyFrame:
    """Q20, potential part promotion (COLOR = forest, DATE = 1994-01-01, NATION = CANADA)."""
    color = "forest"
    start = date(1994, 1, 1)
    end = date(1995, 1, 1)  # start + 1 year
    nation = "CANADA"
    shipped = (
        tables["lineitem"]
        .filter(pl.col("l_shipdate") >= start, pl.col("l_shipdate") < end)
        .group_by("l_partkey", "l_suppkey")
        .agg((0.5 * pl.col("l_quantity").sum()).alias("half_quantity"))
    )
    excess = (
        tables["partsupp"]
        .join(
            tables["part"].filter(pl.col("p_name").str.starts_with(color)),
            left_on="ps_partkey",
            right_on="p_partkey",
            how="semi",
        )
        .join(shipped, left_on=["ps_partkey", "ps_suppkey"], right_on=["l_partkey", "l_suppkey"])
        .filter(pl.col("ps_availqty") > pl.col("half_quantity"))
    )
    return (
        tables["supplier"]
        .join(
            tables["nation"].filter(pl.col("n_name") == nation),
            left_on="s_nationkey",
            right_on="n_nationkey",
        )
        .join(excess, left_on="s_suppkey", right_on="ps_suppkey", how="semi")
        .select("s_name", "s_address")
        .sort("s_name")
    )


def q21(tables: Tables) -> pl.LazyFrame:
    """Q21, suppliers who kept orders waiting (NATION = SAUDI ARABIA), first 100 rows.

    ``exists`` another supplier on the order: the order has two or more distinct suppliers;
    ``not exists`` another late supplier: the order's late lines have one distinct supplier
    (the late line's own)."""
    nation = "SAUDI ARABIA"
    late = tables["lineitem"].filter(pl.col("l_receiptdate") > pl.col("l_commitdate"))
    multi_supplier = (
        tables["lineitem"]
        .group_by("l_orderkey")
        .agg(pl.col("l_suppkey").n_unique().alias("n_suppliers"))
        .filter(pl.col("n_suppliers") > 1)
    )
    one_late_supplier = (
        late.group_by("l_orderkey")
        .agg(pl.col("l_suppkey").n_unique().alias("n_late"))
        .filter(pl.col("n_late") == 1)
    )
    suppliers = tables["supplier"].join(
        tables["nation"].filter(pl.col("n_name") == nation),
        left_on="s_nationkey",
        right_on="n_nationkey",
    )
    return (
        late.join(multi_supplier, on="l_orderkey", how="semi")
        .join(one_late_supplier, on="l_orderkey", how="semi")
        .join(suppliers, left_on="l_suppkey", right_on="s_suppkey")
        .join(
            tables["orders"].filter(pl.col("o_orderstatus") == "F"),
            left_on="l_orderkey",
            right_on="o_orderkey",
            how="semi",
        )
        .group_by("s_name")
        .agg(pl.len().alias("numwait"))
        .sort(["numwait", "s_name"], descending=[True, False])
        .head(100)
    )


def q22(tables: Tables) -> pl.LazyFrame:
    """Q22, global sales opportunity (I1..I7 = 13, 31, 23, 29, 30, 18, 17)."""
    codes = ["13", "31", "23", "29", "30", "18", "17"]
    customers = (
        tables["customer"]
        .with_columns(pl.col("c_phone").str.slice(0, 2).alias("cntrycode"))
        .filter(pl.col("cntrycode").is_in(codes))
    )
    average = customers.filter(pl.col("c_acctbal") > Decimal("0.00")).select(
        pl.col("c_acctbal").mean().alias("avg_acctbal")
    )
    return (
        customers.join(tables["orders"], left_on="c_custkey", right_on="o_custkey", how="anti")
        .join(average, how="cross")
        .filter(pl.col("c_acctbal") > pl.col("avg_acctbal"))
        .group_by("cntrycode")
        .agg(pl.len().alias("numcust"), pl.col("c_acctbal").sum().alias("totacctbal"))
        .sort("cntrycode")
    )


QUERIES: dict[int, Query] = {
    1: q1, 2: q2, 3: q3, 4: q4, 5: q5, 6: q6, 7: q7, 8: q8, 9: q9, 10: q10, 11: q11,
    12: q12, 13: q13, 14: q14, 15: q15, 16: q16, 17: q17, 18: q18, 19: q19, 20: q20,
    21: q21, 22: q22,
}  # fmt: skip
"""The implemented queries, by TPC-H query number."""

SORT_KEYS: dict[int, list[tuple[str, bool]]] = {
    1: [("l_returnflag", False), ("l_linestatus", False)],
    2: [("s_acctbal", True), ("n_name", False), ("s_name", False), ("p_partkey", False)],
    3: [("revenue", True), ("o_orderdate", False)],
    4: [("o_orderpriority", False)],
    5: [("revenue", True)],
    6: [],
    7: [("supp_nation", False), ("cust_nation", False), ("l_year", False)],
    8: [("o_year", False)],
    9: [("nation", False), ("o_year", True)],
    10: [("revenue", True)],
    11: [("value", True)],
    12: [("l_shipmode", False)],
    13: [("custdist", True), ("c_count", True)],
    14: [],
    15: [("s_suppkey", False)],
    16: [("supplier_cnt", True), ("p_brand", False), ("p_type", False), ("p_size", False)],
    17: [],
    18: [("o_totalprice", True), ("o_orderdate", False)],
    19: [],
    20: [("s_name", False)],
    21: [("numwait", True), ("s_name", False)],
    22: [("cntrycode", False)],
}
"""The ORDER BY of each query: ``(column, descending)`` pairs, outermost first."""
