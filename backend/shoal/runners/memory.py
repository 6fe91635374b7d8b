"""The bytes a query holds: a ledger of task outputs produced and not yet released.

Every output table of a finished task (one per output partition: a hash or range bucket,
or the task's single output) is a *piece*, keyed by (stage id, partition, output index).
A piece is held from the moment its task finishes until its last reader has finished:
the dispatch loop knows each piece's size from the task's stats
(:attr:`~shoal.execution.kernel.TaskStats.output_bytes`) and how many tasks read it from
the plan (:func:`readers`). The result stage's pieces have one reader: the caller, who
releases each as the result is handed over.

The loop uses :attr:`ByteLedger.held` for backpressure (see
:mod:`shoal.runners.dispatch`); :attr:`ByteLedger.peak` is reported with the query
(``shoal.runners.session.last_query().memory``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from shoal.planner.physical import PhysicalPlan

#: A piece: (stage id, partition, output index).
PieceKey = tuple[int, int, int]


def readers(plan: PhysicalPlan, stage_id: int) -> int:
    """Tasks that read each output piece of stage ``stage_id``, before any task is split.

    Per consumer input reading the stage: ``"pointwise"``, ``"bucket"`` and ``"concat"``
    give each piece one reader; ``"all"`` gives every task of the consumer. The root stage's
    pieces have one reader more: the result handed to the caller.
    """
    n = 0
    for c in plan.stages:
        for spec in c.inputs:
            if stage_id in spec.stages:
                n += c.num_tasks if spec.mode == "all" else 1
    if stage_id in plan.result_stages:
        n += 1
    return n


@dataclass
class _Piece:
    nbytes: int = 0
    readers: int = 0


@dataclass
class ByteLedger:
    """Bytes of pieces held by one query.

    ``limit`` is the backpressure threshold in bytes (None: no limit). ``held`` is the sum of
    held pieces' bytes now, ``peak`` its highest value so far.
    """

    limit: int | None = None
    held: int = 0
    peak: int = 0
    _pieces: dict[PieceKey, _Piece] = field(default_factory=dict)

    @property
    def over(self) -> bool:
        """Whether the held bytes are at or above the limit."""
        return self.limit is not None and self.held >= self.limit

    def produced(self, key: PieceKey, nbytes: int, readers: int) -> None:
        """A task produced ``nbytes`` bytes of piece ``key`` (a split partition's subtasks
        add to the same piece), to be read by ``readers`` tasks (counted at the first add)."""
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._pieces[key] = _Piece(readers=readers)
        piece.nbytes += nbytes
        self.held += nbytes
        self.peak = max(self.peak, self.held)

    def add_readers(self, key: PieceKey, n: int) -> None:
        """``n`` more tasks will read piece ``key`` (its reader was split into subtasks)."""
        piece = self._pieces.get(key)
        if piece is not None:
            piece.readers += n

    def holds(self, key: PieceKey) -> bool:
        """Whether piece ``key`` was produced and is not released yet."""
        return key in self._pieces

    def drop_readers(self, key: PieceKey, n: int) -> bool:
        """``n`` tasks fewer will read piece ``key`` (its reader runs fewer tasks than
        planned); True when that released it (no reader is left)."""
        piece = self._pieces.get(key)
        if piece is None:
            return False
        piece.readers -= n
        if piece.readers > 0:
            return False
        del self._pieces[key]
        self.held -= piece.nbytes
        return True

    def nbytes(self, key: PieceKey) -> int:
        """Bytes of piece ``key`` (0 when unknown or released)."""
        piece = self._pieces.get(key)
        return piece.nbytes if piece is not None else 0

    def read(self, key: PieceKey) -> bool:
        """One reader of ``key`` finished; True when that released the piece."""
        piece = self._pieces.get(key)
        if piece is None:
            return False
        piece.readers -= 1
        if piece.readers > 0:
            return False
        del self._pieces[key]
        self.held -= piece.nbytes
        return True


@dataclass
class MemoryReport:
    """What a query's memory controls did.

    ``max_bytes_held``: the backpressure limit in bytes (None: none); ``peak_bytes_held``:
    the most bytes of task outputs held at once; ``held_back``: times the loop stopped
    taking a stage's tasks into a dispatch batch because the held bytes (with the expected
    outputs of the tasks in flight) were over the limit; ``forced``: tasks dispatched over
    the limit because nothing else could make progress; ``splits``: (stage id, partition)
    -> subtasks, for each task split because its input exceeded ``max_task_input_bytes``;
    ``not_split``: (stage id, partition, reason) for each oversized task that could not be
    split exactly.
    """

    max_bytes_held: int | None
    peak_bytes_held: int
    held_back: int = 0
    forced: int = 0
    splits: dict[tuple[int, int], int] = field(default_factory=dict)
    not_split: list[tuple[int, int, str]] = field(default_factory=list)


def default_max_bytes_held(runner: str, store: int | None = None) -> int:
    """The backpressure limit when ``Config.max_bytes_held`` is unset, in bytes: half the
    Ray cluster's object store memory (Ray runner; ``store`` when given, as the runner last
    read it, else asked of Ray now), else a quarter of this machine's physical memory
    (local runner, whose outputs live in the driver's heap)."""
    if runner == "ray":
        if store is None:
            import ray

            store = ray.cluster_resources().get("object_store_memory")
        if store:
            return int(store) // 2
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        total = 8 * 1024**3
    return int(total) // 4
