"""The errors shoal raises. Every error is a subclass of :class:`ShoalError`."""

from __future__ import annotations


class ShoalError(Exception):
    """Base class of every error raised by shoal itself."""


class UnsupportedError(ShoalError, NotImplementedError):
    """A frontend construct that shoal cannot run distributed.

    The message names the frontend node (a Polars IR node class such as ``MapFunction``,
    or a DuckDB logical operator) and the reason. Raised instead of falling back to the
    frontend's own engine when ``raise_on_fail=True``.
    """


class PlanError(ShoalError, ValueError):
    """A plan that is not valid: a column that does not exist, types that do not fit,
    or a malformed serialised plan. The message names the plan node and the column."""


class ConfigFrozenError(ShoalError, RuntimeError):
    """A runner-level setting was changed after the runner started.

    Runner settings (runner kind, Ray address, resources) are fixed for the life of a
    runner; call :func:`shoal.shutdown` first, then change them.
    """


class TaskError(ShoalError, RuntimeError):
    """A task of a distributed query failed; the message names the stage and partition."""


class QueryCancelledError(ShoalError, RuntimeError):
    """The query was cancelled (``cancel()`` on a background query's handle) before it
    finished; its tasks were cancelled and its actor pools torn down."""
