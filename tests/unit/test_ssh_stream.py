"""The follow of many nodes through one ssh session per node (launcher/backends/ssh_stream.py): the real node
agent's ``watch`` on local run folders, reached through an ``ssh`` TEST DOUBLE (runs the remote command here;
exit 255, ssh's own failure, for an address listed as down); playbooks/ssh_targets.yml run for real once."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from launcher.backends import ssh_stream
from launcher.backends.agent_stream import AgentStream
from launcher.backends.runner import PlaybookResult, PlaybookRunner
from launcher.backends.ssh import SshBackend
from launcher.backends.ssh_stream import SshStream, ssh_argv
from launcher.node import contract
from launcher.rundir.runs import RunDir
from launcher.transfer import nodeprogram

RUN_ID = "ssh-stream"
SSH_DOUBLE = """#!/usr/bin/env python3
import os, sys
args = sys.argv[1:]
address, command = args[-2], args[-1]
if address in os.environ.get("SSH_DOUBLE_DOWN", "").split(","):
    sys.stderr.write(f"ssh: connect to host {address} port 22: Connection timed out\\n")
    sys.exit(255)
with open(os.environ["SSH_DOUBLE_LOG"], "a") as fh:
    fh.write(" ".join(args) + "\\n")
os.execvp("sh", ["sh", "-c", command])
"""


@dataclass
class Runner:
    """TEST DOUBLE of the PlaybookRunner: ``ssh_targets`` answers ``targets``."""

    targets: dict[str, dict[str, Any]]
    cancel_requested: threading.Event = field(default_factory=threading.Event)
    runs: list[str] = field(default_factory=list)

    def run(self, playbook: str, extravars: dict[str, Any], **_: Any) -> PlaybookResult:
        del extravars
        self.runs.append(playbook)
        assert playbook == "ssh_targets", playbook
        return PlaybookResult(
            playbook, 0, "successful", reports={h: {"ssh": t} for h, t in self.targets.items()}
        )

    def start(self, playbook: str, extravars: dict[str, Any], **_: Any) -> None:
        """The playbook follow's start: raises PlaybookFollow."""
        del extravars
        raise PlaybookFollow(playbook)


class PlaybookFollow(Exception):  # noqa: N818 - what the double's start says: the playbook follow began
    """The follow fell back to the poll playbook (poll_stream.yml)."""


@dataclass
class Nodes:
    run: RunDir
    runner: Runner
    hosts: list[str]

    @property
    def base_vars(self) -> dict[str, str]:
        return {"mift_hosts": ",".join(self.hosts), "mift_run_id": self.run.run_id}


def node(root: Path, state: dict[str, Any]) -> str:
    """A node run folder with the agent, job.json and ``state``; return the run folder."""
    run = root / RUN_ID
    run.mkdir(parents=True)
    (run / "mift_node.pyz").write_bytes(nodeprogram.program_file().read_bytes())  # as install leaves it
    (run / "job.json").write_text(json.dumps({"run_id": RUN_ID, "expect_outputs": []}))
    (run / "state.json").write_text(json.dumps(state))
    return str(run)


@pytest.fixture
def ssh_double(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(SSH_DOUBLE)
    (bin_dir / "ssh").chmod(0o755)
    log = tmp_path / "ssh.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SSH_DOUBLE_LOG", str(log))
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    return log


def cluster(tmp_path: Path, states: dict[str, dict[str, Any]]) -> Nodes:
    targets = {
        host: {
            "connection": "ssh",
            "address": f"addr-{host}",
            "port": "2222",
            "user": "deploy",
            "key": "/keys/id",
            "common_args": "-F '/cfg dir/config'",
            "extra_args": "",
            "run_dir": node(tmp_path / host, state),
        }
        for host, state in states.items()
    }
    return Nodes(RunDir.create(RUN_ID, {"hosts": list(states)}), Runner(targets), list(states))


def test_the_ssh_command_takes_the_inventorys_connection_settings() -> None:
    target = {
        "address": "10.0.0.5",
        "port": "2222",
        "user": "deploy",
        "key": "/k/id",
        "common_args": "-F '/a b/c'",
    }
    argv = ssh_argv(target, "python3 x")
    assert argv[: len(ssh_stream.SSH_OPTIONS) + 1] == ["ssh", *ssh_stream.SSH_OPTIONS]
    assert argv[len(ssh_stream.SSH_OPTIONS) + 1 :] == [
        "-p",
        "2222",
        "-l",
        "deploy",
        "-i",
        "/k/id",
        "-F",
        "/a b/c",
        "10.0.0.5",
        "python3 x",
    ]


def test_one_session_per_node_answers_every_poll(tmp_path: Path, ssh_double: Path) -> None:
    job = cluster(tmp_path, {f"n{i}": {"state": "exited", "rc": 0} for i in range(3)})
    stream = SshStream(job, 0.3)  # type: ignore[arg-type]
    try:
        for _ in range(3):
            nodes = stream.poll()
            assert {h: n["state"] for h, n in nodes.items()} == dict.fromkeys(job.hosts, contract.FINISHED)
    finally:
        stream.close()
    assert job.runner.runs == ["ssh_targets"]
    sessions = ssh_double.read_text().splitlines()
    assert stream.starts == 3 and len(sessions) == 3, sessions
    assert all("-p 2222 -l deploy -i /keys/id -F /cfg dir/config addr-n" in s for s in sessions), sessions
    assert all(" watch " in s and "--every 0.3" in s for s in sessions), sessions


def _two_exited_nodes_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, down: str) -> SshStream:
    """An SshStream (every 0.3 s) over nodes n0 and n1, both exited 0, the ssh double failing for `down`."""
    monkeypatch.setenv("SSH_DOUBLE_DOWN", down)
    job = cluster(tmp_path, {"n0": {"state": "exited", "rc": 0}, "n1": {"state": "exited", "rc": 0}})
    return SshStream(job, 0.3)  # type: ignore[arg-type]


def test_a_node_ssh_cannot_reach_is_unreachable_and_only_its_session_starts_again(
    tmp_path: Path, ssh_double: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = _two_exited_nodes_stream(tmp_path, monkeypatch, down="addr-n1")
    try:
        for polls in (1, 2):
            nodes = stream.poll()
            assert nodes["n0"]["state"] == contract.FINISHED and nodes["n1"]["state"] == contract.UNREACHABLE
            assert stream.starts == 1 + polls  # n0 once, n1 at every poll
    finally:
        stream.close()


def test_ssh_that_reaches_no_node_at_the_first_poll_falls_back_to_the_playbook(
    tmp_path: Path, ssh_double: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = _two_exited_nodes_stream(tmp_path, monkeypatch, down="addr-n0,addr-n1")
    with pytest.raises(PlaybookFollow, match="poll_stream"):
        stream.poll()
    assert isinstance(stream._fallback, AgentStream)


def test_a_node_without_the_run_is_absent(tmp_path: Path, ssh_double: Path) -> None:
    job = cluster(tmp_path, {"n0": {"state": "exited", "rc": 0}})
    stream = SshStream(job, 0.3)  # type: ignore[arg-type]
    job.runner.targets["n0"]["run_dir"] = str(tmp_path / "nowhere")
    try:
        assert stream.poll()["n0"]["state"] == contract.ABSENT
    finally:
        stream.close()


def test_close_ends_every_watch(tmp_path: Path, ssh_double: Path) -> None:
    job = cluster(tmp_path, {"n0": {"state": "exited", "rc": 0}, "n1": {"state": "exited", "rc": 0}})
    stream = SshStream(job, 0.3)  # type: ignore[arg-type]
    stream.poll()
    sessions = list(stream._sessions.values())
    stream.close()
    assert all(s.proc.poll() is not None for s in sessions)


def test_the_ssh_backend_streams_from_the_threshold_on() -> None:
    @dataclass
    class Hosts:
        hosts: list[str]

    small, large = (
        Hosts([f"n{i}" for i in range(n)])
        for n in (ssh_stream.STREAM_FROM_NODES - 1, ssh_stream.STREAM_FROM_NODES)
    )
    assert not isinstance(SshBackend().poller(small, 5), SshStream)  # type: ignore[arg-type]
    assert isinstance(SshBackend().poller(large, 5), SshStream)  # type: ignore[arg-type]


def test_ssh_targets_renders_the_inventorys_templated_settings(tmp_path: Path) -> None:
    inventory = tmp_path / "inv" / "hosts.yml"
    inventory.parent.mkdir()
    inventory.write_text(
        "all:\n  hosts:\n    h1: {ansible_host: 10.0.0.1, mift_runs_root: /r1}\n"
        "    h2: {ansible_port: 2200}\n"
        "  vars:\n    ansible_user: deploy\n"
        "    ansible_ssh_private_key_file: '{{ inventory_dir }}/key'\n"
        "    ansible_ssh_common_args: -F cfg\n"
    )
    runner = PlaybookRunner(tmp_path / "private", inventory=inventory)
    result = runner.run("ssh_targets", {"mift_hosts": "h1,h2", "mift_run_id": "r"}, keep_events=False)
    h1, h2 = result.report("h1", "ssh"), result.report("h2", "ssh")
    assert h1["address"] == "10.0.0.1" and h1["run_dir"] == "/r1/r" and h1["connection"] == "ssh", h1
    assert h1["key"] == f"{inventory.parent}/key" and h1["user"] == "deploy" and h1["common_args"] == "-F cfg"
    assert h2["address"] == "h2" and h2["port"] == "2200" and h2["run_dir"] == "/var/lib/mift/runs/r", h2
