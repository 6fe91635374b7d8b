"""What Polars does not show to engines, recovered from the query Polars was given.

Polars 2.1's NodeTraverser (version 16.0) refuses to show some parts of a plan:

* scan nodes of an in-memory buffer (``scan_parquet(io.BytesIO(...))``, ``scan_csv``,
  ``scan_ndjson``, ``scan_ipc`` of a buffer or an open file): ``view_current_node()`` raises
  ``NotImplementedError('scan with BytesIO')``; every IPC scan: ``'ipc scan'``. Nothing gives
  the buffer, the paths, or the predicate and columns Polars pushed into the scan.
* ``list.eval``, ``cumulative_eval`` and the list and array functions Polars lowers to them
  (``list.unique``, ``list.reverse``, ``arr.unique``, ...): ``view_expression`` raises
  ``NotImplementedError('list.eval')`` and shows neither the list nor the element
  expression.

The query Polars was asked to run (its DSL, before optimisation) holds both. When the only
parts shoal could not translate are of these kinds (:class:`RewriteNeeded`),
:func:`rewrite` serialises the query (Polars' JSON form of the plan) and edits it:

* each such scan is read *alone*, now, on the driver, by Polars' in-memory engine (every
  option of the scan, ``row_index_name``, ``n_rows``, ``include_file_paths``, ..., applied by
  Polars) and replaced by the frame it read (a ``DataFrameScan``). Polars then optimises the
  query as usual (pushing projections and predicates into the in-memory scan), and shoal
  distributes it like any in-memory frame: row ranges, every operator above the scan in
  shoal's tasks.
* each ``pl.field(name)`` in ``struct.with_fields`` (Polars does not show ``pl.field``)
  is written as ``<the struct>.struct.field(name)``, which Polars shows and which means
  the same there.
* each ``Eval`` expression in a ``select``, ``with_columns``, ``filter``, ``group_by`` or
  ``sort`` is replaced by a stand-in that Polars shows and never rewrites,
  ``<list>.hash(seed=<marker>).cast(<the Eval's dtype>)``, which keeps the list expression
  (so projection pushdown keeps its columns) and the output type. Translation turns the
  stand-in back into the IR function ``list.eval`` (``cumulative_eval`` for the
  cumulative kind), whose option ``eval`` is Polars' own JSON of the ``Eval`` with its list
  input left out: the kernel puts the list expression back and lets Polars run it, so the
  per-row work is Polars'. Element expressions that read a column other than the element,
  or draw random numbers (``shuffle``, ``sample``, ``rank("random")``), are left alone (the
  query falls back: a random draw per list is not repeatable).

What counts as distributed: a *source* read on the driver is allowed with
``raise_on_fail=True``: a buffer already lives in the driver's memory, like a
``DataFrame`` given to ``.lazy()``. An operator in the middle of a plan never runs on the
driver: what shoal cannot translate there falls back (or raises). ``shoal.explain`` names
each source read on the driver. The cost: the query is serialised once more on the driver
(in proportion to the in-memory frames it holds), and an IPC file is read whole by the
driver before its rows are distributed.
"""

from __future__ import annotations

import contextlib
import io
import json
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from shoal.errors import UnsupportedError

#: What ``view_current_node()`` says (``NotImplementedError``) at a scan that
#: :func:`rewrite` reads on the driver.
OPAQUE_SCANS = ("scan with BytesIO", "ipc scan", "FastCount with BytesIO sources")

#: What ``view_expression`` says (``NotImplementedError``) at an ``Eval`` expression.
OPAQUE_EVAL = "list.eval"

#: Seeds of the ``hash`` stand-ins for ``Eval`` expressions: ``_SEED_BASE + i``.
_SEED_BASE = 0x5_40A1_0000_0000

#: Plan node kinds (Polars' JSON) whose expressions may hold an ``Eval`` that
#: :func:`rewrite` replaces, with the fields that hold expressions (over ``input``).
_EXPRESSION_FIELDS: dict[str, tuple[str, ...]] = {
    "Select": ("expr",),
    "HStack": ("exprs",),
    "Filter": ("predicate",),
    "GroupBy": ("keys", "aggs"),
    "Sort": ("by_column",),
}

#: Words in an element expression's JSON that make it random (not repeatable per list).
_RANDOM = ("Shuffle", "Sample", '"Random"')


class RewriteNeeded(UnsupportedError):
    """Every part of the plan that shoal could not translate is a scan or an ``Eval``
    that Polars does not show to engines: :func:`rewrite` can recover them."""


@dataclass(frozen=True)
class DriverFrame:
    """A frame read on the driver, and what it was read from (for ``explain``)."""

    frame: pl.DataFrame
    origin: str


@dataclass(frozen=True)
class EvalStandIn:
    """An ``Eval`` that :func:`rewrite` replaced by a ``hash(seed)`` stand-in: the IR
    function name (``list.eval`` or ``cumulative_eval``), Polars' JSON of the ``Eval``
    without its list input (``"expr": null``) and the element expression as text."""

    name: str
    template: str
    element: str


@dataclass
class Rewritten:
    """What :func:`rewrite` did to a query: the frames read on the driver and the
    ``Eval`` stand-ins by seed."""

    frames: tuple[DriverFrame, ...] = ()
    evals: dict[int, EvalStandIn] = field(default_factory=dict)
    #: Indices of :attr:`frames` already matched to an in-memory scan by translation.
    taken: set[int] = field(default_factory=set)


#: The rewrite of the query being translated (set by :func:`labelled`).
_CURRENT: ContextVar[Rewritten | None] = ContextVar("shoal_polars_rewrite", default=None)


@contextlib.contextmanager
def labelled(done: Rewritten) -> Iterator[None]:
    """While the block runs, translation recognises the frames and stand-ins of ``done``
    (:func:`origin_of`, :func:`eval_stand_in`)."""
    token = _CURRENT.set(done)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def origin_of(frame: pl.DataFrame) -> str | None:
    """Where ``frame`` (an in-memory scan of the plan being translated) came from, if it is
    a frame read on the driver for this query (each is matched once); None for the user's
    own frames."""
    done = _CURRENT.get()
    if done is None:
        return None
    for i, found in enumerate(done.frames):
        if i in done.taken or found.frame.schema != frame.schema:
            continue
        if found.frame.height == frame.height and found.frame.equals(frame):
            done.taken.add(i)
            return found.origin
    return None


def eval_stand_in(seed: Any) -> EvalStandIn | None:
    """The ``Eval`` that a ``hash(seed)`` of the plan being translated stands in for."""
    done = _CURRENT.get()
    if done is None or not isinstance(seed, int):
        return None
    return done.evals.get(seed)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # Polars 2.1 deprecates the JSON form of plans (a UserWarning); it is the only form a
    # program can edit.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*serializ.*format")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        yield


def rewrite(lf: pl.LazyFrame) -> tuple[pl.LazyFrame, Rewritten]:
    """``lf`` with every scan Polars does not show to engines replaced by the frame it
    reads (read now, on the driver, by Polars' in-memory engine) and every ``Eval`` in a
    plan node's expressions replaced by its stand-in; and what was done.

    Raises :class:`shoal.UnsupportedError` when the query cannot be rewritten: Polars
    cannot serialise it (a Python function in the plan), its JSON form does not read back
    as the same query (same unoptimised plan and schema), or nothing in it was rewritten.
    Errors of a read itself (a corrupt buffer, a missing file) propagate as Polars raises
    them; the engine refuses the query for them (the read on the driver takes every column
    of the scan, so an error there need not be the query's).
    """
    with _quiet():
        try:
            plan = json.loads(lf.serialize(format="json"))
        except Exception as exc:
            raise UnsupportedError(
                f"the query cannot be serialised by Polars ({type(exc).__name__}: {exc})"
            ) from exc
        _check_round_trip(lf, plan)
        frames: list[DriverFrame] = []
        evals: dict[int, EvalStandIn] = {}
        edited = _plan(plan, frames, evals)
        if edited == plan:
            raise UnsupportedError("nothing in the query could be rewritten")
        out = pl.LazyFrame.deserialize(io.StringIO(json.dumps(edited)), format="json")
    return out, Rewritten(tuple(frames), evals)


def _check_round_trip(lf: pl.LazyFrame, plan: Any) -> None:
    """Raise :class:`shoal.UnsupportedError` unless Polars' JSON form of ``lf`` (``plan``)
    reads back as the same query: the same unoptimised plan (as ``explain`` prints it)
    and the same schema. A query whose JSON form lost an option is never rewritten."""
    back = pl.LazyFrame.deserialize(io.StringIO(json.dumps(plan)), format="json")
    try:
        same = (
            back.explain(optimized=False) == lf.explain(optimized=False)
            and back.collect_schema() == lf.collect_schema()
        )
    except Exception as exc:
        raise UnsupportedError(f"the query's JSON form cannot be read back ({exc})") from exc
    if not same:
        raise UnsupportedError("Polars' JSON form of this query does not read back as the query")


def _plan(node: Any, frames: list[DriverFrame], evals: dict[int, EvalStandIn]) -> Any:
    """``node`` (Polars' JSON plan) with opaque scans read and ``Eval`` stand-ins in."""
    if isinstance(node, list):
        return [_plan(x, frames, evals) for x in node]
    if not isinstance(node, dict):
        return node
    if len(node) == 1:
        kind, body = next(iter(node.items()))
        if kind == "Scan" and isinstance(body, dict) and "sources" in body:
            origin = _opaque(body)
            if origin is None:
                return node
            args = body.get("unified_scan_args")
            if isinstance(args, dict) and args.get("row_count") is not None:
                # Read alone, its rows would be counted, not the row count it was given.
                raise UnsupportedError(
                    f"{origin}: a row count given with the scan (_row_count) is not supported"
                )
            alone = pl.LazyFrame.deserialize(io.StringIO(json.dumps(node)), format="json")
            frame = alone.collect(engine="in-memory")
            frames.append(DriverFrame(frame, origin))
            return json.loads(frame.lazy().serialize(format="json"))
        fields = _EXPRESSION_FIELDS.get(kind)
        if fields and isinstance(body, dict) and isinstance(body.get("input"), dict):
            out = {k: _plan(v, frames, evals) if k == "input" else v for k, v in body.items()}
            text = "".join(json.dumps(out.get(f)) for f in fields)
            if OPAQUE_EVAL_KEY in text or _FIELD_KEY in text:
                schema = _schema(out["input"]) if OPAQUE_EVAL_KEY in text else None
                for f in fields:
                    if f in out:
                        out[f] = _evals(out[f], schema, evals)
            return {kind: out}
    return {k: _plan(v, frames, evals) for k, v in node.items()}


#: How an ``Eval`` expression starts in Polars' JSON.
OPAQUE_EVAL_KEY = '{"Eval": '

#: How ``pl.field(...)`` starts in Polars' JSON.
_FIELD_KEY = '{"Field": '


def _schema(plan: Any) -> pl.Schema | None:
    """The output schema of a JSON plan (None when Polars cannot resolve it)."""
    try:
        lf = pl.LazyFrame.deserialize(io.StringIO(json.dumps(plan)), format="json")
        return lf.collect_schema()
    except Exception:
        return None


def _evals(
    expr: Any, schema: pl.Schema | None, evals: dict[int, EvalStandIn], nested: bool = False
) -> Any:
    """``expr`` (JSON) with each outermost ``Eval`` replaced by its stand-in (an ``Eval``
    shoal cannot carry stays as it is, and the query falls back for it), and the
    ``pl.field`` of each outermost ``struct.with_fields`` written out (:func:`_fields`
    rewrites the ``with_fields`` nested in its evaluation; ``nested`` is True inside one)."""
    if isinstance(expr, list):
        return [_evals(x, schema, evals, nested) for x in expr]
    if not isinstance(expr, dict):
        return expr
    body = expr.get("Eval") if len(expr) == 1 else None
    if isinstance(body, dict) and schema is not None:
        stand_in = _stand_in(body, schema, evals)
        if stand_in is not None:
            return stand_in
    struct_eval = expr.get("StructEval") if len(expr) == 1 else None
    if not isinstance(struct_eval, dict) or not isinstance(struct_eval.get("evaluation"), list):
        return {k: _evals(v, schema, evals, nested) for k, v in expr.items()}
    # The struct is read in the enclosing context; the evaluation in this struct's.
    inner = {
        k: _evals(v, schema, evals, nested or k == "evaluation") for k, v in struct_eval.items()
    }
    if not nested:
        inner["evaluation"] = _fields(inner["evaluation"], inner.get("expr"))
    return {"StructEval": inner}


def _fields(expr: Any, struct: Any) -> Any:
    """``expr`` (JSON, an evaluation of ``struct.with_fields``) with each ``pl.field(name)``
    written as ``<struct>.struct.field(name)``, which Polars shows to engines and means the
    same there (``with_fields`` reads fields of its own struct). A nested ``with_fields``
    reads its own struct in this one's context (its ``pl.field`` are written out with
    ``struct``), and its evaluation in its own (its ``pl.field`` name fields of its
    struct)."""
    if isinstance(expr, list):
        return [_fields(x, struct) for x in expr]
    if not isinstance(expr, dict):
        return expr
    names = expr.get("Field") if len(expr) == 1 else None
    if isinstance(names, list) and len(names) == 1:
        try:
            with_struct = pl.Expr.deserialize(io.StringIO(json.dumps(struct)), format="json")
            return json.loads(with_struct.struct.field(names[0]).meta.serialize(format="json"))
        except Exception:
            return expr
    inner = expr.get("StructEval") if len(expr) == 1 else None
    if isinstance(inner, dict) and isinstance(inner.get("evaluation"), list):
        own = _fields(inner.get("expr"), struct)
        return {
            "StructEval": {**inner, "expr": own, "evaluation": _fields(inner["evaluation"], own)}
        }
    return {k: _fields(v, struct) for k, v in expr.items()}


def _stand_in(body: dict[str, Any], schema: pl.Schema, evals: dict[int, EvalStandIn]) -> Any:
    """The JSON of ``<list>.hash(seed).cast(<dtype>)`` for the ``Eval`` ``body`` over a
    frame of ``schema``, registering it in ``evals``; None when shoal cannot carry it."""
    # An Eval in the list input (``list.eval(...).list.any()``) gets its own stand-in.
    body = {**body, "expr": _evals(body.get("expr"), schema, evals)}
    element = json.dumps(body.get("evaluation"))
    if any(word in element for word in _RANDOM) or _reads_columns(body.get("evaluation")):
        return None
    variant = body.get("variant")
    kind = next(iter(variant), "") if isinstance(variant, dict) else str(variant)
    if kind.startswith(("List", "Array")):
        # list.eval, list.agg (list.any, list.n_unique, ...), the arr.* lowerings: each
        # list (row) on its own
        name = "list.eval"
    elif kind == "Cumulative":
        name = "cumulative_eval"
    else:
        return None
    try:
        whole = pl.Expr.deserialize(io.StringIO(json.dumps({"Eval": body})), format="json")
        dtype = pl.LazyFrame(schema=schema).select(whole.alias("x")).collect_schema()["x"]
        inner = pl.Expr.deserialize(io.StringIO(json.dumps(body["expr"])), format="json")
        seed = _SEED_BASE + len(evals)
        stand_in = inner.hash(seed).cast(dtype)
        out = json.loads(stand_in.meta.serialize(format="json"))
        text = str(pl.Expr.deserialize(io.StringIO(element), format="json"))
    except Exception:
        return None
    template = json.dumps({"Eval": {**body, "expr": None}})
    evals[seed] = EvalStandIn(name, template, text)
    return out


def _reads_columns(expr: Any) -> bool:
    """Whether an element expression reads a column (``pl.col("")`` is the element)."""
    if isinstance(expr, list):
        return any(_reads_columns(x) for x in expr)
    if not isinstance(expr, dict):
        return False
    if len(expr) == 1 and "Column" in expr:
        return expr["Column"] != ""
    if len(expr) == 1 and ("Columns" in expr or "Selector" in expr or "Nth" in expr):
        return True
    return any(_reads_columns(v) for v in expr.values())


def _opaque(scan: dict[str, Any]) -> str | None:
    """What a scan node reads, if the NodeTraverser does not show it; None otherwise."""
    sources = scan.get("sources") or {}
    kind = scan.get("scan_type")
    fmt = next(iter(kind)) if isinstance(kind, dict) and kind else str(kind)
    fmt = {"NDJson": "NDJSON", "Ipc": "IPC", "Csv": "CSV"}.get(fmt, fmt)
    if "Paths" not in sources:
        return f"{fmt} scan of an in-memory buffer"
    if fmt == "IPC":
        paths = [p.get("inner", p) if isinstance(p, dict) else p for p in sources["Paths"]]
        shown = ", ".join(map(str, paths[:3])) + (", ..." if len(paths) > 3 else "")
        return f"IPC scan of {shown}"
    return None
