"""Ansible callback of bench/provision_scaling.py: the wall time of every task, written as JSON.

A task's time runs from its start to the start of the next task (or the end of the play), across all hosts
of a linear play, as ansible.posix's profile_tasks measures it (that collection is not installed here).
Enabled with ANSIBLE_CALLBACKS_ENABLED=mift_task_times and ANSIBLE_CALLBACK_PLUGINS=bench/callback_plugins;
writes [[task name, seconds], ...] in start order to $MIFT_TASK_TIMES at the end of the run.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):  # type: ignore[misc]  # ansible is untyped
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "mift_task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self._current: str | None = None
        self._start = 0.0
        self.times: list[tuple[str, float]] = []

    def _close(self) -> None:
        if self._current is not None:
            self.times.append((self._current, time.monotonic() - self._start))
        self._current = None

    def _open(self, name: str) -> None:
        self._close()
        self._current = name
        self._start = time.monotonic()

    def v2_playbook_on_task_start(self, task: Any, is_conditional: bool) -> None:  # noqa: ANN401
        self._open(task.get_name())

    def v2_playbook_on_handler_task_start(self, task: Any) -> None:  # noqa: ANN401
        self._open(task.get_name())

    def v2_playbook_on_play_start(self, play: Any) -> None:  # noqa: ANN401
        self._close()

    def v2_playbook_on_stats(self, stats: Any) -> None:  # noqa: ANN401
        self._close()
        dest = os.environ.get("MIFT_TASK_TIMES")
        if dest:
            with open(dest, "w") as fh:  # noqa: PTH123
                json.dump([[name, round(sec, 2)] for name, sec in self.times], fh)
