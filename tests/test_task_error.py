"""How a task's error reaches the user: :func:`shoal.errors.task_error` makes a
``TaskError`` that is also of the task's error class (when the two combine)."""

from __future__ import annotations

import pickle

import polars as pl

from shoal.errors import ShoalError, TaskError, task_error
from shoal.udf import UdfError


class _Terse(Exception):
    """An error whose own ``__str__`` ignores its arguments."""

    def __str__(self) -> str:
        return "terse"


class _Final(Exception):
    """An error class that refuses subclasses."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        raise TypeError("final")


def test_the_error_is_of_both_classes_and_keeps_shoals_message() -> None:
    cause = pl.exceptions.InvalidOperationError("conversion failed")
    err = task_error("task failed in stage 1, partition 2: boom", cause)
    assert isinstance(err, TaskError) and isinstance(err, ShoalError)
    assert isinstance(err, pl.exceptions.InvalidOperationError)
    assert isinstance(err, pl.exceptions.PolarsError)
    assert type(err).__name__ == "TaskError[InvalidOperationError]"
    assert str(err) == "task failed in stage 1, partition 2: boom"
    # One class per cause class.
    again = task_error("other", pl.exceptions.InvalidOperationError("x"))
    assert type(again) is type(err)
    assert not isinstance(task_error("m", ValueError("v")), pl.exceptions.PolarsError)


def test_a_base_class_with_its_own_str_does_not_hide_the_message() -> None:
    err = task_error("task failed in stage 0, partition 0: terse", _Terse())
    assert isinstance(err, _Terse)
    assert str(err) == "task failed in stage 0, partition 0: terse"
    assert repr(err).startswith("TaskError[_Terse](")


def test_attributes_of_the_cause_are_kept() -> None:
    err = task_error("task failed: udf", UdfError("user function 'f' raised", udf_name="f"))
    assert isinstance(err, UdfError)
    assert err.udf_name == "f"


def test_the_error_pickles_as_itself() -> None:
    err = task_error("msg", pl.exceptions.ComputeError("c"))
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert str(back) == "msg"
    udf = pickle.loads(pickle.dumps(task_error("m", UdfError("u", udf_name="g"))))
    assert isinstance(udf, UdfError) and udf.udf_name == "g"


def test_plain_task_error_when_the_classes_do_not_combine() -> None:
    err = task_error("m", _Final())
    assert type(err) is TaskError and str(err) == "m"
    # What a generator (the dispatch loop's stream) would turn into RuntimeError.
    assert type(task_error("m", StopIteration())) is TaskError
    # Not an Exception (the loop re-raises KeyboardInterrupt itself).
    assert type(task_error("m", SystemExit(1))) is TaskError
    # Already a TaskError.
    assert type(task_error("m", TaskError("inner"))) is TaskError


def test_local_runner_errors_do_not_claim_retries() -> None:
    """Regression: a failed task on the local runner said "(after up to 3 retries on worker
    or object loss)", but the local runner never runs a task again (only Ray does)."""
    import pytest

    from shoal import Config, DistEngine

    lf = pl.DataFrame({"s": ["1", "2", "x", "4"]}).lazy().select(pl.col("s").cast(pl.Int64))
    engine = DistEngine(
        runner="local", raise_on_fail=True, config=Config(default_partitions=2, task_max_retries=3)
    )
    with pytest.raises(pl.exceptions.InvalidOperationError) as info:
        lf.collect(engine=engine)
    assert isinstance(info.value, TaskError)
    assert "task failed in stage" in str(info.value) and "retries" not in str(info.value)
