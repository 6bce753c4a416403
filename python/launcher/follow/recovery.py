"""Recovery: which failure a run met, and whether the launcher starts another attempt.

Pure decisions, no I/O: :func:`classify` turns the follow loop's verdict and the last node states into a
:class:`Failure` of one kind; :func:`decide` says, from the job spec's ``recovery`` policy and the failures of
the earlier attempts, whether the run is retried (and after how long) or ends, and why, in one line. The
engine (``launcher.engine.attempts``) does the stopping, waiting and resuming.

Failure kinds (``FAILURE_KINDS``):

* ``node_lost`` -- a node stopped answering (``unreachable for N polls``) or its supervisor and trainer are
  gone (``trainer vanished``): a reboot, a network cut, a dead host.
* ``trainer_signal`` -- a trainer process was killed by a signal: the trainer's exit status is negative or
  128+N, or torchrun's report (the agent's ``rank_exits``) shows a rank's ``exitcode : -N``. A rank that
  torchrun itself stopped with SIGTERM after a sibling failed by itself (exit status > 0) is not one: every
  rank of a bad job raises, and torchrun stops those that have not raised yet (:func:`outside_signals`).
* ``gpu_error`` -- the node's GPU telemetry saw a GPU break (``gpu_fault``: an uncorrectable ECC count above
  the baseline's, a GPU gone), or the trainer log shows a GPU or collective error (``HIP error``, ``CUDA
  error``, ``hipError*``, ``NCCL``/``RCCL error``, an ECC error).
* ``stall`` -- the progress watchdog ended the attempt ``stalled`` (:func:`stall_failure`).
* ``oom`` -- out of memory: never retried as is (the same plan would run out again). With ``plan: auto`` (or
  ``probe``) and ``recovery.replan_oom`` (default on) the next attempt runs the next plan that fits with a
  larger margin (``launcher.planning.training.replan_after_oom``, done by the engine); ``oom`` cannot be named
  in ``retry_on``.
* ``trainer_error`` -- the trainer exited non-zero by itself (a Python error: a bug, a bad path).
  A rank whose collective broke under it because a peer went away (gloo's ``Connection closed by peer``,
  NCCL/RCCL's ``NCCL error in: ..., remote process exited or there was a network error`` and
  ``ncclRemoteError``) failed "by itself" too, never as a GPU error: it is the consequence of another node's
  failure, and must not exclude its healthy node nor outrank the cause (a rank killed on host2).
* ``start_failed`` -- the launch playbook failed on a node.
* ``incomplete_output`` -- every trainer ended but the first node's output_dir lacks the results.
* ``timeout`` -- the job spec's ``timeouts.job_s`` was reached.

Spares (``recovery.spares``, an inventory group, docs/launcher.md "Spares"): :func:`excluded_after` says which
node a failure excludes for the rest of the run (lost, a GPU error, or a second stall on it);
:func:`spare_candidates` lists the spares that may take its place, in inventory order; the engine preflights
the new node set with each in turn and the first that passes takes the excluded node's rank slots. None
passes: :func:`fewer_nodes_line` says, in one line, why the run does not go on with fewer nodes.

``NEVER_RETRIED``: a bad config and a validation or preflight failure are never retried (they cannot be named
in ``retry_on``): the same input fails the same way. Nor is ``socket_fallback``: the collectives fell back to
TCP sockets at run time where RDMA was expected and ``fabric.socket_fallback`` is ``fail``
(:mod:`launcher.fabric.runtime`): the same nodes choose the same transport again; the fabric needs fixing.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from launcher.fabric.runtime import FALLBACK_PHRASE
from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

FAILURE_KINDS: dict[str, str] = {
    "node_lost": "a node stopped answering or its trainer and supervisor vanished",
    "trainer_signal": "a trainer process was killed by a signal",
    "gpu_error": "a GPU or collective (HIP/CUDA/NCCL/RCCL) error",
    "stall": "the run stopped making progress (watchdog)",
    "oom": "out of memory",
    "trainer_error": "the trainer exited non-zero by itself",
    "start_failed": "the trainer did not start on a node",
    "incomplete_output": "the trainers ended without the expected outputs",
    "timeout": "the job's time limit (timeouts.job_s) was reached",
}
# failures no policy retries: the same input fails the same way
NEVER_RETRIED: dict[str, str] = {
    "config_error": "a bad job spec or config",
    "preflight": "a validation or preflight failure",
    "socket_fallback": "a fall-back to TCP sockets where RDMA was expected (fabric.socket_fallback: fail)",
}
# the job spec's defaults (launcher.spec.jobspec.RecoveryPolicy takes them from here): a long run on a cluster
# retries what a node or the hardware did to it, not what the job itself does wrong
DEFAULT_MAX_RESTARTS = 3
DEFAULT_RETRY_ON: tuple[str, ...] = ("node_lost", "trainer_signal", "stall", "gpu_error")
DEFAULT_BACKOFF_S = 30.0
DEFAULT_SAME_FAILURE_LIMIT = 2
# an out-of-memory failure of a plan the launcher chose (plan: auto/probe) is re-planned with a larger margin:
# a long run should not end because the planner's estimate was low when a smaller split of the same batch fits
DEFAULT_REPLAN_OOM = True
# failures that exclude their node for the rest of the run (with recovery.spares): a lost node or a broken GPU
# at once; a stall the second time on the same node (one stall may be the job's; two on one node, the node's)
EXCLUDE_AT_ONCE: tuple[str, ...] = ("node_lost", "gpu_error")
EXCLUDE_ON_REPEAT: tuple[str, ...] = ("stall",)
# a kind that retry_on cannot name, and why (the job spec refuses it in one line)
NOT_IN_RETRY_ON: dict[str, str] = {
    "oom": "out of memory is never retried as is (the same plan runs out again); with plan: auto, "
    "recovery.replan_oom (default true) re-plans it with a larger margin",
}
FIXED_PLAN_OOM = (
    "out of memory: a fixed plan (plan: as_written) would run out again; set plan: auto in the job spec to "
    "let the launcher re-plan with a larger margin (recovery.replan_oom)"
)

# priority when several nodes failed in one poll: the cause before its consequences (a rank killed on one
# node makes the ranks of the others fail with a collective error)
_PRIORITY = ("node_lost", "gpu_error", "oom", "trainer_signal", "stall", "trainer_error")
_SIGNAL_RE = re.compile(r"Signal (\d+) \((SIG[A-Z0-9]+)\) received|exitcode\s*:\s*-(\d+)")
_OOM_RE = re.compile(r"out of memory|OutOfMemoryError|MemoryError", re.IGNORECASE)
# a collective that broke because a peer went away (or the network): gloo's, and NCCL/RCCL's (torch's
# DistBackendError "NCCL error in: ..., remote process exited or there was a network error" + ncclRemoteError)
_PEER_RE = re.compile(
    r"Connection closed by peer|Connection reset by peer|ncclRemoteError|"
    r"remote process exited or there was a network error|remote process exiting prematurely"
)
_GPU_RE = re.compile(
    r"HIP error|CUDA error|hipError[A-Za-z]+|cudaError[A-Za-z]+|NCCL error|RCCL error|ncclInternalError|"
    r"ncclUnhandledCudaError|uncorrectable ECC|ECC error|GPU Hang|HW Exception",
)
_HOST_REASON_RE = re.compile(r"^([^:\s]+): (.*)$")


@dataclass(frozen=True)
class Failure:
    """One attempt's failure: its kind, the node it is blamed on ('' for the whole job) and the reason."""

    kind: str
    host: str
    reason: str

    @property
    def key(self) -> tuple[str, str]:
        """Return what makes two failures "the same": the kind and the node."""
        return (self.kind, self.host)


@dataclass(frozen=True)
class Decision:
    """Retry (after ``backoff_s`` seconds) or end the run; ``why`` is one line for the user and the record."""

    retry: bool
    why: str
    backoff_s: float = 0.0


def _node_text(node: contract.NodeStatus) -> str:
    lines = node.get("failure_lines")
    text = "\n".join(str(x) for x in lines) if isinstance(lines, list) else ""
    return f"{text}\n{node.get('log_tail') or ''}\n{node.get('reason') or ''}"


def _node_kind(node: contract.NodeStatus) -> str | None:  # noqa: PLR0911 - one return per kind
    """Return the failure kind one node's status shows, or None when it did not fail."""
    state = node.get("state")
    if state in (contract.UNREACHABLE, contract.VANISHED, contract.ABSENT):
        return "node_lost"
    if node.get("gpu_fault"):  # the supervisor stopped the trainer: a GPU broke (launcher.follow.telemetry)
        return "gpu_error"
    if state != contract.FAILED:
        return None
    text = _node_text(node)
    own = "\n".join(line for line in text.splitlines() if not _PEER_RE.search(line))  # the node's own errors
    if _GPU_RE.search(own):
        return "gpu_error"
    if _OOM_RE.search(own):
        return "oom"
    rc = node.get("rc")
    if isinstance(rc, int) and contract.killed_by_signal(rc):
        return "trainer_signal"
    exits = node.get("rank_exits")
    if isinstance(exits, list) and exits:  # torchrun's report: the rank exits decide, not its lines
        return "trainer_signal" if outside_signals(exits) else "trainer_error"
    return "trainer_signal" if _SIGNAL_RE.search(text) else "trainer_error"


def cause_order(node: contract.NodeStatus) -> int:
    """Return where a failed node's failure ranks as the cause of the others' (0 first, ``_PRIORITY``): a
    node lost, a GPU error, out of memory, a rank killed by a signal come before a rank that failed by itself,
    which is what its peers do when a collective breaks under them."""
    kind = _node_kind(node)
    return _PRIORITY.index(kind) if kind in _PRIORITY else len(_PRIORITY)


def outside_signals(exits: Sequence[Mapping[str, Any]]) -> list[int]:
    """Return the signals that killed ranks from outside, from torchrun's report (``rank_exits``: each failed
    rank's ``exitcode``, -N for signal N).

    When a rank fails, torchrun stops the node's other ranks with SIGTERM: with a rank that exited by itself
    (exit status > 0) in the report, its SIGTERMs are torchrun's. Any other signal (SIGKILL of the OOM killer,
    SIGSEGV, SIGBUS, SIGABRT), or a SIGTERM with no rank failing by itself, came from outside the job.
    """
    codes = [int(e.get("exitcode") or 0) for e in exits]
    by_itself = any(code > 0 for code in codes)
    return [-code for code in codes if code < 0 and not (by_itself and -code == signal.SIGTERM)]


def classify(  # noqa: PLR0911 - one return per kind the judge's line names
    reason: str, nodes: Mapping[str, contract.NodeStatus] | None = None
) -> Failure:
    """Return the failure behind a ``failed`` verdict (``reason``: the judge's line, ``nodes``: the last node
    states, host -> agent status with ``log_tail`` and ``failure_lines``).

    The judge names the first node it saw fail; when several failed, the kind is taken from every node, the
    cause first (``_PRIORITY``): a rank killed on host2 makes host1's rank fail with a collective error.
    """
    match = _HOST_REASON_RE.match(reason)
    host, what = (match.group(1), match.group(2)) if match else ("", reason)
    if reason.startswith("job_s timeout"):
        return Failure("timeout", "", reason)
    if "start failed" in what or reason == "launch playbook failed":
        return Failure("start_failed", host, reason)
    if "unreachable for" in what or "trainer vanished" in what:
        return Failure("node_lost", host, reason)
    if "output_dir lacks" in what:
        return Failure("incomplete_output", host, reason)
    if what.startswith(FALLBACK_PHRASE):
        return Failure("socket_fallback", host, reason)
    kinds = {h: k for h, k in ((h, _node_kind(n)) for h, n in (nodes or {}).items()) if k is not None}
    for kind in _PRIORITY:
        blamed = [h for h, k in kinds.items() if k == kind]
        if blamed:
            chosen = host if host in blamed else blamed[0]
            why = reason if chosen == host else f"{chosen}: {FAILURE_KINDS[kind]} ({reason})"
            return Failure(kind, chosen, why)
    if "rc=" in what:
        rc = re.search(r"rc=(-?\d+)", what)
        code = int(rc.group(1)) if rc else 1
        return Failure("trainer_signal" if contract.killed_by_signal(code) else "trainer_error", host, reason)
    return Failure("trainer_error", host, reason)


def stall_failure(reason: str, lagging: Sequence[str]) -> Failure:
    """Return the failure behind a ``stalled`` verdict (the progress watchdog): blamed on the one lagging
    node, else on none (every node at the same step: the stack dumps tell)."""
    return Failure("stall", lagging[0] if len(lagging) == 1 else "", reason)


class PolicyLike(Protocol):
    """What :func:`decide` reads of a recovery policy (``launcher.spec.jobspec.RecoveryPolicy``)."""

    @property
    def max_restarts(self) -> int: ...
    @property
    def retry_on(self) -> Sequence[str]: ...
    @property
    def backoff_s(self) -> float: ...
    @property
    def same_failure_limit(self) -> int: ...
    @property
    def replan_oom(self) -> bool: ...


def decide(
    policy: PolicyLike, earlier: Sequence[Failure], failure: Failure, *, replan: bool = False
) -> Decision:
    """Decide whether the run gets another attempt after ``failure``.

    Args:
        policy: the job spec's recovery policy.
        earlier: the failures of the attempts before this one, oldest first.
        failure: this attempt's failure.
        replan: the launcher chose the job's plan (``plan: auto`` or ``probe``), so it can choose another.
    """
    restarts = len(earlier)
    if failure.kind in NEVER_RETRIED:
        return Decision(False, f"not retried: {NEVER_RETRIED[failure.kind]} is never retried")
    if failure.kind == "oom":
        return _decide_oom(policy, restarts, replan=replan)
    if failure.kind not in policy.retry_on:
        listed = ", ".join(policy.retry_on) or "nothing"
        return Decision(False, f"not retried: {failure.kind} is not in recovery.retry_on ({listed})")
    same = 1
    for old in reversed(earlier):
        if old.key != failure.key:
            break
        same += 1
    if same >= policy.same_failure_limit:
        where = f" on {failure.host}" if failure.host else ""
        return Decision(
            False,
            f"not retried: {failure.kind}{where} {same} times in a row "
            f"(recovery.same_failure_limit {policy.same_failure_limit})",
        )
    if restarts >= policy.max_restarts:
        return Decision(
            False, f"not retried: the retry budget is used up ({restarts} of {policy.max_restarts} restarts)"
        )
    return Decision(
        True,
        f"retrying: {failure.kind} is in recovery.retry_on; restart {restarts + 1} of {policy.max_restarts} "
        f"in {policy.backoff_s:g} s",
        policy.backoff_s,
    )


def _decide_oom(policy: PolicyLike, restarts: int, *, replan: bool) -> Decision:
    """Out of memory: never the same plan again. Each re-planned attempt runs another plan, so the
    same-failure rule does not apply; the retry budget does, and the engine ends the run when nothing smaller
    fits."""
    if not replan:
        return Decision(False, f"not retried: {FIXED_PLAN_OOM}")
    if not policy.replan_oom:
        return Decision(False, "not retried: out of memory, and recovery.replan_oom is false")
    if restarts >= policy.max_restarts:
        return Decision(
            False, f"not retried: the retry budget is used up ({restarts} of {policy.max_restarts} restarts)"
        )
    return Decision(
        True,
        f"re-planning: out of memory under plan: auto, the next plan that fits with a larger margin; "
        f"restart {restarts + 1} of {policy.max_restarts} in {policy.backoff_s:g} s",
        policy.backoff_s,
    )


def excluded_after(failure: Failure, earlier: Sequence[Failure]) -> str | None:
    """Return the node ``failure`` excludes for the rest of the run, or None.

    A node that was lost (``node_lost``) or broke a GPU (``gpu_error``) is excluded at once; one that stalled
    (``stall`` blamed on it) the second time, at any distance (``earlier``: the earlier attempts' failures).
    A failure blamed on no node excludes none.
    """
    if not failure.host:
        return None
    if failure.kind in EXCLUDE_AT_ONCE:
        return failure.host
    if failure.kind in EXCLUDE_ON_REPEAT and any(old.key == failure.key for old in earlier):
        return failure.host
    return None


def spare_candidates(spares: Sequence[str], in_use: Sequence[str], excluded: Sequence[str]) -> list[str]:
    """Return the spares that may replace an excluded node, in inventory order: those neither running the
    job nor excluded (a spare that failed its preflight is excluded too)."""
    return [h for h in spares if h not in in_use and h not in excluded]


def replace_host(hosts: Sequence[str], gone: str, spare: str) -> list[str]:
    """Return ``hosts`` (rank order) with ``spare`` in ``gone``'s place: the same node rank and ranks."""
    return [spare if h == gone else h for h in hosts]


def fewer_nodes_line(gone: str, hosts: Sequence[str], nproc_per_node: int, tried: Mapping[str, str]) -> str:
    """Return the one line that ends a run which lost ``gone`` and has no spare that passed preflight.

    The launcher does not go on with fewer nodes: the same global batch on fewer ranks would resume a ZeRO
    checkpoint written by ``len(hosts) * nproc_per_node`` ranks on fewer, which needs DeepSpeed's universal
    checkpoint conversion (``ds_to_universal``) that the launcher does not do (docs/launcher.md "Spares").
    ``tried``: spare -> why it did not pass (none configured or left: empty).
    """
    spares = (
        "no spare passed preflight (" + "; ".join(f"{h}: {why}" for h, why in tried.items()) + ")"
        if tried
        else "no spare left in recovery.spares"
    )
    ranks = len(hosts) * nproc_per_node
    fewer = (len(hosts) - 1) * nproc_per_node
    return (
        f"not retried: {gone} is excluded and {spares}; not continuing on {len(hosts) - 1} node(s): the "
        f"checkpoint was written by {ranks} ranks, and the launcher resumes only at the world size it was "
        f"written with (a ZeRO checkpoint on {fewer} ranks needs DeepSpeed's universal checkpoint "
        "conversion, not done here)"
    )
