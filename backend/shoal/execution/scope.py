"""Whether the running code is a shoal task, and which Polars engine a task runs.

A task's own Polars queries must never come back to shoal. Polars resolves
``collect()`` without an engine through its engine affinity, which a user may have set to
a ``shoal.DistEngine`` (``pl.Config.set_engine_affinity(...)``), and any code may patch
``LazyFrame.collect`` process-wide. A query started inside a task would then start a
nested shoal query that waits for a place in the pool its own task occupies: on the local
runner, a deadlock. Two rules prevent it:

* every collect that shoal makes itself names :data:`TASK_ENGINE` (an engine name given
  explicitly is never resolved through the affinity);
* the code of a task (the kernel, a UDF and a stateful UDF's ``__init__``) runs inside
  :func:`task_scope`, and the Polars engine refuses to start a shoal query while
  :func:`in_task` is true (it runs the query on Polars' own engine instead).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Final

from shoal.lowering.engine import TASK_ENGINE as _TASK_ENGINE

#: The Polars engine of every query a task runs (defined with the lowering, which
#: collects with it too).
TASK_ENGINE: Final = _TASK_ENGINE

_state = threading.local()


@contextlib.contextmanager
def task_scope() -> Iterator[None]:
    """Mark this thread as running a shoal task for the duration of the block (blocks
    nest)."""
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


def in_task() -> bool:
    """True while this thread runs a shoal task (inside :func:`task_scope`)."""
    return getattr(_state, "depth", 0) > 0
