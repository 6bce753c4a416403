"""TEST DOUBLE part of the PlaybookRunner doubles that run a job in-process: the background poll playbook (and
the launch playbook's lease answer on free nodes).

``start("poll_stream", ...)`` answers as playbooks/poll_stream.yml does through ansible-runner: one
``runner_retry`` event a node an attempt (its result's stdout: the agent's JSON), an attempt every
``mift_poll_delay_s`` seconds, until stopped; each attempt is the double's own one-shot ``run("poll", ...)``.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

from launcher.backends.runner import RunningPlaybook

if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.backends.runner import PlaybookResult


def lease_taken(extravars: dict[str, Any]) -> dict[str, Any]:
    """A node's ``lease`` answer in a launch playbook that takes the GPU lease (``mift_lease_argv``: the run's
    first start, launcher/engine/lease.py) on a free node; nothing when the start takes none."""
    return {"lease": {"taken": True, "changed": True}} if "mift_lease_argv" in extravars else {}


class PollStreamDouble:
    """Mixin of a PlaybookRunner test double that has a one-shot ``run("poll", ...)``."""

    cancel_requested: threading.Event

    def run(self, playbook: str, extravars: dict[str, Any], **_: Any) -> PlaybookResult:
        raise NotImplementedError

    def start(
        self,
        playbook: str,
        extravars: dict[str, Any],
        *,
        on_event: Callable[[dict[str, Any]], None],
        ident: str,
        timeout: int | None = None,
    ) -> RunningPlaybook:
        del ident, timeout
        assert playbook == "poll_stream", playbook
        stop = threading.Event()
        hosts = str(extravars["mift_hosts"]).split(",")

        def attempts() -> None:
            for _ in range(int(extravars["mift_poll_count"])):
                if stop.is_set() or self.cancel_requested.is_set():
                    return
                result = self.run("poll", extravars)
                for host in hosts:
                    status = result.report(host, "status")
                    if host in result.unreachable:
                        on_event({"event": "runner_on_unreachable", "event_data": {"host": host, "res": {}}})
                        continue
                    res = {"stdout": json.dumps(status) if status is not None else "", "failed": False}
                    on_event(
                        {"event": "runner_retry", "event_data": {"host": host, "task": "poll", "res": res}}
                    )
                if stop.wait(float(extravars["mift_poll_delay_s"])):
                    return

        thread = threading.Thread(target=attempts, daemon=True)
        thread.start()
        return RunningPlaybook(playbook, thread, stop)
