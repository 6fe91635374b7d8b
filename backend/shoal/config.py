"""shoal's configuration: one frozen :class:`Config`, read from ``SHOAL_<FIELD>`` variables.

Environment variables are read on the driver only (never on workers). Each field of
:class:`Config` has an environment variable named ``SHOAL_`` plus the field name in
capitals. A query takes one snapshot of the config when it starts and ships that snapshot
to every task, so workers never read the driver's global state or their own environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from shoal.errors import ConfigFrozenError

RunnerKind = Literal["ray", "local"]

#: Fields that shape the runner; fixed once a runner has started.
RUNNER_FIELDS: frozenset[str] = frozenset({"runner", "ray_address", "num_cpus", "ray_temp_dir"})


@dataclass(frozen=True)
class Config:
    """Every setting that changes how a query runs.

    Construct with keyword arguments, or take the current one with :func:`get_config`.
    ``Config.from_env()`` reads ``SHOAL_<FIELD>`` variables; a malformed value raises
    ``ValueError`` naming the variable and the expected form.
    """

    runner: RunnerKind = field(default="ray", metadata={"doc": "'ray' or 'local' (thread pool, no Ray)."})
    ray_address: str | None = field(
        default=None,
        metadata={"doc": "Ray cluster address (e.g. 'ray://host:10001'); None starts a local "
                  "instance unless RAY_ADDRESS is set."},
    )
    num_cpus: int | None = field(
        default=None, metadata={"doc": "CPUs for a local Ray instance or thread pool; None = all."}
    )
    ray_temp_dir: str | None = field(
        default=None, metadata={"doc": "Ray's session directory for a local instance (short path)."}
    )
    target_partition_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata={"doc": "Bytes (uncompressed, from Parquet footers or Arrow buffers) per scan "
                  "partition."},
    )
    shuffle_partitions: int = field(
        default=0,
        metadata={"doc": "Partitions after a hash or range exchange; 0 = as many as the input "
                  "has, capped at 4 x CPUs."},
    )
    broadcast_join_threshold_bytes: int = field(
        default=32 * 1024 * 1024,
        metadata={"doc": "A join side estimated below this many bytes is broadcast; 0 disables."},
    )
    max_tasks_in_flight: int = field(
        default=0, metadata={"doc": "Upper bound on tasks submitted at once; 0 = 2 x CPUs."}
    )
    task_cpus: int = field(
        default=1, metadata={"doc": "CPUs each task holds; also its Polars thread count."}
    )
    raise_on_fail: bool = field(
        default=False,
        metadata={"doc": "Raise UnsupportedError instead of falling back to the frontend's engine."},
    )
    sort_sample_rows: int = field(
        default=1000, metadata={"doc": "Rows sampled per partition to choose range boundaries."}
    )

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes``; raises ``TypeError`` for an unknown field name."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"unknown shoal setting(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(self, **changes)

    def digest(self) -> str:
        """A stable hash of every setting (hex), used to check what a worker installed."""
        text = repr(sorted(dataclasses.asdict(self).items()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read ``SHOAL_<FIELD>`` variables over the defaults.

        Raises ``ValueError`` naming the variable and the expected form when a value does
        not parse.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = f"SHOAL_{f.name.upper()}"
            if var not in env:
                continue
            values[f.name] = _parse(var, env[var], f)
        return cls(**values)

    def __post_init__(self) -> None:
        if self.runner not in ("ray", "local"):
            raise ValueError(f"shoal setting runner={self.runner!r}: expected 'ray' or 'local'")
        for name in ("target_partition_bytes", "task_cpus", "sort_sample_rows"):
            if getattr(self, name) <= 0:
                raise ValueError(f"shoal setting {name} must be positive, got {getattr(self, name)}")
        for name in ("shuffle_partitions", "broadcast_join_threshold_bytes", "max_tasks_in_flight"):
            if getattr(self, name) < 0:
                raise ValueError(f"shoal setting {name} must be >= 0, got {getattr(self, name)}")


def _parse(var: str, raw: str, f: dataclasses.Field[Any]) -> Any:
    typ = str(f.type)
    text = raw.strip()
    try:
        if typ == "bool":
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if "int" in typ:
            if "None" in typ and text.lower() in ("", "none"):
                return None
            return int(text.replace("_", ""))
        if "None" in typ and text.lower() in ("", "none"):
            return None
        return text
    except ValueError:
        form = "true/false" if typ == "bool" else "an integer" if "int" in typ else "a string"
        raise ValueError(f"environment variable {var}={raw!r}: expected {form}") from None


_lock = threading.Lock()
_config: Config | None = None
_runner_started = False
_local = threading.local()


def get_config() -> Config:
    """The config queries use now: the innermost :func:`execution_config`, else the global
    one (built from ``SHOAL_*`` variables on first use)."""
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    global _config
    with _lock:
        if _config is None:
            _config = Config.from_env()
        return _config


def set_config(**changes: Any) -> Config:
    """Change the global config. Raises :class:`ConfigFrozenError` when a runner setting
    (runner, ray_address, num_cpus, ray_temp_dir) changes after a runner has started."""
    global _config
    current = get_config() if not getattr(_local, "stack", None) else _global()
    frozen = sorted(k for k in changes if k in RUNNER_FIELDS and changes[k] != getattr(current, k))
    if frozen and _runner_started:
        raise ConfigFrozenError(
            f"shoal setting(s) {frozen} shape the runner, which has already started; "
            "call shoal.shutdown() first, then set them"
        )
    new = current.replace(**changes)
    with _lock:
        _config = new
    return new


def _global() -> Config:
    global _config
    with _lock:
        if _config is None:
            _config = Config.from_env()
        return _config


@contextlib.contextmanager
def execution_config(**changes: Any) -> Iterator[Config]:
    """Apply execution settings to the queries inside the ``with`` block (this thread).

    Runner settings cannot change here: raises :class:`ConfigFrozenError` for them.
    """
    bad = sorted(k for k in changes if k in RUNNER_FIELDS)
    if bad:
        raise ConfigFrozenError(
            f"shoal setting(s) {bad} shape the runner and cannot change per query; "
            "use shoal.set_config before the runner starts"
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


_worker_digest: str | None = None


def install_worker_config(config: Config, digest: str) -> None:
    """On a worker: install the query's config snapshot before doing anything else.

    Raises ``RuntimeError`` when the snapshot does not hash to ``digest`` (a config that
    changed in transit must never run a task)."""
    global _config, _worker_digest
    if config.digest() != digest:
        raise RuntimeError(
            f"shoal config snapshot hash mismatch on worker: {config.digest()} != {digest}"
        )
    with _lock:
        _config = config
        _worker_digest = digest
