"""The node agents' answers for a whole follow through one playbook (playbooks/poll_stream.yml).

One ``ansible-playbook`` started per follow, not one per poll: starting it is most of a poll's cost on the
controller (bench/follow_loop_cost.py). The playbook asks every node's agent again and again
(``until: false``; ``delay``: the poll interval); each answer comes back as a ``runner_retry`` event as it
comes. :meth:`AgentStream.poll` waits until every node has answered since the last poll and returns the
answers in :func:`launcher.backends.agent.nodes_from`'s terms. A node whose loop ended (it stopped answering:
unreachable; the playbook's own end after ``mift_poll_count`` answers) has its answer of that poll, and the
next poll starts the playbook again: a node that is gone costs one playbook a poll, as before, and counts as
unreachable.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from launcher.backends.agent import POLL_TIMEOUT_S, timed_out
from launcher.backends.runner import failure_line
from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.backends.base import RunNodes
    from launcher.backends.runner import RunningPlaybook

PLAYBOOK = "poll_stream"
IDENT = "poll-stream"  # its artifacts folder: not ``poll``, which ``launcher status`` uses meanwhile
STREAM_S = 1200  # seconds of answers one playbook gives before it ends by itself and the next one starts
FIRST_ANSWER_S = 60.0  # seconds a (re)started playbook has for every node's first answer (as poll_agents)
# seconds past the poll interval and the attempt's timeout before a silent node counts as unreachable
LATE_S = 20.0
# the events that carry one node's answer: each attempt but the last (runner_retry); the last attempt, a
# timeout or an ssh failure, each of which ends that node's loop
ANSWER = "runner_retry"
LAST = ("runner_on_failed", "runner_on_ok", "runner_on_unreachable")


def answer_of(kind: str, data: dict[str, Any]) -> contract.NodeStatus:
    """Return the node status one event of the playbook carries (the agent's JSON), in
    :func:`launcher.backends.agent.nodes_from`'s terms when it carries none: unreachable (no answer in
    time, ssh failed), absent (the agent failed)."""
    res = data.get("res") if isinstance(data.get("res"), dict) else {}
    assert isinstance(res, dict)
    if kind == "runner_on_unreachable":
        return {"state": contract.UNREACHABLE}
    try:
        return contract.node_status_from(json.loads(str(res.get("stdout") or "")), str(data.get("host")))
    except (ValueError, contract.ContractError):
        pass
    if not res.get("failed"):
        return {"state": contract.UNREACHABLE}
    line = failure_line(res, str(data.get("task", "")))
    return {"state": contract.UNREACHABLE if timed_out(line) else contract.ABSENT, "error": line}


class AgentStream:
    """A follow's polls of the node agents, through one background playbook (started at the first poll and
    again when a node's loop ended); :meth:`close` ends it."""

    def __init__(self, job: RunNodes, interval_s: float) -> None:
        self.job = job
        self.interval_s = interval_s
        self.starts = 0  # playbooks started so far
        self._cond = threading.Condition()
        self._answers: dict[str, tuple[int, contract.NodeStatus]] = {}  # host -> (answer number, status)
        self._ended: set[str] = set()  # hosts whose loop ended in the running playbook
        self._count = 0  # answers so far (every playbook)
        self._taken = 0  # ... when the last poll returned
        self._playbook: RunningPlaybook | None = None

    def _listen(self, starts: int) -> Callable[[dict[str, Any]], None]:
        """Return the event handler of playbook number ``starts``."""

        def on_event(event: dict[str, Any]) -> None:
            kind = str(event.get("event"))
            if kind != ANSWER and kind not in LAST:
                return
            data = event.get("event_data") or {}
            host = str(data.get("host", ""))
            with self._cond:
                if starts != self.starts:  # a late event of a playbook already stopped
                    return
                self._count += 1
                self._answers[host] = (self._count, answer_of(kind, data))
                if kind in LAST:
                    self._ended.add(host)
                self._cond.notify_all()

        return on_event

    def _start(self) -> None:
        """Stop the running playbook, if any, and start the next one."""
        self.close()
        count = max(1, int(STREAM_S / self.interval_s))
        with self._cond:
            self.starts += 1
            self._ended = set()
            starts = self.starts
        self._playbook = self.job.runner.start(
            PLAYBOOK,
            {
                **self.job.base_vars,
                "mift_poll_timeout_s": POLL_TIMEOUT_S,
                "mift_poll_delay_s": self.interval_s,
                "mift_poll_count": count,
                "mift_launcher_pid": os.getpid(),
            },
            on_event=self._listen(starts),
            ident=IDENT,
            timeout=int(STREAM_S + FIRST_ANSWER_S + count * POLL_TIMEOUT_S),
        )

    def _fresh(self, host: str) -> bool:
        answer = self._answers.get(host)
        return answer is not None and answer[0] > self._taken

    def poll(self) -> dict[str, contract.NodeStatus]:
        """Return host -> the agent's status since the last poll (unreachable: none in time); waits for every
        node's next answer, at most the poll interval and the attempt's timeout (a playbook just started: its
        start too). Ctrl-C (the runner's cancel request) ends the wait."""
        restart = self._playbook is None or not self._playbook.running() or bool(self._ended)
        if restart:
            self._start()
        deadline = time.monotonic() + (
            FIRST_ANSWER_S if restart else self.interval_s + POLL_TIMEOUT_S + LATE_S
        )
        cancel = self.job.runner.cancel_requested
        playbook = self._playbook
        assert playbook is not None
        with self._cond:
            while not all(self._fresh(h) for h in self.job.hosts) and not cancel.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or not playbook.running():
                    break
                self._cond.wait(min(left, 0.5))
            nodes: dict[str, contract.NodeStatus] = {}
            for host in self.job.hosts:
                nodes[host] = self._answers[host][1] if self._fresh(host) else {"state": contract.UNREACHABLE}
            self._taken = self._count
        return nodes

    def close(self) -> None:
        """End the running playbook, if any (its ssh sessions and agent calls with it)."""
        if self._playbook is not None:
            self._playbook.stop()
            self._playbook = None
