"""pytest plugin: run a test module's plain Polars queries on shoal.

With ``--shoal-engine``, every ``LazyFrame.collect()`` that leaves the engine to Polars
(``engine="auto"``, the default) runs with ``engine=DistEngine(runner="local", ...)`` instead,
on very small partitions: in-memory frames cut into ``--shoal-partitions`` row ranges (3 by
default, so that small test frames get empty partitions too), Parquet scans cut into pieces
of a few KiB, and that many partitions after every exchange. So any Polars-style test file
becomes a conformance test of shoal::

    pytest --shoal-engine tests/test_polars_conformance.py

A query shoal cannot translate raises :class:`shoal.UnsupportedError` (the test fails and
says what shoal does not run); with ``--shoal-fallback`` it runs on Polars after a
:class:`shoal_polars.ShoalFallbackWarning` instead. Collects that name an engine
(``engine="in-memory"``, ``engine="streaming"``, an engine object), background collects,
and Polars' own eager ``DataFrame`` methods are left alone. The terminal summary says how
many collects ran on shoal.

Register the plugin in ``tests/conftest.py`` with ``pytest_plugins = ["tests.plugin_shoal_engine"]``
or on the command line with ``-p tests.plugin_shoal_engine``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl
import pytest

#: Bytes per Parquet scan partition under the plugin: a few row groups' worth of a test file.
SCAN_PARTITION_BYTES = 4096

#: Collects routed to shoal, and how many are running now (tests run one at a time; while
#: one runs, collects from other threads are shoal's kernel's own).
_counts = {"shoal": 0, "active": 0}


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


@pytest.fixture(autouse=True)
def _shoal_engine(request: pytest.FixtureRequest) -> Iterator[None]:
    """Route default-engine ``LazyFrame.collect`` calls to shoal for the test, when asked."""
    if not request.config.getoption("--shoal-engine"):
        yield
        return
    import shoal

    partitions = request.config.getoption("--shoal-partitions")
    engine = shoal.DistEngine(
        runner="local",
        raise_on_fail=not request.config.getoption("--shoal-fallback"),
        config=shoal.Config(
            default_partitions=partitions,
            shuffle_partitions=partitions,
            target_partition_bytes=SCAN_PARTITION_BYTES,
        ),
    )
    original = pl.LazyFrame.collect

    def collect_on_shoal(self: pl.LazyFrame, *args: Any, **kwargs: Any) -> Any:
        if (
            _counts["active"]  # shoal's own collects (its kernel, in worker threads)
            or args
            or kwargs.get("engine", "auto") != "auto"
            or kwargs.get("background", False)
            or "post_opt_callback" in kwargs
        ):
            return original(self, *args, **kwargs)
        _counts["shoal"] += 1
        _counts["active"] += 1
        kwargs["engine"] = engine
        try:
            return original(self, **kwargs)
        finally:
            _counts["active"] -= 1

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pl.LazyFrame, "collect", collect_on_shoal)
        yield


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.getoption("--shoal-engine"):
        terminalreporter.write_line(
            f"shoal engine: {_counts['shoal']} LazyFrame.collect() calls ran on shoal"
        )
