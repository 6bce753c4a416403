"""The per-node GPU lease: a run holds each node's GPUs from just before its start to its end.

Before the first attempt starts, ``run`` takes a lease on every node (``playbooks/lease.yml``,
``node/lease.py``): a JSON file beside the node's runs root (:func:`lease_file`) naming the run id, the
user, the controller host, the launcher's pid and when it was taken. A node leased by another live run
refuses the whole run in one line naming that run and its owner (the leases taken on the other nodes are
given back); a stale lease (its run ended on the node, or no process of its run is left there and it is
older than :data:`STALE_S`) is taken over and said so; ``run --force`` takes over a live one. The lease is
given back by the run's finish (``run``, ``status`` of a run nobody follows, ``stop``), in its collect
playbook (``collect.yml`` runs the node program's ``lease release`` after packing the logs: no playbook of
its own). The ssh backend only: under Slurm the scheduler owns the GPUs. docs/launcher.md "GPU lease".
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from pathlib import PurePosixPath
from typing import IO, TYPE_CHECKING, Any

from launcher.exceptions import JobFailedError
from launcher.spec.nodelayout import layout

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.backends.runner import PlaybookResult, PlaybookRunner
    from launcher.rundir.runs import RunDir

LEASE_NAME = "gpu-lease.json"
# a lease with no process of its run on the node is stale this long after it was taken: longer than a start
# takes (staging, tokenizing and the trainers' start run between the lease and the first process)
STALE_S = 900.0
LEASING_BACKENDS = (None, "ssh")  # the backends whose nodes the launcher leases (Slurm allocates GPUs itself)


def lease_file() -> str:
    """Return the node path of the lease: beside the layout's runs root (``/var/lib/mift/gpu-lease.json``)."""
    return str(PurePosixPath(layout().runs_root).parent / LEASE_NAME)


def this_lease(run_id: str) -> dict[str, Any]:
    """Return this run's lease: run id, user, controller host, launcher pid, when."""
    return {
        "run_id": run_id,
        "user": getpass.getuser(),
        "controller": socket.gethostname(),
        "pid": os.getpid(),
        "started_at": round(time.time(), 3),
    }


def holder_words(held: Mapping[str, Any]) -> str:
    """Return ``run R of user@controller (pid P, since HH:MM:SS)``."""
    since = time.strftime("%H:%M:%S", time.localtime(float(held.get("started_at") or 0)))
    return (
        f"run {held.get('run_id')} of {held.get('user')}@{held.get('controller')} "
        f"(pid {held.get('pid')}, since {since})"
    )


def _answers(runner: PlaybookRunner, hosts: Sequence[str], argv: list[str]) -> dict[str, dict[str, Any]]:
    result = runner.run(
        "lease",
        {"mift_hosts": ",".join(hosts), "mift_lease_argv": argv},
        cancellable=False,
    )
    answers: dict[str, dict[str, Any]] = {}
    for host in hosts:
        answer = result.report(host, "lease")
        if not isinstance(answer, dict):
            raise JobFailedError(f"{host}: GPU lease: {result.failures.get(host) or 'no answer'}")
        answers[host] = answer
    return answers


def take_leases(
    runner: PlaybookRunner, run: RunDir, hosts: Sequence[str], *, force: bool, out: IO[str]
) -> None:
    """Lease every node's GPUs for ``run``, or refuse the run in one line naming the run that holds one."""
    lease = this_lease(run.run_id)
    argv = ["take", lease_file(), layout().runs_root, json.dumps(lease), f"{STALE_S:g}"]
    answers = _answers(runner, hosts, argv + (["--force"] if force else []))
    busy = {h: a["holder"] for h, a in answers.items() if not a.get("taken")}
    if busy:
        taken = [h for h, a in answers.items() if a.get("taken")]
        if taken:
            release_leases(runner, run.run_id, taken)
        held = next(iter(busy.values()))
        raise JobFailedError(
            f"{', '.join(busy)}: GPUs leased by {holder_words(held)}; wait for it to end, stop it (launcher "
            f"stop {held.get('run_id')}) or take the lease over with run --force"
        )
    for host, answer in answers.items():
        if answer.get("took_over"):
            print(
                f"{host}: took over the GPU lease of {holder_words(answer['took_over'])}: "
                f"{answer.get('why')}",
                file=out,
                flush=True,
            )
    run.update(
        lease={
            **lease,
            "file": lease_file(),
            "hosts": list(hosts),
            "took_over": {
                h: {"run_id": a["took_over"].get("run_id"), "why": a.get("why")}
                for h, a in answers.items()
                if a.get("took_over")
            },
        }
    )


def release_argv(run_id: str) -> list[str]:
    """Return the node program's ``lease`` arguments that give the run's lease back."""
    return ["release", lease_file(), run_id]


def released(result: PlaybookResult, hosts: Sequence[str]) -> list[str]:
    """Return the hosts whose ``lease`` answer in ``result`` says the lease was given back."""
    answers = ((h, result.report(h, "lease")) for h in hosts)
    return [h for h, a in answers if isinstance(a, dict) and a.get("released")]


def release_leases(runner: PlaybookRunner, run_id: str, hosts: Sequence[str]) -> list[str]:
    """Give back the run's lease on ``hosts`` through the lease playbook (a refused run's, on the nodes it
    took; a finished run's goes with its collect: :func:`release_argv`); a node leased by another run since
    keeps its. Return the hosts whose lease was given back; a node that does not answer keeps the lease until
    it is stale."""
    result = runner.run(
        "lease", {"mift_hosts": ",".join(hosts), "mift_lease_argv": release_argv(run_id)}, cancellable=False
    )
    return released(result, hosts)
