"""An inner join of an aggregation with a small side on group keys: the aggregation's
input is first reduced to the rows whose keys the small side has.

``Aggregate(X, by G) ⋈ S on K`` with ``K ⊆ G`` keeps exactly the groups whose ``K`` values
occur in ``S``. Every row of a group has the group's ``K`` values, so a group is either
wholly in ``X ⋉ S`` (the semi join of the aggregation's input with ``S`` on ``K``) or not
at all, and a group that is there has all its rows: ``Aggregate(X ⋉ S, by G) ⋈ S`` gives
the same rows. The small side is broadcast once and read twice, by the semi join inside the
input's tasks and by the join itself; the aggregation hashes, shuffles and merges only the
groups the join keeps (TPC-H Q20: lineitem's sums per part and supplier, of which the
parts named "forest%" keep about one in fifty; Polars computes them all).

Taken only where the rule is exact without more thought: plain column keys on both sides
(projections that only select or rename columns between the join and the aggregation are
seen through), each key of the aggregation's side a group key computed as a plain column
of its input, of a type whose join equality is its grouping equality (integers, decimals,
strings, booleans, temporal types: not floats, whose NaN and -0.0 grouping and joining
need not treat alike, nor nested types), an aggregation that no other part of the plan
shares, and an unordered inner join. Null keys follow the join's
``nulls_equal`` in both joins, so a null-keyed group is kept exactly when the join keeps
it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from shoal.ir.expr import Col, Expr
from shoal.ir.nodes import Aggregate, Join, PlanNode, Project
from shoal.ir.types import DataType


def aggregate_side(
    node: Join,
) -> list[tuple[bool, tuple[Project, ...], Aggregate, tuple[Col, ...]]]:
    """The sides of ``node`` that are an aggregation the join may reduce (module
    docstring), seen through projections that only select and rename columns:
    ``(is_left, projections, aggregation, input_keys)`` for each, the projections from
    the join down, where ``input_keys[i]`` is the input column that join key ``i`` of that
    side groups by."""
    if node.how != "inner" or node.maintain_order != "none" or not node.left_on:
        return []
    out = []
    for is_left, side, on, other_on in (
        (True, node.left, node.left_on, node.right_on),
        (False, node.right, node.right_on, node.left_on),
    ):
        if not all(isinstance(e, Col) for e in (*on, *other_on)):
            continue
        names = [e.name for e in on if isinstance(e, Col)]
        projections: list[Project] = []
        while isinstance(side, Project) and all(isinstance(e.expr, Col) for e in side.exprs):
            sources = {e.name: e.expr for e in side.exprs if isinstance(e.expr, Col)}
            names = [sources[n].name for n in names if n in sources]
            projections.append(side)
            side = side.input
        if not isinstance(side, Aggregate) or len(names) != len(on):
            continue
        keys = input_keys(side, names, [e.dtype for e in on if isinstance(e, Col)])
        if keys is not None:
            out.append((is_left, tuple(projections), side, keys))
    return out


def input_keys(
    agg: Aggregate, names: Sequence[str], dtypes: Sequence[DataType]
) -> tuple[Col, ...] | None:
    """For each join key (``names[i]`` of ``agg``'s output, of type ``dtypes[i]``), the
    input column of the group key of that name; None when some key is no plain group key
    column of a type whose join equality is its grouping equality."""
    by_name = {k.name: k.expr for k in agg.keys}
    found = []
    for name, dtype in zip(names, dtypes, strict=True):
        src = by_name.get(name)
        if not isinstance(src, Col) or src.dtype != dtype or not _plain_key_type(dtype):
            return None
        found.append(src)
    return tuple(found)


def reduced_input(
    rows: PlanNode,
    keys: tuple[Col, ...],
    small: PlanNode,
    small_on: Sequence[Expr],
    nulls_equal: bool,
) -> Join:
    """The semi join of ``rows`` (the aggregation's input, as planned) with ``small`` (the
    small side) on ``keys`` against ``small_on``, under the join's null rule: the rows of
    the groups the join keeps."""
    return Join(
        rows, small, keys, tuple(small_on), "semi", "_right", nulls_equal, False, rows.schema
    )


def _plain_key_type(dtype: DataType) -> bool:
    """Integers, decimals, strings, booleans, dates and times: types whose equality in a
    join is the equality that groups them (no NaN, no -0.0, nothing nested)."""
    t = dtype.arrow
    return (
        dtype.is_integer
        or dtype.is_decimal
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_string_view(t)
        or pa.types.is_boolean(t)
        or pa.types.is_temporal(t)
    )
