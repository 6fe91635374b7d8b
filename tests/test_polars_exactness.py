"""Queries where shoal once returned a different answer from native Polars, silently (issue
14): each against native Polars (``collect(engine="in-memory")``) on data split into
several partitions, one of them empty, with nulls, NaN, -0.0 and duplicates.

Most run on the local runner; one module-level check runs the zero-column count on Ray (a
table without columns loses its rows when pickled, which only Ray does).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.errors import UnsupportedError
from shoal.ir.nodes import Project
from shoal.planner.physical import from_wire, to_wire
from shoal_polars import DistEngine, to_ir

#: Four partitions of about 2 rows for in-memory frames of 7 rows (one has no rows when a
#: frame has fewer than 4), three buckets per exchange.
CONFIG = shoal.Config(runner="local", default_partitions=4, shuffle_partitions=3)


def dist(lf: pl.LazyFrame, config: shoal.Config = CONFIG) -> pl.DataFrame:
    return lf.collect(engine=DistEngine(config=config, raise_on_fail=True))


def check(lf: pl.LazyFrame, *, sort: bool = False, config: shoal.Config = CONFIG) -> None:
    """shoal's answer is native Polars' (rows sorted first where Polars leaves the order
    open)."""
    expected = lf.collect(engine="in-memory")
    got = dist(lf, config)
    if sort:
        expected, got = expected.sort(pl.all()), got.sort(pl.all())
    assert_frame_equal(got, expected)


def _frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "k": pl.Series([1, 2, 2, None, 3, 1, 2], dtype=pl.Int32),
            "x": [1, -2, 3, None, 5, -6, 3],
            "y": [1.0, None, float("nan"), 2.0, -0.0, 3.0, float("nan")],
        }
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The frame as three Parquet files (the middle one empty), two CSV files (Polars reads
    an empty CSV's columns as strings), and a hive-partitioned copy."""
    root = tmp_path_factory.mktemp("exact")
    df = _frame()
    for i, part in enumerate([df[:3], df[3:3], df[3:]]):
        part.write_parquet(root / f"p{i}.parquet")
        if part.height:
            part.write_csv(root / f"c{i}.csv")
    for key, part in (("1", df[:4]), ("2", df[4:4]), ("3", df[4:])):
        (root / "hive" / f"h={key}").mkdir(parents=True)
        part.write_parquet(root / "hive" / f"h={key}" / "0.parquet")
    return root


# ------------------------------------------------------- zero-column tables keep rows


def _counts(files: Path) -> dict[str, pl.LazyFrame]:
    pq = pl.scan_parquet(files / "p*.parquet")
    return {
        "parquet_filter": pq.filter(pl.col("x") > 0).select(pl.len()),
        "parquet_drop_nulls": pq.drop_nulls().select(pl.len()),
        "parquet_row_index": pq.filter(pl.col("x") > 0).with_row_index().select(pl.len()),
        "parquet_row_index_column": pq.filter(pl.col("x") > 0).with_row_index("i").select("i"),
        "csv": pl.scan_csv(files / "c*.csv").filter(pl.col("x") > 0).select(pl.len()),
        "hive": pl.scan_parquet(files / "hive", hive_partitioning=True)
        .filter(pl.col("x") > 0)
        .select(pl.len()),
        "hive_key": pl.scan_parquet(files / "hive", hive_partitioning=True)
        .filter(pl.col("h") > 1)
        .select(pl.len()),
        "memory": _frame().lazy().filter(pl.col("y").is_not_nan()).select(pl.len()),
        "group_by_literal": pq.filter(pl.col("x") > 0).group_by(pl.lit(1)).agg(pl.len()),
    }


@pytest.mark.parametrize(
    "name",
    [
        "parquet_filter",
        "parquet_drop_nulls",
        "parquet_row_index",
        "parquet_row_index_column",
        "csv",
        "hive",
        "hive_key",
        "memory",
        "group_by_literal",
    ],
)
def test_count_after_columns_pruned_to_none(files: Path, name: str) -> None:
    """Polars prunes every column before a count (``simple π 0/0``): the partitions of no
    columns must keep their rows through scans, filters, exchanges and the result."""
    check(_counts(files)[name])


@pytest.mark.parametrize(
    "query",
    [
        lambda f: f,
        lambda f: f.select(pl.len()),
        lambda f: f.with_row_index("i"),
        lambda f: f.with_row_index("i").filter(pl.col("i") > 2).select(pl.len()),
        lambda f: f.slice(2, 3),
        lambda f: f.with_columns(a=pl.lit(1)).select(pl.col("a").sum()),
        lambda f: pl.concat([f, f.head(2)]),
        lambda f: f.with_columns(x=pl.lit(1), y=pl.lit("a")),
        lambda f: f.unique(),
        lambda f: f.with_columns(n=pl.len()),
    ],
    ids=["as_is", "len", "row_index", "row_index_filter", "slice", "literal_sum", "concat",
         "literals", "unique", "with_len"],
)  # fmt: skip
def test_frame_of_height_without_columns(query: object) -> None:
    """``pl.DataFrame(height=5)`` has 5 rows and no columns, in shoal too."""
    assert callable(query)
    check(query(pl.DataFrame(height=5).lazy()))


def test_a_table_without_columns_travels_with_its_rows() -> None:
    """pyarrow pickles (and concatenates) a table by its columns: without columns its rows
    are lost. ``to_wire`` keeps them in a column of nulls that takes no memory."""
    import pickle

    empty = pa.table({"a": [1, 2, 3]}).select([])
    assert pickle.loads(pickle.dumps(empty)).num_rows == 0  # the reason for to_wire
    wire = to_wire(empty)
    assert wire.num_rows == 3 and wire.nbytes == 0
    back = from_wire(pickle.loads(pickle.dumps(wire)))
    assert (back.num_rows, back.num_columns) == (3, 0)
    assert to_wire(pa.table({"a": [1]})).column_names == ["a"]


def test_count_after_columns_pruned_to_none_on_ray(files: Path, ray_runner: None) -> None:
    """The Ray runner moves tables between processes (pickled): a filtered count and a
    frame of no columns keep their rows there too."""
    config = shoal.get_config().replace(runner="ray", default_partitions=4, shuffle_partitions=3)
    for name in ("parquet_filter", "parquet_row_index", "hive"):
        check(_counts(files)[name], config=config)
    check(pl.DataFrame(height=5).lazy().with_row_index("i"), config=config)


# ------------------------------------------------------- literals broadcast or not


@pytest.mark.parametrize(
    "query",
    [
        lambda f: f.with_columns(x=2),
        lambda f: f.select("x").with_columns(x=2.0),
        lambda f: f.with_columns(k=pl.lit(None, pl.Int32), x=pl.lit(1), y=pl.lit(-0.0)),
        lambda f: f.select(pl.lit(1)),
        lambda f: f.select(pl.lit(1), pl.col("x")),
        lambda f: f.select(pl.lit(1).alias("one"), pl.col("x").sum()),
        lambda f: f.select("y").with_columns(y=pl.col("y").max()),
        lambda f: f.filter(pl.col("x") > 0).select("k").with_columns(k=pl.lit(7, pl.Int32)),
    ],
    ids=["with_columns_only_column", "with_columns_float", "with_columns_all", "select_literal",
         "select_literal_and_column", "select_literal_and_sum", "with_columns_scalar_agg",
         "after_filter"],
)  # fmt: skip
def test_literal_projection_height(query: object) -> None:
    """``with_columns`` of literals keeps the frame's height even when they replace every
    column; ``select`` of scalars alone is one row (Polars' rules)."""
    assert callable(query)
    check(query(_frame().lazy()))


def test_with_columns_keeps_height_in_the_ir() -> None:
    """The IR says which rule a projection follows (``Project.keep_height``)."""
    plan = to_ir(pl.LazyFrame({"a": [1.0, 2.0]}).with_columns(a=2.0))
    assert isinstance(plan, Project) and plan.keep_height
    plan = to_ir(pl.LazyFrame({"a": [1.0, 2.0]}).select(pl.lit(1.0), pl.col("a")))
    assert isinstance(plan, Project) and not plan.keep_height


# ------------------------------------------------------- functions mapped right


@pytest.mark.parametrize(
    "expr",
    [
        pl.col("x").arg_sort(),
        pl.col("x").arg_sort(descending=True, nulls_last=True),
        pl.col("y").arg_sort(descending=True),
        pl.col("x").arg_max(),
        pl.col("x").arg_min(),
        pl.col("k").gather(pl.col("x").arg_sort()),
    ],
    ids=["arg_sort", "arg_sort_desc_nulls_last", "arg_sort_float", "arg_max", "arg_min",
         "gather_arg_sort"],
)  # fmt: skip
def test_arg_sort_is_not_arg_max(expr: pl.Expr) -> None:
    """Polars' NodeTraverser names arg_sort "arg_max" (with two parameters)."""
    check(_frame().lazy().select(expr))


def test_arg_sort_per_group() -> None:
    check(_frame().lazy().group_by("k", maintain_order=True).agg(pl.col("x").arg_sort()))


@pytest.mark.parametrize(
    "expr",
    [
        pl.col("y").drop_nans().drop_nulls().len(),
        pl.col("y").drop_nans().len(),
        pl.col("y").drop_nulls().len(),
        pl.col("y").filter(pl.col("x") > 0).len(),
        pl.col("x").head(2).len(),
        pl.col("x").unique().len(),
        pl.lit(1).len(),
        pl.col("x").len(),
    ],
    ids=["drop_nans_drop_nulls", "drop_nans", "drop_nulls", "filter", "head", "unique",
         "literal", "column"],
)  # fmt: skip
def test_len_of_an_expression_counts_its_values(expr: pl.Expr) -> None:
    lf = _frame().lazy()
    check(lf.select(expr))
    check(lf.group_by("k").agg(expr), sort=True)


def test_drop_nans_keeps_nulls_in_a_filter_and_a_window() -> None:
    """Polars' streaming engine (a task's plain collect) drops the nulls too."""
    lf = pl.LazyFrame(
        {"k": [2, 2, 2, 1, 1, 1], "y": [None, float("nan"), float("nan"), 1.0, None, -0.0]}
    )
    check(lf.filter(pl.col("y").drop_nans().len().over("k") > 1))
    check(lf.with_columns(n=pl.col("y").drop_nans().len().over("k")))


# ------------------------------------------------------- aggregations across partitions


def _temporal() -> pl.DataFrame:
    base = dt.datetime(2020, 1, 1, 1, 2, 3, 5)
    t = [base, base + dt.timedelta(days=3), None, dt.datetime(2021, 1, 1),
         dt.datetime(1970, 1, 1), None, dt.datetime(1969, 12, 31, 23, 59, 59, 999999)]  # fmt: skip
    return pl.DataFrame(
        {
            "k": [1, 1, 2, 2, 3, 3, 1],
            "t": t,
            "d": [None if v is None else v.date() for v in t],
            "du": [None if v is None else v - base for v in t],
            "tm": [None if v is None else v.time() for v in t],
        }
    ).with_columns(
        tz=pl.col("t").dt.replace_time_zone("Asia/Kathmandu"),
        ns=pl.col("t").cast(pl.Datetime("ns")) + pl.duration(nanoseconds=7),
    )


@pytest.mark.parametrize("column", ["t", "d", "du", "tm", "tz", "ns"])
def test_mean_of_temporal_columns(column: str) -> None:
    """The mean of a Date is a Datetime in microseconds; each temporal type has its own
    rules, which a partial sum / count in Float64 does not follow."""
    lf = _temporal().lazy()
    check(lf.group_by("k").agg(pl.col(column).mean(), pl.col(column).median().alias("med")),
          sort=True)  # fmt: skip
    check(lf.select(pl.col(column).mean()))


@pytest.mark.parametrize("agg", ["bitwise_xor", "bitwise_and", "bitwise_or"])
def test_bitwise_aggregation_of_booleans(agg: str) -> None:
    """A group of nulls only: Polars' streaming engine (what a task's plain collect runs)
    gives null, the in-memory engine false (true for and)."""
    lf = pl.LazyFrame(
        {"k": [1, 1, 2, 2, 3, 3, 1], "b": [None, None, True, None, False, True, None]},
        schema={"k": pl.Int64, "b": pl.Boolean},
    )
    check(lf.group_by("k").agg(getattr(pl.col("b"), agg)()), sort=True)
    check(lf.select(getattr(pl.col("b"), agg)()))


# ------------------------------------------------------- temporal literals


_BASE_NS = 1_577_836_800_000_000_000  # 2020-01-01 in nanoseconds


def _ns_frame(tz: str | None = None) -> pl.LazyFrame:
    values = [_BASE_NS - 1, _BASE_NS, _BASE_NS + 1, _BASE_NS + 999, _BASE_NS + 1000, None,
              _BASE_NS + 1000]  # fmt: skip
    return pl.LazyFrame({"t": pl.Series(values).cast(pl.Datetime("ns", tz))})


@pytest.mark.parametrize("op", ["gt", "ge", "lt", "le", "eq", "ne"])
@pytest.mark.parametrize("tz", [None, "Asia/Kathmandu"])
def test_nanosecond_column_against_a_python_datetime(op: str, tz: str | None) -> None:
    """Polars turns ``t > datetime(2020, 1, 1)`` on a nanosecond column into
    ``t > 2020-01-01 00:00:00.000000999``, a literal the NodeTraverser gives cut to the
    microsecond."""
    import zoneinfo

    when = dt.datetime(2020, 1, 1) if tz is None else dt.datetime(2020, 1, 1, 5, 45)
    if tz is not None:
        when = when.replace(tzinfo=zoneinfo.ZoneInfo(tz))
    check(_ns_frame(tz).filter(getattr(pl.col("t"), f"__{op}__")(when)))


@pytest.mark.parametrize(
    "query",
    [
        lambda f: f.with_columns(c=pl.lit(np.datetime64("2020-01-01T00:00:00.000000123", "ns"))),
        lambda f: f.filter(pl.col("t") == pl.lit(np.datetime64(_BASE_NS + 999, "ns"))),
        lambda f: f.filter(pl.col("t").is_in([np.datetime64(_BASE_NS + 1, "ns")])),
        lambda f: f.filter(
            pl.col("t").is_in(pl.Series([_BASE_NS + 999]).cast(pl.Datetime("ns")).implode())
        ),
        lambda f: f.with_columns(pl.Series("s", [_BASE_NS + 5] * 7).cast(pl.Datetime("ns"))),
        lambda f: f.with_columns(pl.Series("s", [123] * 7).cast(pl.Time)),
        lambda f: f.with_columns(c=pl.lit(123, pl.Time)),
        lambda f: f.with_columns(c=pl.lit(np.timedelta64(1_000_005, "ns"))),
    ],
    ids=["literal", "equal", "is_in_list", "is_in_series", "series", "time_series",
         "time_literal", "duration"],
)  # fmt: skip
def test_nanosecond_literals_stay_exact(query: object) -> None:
    assert callable(query)
    check(query(_ns_frame()))


def test_a_nanosecond_literal_that_cannot_be_told_apart_is_refused() -> None:
    """Two literals equal to the microsecond with different nanoseconds: the plan text
    cannot say which is which, so shoal refuses rather than cut them."""
    lf = _ns_frame().filter(
        (pl.col("t") > pl.lit(np.datetime64(_BASE_NS + 1, "ns")))
        & (pl.col("t") < pl.lit(np.datetime64(_BASE_NS + 2, "ns")))
    )
    with pytest.raises(UnsupportedError, match="microsecond only"):
        dist(lf)


# ------------------------------------------------------- joins and merges


def test_merge_sorted_by_two_keys() -> None:
    a = pl.LazyFrame({"k1": [1, 1, 1, 2, 2, 3], "k2": [1, 3, 5, 0, 2, 1], "v": list("abcdef")})
    b = pl.LazyFrame({"k1": [1, 1, 2, 2, 4], "k2": [2, 4, 1, 3, 0], "v": list("ABCDE")})
    check(a.merge_sorted(b, key=["k1", "k2"]))
    check(a.merge_sorted(b, key="k1"))


@pytest.mark.parametrize("how", ["left", "right", "full"])
def test_join_where_other_than_inner_is_refused(how: str) -> None:
    """Polars 2.1 shows ``join_where(how="left")`` as a left join whose keys compare with
    ``<``: translated as an equi-join it matched the wrong rows. shoal refuses it."""
    left = pl.LazyFrame({"id": [1, 2, 3, 4, None], "x": [1, 5, 10, None, 3]})
    right = pl.LazyFrame({"id2": [1, 2, 3], "y": [3, 7, None]})
    lf = left.join_where(right, pl.col("x") < pl.col("y"), how=how)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match="join_where with how"):
        dist(lf)
    inner = left.join_where(right, pl.col("x") < pl.col("y"), pl.col("id") <= pl.col("id2"))
    check(inner, sort=True)


def test_join_where_on_comparisons_an_iejoin_does_not_take() -> None:
    """Strings and booleans: Polars makes a nested-loop join (a cross join with a
    predicate), which is the cross join's rows where the predicate holds."""
    a = pl.LazyFrame(
        {"id": [1, 2, 3, None], "s": ["a", "c", "b", "d"], "b": [True, False, None, True]}
    )
    b = pl.LazyFrame({"id2": [1, 2, 3], "s2": ["b", "a", None], "c": [True, True, False]})
    check(a.join_where(b, pl.col("s") < pl.col("s2")), sort=True)
    check(a.join_where(b, pl.col("b") & pl.col("c")), sort=True)
    check(a.join_where(b, pl.col("id") <= pl.col("id2"), pl.col("s") != pl.col("s2")), sort=True)


def test_substrait_keeps_the_height_rule_of_a_projection() -> None:
    """A Substrait ProjectRel is row by row: a ``with_columns`` of literals round-trips
    with the input's height; a ``select`` of scalars alone (one row) is refused."""
    from shoal import ir
    from shoal.plan.substrait import from_substrait, to_substrait

    table = pa.table({"a": [1.0, 2.0, 3.0]})
    kept = ir.from_arrow(table).with_columns(a=ir.lit(2.0)).plan
    assert kept == from_substrait(to_substrait(kept, tables={"t": table}), tables={"t": table})
    one_row = ir.from_arrow(table).select(ir.lit(2.0).alias("a")).plan
    with pytest.raises(UnsupportedError, match="scalars alone"):
        to_substrait(one_row, tables={"t": table})


@pytest.mark.parametrize("how", ["semi", "anti"])
def test_semi_and_anti_joins_keep_the_left_order(how: str) -> None:
    """Polars keeps the left rows' order in a semi or anti join whatever ``maintain_order``
    says; its streaming engine (a task's collect) sometimes did not, so a slice after the
    join picked other rows (about one run in four)."""
    left = pl.LazyFrame({"a": [2, 5, 1, 3], "v": [20, 50, 10, 30]})
    right = pl.LazyFrame({"a": [3, 1, 4, 2] if how == "semi" else [5, 4]})
    config = CONFIG.replace(default_partitions=3)
    for order in ("none", "right"):
        lf = left.join(right, on="a", how=how, maintain_order=order).slice(1, 2)  # type: ignore[arg-type]
        for _ in range(25):
            check(lf, config=config)


def test_cross_joins_keep_the_left_order() -> None:
    """A cross join pairs the rows left-major in Polars' in-memory engine whatever
    ``maintain_order`` says; its streaming engine (a task's collect) does not always. Polars'
    SQL makes ``NOT IN (subquery)`` an anti join and a nested-loop join with the
    subquery's one-row null check: two of them stacked gave the two rows a partition kept
    as 4, 3 about one run in two."""
    ctx = pl.SQLContext(
        t=pl.DataFrame({"a": [10, 20, 30, 40, 50, 60], "b": [1, 2, 3, 4, 5, 6]}),
        u=pl.DataFrame({"c": [0, 7, 8, None], "d": [1, 2, 3, 4]}),
    )
    lf = ctx.execute(
        "SELECT a FROM t WHERE b NOT IN (SELECT d * 10 FROM u) AND a NOT IN (SELECT c FROM u "
        "WHERE c IS NOT NULL)"
    )
    config = CONFIG.replace(default_partitions=3)
    for _ in range(12):
        check(lf, config=config)


@pytest.mark.parametrize(
    "exprs",
    [
        {"xy": pl.list("x", "k")},
        {"xyl": pl.list("x", pl.col("k").cast(pl.Int64), pl.lit(3))},
        {"ll": pl.list("l", "l2")},
        {"lone": pl.list("x")},
    ],
    ids=["two_columns", "with_a_scalar", "lists", "one"],
)
def test_pl_list_of_several_columns(exprs: dict[str, pl.Expr]) -> None:
    """``pl.list(a, b, ...)`` makes one list of the row's values (each list value one
    element); shoal kept the first argument only."""
    lf = _frame().lazy().with_columns(l=pl.concat_list("x"), l2=pl.concat_list("x", "x"))
    check(lf.with_columns(**exprs))


@pytest.mark.parametrize("rows", [0, 1, 2, 7])
def test_sql_in_subquery_of_expressions(rows: int) -> None:
    """Polars' SQL makes ``expr IN (SELECT ...)`` a horizontal concatenation of the frame
    with the subquery's values imploded into one row, broadcast to the frame's height
    (refused before); a frame of one row and an empty one too."""
    t = pl.DataFrame(
        {"a": [3, None, 1, 4, 1, 5, 9][:rows], "b": [2.0, 7.0, None, 1.0, 8.0, -0.0, 2.0][:rows]}
    )
    ctx = pl.SQLContext(t=t, u=pl.DataFrame({"c": [4, 2, None, 10]}))
    for query in (
        "SELECT a FROM t WHERE a + 1 IN (SELECT c FROM u)",
        "SELECT a, b FROM t WHERE a * 2 IN (SELECT c FROM u) OR b IN (SELECT a - 1 FROM t)",
        "SELECT a FROM t WHERE a - 1 NOT IN (SELECT c FROM u WHERE c IS NOT NULL)",
    ):
        check(ctx.execute(query), config=CONFIG.replace(default_partitions=3))


def test_var_and_std_of_a_group_alone_in_its_bucket() -> None:
    """A hash bucket may hold one group of one row. Polars' streaming engine (what a task
    runs) gives var/std(ddof=0) of that one frame's lone NaN or infinity as 0.0, where the
    whole frame gives NaN (found by the function-table walk: 0.0 for the null key's NaN)."""
    nan, inf = float("nan"), float("inf")
    df = pl.DataFrame(
        {"k": [None, 1, 2, 3, 4, 5, 5, 6], "f": [nan, inf, 1.5, -0.0, None, nan, 2.0, -inf]},
        schema={"k": pl.Int64, "f": pl.Float64},
    )
    aggs = [
        getattr(pl.col("f"), name)(ddof=ddof).alias(f"{name}{ddof}")
        for name in ("var", "std")
        for ddof in (0, 1)
    ]
    config = CONFIG.replace(shuffle_partitions=16, small_query_bytes=0)
    check(df.lazy().group_by("k").agg(aggs), sort=True, config=config)
