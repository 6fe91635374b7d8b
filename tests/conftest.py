"""Shared fixtures: a small TPC-H data set, and one Ray instance per test module."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal.tpch.datagen import add_empty_partition, generate

#: ``--shoal-engine`` runs a module's plain ``LazyFrame.collect()`` calls on shoal.
pytest_plugins = ["tests.plugin_shoal_engine"]

#: Small partitions so that every stage of a TPC-H query has several of them.
SMALL_PARTITION_BYTES = 96 * 1024


@pytest.fixture(autouse=True)
def _lowered_small_queries(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small queries run on shoal's own lowering in this suite, as every task of a
    distributed plan does: the suite compares shoal's answers with the frontends', and
    with ``small_query_native`` (on by default) a small Polars query would be answered by
    Polars itself. Tests marked ``native_small_query`` keep the setting as configured (the
    hand-back itself is tested there)."""
    if request.node.get_closest_marker("native_small_query") is None:
        import shoal.runners.session as session

        monkeypatch.setattr(session, "_run_native", lambda physical, native: None)


@pytest.fixture(scope="session")
def tpch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TPC-H scale 0.01, four files per table plus one empty file per table."""
    root = generate(0.01, tmp_path_factory.mktemp("tpch"), parts=4)
    add_empty_partition(root)
    return root


@pytest.fixture(scope="session")
def tpch_sf01_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """TPC-H scale 0.1, four files per table plus one empty file per table."""
    root = generate(0.1, tmp_path_factory.mktemp("tpch-sf0.1"), parts=4)
    add_empty_partition(root)
    return root


@pytest.fixture(scope="module")
def ray_runner() -> Iterator[None]:
    """A local Ray instance (2 CPUs) for the module, shut down after it."""
    shoal.shutdown()
    shoal.set_config(num_cpus=2, ray_temp_dir=f"/tmp/shoal-ray-{os.getpid()}")
    yield
    shoal.shutdown()
    shoal.set_config(num_cpus=None, ray_temp_dir=None)


@contextlib.contextmanager
def ray_test_cluster(
    head_cpus: int, worker_cpus: list[int], name: str
) -> Iterator[tuple[Any, list[Any]]]:
    """A ``ray.cluster_utils.Cluster`` on this machine (a head with ``head_cpus`` CPUs and
    one worker node per entry of ``worker_cpus``), set as shoal's Ray address for the
    block; yields the cluster and its worker nodes, and shuts everything down after."""
    import ray
    from ray.cluster_utils import Cluster

    shoal.shutdown()
    if ray.is_initialized():  # pragma: no cover
        ray.shutdown()
    # Cluster writes Ray's address file under /tmp/ray without creating the folder: on a
    # machine where no Ray ever ran, it raised FileNotFoundError.
    os.makedirs("/tmp/ray", exist_ok=True)
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": head_cpus, "temp_dir": f"/tmp/shoal-ray-{name}-{os.getpid()}"},
    )
    workers = [c.add_node(num_cpus=n) for n in worker_cpus]
    c.wait_for_nodes()
    shoal.set_config(ray_address=c.address)
    try:
        yield c, workers
    finally:
        shoal.shutdown()
        if ray.is_initialized():
            ray.shutdown()
        shoal.set_config(ray_address=None)
        c.shutdown()


def own_ray_processes(
    stage_prefix: str | tuple[str, ...] = "ray::shoal-stage",
) -> list[tuple[int, str]]:
    """Processes of this test's own Ray instance or cluster (descendants of this process:
    its raylets and workers) whose title starts with ``stage_prefix`` (one prefix or a
    tuple of them). Never another program's: the machine may run other Ray instances,
    whose workers have the same titles."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True)
    parent: dict[int, int] = {}
    titles: dict[int, str] = {}
    for line in out.stdout.splitlines():
        pid, ppid, *rest = line.split(None, 2)
        parent[int(pid)] = int(ppid)
        titles[int(pid)] = rest[0] if rest else ""
    me = os.getpid()

    def ours(pid: int) -> bool:
        seen = set()
        while pid not in (0, 1) and pid not in seen:
            if pid == me:
                return True
            seen.add(pid)
            pid = parent.get(pid, 0)
        return False

    return [
        (pid, args)
        for pid, args in titles.items()
        if args.startswith(stage_prefix) and pid != me and ours(pid)
    ]


def task_plans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The Polars plans the tasks collect from now on (as optimised), in order: the
    kernel's ``collect`` is wrapped for the rest of the test."""
    import polars as pl

    import shoal.execution.kernel as kernel

    plans: list[str] = []
    real = kernel.collect

    def spy(lf: pl.LazyFrame) -> pl.DataFrame:
        plans.append(lf.explain(optimizations=kernel.collect_optimizations()))
        return real(lf)

    monkeypatch.setattr(kernel, "collect", spy)
    return plans


def collect_as_native(q: Any, runner: str = "local", **settings: Any) -> Any:
    """``q`` (a Polars LazyFrame) collected on shoal with ``settings``, checked against
    Polars' in-memory engine (rows in any order, floats to Polars' default tolerance);
    returns shoal's frame."""
    from polars.testing import assert_frame_equal

    engine = shoal.DistEngine(runner=runner, raise_on_fail=True, **settings)  # type: ignore[arg-type]
    got = q.collect(engine=engine)
    want = q.collect(engine="in-memory")
    assert_frame_equal(got.sort(got.columns), want.sort(want.columns), check_exact=False)
    return got


def hash_exchanges(q: Any, **settings: Any) -> int:
    """The hash exchanges of ``q``'s physical plan for 2 CPUs with ``settings``."""
    from shoal.config import Config
    from shoal.planner.physical import HashOutput, plan_physical
    from shoal_polars.engine import to_ir

    plan = plan_physical(to_ir(q), Config(**settings), 2)
    return sum(isinstance(s.output, HashOutput) for s in plan.stages)
