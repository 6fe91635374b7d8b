"""A query running in a background thread, which another thread may cancel."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from shoal.runners.dispatch import CANCEL_SETTLE_S, CancelToken

#: Seconds :meth:`BackgroundQuery.cancel` waits at most for the query to stop: the loop's
#: polling interval, the tasks' settling time, and a margin for tearing down actor pools.
CANCEL_WAIT_S = CANCEL_SETTLE_S + 15.0


class BackgroundQuery:
    """Runs ``run(token)`` in a daemon thread, where ``token`` is the query's
    :class:`~shoal.runners.dispatch.CancelToken` (``run`` passes it to
    :func:`shoal.api.execute`).

    ``done()`` says whether it has ended; ``result()`` waits for the result and raises the
    query's error (:class:`shoal.QueryCancelledError` after :meth:`cancel`); ``cancel()``
    cancels the query and returns once its tasks have stopped and its actor pools are
    gone (a query that already ended is left as it is).
    """

    def __init__(self, run: Callable[[CancelToken], Any]) -> None:
        self.token = CancelToken()
        self._run = run
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="shoal-background", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self._result = self._run(self.token)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        """Whether the query has ended (with a result, an error, or cancelled)."""
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Any:
        """The query's result, waiting up to ``timeout`` seconds (None: as long as it
        takes). Raises ``TimeoutError`` when it has not ended by then, else the query's own
        error if it failed."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the background query did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self, timeout: float = CANCEL_WAIT_S) -> None:
        """Cancel the query: every task in flight is cancelled, queued tasks never start,
        actor pools are torn down. Returns when the query has stopped, or after
        ``timeout`` seconds."""
        self.token.cancel()
        self._done.wait(timeout)
