"""Tracing: the Chrome trace-event JSON of real queries on the Ray runner, checked by
parsing it; the live listener hook; free when off; one file per query for a directory."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import shoal
from shoal import tracing
from shoal.config import Config
from shoal.errors import TaskError
from shoal.planner.physical import plan_physical
from shoal.runners.dispatch import DispatchLoop
from shoal.runners.session import QueryReport, last_query
from shoal.tpch.queries import QUERIES, scan_tables
from shoal.tracing import events as ev
from shoal.tracing.tracer import QueryTracer, Span, start_query

from .conftest import SMALL_PARTITION_BYTES
from .irplans import agg_sort_plan, frame
from .test_dispatch import FakeBackend

pytestmark = pytest.mark.usefixtures("ray_runner")

EPS_US = 0.01  # timestamps are written with 3 decimals (ns); allow rounding


# -- helpers: read a trace the way Perfetto does --------------------------------------------


def _frame(table: Any) -> pl.DataFrame:
    df = pl.from_arrow(table)
    assert isinstance(df, pl.DataFrame)
    return df


def _load(path: Path) -> dict[str, Any]:
    text = path.read_text()
    data = json.loads(text)
    assert set(data) <= {"traceEvents", "metadata"}  # keys Perfetto's tokenizer accepts
    for e in data["traceEvents"]:
        assert next(iter(e)) == "ts", e  # Perfetto looks for ts before anything else
    return data


def _slices(events: list[dict[str, Any]]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """Complete ('X') slices per (pid, tid) track, sorted as Perfetto sorts them: by
    start, then the longer (enclosing) slice first."""
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            tracks[(e["pid"], e["tid"])].append(e)
    for sl in tracks.values():
        sl.sort(key=lambda e: (e["ts"], -e["dur"]))
    return tracks


def _check_nesting(tracks: dict[tuple[int, int], list[dict[str, Any]]]) -> None:
    """On every track, slices are properly nested or disjoint."""
    for key, sl in tracks.items():
        stack: list[float] = []  # end times of open slices
        last_ts = float("-inf")
        for e in sl:
            assert e["ts"] >= last_ts, key
            last_ts = e["ts"]
            start, end = e["ts"], e["ts"] + e["dur"]
            while stack and stack[-1] <= start + EPS_US:
                stack.pop()
            if stack:
                assert end <= stack[-1] + EPS_US, f"{key}: {e['name']} overlaps its parent"
            stack.append(end)


def _within(ts: float, e: dict[str, Any]) -> bool:
    return e["ts"] - EPS_US <= ts <= e["ts"] + e["dur"] + EPS_US


def _check_trace(data: dict[str, Any], report: QueryReport, config: Config) -> None:
    """Every structural property a trace of one query must have."""
    events = data["traceEvents"]
    meta = data["metadata"]["shoal"]
    origin = meta["origin_unix_s"]
    (qmeta,) = meta["queries"]
    assert qmeta["config_digest"] == config.digest()
    assert qmeta["settings"] == {k: v for k, v in config.non_defaults().items()}
    assert qmeta["error"] is None
    assert all(e["ts"] >= 0 for e in events)

    # Names: every track and process used is named.
    named_threads = {(e["pid"], e["tid"]) for e in events if e["name"] == "thread_name"}
    named_procs = {e["pid"] for e in events if e["name"] == "process_name"}
    for e in events:
        if e["ph"] in ("X", "s", "f"):
            assert (e["pid"], e["tid"]) in named_threads, e
        if e["ph"] != "M":
            assert e["pid"] in named_procs, e

    tracks = _slices(events)
    _check_nesting(tracks)

    # One slice per dispatched task, with the worker's own times and the task's facts.
    tasks = [e for e in events if e["ph"] == "X" and e["cat"] == "task"]
    keys = Counter((e["args"]["stage"], e["args"]["partition"]) for e in tasks)
    assert set(keys) == set(report.task_stats)
    assert set(keys.values()) == {1}
    digest = config.digest()
    for e in tasks:
        a = e["args"]
        stats = report.task_stats[(a["stage"], a["partition"])]
        assert abs(e["ts"] - (stats.start - origin) * 1e6) < 1
        assert abs(e["dur"] - (stats.end - stats.start) * 1e6) < 1
        assert (a["rows_in"], a["rows_out"], a["bytes_out"]) == (
            stats.rows_in,
            stats.rows_out,
            stats.bytes_out,
        )
        assert a["operators"] == report.physical.stage(a["stage"]).operators
        assert a["config_digest"] == digest == stats.config_digest
        assert (a["cpus"], a["gpus"], a["memory_bytes"]) == (config.task_cpus, 0, 0)
        assert a["worker_pid"] == stats.pid
    # Tasks ran in Ray worker processes: one track per worker, grouped under the node.
    assert all(s.pid != os.getpid() for s in report.task_stats.values())
    workers = {(s.node_id, s.pid) for s in report.task_stats.values()}
    assert len({(e["pid"], e["tid"]) for e in tasks}) == len(workers)
    assert len({e["pid"] for e in tasks}) == len({n for n, _ in workers})

    # The stages track: one slice per stage that covers each of its tasks.
    stages = {e["args"]["stage"]: e for e in events if e["ph"] == "X" and e["cat"] == "stage"}
    # (a stage adaptive execution left without work, e.g. a range split skipped for a
    # small sort, ran no task and has no slice)
    assert set(stages) == {st.id for st in report.physical.stages if st.num_tasks}
    for e in tasks:
        st = stages[e["args"]["stage"]]
        assert _within(e["ts"], st) and _within(e["ts"] + e["dur"], st)
    for sid, st in stages.items():
        mine = [t for t in tasks if t["args"]["stage"] == sid]
        assert abs(st["ts"] - min(t["ts"] for t in mine)) < EPS_US
        assert st["args"]["tasks"] == report.physical.stage(sid).num_tasks

    # Flow arrows: one per task, from inside its stage's slice to inside the task's slice.
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(ends) and len(starts) == len(tasks)
    for fid, s in starts.items():
        f = ends[fid]
        (src,) = [x for x in tracks[(s["pid"], s["tid"])] if _within(s["ts"], x)]
        (dst,) = [x for x in tracks[(f["pid"], f["tid"])] if _within(f["ts"], x)]
        assert src["cat"] == "stage" and dst["cat"] == "task"
        assert src["args"]["stage"] == dst["args"]["stage"]
        assert f.get("bp") == "e"

    # The dispatch loop: its steps nest in the query slice and dispatch every task.
    loop = [e for e in events if e["ph"] == "X" and e["cat"] == "driver"]
    (query,) = [e for e in loop if e["name"] == "query"]
    names = Counter(e["name"] for e in loop)
    assert {"plan", "construct dispatch batch", "dispatch", "await", "fetch result"} <= set(names)
    assert all(_within(e["ts"], query) and _within(e["ts"] + e["dur"], query) for e in loop)
    assert sum(e["args"]["tasks"] for e in loop if e["name"] == "dispatch") == len(tasks)
    assert sum(e["args"]["tasks"] for e in loop if e["name"] == "await") == len(tasks)

    # Counters: never negative; in flight and the object store estimate end at 0.
    counters: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "C":
            ((series, value),) = e["args"].items()
            counters[f"{e['name']} {series}"].append((e["ts"], value))
    assert set(counters) == {
        "tasks in flight",
        "tasks running",
        "CPUs free",
        "rows produced",
        "object store bytes",
        "bytes held",
    }
    for name, samples in counters.items():
        samples.sort(key=lambda s: s[0])  # Perfetto's order: by time, stable
        assert all(v >= 0 for _, v in samples), name
        assert [t for t, _ in samples] == sorted(t for t, _ in samples)
    for name in ("tasks in flight", "tasks running", "object store bytes", "bytes held"):
        assert counters[name][-1][1] == 0, name
    assert max(v for _, v in counters["bytes held"]) == report.memory.peak_bytes_held
    assert counters["rows produced"][-1][1] == sum(s.rows_out for s in report.task_stats.values())
    assert max(v for _, v in counters["tasks running"]) <= qmeta["cpus"]
    assert max(v for _, v in counters["object store bytes"]) > 0


# -- a traced TPC-H query on Ray ----------------------------------------------------------


@pytest.fixture(scope="module")
def q5_trace(tpch_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """TPC-H Q5 (joins, two-phase aggregation, sort) through the Polars engine on Ray,
    traced with ``shoal.trace``."""
    config = shoal.Config(target_partition_bytes=SMALL_PARTITION_BYTES)
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, config=config)
    lf = QUERIES[5](scan_tables(tpch_dir))
    lf.collect(engine=engine)  # warm the workers so the traced run is typical
    path = tmp_path_factory.mktemp("trace") / "q5.json"
    with shoal.trace(path) as rec:
        got = lf.collect(engine=engine)
    report = last_query()
    assert report is not None and report.runner == "ray"
    assert rec.files == [path]
    return path, report, config.replace(runner="ray"), got, lf


def test_tpch_trace_is_a_well_formed_perfetto_trace(q5_trace):
    path, report, config, got, lf = q5_trace
    assert len(report.physical.stages) >= 4
    assert got.equals(lf.collect())
    _check_trace(_load(path), report, config)


def test_ir_plan_trace_on_ray(tmp_path: Path):
    plan, expected = agg_sort_plan(frame())
    config = shoal.Config(default_partitions=4, runner="ray")
    with shoal.trace(tmp_path / "agg.json"):
        got = shoal.execute(plan, runner="ray", config=config)
    assert _frame(got).equals(expected)
    report = last_query()
    assert report is not None
    _check_trace(_load(tmp_path / "agg.json"), report, config)


def test_one_block_records_every_query_into_one_file(tmp_path: Path):
    plan, _ = agg_sort_plan(frame())
    config = shoal.Config(default_partitions=2, runner="ray")
    with shoal.trace(tmp_path / "two.json"):
        shoal.execute(plan, config=config)
        shoal.execute(plan, config=config)
    data = _load(tmp_path / "two.json")
    assert [q["query"] for q in data["metadata"]["shoal"]["queries"]] == [1, 2]
    queries = [e for e in data["traceEvents"] if e["ph"] == "X" and e["name"] == "query"]
    assert len(queries) == 2
    assert queries[0]["ts"] + queries[0]["dur"] <= queries[1]["ts"]
    _check_nesting(_slices(data["traceEvents"]))


# -- directories and the config setting -----------------------------------------------------


def test_shoal_trace_env_directory_gives_one_file_per_query(tmp_path, monkeypatch):
    out = tmp_path / "traces"
    monkeypatch.setenv("SHOAL_TRACE", f"{out}/")
    trace_dir = Config.from_env().trace
    assert trace_dir == f"{out}/"
    plan, _ = agg_sort_plan(frame())
    config = shoal.get_config().replace(trace=trace_dir, default_partitions=3, runner="ray")
    shoal.execute(plan, config=config)
    first = last_query()
    shoal.execute(plan, config=config.replace(default_partitions=2))
    second = last_query()
    files = sorted(out.glob("*.json"))
    assert len(files) == 2
    assert not list(out.glob(".*"))  # no temporary files left behind
    by_tasks = {}
    for f in files:
        data = _load(f)
        (q,) = data["metadata"]["shoal"]["queries"]
        by_tasks[q["tasks"]] = data
    assert first is not None and second is not None
    for report, cfg in ((first, config), (second, config.replace(default_partitions=2))):
        _check_trace(by_tasks[len(report.task_stats)], report, cfg)


def test_config_trace_file_holds_the_latest_query(tmp_path):
    path = tmp_path / "latest.json"
    plan, _ = agg_sort_plan(frame())
    config = shoal.Config(trace=str(path), default_partitions=2, runner="ray")
    shoal.execute(plan, config=config)
    shoal.execute(plan, config=config.replace(default_partitions=3))
    (q,) = _load(path)["metadata"]["shoal"]["queries"]
    assert q["settings"]["default_partitions"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json"]


def test_trace_block_with_a_directory(tmp_path):
    plan, _ = agg_sort_plan(frame())
    with shoal.trace(f"{tmp_path}/d/") as rec:
        shoal.execute(plan, config=shoal.Config(default_partitions=2, runner="ray"))
        shoal.execute(plan, config=shoal.Config(default_partitions=2, runner="ray"))
    assert len(rec.files) == 2 and all(f.parent == tmp_path / "d" for f in rec.files)
    for f in rec.files:
        assert len(_load(f)["metadata"]["shoal"]["queries"]) == 1


# -- listeners ------------------------------------------------------------------------------


def test_listener_receives_the_same_events_live(caplog):
    seen: list[ev.TraceEvent] = []
    calls = 0

    def broken(event: ev.TraceEvent) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("listener bug")

    plan, expected = agg_sort_plan(frame())
    tracing.add_listener(seen.append)
    tracing.add_listener(broken)
    try:
        with caplog.at_level(logging.WARNING, logger="shoal.tracing"):
            got = shoal.execute(plan, config=shoal.Config(default_partitions=4, runner="ray"))
    finally:
        tracing.remove_listener(seen.append)
        tracing.remove_listener(broken)
    assert _frame(got).equals(expected)  # the broken listener broke nothing
    assert calls == len(seen) > 10  # and it kept receiving events
    reports = [r for r in caplog.records if r.name == "shoal.tracing"]
    assert len(reports) == 1 and "listener" in reports[0].getMessage()  # reported once

    report = last_query()
    assert report is not None
    assert isinstance(seen[0], ev.QueryStarted) and isinstance(seen[-1], ev.QueryFinished)
    assert seen[-1].error is None
    finished = [e for e in seen if isinstance(e, ev.TaskFinished)]
    assert {(e.stage, e.partition) for e in finished} == set(report.task_stats)
    assert len(finished) == len(report.task_stats)
    for e in finished:
        stats = report.task_stats[(e.stage, e.partition)]
        assert (e.start, e.end, e.pid, e.node_id) == (
            stats.start,
            stats.end,
            stats.pid,
            stats.node_id,
        )
        assert e.dispatched <= e.collected and e.start <= e.end
    dispatched = [e for e in seen if isinstance(e, ev.TaskDispatched)]
    assert len(dispatched) == len(finished)
    # Live: each task's TaskFinished comes after its dispatch, stages finish in order.
    order = {
        (type(e).__name__, getattr(e, "stage", -1), getattr(e, "partition", -1)): i
        for i, e in enumerate(seen)
    }
    for e in finished:
        assert (
            order[("TaskDispatched", e.stage, e.partition)]
            < order[("TaskFinished", e.stage, e.partition)]
        )
    stages = [e for e in seen if isinstance(e, ev.StageFinished)]
    assert [s.stage for s in stages] == [st.id for st in report.physical.stages if st.num_tasks]
    assert all(s.complete for s in stages)
    spans = {e.name for e in seen if isinstance(e, ev.LoopSpan)}
    assert {"construct dispatch batch", "dispatch", "await"} <= spans

    # Removed listeners receive nothing, and with nothing registered tracing is off.
    n = len(seen)
    shoal.execute(plan, config=shoal.Config(default_partitions=4, runner="ray"))
    assert len(seen) == n and calls == n


# -- free when off --------------------------------------------------------------------------


def test_free_when_off(monkeypatch):
    """With tracing off, a Ray query makes no call into the tracer, builds no event and
    writes nothing."""
    calls: Counter[str] = Counter()

    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    for cls in (QueryTracer, Span, tracing.ChromeTraceWriter):
        for name, fn in list(vars(cls).items()):
            if callable(fn) and (not name.startswith("__") or name in ("__init__", "__enter__")):
                monkeypatch.setattr(cls, name, counting(f"{cls.__name__}.{name}", fn))
    for event_cls in (
        ev.QueryStarted,
        ev.LoopSpan,
        ev.TaskDispatched,
        ev.TaskFinished,
        ev.CounterSample,
        ev.StageFinished,
        ev.QueryFinished,
    ):
        monkeypatch.setattr(event_cls, "__init__", counting(event_cls.__name__, event_cls.__init__))

    config = shoal.Config(default_partitions=4, runner="ray")
    assert config.trace is None and start_query(config) is None
    plan, expected = agg_sort_plan(frame())
    got = shoal.execute(plan, config=config)
    assert _frame(got).equals(expected)
    report = last_query()
    assert report is not None and len(report.task_stats) > 4
    assert calls == Counter(), calls


# -- a failing task, against the fake backend (no cluster) ----------------------------------


def test_a_failed_task_is_in_the_trace(tmp_path):
    plan, _ = agg_sort_plan(frame())
    config = Config(runner="local", target_partition_bytes=800)
    physical = plan_physical(plan, config)
    seen: list[ev.TraceEvent] = []
    writer = tracing.ChromeTraceWriter(tmp_path / "failed.json")
    tracer = QueryTracer(1, config, [writer])
    tracing.add_listener(seen.append)
    try:
        with pytest.raises(TaskError), tracer:
            tracer.planned(physical, cpus=2, max_in_flight=50)
            backend = FakeBackend(0, fail=(0, 2))
            DispatchLoop(physical, backend, 50, None, tracer).run()  # type: ignore[arg-type]
    finally:
        tracing.remove_listener(seen.append)
    writer.close()
    data = _load(tmp_path / "failed.json")
    (failed,) = [e for e in data["traceEvents"] if e["name"] == "task failed"]
    assert (failed["args"]["stage"], failed["args"]["partition"]) == (0, 2)
    (q,) = data["metadata"]["shoal"]["queries"]
    # A TaskError that is also of the task's error class (shoal.errors.task_error).
    assert q["error"].startswith("TaskError[ValueError]: task failed in stage 0")
    assert isinstance(seen[-1], ev.QueryFinished) and seen[-1].error is not None
    final: dict[str, float] = {}
    for e in sorted((e for e in data["traceEvents"] if e["ph"] == "C"), key=lambda e: e["ts"]):
        ((series, value),) = e["args"].items()
        assert value >= 0
        final[f"{e['name']} {series}"] = value
    assert final["tasks in flight"] == 0 and final["object store bytes"] == 0
    _check_nesting(_slices(data["traceEvents"]))


def test_local_runner_tasks_get_one_track_per_thread(tmp_path):
    plan, _ = agg_sort_plan(frame())
    config = shoal.Config(runner="local", default_partitions=4)
    with shoal.trace(tmp_path / "local.json"):
        shoal.execute(plan, config=config)
    data = _load(tmp_path / "local.json")
    report = last_query()
    assert report is not None
    threads = {s.thread for s in report.task_stats.values()}
    tasks = [e for e in data["traceEvents"] if e["ph"] == "X" and e["cat"] == "task"]
    assert len({(e["pid"], e["tid"]) for e in tasks}) == len(threads)
    _check_nesting(_slices(data["traceEvents"]))


def test_trace_is_a_context_manager_and_reports_a_bad_path(tmp_path):
    rec = shoal.trace(tmp_path / "x.json")
    assert isinstance(rec, tracing.TraceRecording)
    with rec, pytest.raises(RuntimeError, match="already open"):
        rec.__enter__()
    assert _load(tmp_path / "x.json")["metadata"]["shoal"]["queries"] == []
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError), shoal.trace(tmp_path / "file" / "x.json"):
        pass


def test_events_are_plain_frozen_dataclasses():
    e = ev.CounterSample(1, 0.0, "tasks in flight", 2)
    with pytest.raises(AttributeError):
        e.value = 3  # type: ignore[misc]


def test_an_unwritable_config_trace_never_breaks_the_query(tmp_path, caplog):
    (tmp_path / "file").write_text("")
    plan, expected = agg_sort_plan(frame())
    config = shoal.Config(trace=str(tmp_path / "file" / "x.json"), default_partitions=2)
    with caplog.at_level(logging.WARNING, logger="shoal.tracing"):
        got = shoal.execute(plan, runner="ray", config=config)
    assert _frame(got).equals(expected)
    assert any("writing the trace" in r.getMessage() for r in caplog.records)


def test_trace_files_are_private_and_no_parent_directory_is_created(tmp_path):
    """Issue 19: trace files are 0600 and SHOAL_TRACE creates only the directory it names."""
    plan, expected = agg_sort_plan(frame())
    out = tmp_path / "traces"
    config = shoal.Config(trace=str(out) + "/", default_partitions=2)
    got = shoal.execute(plan, runner="local", config=config)
    assert _frame(got).equals(expected)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    files = list(out.glob("*.json"))
    assert files and all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    # an existing world-readable file is made private when shoal rewrites it
    single = tmp_path / "one.json"
    single.write_text("")
    single.chmod(0o644)
    with shoal.trace(single):
        shoal.execute(plan, runner="local", config=shoal.Config(default_partitions=2))
    assert stat.S_IMODE(single.stat().st_mode) == 0o600
    # a directory target two levels below an existing one is not created, nor its parent
    deep = tmp_path / "missing" / "traces"
    with pytest.raises(FileNotFoundError, match="missing"), shoal.trace(str(deep) + "/"):
        pass
    assert not (tmp_path / "missing").exists()
    config = shoal.Config(trace=str(deep) + "/", default_partitions=2)
    got = shoal.execute(plan, runner="local", config=config)  # the trace is lost, not the query
    assert _frame(got).equals(expected)
    assert not (tmp_path / "missing").exists()
