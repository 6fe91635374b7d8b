"""User functions in Polars queries: the ``lf.shoal`` LazyFrame namespace.

``lf.shoal.with_udf(f, inputs=["text"], output="vec")`` is ``lf`` with a column ``vec``
computed by the shoal UDF ``f`` (made with ``@shoal.udf``) from the column ``text``, as
``lf.with_columns`` would add it: a column of that name is replaced in place, else the new
one is appended. The same code gives the same answer on native Polars and with shoal:

* **Native Polars** (``lf.collect()``, any Polars engine): the result is a Python scan
  (``polars.io.plugins.register_io_source``) that collects ``lf`` and applies ``f`` batch by
  batch in this process (a class UDF: one instance per process, made on first use).
* **shoal** (``collect(engine="dist")``): Polars shows the Python scan to engines with its
  callable, which is a :class:`UdfSource`; shoal's translation (:func:`translate_python_scan`,
  registered for Polars' ``PythonScan`` node) translates ``lf`` itself and puts a
  :class:`shoal.ir.nodes.UdfProject` on top, so that the UDF runs distributed (on an actor
  pool for a class or a GPU request).

Polars pushes projections, predicates and row limits of the outer query into the scan;
both paths apply them the same way: a predicate that does not read the UDF's output is
applied *before* the UDF (fewer rows reach the model), and the UDF is skipped when its
output is not selected.

Why a Python scan: Polars hides Python functions in expressions (``map_batches``) and
frames (``LazyFrame.map_batches``) from engines as opaque, while a Python scan shows its
callable (NodeTraverser 16.0).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import polars as pl
from polars.io.plugins import register_io_source

from shoal.errors import PlanError
from shoal.ir.nodes import Filter, InMemorySource, PlanNode, Project, Scan, Slice
from shoal.ir.types import Schema
from shoal.udf import UDF, project
from shoal_polars.translate import NODES, UNSUPPORTED_NODES, Translator


class UdfSource:
    """The callable of the Python scan that :meth:`ShoalNamespace.with_udf` builds: ``input``
    (a LazyFrame) with column ``output`` = ``udf(*inputs)``. Polars calls it as an IO source
    (``(with_columns, predicate, n_rows, batch_size) -> iterator of DataFrames``); shoal
    recognises it in the plan and reads its fields instead.
    """

    def __init__(
        self, input: pl.LazyFrame, udf: UDF, inputs: tuple[str, ...], output: str, schema: pl.Schema
    ) -> None:
        self.input = input
        self.udf = udf
        self.inputs = inputs
        self.output = output
        self.schema = schema

    def __repr__(self) -> str:
        return f"UdfSource({self.udf.name}({', '.join(self.inputs)}) AS {self.output})"

    def __call__(
        self,
        with_columns: list[str] | None,
        predicate: pl.Expr | None,
        n_rows: int | None,
        batch_size: int | None,
    ) -> Iterator[pl.DataFrame]:
        """Native Polars: collect the input, apply the UDF here, then the pushed-down parts.
        ``batch_size`` (Polars' hint) is ignored: the UDF's own batch size applies."""
        lf = self.input
        pushed = predicate is not None and self.output not in predicate.meta.root_names()
        if pushed:
            assert predicate is not None
            lf = lf.filter(predicate)
        run_udf = with_columns is None or self.output in with_columns
        if with_columns is not None:
            keep = [
                c
                for c in self.input.collect_schema().names()
                if c in with_columns and c != self.output or (run_udf and c in self.inputs)
            ]
            lf = lf.select(keep)
        df = lf.collect()
        if run_udf:
            out = self.udf.apply([df.get_column(c) for c in self.inputs])
            df = df.with_columns(out.alias(self.output))
        if predicate is not None and not pushed:
            df = df.filter(predicate)
        if with_columns is not None:
            df = df.select(with_columns)
        if n_rows is not None:
            df = df.head(n_rows)
        yield df


def with_udf(lf: pl.LazyFrame, udf: UDF, inputs: Sequence[str] | str, output: str) -> pl.LazyFrame:
    """``lf`` with column ``output`` = the shoal UDF ``udf`` applied to the columns
    ``inputs`` (see the module docstring; native Polars and shoal give the same rows). The
    same as ``lf.shoal.with_udf(...)``, for code that type checkers should follow.

    Raises ``TypeError`` when ``udf`` is not a shoal UDF (decorate with ``@shoal.udf``),
    :class:`shoal.PlanError` when an input column does not exist.
    """
    if not isinstance(udf, UDF):
        raise TypeError(f"with_udf needs a shoal UDF (made with @shoal.udf), got {udf!r}")
    cols = (inputs,) if isinstance(inputs, str) else tuple(inputs)
    schema = lf.collect_schema()
    missing = [c for c in cols if c not in schema]
    if missing or not cols:
        raise PlanError(
            f"UDF {udf.name!r}: input column(s) {missing or '(none)'} not in {schema.names()}"
        )
    out_schema = pl.Schema(dict(schema) | {output: udf.return_dtype.to_polars()})
    source = UdfSource(lf, udf, cols, output, out_schema)
    return register_io_source(
        source,
        schema=out_schema,
        explain_name=f"shoal udf {udf.name}",
        explain_detail=f"{output} = {udf.name}({', '.join(cols)})",
    )


@pl.api.register_lazyframe_namespace("shoal")
class ShoalNamespace:
    """``lf.shoal``: shoal's additions to Polars LazyFrames."""

    def __init__(self, lf: pl.LazyFrame) -> None:
        self._lf = lf

    def with_udf(self, udf: UDF, inputs: Sequence[str] | str, output: str) -> pl.LazyFrame:
        """See :func:`with_udf`."""
        return with_udf(self._lf, udf, inputs, output)


def translate_python_scan(t: Translator, view: Any, schema: Schema) -> PlanNode:
    """Polars' ``PythonScan`` node: a :class:`UdfSource` becomes its input's plan with a
    :class:`~shoal.ir.nodes.UdfProject` on top (plus the pushed-down predicate, projection
    and row limit); a :class:`~shoal_polars.results.ResultSource` (a shoal result's
    ``lazy()``) becomes an in-memory scan of the result, read on the driver; any other
    Python scan is unsupported."""
    options = tuple(view.options)
    scan_fn = options[0] if options else None
    source = getattr(scan_fn, "io_source", None)
    from shoal_polars.results import ResultSource

    if isinstance(source, ResultSource) and len(options) >= 5:
        table = source.table()  # a shoal result read again: through the driver
        scanned: PlanNode = Scan(InMemorySource(table), Schema.from_arrow(table.schema))
    elif not isinstance(source, UdfSource) or len(options) < 5:
        t.error("PythonScan", UNSUPPORTED_NODES["PythonScan"])
        return t.placeholder(schema)
    where = f"PythonScan({source!r})"
    with_columns, predicate, n_rows = options[1], options[3], options[4]
    pred = None
    if predicate is not None:
        kind, node = (predicate[0], predicate[1]) if isinstance(predicate, tuple) else ("", None)
        if kind != "polars" or not isinstance(node, int):
            t.error(where, f"pushed-down predicate of an unknown form {predicate!r}")
            return t.placeholder(schema)
        pred = t.expr(node, where)
    if n_rows is not None and not isinstance(n_rows, int):
        t.error(where, f"pushed-down row limit of an unknown form {n_rows!r}")
        return t.placeholder(schema)
    if isinstance(source, ResultSource):
        return _result_scan(t, where, scanned, pred, with_columns, n_rows, schema)
    from shoal_polars.engine import to_ir

    try:
        plan = to_ir(source.input)
    except Exception as exc:
        t.error(where, f"its input cannot be translated: {exc}")
        return t.placeholder(schema)
    u = source.udf
    pushed = pred is not None and source.output not in pred.columns()
    if pushed:
        assert pred is not None
        plan = Filter(plan, pred, plan.schema)
    run_udf = with_columns is None or source.output in with_columns
    if with_columns is not None:
        keep = [
            c
            for c in plan.schema.names
            if c in with_columns and c != source.output or (run_udf and c in source.inputs)
        ]
        plan = _select(plan, keep)
    if run_udf:
        plan = project(plan, u, source.inputs, source.output)
    if pred is not None and not pushed:
        plan = Filter(plan, pred, plan.schema)
    if with_columns is not None:
        plan = _select(plan, list(with_columns))
    if n_rows is not None:
        plan = Slice(plan, 0, int(n_rows), plan.schema)
    if plan.schema != schema:
        t.error(where, f"schema {plan.schema} differs from Polars' {schema}")
        return t.placeholder(schema)
    return plan


def _result_scan(
    t: Translator,
    where: str,
    plan: PlanNode,
    pred: Any,
    with_columns: Any,
    n_rows: int | None,
    schema: Schema,
) -> PlanNode:
    """A scan of a shoal result (``lf.execute(engine=...).lazy()``) with what Polars
    pushed into it: filter, columns, row limit."""
    if pred is not None:
        plan = Filter(plan, pred, plan.schema)
    if with_columns is not None:
        plan = _select(plan, list(with_columns))
    if n_rows is not None:
        plan = Slice(plan, 0, int(n_rows), plan.schema)
    if plan.schema != schema:
        t.error(where, f"schema {plan.schema} differs from Polars' {schema}")
        return t.placeholder(schema)
    return plan


def _select(plan: PlanNode, names: list[str]) -> PlanNode:
    from shoal.ir.expr import Col, NamedExpr

    if list(plan.schema.names) == names:
        return plan
    exprs = tuple(NamedExpr(n, Col(n, plan.schema[n])) for n in names)
    return Project(plan, exprs, Schema(tuple((n, plan.schema[n]) for n in names)), keep_height=True)


NODES["PythonScan"] = translate_python_scan
