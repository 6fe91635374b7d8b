"""Tracing: a Perfetto trace of every query, free when off.

Record with ``with shoal.trace("query.json"):`` around any collect or execute, or with
``SHOAL_TRACE=path`` / ``Config(trace=path)`` (a directory: one file per query). The file
is Chrome trace-event JSON (timestamps in microseconds), which ui.perfetto.dev opens; see
``docs/tracing.md`` for what it shows and how to read it.

Library authors receive the same events as Python objects, live, with
:func:`add_listener` / :func:`remove_listener` (event classes in
:mod:`shoal.tracing.events`; times there are seconds since the epoch).
"""

from __future__ import annotations

from shoal.tracing.chrome import ChromeTraceWriter
from shoal.tracing.events import (
    CounterSample,
    LoopSpan,
    QueryFinished,
    QueryPlanned,
    QueryStarted,
    StageFinished,
    StageInfo,
    TaskDispatched,
    TaskFailed,
    TaskFinished,
    TraceEvent,
)
from shoal.tracing.tracer import (
    NO_SPAN,
    Listener,
    QueryTracer,
    TraceRecording,
    add_listener,
    remove_listener,
    start_query,
    trace,
)

__all__ = [
    "NO_SPAN",
    "ChromeTraceWriter",
    "CounterSample",
    "Listener",
    "LoopSpan",
    "QueryFinished",
    "QueryPlanned",
    "QueryStarted",
    "QueryTracer",
    "StageFinished",
    "StageInfo",
    "TaskDispatched",
    "TaskFailed",
    "TaskFinished",
    "TraceEvent",
    "TraceRecording",
    "add_listener",
    "remove_listener",
    "start_query",
    "trace",
]
