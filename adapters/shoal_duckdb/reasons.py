"""Reasons for a fallback in the words of the user's SQL.

DuckDB's optimised plan speaks of logical operators (``LOGICAL_PROJECTION``), of the
functions its binder chose (``split_part`` is a macro over ``array_extract``, an INTERVAL
comparison calls ``normalized_interval``) and, in shoal, of the stand-in tables that
replace table functions (``__shoal_standin_<hash>``). A user wrote none of these. This
module turns them back into what the user wrote:

* an operator becomes the clause it comes from (``WHERE``, ``GROUP BY``, ``window``);
* a scan names the table, view, file or table function the user wrote, and the column;
* an expression is quoted from the query text where DuckDB's plan says where it came from
  (``query_location`` and ``query_location_length``), checked against DuckDB's parse tree
  of the same text so that positions inside a macro's own body are never quoted;
* a window function is written back as ``name(...) OVER (...)`` with its frame in SQL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shoal_duckdb.prepare import StandIn, walk_dicts

#: DuckDB logical operator -> the clause a user wrote.
CLAUSES: dict[str, str] = {
    "LOGICAL_PROJECTION": "SELECT",
    "LOGICAL_FILTER": "WHERE",
    "LOGICAL_AGGREGATE_AND_GROUP_BY": "GROUP BY / aggregate",
    "LOGICAL_WINDOW": "window function",
    "LOGICAL_ORDER_BY": "ORDER BY",
    "LOGICAL_TOP_N": "ORDER BY ... LIMIT",
    "LOGICAL_LIMIT": "LIMIT / OFFSET",
    "LOGICAL_DISTINCT": "DISTINCT",
    "LOGICAL_UNION": "UNION",
    "LOGICAL_EXCEPT": "EXCEPT",
    "LOGICAL_INTERSECT": "INTERSECT",
    "LOGICAL_COMPARISON_JOIN": "JOIN",
    "LOGICAL_ANY_JOIN": "JOIN",
    "LOGICAL_CROSS_PRODUCT": "JOIN",
    "LOGICAL_ASOF_JOIN": "ASOF JOIN",
    "LOGICAL_POSITIONAL_JOIN": "POSITIONAL JOIN",
    "LOGICAL_DELIM_JOIN": "correlated subquery",
    "LOGICAL_DELIM_GET": "correlated subquery",
    "LOGICAL_DEPENDENT_JOIN": "correlated subquery",
    "LOGICAL_MATERIALIZED_CTE": "WITH",
    "LOGICAL_CTE_REF": "WITH",
    "LOGICAL_RECURSIVE_CTE": "WITH RECURSIVE",
    "LOGICAL_UNNEST": "UNNEST",
    "LOGICAL_PIVOT": "PIVOT",
    "LOGICAL_SAMPLE": "USING SAMPLE",
    "LOGICAL_EXPRESSION_GET": "VALUES",
    "LOGICAL_CHUNK_GET": "VALUES",
    "LOGICAL_EMPTY_RESULT": "FROM",
    "LOGICAL_DUMMY_SCAN": "FROM",
    "LOGICAL_INSERT": "INSERT",
    "LOGICAL_DELETE": "DELETE",
    "LOGICAL_UPDATE": "UPDATE",
}

_STANDIN = re.compile(r'"?(__shoal_standin_[0-9a-f]+)"?', re.IGNORECASE)
_INVALID = 2**63  # DuckDB writes "no location" as 2**64 - 1


def source_words(name: str, standins: Mapping[str, StandIn]) -> str:
    """What a scanned table is in the user's query: ``table t``, ``view v``,
    ``read_parquet('x/*.parquet')``, ``'x.csv'`` (a replacement scan)."""
    standin = standins.get(name.lower())
    if standin is None:
        return f"table {name}"
    if standin.what.startswith("view "):
        return standin.what
    text = standin.source_sql.strip().rstrip(";")
    head = "SELECT * FROM "
    if text.upper().startswith(head):
        return text[len(head) :].strip()
    return standin.what


def unmask(text: str, standins: Mapping[str, StandIn]) -> str:
    """``text`` with every stand-in table name replaced by what it stands for."""
    return _STANDIN.sub(lambda m: source_words(m.group(1), standins), text)


def where_words(what: str, standins: Mapping[str, StandIn]) -> str:
    """A place in the plan (``LOGICAL_FILTER``, ``LOGICAL_GET(t)``, or already words) as
    the clause of the user's query."""
    m = re.fullmatch(r"(LOGICAL_[A-Z_]+)(?:\((.*)\))?", what, re.DOTALL)
    if m is None:
        return unmask(what, standins)
    op, arg = m.group(1), m.group(2)
    if op == "LOGICAL_GET":
        return f"FROM {source_words(arg, standins)}" if arg else "FROM"
    clause = CLAUSES.get(op, op.removeprefix("LOGICAL_").replace("_", " ").lower())
    return f"{clause} ({unmask(arg, standins)})" if arg else clause


class SourceText:
    """The SQL text whose plan is translated, to quote the expressions of its plan.

    ``tree`` is DuckDB's parse tree of the same text (``json_serialize_sql``): a location
    is quoted only where the parse tree has an expression that starts there (for a
    function, one of the same name), so that the locations DuckDB gives expressions
    inside a macro's body (``split_part``'s ``array_extract``), which point into the
    macro's text, are never taken for the user's."""

    def __init__(
        self, sql: str, tree: dict[str, Any] | None, standins: Mapping[str, StandIn]
    ) -> None:
        self.sql = sql
        self.standins = standins
        #: location -> (names the parse tree's expressions there answer to, first location
        #: of the expression's subtree: an operator's left operand starts before it).
        self.nodes: dict[int, tuple[set[str], int]] = {}
        if tree is not None:
            for d in walk_dicts(tree):
                if "class" not in d:
                    continue
                loc = d.get("query_location")
                if not isinstance(loc, int) or loc >= _INVALID:
                    continue
                names = {str(d.get("function_name") or "").lower(), str(d["class"]).lower()}
                names.add(str(d.get("type") or "").lower())
                start = min([loc, *self._starts(d)])
                got = self.nodes.get(loc)
                if got is not None:
                    names |= got[0]
                    start = min(start, got[1])
                self.nodes[loc] = (names, start)

    @staticmethod
    def _starts(d: dict[str, Any]) -> list[int]:
        out: list[int] = []
        for child in walk_dicts(d):
            if child is d or "class" not in child:
                continue
            loc = child.get("query_location")
            if isinstance(loc, int) and loc < _INVALID:
                out.append(loc)
        return out

    def quote(self, e: dict[str, Any]) -> str | None:
        """The user's text of plan expression ``e``, or None when the plan does not say
        where it came from (or says it inside a macro)."""
        loc, length = e.get("query_location"), e.get("query_location_length")
        if not isinstance(loc, int) or not isinstance(length, int) or length <= 0:
            return None
        if loc >= _INVALID or loc + length > len(self.sql):
            return None
        found = self.nodes.get(loc)
        if found is None:
            return None
        names, start = found
        if e.get("expression_class") in ("BOUND_FUNCTION", "BOUND_AGGREGATE"):
            # The same function, or one DuckDB rewrote a function call into
            # (date_part('epoch', x) -> epoch(x)): a function call starts there.
            name = str(((e.get("qname") or {}).get("path") or [""])[-1]).lower()
            if name not in names and "function" not in names:
                return None
        text = " ".join(self.sql[start : loc + length].split())
        if len(text) > 120:
            text = text[:117] + "..."
        return unmask(text, self.standins)


#: Functions DuckDB's binder or optimizer calls where the user wrote something else.
INTERNAL_FUNCTIONS: dict[str, str] = {
    "normalized_interval": "a comparison of INTERVAL values",
    "array_extract": "list indexing (x[i]), a string index or split_part()",
    "epoch": "date_part('epoch', ...) / extract(epoch FROM ...)",
    "constant_or_null": "an expression DuckDB's optimizer folded",
    "list_value": "a list [...]",
    "struct_pack": "a struct {...}",
}


def internal_function_words(name: str) -> str | None:
    """What the user wrote where DuckDB calls its function ``name``, when DuckDB calls it
    for something else (None for ordinary functions, called by their own name)."""
    return INTERNAL_FUNCTIONS.get(name.lower())


_BOUNDS = {
    "UNBOUNDED_PRECEDING": "UNBOUNDED PRECEDING",
    "UNBOUNDED_FOLLOWING": "UNBOUNDED FOLLOWING",
    "CURRENT_ROW_ROWS": "CURRENT ROW",
    "CURRENT_ROW_RANGE": "CURRENT ROW",
    "CURRENT_ROW_GROUPS": "CURRENT ROW",
    "EXPR_PRECEDING_ROWS": "<n> PRECEDING",
    "EXPR_PRECEDING_RANGE": "<n> PRECEDING",
    "EXPR_PRECEDING_GROUPS": "<n> PRECEDING",
    "EXPR_FOLLOWING_ROWS": "<n> FOLLOWING",
    "EXPR_FOLLOWING_RANGE": "<n> FOLLOWING",
    "EXPR_FOLLOWING_GROUPS": "<n> FOLLOWING",
}

_WINDOW_NAMES = {
    "WINDOW_ROW_NUMBER": "row_number",
    "WINDOW_RANK": "rank",
    "WINDOW_RANK_DENSE": "dense_rank",
    "WINDOW_PERCENT_RANK": "percent_rank",
    "WINDOW_CUME_DIST": "cume_dist",
    "WINDOW_NTILE": "ntile",
    "WINDOW_LAG": "lag",
    "WINDOW_LEAD": "lead",
    "WINDOW_FIRST_VALUE": "first_value",
    "WINDOW_LAST_VALUE": "last_value",
    "WINDOW_NTH_VALUE": "nth_value",
    "WINDOW_FILL": "fill",
}


def frame_words(w: dict[str, Any]) -> str:
    """A window's frame as SQL (``RANGE BETWEEN <n> PRECEDING AND CURRENT ROW``)."""
    start, end = str(w.get("start", "")), str(w.get("end", ""))
    mode = "ROWS"
    for bound in (start, end):
        for m in ("RANGE", "GROUPS"):
            if bound.endswith("_" + m):
                mode = m
    a, b = _BOUNDS.get(start, start), _BOUNDS.get(end, end)
    return f"{mode} BETWEEN {a} AND {b}"


def window_words(w: dict[str, Any]) -> str:
    """A window function as the user wrote it, roughly: ``sum(...) OVER (PARTITION BY ...
    ORDER BY ...)``."""
    kind = str(w.get("type", ""))
    if kind == "WINDOW_AGGREGATE":
        name = str(((w.get("qname") or {}).get("path") or ["?"])[-1])
        if name == "count_star":
            name = "count(*)"
    else:
        name = _WINDOW_NAMES.get(kind, kind.removeprefix("WINDOW_").lower())
    if not name.endswith(")"):
        name += "(...)" if w.get("children") else "()"
    over = []
    if w.get("partitions"):
        over.append("PARTITION BY ...")
    if w.get("orders"):
        over.append("ORDER BY ...")
    return f"{name} OVER ({' '.join(over)})"
