"""Aligned joins: two Parquet sides stored in the order of the join key, joined partition
by partition without an exchange (called by :meth:`shoal.planner.planner._Builder.join`).

Data written in the order of a key (TPC-H's ``lineitem`` and ``orders`` by the order key,
an event log by its id) is cut by the scan split into partitions that each hold a range
of the key, and every Parquet row group stores the min and max of the key. When both sides
of an equi-join are such scans, the rows of the other side that can match one partition of
the kept side are in the row groups whose ``[min, max]`` overlaps that partition's range:
each task of the kept side reads those row groups of the other side beside its own
partition and joins them, with no broadcast stage and no hash exchange of either side (in
Spark's words a storage-partitioned join; here derived from the footers, not declared).

Exact for any data, sorted or not: a row of the kept side is in exactly one task, and
every row of the other side whose key equals its key (same value, so inside the range of
its partition) is in that task. A row group of the other side overlapping two ranges is
read by both tasks; its rows then meet two disjoint sets of kept rows, so no pair is
joined twice. Hence the kept side is the side whose rows the join preserves: either side
of an inner join (the larger one keeps its partitions), the left side of a left, semi or
anti join, the right side of a right join. Null keys never match (a join with
``nulls_equal`` is not aligned): a kept row with a null key stays in its task (a left or
anti join keeps it there), and the other side's row groups holding only nulls are read by
no task.

Taken only when it pays, judged from the footers alone: the other side's row groups read
by all tasks together at most :data:`ALIGNED_OVERLAP` times those it reads once (unsorted
keys overlap every range and would make it a broadcast), by two tasks or more and at most
:data:`ALIGNED_SHARE` of them by one, and only where both keys are
plain columns of a signed integer or date type (:func:`shoal.planner.ranges.key_ranges`)
traced unchanged to a Parquet scan, the other side is that scan with row-local filters,
projections and joins with scans read whole (what :meth:`_Builder._inline_build`
computes inside a task) or broadcasts (which the kept side's tasks then read), each task
reads at most ``target_partition_bytes`` of the other side, and the ``aligned_joins``
setting is on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from shoal.ir.expr import Col
from shoal.ir.nodes import (
    Aggregate,
    Filter,
    Join,
    ParquetSource,
    PlanNode,
    Project,
    Scan,
    StageInput,
    transform,
)
from shoal.planner.context import OpenFragment, source_column
from shoal.planner.physical import ScanInput, ScanPartition, ScanSet, scans_of
from shoal.planner.ranges import aligned_partitions, disjoint_columns, key_ranges

#: The other side's row groups may be read by the kept side's tasks at most this many
#: times their own bytes in all (row groups on the boundary of two ranges are read twice).
ALIGNED_OVERLAP = 1.5
#: And no task may read more than this share of them (the tasks share the work).
ALIGNED_SHARE = 0.75
#: A kept side cut finer gets this many times the partitions its share of the other side
#: needs at ``target_partition_bytes`` each (the row groups on range boundaries are read
#: twice).
ALIGNED_RESPLIT_MARGIN = 1.25

#: ``resplit(scan, n)``: the scan cut into about ``n`` partitions.
Resplit = Callable[[Scan, int], tuple[ScanInput, ...]]


def task_scans(op: OpenFragment, scans: list[Scan]) -> list[dict[int, tuple[Any, bool]]] | None:
    """For each task of ``op`` (whose fragment reads ``scans``, :func:`scans_of` order):
    its partition of each scan by the scan node's id, and whether that partition is one
    of several (True) or the whole scan (False). None when ``op``'s partitions do not
    say it plainly (a fragment with several scans but no :class:`ScanSet`)."""
    if op.scan_partitions is None:
        return [{} for _ in range(op.num_tasks)] if not scans else None
    out: list[dict[int, tuple[Any, bool]]] = []
    for entry in op.scan_partitions:
        if isinstance(entry, ScanSet):
            if len(entry.parts) != len(scans):
                return None
            out.append(
                {
                    id(s): (p, not entry.is_whole(i))
                    for i, (s, p) in enumerate(zip(scans, entry.parts, strict=True))
                }
            )
        elif len(scans) == 1:
            out.append({id(scans[0]): (entry, True)})
        else:
            return None
    return out


def origin(node: PlanNode, column: str) -> tuple[Scan, str] | None:
    """The scan and scan column whose values column ``column`` of ``node``'s output holds
    unchanged (or a subset of them): through filters, projections that pass or rename a
    column, aggregations grouping by it, and the side of a join that gives the column
    (left columns keep their names; a right column its own name or, on a clash, the name
    with the join's suffix; not through a right or full join, whose key columns mix the
    sides). None otherwise."""
    while True:
        if isinstance(node, Scan):
            return (node, column) if column in node.schema.names else None
        if isinstance(node, Filter):
            node = node.input
        elif isinstance(node, Project | Aggregate):
            src = source_column(node, column)
            if src is None:
                return None
            node, column = node.input, src
        elif isinstance(node, Join):
            j = node
            if j.how in ("right", "full"):
                return None
            if column in j.left.schema.names:
                node = j.left
            elif j.how in ("semi", "anti"):
                return None
            elif column in j.right.schema.names:
                node = j.right
            elif column.endswith(j.suffix) and column[: -len(j.suffix)] in j.right.schema.names:
                node, column = j.right, column[: -len(j.suffix)]
            else:
                return None
        else:
            return None


def _shift_inputs(node: PlanNode, by: int) -> PlanNode:
    """``node`` with the index of every :class:`StageInput` leaf raised by ``by`` (its
    inputs follow another fragment's ``by`` inputs); scans stay the same objects."""
    if not by:
        return node
    return transform(
        node, lambda n: replace(n, index=n.index + by) if isinstance(n, StageInput) else None
    )


def _exact_per_range(node: PlanNode, scan: Scan, column: str, by_key: bool) -> bool:
    """Whether ``node``, computed from the rows of ``scan`` whose ``column`` (of
    ``node``'s output) holds any value of a key range, and the rest of ``node`` read whole,
    gives exactly the output rows of ``node`` over all of ``scan`` whose ``column`` is in
    that range. True through row-local filters and projections, the side of a join that
    holds ``scan`` (where the join keeps that side's rows: inner, left, semi, anti, cross
    from the left; inner, right, cross from the right), and, with ``by_key``, an
    aggregation grouping by ``column`` (a group's rows all have its key, so all of them
    are in the range's row groups)."""
    while node is not scan:
        if isinstance(node, Filter):
            if not node.predicate.is_row_local():
                return False
            node = node.input
        elif isinstance(node, Project | Aggregate):
            if isinstance(node, Aggregate) and not by_key:
                return False
            if isinstance(node, Project) and not all(e.expr.is_row_local() for e in node.exprs):
                return False
            src = source_column(node, column)
            if src is None:
                return False
            node, column = node.input, src
        elif isinstance(node, Join):
            j = node
            got = origin(j, column)
            if got is None or got[0] is not scan:
                return False
            if any(n is scan for n in j.left.walk()):
                if j.how not in ("inner", "left", "semi", "anti", "cross"):
                    return False
                node = j.left
                if column not in j.left.schema.names:
                    return False
            else:
                if j.how not in ("inner", "right", "cross"):
                    return False
                node = j.right
                if column not in j.right.schema.names:
                    column = column[: -len(j.suffix)]
        else:
            return False
    return True


def aligned_join(
    node: Join,
    left: OpenFragment,
    right: OpenFragment,
    target_bytes: int,
    resplit: Resplit | None = None,
) -> OpenFragment | None:
    """``node`` planned as an aligned join of ``left`` and ``right`` (see the module
    docstring): the kept side's fragment, now joining the other side computed in each of
    its tasks from the row groups that can match; or None when the join is not aligned.
    ``target_bytes`` (the ``target_partition_bytes`` setting) bounds what one task reads
    of the other side (footer estimates): where the kept side has too few partitions for
    that (a small preserved side against a large other side), ``resplit(scan, n)`` cuts
    its scan into ``n`` partitions, when its fragment allows it (:func:`_resplittable`)."""
    if node.nulls_equal or node.maintain_order != "none" or not node.left_on:
        return None
    if node.how == "inner":
        # The side of more partitions keeps them (the larger on a tie).
        sides = [(left, right, True), (right, left, False)]
        sides.sort(key=lambda s: (-s[0].num_tasks, -s[0].est_bytes))
    elif node.how in ("left", "semi", "anti"):
        sides = [(left, right, True)]
    elif node.how == "right":
        sides = [(right, left, False)]
    else:
        return None
    for kept, other, kept_left in sides:
        got = _align(node, kept, other, kept_left, target_bytes, resplit)
        if got is not None:
            return got
    return None


def _resplittable(
    kept: OpenFragment,
    scan: Scan,
    column: str,
    own: list[dict[int, tuple[Any, bool]]],
    scans: list[Scan],
) -> bool:
    """Whether ``kept`` may run as any number of tasks over partitions of ``scan``: it
    reads only broadcasts besides, its other scans whole, and computes each partition's
    rows from that partition alone (no aggregation, whose in-place completion relied on
    the old partitions' key ranges)."""
    return (
        all(spec.mode == "all" for spec in kept.inputs)
        and not any(own[0][id(s)][1] for s in scans if s is not scan)
        and _exact_per_range(kept.node, scan, column, by_key=False)
    )


def _align(
    node: Join,
    kept: OpenFragment,
    other: OpenFragment,
    kept_left: bool,
    target_bytes: int,
    resplit: Resplit | None,
) -> OpenFragment | None:
    if kept.num_tasks < 2 or other.scan_partitions is None:
        return None
    if any(spec.mode != "all" for spec in other.inputs):
        return None  # the other side may read broadcasts (whole in every task), no more
    if not all(
        isinstance(n, Scan | Filter | Project | Join | StageInput | Aggregate)
        for n in other.node.walk()
    ):
        return None
    kept_scans, other_scans = scans_of(kept.node), scans_of(other.node)
    # A scan node on both sides (a sub-plan Polars shares) is read once per task: only
    # where the task already reads of it what this join would give it (checked below).
    shared = {id(s) for s in kept_scans} & {id(s) for s in other_scans}
    own = task_scans(kept, kept_scans)
    theirs = task_scans(other, other_scans)
    if own is None or not theirs:
        return None
    kept_keys = node.left_on if kept_left else node.right_on
    other_keys = node.right_on if kept_left else node.left_on
    for kk, ok in zip(kept_keys, other_keys, strict=True):
        tasks = own
        if not isinstance(kk, Col) or not isinstance(ok, Col):
            continue
        k_origin = origin(kept.node, kk.name)
        o_origin = origin(other.node, ok.name)
        if k_origin is None or o_origin is None:
            continue
        kscan, kcol = k_origin
        oscan, ocol = o_origin
        if not isinstance(oscan.source, ParquetSource) or not _exact_per_range(
            other.node, oscan, ok.name, by_key=True
        ):
            continue
        mine = [t.get(id(kscan)) for t in tasks]
        if not all(m is not None and m[1] and isinstance(m[0], ScanPartition) for m in mine):
            continue
        # The other side's other scans must be read whole by its tasks (inline builds).
        if any(theirs[0][id(s)][1] for s in other_scans if s is not oscan):
            continue
        if any(id(s) != id(oscan) and tasks[0][id(s)][1] for s in other_scans if id(s) in shared):
            continue  # a whole scan of the other side that the kept side reads in part
        ranges = key_ranges(kscan, [m[0] for m in mine if m is not None], kcol)
        if ranges is None:
            continue
        cut = aligned_partitions(oscan, ocol, ranges)
        if cut is None:
            continue
        parts, read, total = cut
        if id(oscan) in shared and id(kscan) == id(oscan):
            continue
        resplit_parts = None
        if (
            max(read) > target_bytes
            and resplit is not None
            and _resplittable(kept, kscan, kk.name, tasks, kept_scans)
        ):
            # The kept side is cut finer, so that each task reads a partition's worth of
            # the other side.
            n = math.ceil(ALIGNED_RESPLIT_MARGIN * total / max(1, target_bytes))
            finer = resplit(kscan, n) if n > len(tasks) else ()
            if len(finer) > len(tasks) and all(isinstance(p, ScanPartition) for p in finer):
                finer_parts = [p for p in finer if isinstance(p, ScanPartition)]
                ranges = key_ranges(kscan, finer_parts, kcol)
                cut = aligned_partitions(oscan, ocol, ranges) if ranges is not None else None
                if cut is None:
                    continue
                parts, read, total = cut
                whole = {id(s): tasks[0][id(s)] for s in kept_scans if s is not kscan}
                tasks = [{**whole, id(kscan): (p, True)} for p in finer_parts]
                resplit_parts = tuple(finer_parts)
        if id(oscan) in shared and any(
            t.get(id(oscan)) != (p, True) for t, p in zip(tasks, parts, strict=True)
        ):
            continue  # the kept side reads another part of the same scan
        if (
            sum(read) > ALIGNED_OVERLAP * max(total, 1)
            or max(read) > target_bytes
            # Spread over the tasks: not all of it in one (a broadcast to one task).
            or sum(1 for r in read if r) < 2
            or max(read) > ALIGNED_SHARE * total
        ):
            continue
        theirs_node = _shift_inputs(other.node, len(kept.inputs))
        joined = replace(
            node,
            left=kept.node if kept_left else theirs_node,
            right=theirs_node if kept_left else kept.node,
        )
        entries = []
        order = scans_of(joined)
        for t, task in enumerate(tasks):
            by_scan = {**task, id(oscan): (parts[t], True)}
            for s in other_scans:
                if s is not oscan:
                    by_scan[id(s)] = theirs[0][id(s)]
            entries.append(
                ScanSet(
                    tuple(by_scan[id(s)][0] for s in order),
                    tuple(by_scan[id(s)][1] for s in order),
                )
            )
        hashed = kept.hashed
        if resplit_parts is not None:
            kept.num_tasks = len(resplit_parts)
            # Partitioned anew: only what the new partitions' footers say holds.
            disjoint = disjoint_columns(kscan, resplit_parts, [kcol])
            hashed = kept.hashed = ((kk.name,),) if disjoint else ()
        kept.inputs.extend(other.inputs)
        kept.scan_partitions = tuple(entries)
        kept.est_bytes += other.est_bytes
        kept.name = f"{kept.name}+aligned-join"
        kept.wrap(joined)
        if node.how == "inner" and (kk.name,) in hashed:
            # Both keys hold the same values: partitioned on one, on the other too. (A
            # right key column keeps its name unless a left column has it.)
            lk, rk = (kk, ok) if kept_left else (ok, kk)
            names = [lk.name]
            if rk.name not in node.left.schema.names:
                names.append(rk.name)
            extra = [(c,) for c in names if c in node.schema.names]
            kept.hashed = tuple(dict.fromkeys([*kept.hashed, *extra]))
        return kept
    return None
