"""The node agent's ``start`` and its supervisor: the trainer in its own session and process group, its
environment (rank logs, the flight recorder, the GPU sampler), the exit status recorded. Standard library
only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from . import contract
from . import gpu as mift_gpu
from .bundle import _unpacked_job
from .common import (
    MARKER,
    STATE_FILE,
    _identity,
    _now,
    _supervisor_alive,
    agent_key,
    output_dir_of,
    read_json,
    sweep,
    write_json,
)
from .watch import flight_recorder_env


def _trainer_env(run_dir: Path, job: dict[str, Any]) -> dict[str, str]:
    extra = read_json(run_dir / contract.ENV_FILE)
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
    env = read_json(run_dir / contract.ENV_FILE)
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
        write_json(
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
    write_json(run_dir / STATE_FILE, state)
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
    write_json(run_dir / STATE_FILE, state)


def cmd_start(run_dir: Path, grace: float, wait: float) -> dict[str, Any]:
    """Start the trainer through a detached supervisor; return once it runs (or ended)."""
    job, bad = _unpacked_job(run_dir)
    if bad:
        return {"ok": False, "error": bad}
    state = read_json(run_dir / STATE_FILE)
    if state.get("state") in (contract.RUNNING, contract.STARTING) and _supervisor_alive(state):
        return {"ok": True, "changed": False, **state}
    for name in (STATE_FILE, contract.RC_FILE, contract.PID_FILE, contract.STOP_FILE):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
    write_json(run_dir / STATE_FILE, {"state": contract.STARTING, "started_at": _now()})
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
        state = read_json(run_dir / STATE_FILE)
        if state.get("state") not in (None, contract.STARTING):
            break
        time.sleep(0.05)
    return {"ok": state.get("state") in (contract.RUNNING, contract.EXITED), "changed": True, **state}
