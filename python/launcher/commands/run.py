"""``run JOB``: validate, preflight, start the trainer on every node, then follow it to the end."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launcher.configcheck import check_configs
from launcher.exceptions import ConfigurationError, LauncherError
from launcher.exit_codes import JOB_FAILED, OK, ExitCode
from launcher.follow import follow
from launcher.inventory import check_hosts
from launcher.job import Job, agent_source
from launcher.jobspec import load_job_spec, mask_env
from launcher.nodeenv import masked, render_node_env
from launcher.preflight import NodeFacts, run_preflight
from launcher.report import print_summary
from launcher.runner import PlaybookRunner
from launcher.runs import RunDir, find_run, new_run_id
from launcher.trainconfig import DS_FILE, TRAIN_FILE, RunConfigs, prepare, write_files

if TYPE_CHECKING:
    from collections.abc import Iterator

    from launcher.jobspec import JobSpec


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``run`` subcommand."""
    p = subparsers.add_parser(
        "run",
        help="start a job on every node and follow it",
        description="Validate the job spec and its configs, check the nodes (preflight), start "
        "`llamafactory-cli train` on every node, then follow it: live per-node table, stop everywhere on the "
        "first failure or on Ctrl-C, fetch logs and metrics into runs/<run_id>/.",
    )
    p.add_argument("job", type=Path, nargs="?", help="job spec YAML (see configs/jobs/)")
    p.add_argument("-i", "--inventory", type=Path, help="Ansible inventory (default: the one in ansible.cfg)")
    p.add_argument("--detach", action="store_true", help="return once every trainer has started")
    p.add_argument(
        "--resume",
        metavar="RUN",
        help="continue a stopped or failed run from its last checkpoint: a new run with RUN's job spec, "
        "output_dir and inventory, resume_from_checkpoint set to the last checkpoint on the nodes",
    )
    p.set_defaults(func=_cmd_run, parser=p)
    return p


@dataclasses.dataclass(frozen=True)
class ResumeFrom:
    """What ``run --resume RUN`` takes from RUN."""

    run_id: str
    output_dir: str  # node path as the new run sees it (relative: to the new node run directory)


def _cmd_run(args: argparse.Namespace) -> ExitCode:
    if args.resume is None and args.job is None:
        args.parser.error("the following arguments are required: job")
    if args.resume is not None:
        if args.job is not None:
            args.parser.error("argument --resume: give RUN or a job spec, not both")
        job, inventory, resume = _resume_source(args.resume, args.inventory)
        return run_job(job, inventory=inventory, detach=args.detach, resume=resume)
    return run_job(args.job, inventory=args.inventory, detach=args.detach)


def _resume_source(ref: str, inventory: Path | None) -> tuple[Path, Path | None, ResumeFrom]:
    """Return the job spec, inventory and output_dir of the run ``ref`` to resume."""
    old = find_run(ref)
    record = old.load()
    where = f"{old.path}/record.json"
    if record.get("status") not in ("stopped", "failed"):
        raise ConfigurationError(
            f"{where}: status: {record.get('status')}: only a stopped or failed run can be resumed"
        )
    output_dir = record.get("output_dir")
    if not record.get("hosts") or not isinstance(output_dir, str):
        raise ConfigurationError(f"{where}: hosts: the run never started a trainer: nothing to resume")
    spec_path = Path(str(record.get("spec_path", "")))
    if not spec_path.is_file():
        raise ConfigurationError(f"{where}: spec_path: {spec_path}: the run's job spec is gone")
    if inventory is None and record.get("inventory"):
        inventory = Path(str(record["inventory"]))
    # a relative output_dir lives in the old node run directory, a sibling of the new one
    node_out = output_dir if output_dir.startswith("/") else f"../{old.run_id}/{output_dir}"
    return spec_path, inventory, ResumeFrom(old.run_id, node_out)


def _node_local_checkpoints(configs: RunConfigs, nnodes: int) -> RunConfigs:
    """Return the configs with every node saving a complete checkpoint in its own output_dir (multi-node).

    output_dir is a node path, not shared storage: without this only the first node gets trainer_state.json
    and DeepSpeed's ``latest``, and no other node could resume. Values the training YAML or the DeepSpeed JSON
    set themselves are kept.
    """
    if nnodes < 2:
        return configs
    train = {"save_on_each_node": True, **configs.train}
    deepspeed = configs.deepspeed
    if deepspeed is not None:
        checkpoint = {"use_node_local_storage": True, **dict(deepspeed.get("checkpoint") or {})}
        deepspeed = {**deepspeed, "checkpoint": checkpoint}
    return dataclasses.replace(configs, train=train, deepspeed=deepspeed)


def _resume_configs(configs: RunConfigs, facts: NodeFacts, resume: ResumeFrom, spec_path: Path) -> RunConfigs:
    """Return the run's configs pointed at the resumed run's output_dir and its last common checkpoint."""
    found = {h: facts.probe[h].get("checkpoints") or [] for h in facts.hosts}
    common = set.intersection(*(set(v) for v in found.values())) if found else set()
    if not common:
        host = next((h for h, v in found.items() if not v), facts.hosts[0])
        raise ConfigurationError(
            f"{spec_path}: resume: no checkpoint-N in {resume.output_dir} on {host} (run {resume.run_id}); "
            "nothing to resume"
        )
    step = max(common)
    train = {
        **configs.train,
        "output_dir": resume.output_dir,
        "overwrite_output_dir": False,
        "resume_from_checkpoint": f"{resume.output_dir}/checkpoint-{step}",
    }
    return dataclasses.replace(configs, train=train, output_dir=resume.output_dir)


@contextlib.contextmanager
def interrupt_guard(event: threading.Event) -> Iterator[threading.Event]:
    """Turn SIGINT and SIGTERM into ``event`` (no exception), so cleanup always runs; restore on exit."""

    def handler(signum: int, _frame: object) -> None:
        if not event.is_set():
            print(f"\n{signal.Signals(signum).name}: stopping the job on every node ...", file=sys.stderr)
        event.set()

    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield event
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def _deepspeed_choice(
    spec: JobSpec, train_cfg: dict[str, Any], facts: NodeFacts
) -> tuple[str, dict[str, Any]]:
    """Ask the planner for a DeepSpeed config (``deepspeed: auto``)."""
    from launcher.plan import choose_deepspeed_config  # noqa: PLC0415 - only for deepspeed: auto

    master = facts.probe[facts.master]
    gpu_mem = facts.gpu_mem_gib(facts.master) or 191.98  # mift_gpus, else torch (CUDA), else one MI300X
    host_mem = float(master.get("mem_total_bytes") or 0) / 1024**3
    return choose_deepspeed_config(
        train_cfg.get("model_name_or_path"),
        train_cfg,
        facts.nproc_per_node,
        len(facts.hosts),
        gpu_mem,
        host_mem,
    )


def _jobs_per_host(run_id: str, facts: NodeFacts, spec: JobSpec, configs: RunConfigs) -> dict[str, Any]:
    def cli(host: str) -> str:  # the entry point preflight found (job spec node_venv, else the inventory's)
        found = facts.probe.get(host, {}).get("trainer_cli")
        return str(found) if found else f"{spec.node_venv or '/opt/mift/venv'}/bin/llamafactory-cli"

    return {
        host: {
            "run_id": run_id,
            "node_rank": rank,
            "argv": [cli(host), "train", "train.yaml"],
            "output_dir": configs.output_dir,
            "expect_outputs": list(configs.expect_outputs) if rank == 0 else [],
            # the checkpoint the trainer resumes from ("last": LLaMA-Factory picks output_dir's last one)
            "resume_from": configs.train.get("resume_from_checkpoint")
            or ("last" if spec.resume is True else None),
        }
        for rank, host in enumerate(facts.hosts)
    }


def _write_node_files(
    run: RunDir, configs: RunConfigs, jobs: dict[str, Any], envs: dict[str, dict[str, str]]
) -> None:
    """Write ``files/<host>/``: the shipped configs and job.json (kept), and ``bundle.json`` (0600).

    The bundle is the one file the launch playbook copies per node (configs, job, env); the agent unpacks it.
    It holds the environment in clear, so it is deleted once the nodes have it.
    """
    for host, env in envs.items():
        host_dir = run.files_dir / host
        write_files(configs, host_dir)
        (host_dir / "job.json").write_text(json.dumps(jobs[host], indent=2) + "\n")
        files = {p.name: p.read_text() for p in sorted(host_dir.iterdir()) if p.name in (TRAIN_FILE, DS_FILE)}
        fd = os.open(host_dir / "bundle.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"files": files, "job": jobs[host], "env": env}, fh)


def _remove_env_files(run: RunDir) -> None:
    """Delete the controller copies of the node bundles (secrets in clear; the record has them masked)."""
    for path in run.files_dir.glob("*/bundle.json"):
        path.unlink()


def run_job(
    job_path: Path,
    *,
    inventory: Path | None,
    detach: bool,
    out: IO[str] | None = None,
    resume: ResumeFrom | None = None,
) -> ExitCode:
    """Run a job end to end; return 0 on success, 1 when it failed or was stopped (2 raised as bad input)."""
    out = out or sys.stdout
    spec = load_job_spec(job_path)
    inv = inventory.resolve() if inventory else None
    if inv is not None and not inv.exists():
        raise ConfigurationError(f"{inventory}: inventory not found")
    check_configs(job_path)
    check_hosts(spec, inv, job_path)
    run_id = new_run_id(spec.name)
    interrupted = threading.Event()
    with interrupt_guard(interrupted):
        run = RunDir.create(
            run_id,
            {
                "name": spec.name,
                "created_at": time.time(),
                "spec_path": str(job_path.resolve()),
                "spec": {**spec.model_dump(mode="json"), "env": mask_env(spec.env_strings())},
                "inventory": str(inv) if inv else None,
                "launcher_pid": os.getpid(),
                "detached": detach,
                **({"resumed_from": resume.run_id} if resume else {}),
            },
        )
        print(f"run {run_id}: {run.path}", file=out, flush=True)
        runner = PlaybookRunner(run.ansible_dir, inventory=inv)
        runner.cancel_requested = interrupted
        run.set_status("preflight")
        try:
            facts = run_preflight(
                runner,
                spec,
                run_id,
                agent_source(),
                output_dir=resume.output_dir if resume else None,
                checkpoints_of=resume.output_dir if resume else None,
            )
            deepspeed = None
            if spec.deepspeed == "auto":
                deepspeed = _deepspeed_choice(spec, prepare(spec, run_id).train, facts)
            configs = prepare(spec, run_id, deepspeed)
            configs = _node_local_checkpoints(configs, len(facts.hosts))
            if resume:
                configs = _resume_configs(configs, facts, resume, job_path)
        except LauncherError as err:
            run.set_status("stopped" if interrupted.is_set() else "rejected", str(err))
            raise
        return _start_and_follow(
            run, runner, spec, facts, configs, interrupted=interrupted, detach=detach, out=out
        )


def _start_and_follow(
    run: RunDir,
    runner: PlaybookRunner,
    spec: JobSpec,
    facts: NodeFacts,
    configs: RunConfigs,
    *,
    interrupted: threading.Event,
    detach: bool,
    out: IO[str],
) -> ExitCode:
    run_id = run.run_id
    master_addr = spec.master_addr or facts.train_address[facts.master]
    envs = render_node_env(
        spec,
        hosts=facts.hosts,
        master_addr=master_addr,
        nproc_per_node=facts.nproc_per_node,
        run_id=run_id,
        node_env=facts.node_env,
    )
    _write_node_files(run, configs, _jobs_per_host(run_id, facts, spec, configs), envs)
    for note in facts.notes:
        print(f"note: {note}", file=out)
    for warning in facts.warnings:
        print(f"warning: {warning}", file=out)
    run.update(
        hosts=facts.hosts,
        master_addr=master_addr,
        master_port=spec.master_port,
        nproc_per_node=facts.nproc_per_node,
        node_env=masked(envs),
        versions=facts.stack,
        gpus=facts.gpus,
        deepspeed=configs.deepspeed_name,
        output_dir=configs.output_dir,
        warnings=facts.warnings,
        notes=facts.notes,
        torch=facts.torch,
    )
    run.set_status("starting")
    t_start = time.monotonic()
    try:
        launch = runner.run(
            "launch",
            {
                "mift_hosts": ",".join(facts.hosts),
                "mift_run_id": run_id,
                "mift_agent_src": agent_source(),
                "mift_files_dir": str(run.files_dir),
                "mift_stop_grace_s": spec.timeouts.stop_grace_s,
                "mift_start_wait_s": 30,
            },
            timeout=spec.timeouts.start_s,
        )
    finally:
        _remove_env_files(run)
    job = Job(run)
    started = {h: launch.report(h, "start") for h in facts.hosts}
    run.update(start_s=round(time.monotonic() - t_start, 2), started={h: s for h, s in started.items() if s})
    if interrupted.is_set() or not launch.ok:
        reason = (
            "interrupted (Ctrl-C) while starting"
            if interrupted.is_set()
            else _launch_failure(launch.failures)
        )
        state = "stopped" if interrupted.is_set() else "failed"
        print(f"{state}: {reason}; stopping every node ...", file=out, flush=True)
        job.stop()
        job.finalize(state, reason)
        print_summary(run, out)
        return JOB_FAILED
    run.set_status("running")
    print(
        f"started on {len(facts.hosts)} nodes in {time.monotonic() - t_start:.1f} s "
        f"(MASTER_ADDR={master_addr} MASTER_PORT={spec.master_port} NPROC_PER_NODE={facts.nproc_per_node})",
        file=out,
        flush=True,
    )
    if detach:
        run.update(launcher_pid=None)
        print(
            f"detached; follow with: python -m launcher status {run_id} | logs {run_id} --follow | "
            f"stop {run_id}",
            file=out,
        )
        return OK
    verdict, nodes = follow(
        job,
        interrupted=interrupted,
        poll_interval_s=spec.poll_interval_s,
        job_timeout_s=spec.timeouts.job_s,
        out=out,
    )
    if verdict.state != "succeeded":
        print(f"{verdict.state}: {verdict.reason}; stopping every node ...", file=out, flush=True)
        run.set_status("stopping", verdict.reason)
        job.stop()
    job.finalize(verdict.state, verdict.reason, nodes)
    print_summary(run, out)
    return OK if verdict.state == "succeeded" else JOB_FAILED


def _launch_failure(failures: dict[str, str]) -> str:
    if not failures:
        return "launch playbook failed"
    host, line = next(iter(failures.items()))
    return f"{host}: start failed: {line}"
