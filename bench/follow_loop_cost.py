"""What following a run costs the controller: the launcher's two ways to poll, side by side, through its own
code (launcher/runner.py) and playbooks, the node agent (mift_node.pyz agent status) answering on 2
local-connection nodes:

* one playbook per poll: ``poll_agents`` (playbooks/poll.yml), what ``launcher status`` and the Slurm
  backends run, and what a follow ran before;
* one playbook per follow: ``AgentStream`` (playbooks/poll_stream.yml), what a follow of the ssh backend runs:
  its task loops (``until: false``, ``delay``) and hands each answer over as a ``runner_retry`` event.

    .venv/bin/python bench/follow_loop_cost.py [--polls 20] [--interval 1]

Prints the controller CPU seconds (this process and its reaped children: ansible-playbook, its forks, the
agent) and the wall seconds of each, per poll, and how many answers each got.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from launcher.backends.agent import poll_agents
from launcher.backends.agent_stream import AgentStream
from launcher.backends.runner import PlaybookRunner
from launcher.transfer import nodeprogram

HOSTS = ["n0", "n1"]
RUN_ID = "bench-follow"


def cpu_s() -> float:
    """This process's and its reaped children's CPU seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class BenchJob:
    """The part of launcher.engine.job.Job the pollers use: its hosts, extra vars and runner."""

    def __init__(self, work: Path) -> None:
        inventory = work / "inventory.yml"
        local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        inventory.write_text(yaml.safe_dump({"all": {"hosts": {h: {} for h in HOSTS}, "vars": local}}))
        self.runner = PlaybookRunner(work / "ansible", inventory=inventory)
        self.hosts = list(HOSTS)
        self.base_vars: dict[str, Any] = {
            "mift_hosts": ",".join(HOSTS),
            "mift_run_id": RUN_ID,
            "mift_runs_root": str(work / "runs"),
        }
        run_dir = work / "runs" / RUN_ID
        run_dir.mkdir(parents=True)
        # the node program, as launch.yml's install puts it into a run directory
        shutil.copy(nodeprogram.program_file(), run_dir / "mift_node.pyz")


def answered(nodes: dict[str, Any]) -> int:
    """Return how many nodes gave an agent's answer (no trainer here: ``absent``)."""
    return sum(1 for n in nodes.values() if n.get("state") == "absent" and "error" not in n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/follow_loop_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=20, help="polls (default 20)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        job = BenchJob(Path(tmp))
        c0, t0 = cpu_s(), time.monotonic()
        got = 0
        for _ in range(args.polls):
            t = time.monotonic()
            got += answered(poll_agents(job))  # type: ignore[arg-type]
            time.sleep(max(0.0, args.interval - (time.monotonic() - t)))
        rows.append(("one playbook per poll", got, cpu_s() - c0, time.monotonic() - t0))
        c0, t0 = cpu_s(), time.monotonic()
        got = 0
        stream = AgentStream(job, args.interval)  # type: ignore[arg-type]
        try:
            for _ in range(args.polls):
                got += answered(stream.poll())
        finally:
            stream.close()
        rows.append(("one playbook per follow", got, cpu_s() - c0, time.monotonic() - t0))
    print(
        f"{len(HOSTS)} local nodes, {args.polls} polls, {args.interval:g} s apart (the node agent answers):"
    )
    print(f"{'follow':26s} {'answers':>7s} {'CPU s':>7s} {'CPU s/poll':>10s} {'wall s':>7s}")
    for label, n, cpu, wall in rows:
        print(f"{label:26s} {n:7d} {cpu:7.2f} {cpu / args.polls:10.3f} {wall:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
