"""What a planning strategy receives: the open fragment and the planning context.

The planner (:mod:`shoal.planner.planner`) walks the IR bottom-up and hands the strategies
that live in modules of their own (hash windows, prefix carries, temporal operators) two
things: an :class:`OpenFragment`, the pipeline still growing below the node being planned,
and a :class:`PlanningContext`, the few operations of the plan being built that a strategy
may use (cut a stage, read one, gather, size a shuffle, plan a child, combine single-task
inputs). Strategies import this module, never the planner itself, so that no module of the
planner imports another's private names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from shoal.config import Config
from shoal.ir.nodes import PlanNode
from shoal.planner.physical import OutputSpec, ScanInput, Stage, StageInputSpec


@dataclass
class OpenFragment:
    """A fragment still growing: not yet cut into a stage.

    ``node`` is the fragment's root so far (its leaves are the scan or
    :class:`~shoal.ir.nodes.StageInput` nodes numbered as ``inputs``), run as ``num_tasks``
    tasks; ``est_bytes`` estimates its output for the broadcast decision.

    ``hashed`` lists column sets of ``node``'s output that its partitions are hash
    partitioned on (rows equal on every column of a set are in one partition: after a hash
    exchange on them, and through what keeps rows where they are; see :func:`carry_hashed`),
    so that an aggregation on keys that include a set completes in place, without another
    exchange. ``whole_buckets`` says why no task of the fragment may be split into subtasks
    (:mod:`shoal.runners.skew`): an operator in it needs every row of its bucket.
    """

    node: PlanNode
    num_tasks: int
    inputs: list[StageInputSpec] = field(default_factory=list)
    scan_partitions: tuple[ScanInput, ...] | None = None
    est_bytes: int = 0
    name: str = "scan"
    hashed: tuple[tuple[str, ...], ...] = ()
    whole_buckets: str = ""

    def wrap(self, node: PlanNode) -> OpenFragment:
        if self.hashed:
            self.hashed = carry_hashed(self.node, node, self.hashed)
        self.node = node
        return self


def source_column(node: PlanNode, name: str) -> str | None:
    """The input column that output column ``name`` of ``node``, a projection or an
    aggregation, passes on unchanged (``col(a)``, ``col(a) AS name``, an aggregation key
    that is a plain column), or None."""
    from shoal.ir.expr import Col
    from shoal.ir.nodes import Aggregate, Project

    if not isinstance(node, Project | Aggregate):
        return None
    named = node.exprs if isinstance(node, Project) else node.keys
    found = [e.expr for e in named if e.name == name]
    return found[0].name if len(found) == 1 and isinstance(found[0], Col) else None


def carry_hashed(
    old: PlanNode, node: PlanNode, hashed: tuple[tuple[str, ...], ...]
) -> tuple[tuple[str, ...], ...]:
    """The column sets of ``node``'s output hash partitioned as ``hashed`` is of ``old``'s
    (``node``'s child in the same partitions), or fewer: a filter, sort, slice or distinct
    keeps rows in their partition with their values; a projection or aggregation carries
    the sets whose columns it passes on unchanged (``col(a)``, or ``col(a) AS b``); a join
    whose left input is ``old`` keeps its left columns' names and, but for a full or right
    join, every left row stays where it was; an inner join whose right input is ``old`` (a
    broadcast left side) keeps every right row where it was, and carries the sets of right
    columns the output keeps under their own names, a right key that coalescing drops
    standing for the left key it equals (plain columns of one type, not floating point:
    values the join finds equal are equal). Anything else: none."""
    from shoal.ir.expr import Col
    from shoal.ir.nodes import Aggregate, Distinct, Filter, Join, Project, Slice, Sort

    if isinstance(node, Filter | Sort | Slice | Distinct):
        return hashed if node.input is old else ()
    if isinstance(node, Project | Aggregate):
        if node.input is not old:
            return ()
        named = node.exprs if isinstance(node, Project) else node.keys
        renamed: dict[str, str] = {}
        for e in named:
            if isinstance(e.expr, Col):
                renamed.setdefault(e.expr.name, e.name)
        return tuple(
            tuple(renamed[c] for c in cols) for cols in hashed if all(c in renamed for c in cols)
        )
    if isinstance(node, Join) and node.left is old and node.how not in ("full", "right"):
        return hashed
    if isinstance(node, Join) and node.right is old and node.how == "inner":
        return _carry_right(node, hashed)
    return ()


def _carry_right(node: Any, hashed: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    """:func:`carry_hashed` through inner join ``node`` from its right input."""
    from shoal.ir.expr import Col

    left_names = set(node.left.schema.names)
    renamed = {
        c: c for c in node.right.schema.names if c in node.schema.names and c not in left_names
    }
    if node.coalesce:
        for lk, rk in zip(node.left_on, node.right_on, strict=True):
            if (
                isinstance(lk, Col)
                and isinstance(rk, Col)
                and lk.dtype == rk.dtype
                and not lk.dtype.is_float
                and rk.name not in renamed
                and lk.name in node.schema.names
            ):
                renamed[rk.name] = lk.name
    return tuple(
        tuple(renamed[c] for c in cols) for cols in hashed if all(c in renamed for c in cols)
    )


class PlanningContext(Protocol):
    """The operations of the physical plan being built that a strategy may use."""

    #: The query's configuration snapshot.
    config: Config
    #: Hash-window plans by the id of their open fragment's node
    #: (:class:`shoal.planner.windows.HashWindow`), so that a following window step over
    #: the same keys joins the same evaluate stage.
    hash_windows: dict[int, Any]

    def cut(
        self,
        op: OpenFragment,
        output: OutputSpec,
        name: str | None = None,
        boundaries_from: int | None = None,
    ) -> Stage:
        """Close ``op`` into a stage whose tasks partition their output as ``output``."""
        ...

    def read(self, st: Stage, mode: str, num_tasks: int, name: str) -> OpenFragment:
        """A new fragment of ``num_tasks`` tasks reading stage ``st`` in ``mode``."""
        ...

    def gather(self, op: OpenFragment, name: str) -> OpenFragment:
        """All rows of ``op`` in one task, in partition order."""
        ...

    def shuffle_n(self, *ops: OpenFragment) -> int:
        """The number of partitions of a shuffle of ``ops``."""
        ...

    def visit(self, node: PlanNode) -> OpenFragment:
        """Plan ``node`` (a child of the node being planned)."""
        ...

    def combine_single(
        self, ops: list[OpenFragment], make: Callable[[tuple[PlanNode, ...]], PlanNode], name: str
    ) -> OpenFragment:
        """Single-partition inputs combined by one node (``make(children)``) in one task."""
        ...
