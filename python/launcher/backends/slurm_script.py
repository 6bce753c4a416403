"""The Slurm backend's pure parts: the sbatch script, what ``scontrol``/``sinfo`` print, the partition check.

No I/O here (unit-tested on their own): :mod:`launcher.backends.slurm` runs them through the playbooks.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.node import contract

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from launcher.spec.jobspec import JobSpec, SlurmOptions

# JobState values (squeue/scontrol): still to start, running, or ended (docs/slurm.md "States")
QUEUED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
ACTIVE = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"})
# ended: COMPLETED, or one of these (failed with Slurm's reason, or stopped when the launcher cancelled it)
ENDED_BADLY = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)
FIELD_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=(\S*)")
# the batch script's exit status when Slurm restarted it past the recovery policy's max_restarts, and when the
# restart found no node able to say which checkpoints it holds
BUDGET_EXIT = 4
RESUME_EXIT = 5
# the batch script's lines in slurm.out that the node agent reads back (``mift_agent.requeue_causes``)
ATTEMPT_LINE = "mift: attempt"


@dataclass(frozen=True)
class Requeue:
    """How the batch script recovers (docs/slurm.md "Requeue"): Slurm requeues the job on node failure and
    preemption (``--requeue``), the script requeues itself ``before_s`` seconds before its time limit (0:
    never), and a restart past ``max_restarts`` ends the job; each restart resumes from the last checkpoint
    complete on every node."""

    max_restarts: int
    before_s: int


@dataclass(frozen=True)
class Allocation:
    """What the sbatch script asks for and runs."""

    run_id: str
    run_dir: str  # the node run directory (same path on every node; the batch output goes there)
    nodes: tuple[str, ...]  # Slurm node names = the inventory names of the job's hosts, rank order
    gpus_per_node: int
    stop_grace_s: int
    options: SlurmOptions
    # login host only: run_dir is the run's shared folder, ``nodes`` are ranks (rank0, ...) whose folders are
    # under it; Slurm picks the nodes (no --nodelist) and each checks itself before any trainer starts
    ranks: bool = False
    # None: the job is never requeued (``--no-requeue``, whatever the cluster's JobRequeue says)
    requeue: Requeue | None = None


def requeue_for(spec: JobSpec) -> Requeue | None:
    """Return how the job's batch script recovers, from its recovery policy: None (never requeued) when the
    policy allows no restart or in the login-host-only mode (not built there)."""
    policy = spec.recovery
    if spec.slurm.login_only or policy.max_restarts == 0 or "node_lost" not in policy.retry_on:
        return None
    return Requeue(policy.max_restarts, spec.slurm.requeue_before_s)


def requeue_refusal(spec: JobSpec) -> str:
    """Return why the job's recovery policy cannot work under Slurm ('' when it can): Slurm's requeue, the
    only way a batch job restarts, also requeues on node failure, so a policy that retries (max_restarts > 0)
    without node_lost cannot be followed; nor can one in the login-host-only mode."""
    policy = spec.recovery
    if policy.max_restarts == 0:
        return ""
    if spec.slurm.login_only:
        return "Slurm requeue is not built for the login-host-only mode (slurm.shared_dir)"
    if "node_lost" not in policy.retry_on:
        return (
            "a Slurm job restarts only through a requeue, which node failure and preemption trigger too: "
            "add node_lost to recovery.retry_on"
        )
    return ""


def time_limit_s(text: str) -> int:
    """Return the seconds of a Slurm ``--time`` (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS)."""
    days, _, clock = text.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    if days:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
        return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if len(parts) == 1:  # minutes
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def requeue_too_early(spec: JobSpec) -> str:
    """Return why the job's time-limit requeue cannot work ('' when it can): a ``requeue_before_s`` not below
    the job's ``time_limit`` requeues the job as soon as it starts, every attempt."""
    requeue = requeue_for(spec)
    limit = spec.slurm.time_limit
    if requeue is None or not requeue.before_s or limit is None or requeue.before_s < time_limit_s(limit):
        return ""
    return (
        f"slurm.requeue_before_s: {requeue.before_s} s is not below slurm.time_limit {limit} "
        f"({time_limit_s(limit)} s): every attempt would requeue itself at its start; lower requeue_before_s "
        "(0: no requeue at the time limit) or set recovery.max_restarts: 0"
    )


def sbatch_script(alloc: Allocation) -> str:
    """Return the batch script: one task per node, the node agent's ``slurm-step`` in each task (login host
    only: first the agent's ``slurm-check`` in each task, and a node that fails it ends the job)."""
    opts = alloc.options
    first_dir = f"{alloc.run_dir}/rank0" if alloc.ranks else alloc.run_dir
    lines = [
        "#!/bin/bash",
        f"# launcher run {alloc.run_id}: written by python -m launcher (slurm backend); docs/slurm.md",
        f"#SBATCH --job-name=mift-{alloc.run_id}",
        f"#SBATCH --nodes={len(alloc.nodes)}",
        "#SBATCH --ntasks-per-node=1",
        *([] if alloc.ranks else [f"#SBATCH --nodelist={','.join(alloc.nodes)}"]),
        f"#SBATCH --chdir={alloc.run_dir}",
        f"#SBATCH --output={first_dir}/slurm.out",
    ]
    if alloc.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={alloc.gpus_per_node}")
    if opts.time_limit:
        lines.append(f"#SBATCH --time={opts.time_limit}")
    if opts.partition:
        lines.append(f"#SBATCH --partition={opts.partition}")
    if opts.account:
        lines.append(f"#SBATCH --account={opts.account}")
    if alloc.requeue is None:
        lines.append("#SBATCH --no-requeue")
    else:
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
        if alloc.requeue.before_s:
            lines.append(f"#SBATCH --signal=B:USR1@{alloc.requeue.before_s}")
    # the node program in the run directory (the launch playbook's install put it there), its agent
    agent = shlex.quote(f"{alloc.run_dir}/{contract.PROGRAM_FILE}") + " agent"
    tasks = f"--nodes={len(alloc.nodes)} --ntasks={len(alloc.nodes)} --ntasks-per-node=1"
    root = shlex.quote(alloc.run_dir)
    lines.append("set -u")
    if alloc.ranks:
        lines += [
            "# every node checks itself first (its rank's folder on the shared file system); one that",
            "# cannot run its rank records why there and the job ends before any trainer starts",
            f"srun --kill-on-bad-exit=1 {tasks} python3 {agent} slurm-check {root} || exit 3",
        ]
    step = (
        f"srun --kill-on-bad-exit=1 {tasks} python3 {agent} slurm-step {root} --grace {alloc.stop_grace_s}"
        + (" --ranks" if alloc.ranks else "")
    )
    if alloc.requeue is None:
        lines += ["# one trainer per node; a node whose trainer fails ends the whole job", f"exec {step}", ""]
        return "\n".join(lines)
    return "\n".join([*lines, *_requeue_lines(alloc.requeue, agent, root, tasks, step), ""])


def _requeue_lines(requeue: Requeue, agent: str, root: str, tasks: str, step: str) -> list[str]:
    """Return the batch script's body when the job is requeued: count the attempt, stop past the retry budget,
    find the last checkpoint complete on every node on a restart, requeue before the time limit."""
    most = requeue.max_restarts
    lines = [
        '# recovery (docs/slurm.md "Requeue"): Slurm requeues this job on node failure and preemption'
        + (", the USR1 trap below" if requeue.before_s else "")
        + ";",
        "# a restart resumes from the last checkpoint complete on every node",
        "restarts=${SLURM_RESTART_COUNT:-0}",
    ]
    if requeue.before_s:
        lines += [
            "# first, before anything that takes time: Slurm's USR1 may come at once (an attempt that starts",
            "# within before_s of its time limit), and an untrapped USR1 ends the batch shell",
            "# shellcheck disable=SC2317  # run by the trap",
            "at_time_limit() {",
            f'  if [ "$restarts" -lt {most} ]; then',
            f'    echo "mift: time limit: requeued (restart $((restarts + 1)) of {most})"',
            '    scontrol requeue "$SLURM_JOB_ID"',
            "  else",
            f'    echo "mift: time limit: not requeued, the retry budget is used up ($restarts of {most} '
            'restarts)"',
            "  fi",
            "}",
            "trap at_time_limit USR1",
        ]
    lines += [
        f'echo "{ATTEMPT_LINE} $((restarts + 1)) of slurm job $SLURM_JOB_ID on $SLURM_JOB_NODELIST"',
        f'if [ "$restarts" -gt {most} ]; then',
        f'  echo "mift: not retried: the retry budget is used up ($restarts of {most} restarts)"',
        f"  exit {BUDGET_EXIT}",
        "fi",
        "resume=()",
        'if [ "$restarts" -gt 0 ]; then',
        "  # each node lists its complete checkpoints; the step is the newest one every node holds",
        f"  found=$(set -o pipefail; srun {tasks} python3 {agent} slurm-checkpoints {root} "
        f'| python3 {agent} resume-step {root} --nodes "$SLURM_JOB_NUM_NODES") || {{',
        '    echo "mift: restart $restarts: the nodes could not list their checkpoints"',
        f"    exit {RESUME_EXIT}",
        "  }",
        '  echo "mift: restart $restarts resumes from: $found"',
        '  resume=(--restart "$restarts" --resume-step "$found")',
        "fi",
    ]
    return [
        *lines,
        "# one trainer per node; a node whose trainer fails ends the whole job. In the background, so that",
        "# a signal's trap runs while the step does (bash runs one only between commands)",
        f'{step} "${{resume[@]}}" &',
        "task=$!",
        'wait "$task"',
        "rc=$?",
        'while kill -0 "$task" 2>/dev/null; do',
        '  wait "$task"',
        "  rc=$?",
        "done",
        'exit "$rc"',
    ]


def parse_fields(text: str) -> dict[str, str]:
    """Return the ``Key=Value`` fields of one ``scontrol --oneliner show ...`` line."""
    return {m.group(1): m.group(2) for m in FIELD_RE.finditer(text)}


@dataclass(frozen=True)
class SlurmJob:
    """One poll of the job in slurmctld."""

    job_id: str
    state: str  # JobState, or GONE when slurmctld no longer knows the job
    reason: str = ""
    exit_code: str = ""
    nodes: str = ""
    restarts: int = 0  # Restarts: how many times Slurm requeued the job (SLURM_RESTART_COUNT of its script)

    @classmethod
    def from_scontrol(cls, job_id: str, rc: int, stdout: str, stderr: str) -> SlurmJob:
        """Read ``scontrol --oneliner show job JOB_ID``: rc 0 and the fields, or an unknown job."""
        if rc != 0 or "JobState=" not in stdout:
            if "Invalid job id" in stderr or "Invalid job id" in stdout:
                return cls(job_id, "GONE", "slurmctld no longer knows the job")
            why = (stderr.strip() or stdout.strip() or f"rc={rc}").splitlines()[-1]
            return cls(job_id, "UNKNOWN", why)
        fields = parse_fields(stdout.splitlines()[0])
        reason = fields.get("Reason", "")
        return cls(
            job_id,
            fields.get("JobState", "UNKNOWN"),
            "" if reason == "None" else reason,
            fields.get("ExitCode", ""),
            fields.get("NodeList", ""),
            int(fields.get("Restarts", "0") or 0) if fields.get("Restarts", "0").isdigit() else 0,
        )

    def describe(self) -> str:
        """Return e.g. ``slurm job 7 PENDING (Resources)``."""
        extra = [x for x in (self.reason, f"ExitCode={self.exit_code}" if self.exit_code else "") if x]
        return f"slurm job {self.job_id} {self.state}" + (f" ({', '.join(extra)})" if extra else "")


# why an attempt of a requeued job ended (the node agent reads slurm.out: mift_agent.requeue_causes) -> the
# attempt's failure kind and reason in the run's record
REQUEUE_CAUSES: dict[str, tuple[str, str]] = {
    "node failure": ("node_lost", "a node failed; Slurm requeued the job"),
    "preemption": ("preempted", "preempted; Slurm requeued the job"),
    "time limit": ("timeout", "the time limit was near; the batch script requeued the job"),
    "requeue": ("requeued", "scontrol requeue"),
}
UNKNOWN_CAUSE = "Slurm requeued the job"


def requeued_attempts(  # noqa: PLR0917 - what one poll knows
    attempts: Sequence[Mapping[str, Any]],
    restarts: int,
    causes: Mapping[str, str],
    resumed: Mapping[int, int | None],
    max_restarts: int,
    now: float,
) -> list[dict[str, Any]]:
    """Return the run's attempts after a poll of a requeued job (pure; the record keeps the answer).

    Args:
        attempts: the record's attempts, oldest first (attempt 1 started by the launcher).
        restarts: Slurm's restart count (``Restarts=`` of ``scontrol show job``): attempt ``restarts + 1``
            runs.
        causes: attempt number (str) -> why it ended, from the batch output (``mift_agent.requeue_causes``).
        resumed: restart -> the checkpoint step its nodes resumed from (None: from the start).
        max_restarts: the recovery policy's.
        now: the poll's time; a requeue seen now ends the attempt before it and begins the next.
    """
    out = [dict(a) for a in attempts]
    if not out:
        return out
    while len(out) <= restarts:
        last = out[-1]
        number = int(last.get("attempt") or len(out))
        last.update(
            state="requeued",
            ended_at=round(now, 3),
            reason=UNKNOWN_CAUSE,
            decision=f"requeued: restart {number} of {max_restarts}; resumes from the last checkpoint "
            "complete on every node",
        )
        out.append(
            {
                "attempt": number + 1,
                "started_at": round(now, 3),
                "state": "running",
                "hosts": last.get("hosts"),
            }
        )
    for attempt in out:
        number = int(attempt.get("attempt") or 0)
        cause = causes.get(str(number))
        if attempt.get("state") == "requeued" and cause and attempt.get("reason") == UNKNOWN_CAUSE:
            kind, reason = REQUEUE_CAUSES.get(cause, ("requeued", cause))
            attempt.update(kind=kind, reason=reason)
        if number > 1 and number - 1 in resumed and "resume_step" not in attempt:
            attempt["resume_step"] = resumed[number - 1]
    return out


def budget_words(job: SlurmJob, max_restarts: int | None) -> str:
    """Return why a requeued job that ended badly was not requeued again ('' when that is not why)."""
    budget_exit = job.state == "FAILED" and job.exit_code.startswith(f"{BUDGET_EXIT}:")
    if max_restarts is None or job.restarts < max_restarts:
        return ""
    if not budget_exit and job.state not in {"TIMEOUT", "NODE_FAIL", "PREEMPTED"}:
        return ""
    used = min(job.restarts, max_restarts)  # Slurm may requeue past it: the script then exits at once
    return f"not requeued: the retry budget is used up ({used} of {max_restarts} restarts)"


@dataclass(frozen=True)
class Partition:
    """A partition as ``sinfo`` sees it: its name, node count and the fewest GPUs on one of its nodes."""

    name: str
    nodes: int
    gpus_per_node: int
    default: bool


def parse_sinfo(text: str) -> list[Partition]:
    """Read ``sinfo --noheader --format='%P|%D|%G'`` (one line per partition and GRES set)."""
    found: dict[str, Partition] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        name, count, gres = parts
        default = name.endswith("*")
        name = name.rstrip("*")
        gpus = _gpu_count(gres)
        if name in found:
            old = found[name]
            found[name] = Partition(name, old.nodes + int(count), min(old.gpus_per_node, gpus), old.default)
        else:
            found[name] = Partition(name, int(count), gpus, default)
    return list(found.values())


def _gpu_count(gres: str) -> int:
    total = 0
    for item in gres.split(","):
        m = re.match(r"^gpu(?::[^:(]+)?:(\d+)", item)
        if m:
            total += int(m.group(1))
    return total


def check_request(
    partitions: list[Partition], options: SlurmOptions, nodes: int, gpus_per_node: int, where: str
) -> Partition:
    """Return the partition the job goes to; raise ConfigurationError (one line) when it cannot fit."""
    if options.partition:
        chosen = next((p for p in partitions if p.name == options.partition), None)
        if chosen is None:
            known = ", ".join(p.name for p in partitions) or "none"
            raise ConfigurationError(
                f"{where}: slurm.partition: no partition {options.partition!r} (the cluster has: {known})"
            )
    else:
        chosen = next((p for p in partitions if p.default), None)
        if chosen is None:
            raise ConfigurationError(
                f"{where}: slurm.partition: the cluster has no default partition; name one"
            )
    if nodes > chosen.nodes:
        key = "slurm.nodes" if options.login_only else "hosts"
        raise ConfigurationError(
            f"{where}: {key}: the job asks for {nodes} nodes, partition {chosen.name!r} has {chosen.nodes}"
        )
    if gpus_per_node > chosen.gpus_per_node:
        raise ConfigurationError(
            f"{where}: slurm.gpus_per_node: the job asks for {gpus_per_node} GPUs per node, partition "
            f"{chosen.name!r} has {chosen.gpus_per_node} on its smallest node"
        )
    return chosen
