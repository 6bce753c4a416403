"""A provisioned test rig plus the launcher pointed at it: job specs, run records, training processes."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mift_testsupport.launcher import Launcher
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.trainers import TRAINER_PROBE, parse_probe, wait_until_none

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Callable

    from mift_testsupport.rig import Rig


# trainer processes per test host in the launcher e2e and faults suites (gloo on CPU): more than one, as a
# real MI300X node runs 8, so that local ranks, per-rank logs and stack dumps and "which rank on which node"
# are exercised; no more, the CI machine has 2 cores
RANKS_PER_HOST = 2


# A trainer paced like a real one: every training step sleeps PACE_S first (a TEST DOUBLE of a slow step,
# tests/faults/inject/sitecustomize.py, first on the trainer's PYTHONPATH). The tiny model on CPU otherwise
# spins every core it is given, so a run that only has to keep running until the test acts on it (kills,
# cuts, stops it) would take the 2 cores from everything else CI runs beside it. Cluster.job(paced=True).
PACE_S = 1.0
INJECT = REPO_ROOT / "tests" / "faults" / "inject" / "sitecustomize.py"
INJECT_DIR = "/opt/mift-faults/inject"


@dataclass(frozen=True)
class JobBase:
    """The job spec, training YAML and DeepSpeed JSON a test job is one edit away from (``nproc_per_node``:
    set in every job spec written; None: the base job spec's own)."""

    job: Path = REPO_ROOT / "configs" / "jobs" / "tiny-lora-z3.yaml"
    train: Path = REPO_ROOT / "configs" / "train" / "tiny_cpu_lora_sft.yaml"
    deepspeed_dir: Path = REPO_ROOT / "configs" / "deepspeed"
    deepspeed: str = "ds_z3.json"
    train_overrides: dict[str, Any] = field(default_factory=dict)  # set in every training YAML written
    nproc_per_node: int | None = None


class Cluster:
    """The provisioned hosts of a rig, the launcher (its runs folder under ``work``) and helpers."""

    def __init__(
        self, rig: Rig, work: Path, *, real_backend: bool = True, base: JobBase | None = None
    ) -> None:
        self.rig = rig
        self.work = work
        self.hosts = tuple(range(1, rig.hosts + 1))
        self.inventory = rig.inventory
        self.runs = work / "runs"
        self.launcher = Launcher(self.runs, work / "launcher-logs", real_backend=real_backend)
        self.base = base or JobBase()

    # --- the launcher ---------------------------------------------------------------------------------
    def run(
        self, *args: str, timeout: float = 900, real_backend: bool | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``python -m launcher ARGS`` to its end."""
        return self.launcher.run(*args, timeout=timeout, real_backend=real_backend)

    def start(self, *args: str, real_backend: bool | None = None) -> tuple[subprocess.Popen[str], Path]:
        """``python -m launcher ARGS`` in the background: the process and the file with its output."""
        return self.launcher.start(*args, real_backend=real_backend)

    def job(
        self,
        name: str,
        *,
        deepspeed: str | None = None,
        max_steps: int | None = None,
        save_steps: int | None = None,
        paced: bool = False,
        **spec: Any,  # noqa: ANN401 - job spec keys and their YAML values
    ) -> Path:
        """Write a job spec named ``name`` and its training YAML under the work dir; return the spec's path.

        ``max_steps`` (with it, ``save_steps`` defaults to 10000: no checkpoint) and ``save_steps`` go into
        the training YAML, after the base's ``train_overrides``; ``spec`` goes into the job spec. ``paced``:
        every training step sleeps ``PACE_S`` first (the slow-step test double installed on every host).
        """
        cfg = yaml.safe_load(self.base.train.read_text())
        cfg.update(self.base.train_overrides)
        if max_steps is not None:
            cfg.update(max_steps=max_steps, save_steps=10_000)
        if save_steps is not None:
            cfg.update(save_steps=save_steps)
        # a configs/train/ folder next to configs/data/: validation maps /opt/mift/data/... to it
        configs = self.work / "configs"
        (configs / "train").mkdir(parents=True, exist_ok=True)
        if not (configs / "data").exists():
            (configs / "data").symlink_to(REPO_ROOT / "configs" / "data")
        train = configs / "train" / f"{name}.yaml"
        train.write_text(yaml.safe_dump(cfg, sort_keys=False))
        job = yaml.safe_load(self.base.job.read_text())
        if paced:
            self.install_injection()
            env = {**(job.get("env") or {}), **(spec.get("env") or {})}
            env.setdefault("MIFT_FAULTS_SLOW_STEPS", f"1-{10**9}:{PACE_S:g}")
            spec["env"] = {**env, "PYTHONPATH": INJECT_DIR}
        if self.base.nproc_per_node is not None:
            job["nproc_per_node"] = self.base.nproc_per_node
        job.update(
            name=name,
            train_config=str(train),
            deepspeed=str(self.base.deepspeed_dir / (deepspeed or self.base.deepspeed)),
            **spec,
        )
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job, sort_keys=False))
        return path

    def install_injection(self) -> None:
        """Put the trainer test double (``INJECT``) into ``INJECT_DIR`` on every host (again: a host may be
        new)."""
        text = shlex.quote(INJECT.read_text())
        for host in self.hosts:
            self.ssh(host, f"mkdir -p {INJECT_DIR} && printf %s {text} > {INJECT_DIR}/sitecustomize.py")

    def run_dirs(self) -> set[str]:
        return {p.name for p in self.runs.iterdir()} if self.runs.is_dir() else set()

    def run_dir(self, name: str) -> Path:
        """The controller run directory of the latest run of job ``name``."""
        found = sorted(p for p in self.runs.iterdir() if p.name.startswith(f"{name}-"))
        assert found, f"no run directory for {name} in {self.runs}"
        return found[-1]

    def record(self, name: str) -> dict[str, Any]:
        """The run record of job ``name`` ({} while there is none or it is being written)."""
        try:
            return dict(json.loads((self.run_dir(name) / "record.json").read_text()))
        except (OSError, ValueError, AssertionError):
            return {}

    def stop_leftover_runs(self, before: set[str]) -> list[str]:
        """Stop every run created since ``before`` that started trainers (a bad input wrongly accepted)."""
        stopped = []
        for run_id in sorted(self.run_dirs() - before):
            try:
                record = json.loads((self.runs / run_id / "record.json").read_text())
            except (OSError, ValueError):
                continue
            if record.get("hosts"):
                self.run("stop", run_id, timeout=300)
                stopped.append(run_id)
        return stopped

    # --- the hosts ------------------------------------------------------------------------------------
    def ssh(self, host: int, command: str, *, check: bool = True, timeout: float = 120) -> str:
        """Run a shell command on hostN; return its stdout."""
        return str(self.rig.ssh(host, command, check=check, timeout=timeout).stdout)

    def trainer_processes_on(self, host: int) -> list[str]:
        """The training processes alive on one host."""
        return parse_probe(self.ssh(host, TRAINER_PROBE))

    def trainer_processes(self) -> dict[int, list[str]]:
        """Host -> the training processes alive there."""
        return {host: self.trainer_processes_on(host) for host in self.hosts}

    def wait_no_trainers(self, seconds: float, *, since: float | None = None) -> float:
        """Wait until no host runs a training process; return the seconds since ``since`` (or now)."""
        return wait_until_none(self.trainer_processes, seconds, since=since)

    def watch_until_clean(
        self, proc: subprocess.Popen[str], since: float, seconds: float = 180
    ) -> tuple[float, float]:
        """Watch the hosts from ``since`` until the launcher has exited and no training process is left.

        Returns (seconds from ``since`` to the last time a training process was seen, 0 if never; seconds from
        ``since`` to the launcher's exit). Raises when processes are still there after ``seconds``.
        """
        last_seen = since
        ended: float | None = None
        while True:
            now = time.monotonic()
            if ended is None and proc.poll() is not None:
                ended = now - since
            left = self.trainer_processes()
            if any(left.values()):
                last_seen = time.monotonic()
            elif ended is not None:
                return last_seen - since, ended
            if now - since > seconds:
                raise AssertionError(f"launcher exit {ended}; processes left {seconds:.0f} s after: {left}")
            time.sleep(0.5)

    def node_file(self, host: int, run_id: str, name: str) -> str:
        """A file of the node run directory ('' when missing)."""
        return self.ssh(host, f"cat /var/lib/mift/runs/{shlex.quote(run_id)}/{name}", check=False)

    def trainer_log(self, host: int, output_dir: str) -> list[dict[str, Any]]:
        """The entries of ``output_dir``'s trainer_log.jsonl on ``host`` (LLaMA-Factory's log of each step;
        every attempt of a resumed run appends), in order; [] when there is none; unparsable lines are left
        out."""
        text = self.ssh(host, f"cat {shlex.quote(output_dir)}/trainer_log.jsonl 2>/dev/null; true")
        entries = []
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("current_steps"), int):
                entries.append(entry)
        return entries

    def node_state(self, host: int, run_id: str) -> dict[str, Any]:
        try:
            return dict(json.loads(self.node_file(host, run_id, "state.json") or "{}"))
        except ValueError:
            return {}

    def wait_step(
        self,
        run_id_of: Callable[[], str],
        proc: subprocess.Popen[str] | None = None,
        seconds: float = 600,
    ) -> str:
        """Wait until host1's trainer logged a step; ``run_id_of()`` returns the run id (or '')."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"launcher ended early (rc={proc.returncode})")
            run_id = run_id_of()
            if run_id:
                out = self.ssh(
                    1,
                    f"tail -c 2000 /var/lib/mift/runs/{shlex.quote(run_id)}/output/trainer_log.jsonl",
                    check=False,
                )
                if '"current_steps"' in out:
                    return str(run_id)
            time.sleep(1)
        raise AssertionError(f"no logged training step within {seconds:.0f} s")

    def run_id_of(self, name: str) -> Callable[[], str]:
        """A function returning the run id of job ``name`` once its record exists ('' before)."""
        return lambda: str(self.record(name).get("run_id", ""))
