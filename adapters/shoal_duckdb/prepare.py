"""Getting DuckDB's bound, optimised logical plan of a query as JSON.

DuckDB 2.0's ``json_serialize_plan`` refuses plans that scan a table function
(``read_parquet``, ``read_csv``, views over them, registered Arrow objects). The workaround
(``shared/FACTS.md``): parse the query with ``json_serialize_sql``, replace every table
function in the parse tree (and every view, expanded into its defining query, and every
name that DuckDB would resolve by replacement scan) with a *stand-in*: an empty temporary
table of the same schema. ``json_deserialize_sql`` turns the tree back into SQL, whose plan
then serialises. The translation maps each stand-in back to its data:

* ``read_parquet``/``parquet_scan`` over local files (and ``FROM 'file.parquet'``): the
  resolved file list, read by shoal itself (split by file and row group);
* anything else (``read_csv``, ``range``, registered Arrow/Polars objects, ...): DuckDB
  evaluates it on the driver into an Arrow table, which shoal partitions in memory.

Planning over empty tables would let DuckDB's statistics-based optimizers prune the plan
to nothing, so they are switched off while the plan is serialised (``disabled_optimizers``
is a database-wide setting in DuckDB; shoal sets it under a lock and restores the previous
value right after). Each Parquet stand-in holds a small sample of its files' first rows, in
proportion to their row counts, so that DuckDB's join order is chosen for the real relative
table sizes (:func:`fill_with_samples`); the join strategy is shoal's own business.
"""

from __future__ import annotations

import contextlib
import glob as _glob
import json
import math
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import duckdb

from shoal.errors import UnsupportedError
from shoal_duckdb.types import loads_plan_json

#: Optimizers switched off while serialising the plan: those that use table statistics
#: (meaningless on empty stand-ins: they would prune the plan or compress columns), those
#: that rewrite the plan into forms shoal does not run (row-id late materialisation, runtime
#: join filters, IN lists turned into joins, expressions pushed into scans, grouping sets
#: split into partial aggregates, aggregates pushed below joins or reused from
#: a subquery as combine_aggr/finalize),
#: and the build/probe side swap (shoal picks the build
#: side itself).
DISABLED_OPTIMIZERS: tuple[str, ...] = (
    "statistics_propagation",
    "empty_result_pullup",
    "compressed_materialization",
    "late_materialization",
    "join_filter_pushdown",
    "row_group_pruner",
    "sampling_pushdown",
    "in_clause",
    "build_side_probe_side",
    "scalar_fn_pushdown",
    "type_pushdown",
    "top_n_window_elimination",
    "grouping_sets",
    "partial_aggregate_pushdown",
    "aggregate_reuse",
)

#: Rows copied into a Parquet stand-in: this fraction of its files' rows (at least one), but
#: the largest stand-in of a query gets at most :data:`SAMPLE_MAX_ROWS`, the others in
#: proportion, so that the tables keep their relative sizes.
SAMPLE_FRACTION = 0.001
SAMPLE_MAX_ROWS = 20_000

_SETTINGS_LOCK = threading.Lock()
_PARQUET_FUNCTIONS = frozenset({"read_parquet", "parquet_scan"})


@dataclass
class StandIn:
    """What an empty stand-in table replaces.

    ``kind`` ``"parquet"``: the Parquet files ``paths`` (absolute, in DuckDB's order);
    ``"duckdb"``: the rows of ``source_sql`` (``SELECT * FROM <original reference>``),
    evaluated by DuckDB on the driver when the query runs. ``what`` names the original
    (``read_parquet``, ``read_csv``, ``view v``).
    """

    name: str
    kind: Literal["parquet", "duckdb"]
    what: str
    source_sql: str
    paths: tuple[str, ...] = ()


@dataclass
class Prepared:
    """A query made ready for ``json_serialize_plan``; :meth:`close` drops the stand-ins."""

    con: Any
    query: str
    sql: str
    standins: dict[str, StandIn] = field(default_factory=dict)
    _temp_tables: list[str] = field(default_factory=list)

    def plan_json(self) -> dict[str, Any]:
        """The optimised logical plan of :attr:`sql`: the root operator's JSON.

        Raises :class:`shoal.UnsupportedError` when DuckDB cannot serialise it (the message
        is DuckDB's)."""
        text = _serialize_plan(self.con, self.sql)
        doc = loads_plan_json(text)
        if doc.get("error"):
            raise UnsupportedError(
                f"DuckDB cannot serialise this plan: {doc.get('error_message', doc)}"
            )
        plans = doc.get("plans") or []
        if len(plans) != 1:
            raise UnsupportedError(f"expected one plan from DuckDB, got {len(plans)}")
        return plans[0]

    def close(self) -> None:
        """Drop the stand-in tables (errors ignored: the connection may be closing)."""
        while self._temp_tables:
            name = self._temp_tables.pop()
            with contextlib.suppress(Exception):  # best effort: the connection may be closing
                self.con.sql(f"DROP TABLE IF EXISTS temp.main.{quote_ident(name)}")


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def quote_str(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def fetch_one(con: Any, sql: str, params: list[Any] | None = None) -> Any:
    """The first value of the first row of ``sql`` (the whole result is fetched, as DuckDB
    2.0 requires before the connection does other work)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0][0] if rows else None


def parse_tree(con: Any, query: str) -> dict[str, Any] | None:
    """DuckDB's parse tree of ``query`` (one SELECT statement), or None when DuckDB cannot
    serialise it."""
    doc = json.loads(fetch_one(con, "SELECT json_serialize_sql(?)", [query]))
    if doc.get("error") or len(doc.get("statements", [])) != 1:
        return None
    return doc  # type: ignore[no-any-return]


def to_sql(con: Any, tree: dict[str, Any]) -> str:
    """SQL text of a parse tree (``json_deserialize_sql``)."""
    return str(fetch_one(con, "SELECT json_deserialize_sql(?)", [json.dumps(tree)]))


def _serialize_plan(con: Any, sql: str) -> str:
    with _SETTINGS_LOCK:
        before = str(fetch_one(con, "SELECT current_setting('disabled_optimizers')") or "")
        wanted = [o.strip() for o in before.split(",") if o.strip()]
        known = {str(r[0]) for r in con.execute("SELECT name FROM duckdb_optimizers()").fetchall()}
        # A DuckDB release without one of them (renamed, removed) must not break planning.
        wanted += [o for o in DISABLED_OPTIMIZERS if o not in wanted and o in known]
        con.execute(f"SET disabled_optimizers = {quote_str(','.join(wanted))}").fetchall()
        try:
            return str(fetch_one(con, "SELECT json_serialize_plan(?, optimize := true)", [sql]))
        finally:
            con.execute(f"SET disabled_optimizers = {quote_str(before)}").fetchall()


# ---------------------------------------------------------------- parse tree rewriting


def walk_dicts(node: Any) -> Iterator[dict[str, Any]]:
    """Every dict in a JSON tree, pre-order."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from walk_dicts(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk_dicts(v)


def _cte_names(tree: Any) -> set[str]:
    names: set[str] = set()
    for d in walk_dicts(tree):
        cte = d.get("cte_map")
        if isinstance(cte, dict):
            names.update(str(e["key"]).lower() for e in cte.get("map", []))
    return names


def is_table_ref(d: dict[str, Any], kind: str) -> bool:
    """Whether ``d`` is a parse-tree table reference of type ``kind``."""
    return d.get("type") == kind and "class" not in d and "query_location" in d


def rewrite_refs(node: Any, fn: Callable[[dict[str, Any]], dict[str, Any] | None]) -> Any:
    """A copy of ``node`` where ``fn`` replaced table references (``fn`` returns a new
    reference or None to keep it and descend)."""
    if isinstance(node, dict):
        if is_table_ref(node, "BASE_TABLE") or is_table_ref(node, "TABLE_FUNCTION"):
            new = fn(node)
            if new is not None:
                return new
        return {k: rewrite_refs(v, fn) for k, v in node.items()}
    if isinstance(node, list):
        return [rewrite_refs(v, fn) for v in node]
    return node


def _base_table(ref: dict[str, Any], name: str, alias: str) -> dict[str, Any]:
    return {
        "type": "BASE_TABLE",
        "alias": alias,
        "sample": ref.get("sample"),
        "query_location": ref.get("query_location", 0),
        "query_location_length": ref.get("query_location_length", 0),
        "schema_name": "main",
        "table_name": name,
        "column_name_alias": ref.get("column_name_alias", []),
        "catalog_name": "temp",
        "at_clause": None,
        "qualified_name": {"path": ["temp", "main", name]},
    }


class Rewriter:
    """Replaces table functions, views and replacement scans of a parse tree by stand-ins."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.prepared: Prepared | None = None
        self.by_sql: dict[str, StandIn] = {}
        self.depth = 0

    def prepare(self, query: str) -> Prepared:
        """Rewrite ``query``; the stand-in tables exist until ``Prepared.close``."""
        prepared = Prepared(self.con, query, query)
        self.prepared = prepared
        tree = parse_tree(self.con, query)
        if tree is None:
            return prepared
        try:
            new_tree = self._rewrite(tree)
            if prepared.standins or new_tree != tree:
                prepared.sql = to_sql(self.con, new_tree)
            fill_with_samples(self.con, list(prepared.standins.values()))
        except BaseException:
            prepared.close()
            raise
        return prepared

    def _rewrite(self, tree: Any) -> Any:
        ctes = _cte_names(tree)

        def fn(ref: dict[str, Any]) -> dict[str, Any] | None:
            if ref["type"] == "TABLE_FUNCTION":
                return self._table_function(ref)
            return self._base_table_ref(ref, ctes)

        return rewrite_refs(tree, fn)

    # -- references -------------------------------------------------------------------

    def _table_function(self, ref: dict[str, Any]) -> dict[str, Any]:
        func = ref["function"]
        fname = str(func.get("function_name", "")).lower()
        bare = dict(ref, alias="", column_name_alias=[], sample=None)
        source_sql = self._select_from(bare)
        paths = self._parquet_paths(func) if fname in _PARQUET_FUNCTIONS else None
        standin = self._standin(source_sql, fname, paths)
        return _base_table(ref, standin.name, ref.get("alias") or fname)

    def _base_table_ref(self, ref: dict[str, Any], ctes: set[str]) -> dict[str, Any] | None:
        name = str(ref.get("table_name", ""))
        schema = str(ref.get("schema_name") or "")
        catalog = str(ref.get("catalog_name") or "")
        if not schema and not catalog and name.lower() in ctes:
            return None
        found = lookup(self.con, catalog, schema, name)
        if found is not None:
            kind, db, sch, sql = found
            if kind == "table":
                return None
            return self._view(ref, db, sch, name, sql or "")
        # DuckDB's replacement scans: 'file.parquet', 'file.csv', ...
        bare = dict(ref, alias="", column_name_alias=[], sample=None)
        source_sql = self._select_from(bare)
        paths = None
        if name.lower().endswith(".parquet") and "://" not in name:
            paths = _glob_paths(self.con, [name])
        standin = self._standin(source_sql, f"replacement scan {name!r}", paths)
        return _base_table(ref, standin.name, ref.get("alias") or _stem(name))

    def _view(
        self, ref: dict[str, Any], db: str, schema: str, name: str, sql: str
    ) -> dict[str, Any]:
        qualified = ".".join(quote_ident(p) for p in (db, schema, name))
        columns = list(self.con.sql(f"SELECT * FROM {qualified} LIMIT 0").columns)
        body = _view_body(self.con, sql)
        if (
            body is None
            or self.depth > 16
            or any(
                is_table_ref(d, "TABLE_FUNCTION")
                and str(d["function"].get("function_name", "")).startswith("python_")
                for d in walk_dicts(body)
            )
        ):
            # Registered Python objects and views shoal cannot expand: DuckDB reads them.
            standin = self._standin(f"SELECT * FROM {qualified}", f"view {name}", None)
            return _base_table(ref, standin.name, ref.get("alias") or name)
        self.depth += 1
        try:
            body = self._rewrite(body)
        finally:
            self.depth -= 1
        own = list(ref.get("column_name_alias") or [])
        return {
            "type": "SUBQUERY",
            "alias": ref.get("alias") or name,
            "sample": ref.get("sample"),
            "query_location": ref.get("query_location", 0),
            "query_location_length": ref.get("query_location_length", 0),
            "subquery": body,
            "column_name_alias": own + columns[len(own) :],
        }

    # -- stand-ins --------------------------------------------------------------------

    def _select_from(self, ref: dict[str, Any]) -> str:
        template = parse_tree(self.con, "SELECT * FROM range(1)")
        assert template is not None
        template["statements"][0]["node"]["from_table"] = ref
        return to_sql(self.con, template)

    def _parquet_paths(self, func: dict[str, Any]) -> tuple[str, ...] | None:
        args = func.get("arguments", [])
        if len(args) != 1 or args[0].get("name"):
            return None  # named options (hive_partitioning, filename, ...): DuckDB reads
        expr = args[0]["expression"]
        patterns = _constant_strings(expr)
        if patterns is None or any("://" in p for p in patterns):
            return None
        return _glob_paths(self.con, patterns)

    def _standin(self, source_sql: str, what: str, paths: tuple[str, ...] | None) -> StandIn:
        assert self.prepared is not None
        found = self.by_sql.get(source_sql)
        if found is not None:
            return found
        name = f"__shoal_standin_{uuid.uuid4().hex[:12]}"
        self.con.execute(
            f"CREATE TEMP TABLE {quote_ident(name)} AS {source_sql} LIMIT 0"
        ).fetchall()
        self.prepared._temp_tables.append(name)
        if paths is not None and not _columns_in_files(self.con, name, paths):
            paths = None  # e.g. hive partition columns: DuckDB reads
        standin = StandIn(
            name=name,
            kind="parquet" if paths else "duckdb",
            what=what,
            source_sql=source_sql,
            paths=paths or (),
        )
        self.by_sql[source_sql] = standin
        self.prepared.standins[name.lower()] = standin
        return standin


def fill_with_samples(con: Any, standins: list[StandIn]) -> None:
    """Copy the first rows of each Parquet stand-in's files into it, in proportion to the
    files' row counts (from their footers; see :data:`SAMPLE_FRACTION`).

    DuckDB's join order optimizer estimates cardinalities from the tables it sees: over
    empty stand-ins its join order is arbitrary (TPC-H Q9 and Q21 at scale 1 ran 3-4x
    slower in an order DuckDB would never pick), over samples of the right relative sizes
    it is DuckDB's usual choice. The rows themselves are never read: the optimizers that
    use column statistics stay off (:data:`DISABLED_OPTIMIZERS`), so a sample cannot prune
    the plan, and the translation maps each stand-in back to its files.
    """
    import pyarrow.parquet as pq

    rows = {
        s.name: sum(pq.read_metadata(p).num_rows for p in s.paths)
        for s in standins
        if s.kind == "parquet"
    }
    if not rows or max(rows.values()) == 0:
        return
    fraction = min(SAMPLE_FRACTION, SAMPLE_MAX_ROWS / max(rows.values()))
    for standin in standins:
        n = rows.get(standin.name, 0)
        if n:
            limit = max(1, math.ceil(n * fraction))
            # The sample is a hint only: where DuckDB cannot read every column of the
            # files (a column missing from a later file, which a query that does not
            # read it never notices), the stand-in stays empty.
            with contextlib.suppress(duckdb.Error):
                con.execute(
                    f"INSERT INTO {quote_ident(standin.name)} {standin.source_sql} LIMIT {limit}"
                ).fetchall()


def prepare(con: Any, query: str) -> Prepared:
    """``query`` with stand-ins for everything ``json_serialize_plan`` refuses.

    Raises DuckDB's own errors (``IOException`` for a missing file, ...) when a stand-in
    cannot be created; the caller binds the query first, so these are rare.
    """
    return Rewriter(con).prepare(query)


# ---------------------------------------------------------------- catalog look-ups


def lookup(
    con: Any, catalog: str, schema: str, name: str
) -> tuple[str, str, str, str | None] | None:
    """Resolve a table name as DuckDB's binder would, roughly: temporary objects first,
    then the current database and schema. Returns ``(kind, database, schema, view_sql)``
    with ``kind`` ``"table"`` or ``"view"``, or None when no catalog entry has the name."""
    rows = con.execute(
        """
        SELECT 'table', database_name, schema_name, NULL, temporary
        FROM duckdb_tables() WHERE lower(table_name) = lower(?)
        UNION ALL
        SELECT 'view', database_name, schema_name, sql, temporary
        FROM duckdb_views() WHERE NOT internal AND lower(view_name) = lower(?)
        """,
        [name, name],
    ).fetchall()
    if not rows:
        return None
    cur_db, cur_schema = con.execute("SELECT current_database(), current_schema()").fetchall()[0]

    def matches(row: tuple[Any, ...]) -> bool:
        db, sch = str(row[1]).lower(), str(row[2]).lower()
        if catalog:
            return db == catalog.lower() and (not schema or sch == schema.lower())
        if schema:
            return (db == str(cur_db).lower() and sch == schema.lower()) or (
                db == schema.lower() and sch == "main"
            )
        return True

    def rank(row: tuple[Any, ...]) -> int:
        if row[4]:
            return 0
        if str(row[1]) == cur_db and str(row[2]) == cur_schema:
            return 1
        if str(row[1]) == cur_db:
            return 2
        return 3

    candidates = sorted((r for r in rows if matches(r)), key=rank)
    if not candidates:
        return None
    kind, db, sch, sql, _ = candidates[0]
    return str(kind), str(db), str(sch), sql


def _view_body(con: Any, sql: str) -> dict[str, Any] | None:
    """The parse tree of a view's defining query, from its ``CREATE VIEW ... AS`` text."""
    text = sql.strip().rstrip(";")
    upper = text.upper()
    start = 0
    while True:
        i = upper.find(" AS ", start)
        if i < 0:
            return None
        tree = parse_tree(con, text[i + 4 :])
        if tree is not None:
            return tree["statements"][0]  # type: ignore[no-any-return]
        start = i + 1


def _constant_strings(expr: dict[str, Any]) -> list[str] | None:
    if expr.get("class") == "CONSTANT":
        lit = expr.get("literal") or {}
        if lit.get("kind") == "STRING":
            return [str(lit["text"])]
        value = expr.get("value") or {}
        if isinstance(value.get("value"), str):
            return [value["value"]]
        return None
    if expr.get("class") == "FUNCTION" and expr.get("function_name") == "list_value":
        out: list[str] = []
        for a in expr.get("arguments", []):
            got = _constant_strings(a["expression"])
            if got is None:
                return None
            out.extend(got)
        return out
    return None


def _glob_paths(con: Any, patterns: list[str]) -> tuple[str, ...] | None:
    out: list[str] = []
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            files = sorted(_glob.glob(os.path.expanduser(pattern), recursive=True))
        else:
            files = [os.path.expanduser(pattern)]
        if not files:
            return None  # DuckDB raises its own error when the query runs
        out.extend(os.path.abspath(f) for f in files)
    return tuple(out)


def _columns_in_files(con: Any, standin: str, paths: tuple[str, ...]) -> bool:
    import pyarrow.parquet as pq

    cols = con.sql(f"SELECT * FROM temp.main.{quote_ident(standin)}").columns
    try:
        names = set(pq.read_schema(paths[0]).names)
    except Exception:
        return False
    return all(c in names for c in cols)


def _stem(name: str) -> str:
    base = os.path.basename(name)
    return base.split(".", 1)[0] or "t"
