"""What every backend is: the :class:`Backend` protocol and the :class:`Handle` the run record stores.

A backend owns the whole remote side of a run: ``prepare`` (a frozen :class:`Handle`: what the run record
keeps to find the run's remote half again), the recovery policy it can follow, where preflight runs, start,
poll (once, or for a whole follow: :class:`Poller`), judge, stop and collect. The engine calls these and
nothing else; a new backend is one new module.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from launcher.exceptions import ConfigurationError
from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path
    from typing import IO, Self

    from launcher.backends.runner import PlaybookResult, PlaybookRunner
    from launcher.engine.plan import RunPlan
    from launcher.follow.verdict import Verdict
    from launcher.preflight.checks import NodeFacts, NodePath
    from launcher.rundir.runs import RunDir
    from launcher.spec.jobspec import JobSpec

# the run record's key holding the backend's handle (``kind`` and the handle's fields)
HANDLE_KEY = "handle"


@dataclasses.dataclass(frozen=True)
class Handle:
    """What a run's record keeps of its backend, so that ``status``, ``stop`` and ``logs`` reach the run's
    remote half after the launcher is gone. ``kind`` names the backend class that reads it back."""

    kind: ClassVar[str]
    backend: ClassVar[str]  # the run record's ``backend``: the name ``run --backend`` takes

    def stored(self) -> dict[str, Any]:
        """Return the handle as the run record stores it (``kind`` first)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}

    def record_fields(self) -> dict[str, Any]:
        """Return the run record's fields of a run prepared with this handle (``backend``, the handle, and
        what the backend shows besides)."""
        return {"backend": self.backend, HANDLE_KEY: self.stored()}


class RunNodes(Protocol):
    """A started run's nodes as a backend reaches them (:class:`launcher.engine.job.Job`, built from the
    record)."""

    @property
    def run(self) -> RunDir:
        """Return the run directory."""
        ...

    @property
    def runner(self) -> PlaybookRunner:
        """Return the run's own ansible-runner wrapper."""
        ...

    @property
    def hosts(self) -> list[str]:
        """Return the run's nodes, in rank order."""
        ...

    @property
    def stop_grace_s(self) -> int:
        """Return the seconds a trainer has between SIGTERM and SIGKILL."""
        ...

    @property
    def dump_stacks_on_stop(self) -> bool:
        """Return True when the stop dumps every trainer's stacks first (a stalled run)."""
        ...

    @property
    def node_judge(self) -> Callable[[dict[str, contract.NodeStatus]], Verdict]:
        """Return the judge of the nodes' states (the ssh backend's verdict)."""
        ...

    @property
    def base_vars(self) -> dict[str, Any]:
        """Return the extra vars every run playbook takes."""
        ...


class Poller(Protocol):
    """How a follow polls a run's nodes, from its first poll to its end (:meth:`Backend.poller`)."""

    def poll(self) -> dict[str, contract.NodeStatus]:
        """Return host -> the node agent's status."""
        ...

    def close(self) -> None:
        """End whatever polls between two polls (the follow is over)."""
        ...


class PollEach:
    """A poller that runs the backend's one-shot poll at every poll."""

    def __init__(self, poll: Callable[[], dict[str, contract.NodeStatus]]) -> None:
        self._poll = poll

    def poll(self) -> dict[str, contract.NodeStatus]:
        """Return host -> the node agent's status, from one poll playbook."""
        return self._poll()

    def close(self) -> None:
        """Nothing runs between two polls."""


class Preflight(Protocol):
    """:func:`launcher.preflight.checks.run_preflight`, as the engine hands it to
    :meth:`Backend.preflight`."""

    def __call__(
        self,
        runner: PlaybookRunner,
        spec: JobSpec,
        run_id: str,
        *,
        output_dir: str | None = None,
        checkpoints_of: str | None = None,
        requires: Sequence[NodePath] = (),
    ) -> NodeFacts:
        """Run preflight on ``spec``'s hosts; return their facts."""
        ...


class Backend(abc.ABC):
    """The remote side of a run: prepare, preflight, start, poll, judge, stop and collect.

    An abstract base: each backend writes what differs; what they share is written here once (preflight
    on every node of the job).
    """

    name: ClassVar[str]

    @classmethod
    @abc.abstractmethod
    @abc.abstractmethod
    def inventory_fields(cls, inventory: Mapping[str, Any], where: str) -> dict[str, Any]:
        """Return what the backend reads from the inventory (``ansible-inventory --list``) for the record."""
        ...

    @classmethod
    @abc.abstractmethod
    @abc.abstractmethod
    def takes(cls, spec: JobSpec) -> bool:
        """Return True when the backend can run ``spec`` (False: ``run`` refuses it before anything)."""
        ...

    @classmethod
    @abc.abstractmethod
    @abc.abstractmethod
    def prepare(
        cls, spec: JobSpec, chosen: Mapping[str, Any], where: Path, run_id: str, *, resume: bool
    ) -> Handle:
        """Return the run's handle (``chosen``: :meth:`inventory_fields`); bad input raises, one line."""
        ...

    @classmethod
    @abc.abstractmethod
    @abc.abstractmethod
    def from_handle(cls, handle: Handle) -> Self:
        """Return the backend of a run prepared with ``handle``."""
        ...

    @classmethod
    @abc.abstractmethod
    @abc.abstractmethod
    def recovery(cls, spec: JobSpec, where: Path, *, detach: bool, out: IO[str]) -> bool:
        """Return True when the launcher retries failed attempts; refuse (one line) a policy the backend
        cannot follow; note when the default one is off."""
        ...

    def preflight(
        self,
        run_preflight: Preflight,
        runner: PlaybookRunner,
        spec: JobSpec,
        run_id: str,
        *,
        output_dir: str | None,
        checkpoints_of: str | None,
        requires: Sequence[NodePath],
    ) -> NodeFacts:
        """Run preflight where the backend reaches; return the facts the plan is made from (by default: on
        every node of the job)."""
        return run_preflight(
            runner, spec, run_id, output_dir=output_dir, checkpoints_of=checkpoints_of, requires=requires
        )

    @abc.abstractmethod
    def start(
        self, runner: PlaybookRunner, run: RunDir, plan: RunPlan, launch_vars: Mapping[str, Any]
    ) -> PlaybookResult:
        """Start the trainers (or hand them to the scheduler); per-host ``start`` reports and failures."""
        ...

    @abc.abstractmethod
    def started(self, plan: RunPlan) -> tuple[str, str]:
        """Return the line said once started ('' for none) and the MASTER_ADDR the start line shows."""
        ...

    @abc.abstractmethod
    def poll(self, job: RunNodes) -> dict[str, contract.NodeStatus]:
        """Return host -> the node agent's status (one poll: ``status``, a settled look after a failure)."""
        ...

    @abc.abstractmethod
    def poller(self, job: RunNodes, interval_s: float) -> Poller:
        """Return the poller of a follow that polls every ``interval_s`` seconds."""
        ...

    @abc.abstractmethod
    def judge(self, job: RunNodes) -> Callable[[dict[str, contract.NodeStatus]], Verdict]:
        """Return the function that turns one poll's node states into the run's state."""
        ...

    @abc.abstractmethod
    def stop(self, job: RunNodes) -> PlaybookResult:
        """Stop every trainer of the run; per-host ``stop`` reports (what is left)."""
        ...

    @abc.abstractmethod
    def collect(self, job: RunNodes, *, lease_argv: Sequence[str] = ()) -> PlaybookResult:
        """Fetch every node's logs, state and metrics into ``nodes/<host>/``; per-host ``collect`` reports.

        ``lease_argv``: the node program's ``lease`` arguments, run on each node after its collect (the run's
        finish gives the GPU lease back in the same playbook: launcher/engine/lease.py); per-host ``lease``
        reports. Only a backend that leases is ever given them."""
        ...


def recovery_or_note(spec: JobSpec, where: Path, why: str, out: IO[str]) -> bool:
    """Return whether the launcher retries: the job spec's policy, unless ``why`` says it cannot; then a
    policy the job spec names is refused (one line), the default one noted as off."""
    if not why or not spec.recovery.enabled:
        return spec.recovery.enabled
    if "recovery" in spec.model_fields_set:
        raise ConfigurationError.at(
            where, "recovery", f"{why}; set recovery.max_restarts: 0, or follow it over ssh", "recovery"
        )
    print(f"note: recovery off: {why}; the first failure ends the run", file=out)
    return False
