"""The controller/node contract of the launcher: what the controller sends a node and what the node answers.

Standard library only, and importable on its own: it is part of the node program (``mift_node.pyz``, in the
node run directory ``/var/lib/mift/runs/<run_id>/``), where the agent imports it with the node's ``python3``;
the launcher imports it as ``launcher.node.contract``. One definition for both sides:

* :class:`Job` (``job.json``): what the node agent runs;
* :class:`Bundle` (``bundle.json``, 0600, deleted once unpacked): the files, the job and the environment;
* :class:`NodeStatus`: the agent's answer to ``status`` (and inside ``collect``);
* :class:`StartResult`, :class:`StopResult`, :class:`CollectResult`: the answers of the other commands;
* :data:`NodeState` and its names (:data:`RUNNING`, ...): the states a node reports, and :data:`UNREACHABLE`,
  the controller's own word for a node that did not answer;
* :func:`node_status_from`, :func:`collect_result_from`: a node's answer checked once, where it arrives;
* the names of the files in a node run directory, and the marker every process of a run carries.

Python 3.10 (the nodes' ``python3``): no syntax or typing newer than that.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, TypedDict, cast

if TYPE_CHECKING:
    from collections.abc import Callable

# files of a node run directory
# the node programs, one file in the run directory (``python3 <run_dir>/mift_node.pyz agent ...``)
PROGRAM_FILE = "mift_node.pyz"
BUNDLE_FILE = "bundle.json"
JOB_FILE = "job.json"
ENV_FILE = "env.json"
STATE_FILE = "state.json"
TRAINER_LOG = "trainer.log"
PID_FILE = "trainer.pid"
RC_FILE = "rc"
STOP_FILE = "stop_requested"
COLLECT_ARCHIVE = "collect.tar.gz"
# every process of a run carries MARKER=<run_id>@<run_dir> in its environment
MARKER = "MIFT_AGENT_KEY"

# the states a node reports (NodeStatus.state); the JSON carries these strings
NodeState = Literal["absent", "queued", "starting", "running", "finished", "failed", "stopped", "vanished"]
ABSENT: Final = "absent"  # no trainer was started in this run directory
QUEUED: Final = "queued"  # waiting for its Slurm job step (the Slurm backends)
STARTING: Final = "starting"  # the supervisor is starting the trainer
RUNNING: Final = "running"
FINISHED: Final = "finished"  # the trainer exited 0
FAILED: Final = "failed"  # the trainer exited non-zero (rc), or its start failed
STOPPED: Final = "stopped"  # stopped on request (launcher stop, scancel)
VANISHED: Final = "vanished"  # the trainer and its supervisor are gone without a word
STATES: tuple[NodeState, ...] = (ABSENT, QUEUED, STARTING, RUNNING, FINISHED, FAILED, STOPPED, VANISHED)
FINAL_STATES: tuple[NodeState, ...] = (FINISHED, FAILED, STOPPED, VANISHED)  # they do not change any more
EXITED: Final = "exited"  # state.json only: the trainer exited; status reports FINISHED or FAILED by rc
# never written by a node: the controller's state of a node that gave no status (no answer in time, no ssh),
# and the prefix of the state it shows for every node while Slurm queues the job (pending(<reason>))
UNREACHABLE: Final = "unreachable"
PENDING: Final = "pending"


class Job(TypedDict):
    """``job.json``: the trainer a node runs (no secrets)."""

    run_id: str
    node_rank: int
    argv: list[str]
    output_dir: str
    expect_outputs: list[str]
    resume_from: str | None  # optional in job.json (None)
    telemetry_period_s: float  # optional in job.json (0: no GPU sampling); mift_gpu.Sampler


class Bundle(TypedDict):
    """``bundle.json``: one file per node with everything the launch playbook ships."""

    files: dict[str, str]  # plain file name -> text (the plan's bytes, UTF-8)
    job: Job
    env: dict[str, str]


class NodeStatus(TypedDict, total=False):
    """The agent's view of the run on one node (``status``), as the controller holds it.

    ``state``: a :data:`NodeState`; on the controller also :data:`UNREACHABLE` (with ``error`` when the poll
    said why) and, while Slurm queues the job, ``pending(<reason>)``.
    """

    run_id: str | None
    node_rank: int | None
    state: str
    error: str  # the controller's: why the node gave no status
    rc: int | None
    reason: str | None
    pid: int | None
    trainer_alive: bool
    started_at: float | None
    ended_at: float | None
    last_log: dict[str, Any]
    outputs: dict[str, bool]
    outputs_complete: bool
    output_dir: str
    processes: int | None  # None: read through a shared folder on another host (Slurm login host)
    slurm_node: str  # a Slurm task's placement: the node Slurm picked ...
    master_addr: str  # ... and the rendezvous address the allocation gave the trainers
    restart: int  # a requeued Slurm job: which restart this is, and the checkpoint step it resumed from
    resume_step: int | None
    requeues: dict[str, str]  # the node that ran the batch script of a requeued job: attempt -> cause
    watch: dict[str, Any]  # what the progress watchdog reads (ranks, their process states, checkpoints)
    ranks_joined: list[int]
    world_size: int | None
    teardown_abort: bool
    failure_lines: list[str]  # how the trainer failed (signal, OOM, GPU errors), for the launcher's recovery
    rank_exits: list[
        dict[str, int]
    ]  # torchrun's report: each failed rank's "rank" and "exitcode" (-N: signal)
    log_tail: str
    # the networks RCCL/NCCL chose in this start ("Using network X" lines: Socket, IB, IBext_v8, ...);
    # None: no rank printed the line (yet)
    net_transport: list[str] | None
    gpu: dict[str, Any] | None  # mift_gpu.summary of the latest GPU sample
    telemetry_warning: str | None  # the GPU tool failed or hung (printed once by the launcher)
    gpu_fault: str | None  # a GPU broke (new uncorrectable ECC error, GPU gone): the run fails


class StartResult(TypedDict, total=False):
    """``start``: ok once the trainer runs (or ended), the state file's fields."""

    ok: bool
    changed: bool
    state: str
    error: str


class StopResult(TypedDict, total=False):
    """``stop``: the pids killed and those still alive (``left``: must be empty)."""

    ok: bool
    changed: bool
    killed: list[int]
    left: list[int]
    state: str | None
    note: str


class CollectResult(TypedDict):
    """``collect``: the status, the output files (full node paths) and the archive to fetch."""

    ok: bool
    status: NodeStatus
    outputs: list[str]
    archive: str
    gpu_after: dict[str, Any] | None  # mift_gpu.after_check: the GPUs idle and healthy after the run


SHELL_SIGNAL_BASE: Final = 128  # a shell reports a process killed by signal N as exit status 128 + N


def killed_by_signal(rc: int) -> bool:
    """Return True for the exit status of a trainer killed by a signal (Python: -N; a shell: 128+N)."""
    return rc < 0 or rc >= SHELL_SIGNAL_BASE


class ContractError(ValueError):
    """A contract file that does not hold what the contract says."""


def job_from(data: object, where: str = JOB_FILE) -> Job:
    """Return ``data`` as a :class:`Job`; raise :class:`ContractError` naming the first bad field."""
    if not isinstance(data, dict):
        raise ContractError(f"{where}: not a JSON object")
    checks: dict[str, Callable[[Any], bool]] = {
        "run_id": lambda v: isinstance(v, str) and bool(v),
        "node_rank": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "argv": lambda v: isinstance(v, list) and bool(v) and all(isinstance(a, str) for a in v),
        "output_dir": lambda v: isinstance(v, str) and bool(v),
        "expect_outputs": lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v),
        "resume_from": lambda v: v is None or isinstance(v, str),
        "telemetry_period_s": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
    }
    # optional: no checkpoint to resume from, no GPU sampling
    data = {"resume_from": None, "telemetry_period_s": 0, **data}
    for key, ok in checks.items():
        if key not in data or not ok(data[key]):
            raise ContractError(f"{where}: {key}: missing or of the wrong type ({data.get(key)!r})")
    return Job(
        run_id=data["run_id"],
        node_rank=data["node_rank"],
        argv=list(data["argv"]),
        output_dir=data["output_dir"],
        expect_outputs=list(data["expect_outputs"]),
        resume_from=data["resume_from"],
        telemetry_period_s=float(data["telemetry_period_s"]),
    )


def bundle_from(data: object, where: str = BUNDLE_FILE) -> Bundle:
    """Return ``data`` as a :class:`Bundle`; raise :class:`ContractError` naming the first bad field."""
    if not isinstance(data, dict):
        raise ContractError(f"{where}: not a JSON object")
    files, env = data.get("files"), data.get("env")
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise ContractError(f"{where}: files: must map file names to text")
    if any(Path(name).name != name or name.startswith(".") for name in files):
        raise ContractError(f"{where}: files: plain file names only")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ContractError(f"{where}: env: must map names to strings")
    return Bundle(files=dict(files), job=job_from(data.get("job"), f"{where}: job"), env=dict(env))


def node_status_from(data: object, where: str = "status") -> NodeStatus:
    """Return ``data`` as a :class:`NodeStatus` (a JSON object with a ``state`` string); raise
    :class:`ContractError` when it is not one."""
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        raise ContractError(f"{where}: not a node status (a JSON object with a state)")
    return cast("NodeStatus", data)


def collect_result_from(data: object, where: str = "collect") -> CollectResult:
    """Return ``data`` as a :class:`CollectResult`: ``status`` a :class:`NodeStatus` (else
    :class:`ContractError`), ``outputs`` a list of paths ([] when missing or of the wrong type)."""
    if not isinstance(data, dict):
        raise ContractError(f"{where}: not a JSON object")
    outputs = data.get("outputs")
    return CollectResult(
        ok=bool(data.get("ok")),
        status=node_status_from(data.get("status"), f"{where}: status"),
        outputs=[str(o) for o in outputs] if isinstance(outputs, list) else [],
        archive=str(data.get("archive") or ""),
        gpu_after=gpu_after if isinstance(gpu_after := data.get("gpu_after"), dict) else None,
    )


def read_job(run_dir: Path) -> Job | None:
    """Return the run directory's job, or None when it has none (or an unreadable one)."""
    try:
        return job_from(json.loads((run_dir / JOB_FILE).read_text()))
    except (OSError, ValueError):
        return None
