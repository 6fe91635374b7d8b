"""``LazyFrame.sink_parquet`` targets and options -> a shoal :class:`~shoal.ir.nodes.Sink`.

:func:`sink_plan` says how shoal writes what Polars would write (Polars 2.1's layouts, see
:mod:`shoal.execution.sink`), or raises :class:`shoal.UnsupportedError` naming what shoal
cannot honour; the engine then falls back to Polars' own sink.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import polars as pl
from polars._utils.wrap import wrap_expr

from shoal import storage
from shoal.errors import UnsupportedError
from shoal.ir.nodes import SINK_SCHEMA, PlanNode, Sink, StorageOptions

#: Polars' "no limit" for ``PartitionBy(approximate_bytes_per_file=None)``: 2**64 - 1.
_NO_LIMIT = (1 << 64) - 1


def sink_plan(
    plan: PlanNode,
    path: Any,
    *,
    compression: str,
    compression_level: int | None,
    statistics: bool | str | dict[str, bool],
    row_group_size: int | None,
    data_page_size: int | None,
    storage_options: Any,
    credential_provider: Any,
    sync_on_close: str | None,
    metadata: Any,
    arrow_schema: Any,
    encryption: Any,
    mkdir: bool,
) -> Sink:
    """The :class:`Sink` that writes ``plan``'s rows to ``path`` (a file path or a
    ``pl.PartitionBy``) with Polars' writer options.

    Raises :class:`shoal.UnsupportedError` for a target or option shoal cannot honour: a
    file-like object, a remote URL other than object storage (``s3://``, ``gs://``,
    ``az://``), ``storage_options`` with a key shoal does not map, a credential provider other than
    ``"auto"``, ``arrow_schema``, ``encryption``, metadata given as a callable, a
    ``PartitionBy`` with a ``file_path_provider`` or with keys that are not plain columns.
    """
    problems = []
    so: StorageOptions | None = None
    if storage_options:
        so = StorageOptions(dict(storage_options))
        unknown = sorted(k for k, _ in so.items if k.lower() not in storage.OPTION_MAP)
        if unknown:
            problems.append(f"storage options {unknown}")
    if credential_provider not in (None, "auto"):
        problems.append("a credential_provider")
    if arrow_schema is not None:
        problems.append("arrow_schema")
    if encryption is not None:
        problems.append("encryption")
    if metadata is not None and not isinstance(metadata, Mapping):
        problems.append("metadata given as a callable")
    options: list[tuple[str, Any]] = [
        ("compression", compression),
        ("compression_level", compression_level),
        ("statistics", _pairs(statistics)),
        ("row_group_size", row_group_size),
        ("data_page_size", data_page_size),
        ("mkdir", mkdir),
    ]
    if sync_on_close is not None:
        options.append(("sync_on_close", sync_on_close))
    if metadata is not None and isinstance(metadata, Mapping):
        options.append(("metadata", _pairs(metadata)))
    if isinstance(path, pl.PartitionBy):
        sink = _partitioned(plan, path, tuple(options), problems, storage_options)
    elif isinstance(path, str | os.PathLike):
        text = os.path.expanduser(os.fspath(path))
        _local(text, problems)
        sink = Sink(
            plan, "parquet", _absolute(text), "file", SINK_SCHEMA, options=tuple(options),
            storage_options=so,
        )  # fmt: skip
    else:
        problems.append(f"a file-like target ({type(path).__name__})")
        sink = None
    if problems or sink is None:
        raise UnsupportedError(
            "shoal cannot write this sink_parquet target distributed: " + "; ".join(problems)
        )
    return sink


def _partitioned(
    plan: PlanNode,
    target: pl.PartitionBy,
    options: tuple[tuple[str, Any], ...],
    problems: list[str],
    storage_options: Any = None,
) -> Sink | None:
    inner = target._pl_partition_by
    base = os.path.expanduser(inner.base_path)
    _local(base, problems)
    if inner.file_path_provider is not None:
        problems.append("PartitionBy(file_path_provider=...)")
    keys: list[str] = []
    for pyexpr in inner.key or []:
        key = wrap_expr(pyexpr)
        if not key.meta.is_column():
            problems.append(f"PartitionBy key {key} (only plain columns are supported)")
        keys.append(key.meta.output_name())
    if problems:
        return None
    so = StorageOptions(dict(storage_options)) if storage_options else None
    max_bytes = inner.approximate_bytes_per_file
    return Sink(
        plan,
        "parquet",
        _absolute(base),
        "hive" if keys else "split",
        SINK_SCHEMA,
        partition_by=tuple(keys),
        include_key=inner.include_key is not False,
        max_rows_per_file=inner.max_rows_per_file,
        max_bytes_per_file=None if max_bytes >= _NO_LIMIT else max_bytes,
        options=options,
        storage_options=so,
    )


def _local(path: str, problems: list[str]) -> None:
    if "://" in path and not storage.is_url(path):
        problems.append(
            f"a remote target {path!r} (local paths and s3://, gs://, az:// are supported)"
        )


def _absolute(path: str) -> str:
    """``path`` made absolute (tasks may run in another working directory), keeping a
    trailing separator, which marks a directory; an object-storage URL stays as it is."""
    if storage.is_url(path):
        return path
    out = os.path.abspath(path)
    return out + os.sep if path.endswith(os.sep) and out != os.sep else out


def _pairs(value: Any) -> Any:
    """A mapping as (key, value) pairs (the IR keeps options hashable)."""
    return tuple(value.items()) if isinstance(value, Mapping) else value


def user_path(sink: Sink, user_target: Any) -> Callable[[str], str]:
    """Map an absolute path a task wrote to the form Polars reports to
    ``sinked_paths_callback``: under the base path as the user wrote it."""
    if not isinstance(user_target, pl.PartitionBy):
        given = os.fspath(user_target)
        return lambda _p: given
    given_base = user_target._pl_partition_by.base_path
    root = sink.path

    def to_user(p: str) -> str:
        return os.path.join(given_base, os.path.relpath(p, root))

    return to_user
