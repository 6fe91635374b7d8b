"""``LazyFrame.sink_parquet``/``sink_csv``/``sink_ipc``/``sink_ndjson`` targets and options ->
a shoal :class:`~shoal.ir.nodes.Sink`.

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


#: Writer options of each format that shoal passes to Polars' writer in each task (the
#: keyword arguments of ``LazyFrame.sink_<format>``, less target, storage and engine ones).
WRITER_OPTIONS: dict[str, tuple[str, ...]] = {
    "parquet": (
        "compression", "compression_level", "statistics", "row_group_size",
        "data_page_size", "mkdir", "sync_on_close", "metadata",
    ),
    "csv": (
        "include_bom", "compression", "compression_level", "check_extension",
        "include_header", "separator", "line_terminator", "quote_char", "batch_size",
        "datetime_format", "date_format", "time_format", "float_scientific",
        "float_precision", "decimal_comma", "null_value", "quote_style", "mkdir",
        "sync_on_close",
    ),
    "ipc": (
        "compression", "compat_level", "record_batch_size", "mkdir", "sync_on_close",
        "_record_batch_statistics",
    ),
    "ndjson": ("compression", "compression_level", "check_extension", "mkdir", "sync_on_close"),
}  # fmt: skip


def sink_plan(
    plan: PlanNode,
    path: Any,
    *,
    fmt: str = "parquet",
    storage_options: Any = None,
    credential_provider: Any = None,
    arrow_schema: Any = None,
    encryption: Any = None,
    **writer: Any,
) -> Sink:
    """The :class:`Sink` that writes ``plan``'s rows to ``path`` (a file path or a
    ``pl.PartitionBy``) as ``fmt`` files (``"parquet"``, ``"csv"``, ``"ipc"``,
    ``"ndjson"``) with Polars' writer options for that format (the keyword arguments
    ``LazyFrame.sink_<fmt>`` hands its engine; see :data:`WRITER_OPTIONS`).

    Raises :class:`shoal.UnsupportedError` for a target or option shoal cannot honour: a
    file-like object, a remote URL other than object storage (``s3://``, ``gs://``,
    ``az://``), ``storage_options`` with a key shoal does not map, a credential provider other than
    ``"auto"``, ``arrow_schema``, ``encryption``, metadata given as a callable, a
    ``PartitionBy`` with a ``file_path_provider`` or with keys that are not plain columns;
    ``ValueError`` for an option that is not one of ``fmt``'s.
    """
    if fmt not in WRITER_OPTIONS:
        raise ValueError(f"sink format {fmt!r}: expected one of {sorted(WRITER_OPTIONS)}")
    unknown_options = sorted(set(writer) - set(WRITER_OPTIONS[fmt]))
    if unknown_options:
        raise ValueError(f"sink_{fmt}: options {unknown_options} are not sink_{fmt}'s")
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
    metadata = writer.pop("metadata", None)
    if metadata is not None and not isinstance(metadata, Mapping):
        problems.append("metadata given as a callable")
    options: list[tuple[str, Any]] = [
        (k, _pairs(v))
        for k, v in writer.items()
        if not (k == "sync_on_close" and v is None)  # Polars' default
    ]
    if metadata is not None and isinstance(metadata, Mapping):
        options.append(("metadata", _pairs(metadata)))
    if isinstance(path, pl.PartitionBy):
        sink = _partitioned(plan, path, tuple(options), problems, storage_options, fmt)
    elif isinstance(path, str | os.PathLike):
        text = os.path.expanduser(os.fspath(path))
        _local(text, problems)
        sink = Sink(
            plan, fmt, _absolute(text), "file", SINK_SCHEMA, options=tuple(options),  # type: ignore[arg-type]
            storage_options=so,
        )  # fmt: skip
    else:
        problems.append(f"a file-like target ({type(path).__name__})")
        sink = None
    if problems or sink is None:
        raise UnsupportedError(
            f"shoal cannot write this sink_{fmt} target distributed: " + "; ".join(problems)
        )
    return sink


def _partitioned(
    plan: PlanNode,
    target: pl.PartitionBy,
    options: tuple[tuple[str, Any], ...],
    problems: list[str],
    storage_options: Any = None,
    fmt: str = "parquet",
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
        fmt,  # type: ignore[arg-type]
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
