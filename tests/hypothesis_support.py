"""Helpers shared by the differential property tests (tests/test_*_property.py): hypothesis'
``note``/``event``/``assume`` that also work in the plain regression tests beside them."""

from __future__ import annotations

import pytest
from hypothesis import assume
from hypothesis import event as _event
from hypothesis import note as _note
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
