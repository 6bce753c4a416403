"""Which training processes a node runs, and waiting until none is left.

One probe for every suite and bench: the node agent's supervisor (``mift_node.pyz agent start``; its
short-lived ``status``/``stop`` calls are not part of a run), torchrun (also as ``torch.distributed.run``) and
LLaMA-Factory (``llamafactory-cli`` and its ranks, ``llamafactory/launcher.py``). The brackets keep the probe
from matching itself.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

TRAINER_PATTERN = "[l]lamafactory|[t]orchrun|[t]orch.distributed.run|[m]ift_node.pyz agent start"
# a shell command for a node: one line "PID COMMAND LINE" per training process, exit 0 also when there is none
TRAINER_PROBE = f"pgrep -af '{TRAINER_PATTERN}' || true"

Host = TypeVar("Host")


def parse_probe(output: str) -> list[str]:
    """Return the non-empty lines of the probe's output."""
    return [line for line in output.splitlines() if line.strip()]


def wait_until_none(
    processes: Callable[[], Mapping[Host, list[str]]], seconds: float, *, since: float | None = None
) -> float:
    """Poll ``processes()`` until no host lists one; return the seconds since ``since`` (or since the call).

    Raises AssertionError, naming what is left, when some remain ``seconds`` after ``since``.
    """
    t0 = time.monotonic() if since is None else since
    while True:
        left = processes()
        if not any(left.values()):
            return time.monotonic() - t0
        if time.monotonic() - t0 > seconds:
            raise AssertionError(
                f"training processes left {seconds:.0f} s after the start of the wait: {left}"
            )
        time.sleep(0.5)
