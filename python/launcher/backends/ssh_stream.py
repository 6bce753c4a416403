"""The follow of many nodes: one ssh session per node streams its agent's status, no Ansible task a poll.

With the one poll playbook of :mod:`launcher.backends.agent_stream`, every answer of every node is an Ansible
task attempt on the controller (a worker's templating, an ``ssh`` client started, the result sent back as an
event through ansible-runner): 0.026 CPU-s of the controller per node and poll at 64 test hosts, and each
node's next answer waits for its attempt after the delay, so the poll period stretched from 6.7 s to 10 s
(docs/measurements.md "Control plane at scale"); streamed: 0.001 CPU-s a node, the period the interval.
From :data:`STREAM_FROM_NODES` nodes on, the ssh backend follows a run this way instead: one playbook
(playbooks/ssh_targets.yml) hands back each node's ssh destination as the inventory gives it, then one
``ssh`` per node runs the agent's ``watch`` (``status`` as one JSON line every poll interval, for
:data:`WATCH_S` s); a reader thread per session keeps its latest answer. A poll waits until every node has
answered since the last poll, at most the interval plus :data:`POLL_TIMEOUT_S` (the first poll: the sessions'
start, :data:`FIRST_ANSWER_S`); a node silent that long is unreachable for that poll, as with the playbook.
A session that ended (ssh failed, the node went away, its ``watch`` time is up) is started again at the next
poll, for that node alone. When the launcher dies, its end of each session's pipe closes: ssh and the agent
end at their next line. Nodes that are no ssh connection (``ansible_connection: local``, ...), and a run
where ssh of its own reached no node at the first poll (a password login, a setting only Ansible knows), are
followed by the playbook of :mod:`launcher.backends.agent_stream`.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from launcher.backends.agent import POLL_TIMEOUT_S
from launcher.backends.agent_stream import FIRST_ANSWER_S, AgentStream
from launcher.node import contract

if TYPE_CHECKING:
    from launcher.backends.base import RunNodes

STREAM_FROM_NODES = 16  # from this many nodes on, the ssh backend's follow streams (SshBackend.poller)
WATCH_S = 1200  # seconds one session's agent streams before it ends and the next poll starts it again
# ssh's own bounds: a node cut off ends its session in 15 s (3 keep-alives 5 s apart), a connection that does
# not open in POLL_TIMEOUT_S s fails
SSH_OPTIONS = (
    "-o",
    "BatchMode=yes",
    # as the launcher's own Ansible does (python/launcher/ansible.cfg: host_key_checking = False)
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    f"ConnectTimeout={POLL_TIMEOUT_S}",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
)
UNREACHABLE_RC = 255  # ssh's own failure (connection, authentication), not the remote command's


def ssh_argv(target: dict[str, Any], command: str) -> list[str]:
    """The ``ssh`` command line that runs ``command`` on a node with the inventory's connection settings
    (``target``: playbooks/ssh_targets.yml's answer)."""
    argv = ["ssh", *SSH_OPTIONS]
    if str(target.get("port") or ""):
        argv += ["-p", str(target["port"])]
    if str(target.get("user") or ""):
        argv += ["-l", str(target["user"])]
    if str(target.get("key") or ""):
        argv += ["-i", str(target["key"])]
    argv += shlex.split(str(target.get("common_args") or ""))
    argv += shlex.split(str(target.get("extra_args") or ""))
    return [*argv, str(target["address"]), command]


def answer_of_line(line: str, host: str) -> contract.NodeStatus | None:
    """Return the node status one line of the agent's ``watch`` carries; None for a line that is none."""
    try:
        return contract.node_status_from(json.loads(line), host)
    except (ValueError, contract.ContractError):
        return None


class _Session:
    """One node's ssh session running the agent's ``watch``, and its reader thread."""

    def __init__(self, host: str, argv: list[str], on_answer: Any) -> None:  # noqa: ANN401 - a callback
        self.host = host
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.ended = False
        self.never_connected = False  # ended by ssh's own failure before any answer
        self._on_answer = on_answer
        self._thread = threading.Thread(target=self._read, name=f"ssh-stream-{host}", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        answered = False
        for line in self.proc.stdout:
            status = answer_of_line(line, self.host)
            if status is not None:
                answered = True
                self._on_answer(self.host, status, False)
        rc = self.proc.wait()
        err = self.proc.stderr.read().strip()
        last = err.splitlines()[-1] if err else f"exit status {rc}"
        final: contract.NodeStatus
        self.never_connected = rc == UNREACHABLE_RC and not answered
        if rc == UNREACHABLE_RC or answered:
            final = {"state": contract.UNREACHABLE}
        else:  # ssh worked, the agent did not answer (no run directory, no python3): the playbook's failure
            final = {"state": contract.ABSENT, "error": f"watch: {last}"}
        self.ended = True
        self._on_answer(self.host, final, True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class SshStream:
    """A follow's polls of the node agents through one ssh session per node (see the module's text)."""

    def __init__(self, job: RunNodes, interval_s: float) -> None:
        self.job = job
        self.interval_s = interval_s
        self.starts = 0  # sessions started so far (every node)
        self._cond = threading.Condition()
        self._answers: dict[str, tuple[int, contract.NodeStatus]] = {}
        self._count = 0
        self._taken = 0
        self._targets: dict[str, dict[str, Any]] | None = None
        self._sessions: dict[str, _Session] = {}
        self._fallback: AgentStream | None = None

    def _resolve(self) -> None:
        """Ask the inventory for every node's ssh destination; a node that is no ssh connection makes the
        follow the playbook's (AgentStream)."""
        result = self.job.runner.run("ssh_targets", dict(self.job.base_vars), keep_events=False, timeout=120)
        targets = {h: result.report(h, "ssh") for h in self.job.hosts}
        if all(isinstance(t, dict) and t.get("connection") in ("ssh", "smart") for t in targets.values()):
            self._targets = {h: dict(t) for h, t in targets.items() if isinstance(t, dict)}
        else:
            self._targets = {}
            self._fallback = AgentStream(self.job, self.interval_s)

    def _command(self, host: str) -> str:
        """The agent's ``watch`` in the node's run directory (the inventory's runs root)."""
        assert self._targets is not None
        run_dir = str(self._targets[host]["run_dir"])
        every = f"{self.interval_s:g}"
        return shlex.join(
            [
                "python3",
                f"{run_dir}/mift_node.pyz",
                "agent",
                "watch",
                run_dir,
                "--every",
                every,
                "--for",
                str(WATCH_S),
            ]
        )

    def _on_answer(self, host: str, status: contract.NodeStatus, last: bool) -> None:
        with self._cond:
            if last and host in self._answers and self._answers[host][0] > self._taken:
                pass  # a fresh answer of this poll stands; the session's end shows at the next poll
            else:
                self._count += 1
                self._answers[host] = (self._count, status)
            self._cond.notify_all()

    def _fresh(self, host: str) -> bool:
        answer = self._answers.get(host)
        return answer is not None and answer[0] > self._taken

    def poll(self) -> dict[str, contract.NodeStatus]:
        """Return host -> the agent's status since the last poll (unreachable: none in time); Ctrl-C (the
        runner's cancel request) ends the wait."""
        if self._targets is None:
            self._resolve()
        if self._fallback is not None:
            return self._fallback.poll()
        assert self._targets is not None
        first = not self._sessions
        for host in self.job.hosts:
            session = self._sessions.get(host)
            if session is None or session.ended:
                if session is not None:
                    session.stop()
                self._sessions[host] = _Session(
                    host, ssh_argv(self._targets[host], self._command(host)), self._on_answer
                )
                self.starts += 1
        deadline = time.monotonic() + (FIRST_ANSWER_S if first else self.interval_s + POLL_TIMEOUT_S)
        cancel = self.job.runner.cancel_requested
        with self._cond:
            while not all(self._fresh(h) for h in self.job.hosts) and not cancel.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.5))
            nodes: dict[str, contract.NodeStatus] = {
                h: self._answers[h][1] if self._fresh(h) else {"state": contract.UNREACHABLE}
                for h in self.job.hosts
            }
            self._taken = self._count
        if first and all(s.never_connected for s in self._sessions.values()):
            # ssh of its own reaches no node (a password login, an ssh setting only Ansible knows): the
            # playbook's follow, as below STREAM_FROM_NODES
            self.close()
            self._fallback = AgentStream(self.job, self.interval_s)
            return self._fallback.poll()
        return nodes

    def close(self) -> None:
        """End every session (ssh and, at its next line, the agent's watch)."""
        if self._fallback is not None:
            self._fallback.close()
        for session in self._sessions.values():
            session.stop()
        self._sessions = {}
