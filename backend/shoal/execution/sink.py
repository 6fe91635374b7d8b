"""Writing query results to files: the task side and the driver side of a
:class:`~shoal.ir.nodes.Sink`.

Each task of a sink's stage writes its own partition with Polars' own Parquet writer
(:func:`write_partition`) and returns one row per file (path, rows, bytes). The driver
checks the target before any task runs (:func:`check_target`), gives a ``"split"`` sink a
fresh staging directory (:func:`prepare`), and after the last task renames the staged
files to Polars' names in partition order (:func:`commit`), or removes them when the
query failed or was cancelled (:func:`abort`). Renaming is a metadata operation: no data
passes through the driver.

The layouts are Polars 2.1's (``LazyFrame.sink_parquet`` with a path, or with
``pl.PartitionBy``), as measured by running it: ``PartitionBy(base, max_rows_per_file=n)``
writes ``base/00000000.parquet``, ``base/00000001.parquet``, ... (an empty result: one
empty file ``00000000.parquet``); ``PartitionBy(base, key="x")`` writes
``base/x=<value>/00000000.parquet`` per key value (a null key: ``x=__HIVE_DEFAULT_PARTITION__``;
an empty result: no file), numbering files per key.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import replace
from typing import Any

import polars as pl
import pyarrow as pa

from shoal.execution.kernel import _reader_options
from shoal.ir.nodes import SINK_SCHEMA, Sink

#: Polars' file names in a partitioned sink: the file's number, 8 hexadecimal digits
#: (Polars 2.1 writes ``00000009.parquet``, ``0000000a.parquet``, ...; measured).
FILE_NAME = "{index:08x}.{ext}"


def _files_frame(paths: list[str], rows: list[int], sizes: list[int]) -> pl.DataFrame:
    return pl.DataFrame(
        {"path": paths, "rows": rows, "bytes": sizes},
        schema={"path": pl.String, "rows": pl.Int64, "bytes": pl.Int64},
    )


def write_partition(df: pl.DataFrame, node: Sink) -> pl.DataFrame:
    """Write this task's rows ``df`` as ``node`` says (on the worker); return one row per
    file written, in file order: ``path`` (absolute), ``rows``, ``bytes`` (file size).

    Polars' writer does the work (``LazyFrame.sink_parquet`` with ``node.options``), so
    compression, statistics and row groups are exactly Polars'. Raises what Polars raises
    for a file it cannot write (``OSError`` and its subclasses)."""
    options = _reader_options(node.options)
    written: list[Any] = []
    target: Any
    if node.layout == "file":
        target = node.path
    else:
        base = node.path
        if node.staging:  # a directory of this task's own, moved into place by commit()
            base = os.path.join(node.path, node.staging, uuid.uuid4().hex)
        keys: dict[str, Any] = {}
        if node.layout == "hive":
            keys = {"key": list(node.partition_by), "include_key": node.include_key}
        target = pl.PartitionBy(
            base,
            max_rows_per_file=node.max_rows_per_file,
            approximate_bytes_per_file=node.max_bytes_per_file,
            **keys,
        )
    df.lazy().sink_parquet(
        target,
        engine="streaming",
        maintain_order=True,
        sinked_paths_callback=lambda args: written.extend(args.paths),
        **options,
    )
    written.sort(key=lambda p: p.path)
    return _files_frame(
        [os.path.abspath(p.path) for p in written],
        [p.num_rows for p in written],
        [p.num_bytes for p in written],
    )


def check_target(node: Sink) -> None:
    """Check ``node``'s target on the driver, before any task runs (Polars' rules).

    Raises ``IsADirectoryError`` when a single-file target is a directory (or ends with a
    path separator), ``FileNotFoundError`` when its directory does not exist and
    ``mkdir`` is not set, ``NotADirectoryError`` when a partitioned target (or the parent
    of a file target) is an existing file. Each message names the path."""
    path = node.path
    mkdir = dict(node.options).get("mkdir", False)
    if node.layout == "file":
        if path.endswith(os.sep) or os.path.isdir(path):
            raise IsADirectoryError(
                f"sink target {path!r} is a directory; sink_parquet expects a file path "
                "(write a directory of files with pl.PartitionBy)"
            )
        parent = os.path.dirname(path) or "."
        if os.path.exists(parent) and not os.path.isdir(parent):
            raise NotADirectoryError(f"sink target {path!r}: {parent!r} is not a directory")
        if not os.path.exists(parent) and not mkdir:
            raise FileNotFoundError(
                f"sink target {path!r}: directory {parent!r} does not exist (pass mkdir=True)"
            )
    elif os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(
            f"sink target {path!r} is a file; a partitioned sink (pl.PartitionBy) writes a "
            "directory"
        )


def prepare(node: Sink) -> Sink:
    """``node`` ready to run: a partitioned sink (``"split"``, ``"hive"``) gets a fresh
    staging directory name, so that its tasks write nothing into the target itself and a
    failed query leaves the target as it was (all or nothing per query)."""
    if node.layout not in ("split", "hive"):
        return node
    return replace(node, staging=f".shoal-staging-{uuid.uuid4().hex}")


def commit(node: Sink, written: pa.Table) -> pa.Table:
    """Finish a sink on the driver after every task has written: ``written`` holds the
    tasks' rows (path, rows, bytes) in partition order. A ``"split"`` sink's staged files
    are renamed ``00000000.parquet``, ``00000001.parquet``, ... in that order (empty files
    dropped, except one when every file is empty, as Polars writes for an empty result)
    and the staging directory removed. Returns the final files in order (schema
    :data:`~shoal.ir.nodes.SINK_SCHEMA`)."""
    df = pl.from_arrow(written)
    assert isinstance(df, pl.DataFrame)
    if node.layout == "hive":
        df = _commit_hive(node, df).sort("path")
    elif node.layout == "split":
        keep = df.filter(pl.col("rows") > 0)
        if keep.height == 0:
            keep = df.head(1)
        for stale in df.filter(~pl.col("path").is_in(keep["path"].implode()))["path"]:
            os.remove(stale)
        final = [
            os.path.join(node.path, FILE_NAME.format(index=i, ext=node.format))
            for i in range(keep.height)
        ]
        for src, dst in zip(keep["path"], final, strict=True):
            os.replace(src, dst)
        df = keep.with_columns(pl.Series("path", final, pl.String))
        abort(node)
    return df.to_arrow().cast(SINK_SCHEMA.to_arrow())


def _commit_hive(node: Sink, df: pl.DataFrame) -> pl.DataFrame:
    """Move a ``"hive"`` sink's staged files (``<staging>/<task>/<key>=<value>/<file>``)
    to ``<path>/<key>=<value>/<file>``. Each key value is written by one task (the rows
    were hash-partitioned by the keys), so the names cannot collide. Should a move fail,
    the files already moved are moved back before the error propagates."""
    if not node.staging:
        return df
    root = os.path.join(node.path, node.staging)
    final: list[str] = []
    moved: list[tuple[str, str]] = []
    try:
        for src in df["path"]:
            rel = os.path.relpath(src, root).split(os.sep, 1)[1]  # drop the task's folder
            dst = os.path.join(node.path, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
            moved.append((src, dst))
            final.append(dst)
    except BaseException:
        for src, dst in reversed(moved):
            os.replace(dst, src)
        raise
    abort(node)
    return df.with_columns(pl.Series("path", final, pl.String))


def abort(node: Sink) -> None:
    """Remove a partitioned sink's staging directory (after success, failure or
    cancellation; files already in their final place stay)."""
    if node.layout in ("split", "hive") and node.staging:
        shutil.rmtree(os.path.join(node.path, node.staging), ignore_errors=True)
