"""DuckDB's exception classes for the errors of a query that shoal runs.

Where DuckDB raises during execution (a cast that fails, an overflow, a division by zero,
a scalar subquery with several rows), the translated plan fails the task with DuckDB's
own message (:func:`shoal_duckdb.exprs.fail_where`: the kernel raises by a strict cast of
the message, so Polars' error quotes it). :func:`duckdb_error` finds that message in the
task's error and makes the error a DuckDB user expects: a ``TaskError[<DuckDB class>]``
(see :func:`shoal.errors.task_error`), so ``except duckdb.ConversionException`` catches it
as on native DuckDB and ``except shoal.TaskError`` still does too. The few errors that
Polars raises by itself for the same cause (a DECIMAL sum that overflows) are mapped by
their Polars message.
"""

from __future__ import annotations

import re

import duckdb

from shoal.errors import TaskError, task_error
from shoal_duckdb.exprs import DUCKDB_ERRORS

_KINDS = "|".join(re.escape(k) for k in DUCKDB_ERRORS)
#: DuckDB's message, quoted by Polars as the value of the failed cast.
_EMBEDDED = re.compile(rf'values: \["((?:{_KINDS}): .*?)"(?:, "|\])', re.DOTALL)

#: Errors Polars raises itself where DuckDB raises: (pattern, DuckDB's message).
_POLARS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"overflow in decimal addition"),
        "Out of Range Error: Overflow in HUGEINT addition (a sum that does not fit in DECIMAL(38))",
    ),
    # DECIMAL(38) results are computed in the kernel's DECIMAL(38) unchecked
    # (exprs._arith): Polars raises where the exact result does not fit, as DuckDB does.
    (
        re.compile(r"overflow in decimal subtraction"),
        "Out of Range Error: Overflow in subtract of DECIMAL(38)",
    ),
    (
        re.compile(r"overflow in decimal multiplication"),
        "Out of Range Error: Overflow in multiplication of DECIMAL(38)",
    ),
)


def duckdb_message(error: BaseException) -> str | None:
    """DuckDB's message for a failed query, found in ``error`` or its causes, or None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        found = _EMBEDDED.search(text)
        if found is not None:
            return found.group(1)
        for pattern, message in _POLARS:
            if pattern.search(text):
                return message
        current = current.__cause__ or current.__context__
    return None


def duckdb_error(error: TaskError) -> TaskError | None:
    """The error to raise instead of ``error`` (a failed task of a DuckDB query): a
    ``TaskError[<DuckDB exception class>]`` whose message starts with DuckDB's
    (``Conversion Error: Could not convert string 'abc' to INT32``) and names the stage
    and partition after it; None when ``error`` is not one DuckDB would raise."""
    message = duckdb_message(error)
    if message is None:
        return None
    kind = message.split(":", 1)[0]
    cls = getattr(duckdb, DUCKDB_ERRORS[kind], None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return None
    where = str(error).split(":", 1)[0]
    return task_error(f"{message}\n(shoal: {where})", cls(message))
