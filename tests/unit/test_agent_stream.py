"""The follow's polls through one background playbook (launcher/backends/agent_stream.py): what each event of
playbooks/poll_stream.yml means, one playbook for many polls, a node whose loop ended, Ctrl-C, the end.

The playbook itself is replaced by ``ScriptedStreamTEST_DOUBLE`` (no ansible-playbook, no node): it hands the
stream the events the real one would, from a script; the rig suites run the real one (docs/testing.md).
"""

from __future__ import annotations

import json
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from launcher.backends.agent_stream import AgentStream, answer_of
from launcher.backends.runner import RunningPlaybook
from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Callable

HOSTS = ["host1", "host2"]
RUNNING = {"state": "running", "last_log": {"current_steps": 3}}


def _retry(host: str, status: object) -> dict[str, Any]:
    res = {"stdout": json.dumps(status), "rc": 0, "failed": False}
    return {"event": "runner_retry", "event_data": {"host": host, "task": "Ask", "res": res}}


# --- one event, one answer -------------------------------------------------------------------------------


def test_an_attempt_that_printed_a_status_is_that_status() -> None:
    data = _retry("host1", RUNNING)["event_data"]
    assert answer_of("runner_retry", data) == RUNNING


def test_an_agent_that_failed_is_absent_with_its_last_stderr_line() -> None:
    res = {"stdout": "", "stderr": "Traceback ...\nFileNotFoundError: mift_node.pyz", "rc": 2, "failed": True}
    node = answer_of("runner_retry", {"host": "host1", "task": "Ask", "res": res})
    assert node == {"state": contract.ABSENT, "error": "Ask: FileNotFoundError: mift_node.pyz"}


def test_an_attempt_past_its_timeout_and_an_ssh_failure_are_unreachable() -> None:
    timed = {"failed": True, "msg": "Timed out after 8 seconds."}
    assert answer_of("runner_on_failed", {"host": "h", "task": "Ask", "res": timed})["state"] == "unreachable"
    assert answer_of("runner_on_unreachable", {"host": "h", "res": {"msg": "ssh: no route"}}) == {
        "state": contract.UNREACHABLE
    }


def test_output_that_is_no_status_is_no_answer() -> None:
    node = answer_of("runner_retry", {"host": "h", "res": {"stdout": '["not", "a status"]', "failed": False}})
    assert node == {"state": contract.UNREACHABLE}


# --- the stream over many polls --------------------------------------------------------------------------


class ScriptedStreamTEST_DOUBLE:  # noqa: N801 - the test-double marker in the name
    """TEST DOUBLE of PlaybookRunner.start: each started playbook hands its events from ``script`` (one list
    of events an attempt), ``delay`` seconds apart, then keeps running quietly until stopped."""

    def __init__(self, script: list[list[dict[str, Any]]], delay: float = 0.05) -> None:
        self.script = script
        self.delay = delay
        self.cancel_requested = threading.Event()
        self.started: list[dict[str, Any]] = []
        self.stopped: list[RunningPlaybook] = []

    def start(
        self,
        playbook: str,
        extravars: dict[str, Any],
        *,
        on_event: Callable[[dict[str, Any]], None],
        ident: str,
        timeout: int | None = None,
    ) -> RunningPlaybook:
        del timeout
        self.started.append({"playbook": playbook, "ident": ident, **extravars})
        stop = threading.Event()
        attempts = self.script.pop(0) if self.script else []

        def play() -> None:
            for events in attempts:
                for event in events:
                    on_event(event)
                if stop.wait(self.delay):
                    return
            while not stop.wait(0.01) and not self.cancel_requested.is_set():
                pass

        thread = threading.Thread(target=play, daemon=True)
        thread.start()
        running = RunningPlaybook(playbook, thread, stop)
        self.stopped.append(running)
        return running


class JobTEST_DOUBLE:  # noqa: N801 - the test-double marker in the name
    """TEST DOUBLE of launcher.engine.job.Job: its hosts, extra vars and runner."""

    def __init__(self, runner: ScriptedStreamTEST_DOUBLE) -> None:
        self.runner = runner
        self.hosts = list(HOSTS)
        self.base_vars = {"mift_hosts": ",".join(HOSTS), "mift_run_id": "r1"}


def _stream(script: list[list[list[dict[str, Any]]]], interval_s: float = 0.05) -> AgentStream:
    return AgentStream(JobTEST_DOUBLE(ScriptedStreamTEST_DOUBLE(script)), interval_s)  # type: ignore[arg-type]


def test_one_playbook_answers_many_polls_each_with_every_nodes_latest_answer() -> None:
    step = [
        [_retry(h, {"state": "running", "last_log": {"current_steps": i}}) for h in HOSTS] for i in range(40)
    ]
    stream = _stream([step])
    seen = [stream.poll() for _ in range(4)]
    stream.close()
    runner = stream.job.runner
    assert len(runner.started) == 1  # type: ignore[attr-defined]
    started = runner.started[0]  # type: ignore[attr-defined]
    assert started["playbook"] == "poll_stream" and started["ident"] == "poll-stream"
    assert started["mift_poll_delay_s"] == 0.05 and started["mift_poll_count"] >= 1
    for host in HOSTS:  # every poll has each node's answer since the poll before
        steps = [polled[host]["last_log"]["current_steps"] for polled in seen]
        assert steps == sorted(set(steps)), steps
    assert not runner.stopped[0].running()  # type: ignore[attr-defined]


def test_a_node_whose_loop_ended_is_unreachable_and_the_next_poll_starts_the_playbook_again() -> None:
    gone = {"event": "runner_on_unreachable", "event_data": {"host": "host2", "res": {"msg": "no route"}}}
    first = [[_retry("host1", RUNNING), gone]]
    again = [[_retry(h, RUNNING) for h in HOSTS]]
    stream = _stream([first, again])
    polled = stream.poll()
    assert polled == {"host1": RUNNING, "host2": {"state": contract.UNREACHABLE}}
    assert stream.poll() == {"host1": RUNNING, "host2": RUNNING}
    stream.close()
    runner = stream.job.runner
    assert len(runner.started) == 2  # type: ignore[attr-defined]
    assert not any(p.running() for p in runner.stopped)  # type: ignore[attr-defined]


def test_a_node_silent_past_the_interval_and_the_attempt_timeout_counts_as_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("launcher.backends.agent_stream.FIRST_ANSWER_S", 0.3)
    stream = _stream([[[_retry("host1", RUNNING)]]])  # host2 never answers, its loop never ends
    t0 = time.monotonic()
    assert stream.poll() == {"host1": RUNNING, "host2": {"state": contract.UNREACHABLE}}
    assert time.monotonic() - t0 < 5
    stream.close()


def test_ctrl_c_ends_the_wait_at_once_and_close_ends_the_playbook() -> None:
    stream = _stream([[]])  # a playbook that never answers
    runner = stream.job.runner
    threading.Timer(0.2, runner.cancel_requested.set).start()
    t0 = time.monotonic()
    polled = stream.poll()
    assert time.monotonic() - t0 < 3  # not the 60 s a first answer may take
    assert set(polled) == set(HOSTS)
    assert {n["state"] for n in polled.values()} == {contract.UNREACHABLE}
    stream.close()
    assert not runner.stopped[0].running()  # type: ignore[attr-defined]


def test_a_late_event_of_a_stopped_playbook_is_no_answer_of_the_next() -> None:
    stream = _stream(
        [[[_retry(h, RUNNING) for h in HOSTS]], [[_retry(h, {"state": "finished"}) for h in HOSTS]]]
    )
    stream.poll()
    late = stream._listen(stream.starts)  # the first playbook's handler
    stream._start()
    late(_retry("host1", {"state": "failed", "rc": 1}))
    assert stream.poll() == {"host1": {"state": "finished"}, "host2": {"state": "finished"}}
    stream.close()
