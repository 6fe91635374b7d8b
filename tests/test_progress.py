"""Progress bars per stage: drawn when asked, quiet in pipes by default."""

from __future__ import annotations

import io
import sys

import polars as pl
import pytest

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


class ZMQInteractiveShell:
    """Stands for ipykernel's shell class (what a Jupyter kernel's IPython is)."""


class TerminalInteractiveShell:
    """Stands for IPython's terminal shell."""


class _Colab:
    """A shell class from a module named like Colab's."""


_Colab.__module__ = "google.colab._shell"


def _fake_ipython(monkeypatch, shell: object) -> None:
    """IPython as a kernel or terminal leaves it: the module with ``get_ipython``, and the
    name ``get_ipython`` in builtins (where IPython puts it, and rich looks)."""
    import builtins
    import types

    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: shell  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", fake)
    monkeypatch.setattr(builtins, "get_ipython", fake.get_ipython, raising=False)


@pytest.mark.parametrize(
    "shell", [ZMQInteractiveShell(), TerminalInteractiveShell(), _Colab(), None]
)
def test_notebook_detection_agrees_with_rich(monkeypatch, shell) -> None:
    """A Jupyter (or Colab) kernel is a notebook, an IPython terminal is not: the same
    answer as rich's own test, so bars are on exactly where rich draws them as a
    notebook's."""
    from rich.console import _is_jupyter

    monkeypatch.delenv("DATABRICKS_RUNTIME_VERSION", raising=False)
    _fake_ipython(monkeypatch, shell)
    expected = isinstance(shell, ZMQInteractiveShell | _Colab)
    assert progress.in_notebook() is expected
    if shell is not None:  # rich's test assumes a shell where get_ipython exists
        assert _is_jupyter() is expected


def test_auto_mode_draws_in_a_notebook_kernel_with_ipywidgets(monkeypatch) -> None:
    """``auto``: stderr of a kernel is no TTY, yet the bars are on in a notebook, where
    rich shows them as an ipywidgets ``Output``; without ipywidgets (rich cannot update
    them there) they stay off, and a plain script's pipe stays quiet."""
    import importlib.util

    real_find_spec = importlib.util.find_spec
    assert not progress.wanted("auto", io.StringIO())  # no IPython in this process
    _fake_ipython(monkeypatch, ZMQInteractiveShell())
    have = {"ipywidgets": True}

    def find_spec(name: str, *args: object) -> object:
        if name == "ipywidgets":
            return object() if have["ipywidgets"] else None
        return real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert progress.wanted("auto", io.StringIO())
    assert not progress.wanted("never", io.StringIO())
    have["ipywidgets"] = False
    assert not progress.wanted("auto", io.StringIO())
    assert progress.wanted("always", io.StringIO())
    _fake_ipython(monkeypatch, TerminalInteractiveShell())
    have["ipywidgets"] = True
    assert not progress.wanted("auto", io.StringIO())  # an IPython terminal: the TTY rule


@pytest.mark.slow  # starts a real Jupyter kernel: about 10 s
def test_bars_render_in_a_real_jupyter_kernel() -> None:
    """A query with ``progress="auto"`` run in a real ipykernel kernel shows its bars as
    rich's widget output (display_data messages carrying the bars' text), ending with
    every stage complete."""
    pytest.importorskip("ipywidgets")
    pytest.importorskip("ipykernel")
    manager = pytest.importorskip("jupyter_client.manager")
    import os

    code = """
import polars as pl, shoal
from shoal.tracing import progress
progress.AUTO_DELAY_S = 0.0  # draw at once, however quick the query
print("notebook", progress.in_notebook(), progress.wanted("auto"))
lf = pl.LazyFrame({"k": list(range(100)) * 10, "v": list(range(1000))})
q = lf.group_by("k").agg(pl.col("v").sum()).sort("k")
engine = shoal.DistEngine(runner="local", default_partitions=4, progress="auto")
print("equal", q.collect(engine=engine).equals(q.collect(engine="in-memory")))
"""
    km, kc = manager.start_new_kernel(kernel_name="python3", env=dict(os.environ))
    try:
        msgs: list[dict] = []
        reply = kc.execute_interactive(code, output_hook=msgs.append, timeout=300)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok", reply["content"]
    out = "".join(m["content"]["text"] for m in msgs if m["header"]["msg_type"] == "stream")
    assert "notebook True True" in out and "equal True" in out
    bars = [
        m["content"]["data"].get("text/plain", "")
        for m in msgs
        if m["header"]["msg_type"] == "display_data"
    ]
    drawn = [b for b in bars if "stage 0 (scan+partial-agg)" in b]
    assert drawn, msgs
    assert "4/4" in drawn[-1] and "0/4" not in drawn[-1]
