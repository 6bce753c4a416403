#!/usr/bin/env python3
"""Node agent of the launcher (the supervisor side): start, report on and stop one trainer in a node run
directory.

Standard library only: the launch playbook copies this file, ``mift_contract.py`` (the controller/node
contract: job, bundle, status) and ``mift_probe.py`` (the read-only probe preflight feeds to ``python3 -``)
into ``/var/lib/mift/runs/<run_id>/``, and the playbooks run it with the system ``python3``. The run directory
holds, unpacked by ``start`` from the ``bundle.json`` the launch playbook copied:

* ``job.json``  -- ``mift_contract.Job`` (no secrets)
* ``env.json``  -- the trainer's extra environment, mode 0600 (may hold secrets)
* the files of the run plan (``train.yaml``, ``ds_config.json``), mode 0600

and, written by this agent:

* ``trainer.pid`` -- the trainer's pid (= its process group id)
* ``trainer.log`` -- stdout and stderr of the trainer; torchrun tees every rank's lines into it, each line
  prefixed ``[rankN localL]:`` (N: the global rank, L: the local rank)
* ``ranks/`` -- torchrun's log folder: each local rank's ``stdout.log`` and ``stderr.log``; ``collect``
  ships them as ``rank<N>.stdout.log`` and ``rank<N>.stderr.log``
* ``state.json``  -- ``{"state", "pid", "supervisor_pid", "supervisor_id", "started_at", "ended_at", "rc"}``
  (``supervisor_id``: boot id and start time of the supervisor, so that a later process given its pid is
  not taken for it)
* ``rc``          -- the trainer's exit status once it ended
* ``stop_requested`` -- present once ``stop`` was asked for
* ``telemetry.jsonl``, ``telemetry.json``, ``gpu_after.json`` -- GPU samples while the trainer runs (every
  ``telemetry_period_s`` of job.json, from a baseline taken before it starts) and the check after the run,
  written by ``mift_gpu.py`` (shipped next to this file); a GPU that breaks stops the trainer (state
  ``failed``, ``gpu_fault``)

Commands (each prints one JSON object on stdout):

* ``start RUN_DIR``  -- double-fork a supervisor that runs the trainer in its own session and process group,
  wait until the trainer is running, return. The supervisor survives the ssh session and records the exit
  status.
* ``prepare RUN_DIR`` -- unpack the bundle and record the run as ``queued``; start nothing (the Slurm backend:
  Slurm starts the trainer later, through ``slurm-step``).
* ``slurm-step RUN_DIR [--grace S]`` -- run by ``srun``, one task per node: take ``NODE_RANK`` from
  ``SLURM_NODEID``, ``NNODES`` and ``MASTER_ADDR`` from the allocation, then supervise the trainer in the
  foreground (the same supervisor and files as ``start``); exit non-zero when the trainer did, so that
  ``srun --kill-on-bad-exit`` ends the job. SIGTERM (scancel, a time limit, another node's failure) stops the
  trainer and records the run as stopped.
* ``slurm-check ROOT`` -- login host only (docs/slurm.md): the first step of the batch script, one task per
  node, before any trainer: this node can run rank ``SLURM_NODEID`` of the job (ROOT/rank<N>: the trainer,
  the stack versions the job was planned for, GPUs verified, free disk); a node that cannot records why as
  its rank's state and exits 1, which fails the job.
* ``slurm-step ROOT --ranks`` -- as ``slurm-step``, in ROOT/rank<SLURM_NODEID> (a shared run root).
* ``slurm-step RUN_DIR --restart K --resume-step N|none`` -- restart K of a requeued job (docs/slurm.md
  "Requeue"): the trainer resumes from ``checkpoint-N`` of its output_dir (LLaMA-Factory's command-line
  overrides ``resume_from_checkpoint=...``), or starts as the first attempt did (``none``); the state file
  records the restart and the step.
* ``slurm-checkpoints RUN_DIR`` -- one JSON line: this node's Slurm name and its complete ``checkpoint-N``
  steps (the batch script runs it on every node when Slurm restarts the job).
* ``resume-step RUN_DIR --nodes N`` -- read the lines of ``slurm-checkpoints`` from every node on stdin and
  print the newest step all N nodes hold, or ``none``; exit 1 when fewer than N nodes answered.
* ``shared-prepare|shared-status|shared-collect|shared-stop ROOT`` -- on the login host: the command for every
  rank under a shared run root, answered as ``{"results": {rank: {...}}}``; status reads the state files only
  (the trainers run on other hosts).
* ``status RUN_DIR`` -- state, liveness, rc, the last trainer_log.jsonl entry, which expected outputs exist.
* ``watch RUN_DIR [--every S] [--for S]`` -- ``status`` as one JSON line every S seconds until nobody reads
  them (the launcher's streamed follow of many nodes, launcher/backends/ssh_stream.py).
* ``collect RUN_DIR`` -- the status, the output files, and ``collect.tar.gz`` (logs, state, metrics) to fetch.
* ``stop RUN_DIR [--grace S] [--dump-stacks]`` -- SIGTERM the trainer's process group and every process
  carrying the run's marker in its environment, SIGKILL what is left after the grace period, check that
  nothing is left. Idempotent. ``--dump-stacks`` (the progress watchdog saw a stall): first
  ``stack-<rank>-<pid>.txt`` of every process of the run (py-spy, the kernel's view of each thread) and a
  poke of the flight recorder.

Every process of a run carries ``MIFT_AGENT_KEY=<run_id>@<run_dir>`` in its environment; ``torchrun`` puts its
workers in new sessions, so the marker (not the process group) is what finds all of them. The key holds the
run directory so that two nodes sharing one machine (local tests) never touch each other's processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import IO, Any

import mift_contract as contract
import mift_gpu
from mift_probe import checkpoints, free_bytes, installed_versions, local_facts

MARKER = contract.MARKER
STATE_FILE = contract.STATE_FILE
LOG_TAIL_BYTES = 4096
GIB = 1024**3
# printed by a ZeRO-3 rank on CPU when a gloo thread races interpreter teardown after training finished
TEARDOWN_ABORT = "terminate called without an active exception"
WORLD_SIZE_RE = re.compile(r"world size: (\d+)")
JOINED_RE = re.compile(r"Process rank: (\d+), world size: (\d+)")
# lines that tell how a trainer failed (the launcher's recovery classifies them): torchrun's report of a rank
# killed by a signal, out of memory, GPU and collective errors; the last FAILURE_LINES of them are reported
FAILURE_RE = re.compile(
    r"Signal \d+ \(SIG|exitcode\s*:\s*-?\d+|out of memory|OutOfMemoryError|HIP error|CUDA error|hipError|"
    r"cudaError|NCCL error|RCCL error|ECC error|GPU Hang|stalled"
)
FAILURE_LINES = 12
# torchrun's failure report (``<entrypoint> FAILED``): each failed rank's global rank and exit status
# (negative: the signal that killed it). After one rank fails, torchrun stops its siblings with SIGTERM, and
# they appear there as ``exitcode : -15``: the launcher's recovery tells them from a rank killed from outside
REPORT_START = "\nFailures:\n"
REPORT_RANK_RE = re.compile(
    r"^\s*rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", re.MULTILINE
)
# RCCL/NCCL's init line naming the network its collectives use between nodes (NCCL_DEBUG=INFO, subsystem
# INIT; ``INFO(NCCL_INIT, "Using network %s", ...)`` in init.cc): ``Socket`` is TCP sockets; ``IB``,
# ``IBext_v8``, ... RDMA through verbs or a net plugin. The launcher judges it (launcher/fabric/runtime.py).
NET_RE = re.compile(r"NCCL INFO Using network (\S+)")


def _now() -> float:
    return round(time.time(), 3)


def _write_json(path: Path, data: dict[str, Any], mode: int = 0o644) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    tmp.replace(path)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int | None) -> bool:
    """Return True when ``pid`` exists and is not a zombie."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _identity(pid: int | None) -> str | None:
    """Return ``<boot id>:<start time>`` of a live ``pid``: what tells a process from a later one that got its
    pid (pids are reused; a reboot restarts the count), else None."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{fields[19]}" if len(fields) > 19 and fields[0] != "Z" else None  # field 22: starttime


def _supervisor_alive(state: dict[str, Any]) -> bool:
    """Return True when the state file's supervisor still runs: its pid is alive and, when the state file
    recorded its identity, is the same process (not a later one that got the pid)."""
    pid = state.get("supervisor_pid")
    recorded = state.get("supervisor_id")
    if recorded is None:  # written by an agent of before the identity: the pid is all there is
        return _alive(pid)
    return bool(_identity(pid) == recorded)


def agent_key(run_id: str, run_dir: Path) -> str:
    """Return the marker value of this node's processes of a run."""
    return f"{run_id}@{run_dir}"


def marked_pids(key: str) -> list[int]:
    """Return the live processes whose environment carries the marker ``key``."""
    needle = f"{MARKER}={key}".encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and _alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def _ours(pid: int | None, key: str) -> bool:
    """Return True when ``pid`` is a live process of this run (it carries the run's marker ``key``).

    A pid read from the state file may name a process that ended long ago and whose pid now belongs to
    another program (pids are reused; a busy node wraps ``pid_max`` quickly): only a process that carries the
    marker is this run's, to signal or to count as its trainer."""
    if not pid or not _alive(pid):
        return False
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={key}".encode() in env.split(b"\0")


def _signal_all(pgid: int | None, key: str, sig: int) -> None:
    if pgid is not None and _ours(pgid, key):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for pid in marked_pids(key):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def sweep(pgid: int | None, key: str, grace: float) -> list[int]:
    """SIGTERM everything of the run, SIGKILL what is left after ``grace`` s; return pids still alive."""
    _signal_all(pgid, key, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not marked_pids(key) and not _ours(pgid, key):
            return []
        time.sleep(0.2)
    _signal_all(pgid, key, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = marked_pids(key)
        if not left:
            return []
        time.sleep(0.2)
    return marked_pids(key)


def output_dir_of(run_dir: Path, job: dict[str, Any]) -> Path:
    """Return the job's output directory on this node (relative to the run dir, or absolute)."""
    return run_dir / str(job.get("output_dir") or "output")


def _trainer_env(run_dir: Path, job: dict[str, Any]) -> dict[str, str]:
    extra = _read_json(run_dir / contract.ENV_FILE)
    env = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "LC_ALL", "TERM", "USER", "LOGNAME")}
    env.setdefault("HOME", "/root")
    env["PATH"] = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update({str(k): str(v) for k, v in extra.items()})
    env[MARKER] = agent_key(str(job["run_id"]), run_dir)
    flight_recorder_env(env, run_dir)
    rank_log_env(env, run_dir)
    # report_to: tensorboard: transformers 5 writes where TENSORBOARD_LOGGING_DIR says, else into runs/ of
    # the trainer's working directory; under the output, collect ships the event files (the job's env wins)
    env.setdefault("TENSORBOARD_LOGGING_DIR", str(output_dir_of(run_dir, job) / "runs"))
    tunableop = env.get("PYTORCH_TUNABLEOP_FILENAME", "")
    if tunableop.startswith("/"):  # kept between runs: PyTorch writes it when the trainer ends
        Path(tunableop).parent.mkdir(parents=True, exist_ok=True)
    return env


# torchrun's per-rank logs (each torchrun option has a PET_<OPTION> variable; LLaMA-Factory starts torchrun
# itself): every local rank's stdout and stderr in RANK_LOG_DIR, teed to trainer.log with a prefix naming the
# global and the local rank; the job spec's env wins
RANK_LOG_DIR = "ranks"
RANK_LOG_PREFIX = "[rank${rank} local${local_rank}]: "


def rank_log_env(env: dict[str, str], run_dir: Path) -> None:
    """Point torchrun's per-rank log files into the run directory and prefix the teed lines with the rank."""
    env.setdefault("PET_LOG_DIR", str(run_dir / RANK_LOG_DIR))
    env.setdefault("PET_TEE", "3")  # 3: stdout and stderr, to the files and to trainer.log
    env.setdefault("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", RANK_LOG_PREFIX)


def tensorboard_files(output_dir: Path) -> list[Path]:
    """Return the trainer's TensorBoard event files (``report_to: tensorboard``: the main process writes them
    into ``<output_dir>/runs``, where :func:`_trainer_env` points ``TENSORBOARD_LOGGING_DIR``). Their names
    are unique (time, host, pid), so they travel flat, beside the logs."""
    if not (output_dir / "runs").is_dir():
        return []
    return sorted(p for p in (output_dir / "runs").rglob("events.out.tfevents.*") if p.is_file())


def rank_logs(run_dir: Path) -> dict[str, Path]:
    """Return ``rank<N>.<stream>.log`` -> torchrun's file for it (N = NODE_RANK x NPROC_PER_NODE + the local
    rank: torchrun's static rendezvous; the newest attempt wins)."""
    env = _read_json(run_dir / contract.ENV_FILE)
    try:
        first = int(env.get("NODE_RANK") or 0) * int(env.get("NPROC_PER_NODE") or 1)
    except ValueError:
        return {}
    found: dict[str, Path] = {}
    attempts = sorted((run_dir / RANK_LOG_DIR).glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
    for attempt in attempts:
        for log in sorted(attempt.glob("*/std*.log")):
            if log.parent.name.isdigit() and log.name in ("stdout.log", "stderr.log"):
                found[f"rank{first + int(log.parent.name)}.{log.name}"] = log
    return found


WATCH_PERIOD_S = 2.0
# a non-master node that cannot reach MASTER_ADDR for this long stops its trainer by itself (the launcher
# cannot reach it either; its gloo/NCCL collectives would hang until ddp_timeout)
MASTER_LOST_S = 15.0


class MasterWatch:
    """Tells a non-master node when its network path to the master has been gone for ``MASTER_LOST_S``.

    Every period, a TCP connect to MASTER_ADDR:MASTER_PORT. Accepted or refused both prove the master host is
    reachable (the port closes when the master's trainer ends); only unreachable or timed out count as lost.
    """

    def __init__(self, addr: str, port: int, lost_s: float = MASTER_LOST_S) -> None:
        self.addr = addr
        self.port = port
        self.lost_s = lost_s
        self.first_miss: float | None = None

    @classmethod
    def from_env(cls, env: dict[str, str], job: dict[str, Any]) -> MasterWatch | None:
        """Return a watch for a non-master node of a multi-node job, else None."""
        if int(job.get("node_rank") or 0) == 0 or int(env.get("NNODES", "1") or 1) < 2:
            return None
        addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
        lost = float(env.get("MIFT_MASTER_LOST_S") or MASTER_LOST_S)
        return cls(addr, int(port), lost) if addr and port.isdigit() else None

    def reachable(self) -> bool:
        """Return True when the master host answers (accept or refuse) within a few seconds."""
        try:
            with socket.create_connection((self.addr, self.port), timeout=3):
                return True
        except ConnectionRefusedError:
            return True
        except OSError:
            return False

    def check(self, now: float | None = None) -> str:
        """Probe once; return why the master counts as lost ('' while it does not)."""
        now = time.monotonic() if now is None else now
        if self.reachable():
            self.first_miss = None
            return ""
        if self.first_miss is None:
            self.first_miss = now
        if now - self.first_miss >= self.lost_s:
            return f"master {self.addr}:{self.port} unreachable for {now - self.first_miss:.0f} s"
        return ""


def _open_log(run_dir: Path, extra: dict[str, Any]) -> IO[bytes]:
    """Open the trainer log to append; a restarted run (the launcher's recovery) appends to it, so what this
    start writes begins at ``extra["log_offset"]``."""
    log: IO[bytes] = (run_dir / contract.TRAINER_LOG).open("ab")
    extra.setdefault("log_offset", log.tell())
    return log


def _supervise(run_dir: Path, job: dict[str, Any], grace: float, extra: dict[str, Any] | None = None) -> None:
    """Run in the detached supervisor: start the trainer, wait for it, record how it ended (``extra``: more
    fields for every state.json written, e.g. the Slurm node)."""
    extra = dict(extra or {})
    run_id = str(job["run_id"])
    env = _trainer_env(run_dir, job)
    argv = [str(a) for a in job["argv"]]
    venv_bin = str(Path(argv[0]).parent)
    env["PATH"] = venv_bin + os.pathsep + env["PATH"]  # llamafactory-cli runs `torchrun` by name
    log = _open_log(run_dir, extra)
    started = _now()
    sampler = mift_gpu.Sampler.for_job(run_dir, job)
    if sampler is not None:
        sampler.start()  # the baseline (one tool call, bounded by its timeout), then a thread
    try:
        proc = subprocess.Popen(
            argv,
            cwd=run_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as err:
        if sampler is not None:
            sampler.stop()
        log.write(f"mift_agent: cannot start {argv[0]}: {err}\n".encode())
        log.close()
        (run_dir / contract.RC_FILE).write_text("127\n")
        _write_json(
            run_dir / STATE_FILE,
            {
                "state": contract.EXITED,
                "rc": 127,
                "pid": None,
                "supervisor_pid": os.getpid(),
                "supervisor_id": _identity(os.getpid()),
                "started_at": started,
                "ended_at": _now(),
                **extra,
            },
        )
        return
    (run_dir / contract.PID_FILE).write_text(f"{proc.pid}\n")
    state = {
        "state": contract.RUNNING,
        "pid": proc.pid,
        "supervisor_pid": os.getpid(),
        "supervisor_id": _identity(os.getpid()),
        "started_at": started,
        "ended_at": None,
        "rc": None,
        **extra,
    }
    _write_json(run_dir / STATE_FILE, state)
    watchdog = MasterWatch.from_env(env, job)
    lost = ""
    while True:
        try:
            rc = proc.wait(timeout=WATCH_PERIOD_S)
            break
        except subprocess.TimeoutExpired:
            lost = (watchdog.check() if watchdog else "") or (sampler.fault if sampler else "")
            # cut off from the master (nobody can stop this node, and its collectives hang for ages), or a GPU
            # broke (a new uncorrectable ECC error, a GPU gone: the run must not go on with it)
            if lost:
                log.write(f"mift_agent: {lost}; stopping the trainer\n".encode())
                log.flush()
                sweep(proc.pid, agent_key(run_id, run_dir), grace)
                rc = proc.wait()
                break
    if sampler is not None:
        sampler.stop()
    # a trainer killed from outside leaves torchrun's workers (own sessions) behind: sweep them
    left = sweep(proc.pid, agent_key(run_id, run_dir), grace)
    log.close()
    (run_dir / contract.RC_FILE).write_text(f"{rc}\n")
    stopped = (run_dir / contract.STOP_FILE).exists()
    state.update(
        {
            "state": contract.STOPPED if stopped else contract.EXITED,
            "rc": rc,
            "ended_at": _now(),
            "left": left,
        }
    )
    if lost:
        state["reason"] = lost
    if sampler is not None and sampler.fault:  # the run fails, whatever the stopped trainer's rc
        state.update(state=contract.FAILED, gpu_fault=sampler.fault)
    _write_json(run_dir / STATE_FILE, state)


def unpack_bundle(run_dir: Path) -> str | None:
    """Write the files of ``bundle.json`` (``mift_contract.Bundle``) into the run dir, then delete it.

    Every file is written 0600. Returns why the bundle is unusable (None: unpacked, or no bundle).
    """
    bundle_path = run_dir / contract.BUNDLE_FILE
    if not bundle_path.exists():
        return None
    try:
        bundle = contract.bundle_from(json.loads(bundle_path.read_text()))
    except (OSError, ValueError) as err:
        return str(err)
    for name, text in bundle["files"].items():
        fd = os.open(run_dir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    _write_json(run_dir / contract.JOB_FILE, dict(bundle["job"]), 0o600)
    _write_json(run_dir / contract.ENV_FILE, dict(bundle["env"]), 0o600)
    bundle_path.unlink()
    return None


def mark_latest(run_dir: Path, job: dict[str, Any]) -> str | None:
    """Give the checkpoint this node resumes from a DeepSpeed ``latest`` file when it lacks one.

    DeepSpeed writes ``latest`` (the tag to load) on global rank 0's node only; on every other node's own copy
    of the checkpoint the load would fail ("Unable to find latest file"). The tag is the checkpoint's only
    ``global_step*`` folder. Returns the tag written, or None.
    """
    resume = job.get("resume_from")
    if not resume:
        return None
    output_dir = output_dir_of(run_dir, job)
    if resume == "last":
        steps = checkpoints(output_dir)
        if not steps:
            return None
        ckpt = output_dir / f"checkpoint-{steps[-1]}"
    else:
        ckpt = run_dir / str(resume)
    tags = sorted(p.name for p in ckpt.glob("global_step*") if p.is_dir())
    if len(tags) != 1 or (ckpt / "latest").exists():
        return None
    (ckpt / "latest").write_text(tags[0])
    return tags[0]


def _unpacked_job(run_dir: Path) -> tuple[dict[str, Any], str]:
    """Unpack the bundle; return the run's job (mift_contract.Job) and '' or ({}, why it is unusable)."""
    bad = unpack_bundle(run_dir)
    if bad:
        return {}, f"{run_dir}/{bad}"
    try:
        job: dict[str, Any] = dict(contract.job_from(_read_json(run_dir / contract.JOB_FILE)))
    except contract.ContractError as err:
        return {}, f"{run_dir}/{err}"
    mark_latest(run_dir, job)
    return job, ""


def cmd_prepare(run_dir: Path) -> dict[str, Any]:
    """Unpack the bundle and record the run as queued; the trainer is started later by ``slurm-step``."""
    job, bad = _unpacked_job(run_dir)
    if bad:
        return {"ok": False, "error": bad}
    state = _read_json(run_dir / STATE_FILE)
    if state.get("state") == contract.QUEUED:
        return {"ok": True, "changed": False, **state}
    state = {"state": contract.QUEUED, "queued_at": _now(), "node_rank": job.get("node_rank")}
    _write_json(run_dir / STATE_FILE, state)
    return {"ok": True, "changed": True, **state}


# Slurm's GPU binding of the step, passed to the trainer unless the job's environment sets them itself
SLURM_GPU_ENV = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")


def slurm_nodes(nodelist: str) -> list[str]:
    """Return the node names of a Slurm node list (``scontrol show hostnames``), in allocation order."""
    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True, timeout=30
    )
    return out.stdout.split()


def slurm_placement(environ: dict[str, str], nodes: list[str]) -> dict[str, str]:
    """Return the environment a Slurm task sets for its trainer: rank, node count, master, GPU binding."""
    placed = {
        "NODE_RANK": environ["SLURM_NODEID"],
        "NNODES": str(len(nodes)),
        "MASTER_ADDR": nodes[0],
    }
    placed.update({k: environ[k] for k in SLURM_GPU_ENV if k in environ})
    return placed


def rank_dir(root: Path, environ: dict[str, str]) -> Path:
    """Return this task's node run directory under a shared run root: ``rank<SLURM_NODEID>``."""
    return root / f"rank{int(environ['SLURM_NODEID'])}"


def slurm_node(environ: dict[str, str]) -> str:
    """Return the Slurm node this task runs on."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def cmd_slurm_checkpoints(run_dir: Path) -> dict[str, Any]:
    """Return this node's Slurm name and the steps of the complete checkpoints in the job's output_dir."""
    job = _read_json(run_dir / contract.JOB_FILE)
    steps = checkpoints(output_dir_of(run_dir, job)) if job.get("run_id") else []
    return {"ok": bool(job.get("run_id")), "node": slurm_node(dict(os.environ)), "checkpoints": steps}


def resume_step(lines: list[str], nodes: int) -> int | None:
    """Return the newest checkpoint step every one of ``nodes`` nodes listed (``slurm-checkpoints`` lines),
    None when they hold none in common; raise ValueError when fewer than ``nodes`` nodes answered."""
    found: dict[str, set[int]] = {}
    for line in lines:
        with contextlib.suppress(ValueError):
            answer = json.loads(line)
            if isinstance(answer, dict) and answer.get("ok"):
                found[str(answer.get("node"))] = {int(x) for x in answer.get("checkpoints") or []}
    if len(found) < nodes:
        raise ValueError(f"{len(found)} of {nodes} nodes listed their checkpoints")
    common = set.intersection(*found.values()) if found else set()
    return max(common) if common else None


def resume_argv(argv: list[str], output_dir: Path, step: int | None) -> list[str]:
    """Return the trainer's command line for a restart: from ``checkpoint-<step>`` of the output_dir
    (LLaMA-Factory merges ``key=value`` arguments after the YAML into it), or as the first attempt's when no
    checkpoint is complete on every node."""
    if step is None:
        return list(argv)
    return [*argv, f"resume_from_checkpoint={output_dir}/checkpoint-{step}", "overwrite_output_dir=false"]


# slurm.out lines (slurmstepd's, the batch script's) that say why an attempt of a requeued job ended
REQUEUE_CAUSE_RE = re.compile(
    r"mift: time limit: requeued|DUE TO (NODE FAILURE|PREEMPTION|JOB REQUEUE|TIME LIMIT)"
)
REQUEUE_CAUSES = {
    "NODE FAILURE": "node failure",
    "PREEMPTION": "preemption",
    "JOB REQUEUE": "requeue",
    "TIME LIMIT": "time limit",
}
ATTEMPT_RE = re.compile(r"^mift: attempt (\d+) of slurm job")


def requeue_causes(text: str) -> dict[str, str]:
    """Return attempt number -> why it ended (``node failure``, ``preemption``, ``time limit``,
    ``requeue``: scontrol requeue) from the batch output of a requeued job; the first cause of an attempt
    wins (the time-limit trap's requeue shows as ``JOB REQUEUE`` after its own line)."""
    causes: dict[str, str] = {}
    attempt = 0
    for line in text.splitlines():
        start = ATTEMPT_RE.match(line)
        if start:
            attempt = int(start.group(1))
            continue
        match = REQUEUE_CAUSE_RE.search(line)
        if match and attempt:
            cause = REQUEUE_CAUSES[match.group(1)] if match.group(1) else "time limit"
            causes.setdefault(str(attempt), cause)
    return causes


def cmd_slurm_step(
    run_dir: Path, grace: float, ranks: bool = False, restart: int = 0, step: int | None = None
) -> dict[str, Any]:
    """Run this node's trainer as one task of a Slurm step (foreground); return how it ended.

    ``ranks``: RUN_DIR is a shared run root (login host only); this node's run directory is its rank's.
    ``restart``: Slurm's restart count (0: the first attempt); a restart resumes from ``checkpoint-<step>``
    (None: from where the first attempt began).
    """
    if ranks:
        run_dir = rank_dir(run_dir, dict(os.environ))
    job = _read_json(run_dir / contract.JOB_FILE)
    if not job.get("run_id"):
        return {"ok": False, "error": f"{run_dir}/{contract.JOB_FILE}: no job here (not prepared)"}
    env = _read_json(run_dir / contract.ENV_FILE)
    placed = slurm_placement(dict(os.environ), slurm_nodes(os.environ["SLURM_JOB_NODELIST"]))
    # the node's state says where Slurm put it and the rendezvous it used (the launcher's record takes them)
    extra: dict[str, Any] = {"slurm_node": slurm_node(dict(os.environ)), "master_addr": placed["MASTER_ADDR"]}
    env.update({k: v for k, v in placed.items() if k not in SLURM_GPU_ENV or k not in env})
    _write_json(run_dir / contract.ENV_FILE, env, 0o600)
    job["node_rank"] = int(placed["NODE_RANK"])
    _write_json(run_dir / contract.JOB_FILE, job, 0o600)
    for name in (STATE_FILE, contract.RC_FILE, contract.PID_FILE, contract.STOP_FILE):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
    key = agent_key(str(job["run_id"]), run_dir)

    def on_term(signum: int, _frame: object) -> None:
        # scancel, a time limit or another node's failure (--kill-on-bad-exit): stop the trainer; the
        # supervisor's wait then returns and records the run as stopped
        (run_dir / contract.STOP_FILE).write_text(f"{_now()} slurm {signal.Signals(signum).name}\n")
        state = _read_json(run_dir / STATE_FILE)
        sweep(state.get("pid"), key, grace)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    if restart:
        extra.update(restart=restart, resume_step=step)
        output_dir = output_dir_of(run_dir, job)
        if step is not None:  # DeepSpeed's `latest` on the nodes that lack it (every one but rank 0's)
            mark_latest(run_dir, {**job, "resume_from": f"{output_dir}/checkpoint-{step}"})
        job = {**job, "argv": resume_argv([str(a) for a in job["argv"]], output_dir, step)}
    _supervise(run_dir, job, grace, extra)
    state = _read_json(run_dir / STATE_FILE)
    return {"ok": state.get("rc") == 0, **state}


EXPECT_FILE = "expect.json"  # shared run root: what the plan was made for (the login host's probe)


def node_check(run_dir: Path, expect: dict[str, Any], local: dict[str, dict[str, Any]]) -> str:
    """Return why this node cannot run its rank of the job ('' when it can): the bundle unpacked, the trainer
    entry point, the stack versions the plan was made for, GPUs verified, free disk for the outputs."""
    job = _read_json(run_dir / contract.JOB_FILE)
    if not job.get("run_id"):
        return f"{run_dir}/{contract.JOB_FILE}: no job here (not prepared)"
    cli = Path(str(job["argv"][0]))
    if not os.access(cli, os.X_OK):
        return f"{cli} not found: provision the node (ansible-playbook provision.yml)"
    wanted = expect.get("versions")
    if isinstance(wanted, dict) and wanted:
        found = installed_versions(cli.parent.parent, tuple(sorted(wanted))) or {}
        for dist in sorted(wanted):
            if str(found.get(dist)) != str(wanted[dist]):
                return (
                    f"{dist} is {found.get(dist) or 'not installed'}, the job was planned for "
                    f"{wanted[dist]} (the login host's); re-run provision.yml"
                )
    gpus = local.get("mift_gpus") or {}
    if str(gpus.get("verified", "")).lower() in ("false", "0", "no"):
        return f"GPUs not verified (ansible_local.mift_gpus, arch {gpus.get('arch') or 'unknown'})"
    need = int(expect.get("min_free_bytes") or 0)
    free = free_bytes(run_dir)
    if free < need:
        return f"only {free / GIB:.1f} GiB free for output_dir, the job spec asks for {need / GIB:g} GiB"
    return ""


def cmd_slurm_check(root: Path) -> dict[str, Any]:
    """The in-allocation preflight of the login-host-only mode (one task per node, before any trainer):
    check this node (:func:`node_check`); a node that fails records why as its rank's state and exits 1."""
    environ = dict(os.environ)
    run_dir = rank_dir(root, environ)
    node = slurm_node(environ)
    if not run_dir.is_dir():
        why = f"{run_dir}: no such run directory (not prepared)"
        print(f"mift_agent: {node}: preflight: {why}", file=sys.stderr)
        return {"ok": False, "error": why, "slurm_node": node}
    expect = _read_json(root / EXPECT_FILE)
    facts_dir = expect.get("facts_dir")  # the node layout's, from the launcher (no copy of it here)
    why = (
        node_check(run_dir, expect, local_facts(Path(str(facts_dir))))
        if facts_dir
        else f"{root / EXPECT_FILE}: no facts_dir (written by an older launcher): submit the run again"
    )
    state = _read_json(run_dir / STATE_FILE)
    if why:
        state = {"state": contract.EXITED, "rc": 3, "reason": f"preflight: {why}", "ended_at": _now()}
        state["slurm_node"] = node
        print(f"mift_agent: {node} (rank {environ['SLURM_NODEID']}): preflight: {why}", file=sys.stderr)
    else:
        state = {**state, "preflight": "ok", "slurm_node": node}
    _write_json(run_dir / STATE_FILE, state)
    return {"ok": not why, **state}


def rank_dirs(root: Path) -> list[Path]:
    """Return the node run directories under a shared run root (``rank0``, ``rank1``, ...), in rank order."""
    found = [p for p in root.glob("rank*") if p.is_dir() and p.name[4:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[4:]))


def cmd_shared(command: str, root: Path, grace: float, job_gone: bool) -> dict[str, Any]:
    """Run ``command`` (prepare, status, collect, stop) for every rank of a shared run root, on the login
    host: ``{"ok", "results": {rank: {command: answer}}}`` (the launcher's ``mift_results`` shape).

    On the login host no trainer process is visible: the ranks' state files (written by ``slurm-step`` on the
    nodes) are the truth, and ``stop`` (after ``scancel``) records a rank Slurm ended without its state
    written as stopped, and reports it left only while the job is still on its nodes (``job_gone`` False).
    """
    del grace  # the nodes' processes are Slurm's to end (scancel); nothing here signals them
    results: dict[str, dict[str, Any]] = {}
    ok = True
    for run_dir in rank_dirs(root):
        if command == "prepare":
            answer = cmd_prepare(run_dir)
            name = "start"
        elif command == "status":
            answer, name = {"ok": True, **cmd_status(run_dir, remote=True)}, "status"
        elif command == "collect":
            answer, name = cmd_collect(run_dir, remote=True), "collect"
        else:
            answer, name = _shared_stop(run_dir, job_gone), "stop"
        ok = ok and bool(answer.get("ok"))
        results[run_dir.name] = {name: answer}
    return {"ok": ok, "results": results}


def _shared_stop(run_dir: Path, job_gone: bool) -> dict[str, Any]:
    state = _read_json(run_dir / STATE_FILE)
    active = state.get("state") in (contract.RUNNING, contract.STARTING, contract.QUEUED)
    if not active:
        return {"ok": True, "changed": False, "left": [], "state": state.get("state")}
    if not job_gone:
        return {"ok": False, "changed": False, "left": ["the slurm job is still on its nodes"], **state}
    state.update({"state": contract.STOPPED, "ended_at": _now(), "note": "ended by slurm (scancel)"})
    _write_json(run_dir / STATE_FILE, state)
    return {"ok": True, "changed": True, "left": [], "state": contract.STOPPED}


def cmd_start(run_dir: Path, grace: float, wait: float) -> dict[str, Any]:
    """Start the trainer through a detached supervisor; return once it runs (or ended)."""
    job, bad = _unpacked_job(run_dir)
    if bad:
        return {"ok": False, "error": bad}
    state = _read_json(run_dir / STATE_FILE)
    if state.get("state") in (contract.RUNNING, contract.STARTING) and _supervisor_alive(state):
        return {"ok": True, "changed": False, **state}
    for name in (STATE_FILE, contract.RC_FILE, contract.PID_FILE, contract.STOP_FILE):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
    _write_json(run_dir / STATE_FILE, {"state": contract.STARTING, "started_at": _now()})
    pid = os.fork()
    if pid == 0:  # first child: new session, fork again so the supervisor is no session leader
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            _supervise(run_dir, job, grace)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        state = _read_json(run_dir / STATE_FILE)
        if state.get("state") not in (None, contract.STARTING):
            break
        time.sleep(0.05)
    return {"ok": state.get("state") in (contract.RUNNING, contract.EXITED), "changed": True, **state}


def _last_jsonl(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 8192))
            lines = fh.read().splitlines()
    except OSError:
        return {}
    last: dict[str, Any] = {}
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict):
            continue
        if not last:
            last = entry
        if "loss" in entry:  # the final line of a run has no loss: show the last one logged
            return {**entry, **last} if "loss" in last else {**last, "loss": entry["loss"]}
    return last


def rank_exits(text: str) -> list[dict[str, int]]:
    """Return each failed rank's exit status from the last torchrun failure report in ``text``, by rank
    (``[]`` when there is none: the trainer still runs, ended well, or torchrun itself was killed)."""
    start = text.rfind(REPORT_START)
    if start < 0:
        return []
    found = {int(m.group(1)): int(m.group(2)) for m in REPORT_RANK_RE.finditer(text, start)}
    return [{"rank": rank, "exitcode": code} for rank, code in sorted(found.items())]


def _log_facts(log: Path, offset: int = 0) -> dict[str, Any]:
    """Return what the trainer log says: ranks that joined, world size, a teardown abort, how it failed, the
    last lines, the networks RCCL/NCCL chose; ``offset``: where the current start's output begins (earlier
    starts are not judged)."""
    try:
        with log.open("rb") as fh:
            fh.seek(offset if 0 < offset <= log.stat().st_size else 0)
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return {
            "ranks_joined": [],
            "world_size": None,
            "teardown_abort": False,
            "failure_lines": [],
            "rank_exits": [],
            "log_tail": "",
            "net_transport": None,
        }
    joined = sorted({int(m.group(1)) for m in JOINED_RE.finditer(text)})
    sizes = [int(m) for m in WORLD_SIZE_RE.findall(text)]
    failures = [line.strip()[:300] for line in text[-65536:].splitlines() if FAILURE_RE.search(line)]
    return {
        "ranks_joined": joined,
        "world_size": sizes[-1] if sizes else None,
        "teardown_abort": TEARDOWN_ABORT in text,
        "failure_lines": failures[-FAILURE_LINES:],
        "rank_exits": rank_exits(text),
        "log_tail": "\n".join(text[-LOG_TAIL_BYTES:].splitlines()[-8:]),
        "net_transport": net_transport(text),
    }


def net_transport(text: str) -> list[str] | None:
    """Return the networks RCCL/NCCL said it uses (``Using network X``), in the order first seen; None when
    no rank printed the line (not initialized yet, NCCL_DEBUG not INFO, or no RCCL/NCCL: gloo)."""
    names = list(dict.fromkeys(NET_RE.findall(text)))
    return names or None


def _processes(job: dict[str, Any], run_dir: Path) -> int:
    """Return how many processes carry the run's marker on this host."""
    return len(marked_pids(agent_key(str(job["run_id"]), run_dir))) if job.get("run_id") else 0


def cmd_status(run_dir: Path, remote: bool = False) -> dict[str, Any]:
    """Report the node's view of the run (``remote``: read on another host through a shared folder, where
    the pids mean nothing: the state file is the answer)."""
    job = _read_json(run_dir / contract.JOB_FILE)
    state = _read_json(run_dir / STATE_FILE)
    name = state.get("state", contract.ABSENT)
    if remote:
        trainer_alive = name == contract.RUNNING
    else:
        run_id = str(job.get("run_id") or "")
        trainer_alive = bool(run_id) and _ours(state.get("pid"), agent_key(run_id, run_dir))
        if name == contract.RUNNING and not _supervisor_alive(state):
            name = contract.RUNNING if trainer_alive else contract.VANISHED
    if name == contract.STARTING and time.time() - float(state.get("started_at") or 0) > 60:
        name = contract.VANISHED
    output_dir = output_dir_of(run_dir, job)
    expect = [str(e) for e in job.get("expect_outputs", [])]
    outputs = {e: (output_dir / e).exists() for e in expect}
    rc = state.get("rc")
    if name == contract.EXITED:
        name = contract.FINISHED if rc == 0 else contract.FAILED
    return {
        "run_id": job.get("run_id"),
        "node_rank": job.get("node_rank"),
        "state": name,
        "rc": rc,
        "reason": state.get("reason"),
        "pid": state.get("pid"),
        "trainer_alive": trainer_alive,
        "started_at": state.get("started_at"),
        "ended_at": state.get("ended_at"),
        "last_log": _last_jsonl(output_dir / "trainer_log.jsonl"),
        "outputs": outputs,
        "outputs_complete": bool(expect) and all(outputs.values()),
        "output_dir": str(output_dir),
        "processes": None if remote else _processes(job, run_dir),
        **{k: state[k] for k in ("slurm_node", "master_addr") if state.get(k)},  # a Slurm task's placement
        **({k: state.get(k) for k in ("restart", "resume_step")} if state.get("restart") else {}),
        **_requeues(run_dir),
        **_log_facts(run_dir / "trainer.log", int(state.get("log_offset") or 0)),
        **({} if remote else {"watch": watch_facts(run_dir, job)}),
        **mift_gpu.status_fields(run_dir),
    }


def cmd_watch(run_dir: Path, every: float, seconds: float) -> int:
    """``status`` every ``every`` s, one JSON line each, for ``seconds`` s or until nobody reads them (the
    controller's ssh session ended: the next write fails) -- the launcher's streamed follow
    (launcher/backends/ssh_stream.py): one ssh session per node for a whole follow, no Ansible task a poll."""
    deadline = time.monotonic() + seconds
    while True:
        t0 = time.monotonic()
        try:
            sys.stdout.write(json.dumps({"ok": True, **cmd_status(run_dir)}) + "\n")
            sys.stdout.flush()
        except OSError:  # BrokenPipeError: the session is gone
            return 0
        if t0 + every >= deadline:
            return 0
        time.sleep(max(0.0, every - (time.monotonic() - t0)))


def _requeues(run_dir: Path) -> dict[str, Any]:
    """Return ``{"requeues": {attempt: cause}}`` from the batch output on the node that ran the batch script
    of a requeued job, else {}."""
    try:
        text = (run_dir / "slurm.out").read_text(errors="replace")
    except OSError:
        return {}
    causes = requeue_causes(text)
    return {"requeues": causes} if causes else {}


# --- the progress watchdog (launcher/watchdog.py decides; here: what this node shows, the stack dumps) ---
STACK_PREFIX = "stack-"  # stack-<rank N | program>-<pid>.txt in the node run directory
# PyTorch's flight recorder (ProcessGroupNCCL, RCCL on ROCm): the launcher asks for it with
# TORCH_NCCL_TRACE_BUFFER_SIZE on GPU runs; its dumps (on a collective's timeout, or when a byte is written to
# the rank's pipe) land in the node run directory as nccl-trace-rank<N>
FLIGHT_RECORDER_DUMP = "nccl-trace-rank"
FLIGHT_RECORDER_PIPE = "nccl-trace-pipe-rank"  # <this><N>.pipe, a FIFO made by the rank
PY_SPY_TIMEOUT_S = 20.0


def flight_recorder_env(env: dict[str, str], run_dir: Path) -> None:
    """Point the flight recorder's dump files and dump pipe into the run directory (when it is on)."""
    try:
        size = int(env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0)
    except ValueError:
        size = 0
    if size > 0:
        env.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", str(run_dir / FLIGHT_RECORDER_DUMP))
        env.setdefault(
            "TORCH_FR_DUMP_TEMP_FILE", env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
        )  # torch >= 2.7's name
        env.setdefault("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", str(run_dir / FLIGHT_RECORDER_PIPE))


def _proc_environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _proc_state(pid: int) -> str:
    """Return the process state letter (R, S, D, T, Z, ...; '' when gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except (OSError, IndexError):
        return ""


def _proc_cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def rank_processes(key: str) -> list[dict[str, Any]]:
    """Return the run's training ranks on this host (torchrun's workers: RANK in their environment)."""
    ranks = []
    for pid in marked_pids(key):
        env = _proc_environ(pid)
        if "RANK" in env:
            ranks.append(
                {
                    "pid": pid,
                    "rank": env["RANK"],
                    "local_rank": env.get("LOCAL_RANK"),
                    "state": _proc_state(pid),
                }
            )
    return ranks


def checkpoint_fact(output_dir: Path) -> dict[str, Any] | None:
    """Return the newest checkpoint-N of output_dir: its step, whether it is complete (trainer_state.json,
    written last) and the newest write in it (a save in progress keeps moving it)."""
    try:
        found = [(int(p.name[11:]), p) for p in output_dir.glob("checkpoint-*") if p.name[11:].isdigit()]
    except OSError:
        return None
    if not found:
        return None
    step, folder = max(found)
    newest = 0.0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)  # noqa: PTH116,PTH118
    return {"step": step, "complete": (folder / "trainer_state.json").is_file(), "mtime": round(newest, 3)}


def watch_facts(run_dir: Path, job: dict[str, Any]) -> dict[str, Any]:
    """What the progress watchdog needs of this node besides the logged step: the newest checkpoint and the
    state of every training rank."""
    run_id = str(job.get("run_id") or "")
    return {
        "checkpoint": checkpoint_fact(output_dir_of(run_dir, job)),
        "ranks": rank_processes(agent_key(run_id, run_dir)) if run_id else [],
    }


def _py_spy(job: dict[str, Any]) -> str | None:
    argv = job.get("argv") or []
    beside = Path(str(argv[0])).parent / "py-spy" if argv else None
    if beside is not None and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def _kernel_view(pid: int) -> str:
    """Per thread: state, wait channel and kernel stack (works on any process, stopped or blocked)."""
    lines = []
    for task in sorted(
        Path(f"/proc/{pid}/task").glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else 0
    ):
        try:
            comm = (task / "comm").read_text().strip()
            state = (task / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            wchan = (task / "wchan").read_text().strip()
        except (OSError, IndexError):
            continue
        lines.append(f"thread {task.name} ({comm}) state {state} wchan {wchan or '-'}")
        with contextlib.suppress(OSError):
            lines.extend("    " + line for line in (task / "stack").read_text().splitlines())
    return "\n".join(lines)


def poke_flight_recorder(run_dir: Path) -> list[str]:
    """Write a byte into every rank's flight-recorder pipe (the rank dumps its trace); return the pipes."""
    poked = []
    for pipe in sorted(run_dir.glob(FLIGHT_RECORDER_PIPE + "*.pipe")):
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue  # no reader: the rank is gone
        with contextlib.suppress(OSError):
            os.write(fd, b"1")
        os.close(fd)
        poked.append(pipe.name)
    return poked


def dump_stacks(run_dir: Path, job: dict[str, Any]) -> list[str]:
    """Write ``stack-<label>-<pid>.txt`` for every process of the run: py-spy's Python stacks (read without
    stopping the process, ``--nonblocking``: py-spy's default mode pauses the process, which fails on a
    SIGSTOPped one) and the kernel's view of every thread; poke the flight recorder.
    Return the files written."""
    run_id = str(job.get("run_id") or "")
    if not run_id:
        return []
    spy = _py_spy(job)
    poke_flight_recorder(run_dir)
    written = []
    for pid in marked_pids(agent_key(run_id, run_dir)):
        env = _proc_environ(pid)
        cmd = _proc_cmd(pid)
        label = (
            f"rank{env['RANK']}"
            if "RANK" in env
            else re.sub(r"[^A-Za-z0-9_.-]", "_", Path(cmd.split(" ")[0] or "proc").name)
        )
        head = [
            f"pid {pid} state {_proc_state(pid)} rank {env.get('RANK', '-')} local_rank "
            f"{env.get('LOCAL_RANK', '-')}",
            f"cmd {cmd[:500]}",
            "",
        ]
        if spy is None:
            body = "py-spy: not installed in the node venv nor on PATH"
        else:
            try:
                out = subprocess.run(
                    [spy, "dump", "--pid", str(pid), "--nonblocking"],
                    capture_output=True,
                    text=True,
                    timeout=PY_SPY_TIMEOUT_S,
                    check=False,
                )
                body = f"py-spy dump --nonblocking (rc {out.returncode}):\n{out.stdout}{out.stderr}"
            except (OSError, subprocess.TimeoutExpired) as err:
                body = f"py-spy dump --nonblocking failed: {err}"
        path = run_dir / f"{STACK_PREFIX}{label}-{pid}.txt"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write("\n".join([*head, body, "", "kernel (/proc/PID/task/*):", _kernel_view(pid), ""]))
        written.append(path.name)
    return written


def watch_files(run_dir: Path) -> list[Path]:
    """Return the stack dumps and flight-recorder traces of the run directory (for collect)."""
    found = [*run_dir.glob(STACK_PREFIX + "*.txt"), *run_dir.glob(FLIGHT_RECORDER_DUMP + "*")]
    return sorted(p for p in found if p.is_file())


def cmd_stop(run_dir: Path, grace: float, dump: bool = False) -> dict[str, Any]:
    """Stop every process of the run on this node; safe to call again (``dump``: write stack dumps of every
    process of the run first, :func:`dump_stacks`)."""
    job = _read_json(run_dir / contract.JOB_FILE)
    run_id = str(job.get("run_id") or "")
    if not run_id:
        return {"ok": True, "changed": False, "left": [], "note": "no job here"}
    state = _read_json(run_dir / STATE_FILE)
    key = agent_key(run_id, run_dir)
    before = marked_pids(key)
    pgid = state.get("pid")
    running = bool(before) or _ours(pgid, key)
    stacks = dump_stacks(run_dir, job) if dump and running else []
    if running:
        (run_dir / contract.STOP_FILE).write_text(f"{_now()}\n")
    left = sweep(pgid, key, grace) if running else []
    # wait for the supervisor to record the end, so status reads "stopped" right after
    deadline = time.monotonic() + 5
    while running and time.monotonic() < deadline and _supervisor_alive(state):
        time.sleep(0.1)
    state = _read_json(run_dir / STATE_FILE)
    if state.get("state") in (
        contract.RUNNING,
        contract.STARTING,
    ):  # the supervisor is gone too: record it here
        state.update({"state": contract.STOPPED, "ended_at": _now(), "rc": state.get("rc")})
        _write_json(run_dir / STATE_FILE, state)
    return {
        "ok": not left,
        "changed": running,
        "killed": before,
        "left": left,
        "state": state.get("state"),
        **({"stacks": stacks} if dump else {}),
    }


SHARED_COMMANDS = ("shared-prepare", "shared-status", "shared-collect", "shared-stop")
COLLECT_ARCHIVE = contract.COLLECT_ARCHIVE
# what the launcher fetches from a node run directory and from its output_dir (small files only)
COLLECT_RUN_FILES = (
    contract.TRAINER_LOG,
    STATE_FILE,
    contract.JOB_FILE,
    contract.RC_FILE,
    "slurm.out",
    mift_gpu.TELEMETRY_FILE,
    mift_gpu.TELEMETRY_STATE,
    mift_gpu.AFTER_FILE,
)
COLLECT_OUTPUT_FILES = ("trainer_log.jsonl", "all_results.json", "train_results.json", "adapter_config.json")


def cmd_collect(run_dir: Path, remote: bool = False) -> dict[str, Any]:
    """Pack the run's logs, state and metrics into one archive in the run dir (one fetch instead of eight).

    Returns the status (as ``status``), the output files (full paths) and the archive's path.
    """
    status = cmd_status(run_dir, remote)
    # the trainer has ended (collect follows stop or success): its GPUs must be idle and healthy; on a login
    # host (remote) the GPUs are another host's
    gpu_after = None if remote or not status.get("run_id") else mift_gpu.after_check(run_dir)
    output_dir = Path(status["output_dir"])
    outputs = sorted(str(p) for p in output_dir.rglob("*") if p.is_file()) if output_dir.is_dir() else []
    archive = run_dir / COLLECT_ARCHIVE
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for folder, names in ((run_dir, COLLECT_RUN_FILES), (output_dir, COLLECT_OUTPUT_FILES)):
            for name in names:
                if (folder / name).is_file():
                    tar.add(folder / name, arcname=name)
        for path in watch_files(run_dir):
            tar.add(path, arcname=path.name)
        for name, path in rank_logs(run_dir).items():
            tar.add(path, arcname=name)
        for path in tensorboard_files(output_dir):
            tar.add(path, arcname=path.name)
    tmp.chmod(0o600)
    tmp.replace(archive)
    return {"ok": True, "status": status, "outputs": outputs, "archive": str(archive), "gpu_after": gpu_after}


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0912 - one branch per command
    """Parse the command line, run the command, print its JSON result."""
    parser = argparse.ArgumentParser(prog="mift_agent.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "command",
        choices=(
            "start",
            "prepare",
            "slurm-step",
            "status",
            "watch",
            "stop",
            "collect",
            "slurm-check",
            "slurm-checkpoints",
            "resume-step",
            *SHARED_COMMANDS,
        ),
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument(
        "--wait", type=float, default=30.0, help="start: seconds to wait for the trainer to run"
    )
    parser.add_argument(
        "--ranks", action="store_true", help="slurm-step: RUN_DIR is a shared run root: rank<SLURM_NODEID>"
    )
    parser.add_argument("--restart", type=int, default=0, help="slurm-step: Slurm's restart count")
    parser.add_argument(
        "--resume-step",
        default="none",
        help="slurm-step --restart: the checkpoint step to resume from, or none",
    )
    parser.add_argument("--nodes", type=int, default=1, help="resume-step: how many nodes must answer")
    parser.add_argument("--every", type=float, default=5.0, help="watch: seconds between two statuses")
    parser.add_argument("--for", dest="for_s", type=float, default=1200.0, help="watch: seconds in all")
    parser.add_argument("--job-gone", action="store_true", help="shared-stop: the Slurm job left its nodes")
    parser.add_argument(
        "--dump-stacks", action="store_true", help="stop: stack dumps of every process of the run first"
    )
    args = parser.parse_args(argv)
    run_dir: Path = args.run_dir.resolve()
    if not run_dir.is_dir():
        print(
            json.dumps({"ok": False, "state": contract.ABSENT, "error": f"{run_dir}: no such run directory"})
        )
        return 0 if args.command != "start" else 1
    result: Any
    if args.command == "start":
        result = cmd_start(run_dir, args.grace, args.wait)
    elif args.command == "prepare":
        result = cmd_prepare(run_dir)
    elif args.command == "slurm-step":
        step = None if args.resume_step == "none" else int(args.resume_step)
        result = cmd_slurm_step(run_dir, args.grace, args.ranks, args.restart, step)
    elif args.command == "slurm-checkpoints":
        result = cmd_slurm_checkpoints(run_dir)
    elif args.command == "resume-step":
        try:
            found = resume_step(sys.stdin.read().splitlines(), args.nodes)
        except ValueError as err:
            print(f"mift_agent: resume-step: {err}", file=sys.stderr)
            return 1
        print("none" if found is None else found)
        return 0
    elif args.command == "slurm-check":
        result = cmd_slurm_check(run_dir)
    elif args.command in SHARED_COMMANDS:
        result = cmd_shared(args.command.removeprefix("shared-"), run_dir, args.grace, args.job_gone)
    elif args.command == "status":
        result = {"ok": True, **cmd_status(run_dir)}
    elif args.command == "watch":
        return cmd_watch(run_dir, args.every, args.for_s)
    elif args.command == "collect":
        result = cmd_collect(run_dir)
    else:
        result = cmd_stop(run_dir, args.grace, args.dump_stacks)
    print(json.dumps(result))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
