"""User-defined functions: ``@shoal.udf`` on a function (stateless) or a class (stateful).

A UDF maps input columns to one output column, batch by batch, row-wise: output row ``i``
depends only on input row ``i`` (batch boundaries are not part of the answer; shoal and
native Polars cut batches differently). It runs:

* in ordinary tasks, when it is a stateless function that asks for no GPU;
* on an **actor pool** otherwise (a class, or any GPU request): long-lived workers (Ray
  actors, or worker processes of the local runner), each holding its own resources and its
  own instance of the class, whose ``__init__`` runs once per actor (load a model once) and
  whose ``__call__`` runs once per batch.

A UDF appears in the IR as :class:`shoal.ir.nodes.UdfProject`, by its registered name and a
reference to the :class:`UDF` object. Every UDF is registered by name when decorated
(:func:`lookup` finds it), which is how the DuckDB adapter recognises it in a plan.

Errors raised by the user's code surface as :class:`UdfError`, whose message names the UDF
and carries the original traceback (also across process boundaries).
"""

from __future__ import annotations

import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import polars as pl
import pyarrow as pa

from shoal.errors import ShoalError
from shoal.ir.types import DataType
from shoal.resources import ResourceRequest

if TYPE_CHECKING:
    from shoal.ir.nodes import PlanNode, UdfProject

BatchFormat = Literal["polars", "arrow"]

_registry: dict[str, UDF] = {}
_registry_lock = threading.Lock()
#: This process's instances of stateful UDFs, by :attr:`UDF.token` (one per actor process).
_instances: dict[str, Any] = {}
_instances_lock = threading.Lock()


class UdfError(ShoalError):
    """A user function raised. The message names the UDF (``udf_name``) and includes the
    original exception and its traceback, formatted where it was raised (an actor or worker
    process as well as the driver)."""

    def __init__(self, message: str, udf_name: str = "") -> None:
        super().__init__(message)
        self.udf_name = udf_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (UdfError, (str(self), self.udf_name))


def _dtype(value: Any) -> DataType:
    if isinstance(value, DataType):
        return value
    if isinstance(value, pa.DataType):
        return DataType(value)
    try:
        return DataType.from_polars(value)
    except Exception as exc:
        raise ValueError(
            f"return_dtype={value!r}: expected a Polars dtype, a pyarrow DataType or a "
            f"shoal DataType ({exc})"
        ) from exc


def _concurrency(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"concurrency={value!r}: expected an integer >= 1")
        return (value, value)
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        lo, hi = int(value[0]), int(value[1])
        if 1 <= lo <= hi:
            return (lo, hi)
    raise ValueError(
        f"concurrency={value!r}: expected an integer >= 1 or a (min, max) pair with 1 <= min <= max"
    )


#: Rows per call of a stateful or GPU UDF (on an actor pool) when neither the UDF's
#: ``batch_size`` nor the ``udf_batch_size`` setting says otherwise.
POOL_BATCH_SIZE = 8192


class UDF:
    """A user function made with :func:`udf`. Immutable; derive variants with
    :meth:`options` and :meth:`with_init`.

    Attributes: ``fn`` (the function or class), ``name``, ``return_dtype`` (a shoal
    :class:`~shoal.ir.types.DataType`), ``resources`` (a
    :class:`~shoal.resources.ResourceRequest` per actor, or per task for a stateless CPU
    function), ``concurrency`` (``(min, max)`` actors, or None: from 1 up to as many as the
    runner's resources hold), ``batch_size`` (rows per call; None: the ``udf_batch_size``
    setting, else a stateless CPU function's whole input and :data:`POOL_BATCH_SIZE` rows
    on an actor pool), ``batch_format`` and the class's ``init_args``/``init_kwargs``. ``token``
    identifies this exact variant (for the per-process instance cache).

    Calling a stateless UDF object calls the function itself (``f(series)``); to apply a
    UDF to a table, use the Polars namespace (``lf.shoal.with_udf``), the DuckDB adapter, or
    :class:`shoal.ir.nodes.UdfProject`.
    """

    __slots__ = (
        "batch_format",
        "batch_size",
        "concurrency",
        "fn",
        "init_args",
        "init_kwargs",
        "name",
        "resources",
        "return_dtype",
        "token",
        "__weakref__",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        return_dtype: Any,
        num_cpus: float = 1,
        num_gpus: float = 0,
        memory_bytes: int | None = None,
        concurrency: int | tuple[int, int] | None = None,
        batch_size: int | None = None,
        batch_format: BatchFormat = "polars",
        name: str | None = None,
        init_args: Sequence[Any] = (),
        init_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"@shoal.udf needs a function or a class, got {fn!r}")
        self.fn = fn
        self.name = name if name is not None else getattr(fn, "__name__", "udf")
        if not isinstance(self.name, str) or not self.name or any(c.isspace() for c in self.name):
            raise ValueError(f"UDF name {self.name!r}: expected a non-empty name without spaces")
        self.return_dtype = _dtype(return_dtype)
        self.resources = ResourceRequest(num_cpus, num_gpus, memory_bytes)
        self.concurrency = _concurrency(concurrency)
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size={batch_size!r}: expected an integer >= 1 or None")
        self.batch_size = batch_size
        if batch_format not in ("polars", "arrow"):
            raise ValueError(f"batch_format={batch_format!r}: expected 'polars' or 'arrow'")
        self.batch_format: BatchFormat = batch_format
        is_class = isinstance(fn, type)
        if not is_class and (init_args or init_kwargs):
            raise ValueError(f"UDF {self.name!r}: init_args/init_kwargs need a class")
        self.init_args = tuple(init_args)
        self.init_kwargs = dict(init_kwargs or {})
        self.token = uuid.uuid4().hex

    # -- what it is -----------------------------------------------------------------

    @property
    def is_stateful(self) -> bool:
        """True for a class: one instance per actor, ``__call__`` per batch."""
        return isinstance(self.fn, type)

    @property
    def needs_actor_pool(self) -> bool:
        """True when the UDF runs on an actor pool: a class, or a GPU request."""
        return self.is_stateful or self.resources.gpus > 0

    def pool_bounds(self, fits: int) -> tuple[int, int]:
        """Actors ``(min, max)``: the ``concurrency`` given, else 1 up to ``fits`` (how many
        the runner's resources hold, at least 1)."""
        if self.concurrency is not None:
            return self.concurrency
        return (1, max(1, fits))

    def __repr__(self) -> str:
        kind = "class" if self.is_stateful else "function"
        return (
            f"<shoal UDF {self.name!r} ({kind}) -> {self.return_dtype}, "
            f"{self.resources.describe()}, concurrency={self.concurrency}>"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # A function or class decorated at module level is pickled by reference (the
        # worker imports its module: tracebacks then show the user's source lines); others
        # (defined in __main__ or in a function) travel by value, pickled by cloudpickle.
        ref = _reference(self.fn)
        return (
            _rebuild,
            (
                ref if ref is not None else self.fn,
                ref is not None,
                self.name,
                self.return_dtype,
                self.resources,
                self.concurrency,
                self.batch_size,
                self.batch_format,
                self.init_args,
                self.init_kwargs,
                self.token,
            ),
        )

    # -- variants -------------------------------------------------------------------

    def options(self, **changes: Any) -> UDF:
        """A copy with decorator arguments changed (``num_gpus=``, ``concurrency=``, ...).
        The copy is not registered by name (the decorated UDF stays registered); pass it to
        :func:`register` (or ``shoal.duckdb.register_udf``) to make it the one found there.
        Raises ``TypeError`` for an unknown argument, ``ValueError`` as :func:`udf` does."""
        current: dict[str, Any] = {
            "return_dtype": self.return_dtype,
            "num_cpus": self.resources.cpus,
            "num_gpus": self.resources.gpus,
            "memory_bytes": self.resources.memory_bytes,
            "concurrency": self.concurrency,
            "batch_size": self.batch_size,
            "batch_format": self.batch_format,
            "name": self.name,
            "init_args": self.init_args,
            "init_kwargs": self.init_kwargs,
        }
        unknown = sorted(set(changes) - set(current))
        if unknown:
            raise TypeError(f"unknown UDF option(s) {unknown}; known: {sorted(current)}")
        current.update(changes)
        return UDF(self.fn, **current)

    def with_init(self, *args: Any, **kwargs: Any) -> UDF:
        """A copy of a class UDF whose ``__init__`` receives ``args`` and ``kwargs``."""
        if not self.is_stateful:
            raise TypeError(f"UDF {self.name!r} is a function: it has no __init__ arguments")
        return self.options(init_args=args, init_kwargs=kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.is_stateful:
            raise TypeError(
                f"UDF {self.name!r} is a class: apply it to a table (lf.shoal.with_udf) or "
                "bind __init__ arguments with .with_init(...)"
            )
        return self.fn(*args, **kwargs)

    # -- running ----------------------------------------------------------------------

    def instantiate(self) -> Any:
        """A new instance of a class UDF (runs the user's ``__init__``); raises
        :class:`UdfError` naming the UDF when ``__init__`` raises."""
        try:
            return self.fn(*self.init_args, **self.init_kwargs)
        except Exception as exc:
            raise UdfError(
                f"user function {self.name!r}: __init__ raised {type(exc).__name__}: {exc}\n\n"
                f"Original traceback:\n{traceback.format_exc()}",
                self.name,
            ) from exc

    def process_callable(self) -> Callable[..., Any]:
        """What this process calls per batch: the function, or this process's one instance
        of the class (made on first use, then kept: on an actor, made when it starts)."""
        if not self.is_stateful:
            return self.fn
        with _instances_lock:
            inst = _instances.get(self.token)
        if inst is None:
            inst = self.instantiate()
            with _instances_lock:
                inst = _instances.setdefault(self.token, inst)
        return inst

    def apply(self, columns: Sequence[pl.Series], batch_size: int | None = None) -> pl.Series:
        """Apply the UDF to equal-length input columns, batch by batch (``batch_size`` rows,
        default: :attr:`batch_size`, else the ``udf_batch_size`` setting, else all rows at
        once for a stateless CPU function and :data:`POOL_BATCH_SIZE` on an actor pool),
        and return the
        output column (unnamed; dtype :attr:`return_dtype`, one row per input row).

        Each call receives one ``polars.Series`` per input column (``batch_format="polars"``)
        or one ``pyarrow.Array`` (``"arrow"``), and may return a Polars Series, a pyarrow
        Array or ChunkedArray, a NumPy array or a list. An empty input calls nothing.
        Raises :class:`UdfError` naming the UDF when the function raises, returns the wrong
        number of rows, or returns values that do not convert to the return dtype.
        """
        dtype = self.return_dtype.to_polars()
        height = columns[0].len() if columns else 0
        if height == 0:
            return pl.Series("", [], dtype=dtype)
        if batch_size is None:
            batch_size = self.batch_size
        if batch_size is None:
            from shoal.config import get_config

            batch_size = get_config().udf_batch_size
        if batch_size is None:
            # A stateless CPU function is vectorised code: one call per task's rows (each
            # call of a * 2 on 8,192 rows cost about 0.1 ms of Python and Polars dispatch,
            # 3,000,000 rows 40 ms where one call takes 7). Actors keep batches of a size
            # a model's memory plans for.
            batch_size = POOL_BATCH_SIZE if self.needs_actor_pool else height
        fn = self.process_callable()
        parts = []
        for start in range(0, height, batch_size):
            n = min(batch_size, height - start)
            batch = [c.slice(start, n) for c in columns]
            args: list[Any] = batch
            if self.batch_format == "arrow":
                args = [c.to_arrow() for c in batch]
            try:
                result = fn(*args)
            except Exception as exc:
                raise UdfError(
                    f"user function {self.name!r} raised {type(exc).__name__}: {exc} "
                    f"(on a batch of {n} rows)\n\nOriginal traceback:\n"
                    f"{traceback.format_exc()}",
                    self.name,
                ) from exc
            parts.append(self._to_series(result, n, dtype))
        out = parts[0] if len(parts) == 1 else pl.concat(parts, rechunk=False)
        return out.alias("")

    def _to_series(self, result: Any, rows: int, dtype: pl.DataType) -> pl.Series:
        try:
            if isinstance(result, pl.Series):
                s = result
            elif isinstance(result, pa.Array | pa.ChunkedArray):
                s = pl.Series(result)
            else:
                s = pl.Series(values=result)
            if s.dtype != dtype:
                s = s.cast(dtype)
        except Exception as exc:
            raise UdfError(
                f"user function {self.name!r} returned {type(result).__name__} that does not "
                f"convert to its return dtype {dtype}: {type(exc).__name__}: {exc}",
                self.name,
            ) from exc
        if s.len() != rows:
            raise UdfError(
                f"user function {self.name!r} returned {s.len()} rows for a batch of {rows}; "
                "a UDF must return one value per input row",
                self.name,
            )
        return s


def _reference(fn: Any) -> tuple[str, str] | None:
    """``(module, qualname)`` when ``fn`` is importable there, itself or as the ``fn`` of
    the UDF that decorating it left under its name; else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname:
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if obj is fn or (isinstance(obj, UDF) and obj.fn is fn):
        return (module, qualname)
    return None


def _resolve(ref: tuple[str, str]) -> Any:
    import importlib

    obj: Any = importlib.import_module(ref[0])
    for part in ref[1].split("."):
        obj = getattr(obj, part)
    return obj.fn if isinstance(obj, UDF) else obj


def _rebuild(
    fn: Any,
    by_reference: bool,
    name: str,
    return_dtype: DataType,
    resources: ResourceRequest,
    concurrency: tuple[int, int] | None,
    batch_size: int | None,
    batch_format: BatchFormat,
    init_args: tuple[Any, ...],
    init_kwargs: dict[str, Any],
    token: str,
) -> UDF:
    if by_reference:
        fn = _resolve(fn)
    u = UDF(
        fn,
        return_dtype=return_dtype,
        num_cpus=resources.cpus,
        num_gpus=resources.gpus,
        memory_bytes=resources.memory_bytes,
        concurrency=concurrency,
        batch_size=batch_size,
        batch_format=batch_format,
        name=name,
        init_args=init_args,
        init_kwargs=init_kwargs,
    )
    u.token = token
    return u


def project(input: PlanNode, u: UDF, inputs: Sequence[str], output: str) -> UdfProject:
    """The IR node applying ``u`` to the columns ``inputs`` of ``input``, as column
    ``output`` (replacing a column of that name in place, else appended).

    Raises :class:`shoal.PlanError` naming the UDF when an input column does not exist,
    and ``TypeError`` when ``u`` is not a :class:`UDF`.
    """
    from shoal.errors import PlanError
    from shoal.ir.nodes import UdfProject
    from shoal.ir.types import Schema

    if not isinstance(u, UDF):
        raise TypeError(f"expected a shoal UDF (made with @shoal.udf), got {u!r}")
    names = input.schema.names
    missing = [c for c in inputs if c not in names]
    if missing:
        raise PlanError(f"UDF {u.name!r}: input column(s) {missing} not in {list(names)}")
    if not inputs:
        raise PlanError(f"UDF {u.name!r}: needs at least one input column")
    fields = list(input.schema.fields)
    if output in names:
        fields[names.index(output)] = (output, u.return_dtype)
    else:
        fields.append((output, u.return_dtype))
    return UdfProject(input, u.name, u, tuple(inputs), output, Schema(tuple(fields)))


def apply_project(node: UdfProject, df: pl.DataFrame) -> pl.DataFrame:
    """Evaluate ``node`` on the rows ``df`` of its input (in this process): ``df`` with the
    UDF's output column. Raises :class:`UdfError` as :meth:`UDF.apply` does."""
    u: UDF = node.udf
    out = u.apply([df.get_column(c) for c in node.inputs])
    return df.with_columns(out.alias(node.output))


def register(u: UDF) -> UDF:
    """Register ``u`` under its name (replacing an earlier UDF of that name) and return it."""
    with _registry_lock:
        _registry[u.name] = u
    return u


def lookup(name: str) -> UDF | None:
    """The UDF registered under ``name``, or None."""
    with _registry_lock:
        return _registry.get(name)


def set_instance(u: UDF, instance: Any) -> None:
    """Make ``instance`` this process's instance of the class UDF ``u`` (actors call this
    once, when they start)."""
    with _instances_lock:
        _instances[u.token] = instance


def drop_instance(u: UDF) -> None:
    """Forget this process's instance of ``u`` (no error when there is none)."""
    with _instances_lock:
        _instances.pop(u.token, None)


@overload
def udf(
    fn: Callable[..., Any],
    /,
    *,
    return_dtype: Any,
    num_cpus: float = ...,
    num_gpus: float = ...,
    memory_bytes: int | None = ...,
    concurrency: int | tuple[int, int] | None = ...,
    batch_size: int | None = ...,
    batch_format: BatchFormat = ...,
    name: str | None = ...,
    init_args: Sequence[Any] = ...,
    init_kwargs: Mapping[str, Any] | None = ...,
) -> UDF: ...


@overload
def udf(
    fn: None = None,
    /,
    *,
    return_dtype: Any,
    num_cpus: float = ...,
    num_gpus: float = ...,
    memory_bytes: int | None = ...,
    concurrency: int | tuple[int, int] | None = ...,
    batch_size: int | None = ...,
    batch_format: BatchFormat = ...,
    name: str | None = ...,
    init_args: Sequence[Any] = ...,
    init_kwargs: Mapping[str, Any] | None = ...,
) -> Callable[[Callable[..., Any]], UDF]: ...


def udf(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    return_dtype: Any,
    num_cpus: float = 1,
    num_gpus: float = 0,
    memory_bytes: int | None = None,
    concurrency: int | tuple[int, int] | None = None,
    batch_size: int | None = None,
    batch_format: BatchFormat = "polars",
    name: str | None = None,
    init_args: Sequence[Any] = (),
    init_kwargs: Mapping[str, Any] | None = None,
) -> UDF | Callable[[Callable[..., Any]], UDF]:
    """Make a function or a class a shoal user function (``@shoal.udf(return_dtype=...)``).

    * A **function** ``f(*columns) -> column`` is stateless: it runs in ordinary tasks, or
      on an actor pool when it asks for GPUs.
    * A **class** is stateful: ``__init__(*init_args, **init_kwargs)`` runs once per actor,
      ``__call__(*columns) -> column`` once per batch; it always runs on an actor pool.

    Each input column arrives as a ``polars.Series`` (``batch_format="polars"``, the
    default) or a ``pyarrow.Array`` (``"arrow"``), ``batch_size`` rows at a time (None: the
    ``udf_batch_size`` setting; unset, a function's task rows in one call, as Polars'
    ``map_batches`` gets a whole column, and 8192 rows per call of a class or GPU function);
    the result (Series, Array, NumPy array or
    list) must have one value per input row and convert to ``return_dtype`` (a Polars
    dtype, a pyarrow type or a shoal DataType).

    Resources are per actor (or per task): ``num_cpus``, ``num_gpus`` (a fraction below 1
    shares a device; above 1 it must be a whole number) and ``memory_bytes`` (bytes).
    ``concurrency`` is the number of actors, an int or a ``(min, max)`` pair (the pool
    starts at min and grows to max while batches wait); None: 1 up to as many as the
    runner's resources hold. ``name`` (default: the function's or class's ``__name__``)
    registers the UDF and names its actors ``shoal-udf-<name>-<query id>-<i>``.

    Raises ``ValueError`` at decoration time for a fractional GPU request above 1, a bad
    ``concurrency``, ``batch_size``, ``batch_format`` or ``return_dtype``, and
    ``TypeError`` for something not callable.
    """

    def make(f: Callable[..., Any]) -> UDF:
        return register(
            UDF(
                f,
                return_dtype=return_dtype,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                memory_bytes=memory_bytes,
                concurrency=concurrency,
                batch_size=batch_size,
                batch_format=batch_format,
                name=name,
                init_args=init_args,
                init_kwargs=init_kwargs,
            )
        )

    if fn is not None:
        return make(fn)
    # Validate the arguments now, not when the decorator is applied.
    ResourceRequest(num_cpus, num_gpus, memory_bytes)
    _concurrency(concurrency)
    _dtype(return_dtype)
    return make
