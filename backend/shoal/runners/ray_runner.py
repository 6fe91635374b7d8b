"""The Ray runner: tasks as Ray tasks, tables through the Ray object store.

Each task returns ``1 + num_outputs`` objects: its :class:`~shoal.execution.kernel.TaskStats`
(small, fetched by the driver) and one Arrow table per output partition, which stay in the
object store until a downstream task reads them (zero-copy on the same node). The query's
config snapshot is ``ray.put`` once per query and every task installs it first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import pyarrow as pa

from shoal.config import Config, redact
from shoal.errors import ShoalError
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


def _ray_task_body(
    payload: tuple[Any, ...], layout: list[int], refs: tuple[pa.Table, ...], run_fragment: Any
) -> tuple[Any, ...]:
    fragment, input_schemas, scan, output = payload
    inputs: list[list[pa.Table]] = []
    pos = 0
    for n in layout:
        inputs.append(list(refs[pos : pos + n]))
        pos += n
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

    def begin_query(self, config: Config) -> Any:
        """Put the query's config snapshot in the object store: once per query.

        Raises :class:`shoal.ShoalError` before any task when no alive node of the cluster
        has ``config.task_cpus`` CPUs: Ray would keep such tasks pending forever."""
        largest = max(
            (n["Resources"].get("CPU", 0.0) for n in self._ray.nodes() if n.get("Alive")),
            default=0.0,
        )
        if config.task_cpus > largest + 1e-9:
            raise ShoalError(
                f"shoal setting task_cpus={config.task_cpus} asks more CPUs per task than any "
                f"node of the Ray cluster has (the largest has {largest:g}); its tasks could "
                "never be scheduled"
            )
        handle = self._ray.put(config)
        if len(self._query_cpus) > 256:
            self._query_cpus.pop(next(iter(self._query_cpus)))
        self._query_cpus[handle.hex()] = config.task_cpus
        return handle

    def submit(self, task: TaskSpec) -> Any:
        if task.pool is not None:  # a stage of a stateful or GPU UDF: one of its actors
            out = task.pool.submit(task)
            self._outputs[out[0]] = (task, list(out[1:]))
            return out[0]
        refs = [r for group in task.inputs for r in group]
        layout = [len(g) for g in task.inputs]
        payload = (task.fragment, task.input_schemas, task.scan, task.output)
        out = self._remote.options(
            num_returns=1 + task.output.num_outputs,
            num_cpus=self._task_cpus(task),
            max_retries=task.max_retries,
            retry_exceptions=False,
            name=f"shoal-stage{task.stage.id}-p{task.partition}",
        ).remote(payload, task.config, task.config_digest, layout, *refs)
        self._outputs[out[0]] = (task, list(out[1:]))
        return out[0]

    def _task_cpus(self, task: TaskSpec) -> int:
        hex_of = getattr(task.config, "hex", None)
        key = hex_of() if callable(hex_of) else None
        return self._query_cpus.get(key, self.task_cpus) if key else self.task_cpus

    def wait(self, handles: Sequence[Any], timeout: float | None = None) -> list[Any]:
        ready, rest = self._ray.wait(list(handles), num_returns=1, timeout=timeout)
        if ready and rest:
            more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0.01)
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
