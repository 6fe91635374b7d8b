"""Actor pools: long-lived workers for stateful and GPU user functions.

The planner gives every stateful or GPU UDF a stage of its own whose fragment is only the
:class:`~shoal.ir.nodes.UdfProject` over the upstream stage's output, or over a scan of an
in-memory table that only selects columns, whose row ranges the pool's tasks then read
themselves (:func:`pool_udf` recognises both). For each such stage of a query, :func:`make_pools` makes one pool:

* :class:`RayActorPool` (Ray runner): Ray actors named
  ``shoal-udf-<udf name>-<query id>-<i>``, each asking Ray for the UDF's CPUs, GPUs and
  memory; Ray picks the devices and sets ``CUDA_VISIBLE_DEVICES`` for each actor.
* :class:`LocalProcessPool` (local runner): worker processes (not threads, so that each
  holds its own devices and state), whose command line carries the same name. Devices come
  from the runner's :class:`~shoal.resources.ResourceLedger`, and each process starts with
  ``CUDA_VISIBLE_DEVICES`` set to exactly its own (empty when it holds none).

Life of a pool, driven by the dispatch loop (:mod:`shoal.runners.dispatch`):

1. made (not started) before the query runs; a pool whose minimum size can never fit in the
   runner's resources raises :class:`shoal.ShoalError` then, before any task runs;
2. started by the first :meth:`capacity` call, when its stage becomes runnable: ``min``
   actors, each running the UDF class's ``__init__`` once;
3. each task (one partition) goes to a free actor; while tasks wait and every actor is busy,
   the pool grows towards ``max`` as far as free resources allow (a new actor takes tasks
   once it has started);
4. when its stage has finished: parked for the next query (``udf_keep_warm``, on by
   default; see below) or closed; closed in any case when the query fails: after a failure (a UDF exception surfaces as :class:`shoal.udf.UdfError` with
   the UDF's name and the original traceback) and after ``KeyboardInterrupt``. Closing
   kills the actors (Ray) or stops and, if need be, kills the processes (local), waits
   until they are gone, and gives their resources back.

**Warm pools** (the ``udf_keep_warm`` setting, on by default). Starting a pool costs a
process per actor (importing Polars, pyarrow and shoal, unpickling the UDF) plus the UDF's
``__init__`` (loading a model): 1 s on a quiet machine, 2.5-19 s per actor with the 2-core
machine loaded, every query, where the batches themselves took 0.1-0.5 s. With the setting
on, a pool whose stage finished in a query
that succeeded is *parked* (:meth:`finish`) instead of closed, its actors idle and still
holding their resources and their UDF instance; the next query that runs the same UDF
(the same :attr:`~shoal.udf.UDF.token`: same function, options and ``__init__`` arguments)
on the same runner takes it over (:func:`make_pools`) and its batches start at once. A
parked Ray pool keeps only the actors that leave ``task_cpus`` CPUs of the cluster free (on
a 2-CPU machine, one actor of one CPU), so that ordinary tasks can always run; it grows
again in its next stage. A parked pool unused for ``udf_keep_warm_idle_s`` seconds is
closed by a timer (idle actors hold CPUs and GPUs). A query that needs a pool for another
UDF first closes the parked ones (their resources may be what it needs), as do a failed
query (its own pools) and :func:`close_parked` (``shoal.shutdown()``). A query with several
pool stages takes over none (a pool taken over at the query's start holds its resources
while an earlier stage's pool may need them for its minimum of actors): its pools start
cold, and are parked at its end as usual.

Each Ray actor takes up to :data:`CALLS_IN_FLIGHT` batches at a time (they queue at the
actor, which runs one at a time): the next batch's input arrives while the current one
runs, as Ray Data keeps several in flight per actor.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import math
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

from shoal.errors import ShoalError
from shoal.ir.nodes import StageInput, UdfProject
from shoal.planner.physical import PhysicalPlan, Stage, plain_memory_scan
from shoal.resources import AcquiredResources, ResourceLedger, ResourceRequest
from shoal.runners.dispatch import TaskResult, TaskSpec
from shoal.runners.ray_runner import ship
from shoal.udf import UDF

#: Seconds a closing pool waits for its actors or processes to be gone.
CLOSE_TIMEOUT_S = 15.0
#: Batches sent to one Ray actor before it has finished the first (see the module
#: docstring).
CALLS_IN_FLIGHT = 2

#: glibc malloc settings for the actors and worker processes of pools (environment
#: variables; one that the job's ``ray_runtime_env``, or the driver's environment for the
#: local runner, sets is left to it). glibc raises its mmap threshold to the largest block
#: a process has freed and gives the top of its heap back to the OS beyond twice that: a
#: UDF process whose largest temporary is one batch's (a NumPy model's activations, 1 MiB
#: at 8,192 rows) but whose batch holds several at once gave MiBs back after every batch
#: and faulted them in again in the next. Measured on a small NumPy model, 367 batches of
#: 8,192 rows: 181,000 page faults and 30-40 % more CPU than the same work in the driver
#: (which had freed a 24 MiB block before). These are the values glibc's own adjustment
#: stops at: a 32 MiB mmap threshold, and twice that kept at the top of the heap.
ACTOR_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(64 << 20),
}
#: Seconds an actor is expected to take to start until one of the pool's has (1 s on a quiet
#: machine: a process importing Ray, Polars, pyarrow and shoal, then the UDF's __init__).
ACTOR_START_S = 1.0
#: Seconds between two asks of Ray's free resources by a pool that could grow.
ROOM_CHECK_S = 0.25

#: Parked pools (``udf_keep_warm``) by (runner, UDF token).
_parked: dict[tuple[str, str], Any] = {}
_parked_lock = threading.Lock()


def close_parked(keep: frozenset[tuple[str, str]] = frozenset()) -> None:
    """Close every parked pool except those keyed in ``keep`` (shutdown: all of them)."""
    with _parked_lock:
        going = [k for k in _parked if k not in keep]
        pools = [_parked.pop(k) for k in going]
    for pool in pools:
        pool.close()


def _take_parked(key: tuple[str, str]) -> Any:
    with _parked_lock:
        pool = _parked.pop(key, None)
    return pool if pool is not None and not pool.closed else None


def _park(pool: Any) -> None:
    with _parked_lock:
        old = _parked.get(pool.key)
        _parked[pool.key] = pool
        pool.parkings += 1
        parking = pool.parkings
    if old is not None and old is not pool:
        old.close()
    if pool.idle_s > 0:
        timer = threading.Timer(pool.idle_s, _expire, (pool, parking))
        timer.daemon = True
        timer.name = f"shoal-udf-idle-{pool.udf.name}"
        timer.start()


def _expire(pool: _Parkable, parking: int) -> None:
    """Close ``pool`` if it is still parked since its ``parking``-th parking (it went
    unused for ``udf_keep_warm_idle_s``); a pool taken over by a query, or parked again
    since, is left alone."""
    with _parked_lock:
        parked_now = _parked.get(pool.key)
        if parked_now is not pool or pool.parkings != parking:
            return
        del _parked[pool.key]
    pool.close()


class _Parkable:
    """What both pool kinds share for warm pools: a key, the setting, :meth:`finish`."""

    key: tuple[str, str]
    keep_warm: bool = False
    _closed: bool

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:  # pragma: no cover - both pools define it
        raise NotImplementedError

    #: CPUs a parked pool leaves free for ordinary tasks (the query's ``task_cpus``).
    reserve_cpus: float = 1.0
    #: Seconds a parked pool waits unused before it closes (``udf_keep_warm_idle_s``;
    #: 0: until closed otherwise), and how many times it has been parked.
    idle_s: float = 0.0
    parkings: int = 0
    #: Queries that have held the pool (see :class:`_Lease`).
    leases: int = 0

    def finish(self) -> None:
        """The pool's stage is done: park it for the next query when its UDF stays warm
        (``udf_keep_warm``), else close it (idempotent). A parked pool keeps only as many
        actors as leave ``reserve_cpus`` of the runner's CPUs to ordinary tasks: idle actors
        holding every CPU would leave the next query's scans unschedulable."""
        if self.keep_warm and not self._closed and self._trim_for_parking():
            _park(self)
        else:
            self.close()

    def _trim_for_parking(self) -> bool:
        """Stop the actors beyond what may stay parked; False when none may."""
        return True

    def adopt(self, config_handle: Any, config_digest: str) -> None:
        """Take a parked pool over for a new query: actors started from now on install
        that query's config snapshot."""
        self._config = config_handle
        self._digest = config_digest


def pool_udf(stage: Stage) -> UdfProject | None:
    """The UDF node of an actor pool stage (a stateful or GPU UDF over a stage input, or
    over a plain in-memory scan that the stage reads itself), or None for an ordinary
    stage."""
    node = stage.fragment
    if (
        isinstance(node, UdfProject)
        and (isinstance(node.input, StageInput) or plain_memory_scan(node.input))
        and isinstance(node.udf, UDF)
        and node.udf.needs_actor_pool
    ):
        return node
    return None


def new_query_id() -> str:
    """A short id for a query's actor names (8 hex digits)."""
    return uuid.uuid4().hex[:8]


class ActorPool(Protocol):
    """What the dispatch loop and the backends need of a pool."""

    #: Names of the pool's actors or worker processes, in start order.
    names: list[str]

    def capacity(self, backlog: int) -> int:
        """Free actors now (starting the pool on first call, growing it while ``backlog``
        tasks wait); the loop dispatches at most this many of the stage's tasks."""
        ...

    def submit(self, task: TaskSpec) -> Any:
        """Send ``task`` to a free actor; return the backend's kind of handle."""
        ...

    def close(self) -> None:
        """Tear the pool down (idempotent); returns once every actor is gone."""
        ...

    def finish(self) -> None:
        """Its stage is done: close it, or park it when its UDF stays warm."""
        ...


def make_pools(
    plan: PhysicalPlan,
    backend: Any,
    runner: str,
    query_id: str,
    config_handle: Any,
    config_digest: str,
    keep_warm: bool = False,
    reserve_cpus: float = 1.0,
    idle_s: float = 0.0,
) -> dict[int, ActorPool]:
    """One (unstarted) pool per actor pool stage of ``plan``, by stage id; or a parked
    pool of the same UDF and runner, already started (see "Warm pools" above).

    ``backend`` is the runner's backend (the local runner's carries the resource ledger);
    ``config_handle``/``config_digest`` are the query's config snapshot as its tasks get
    it; ``keep_warm`` (``udf_keep_warm``) parks the pools when their stage is done, leaving
    ``reserve_cpus`` (``task_cpus``) free, until ``idle_s`` seconds pass unused
    (``udf_keep_warm_idle_s``; 0: no limit). Parked pools of other UDFs are closed first,
    and every parked pool when the plan has several pool stages (see "Warm pools"). Raises :class:`shoal.ShoalError` when a UDF's minimum number of actors can never fit in
    the runner's resources.
    """
    pools: dict[int, ActorPool] = {}
    counters: dict[str, int] = {}
    nodes = [(st, pool_udf(st)) for st in plan.stages]
    wanted = frozenset((runner, n.udf.token) for _, n in nodes if n is not None)
    # A parked pool holds its actors' resources from the query's start. With one pool stage
    # that is what keeping it warm is for; with several, a pool taken over early could hold
    # the CPUs that another stage's pool needs for its minimum of actors, and that pool
    # would wait for them forever (a UDF with concurrency=2 after a warm one, on 2 CPUs).
    # Such a query starts its pools cold, each when its stage runs, as without udf_keep_warm.
    close_parked(keep=wanted if sum(n is not None for _, n in nodes) == 1 else frozenset())
    for st, node in nodes:
        if node is None:
            continue
        u: UDF = node.udf
        key = (runner, u.token)
        parked = _take_parked(key)
        if parked is not None:
            parked.adopt(config_handle, config_digest)
            parked.keep_warm, parked.reserve_cpus = keep_warm, reserve_cpus
            parked.idle_s = idle_s
            pools[st.id] = _Lease(parked)
            continue

        def name_of(_i: int, _u: UDF = u) -> str:
            i = counters.get(_u.name, 0)
            counters[_u.name] = i + 1
            return f"shoal-udf-{_u.name}-{query_id}-{i}"

        pool: RayActorPool | LocalProcessPool
        if runner == "ray":
            pool = RayActorPool(
                u, name_of, config_handle, config_digest, cluster_cpus=_cached_cpus(backend)
            )
        else:
            pool = LocalProcessPool(u, name_of, backend.resources, config_handle, config_digest)
        pool.key, pool.keep_warm, pool.reserve_cpus = key, keep_warm, reserve_cpus
        pool.idle_s = idle_s
        pools[st.id] = _Lease(pool)
    return pools


def _cached_cpus(backend: Any) -> Callable[[], float] | None:
    """The CPUs of the Ray cluster as the runner's cached
    :class:`~shoal.runners.ray_runner.ClusterView` has them (None: no such view)."""
    cluster = getattr(backend, "cluster", None)
    if cluster is None:
        return None
    return lambda: float(cluster.cpus()[0])


class _Lease:
    """One query's hold on a pool (what :func:`make_pools` hands the dispatch loop).

    A parked pool may be taken over by another query while the query that parked it is
    still ending (its stage finished first; the loop's closing calls ``finish()`` or, when
    the query fails later, ``close()`` again). Only the latest lease of a pool may park or
    close it: the earlier query's calls then do nothing, instead of parking a pool that
    another query is using (a third query could take it too, and a query of another UDF
    would close it under both) or closing it."""

    def __init__(self, pool: Any) -> None:
        with _parked_lock:
            pool.leases += 1
            self.number = pool.leases
        self.pool = pool
        self.names: list[str] = pool.names  # the pool's own list, which grows with it
        self._done = False

    @property
    def replaced(self) -> int:
        return getattr(self.pool, "replaced", 0)  # type: ignore[no-any-return]

    def _current(self) -> bool:
        with _parked_lock:
            return bool(self.pool.leases == self.number)

    def capacity(self, backlog: int) -> int:
        return self.pool.capacity(backlog)  # type: ignore[no-any-return]

    def submit(self, task: TaskSpec) -> Any:
        return self.pool.submit(task)

    def replace_lost(self, handle: Any, exc: BaseException) -> bool:
        replace = getattr(self.pool, "replace_lost", None)
        return bool(replace(handle, exc)) if replace is not None else False

    def finish(self) -> None:
        if not self._done and self._current():
            self._done = True
            self.pool.finish()

    def close(self) -> None:
        self._done = True
        if self._current():
            self.pool.close()


def _fits(request: ResourceRequest, cpus: float, gpus: float, memory: float) -> int:
    """How many holders of ``request`` fit in the given totals."""
    n = math.inf
    if request.cpus > 0:
        n = min(n, math.floor(cpus / request.cpus + 1e-9))
    if request.gpus > 0:
        n = min(
            n,
            math.floor(gpus / request.gpus + 1e-9)
            if request.gpus < 1
            else math.floor(gpus / request.gpus),
        )
    if request.memory_bytes:
        n = min(n, math.floor(memory / request.memory_bytes))
    return 64 if n == math.inf else int(n)


def _too_small(u: UDF, lo: int, where: str) -> ShoalError:
    return ShoalError(
        f"user function {u.name!r} needs at least {lo} actor(s) of "
        f"{u.resources.describe()} each, more than {where} can ever hold; lower its "
        "concurrency or its resource request (or give the runner more: num_cpus, "
        "num_gpus for Ray, gpus / SHOAL_GPUS for the local runner)"
    )


# ------------------------------------------------------------------ Ray


class _UdfActor:
    """The Ray actor of a pool: holds this process's instance of the UDF."""

    def __init__(self, u: UDF, config: Any, digest: str, name: str) -> None:
        from shoal.config import task_config
        from shoal.execution.scope import task_scope
        from shoal.udf import set_instance

        self.name = name
        if u.is_stateful:
            with task_config(config, digest), task_scope():
                set_instance(u, u.instantiate())

    def ready(self) -> bool:
        return True

    def run(
        self, payload: tuple[Any, ...], config: Any, digest: str, layout: list[int], *refs: Any
    ) -> tuple[Any, ...]:
        from shoal.config import task_config
        from shoal.execution.kernel import run_fragment
        from shoal.runners.ray_runner import _ray_task_body

        with task_config(config, digest):
            out = _ray_task_body(payload, layout, refs, run_fragment)
        out[0].extra.update(_actor_extra(self.name))
        return out


def _actor_extra(name: str) -> dict[str, Any]:
    return {"actor": name, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


_remote_actor_class: Any = None


def _actor_class() -> Any:
    global _remote_actor_class
    if _remote_actor_class is None:
        import ray

        _remote_actor_class = ray.remote(_UdfActor)
    return _remote_actor_class


class RayActorPool(_Parkable):
    """A pool of Ray actors for one UDF stage (see the module docstring).

    ``cluster_cpus`` returns the CPUs of the cluster's alive nodes together, which a
    parking pool needs (the Ray runner's cached
    :class:`~shoal.runners.ray_runner.ClusterView`; None: ask Ray's GCS each time, a round
    trip of 5-25 ms on a loaded machine at the end of every query)."""

    def __init__(
        self,
        u: UDF,
        name_of: Callable[[int], str],
        config_handle: Any,
        config_digest: str,
        cluster_cpus: Callable[[], float] | None = None,
    ) -> None:
        import ray

        self._ray = ray
        self._cluster_cpus = cluster_cpus or (lambda: float(ray.cluster_resources().get("CPU", 0)))
        #: When the pool last asked Ray for free resources to grow (``_room_for_one``).
        self._room_checked = -math.inf
        job_env = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
        self._env = {k: v for k, v in ACTOR_MALLOC_ENV.items() if k not in job_env}
        self.udf = u
        self._name_of = name_of
        self._config = config_handle
        self._digest = config_digest
        # An actor lives on one node: what fits is counted node by node (the cluster's
        # totals let a request larger than every node through, and Ray then keeps the actor
        # pending forever).
        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        fits = min(
            64,
            sum(
                _fits(u.resources, r.get("CPU", 0), r.get("GPU", 0), r.get("memory", 0))
                for r in nodes
            ),
        )
        self.min, self.max = u.pool_bounds(fits)
        if fits < self.min:
            largest: dict[str, float] = max(
                nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={}
            )
            raise _too_small(
                u,
                self.min,
                f"the Ray cluster ({len(nodes)} alive node(s); the largest has "
                f"{largest.get('CPU', 0):g} CPUs, {largest.get('GPU', 0):g} GPUs, "
                f"{largest.get('memory', 0) / 2**30:.1f} GiB)",
            )
        self.names: list[str] = []
        self._actors: list[Any] = []
        self._busy: list[list[Any]] = []  # stats references of the calls in flight
        self._ready: list[bool] = []
        self._pending_ready: dict[Any, int] = {}  # ready() reference -> actor index
        self._actor_of: dict[Any, Any] = {}  # a call's stats reference -> the actor running it
        #: Growth is measured (see :meth:`_worth_growing`): when each call in flight was
        #: sent, when each actor last finished one, the seconds a call takes (a running
        #: mean; None until one finished), the ``ready()`` calls that time each new
        #: actor's start, and the seconds an actor of this pool took to start.
        self._sent_at: dict[Any, float] = {}
        self._done_at: list[float] = []
        self.call_s: float | None = None
        self._start_timers: dict[Any, float] = {}
        self.start_s = ACTOR_START_S
        self.replaced = 0  # actors started in place of ones that died
        #: Replacements after which a dying actor fails the query instead (an actor that
        #: dies on every batch, e.g. out of memory, must not be replaced forever).
        self.max_replacements = 3 * self.max + 2
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    def _new_actor(self, name: str) -> Any:
        extra: dict[str, Any] = {}
        if self._env:  # merged by Ray with the job's runtime_env env_vars
            extra["runtime_env"] = {"env_vars": self._env}
        return (
            _actor_class()
            .options(
                name=name,
                max_restarts=0,
                max_task_retries=0,
                max_concurrency=1,
                **self.udf.resources.ray_options(),
                **extra,
            )
            .remote(self.udf, self._config, self._digest, name)
        )

    def _add(self, counts_before_ready: bool) -> None:
        i = len(self._actors)
        name = self._name_of(len(self.names))
        actor = self._new_actor(name)
        self.names.append(name)
        self._actors.append(actor)
        self._busy.append([])
        self._done_at.append(0.0)
        self._ready.append(counts_before_ready)
        # Sent before any batch, ready() runs right after __init__: it times the start.
        ready = actor.ready.remote()
        self._start_timers[ready] = time.monotonic()
        if not counts_before_ready:
            self._pending_ready[ready] = i

    def _reap(self) -> None:
        """Mark actors whose call has finished as free, and new actors that started;
        measure both (:meth:`_worth_growing`)."""
        busy = [r for b in self._busy for r in b]
        now = time.monotonic()
        if busy:
            done, _ = self._ray.wait(busy, num_returns=len(busy), timeout=0, fetch_local=False)
            finished = set(done)
            for i, b in enumerate(self._busy):
                for r in b:
                    if r in finished:
                        # Its service time: from when it was sent, or from the end of the
                        # call before it on the same actor when it waited behind that one.
                        took = now - max(self._sent_at.pop(r, now), self._done_at[i])
                        self._done_at[i] = now
                        old = self.call_s
                        self.call_s = took if old is None else 0.7 * old + 0.3 * took
            self._busy = [[r for r in b if r not in finished] for b in self._busy]
            for r in finished:
                self._actor_of.pop(r, None)
        waiting = list(self._pending_ready) + [
            r for r in self._start_timers if r not in self._pending_ready
        ]
        if waiting:
            done, _ = self._ray.wait(
                waiting, num_returns=len(waiting), timeout=0, fetch_local=False
            )
            for r in done:
                if r in self._pending_ready:
                    self._ready[self._pending_ready.pop(r)] = True
                born = self._start_timers.pop(r, None)
                if born is not None:
                    self.start_s = now - born

    def _worth_growing(self, backlog: int) -> bool:
        """Whether one more actor would help: the work left for the pool's actors (the
        ``backlog`` of unsent tasks and the calls in flight, at the pool's measured seconds
        per call) is longer per actor than starting an actor takes (as measured for this
        pool's actors; :data:`ACTOR_START_S` until one has started). Until a call has
        finished there is nothing to go by, and the pool grows while resources allow.

        A warm pool is trimmed when it is parked and would otherwise start an actor again
        in every query, one that the query's few batches are done before it is up (an
        actor start costs a process and the UDF's ``__init__``: seconds, and CPU that the
        running batches need); the actor is then stopped at the next parking."""
        if self.call_s is None or not self._actors:
            return True
        in_flight = sum(len(b) for b in self._busy)
        return (backlog + in_flight) * self.call_s / len(self._actors) > self.start_s

    def _trim_for_parking(self) -> bool:
        with self._lock:
            cpus = self.udf.resources.cpus
            if cpus <= 0:
                return bool(self._actors)
            total = self._cluster_cpus()
            keep = max(0, math.floor((total - self.reserve_cpus) / cpus + 1e-9))
            keep = min(keep, len(self._actors))
            for a in self._actors[keep:]:
                with contextlib.suppress(Exception):
                    self._ray.kill(a, no_restart=True)
            self._actors = self._actors[:keep]
            self._busy = self._busy[:keep]
            self._done_at = self._done_at[:keep]
            self._ready = self._ready[:keep]
            self._pending_ready = {r: i for r, i in self._pending_ready.items() if i < keep}
            return keep > 0

    def _room_for_one(self) -> bool:
        """Whether Ray has the free resources for one more actor now; asked at most once
        per :data:`ROOM_CHECK_S` (each ask is a round trip to Ray's GCS, and the loop asks
        after every finished task while the pool could grow)."""
        now = time.monotonic()
        if now - self._room_checked < ROOM_CHECK_S:
            return False
        self._room_checked = now
        avail = self._ray.available_resources()
        r = self.udf.resources
        return (
            avail.get("CPU", 0) + 1e-9 >= r.cpus
            and avail.get("GPU", 0) + 1e-9 >= r.gpus
            and (not r.memory_bytes or avail.get("memory", 0) >= r.memory_bytes)
        )

    def capacity(self, backlog: int) -> int:
        with self._lock:
            if self._closed:
                return 0
            if not self._started:
                self._started = True
                for _ in range(self.min):
                    # The first actors take tasks at once: Ray queues the calls until the
                    # actor is up, and the cluster can hold them (checked when made).
                    self._add(counts_before_ready=True)
            self._reap()
            ready = [b for b, r in zip(self._busy, self._ready, strict=True) if r]
            free = sum(CALLS_IN_FLIGHT - len(b) for b in ready)
            idle = sum(1 for b in ready if not b)
            if (
                backlog > idle
                and len(self._actors) < self.max
                and not self._pending_ready
                and self._worth_growing(backlog)
                and self._room_for_one()
            ):
                self._add(counts_before_ready=False)  # takes tasks once it has started
            return free

    def submit(self, task: TaskSpec) -> list[Any]:
        with self._lock:
            free = [
                (len(b), i)
                for i, (b, r) in enumerate(zip(self._busy, self._ready, strict=True))
                if r and len(b) < CALLS_IN_FLIGHT
            ]
            if not free:  # pragma: no cover - the loop asks capacity() first
                raise RuntimeError(f"actor pool of {self.udf.name!r}: no free actor")
            i = min(free)[1]  # the actor with the fewest batches in flight
            payload, layout, args = ship(task)
            out = (
                self._actors[i]
                .run.options(num_returns=1 + task.output.num_outputs)
                .remote(payload, task.config, task.config_digest, layout, *args)
            )
            self._busy[i].append(out[0])
            self._sent_at[out[0]] = time.monotonic()
            self._actor_of[out[0]] = self._actors[i]
            return list(out)

    def replace_lost(self, handle: Any, exc: BaseException) -> bool:
        """If ``exc`` says the actor that ran ``handle`` died, start a replacement in its
        place (a new name, the same resources) and return True; else False."""
        if not isinstance(exc, self._ray.exceptions.RayActorError):
            return False
        with self._lock:
            dead = self._actor_of.pop(handle, None)
            if dead is None or self._closed or self.replaced >= self.max_replacements:
                return False  # the query fails with a TaskError naming the UDF
            i = next((k for k, a in enumerate(self._actors) if a is dead), None)
            if i is None:
                return True  # already replaced after another of its calls failed
            with contextlib.suppress(Exception):
                self._ray.kill(self._actors[i], no_restart=True)
            name = self._name_of(len(self.names))
            self.names.append(name)
            actor = self._new_actor(name)
            self._actors[i] = actor
            for r in self._busy[i]:
                self._sent_at.pop(r, None)
            self._busy[i] = []
            self._done_at[i] = 0.0
            if any(r for k, r in enumerate(self._ready) if k != i):
                # Others take batches until it has started.
                self._ready[i] = False
                self._pending_ready[actor.ready.remote()] = i
            else:
                # The pool's only actor: it takes the resent batch at once, as the first
                # actors do (Ray queues the call until it is up). Waiting for it to be ready
                # left a pool of one with no free actor, and the loop, with nothing else in
                # flight, failed the query with "no free actor".
                self._ready[i] = True
            self.replaced += 1
            return True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            actors, names = list(self._actors), set(self.names)
        for a in actors:
            with contextlib.suppress(Exception):
                self._ray.kill(a, no_restart=True)
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        while names and time.monotonic() < deadline:
            alive = {a["name"] for a in self._ray.util.list_named_actors(all_namespaces=True)}
            if not alive & names:
                break
            time.sleep(0.02)


# ------------------------------------------------------------------ local processes


def _send(conn: Connection, obj: Any) -> None:
    import cloudpickle

    conn.send_bytes(cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a RuntimeError with its type, message and traceback."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        tb = "".join(traceback.format_exception(exc))
        return RuntimeError(f"{type(exc).__name__}: {exc}\n\nOriginal traceback:\n{tb}")


def _worker_main() -> None:
    """Entry point of a local worker process (``python -c ... <name> <fd>``).

    Ignores SIGINT (the driver handles Ctrl-C and stops its workers); reads the init
    message (sys.path, the UDF, the config snapshot), makes the UDF's instance, says
    ``ready``, then runs tasks until told to stop or until the driver's end of the
    connection closes.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    name, fd = sys.argv[1], int(sys.argv[2])
    conn = Connection(fd)
    try:
        kind, (path, u, config, digest) = pickle.loads(conn.recv_bytes())
    except EOFError:
        return
    sys.path[:0] = [p for p in path if p not in sys.path]
    from shoal.config import task_config
    from shoal.execution.kernel import run_fragment
    from shoal.execution.scope import task_scope
    from shoal.udf import set_instance

    try:
        if u.is_stateful:
            with task_config(config, digest), task_scope():
                set_instance(u, u.instantiate())
    except BaseException as exc:
        _send(conn, ("fatal", _portable(exc)))
        return
    _send(conn, ("ready", None))
    while True:
        try:
            kind, body = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        if kind == "stop":
            return
        fragment, inputs, scan, output, schemas, config, digest = body
        try:
            with task_config(config, digest):
                stats, tables = run_fragment(fragment, inputs, scan, output, schemas)
            stats.extra.update(_actor_extra(name))
            reply: tuple[str, Any] = ("ok", (stats, tables))
        except Exception as exc:
            reply = ("error", _portable(exc))
        _send(conn, reply)


class _Worker:
    """The driver's side of one worker process."""

    def __init__(
        self,
        name: str,
        held: AcquiredResources,
        proc: subprocess.Popen[bytes],
        conn: Connection,
        counts_before_ready: bool,
    ) -> None:
        self.name = name
        self.held = held
        self.proc = proc
        self.conn = conn
        self.ready = counts_before_ready
        self.job: tuple[cf.Future[TaskResult], TaskSpec] | None = None
        self.dead: BaseException | None = None
        self.outbox: queue.Queue[bytes | None] = queue.Queue()


class LocalProcessPool(_Parkable):
    """A pool of worker processes for one UDF stage of the local runner (see the module
    docstring). Handles are ``concurrent.futures.Future`` objects of
    :class:`~shoal.runners.dispatch.TaskResult`, as the local backend's."""

    def __init__(
        self,
        u: UDF,
        name_of: Callable[[int], str],
        ledger: ResourceLedger,
        config: Any,
        config_digest: str,
    ) -> None:
        self.udf = u
        self._name_of = name_of
        self._ledger = ledger
        self._config = config
        self._digest = config_digest
        fits = 0
        while fits < 64 and ledger.fits_at_all(u.resources, fits + 1):
            fits += 1
        self.min, self.max = u.pool_bounds(fits)
        if not ledger.fits_at_all(u.resources, self.min):
            raise _too_small(u, self.min, f"the local runner ({ledger.describe()})")
        self.names: list[str] = []
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    # -- starting -----------------------------------------------------------------------

    def _spawn(self, held: AcquiredResources, counts_before_ready: bool) -> None:
        name = self._name_of(len(self._workers))
        parent, child = socket.socketpair()
        env = {**ACTOR_MALLOC_ENV, **os.environ}
        env.update(held.env())
        env["POLARS_MAX_THREADS"] = str(max(1, math.ceil(held.cpus)))
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "from shoal.runners.actor_pool import _worker_main; _worker_main()",
                    name,
                    str(child.fileno()),
                ],
                pass_fds=(child.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            parent.close()
            child.close()
            self._ledger.release(held)
            raise
        child.close()
        conn = Connection(parent.detach())
        w = _Worker(name, held, proc, conn, counts_before_ready)
        self.names.append(name)
        self._workers.append(w)
        _send(conn, ("init", (list(sys.path), self.udf, self._config, self._digest)))
        threading.Thread(target=self._read, args=(w,), daemon=True, name=f"{name}-reader").start()
        threading.Thread(target=self._write, args=(w,), daemon=True, name=f"{name}-writer").start()

    def capacity(self, backlog: int) -> int:
        with self._lock:
            if self._closed:
                return 0
            if not self._started:
                self._started = True
                for _ in range(self.min):
                    held = self._ledger.try_acquire(self.udf.resources)
                    if held is None:
                        raise ShoalError(
                            f"user function {self.udf.name!r}: the local runner has no room "
                            f"now for {self.min} actor(s) of {self.udf.resources.describe()} "
                            f"({self._ledger.describe()}; in use by other pools)"
                        )
                    self._spawn(held, counts_before_ready=True)
            free = sum(1 for w in self._workers if w.job is None and (w.ready or w.dead))
            starting = any(not w.ready and w.dead is None for w in self._workers)
            if backlog > free and len(self._workers) < self.max and not starting:
                held = self._ledger.try_acquire(self.udf.resources)
                if held is not None:
                    self._spawn(held, counts_before_ready=False)
            return free

    # -- running ------------------------------------------------------------------------

    def submit(self, task: TaskSpec) -> cf.Future[TaskResult]:
        import cloudpickle

        fut: cf.Future[TaskResult] = cf.Future()
        with self._lock:
            free = [w for w in self._workers if w.job is None and (w.ready or w.dead)]
            if not free:  # pragma: no cover - the loop asks capacity() first
                raise RuntimeError(f"actor pool of {self.udf.name!r}: no free worker")
            w = free[0]
            if w.dead is not None:
                fut.set_exception(w.dead)
                return fut
            w.job = (fut, task)
        body = (
            task.fragment,
            task.inputs,
            task.scan,
            task.output,
            task.input_schemas,
            task.config,
            task.config_digest,
        )
        w.outbox.put(cloudpickle.dumps(("run", body), protocol=pickle.HIGHEST_PROTOCOL))
        return fut

    def _write(self, w: _Worker) -> None:
        while True:
            data = w.outbox.get()
            if data is None:
                return
            try:
                w.conn.send_bytes(data)
            except OSError:
                return

    def _read(self, w: _Worker) -> None:
        while True:
            try:
                kind, body = pickle.loads(w.conn.recv_bytes())
            except (EOFError, OSError):
                code = w.proc.poll()
                self._fail(
                    w,
                    ShoalError(
                        f"worker process {w.name} of user function {self.udf.name!r} exited "
                        f"unexpectedly (exit code {code})"
                    ),
                )
                return
            except Exception as exc:  # a reply that does not unpickle here
                self._fail(w, RuntimeError(f"worker process {w.name}: bad reply: {exc!r}"))
                return
            if kind == "ready":
                w.ready = True
            elif kind == "fatal":
                self._fail(w, body)
                return
            else:
                with self._lock:
                    job, w.job = w.job, None
                if job is None:  # pragma: no cover
                    continue
                fut, task = job
                with contextlib.suppress(cf.InvalidStateError):  # cancelled meanwhile
                    if kind == "ok":
                        stats, tables = body
                        fut.set_result(TaskResult(task, stats, tables))
                    else:
                        fut.set_exception(body)

    def _fail(self, w: _Worker, exc: BaseException) -> None:
        with self._lock:
            w.dead = w.dead or exc
            job, w.job = w.job, None
        if job is not None:
            with contextlib.suppress(cf.InvalidStateError):
                job[0].set_exception(exc)

    # -- closing ------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers = list(self._workers)
        for w in workers:
            if w.job is None and w.dead is None and w.ready:
                w.outbox.put(pickle.dumps(("stop", None)))
            else:  # busy, starting or failed: do not wait for the user's code
                with contextlib.suppress(OSError):
                    w.proc.kill()
            w.outbox.put(None)
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for w in workers:
            try:
                w.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            with contextlib.suppress(OSError):
                w.conn.close()
            self._ledger.release(w.held)
            if w.job is not None:
                with contextlib.suppress(cf.InvalidStateError):
                    w.job[0].set_exception(ShoalError(f"actor pool of {self.udf.name!r} closed"))
