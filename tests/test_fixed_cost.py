"""The Ray runner's per-query fixed cost: what it caches between queries (the cluster's
CPUs, the config snapshot in the object store) and that nothing cached goes stale in a way
that changes a query (issue 17). Fakes stand in for Ray: these need no Ray instance."""

from __future__ import annotations

from typing import Any

import pytest

from shoal.config import Config
from shoal.errors import ShoalError
from shoal.runners.ray_runner import CLUSTER_VIEW_TTL_S, ClusterView, RayBackend


class _Nodes:
    """``ray.nodes()`` over a list that a test changes; counts the calls."""

    def __init__(self, *cpus: float) -> None:
        self.nodes = [
            {"Alive": True, "Resources": {"CPU": c, "object_store_memory": 100.0}} for c in cpus
        ]
        self.calls = 0

    def __call__(self) -> list[dict[str, Any]]:
        self.calls += 1
        return [dict(n) for n in self.nodes]

    def join(self, cpus: float) -> None:
        self.nodes.append({"Alive": True, "Resources": {"CPU": cpus, "object_store_memory": 100.0}})


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cluster_view_reads_once_per_ttl_and_sees_a_joined_node_after_it() -> None:
    nodes, clock = _Nodes(2, 4), _Clock()
    view = ClusterView(nodes, ttl_s=2.0, clock=clock)
    assert view.cpus() == (6.0, 4.0)
    assert view.cpus() == (6.0, 4.0)
    assert view.object_store_bytes() == 200
    assert nodes.calls == 1  # the later calls asked nobody
    nodes.join(8)
    nodes.nodes[0]["Alive"] = False  # a dead node counts for nothing
    clock.now += 1.0
    assert view.cpus() == (6.0, 4.0) and nodes.calls == 1  # within the TTL: cached
    clock.now += 1.0
    assert view.cpus() == (12.0, 8.0) and nodes.calls == 2  # the joined node is seen
    assert view.object_store_bytes() == 200  # one node gone, one joined
    nodes.join(16)
    assert view.cpus(fresh=True) == (28.0, 16.0) and nodes.calls == 3


class _FakeRef:
    def __init__(self, n: int) -> None:
        self.n = n

    def hex(self) -> str:
        return f"{self.n:040x}"


class _FakeRay:
    """The few ``ray`` calls ``RayBackend.begin_query`` makes."""

    def __init__(self, nodes: _Nodes) -> None:
        self.nodes = nodes
        self.puts: list[Config] = []

    def put(self, value: Config) -> _FakeRef:
        self.puts.append(value)
        return _FakeRef(len(self.puts))


def _backend(nodes: _Nodes) -> tuple[RayBackend, _FakeRay]:
    backend = RayBackend(Config())
    fake = _FakeRay(nodes)
    backend._ray = fake
    backend.cluster = ClusterView(nodes, ttl_s=CLUSTER_VIEW_TTL_S, clock=_Clock())
    return backend, fake


def test_equal_configs_share_one_snapshot_and_a_changed_config_gets_its_own() -> None:
    """The snapshot object is reused only for an equal config: a setting changed between
    queries is a new object (its tasks get the new value), and going back reuses the old
    one with the CPUs per task of its own config."""
    backend, fake = _backend(_Nodes(4))
    a = Config(default_partitions=5, sort_sample_rows=77)
    b = a.replace(sort_sample_rows=78)
    c = a.replace(task_cpus=2)
    first = backend.begin_query(a)
    assert backend.begin_query(Config(default_partitions=5, sort_sample_rows=77)) is first
    assert fake.puts == [a]
    second = backend.begin_query(b)
    assert second is not first and fake.puts == [a, b]
    third = backend.begin_query(c)
    assert backend.begin_query(a) is first and len(fake.puts) == 3
    assert backend._query_cpus[first.hex()] == 1
    assert backend._query_cpus[third.hex()] == 2
    backend.close()
    assert backend.begin_query(a) is not first  # a closed runner keeps no snapshots


def test_task_cpus_check_rereads_the_cluster_before_refusing() -> None:
    """The cached view may predate a node that joined: a query asking for more CPUs per task
    than the cached largest node reads the cluster again before it is refused."""
    nodes = _Nodes(2)
    backend, _ = _backend(nodes)
    backend.begin_query(Config())
    nodes.join(8)
    backend.begin_query(Config(task_cpus=8))  # the view said 2; the fresh read says 8
    with pytest.raises(ShoalError, match=r"task_cpus=9 .*the largest has 8"):
        backend.begin_query(Config(task_cpus=9))


def test_the_planner_and_backpressure_use_the_runners_cached_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A query on a running Ray runner takes the cluster's CPUs (the plan's size) and object
    store (the default ``max_bytes_held``) from the runner's view, not from a GCS call."""
    from shoal.runners import session
    from shoal.runners.memory import default_max_bytes_held

    nodes = _Nodes(2, 4)
    backend, _ = _backend(nodes)
    monkeypatch.setitem(session._backends, "ray", backend)
    assert session._cpus(Config(runner="ray")) == 6
    assert session.running_cpus(Config(runner="ray")) == 6
    assert default_max_bytes_held("ray", backend.object_store_bytes()) == 100
    assert nodes.calls == 1
