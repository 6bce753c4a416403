"""``launcher check``'s link test: which transport it measures, and the GPU path
(:mod:`launcher.fabric.gpulinks`).

``--fabric auto`` (the default) measures the GPUs' fabric when the per-node GPU test found a GPU backend on
every node (its own answer, not preflight's), else TCP (gloo on the CPU: the test hosts); ``gpu`` and ``tcp``
force one. The GPU path runs the node program's ``gpu-allreduce`` (``node/gpu_allreduce.py``) through
``playbooks/check_allreduce.yml`` (the same play as the TCP test, another program): inside every node, then
the groups of
:mod:`launcher.fabric.schedule`; its figures go to the GPU cache record, the planner's only source.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from launcher.exceptions import ConfigurationError
from launcher.fabric import gpulinks, links, schedule
from launcher.fabric.env import node_fabric

if TYPE_CHECKING:
    from collections.abc import Mapping

    from launcher.backends.runner import PlaybookRunner
    from launcher.preflight.checks import NodeFacts
    from launcher.spec.jobspec import JobSpec

FABRIC_MODES = ("auto", "gpu", "tcp")
# the intra-node group's port on each node's loopback, above the link groups' ports
INTRA_PORT_OFFSET = 9000


def choose(
    mode: str, gpu_answers: Mapping[str, Mapping[str, Any]] | None, hosts: list[str]
) -> tuple[str, str]:
    """Return the transport to measure (``gpu`` or ``tcp``) and why."""
    if mode == "tcp":
        return "tcp", "--fabric tcp"
    if mode == "gpu":
        return "gpu", "--fabric gpu"
    answers = gpu_answers or {}
    with_gpu = [h for h in hosts if (answers.get(h) or {}).get("backend") not in (None, "cpu")]
    if answers and len(with_gpu) == len(hosts):
        return "gpu", "every node has a GPU backend (the GPU test's answer)"
    if not answers:
        return "tcp", "the GPU test did not run (--no-gpu-test): no GPU seen"
    return "tcp", f"no GPU backend on {', '.join(h for h in hosts if h not in with_gpu)}"


GPU_PROGRAM = "gpu-allreduce"  # the node program's GPU all-reduce (launcher/node/gpu_allreduce.py)


def _rdma(facts: NodeFacts) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int | None]]:
    ports: dict[str, list[dict[str, Any]]] = {}
    gids: dict[str, int | None] = {}
    for host in facts.hosts:
        fabric = node_fabric(host, facts.train_address[host], facts.probe[host].get("net") or {})
        active = fabric.hcas if fabric.transport == "rdma" else ()
        ports[host] = [{"device": h.split(":")[0], "port": int(h.split(":")[1])} for h in active]
        gids[host] = fabric.gid_index
    return ports, gids


def measure_gpu(
    runner: PlaybookRunner,
    spec: JobSpec,
    facts: NodeFacts,
    envs: dict[str, dict[str, str]],
    pythons: dict[str, str],
    *,
    base_port: int,
    max_mib: int,
) -> tuple[gpulinks.GpuFabric, list[dict[str, Any]]]:
    """Run the GPU all-reduce on every node; return the judged answers and the planned groups."""
    planned = schedule.planned_rounds(facts.hosts, base_port) if len(facts.hosts) > 1 else []
    ports, gids = _rdma(facts)
    node_spec = gpulinks.node_spec(
        facts.hosts,
        facts.train_address,
        planned,
        intra_port=base_port + INTRA_PORT_OFFSET,
        rdma_ports=ports,
        gid_index=gids,
        sizes=gpulinks.sweep_sizes(max_mib=max_mib),
    )
    rounds = schedule.round_count(planned)
    result = runner.run(
        "check_allreduce",
        {
            "mift_hosts": ",".join(facts.hosts),
            "mift_check_program": GPU_PROGRAM,
            "mift_check_python": pythons,
            "mift_check_env": envs,
            "mift_check_spec": node_spec,
        },
        timeout=gpulinks.GROUP_TIMEOUT_S * (rounds + 3),
    )
    if result.failures and not result.reports:
        host, line = next(iter(result.failures.items()))
        raise ConfigurationError(f"{host}: GPU all-reduce test failed: {line}")
    answers = {h: (result.reports.get(h) or {}).get("allreduce") for h in facts.hosts}
    for host, line in result.failures.items():
        if not answers.get(host):
            answers[host] = {"error": f"the node script failed: {line}"}
    return gpulinks.merge(answers, planned), planned


def gpu_links(
    runner: PlaybookRunner,
    spec: JobSpec,
    facts: NodeFacts,
    envs: dict[str, dict[str, str]],
    pythons: dict[str, str],
    *,
    base_port: int,
    fresh: bool,
    min_gbs: float,
    max_mib: int,
) -> tuple[list[str], list[str], list[str], str]:
    """Return the GPU fabric's lines to print, one line per bad node, link or tool output, the notes, and
    where the figures came from (this boot's GPU record unless ``fresh``, else measured now and saved)."""
    key = links.cache_key(facts.hosts, facts.train_address, facts.probe)
    record = gpulinks.load(key) if key is not None and not fresh else None
    if record is not None:
        results = links.results_of(record)
        verdict = links.judge(results, min_gbs=min_gbs)
        age = time.time() - float(record.get("measured_at") or 0)
        lines = ["", "GPU fabric (served from the cache):", *links.table(verdict)]
        how = f"GPU figures served from the cache ({gpulinks.cache_path(str(key))}, measured {age:.0f} s ago)"
        return lines, list(verdict.bad), [], how
    t0 = time.monotonic()
    fabric, planned = measure_gpu(runner, spec, facts, envs, pythons, base_port=base_port, max_mib=max_mib)
    took = time.monotonic() - t0
    verdict = links.judge(fabric.results, min_gbs=min_gbs)
    if key is not None:
        gpulinks.save(key, facts.hosts, fabric, verdict)
    rounds = schedule.round_count(planned)
    lines = [
        "",
        f"GPU fabric: all-reduce through torch.distributed ({fabric.library}), one process per GPU; "
        "busbw = algbw x 2(n-1)/n, n ranks (nccl-tests' definition), GB/s:",
        *gpulinks.sweep_table(fabric),
    ]
    if planned:
        lines += ["", f"links ({len(planned)} groups in {rounds} rounds, figures at the largest size):"]
        lines += links.table(verdict)
    lines += fabric.tools
    bad = [*fabric.bad, *verdict.bad]
    how = f"GPU fabric measured in {took:.1f} s ({rounds} link rounds)"
    return lines, bad, fabric.notes, how
