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
    """

    node: PlanNode
    num_tasks: int
    inputs: list[StageInputSpec] = field(default_factory=list)
    scan_partitions: tuple[ScanInput, ...] | None = None
    est_bytes: int = 0
    name: str = "scan"

    def wrap(self, node: PlanNode) -> OpenFragment:
        self.node = node
        return self


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
