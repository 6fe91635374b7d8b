"""Every worker must run the driver's versions of shoal, Polars, pyarrow and DuckDB."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

import shoal
from shoal.config import check_versions, query_digest, software_versions
from shoal.errors import VersionMismatchError


def test_versions_join_the_digest_every_task_checks() -> None:
    versions = software_versions()
    assert f"polars={pl.__version__}" in versions
    assert query_digest(shoal.Config()) == f"{shoal.Config().digest()};{versions}"
    check_versions(versions)  # the same versions: no error
    other = versions.replace(f"polars={pl.__version__}", "polars=0.0.1")
    with pytest.raises(VersionMismatchError, match=r"polars .* \(driver: 0\.0\.1\)"):
        check_versions(other)


@pytest.fixture(scope="module")
def ray_with_a_fake_polars_on_the_workers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[None]:
    """A local Ray instance whose workers see another Polars version: a sitecustomize on
    their path rewrites ``polars.__version__`` at interpreter start (the driver is not
    affected)."""
    import ray

    fake = tmp_path_factory.mktemp("fakepolars")
    Path(fake, "sitecustomize.py").write_text("import polars\npolars.__version__ = '0.0.0+fake'\n")
    path = os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH", "")) if p)
    shoal.shutdown()
    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=f"/tmp/shoal-ray-v{os.getpid()}",
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    try:
        yield
    finally:
        shoal.shutdown()
        ray.shutdown()


@pytest.mark.usefixtures("ray_with_a_fake_polars_on_the_workers")
def test_a_worker_with_another_polars_fails_the_query_naming_node_and_versions() -> None:
    lf = pl.LazyFrame({"k": [1, 2, 1, None], "v": [1.0, -0.0, float("nan"), 2.0]})
    q = lf.group_by("k").agg(pl.col("v").sum())
    # On a worker: a small query's one task runs in the driver by default.
    engine = shoal.DistEngine(runner="ray", raise_on_fail=True, small_query_where="worker")
    with pytest.raises(VersionMismatchError) as err:
        q.collect(engine=engine)
    text = str(err.value)
    assert f"polars 0.0.0+fake (driver: {pl.__version__})" in text
    assert "Ray node" in text
