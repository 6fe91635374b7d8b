"""The errors shoal raises. Every error is a subclass of :class:`ShoalError`."""

from __future__ import annotations


class ShoalError(Exception):
    """Base class of every error raised by shoal itself."""


class ShoalWarning(UserWarning):
    """Base class of every warning shoal gives (a misspelt ``SHOAL_*`` variable, a query
    that runs on the frontend's own engine instead, ...)."""


class ShoalFallbackWarning(ShoalWarning):
    """A query (or a part of one: a sink, a batch stream) that shoal could not run ran on
    the frontend's own engine instead; the message gives every reason.

    Each frontend warns with a subclass of its own: ``shoal_polars.PolarsFallbackWarning``
    (also a ``polars.exceptions.PerformanceWarning``, as Polars' GPU engine reports its
    fallbacks) and ``shoal_duckdb.DuckDBFallbackWarning``; ``warnings.filterwarnings`` or
    ``pytest.warns`` with this class catches both.
    """


class UnsupportedError(ShoalError, NotImplementedError):
    """A frontend construct that shoal cannot run distributed.

    The message names the frontend node (a Polars IR node class such as ``MapFunction``,
    or a DuckDB logical operator) and the reason. Raised instead of falling back to the
    frontend's own engine when ``raise_on_fail=True``.
    """


class PlanError(ShoalError, ValueError):
    """A plan that is not valid: a column that does not exist, types that do not fit,
    or a malformed serialised plan. The message names the plan node and the column."""


class SchemaMismatchError(PlanError):
    """The files of one scan disagree on a column (one lacks it, or its type differs from
    the first file's as the frontend reads it); the message names the column and both
    files. A frontend raises it as its own class too (the Polars frontend: also a
    ``polars.exceptions.SchemaError``, what Polars raises for the same files)."""


class ConfigFrozenError(ShoalError, RuntimeError):
    """A runner-level setting was changed after the runner started.

    Runner settings (runner kind, Ray address, resources) are fixed for the life of a
    runner; call :func:`shoal.shutdown` first, then change them.
    """


class VersionMismatchError(ShoalError, RuntimeError):
    """A worker runs other versions of shoal, Polars, pyarrow, DuckDB or Python than the
    driver. Raised by the task, before it computes anything: hash partitioning (Polars
    documents ``hash`` as unstable across versions) and every per-row rule must be the same
    on every worker, or a join or an aggregation is silently wrong. The message names the
    worker's node and both versions of each package that differs."""


class TaskError(ShoalError, RuntimeError):
    """A task of a distributed query failed; the message names the stage and partition.

    When the task raised an exception, what the query raises is a ``TaskError[<class>]``
    (made by :func:`task_error`), also an instance of the exception's class: a strict cast
    that fails in a task raises ``polars.exceptions.InvalidOperationError`` as native
    Polars does. The task's exception is the ``__cause__``.
    """


_task_error_classes: dict[type[BaseException], type[TaskError]] = {}

#: Causes whose class a TaskError does not take: itself, and the ones that mean something
#: else to Python when raised (a StopIteration raised in a generator becomes RuntimeError).
_NOT_MIXED = (TaskError, StopIteration, StopAsyncIteration)


def task_error(message: str, cause: BaseException) -> TaskError:
    """The :class:`TaskError` (with ``message``) for a task that raised ``cause``.

    The error is also an instance of ``cause``'s class when the two combine: a class
    ``TaskError[<cause class>]`` that derives from both. So a query that fails in a task
    raises what the frontend raises for the same failure (``except
    polars.exceptions.InvalidOperationError`` catches a failed strict cast on shoal as on
    native Polars), and ``except shoal.TaskError`` still catches every task failure.
    Attributes of ``cause`` (such as :attr:`shoal.udf.UdfError.udf_name`) are copied.
    Plain :class:`TaskError` when ``cause`` is not an ``Exception`` (``SystemExit``), is a
    ``StopIteration`` or already a ``TaskError``, or when its class cannot be combined (it
    refuses subclasses, or an incompatible metaclass or instance layout).
    """
    base = type(cause)
    if not isinstance(cause, Exception) or isinstance(cause, _NOT_MIXED):
        return TaskError(message)
    try:
        err = _task_error_class(base)(message)
    except Exception:
        return TaskError(message)
    for name, value in vars(cause).items():
        if not name.startswith("__"):
            try:
                setattr(err, name, value)
            except Exception:  # a read-only attribute: the class keeps its own
                continue
    return err


def _task_error_class(base: type[BaseException]) -> type[TaskError]:
    cls = _task_error_classes.get(base)
    if cls is None:
        cls = type(
            f"TaskError[{base.__name__}]",
            (TaskError, base),
            {
                "__module__": __name__,
                "__doc__": TaskError.__doc__,
                "__reduce__": _reduce,
                # The message is shoal's, whatever the base class makes of its arguments.
                "__str__": BaseException.__str__,
                "__repr__": BaseException.__repr__,
            },
        )
        _task_error_classes[base] = cls
    return cls


def _reduce(self: TaskError) -> tuple[object, ...]:
    """Pickle a ``TaskError[<class>]`` as the way to make it again."""
    base = next(c for c in type(self).__bases__ if c is not TaskError)
    return (_rebuild, (str(self), base), dict(vars(self)))


def _rebuild(message: str, base: type[BaseException]) -> TaskError:
    return _task_error_class(base)(message)


class QueryCancelledError(ShoalError, RuntimeError):
    """The query was cancelled (``cancel()`` on a background query's handle) before it
    finished; its tasks were cancelled and its actor pools torn down."""
