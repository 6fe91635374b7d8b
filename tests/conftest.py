"""Shared fixtures: a small TPC-H data set, and one Ray instance per test module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import shoal
from shoal.tpch.datagen import add_empty_partition, generate

#: ``--shoal-engine`` runs a module's plain ``LazyFrame.collect()`` calls on shoal.
pytest_plugins = ["tests.plugin_shoal_engine"]

#: Small partitions so that every stage of a TPC-H query has several of them.
SMALL_PARTITION_BYTES = 96 * 1024


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
