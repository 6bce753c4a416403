"""Signals: SIGINT and SIGTERM become an event, so that a run always cleans up."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextlib.contextmanager
def interrupt_guard(event: threading.Event) -> Iterator[threading.Event]:
    """Turn SIGINT and SIGTERM into ``event`` (no exception), so cleanup always runs; restore on exit."""

    def handler(signum: int, _frame: object) -> None:
        if not event.is_set():
            print(f"\n{signal.Signals(signum).name}: stopping the job on every node ...", file=sys.stderr)
        event.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield event
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)
