"""Plans nested deeper than Python's recursion allows get shoal's errors, not RecursionError."""

from __future__ import annotations

import json

import polars as pl
import pyarrow as pa
import pytest

import shoal
from shoal.ir import from_json, to_json
from shoal.plan.builder import col
from shoal_polars.engine import ShoalFallbackWarning

DEPTH = 1500


def _deep_query() -> pl.LazyFrame:
    e = pl.col("a")
    for i in range(DEPTH):
        e = e + (i % 3)
    return pl.LazyFrame({"a": [1, None, 3]}).select(e)


def test_a_deep_polars_expression_is_refused_with_a_reason_or_falls_back() -> None:
    lf = _deep_query()
    strict = shoal.DistEngine(runner="local", raise_on_fail=True)
    with pytest.raises(shoal.UnsupportedError, match="nested too deeply"):
        lf.collect(engine=strict)
    with pytest.warns(ShoalFallbackWarning, match="nested too deeply"):
        got = lf.collect(engine=shoal.DistEngine(runner="local"))
    assert got.equals(lf.collect(engine="in-memory"))


def test_a_deep_ir_document_is_a_plan_error() -> None:
    table = pa.table({"a": [1, 2]})
    plan = shoal.ir.from_arrow(table).filter(col("a") > 0).plan
    doc = json.loads(to_json(plan, tables={"t": table}))
    filter_node = doc["plan"]
    predicate = filter_node["predicate"]
    for _ in range(900):  # the predicate: ((a > 0) & (a > 0)) & ..., 900 levels deep
        predicate = {
            "kind": "BinaryOp",
            "op": "and",
            "left": predicate,
            "right": filter_node["predicate"],
            "dtype": "bool",
        }
    doc["plan"] = {**filter_node, "predicate": predicate}
    with pytest.raises(shoal.PlanError, match="nested too deeply"):
        from_json(json.dumps(doc), tables={"t": table})
    with pytest.raises(shoal.PlanError, match="nested too deeply"):
        from_json("[" * 100_000 + "]" * 100_000)
    shallow = {**filter_node}
    assert from_json(json.dumps({**doc, "plan": shallow}), tables={"t": table}) == plan


def test_reading_a_deep_expression_lowers_each_node_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19 (linear-time IR reading): the validator types every sub-expression; it
    lowered each subtree to Polars separately (n^2/2 lowerings for an n-level chain, 7.9 s
    to read a 300-level sum back from JSON). Counted, not timed."""
    from shoal.lowering import expressions

    calls = 0
    lower = expressions._to_polars

    def counting(e: object) -> pl.Expr:
        nonlocal calls
        calls += 1
        return lower(e)  # type: ignore[arg-type]

    monkeypatch.setattr(expressions, "_to_polars", counting)
    table = pa.table({"a": [1, None, 3]})
    levels = 300
    e = col("a")
    for i in range(levels):
        e = e + (i % 3)
    plan = shoal.ir.from_arrow(table).select(e.alias("b")).plan
    text = to_json(plan, tables={"t": table})
    calls = 0
    assert from_json(text, tables={"t": table}) == plan
    assert calls <= 6 * levels, calls  # about 2 per node; n^2/2 = 45,000 before
    got = shoal.execute(plan, runner="local")
    want = pl.DataFrame({"a": [1, None, 3]}).select(pl.col("a") + sum(i % 3 for i in range(levels)))
    assert pl.from_arrow(got)["b"].to_list() == want["a"].to_list()
