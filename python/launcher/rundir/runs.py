"""The controller run directory ``runs/<run_id>/``: run record, ansible artifacts, node logs, metrics.

Everything ``status``, ``logs``, ``stop`` and ``list`` need is in here, so they work after the launcher died.
The run record (``record.json``) is read and written here only: :meth:`RunDir.record` returns the typed
:class:`RunRecord` of the fields the engine, the backends and the commands read; :meth:`RunDir.update` and
:meth:`RunDir.set_status` write it (atomically, merging fields: the run's steps add theirs as they go).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from launcher.exceptions import ConfigurationError, NoRunsError
from launcher.exit_codes import JOB_FAILED, OK, ExitCode
from launcher.node import contract
from launcher.spec.repo import STATE_DIR

RECORD = "record.json"


class RunState(enum.StrEnum):
    """A run's ``status`` in record.json: str-valued, so the record's bytes are the names themselves."""

    CREATED = "created"
    PREFLIGHT = "preflight"
    PROBING = "probing"
    STAGING = "staging"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    STALLED = "stalled"  # the progress watchdog saw no optimizer step within its window (follow/watchdog.py)
    REJECTED = "rejected"


ACTIVE_STATES = (
    RunState.CREATED,
    RunState.PREFLIGHT,
    RunState.PROBING,
    RunState.STARTING,
    RunState.RUNNING,
    RunState.STOPPING,
    RunState.RECOVERING,
)
FINAL_STATES = (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.STALLED, RunState.REJECTED)


def runs_root() -> Path:
    """Return the folder holding all run directories (``MIFT_RUNS_DIR`` or ``runs/`` under the repo)."""
    return Path(os.environ.get("MIFT_RUNS_DIR") or STATE_DIR / "runs")


def new_run_id(name: str) -> str:
    """Return a fresh, sortable run id for a job named ``name``."""
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class RunRecord:
    """The fields of a run record (``record.json``) that the engine, the backends and the commands read,
    typed; ``data`` is the whole record as stored (the rest: summary, nodes, staging, ... as JSON)."""

    run_id: str
    status: str
    name: str = ""
    created_at: float = 0.0
    spec_path: str = ""
    spec: Mapping[str, Any] = field(default_factory=dict)
    inventory: str | None = None
    launcher_pid: int | None = None
    # the backend's name (``run --backend``) and its handle (launcher.backends: ``kind`` and its fields)
    backend: str | None = None
    handle: Mapping[str, Any] | None = None
    slurm: Mapping[str, Any] = field(default_factory=dict)  # the Slurm job (slurm backend)
    hosts: tuple[str, ...] = ()  # the nodes, once the plan named them (none: no trainer was started)
    nproc_per_node: int | None = None
    output_dir: str | None = None
    deepspeed: str | None = None
    plan: Mapping[str, Any] | None = None
    attempts: tuple[Mapping[str, Any], ...] = ()
    result_reason: str = ""
    resumed_from: str | None = None
    summary: Mapping[str, Any] = field(
        default_factory=dict
    )  # once the run ended (launcher.engine.job.Job.finalize)
    nodes: Mapping[str, contract.NodeStatus] = field(default_factory=dict)  # the last poll (no log tail)
    staging: Mapping[str, Any] = field(default_factory=dict)  # what staging sent (launcher.transfer.staging)
    stall: Mapping[str, Any] | None = None  # what the progress watchdog saw (launcher.follow.watchdog.Stall)
    data: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> RunRecord:
        """Return the typed record of ``data`` (a record as stored; missing fields take their defaults)."""
        pid, nproc = data.get("launcher_pid"), data.get("nproc_per_node")
        handle, plan, stall = data.get("handle"), data.get("plan"), data.get("stall")
        nodes: dict[str, contract.NodeStatus] = {}
        for host, node in _mapping(data.get("nodes")).items():
            with contextlib.suppress(contract.ContractError):
                nodes[str(host)] = contract.node_status_from(node, str(host))
        return cls(
            run_id=str(data.get("run_id") or ""),
            status=str(data.get("status") or ""),
            name=str(data.get("name") or ""),
            created_at=float(data.get("created_at") or 0.0),
            spec_path=str(data.get("spec_path") or ""),
            spec=_mapping(data.get("spec")),
            inventory=_str_or_none(data.get("inventory")),
            launcher_pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
            backend=_str_or_none(data.get("backend")),
            handle=handle if isinstance(handle, Mapping) else None,
            slurm=_mapping(data.get("slurm")),
            hosts=tuple(str(h) for h in data.get("hosts") or ()),
            nproc_per_node=nproc if isinstance(nproc, int) and not isinstance(nproc, bool) else None,
            output_dir=_str_or_none(data.get("output_dir")),
            deepspeed=_str_or_none(data.get("deepspeed")),
            plan=plan if isinstance(plan, Mapping) else None,
            attempts=tuple(a for a in data.get("attempts") or () if isinstance(a, Mapping)),
            result_reason=str(data.get("result_reason") or ""),
            resumed_from=_str_or_none(data.get("resumed_from")),
            summary=_mapping(data.get("summary")),
            nodes=nodes,
            staging=_mapping(data.get("staging")),
            stall=stall if isinstance(stall, Mapping) else None,
            data=data,
        )

    @property
    def final(self) -> bool:
        """Return True when the run ended (a final state)."""
        return self.status in FINAL_STATES


@dataclass
class RunDir:
    """One run directory and its record."""

    path: Path

    @property
    def run_id(self) -> str:
        """Return the run id (the folder name)."""
        return self.path.name

    @property
    def ansible_dir(self) -> Path:
        """Return ansible-runner's private data dir."""
        return self.path / "ansible"

    @property
    def nodes_dir(self) -> Path:
        """Return where node logs and results are fetched to."""
        return self.path / "nodes"

    @property
    def files_dir(self) -> Path:
        """Return ``<host>/`` folders copied to the nodes (configs, job.json; env.json until started)."""
        return self.path / "files"

    @classmethod
    def create(cls, run_id: str, record: dict[str, Any]) -> RunDir:
        """Create the run directory (mode 0700) with its first record."""
        root = runs_root()
        root.mkdir(parents=True, exist_ok=True)
        path = root / run_id
        path.mkdir(mode=0o700)
        run = cls(path)
        record = {"run_id": run_id, "status": "created", "timeline": [], **record}
        run.save(record)
        run.set_status("created")
        return run

    def created_at(self) -> float:
        """Return when the run was created (from its record; the folder time if unreadable)."""
        try:
            return float(self.load().get("created_at", 0.0))
        except ConfigurationError:
            return self.path.stat().st_mtime

    def record(self) -> RunRecord:
        """Return the run record, typed."""
        return RunRecord.of(self.load())

    def load(self) -> dict[str, Any]:
        """Return the run record as stored (JSON)."""
        try:
            data = json.loads((self.path / RECORD).read_text())
        except (OSError, ValueError) as err:
            raise ConfigurationError(f"{self.path}: no readable run record: {err}") from None
        if not isinstance(data, dict):
            raise ConfigurationError(f"{self.path / RECORD}: not a run record")
        return data

    def save(self, record: dict[str, Any]) -> None:
        """Write the run record atomically."""
        tmp = self.path / f".{RECORD}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, indent=2, default=str)
            fh.write("\n")
        tmp.replace(self.path / RECORD)

    def update(self, **fields: Any) -> dict[str, Any]:  # noqa: ANN401 - JSON values
        """Merge ``fields`` into the record and save it."""
        record = self.load()
        record.update(fields)
        self.save(record)
        return record

    # the record's fields written from more than one place, each through its own typed method
    def set_nodes(self, nodes: Mapping[str, Mapping[str, Any]]) -> None:
        """Record each host's last node state (``nodes``)."""
        self.update(nodes=dict(nodes))

    def set_excluded(self, excluded: Mapping[str, str]) -> None:
        """Record the hosts recovery took out of the run, and why (``excluded``)."""
        self.update(excluded=dict(excluded))

    def set_attempts(self, attempts: list[dict[str, Any]]) -> None:
        """Record the run's attempts (``attempts``, engine/attempt_log.py)."""
        self.update(attempts=attempts)

    def set_slurm(self, slurm: Mapping[str, Any]) -> None:
        """Record the Slurm job's fields (``slurm``)."""
        self.update(slurm=dict(slurm))

    def set_staging(self, staging: Mapping[str, Any]) -> None:
        """Record staging's progress or outcome (``staging``)."""
        self.update(staging=dict(staging))

    def set_merge(self, merge: Mapping[str, Any]) -> None:
        """Record the LoRA merge's outcome (``merge``)."""
        self.update(merge=dict(merge))

    def set_status(self, status: str, note: str = "") -> dict[str, Any]:
        """Set the run status and append it to the status timeline."""
        record = self.load()
        record["status"] = status
        entry = {"t": round(time.time(), 3), "status": status}
        if note:
            entry["note"] = note
        record.setdefault("timeline", []).append(entry)
        self.save(record)
        return record


def exit_code_of(status: object) -> ExitCode:
    """Return the exit code for a run in ``status`` (the record's): 0 once it succeeded, or
    (``run --detach``) while its trainers run on; 1 when it failed, stalled, was stopped or rejected."""
    return OK if status == RunState.SUCCEEDED or status not in FINAL_STATES else JOB_FAILED


def list_runs() -> list[RunDir]:
    """Return every run directory, oldest first."""
    root = runs_root()
    if not root.is_dir():
        return []
    runs = [RunDir(p) for p in root.iterdir() if (p / RECORD).is_file()]
    return sorted(runs, key=lambda r: r.created_at())


def find_run(ref: str | None) -> RunDir:
    """Return the run named ``ref`` (run id, unique prefix or path); the latest run when ``ref`` is None."""
    if ref is None:
        runs = list_runs()
        if not runs:
            raise NoRunsError(f"no runs in {runs_root()}")
        return runs[-1]
    as_path = Path(ref)
    if (as_path / RECORD).is_file():
        return RunDir(as_path.resolve())
    matches = [r for r in list_runs() if r.run_id == ref] or [
        r for r in list_runs() if r.run_id.startswith(ref)
    ]
    if not matches:
        raise ConfigurationError(f"{ref}: no such run in {runs_root()}")
    if len(matches) > 1:
        names = ", ".join(r.run_id for r in matches[:5])
        raise ConfigurationError(f"{ref}: ambiguous run, matches {names}")
    return matches[0]
