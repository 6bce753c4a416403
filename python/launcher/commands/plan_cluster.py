"""The cluster ``plan`` plans for: the nodes ``run`` would use and what is known of their GPUs, each value
with where it came from.

Nodes: the job's host list, or its ``hosts:`` groups and hosts resolved through the inventory (``-i``, else
ansible.cfg's, as ``run``). GPUs per node and memory per GPU, first found of: the flags, the job spec's
``nproc_per_node`` (GPUs only), a ``--facts`` file, the torch answers the controller keeps from the last
preflight of each node (:mod:`launcher.torch_answers`, when it holds one for every node), the inventory's
``gpu_verify_expected_count`` (GPUs only), the ``--hardware`` preset. Host memory: the flags, the facts file,
else the preset.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.preflight.torchinfo import torch_gpu_mem_gib
from launcher.spec.inventory import (
    PLAIN_NAME_RE,
    default_inventory,
    group_members,
    inventory_list,
    inventory_var,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from launcher.planning.hardware import NodePreset
    from launcher.planning.memory import Cluster


@dataclass(frozen=True)
class Nodes:
    """The job's nodes as ``run`` would resolve them; ``hosts`` empty when they could not be named."""

    hosts: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class PlannedCluster:
    """The cluster and one phrase per value saying where it came from."""

    cluster: Cluster
    nodes: Nodes
    gpus_from: str
    gpu_mem_from: str
    host_mem_from: str

    def line(self) -> str:
        """One line: each value and its source."""
        c = self.cluster
        return (
            f"cluster from: {c.nodes} node(s) ({self.nodes.source}); {c.gpus_per_node} GPU(s) per node "
            f"({self.gpus_from}); {c.gpu_mem_gib:.1f} GiB per GPU ({self.gpu_mem_from}); "
            f"{c.host_mem_gib:.0f} GiB per host ({self.host_mem_from})"
        )

    def as_json(self) -> dict[str, Any]:
        """The hosts and the sources, for ``plan --json``."""
        return {
            "hosts": list(self.nodes.hosts),
            "nodes_from": self.nodes.source,
            "gpus_per_node_from": self.gpus_from,
            "gpu_mem_gib_from": self.gpu_mem_from,
            "host_mem_gib_from": self.host_mem_from,
        }


def resolve_nodes(hosts: str | list[str], inventory: Path | None) -> Nodes:
    """The job's hosts: a list as written; group and host names through the inventory (inventory order)."""
    if isinstance(hosts, list):
        return Nodes(tuple(hosts), "the job spec's host list")
    inv = inventory or default_inventory()
    if inv is None:  # an installed launcher without -i: planned as one node, and said so
        return Nodes((), f"hosts: {hosts} not resolved: no inventory, name one with -i; planned as 1")
    if not inv.exists():
        raise ConfigurationError(f"{inv}: inventory not found")
    data = inventory_list(inv)
    members = group_members(data)
    known_hosts = set((data.get("_meta") or {}).get("hostvars") or {})
    found: list[str] = []
    for name in (p.strip() for p in hosts.split(",") if p.strip()):
        if not PLAIN_NAME_RE.match(name):
            raise ConfigurationError(
                f"hosts: {hosts}: {name} is a pattern, which plan cannot resolve: pass --nodes N"
            )
        if name in members:
            picked = members[name]
        elif name in known_hosts:
            picked = [name]
        else:
            raise ConfigurationError(f"hosts: {name}: no such host or group in the inventory {inv}")
        found += [h for h in picked if h not in found]
    if not found:
        raise ConfigurationError(f"hosts: {hosts}: no host in the inventory {inv}")
    return Nodes(tuple(found), f"{_shown(inv)}, hosts: {hosts}: {', '.join(found)}")


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def held_gpus(hosts: tuple[str, ...], answers: Mapping[str, Mapping[str, Any]]) -> tuple[int, float] | None:
    """(fewest GPUs, smallest GPU memory in GiB) over ``hosts`` from the held torch answers; None unless every
    host has an answer that saw a GPU."""
    counts, sizes = [], []
    for host in hosts:
        answer = (answers.get(host) or {}).get("answer")
        if not isinstance(answer, dict):
            return None
        count, size = answer.get("device_count"), torch_gpu_mem_gib(answer)
        if not isinstance(count, int) or count <= 0 or size is None:
            return None
        counts.append(count)
        sizes.append(size)
    return (min(counts), min(sizes)) if counts else None


def torch_answers() -> tuple[dict[str, Any], str]:
    """The torch answers the controller keeps per node (preflight's, launcher.preflight.torch_answers) and
    their file: where GPU counts and memory of provisioned nodes come from."""
    from launcher.preflight.torch_answers import TorchAnswers  # noqa: PLC0415

    answers = TorchAnswers()
    return answers.entries, str(answers.path)


def plan_cluster(
    *,
    hosts: str | list[str],
    inventory: Path | None,
    preset: NodePreset,
    preset_name: str,
    facts_file: Mapping[str, Any],
    nodes_flag: int | None = None,
    gpus_flag: int | None = None,
    gpu_mem_flag: float | None = None,
    host_mem_flag: float | None = None,
    nproc_per_node: int | None = None,
    answers: Mapping[str, Mapping[str, Any]] | None = None,
    answers_path: str = "",
) -> PlannedCluster:
    """Combine flags, job spec, facts file, held torch answers, inventory and preset (module docstring)."""
    from launcher.planning.memory import Cluster  # noqa: PLC0415

    nodes = Nodes((), "--nodes") if nodes_flag else resolve_nodes(hosts, inventory)
    count = nodes_flag or len(nodes.hosts) or 1
    preset_says = f"preset {preset_name}"
    held = held_gpus(nodes.hosts, answers or {}) if nodes.hosts else None
    held_says = f"provisioned: the torch answers of {count} node(s) held in {answers_path}"
    inv_count = _inventory_gpus(inventory) if not nodes_flag else None

    gpus = _first(
        (gpus_flag, "--gpus-per-node"),
        (nproc_per_node, "the job spec's nproc_per_node"),
        (facts_file.get("gpus_per_node"), "--facts"),
        (held[0] if held else None, held_says),
        (inv_count, "the inventory's gpu_verify_expected_count"),
        (preset.gpus, f"{preset_says}: no provisioned facts held for these nodes"),
    )
    mem = _first(
        (gpu_mem_flag, "--gpu-mem-gib"),
        (facts_file.get("gpu_mem_gib"), "--facts"),
        (held[1] if held else None, held_says),
        (preset.gpu_mem_gib, preset_says),
    )
    host = _first(
        (host_mem_flag, "--host-mem-gib"),
        (facts_file.get("host_mem_gib"), "--facts"),
        (preset.host_mem_gib, preset_says),
    )
    return PlannedCluster(
        cluster=Cluster(
            nodes=count, gpus_per_node=int(gpus[0]), gpu_mem_gib=float(mem[0]), host_mem_gib=float(host[0])
        ),
        nodes=nodes,
        gpus_from=gpus[1],
        gpu_mem_from=mem[1],
        host_mem_from=host[1],
    )


def _first(*options: tuple[object, str]) -> tuple[float, str]:
    """The first option with a value (a positive number) and its source; the last one always has one."""
    for value, source in options:
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value), source
    raise AssertionError("no default")  # the preset always has one


def _inventory_gpus(inventory: Path | None) -> int | None:
    inv = inventory or default_inventory()
    if inv is None or not inv.exists():
        return None
    value = inventory_var(inventory_list(inv), "gpu_verify_expected_count")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
