"""TPC-H for shoal: the queries in Polars form, data generation and result comparison.

Used by the ``shoal tpch`` command, the tests and the benchmarks.
"""

from __future__ import annotations

from shoal.tpch.compare import assert_frames_match, compare_frames
from shoal.tpch.datagen import add_empty_partition, default_data_dir, generate
from shoal.tpch.queries import QUERIES, SORT_KEYS, TABLE_NAMES, Tables, scan_tables

__all__ = [
    "QUERIES",
    "SORT_KEYS",
    "TABLE_NAMES",
    "Tables",
    "add_empty_partition",
    "assert_frames_match",
    "compare_frames",
    "default_data_dir",
    "generate",
    "scan_tables",
]
