"""Memory controls of the dispatch loop: the ledger of bytes held, backpressure on tasks
that only add bytes, and splitting a skewed hash-join task into subtasks.

Each query is checked against native Polars on data split into several partitions, with
nulls, NaN, duplicate keys and an empty partition; the loop's rules are checked against a
fake backend (no cluster), the answers on the local and the Ray runner.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import shoal
from shoal.config import Config
from shoal.planner.physical import PhysicalPlan, plan_physical
from shoal.runners.dispatch import DispatchLoop, TaskSpec
from shoal.runners.memory import ByteLedger, readers
from shoal.runners.session import last_query
from shoal.runners.skew import group_pieces, split_sides
from shoal.tracing import progress
from shoal_polars.engine import to_ir

from .test_dispatch import FakeBackend

SKEWED_KEY = 1


def _facts(rows: int, seed: int) -> pl.DataFrame:
    """A probe side where key 1 holds about 80% of the rows; some keys are null, some
    values NaN, and every key repeats."""
    keys = [
        None if i % 17 == 0 else (SKEWED_KEY if i % 5 else (i * 7 + seed) % 23) for i in range(rows)
    ]
    vals = [float("nan") if i % 13 == 0 else float(i % 101) for i in range(rows)]
    return pl.DataFrame({"k": keys, "v": vals, "tag": [f"t{i % 9}" for i in range(rows)]})


def _dims() -> pl.DataFrame:
    """A build side: keys 0..29 (key 1 twice, so its matches double), and a null key."""
    keys = [*range(30), SKEWED_KEY, None]
    return pl.DataFrame({"k": keys, "name": [f"n{i}" for i in range(len(keys))]})


def _write(df: pl.DataFrame, root: Path, name: str, parts: int) -> pl.LazyFrame:
    """``df`` as ``parts`` Parquet files plus an empty one under ``root/name``."""
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    step = -(-df.height // parts)
    for i in range(parts):
        df.slice(i * step, step).write_parquet(d / f"{name}.{i}.parquet")
    df.clear().write_parquet(d / f"{name}.empty.parquet")
    return pl.scan_parquet(d / "*.parquet")


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pl.LazyFrame]:
    root = tmp_path_factory.mktemp("skew")
    return {
        "facts": _write(_facts(3000, 0), root, "facts", 5),
        "other": _write(_facts(1200, 3), root, "other", 3),
        "dims": _write(_dims(), root, "dims", 2),
    }


# -- the fake backend: the loop's rules -------------------------------------------------------


class WatchedBackend(FakeBackend):
    """A fake backend that records, for every task submitted, the loop's ledger then."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.loop: DispatchLoop | None = None
        self.dispatches: list[dict[str, Any]] = []

    def submit(self, task: TaskSpec) -> int:
        loop = self.loop
        assert loop is not None
        st = loop.states[task.stage.id]
        self.dispatches.append(
            {
                "held": loop.ledger.held,
                "in_flight": len(loop.in_flight),
                "releases": st.releases,
                "stage": task.stage.id,
            }
        )
        return super().submit(task)

    def result(self, handle: int) -> Any:
        res = super().result(handle)
        assert self.loop is not None
        self.max_output = max(getattr(self, "max_output", 0), res.stats.bytes_out)
        return res


def _run_fake(
    physical: PhysicalPlan, seed: int, in_flight: int, **limits: Any
) -> tuple[pl.DataFrame, DispatchLoop, WatchedBackend]:
    backend = WatchedBackend(seed)
    loop = DispatchLoop(physical, backend, in_flight, **limits)
    backend.loop = loop
    refs = loop.run()
    got = pl.from_arrow(pa.concat_tables(refs))
    assert isinstance(got, pl.DataFrame)
    return got, loop, backend


def _three_scans(tables: dict[str, pl.LazyFrame]) -> tuple[PhysicalPlan, pl.LazyFrame]:
    """(facts semi-join some dims) joined with other: three independent scan stages; the
    third (other) is not needed until the first join, which keeps few rows, is done."""
    lf = (
        tables["facts"]
        .join(tables["dims"].filter(pl.col("k") >= 10), on="k", how="semi")
        .join(tables["other"].select("k", pl.col("v").alias("w")), on="k", how="inner")
        .group_by("k", "tag")
        .agg(pl.col("v").sum(), pl.col("w").max(), pl.len())
    )
    cfg = Config(
        runner="local",
        target_partition_bytes=4096,
        broadcast_join_threshold_bytes=0,
        shuffle_partitions=3,
    )
    return plan_physical(to_ir(lf), cfg), lf


def _same(got: pl.DataFrame, lf: pl.LazyFrame) -> None:
    assert_frame_equal(got, lf.collect(), check_row_order=False, check_dtypes=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("in_flight", [1, 50])
def test_backpressure_bounds_the_bytes_held(tables, seed, in_flight):
    physical, lf = _three_scans(tables)
    # Without a limit, and every task allowed in flight: all three scans run at once.
    free_got, free, free_backend = _run_fake(physical, seed, 50)
    _same(free_got, lf)
    (join1,) = [s for s in physical.stages if s.inputs and s.inputs[0].stage == 0]
    first_inputs = {i.stage for i in join1.inputs}
    needed = sum(st.bytes_out for (s, _), st in free.task_stats.items() if s in first_inputs)
    # The first join's inputs must all be held at once (stage barrier): that is the floor.
    limit = needed + free_backend.max_output
    got, loop, backend = _run_fake(physical, seed, in_flight, max_bytes_held=limit)
    _same(got, lf)
    report = loop.memory_report()
    assert report.max_bytes_held == limit and report.forced == 0
    assert report.peak_bytes_held <= limit + backend.max_output
    assert report.peak_bytes_held < free.ledger.peak
    if in_flight > 1:
        assert report.held_back > 0
    # Producers started only under the limit.
    assert all(d["releases"] or d["held"] < limit for d in backend.dispatches)
    # Nothing is held once the result is handed over, and every reference was dropped.
    assert loop.ledger.held == 0
    for st in loop.states:
        assert all(refs == [] for outs in st.outputs.values() for refs in outs)


def test_a_tiny_limit_still_completes_one_task_at_a_time(tables):
    physical, lf = _three_scans(tables)
    got, loop, backend = _run_fake(physical, 0, 8, max_bytes_held=1)
    _same(got, lf)
    assert loop.memory_report().forced > 0
    assert loop.ledger.held == 0
    # Over the limit, a task that only adds bytes started only with nothing in flight.
    over = [d for d in backend.dispatches if not d["releases"] and d["held"] >= 1]
    assert over and all(d["in_flight"] == 0 for d in over)


def test_ledger_counts_readers_and_releases_at_the_last():
    led = ByteLedger(limit=100)
    led.produced((0, 0, 0), 60, readers=2)
    led.produced((0, 0, 0), 10, readers=2)  # a second subtask of the same partition
    led.produced((0, 1, 0), 50, readers=1)
    assert (led.held, led.peak, led.over) == (120, 120, True)
    assert not led.read((0, 0, 0))
    assert led.read((0, 0, 0)) and led.held == 50
    led.add_readers((0, 1, 0), 1)
    assert not led.read((0, 1, 0)) and led.read((0, 1, 0))
    assert (led.held, led.peak, led.over) == (0, 120, False)


def test_readers_per_mode(tables):
    physical, _ = _three_scans(tables)
    for st in physical.stages:
        n = readers(physical, st.id)
        consumers = physical.consumers(st.id)
        if st is physical.root:
            assert n == 1
        else:
            assert n == sum(
                c.num_tasks if i.mode == "all" else 1
                for c in consumers
                for i in c.inputs
                if st.id in i.stages
            )


def test_group_pieces_keeps_order_and_room():
    assert group_pieces([5, 5, 5, 5], 10) == [[0, 1], [2, 3]]
    assert group_pieces([30, 1, 1], 10) == [[0], [1, 2]]
    assert group_pieces([1, 2], 100) == [[0, 1]]
    assert group_pieces([3, 3], 0) == [[0], [1]]


# -- splitting a skewed join task ---------------------------------------------------------------

JOINS = ["inner", "left", "semi", "anti", "right", "full"]


def _skewed_join(tables: dict[str, pl.LazyFrame], how: str) -> pl.LazyFrame:
    facts = tables["facts"]
    dims = tables["dims"]
    if how == "right":  # the skewed side is the right one
        return dims.join(facts, on="k", how="right")
    return facts.join(dims, on="k", how=how)  # type: ignore[arg-type]


def _split_config(runner: str = "local", **kw: Any) -> Config:
    settings: dict[str, Any] = {
        "target_partition_bytes": 4096,
        "broadcast_join_threshold_bytes": 0,
        "shuffle_partitions": 4,
        "max_task_input_bytes": 6000,
    }
    return Config(runner=runner, **{**settings, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("how", JOINS)
def test_skewed_bucket_splits_where_exact_fake(tables, how):
    lf = _skewed_join(tables, how)
    physical = plan_physical(to_ir(lf), _split_config())
    got, loop, _ = _run_fake(physical, 0, 4, max_task_input_bytes=6000)
    _same(got, lf)
    report = loop.memory_report()
    if how == "full":
        assert not report.splits
        assert report.not_split and all("full join" in why for _, _, why in report.not_split)
        return
    assert report.splits and max(report.splits.values()) > 1
    (sid, p), k = max(report.splits.items(), key=lambda kv: kv[1])
    assert loop.task_stats[(sid, p)].extra["subtasks"] == k
    assert sum(1 for s, q, _ in loop.subtask_stats if (s, q) == (sid, p)) == k
    assert loop.task_stats[(sid, p)].rows_out == sum(
        st.rows_out for (s, q, _), st in loop.subtask_stats.items() if (s, q) == (sid, p)
    )
    assert loop.ledger.held == 0


def test_split_sides_names_the_probe_side(tables):
    cfg = _split_config()
    for how, want in [("inner", (0, 1)), ("left", (0,)), ("anti", (0,)), ("right", (1,))]:
        physical = plan_physical(to_ir(_skewed_join(tables, how)), cfg)
        (stage,) = [s for s in physical.stages if [i.mode for i in s.inputs] == ["bucket"] * 2]
        got = split_sides(stage)
        assert not isinstance(got, str) and got[1] == want, how
    # A final aggregation after a shuffle is never split.
    agg = tables["facts"].group_by("k").agg(pl.col("v").sum())
    physical = plan_physical(to_ir(agg), cfg)
    final = [s for s in physical.stages if any(i.mode == "bucket" for i in s.inputs)]
    assert final and all(isinstance(split_sides(s), str) for s in final)


# -- the real runners ------------------------------------------------------------------------


def _dist(lf: pl.LazyFrame, config: Config) -> pl.DataFrame:
    engine = shoal.DistEngine(runner=config.runner, raise_on_fail=True, config=config)
    return lf.collect(engine=engine)


def _check_skew(tables: dict[str, pl.LazyFrame], runner: str, how: str) -> None:
    lf = _skewed_join(tables, how)
    got = _dist(lf, _split_config(runner))
    _same(got, lf)
    report = last_query()
    assert report is not None and report.memory is not None
    if how == "full":
        assert not report.memory.splits and report.memory.not_split
    else:
        assert max(report.memory.splits.values()) > 1
        split = [s for s in report.task_stats.values() if s.extra.get("subtasks", 1) > 1]
        assert split


def _check_backpressure(tables: dict[str, pl.LazyFrame], runner: str) -> None:
    _, lf = _three_scans(tables)
    cfg = _split_config(runner, max_bytes_held=20_000, shuffle_partitions=3)
    got = _dist(lf, cfg)
    _same(got, lf)
    report = last_query()
    assert report is not None and report.memory is not None
    assert report.memory.max_bytes_held == 20_000
    assert report.memory.held_back > 0 and report.memory.peak_bytes_held > 0


@pytest.mark.parametrize("how", JOINS)
def test_skewed_join_local(tables, how):
    _check_skew(tables, "local", how)


def test_a_full_join_is_not_split_and_says_why(tables, tmp_path, caplog):
    lf = _skewed_join(tables, "full")
    path = tmp_path / "full.json"
    with shoal.trace(path), caplog.at_level("INFO", logger="shoal"):
        _same(_dist(lf, _split_config()), lf)
    report = last_query()
    assert report is not None and report.memory is not None and report.memory.not_split
    events = json.loads(path.read_text())["traceEvents"]
    noted = [e["args"] for e in events if e.get("name") == "task not split"]
    assert [(a["stage"], a["partition"]) for a in noted] == [
        (s, p) for s, p, _ in report.memory.not_split
    ]
    assert all("full join" in a["reason"] and a["input_bytes"] > 6000 for a in noted)
    assert "runs as one task: full join" in caplog.text


def test_split_and_bytes_held_are_traced(tables, tmp_path):
    lf = _skewed_join(tables, "inner")
    path = tmp_path / "skew.json"
    with shoal.trace(path):
        got = _dist(lf, _split_config(max_bytes_held=30_000))
    _same(got, lf)
    report = last_query()
    assert report is not None and report.memory is not None
    events = json.loads(path.read_text())["traceEvents"]
    splits = [e["args"] for e in events if e.get("name") == "split task"]
    assert {(a["stage"], a["partition"]): a["subtasks"] for a in splits} == report.memory.splits
    held = sorted(
        (e["ts"], v)
        for e in events
        if e["ph"] == "C" and e["name"] == "bytes"
        for v in e["args"].values()
    )
    assert held[-1][1] == 0 and max(v for _, v in held) == report.memory.peak_bytes_held
    (sid, p), k = next(iter(report.memory.splits.items()))
    finished = [
        e
        for e in events
        if e.get("ph") == "X"
        and e.get("args", {}).get("stage") == sid
        and e["args"].get("partition") == p
        and "rows_out" in e["args"]
    ]
    assert len(finished) == k


def test_backpressure_local(tables):
    _check_backpressure(tables, "local")


def test_default_limit_is_sized_from_memory(tables):
    _dist(tables["dims"].select(pl.len()), Config(runner="local"))
    report = last_query()
    assert report is not None and report.memory is not None
    assert report.memory.max_bytes_held and report.memory.max_bytes_held > 2**20


@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_skewed_join_ray(ray_runner, tables, how):
    _check_skew(tables, "ray", how)


def test_backpressure_ray(ray_runner, tables):
    _check_backpressure(tables, "ray")
    report = last_query()
    assert report is not None and report.memory is not None
    import ray

    from shoal.runners.memory import default_max_bytes_held

    store = ray.cluster_resources()["object_store_memory"]
    _dist(tables["dims"].select(pl.len()), Config(runner="ray", small_query_where="worker"))
    default = last_query()
    assert default is not None and default.memory is not None
    assert default.memory.max_bytes_held == int(store) // 2
    # A small query whose one task runs in the driver holds its output in the driver's
    # heap: the local runner's default limit.
    _dist(tables["dims"].select(pl.len()), Config(runner="ray"))
    default = last_query()
    assert default is not None and default.memory is not None
    assert default.physical.small_query_in_driver
    assert default.memory.max_bytes_held == default_max_bytes_held("local")


def test_progress_counts_subtasks(tables, monkeypatch):
    out = io.StringIO()
    real = progress.ProgressSink.__init__

    def init(self, mode, stream=None):  # type: ignore[no-untyped-def]
        real(self, mode, out)

    monkeypatch.setattr(progress.ProgressSink, "__init__", init)
    lf = _skewed_join(tables, "left")
    _same(_dist(lf, _split_config(progress="always")), lf)
    report = last_query()
    assert report is not None and report.memory is not None and report.memory.splits
    sid = next(iter(report.memory.splits))[0]
    total = report.physical.stage(sid).num_tasks + sum(
        k - 1 for (s, _), k in report.memory.splits.items() if s == sid
    )
    lines = [ln for ln in out.getvalue().splitlines() if f"stage {sid} (" in ln]
    assert lines and f"{total}/{total}" in lines[-1]
