"""User functions: the decorator, resources and GPU accounting, the Polars and DuckDB user
APIs (native answers equal shoal's), the planner's actor pool stages, and actor pools of the
local runner (worker processes): __init__ once per actor, CUDA_VISIBLE_DEVICES per worker,
errors with the UDF's name and traceback, nothing left behind after success, failure or
Ctrl-C. The Ray runner's pools are tested in test_udf_ray.py."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest

import shoal
from shoal.config import Config
from shoal.errors import PlanError, ShoalError
from shoal.ir import InMemorySource, Scan, Schema, to_json
from shoal.planner.physical import plan_physical
from shoal.resources import (
    GPU_UNITS,
    ResourceLedger,
    ResourceRequest,
    discover_gpus,
    local_ledger,
)
from shoal.runners.actor_pool import pool_udf
from shoal.runners.session import last_query
from shoal.udf import UDF, lookup, project

# ------------------------------------------------------------------ UDFs used here and in
# test_udf_ray.py (module level: workers import them by reference)


@shoal.udf(return_dtype=pl.Float64, batch_size=64)
def score(a: pl.Series, s: pl.Series) -> pl.Series:
    """A stateless CPU function of two columns (nulls propagate)."""
    return a.cast(pl.Float64) * 1.5 + s.str.len_chars()


@shoal.udf(return_dtype=pl.String, concurrency=2, batch_size=50)
class Counted:
    """A stateful UDF that records each __init__ (a file in ``directory``) and tags each row
    with the id of the instance that computed it."""

    def __init__(self, directory: str, delay: float = 0.0) -> None:
        self.id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.delay = delay
        Path(directory, f"init-{self.id}").touch()

    def __call__(self, a: pl.Series) -> pl.Series:
        time.sleep(self.delay)
        return pl.Series([self.id] * a.len(), dtype=pl.String)


@shoal.udf(return_dtype=pl.String, num_gpus=1, num_cpus=0.5, concurrency=4)
class SeeDevices:
    """Tags each row with the CUDA_VISIBLE_DEVICES its actor sees."""

    def __call__(self, a: pl.Series) -> pl.Series:
        return pl.Series([os.environ.get("CUDA_VISIBLE_DEVICES", "")] * a.len(), dtype=pl.String)


@shoal.udf(return_dtype=pl.Int64, concurrency=2)
class Offset:
    """A stateful UDF with __init__ arguments (native Polars and shoal agree on it)."""

    def __init__(self, k: int = 1) -> None:
        self.k = k

    def __call__(self, a: pl.Series) -> pl.Series:
        return a + self.k


@shoal.udf(return_dtype=pl.Int64, concurrency=2, batch_size=10)
class Fails:
    """Raises on the batch holding the value ``bad``."""

    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __call__(self, a: pl.Series) -> pl.Series:
        if (a == self.bad).any():
            raise ValueError(f"cannot score {self.bad}")
        return a


@shoal.udf(return_dtype=pl.Int64, concurrency=2, batch_size=100)
class Slow:
    """Sleeps per batch; appends a line to ``marker`` per batch it begins (for the Ctrl-C
    tests: the file exists once it is working, and counts the batches that ran)."""

    def __init__(self, marker: str, delay_s: float = 0.25) -> None:
        self.marker = marker
        self.delay_s = delay_s

    def __call__(self, a: pl.Series) -> pl.Series:
        with Path(self.marker).open("a") as f:  # one line per batch begun
            f.write("batch\n")
        time.sleep(self.delay_s)
        return a


@shoal.udf(return_dtype=pl.Int64, concurrency=1, batch_size=100)
class PageFaults:
    """Per batch, makes and drops 2 MiB of NumPy temporaries (as a model's activations)
    and gives each row the minor page faults the batch cost its process."""

    def __call__(self, a: pl.Series) -> pl.Series:
        import resource

        import numpy as np

        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        x = np.arange(1 << 17, dtype=np.float64)
        y = np.tanh(x * 1e-6) + x
        del x, y
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        return pl.Series([faults] * a.len(), dtype=pl.Int64)


def frame(rows: int = 4000) -> pl.DataFrame:
    """Ints with nulls and strings of varied length."""
    i = pl.int_range(rows, eager=True)
    return pl.DataFrame({"i": i}).select(
        a=pl.when(pl.col("i") % 11 == 0).then(None).otherwise(pl.col("i") * 7 % 1000),
        s=(pl.col("i") % 13).cast(pl.String).repeat_by(pl.col("i") % 4).list.join(""),
    )


def scan_of(df: pl.DataFrame) -> Scan:
    t = df.to_arrow()
    return Scan(InMemorySource(t), Schema.from_arrow(t.schema))


def udf_processes() -> list[str]:
    """Command lines of live local UDF worker processes of this test process (``-ww``: ps
    cuts lines at 80 columns without a terminal, which hid every worker's name)."""
    out = subprocess.run(
        ["ps", "-ww", "--ppid", str(os.getpid()), "-o", "args="], capture_output=True, text=True
    ).stdout
    return [line for line in out.splitlines() if "shoal-udf-" in line and "_worker_main" in line]


def wait_until(cond: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def interrupt_when(path: Path) -> threading.Thread:
    """A thread that sends this process SIGINT once ``path`` exists."""

    def run() -> None:
        if wait_until(path.exists, 60):
            os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def polars_native(
    df: pl.DataFrame, fn: object, inputs: list[str], output: str, dtype: pl.DataType
) -> pl.DataFrame:
    """``fn`` applied by native Polars (``map_batches`` over a struct of the inputs)."""
    return df.with_columns(
        pl.struct(inputs)
        .map_batches(
            lambda st: fn(*[st.struct.field(c) for c in inputs]),  # type: ignore[operator]
            return_dtype=dtype,
        )
        .alias(output)
    )


# ------------------------------------------------------------------ decorator and resources


def test_decorator_validates_at_decoration_time() -> None:
    with pytest.raises(ValueError, match="whole number"):
        shoal.udf(return_dtype=pl.Int64, num_gpus=1.5)
    with pytest.raises(ValueError, match="whole number"):
        shoal.udf(lambda a: a, return_dtype=pl.Int64, num_gpus=2.5)
    for bad in (0, (3, 2), (0, 2), "4", (1, 2, 3)):
        with pytest.raises(ValueError, match="concurrency"):
            shoal.udf(return_dtype=pl.Int64, concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_format"):
        shoal.udf(lambda a: a, return_dtype=pl.Int64, batch_format="pandas")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="return_dtype"):
        shoal.udf(return_dtype="not a type")
    with pytest.raises(ValueError, match="num_cpus"):
        shoal.udf(return_dtype=pl.Int64, num_cpus=-1)
    two = shoal.udf(lambda a: a, return_dtype=pl.Int64, num_gpus=2.0, name="two_gpus")
    half = shoal.udf(lambda a: a, return_dtype=pl.Int64, num_gpus=0.5, name="half_gpu")
    assert two.resources.gpus == 2 and half.resources.gpu_units == GPU_UNITS // 2
    assert two.needs_actor_pool and half.needs_actor_pool and not two.is_stateful
    assert not score.needs_actor_pool and Counted.needs_actor_pool and Counted.is_stateful
    assert score(pl.Series([2]), pl.Series(["ab"])).to_list() == [5.0]  # still a function
    with pytest.raises(TypeError, match="is a class"):
        Counted(pl.Series([1]))
    assert Offset.with_init(k=5).init_kwargs == {"k": 5}
    assert Offset.options(concurrency=(1, 3)).concurrency == (1, 3)
    assert lookup("score") is score and isinstance(score, UDF)


def test_ledger_accounts_each_gpu_device() -> None:
    ledger = ResourceLedger(cpus=4, memory_bytes=2**30, gpus=(0, 1, 2, 3))
    pair_a = ledger.try_acquire(ResourceRequest(1, 2))
    pair_b = ledger.try_acquire(ResourceRequest(1, 2))
    assert pair_a is not None and pair_b is not None
    assert set(pair_a.gpu_ids).isdisjoint(pair_b.gpu_ids) and len(pair_a.gpu_ids) == 2
    assert ledger.try_acquire(ResourceRequest(0, 0.5)) is None  # every device is held whole
    ledger.release(pair_b)
    halves = [ledger.try_acquire(ResourceRequest(0, 0.5)) for _ in range(4)]
    assert all(h is not None for h in halves)
    used = sorted(h.gpu_ids[0] for h in halves if h)
    assert used == [2, 2, 3, 3]  # packed: two halves share a device
    assert halves[0] and halves[0].cuda_visible_devices == "2"
    assert ledger.try_acquire(ResourceRequest(0, 0.5)) is None
    assert ledger.try_acquire(ResourceRequest(5, 0)) is None  # 2 of 4 CPUs are free
    assert ledger.try_acquire(ResourceRequest(0, 0, 2**31)) is None  # memory in bytes
    assert ledger.fits_at_all(ResourceRequest(1, 1), 4)
    assert not ledger.fits_at_all(ResourceRequest(1, 1), 5)
    assert ledger.fits_at_all(ResourceRequest(0.5, 0.25), 8)


def test_gpus_setting_is_read_on_the_driver_through_config() -> None:
    assert Config.from_env({"SHOAL_GPUS": "0,1,2,3"}).gpus == "0,1,2,3"
    with pytest.raises(ValueError, match="SHOAL_GPUS"):
        Config.from_env({"SHOAL_GPUS": "0,x"})
    with pytest.raises(ValueError, match="distinct"):
        Config(gpus="1,1")
    assert local_ledger(2, "0,1,2,3").gpus == (0, 1, 2, 3)
    assert Config.from_env({"SHOAL_NUM_GPUS": "4"}).num_gpus == 4


def test_no_nvidia_driver_means_zero_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def missing() -> None:
        raise pynvml.NVMLError_LibraryNotFound(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    assert discover_gpus() == ()
    assert local_ledger(2, None).gpus == ()


# ------------------------------------------------------------------ planning


def test_planner_puts_stateful_and_gpu_udfs_on_actor_pools_only() -> None:
    df = frame(100)
    scan = scan_of(df)
    cfg = Config(default_partitions=4)
    stateless = plan_physical(project(scan, score, ["a", "s"], "y"), cfg)
    assert [pool_udf(s) for s in stateless.stages] == [None]  # in the scan tasks
    gpu_fn = shoal.udf(lambda a: a, return_dtype=pl.Int64, num_gpus=1, name="gpu_fn")
    plan = project(
        project(project(scan, score, ["a", "s"], "y"), Offset, ["a"], "a"), gpu_fn, ["a"], "g"
    )
    phys = plan_physical(plan, cfg)
    pools = [pool_udf(s) for s in phys.stages]
    assert [p.udf_name for p in pools if p] == ["Offset", "gpu_fn"]
    # A pool stage runs only the UDF, pointwise over the stage before it (same partitions).
    for st in phys.stages:
        if pool_udf(st):
            assert st.operators == ["UdfProject", "StageInput"]
            assert st.inputs[0].mode == "pointwise" and st.num_tasks == 4
    assert phys.root.fragment.schema.names == ("a", "s", "y", "g")  # "a" replaced in place
    text = shoal.explain(plan, config=cfg)
    assert "UDF Offset(a) AS a [ACTOR POOL, 1 CPU]" in text
    assert "UDF score(a, s) AS y [IN TASK" in text
    with pytest.raises(PlanError):
        to_json(plan)  # the JSON form carries no Python objects
    with pytest.raises(PlanError, match="not in"):
        project(scan, score, ["a", "nope"], "y")


def test_pool_stage_reads_a_plain_in_memory_scan_itself() -> None:
    """A stateful UDF straight over an in-memory frame (all columns, or some): one stage,
    the pool's, whose tasks read the frame's row ranges themselves (no stage of scan tasks
    before it: a task and a copy of the rows less per partition). Over a scan with a
    predicate, or over anything else, the pool stage still reads the stage before it (only
    the UDF runs on the actors). Failed before: two stages, a scan stage and the pool's."""
    from shoal.ir import BinaryOp, Col, Lit
    from shoal.ir.types import BOOL

    df = frame(100)
    scan = scan_of(df)
    cfg = Config(default_partitions=4)
    for source in (scan, Scan(scan.source, Schema((("a", scan.schema["a"]),)))):
        phys = plan_physical(project(source, Offset, ["a"], "b"), cfg)
        assert len(phys.stages) == 1
        (st,) = phys.stages
        assert pool_udf(st) is not None and st.operators == ["UdfProject", "Scan"]
        assert st.inputs == () and st.num_tasks == 4
        assert st.scan_partitions is not None and len(st.scan_partitions) == 4
        assert st.name == "actor-pool[Offset]"
    a = scan.schema["a"]
    filtered = Scan(scan.source, scan.schema, BinaryOp("gt", Col("a", a), Lit(5, a), BOOL))
    phys = plan_physical(project(filtered, Offset, ["a"], "b"), cfg)
    assert [pool_udf(s) is not None for s in phys.stages] == [False, True]
    assert phys.stages[1].operators == ["UdfProject", "StageInput"]


# ------------------------------------------------------------------ Polars and DuckDB APIs


def test_polars_namespace_native_equals_polars_map_batches() -> None:
    df = frame()
    got = df.lazy().shoal.with_udf(score, inputs=["a", "s"], output="y").collect()
    assert got.equals(polars_native(df, score.fn, ["a", "s"], "y", pl.Float64()))
    got2 = df.lazy().shoal.with_udf(Offset.with_init(k=3), inputs="a", output="a").collect()
    assert got2.equals(df.with_columns(pl.col("a") + 3))
    with pytest.raises(TypeError, match="shoal UDF"):
        df.lazy().shoal.with_udf(lambda a: a, inputs="a", output="b")  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="not in"):
        df.lazy().shoal.with_udf(score, inputs=["zz"], output="b")


def test_duckdb_register_udf_runs_natively_and_registers_with_shoal() -> None:
    from shoal_duckdb.udf import lookup_udf, udf_project_for

    df = frame(3000)
    con = duckdb.connect()
    shoal.duckdb.register_udf(con, score)
    shoal.duckdb.register_udf(con, Offset.with_init(k=10).options(name="offset10"))
    con.register("t", df.to_arrow())
    got = con.sql("SELECT a, s, score(a, s) AS y, offset10(a) AS o FROM t").pl()
    want = polars_native(df, score.fn, ["a", "s"], "y", pl.Float64()).with_columns(
        o=pl.col("a") + 10
    )
    assert got.equals(want)
    assert lookup_udf("SCORE") is score
    # The IR a DuckDB translation builds for score(a + 1, s) runs on shoal with the same rows.
    scan = scan_of(df)
    a1 = shoal.ir.BinaryOp(
        "add",
        shoal.ir.Col("a", scan.schema["a"]),
        shoal.ir.Lit(1, scan.schema["a"]),
        scan.schema["a"],
    )
    plan = udf_project_for(scan, score, [a1, shoal.ir.Col("s", scan.schema["s"])], "y")
    ran = pl.from_arrow(shoal.execute(plan, runner="local", config=Config(default_partitions=3)))
    native = con.sql("SELECT a, s, score(a + 1, s) AS y FROM t").pl()
    assert isinstance(ran, pl.DataFrame) and ran.equals(native)


# ------------------------------------------------------------------ the local runner's pools


@pytest.fixture(scope="module")
def local_gpus() -> Iterator[None]:
    """The local runner with four (pretend) GPUs: SHOAL_GPUS=0,1,2,3 through the config."""
    shoal.shutdown()
    shoal.set_config(gpus="0,1,2,3")
    yield
    shoal.shutdown()
    shoal.set_config(gpus=None)


def _local(default_partitions: int = 8) -> shoal.DistEngine:
    return shoal.DistEngine(
        runner="local",
        raise_on_fail=True,
        config=Config(runner="local", default_partitions=default_partitions, udf_keep_warm=False),
    )


@pytest.mark.usefixtures("local_gpus")
def test_local_shoal_equals_native_polars_row_for_row() -> None:
    df = frame()
    lf = (
        df.lazy()
        .filter(pl.col("a").is_null() | (pl.col("a") > 5))
        .shoal.with_udf(score, inputs=["a", "s"], output="y")
        .shoal.with_udf(Offset.with_init(k=7), inputs="a", output="a7")
        .filter(pl.col("y") > 3.0)
    )
    native = lf.collect()
    assert native.height > 100
    assert lf.collect(engine=_local()).equals(native)
    expected = (
        polars_native(
            df.filter(pl.col("a").is_null() | (pl.col("a") > 5)),
            score.fn,
            ["a", "s"],
            "y",
            pl.Float64(),
        )
        .with_columns(a7=pl.col("a") + 7)
        .filter(pl.col("y") > 3.0)
    )
    assert native.equals(expected)
    assert udf_processes() == []


@pytest.mark.usefixtures("local_gpus")
def test_local_pool_reading_its_scan_equals_native() -> None:
    """Stateful UDFs straight over in-memory frames with nulls (the pool stage reads the
    row ranges itself): native Polars' answer with 4 partitions, with 8 partitions of 5
    rows (three empty), and over a column selection."""
    check_pool_reads_scan(_local)
    assert udf_processes() == []


def check_pool_reads_scan(engine: Any) -> None:
    """What ``test_*_pool_reading_its_scan_equals_native`` check, on ``engine(n)``, a
    DistEngine of ``n`` default partitions: each query runs as the pool stage alone."""
    cases = [
        (frame(4000), 4, lambda lf: lf),
        (frame(5), 8, lambda lf: lf),
        (frame(3000), 3, lambda lf: lf.select("a")),
    ]
    for df, parts, shape in cases:
        lf = shape(df.lazy()).shoal.with_udf(Offset.with_init(k=4), inputs="a", output="b")
        native = shape(df.lazy()).with_columns(
            b=pl.col("a").map_batches(lambda a: a + 4, return_dtype=pl.Int64)
        )
        got = lf.collect(engine=engine(parts))
        assert got.equals(native.collect())
        assert got["b"].null_count() == df["a"].null_count() > 0
        report = last_query()
        assert report is not None
        assert [pool_udf(st) is not None for st in report.physical.stages] == [True]
        assert len(report.task_stats) == parts


@pytest.mark.usefixtures("local_gpus")
def test_local_worker_reuses_its_heap_between_batches() -> None:
    """See ``check_heap_reused`` (on a local worker process)."""
    check_heap_reused(_local(1))
    assert udf_processes() == []


def check_heap_reused(engine: shoal.DistEngine) -> None:
    """Batches that make and drop MiBs of NumPy temporaries do not page-fault them in
    again every batch in a pool's process (glibc's thresholds set for pools: see
    ``actor_pool.ACTOR_MALLOC_ENV``); the answer is unchanged. Failed before: about 730
    faults per batch, the temporaries' pages fresh each time (glibc gave them back to
    the OS after each batch: its largest freed block, 1 MiB, set its thresholds)."""
    df = frame(3000)
    got = df.lazy().shoal.with_udf(PageFaults, inputs="a", output="faults").collect(engine=engine)
    assert got.drop("faults").equals(df)
    per_batch = got["faults"].gather_every(100).to_list()
    assert len(per_batch) == 30
    assert sorted(per_batch)[15] < 64, per_batch


@pytest.mark.usefixtures("local_gpus")
def test_local_stateful_init_runs_once_per_actor(tmp_path: Path) -> None:
    df = frame(4000)
    lf = df.lazy().shoal.with_udf(Counted.with_init(str(tmp_path)), inputs="a", output="who")
    got = lf.collect(engine=_local(default_partitions=40))
    report = last_query()
    assert report is not None
    pool_stage = next(s for s in report.physical.stages if pool_udf(s))
    assert pool_stage.num_tasks == 40
    inits = list(tmp_path.glob("init-*"))
    assert len(inits) == 2, inits  # concurrency=2: two actors, one __init__ each
    assert got["who"].n_unique() <= 2 and got.height == df.height
    actors = {v.extra["actor"] for (sid, _), v in report.task_stats.items() if sid == pool_stage.id}
    assert len(actors) <= 2 and all(a.startswith("shoal-udf-Counted-") for a in actors)
    assert got.drop("who").equals(df)
    assert udf_processes() == []


@pytest.mark.usefixtures("local_gpus")
def test_local_pool_grows_from_min_to_max_while_batches_wait(tmp_path: Path) -> None:
    growing = Counted.options(concurrency=(1, 2)).with_init(str(tmp_path), delay=0.1)
    lf = frame(400).lazy().shoal.with_udf(growing, inputs="a", output="who")
    got = lf.collect(engine=_local(default_partitions=30))
    assert len(list(tmp_path.glob("init-*"))) == 2  # started with 1, grew to 2
    assert got["who"].n_unique() == 2  # and the second one took batches
    assert udf_processes() == []


@pytest.mark.slow  # heavy (a Ray instance of its own or many processes): -m slow
@pytest.mark.usefixtures("local_gpus")
def test_local_workers_see_their_own_gpus() -> None:
    lf = frame(2000).lazy().shoal.with_udf(SeeDevices, inputs="a", output="cvd")
    singles = set(lf.collect(engine=_local(16))["cvd"])
    assert singles == {"0", "1", "2", "3"}
    two_each = SeeDevices.options(num_gpus=2, concurrency=2)
    lf2 = frame(2000).lazy().shoal.with_udf(two_each, inputs="a", output="cvd")
    pairs = set(lf2.collect(engine=_local(16))["cvd"])
    assert len(pairs) == 2
    a, b = ({int(x) for x in p.split(",")} for p in pairs)
    assert len(a) == len(b) == 2 and a.isdisjoint(b) and a | b == {0, 1, 2, 3}
    assert udf_processes() == []


@pytest.mark.usefixtures("local_gpus")
def test_local_pool_larger_than_the_devices_fails_before_running() -> None:
    lf = (
        frame(10).lazy().shoal.with_udf(SeeDevices.options(concurrency=5), inputs="a", output="cvd")
    )
    with pytest.raises(ShoalError, match="at least 5 actor"):
        lf.collect(engine=_local())


@pytest.mark.usefixtures("local_gpus")
def test_local_udf_error_names_the_udf_with_its_traceback() -> None:
    lf = frame(2000).lazy().shoal.with_udf(Fails.with_init(bad=77), inputs="a", output="b")
    with pytest.raises(shoal.TaskError) as info:
        lf.collect(engine=_local(20))
    text = str(info.value)
    assert "user function 'Fails' raised ValueError: cannot score 77" in text
    assert "Original traceback" in text and 'raise ValueError(f"cannot score' in text
    assert "actor-pool[Fails]" in text
    assert udf_processes() == []


@pytest.mark.usefixtures("local_gpus")
def test_local_ctrl_c_leaves_no_worker_process(tmp_path: Path) -> None:
    marker = tmp_path / "working"
    # 40 batches of 1 s each: run to its end, the query would take 20 s on two workers.
    lf = frame(4000).lazy().shoal.with_udf(Slow.with_init(str(marker), 1.0), inputs="a", output="b")
    t = interrupt_when(marker)
    with pytest.raises(KeyboardInterrupt):
        lf.collect(engine=_local(40))
    t.join()
    # Interrupted, not run to its end: fewer than the 40 batches began.
    assert len(marker.read_text().splitlines()) < 40
    assert udf_processes() == []
    # The runner is ready for the next query.
    small = frame(50).lazy().shoal.with_udf(Offset, inputs="a", output="b")
    assert small.collect(engine=_local(2)).equals(small.collect())


@pytest.mark.usefixtures("local_gpus")
def test_local_warm_pool_serves_the_next_query(tmp_path: Path) -> None:
    """udf_keep_warm: the second query of the same UDF runs on the first one's worker
    processes (no new __init__), with the same answer; a query of another UDF closes the
    parked pool, and shutdown closes what is parked."""
    warm = Config(runner="local", default_partitions=6)
    assert warm.udf_keep_warm  # on by default
    engine = shoal.DistEngine(runner="local", raise_on_fail=True, config=warm)
    counted = Counted.with_init(str(tmp_path))
    df = frame(600)
    lf = df.lazy().shoal.with_udf(counted, inputs="a", output="who")
    try:
        first = lf.collect(engine=engine)
        inits = sorted(tmp_path.glob("init-*"))
        assert 1 <= len(inits) <= 2
        assert len(udf_processes()) == len(inits)  # parked, not closed
        second = lf.collect(engine=engine)
        assert sorted(tmp_path.glob("init-*")) == inits  # no __init__ again
        assert set(second["who"]) <= {p.name.removeprefix("init-") for p in inits}
        assert first.drop("who").equals(df) and second.drop("who").equals(df)
        other = df.lazy().shoal.with_udf(Offset, inputs="a", output="b").collect(engine=engine)
        assert other["b"].equals((df["a"] + 1).alias("b"))
        assert all("shoal-udf-Counted-" not in p for p in udf_processes())
    finally:
        shoal.shutdown()
    assert udf_processes() == []


@pytest.mark.slow  # heavy (a Ray instance of its own or many processes): -m slow
@pytest.mark.usefixtures("local_gpus")
def test_local_pool_closed_after_each_query_with_keep_warm_off(tmp_path: Path) -> None:
    counted = Counted.with_init(str(tmp_path))
    lf = frame(300).lazy().shoal.with_udf(counted, inputs="a", output="who")
    lf.collect(engine=_local(4))
    n = len(list(tmp_path.glob("init-*")))
    assert udf_processes() == []
    lf.collect(engine=_local(4))
    assert len(list(tmp_path.glob("init-*"))) > n  # new actors, new __init__
    assert udf_processes() == []


@pytest.mark.usefixtures("local_gpus")
def test_local_warm_pool_closes_after_its_idle_time(tmp_path: Path) -> None:
    """udf_keep_warm_idle_s: a parked pool taken over by the next query serves it; left
    unused that long, it is closed (its worker processes gone, their resources back)."""
    cfg = Config(runner="local", default_partitions=3, udf_keep_warm_idle_s=2.0)
    engine = shoal.DistEngine(runner="local", raise_on_fail=True, config=cfg)
    counted = Counted.options(concurrency=1).with_init(str(tmp_path))
    df = frame(300)
    lf = df.lazy().shoal.with_udf(counted, inputs="a", output="who")
    try:
        assert lf.collect(engine=engine).drop("who").equals(df)
        assert lf.collect(engine=engine).drop("who").equals(df)
        assert len(list(tmp_path.glob("init-*"))) == 1  # the second query took it over
        assert wait_until(lambda: udf_processes() == [], timeout=60)
    finally:
        shoal.shutdown()


def _fake_pool() -> Any:
    """A pool without actors, for the parking rules (warm pools)."""
    from shoal.runners import actor_pool

    class FakePool(actor_pool._Parkable):
        def __init__(self) -> None:
            self.key = ("local", uuid.uuid4().hex)
            self.udf = Offset
            self.names: list[str] = []
            self.keep_warm = True
            self._closed = False

        def close(self) -> None:
            self._closed = True

    return FakePool()


def test_idle_timer_of_an_earlier_parking_leaves_the_pool_alone() -> None:
    """A pool parked, taken over and parked again is closed only by the timer of its last
    parking (the timers are threads; here their callback is called directly)."""
    from shoal.runners import actor_pool

    pool = _fake_pool()
    actor_pool._park(pool)  # idle_s 0: no timer thread
    assert actor_pool._take_parked(pool.key) is pool  # a query takes it over
    actor_pool._park(pool)  # and parks it again
    actor_pool._expire(pool, 1)  # the first parking's timer
    assert not pool.closed
    actor_pool._expire(pool, 2)
    assert pool.closed and actor_pool._take_parked(pool.key) is None


def test_a_query_ending_late_does_not_park_or_close_a_pool_taken_over() -> None:
    """Query A parks its pool when the pool's stage ends and then, ending, finishes (or,
    failing, closes) its pools again; meanwhile query B took the pool over. A's late calls
    must leave B's pool alone: parked again it could be taken by a third query too, and
    closed under B. The pools the loop holds are leases (``make_pools``)."""
    from shoal.runners import actor_pool

    pool = _fake_pool()
    a = actor_pool._Lease(pool)
    a.finish()  # A's UDF stage ended: parked
    assert actor_pool._take_parked(pool.key) is pool  # B takes it over
    b = actor_pool._Lease(pool)
    a.finish()  # A ends
    a.close()  # or fails later
    assert not pool.closed
    assert actor_pool._take_parked(pool.key) is None  # not parked while B uses it
    b.finish()
    assert actor_pool._take_parked(pool.key) is pool
    b.close()
    assert pool.closed
