"""``logs RUN [--node N | --rank N] [--follow]``: a node's trainer log (or one rank's lines of it), fetched
from the node while the run is active."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from launcher.commands.completion import add_run_argument
from launcher.exceptions import ConfigurationError
from launcher.exit_codes import OK, ExitCode
from launcher.node import contract

if TYPE_CHECKING:
    from launcher.rundir.runs import RunDir, RunRecord


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``logs`` subcommand."""
    p = subparsers.add_parser(
        "logs",
        help="print a node's trainer log",
        description="Print the trainer log of one node (rank 0 by default). While the run is active the log "
        "is "
        "fetched from the node first; --follow keeps fetching until the run ends.",
    )
    add_run_argument(p)
    p.add_argument("--node", default="0", help="node rank or host name (default: 0)")
    p.add_argument(
        "--rank",
        type=int,
        help="only this global rank's lines (its node's trainer.log, lines prefixed [rankN localL])",
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the run ends")
    p.add_argument(
        "--json", action="store_true", help='one JSON object per line (docs/launcher.md "JSON output")'
    )
    p.set_defaults(func=_cmd_logs)
    return p


def _cmd_logs(args: argparse.Namespace) -> ExitCode:
    return show_logs(args.run, node=args.node, follow=args.follow, rank=args.rank, as_json=args.json)


def _host(record: RunRecord, node: str) -> str:
    hosts = list(record.hosts)
    if node.isdigit() and int(node) < len(hosts):
        return hosts[int(node)]
    if node in hosts:
        return node
    raise ConfigurationError(f"--node {node}: not a node of this run ({', '.join(hosts) or 'none started'})")


def _rank_host(record: RunRecord, rank: int) -> str:
    """Return the host that runs global rank ``rank`` (node rank = rank // nproc_per_node)."""
    hosts = list(record.hosts)
    nproc = record.nproc_per_node
    if not isinstance(nproc, int) or nproc < 1 or not 0 <= rank < nproc * len(hosts):
        world = nproc * len(hosts) if isinstance(nproc, int) else "unknown"
        raise ConfigurationError(f"--rank {rank}: not a rank of this run (world size {world})")
    return hosts[rank // nproc]


def rank_lines(text: str, rank: int) -> str:
    """Return the lines of a node's trainer.log that rank ``rank`` wrote (torchrun's ``[rankN localL]: ``
    prefix, launcher/node/supervise.py ``RANK_LOG_PREFIX``)."""
    prefix = f"[rank{rank} local"
    return "".join(line for line in text.splitlines(keepends=True) if line.startswith(prefix))


def _log_path(run: RunDir, host: str) -> str:
    return str(run.nodes_dir / host / contract.TRAINER_LOG)


def show_logs(
    ref: str | None, *, node: str, follow: bool, rank: int | None = None, as_json: bool = False
) -> ExitCode:
    """Print (and with ``follow``, keep printing) one node's trainer log (``rank``: only that global rank's
    lines, from its node's log)."""
    from launcher.engine.job import Job, is_final  # noqa: PLC0415 - `--help` imports no engine
    from launcher.rundir.json_out import log_objects, write  # noqa: PLC0415
    from launcher.rundir.runs import find_run  # noqa: PLC0415

    run = find_run(ref)
    record = run.record()
    host = _host(record, node) if rank is None else _rank_host(record, rank)
    printed = 0
    from launcher.backends.slurm_shared import SharedSlurmBackend  # noqa: PLC0415

    job = Job(run, record) if not is_final(record) else None
    if job is not None and not isinstance(job.backend, SharedSlurmBackend):
        # fetch only the node asked for: one Ansible task, not one a node of the run (`logs` of a 64-node run
        # collected every node: docs/measurements.md "Control plane at scale"); the login-host-only Slurm
        # mode fetches every rank through the login host at once
        job.hosts = [host]
    active = job is not None
    while True:
        if job is not None:
            result = job.collect()
            states = [_collected_state(result.report(h, "collect"), h) for h in job.hosts]
            active = any(state in (contract.RUNNING, contract.STARTING, contract.QUEUED) for state in states)
        try:
            data = (run.nodes_dir / host / contract.TRAINER_LOG).read_bytes()
        except OSError:
            data = b""
        # a rank's lines, JSON lines: whole lines only (the rest comes with the next fetch)
        # (a rank's lines: whole lines only; JSON lines: the last part too once nothing more comes)
        whole = rank is None and (not as_json or not follow or not active)
        end = len(data) if whole else data.rfind(b"\n") + 1
        if end > printed:
            text = data[printed:end].decode("utf-8", "replace")
            text = text if rank is None else rank_lines(text, rank)
            if as_json:
                for obj in log_objects(run.run_id, host, text):
                    write(obj, sys.stdout)
            else:
                sys.stdout.write(text)
            sys.stdout.flush()
            printed = end
        if not follow or not active or is_final(run.record()):
            break
        try:
            time.sleep(2)
        except KeyboardInterrupt:
            break
    if not data:
        print(f"(no log yet at {_log_path(run, host)})", file=sys.stderr)
    return OK


def _collected_state(answer: object, host: str) -> str | None:
    """Return the node state in a node's ``collect`` answer (None when it gave none)."""
    try:
        return contract.collect_result_from(answer, f"{host}: collect")["status"]["state"]
    except contract.ContractError:
        return None
