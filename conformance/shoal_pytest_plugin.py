"""pytest plugin: run a test suite's plain Polars queries on shoal, and record what happened.

With ``--shoal-engine``, every ``LazyFrame.collect()`` that leaves the engine to Polars
(``engine="auto"``, the default) runs with ``engine=DistEngine(runner="local", ...)`` instead,
on very small partitions: in-memory frames cut into ``--shoal-partitions`` row ranges (3 by
default, so that small test frames get empty partitions too), file scans cut into pieces of
``--shoal-scan-bytes`` (a few KiB: several pieces per test file), and that many partitions
after every exchange. So any Polars-style test file becomes a conformance test of shoal::

    pytest -p tests.plugin_shoal_engine --shoal-engine tests/test_polars_conformance.py

``conformance/polars_suite.py`` loads this module as ``-p shoal_pytest_plugin`` to run
Polars' own unit-test suite the same way (``tests/plugin_shoal_engine.py`` re-exports it for
shoal's own tests; the two names are never loaded together).

A query shoal cannot translate raises :class:`shoal.UnsupportedError` (the test fails and
says what shoal does not run); with ``--shoal-fallback`` it runs on Polars after a
:class:`shoal_polars.ShoalFallbackWarning` instead (the warning is re-issued after the
collect returns, so ``-W ignore::shoal_polars.ShoalFallbackWarning`` silences it). Collects
that name an engine (``engine="in-memory"``, ``engine="streaming"``, an engine object),
background collects, and Polars' own eager ``DataFrame`` methods are left alone.

**Nested queries.** A collect made while a shoal query is running in this process (shoal's
kernel collects each fragment in worker threads; a Python UDF inside a task may collect too)
always stays on Polars: routing it to shoal again would start a nested query on a thread
pool that the outer query already fills, and the local runner would deadlock.

``--shoal-record DIR`` writes one JSON line per test to ``DIR/<worker>.jsonl``: its node id,
outcome (``passed``, ``failed``, ``skipped``, ``xfailed``, ``error``), the phase and the
exception class, message and cause chain of a failure, and the counts of collects routed
to shoal, plans shoal's translator saw, and fallbacks (with their reasons).
``--shoal-only FILE`` deselects every collected test whose node id is not a line of FILE and
runs the others in FILE's order.
The terminal summary says how many collects ran on shoal.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import traceback
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

#: Default bytes per file-scan partition under the plugin: a few row groups' worth of a
#: test file, so that scans of small test files are split too.
SCAN_PARTITION_BYTES = 4096

#: Collects routed to shoal over the session (the terminal summary prints it).
_counts = {"shoal": 0}

#: Shoal queries running now in this process. While one runs, every other collect (shoal's
#: kernel's own, in worker threads, or a UDF's inside a task) stays on Polars.
_active = {"n": 0}
_active_lock = threading.Lock()

#: Per-test counters, reset before each test.
_test: dict[str, Any] = {}


def _reset_test_counters() -> None:
    _test.clear()
    _test.update(eligible=0, routed=0, reached=0, fallbacks=0, fallback_reasons=[], nested=0)


_reset_test_counters()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("shoal")
    group.addoption(
        "--shoal-engine",
        action="store_true",
        help="run every LazyFrame.collect() that uses Polars' default engine on shoal "
        "(local runner, very small partitions)",
    )
    group.addoption(
        "--shoal-fallback",
        action="store_true",
        help="with --shoal-engine: queries shoal cannot translate run on Polars with a "
        "warning instead of failing",
    )
    group.addoption(
        "--shoal-partitions",
        type=int,
        default=3,
        help="with --shoal-engine: partitions per in-memory frame and after each exchange",
    )
    group.addoption(
        "--shoal-scan-bytes",
        type=int,
        default=SCAN_PARTITION_BYTES,
        help="with --shoal-engine: target bytes per file-scan partition",
    )
    group.addoption(
        "--shoal-record",
        default=None,
        metavar="DIR",
        help="write one JSON line per test (outcome, error, shoal counts) to DIR/<worker>.jsonl",
    )
    group.addoption(
        "--shoal-only",
        default=None,
        metavar="FILE",
        help="run only the tests whose node ids are lines of FILE, in FILE's order",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--shoal-only FILE``: keep the tests listed in FILE, in FILE's order (so a run in a
    random order can stop at any point and still have run a uniform sample)."""
    only = config.getoption("--shoal-only")
    if not only:
        return
    position = {line: n for n, line in enumerate(Path(only).read_text().splitlines())}
    keep = sorted(
        (item for item in items if item.nodeid in position), key=lambda i: position[i.nodeid]
    )
    dropped = [item for item in items if item.nodeid not in position]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def _make_engine(config: pytest.Config) -> Any:
    import shoal
    from shoal_polars import ShoalFallbackWarning

    class RecordingEngine(shoal.DistEngine):
        """``DistEngine`` that counts the plans it sees and the fallbacks it takes; its
        fallback warnings are kept and re-issued after the collect (see the module doc)."""

        pending: list[str] = []

        def _translate_or_fall_back(self, nt: Any, *args: Any, **kwargs: Any) -> None:
            # Every plan DistEngine.collect translates passes here (both passes of a
            # rewritten query too).
            _test["reached"] += 1
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ShoalFallbackWarning)
                super()._translate_or_fall_back(nt, *args, **kwargs)
            for w in caught:
                if issubclass(w.category, ShoalFallbackWarning):
                    _test["fallbacks"] += 1
                    if len(_test["fallback_reasons"]) < 5:
                        _test["fallback_reasons"].append(str(w.message)[:2000])
                    self.pending.append(str(w.message))
                else:
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    partitions = config.getoption("--shoal-partitions")
    return RecordingEngine(
        runner="local",
        raise_on_fail=not config.getoption("--shoal-fallback"),
        config=shoal.Config(
            default_partitions=partitions,
            shuffle_partitions=partitions,
            target_partition_bytes=config.getoption("--shoal-scan-bytes"),
        ),
    )


def _eligible(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a ``LazyFrame.collect`` call leaves the engine to Polars (the calls the
    plugin routes to shoal)."""
    return not (
        args
        or kwargs.get("engine", "auto") != "auto"
        or kwargs.get("background", False)
        or "post_opt_callback" in kwargs
    )


@pytest.fixture(autouse=True)
def _shoal_engine(request: pytest.FixtureRequest) -> Iterator[None]:
    """Route default-engine ``LazyFrame.collect`` calls to shoal for the test, when asked.

    Without ``--shoal-engine`` but with ``--shoal-record``, the calls only are counted
    (``eligible``): a test with none cannot reach shoal, so a shoal run may skip it."""
    engine_on = request.config.getoption("--shoal-engine")
    if not engine_on and not request.config.getoption("--shoal-record"):
        yield
        return
    original = pl.LazyFrame.collect

    if not engine_on:

        @functools.wraps(original)
        def collect_counted(self: pl.LazyFrame, *args: Any, **kwargs: Any) -> Any:
            if _eligible(args, kwargs):
                _test["eligible"] += 1
            return original(self, *args, **kwargs)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(pl.LazyFrame, "collect", collect_counted)
            yield
        return

    from shoal_polars import ShoalFallbackWarning

    engine = _make_engine(request.config)

    @functools.wraps(original)
    def collect_on_shoal(self: pl.LazyFrame, *args: Any, **kwargs: Any) -> Any:
        if not _eligible(args, kwargs):
            return original(self, *args, **kwargs)
        with _active_lock:
            nested = _active["n"] > 0
            if not nested:
                _active["n"] += 1
        if nested:  # a collect made while a shoal query runs: never shoal again
            _test["nested"] += 1
            return original(self, *args, **kwargs)
        _counts["shoal"] += 1
        _test["eligible"] += 1
        _test["routed"] += 1
        kwargs["engine"] = engine
        try:
            return original(self, **kwargs)
        finally:
            with _active_lock:
                _active["n"] -= 1
            pending, engine.pending[:] = list(engine.pending), []
            for message in pending:
                warnings.warn(message, ShoalFallbackWarning, stacklevel=2)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pl.LazyFrame, "collect", collect_on_shoal)
        yield


# ----------------------------------------------------------------------------- recording


def _worker_id(config: pytest.Config) -> str:
    worker = getattr(config, "workerinput", None)
    return worker["workerid"] if worker else "main"


def _error_info(excinfo: pytest.ExceptionInfo[BaseException]) -> dict[str, Any]:
    exc = excinfo.value
    chain: list[dict[str, str]] = []
    cause: BaseException | None = exc
    while cause is not None and len(chain) < 6:
        chain.append(
            {
                "type": f"{type(cause).__module__}.{type(cause).__qualname__}",
                "message": str(cause)[:3000],
            }
        )
        cause = cause.__cause__ or cause.__context__
    tb = traceback.extract_tb(excinfo.tb)
    where = [f"{f.filename}:{f.lineno}:{f.name}" for f in tb[-4:]]
    return {
        "type": chain[0]["type"],
        "message": chain[0]["message"],
        "chain": chain,
        "where": where,
    }


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    if not item.config.getoption("--shoal-record"):
        return
    report = outcome.get_result()
    state = item.stash.setdefault(_STATE_KEY, {"outcome": "passed", "seconds": 0.0})
    state["seconds"] = round(state["seconds"] + report.duration, 3)
    if report.skipped:
        if hasattr(report, "wasxfail"):
            state["outcome"] = "xfailed"
        elif state["outcome"] == "passed":
            state["outcome"] = "skipped"
    elif report.failed and state["outcome"] not in ("failed", "error"):
        state["outcome"] = "failed" if report.when == "call" else "error"
        state["when"] = report.when
        if call.excinfo is not None:
            state["error"] = _error_info(call.excinfo)
        else:  # e.g. a strict xfail that passed
            state["error"] = {"type": "XPASS(strict)", "message": str(report.longrepr)[:500]}


_STATE_KEY = pytest.StashKey[dict[str, Any]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _reset_test_counters()
    yield
    directory = item.config.getoption("--shoal-record")
    if not directory:
        return
    state = item.stash.get(_STATE_KEY, {"outcome": "unknown"})
    record = {"nodeid": item.nodeid, **state, **_test}
    path = Path(directory) / f"{_worker_id(item.config)}.jsonl"
    with path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    directory = config.getoption("--shoal-record", None)
    if directory:
        os.makedirs(directory, exist_ok=True)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.getoption("--shoal-engine"):
        terminalreporter.write_line(
            f"shoal engine: {_counts['shoal']} LazyFrame.collect() calls ran on shoal"
        )
