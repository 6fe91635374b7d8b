"""The Ray runner: tasks as Ray tasks, tables through the Ray object store.

Each task returns ``1 + num_outputs`` objects: its :class:`~shoal.execution.kernel.TaskStats`
(small, fetched by the driver) and one Arrow table per output partition, which stay in the
object store until a downstream task reads them (zero-copy on the same node). The query's
config snapshot is ``ray.put`` once per distinct config (queries under the same settings
share one object) and every task installs it first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle as _pickle
import queue
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, TypeVar

import pyarrow as pa

from shoal.config import Config, redact
from shoal.errors import ShoalError
from shoal.ir.nodes import InMemorySource, PlanNode, Scan
from shoal.planner.physical import MemoryPiece, ScanSet
from shoal.runners.dispatch import TaskResult, TaskSpec

_log = logging.getLogger("shoal")
_T = TypeVar("_T")

#: Tries to start a local Ray instance whose node timed out during startup.
START_ATTEMPTS = 2
#: Seconds a cancelled Ray task gets to stop by itself before its worker is killed.
CANCEL_GRACE_S = 1.0
#: Seconds to read what a finished task left (it is ready: this only bounds a busy driver;
#: ``timeout=0`` can give up before even an inline error is read).
READ_TIMEOUT_S = 5.0
#: Seconds a :class:`ClusterView` trusts its last read of the cluster's nodes: a node that
#: joins (or leaves) is seen by the first query planned this long after the change.
CLUSTER_VIEW_TTL_S = 2.0
#: Config snapshots a :class:`RayBackend` keeps in the object store for reuse.
CONFIG_CACHE_SIZE = 8


class ClusterView:
    """The Ray cluster's size as a query's planning needs it (CPUs, object store), read at
    most once per ``ttl_s``.

    Each read is a round trip to Ray's GCS (``ray.nodes()``: 1-13 ms measured on a loaded
    2-core machine), which every query paid three times (the plan's size, the task CPU
    check, the object store for backpressure). ``read_nodes`` returns Ray's node list
    (``ray.nodes()``: dicts with ``Alive`` and ``Resources``); ``clock`` is a monotonic
    clock in seconds (injectable for tests). A stale view only sizes a plan for the cluster
    as it was up to ``ttl_s`` ago (a joining node gets tasks at once, Ray schedules them;
    it counts in the plan's partition count from the next read); the one decision that
    must not be stale, refusing tasks that no node can run, reads again first
    (:meth:`RayBackend.begin_query`)."""

    def __init__(
        self,
        read_nodes: Callable[[], list[dict[str, Any]]],
        ttl_s: float = CLUSTER_VIEW_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read_nodes = read_nodes
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._total = self._largest = self._store = 0.0

    def _refresh(self, fresh: bool) -> None:
        now = self._clock()
        if fresh or self._read_at is None or now - self._read_at >= self._ttl_s:
            alive = [n.get("Resources", {}) for n in self._read_nodes() if n.get("Alive")]
            cpus = [float(r.get("CPU", 0.0)) for r in alive]
            self._total = sum(cpus)
            self._largest = max(cpus, default=0.0)
            self._store = sum(float(r.get("object_store_memory", 0.0)) for r in alive)
            self._read_at = now

    def cpus(self, fresh: bool = False) -> tuple[float, float]:
        """``(total, largest)``: the CPUs of all alive nodes together and of the largest
        one, read again when older than ``ttl_s`` or when ``fresh``."""
        with self._lock:
            self._refresh(fresh)
            return self._total, self._largest

    def object_store_bytes(self) -> int:
        """The object store memory of all alive nodes together, in bytes (0: unknown)."""
        with self._lock:
            self._refresh(False)
            return int(self._store)


class _OwnerThread:
    """The thread that starts (and so owns) a local Ray instance, for the process's life.

    Ray ties the daemons it starts (gcs_server, raylet) to the *thread* that ran
    ``ray.init`` (Linux ``PR_SET_PDEATHSIG`` fires when the forking thread exits). Started
    from a short-lived thread (a ``ThreadPoolExecutor`` worker, ``asyncio.to_thread``, a web
    server's request thread), the instance died with that thread, the next query hung for
    60 s and Ray's C++ core then exited the whole process. So shoal runs ``ray.init`` on one
    daemon thread of its own that waits for work until the process ends.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def run(self, fn: Callable[[], _T]) -> _T:
        """Run ``fn`` on the owner thread and return its result (or raise its error)."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, name="shoal-ray-owner", daemon=True
                )
                self._thread.start()
        done: Future[_T] = Future()
        self._jobs.put((fn, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            fn, done = self._jobs.get()
            try:
                done.set_result(fn())
            except BaseException as exc:  # handed to the caller's thread
                done.set_exception(exc)


_owner = _OwnerThread()


class _DropNotMainThreadWarning(logging.Filter):
    """Ray warns that it sets no SIGTERM handler off the main thread: expected on the
    owner thread, and not the user's concern."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "not the main thread" not in record.getMessage()


#: The logger of Ray's notice that a local instance starts with token authentication on.
RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class _TokenAuthNotice(logging.Filter):
    """Ray 2.60 warns, at the start of every local instance, that token authentication is
    on (its default), on stderr, in the middle of whatever the program prints. For the
    private instance shoal starts that is no news to act on (shoal keeps it on): the
    notice goes to the ``shoal`` logger at INFO instead. Ray's warning that token
    authentication is *off* (``RAY_AUTH_MODE=disabled``) is left as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.getMessage().startswith("Token authentication is enabled"):
            _log.info(
                "shoal: the local Ray instance uses Ray's token authentication (%s)",
                record.getMessage(),
            )
            return False
        return True


def start_ray(config: Config) -> bool:
    """Connect to Ray, starting a local instance when no address is configured.

    Runs on shoal's Ray owner thread (see :class:`_OwnerThread`), so that a local instance
    lives as long as the process whichever thread ran the first query.

    The address is ``config.ray_address`` (``SHOAL_RAY_ADDRESS``), else ``RAY_ADDRESS``
    (read by Ray on the driver), else a new local instance with ``config.num_cpus`` CPUs
    and ``config.num_gpus`` GPUs, and the Ray dashboard when ``config.ray_dashboard`` (a
    cluster's dashboard is the cluster's own: ``ray start --head`` starts it).
    Returns True when shoal started (and so owns) the instance. Raises
    :class:`shoal.ShoalError` saying why when Ray cannot start; never falls back.
    """
    return _owner.run(lambda: _start_ray(config))


def _start_ray(config: Config) -> bool:
    import ray

    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {
        "logging_level": logging.WARNING,
        "runtime_env": runtime_env(config),
    }
    if config.ray_namespace:
        kwargs["namespace"] = config.ray_namespace
    address = config.ray_address or os.environ.get("RAY_ADDRESS")
    if address and address != "auto":
        check_reachable(address, config.ray_connect_timeout_s)
    try:
        if address:
            ray.init(address=address, **kwargs)
        else:
            system: dict[str, Any] = {}
            if config.spill_dir:
                os.makedirs(config.spill_dir, mode=0o700, exist_ok=True)
                system["object_spilling_config"] = json.dumps(
                    {"type": "filesystem", "params": {"directory_path": config.spill_dir}}
                )
            # address="local" always starts a new instance private to this process: with no
            # address Ray would attach to any instance another program started on the
            # machine (it reads /tmp/ray/ray_current_cluster).
            ray_worker_log = logging.getLogger("ray._private.worker")
            quiet = _DropNotMainThreadWarning()
            ray_worker_log.addFilter(quiet)
            auth_log = logging.getLogger(RAY_AUTH_LOGGER)
            notice = _TokenAuthNotice()
            auth_log.addFilter(notice)
            try:
                for attempt in range(START_ATTEMPTS):
                    try:
                        ray.init(
                            address="local",
                            num_cpus=config.num_cpus,
                            num_gpus=config.num_gpus,
                            _temp_dir=config.ray_temp_dir or private_ray_dir(),
                            object_store_memory=config.object_store_bytes,
                            _system_config=system or None,
                            include_dashboard=config.ray_dashboard,
                            **kwargs,
                        )
                        break
                    except Exception as exc:
                        # On a loaded machine the raylet can miss Ray's start deadline;
                        # what it left is stopped and the start tried again.
                        if attempt + 1 == START_ATTEMPTS or "timed out" not in str(exc):
                            raise
                        with contextlib.suppress(Exception):
                            ray.shutdown()
            finally:
                ray_worker_log.removeFilter(quiet)
                auth_log.removeFilter(notice)
    except Exception as exc:
        where = f"cluster at {redact(address)!r}" if address else "a local Ray instance"
        hint = (
            "; ray_dashboard (SHOAL_RAY_DASHBOARD) needs ray[default]: pip install 'ray[default]'"
            if config.ray_dashboard and not address and "dashboard" in str(exc).lower()
            else ""
        )
        if address and address.startswith("ray://") and "timeout" in str(exc).lower():
            # Ray Client does not say that the server refused it for want of a token.
            hint = (
                "; a cluster started by Ray 2.60 requires token authentication: set "
                "RAY_AUTH_MODE=token on the driver and give it the cluster's token "
                "(RAY_AUTH_TOKEN, or the file ~/.ray/auth_token)"
            )
        # Ray's own message may repeat the address, credentials and all: redacted, and the
        # original is not chained.
        raise ShoalError(
            f"shoal could not start the Ray runner ({where}): {redact(str(exc))}{hint}"
        ) from None
    return True


def private_ray_dir() -> str:
    """The root of a local Ray instance's files when ``ray_temp_dir`` is unset:
    ``<tmp>/shoal-<uid>/ray``, under a directory of mode 0700 owned by the user.

    Ray makes its own directories 0777 (sessions, sockets, logs, spilled objects), so the
    privacy comes from the parent, which no other user can enter. Raises
    :class:`shoal.ShoalError` when that parent exists but is a link, not a directory, or
    another user's (someone may be waiting for our files there).
    """
    uid = os.getuid() if hasattr(os, "getuid") else 0
    base = os.path.join(tempfile.gettempdir(), f"shoal-{uid}")
    os.makedirs(base, mode=0o700, exist_ok=True)
    info = os.lstat(base)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != uid:
        raise ShoalError(
            f"shoal: {base} is not a directory of this user's; shoal keeps its local Ray "
            "instance's files there (mode 0700). Remove it, or set ray_temp_dir "
            "(SHOAL_RAY_TEMP_DIR) to a directory of your own"
        )
    if info.st_mode & 0o077:
        os.chmod(base, 0o700)
    return os.path.join(base, "ray")


def runtime_env(config: Config) -> dict[str, Any]:
    """The Ray runtime_env of the driver's job: the user's ``ray_runtime_env`` with
    ``POLARS_MAX_THREADS`` (the task's CPUs: Polars fixes its thread pool at import) added
    to its ``env_vars`` unless the user set it."""
    env: dict[str, Any] = json.loads(json.dumps(dict(config.ray_runtime_env), default=_plain))
    env_vars = dict(env.get("env_vars") or {})
    env_vars.setdefault("POLARS_MAX_THREADS", str(config.task_cpus))
    env["env_vars"] = env_vars
    return env


def _plain(value: Any) -> Any:
    """JSON form of the frozen mappings and tuples a Config holds."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"shoal setting ray_runtime_env: {value!r} is not JSON")


def check_reachable(address: str, timeout_s: float) -> None:
    """Raise :class:`shoal.ShoalError` unless a gRPC server answers at the Ray ``address``
    (``ray://host:port`` or ``host:port``) within ``timeout_s`` seconds in all.

    Two steps share the budget: a TCP connection, then an HTTP/2 (gRPC) handshake, which
    Ray's GCS and its client server both complete. The second step matters: ``ray.init``
    against a port that accepts TCP but is not Ray (a web server, a stray listener) retries
    for more than ten minutes, and with short GCS timeouts Ray's C++ core ends the process.
    """
    target = address.removeprefix("ray://").rpartition("@")[2]
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ShoalError(
            f"shoal: Ray address {redact(address)!r} is not of the form [ray://]host:port"
        )
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ShoalError(
            f"shoal: the Ray cluster at {redact(address)!r} is unreachable ({exc}; "
            f"ray_connect_timeout_s is {timeout_s:g} s); check the address "
            "(SHOAL_RAY_ADDRESS / RAY_ADDRESS)"
        ) from None
    import grpc  # a dependency of Ray

    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=max(0.1, deadline - time.monotonic()))
    except grpc.FutureTimeoutError:
        raise ShoalError(
            f"shoal: nothing at {redact(address)!r} answered as a Ray cluster within "
            f"{timeout_s:g} s (the port accepts connections but does not speak gRPC); check "
            "the address (SHOAL_RAY_ADDRESS / RAY_ADDRESS) and ray_connect_timeout_s"
        ) from None
    finally:
        channel.close()


def _ray_task(
    payload: tuple[Any, ...], config: Config, digest: str, layout: list[int], *refs: pa.Table
) -> tuple[Any, ...]:
    from shoal.config import task_config
    from shoal.execution.kernel import run_fragment

    with task_config(config, digest):
        return _ray_task_body(payload, layout, refs, run_fragment)


class ShippedPiece:
    """Stands in a task's payload for an in-memory scan partition (a
    :class:`~shoal.planner.physical.MemoryPiece`) whose table travels as task argument
    ``index`` (after the stage inputs' references) instead."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __reduce__(self) -> tuple[Any, ...]:
        return (ShippedPiece, (self.index,))


def without_tables(fragment: PlanNode) -> PlanNode:
    """``fragment`` with the table of every in-memory scan replaced by an empty table of
    its schema (``origin`` kept), for shipping: a task reads its rows from its scan
    partition, never from the plan, and the whole table in every task's payload cost a
    copy of the frame per task. Shared sub-plans stay shared (the kernel pairs scans with
    their partitions by identity, :func:`~shoal.planner.physical.scans_of`); a fragment
    without in-memory scans is returned as it is."""
    if not any(
        isinstance(n, Scan) and isinstance(n.source, InMemorySource) for n in fragment.walk()
    ):
        return fragment
    done: dict[int, PlanNode] = {}

    def rec(node: PlanNode) -> PlanNode:
        got = done.get(id(node))
        if got is None:
            if isinstance(node, Scan) and isinstance(node.source, InMemorySource):
                empty = node.source.table.schema.empty_table()
                got = replace(node, source=InMemorySource(empty, node.source.origin))
            else:
                kids = node.children()
                new = tuple(rec(k) for k in kids)
                changed = any(a is not b for a, b in zip(kids, new, strict=True))
                got = node.with_children(new) if changed else node
            done[id(node)] = got
        return got

    return rec(fragment)


def ship(task: TaskSpec) -> tuple[tuple[Any, ...], list[int], list[Any]]:
    """What a Ray task or actor call of ``task`` is given: ``(payload, layout, args)``.

    ``payload`` is ``(stage_part, scan)``: ``stage_part`` the pickled fragment
    (:func:`without_tables`), input schemas and output spec, the same ``bytes`` object for
    every task of a stage (:func:`stage_part`: pickled once per stage, where pickling them
    with every task cost the driver 0.1-0.5 ms a task), and ``scan`` the task's scan
    partition: small, whatever the data. ``args`` are the references to the stage inputs'
    tables (``layout[i]`` of them for input ``i``) followed by the tables of in-memory scan
    partitions, each a task argument of its own: Ray moves an argument over 100 KiB
    through the object store once (the worker reads it zero-copy) and a retried task
    reuses it, where inside the payload every task carried it pickled along with the plan.
    The worker puts the pieces back (:func:`_ray_task_body`)."""
    pieces: list[pa.Table] = []

    def lift(part: Any) -> Any:
        if isinstance(part, MemoryPiece):
            pieces.append(part.table)
            return ShippedPiece(len(pieces) - 1)
        if isinstance(part, ScanSet):
            return ScanSet(tuple(lift(p) for p in part.parts), part.partitioned)
        return part

    scan = lift(task.scan)
    refs = [r for group in task.inputs for r in group]
    layout = [len(g) for g in task.inputs]
    return (stage_part(task), scan), layout, refs + pieces


def stage_part(task: TaskSpec) -> bytes:
    """The part of ``task``'s payload that every task of its stage shares, pickled: its
    fragment (:func:`without_tables`), input schemas and output spec. Pickled once per
    stage and kept in ``task.ship_cache`` (the stage's, for the query's life), checked by
    identity against the stage's current fragment, inputs and output (adaptive execution
    may re-plan a stage before its first task); without a cache, pickled for this task."""
    cache = task.ship_cache
    stage = task.stage
    key = (stage.fragment, stage.inputs, task.output)
    if cache is not None:
        got = cache.get("stage_part")
        if (
            got is not None
            and all(a is b for a, b in zip(got[0], key, strict=True))
            and got[2] == task.empty_if
        ):
            return got[1]  # type: ignore[no-any-return]
    from ray import cloudpickle  # a stateless UDF's function may be a lambda

    blob = cloudpickle.dumps(
        (without_tables(stage.fragment), task.input_schemas, task.output, task.empty_if),
        protocol=_pickle.HIGHEST_PROTOCOL,
    )
    if cache is not None:
        cache["stage_part"] = (key, blob, task.empty_if)
    return blob


def _land(part: Any, pieces: Sequence[pa.Table]) -> Any:
    """The scan partition :func:`ship` lifted, with its tables back in place."""
    if isinstance(part, ShippedPiece):
        return MemoryPiece(pieces[part.index])
    if isinstance(part, ScanSet):
        return ScanSet(tuple(_land(p, pieces) for p in part.parts), part.partitioned)
    return part


def _ray_task_body(
    payload: tuple[Any, ...], layout: list[int], refs: tuple[pa.Table, ...], run_fragment: Any
) -> tuple[Any, ...]:
    part, scan = payload
    fragment, input_schemas, output, empty_if = _pickle.loads(part)
    inputs: list[list[pa.Table]] = []
    pos = 0
    for n in layout:
        inputs.append(list(refs[pos : pos + n]))
        pos += n
    scan = _land(scan, refs[pos:])
    if empty_if and any(not any(t.num_rows for t in inputs[i]) for i in empty_if):
        stats, tables = run_fragment(fragment, inputs, scan, output, input_schemas, empty=True)
    else:
        stats, tables = run_fragment(fragment, inputs, scan, output, input_schemas)
    return (stats, *tables)


class RayBackend:
    """Submits tasks with ``ray.remote``; a handle is the stats reference of a task."""

    #: Ray runs a task again when its worker dies or its output is lost (``max_retries``).
    retries_lost_tasks = True

    def __init__(self, config: Config) -> None:
        import ray

        self._ray = ray
        self._remote = ray.remote(_ray_task)
        self._outputs: dict[Any, tuple[TaskSpec, list[Any]]] = {}
        self.task_cpus = config.task_cpus
        #: CPUs per task of recent queries, by their config snapshot's object id (a query's
        #: ``task_cpus`` may differ from the runner's: ``execution_config(task_cpus=4)``).
        self._query_cpus: dict[str, int] = {}
        self.cluster = ClusterView(ray.nodes)
        #: Config snapshots in the object store, newest last: ``(config, handle)``.
        self._configs: list[tuple[Config, Any]] = []

    def cluster_cpus(self) -> int:
        """The CPUs of the cluster's alive nodes together (at least 1), as of at most
        :data:`CLUSTER_VIEW_TTL_S` ago (see :class:`ClusterView`)."""
        return max(1, int(self.cluster.cpus()[0]))

    def object_store_bytes(self) -> int:
        """The object store memory of the cluster's alive nodes together (0: unknown), as
        of at most :data:`CLUSTER_VIEW_TTL_S` ago."""
        return self.cluster.object_store_bytes()

    def begin_query(self, config: Config) -> Any:
        """Put the query's config snapshot in the object store, or reuse the object of an
        earlier query with an equal config (a config changed between queries is a new
        object: its tasks get the new settings, and each task checks the snapshot's hash).

        Raises :class:`shoal.ShoalError` before any task when no alive node of the cluster
        has ``config.task_cpus`` CPUs: Ray would keep such tasks pending forever."""
        self.check_task_cpus(config)
        handle = None
        for i, (cached, ref) in enumerate(self._configs):
            if cached == config:
                handle = ref
                self._configs.append(self._configs.pop(i))
                break
        if handle is None:
            handle = self._ray.put(config)
            self._configs.append((config, handle))
            if len(self._configs) > CONFIG_CACHE_SIZE:
                del self._configs[0]
        key = handle.hex()
        self._query_cpus.pop(key, None)  # newest last: the first is the one to drop
        if len(self._query_cpus) > 256:
            self._query_cpus.pop(next(iter(self._query_cpus)))
        self._query_cpus[key] = config.task_cpus
        return handle

    def check_task_cpus(self, config: Config) -> None:
        """Raise :class:`shoal.ShoalError` when no alive node of the cluster has
        ``config.task_cpus`` CPUs (read again before refusing: a node may have joined).
        Also asked of a query whose small-query task runs in the driver
        (``small_query_where``), so that a setting the cluster cannot run fails every
        query alike."""
        largest = self.cluster.cpus()[1]
        if config.task_cpus > largest + 1e-9:
            largest = self.cluster.cpus(fresh=True)[1]  # a node may have joined since
        if config.task_cpus > largest + 1e-9:
            raise ShoalError(
                f"shoal setting task_cpus={config.task_cpus} asks more CPUs per task than any "
                f"node of the Ray cluster has (the largest has {largest:g}); its tasks could "
                "never be scheduled"
            )

    def submit(self, task: TaskSpec) -> Any:
        if task.pool is not None:  # a stage of a stateful or GPU UDF: one of its actors
            out = task.pool.submit(task)
            self._outputs[out[0]] = (task, list(out[1:]))
            return out[0]
        payload, layout, args = ship(task)
        out = self._remote_of(task).remote(payload, task.config, task.config_digest, layout, *args)
        self._outputs[out[0]] = (task, list(out[1:]))
        return out[0]

    def _remote_of(self, task: TaskSpec) -> Any:
        """The remote function with ``task``'s options, made once per stage (kept in
        ``task.ship_cache``): Ray's ``.options()`` validates and copies every option on
        each call. The task name in Ray's dashboard is ``shoal-stage<id>`` (the partition
        is in shoal's trace and profile, per task)."""
        key = (
            self._remote,
            1 + task.output.num_outputs,
            self._task_cpus(task),
            task.max_retries,
            task.stage.id,
        )
        cache = task.ship_cache if task.ship_cache is not None else {}
        got = cache.get("remote")
        if got is not None and got[0] == key:
            return got[1]
        made = self._remote.options(
            num_returns=key[1],
            num_cpus=key[2],
            max_retries=key[3],
            retry_exceptions=False,
            name=f"shoal-stage{task.stage.id}",
        )
        cache["remote"] = (key, made)
        return made

    def _task_cpus(self, task: TaskSpec) -> int:
        hex_of = getattr(task.config, "hex", None)
        key = hex_of() if callable(hex_of) else None
        return self._query_cpus.get(key, self.task_cpus) if key else self.task_cpus

    def wait(self, handles: Sequence[Any], timeout: float | None = None) -> list[Any]:
        ready, rest = self._ray.wait(list(handles), num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0)
            ready = ready + more
        return ready

    def result(self, handle: Any) -> TaskResult:
        task, outs = self._outputs.pop(handle)
        try:
            stats = self._ray.get(handle)
        except self._ray.exceptions.RayTaskError as exc:
            self._read_errors(outs)
            # The task's own exception (its class, as the local runner raises it); Ray's
            # error, with the remote traceback, stays attached as its cause.
            cause = exc.cause
            if not isinstance(cause, BaseException):  # pragma: no cover - Ray kept no cause
                raise exc.as_instanceof_cause() from None
            raise cause from exc
        return TaskResult(task, stats, outs)

    def pending_outputs(self, handle: Any) -> list[Any]:
        """The output references of the task of ``handle`` (finished or not): other tasks
        may take them as arguments; Ray starts those once the outputs exist."""
        return list(self._outputs[handle][1])

    def fetch(self, refs: Sequence[Any]) -> list[pa.Table]:
        return list(self._ray.get(list(refs)))

    def cancel(self, handles: Sequence[Any]) -> None:
        """Cancel unfinished tasks and make sure they stop.

        Tasks get :data:`CANCEL_GRACE_S` seconds to finish by themselves (most of the tasks
        in flight when a query fails are about to finish, failing the same way); those still
        running then are cancelled with ``force=True``, which kills their worker process
        (Ray starts a new one when needed). A plain ``ray.cancel`` would wait until the task
        next runs Python bytecode (a task inside a Polars collect or a ``time.sleep`` runs
        on), and in Ray 2.60 a ``ray.cancel`` that races a task's own completion can crash
        the driver ("Check failed: ... Tried to complete task that was not pending",
        ray-project/ray#54846): cancelling only tasks that are still running a second later
        makes that race rare. Calls on a UDF actor are left to the actor pool, which kills
        its actors when the query ends.
        """
        tasks = []
        outputs: dict[Any, list[Any]] = {}
        for h in handles:
            spec, outs = self._outputs.pop(h, (None, None))
            if spec is not None and spec.pool is None:
                tasks.append(h)
                outputs[h] = outs or []
        if not tasks:
            return
        done, running = self._ray.wait(
            tasks, num_returns=len(tasks), timeout=CANCEL_GRACE_S, fetch_local=False
        )
        for h in done:
            # Read the error a failed task left in each of its returns (the query is failing),
            # so that Ray does not print it as an "Unhandled error" when they are freed.
            try:
                self._ray.get(h, timeout=READ_TIMEOUT_S)
            except Exception:
                self._read_errors(outputs[h])
        for h in running:
            with contextlib.suppress(Exception):
                self._ray.cancel(h, force=True)

    def _read_errors(self, refs: Sequence[Any]) -> None:
        """Read the error a failed task left in each of ``refs`` (its outputs), so that Ray
        does not print it again as an "Unhandled error" when they are freed."""
        for ref in refs:
            with contextlib.suppress(Exception):
                self._ray.get(ref, timeout=READ_TIMEOUT_S)

    def spill_counters(self) -> tuple[int, int, int, int] | None:
        """Ray's object spilling counters for the whole cluster, since it started: bytes
        and objects spilled to ``spill_dir``, bytes and objects restored from it (what
        ``ray memory --stats-only`` prints). None where Ray does not answer (a Ray Client
        connection, a raylet that does not reply within 5 s, a Ray whose private
        ``internal_api`` changed): the profile then says spilling is unknown. About 10 ms
        per call (one gRPC request to a raylet, which asks every node)."""
        try:
            from ray._private import internal_api
            from ray._private.state import state

            stats = internal_api.get_memory_info_reply(state, timeout_seconds=5.0).store_stats
            return (
                int(stats.spilled_bytes_total),
                int(stats.spilled_objects_total),
                int(stats.restored_bytes_total),
                int(stats.restored_objects_total),
            )
        except Exception:
            return None

    def close(self) -> None:
        self._outputs.clear()
        self._configs.clear()
