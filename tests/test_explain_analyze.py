"""``explain(..., analyze=True)`` and ``format="mermaid"`` (issue 18): the profile of a
query that ran, read from its tasks' stats; counts checked against native answers."""

from __future__ import annotations

import duckdb
import polars as pl
import pytest

import shoal

CONFIG = shoal.Config(runner="local", default_partitions=3, shuffle_partitions=4)


def _frame() -> pl.DataFrame:
    n = 3000
    return pl.DataFrame(
        {
            "k": [None if i % 97 == 0 else i % 5 for i in range(n)],
            "v": [float("nan") if i % 89 == 0 else -0.0 if i % 7 == 0 else i / 3 for i in range(n)],
        }
    )


def test_analyze_reports_rows_per_stage() -> None:
    df = _frame()
    lf = df.lazy().filter(pl.col("v") > 10).group_by("k").agg(pl.col("v").sum()).sort("k")
    text = shoal.explain(lf, config=CONFIG, analyze=True)
    assert "Physical plan:" in text and "Profile (ran on the local runner):" in text
    from shoal.runners.session import last_query

    report = last_query()
    assert report is not None
    root = report.physical.root
    rows_out = sum(s.rows_out for (sid, _), s in report.task_stats.items() if sid == root.id)
    assert rows_out == lf.collect().height  # the root's rows are the answer's
    scan = report.physical.stages[0]
    scanned = sum(s.scan_rows for (sid, _), s in report.task_stats.items() if sid == scan.id)
    assert scanned == df.height
    assert f"{df.height:,}" in next(ln for ln in text.splitlines() if ln.startswith("0 ["))
    for st in report.physical.stages:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{st.id} [{st.name}]"))
        assert f"{sum(1 for (sid, _) in report.task_stats if sid == st.id):>5}" in line
    # explain without analyze runs nothing and has no profile
    assert "Profile" not in shoal.explain(lf, config=CONFIG)


def test_mermaid_stage_graph() -> None:
    lf = _frame().lazy().group_by("k").agg(pl.len()).sort("k")
    graph = shoal.explain(lf, config=CONFIG, format="mermaid")
    assert graph.startswith("flowchart BT")
    from shoal.api import explain as explain_ir

    edges = [ln for ln in graph.splitlines() if "-->" in ln]
    assert edges, graph
    ran = shoal.explain(lf, config=CONFIG, format="mermaid", analyze=True)
    assert "rows out" in ran
    with pytest.raises(ValueError, match="format"):
        explain_ir(lf, config=CONFIG, format="dot")  # type: ignore[arg-type]


def test_duckdb_explain_analyze() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT i % 7 AS g, i * 1.5 AS x FROM range(2000) r(i)")
    q = "SELECT g, sum(x) AS s FROM t GROUP BY g ORDER BY g"
    text = shoal.duckdb.explain(con, q, config=CONFIG, analyze=True)
    assert "Profile (ran on the local runner):" in text
    from shoal.runners.session import last_query

    report = last_query()
    assert report is not None
    root = report.physical.root
    assert sum(s.rows_out for (sid, _), s in report.task_stats.items() if sid == root.id) == 7


def test_skew_and_broadcast_warnings() -> None:
    """The warnings read the task stats: a report whose one task took far longer than the
    others, and wrote far more, is flagged; an even one is not."""
    import dataclasses

    from shoal.runners import profile
    from shoal.runners.session import last_query

    lf = _frame().lazy().group_by("k").agg(pl.col("v").sum())
    shoal.explain(lf, config=CONFIG, analyze=True)
    report = last_query()
    assert report is not None
    even = {
        key: dataclasses.replace(s, start=0.0, end=0.1, bytes_out=2 << 20)
        for key, s in report.task_stats.items()
    }
    assert "skew" not in profile.analyze_text(dataclasses.replace(report, task_stats=even))
    skewed = dict(even)
    stage = report.physical.stages[0].id
    key = next(k for k in skewed if k[0] == stage)
    skewed[key] = dataclasses.replace(skewed[key], end=2.0, bytes_out=64 << 20)
    assert sum(1 for k in skewed if k[0] == stage) > 1
    text = profile.analyze_text(dataclasses.replace(report, task_stats=skewed))
    assert f"stage {stage}" in text and "slowest task took 2.000 s" in text
    assert "largest output is 64.0 MiB" in text


def _stats_of(report: object, stage_id: int) -> list:
    return [s for (sid, _), s in report.task_stats.items() if sid == stage_id]  # type: ignore[attr-defined]


def test_operators_show_what_the_kernel_counts() -> None:
    """Per operator: each scan's rows read, each stage input's rows, each fragment's rows
    out and each exchange's buckets, checked against native Polars counts of the same
    intermediate results."""
    from shoal.ir.nodes import Join
    from shoal.runners.session import last_query

    df = _frame()
    other = pl.DataFrame(
        {"k": [0, 1, 2, 2, None, 4, 7], "w": [1.5, -0.0, None, 2.0, 3.0, 4.0, 5.0]}
    )
    left = df.lazy().filter(pl.col("v") > 10)
    lf = left.join(other.lazy(), on="k").group_by("w").agg(pl.col("v").sum()).sort("w")
    # A hash join: both sides shuffled; adaptive=False: every bucket read (adaptive execution
    # skips the buckets of an inner join whose other side is empty).
    cfg = CONFIG.replace(broadcast_join_threshold_bytes=0, adaptive=False)
    text = shoal.explain(lf, config=cfg, analyze=True)
    report = last_query()
    assert report is not None
    ops = text[text.index("Operators (per stage") :]
    join_stage = next(
        st for st in report.physical.stages if any(isinstance(n, Join) for n in st.fragment.walk())
    )
    stats = _stats_of(report, join_stage.id)
    per_input = [sum(s.extra["input_rows"][i] for s in stats) for i in range(2)]
    # The hash join reads every row of both sides (null keys too): the filtered left side
    # and the whole right side, as native Polars counts them.
    assert sorted(per_input) == sorted([left.collect().height, other.height])
    for i, rows in enumerate(per_input):
        assert f"rows in {rows:,} (stage {join_stage.inputs[i].stage}, bucket)" in ops
    # Each shuffle's buckets add up to what its stage wrote; the readers got exactly those.
    for st in report.physical.stages:
        st_stats = _stats_of(report, st.id)
        if st.output.num_outputs > 1:
            buckets = [
                sum(col) for col in zip(*(s.extra["bucket_rows"] for s in st_stats), strict=True)
            ]
            assert sum(buckets) == sum(s.rows_out for s in st_stats)
            assert len(buckets) == st.output.num_outputs
        assert all(len(s.extra["phase_s"]) == 3 for s in st_stats)
    scan_lines = [ln for ln in ops.splitlines() if "SCAN" in ln and "rows read" in ln]
    assert any(
        f"({df.height} rows)" in ln and f"rows read {df.height:,}" in ln for ln in scan_lines
    )
    assert any(
        f"({other.height} rows)" in ln and f"rows read {other.height:,}" in ln for ln in scan_lines
    )
    root_rows = sum(s.rows_out for s in _stats_of(report, report.physical.root.id))
    assert root_rows == lf.collect().height
    assert "task seconds in all: inputs" in ops


def test_skewed_shuffle_bucket_is_flagged() -> None:
    """A hash join whose key has one value in most rows puts them in one bucket: the
    profile names that bucket; an even key does not."""
    from shoal.runners.session import last_query

    n = 300_000
    skewed = pl.DataFrame({"k": [7] * n + list(range(300)), "x": range(n + 300)})
    dims = pl.DataFrame({"k": list(range(300)), "y": [float(i) for i in range(300)]})
    cfg = CONFIG.replace(broadcast_join_threshold_bytes=0)
    q = skewed.lazy().join(dims.lazy(), on="k").select(pl.len())
    text = shoal.explain(q, config=cfg, analyze=True)
    report = last_query()
    assert report is not None
    assert sum(s.rows_out for s in _stats_of(report, report.physical.root.id)) == 1
    assert "skewed exchange: bucket" in text
    line = next(ln for ln in text.splitlines() if "skewed exchange" in ln)
    held = int(line.split(" MiB (")[1].split(" rows)")[0].replace(",", ""))
    # All n rows of key 7, and the few other keys that hash to the same bucket.
    assert n < held <= n + 300
    even = pl.DataFrame({"k": list(range(300)) * 1000, "x": range(300_000)})
    text = shoal.explain(
        even.lazy().join(dims.lazy(), on="k").select(pl.len()), config=cfg, analyze=True
    )
    assert "skewed exchange" not in text


def test_spill_is_given_to_the_stage_that_ends_next() -> None:
    """The sampler reads the spill counters at the start, at each stage's end and at the
    end; the growth between readings goes to the stage that ended, and the profile shows
    it (a fake reader stands in for Ray's counters: spilling on purpose takes a minute,
    see tests/test_spill.py)."""
    from shoal.planner.physical import plan_physical
    from shoal.runners import profile
    from shoal.runners.dispatch import DispatchLoop
    from shoal.runners.session import QueryReport

    from .irplans import agg_sort_plan, frame
    from .test_dispatch import FakeBackend

    plan, _ = agg_sort_plan(frame())
    physical = plan_physical(plan, shoal.Config(runner="local", target_partition_bytes=800))
    counters = [0, 0, 0, 0]
    readings: list[int] = []

    def read() -> tuple[int, int, int, int]:
        readings.append(len(readings))
        if len(readings) == 2:  # at the end of the first stage to finish: 3 MiB spilled
            counters[0] += 3 << 20
            counters[1] += 2
        return (counters[0], counters[1], counters[2], counters[3])

    loop = DispatchLoop(physical, FakeBackend(0), max_in_flight=4)
    sampler = profile.SpillSampler(read)
    loop.on_stage_done = sampler
    order: list[int] = []
    inner = sampler.__call__
    loop.on_stage_done = lambda sid: (order.append(sid), inner(sid))
    loop.run()
    spill = sampler.finish()
    assert len(readings) == len(physical.stages) + 2
    assert spill.by_stage == {order[0]: (3 << 20, 2, 0, 0)}
    assert spill.total == (3 << 20, 2, 0, 0)
    report = QueryReport(physical, loop.task_stats, "ray", loop.memory_report(), spill=spill)
    text = profile.analyze_text(report)
    first = physical.stage(order[0])
    line = next(ln for ln in text.splitlines() if ln.startswith(f"{first.id} [{first.name}]"))
    assert line.endswith("3.0 MiB")
    assert "spilled: 3.0 MiB in 2 objects to disk" in text


def test_ray_profile_reads_the_spill_counters(ray_runner: None) -> None:
    """On Ray, a profiled query reads Ray's spill counters (nothing spills here: the
    profile says so rather than "unknown"); the local runner has none to read."""
    from shoal.runners.session import last_query

    lf = _frame().lazy().group_by("k").agg(pl.col("v").sum()).sort("k")
    text = shoal.explain(lf, config=CONFIG.replace(runner="ray"), analyze=True)
    report = last_query()
    assert report is not None and report.runner == "ray"
    assert report.spill is not None and not report.spill.unknown
    assert report.spill.total == (0, 0, 0, 0)
    assert "spilled: nothing (Ray's object store, whole cluster)" in text
    import ray
    from ray._private.internal_api import memory_summary

    from shoal_polars import to_ir

    address = ray.get_runtime_context().gcs_address  # this Ray instance, not another's
    assert "Spilled" not in memory_summary(address, stats_only=True)  # Ray agrees
    shoal.execute(to_ir(lf), config=CONFIG.replace(runner="ray"))
    report = last_query()
    assert report is not None and report.spill is None  # not profiled: not read
