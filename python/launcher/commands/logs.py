"""``logs RUN [--node N] [--follow]``: a node's trainer log, fetched from the node while the run is active."""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from launcher.exceptions import ConfigurationError
from launcher.exit_codes import OK, ExitCode

if TYPE_CHECKING:
    from launcher.runs import RunDir


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add the ``logs`` subcommand."""
    p = subparsers.add_parser(
        "logs",
        help="print a node's trainer log",
        description="Print the trainer log of one node (rank 0 by default). While the run is active the log "
        "is "
        "fetched from the node first; --follow keeps fetching until the run ends.",
    )
    p.add_argument("run", help="run id or unique prefix")
    p.add_argument("--node", default="0", help="node rank or host name (default: 0)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until the run ends")
    p.set_defaults(func=_cmd_logs)
    return p


def _cmd_logs(args: argparse.Namespace) -> ExitCode:
    return show_logs(args.run, node=args.node, follow=args.follow)


def _host(record: dict[str, object], node: str) -> str:
    hosts = [str(h) for h in record.get("hosts") or []]  # type: ignore[attr-defined]
    if node.isdigit() and int(node) < len(hosts):
        return hosts[int(node)]
    if node in hosts:
        return node
    raise ConfigurationError(f"--node {node}: not a node of this run ({', '.join(hosts) or 'none started'})")


def _log_path(run: RunDir, host: str) -> str:
    return str(run.nodes_dir / host / "trainer.log")


def show_logs(ref: str, *, node: str, follow: bool) -> ExitCode:
    """Print (and with ``follow``, keep printing) one node's trainer log."""
    from launcher.job import Job, is_final  # noqa: PLC0415 - `--help` imports no engine
    from launcher.runs import find_run  # noqa: PLC0415

    run = find_run(ref)
    record = run.load()
    host = _host(record, node)
    printed = 0
    job = Job(run, record) if not is_final(record) else None
    active = job is not None
    while True:
        if job is not None:
            result = job.collect()
            states = [
                ((result.report(h, "collect") or {}).get("status") or {}).get("state") for h in job.hosts
            ]
            active = any(state in ("running", "starting", "queued") for state in states)
        try:
            data = (run.nodes_dir / host / "trainer.log").read_bytes()
        except OSError:
            data = b""
        if len(data) > printed:
            sys.stdout.write(data[printed:].decode("utf-8", "replace"))
            sys.stdout.flush()
            printed = len(data)
        if not follow or not active or is_final(run.load()):
            break
        try:
            time.sleep(2)
        except KeyboardInterrupt:
            break
    if not data:
        print(f"(no log yet at {_log_path(run, host)})", file=sys.stderr)
    return OK
