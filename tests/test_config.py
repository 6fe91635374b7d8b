"""Config: parsing, freezing, per-query snapshots that every task installs (on Ray)."""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl
import pytest

import shoal
from shoal.config import Config, config_page, register_extension
from shoal.runners.session import last_query

from .irplans import agg_sort_plan, frame

pytestmark = pytest.mark.usefixtures("ray_runner")


def test_env_values_parse_and_bad_values_name_the_variable() -> None:
    cfg = Config.from_env(
        {
            "SHOAL_SHUFFLE_PARTITIONS": "64",
            "SHOAL_RAISE_ON_FAIL": "true",
            "SHOAL_RAY_ADDRESS": "ray://h:10001",
            "SHOAL_RUNNER": "local",
        }
    )
    assert (cfg.shuffle_partitions, cfg.raise_on_fail, cfg.ray_address, cfg.runner) == (
        64,
        True,
        "ray://h:10001",
        "local",
    )
    with pytest.raises(ValueError, match="SHOAL_SHUFFLE_PARTITIONS='abc': expected an integer"):
        Config.from_env({"SHOAL_SHUFFLE_PARTITIONS": "abc"})
    with pytest.raises(ValueError, match="SHOAL_RAISE_ON_FAIL='maybe': expected true or false"):
        Config.from_env({"SHOAL_RAISE_ON_FAIL": "maybe"})
    with pytest.raises(ValueError, match="SHOAL_RUNNER"):
        Config.from_env({"SHOAL_RUNNER": "spark"})
    with pytest.raises(ValueError, match="SHOAL_TARGET_PARTITION_BYTES"):
        Config.from_env({"SHOAL_TARGET_PARTITION_BYTES": "-5"})
    with pytest.raises(TypeError, match="unknown shoal setting"):
        Config().replace(shuffle_partitons=3)


def test_docs_config_page_matches_the_dataclass() -> None:
    page = Path(__file__).resolve().parents[1] / "docs" / "config.md"
    assert page.read_text() == config_page(), (
        "docs/config.md is stale; regenerate it with shoal.config.config_page()"
    )


def test_snapshot_is_hashable_and_digest_is_content_based() -> None:
    a, b = Config(shuffle_partitions=3), Config(shuffle_partitions=3)
    assert a == b and hash(a) == hash(b) and a.digest() == b.digest()
    assert a.digest() != Config(shuffle_partitions=4).digest()
    assert len(a.digest()) == 16


def test_digest_kept_on_the_snapshot_stays_its_content_hash() -> None:
    """The digest kept on a snapshot (asked by every task) is the content hash: the same
    for an equal snapshot, after a pickle round trip (a Ray task's copy), and not carried
    to a changed copy; the snapshot still compares and prints by its settings."""
    import pickle

    a = Config(shuffle_partitions=3, target_partition_bytes=1 << 20)
    first = a.digest()
    assert a.digest() == first
    copy = pickle.loads(pickle.dumps(a))
    assert copy == a and copy.digest() == first
    assert Config(shuffle_partitions=3, target_partition_bytes=1 << 20).digest() == first
    changed = a.replace(shuffle_partitions=4)
    assert changed.digest() != first
    assert changed.digest() == Config(shuffle_partitions=4, target_partition_bytes=1 << 20).digest()
    assert a == Config(shuffle_partitions=3, target_partition_bytes=1 << 20)
    assert "_digest" not in repr(a)


def test_extensions_are_validated_frozen_and_shipped() -> None:
    def validate(value: object) -> None:
        if not isinstance(value, dict | shoal.config.FrozenDict) or "model" not in value:
            raise ValueError("mylib needs a 'model'")

    register_extension("mylib", validate)
    with pytest.raises(ValueError, match="mylib needs a 'model'"):
        Config(extensions={"mylib": {}})
    with pytest.raises(ValueError, match="no extension registered"):
        Config(extensions={"unknown-lib": {}})
    cfg = Config(extensions={"mylib": {"model": "m1", "sizes": [1, 2]}})
    assert cfg.extensions["mylib"]["sizes"] == (1, 2)
    with pytest.raises(TypeError):
        cfg.extensions["mylib"]["model"] = "x"  # type: ignore[index]
    plan, expected = agg_sort_plan(frame())
    got = shoal.execute(plan, runner="ray", config=cfg.replace(default_partitions=4))
    assert pl.from_arrow(got).equals(expected)
    digests = {s.config_digest for s in last_query().task_stats.values()}  # type: ignore[union-attr]
    assert digests == {cfg.replace(default_partitions=4).digest()}


def _digests() -> set[str]:
    report = last_query()
    assert report is not None
    return {s.config_digest for s in report.task_stats.values()}


def test_every_ray_task_sees_the_query_snapshot_and_the_next_query_the_new_one() -> None:
    plan, expected = agg_sort_plan(frame())
    with shoal.execution_config(default_partitions=5, sort_sample_rows=77):
        first = shoal.get_config()
        assert pl.from_arrow(shoal.execute(plan, runner="ray")).equals(expected)
    assert _digests() == {first.digest()}
    with shoal.execution_config(default_partitions=5, sort_sample_rows=78):
        second = shoal.get_config()
        assert pl.from_arrow(shoal.execute(plan, runner="ray")).equals(expected)
    assert _digests() == {second.digest()}


def test_a_config_snapshot_reused_across_queries_follows_every_change() -> None:
    """The Ray runner keeps a config snapshot in the object store for the next query with
    an equal config (issue 17): each query's tasks still run under its own settings, when
    they change, change back, and stay the same."""
    plan, expected = agg_sort_plan(frame())
    seen = []
    for rows in (77, 78, 77, 77, 79, 78):
        with shoal.execution_config(default_partitions=5, sort_sample_rows=rows):
            want = shoal.get_config().digest()
            assert pl.from_arrow(shoal.execute(plan, runner="ray")).equals(expected)
        seen.append(_digests() == {want})
    assert all(seen), seen


def test_execution_config_changes_the_plan_of_queries_inside_only() -> None:
    plan, _ = agg_sort_plan(frame())
    with shoal.execution_config(default_partitions=4, shuffle_partitions=3):
        shoal.execute(plan, runner="local")
    shuffle = [
        s
        for s in last_query().physical.stages
        if s.inputs  # type: ignore[union-attr]
        and s.inputs[0].mode == "bucket"
    ]
    assert shuffle and all(s.num_tasks == 3 for s in shuffle)
    assert shoal.get_config().shuffle_partitions == 0


def test_driver_config_changes_during_a_query_do_not_reach_its_tasks() -> None:
    plan, expected = agg_sort_plan(frame(4000))
    cfg = Config(default_partitions=48)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            shoal.set_config(sort_sample_rows=100 + i % 50)

    t = threading.Thread(target=churn)
    t.start()
    try:
        got = shoal.execute(plan, runner="ray", config=cfg)
    finally:
        stop.set()
        t.join()
    shoal.set_config(sort_sample_rows=1000)
    assert pl.from_arrow(got).equals(expected)
    assert _digests() == {cfg.digest()}


def test_config_is_put_in_the_object_store_once_per_distinct_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not once per task; and a query under the same settings as an earlier one reuses that
    query's object (issue 17), while a changed setting puts a new one."""
    import ray

    plan, _ = agg_sort_plan(frame())
    # (adaptive=False: every planned task runs, none coalesced)
    config = Config(default_partitions=6, adaptive=False)
    shoal.execute(plan, runner="ray", config=config)  # runner started
    puts: list[object] = []
    real_put = ray.put

    def counting_put(value: object, **kw: object) -> object:
        puts.append(value)
        return real_put(value, **kw)

    monkeypatch.setattr(ray, "put", counting_put)
    shoal.execute(plan, runner="ray", config=config)
    assert len(last_query().task_stats) > 10  # type: ignore[union-attr]
    assert [type(p).__name__ for p in puts].count("Config") == 0  # the first query's
    shoal.execute(plan, runner="ray", config=config.replace(sort_sample_rows=91))
    assert len(last_query().task_stats) > 10  # type: ignore[union-attr]
    assert [type(p).__name__ for p in puts].count("Config") == 1


def test_runner_settings_freeze_once_the_runner_starts() -> None:
    plan, _ = agg_sort_plan(frame())
    shoal.execute(plan, runner="ray")
    with pytest.raises(shoal.ConfigFrozenError, match=r"runner.*shoal.shutdown\(\)"):
        shoal.set_config(runner="local")
    with (
        pytest.raises(shoal.ConfigFrozenError, match="num_cpus"),
        shoal.execution_config(num_cpus=1),
    ):
        pass
    shoal.set_config(shuffle_partitions=0)  # execution settings still change


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("raise_on_fail", "no"),  # a truthy string is not True
        ("trace", 5),
        ("ray_address", 123),
        ("ray_dashboard", "yes"),
        ("task_cpus", True),  # bool is not an int here
        ("ray_connect_timeout_s", float("nan")),
        ("ray_connect_timeout_s", float("inf")),
        ("num_cpus", 2.5),
        ("target_partition_bytes", "lots"),
    ],
)
def test_every_setting_is_checked_against_its_type(setting: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"shoal setting {setting}"):
        Config(**{setting: value})


def test_sizes_take_units() -> None:
    assert Config(target_partition_bytes="128MiB").target_partition_bytes == 128 * 2**20
    assert Config(broadcast_join_threshold_bytes="1.5 GiB").broadcast_join_threshold_bytes == (
        3 * 2**29
    )
    cfg = Config.from_env({"SHOAL_MAX_BYTES_HELD": "500kB", "SHOAL_OBJECT_STORE_BYTES": "2GiB"})
    assert (cfg.max_bytes_held, cfg.object_store_bytes) == (500_000, 2 * 2**30)
    with pytest.raises(ValueError, match="SHOAL_TARGET_PARTITION_BYTES"):
        Config.from_env({"SHOAL_TARGET_PARTITION_BYTES": "12 parsecs"})


def test_a_misspelt_variable_warns_with_the_closest_name() -> None:
    with pytest.warns(shoal.ShoalWarning, match="SHOAL_RUNER .* did you mean SHOAL_RUNNER"):
        cfg = Config.from_env({"SHOAL_RUNER": "local", "SHOAL_DATA_DIR": "/x"})
    assert cfg.runner == "ray"  # ignored, as the warning says


def test_version_is_exposed() -> None:
    import subprocess
    import sys
    from importlib.metadata import version

    assert shoal.__version__ == version("shoal")
    cli = Path(sys.executable).with_name("shoal")  # the console script pip installed
    out = subprocess.run([str(cli), "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == f"shoal {shoal.__version__}"


def test_unknown_setting_names_the_closest_one() -> None:
    """A misspelt keyword got Python's bare "unexpected keyword argument" (issue 18)."""
    with pytest.raises(
        TypeError, match="'default_partiton' is no shoal setting; did you mean 'default_partitions'"
    ):
        shoal.Config(default_partiton=8)  # type: ignore[call-arg]
    assert shoal.Config(default_partitions=8).default_partitions == 8
