"""One engine in its own process, driven by the benchmark over a pipe.

The parent (:class:`EngineProcess`) starts ``python -m benchmarks._worker ENGINE DATA_DIR
OPTIONS_JSON``; the child starts the engine and then answers one JSON line per command
read from stdin:

- ``{"cmd": "run", "query": N, "warmup": W, "runs": R, "result_path": P}``: W untimed
  runs, then R timed runs (``time.perf_counter`` around the call that returns the answer
  as a ``polars.DataFrame``; a ``gc.collect()`` before each run, untimed; the process
  tree's memory is sampled during the warm-up runs, or during the timed runs when there
  is none, and never while another engine runs); the last answer is written to P as Arrow IPC for the parent to check. Reply: ``status`` (``done``,
  ``unsupported``, ``error``, ``interrupted``), ``warmup_s``, ``times_s``, ``rows``,
  ``detail`` and the memory figures so far.
- ``{"cmd": "close"}``: stop the engine, reply with the final memory figures, exit.

The first line the child writes says whether the engine started (``ready``) or cannot
run here (``unavailable``). Replies go to a private copy of the original stdout; file
descriptor 1 is pointed at stderr so that whatever the libraries print (Ray, Daft's
progress bars) lands in the child's log, not in the protocol. A child in its own process
is what makes the memory figures per engine (:mod:`benchmarks._memory`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import IO, Any

from benchmarks._engines import ENGINES, EngineOptions, EngineUnavailable, QueryUnsupported
from benchmarks._memory import TreeSampler, driver_peak_rss_bytes

REPO_ROOT = Path(__file__).resolve().parents[1]

INTERRUPT_GRACE_S = 30.0
"""After a timeout, seconds the child gets to give up the query (SIGINT) before it is
killed."""


class EngineDied(Exception):
    """The engine's process ended or cannot be written to."""


class EngineTimeout(EngineDied):
    """The engine's process did not answer in time."""


# ---------------------------------------------------------------------------------------
# The child


def _memory(sampler: TreeSampler) -> dict[str, Any]:
    return {
        "driver_peak_rss_bytes": driver_peak_rss_bytes(),
        "tree_peak_pss_bytes": sampler.peak_bytes,
        "window_peak_pss_bytes": sampler.window_peak_bytes,
    }


def _reply(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _short(exc: BaseException, limit: int = 300) -> str:
    """``exc`` in one line without terminal colours: the first line of its message and,
    for a message of several lines (a remote traceback), the last one, which usually
    names the cause; each at most ``limit`` characters."""
    text = _ANSI.sub("", f"{type(exc).__name__}: {exc}").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]

    def cut(line: str) -> str:
        return line if len(line) <= limit else line[:limit] + " ..."

    if len(lines) <= 1:
        return cut(lines[0] if lines else type(exc).__name__)
    return f"{cut(lines[0])} ... {cut(lines[-1])}"


def _run_block(engine: Any, command: dict[str, Any], sampler: TreeSampler) -> dict[str, Any]:
    """Run one query block (warm-up and timed runs) and describe the outcome."""
    number = int(command["query"])
    reply: dict[str, Any] = {"query": number, "warmup_s": [], "times_s": [], "rows": None}
    sampler.reset_window()
    warmups = int(command["warmup"])
    try:
        run = engine.query(number)
        answer = None
        # Memory is sampled during the warm-up runs (the same query), not the timed ones:
        # a sample costs CPU (see TreeSampler) that the timed query would lose. Without
        # a warm-up run, the timed runs are sampled.
        sampler.resume()
        for _ in range(warmups):
            gc.collect()
            start = time.perf_counter()
            answer = run()
            reply["warmup_s"].append(time.perf_counter() - start)
        if warmups:
            sampler.sample()
            sampler.pause()
        for _ in range(int(command["runs"])):
            gc.collect()
            start = time.perf_counter()
            answer = run()
            reply["times_s"].append(time.perf_counter() - start)
        if answer is not None:
            answer.write_ipc(command["result_path"])
            reply["rows"] = answer.height
        reply["status"] = "done"
    except QueryUnsupported as exc:
        reply.update(status="unsupported", detail=_short(exc))
    except KeyboardInterrupt:
        reply.update(status="interrupted", detail="interrupted (timeout)")
    except Exception as exc:
        traceback.print_exc()
        reply.update(status="error", detail=_short(exc))
    sampler.pause()  # not while the other engines run their queries
    sampler.sample()
    reply.update(_memory(sampler))
    return reply


def serve(engine_name: str, data_dir: str, options_json: str) -> int:
    """The child's main loop (see the module docstring). Returns the exit status."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sampler = TreeSampler().start()
    options = EngineOptions(**json.loads(options_json))
    engine = ENGINES[engine_name](Path(data_dir), options)
    start = time.perf_counter()
    try:
        engine.start()
    except EngineUnavailable as exc:
        _reply(out, {"status": "unavailable", "detail": _short(exc)})
        return 0
    except Exception as exc:
        traceback.print_exc()
        _reply(out, {"status": "unavailable", "detail": f"failed to start: {_short(exc)}"})
        return 0
    sampler.pause()  # sampled again while this engine runs its queries' warm-ups
    sampler.sample()
    _reply(
        out,
        {
            "status": "ready",
            "start_s": time.perf_counter() - start,
            "versions": engine.versions(),
            "pid": os.getpid(),
        },
    )
    while True:
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:  # a late interrupt between two commands
            continue
        if not line:
            break
        command = json.loads(line)
        if command["cmd"] == "run":
            _reply(out, _run_block(engine, command, sampler))
        elif command["cmd"] == "close":
            break
    try:
        engine.close()
    except Exception:
        traceback.print_exc()
    sampler.stop()
    _reply(out, {"status": "closed", **_memory(sampler)})
    return 0


# ---------------------------------------------------------------------------------------
# The parent's handle on a child


class EngineProcess:
    """A child process running one engine, with a log file for its stderr.

    :meth:`start` returns the child's first message; :meth:`run` one query block;
    :meth:`close` stops it. A child that dies or times out is killed (its whole process
    group: it runs in a session of its own) and started again by the next :meth:`run`;
    the memory peaks are the largest over all its lifetimes.
    """

    def __init__(
        self,
        engine: str,
        data_dir: Path,
        options: EngineOptions,
        log_path: Path,
        start_timeout_s: float = 300.0,
    ) -> None:
        self.engine = engine
        self.data_dir = data_dir
        self.options = options
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.hello: dict[str, Any] | None = None
        self.memory: dict[str, int | None] = {
            "driver_peak_rss_bytes": None,
            "tree_peak_pss_bytes": None,
        }
        self.restarts = 0

    @property
    def available(self) -> bool:
        """Whether the engine started (or has not been tried yet)."""
        return self.hello is None or self.hello.get("status") == "ready"

    def start(self) -> dict[str, Any]:
        """Start the child and wait for its first message (``ready`` or ``unavailable``)."""
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "benchmarks._worker",
                    self.engine,
                    str(self.data_dir),
                    json.dumps(asdict(self.options)),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=REPO_ROOT,
                start_new_session=True,
            )
        finally:
            log.close()
        try:
            hello = self._read(self.start_timeout_s)
        except EngineDied as exc:
            hello = {"status": "unavailable", "detail": f"did not start: {exc}"}
            self._kill()
        if self.hello is None or hello.get("status") == "ready":
            self.hello = hello
        if hello.get("status") != "ready":
            self._wait()
        return hello

    def run(
        self, query: int, warmup: int, runs: int, result_path: Path, timeout_s: float
    ) -> dict[str, Any]:
        """Run one query block; the reply of the child, or a ``timeout``/``error`` status
        when it stopped answering."""
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.restarts += 1
            hello = self.start()
            if hello.get("status") != "ready":
                return {"status": "error", "detail": f"engine restart failed: {hello}"}
        command = {
            "cmd": "run",
            "query": query,
            "warmup": warmup,
            "runs": runs,
            "result_path": str(result_path),
        }
        deadline = time.monotonic() + timeout_s
        try:
            self._send(command)
            reply = self._read(timeout_s)
            # A late answer to an earlier, interrupted block is not this one's.
            while reply.get("query") != query:
                reply = self._read(max(0.0, deadline - time.monotonic()))
        except EngineTimeout:
            reply = self._interrupt()
            reply["status"] = "timeout"
            reply["detail"] = f"no answer within {timeout_s:g} s"
        except EngineDied as exc:
            self._kill()
            return {"status": "error", "detail": f"engine process died: {exc}"}
        self._note_memory(reply)
        return reply

    def close(self, timeout_s: float = 120.0) -> None:
        """Stop the child (politely, then by force) and keep its last memory figures."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self._send({"cmd": "close"})
                self._note_memory(self._read(timeout_s))
            except EngineDied:
                self._kill()
        self._wait()

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the child's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _note_memory(self, reply: dict[str, Any]) -> None:
        for key in self.memory:
            value = reply.get(key)
            if value is not None:
                self.memory[key] = max(self.memory[key] or 0, int(value))

    def _send(self, command: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(command) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise EngineDied(f"cannot write to the engine process: {exc}") from exc

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            raise EngineTimeout(f"no answer within {timeout_s:g} s")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise EngineDied(f"exit status {code}; log {self.log_path}:\n{self.log_tail()}")
        return json.loads(line)

    def _interrupt(self) -> dict[str, Any]:
        """Ask a child that overran to give up its query; kill it if it does not."""
        assert self.proc is not None
        try:
            self.proc.send_signal(signal.SIGINT)
            return self._read(INTERRUPT_GRACE_S)
        except (EngineDied, OSError):
            self._kill()
            return {}

    def _kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self._wait()

    def _wait(self) -> None:
        if self.proc is None:
            return
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2], sys.argv[3]))
