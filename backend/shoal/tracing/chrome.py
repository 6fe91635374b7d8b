"""Writing trace events as Chrome trace-event JSON, the format ui.perfetto.dev opens.

:class:`ChromeTraceWriter` streams one file: ``{"traceEvents": [...], "metadata": {...}}``.
Timestamps and durations in the file are **microseconds** since the trace's origin, the
start of the first query it records (``metadata.shoal.origin_unix_s`` gives the origin in
seconds since the epoch). Every event is written with ``ts`` first: Perfetto's tokenizer
looks for it before it parses the rest of the event.

Layout (``pid`` and ``tid`` are small synthetic numbers, unique in the file; names come
from ``process_name``/``thread_name`` metadata events):

* one process per query, ``shoal query N``: a ``dispatch loop`` thread (the ``query``
  slice, with the driver's steps nested in it), one thread per stage (a slice from the
  stage's first task start to its last task end, with a flow arrow to each task), and
  the query's counters;
* one process per node, ``node <id>``, with a thread per worker process (the local runner:
  per worker thread), holding one slice per task, measured on the worker.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from shoal.tracing.events import (
    CounterSample,
    LoopSpan,
    QueryFinished,
    QueryPlanned,
    QueryStarted,
    StageFinished,
    TaskDispatched,
    TaskFailed,
    TaskFinished,
    TraceEvent,
)

CLOCK_NOTE = (
    "Timestamps are time.time() of the machine that measured them (the driver for the "
    "dispatch loop and counters, the worker for tasks), in microseconds since "
    "origin_unix_s. Traces across machines rely on NTP to align their clocks."
)


@dataclass
class _QueryTracks:
    number: int
    pid: int
    loop_tid: int
    stage_tids: dict[int, int] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


class ChromeTraceWriter:
    """A sink that streams events of any number of queries into one JSON file at ``path``.

    Thread-safe: concurrent queries may share a writer. :meth:`close` writes the tail
    (metadata: each query's config digest and non-default settings) and closes the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: IO[str] = _open_private(self.path)
        self._file.write('{"traceEvents":[\n')
        self._sep = ""
        self._lock = threading.Lock()
        self._origin: float | None = None
        self._ids = itertools.count(1)
        self._flow_ids = itertools.count(1)
        self._nodes: dict[str, int] = {}
        self._workers: dict[tuple[str, int, int], int] = {}
        self._queries: dict[int, _QueryTracks] = {}
        self._meta: list[dict[str, Any]] = []
        self._counter_heads: dict[str, tuple[str, str]] = {}
        self._closed = False

    @property
    def files(self) -> list[Path]:
        """The file this writer writes."""
        return [self.path]

    # -- events -------------------------------------------------------------------------

    def handle(self, event: TraceEvent) -> None:
        """Write ``event`` (events of a query the writer never saw start are ignored)."""
        with self._lock:
            if self._closed:
                return
            if isinstance(event, QueryStarted):
                self._query_started(event)
                return
            q = self._queries.get(event.query_id)
            if q is None:
                return
            if isinstance(event, LoopSpan):
                if event.name == "adaptive plan":  # the stage runs another number of tasks
                    change = event.args["tasks"] - event.args["tasks_planned"]
                    q.meta["tasks"] = q.meta.get("tasks", 0) + change
                self._slice(
                    event.start,
                    event.end,
                    event.name,
                    "driver",
                    q.pid,
                    q.loop_tid,
                    dict(event.args),
                )
            elif isinstance(event, TaskFinished):
                self._task(event, q)
            elif isinstance(event, StageFinished):
                self._stage(event, q)
            elif isinstance(event, CounterSample):
                self._counter(event, q)
            elif isinstance(event, QueryPlanned):
                self._query_planned(event, q)
            elif isinstance(event, TaskFailed):
                self._write(
                    {
                        "ts": self._us(event.ts),
                        "ph": "i",
                        "s": "t",
                        "name": "task failed",
                        "cat": "driver",
                        "pid": q.pid,
                        "tid": q.loop_tid,
                        "args": {
                            "stage": event.stage,
                            "partition": event.partition,
                            "error": event.error,
                        },
                    }
                )
            elif isinstance(event, QueryFinished):
                self._query_finished(event, q)
            elif isinstance(event, TaskDispatched):
                pass  # shown through the "tasks in flight" counter

    def close(self) -> None:
        """Write the metadata and close the file (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            meta = {
                "shoal": {
                    "origin_unix_s": self._origin,
                    "time_unit": "us",
                    "clock": CLOCK_NOTE,
                    "queries": self._meta,
                }
            }
            self._file.write("\n],\n" + '"metadata":' + json.dumps(meta, default=repr) + "}\n")
            self._file.close()

    # -- one handler per event kind -------------------------------------------------------

    def _query_started(self, ev: QueryStarted) -> None:
        if self._origin is None:
            self._origin = ev.ts
        number = len(self._meta) + 1
        q = _QueryTracks(number, next(self._ids), next(self._ids))
        q.meta = {
            "query": number,
            "query_id": ev.query_id,
            "runner": ev.runner,
            "config_digest": ev.config_digest,
            "settings": dict(ev.settings),
            "start_unix_s": ev.ts,
        }
        self._queries[ev.query_id] = q
        self._meta.append(q.meta)
        self._name("process_name", q.pid, q.pid, f"shoal query {number}", number)
        self._name("thread_name", q.pid, q.loop_tid, "dispatch loop", 0)

    def _query_planned(self, ev: QueryPlanned, q: _QueryTracks) -> None:
        q.meta.update(
            cpus=ev.cpus,
            task_cpus=ev.task_cpus,
            max_in_flight=ev.max_in_flight,
            stages=len(ev.stages),
            tasks=sum(s.num_tasks for s in ev.stages),
        )
        for st in ev.stages:
            tid = next(self._ids)
            q.stage_tids[st.id] = tid
            self._name("thread_name", q.pid, tid, f"stage {st.id}: {st.name}", st.id + 1)

    def _task(self, ev: TaskFinished, q: _QueryTracks) -> None:
        pid, tid = self._worker_track(ev.node_id, ev.pid, ev.thread)
        args = {
            "query": q.number,
            "stage": ev.stage,
            "partition": ev.partition,
            "operators": list(ev.operators),
            "rows_in": ev.rows_in,
            "rows_out": ev.rows_out,
            "bytes_out": ev.bytes_out,
            "cpus": ev.cpus,
            "gpus": ev.gpus,
            "memory_bytes": ev.memory_bytes,
            "config_digest": ev.config_digest,
            "queued_ms": round((ev.start - ev.dispatched) * 1e3, 3),
            "result_wait_ms": round((ev.collected - ev.end) * 1e3, 3),
            "node_id": ev.node_id,
            "worker_pid": ev.pid,
        }
        if ev.early:  # queued_ms includes the wait for its inputs
            args["started_early"] = True
        self._slice(ev.start, ev.end, f"stage {ev.stage}: {ev.stage_name}", "task", pid, tid, args)

    def _stage(self, ev: StageFinished, q: _QueryTracks) -> None:
        stage_tid = q.stage_tids.get(ev.stage)
        if stage_tid is None:  # pragma: no cover - a stage that was never planned
            return
        args = {
            "query": q.number,
            "stage": ev.stage,
            "tasks": len(ev.tasks),
            "complete": ev.complete,
            "rows_in": sum(t.rows_in for t in ev.tasks),
            "rows_out": sum(t.rows_out for t in ev.tasks),
            "bytes_out": sum(t.bytes_out for t in ev.tasks),
            "operators": list(ev.tasks[0].operators) if ev.tasks else [],
        }
        self._slice(
            ev.start, ev.end, f"stage {ev.stage}: {ev.name}", "stage", q.pid, stage_tid, args
        )
        # One arrow per task, from the stage slice to the task slice, both bound at the
        # task's midpoint (inside both slices, so Perfetto binds each end unambiguously).
        # (Written by hand: these are the most numerous events, with fixed shapes.)
        for t in ev.tasks:
            pid, tid = self._worker_track(t.node_id, t.pid, t.thread)
            mid = self._us((t.start + t.end) / 2)
            flow = next(self._flow_ids)
            self._write_raw(
                f'{{"ts":{mid!r},"ph":"s","id":{flow},"name":"launch","cat":"launch",'
                f'"pid":{q.pid},"tid":{stage_tid}}}'
            )
            self._write_raw(
                f'{{"ts":{mid!r},"ph":"f","bp":"e","id":{flow},"name":"launch",'
                f'"cat":"launch","pid":{pid},"tid":{tid}}}'
            )

    def _counter(self, ev: CounterSample, q: _QueryTracks) -> None:
        # Perfetto names a counter track "<name> <arg key>": split "tasks in flight" into
        # name "tasks" and key "in flight" so other viewers group related series.
        head = self._counter_heads.get(ev.name)
        if head is None:
            group, _, series = ev.name.partition(" ")
            head = self._counter_heads[ev.name] = (json.dumps(group), json.dumps(series))
        value = ev.value if isinstance(ev.value, int) else float(ev.value)
        self._write_raw(
            f'{{"ts":{self._us(ev.ts)!r},"ph":"C","name":{head[0]},"pid":{q.pid},'
            f'"tid":{q.pid},"args":{{{head[1]}:{value!r}}}}}'
        )

    def _query_finished(self, ev: QueryFinished, q: _QueryTracks) -> None:
        q.meta.update(end_unix_s=ev.end, error=ev.error)
        args = {k: v for k, v in q.meta.items() if k not in ("start_unix_s", "end_unix_s")}
        self._slice(ev.start, ev.end, "query", "driver", q.pid, q.loop_tid, args)
        del self._queries[ev.query_id]
        self._file.flush()

    # -- helpers ------------------------------------------------------------------------

    def _worker_track(self, node_id: str, pid: int, thread: int) -> tuple[int, int]:
        node = self._nodes.get(node_id)
        if node is None:
            node = self._nodes[node_id] = next(self._ids)
            label = node_id if len(node_id) <= 12 else node_id[:12]
            self._name("process_name", node, node, f"node {label}", 1000 + len(self._nodes))
        key = (node_id, pid, thread)
        tid = self._workers.get(key)
        if tid is None:
            tid = self._workers[key] = next(self._ids)
            name = f"worker pid {pid}" if thread in (pid, 0) else f"pid {pid} thread {thread}"
            self._name("thread_name", node, tid, name, len(self._workers))
        return node, tid

    def _us(self, t: float) -> float:
        assert self._origin is not None
        return round((t - self._origin) * 1e6, 3)

    def _slice(
        self,
        start: float,
        end: float,
        name: str,
        cat: str,
        pid: int,
        tid: int,
        args: dict[str, Any],
    ) -> None:
        ts = self._us(start)
        dur = max(0.0, round(self._us(end) - ts, 3))
        self._write(
            {
                "ts": ts,
                "ph": "X",
                "dur": dur,
                "name": name,
                "cat": cat,
                "pid": pid,
                "tid": tid,
                "args": args,
            }
        )

    def _name(self, kind: str, pid: int, tid: int, name: str, sort_index: int) -> None:
        self._write(
            {"ts": 0, "ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}
        )
        sort = "process_sort_index" if kind == "process_name" else "thread_sort_index"
        self._write(
            {
                "ts": 0,
                "ph": "M",
                "name": sort,
                "pid": pid,
                "tid": tid,
                "args": {"sort_index": sort_index},
            }
        )

    def _write(self, event: dict[str, Any]) -> None:
        self._write_raw(json.dumps(event, separators=(",", ":"), default=repr))

    def _write_raw(self, text: str) -> None:
        self._file.write(self._sep + text)
        self._sep = ",\n"


class PerQuerySink:
    """A sink that writes one file per query.

    ``directory=True``: ``target/shoal-<local time>-<pid>-q<query id>.json``, one per
    query. ``directory=False``: ``target`` itself, rewritten by every query (written to a
    temporary name and renamed when the query ends, so the file is always whole).
    """

    def __init__(self, target: str | os.PathLike[str], directory: bool) -> None:
        self.target = Path(target)
        self.directory = directory
        self.files: list[Path] = []
        self._writers: dict[int, tuple[ChromeTraceWriter, Path]] = {}
        self._lock = threading.Lock()

    def handle(self, event: TraceEvent) -> None:
        """Route ``event`` to its query's writer, opening it at the query's start."""
        if isinstance(event, QueryStarted):
            if self.directory:
                _make_directory_target(self.target)
            final = self._path_for(event)
            tmp = (
                final
                if self.directory
                else final.with_name(f".{final.name}.{os.getpid()}-{event.query_id}.tmp")
            )
            writer = ChromeTraceWriter(tmp)
            with self._lock:
                self._writers[event.query_id] = (writer, final)
        with self._lock:
            entry = self._writers.get(event.query_id)
        if entry is None:
            return
        writer, final = entry
        writer.handle(event)
        if isinstance(event, QueryFinished):
            with self._lock:
                del self._writers[event.query_id]
            self._finish(writer, final)

    def close(self) -> None:
        """Close the files of queries still running (their traces end here)."""
        with self._lock:
            entries = list(self._writers.values())
            self._writers.clear()
        for writer, final in entries:
            self._finish(writer, final)

    def _finish(self, writer: ChromeTraceWriter, final: Path) -> None:
        writer.close()
        if writer.path != final:
            os.replace(writer.path, final)
        with self._lock:
            self.files.append(final)

    def _path_for(self, ev: QueryStarted) -> Path:
        if not self.directory:
            return self.target
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(ev.ts))
        return self.target / f"shoal-{stamp}-{os.getpid()}-q{ev.query_id}.json"


def _open_private(path: Path) -> IO[str]:
    """Open ``path`` for writing with mode 0600 (a trace names the user's tables, columns
    and files), truncating it. Its directory must exist: shoal never creates directories
    the user did not name. Raises :class:`FileNotFoundError` naming the path."""
    _check_file_target(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    return open(fd, "w", encoding="utf-8")  # noqa: SIM115


def _check_file_target(path: Path) -> None:
    """Raise :class:`FileNotFoundError` before the query runs when the trace file's
    directory does not exist."""
    if not path.parent.is_dir():
        raise FileNotFoundError(
            f"shoal trace target {str(path)!r}: the directory {str(path.parent)!r} does not "
            "exist (shoal creates the trace file, not its directories)"
        )


def _make_directory_target(path: str | os.PathLike[str]) -> None:
    """Create the directory a trace target names (mode 0700), but not its parents."""
    target = Path(path)
    if target.is_dir():
        return
    if not target.parent.is_dir():
        raise FileNotFoundError(
            f"shoal trace target {os.fspath(path)!r}: its parent directory "
            f"{str(target.parent)!r} does not exist (shoal creates the directory it is "
            "given, not the ones above it)"
        )
    target.mkdir(mode=0o700, exist_ok=True)


def is_directory_target(path: str | os.PathLike[str]) -> bool:
    """A trace target names a directory when it is one, or when it ends with a separator."""
    text = os.fspath(path)
    return Path(text).is_dir() or text.endswith(("/", os.sep))


def open_target(path: str | os.PathLike[str]) -> ChromeTraceWriter | PerQuerySink:
    """The sink of a ``shoal.trace(path)`` block: one file for every query of the block,
    or one file per query when ``path`` is a directory (created if missing)."""
    if is_directory_target(path):
        _make_directory_target(path)
        return PerQuerySink(path, directory=True)
    return ChromeTraceWriter(path)


def config_target(path: str) -> PerQuerySink:
    """The sink of ``Config.trace`` / ``SHOAL_TRACE`` for one query: a directory gets a
    file per query; a file is rewritten by each query. Files are written 0600; the named
    directory is created (0700) when the query starts, never its parents. A target that
    cannot be written costs the trace, not the query (the tracer logs a warning)."""
    return PerQuerySink(path, directory=is_directory_target(path))
