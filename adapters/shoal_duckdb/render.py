"""DuckDB bound expressions (``json_serialize_plan`` JSON) written back as DuckDB SQL.

Where the adapter cannot say an expression in the IR exactly (``list_reduce`` with a
lambda, ``printf``, a STRUCT constant, ...), the expression runs on DuckDB inside the
tasks instead (a :class:`shoal.ir.nodes.SqlMap`, see :mod:`shoal_duckdb.fragment`). Its SQL
is printed here from DuckDB's bound plan, against the input's column names: every column
reference is cast to the type DuckDB bound it with (so that DuckDB binds the same
functions over the Arrow columns a task hands it), every constant is written with its
type, operators are called by their catalog name (``"+"(a, b)``) and lambdas get fresh
parameter names.

:class:`Renderer` refuses (:class:`CannotRender`, with the reason) what would not mean the
same thing in a task: aggregates, windows, subqueries, parameters, functions that are not
DuckDB built-ins (the user's Python UDFs), functions whose answer depends on the time, the
session, the catalog or chance (``now()``, ``random()``, ``nextval``, ``current_setting``,
``stats``, ``alias``), and types or constants it cannot write (user-defined types, unions,
``TIME WITH TIME ZONE``, collated strings). What it prints is checked before it is used
(:mod:`shoal_duckdb.fragment`).
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Sequence
from typing import Any

from shoal_duckdb.prepare import quote_ident


class CannotRender(Exception):
    """An expression that cannot run as DuckDB SQL in the tasks; the message says why."""


#: Functions whose answer depends on something other than their arguments: the moment
#: (the task runs later than the query was bound), the session or catalog (the task's
#: DuckDB is a fresh in-memory database), chance, or the binder's view of the query; and
#: ``error()``, which raises only where DuckDB evaluates it (a LIMIT stops DuckDB early,
#: while the tasks evaluate every row).
NOT_IN_TASKS = frozenset(
    {
        "random", "setseed", "gen_random_uuid", "uuid", "uuidv4", "uuidv7", "nextval",
        "currval", "setval", "sleep_ms", "stats", "vector_type", "write_log", "alias",
        "current_connection_id", "current_query", "current_query_id",
        "current_transaction_id", "current_database", "current_catalog", "current_schema",
        "current_schemas", "current_setting", "current_date", "current_localtime",
        "current_localtimestamp", "current_time", "current_timestamp", "get_current_time",
        "get_current_timestamp", "now", "today", "transaction_timestamp", "txid_current",
        "getvariable", "in_search_path", "current_user", "current_role", "user",
        "session_user", "version", "pragma_version", "platform", "duckdb_api", "error",
    }
)  # fmt: skip

_SIMPLE_TYPES = {
    "BOOLEAN": "BOOLEAN",
    "TINYINT": "TINYINT",
    "SMALLINT": "SMALLINT",
    "INTEGER": "INTEGER",
    "BIGINT": "BIGINT",
    "HUGEINT": "HUGEINT",
    "UTINYINT": "UTINYINT",
    "USMALLINT": "USMALLINT",
    "UINTEGER": "UINTEGER",
    "UBIGINT": "UBIGINT",
    "UHUGEINT": "UHUGEINT",
    "FLOAT": "FLOAT",
    "DOUBLE": "DOUBLE",
    "VARCHAR": "VARCHAR",
    "BLOB": "BLOB",
    "DATE": "DATE",
    "TIME": "TIME",
    "TIMESTAMP": "TIMESTAMP",
    "TIMESTAMP_S": "TIMESTAMP_S",
    "TIMESTAMP_MS": "TIMESTAMP_MS",
    "TIMESTAMP_NS": "TIMESTAMP_NS",
    "TIMESTAMP WITH TIME ZONE": "TIMESTAMPTZ",
    "INTERVAL": "INTERVAL",
    "UUID": "UUID",
}

_COMPARISONS = {
    "COMPARE_EQUAL": "=",
    "COMPARE_NOTEQUAL": "<>",
    "COMPARE_LESSTHAN": "<",
    "COMPARE_GREATERTHAN": ">",
    "COMPARE_LESSTHANOREQUALTO": "<=",
    "COMPARE_GREATERTHANOREQUALTO": ">=",
    "COMPARE_DISTINCT_FROM": "IS DISTINCT FROM",
    "COMPARE_NOT_DISTINCT_FROM": "IS NOT DISTINCT FROM",
}

#: DuckDB's raw values of infinity and -infinity: DATE, then the TIMESTAMP types.
_DATE_INFINITY = 2**31 - 1
_TIMESTAMP_INFINITY = 2**63 - 1


def quote_literal(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def sql_type(t: dict[str, Any]) -> str:
    """DuckDB's SQL name of a serialised type (``DECIMAL(15,2)``, ``STRUCT("a" INTEGER)``,
    ``BIGINT[]``); raises :class:`CannotRender` for types a fresh DuckDB session cannot
    name the same way (user-defined type names, collations, unnamed structs, unions)."""
    tid = str(t.get("id"))
    info = t.get("type_info") or {}
    alias = info.get("alias") or ""
    if alias:
        if alias.upper() == "JSON" and tid == "VARCHAR":
            return "JSON"
        raise CannotRender(f"type {alias} (a user-defined type name)")
    if info.get("collation"):
        raise CannotRender(f"type VARCHAR COLLATE {info['collation']}")
    if tid in _SIMPLE_TYPES:
        return _SIMPLE_TYPES[tid]
    if tid == "DECIMAL":
        return f"DECIMAL({int(info['width'])},{int(info['scale'])})"
    if tid == "LIST":
        return f"{sql_type(info['child_type'])}[]"
    if tid == "ARRAY":
        return f"{sql_type(info['child_type'])}[{int(info['size'])}]"
    if tid == "STRUCT":
        fields = [
            f"{quote_ident(str(c['first']))} {sql_type(c['second'])}" for c in info["child_types"]
        ]
        if not fields or any(not c["first"] for c in info["child_types"]):
            raise CannotRender("a STRUCT type without field names")
        return f"STRUCT({', '.join(fields)})"
    if tid == "TUPLE" and info.get("child_types"):
        return f"TUPLE({', '.join(sql_type(c['second']) for c in info['child_types'])})"
    if tid == "MAP":
        entry = info["child_type"]["type_info"]["child_types"]
        return f"MAP({sql_type(entry[0]['second'])}, {sql_type(entry[1]['second'])})"
    if tid == "ENUM":
        values = ", ".join(quote_literal(str(v)) for v in info.get("values") or [])
        return f"ENUM({values})"
    raise CannotRender(f"type {tid}")


def _hugeint(v: Any) -> int:
    if isinstance(v, dict):
        return int(v["upper"]) * (1 << 64) + int(v["lower"])
    return int(v)


def _float_text(value: Any) -> str:
    if isinstance(value, str):  # DuckDB's JSON writes NaN and infinities as bare words
        value = float(value)
    x = float(value)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def _time_text(micros: int) -> str:
    hours, rest = divmod(micros, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    seconds, fraction = divmod(rest, 1_000_000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}.{fraction:06d}"


def _children(v: dict[str, Any], child_type: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": child_type, **c} for c in (v["value"] or {}).get("children", [])]


def sql_constant(v: dict[str, Any]) -> str:
    """A serialised DuckDB constant (``{"type", "is_null", "value"}``) as SQL of exactly
    that type and value; raises :class:`CannotRender`."""
    t = v["type"]
    tid = str(t.get("id"))
    if tid in ("NULL", "SQLNULL"):
        return "NULL"
    name = sql_type(t) if tid != "TUPLE" else ""
    if v.get("is_null"):
        return f"CAST(NULL AS {name or sql_type(t)})"
    raw: Any = v["value"]
    info = t.get("type_info") or {}
    if tid == "BOOLEAN":
        return "true" if raw else "false"
    if tid in ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "UTINYINT", "USMALLINT"):
        return f"CAST({int(raw)} AS {name})"
    if tid in ("UINTEGER", "UBIGINT", "HUGEINT", "UHUGEINT"):
        return f"CAST({quote_literal(str(_hugeint(raw)))} AS {name})"
    if tid in ("FLOAT", "DOUBLE"):
        return f"CAST({quote_literal(_float_text(raw))} AS {name})"
    if tid == "DECIMAL":
        scale = int(info["scale"])
        text = format(decimal.Decimal(_hugeint(raw)).scaleb(-scale, decimal.Context(prec=100)), "f")
        return f"CAST({quote_literal(text)} AS {name})"
    if tid in ("VARCHAR", "BLOB"):
        return f"CAST({quote_literal(str(raw))} AS {name})"
    if tid == "UUID":
        bits = (_hugeint(raw) + (1 << 127)) % (1 << 128)  # DuckDB flips the top bit
        h = f"{bits:032x}"
        text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        return f"CAST({quote_literal(text)} AS UUID)"
    if tid == "DATE":
        days = int(raw)
        if abs(days) == _DATE_INFINITY:
            return f"CAST({quote_literal('infinity' if days > 0 else '-infinity')} AS DATE)"
        return f"CAST(DATE '1970-01-01' + CAST({days} AS INTEGER) AS DATE)"
    if tid.startswith("TIMESTAMP"):
        n = int(raw)
        if abs(n) == _TIMESTAMP_INFINITY:
            return f"CAST({quote_literal('infinity' if n > 0 else '-infinity')} AS {name})"
        if tid == "TIMESTAMP":
            return f"make_timestamp(CAST({n} AS BIGINT))"
        if tid == "TIMESTAMP_NS":
            return f"make_timestamp_ns(CAST({n} AS BIGINT))"
        if tid == "TIMESTAMP_MS":
            return f"CAST(epoch_ms(CAST({n} AS BIGINT)) AS TIMESTAMP_MS)"
        if tid == "TIMESTAMP_S":
            return f"CAST(epoch_ms(CAST({n} AS BIGINT) * 1000) AS TIMESTAMP_S)"
        if tid == "TIMESTAMP WITH TIME ZONE":
            return f"timezone('UTC', make_timestamp(CAST({n} AS BIGINT)))"
    if tid == "TIME":
        if int(raw) >= 86_400_000_000:
            raise CannotRender("TIME '24:00:00' (the kernel's TIME cannot hold it)")
        return f"CAST({quote_literal(_time_text(int(raw)))} AS TIME)"
    if tid == "INTERVAL":
        return (
            f"(to_months(CAST({int(raw['months'])} AS INTEGER)) + "
            f"to_days(CAST({int(raw['days'])} AS INTEGER)) + "
            f"to_microseconds(CAST({int(raw['micros'])} AS BIGINT)))"
        )
    if tid in ("LIST", "ARRAY"):
        items = ", ".join(sql_constant(c) for c in _children(v, info["child_type"]))
        return f"CAST([{items}] AS {name})"
    if tid == "STRUCT":
        kinds = info["child_types"]
        values = _children_of_struct(v, kinds)
        fields = ", ".join(
            f"{quote_ident(str(k['first']))} := {sql_constant(x)}"
            for k, x in zip(kinds, values, strict=True)
        )
        return f"CAST(struct_pack({fields}) AS {name})"
    if tid == "TUPLE":
        kinds = info["child_types"]
        values = _children_of_struct(v, kinds)
        return f"row({', '.join(sql_constant(x) for x in values)})"
    if tid == "MAP":
        entry = info["child_type"]
        key_type, value_type = (c["second"] for c in entry["type_info"]["child_types"])
        entries = _children(v, entry)
        keys: list[str] = []
        vals: list[str] = []
        for en in entries:
            if en.get("is_null"):
                raise CannotRender("a NULL MAP entry")
            k, x = _children_of_struct(en, entry["type_info"]["child_types"])
            keys.append(sql_constant(k))
            vals.append(sql_constant(x))
        return (
            f"CAST(MAP(CAST([{', '.join(keys)}] AS {sql_type(key_type)}[]), "
            f"CAST([{', '.join(vals)}] AS {sql_type(value_type)}[])) AS {name})"
        )
    if tid == "ENUM":
        labels = info.get("values") or []
        return f"CAST({quote_literal(str(labels[int(raw)]))} AS {name})"
    raise CannotRender(f"a constant of type {tid}")


def _children_of_struct(v: dict[str, Any], kinds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kids = (v["value"] or {}).get("children", [])
    if len(kids) != len(kinds):
        raise CannotRender("a STRUCT constant whose fields do not match its type")
    return [{"type": k["second"], **c} for k, c in zip(kinds, kids, strict=True)]


class _Scope:
    """A lambda's parameters (SQL names, in declaration order) and captured values (SQL,
    rendered in the enclosing scope)."""

    def __init__(self, params: list[str], captures: list[str]) -> None:
        self.params = params
        self.captures = captures


class Renderer:
    """Writes expressions over one operator's input as DuckDB SQL.

    ``columns[i]`` is the name (in the relation a task hands DuckDB) of the column that
    ``BOUND_REF`` index ``i`` reads, or None where the column cannot be read there.
    After :meth:`render`, ``used`` lists the columns read and ``constants`` the constants
    written, as (SQL, DuckDB's serialised value), for the caller to check.
    """

    def __init__(self, columns: Sequence[str | None], builtins: frozenset[str]) -> None:
        self.columns = columns
        self.builtins = builtins
        self.used: list[str] = []
        self.constants: list[tuple[str, dict[str, Any]]] = []
        #: Whether a DATE or TIMESTAMP constant written is DuckDB's infinity.
        self.infinite = False
        self._scopes: list[_Scope] = []
        self._lambdas = 0

    def render(self, e: dict[str, Any]) -> str:
        """DuckDB SQL for the bound expression ``e``; raises :class:`CannotRender`."""
        cls = str(e.get("expression_class"))
        handler = _CLASSES.get(cls)
        if handler is None:
            raise CannotRender(f"expression {cls}")
        return handler(self, e)

    # -- pieces --------------------------------------------------------------------------

    def _ref(self, e: dict[str, Any]) -> str:
        index = int(e["index"])
        if self._scopes:
            scope = self._scopes[-1]
            n = len(scope.params)
            if index < n:  # DuckDB numbers a lambda's parameters from the last one
                return scope.params[n - 1 - index]
            if index - n < len(scope.captures):
                return f"({scope.captures[index - n]})"
            raise CannotRender(f"lambda reference #{index} out of range")
        if not 0 <= index < len(self.columns) or self.columns[index] is None:
            raise CannotRender(f"column reference #{index} cannot be read in the tasks")
        name = str(self.columns[index])
        if name not in self.used:
            self.used.append(name)
        return f"CAST({quote_ident(name)} AS {sql_type(e['return_type'])})"

    def _constant(self, e: dict[str, Any]) -> str:
        text = sql_constant(e["value"])
        self.infinite = self.infinite or "infinity'" in text
        self.constants.append((text, e["value"]))
        return text

    def _function(self, e: dict[str, Any]) -> str:
        kind = str(e.get("type", ""))
        kids: list[dict[str, Any]] = list(e.get("children") or [])
        if kind == "OPERATOR_CAST":
            data = e.get("function_data") or {}
            return self._cast(kids[0], e["return_type"], bool(data.get("try_cast")))
        if kind in _COMPARISONS and len(kids) == 2:
            return f"({self.render(kids[0])} {_COMPARISONS[kind]} {self.render(kids[1])})"
        path = (e.get("qname") or {}).get("path") or []
        name = str(path[-1]) if path else ""
        if name.lower() in NOT_IN_TASKS:
            raise CannotRender(f"function {name}() depends on more than its arguments")
        if name.lower() not in self.builtins:
            raise CannotRender(f"function {name}() is not a DuckDB built-in")
        args = kids
        captures: list[str] = []
        if any(k.get("expression_class") == "BOUND_LAMBDA" for k in kids):
            n = len(e.get("arguments") or [])
            args, captured = kids[:n], kids[n:]
            captures = [self.render(c) for c in captured]
        named = [str(x) for x in e.get("named_arguments") or []]
        if len(named) > len(args):
            raise CannotRender(f"function {name}() with named arguments")
        texts = [
            self._lambda(a, captures) if a.get("expression_class") == "BOUND_LAMBDA"
            else self.render(a)
            for a in args
        ]  # fmt: skip
        first_named = len(texts) - len(named)
        items = texts[:first_named] + [
            f"{quote_ident(n)} := {x}" for n, x in zip(named, texts[first_named:], strict=True)
        ]
        return f"{quote_ident(name)}({', '.join(items)})"

    def _lambda(self, e: dict[str, Any], captures: list[str]) -> str:
        count = int(e.get("parameter_count") or 0)
        self._lambdas += 1
        params = [f"__shoal_l{self._lambdas}_{i}" for i in range(count)]
        self._scopes.append(_Scope(params, captures))
        try:
            body = self.render(e["lambda_expr"])
        finally:
            self._scopes.pop()
        return f"lambda {', '.join(params)}: ({body})"

    def _cast(self, child: dict[str, Any], target: dict[str, Any], try_cast: bool) -> str:
        word = "TRY_CAST" if try_cast else "CAST"
        return f"{word}({self.render(child)} AS {sql_type(target)})"

    def _bound_cast(self, e: dict[str, Any]) -> str:
        child = e.get("child") or (e.get("children") or [None])[0]
        if child is None:
            raise CannotRender("a cast without its argument")
        return self._cast(child, e["return_type"], bool(e.get("try_cast")))

    def _comparison(self, e: dict[str, Any]) -> str:
        op = _COMPARISONS.get(str(e.get("type")))
        if op is None:
            raise CannotRender(f"comparison {e.get('type')}")
        return f"({self.render(e['left'])} {op} {self.render(e['right'])})"

    def _conjunction(self, e: dict[str, Any]) -> str:
        word = {"CONJUNCTION_AND": " AND ", "CONJUNCTION_OR": " OR "}.get(str(e.get("type")))
        if word is None:
            raise CannotRender(f"conjunction {e.get('type')}")
        return "(" + word.join(self.render(c) for c in e["children"]) + ")"

    def _operator(self, e: dict[str, Any]) -> str:
        kind = str(e.get("type"))
        kids = [self.render(c) for c in e.get("children") or []]
        if kind == "OPERATOR_NOT" and len(kids) == 1:
            return f"(NOT {kids[0]})"
        if kind == "OPERATOR_IS_NULL" and len(kids) == 1:
            return f"({kids[0]} IS NULL)"
        if kind == "OPERATOR_IS_NOT_NULL" and len(kids) == 1:
            return f"({kids[0]} IS NOT NULL)"
        if kind == "OPERATOR_COALESCE" and kids:
            return f"COALESCE({', '.join(kids)})"
        if kind == "OPERATOR_TRY" and len(kids) == 1:
            return f"TRY({kids[0]})"
        if kind in ("COMPARE_IN", "COMPARE_NOT_IN") and len(kids) >= 2:
            word = "IN" if kind == "COMPARE_IN" else "NOT IN"
            return f"({kids[0]} {word} ({', '.join(kids[1:])}))"
        raise CannotRender(f"operator {kind}")

    def _case(self, e: dict[str, Any]) -> str:
        parts = ["CASE"]
        for check in e["case_checks"]:
            parts.append(f"WHEN {self.render(check['when_expr'])}")
            parts.append(f"THEN {self.render(check['then_expr'])}")
        parts.append(f"ELSE {self.render(e['else_expr'])} END")
        return " ".join(parts)

    def _between(self, e: dict[str, Any]) -> str:
        x = self.render(e["input"])
        lo, hi = self.render(e["lower"]), self.render(e["upper"])
        low = ">=" if e.get("lower_inclusive", True) else ">"
        high = "<=" if e.get("upper_inclusive", True) else "<"
        return f"(({x} {low} {lo}) AND ({x} {high} {hi}))"


_CLASSES = {
    "BOUND_REF": Renderer._ref,
    "BOUND_CONSTANT": Renderer._constant,
    "BOUND_FUNCTION": Renderer._function,
    "BOUND_CAST": Renderer._bound_cast,
    "BOUND_COMPARISON": Renderer._comparison,
    "BOUND_CONJUNCTION": Renderer._conjunction,
    "BOUND_OPERATOR": Renderer._operator,
    "BOUND_CASE": Renderer._case,
    "BOUND_BETWEEN": Renderer._between,
}


@functools.cache
def builtin_functions() -> frozenset[str]:
    """The names (lower case) of the scalar functions a fresh DuckDB database has: what a
    task's DuckDB can call."""
    import duckdb

    con = duckdb.connect(":memory:")
    try:
        rows = con.execute(
            "SELECT DISTINCT lower(function_name) FROM duckdb_functions() "
            "WHERE function_type = 'scalar'"
        ).fetchall()
    finally:
        con.close()
    return frozenset(str(r[0]) for r in rows)
