"""shoal's one notion of a file system, for planning: file sizes, existence and Parquet
footers of local paths and object-storage URLs (``s3://``, ``gs://``, ``az://``/``abfss://``).

Built on :mod:`pyarrow.fs` (see docs/operations.md, "Object storage", for why). The options
come in Polars' ``storage_options`` names (object_store's keys: ``aws_endpoint_url``,
``aws_access_key_id``, ...) and are mapped to pyarrow's file-system arguments by the one
table :data:`OPTION_MAP`. Tasks do not use this module: the kernel reads with Polars, handing
it the same ``storage_options``.

Footers are read in parallel (a thread pool) and cached by (URL, size, modification time).
Errors name the URL and never a credential: :class:`FileNotFoundError` for a missing
bucket or key, :class:`PermissionError` for refused credentials.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from shoal.errors import PlanError, UnsupportedError
from shoal.ir.nodes import REDACTED, StorageOptions, is_secret_option

#: URL schemes read through object storage, and the file-system family of each.
SCHEMES = {
    "s3": "s3",
    "s3a": "s3",
    "gs": "gcs",
    "gcs": "gcs",
    "az": "azure",
    "abfs": "azure",
    "abfss": "azure",
}

#: Polars ``storage_options`` key (object_store's names, lower case) -> (file-system family,
#: pyarrow argument). ``None`` as the argument: the key is understood and needs no argument
#: of its own (``aws_allow_http``: the endpoint's scheme says http or https).
OPTION_MAP: dict[str, tuple[str, str | None]] = {
    "aws_access_key_id": ("s3", "access_key"),
    "access_key_id": ("s3", "access_key"),
    "aws_secret_access_key": ("s3", "secret_key"),
    "secret_access_key": ("s3", "secret_key"),
    "aws_session_token": ("s3", "session_token"),
    "session_token": ("s3", "session_token"),
    "aws_token": ("s3", "session_token"),
    "aws_region": ("s3", "region"),
    "region": ("s3", "region"),
    "aws_default_region": ("s3", "region"),
    "aws_endpoint_url": ("s3", "endpoint_override"),
    "aws_endpoint": ("s3", "endpoint_override"),
    "endpoint_url": ("s3", "endpoint_override"),
    "endpoint": ("s3", "endpoint_override"),
    "aws_allow_http": ("s3", None),
    "allow_http": ("s3", None),
    "aws_skip_signature": ("s3", "anonymous"),
    "skip_signature": ("s3", "anonymous"),
    "aws_virtual_hosted_style_request": ("s3", "force_virtual_addressing"),
    "virtual_hosted_style_request": ("s3", "force_virtual_addressing"),
    "google_service_account_token": ("gcs", "access_token"),
    "google_anonymous": ("gcs", "anonymous"),
    "google_endpoint_url": ("gcs", "endpoint_override"),
    "azure_storage_account_name": ("azure", "account_name"),
    "account_name": ("azure", "account_name"),
    "azure_storage_account_key": ("azure", "account_key"),
    "account_key": ("azure", "account_key"),
    "azure_storage_sas_key": ("azure", "sas_token"),
    "azure_storage_sas_token": ("azure", "sas_token"),
    "azure_client_id": ("azure", "client_id"),
    "azure_client_secret": ("azure", "client_secret"),
    "azure_tenant_id": ("azure", "tenant_id"),
    "azure_storage_endpoint": ("azure", "blob_storage_authority"),
}

_BOOL_ARGS = frozenset({"anonymous", "force_virtual_addressing"})


def is_url(path: str) -> bool:
    """Whether ``path`` is an object-storage URL (``s3://``, ``gs://``, ``az://``, ...)."""
    return urlsplit(path).scheme.lower() in SCHEMES


def scrub(text: str, options: StorageOptions | None) -> str:
    """``text`` with every credential value of ``options`` replaced by ``***``."""
    if options:
        for key, value in options.items:
            if value and is_secret_option(key):
                text = text.replace(value, REDACTED)
    return text


_FS_LOCK = threading.Lock()
#: The local file system, one object for every local path: a new one per path cost a
#: ``get_file_info`` call per file in :func:`file_infos` (files are grouped by file system).
_LOCAL = pafs.LocalFileSystem()
_FILESYSTEMS: dict[tuple[str, StorageOptions | None, str | None], pafs.FileSystem] = {}


def filesystem(url: str, options: StorageOptions | None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow file system of ``url`` and the path inside it (``bucket/key``).

    A local path (or ``file://`` URL) gives the local file system. Raises
    :class:`shoal.UnsupportedError` for an unknown scheme or a storage option that has no
    mapping (naming the option, never its value)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or len(scheme) == 1:  # "C:\\..." is a local path
        path = parts.path if scheme == "file" else url
        return _LOCAL, path
    family = SCHEMES.get(scheme)
    if family is None:
        raise UnsupportedError(f"shoal: cannot plan a scan of {url!r}: scheme {scheme!r}")
    inner = f"{parts.netloc}{parts.path}"
    key = (
        family,
        options,
        os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
    )
    with _FS_LOCK:
        fs = _FILESYSTEMS.get(key)
    if fs is None:
        fs = _make_filesystem(family, options)
        with _FS_LOCK:
            _FILESYSTEMS[key] = fs
    return fs, inner


def _make_filesystem(family: str, options: StorageOptions | None) -> pafs.FileSystem:
    kwargs: dict[str, Any] = {}
    unknown = []
    for name, value in options.items if options else ():
        mapped = OPTION_MAP.get(name.lower())
        if mapped is None:
            unknown.append(name)
            continue
        fam, arg = mapped
        if fam != family or arg is None:
            continue
        if arg in _BOOL_ARGS:
            kwargs[arg] = value.strip().lower() in ("1", "true", "yes")
        elif arg == "endpoint_override" and "://" in value:
            ep = urlsplit(value)
            kwargs["endpoint_override"] = f"{ep.netloc}{ep.path}".rstrip("/")
            if family == "s3":
                kwargs["scheme"] = ep.scheme
        else:
            kwargs[arg] = value
    if family == "s3" and "endpoint_override" not in kwargs:
        # As object_store (Polars) does: an endpoint from the environment.
        env = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if env:
            ep = urlsplit(env)
            kwargs["endpoint_override"] = f"{ep.netloc}{ep.path}".rstrip("/") or env
            if ep.scheme:
                kwargs["scheme"] = ep.scheme
    if unknown:
        raise UnsupportedError(
            f"shoal: storage options {sorted(unknown)} are not supported for planning "
            f"(supported: {sorted(OPTION_MAP)})"
        )
    if family == "s3":
        return pafs.S3FileSystem(**kwargs)
    if family == "gcs":
        return pafs.GcsFileSystem(**kwargs)
    return pafs.AzureFileSystem(**kwargs)


def error(url: str, exc: Exception, options: StorageOptions | None) -> Exception:
    """A clear error naming ``url`` for a failed storage call, without any credential:
    ``PermissionError`` for refused credentials, ``FileNotFoundError`` for a missing
    bucket or key, ``OSError`` otherwise."""
    text = scrub(str(exc), options)
    low = text.lower()
    if (
        isinstance(exc, PermissionError)
        or re.search(r"\b40[13]\b", low)
        or any(
            w in low
            for w in ("access_denied", "accessdenied", "invalidaccesskeyid",
                      "signaturedoesnotmatch", "forbidden", "unauthorized")
        )
    ):  # fmt: skip
        return PermissionError(
            13, f"shoal: access to {url} was refused (check the credentials): {text}", url
        )
    if isinstance(exc, FileNotFoundError) or "nosuchbucket" in low or "not found" in low:
        return FileNotFoundError(2, f"shoal: not found: {url}: {text}", url)
    return OSError(f"shoal: cannot read {url}: {text}")


#: The file infos of the query being planned in this thread (:func:`one_look`), by (path,
#: options); None outside such a block.
_LOOKED: contextvars.ContextVar[dict[tuple[str, StorageOptions | None], pafs.FileInfo] | None] = (
    contextvars.ContextVar("shoal_storage_looked", default=None)
)


@contextlib.contextmanager
def one_look() -> Iterator[None]:
    """Within the block, :func:`file_infos` asks the storage about each file once: a
    frontend's checks and the planner then see the same size and modification time (and
    so the same cached footer) of a file, and a query over local files makes one ``stat``
    per file instead of one per reader (the Polars adapter's column checks, the planner's
    scan splitting). The block is one query's translation and planning; a later query asks
    again, so a file rewritten between two queries is read again. The answers belong to the
    thread (and context) that opened the block."""
    token = _LOOKED.set({})
    try:
        yield
    finally:
        _LOOKED.reset(token)


def file_infos(
    paths: Sequence[str], options: StorageOptions | None, kind: str = "file"
) -> list[pafs.FileInfo]:
    """The file info (size, modification time) of every path, in order (inside
    :func:`one_look`: asked once per block).

    Raises :class:`FileNotFoundError` naming the first path (URL) that is missing (also a
    missing bucket), :class:`PermissionError` naming it when the storage refuses the
    credentials; ``kind`` words the message (``"Parquet"``, ``"CSV"``)."""
    looked = _LOOKED.get()
    if looked is None:
        return _file_infos(paths, options, kind)
    got = [looked.get((url, options)) for url in paths]
    todo = [url for url, info in zip(paths, got, strict=True) if info is None]
    if todo:
        fresh = iter(_file_infos(todo, options, kind))
        for i, info in enumerate(got):
            if info is None:
                got[i] = looked[(paths[i], options)] = next(fresh)
    return got  # type: ignore[return-value]


def _file_infos(
    paths: Sequence[str], options: StorageOptions | None, kind: str
) -> list[pafs.FileInfo]:
    out: list[pafs.FileInfo] = []
    by_fs: dict[int, tuple[pafs.FileSystem, list[int], list[str]]] = {}
    for i, url in enumerate(paths):
        fs, inner = filesystem(url, options)
        entry = by_fs.setdefault(id(fs), (fs, [], []))
        entry[1].append(i)
        entry[2].append(inner)
    found: dict[int, pafs.FileInfo] = {}
    for fs, idx, inners in by_fs.values():
        try:
            infos = fs.get_file_info(inners)
        except Exception as exc:
            raise error(paths[idx[0]], exc, options) from None
        found.update(zip(idx, infos, strict=True))
    for i, url in enumerate(paths):
        info = found[i]
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(
                2, f"shoal: {kind} file not found: {url}{_why(url, options)}", url
            )
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(2, f"shoal: {kind} path is not a file: {url}", url)
        out.append(info)
    return out


def _why(url: str, options: StorageOptions | None) -> str:
    """For a missing object-storage URL: ``" (bucket 'b' does not exist)"`` when that is
    the reason, else ``""``."""
    if not is_url(url):
        return ""
    fs, inner = filesystem(url, options)
    bucket = inner.split("/", 1)[0]
    try:
        missing = fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except Exception:
        return ""
    return f" (bucket {bucket!r} does not exist)" if missing else ""


#: Footers kept in memory (most recently used); a file that changed (size or modification
#: time) is read again.
FOOTER_CACHE_SIZE = 4096
_FOOTERS: OrderedDict[tuple[str, int, int], pq.FileMetaData] = OrderedDict()
_FOOTERS_LOCK = threading.Lock()
_FOOTER_THREADS = 16


def _footer_key(url: str, info: pafs.FileInfo) -> tuple[str, int, int]:
    mtime = info.mtime_ns if info.mtime_ns is not None else -1
    return (url, int(info.size or 0), int(mtime))


def read_footers(paths: Sequence[str], options: StorageOptions | None) -> list[pq.FileMetaData]:
    """The Parquet footer of every path, in order: read in parallel, cached by (URL, size,
    modification time).

    Raises ``FileNotFoundError``/``PermissionError`` as :func:`file_infos`, and
    :class:`shoal.PlanError` naming a file that is not readable Parquet."""
    infos = file_infos(paths, options, "Parquet")
    keys = [_footer_key(url, info) for url, info in zip(paths, infos, strict=True)]
    out: list[pq.FileMetaData | None] = []
    with _FOOTERS_LOCK:
        for k in keys:
            meta = _FOOTERS.get(k)
            if meta is not None:
                _FOOTERS.move_to_end(k)
            out.append(meta)
    todo = [i for i, m in enumerate(out) if m is None]

    def read(i: int) -> pq.FileMetaData:
        url = paths[i]
        fs, inner = filesystem(url, options)
        try:
            with fs.open_input_file(inner) as f:
                return pq.read_metadata(f)
        except (FileNotFoundError, PermissionError) as exc:
            raise error(url, exc, options) from None
        except Exception as exc:
            raise PlanError(
                f"shoal: {url} is not a readable Parquet file (corrupt or truncated): "
                f"{scrub(str(exc), options)}"
            ) from None

    if len(todo) == 1:
        out[todo[0]] = read(todo[0])
    elif todo:
        with ThreadPoolExecutor(min(_FOOTER_THREADS, len(todo))) as pool:
            for i, meta in zip(todo, pool.map(read, todo), strict=True):
                out[i] = meta
    with _FOOTERS_LOCK:
        for i in todo:
            _FOOTERS[keys[i]] = out[i]  # type: ignore[assignment]
        while len(_FOOTERS) > FOOTER_CACHE_SIZE:
            _FOOTERS.popitem(last=False)
    return out  # type: ignore[return-value]


def footer_cache_info() -> int:
    """How many footers the cache holds (for tests and diagnostics)."""
    with _FOOTERS_LOCK:
        return len(_FOOTERS)


def glob(pattern: str, options: StorageOptions | None) -> list[str]:
    """The object-storage URLs that match ``pattern`` (``*`` and ``?`` within one path
    segment, ``**`` across segments), sorted; a pattern without wildcards is returned as
    is. Lists the prefix before the first wildcard (recursively). Raises
    ``FileNotFoundError``/``PermissionError`` naming the URL (see :func:`error`)."""
    if not any(c in pattern for c in "*?["):
        return [pattern]
    parts = urlsplit(pattern)
    fs, inner = filesystem(pattern, options)
    cut = min(i for i, c in enumerate(inner) if c in "*?[")
    prefix = inner[: inner.rfind("/", 0, cut) + 1].rstrip("/")
    regex = re.compile(_glob_regex(inner))
    try:
        infos = fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    except Exception as exc:
        raise error(pattern, exc, options) from None
    scheme = parts.scheme
    return sorted(
        f"{scheme}://{i.path}"
        for i in infos
        if i.type == pafs.FileType.File and regex.fullmatch(i.path)
    )


def _glob_regex(pattern: str) -> str:
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        out.append("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c))
        i += 1
    return "".join(out)


#: Environment variables read by :func:`env_options` -> storage option.
ENV_OPTIONS = {
    "AWS_ACCESS_KEY_ID": "aws_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
    "AWS_SESSION_TOKEN": "aws_session_token",
    "AWS_REGION": "aws_region",
    "AWS_DEFAULT_REGION": "aws_default_region",
    "AWS_ENDPOINT_URL": "aws_endpoint_url",
    "AWS_ALLOW_HTTP": "aws_allow_http",
}


def env_options(url: str) -> StorageOptions | None:
    """The driver's ``AWS_*`` environment (see :data:`ENV_OPTIONS`) as storage options for
    an ``s3://`` URL, or None (no such variable, or another scheme). A frontend without
    storage options of its own (DuckDB without httpfs) plans with them and hands them to
    the tasks, so that the workers read with the credentials the driver planned with."""
    if SCHEMES.get(urlsplit(url).scheme.lower()) != "s3":
        return None
    found = {opt: os.environ[var] for var, opt in ENV_OPTIONS.items() if os.environ.get(var)}
    return StorageOptions(found) if found else None
