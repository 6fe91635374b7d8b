"""Progress bars per stage: drawn when asked, quiet in pipes by default."""

from __future__ import annotations

import io

import polars as pl

import shoal
from shoal.tracing import progress

from .irplans import agg_sort_plan, frame


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_auto_mode_draws_only_on_a_terminal() -> None:
    assert progress.wanted("auto", _Tty())
    assert not progress.wanted("auto", io.StringIO())
    assert progress.wanted("always", io.StringIO())
    assert not progress.wanted("never", _Tty())


def test_progress_always_draws_a_bar_per_stage(monkeypatch) -> None:
    out = io.StringIO()
    real = progress.ProgressSink.__init__

    def init(self, mode, stream=None):  # type: ignore[no-untyped-def]
        real(self, mode, out)

    monkeypatch.setattr(progress.ProgressSink, "__init__", init)
    plan, expected = agg_sort_plan(frame())
    cfg = shoal.Config(runner="local", default_partitions=4, progress="always")
    got = shoal.execute(plan, config=cfg)
    assert pl.from_arrow(got).equals(expected)
    text = out.getvalue()
    assert "stage 0 (scan+partial-agg)" in text
    assert "4/4" in text


def test_progress_is_off_in_a_pipe_by_default(capsys) -> None:
    plan, _ = agg_sort_plan(frame())
    shoal.execute(plan, config=shoal.Config(runner="local", default_partitions=4))
    captured = capsys.readouterr()
    assert "stage" not in captured.err and "stage" not in captured.out
