"""Polars' optimised plan (NodeTraverser version (16, 0)) -> shoal IR plan.

:func:`translate_plan` walks the plan from the cursor's node down with a
:class:`Translator`. One function per Polars plan node class, chosen by class name in
:data:`NODES` (the functions are in :mod:`shoal_polars.nodes`, expressions in
:mod:`shoal_polars.exprs`). A part that cannot be translated is recorded and replaced by a
placeholder, and translation goes on, so that one :class:`shoal.UnsupportedError` names
every unsupported part of the query at once.
"""

from __future__ import annotations

import contextlib
import datetime
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from shoal.errors import PlanError, UnsupportedError
from shoal.ir.expr import Col, Expr, NamedExpr, replace
from shoal.ir.nodes import PlanNode
from shoal.ir.types import NULL, DataType, Schema
from shoal_polars.exprs import translate_expr
from shoal_polars.rewrite import OPAQUE_SCANS, RewriteNeeded

#: A datetime or time printed with nanoseconds (Polars prints 9 digits only when the
#: value is not a whole number of microseconds: ``2020-01-01 00:00:00.000000123``).
_SUBMICRO = re.compile(r"(\d{4}-\d\d-\d\d )?(\d\d:\d\d:\d\d)(\.\d{1,9})?(?!\d)")

#: NodeTraverser versions this translation was tested against.
TESTED_VERSIONS: tuple[tuple[int, int], ...] = ((16, 0),)

NodeHandler = Callable[["Translator", Any, Schema], PlanNode]

#: Polars plan node class name -> translation function (filled by :mod:`shoal_polars.nodes`).
NODES: dict[str, NodeHandler] = {}

#: Plan node classes shoal cannot run, with the reason.
UNSUPPORTED_NODES: dict[str, str] = {
    "PythonScan": "Python scans (register_io_source, from_*) cannot be read by shoal",
    "ExtContext": "with_context is not supported",
    "Sink": "sinks are not supported; collect the result instead",
}


@dataclass(frozen=True)
class Unsupported(PlanNode):
    """Placeholder for a plan part that could not be translated (never leaves this module:
    :func:`translate_plan` raises when one was made)."""

    schema: Schema


@dataclass(frozen=True)
class UnsupportedExpr(Expr):
    """Placeholder for an expression that could not be translated."""

    dtype: DataType


class Translator:
    """The state of one translation: the NodeTraverser, the errors, the Cache memo.

    ``nt`` is Polars' NodeTraverser; every method that moves its cursor moves it back.
    """

    def __init__(self, nt: Any, plan_text: Callable[[], str] | None = None) -> None:
        self.nt = nt
        self.errors: list[str] = []
        self.caches: dict[int, PlanNode] = {}
        #: Errors recorded at scans and expressions Polars does not show to engines, which
        #: :func:`shoal_polars.rewrite.rewrite` can recover.
        self.rewritable: set[str] = set()
        #: Columns made by Polars' common subexpression elimination (``__POLARS_CSER_*``,
        #: added by an ``HStack`` below the node that reads them) -> their expressions.
        self.cse: dict[str, Expr] = {}
        #: Polars' text of the plan (see :meth:`nanoseconds`), read when first needed.
        self.plan_text = plan_text
        self._submicro: dict[tuple[str, str], set[int]] | None = None
        #: Each plan node's output schema as Polars gives it, by node, asked once
        #: (:meth:`polars_schema`).
        self._schemas: dict[int, Any] = {}
        #: Polars dtypes of expressions, by (cursor node, expression node), asked once
        #: (:meth:`polars_dtype`).
        self._dtypes: dict[tuple[int, int], Any] = {}

    # -- errors ---------------------------------------------------------------------

    def error(self, what: str, reason: str) -> None:
        """Record an unsupported part: ``what`` names the Polars node (and expression)."""
        entry = f"{what}: {reason}"
        if entry not in self.errors:
            self.errors.append(entry)

    def placeholder(self, schema: Schema) -> PlanNode:
        """A plan placeholder (after :meth:`error`)."""
        return Unsupported(schema)

    def placeholder_expr(self, dtype: DataType = NULL) -> Expr:
        """An expression placeholder (after :meth:`error`)."""
        return UnsupportedExpr(dtype)

    @staticmethod
    def failed(expr: Expr) -> bool:
        """Whether ``expr`` contains a placeholder (its error is already recorded)."""
        return any(isinstance(e, UnsupportedExpr) for e in expr.walk())

    def nanoseconds(self, value: datetime.datetime | datetime.time) -> int | None:
        """The nanoseconds beyond the microsecond of a nanosecond datetime or time literal
        that the NodeTraverser gave as ``value`` (cut to the microsecond); None when that
        cannot be told.

        Polars' plan text (``explain()``) prints such a literal with all 9 digits when it
        is not a whole number of microseconds (``00:00:00.000000999``: Polars itself
        makes such literals, comparing a nanosecond column with a Python datetime). The
        text's values that start like ``value`` give its nanoseconds: none means 0, one
        value is the answer; several (two literals alike up to the microsecond, as the
        bounds of ``is_between`` that Polars makes of ``==``) or no text at all cannot be
        told apart."""
        extra = self.nanosecond_candidates(value)
        if extra is None or len(extra) > 1:
            return None
        return next(iter(extra), 0)

    def nanosecond_candidates(self, value: datetime.datetime | datetime.time) -> set[int] | None:
        """Every nanosecond part that Polars' plan text shows for a literal that starts like
        ``value`` (see :meth:`nanoseconds`); None without the plan text."""
        if self._submicro is None:
            if self.plan_text is None:
                return None
            found: dict[tuple[str, str], set[int]] = {}
            for m in _SUBMICRO.finditer(self.plan_text()):
                digits = (m.group(3) or ".")[1:].ljust(9, "0")
                key = ((m.group(1) or "").strip(), f"{m.group(2)}.{digits[:6]}")
                found.setdefault(key, set()).add(int(digits[6:]))
            self._submicro = found
        if isinstance(value, datetime.datetime):
            key = (value.strftime("%Y-%m-%d"), value.strftime("%H:%M:%S.%f"))
        else:
            key = ("", value.strftime("%H:%M:%S.%f"))
        return self._submicro.get(key, set())

    # -- cursor ---------------------------------------------------------------------

    @contextlib.contextmanager
    def at(self, node: int) -> Iterator[None]:
        """Move the cursor to ``node`` for the block, and back afterwards."""
        here = self.nt.get_node()
        self.nt.set_node(node)
        try:
            yield
        finally:
            self.nt.set_node(here)

    # -- pieces ---------------------------------------------------------------------

    def polars_schema(self) -> Any:
        """The output schema of the cursor's node as Polars gives it (``get_schema``: a
        mapping of names to Polars dtypes), asked of Polars once per node."""
        node = self.nt.get_node()
        got = self._schemas.get(node)
        if got is None:
            got = self._schemas[node] = self.nt.get_schema()
        return got

    def schema(self, where: str) -> Schema:
        """The output schema of the cursor's node."""
        polars_schema = self.polars_schema()
        try:
            return Schema.from_polars(polars_schema)
        except PlanError:
            pass
        fields = []
        for name, dtype in polars_schema.items():
            try:
                fields.append((name, DataType.from_polars(dtype)))
            except PlanError as exc:
                self.error(where, f"column {name!r}: {exc}; shoal cannot carry it")
        return Schema(tuple(fields))

    def dtype(self, node: int, where: str) -> DataType:
        """The IR type of expression ``node`` (resolved at the cursor's node)."""
        try:
            return DataType.from_polars(self.polars_dtype(node))
        except PlanError as exc:
            self.error(f"{where}: expression", f"type shoal cannot carry ({exc})")
            return NULL

    def polars_dtype(self, node: int) -> Any:
        """Polars' dtype of expression ``node`` at the cursor's node (``get_dtype``, about
        15 microseconds), asked of Polars once per expression and cursor node."""
        key = (self.nt.get_node(), node)
        got = self._dtypes.get(key)
        if got is None:
            got = self._dtypes[key] = self.nt.get_dtype(node)
        return got

    def column_dtype(self, name: str, node: int, where: str) -> DataType:
        """The IR type of column expression ``node`` (reading column ``name``) at the
        cursor's node: the type of that column in the cursor node's schema, which is what
        Polars' ``get_dtype`` resolves a column against (the cursor node's output schema),
        without asking Polars for each expression (about 15 microseconds each, dozens per
        query). A name the schema lacks, or a type shoal cannot carry, goes through
        :meth:`dtype` as before."""
        polars_dtype = self.polars_schema().get(name)
        if polars_dtype is not None:
            try:
                return DataType.from_polars(polars_dtype)
            except PlanError:
                pass
        return self.dtype(node, where)

    def expr(self, node: int, where: str) -> Expr:
        """Translate expression ``node`` at the cursor's node; a column that Polars' common
        subexpression elimination made is replaced by the expression it stands for."""
        out = translate_expr(self, node, where)
        if self.cse:
            out = replace(out, lambda e: self.cse.get(e.name) if isinstance(e, Col) else None)
        return out

    def named(self, pyexpr: Any, where: str) -> NamedExpr:
        """Translate a Polars ``PyExprIR`` (output name + expression) at the cursor's node."""
        return NamedExpr(pyexpr.output_name, self.expr(pyexpr.node, where))

    def named_at(self, node: int, pyexprs: Any, where: str) -> tuple[NamedExpr, ...]:
        """Translate ``pyexprs`` with the cursor on ``node`` (the node whose rows they read)."""
        with self.at(node):
            return tuple(self.named(e, where) for e in pyexprs)

    def plan(self, node: int | None = None) -> PlanNode:
        """Translate plan node ``node`` (default: the cursor's node) and its inputs."""
        if node is not None:
            with self.at(node):
                return self.plan()
        try:
            view = self.nt.view_current_node()
        except NotImplementedError as exc:
            # LazyFrame.map_batches: "opaque python mapfunction"; IPC scans: "ipc scan".
            if "mapfunction" in str(exc).lower():
                self.error(
                    f"MapFunction ({exc})", "Python functions over frames cannot run in shoal"
                )
            elif str(exc) in OPAQUE_SCANS:
                entry = f"plan node ({exc})"
                self.error(entry, "Polars does not show this source to engines")
                self.rewritable.add(f"{entry}: Polars does not show this source to engines")
            else:
                self.error(f"plan node ({exc})", "Polars does not show this node to engines")
            # The placeholder keeps the node's columns, so that the nodes above it find
            # them and report only their own problems.
            try:
                schema = Schema.from_polars(self.nt.get_schema())
            except Exception:  # the schema is only a courtesy here
                schema = Schema(())
            return self._skip(schema)
        name = type(view).__name__
        schema = self.schema(name)
        handler = NODES.get(name)
        if handler is None:
            reason = UNSUPPORTED_NODES.get(name, "plan node not supported by shoal")
            detail = _map_function_name(view) if name == "MapFunction" else ""
            self.error(f"{name}{detail}", reason)
            return self._skip(schema)
        return handler(self, view, schema)

    def _skip(self, schema: Schema) -> PlanNode:
        """Translate the inputs of an untranslatable node (to report their errors too)."""
        for child in self.nt.get_inputs():
            self.plan(child)
        return self.placeholder(schema)


def _map_function_name(view: Any) -> str:
    try:
        return f"({view.function[0]})"
    except Exception:  # pragma: no cover - defensive: attribute layout changed
        return ""


def check_version(nt: Any) -> None:
    """Raise :class:`shoal.UnsupportedError` unless ``nt.version()`` was tested."""
    version = tuple(nt.version())
    if version not in TESTED_VERSIONS:
        tested = ", ".join(map(str, TESTED_VERSIONS))
        raise UnsupportedError(
            f"NodeTraverser version {version} is not supported by shoal; tested: {tested}"
        )


def translate_plan(nt: Any, plan_text: Callable[[], str] | None = None) -> PlanNode:
    """Translate the plan below the NodeTraverser's cursor (its root, in a callback).

    ``plan_text`` gives Polars' ``explain()`` of the same optimised plan; it is called only
    when the plan has a nanosecond datetime or a time literal, which the NodeTraverser
    gives as a Python ``datetime``/``time`` cut to the microsecond: the plan text has the
    nanoseconds (:meth:`Translator.nanoseconds`). Without it such literals are refused
    rather than cut.

    Raises :class:`shoal.UnsupportedError` for an untested NodeTraverser version, or when
    any part of the plan cannot be translated; the message lists every such part, each
    naming the Polars node class (and expression) and the reason. When every such part is
    a scan or a ``list.eval`` that Polars does not show to engines, the error is a
    :class:`~shoal_polars.rewrite.RewriteNeeded` (the caller may rewrite the query with
    :func:`shoal_polars.rewrite.rewrite` and translate again).
    """
    return translate_roots(nt, [None], plan_text)[0]


def translate_roots(
    nt: Any, roots: list[int | None], plan_text: Callable[[], str] | None = None
) -> list[PlanNode]:
    """Translate the plans below several nodes of one NodeTraverser (None: the cursor's
    node) with one :class:`Translator`, as :func:`translate_plan` translates one: the
    queries of ``pl.collect_all``, each the input of one sink of Polars' ``SinkMultiple``.
    A ``Cache`` that several queries read (Polars' common sub-plan elimination across the
    queries) becomes one IR node object that every plan holds, so that the planner computes
    it once. Raises as :func:`translate_plan` does, naming every unsupported part of every
    plan."""
    import shoal_polars.nodes  # noqa: F401  (registers the node handlers)

    check_version(nt)
    t = Translator(nt, plan_text)
    try:
        plans = [t.plan(root) for root in roots]
    except RecursionError:
        raise UnsupportedError(
            "shoal cannot run this Polars query: its plan or an expression in it is nested "
            f"too deeply to translate (Python's recursion limit is {sys.getrecursionlimit()} "
            "frames, about half as many levels)"
        ) from None
    if t.errors:
        listing = "\n".join(f"  - {e}" for e in t.errors)
        if set(t.errors) <= t.rewritable:
            raise RewriteNeeded(
                f"Polars does not show these parts to engines (shoal recovers them from "
                f"the query):\n{listing}"
            )
        raise UnsupportedError(
            f"shoal cannot run this Polars query ({len(t.errors)} unsupported "
            f"part{'s' if len(t.errors) != 1 else ''}):\n{listing}"
        )
    return plans
