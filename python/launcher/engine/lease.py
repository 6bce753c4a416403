"""The per-node GPU lease: a run holds each node's GPUs from just before its start to its end.

The first attempt's launch playbook takes a lease on every node before it starts any trainer
(``playbooks/launch.yml``, the node program's ``lease``, ``node/lease.py``; :class:`LeaseRequest`): a JSON
file beside the node's runs root (:func:`lease_file`) naming the run id, the user, the controller host, the
launcher's pid and when it was taken. A node leased by another live run refuses the whole run in one line
naming that run and its owner (the leases taken on the other nodes are given back, nothing starts); a stale
lease (its run ended on the node, or no process of its run is left there and it is older than
:data:`STALE_S`) is taken over and said so; ``run --force`` takes over a live one. The lease is given back by
the run's finish (``run``, ``status`` of a run nobody follows, ``stop``), in its collect playbook
(``collect.yml`` runs the node program's ``lease release`` after packing the logs). No playbook of its own
either way (``playbooks/lease.yml`` only where a node did not answer). The ssh backend only: under Slurm the
scheduler owns the GPUs. docs/launcher.md "GPU lease".
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import time
from dataclasses import dataclass
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


@dataclass(frozen=True)
class LeaseRequest:
    """The lease a run's first start takes: the launch playbook takes it on every node before it starts any
    trainer (``launch.yml``: one node leased by another live run starts nothing anywhere, and the leases taken
    on the others are given back in the same playbook)."""

    lease: dict[str, Any]
    force: bool = False

    @classmethod
    def for_run(cls, run_id: str, *, force: bool) -> LeaseRequest:
        """Return this launcher's lease request for ``run_id`` (``force``: take over a live one)."""
        return cls(this_lease(run_id), force)

    def extravars(self) -> dict[str, Any]:
        """The launch playbook's view: the node program's ``lease`` arguments that take it, and those that
        give it back where another node refused."""
        take = ["take", lease_file(), layout().runs_root, json.dumps(self.lease), f"{STALE_S:g}"]
        return {
            "mift_lease_argv": take + (["--force"] if self.force else []),
            "mift_lease_undo_argv": release_argv(str(self.lease["run_id"])),
        }


def accept(  # noqa: PLR0917 - the launch's parts
    request: LeaseRequest,
    runner: PlaybookRunner,
    run: RunDir,
    launch: PlaybookResult,
    hosts: Sequence[str],
    out: IO[str],
) -> None:
    """Read the launch playbook's ``lease`` answers: record the lease (and say each stale one taken over), or
    refuse the run in one line naming the run that holds a node (nothing was started)."""
    answers = {h: launch.report(h, "lease") for h in hosts}
    taken = [h for h, a in answers.items() if isinstance(a, dict) and a.get("taken")]
    busy = {h: a["holder"] for h, a in answers.items() if isinstance(a, dict) and not a.get("taken")}
    if busy:  # the playbook gave the others back and started nothing
        held = next(iter(busy.values()))
        raise JobFailedError(
            f"{', '.join(busy)}: GPUs leased by {holder_words(held)}; wait for it to end, stop it (launcher "
            f"stop {held.get('run_id')}) or take the lease over with run --force"
        )
    missing = [h for h in hosts if h not in taken]
    if missing:  # a node did not answer: the play stopped everywhere before any start
        if taken:
            release_leases(runner, run.run_id, taken)
        host = missing[0]
        raise JobFailedError(
            f"{host}: GPU lease: {launch.failures.get(host) or 'no answer'}; nothing was started"
        )
    for host, answer in answers.items():  # every host answered: taken
        if answer.get("took_over"):
            print(
                f"{host}: took over the GPU lease of {holder_words(answer['took_over'])}: "
                f"{answer.get('why')}",
                file=out,
                flush=True,
            )
    run.update(
        lease={
            **request.lease,
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
