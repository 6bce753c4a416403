"""The probe's runner: each candidate as a short ``python -m launcher run`` on the job's first node.

:class:`LauncherProber` writes, per candidate, a job spec (the job's own, with ``hosts`` the first node,
``plan: as_written``, the candidate's DeepSpeed JSON or ``none`` and a job timeout of the probe budget
left) and a training YAML (the job's, with the candidate's micro-batch, accumulation and checkpointing,
``max_steps`` the probe's steps, ``logging_steps: 1``, ``include_num_input_tokens_seen: true`` so that
LLaMA-Factory logs a precise throughput at every step, and ``save_strategy: "no"``), runs it through the
engine's own
:func:`launcher.engine.run.run_job` (validation, preflight, follow, collect: everything a real run does) and
reads the steady tokens/s from the collected ``metrics.jsonl`` of the run directory it returns
(:func:`launcher.planning.probe.steady_tokens_per_s`).

Used by ``launcher plan --probe`` and by ``run`` for a job spec with ``plan: probe``
(:func:`probe_before_run`). The probe runs' own run directories are kept (``<name>-probe<i>-...``), next
to the files written for them under ``<work dir>/probe<i>/``.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import yaml

from launcher.engine.plan import require_liger
from launcher.exceptions import LauncherError
from launcher.exit_codes import OK
from launcher.planning.candidate import ProbeMeasure
from launcher.planning.dsconfig import deepspeed_config
from launcher.planning.probe import steady_tokens_per_s
from launcher.preflight.checks import PreflightOnce, facts_of_host
from launcher.rundir.metrics import read_jsonl
from launcher.rundir.runs import RunRecord, exit_code_of, runs_root

if TYPE_CHECKING:
    from collections.abc import Callable

    from launcher.planning.candidate import Candidate
    from launcher.planning.training import TrainingPlan
    from launcher.preflight.checks import NodeFacts
    from launcher.rundir.runs import RunDir
    from launcher.validation.job import LoadedJob


class RunJob(Protocol):
    """How a probe candidate runs: :func:`launcher.engine.run.run_job`."""

    def __call__(
        self,
        job_path: Path,
        *,
        inventory: Path | None,
        detach: bool,
        out: IO[str] | None = None,
        preflight_once: PreflightOnce | None = None,
    ) -> RunDir: ...


# keys of the training YAML the probe sets (the candidate's split comes on top)
PROBE_TRAIN_KEYS: dict[str, Any] = {
    "logging_steps": 1,
    "include_num_input_tokens_seen": True,
    "save_strategy": "no",
    "overwrite_cache": False,  # the later candidates reuse the first one's tokenized dataset
}


@dataclass
class LauncherProber:
    """Runs one candidate for a few steps on ``host`` through ``python -m launcher run`` (the real thing)."""

    job: LoadedJob
    host: str
    inventory: Path | None
    workdir: Path
    out: IO[str]
    run_job: RunJob  # launcher.engine.run.run_job (given by the caller: the engine imports this module)
    index: int = field(default=0)
    # one preflight for every candidate (the job's own under plan: probe; else the first candidate's)
    preflight: PreflightOnce = field(default_factory=PreflightOnce)

    def prepare(self, candidate: Candidate, steps: int, timeout_s: float) -> Path:
        """Write the probe's training YAML, DeepSpeed JSON and job spec; return the job spec's path."""
        self.index += 1
        where = self.workdir / f"probe{self.index}"
        where.mkdir(parents=True, exist_ok=True)
        train = dict(self.job.train.data)
        train.pop("deepspeed", None)
        for key in ("eval_strategy", "evaluation_strategy"):
            if key in train:
                train[key] = "no"
        split = candidate.split
        train.update(
            PROBE_TRAIN_KEYS,
            per_device_train_batch_size=split.micro_batch,
            gradient_accumulation_steps=split.accumulation,
            disable_gradient_checkpointing=not split.checkpointing,
            max_steps=steps,
        )
        if split.liger or "enable_liger_kernel" in train:
            train["enable_liger_kernel"] = split.liger
        (where / "train.yaml").write_text(yaml.safe_dump(train, sort_keys=False))
        ds = deepspeed_config(candidate.strategy)
        if ds is not None:
            (where / "ds.json").write_text(json.dumps(ds, indent=2) + "\n")
        spec = self.job.spec.model_dump(mode="json", exclude_none=True)
        spec.update(
            name=f"{self.job.spec.name[:48]}-probe{self.index}",
            train_config="train.yaml",
            deepspeed="ds.json" if ds is not None else "none",
            plan="as_written",
            hosts=[self.host],
            resume=False,
            output_dir="output",
            timeouts={**spec.get("timeouts", {}), "job_s": max(1, math.ceil(timeout_s))},
        )
        # the spec carries the job's env (secrets such as HF_TOKEN included): private, and removed once the
        # probe ran (see __call__); the probe run's own record keeps them masked, as every run record does
        path = where / "job.yaml"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(yaml.safe_dump(spec, sort_keys=False))
        return path

    def __call__(self, candidate: Candidate, steps: int, timeout_s: float) -> ProbeMeasure:
        """Run the candidate; return its steady tokens/s on the node, or ``failed`` with the reason."""
        spec_path = self.prepare(candidate, steps, timeout_s)
        print(f"probe: {candidate.describe()} ({steps} steps, at most {timeout_s:.0f} s)", file=self.out)
        start = time.monotonic()
        try:
            run = self.run_job(
                spec_path, inventory=self.inventory, detach=False, out=self.out, preflight_once=self.preflight
            )
        except LauncherError as err:
            return ProbeMeasure(candidate, "failed", wall_s=time.monotonic() - start, note=_one_line(err))
        finally:
            spec_path.unlink(missing_ok=True)
        wall = time.monotonic() - start
        steady = steady_tokens_per_s(read_jsonl(run.path / "metrics.jsonl"))
        if steady is None:  # a run stopped at the budget still counts when it logged two steps
            record = _record(run)
            code = exit_code_of(record.status)
            why = record.result_reason or record.status or f"exit {code}"
            if code == OK:
                why = "fewer than 2 steps logged with a throughput"
            return ProbeMeasure(candidate, "failed", wall_s=wall, note=f"{run.run_id}: {why}")
        return ProbeMeasure(candidate, "measured", node_tokens_per_s=steady[0], wall_s=wall, note=run.run_id)


def _record(run: RunDir) -> RunRecord:
    try:
        return run.record()
    except LauncherError:
        return RunRecord(run.run_id, "")


def _one_line(err: BaseException) -> str:
    return "; ".join(line.strip() for line in str(err).splitlines() if line.strip())


def probe_workdir(name: str) -> Path:
    """Return a fresh folder for the files of one probe (under the runs folder)."""
    path = runs_root() / "probes" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{time.monotonic_ns() % 10**6}"
    path.mkdir(parents=True, exist_ok=False)
    return path


def probe_before_run(  # noqa: PLR0917 - the run's step, as run_job calls it
    job: LoadedJob,
    facts: NodeFacts,
    inventory: Path | None,
    run: RunDir,
    out: IO[str],
    run_job: Callable[..., RunDir],
) -> TrainingPlan:
    """``plan: probe``: plan as ``auto``, run the best candidates for a few steps on the first node, pick by
    measurement (:mod:`launcher.planning.probe`); the probe runs are runs of their own, named
    ``<name>-probe<i>``. ``run_job``: :func:`launcher.engine.run.run_job`, which runs each probe run.
    """
    from launcher.engine.split import auto_plan  # noqa: PLC0415
    from launcher.planning.probe import run_probe  # noqa: PLC0415

    if job.spec.plan_liger:  # before the probe's minutes: its candidates would all fail at start
        require_liger(facts, "plan_liger: true lets the plan switch liger kernels on")
    training = auto_plan(job, dict(job.train.data), facts)
    run.set_status("probing")
    workdir = run.path / "probe"
    prober = LauncherProber(job, facts.master, inventory, workdir, out, run_job)
    prober.preflight = PreflightOnce(facts_of_host(facts, facts.master))  # checked a moment ago
    probed = run_probe(training, prober, clock=time.monotonic)
    assert probed.probe is not None
    print(probed.probe.reason(), file=out, flush=True)
    run.set_status("preflight")
    return probed
