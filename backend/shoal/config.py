"""shoal's configuration: one frozen :class:`Config`, read from ``SHOAL_<FIELD>`` variables.

Environment variables are read on the driver only, never on workers. Each field of
:class:`Config` has an environment variable named ``SHOAL_`` plus the field name in
capitals. A query takes one snapshot of the config when it starts; the runners ship that
snapshot to every task (the Ray runner ``ray.put``\\ s it once per query), and each task
installs it, after checking its content hash, before doing anything else. Inside a task,
:func:`get_config` returns the installed snapshot, so workers never read the driver's
global state or their own environment.

Libraries built on shoal attach their own settings under a namespace:
``register_extension("mylib", validator)`` then ``set_config(extensions={"mylib": {...}})``;
they are validated on the driver, frozen with the rest, and read on any worker as
``get_config().extensions["mylib"]``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import math
import os
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from shoal.errors import ConfigFrozenError, ShoalWarning, VersionMismatchError

RunnerKind = Literal["ray", "local"]
ProgressMode = Literal["auto", "always", "never"]
SmallQueryWhere = Literal["driver", "worker"]

#: Fields that shape the runner; fixed once a runner has started.
RUNNER_FIELDS: frozenset[str] = frozenset(
    {
        "runner",
        "ray_address",
        "num_cpus",
        "ray_temp_dir",
        "object_store_bytes",
        "spill_dir",
        "ray_dashboard",
        "ray_connect_timeout_s",
        "ray_runtime_env",
        "ray_namespace",
        "num_gpus",
        "gpus",
    }
)


class FrozenDict(Mapping[str, Any]):
    """A read-only, hashable mapping (nested mappings and lists are frozen too)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] | None = None) -> None:
        self._items = {str(k): _freeze(v) for k, v in (items or {}).items()}

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, _hashable(v)) for k, v in self._items.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return f"FrozenDict({self._items!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (_thaw(self),))


def _freeze(v: Any) -> Any:
    if isinstance(v, Mapping):
        return FrozenDict(v)
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    return v


def _thaw(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


def _hashable(v: Any) -> Any:
    return repr(_thaw(v))


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]*)@")
_SECRET_QUERY = re.compile(
    r"(?P<key>[?&;](?:token|password|passwd|pwd|secret|key|auth|access_key|secret_key|"
    r"session_token|sig|signature)=)[^&;\s]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with credentials replaced by ``***``: the user-info part of URLs
    (``ray://user:token@head:10001`` -> ``ray://***@head:10001``) and the values of
    query parameters named like secrets (``token=``, ``password=``, ``signature=``, ...).
    shoal passes every address and error message it shows (explain, traces, logs,
    errors) through this."""
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}***@", text)
    return _SECRET_QUERY.sub(lambda m: f"{m.group('key')}***", text)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15}
_UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50})


def parse_size(text: str, what: str) -> int:
    """Bytes in ``text``: a whole number, or a number with a unit (``"128MiB"``,
    ``"1.5 GiB"``, ``"500kB"``; binary ``KiB/MiB/GiB/TiB`` and decimal ``kB/MB/GB/TB``).
    Raises ``ValueError`` naming ``what`` when it is neither."""
    m = _SIZE.match(text.replace("_", ""))
    if not m:
        raise ValueError(
            f"{what}={text!r}: expected a number of bytes, optionally with a unit such as "
            "KiB, MiB, GiB (or kB, MB, GB)"
        )
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])


#: :meth:`Config.digest` by config (equal configs hash alike), while the config lives.
_DIGESTS: weakref.WeakKeyDictionary[Config, str] = weakref.WeakKeyDictionary()


def _check_type(name: str, annotation: str, value: Any) -> None:
    """Raise ``ValueError`` naming setting ``name`` when ``value`` is not of its annotated
    type (bool is not accepted as an int, nor NaN or infinity as a number)."""
    optional = annotation.endswith(" | None")
    base = annotation.removesuffix(" | None")
    if value is None and optional:
        return
    if base == "bool":
        ok, form = isinstance(value, bool), "True or False"
    elif base == "int":
        ok, form = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif base == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        form = "a finite number"
    elif base.startswith("Mapping"):
        ok, form = isinstance(value, Mapping), "a mapping"
    else:  # str and the string literals (runner, progress), checked by value below
        ok, form = isinstance(value, str), "a string"
    if not ok:
        none = " or None" if optional else ""
        raise ValueError(f"shoal setting {name} must be {form}{none}, got {value!r}")


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@dataclass(frozen=True)
class Config:
    """Every setting that changes how a query runs (immutable; see the module docstring).

    Construct with keyword arguments, derive with :meth:`replace`, read the current one
    with :func:`get_config`. ``Config.from_env()`` reads ``SHOAL_<FIELD>`` variables; a
    malformed value raises ``ValueError`` naming the variable and the expected form.
    Invalid values raise ``ValueError`` naming the setting.
    """

    runner: RunnerKind = field(
        default="ray",
        metadata=_doc(
            "Where tasks run: 'ray' (Ray tasks; a local instance starts on first use) or "
            "'local' (an in-process thread pool, no Ray)."
        ),
    )
    ray_address: str | None = field(
        default=None,
        metadata=_doc(
            "Ray cluster address ('ray://host:10001' or 'host:6379'); unset: RAY_ADDRESS, "
            "else a new local instance."
        ),
    )
    num_cpus: int | None = field(
        default=None,
        metadata=_doc(
            "CPUs of a local Ray instance or threads of the local runner; unset: all cores."
        ),
    )
    num_gpus: int | None = field(
        default=None,
        metadata=_doc(
            "GPUs of a local Ray instance (logical: more than the machine has is allowed, for "
            "tests); unset: Ray detects them."
        ),
    )
    gpus: str | None = field(
        default=None,
        metadata=_doc(
            "GPU device ids the local runner hands to user-function worker processes, e.g. "
            "'0,1,2,3' (each process sees its own through CUDA_VISIBLE_DEVICES); unset: the "
            "devices NVML finds."
        ),
    )
    ray_temp_dir: str | None = field(
        default=None,
        metadata=_doc(
            "Session directory of a local Ray instance (keep it short: Unix socket paths are "
            "limited to 107 bytes); unset: <tmp>/shoal-<uid>/ray under a directory of mode "
            "0700, so the instance's sockets, logs and spilled objects are the user's alone."
        ),
    )
    object_store_bytes: int | None = field(
        default=None,
        metadata=_doc(
            "Object store size of a local Ray instance, in bytes; unset: Ray's default (30% of "
            "memory). Data beyond it spills to spill_dir."
        ),
    )
    spill_dir: str | None = field(
        default=None,
        metadata=_doc(
            "Directory where a local Ray instance spills objects that do not fit in the object "
            "store; unset: Ray's default under its session directory."
        ),
    )
    ray_dashboard: bool = field(
        default=False,
        metadata=_doc(
            "Start the Ray dashboard with a local Ray instance, so that the dashboard and "
            "Ray's state API (ray.util.state, `ray list tasks`) show shoal's tasks and actors; "
            "needs ray[default]. A cluster started with `ray start` has its own."
        ),
    )
    ray_connect_timeout_s: float = field(
        default=10.0,
        metadata=_doc(
            "Seconds to wait for a Ray cluster address to answer before saying it is unreachable."
        ),
    )
    ray_runtime_env: Mapping[str, Any] = field(
        default_factory=lambda: FrozenDict({}),
        metadata=_doc(
            "Ray runtime_env for shoal's tasks and actors (working_dir, py_modules, pip, "
            "env_vars, ...; JSON object in the environment), e.g. to ship the modules of "
            "your user functions to every node. shoal adds POLARS_MAX_THREADS to env_vars "
            "unless you set it."
        ),
    )
    ray_namespace: str | None = field(
        default=None,
        metadata=_doc(
            "Ray namespace of the driver's job (named actors live there); unset: an "
            "anonymous namespace, as ray.init gives."
        ),
    )
    task_max_retries: int = field(
        default=3,
        metadata=_doc(
            "Times Ray re-runs a task whose worker or node died, or whose output object was "
            "lost (lineage reconstruction); errors raised by the task itself are not retried."
        ),
    )
    target_partition_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata=_doc(
            "Bytes per scan partition, uncompressed, as Parquet footers or Arrow buffers "
            "report them."
        ),
    )
    default_partitions: int = field(
        default=0,
        metadata=_doc(
            "Partitions an in-memory table is split into (row ranges); 0: by "
            "target_partition_bytes."
        ),
    )
    shuffle_partitions: int = field(
        default=0,
        metadata=_doc(
            "Partitions after a hash or range exchange; 0: as many as the input has, at most "
            "4 per CPU."
        ),
    )
    broadcast_join_threshold_bytes: int = field(
        default=32 * 1024 * 1024,
        metadata=_doc(
            "A join side estimated at or under this many bytes is broadcast; 0: never broadcast."
        ),
    )
    broadcast_inline_bytes: int = field(
        default=8 * 1024 * 1024,
        metadata=_doc(
            "A broadcast join's build side that only reads files (Parquet, CSV, NDJSON scans "
            "the tasks read; filters, projections, joins of them) estimated at or under this many "
            "bytes read, in all, is computed inside each task of the other side instead of "
            "in a stage of its own, when the copies read at most target_partition_bytes in "
            "all; 0: never."
        ),
    )
    aggregate_key_filter: bool = field(
        default=True,
        metadata=_doc(
            "An inner join of an aggregation with a side small enough to broadcast "
            "(broadcast_join_threshold_bytes), on group keys: the aggregation's input is "
            "reduced first to the rows whose keys the small side has (a semi join in the "
            "input's tasks), so that only the groups the join keeps are aggregated and "
            "shuffled. Exact: a group's rows all share its keys. Plain column keys, not "
            "float."
        ),
    )
    aligned_joins: bool = field(
        default=True,
        metadata=_doc(
            "Join two Parquet scans whose footers show them stored in the order of the join "
            "key (integer or date; min/max per row group) partition by partition: each task "
            "of the larger (or the preserved) side reads the other side's row groups that "
            "can hold its keys, with no broadcast or hash exchange. Taken only where those "
            "reads overlap little (unsorted keys fall back to the other strategies). Also "
            "moves an inner join that would shuffle both sides down into its left side "
            "((X join Y) join Z on a key of Y runs as X join (Y join Z)) where that makes "
            "it such a join."
        ),
    )
    inline_shared_stages: bool = field(
        default=True,
        metadata=_doc(
            "Run a shared sub-plan (Polars' cache: a sub-plan the query uses twice) inside "
            "the stage that reads it, when that one stage reads it partition by partition: "
            "each task computes its partition once for both uses, and nothing is written "
            "to the object store in between. Off: the shared sub-plan is a stage of its own."
        ),
    )
    small_query_bytes: int = field(
        default=64 * 1024 * 1024,
        metadata=_doc(
            "Small-query path: a query whose scans are estimated (Parquet footers, in-memory "
            "table sizes) under this many bytes in all, and under target_partition_bytes, "
            "runs as one task with no exchange; 0: never. Off when default_partitions or "
            "shuffle_partitions is set, or with a stateful or GPU user function."
        ),
    )
    small_query_native: bool = field(
        default=True,
        metadata=_doc(
            "A small query (small_query_bytes) whose one task runs in this process (the "
            "local runner, or small_query_where='driver') runs as the frontend's own query "
            "on the frontend's own engine (a Polars collect: Polars' optimised plan on the "
            "engine a plain collect() would use, with the query's optimisation flags) "
            "instead of shoal's lowering of it: the same query, answered as the frontend "
            "answers it, without lowering it and optimising it again (2-3 ms per query at "
            "TPC-H scale 0.1). The task, its report and its trace are shoal's as before. "
            "Off: shoal's lowering runs it, as it runs every task of a distributed plan. "
            "A query with a shoal user function is lowered (its function must run inside "
            "the task), as are the queries of frontends that cannot hand a query back "
            "(DuckDB, shoal's IR)."
        ),
    )
    small_query_where: SmallQueryWhere = field(
        default="driver",
        metadata=_doc(
            "Where the one task of a small query (small_query_bytes) runs on the Ray runner: "
            "'driver' runs it in this process with all of Polars' threads (the planner has "
            "just read its files' footers, its frames are here), without a Ray task's start, "
            "the object store or a worker limited to task_cpus threads; 'worker' runs it as a "
            "Ray task. A query with a user function runs on a worker while ray_runtime_env "
            "is set (the function may need what that environment installs there). As on the "
            "local runner, which runs every task in this process, a query cancelled or "
            "interrupted (Ctrl-C) returns at once while its task's Polars query finishes in "
            "the background."
        ),
    )
    max_tasks_in_flight: int = field(
        default=0, metadata=_doc("Tasks submitted and not yet finished, at most; 0: 2 per CPU.")
    )
    max_bytes_held: int | None = field(
        default=None,
        metadata=_doc(
            "Backpressure: bytes of task outputs a query may hold (produced, not yet read by "
            "their last reader) before the dispatch loop stops starting tasks that only add "
            "bytes (scans); tasks that release bytes still run. Unset: half the Ray object "
            "store (Ray runner) or a quarter of physical memory (local runner); 0: no limit."
        ),
    )
    max_task_input_bytes: int = field(
        default=1024**3,
        metadata=_doc(
            "A hash-join task whose input (its upstream pieces, in bytes) exceeds this is "
            "split into subtasks where that is exact (inner, left, semi, anti, right joins: "
            "the skewed side's pieces in groups, the other side whole); 0: never split."
        ),
    )
    adaptive: bool = field(
        default=True,
        metadata=_doc(
            "Adaptive execution: when a stage is about to run, use the rows and bytes its "
            "inputs actually produced to skip work whose output is certainly empty (an inner "
            "join with an empty side, per stage or per shuffle bucket) and to read adjacent "
            "small shuffle buckets in one task (about input bytes / CPUs per task, at least "
            "8 MiB, at most target_partition_bytes; not when shuffle_partitions is set). "
            "explain(analyze=True) lists what changed."
        ),
    )
    task_cpus: int = field(
        default=1,
        metadata=_doc(
            "CPUs each task holds; also its Polars thread count (POLARS_MAX_THREADS of Ray "
            "workers)."
        ),
    )
    sort_sample_rows: int = field(
        default=1000,
        metadata=_doc(
            "Rows of sort keys sampled per partition to choose range-exchange boundaries."
        ),
    )
    raise_on_fail: bool = field(
        default=False,
        metadata=_doc(
            "Fallback policy: raise UnsupportedError instead of falling back to the "
            "frontend's own engine. An explicit raise_on_fail argument wins."
        ),
    )
    trace: str | None = field(
        default=None,
        metadata=_doc(
            "Write a Perfetto (Chrome trace-event JSON) trace to this file, or one file per "
            "query into this directory; unset: no tracing."
        ),
    )
    progress: ProgressMode = field(
        default="auto",
        metadata=_doc(
            "Progress bars per stage: 'auto' (on a TTY or in a Jupyter notebook, for queries "
            "over about a second), 'always' or 'never'."
        ),
    )
    udf_batch_size: int | None = field(
        default=None,
        metadata=_doc(
            "Rows per batch handed to a user function when the UDF sets no batch_size. "
            "Unset: a stateless CPU function gets each task's rows in one call (as Polars' "
            "map_batches gets the whole column), a stateful class or GPU function 8192 rows "
            "per call."
        ),
    )
    udf_keep_warm: bool = field(
        default=True,
        metadata=_doc(
            "Keep the actor pool of a stateful or GPU user function up after a query that "
            "succeeded, for the next query that runs the same UDF (no actor start, no "
            "__init__ again: loading a model is the expensive part); its actors keep their "
            "CPUs and GPUs while idle (on Ray only as many as leave task_cpus CPUs free). "
            "Closed after udf_keep_warm_idle_s seconds unused, by a query that needs a pool "
            "for another UDF, and by shoal.shutdown(). False: a pool is closed when its "
            "stage ends."
        ),
    )
    udf_keep_warm_idle_s: float = field(
        default=300.0,
        metadata=_doc(
            "Seconds a kept (udf_keep_warm) actor pool waits unused before it is closed and "
            "its actors' CPUs and GPUs are free again; 0: until shutdown or another UDF."
        ),
    )
    extensions: Mapping[str, Any] = field(
        default_factory=FrozenDict,
        metadata=_doc(
            "Settings of libraries built on shoal, by namespace (JSON object in the "
            "environment); validated by the validator registered with register_extension."
        ),
    )

    def __new__(cls, *args: Any, **kwargs: Any) -> Config:
        """Refuse an unknown setting with the closest name (``default_partiton`` ->
        ``default_partitions``), as ``DistEngine(**settings)`` does."""
        unknown = sorted(set(kwargs) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            import difflib

            names = [f.name for f in dataclasses.fields(cls)]
            close = difflib.get_close_matches(unknown[0], names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"Config: {unknown[0]!r} is no shoal setting{hint}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if "bytes" in f.name and isinstance(value, str):
                object.__setattr__(self, f.name, parse_size(value, f"shoal setting {f.name}"))
            _check_type(f.name, str(f.type), getattr(self, f.name))
        if self.runner not in ("ray", "local"):
            raise ValueError(f"shoal setting runner={self.runner!r}: expected 'ray' or 'local'")
        if self.small_query_where not in ("driver", "worker"):
            raise ValueError(
                f"shoal setting small_query_where={self.small_query_where!r}: expected "
                "'driver' or 'worker'"
            )
        if self.progress not in ("auto", "always", "never"):
            raise ValueError(
                f"shoal setting progress={self.progress!r}: expected 'auto', 'always' or 'never'"
            )
        for name in ("target_partition_bytes", "task_cpus", "sort_sample_rows"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(
                    f"shoal setting {name} must be a positive integer, got {getattr(self, name)!r}"
                )
        for name in (
            "shuffle_partitions",
            "broadcast_join_threshold_bytes",
            "broadcast_inline_bytes",
            "small_query_bytes",
            "max_tasks_in_flight",
            "max_task_input_bytes",
            "default_partitions",
            "task_max_retries",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(
                    f"shoal setting {name} must be an integer >= 0, got {getattr(self, name)!r}"
                )
        for name in ("num_cpus", "object_store_bytes", "udf_batch_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"shoal setting {name} must be a positive integer, got {value!r}")
        held = self.max_bytes_held
        if held is not None and (not isinstance(held, int) or held < 0):
            raise ValueError(f"shoal setting max_bytes_held must be an integer >= 0, got {held!r}")
        if self.num_gpus is not None and (not isinstance(self.num_gpus, int) or self.num_gpus < 0):
            raise ValueError(
                f"shoal setting num_gpus must be an integer >= 0, got {self.num_gpus!r}"
            )
        if self.gpus is not None:
            from shoal.resources import parse_gpu_ids

            if not isinstance(self.gpus, str):
                raise ValueError(
                    f"shoal setting gpus must be a string such as '0,1', got {self.gpus!r}"
                )
            parse_gpu_ids(self.gpus, "shoal setting gpus")
        idle = self.udf_keep_warm_idle_s
        if isinstance(idle, bool) or not isinstance(idle, int | float) or idle < 0:
            raise ValueError(
                f"shoal setting udf_keep_warm_idle_s must be a number of seconds >= 0, got {idle!r}"
            )
        if (
            not isinstance(self.ray_connect_timeout_s, int | float)
            or self.ray_connect_timeout_s <= 0
        ):
            raise ValueError(
                "shoal setting ray_connect_timeout_s must be a positive number of "
                f"seconds, got {self.ray_connect_timeout_s!r}"
            )
        env = self.ray_runtime_env
        if not isinstance(env, Mapping):
            raise ValueError(
                f"shoal setting ray_runtime_env must be a mapping (Ray's runtime_env), got {env!r}"
            )
        if not isinstance(env, FrozenDict):
            object.__setattr__(self, "ray_runtime_env", FrozenDict(env))
        if self.ray_namespace is not None and not isinstance(self.ray_namespace, str):
            raise ValueError(
                f"shoal setting ray_namespace must be a string, got {self.ray_namespace!r}"
            )
        ext = self.extensions
        if not isinstance(ext, FrozenDict):
            if not isinstance(ext, Mapping):
                raise ValueError("shoal setting extensions must be a mapping of namespaces")
            object.__setattr__(self, "extensions", FrozenDict(ext))
        for ns, value in self.extensions.items():
            validator = _extensions.get(ns)
            if validator is None:
                raise ValueError(
                    f"shoal setting extensions[{ns!r}]: no extension registered under that "
                    "namespace; call shoal.config.register_extension first"
                )
            validator(value)

    def __repr__(self) -> str:
        """Like a dataclass's, with credentials redacted (see :meth:`non_defaults`)."""
        shown = self.non_defaults()
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes``; raises ``TypeError`` naming an unknown setting."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"unknown shoal setting(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(self, **changes)

    def digest(self) -> str:
        """A short content hash (16 hex digits) of every setting. Computed once per
        content in a process (a query asks for it on the driver and in every task), and
        kept on the instance (the settings are frozen): finding it again by content
        compares every setting, about 40 microseconds per call."""
        got: str | None = self.__dict__.get("_digest")
        if got is not None:
            return got
        try:
            got = _DIGESTS[self]
        except (KeyError, TypeError):  # TypeError: an unhashable extension value
            values = {f.name: _thaw(getattr(self, f.name)) for f in fields(self)}
            text = json.dumps(values, sort_keys=True, default=repr)
            got = hashlib.sha256(text.encode()).hexdigest()[:16]
            with contextlib.suppress(TypeError):
                _DIGESTS[self] = got
        object.__setattr__(self, "_digest", got)
        return got

    def non_defaults(self) -> dict[str, Any]:
        """The settings that differ from the defaults, by name, for display (explain,
        traces): credentials in ``ray_address`` and the values of ``ray_runtime_env``'s
        ``env_vars`` are replaced by ``***`` (see :func:`redact`)."""
        base = Config()
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(base, f.name):
                continue
            if f.name == "ray_address" and isinstance(value, str):
                value = redact(value)
            elif f.name == "ray_runtime_env":
                value = _thaw(value)
                if isinstance(value.get("env_vars"), dict):
                    value["env_vars"] = dict.fromkeys(value["env_vars"], "***")
            out[f.name] = value
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read ``SHOAL_<FIELD>`` variables over the defaults (the driver only).

        Raises ``ValueError`` naming the variable and the expected form when a value does
        not parse or is out of range.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = env_var(f.name)
            if var in env:
                values[f.name] = _parse(var, env[var], f)
        _warn_unknown_variables(env)
        try:
            return cls(**values)
        except ValueError as exc:
            names = ", ".join(env_var(n) for n in values)
            raise ValueError(f"{exc} (from environment variables {names})") from None


#: ``SHOAL_*`` variables that are not settings but are read elsewhere (the CLI's data cache).
OTHER_VARIABLES = frozenset({"SHOAL_DATA_DIR"})


def _warn_unknown_variables(env: Mapping[str, str]) -> None:
    """Warn (:class:`shoal.errors.ShoalWarning`) about each ``SHOAL_*`` variable that
    names no setting, with the closest setting's variable: a misspelt variable would
    otherwise be ignored without a word."""
    import difflib

    known = {env_var(f.name) for f in fields(Config)} | OTHER_VARIABLES
    for var in sorted(v for v in env if v.startswith("SHOAL_") and v not in known):
        close = difflib.get_close_matches(var, sorted(known), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.warn(
            f"environment variable {var} is not a shoal setting and is ignored{hint}",
            ShoalWarning,
            stacklevel=3,
        )


def env_var(name: str) -> str:
    """The environment variable of setting ``name``: ``SHOAL_`` + the name in capitals."""
    return f"SHOAL_{name.upper()}"


def _parse(var: str, raw: str, f: dataclasses.Field[Any]) -> Any:
    typ = str(f.type)
    text = raw.strip()
    optional = "None" in typ
    if optional and text.lower() in ("", "none"):
        return None
    try:
        if typ == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if typ.startswith("int"):
            if "bytes" in f.name:
                return parse_size(text, var)
            return int(text.replace("_", ""))
        if typ.startswith("float"):
            return float(text)
        if typ.startswith("Mapping"):
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError
            return value
        return text
    except ValueError:
        form = (
            "true or false"
            if typ == "bool"
            else "an integer"
            if typ.startswith("int")
            else "a number"
            if typ.startswith("float")
            else "a JSON object"
            if typ.startswith("Mapping")
            else "a string"
        )
        raise ValueError(f"environment variable {var}={raw!r}: expected {form}") from None


# ------------------------------------------------------------------ extensions

_extensions: dict[str, Callable[[Any], None]] = {}


def register_extension(namespace: str, validator: Callable[[Any], None] | None = None) -> None:
    """Let a library attach settings under ``namespace`` in ``Config.extensions``.

    ``validator(value)`` runs on the driver whenever a config holding the namespace is
    built, and raises (``ValueError``) to refuse a value.
    """
    _extensions[namespace] = validator or (lambda _value: None)


# ------------------------------------------------------------------ current config

_lock = threading.RLock()
_config: Config | None = None
_runner_started = False
_local = threading.local()
_task_config: contextvars.ContextVar[Config | None] = contextvars.ContextVar(
    "shoal_task_config", default=None
)


def _global() -> Config:
    global _config
    with _lock:
        if _config is None:
            _config = Config.from_env()
        return _config


def get_config() -> Config:
    """The config in force: inside a task, the query's installed snapshot; on the driver,
    the innermost :func:`execution_config` of this thread, else the global config (built
    from ``SHOAL_*`` variables on first use)."""
    task = _task_config.get()
    if task is not None:
        return task
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    return _global()


def set_config(**changes: Any) -> Config:
    """Change the global config and return it.

    Raises :class:`ConfigFrozenError` when a runner setting (runner, ray_address,
    num_cpus, num_gpus, gpus, ray_temp_dir, object_store_bytes, spill_dir, ray_dashboard,
    ray_connect_timeout_s) changes while a runner is running, ``TypeError`` for an unknown
    setting, ``ValueError`` for an invalid value.
    """
    global _config
    with _lock:
        current = _global()
        frozen = sorted(
            k for k in changes if k in RUNNER_FIELDS and changes[k] != getattr(current, k)
        )
        if frozen and _runner_started:
            raise ConfigFrozenError(
                f"shoal setting(s) {', '.join(frozen)} shape the runner, which has already "
                "started; call shoal.shutdown() first, then set them"
            )
        _config = current.replace(**changes)
        return _config


@contextlib.contextmanager
def execution_config(**changes: Any) -> Iterator[Config]:
    """Apply execution settings to the queries this thread runs inside the block.

    Runner settings cannot change per query: raises :class:`ConfigFrozenError` for them.
    """
    bad = sorted(k for k in changes if k in RUNNER_FIELDS)
    if bad:
        raise ConfigFrozenError(
            f"shoal setting(s) {', '.join(bad)} shape the runner and cannot change per "
            "query; use shoal.set_config before the runner starts"
        )
    cfg = get_config().replace(**changes)
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(cfg)
    try:
        yield cfg
    finally:
        stack.pop()


def mark_runner_started(started: bool) -> None:
    """Called by the runners: runner settings freeze while a runner is alive."""
    global _runner_started
    _runner_started = started


#: The packages whose versions must agree between the driver and every worker.
VERSIONED_PACKAGES = ("shoal", "polars", "pyarrow", "duckdb")
_versions: str | None = None


def software_versions() -> str:
    """This process's versions of Python (major.minor) and of :data:`VERSIONED_PACKAGES`
    (those imported or importable), as ``"name=version;..."``, computed once."""
    global _versions
    if _versions is None:
        import importlib.metadata
        import sys

        parts = [f"python={sys.version_info[0]}.{sys.version_info[1]}"]
        for name in VERSIONED_PACKAGES:
            module = sys.modules.get(name)
            version = getattr(module, "__version__", None) if module is not None else None
            if not isinstance(version, str):
                try:
                    version = importlib.metadata.version(name)
                except importlib.metadata.PackageNotFoundError:
                    version = "absent"
            parts.append(f"{name}={version}")
        _versions = ";".join(parts)
    return _versions


def query_digest(config: Config) -> str:
    """What every task of a query checks before it starts: the config snapshot's content
    hash and the driver's :func:`software_versions`, as ``"<hash>;<versions>"``."""
    return f"{config.digest()};{software_versions()}"


def _node_name() -> str:
    import socket
    import sys

    ray = sys.modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()
            return f"{socket.gethostname()} (Ray node {node[:12]})"
    except Exception:  # pragma: no cover - no runtime context outside a Ray worker
        pass
    return socket.gethostname()


def check_versions(driver_versions: str) -> None:
    """Raise :class:`shoal.errors.VersionMismatchError` naming this node and each package
    whose version here differs from the driver's (``driver_versions`` as
    :func:`software_versions` writes them)."""
    mine = software_versions()
    if driver_versions == mine:
        return
    here = dict(p.split("=", 1) for p in mine.split(";") if "=" in p)
    there = dict(p.split("=", 1) for p in driver_versions.split(";") if "=" in p)
    diff = ", ".join(
        f"{name} {here.get(name, 'absent')} (driver: {there.get(name, 'absent')})"
        for name in sorted(set(here) | set(there))
        if here.get(name) != there.get(name)
    )
    raise VersionMismatchError(
        f"shoal: the worker on {_node_name()} runs {diff}; every node of the cluster must "
        "run the driver's versions (install the same packages there, or give Ray a "
        "runtime_env that does)"
    )


@contextlib.contextmanager
def task_config(config: Config, digest: str) -> Iterator[Config]:
    """Inside a task: install the query's snapshot for the task's duration.

    ``digest`` is the query's :func:`query_digest` (a bare :meth:`Config.digest` skips the
    version check). Raises ``RuntimeError`` when the snapshot does not hash to it (a task
    must never run under a config other than its query's), and
    :class:`shoal.errors.VersionMismatchError` when this worker's software versions
    differ from the driver's, before any work.
    """
    wanted, _, driver_versions = digest.partition(";")
    got = config.digest()
    if got != wanted:
        raise RuntimeError(f"shoal config snapshot hash mismatch in task: {got} != {wanted}")
    if driver_versions:
        check_versions(driver_versions)
    token = _task_config.set(config)
    try:
        yield config
    finally:
        _task_config.reset(token)


def config_table_markdown() -> str:
    """The table of every setting (docs/config.md is generated from this)."""
    lines = [
        "| setting | environment variable | type | default | meaning |",
        "| --- | --- | --- | --- | --- |",
    ]
    base = Config()
    for f in fields(Config):
        default = getattr(base, f.name)
        shown = "{}" if isinstance(default, Mapping) else repr(default)
        typ = str(f.type).replace("|", "\\|")
        lines.append(
            f"| `{f.name}` | `{env_var(f.name)}` | `{typ}` | `{shown}` | {f.metadata['doc']} |"
        )
    return "\n".join(lines)


def config_page() -> str:
    """The text of ``docs/config.md``; regenerate the page with
    ``python -c "from shoal.config import config_page; print(config_page(), end='')" > docs/config.md``.
    """
    return (
        "# shoal settings\n\n"
        "Every setting of `shoal.Config`, generated from the dataclass by\n"
        "`shoal.config.config_page()` (a test checks that this page matches). Set them in code\n"
        "(`shoal.set_config(...)`, `with shoal.execution_config(...)`, `Config(...)` passed to\n"
        "`DistEngine(config=...)`) or with the environment variables, which are read on the\n"
        "driver only. Runner settings (runner, ray_address, num_cpus, ray_temp_dir) are fixed\n"
        "while a runner is running: `shoal.shutdown()` first. Each query takes one snapshot;\n"
        "every task installs it and checks its hash before it starts work.\n\n"
        + config_table_markdown()
        + "\n"
    )
