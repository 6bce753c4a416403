"""The Slurm backend's poll asks the scheduler once per poll, not once per node: playbooks/slurm_poll.yml run
for real (ansible-playbook through the launcher's runner) against local-connection nodes, with ``scontrol``,
``squeue`` and ``sacct`` TEST DOUBLES on PATH (this machine runs no Slurm) that count their calls."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from launcher.backends.runner import PlaybookRunner
from launcher.backends.slurm import SlurmBackend, SlurmHandle
from launcher.follow.verdict import Verdict
from launcher.rundir.runs import RunDir
from launcher.transfer import nodeprogram

if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.node import contract

SCHEDULER = ("scontrol", "squeue", "sacct")
RUN_ID = "slurm-poll-calls"


@dataclass
class Nodes:
    """The run's nodes as the backend reaches them (launcher.backends.base.RunNodes)."""

    run: RunDir
    runner: PlaybookRunner
    hosts: list[str]
    stop_grace_s: int = 8
    dump_stacks_on_stop: bool = False
    node_judge: Callable[[dict[str, contract.NodeStatus]], Verdict] = field(
        default=lambda _nodes: Verdict("running")
    )

    @property
    def base_vars(self) -> dict[str, str]:
        return {"mift_hosts": ",".join(self.hosts), "mift_run_id": self.run.run_id}


def scheduler_doubles(bin_dir: Path, calls: Path) -> None:
    """``scontrol``/``squeue``/``sacct`` that append their command line to ``calls``; scontrol answers a
    running job."""
    bin_dir.mkdir()
    for name in SCHEDULER:
        answer = (
            "JobId=42 JobName=x JobState=RUNNING Reason=None ExitCode=0:0 Restarts=0"
            if name == "scontrol"
            else ""
        )
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> {calls}\necho "{answer}"\n')
        script.chmod(0o755)


def local_nodes(work: Path, count: int) -> tuple[Path, list[str]]:
    """``count`` local-connection nodes with a run folder each (the agent, job.json, a running state) and the
    login host; return the inventory and the node names."""
    names = [f"node{i}" for i in range(1, count + 1)]
    lines = ["all:", "  hosts:", "    login: {}", "  children:", "    trainers:", "      hosts:"]
    for name in names:
        run = work / name / RUN_ID
        run.mkdir(parents=True)
        (run / "mift_node.pyz").write_bytes(nodeprogram.program_file().read_bytes())  # as install leaves it
        (run / "job.json").write_text(json.dumps({"run_id": RUN_ID, "expect_outputs": []}))
        (run / "state.json").write_text(json.dumps({"state": "queued"}))
        lines.append(f"        {name}: {{mift_runs_root: {json.dumps(str(work / name))}}}")
    lines += ["  vars: {ansible_connection: local, ansible_python_interpreter: /usr/bin/python3}"]
    inventory = work / "hosts.yml"
    inventory.write_text("\n".join(lines) + "\n")
    return inventory, names


def test_one_scheduler_query_per_poll_not_one_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 8
    calls = tmp_path / "calls.log"
    scheduler_doubles(tmp_path / "bin", calls)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    inventory, hosts = local_nodes(tmp_path, count)
    run = RunDir.create(RUN_ID, {"hosts": hosts})
    nodes = Nodes(run, PlaybookRunner(tmp_path / "private", inventory=inventory), hosts)
    backend = SlurmBackend(SlurmHandle(login_host="login", job_id="42"))
    polls = 2
    for _ in range(polls):
        answers = backend.poll(nodes)
        assert set(answers) == set(hosts), answers
        assert all(a.get("state") == "queued" for a in answers.values()), answers
    assert backend.last is not None and backend.last.state == "RUNNING", backend.last
    lines = calls.read_text().splitlines()
    assert lines == ["scontrol --oneliner show job 42"] * polls, lines
