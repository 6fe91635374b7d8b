"""Helpers shared by the differential property tests (tests/test_*_property.py): hypothesis'
``note``/``event``/``assume`` that also work in the plain regression tests beside them."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, settings
from hypothesis import event as _event
from hypothesis import note as _note
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context


def note(text: str) -> None:
    """``hypothesis.note`` inside a hypothesis test, nothing outside (regression tests)."""
    if currently_in_test_context():
        _note(text)


def event(text: str) -> None:
    """``hypothesis.event`` inside a hypothesis test, nothing outside."""
    if currently_in_test_context():
        _event(text)


def leave_out(reason: str) -> None:
    """Count ``reason`` and leave the example out (hypothesis ``assume``); outside a
    hypothesis test (the regression tests), fail with it."""
    if not currently_in_test_context():
        pytest.fail(f"left out: {reason}")
    _event(reason)
    assume(False)


#: The settings both property tests start from: no deadline (a query may start Ray), and
#: generated data may be slow or large.
BASE_SETTINGS = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
#: Partition counts of the default run.
PARTITIONS = st.sampled_from([1, 2, 7])
