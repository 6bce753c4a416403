"""What following a run costs the controller: one playbook per poll (what the launcher does today) against one
playbook for the whole follow, whose status task loops (``until``/``retries``/``delay``) and hands each answer
to the caller as a ``runner_retry`` event (the design docs/measurements.md "CI A and B" weighs). Both through
ansible-runner, on 2 local-connection nodes, the same raw status command, the same number of answers:

    python bench/follow_loop_cost.py [--polls 20] [--interval 1]

Prints the controller CPU seconds (this process and its children) and the wall seconds of each, per poll.
The playbooks are this bench's own (a raw task standing in for ``mift_agent.py status``): it measures the
shape of the follow, not the launcher's code.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

STATUS = 'echo \'{"state": "running"}\''
INVENTORY = {
    "all": {
        "hosts": {"n0": {}, "n1": {}},
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3"},
    }
}


def cpu_s() -> float:
    """This process's and its reaped children's CPU seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def playbook(answers: int, delay: float) -> list[dict[str, Any]]:
    """The status task on every node; with ``answers`` > 1 it loops, never satisfied (``until: false``): the
    first attempt and ``retries`` more (ansible-core 2.19 counts them so)."""
    task: dict[str, Any] = {
        "name": "Ask for the status",
        "ansible.builtin.raw": STATUS,
        "register": "status",
        "changed_when": False,
    }
    if answers > 1:
        task.update(until="false", retries=answers - 1, delay=delay, ignore_errors=True)
    return [{"name": "Follow", "hosts": "all", "gather_facts": False, "tasks": [task]}]


def run(work: Path, answers: int, delay: float) -> int:
    """Run the playbook once; return the answers it handed back (ok and retry events with a stdout)."""
    got = 0

    def on_event(event: dict[str, Any]) -> bool:
        nonlocal got
        if event.get("event") in ("runner_retry", "runner_on_ok", "runner_on_failed"):
            got += "running" in str((event.get("event_data", {}).get("res") or {}).get("stdout", ""))
        return False

    pdd = Path(tempfile.mkdtemp(dir=work))
    ansible_runner.run(
        private_data_dir=str(pdd),
        playbook=playbook(answers, delay),
        inventory=str(work / "inventory.yml"),
        quiet=True,
        event_handler=on_event,
    )
    return got


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/follow_loop_cost.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=20, help="answers per node (default 20)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "inventory.yml").write_text(yaml.safe_dump(INVENTORY))
        rows = []
        c0, t0 = cpu_s(), time.monotonic()
        answers = 0
        for _ in range(args.polls):
            answers += run(work, 1, 0)
            time.sleep(args.interval)
        rows.append(("one playbook per poll", answers, cpu_s() - c0, time.monotonic() - t0))
        c0, t0 = cpu_s(), time.monotonic()
        answers = run(work, args.polls, args.interval)
        rows.append(("one playbook per follow", answers, cpu_s() - c0, time.monotonic() - t0))
    print(f"2 local nodes, {args.polls} polls each, {args.interval:g} s apart:")
    print(f"{'follow':26s} {'answers':>7s} {'CPU s':>7s} {'CPU s/poll':>10s} {'wall s':>7s}")
    for label, got, cpu, wall in rows:
        print(f"{label:26s} {got:7d} {cpu:7.2f} {cpu / args.polls:10.3f} {wall:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
