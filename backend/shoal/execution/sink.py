"""Writing query results to files: the task side and the driver side of a
:class:`~shoal.ir.nodes.Sink`.

Each task of a sink's stage writes its own partition with Polars' own Parquet writer
(:func:`write_partition`) and returns one row per file (path, rows, bytes). The driver
checks the target before any task runs (:func:`check_target`), gives a ``"split"`` sink a
fresh staging directory (:func:`prepare`), and after the last task renames the staged
files to Polars' names in partition order (:func:`commit`), or removes them when the
query failed or was cancelled (:func:`abort`). Renaming is a metadata operation: no data
passes through the driver. In object storage (``s3://``, ...: the sink's
``storage_options``) tasks write with Polars' object-storage writer, and a rename is
:mod:`pyarrow.fs`'s move (a server-side copy and a delete); the target's bucket is checked
before any task runs.

The layouts are Polars 2.1's (``LazyFrame.sink_parquet`` with a path, or with
``pl.PartitionBy``), as measured by running it: ``PartitionBy(base, max_rows_per_file=n)``
writes ``base/00000000.parquet``, ``base/00000001.parquet``, ... (an empty result: one
empty file ``00000000.parquet``); ``PartitionBy(base, key="x")`` writes
``base/x=<value>/00000000.parquet`` per key value (a null key: ``x=__HIVE_DEFAULT_PARTITION__``;
an empty result: no file), numbering files per key.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from dataclasses import replace
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.fs as pafs

from shoal import storage
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

    Polars' writer does the work (``LazyFrame.sink_<format>`` with ``node.options``), so
    compression, statistics, row groups, CSV quoting and number formats are exactly
    Polars'. Raises what Polars raises
    for a file it cannot write (``OSError`` and its subclasses)."""
    options = _reader_options(node.options)
    remote = storage.is_url(node.path)
    if node.storage_options:
        options["storage_options"] = node.storage_options.to_dict()
    if remote:
        options.pop("mkdir", None)  # object storage has no directories to make
    written: list[Any] = []
    target: Any
    if node.layout == "file":
        target = node.path
    else:
        base = node.path
        if node.staging:  # a directory of this task's own, moved into place by commit()
            base = _join(node, staging_root(node), uuid.uuid4().hex)
        keys: dict[str, Any] = {}
        if node.layout == "hive":
            keys = {"key": list(node.partition_by), "include_key": node.include_key}
        target = pl.PartitionBy(
            base,
            max_rows_per_file=node.max_rows_per_file,
            approximate_bytes_per_file=node.max_bytes_per_file,
            **keys,
        )
    sink = getattr(df.lazy(), f"sink_{node.format}")  # Polars' writer of the format
    if node.format not in _REPORTS_PATHS:
        sink(target, engine="streaming", maintain_order=True, **options)
        return _listed(node, df, target)
    sink(
        target,
        engine="streaming",
        maintain_order=True,
        sinked_paths_callback=lambda args: written.extend(args.paths),
        **options,
    )
    written.sort(key=lambda p: p.path)
    return _files_frame(
        [p.path if remote else os.path.abspath(p.path) for p in written],
        [p.num_rows for p in written],
        [p.num_bytes for p in written],
    )


#: The formats whose Polars writer reports the files it wrote (``sinked_paths_callback``).
_REPORTS_PATHS = ("parquet", "ipc")


def _listed(node: Sink, df: pl.DataFrame, target: Any) -> pl.DataFrame:
    """The files a writer without ``sinked_paths_callback`` (CSV, NDJSON) wrote: the
    target file, or every file under this task's own staging directory, in name order,
    with sizes. Rows: exact for a single file; 0 for each file of a task without rows;
    else null (not counted: Polars does not report them for these formats)."""
    if node.layout == "file":
        paths = [node.path]
    else:
        base = target._pl_partition_by.base_path
        paths = sorted(_walk(node, base))
    sizes = [_size(node, p) for p in paths]
    rows: list[int | None]
    if node.layout == "file":
        rows = [df.height]
    else:
        rows = [0 if df.height == 0 else None] * len(paths)
    return pl.DataFrame(
        {"path": paths, "rows": rows, "bytes": sizes},
        schema={"path": pl.String, "rows": pl.Int64, "bytes": pl.Int64},
    )


def _walk(node: Sink, base: str) -> list[str]:
    if not storage.is_url(base):
        return [os.path.join(d, f) for d, _, files in os.walk(base) for f in files]
    fs, inner = storage.filesystem(base, node.storage_options)
    scheme = base.split("://", 1)[0]
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
    return [f"{scheme}://{i.path}" for i in infos if i.type == pafs.FileType.File]


def _size(node: Sink, path: str) -> int:
    if not storage.is_url(path):
        return os.path.getsize(path)
    fs, inner = storage.filesystem(path, node.storage_options)
    return int(fs.get_file_info(inner).size or 0)


def _extension(staged: str, node: Sink) -> str:
    """The extension of a staged file as Polars' writer named it (``parquet``, ``csv``,
    ``ipc``, ``jsonl``, or with compression e.g. ``csv.gz``): the final name keeps it."""
    name = staged.rsplit("/", 1)[-1].rsplit(os.sep, 1)[-1]
    return name.split(".", 1)[1] if "." in name else node.format


def check_target(node: Sink) -> None:
    """Check ``node``'s target on the driver, before any task runs (Polars' rules).

    Raises ``IsADirectoryError`` when a single-file target is a directory (or ends with a
    path separator), ``FileNotFoundError`` when its directory does not exist and
    ``mkdir`` is not set, ``NotADirectoryError`` when a partitioned target (or the parent
    of a file target) is an existing file. Each message names the path."""
    path = node.path
    if storage.is_url(path):
        _check_bucket(node)
        return
    mkdir = dict(node.options).get("mkdir", False)
    if node.layout == "file":
        if path.endswith(os.sep) or os.path.isdir(path):
            raise IsADirectoryError(
                f"sink target {path!r} is a directory; sink_{node.format} expects a file path "
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


def _check_bucket(node: Sink) -> None:
    """An object-storage target's bucket must exist (a missing one raises
    ``FileNotFoundError`` naming the URL; refused credentials ``PermissionError``)."""
    fs, inner = storage.filesystem(node.path, node.storage_options)
    bucket = inner.split("/", 1)[0]
    try:
        info = fs.get_file_info(bucket)
    except Exception as exc:
        raise storage.error(node.path, exc, node.storage_options) from None
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(
            2, f"sink target {node.path!r}: bucket {bucket!r} does not exist", node.path
        )
    if node.layout == "file" and node.path.endswith("/"):
        raise IsADirectoryError(
            f"sink target {node.path!r} ends with '/'; sink_{node.format} expects a file path"
        )


class _Files:
    """Moves and deletes on the target's file system: ``os`` for local paths,
    :mod:`pyarrow.fs` for object storage (a move is a copy and a delete there)."""

    def __init__(self, node: Sink) -> None:
        self.remote = storage.is_url(node.path)
        self.node = node

    def _fs(self, url: str) -> tuple[pafs.FileSystem, str]:
        return storage.filesystem(url, self.node.storage_options)

    def move(self, src: str, dst: str) -> None:
        if not self.remote:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.replace(src, dst)
            return
        fs, a = self._fs(src)
        _, b = self._fs(dst)
        try:
            fs.move(a, b)
        except Exception as exc:
            raise storage.error(dst, exc, self.node.storage_options) from None

    def remove(self, path: str) -> None:
        if not self.remote:
            os.remove(path)
            return
        fs, a = self._fs(path)
        fs.delete_file(a)

    def remove_tree(self, path: str) -> None:
        if not self.remote:
            shutil.rmtree(path, ignore_errors=True)
            return
        fs, a = self._fs(path)
        with contextlib.suppress(Exception):  # best effort, as rmtree(ignore_errors=True)
            fs.delete_dir(a)

    @staticmethod
    def join(*parts: str) -> str:
        return "/".join(p.rstrip("/") for p in parts)


def _join(node: Sink, *parts: str) -> str:
    return _Files.join(*parts) if storage.is_url(node.path) else os.path.join(*parts)


def staging_root(node: Sink) -> str:
    """Where a partitioned sink's tasks write before the commit: the ``staging`` directory
    inside the target for a local path; beside the target for object storage
    (``<target>.<staging>``), because pyarrow leaves an empty directory-marker object in
    the parent of a prefix it deletes, which must not land inside the target."""
    if storage.is_url(node.path):
        return f"{node.path.rstrip('/')}.{node.staging}"
    return os.path.join(node.path, node.staging)


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
    files = _Files(node)
    join = files.join if files.remote else os.path.join
    if node.layout == "hive":
        df = _commit_hive(node, df).sort("path")
    elif node.layout == "split":
        keep = df.filter(pl.col("rows").is_null() | (pl.col("rows") > 0))
        if keep.height == 0:
            keep = df.head(1)
        for stale in df.filter(~pl.col("path").is_in(keep["path"].implode()))["path"]:
            files.remove(stale)
        final = [
            join(node.path, FILE_NAME.format(index=i, ext=_extension(src, node)))
            for i, src in enumerate(keep["path"])
        ]
        for src, dst in zip(keep["path"], final, strict=True):
            files.move(src, dst)
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
    files = _Files(node)
    join = files.join if files.remote else os.path.join
    root = staging_root(node)
    final: list[str] = []
    moved: list[tuple[str, str]] = []
    try:
        for src in df["path"]:
            if files.remote:
                rel = src[len(root) :].lstrip("/").split("/", 1)[1]
            else:
                rel = os.path.relpath(src, root).split(os.sep, 1)[1]  # drop the task's folder
            dst = join(node.path, rel)
            files.move(src, dst)
            moved.append((src, dst))
            final.append(dst)
    except BaseException:
        for src, dst in reversed(moved):
            files.move(dst, src)
        raise
    abort(node)
    return df.with_columns(pl.Series("path", final, pl.String))


def abort(node: Sink) -> None:
    """Remove a partitioned sink's staging directory (after success, failure or
    cancellation; files already in their final place stay)."""
    if node.layout in ("split", "hive") and node.staging:
        _Files(node).remove_tree(staging_root(node))
