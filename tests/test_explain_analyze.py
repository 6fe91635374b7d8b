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
