"""Plan nodes of the shoal IR: immutable, schema-carrying trees.

Each node is a frozen dataclass whose ``schema`` is the schema of the rows it produces.
Nodes compare and hash by value (an in-memory source by identity of its table), pickle
for ``ray.put``, and print with :func:`shoal.ir.explain.explain`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Literal

import pyarrow as pa

from shoal.ir.expr import Expr, NamedExpr, child_fields
from shoal.ir.types import INT64, STRING, Schema

JoinHow = Literal["inner", "left", "right", "full", "semi", "anti", "cross"]
JoinOrder = Literal["none", "left", "right", "left_right", "right_left"]
AsofStrategy = Literal["backward", "forward", "nearest"]
ClosedWindow = Literal["left", "right", "both", "none"]
WindowLabel = Literal["left", "right", "datapoint"]
WindowStart = Literal[
    "window", "datapoint", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday",
    "sunday",
]  # fmt: skip


class PlanNode:
    """Base class of plan nodes. ``schema`` is the output schema."""

    schema: Schema

    def children(self) -> tuple[PlanNode, ...]:
        out: list[PlanNode] = []
        for name in child_fields(type(self), "PlanNode"):
            v = getattr(self, name)
            if isinstance(v, PlanNode):
                out.append(v)
            elif isinstance(v, tuple) and v and all(isinstance(x, PlanNode) for x in v):
                out.extend(v)
        return tuple(out)

    def with_children(self, children: tuple[PlanNode, ...]) -> PlanNode:
        """A copy whose child nodes (in :meth:`children` order) are ``children``."""
        it = iter(children)
        kwargs: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, PlanNode):
                kwargs[f.name] = next(it)
            elif isinstance(v, tuple) and v and all(isinstance(x, PlanNode) for x in v):
                kwargs[f.name] = tuple(next(it) for _ in v)
            else:
                kwargs[f.name] = v
        return type(self)(**kwargs)

    def walk(self) -> Iterator[PlanNode]:
        yield self
        for c in self.children():
            yield from c.walk()

    @property
    def label(self) -> str:
        return type(self).__name__


# ---------------------------------------------------------------- sources

#: Substrings of option names whose values are credentials: never shown, never written.
_SECRET_WORDS = ("secret", "token", "password", "key", "sas", "credential", "signature")
#: Option names that contain a secret word but are not secrets.
_NOT_SECRET = frozenset({"aws_access_key_id", "access_key_id", "azure_storage_account_key_id"})
#: What a secret value is shown and written as.
REDACTED = "***"


def is_secret_option(name: str) -> bool:
    """Whether the storage option ``name`` holds a credential (its value is never shown)."""
    low = name.lower()
    return low not in _NOT_SECRET and any(w in low for w in _SECRET_WORDS)


class StorageOptions:
    """The object-storage options of a file scan (Polars' ``storage_options``, in
    object_store's key names: ``aws_endpoint_url``, ``aws_secret_access_key``, ...).

    They travel with the plan to the tasks, which read with them; they never show:
    ``repr``/``str`` and the IR's JSON form write every credential (see
    :func:`is_secret_option`) as ``***``. Immutable; compares and hashes by value.
    """

    __slots__ = ("_items",)
    _items: tuple[tuple[str, str], ...]

    def __init__(self, items: Any = ()) -> None:
        pairs = items.items() if isinstance(items, dict) else items
        object.__setattr__(self, "_items", tuple(sorted((str(k), str(v)) for k, v in pairs)))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("StorageOptions is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (StorageOptions, (self._items,))

    @property
    def items(self) -> tuple[tuple[str, str], ...]:
        """The (name, value) pairs, sorted, values in the clear (for readers only)."""
        return self._items

    def to_dict(self) -> dict[str, str]:
        """The options as Polars' ``storage_options`` (values in the clear)."""
        return dict(self._items)

    def redacted(self) -> dict[str, str]:
        """The options with every credential replaced by ``***``."""
        return {k: REDACTED if is_secret_option(k) else v for k, v in self._items}

    def __bool__(self) -> bool:
        return bool(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorageOptions) and other._items == self._items

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"StorageOptions({self.redacted()!r})"

    __str__ = __repr__


@dataclass(frozen=True)
class ParquetSource:
    """Parquet files read in order, as one table. ``paths`` are absolute file paths or
    object-storage URLs (``s3://bucket/key``), read with ``storage_options``."""

    paths: tuple[str, ...]
    storage_options: StorageOptions | None = None

    def describe(self) -> str:
        if len(self.paths) <= 2:
            return f"parquet {list(self.paths)}"
        return f"parquet [{self.paths[0]!r}, ... {len(self.paths)} files]"


@dataclass(frozen=True, eq=False)
class InMemorySource:
    """An in-memory Arrow table (from a Polars DataFrame or an Arrow table).

    Compares by identity of the table. ``table`` keeps every column of the original frame;
    the :class:`Scan` schema says which are read. ``origin``, when not empty, says what the
    frontend read on the driver to make the table (a scan the frontend does not show to
    engines, such as Polars' scan of an in-memory buffer); ``explain`` shows it.
    """

    table: pa.Table
    origin: str = ""

    def describe(self) -> str:
        read = f", read on the driver: {self.origin}" if self.origin else ""
        return f"in-memory table ({self.table.num_rows} rows{read})"

    def __hash__(self) -> int:
        return id(self.table)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InMemorySource) and other.table is self.table


@dataclass(frozen=True)
class FileSource:
    """Files of another format, read whole (one partition per file), in order.

    ``format`` is ``"csv"``, ``"ndjson"`` or ``"ipc"``; ``options`` are keyword arguments
    of the matching Polars reader (``polars.scan_csv`` etc.), as (name, value) pairs;
    ``storage_options`` are those of object-storage URLs (see :class:`StorageOptions`).
    """

    format: str
    paths: tuple[str, ...]
    options: tuple[tuple[str, Any], ...] = ()
    storage_options: StorageOptions | None = None

    def describe(self) -> str:
        first = self.paths[0] if self.paths else ""
        more = f", ... {len(self.paths)} files" if len(self.paths) > 1 else ""
        return f"{self.format} [{first!r}{more}]"


Source = ParquetSource | InMemorySource | FileSource


# ---------------------------------------------------------------- nodes


@dataclass(frozen=True)
class Scan(PlanNode):
    """Read ``source``: the columns of ``schema`` (projection pushdown), keeping the rows
    where ``predicate`` is true (predicate pushdown; null counts as false)."""

    source: Source
    schema: Schema
    predicate: Expr | None = None


@dataclass(frozen=True)
class Project(PlanNode):
    """Evaluate ``exprs`` row by row; the output has exactly these columns, in order.
    A literal or a scalar aggregate broadcasts to the height of the other columns.

    ``keep_height`` says how many rows the output has when no expression gives a column of
    its own height (every one is a literal or a scalar aggregate, or there is none):

    * False (Polars' ``select``): one row, the scalars' values (no row at all when there
      is no expression); ``select(pl.lit(1))`` is one row whatever the input's height.
    * True (Polars' ``with_columns`` and its column pruning, a SQL projection, a Substrait
      ``ProjectRel``): the input's height, every scalar broadcast to it, also when the
      input has no columns (a frame of ``n`` rows and no columns stays ``n`` rows).

    Otherwise both read the same: the height of the expressions that have one, and
    ``keep_height`` is stored False (one plan, one form: equal plans compare equal).
    """

    input: PlanNode
    exprs: tuple[NamedExpr, ...]
    schema: Schema
    keep_height: bool = False

    def __post_init__(self) -> None:
        if self.keep_height and any(
            ne.expr.columns() and ne.expr.is_row_local() for ne in self.exprs
        ):
            object.__setattr__(self, "keep_height", False)


@dataclass(frozen=True)
class Filter(PlanNode):
    """Keep the rows where ``predicate`` is true (null counts as false)."""

    input: PlanNode
    predicate: Expr
    schema: Schema


@dataclass(frozen=True)
class Aggregate(PlanNode):
    """Group by ``keys`` and compute ``aggs`` per group (Polars ``group_by().agg()``).

    With no keys the output is one row. ``aggs`` may combine aggregates
    (``sum(a) / count(b)``). Output columns: keys then aggs. Without ``maintain_order``
    the order of groups is unspecified.
    """

    input: PlanNode
    keys: tuple[NamedExpr, ...]
    aggs: tuple[NamedExpr, ...]
    maintain_order: bool
    schema: Schema


@dataclass(frozen=True)
class Join(PlanNode):
    """Equi-join on ``left_on[i] == right_on[i]`` with Polars' join semantics.

    ``how`` is any of :data:`JoinHow` (a cross join has no keys); null keys match only when
    ``nulls_equal``. With ``coalesce`` the right key columns are dropped; other right
    columns whose names clash get ``suffix``. ``maintain_order`` is Polars' option of that
    name: ``"none"`` (output order unspecified), ``"left"``, ``"right"``, ``"left_right"`` or
    ``"right_left"`` (rows in the order of that side, ties in the order of the other).
    """

    left: PlanNode
    right: PlanNode
    left_on: tuple[Expr, ...]
    right_on: tuple[Expr, ...]
    how: JoinHow
    suffix: str
    nulls_equal: bool
    coalesce: bool
    schema: Schema
    maintain_order: JoinOrder = "none"


@dataclass(frozen=True)
class Sort(PlanNode):
    """Sort by ``by`` (one flag per key in ``descending`` and ``nulls_last``). ``stable``
    keeps the input order of ties."""

    input: PlanNode
    by: tuple[Expr, ...]
    descending: tuple[bool, ...]
    nulls_last: tuple[bool, ...]
    stable: bool
    schema: Schema


@dataclass(frozen=True)
class Slice(PlanNode):
    """Rows ``offset`` to ``offset + length`` (``length`` None: to the end); a negative
    ``offset`` counts from the end, as in Polars (``tail(n)`` is offset ``-n``)."""

    input: PlanNode
    offset: int
    length: int | None
    schema: Schema


@dataclass(frozen=True)
class Distinct(PlanNode):
    """Drop duplicate rows (Polars ``unique``): rows equal on ``subset`` (all columns when
    None); ``keep`` is ``"first"``, ``"last"``, ``"any"`` or ``"none"`` (drop every row that
    has a duplicate). ``maintain_order`` keeps the input order of the kept rows."""

    input: PlanNode
    subset: tuple[str, ...] | None
    keep: Literal["first", "last", "any", "none"]
    maintain_order: bool
    schema: Schema


@dataclass(frozen=True)
class Union(PlanNode):
    """Rows of every input, in order (Polars ``concat(how="vertical")``). Inputs have the
    schema of the node; frontends insert projections for diagonal or relaxed unions."""

    inputs: tuple[PlanNode, ...]
    schema: Schema


@dataclass(frozen=True)
class HConcat(PlanNode):
    """Columns of every input side by side (Polars ``concat(how="horizontal")``); with
    ``strict`` the inputs must have the same number of rows (Polars raises ``ShapeError``
    otherwise), without it shorter inputs are padded with nulls. With ``broadcast`` (what
    Polars' SQL makes of a scalar subquery) the output has the largest height of an input
    whose height is not 1 (1 if none), and each input of one row is repeated to it (to no
    row for a height of 0) before padding."""

    inputs: tuple[PlanNode, ...]
    schema: Schema
    strict: bool = True
    broadcast: bool = False


@dataclass(frozen=True)
class Explode(PlanNode):
    """One row per element of the list columns ``columns`` (Polars ``explode``): an empty
    list gives a null row when ``empty_as_null`` (else no row), a null list gives a null row
    when ``keep_nulls`` (else no row)."""

    input: PlanNode
    columns: tuple[str, ...]
    schema: Schema
    empty_as_null: bool = False
    keep_nulls: bool = True


@dataclass(frozen=True)
class Unnest(PlanNode):
    """Struct columns ``columns`` replaced by their fields (Polars ``unnest``), each named
    ``<column><separator><field>`` when ``separator`` is set, else by the field name."""

    input: PlanNode
    columns: tuple[str, ...]
    schema: Schema
    separator: str | None = None


@dataclass(frozen=True)
class Unpivot(PlanNode):
    """Wide to long (Polars ``unpivot``): ``index`` columns kept, one row per (row, column
    of ``on``) with the column name in ``variable_name`` and its value in ``value_name``;
    the rows for the first column of ``on`` come first (in input order), then the second's.
    """

    input: PlanNode
    index: tuple[str, ...]
    on: tuple[str, ...]
    variable_name: str
    value_name: str
    schema: Schema


@dataclass(frozen=True)
class RowIndex(PlanNode):
    """Prepend a column ``name`` numbering the rows in order from ``offset``
    (Polars ``with_row_index``)."""

    input: PlanNode
    name: str
    offset: int
    schema: Schema


@dataclass(frozen=True)
class StageInput(PlanNode):
    """Physical plans only: the leaf of a fragment that reads the output of another stage
    (through an exchange). ``index`` is the position in the stage's input list.

    ``source_column``, when set, names the last column of ``schema`` (``UInt32``), which
    the upstream tables do not have: the kernel fills it with the index of the upstream
    task (partition) each row comes from. A ``"bucket"`` or ``"all"`` input receives one
    table per upstream task, in partition order, so the index is known exactly (the
    distributed window plan tags rows with it to put them back in input order)."""

    index: int
    schema: Schema
    source_column: str | None = None


@dataclass(frozen=True)
class UdfProject(PlanNode):
    """Every column of ``input`` plus ``output``: the user function ``udf`` applied to the
    columns ``inputs``, batch by batch, row-wise (one output row per input row, in order).

    As Polars' ``with_columns``: ``output`` replaces an input column of that name in place,
    else it is appended. ``udf_name`` is the name the UDF is registered under
    (:func:`shoal.udf.lookup`); ``udf`` is the :class:`shoal.udf.UDF` object itself, which
    the JSON form cannot carry (writing a plan with a UDF raises ``PlanError``). The planner
    runs a stateful or GPU UDF on an actor pool stage of its own, any other UDF in place.
    """

    input: PlanNode
    udf_name: str
    udf: Any
    inputs: tuple[str, ...]
    output: str
    schema: Schema


#: The name under which a :class:`SqlMap`'s SQL reads its input's columns.
SQL_MAP_RELATION = "shoal_input"

#: The SQL engines a :class:`SqlMap` can name (``dialect``).
SqlDialect = Literal["duckdb"]


@dataclass(frozen=True)
class SqlMap(PlanNode):
    """Every column of ``input`` plus the result columns of ``sql``, a row-wise SELECT that
    the SQL engine ``dialect`` evaluates on each partition (a foreign kernel for per-row
    work: the DuckDB frontend's expressions that the IR cannot say exactly run on DuckDB).

    ``sql`` reads the relation :data:`SQL_MAP_RELATION`, whose columns are the ``inputs``
    columns of ``input`` (by name, with their IR types as Arrow types), and must be
    row-wise: one output row per input row, in order (a projection: no ``WHERE``, no
    aggregate, window, ``ORDER BY``, ``LIMIT`` or set operation; a filter is an IR
    :class:`Filter` on a computed column). Its result columns are appended to the input's
    in ``schema`` (names new to the input; types are the IR types the engine must give:
    the kernel checks them and fails the task naming the node and column otherwise).

    ``settings`` are (name, value) pairs set on the engine's session before the SQL runs
    (the frontend session's ``TimeZone``, ``Calendar``, ``default_order``, ...: settings
    that change what an expression computes). The planner places the node like a
    projection, in the stage of its input.
    """

    input: PlanNode
    sql: str
    inputs: tuple[str, ...]
    schema: Schema
    dialect: SqlDialect = "duckdb"
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def outputs(self) -> tuple[str, ...]:
        """The names of the columns the SQL computes (the schema's last columns)."""
        return self.schema.names[len(self.input.schema) :]


@dataclass(frozen=True)
class AsofJoin(PlanNode):
    """As-of join (Polars ``join_asof``): every ``left`` row, in order, with the columns of
    the ``right`` row whose key ``right_on`` is nearest to ``left_on`` in the direction of
    ``strategy`` (``"backward"``: the last right key <= the left key; ``"forward"``: the
    first >=; ``"nearest"``: the closest, ties to the earlier), among the right rows whose
    ``right_by`` columns equal the row's ``left_by`` columns; null columns where none is.

    Both keys must be sorted ascending (within each by-group when ``left_by`` is set); with
    ``check_sortedness`` and no by-columns Polars raises ``InvalidOperationError`` on an
    unsorted key. ``tolerance`` is None, a number in the key's unit, or a duration string of
    Polars' duration language (``"1h"``, ``"2d"``) for temporal keys: a match further away is
    no match. Without ``allow_exact_matches`` an equal key does not match. ``suffix`` renames
    clashing right columns; with ``coalesce`` the right key column is dropped.
    """

    left: PlanNode
    right: PlanNode
    left_on: Expr
    right_on: Expr
    left_by: tuple[str, ...]
    right_by: tuple[str, ...]
    strategy: AsofStrategy
    tolerance: Any
    allow_exact_matches: bool
    check_sortedness: bool
    suffix: str
    coalesce: bool
    schema: Schema


@dataclass(frozen=True)
class DynamicGroupBy(PlanNode):
    """Group rows into time windows of ``index_column`` (Polars ``group_by_dynamic``) and
    compute ``aggs`` per window, separately per group of ``keys`` when there are keys.

    ``every``, ``period`` and ``offset`` are durations in Polars' duration language
    (``"1h"``, ``"1mo"``, ``"3i"`` for an integer index): a window starts every ``every``
    (from the first index value truncated to ``every``, plus ``offset``, or as ``start_by``
    says) and spans ``period``; ``closed`` says which window ends are inside. ``window_label`` (Polars ``label``) says
    which index value names a window; ``include_boundaries`` adds ``_lower_boundary`` and
    ``_upper_boundary``. The index must be sorted ascending (within each group); Polars
    raises ``InvalidOperationError`` (``ComputeError`` with keys) otherwise. Output: keys,
    boundaries, index, aggs; groups in Polars' order (see :class:`RestoreGroupOrder`).
    """

    input: PlanNode
    index_column: str
    every: str
    period: str
    offset: str
    closed: ClosedWindow
    window_label: WindowLabel
    include_boundaries: bool
    start_by: WindowStart
    keys: tuple[NamedExpr, ...]
    aggs: tuple[NamedExpr, ...]
    schema: Schema


@dataclass(frozen=True)
class RollingGroupBy(PlanNode):
    """One window per row (Polars ``LazyFrame.rolling``): for each row, the rows of its
    group of ``keys`` whose ``index_column`` lies in ``(t + offset, t + offset + period]``
    (ends as ``closed`` says), aggregated by ``aggs``. Durations as in
    :class:`DynamicGroupBy`; the index must be sorted ascending (within each group).
    Output: keys, index, aggs; one row per input row, groups in Polars' order.
    """

    input: PlanNode
    index_column: str
    period: str
    offset: str
    closed: ClosedWindow
    keys: tuple[NamedExpr, ...]
    aggs: tuple[NamedExpr, ...]
    schema: Schema


@dataclass(frozen=True)
class MergeSorted(PlanNode):
    """Two inputs sorted ascending by the columns ``key`` (lexicographically: the first
    key, then the next among equal ones), merged into one sorted output (Polars
    ``merge_sorted``; rows with equal keys from the two sides come in the order Polars'
    merge of the whole inputs gives them, which is not always left first). Both inputs
    have the node's schema."""

    left: PlanNode
    right: PlanNode
    key: tuple[str, ...]
    schema: Schema


@dataclass(frozen=True)
class RestoreGroupOrder(PlanNode):
    """Physical plans only: the output of a :class:`DynamicGroupBy` or
    :class:`RollingGroupBy` (``operator``: ``"group_by_dynamic"`` or ``"rolling"``)
    computed per hash partition of its group columns ``keys`` and concatenated, each
    group's rows contiguous and in order, reordered so that the groups come in the order
    the operator gives them on the whole input (the kernel asks Polars for that order on
    the distinct keys). Rows within a group keep their order."""

    input: PlanNode
    keys: tuple[str, ...]
    operator: Literal["group_by_dynamic", "rolling"]
    schema: Schema


SinkLayout = Literal["file", "split", "hive"]
#: The file formats a :class:`Sink` writes (Polars' writers of the same names).
SinkFormat = Literal["parquet", "csv", "ipc", "ndjson"]

#: The rows a :class:`Sink` produces: one per file written (path, rows, bytes).
SINK_SCHEMA = Schema.of([("path", STRING), ("rows", INT64), ("bytes", INT64)])


@dataclass(frozen=True)
class Sink(PlanNode):
    """Write the rows of ``input`` to ``format`` files (``"parquet"``, ``"csv"``, ``"ipc"``
    (Arrow IPC) or ``"ndjson"``, each with Polars' writer of that format) and
    produce one row per file written: its ``path``, ``rows`` and ``bytes`` (the node's
    ``schema`` is always :data:`SINK_SCHEMA`).

    ``layout`` follows Polars' sinks (``LazyFrame.sink_parquet``):

    * ``"file"``: one file at ``path``, the rows in input order;
    * ``"split"``: files ``path/00000000.parquet``, ``00000001``, ... (Polars'
      ``PartitionBy(path, max_rows_per_file=..., approximate_bytes_per_file=...)``), each
      with at most ``max_rows_per_file`` rows and about ``max_bytes_per_file`` bytes (None:
      no limit); reading them in name order gives the rows in input order. Tasks write
      under the ``staging`` directory inside ``path``; the driver then renames the files to
      their final names (``shoal.execution.sink.commit``);
    * ``"hive"``: Polars' ``PartitionBy(path, key=partition_by)``: one directory per key
      value, ``path/<col>=<value>/00000000.parquet``, each key's rows in input order (the
      key columns are kept in the files when ``include_key``). Tasks write under the
      ``staging`` directory too, and the driver moves the files into place only when every
      task has succeeded; a failed query leaves nothing behind.

    ``options`` are keyword arguments of Polars' Parquet writer (``compression``,
    ``compression_level``, ``statistics``, ``row_group_size``, ``data_page_size``,
    ``metadata``, ``sync_on_close``, ``mkdir``) as (name, value) pairs; a mapping is kept as
    (key, value) pairs. ``path`` is absolute, or an object-storage URL written with
    ``storage_options`` (there, moving a staged file into place is a copy and a delete).
    """

    input: PlanNode
    format: SinkFormat
    path: str
    layout: SinkLayout
    schema: Schema
    partition_by: tuple[str, ...] = ()
    include_key: bool = True
    max_rows_per_file: int | None = None
    max_bytes_per_file: int | None = None
    options: tuple[tuple[str, Any], ...] = ()
    staging: str = ""
    storage_options: StorageOptions | None = None


def shared_nodes(*roots: PlanNode) -> dict[int, PlanNode]:
    """The node objects that ``roots`` reach by more than one path (sub-plans shared by
    several parents, or by several roots: Polars' cache), by ``id``."""
    seen: set[int] = set()
    shared: dict[int, PlanNode] = {}
    todo = list(roots)
    while todo:
        node = todo.pop()
        if id(node) in seen:
            shared[id(node)] = node
            continue
        seen.add(id(node))
        todo.extend(node.children())
    return shared


def transform(node: PlanNode, fn: Callable[[PlanNode], PlanNode | None]) -> PlanNode:
    """Rewrite bottom-up: ``fn`` returns a replacement or None to keep the node."""
    kids = node.children()
    new = node.with_children(tuple(transform(c, fn) for c in kids)) if kids else node
    out = fn(new)
    return new if out is None else out
