"""Plan: the one immutable run plan, built once from the loaded job and the node facts.

The plan holds the bytes of every file the nodes get (``train.yaml``, ``ds_config.json``), rendered here from
the configs read at load time; :func:`validate_plan` validates exactly these bytes, and the ship step copies
exactly these bytes to the nodes.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from launcher.exceptions import ConfigurationError
from launcher.follow.watchdog import with_flight_recorder
from launcher.node import contract
from launcher.preflight.nodeenv import render_node_env
from launcher.problems import ConfigKind, FileReport
from launcher.spec.config_io import parse_config
from launcher.spec.nodelayout import layout

if TYPE_CHECKING:
    from collections.abc import Mapping

    from launcher.fabric.env import FabricPlan
    from launcher.fabric.runtime import TransportCheck
    from launcher.planning.training import TrainingPlan
    from launcher.preflight.checks import NodeFacts
    from launcher.spec.jobspec import JobSpec
    from launcher.validation.job import LoadedJob

TRAIN_FILE = "train.yaml"
DS_FILE = "ds_config.json"


@dataclass(frozen=True)
class ResumeFrom:
    """What ``run --resume RUN`` takes from RUN."""

    run_id: str
    output_dir: str  # node path as the new run sees it (relative: to the new node run directory)


@dataclass(frozen=True)
class RunPlan:
    """Everything a run does on its nodes, decided before anything is written on them.

    Attributes:
        run_id: the run.
        job: the loaded job (spec and the configs as read).
        facts: what preflight found on the nodes (hosts in rank order).
        files: file name -> the exact bytes every node gets (validated by :func:`validate_plan`).
        deepspeed_name: the DeepSpeed file's name, the planner's strategy, or ``none``.
        output_dir: the trainer's output_dir on the nodes.
        expect_outputs: files in output_dir (first node) that mean the training finished.
        master_addr: torchrun's rendezvous address.
        envs: host -> the trainer's environment (secrets in clear; masked in the record).
        jobs: host -> the node agent's job description (``mift_contract.Job``).
        training: with ``plan: auto``, the training plan whose split (and, with ``deepspeed: auto``,
        strategy) ``files`` carry; None when the YAML runs as written.
    """

    run_id: str
    job: LoadedJob
    facts: NodeFacts
    files: Mapping[str, bytes]
    deepspeed_name: str
    output_dir: str
    expect_outputs: tuple[str, ...]
    master_addr: str
    envs: Mapping[str, Mapping[str, str]]
    jobs: Mapping[str, contract.Job]
    notes: tuple[str, ...] = field(default=())
    # plan: auto: the applied training plan (launcher.engine.split.record_of); None: the YAML as written
    training: TrainingPlan | None = None
    # RDMA expected on a multi-node job: RCCL/NCCL's choice at run time is judged (launcher.fabric.runtime)
    transport: TransportCheck | None = None

    @property
    def spec(self) -> JobSpec:
        """Return the job spec."""
        return self.job.spec

    @functools.cached_property
    def _train_parsed(self) -> Any:  # noqa: ANN401 - YAML
        return yaml.safe_load(self.files[TRAIN_FILE])

    @property
    def train(self) -> Any:  # noqa: ANN401 - YAML
        """The shipped training YAML, parsed once beside its bytes (each reader gets its own copy)."""
        return copy.deepcopy(self._train_parsed)

    @property
    def hosts(self) -> list[str]:
        """Return the hosts in rank order."""
        return list(self.facts.hosts)


def expected_outputs(train: Mapping[str, Any]) -> tuple[str, ...]:
    """Return the files whose presence in output_dir (on the first node) means the training finished."""
    if str(train.get("finetuning_type", "lora")) == "lora":
        return ("adapter_model.safetensors", "all_results.json")
    return ("config.json", "all_results.json")


def _auto_deepspeed(
    train: Mapping[str, Any], facts: NodeFacts, model_config: Path | None = None
) -> tuple[str, dict[str, Any]]:
    """Ask the planner for a DeepSpeed config (``deepspeed: auto`` at the YAML's own split)."""
    from launcher.engine.split import cluster_of  # noqa: PLC0415 - only for deepspeed: auto
    from launcher.planning.training_yaml import choose_deepspeed_config  # noqa: PLC0415

    cluster = cluster_of(facts)  # GPU memory: mift_gpus, else torch, else the MI300X default
    return choose_deepspeed_config(
        model_config or train.get("model_name_or_path"),
        dict(train),
        cluster.gpus_per_node,
        cluster.nodes,
        cluster.gpu_mem_gib,
        cluster.host_mem_gib,
    )


def last_common_checkpoint(facts: NodeFacts) -> int | None:
    """Return the last complete checkpoint step present on every node (preflight listed them), or None."""
    found = [set(facts.probe[h].get("checkpoints") or []) for h in facts.hosts]
    common = set.intersection(*found) if found else set()
    return max(common) if common else None


def _resume_step(facts: NodeFacts, resume: ResumeFrom, spec_path: Path) -> int:
    """Return the last complete checkpoint step present on every node of the resumed run."""
    step = last_common_checkpoint(facts)
    if step is None:
        found = {h: facts.probe[h].get("checkpoints") or [] for h in facts.hosts}
        host = next((h for h, v in found.items() if not v), facts.hosts[0])
        raise ConfigurationError.at(
            spec_path,
            "resume",
            f"no checkpoint-N in {resume.output_dir} on {host} (run {resume.run_id}); nothing to resume",
            "resume",
        )
    return step


def _deepspeed(
    job: LoadedJob, train: dict[str, Any], facts: NodeFacts, training: TrainingPlan | None
) -> tuple[dict[str, Any] | None, str]:
    """Return the DeepSpeed config the run ships (None: no DeepSpeed) and its name."""
    if job.deepspeed_from == "auto" and training is not None:
        choice = training.choice
        assert choice is not None  # auto_plan refuses a plan without a choice
        return training.deepspeed_config(), choice.strategy.value
    if job.deepspeed_from == "auto":
        name, chosen = _auto_deepspeed(train, facts, job.spec.plan_model_config)
        return chosen or None, name  # the planner returns ("none", {}) when plain DDP is fastest
    if job.deepspeed is not None:
        return copy.deepcopy(dict(job.deepspeed.data)), job.deepspeed.path.name
    return None, "none"


def _configs(
    job: LoadedJob,
    facts: NodeFacts,
    run_id: str,
    resume: ResumeFrom | None,
    training: TrainingPlan | None,
) -> tuple[dict[str, Any], dict[str, Any] | None, str, str, TrainingPlan | None]:
    """Return the shipped training config, DeepSpeed config, DeepSpeed name, output_dir and the plan.

    ``training``: a plan already made (``plan: probe`` probes before this); else ``plan: auto`` plans here.
    """
    from launcher.engine.split import auto_plan  # noqa: PLC0415 - only for plan: auto

    spec = job.spec
    train = copy.deepcopy(dict(job.train.data))
    if training is None and spec.plan != "as_written":
        training = auto_plan(job, train, facts)
    if training is not None:
        # the same global batch, re-split: micro-batch, accumulation, checkpointing (validated after this)
        train.update(training.yaml_overrides())
    ds, name = _deepspeed(job, train, facts, training)
    if ds is not None:
        train["deepspeed"] = DS_FILE  # relative: the trainer runs in the node run directory
    else:
        train.pop("deepspeed", None)
    output_dir = spec.node_output_dir(run_id)
    if spec.resume is False:
        train["overwrite_output_dir"] = True
        train.pop("resume_from_checkpoint", None)
    else:
        train["overwrite_output_dir"] = False
        if isinstance(spec.resume, str):
            train["resume_from_checkpoint"] = spec.resume
        elif resume is None and (step := last_common_checkpoint(facts)) is not None:
            # resume: true names the last checkpoint complete on every node, not the trainer's "last
            # folder", which may be one a stop cut short while saving (none: the trainer decides, as before)
            train["resume_from_checkpoint"] = f"{output_dir}/checkpoint-{step}"
    if resume is not None:
        output_dir = resume.output_dir
        train["resume_from_checkpoint"] = (
            f"{output_dir}/checkpoint-{_resume_step(facts, resume, job.spec_path)}"
        )
        train["overwrite_output_dir"] = False
    train["output_dir"] = output_dir
    if len(facts.hosts) > 1 and not job.spec.output_shared:
        # output_dir is a node path, not shared storage: every node saves a complete checkpoint (values the
        # configs set themselves are kept); otherwise only the first node could resume. On shared storage
        # (output_shared) the ranks write one checkpoint together: the first rank its common files
        train = {"save_on_each_node": True, **train}
        if ds is not None:
            ds = {**ds, "checkpoint": {"use_node_local_storage": True, **dict(ds.get("checkpoint") or {})}}
    return train, ds, name, output_dir, training


def require_liger(facts: NodeFacts, why: str) -> None:
    """Refuse, in one line naming the host, a job that needs liger-kernel on a node whose venv lacks it.

    Provisioning installs it only when asked (``llamafactory_liger_kernel: true``); without it
    LLaMA-Factory would fail at start on every node. Preflight's probe reports it (``optional``); a node
    whose probe could not ask its venv is not judged here.
    """
    for host in facts.hosts:
        optional = facts.probe.get(host, {}).get("optional")
        if isinstance(optional, dict) and not optional.get("liger_kernel"):
            raise ConfigurationError(
                f"{host}: {why}, but liger-kernel is not installed in the node's venv: provision with "
                "llamafactory_liger_kernel: true or leave liger off; nothing was started"
            )


def fabric_plan(spec: JobSpec, facts: NodeFacts) -> FabricPlan | None:
    """Return the job's fabric plan (:mod:`launcher.fabric.env`); its warnings and notes go to ``facts``. A
    missing interface, settings that differ across nodes, or sockets where RDMA is expected
    (``fabric.socket_fallback: fail``) raise, one line naming the node. None when a node's probe has no
    ``net`` facts (a probe from before them): nothing is derived."""
    from launcher.fabric.env import resolve_fabric  # noqa: PLC0415

    if not all(isinstance(facts.probe.get(h, {}).get("net"), dict) for h in facts.hosts):
        return None
    spec_env = spec.env_strings()
    overrides = {
        h: {**{str(k): str(v) for k, v in (facts.node_env.get(h) or {}).items()}, **spec_env}
        for h in facts.hosts
    }
    fabric = resolve_fabric(facts.hosts, facts.train_address, facts.probe, overrides, spec.fabric)
    facts.warnings.extend(w for w in fabric.warnings if w not in facts.warnings)
    facts.notes.extend(n for n in fabric.notes if n not in facts.notes)
    return fabric


def fabric_of(spec: JobSpec, facts: NodeFacts) -> dict[str, dict[str, str]]:
    """Return each host's derived NCCL/Gloo variables (:func:`fabric_plan`; {} when nothing is derived)."""
    fabric = fabric_plan(spec, facts)
    return {h: dict(e) for h, e in fabric.envs.items()} if fabric is not None else {}


def build_plan(
    job: LoadedJob,
    facts: NodeFacts,
    run_id: str,
    resume: ResumeFrom | None = None,
    training: TrainingPlan | None = None,
) -> RunPlan:
    """Build the run plan: the shipped files' bytes, the per-node environment and job description.

    ``training``: the training plan to apply (``plan: probe``, probed before); None: planned here if asked.
    """
    spec = job.spec
    train, ds, ds_name, output_dir, training = _configs(job, facts, run_id, resume, training)
    if train.get("enable_liger_kernel") is True:
        by_plan = training is not None and training.choice is not None and training.choice.split.liger
        require_liger(
            facts,
            "the plan switches liger kernels on (plan_liger)"
            if by_plan
            else ("the training YAML switches liger kernels on (enable_liger_kernel)"),
        )
    files = {TRAIN_FILE: yaml.safe_dump(train, sort_keys=False).encode()}
    if ds is not None:
        files[DS_FILE] = (json.dumps(ds, indent=2) + "\n").encode()
    master_addr = spec.master_addr or facts.train_address[facts.master]
    fabric = None if spec.slurm.login_only else fabric_plan(spec, facts)
    # the run (not `check`) also asks RCCL/NCCL for its transport line where it is judged; the overrides win
    fabric_env = {h: {**e, **fabric.debug_env} for h, e in fabric.envs.items()} if fabric else None
    envs = render_node_env(
        spec,
        hosts=facts.hosts,
        master_addr=master_addr,
        nproc_per_node=facts.nproc_per_node,
        run_id=run_id,
        node_env=facts.node_env,
        fabric_env=fabric_env,
    )
    envs = {  # a node whose stack is the cpu backend has no collective to record
        h: with_flight_recorder(e, gpu=(facts.stack.get(h) or {}).get("backend") != "cpu")
        for h, e in envs.items()
    }
    expect = expected_outputs(train)

    def cli(host: str) -> str:  # the entry point preflight found (job spec node_venv, else the inventory's)
        found = facts.probe.get(host, {}).get("trainer_cli")
        return str(found) if found else f"{spec.node_venv or layout().venv}/bin/llamafactory-cli"

    jobs = {
        host: contract.Job(
            run_id=run_id,
            node_rank=rank,
            argv=[cli(host), "train", TRAIN_FILE],
            output_dir=output_dir,
            expect_outputs=list(expect) if rank == 0 else [],
            # the checkpoint the trainer resumes from ("last": LLaMA-Factory picks output_dir's last one)
            resume_from=train.get("resume_from_checkpoint") or ("last" if spec.resume is True else None),
            # GPU sampling period of the node agent (0: off); docs/launcher.md "GPU telemetry"
            telemetry_period_s=spec.telemetry.period_s,
        )
        for rank, host in enumerate(facts.hosts)
    }
    return RunPlan(
        run_id=run_id,
        job=job,
        facts=facts,
        files=MappingProxyType(files),
        deepspeed_name=ds_name,
        output_dir=output_dir,
        expect_outputs=expect,
        master_addr=master_addr,
        envs=MappingProxyType({h: MappingProxyType(e) for h, e in envs.items()}),
        jobs=MappingProxyType(jobs),
        training=training,
        transport=fabric.transport_check if fabric else None,
    )


def validate_plan(plan: RunPlan, *, builtin: bool | None = None) -> FileReport:
    """Validate the bytes the nodes will get (parsed by the one loader), naming the source files in problems.

    The launcher-owned keys (``deepspeed``, ``output_dir``, ...) are part of what is checked, and so is a
    DeepSpeed config the planner chose (``deepspeed: auto``).
    """
    from launcher.validation.llamafactory import validate_llamafactory  # noqa: PLC0415

    job = plan.job
    label = f"{job.train.label} (as shipped)"
    train = parse_config(plan.files[TRAIN_FILE], Path(TRAIN_FILE))
    ds_label = f"{job.deepspeed.label if job.deepspeed else plan.deepspeed_name} (as shipped)"
    ds = parse_config(plan.files[DS_FILE], Path(DS_FILE)) if DS_FILE in plan.files else None
    report = validate_llamafactory(
        train, label, job.train.path.parent, builtin=builtin, chosen_deepspeed=(ds_label, ds)
    )
    return report if report.problems else FileReport(label, ConfigKind.LLAMAFACTORY, report.summary)


def with_tokenized_path(plan: RunPlan, path: str) -> RunPlan:
    """The plan whose shipped training YAML reads the tokenized dataset at ``path`` (tokenize once)."""
    train = yaml.safe_load(plan.files[TRAIN_FILE])
    train["tokenized_path"] = path
    files = {**plan.files, TRAIN_FILE: yaml.safe_dump(train, sort_keys=False).encode()}
    return dataclasses.replace(plan, files=MappingProxyType(files))
