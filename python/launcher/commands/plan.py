"""``plan JOB``: per-strategy memory estimates and the fastest strategy that fits."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.exit_codes import BAD_INPUT, OK, ExitCode
from launcher.planning.hardware import NODE_PRESETS
from launcher.planning.memory import SAFETY_MARGIN

if TYPE_CHECKING:
    from launcher.planning.hardware import Accelerator
    from launcher.planning.memory import Cluster
    from launcher.planning.training import TrainingPlan
    from launcher.validation.job import LoadedJob


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``plan`` subcommand."""
    p = subparsers.add_parser(
        "plan",
        help="estimate memory and speed of every strategy and split; pick the fastest that fits",
        description="Estimate per-GPU and per-host memory of no DeepSpeed, ZeRO-2, ZeRO-3 and ZeRO-3 with "
        "offload for a job, mark which fit with a safety margin, and pick the fastest that fits; then the "
        "whole training plan: every strategy x micro-batch x accumulation x checkpointing at the job's "
        "global batch, with memory, predicted tokens/s and the choice (applied by `run` with plan: auto).",
    )
    p.add_argument("job", type=Path, help="job spec YAML")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument(
        "--model-config", type=Path, help="the model's config.json or folder (default: from the job)"
    )
    p.add_argument(
        "--hardware", choices=sorted(NODE_PRESETS), default="mi300x", help="preset (default: mi300x)"
    )
    p.add_argument(
        "--facts", type=Path, help="JSON with gpus_per_node, gpu_mem_gib, host_mem_gib (from preflight)"
    )
    p.add_argument("--nodes", type=int, help="nodes (default: the job's host list, else 1)")
    p.add_argument(
        "--gpus-per-node", type=int, help="GPUs per node (default: job's nproc_per_node, facts, preset)"
    )
    p.add_argument("--gpu-mem-gib", type=float, help="usable memory per GPU in GiB")
    p.add_argument("--host-mem-gib", type=float, help="RAM per host in GiB")
    p.add_argument(
        "--margin", type=float, help=f"safety margin (default: {SAFETY_MARGIN}, launcher.planning.memory)"
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="run the best candidates for a few steps on the job's first node (python -m launcher run) and "
        "pick by measured tokens/s",
    )
    p.add_argument(
        "-i", "--inventory", type=Path, help="Ansible inventory for --probe (default: ansible.cfg's)"
    )
    p.add_argument("--probe-candidates", type=int, default=None, help="candidates to probe (default: 3)")
    p.add_argument("--probe-steps", type=int, default=None, help="optimizer steps per candidate (default: 4)")
    p.add_argument(
        "--probe-budget-s", type=float, default=None, help="seconds for the whole probe (default: 120)"
    )
    p.set_defaults(func=run)
    return p


def _facts(path: Path | None) -> dict[str, Any]:
    from launcher.spec.config_io import decode_text, load_json_text, read_config_bytes  # noqa: PLC0415

    if path is None:
        return {}
    data = load_json_text(decode_text(read_config_bytes(path, "facts file"), path), path)
    if not isinstance(data, dict):
        raise ConfigurationError.at(path, "(file)", "facts must be a JSON object", "kind")
    return data


def cluster_from(args: argparse.Namespace, hosts: str | list[str], nproc: int | None) -> Cluster:
    """Combine flags, facts, the job spec and the preset (in that order of precedence)."""
    from launcher.planning.memory import Cluster  # noqa: PLC0415

    preset = NODE_PRESETS[args.hardware]
    gpus, gpu_mem, host_mem = preset.gpus, preset.gpu_mem_gib, preset.host_mem_gib
    facts = _facts(args.facts)
    nodes = args.nodes or (len(hosts) if isinstance(hosts, list) else 1)
    return Cluster(
        nodes=nodes,
        gpus_per_node=int(args.gpus_per_node or nproc or facts.get("gpus_per_node") or gpus),
        gpu_mem_gib=float(args.gpu_mem_gib or facts.get("gpu_mem_gib") or gpu_mem),
        host_mem_gib=float(args.host_mem_gib or facts.get("host_mem_gib") or host_mem),
    )


def _accelerator(args: argparse.Namespace) -> Accelerator:
    from launcher.planning.hardware import ACCELERATORS  # noqa: PLC0415

    return ACCELERATORS[args.hardware]


def _probe(args: argparse.Namespace, job: LoadedJob, training: TrainingPlan) -> TrainingPlan:
    """Run the probe on the job's first node; progress goes to stderr (stdout keeps the table or JSON)."""
    from launcher.engine.probe import LauncherProber, probe_workdir  # noqa: PLC0415
    from launcher.engine.run import run_job  # noqa: PLC0415
    from launcher.planning import probe  # noqa: PLC0415
    from launcher.spec.inventory import first_host  # noqa: PLC0415

    count = args.probe_candidates or probe.DEFAULT_CANDIDATES
    steps = args.probe_steps or probe.DEFAULT_STEPS
    budget = args.probe_budget_s or probe.DEFAULT_BUDGET_S
    if count <= 0 or steps < 2 or budget <= 0:
        raise ConfigurationError(
            "--probe-candidates must be >= 1, --probe-steps >= 2 and --probe-budget-s > 0"
        )
    inventory = args.inventory.resolve() if args.inventory else None
    if inventory is not None and not inventory.exists():
        from launcher.spec.inventory import inventory_not_found  # noqa: PLC0415 - `--help` imports no yaml

        raise inventory_not_found(args.inventory)
    host = first_host(job.spec, inventory)
    prober = LauncherProber(job, host, inventory, probe_workdir(job.spec.name), sys.stderr, run_job)
    return probe.run_probe(training, prober, count=count, steps=steps, budget_s=budget, clock=time.monotonic)


def run(args: argparse.Namespace) -> ExitCode:
    """Print the plan; exit 2 when nothing fits. The job is read by the engine's one loader.

    Text: the per-strategy memory table at the YAML's own split (the fixed-split plan: what
    ``deepspeed: auto`` compares under ``plan: as_written``), then the whole training plan
    (:mod:`launcher.planning.training`): the candidate table, why the choice won and its predicted gain over
    the YAML as written, and whether the job spec applies it (``plan: auto``).
    JSON: the keys it always had (``strategies``, ``choice``, ``reason``, ``inputs``: the strategy choice at
    the YAML's split) plus ``plan_mode`` and ``training_plan`` (:meth:`TrainingPlan.as_json`).
    """
    from launcher.engine.split import plan_job  # noqa: PLC0415
    from launcher.planning.model import resolve_shape  # noqa: PLC0415
    from launcher.planning.report import render, render_training  # noqa: PLC0415
    from launcher.planning.training_yaml import plan_as_written  # noqa: PLC0415
    from launcher.validation.job import load_job  # noqa: PLC0415

    margin = SAFETY_MARGIN if args.margin is None else args.margin
    job = load_job(args.job)
    spec, train = job.spec, dict(job.train.data)
    cluster = cluster_from(args, spec.hosts, spec.nproc_per_node)
    model_config = args.model_config or spec.plan_model_config
    accelerator = _accelerator(args)
    plan = plan_as_written(
        resolve_shape(model_config, train), train, cluster, accelerator=accelerator, margin=margin
    )
    training = plan_job(
        job, train, cluster, accelerator=accelerator, model_config=model_config, margin=margin
    )
    if args.probe:
        training = _probe(args, job, training)
    applies = spec.plan != "as_written"
    if args.json:
        print(
            json.dumps(
                {**plan.as_json(), "plan_mode": spec.plan, "training_plan": training.as_json()}, indent=2
            )
        )
    else:
        how = (
            f"the job spec says plan: {spec.plan}: `run` applies "
            + ("this choice" if spec.plan == "auto" else "the choice of its own probe")
            if applies
            else "the job spec runs the YAML as written (plan: as_written); "
            "`plan: auto` would apply this choice"
        )
        print(f"{render(plan)}\n\nWhole training plan ({how})\n{render_training(training)}")
    chosen = training.choice if applies else plan.choice
    return OK if chosen is not None else BAD_INPUT
