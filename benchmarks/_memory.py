"""Peak memory of a benchmark process and of every process it started.

Two measures, both taken inside the engine's own child process:

- **driver peak RSS**: ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, the kernel's
  high-water mark of the process's resident set. Exact, but blind to other processes.
- **process-tree peak**: a background thread samples, every :data:`SAMPLE_INTERVAL_S`
  seconds, the anonymous and shared memory (``Pss_Anon + Pss_Shmem`` of
  ``/proc/<pid>/smaps_rollup``) of the process and of all its descendants (for a local Ray
  instance: the GCS, the raylet, the workers, Ray's agents) and keeps the largest sum.
  That is the memory holding data: heaps, Arrow buffers, Ray's object store (shared
  memory in ``/dev/shm``). PSS divides a shared page between the processes that map it,
  so an object in the store mapped by the driver and two workers counts once. File-backed
  pages (code of shared libraries, memory-mapped Parquet files: the page cache) are left
  out: their PSS depends on which unrelated processes map the same files. Being sampled,
  the figure can miss a spike shorter than the interval. Linux only; elsewhere ``None``.

Processes of a Ray cluster that the driver did not start (``--ray-address``) are not its
descendants and are not counted.
"""

from __future__ import annotations

import os
import resource
import sys
import threading
from pathlib import Path

SAMPLE_INTERVAL_S = 0.25
"""Seconds between two samples of the process tree's memory."""

_PROC = Path("/proc")


def driver_peak_rss_bytes() -> int:
    """The high-water mark of this process's resident set, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def process_tree(root: int) -> list[int]:
    """``root`` and the pids of all its descendants (Linux ``/proc``); ``[root]`` elsewhere."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return [root]
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = (_PROC / entry / "stat").read_text()
        except OSError:  # the process ended meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    tree: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def data_pss_bytes(pid: int) -> int:
    """``Pss_Anon + Pss_Shmem`` of ``pid`` in bytes (``Pss`` on kernels without them), or
    0 when it cannot be read (the process ended)."""
    fields: dict[str, int] = {}
    try:
        with open(_PROC / str(pid) / "smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss"):
                    name, value = line.split()[:2]
                    fields[name.rstrip(":")] = int(value) * 1024
    except (OSError, ValueError):
        return 0
    if "Pss_Anon" in fields:
        return fields["Pss_Anon"] + fields.get("Pss_Shmem", 0)
    return fields.get("Pss", 0)


def tree_pss_available() -> bool:
    """Whether this system exposes ``/proc/<pid>/smaps_rollup`` (Linux 4.14+)."""
    return (_PROC / "self" / "smaps_rollup").exists()


class TreeSampler:
    """Samples the data memory (anonymous + shared PSS) of this process and its descendants
    in a daemon thread, while not paused.

    :attr:`peak_bytes` is the largest sum seen since the start; :meth:`reset_window` starts
    a new window whose largest sum is :attr:`window_peak_bytes` (for a per-query peak).

    A sample costs CPU: reading ``smaps_rollup`` makes the kernel walk the process's page
    tables, about 26 ms for a local Ray instance's ten processes on the development
    machine (2-5 ms for one process), a tenth of a core at one sample per 0.25 s, taken
    from the engines on a 2-core machine. :meth:`pause` stops the thread's sampling (the
    benchmark pauses it during timed runs, see ``benchmarks._worker``) and :meth:`resume`
    starts it again.
    """

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.available = tree_pss_available()
        self.peak_bytes: int | None = None
        self.window_peak_bytes: int | None = None
        self._stop = threading.Event()
        self._active = threading.Event()
        self._active.set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="tree-pss", daemon=True)

    def start(self) -> TreeSampler:
        """Start sampling (no-op where PSS is unavailable); returns ``self``."""
        if self.available:
            self.sample()
            self._thread.start()
        return self

    def sample(self) -> int | None:
        """Take one sample now and fold it into the peaks; returns it (None if unavailable)."""
        if not self.available:
            return None
        total = sum(data_pss_bytes(pid) for pid in process_tree(os.getpid()))
        with self._lock:
            self.peak_bytes = max(self.peak_bytes or 0, total)
            self.window_peak_bytes = max(self.window_peak_bytes or 0, total)
        return total

    def reset_window(self) -> None:
        """Start a new window for :attr:`window_peak_bytes`."""
        with self._lock:
            self.window_peak_bytes = None
        self.sample()

    def pause(self) -> None:
        """Stop sampling in the background until :meth:`resume` (:meth:`sample` still
        samples)."""
        self._active.clear()

    def resume(self) -> None:
        """Sample in the background again."""
        self._active.set()

    def stop(self) -> None:
        """Stop the sampling thread (after one last sample)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._active.is_set():
                self.sample()
