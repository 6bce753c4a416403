"""What one follow-loop poll costs the controller: the launcher's poll playbook next to the alternative.

The follow loop polls every node's agent every ``poll_interval_s`` (2 s by default) through
``playbooks/poll.yml`` (ansible-runner, one ansible-playbook run per poll), for as long as a run lasts: on a
controller that also runs other things (CI's 2 cores, a login node), its CPU is the run's steady cost.
This bench runs, alternately and ``--repeat`` times each, the launcher's poll playbook
(``ansible.builtin.raw``: only the agent runs on the node) and the one it replaced
(``ansible.builtin.command``: a module payload built on the controller and started in its own python3 on
every node), through the launcher's own runner, against ``--hosts`` nodes, and prints the CPU seconds (this
process and its children: ansible-playbook, its workers and what they start) and the wall time per poll,
with the medians side by side, and checks that both returned the same node states.

The nodes: ``ansible_connection: local`` "hosts" on this machine, each with its own runs root holding a run
folder with the real node agent and a state file (over ssh a node would also save the python3 start that
the command module adds there; that is not measured here).

    python bench/poll_cost.py [--hosts 2] [--repeat 10]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
from launcher.backends.agent import POLL_TIMEOUT_S, nodes_from  # noqa: E402
from launcher.backends.runner import PlaybookRunner  # noqa: E402
from launcher.spec.repo import PLAYBOOK_DIR  # noqa: E402
from launcher.transfer import nodeprogram  # noqa: E402

# what launch.yml's install puts into a node's run folder for the agent: the node program
AGENT_FILES = [nodeprogram.program_file()]
RUN_ID = "poll-bench"


def command_variant(work: Path) -> Path:
    """Write the poll playbook as it was before (the agent under ``ansible.builtin.command``); return it."""
    text = (PLAYBOOK_DIR / "poll.yml").read_text()
    start = text.index("    # raw, not command")
    end = text.index("    - name: Hand the status")
    old = """    - name: Ask the node agent for the trainer's state
      ansible.builtin.command:
        argv: ["python3", "{{ __mift_run_dir }}/mift_node.pyz", "agent", "status", "{{ __mift_run_dir }}"]
      register: __mift_status
      changed_when: false
      check_mode: false
      timeout: "{{ mift_poll_timeout_s | default(8) | int }}"

"""
    path = work / "poll_command.yml"
    path.write_text(text[:start] + old + text[end:])
    return path


def local_nodes(work: Path, hosts: int) -> tuple[Path, list[str]]:
    """Write ``hosts`` local-connection nodes, each with a run folder (agent, job.json, a state); return the
    inventory and the host names."""
    names = [f"n{i}" for i in range(hosts)]
    lines = ["all:", "  hosts:"]
    for name in names:
        run = work / name / RUN_ID
        run.mkdir(parents=True)
        for source in AGENT_FILES:
            (run / "mift_node.pyz").write_bytes(source.read_bytes())
        (run / "job.json").write_text(json.dumps({"run_id": RUN_ID, "expect_outputs": []}))
        (run / "state.json").write_text(json.dumps({"state": "exited", "rc": 0}))
        lines.append(f"    {name}: {{mift_runs_root: {json.dumps(str(work / name))}}}")
    lines += ["  vars: {ansible_connection: local, ansible_python_interpreter: /usr/bin/python3}"]
    inventory = work / "hosts.yml"
    inventory.write_text("\n".join(lines) + "\n")
    return inventory, names


def cpu_s() -> float:
    """CPU seconds of this process and its waited-for children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def poll_once(
    runner: PlaybookRunner, playbook: str, hosts: list[str]
) -> tuple[float, float, dict[str, object]]:
    """Run one poll; return (CPU s, wall s, host -> state)."""
    extravars = {"mift_hosts": ",".join(hosts), "mift_run_id": RUN_ID, "mift_poll_timeout_s": POLL_TIMEOUT_S}
    c0, t0 = cpu_s(), time.monotonic()
    result = runner.run(playbook, extravars, keep_events=False, ident="poll", timeout=60)
    cpu, wall = cpu_s() - c0, time.monotonic() - t0
    return cpu, wall, {h: s.get("state") for h, s in nodes_from(result, hosts).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="poll-bench.") as tmp:
        work = Path(tmp)
        inventory, hosts = local_nodes(work, args.hosts)
        runner = PlaybookRunner(work / "private", inventory=inventory)
        variants = {"raw (poll.yml)": "poll", "command (before)": str(command_variant(work))[:-4]}
        samples: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        states: dict[str, set[str]] = {k: set() for k in variants}
        poll_once(runner, "poll", hosts)  # warm the page cache and ansible's own caches once
        for i in range(args.repeat):
            for label, playbook in variants.items():
                cpu, wall, nodes = poll_once(runner, playbook, hosts)
                samples[label].append((cpu, wall))
                states[label].add(json.dumps(nodes, sort_keys=True))
                print(f"{i + 1:3d} {label:18s} cpu {cpu:5.2f} s  wall {wall:5.2f} s  {nodes}", flush=True)
        print(f"\n{args.hosts} nodes, {args.repeat} polls each, medians (os.cpu_count()={os.cpu_count()}):")
        print(f"{'playbook':20s} {'CPU s/poll':>11s} {'wall s/poll':>12s}")
        for label, rows in samples.items():
            cpu = statistics.median(r[0] for r in rows)
            wall = statistics.median(r[1] for r in rows)
            print(f"{label:20s} {cpu:11.2f} {wall:12.2f}")
        same = states["raw (poll.yml)"] == states["command (before)"]
        answered = all('"finished"' in s and "absent" not in s for s in states["raw (poll.yml)"])
        print(f"same node states from both: {same} ({sorted(states['raw (poll.yml)'])})")
        if not answered:
            print("poll_cost: error: the agents did not report the state written for them (finished)")
        return 0 if same and answered else 1


if __name__ == "__main__":
    sys.exit(main())
