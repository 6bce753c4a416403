"""The Slurm backend's pure parts: the sbatch script, what ``scontrol``/``sinfo`` print, the partition check.

No I/O here (unit-tested on their own): :mod:`launcher.backends.slurm` runs them through the playbooks.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.exceptions import ConfigurationError

if TYPE_CHECKING:
    from launcher.jobspec import SlurmOptions

# JobState values (squeue/scontrol): still to start, running, or ended (docs/slurm.md "States")
QUEUED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
ACTIVE = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "RESIZING", "STOPPED"})
# ended: COMPLETED, or one of these (failed with Slurm's reason, or stopped when the launcher cancelled it)
ENDED_BADLY = frozenset(
    {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
)
FIELD_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=(\S*)")


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
    agent = shlex.quote(f"{alloc.run_dir}/mift_agent.py")
    tasks = f"--nodes={len(alloc.nodes)} --ntasks={len(alloc.nodes)} --ntasks-per-node=1"
    root = shlex.quote(alloc.run_dir)
    lines.append("set -u")
    if alloc.ranks:
        lines += [
            "# every node checks itself first (its rank's folder on the shared file system); one that",
            "# cannot run its rank records why there and the job ends before any trainer starts",
            f"srun --kill-on-bad-exit=1 {tasks} python3 {agent} slurm-check {root} || exit 3",
        ]
    lines += [
        "# one trainer per node; a node whose trainer fails ends the whole job",
        f"exec srun --kill-on-bad-exit=1 {tasks} python3 {agent} slurm-step {root} "
        f"--grace {alloc.stop_grace_s}" + (" --ranks" if alloc.ranks else ""),
        "",
    ]
    return "\n".join(lines)


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
        )

    def describe(self) -> str:
        """Return e.g. ``slurm job 7 PENDING (Resources)``."""
        extra = [x for x in (self.reason, f"ExitCode={self.exit_code}" if self.exit_code else "") if x]
        return f"slurm job {self.job_id} {self.state}" + (f" ({', '.join(extra)})" if extra else "")


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
