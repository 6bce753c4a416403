"""Import a heavy library quietly: what it prints at import must not reach the one line per problem."""

from __future__ import annotations

import contextlib
import io
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextlib.contextmanager
def quiet_import() -> Iterator[None]:
    """Swallow what a heavy library prints while it is imported, and keep its loggers quiet after.

    DeepSpeed logs "Setting accelerator to CPU" to stdout at import; validation output must stay
    one line per problem.
    """
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield
    for name in ("DeepSpeed", "llamafactory", "transformers"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.ERROR)
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is sink:
                handler.setStream(io.StringIO())
