"""Preflight: check every node of a job before anything starts (reachable, same stack, GPUs, port, disk)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError, JobFailedError
from launcher.nodeenv import resolve_nproc

if TYPE_CHECKING:
    from launcher.jobspec import JobSpec
    from launcher.runner import PlaybookRunner

# stack fact keys that differ per host by nature and are not versions
_NOT_VERSIONS = ("host", "hostname", "time", "date", "checked", "path", "node")
GIB = 1024**3


@dataclass
class NodeFacts:
    """What preflight learnt about the job's nodes, in rank order."""

    hosts: list[str]
    train_address: dict[str, str]
    stack: dict[str, dict[str, Any]]
    gpus: dict[str, dict[str, Any]]
    probe: dict[str, dict[str, Any]]
    nproc_per_node: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def master(self) -> str:
        """Return the rank-0 host."""
        return self.hosts[0]


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if any(word in str(key).lower() for word in _NOT_VERSIONS):
            continue
        if isinstance(value, dict):
            out.update(_flatten(value, f"{name}."))
        elif not isinstance(value, list):
            out[name] = str(value)
    return out


def _comparable(stack: dict[str, Any]) -> dict[str, str]:
    """Return the fields of a ``mift_stack`` fact that must match across nodes (versions and backend)."""
    if isinstance(stack.get("versions"), dict):
        stack = {"versions": stack["versions"], "backend": stack.get("backend")}
    return _flatten(stack)


def stack_drift(stacks: dict[str, dict[str, Any]], hosts: list[str]) -> list[str]:
    """Return one line per package whose version differs from the first host's (empty: identical)."""
    ref_host = hosts[0]
    ref = _comparable(stacks.get(ref_host, {}))
    problems = []
    for host in hosts[1:]:
        mine = _comparable(stacks.get(host, {}))
        for key in sorted(set(ref) | set(mine)):
            if ref.get(key) != mine.get(key):
                problems.append(
                    f"{host}: {key} is {mine.get(key, 'missing')} ({ref_host}: {ref.get(key, 'missing')})"
                )
    return problems


def run_preflight(runner: PlaybookRunner, spec: JobSpec, run_id: str, agent_src: str) -> NodeFacts:
    """Run the preflight playbook and check its facts; raise ConfigurationError naming the host."""
    result = runner.run(
        "preflight",
        {
            "mift_hosts": spec.host_pattern,
            "mift_run_id": run_id,
            "mift_agent_src": agent_src,
            "mift_master_port": spec.master_port,
            "mift_output_dir": spec.output_dir.format(run_id=run_id),
            "mift_node_venv": spec.node_venv,
        },
    )
    if runner.cancel_requested.is_set():
        raise JobFailedError("interrupted during preflight; nothing was started")
    if result.unreachable:
        host = result.unreachable[0]
        raise ConfigurationError(f"{host}: {result.failures[host]}; nothing was started")
    if result.failures:
        host, line = next(iter(result.failures.items()))
        raise ConfigurationError(f"{host}: preflight failed: {line}; nothing was started")
    reports = {h: r["preflight"] for h, r in result.reports.items() if isinstance(r.get("preflight"), dict)}
    if not reports:
        raise ConfigurationError(f"no hosts match {spec.host_pattern!r} in the inventory")
    play_hosts = next(iter(reports.values())).get("play_hosts") or sorted(reports)
    hosts = [h for h in play_hosts if h in reports]
    facts = NodeFacts(
        hosts=hosts,
        train_address={h: str(reports[h]["train_address"]) for h in hosts},
        stack={h: reports[h].get("stack") or {} for h in hosts},
        gpus={h: reports[h].get("gpus") or {} for h in hosts},
        probe={h: reports[h].get("probe") or {} for h in hosts},
    )
    _check(facts, spec)
    return facts


def _check(facts: NodeFacts, spec: JobSpec) -> None:
    with_stack = [h for h in facts.hosts if facts.stack[h]]
    if not with_stack:
        facts.warnings.append(
            "no node has stack facts (mift_stack): versions not compared; run provision.yml"
        )
    else:
        drift = stack_drift(facts.stack, facts.hosts)
        if drift:
            raise ConfigurationError(f"stack versions differ across nodes: {drift[0]}; re-run provision.yml")
    for host in facts.hosts:
        probe = facts.probe[host]
        if not probe.get("trainer_cli_found"):
            raise ConfigurationError(
                f"{host}: {probe.get('trainer_cli')} not found: provision the node (ansible-playbook "
                "provision.yml)"
            )
        free = int(probe.get("free_bytes") or 0)
        if free < spec.min_free_disk_gb * GIB:
            raise ConfigurationError(
                f"{host}: only {free / GIB:.1f} GiB free for output_dir, the job spec asks for "
                f"{spec.min_free_disk_gb} GiB (min_free_disk_gb)"
            )
    master_probe = facts.probe[facts.master]
    if master_probe.get("port_free") is False:
        raise ConfigurationError(
            f"{facts.master}: master_port {spec.master_port} is in use; pick another master_port in the "
            "job spec"
        )
    facts.nproc_per_node = resolve_nproc(spec, facts.gpus, facts.hosts, facts.stack)
