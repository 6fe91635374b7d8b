"""The user's Ray environment (runtime_env, namespace) and credentials kept out of sight."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

import shoal
from shoal.config import Config, redact
from shoal.runners.session import last_query

SECRET = "s3cr3t-t0ken"


@pytest.fixture(scope="module")
def ray_with_user_env() -> Iterator[None]:
    import ray

    shoal.shutdown()
    if ray.is_initialized():  # pragma: no cover
        ray.shutdown()
    shoal.set_config(
        num_cpus=2,
        ray_temp_dir=f"/tmp/shoal-ray-e{os.getpid()}",
        ray_runtime_env={"env_vars": {"SHOAL_TEST_FLAG": "from-runtime-env"}},
        ray_namespace="shoal-test-ns",
    )
    try:
        yield
    finally:
        shoal.shutdown()
        shoal.set_config(num_cpus=None, ray_temp_dir=None, ray_runtime_env={}, ray_namespace=None)


@pytest.mark.usefixtures("ray_with_user_env")
def test_runtime_env_and_namespace_reach_the_workers() -> None:
    import ray

    lf = pl.LazyFrame({"k": [1, 2, 1, None, 2], "v": [1.0, -0.0, float("nan"), 2.0, None]})
    q = lf.group_by("k").agg(pl.col("v").sum()).sort("k")
    got = q.collect(engine=shoal.DistEngine(runner="ray", raise_on_fail=True))
    assert got.equals(q.collect(engine="in-memory"))
    assert ray.get_runtime_context().namespace == "shoal-test-ns"

    @ray.remote
    def env() -> tuple[str | None, str | None]:
        return os.environ.get("SHOAL_TEST_FLAG"), os.environ.get("POLARS_MAX_THREADS")

    # The job's runtime_env is the user's, with the Polars thread count shoal adds.
    assert ray.get(env.remote()) == ("from-runtime-env", "1")


def test_runtime_env_validation() -> None:
    with pytest.raises(ValueError, match="ray_runtime_env"):
        Config(ray_runtime_env="pip")  # type: ignore[arg-type]
    cfg = Config.from_env({"SHOAL_RAY_RUNTIME_ENV": '{"env_vars": {"A": "1"}}'})
    assert cfg.ray_runtime_env["env_vars"]["A"] == "1"
    with pytest.raises(ValueError, match="ray_namespace"):
        Config(ray_namespace=5)  # type: ignore[arg-type]


def test_redact() -> None:
    assert redact(f"ray://alice:{SECRET}@head:10001") == "ray://***@head:10001"
    assert redact(f"https://h/x?a=1&token={SECRET}&b=2") == "https://h/x?a=1&token=***&b=2"
    assert redact("ray://head:10001") == "ray://head:10001"


def test_credentials_in_the_address_appear_nowhere(tmp_path: Path) -> None:
    address = f"ray://alice:{SECRET}@127.0.0.1:1"
    cfg = Config(
        runner="local",
        ray_address=address,
        ray_runtime_env={"env_vars": {"AWS_SECRET_ACCESS_KEY": SECRET}},
    )
    lf = pl.LazyFrame({"a": [1, 2, 3]}).select(pl.col("a").sum())
    shown = [repr(cfg), str(cfg.non_defaults()), shoal.explain(lf, config=cfg)]
    trace = tmp_path / "q.json"
    with shoal.trace(str(trace)):
        assert lf.collect(engine=shoal.DistEngine(config=cfg, raise_on_fail=True)).item() == 6
    shown.append(trace.read_text())
    json.loads(shown[-1])
    with pytest.raises(shoal.ShoalError) as err:
        lf.collect(
            engine=shoal.DistEngine(
                config=cfg.replace(runner="ray", ray_connect_timeout_s=0.5), raise_on_fail=True
            )
        )
    shown.append(str(err.value))
    assert "127.0.0.1:1" in shown[-1]
    for text in shown:
        assert SECRET not in text


@pytest.mark.usefixtures("ray_with_user_env")
def test_task_cpus_per_query_reach_ray_and_impossible_requests_fail_first() -> None:
    lf = pl.LazyFrame({"k": [i % 5 for i in range(400)], "v": [float(i) for i in range(400)]})
    q = lf.group_by("k").agg(pl.col("v").sum()).sort("k")
    expected = q.collect(engine="in-memory")
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True)
    # The local instance has 2 CPUs.
    with (
        shoal.execution_config(task_cpus=3),
        pytest.raises(shoal.ShoalError, match=r"task_cpus=3 .* \(the largest has 2\)"),
    ):
        q.collect(engine=engine)
    with shoal.execution_config(task_cpus=2, default_partitions=8, shuffle_partitions=4):
        assert q.collect(engine=engine).equals(expected)
    report = last_query()
    assert report is not None
    spans = sorted((s.start, s.end) for s in report.task_stats.values())
    assert len(spans) >= 8
    # Each task held both CPUs of the instance, so no two ran at the same time.
    assert all(b[0] >= a[1] - 1e-3 for a, b in zip(spans, spans[1:], strict=False))
