"""Progress bars per stage (tasks done of total, rows produced), drawn with ``rich``.

A :class:`ProgressSink` consumes the same events as a trace (:mod:`shoal.tracing.events`),
so progress costs nothing when it is off. ``Config.progress`` chooses: ``"always"``,
``"never"``, or ``"auto"``: bars on a terminal (stderr is a TTY) and in a Jupyter notebook
(:func:`in_notebook`: rich draws them there as a widget, which needs ``ipywidgets``), and
only once a query has run for more than :data:`AUTO_DELAY_S` seconds, so quick queries and
pipes stay quiet.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from typing import Any

from shoal.tracing.events import (
    LoopSpan,
    QueryFinished,
    QueryPlanned,
    QueryStarted,
    TaskFinished,
)

#: Seconds a query runs before ``progress="auto"`` shows its bars.
AUTO_DELAY_S = 1.0


def wanted(mode: str, stream: Any = None) -> bool:
    """Whether a query under progress ``mode`` should get a :class:`ProgressSink`:
    ``"always"`` yes, ``"never"`` no, ``"auto"`` when ``stream`` (default stderr) is a
    terminal or this process is a notebook kernel that can show rich's live widget
    (:func:`in_notebook` and ``ipywidgets`` importable: without it rich cannot update a
    bar in a notebook, and warns at every refresh instead)."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty and isatty():
        return True
    return in_notebook() and importlib.util.find_spec("ipywidgets") is not None


def in_notebook() -> bool:
    """Whether this process is a notebook kernel whose output rich renders as HTML and
    widgets: IPython's shell is an ipykernel ``ZMQInteractiveShell`` (Jupyter, JupyterLab,
    VS Code's notebooks), or Colab's or Databricks' notebook shell. The same test rich
    makes (``rich.console._is_jupyter``), so that the bars are on exactly where rich draws
    them as a notebook's. An IPython terminal (``TerminalInteractiveShell``) is not a
    notebook (its stderr is a TTY). IPython is never imported here: a process that has not
    imported it is no notebook kernel."""
    ipython = sys.modules.get("IPython")
    get_ipython = getattr(ipython, "get_ipython", None)
    if get_ipython is None:
        return False
    try:
        shell = get_ipython()
    except Exception:  # pragma: no cover - a broken IPython is no notebook
        return False
    if shell is None:
        return False
    cls = type(shell)
    return (
        cls.__name__ == "ZMQInteractiveShell"
        or "google.colab" in str(cls)
        or bool(os.getenv("DATABRICKS_RUNTIME_VERSION"))
    )


class ProgressSink:
    """One bar per stage of one query. ``mode`` is ``"always"`` or ``"auto"`` (delayed)."""

    def __init__(self, mode: str, stream: Any = None) -> None:
        self.mode = mode
        self.stream = sys.stderr if stream is None else stream
        self._start = time.monotonic()
        self._progress: Any = None
        self._bars: dict[int, Any] = {}
        self._stages: dict[int, tuple[str, int]] = {}
        self._done: dict[int, int] = {}
        self._rows: dict[int, int] = {}

    def handle(self, event: object) -> None:
        if isinstance(event, QueryStarted):
            self._start = time.monotonic()
        elif isinstance(event, QueryPlanned):
            for st in event.stages:
                self._stages[st.id] = (st.name, st.num_tasks)
                self._done[st.id] = 0
                self._rows[st.id] = 0
        elif isinstance(event, TaskFinished):
            self._done[event.stage] = self._done.get(event.stage, 0) + 1
            self._rows[event.stage] = self._rows.get(event.stage, 0) + event.rows_out
            self._refresh()
        elif isinstance(event, LoopSpan) and event.name == "split task":
            # A partition runs as several subtasks: the stage has that many more tasks.
            sid = event.args["stage"]
            name, total = self._stages[sid]
            self._stages[sid] = (name, total + event.args["subtasks"] - 1)
        elif isinstance(event, LoopSpan) and event.name == "adaptive plan":
            sid = event.args["stage"]  # adaptive execution changed the stage's task count
            name, total = self._stages[sid]
            self._stages[sid] = (name, total + event.args["tasks"] - event.args["tasks_planned"])
        elif isinstance(event, QueryFinished):
            self.close()

    def _refresh(self) -> None:
        if self._progress is None:
            if self.mode != "always" and time.monotonic() - self._start < AUTO_DELAY_S:
                return
            self._open()
        for sid, (_name, total) in self._stages.items():
            bar = self._bars.get(sid)
            if bar is None:
                continue
            self._progress.update(
                bar, completed=self._done.get(sid, 0), total=total, rows=self._rows.get(sid, 0)
            )

    def _open(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self._progress = Progress(
            TextColumn("stage {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("tasks, {task.fields[rows]:,} rows"),
            console=Console(file=self.stream, force_terminal=self.mode == "always" or None),
            transient=False,
        )
        for sid, (name, total) in self._stages.items():
            self._bars[sid] = self._progress.add_task(f"{sid} ({name})", total=total, rows=0)
        self._progress.start()

    def close(self) -> None:
        if self._progress is not None:
            self._refresh()
            self._progress.stop()
            self._progress = None
