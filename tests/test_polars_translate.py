"""The Polars adapter: Polars' optimised plan -> shoal IR, and the engine "dist".

Translation is checked by running the IR in-process (``run_single``) and comparing with
Polars' own result; the engine is checked end to end with the local runner (no Ray).
"""

from __future__ import annotations

import datetime as dt
import re
import warnings
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import shoal
import shoal_polars
from shoal.config import Config
from shoal.errors import PlanError, UnsupportedError
from shoal.execution.kernel import run_single
from shoal.ir import Aggregate, Filter, Join, Project, Scan, Slice, Sort
from shoal.ir.nodes import AsofJoin, InMemorySource
from shoal_polars import DistEngine, ShoalFallbackWarning, to_ir
from shoal_polars import engine as engine_mod
from shoal_polars.engine import to_polars_frame
from shoal_polars.translate import check_version

Query = Callable[[pl.LazyFrame], pl.LazyFrame]


def _frame() -> pl.DataFrame:
    """Nulls, NaN, duplicate keys and rows, decimals, dates."""
    return pl.DataFrame(
        {
            "k": [1, 2, 2, None, 3, 2, 1],
            "g": ["a", "b", "b", "a", None, "b", "a"],
            "v": [1.0, 2.0, float("nan"), None, -4.5, 2.0, 1.0],
            "s": ["apple", " b ", "PROMO x", None, "green", " b ", "apple"],
            "d": [dt.date(2020, 1, 1), dt.date(2021, 5, 3), None, dt.date(2020, 12, 31),
                  dt.date(1998, 9, 2), dt.date(2021, 5, 3), dt.date(2020, 1, 1)],
            "m": pl.Series([Decimal("1.50"), None, Decimal("2.25"), Decimal("0.01"),
                            Decimal("9.99"), Decimal("2.25"), Decimal("1.50")],
                           dtype=pl.Decimal(12, 2)),
            "u": pl.Series([1, 2, 3, 4, 5, 2, 1], dtype=pl.UInt8),
        }
    )  # fmt: skip


@pytest.fixture(scope="module")
def mem() -> pl.LazyFrame:
    return _frame().lazy()


@pytest.fixture(scope="module")
def pq_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pq")
    df = _frame()
    df.head(4).write_parquet(root / "part-0.parquet")
    df.clear().write_parquet(root / "part-1.parquet")  # an empty file
    df.tail(3).write_parquet(root / "part-2.parquet")
    return root


@pytest.fixture(scope="module")
def pq(pq_dir: Path) -> pl.LazyFrame:
    return pl.scan_parquet(pq_dir / "*.parquet")


def check(lf: pl.LazyFrame, *, ordered: bool = False) -> None:
    """The IR of ``lf`` run in-process gives Polars' own result."""
    got = pl.DataFrame(run_single(to_ir(lf)))
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_row_order=ordered)


# ---------------------------------------------------------------- row-wise queries

ROW_QUERIES: dict[str, Query] = {
    "filter-select": lambda lf: lf.filter(pl.col("k") > 1).select(
        "g", (pl.col("v") * 2 + pl.col("u")).alias("x"), (pl.col("k") / 2).alias("half")
    ),
    "with_columns-replace-and-append": lambda lf: lf.with_columns(
        pl.col("v").fill_null(0.0), (pl.col("k") // 2).alias("kk"), pl.lit("c").alias("const")
    ),
    "drop-rename": lambda lf: lf.drop("s").rename({"k": "key"}),
    "drop_nulls-fill_nan": lambda lf: lf.drop_nulls("k").with_columns(pl.col("v").fill_nan(-1)),
    "dyn-int-literal": lambda lf: lf.select((pl.col("u") + 1).alias("u1"), pl.col("u") * 300),
    "decimal": lambda lf: lf.select(
        (pl.col("m") * (1 - pl.col("m"))).alias("mm"),
        (pl.col("m") > Decimal("1.2")).alias("gt"),
        pl.col("m").is_between(Decimal("0.01"), Decimal("2.25")).alias("btw"),
    ),
    "when-then": lambda lf: lf.select(
        pl.when(pl.col("k") > 1).then(pl.lit("big")).otherwise(pl.lit("small")).alias("w"),
        pl.when(pl.col("v").is_nan()).then(pl.col("k")).alias("w2"),
    ),
    "casts": lambda lf: lf.select(
        pl.col("k").cast(pl.String).alias("a"),
        pl.col("s").cast(pl.Int64, strict=False).alias("b"),
        pl.min_horizontal("k", "u").alias("c"),
    ),
    "strings": lambda lf: lf.select(
        pl.col("s").str.starts_with("PROMO").alias("sw"),
        pl.col("s").str.ends_with("e").alias("ew"),
        pl.col("s").str.contains("gr.*n").alias("re"),
        (~pl.col("s").str.contains("b", literal=True)).alias("lit"),
        pl.col("s").str.slice(0, 2).alias("sl"),
        pl.col("s").str.len_chars().alias("len"),
        pl.col("s").str.strip_chars().str.to_uppercase().alias("up"),
        pl.col("s").str.replace_all("p", "P", literal=True).alias("rep"),
        pl.concat_str([pl.col("g"), pl.col("s")], separator="-").alias("cat"),
    ),
    "dates": lambda lf: lf.select(
        pl.col("d").dt.year().alias("y"),
        pl.col("d").dt.month().alias("mo"),
        pl.col("d").dt.day().alias("dd"),
        (pl.col("d") <= dt.date(2020, 12, 31)).alias("le"),
        (pl.col("d") - dt.timedelta(days=3)).alias("minus"),
        pl.col("d").is_between(dt.date(2020, 1, 1), dt.date(2021, 1, 1), closed="left").alias("b"),
    ),
    "numeric-null": lambda lf: lf.select(
        pl.col("v").abs().alias("abs"),
        pl.col("v").round(1).alias("round"),
        pl.col("k").is_in([1, 3]).alias("isin"),
        pl.col("g").is_in(["a"]).alias("isin_s"),
        pl.col("k").is_null().alias("isnull"),
        pl.coalesce("k", pl.lit(0)).alias("coal"),
        pl.col("k").eq_missing(2).alias("eqm"),
        (-pl.col("k")).alias("neg"),
        pl.col("v").is_nan().alias("nan"),
    ),
    "bool-logic": lambda lf: lf.filter(
        (pl.col("g") == "a") | (pl.col("k").is_null() & ~pl.col("v").is_nan())
    ),
    "slice": lambda lf: lf.slice(1, 3),
    "head": lambda lf: lf.head(2),
    "select-literal-only": lambda lf: lf.select(pl.lit(1).alias("one")),
}


@pytest.mark.parametrize("name", sorted(ROW_QUERIES))
def test_row_queries_in_memory(mem: pl.LazyFrame, name: str) -> None:
    check(ROW_QUERIES[name](mem), ordered=name in ("slice", "head"))


@pytest.mark.parametrize("name", sorted(ROW_QUERIES))
def test_row_queries_parquet(pq: pl.LazyFrame, name: str) -> None:
    check(ROW_QUERIES[name](pq), ordered=name in ("slice", "head"))


# ---------------------------------------------------------------- whole-input queries

AGG_QUERIES: dict[str, Query] = {
    "group_by-aggs": lambda lf: lf.group_by("g").agg(
        pl.col("k").sum().alias("sum"),
        pl.col("v").mean().alias("mean"),
        pl.col("v").min().alias("min"),
        pl.col("d").max().alias("max"),
        pl.col("v").count().alias("count"),
        pl.col("v").len().alias("len_col"),
        pl.len().alias("len"),
        pl.col("k").n_unique().alias("nu"),
        pl.col("v").median().alias("med"),
        pl.col("v").std().alias("std"),
        pl.col("v").var(ddof=0).alias("var"),
        pl.col("k").null_count().alias("nc"),
        (pl.col("m").sum() / pl.col("k").count()).alias("ratio"),
        pl.col("m").sum().alias("msum"),
    ),
    "group_by-expr-key": lambda lf: lf.group_by((pl.col("k") % 2).alias("odd"), "g").agg(
        pl.col("v").sum()
    ),
    "group_by-maintain_order": lambda lf: lf.group_by("k", maintain_order=True).agg(
        pl.col("u").sum()
    ),
    "scalar-aggs": lambda lf: lf.select(pl.col("v").sum(), pl.len(), pl.col("m").mean()),
    "agg-broadcast": lambda lf: lf.select("k", (pl.col("u") - pl.col("u").mean()).alias("c")),
    "sort-multi": lambda lf: lf.sort(
        ["g", "k", "v", "s", "m"], descending=[True, False, True, False, False], nulls_last=True
    ),
    "sort-head": lambda lf: lf.sort("u", "s", descending=True, nulls_last=True).head(3),
    "sort-slice": lambda lf: lf.sort("u", "s", maintain_order=True).slice(2, 3),
    "unique": lambda lf: lf.unique(),
    "unique-subset-first": lambda lf: lf.unique(subset=["g"], keep="first", maintain_order=True),
    "unique-subset-last": lambda lf: lf.unique(subset=["g", "k"], keep="last"),
    "unique-none-ordered": lambda lf: lf.unique(subset="g", keep="none", maintain_order=True),
    "concat": lambda lf: pl.concat([lf, lf.filter(pl.col("k") > 1)]),
    "concat-head": lambda lf: pl.concat([lf, lf]).head(9),
    "concat-diagonal-relaxed": lambda lf: pl.concat(
        [lf.select("k", "g"), lf.select(pl.col("u").alias("k"), "s")], how="diagonal_relaxed"
    ),
    "filter-after-agg": lambda lf: lf.group_by("g").agg(pl.col("u").sum()).filter(pl.col("u") > 3),
}

_ORDERED = {"sort-multi", "sort-head", "sort-slice", "group_by-maintain_order",
            "unique-subset-first", "unique-none-ordered", "concat", "concat-head"}  # fmt: skip


@pytest.mark.parametrize("name", sorted(AGG_QUERIES))
def test_agg_queries_in_memory(mem: pl.LazyFrame, name: str) -> None:
    check(AGG_QUERIES[name](mem), ordered=name in _ORDERED)


@pytest.mark.parametrize("name", sorted(AGG_QUERIES))
def test_agg_queries_parquet(pq: pl.LazyFrame, name: str) -> None:
    check(AGG_QUERIES[name](pq), ordered=name in _ORDERED)


def test_select_of_aggregates_is_an_aggregate(mem: pl.LazyFrame) -> None:
    plan = to_ir(mem.select(pl.col("v").sum(), pl.len()))
    assert isinstance(plan, Aggregate) and plan.keys == ()
    assert isinstance(to_ir(mem.select("k", pl.col("v").sum())), Project)


def test_sort_with_slice_becomes_sort_then_slice(mem: pl.LazyFrame) -> None:
    plan = to_ir(mem.sort("k").head(2))
    assert isinstance(plan, Slice) and plan.offset == 0 and plan.length == 2
    assert isinstance(plan.input, Sort)


# ---------------------------------------------------------------- joins


@pytest.fixture(scope="module")
def right() -> pl.LazyFrame:
    return pl.DataFrame(
        {"k": [2, None, 3, 3, 7], "v": [10.0, 20.0, 30.0, float("nan"), 5.0],
         "t": ["x", "y", "z", "w", "q"]}
    ).lazy()  # fmt: skip


JOIN_QUERIES: dict[str, Callable[[pl.LazyFrame, pl.LazyFrame], pl.LazyFrame]] = {
    "inner": lambda a, b: a.join(b, on="k"),
    "left": lambda a, b: a.join(b, on="k", how="left"),
    "left-no-coalesce": lambda a, b: a.join(b, on="k", how="left", coalesce=False),
    "nulls_equal": lambda a, b: a.join(b, on="k", nulls_equal=True, suffix="_r"),
    "expr-keys": lambda a, b: a.join(b, left_on=pl.col("k") + 1, right_on="k"),
    "multi-key": lambda a, b: a.join(
        b.with_columns(pl.col("t").alias("g")), on=["k", "g"], how="left"
    ),
    "fused-predicate": lambda a, b: a.join(b, on="k").filter(pl.col("v") < pl.col("v_right")),
    "self-join-cached": lambda a, b: a.filter(pl.col("u") > 1).pipe(
        lambda x: x.join(x, on="k", suffix="_2")
    ),
}


@pytest.mark.parametrize("name", sorted(JOIN_QUERIES))
def test_joins_in_memory(mem: pl.LazyFrame, right: pl.LazyFrame, name: str) -> None:
    check(JOIN_QUERIES[name](mem, right))


@pytest.mark.parametrize("name", sorted(JOIN_QUERIES))
def test_joins_parquet(pq: pl.LazyFrame, right: pl.LazyFrame, name: str) -> None:
    check(JOIN_QUERIES[name](pq, right))


def test_join_predicate_becomes_filter(mem: pl.LazyFrame, right: pl.LazyFrame) -> None:
    plan = to_ir(mem.join(right, on="k").filter(pl.col("v") < pl.col("v_right")))
    nodes = list(plan.walk())
    assert any(isinstance(n, Filter) and isinstance(n.input, Join) for n in nodes)


def test_cache_is_translated_once(mem: pl.LazyFrame) -> None:
    sub = mem.filter(pl.col("u") > 1).with_columns(w=pl.col("v") * 2)
    plan = to_ir(sub.join(sub, on="k", suffix="_2"))
    join = next(n for n in plan.walk() if isinstance(n, Join))
    assert join.left is join.right


# ---------------------------------------------------------------- Parquet scans


def test_parquet_pushdown(pq: pl.LazyFrame, pq_dir: Path) -> None:
    lf = pq.filter(pl.col("k") > 1).select("g", "u")
    plan = to_ir(lf)
    scan = next(n for n in plan.walk() if isinstance(n, Scan))
    assert scan.predicate is not None and scan.predicate.columns() == {"k"}
    assert set(scan.schema.names) == {"g", "u", "k"}
    paths = scan.source.paths  # type: ignore[union-attr]
    assert list(paths) == [str(pq_dir / f"part-{i}.parquet") for i in range(3)]
    check(lf)


def test_parquet_relative_path(pq_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(pq_dir)
    lf = pl.scan_parquet("part-0.parquet").filter(pl.col("u") < 3)
    scan = next(n for n in to_ir(lf).walk() if isinstance(n, Scan))
    assert scan.source.paths == (str(pq_dir / "part-0.parquet"),)  # type: ignore[union-attr]
    check(lf)


def test_parquet_empty_file(pq_dir: Path) -> None:
    lf = pl.scan_parquet(pq_dir / "part-1.parquet")
    check(lf)
    check(lf.group_by("g").agg(pl.col("v").sum()))
    check(lf.select(pl.col("v").sum(), pl.len()))


def test_parquet_head_then_filter(pq_dir: Path) -> None:
    # Polars pushes the slice into the scan next to the predicate; the slice applies first.
    lf = pl.scan_parquet(pq_dir / "part-0.parquet").head(3).filter(pl.col("k") > 1)
    check(lf, ordered=True)
    check(pl.scan_parquet(pq_dir / "part-0.parquet").slice(1, 2), ordered=True)


def test_parquet_unsupported_options(pq_dir: Path) -> None:
    path = pq_dir / "part-0.parquet"
    with pytest.raises(UnsupportedError, match=r"Scan\(parquet\): include_file_paths"):
        to_ir(pl.scan_parquet(path, include_file_paths="f"))
    with pytest.raises(UnsupportedError, match="an explicit schema"):
        to_ir(pl.scan_parquet(path, schema=_frame().schema))
    ipc = pq_dir / "x.arrow"
    _frame().select("k", "g").write_ipc(ipc)
    # Polars does not show IPC scans to engines: shoal reads them on the driver.
    scan = to_ir(pl.scan_ipc(ipc))
    assert isinstance(scan, Scan) and isinstance(scan.source, InMemorySource)
    assert scan.source.origin.startswith("IPC scan of")


# ---------------------------------------------------------------- unsupported


def _unsupported(a: pl.LazyFrame, b: pl.LazyFrame) -> pl.LazyFrame:
    """A join shoal does not run: an equi-join with the modes of a column (their order is
    not defined; the query's answer is, as it counts the distinct values only)."""
    return a.join(b, on="k").with_columns(pl.col("v").mode().n_unique().alias("modes"))


def test_asof_join_translates(mem: pl.LazyFrame, right: pl.LazyFrame) -> None:
    lf = mem.drop_nulls("k").sort("k").join_asof(right.drop_nulls("k").sort("k"), on="k")
    assert isinstance(to_ir(lf), AsofJoin)


def test_unsupported_raises_naming_the_node(mem: pl.LazyFrame, right: pl.LazyFrame) -> None:
    lf = _unsupported(mem, right)
    with pytest.raises(UnsupportedError, match=r"Function\(mode\)"):
        to_ir(lf)
    with pytest.raises(UnsupportedError, match=r"Function\(mode\)"):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))


def test_map_batches_raises_naming_the_node(mem: pl.LazyFrame) -> None:
    lf = mem.map_batches(lambda df: df)
    with pytest.raises(UnsupportedError, match="MapFunction"):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))


def test_expression_udf_raises(mem: pl.LazyFrame) -> None:
    lf = mem.select(pl.col("k").map_batches(lambda s: s, return_dtype=pl.Int64))
    with pytest.raises(UnsupportedError, match="Select: expression.*Python UDF"):
        to_ir(lf)


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (lambda lf: lf.select(pl.col("v").top_k(2)), "Function(top_k)"),
        (
            lambda lf: lf.group_by("g").agg(pl.col("v").get(pl.col("k"))),
            "Expr.get (one value per group)",
        ),
        (lambda lf: lf.select(pl.col("g").mode()), "Function(mode)"),
    ],
)
def test_unsupported_constructs(mem: pl.LazyFrame, query: Query, expected: str) -> None:
    with pytest.raises(UnsupportedError, match=re.escape(expected)):
        to_ir(query(mem))


def test_every_unsupported_part_is_reported(mem: pl.LazyFrame, right: pl.LazyFrame) -> None:
    lf = (
        _unsupported(mem, right)
        .with_columns(pl.col("v").rolling_map(lambda s: s.sum(), 2).alias("c"))
        .map_batches(lambda df: df)
    )
    with pytest.raises(UnsupportedError) as info:
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))
    msg = str(info.value)
    assert "3 unsupported parts" in msg
    for part in ("MapFunction", "(rolling map)", "Function(mode)"):
        assert part in msg


def _opaque(lf: pl.LazyFrame) -> pl.LazyFrame:
    return lf.map_batches(lambda df: df)


@pytest.mark.parametrize(
    ("query", "parts"),
    [
        # An opaque map function as the left input of an equi-join used to crash
        # (KeyError in the join's coalescing projection) instead of being reported.
        (lambda a, b: _opaque(a).join(b, on="k"), ["MapFunction"]),
        (lambda a, b: _opaque(a).join(b, on="k", how="full", coalesce=True), ["MapFunction"]),
        (lambda a, b: _opaque(a).join(b, left_on=pl.col("k") + 1, right_on="k"), ["MapFunction"]),
        (lambda a, b: _opaque(a).join(_opaque(b), on="k", how="left"), ["MapFunction"]),
        (lambda a, b: a.join(_opaque(b), on="k", how="right"), ["MapFunction"]),
        (lambda a, b: _opaque(a).join_asof(b, on="k"), ["MapFunction"]),
        (lambda a, b: _opaque(a).join_where(b, pl.col("v") < pl.col("v_right")), ["MapFunction"]),
        (
            lambda a, b: _opaque(a).join(b.with_columns(pl.col("v").top_k(1).first()), on="k"),
            ["MapFunction", "Function(top_k)"],
        ),
        (
            lambda a, b: (
                _opaque(a.with_columns(pl.col("v").mode().first().alias("r")))
                .join(b, on="k")
                .filter(pl.col("v") > pl.col("v_right"))
            ),
            ["MapFunction", "Function(mode)"],
        ),
    ],
)
def test_join_with_an_untranslatable_input_reports_every_part(
    mem: pl.LazyFrame, right: pl.LazyFrame, query: Callable[..., pl.LazyFrame], parts: list[str]
) -> None:
    lf = query(mem.drop_nulls("k"), right)
    with pytest.raises(UnsupportedError) as info:
        to_ir(lf)
    msg = str(info.value)
    assert f"{len(parts)} unsupported part" in msg
    for part in parts:
        assert part in msg
    with pytest.raises(UnsupportedError, match="MapFunction"):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))


def test_fallback_warns_and_gives_polars_answer(mem: pl.LazyFrame, right: pl.LazyFrame) -> None:
    # the join keeps an order, so that the streaming engine's answer is repeatable; the
    # modes of a column are refused (their order is not defined), counting them is
    # repeatable
    lf = mem.join(right, on="k", maintain_order="left_right")
    lf = lf.with_columns(pl.col("v").mode().n_unique().alias("modes"))
    with pytest.warns(ShoalFallbackWarning, match=r"(?s)falling back.*Function\(mode\)") as rec:
        got = lf.collect(engine=DistEngine(runner="local"))
    assert rec[0].filename == __file__  # points at the caller of collect()
    # the engine a plain collect() runs
    assert_frame_equal(got, lf.collect())


def test_raise_on_fail_explicit_wins_over_config(mem: pl.LazyFrame) -> None:
    lf = mem.select(pl.col("v").mode())
    raising = Config(runner="local", raise_on_fail=True)
    with pytest.warns(ShoalFallbackWarning):
        lf.collect(engine=DistEngine(raise_on_fail=False, config=raising))
    with pytest.raises(UnsupportedError):
        lf.collect(engine=DistEngine(config=raising))
    with pytest.raises(UnsupportedError):
        lf.collect(engine=DistEngine(runner="local", raise_on_fail=True, config=Config()))


def test_background_collect_of_an_untranslatable_query(
    mem: pl.LazyFrame, right: pl.LazyFrame
) -> None:
    """Background collects run on shoal (tests/test_polars_background.py); one that shoal
    cannot translate falls back to Polars' background collect, or raises."""
    lf = _unsupported(mem, right)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # Polars: background mode is unstable
        warnings.simplefilter("error", ShoalFallbackWarning)
        with pytest.raises(UnsupportedError):
            lf.collect(engine=DistEngine(raise_on_fail=True), background=True)
        warnings.simplefilter("always", ShoalFallbackWarning)
        with pytest.warns(ShoalFallbackWarning, match="background collect falls back"):
            q = lf.collect(engine=DistEngine(raise_on_fail=False), background=True)
    assert_frame_equal(q.fetch_blocking(), lf.collect(engine="in-memory"))


# ---------------------------------------------------------------- version gate


class _FakeTraverser:
    """Just enough of a NodeTraverser for the version gate."""

    def __init__(self, version: tuple[int, int]) -> None:
        self._version = version
        self.udf: Callable[..., Any] | None = None

    def version(self) -> tuple[int, int]:
        return self._version

    def get_schema(self) -> dict[str, pl.DataType]:
        return {"a": pl.Int64()}

    def set_udf(self, fn: Callable[..., Any]) -> None:
        self.udf = fn


def test_untested_version_is_refused() -> None:
    check_version(_FakeTraverser((16, 0)))
    with pytest.raises(UnsupportedError, match=r"NodeTraverser version \(17, 0\) is not "
                       r"supported by shoal; tested: \(16, 0\)"):  # fmt: skip
        check_version(_FakeTraverser((17, 0)))


def test_untested_version_falls_back_or_raises() -> None:
    nt = _FakeTraverser((15, 2))
    with pytest.warns(ShoalFallbackWarning, match=r"version \(15, 2\)"):
        DistEngine(raise_on_fail=False)._callback(nt)
    assert nt.udf is None  # Polars runs the plan itself
    DistEngine(raise_on_fail=True)._callback(nt)
    assert nt.udf is not None
    with pytest.raises(UnsupportedError, match=r"version \(15, 2\)"):
        nt.udf()


# ---------------------------------------------------------------- the engine


def test_dist_name_resolves_to_dist_engine() -> None:
    from polars.lazyframe import engine_config

    assert isinstance(engine_config._ENGINE_BY_NAME, dict)
    # "dist" is not in Polars' EngineType literal: mypy flags it, Python accepts it.
    engine = engine_config._select_engine("dist")  # type: ignore[arg-type]
    assert isinstance(engine, DistEngine)
    assert engine.name == "in-memory"  # the only kind of name Polars' Rust side accepts
    assert shoal.DistEngine is DistEngine


def test_registration_refuses_a_moved_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    from polars.lazyframe import engine_config

    monkeypatch.delattr(engine_config, "_ENGINE_BY_NAME")
    with pytest.raises(ImportError, match=r"'dist'.*tested with Polars 2\.1\.0"):
        shoal_polars._register()


def test_collect_engine_dist_runs_through_shoal(
    mem: pl.LazyFrame, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans: list[Any] = []

    def fake_execute(plan: Any, runner: Any, config: Any, native: Any = None) -> Any:
        plans.append(plan)
        return run_single(plan)

    monkeypatch.setattr(engine_mod, "_execute", fake_execute)
    lf = mem.group_by("g").agg(pl.col("u").sum())
    got = lf.collect(engine="dist")  # type: ignore[call-overload]
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_row_order=False)
    assert len(plans) == 1 and isinstance(plans[0], Aggregate)


@pytest.mark.parametrize(
    "name", ["group_by-aggs", "sort-head", "unique", "unique-none-ordered", "concat"]
)
def test_local_runner_end_to_end(pq: pl.LazyFrame, name: str) -> None:
    lf = AGG_QUERIES[name](pq)
    config = Config(runner="local", target_partition_bytes=256)  # several partitions
    got = lf.collect(engine=DistEngine(config=config, raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"), check_row_order=name in _ORDERED)


def test_local_runner_join(pq: pl.LazyFrame, right: pl.LazyFrame) -> None:
    lf = pq.join(right, on="k", how="left").sort("u", "t", "m", nulls_last=True)
    got = lf.collect(engine=DistEngine(runner="local", raise_on_fail=True))
    assert_frame_equal(got, lf.collect(engine="in-memory"))


def test_result_takes_polars_schema() -> None:
    import pyarrow as pa

    table = pa.table({"a": pa.array([1, 2], pa.int64()), "b": pa.array(["x", None])})
    out = to_polars_frame(table, {"a": pl.Int32(), "b": pl.String()})
    assert out.schema == pl.Schema({"a": pl.Int32(), "b": pl.String()})
    with pytest.raises(PlanError, match="Polars expects"):
        to_polars_frame(table, {"b": pl.String(), "a": pl.Int64()})


def test_engine_arguments() -> None:
    with pytest.raises(ValueError, match="runner"):
        DistEngine(runner="spark")  # type: ignore[arg-type]
    assert DistEngine()._post_opt_callback(background=False, eager=True) is None
    assert DistEngine()._post_opt_callback(background=True, eager=False) is None
