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
    from launcher.commands.plan_cluster import PlannedCluster
    from launcher.planning.hardware import Accelerator
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
    p.add_argument(
        "--nodes", type=int, help="nodes (default: the job's hosts, resolved through the inventory)"
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        help="GPUs per node (default: job's nproc_per_node, --facts, the nodes' provisioned facts, "
        "inventory, preset)",
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
        "-i",
        "--inventory",
        type=Path,
        help="Ansible inventory: resolves the job's hosts: groups, and --probe runs there "
        "(default: ansible.cfg's)",
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


def cluster_from(args: argparse.Namespace, job: LoadedJob) -> PlannedCluster:
    """The cluster `run` would use (:mod:`launcher.commands.plan_cluster`): flags, job spec, facts, inventory,
    preset, each value with its source."""
    from launcher.commands.plan_cluster import plan_cluster, torch_answers  # noqa: PLC0415

    entries, answers_path = torch_answers()
    inventory = args.inventory.resolve() if args.inventory else None
    return plan_cluster(
        hosts=job.spec.hosts,
        inventory=inventory,
        preset=NODE_PRESETS[args.hardware],
        preset_name=args.hardware,
        facts_file=_facts(args.facts),
        nodes_flag=args.nodes,
        gpus_flag=args.gpus_per_node,
        gpu_mem_flag=args.gpu_mem_gib,
        host_mem_flag=args.host_mem_gib,
        nproc_per_node=job.spec.nproc_per_node,
        answers=entries,
        answers_path=answers_path,
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
    """Print the plan `run` would apply; exit 2 when it does not fit. The job is read by the engine's loader.

    Text: the inputs (model, the cluster and where each value came from, the DeepSpeed choice in one line),
    the per-strategy memory table at the YAML's own split, then the whole training plan
    (:mod:`launcher.planning.training`). One decision is stated, the one `run` applies: under
    ``plan: as_written`` the job's strategy (the pinned DeepSpeed file, none, or with ``deepspeed: auto`` the
    fastest that fits) at the YAML's split, the training plan only as what ``plan: auto`` would pick; under
    ``plan: auto``/``probe`` the training plan's choice, the strategy table only for reference.
    JSON: the keys it always had (``strategies``, ``choice``, ``reason``, ``inputs``: the strategy choice at
    the YAML's split) plus ``plan_mode``, ``training_plan`` (:meth:`TrainingPlan.as_json`), ``deepspeed``
    (``auto``, a file, or ``none``), ``applied`` (what `run` applies) and ``cluster`` (hosts and sources).
    """
    from launcher.engine.split import plan_job  # noqa: PLC0415
    from launcher.planning.model import resolve_shape  # noqa: PLC0415
    from launcher.planning.training_yaml import plan_as_written  # noqa: PLC0415
    from launcher.validation.job import load_job  # noqa: PLC0415

    margin = SAFETY_MARGIN if args.margin is None else args.margin
    job = load_job(args.job)
    spec, train = job.spec, dict(job.train.data)
    planned = cluster_from(args, job)
    cluster = planned.cluster
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
    from launcher.commands.plan_text import applied_of, render_plan  # noqa: PLC0415

    applied = applied_of(job, plan, training)
    if args.json:
        print(
            json.dumps(
                {
                    **plan.as_json(),
                    "plan_mode": spec.plan,
                    "training_plan": training.as_json(),
                    "deepspeed": applied.deepspeed,
                    "applied": applied.as_json(),
                    "cluster": planned.as_json(),
                },
                indent=2,
            )
        )
    else:
        print(render_plan(job, planned, plan, training, applied))
    return OK if applied.fits else BAD_INPUT
