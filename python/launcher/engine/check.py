"""``launcher check``: accept a job's nodes and the links between them before a run.

1. Preflight's probe on every node (read-only; with ``--gpu-tools``: what amd-smi prints).
2. Each node's fabric environment (:mod:`launcher.fabric.env`): a missing interface or settings that differ
   across nodes are refused here, one line naming the node, as ``run`` would.
3. Per node: :func:`launcher.fabric.accept.accept_nodes` (RDMA ports, GID indexes, ECC, PCIe, firmware), and
   the GPU test on every node (``playbooks/check_gpu.yml``, ``node/gpu_check.py``: bf16 matmul TFLOP/s
   and copy bandwidth of every GPU against floors and against the node's best GPU; nothing left allocated).
   A node whose torch is a CPU build (the script's answer, not preflight's: torch is asked there only when
   needed) gets a note, not a pass.
4. The fabric (:mod:`launcher.engine.check_fabric` chooses): on GPU nodes the GPU all-reduce (NCCL/RCCL
through
   torch.distributed, inside each node and across nodes, a sweep of sizes; ``all_reduce_perf`` and
   ``ib_write_bw`` beside it where the nodes have them), else the all-reduce over TCP (gloo over the derived
   ``GLOO_SOCKET_IFNAME``), both in the rounds of :mod:`launcher.fabric.schedule` (``playbooks/
   check_allreduce.yml``), judged by :func:`launcher.fabric.links.judge`; served from the cache of this boot
   and node set unless ``fresh``. Only the GPU figures are ever the planner's.

Prints the node table, the table of links, one ``bad:`` line per bad node or link, then one summary line with
the time taken. Exit code: 0 when nothing is bad, 1 otherwise (2: bad input).
"""

from __future__ import annotations

import io
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from launcher.engine import check_fabric
from launcher.exceptions import ConfigurationError
from launcher.exit_codes import JOB_FAILED, OK, ExitCode
from launcher.fabric import links, schedule
from launcher.fabric.accept import accept_nodes
from launcher.rundir import json_out
from launcher.spec.nodelayout import layout

if TYPE_CHECKING:
    from launcher.backends.runner import PlaybookRunner
    from launcher.fabric.env import NodeFabric
    from launcher.preflight.checks import NodeFacts
    from launcher.spec.jobspec import JobSpec

# the rounds' ports start here, above the job's master_port (nothing of the job runs during a check)
PORT_OFFSET = 10
# the GPU test of one node: 8 GPUs one after the other, a few seconds each (4-6 s on an H200), torch's start
GPU_TEST_TIMEOUT_S = 600


def _pythons(spec: JobSpec, facts: NodeFacts) -> dict[str, str]:
    """Return host -> the trainer's interpreter (what preflight's torch answer ran, else the node venv's)."""
    venv = spec.node_venv or layout().venv
    return {h: str((facts.torch.get(h) or {}).get("python") or f"{venv}/bin/python3") for h in facts.hosts}


def measure_gpus(
    runner: PlaybookRunner,
    hosts: list[str],
    pythons: dict[str, str],
    *,
    min_tflops: float,
    min_membw_gbs: float,
) -> dict[str, dict[str, Any]]:
    """Run the GPU test on ``hosts``; return host -> its answer (``ok``, ``gpus``, ``problems``, ...); a node
    whose test did not answer gets ``ok`` false and the failure as its problem."""
    args = ["--min-tflops", f"{min_tflops:g}", "--min-membw-gbs", f"{min_membw_gbs:g}"]
    result = runner.run(
        "check_gpu",
        {
            "mift_hosts": ",".join(hosts),
            "mift_check_python": {h: pythons[h] for h in hosts},
            "mift_gpu_check_args": args,
        },
        timeout=GPU_TEST_TIMEOUT_S,
    )
    answers: dict[str, dict[str, Any]] = {}
    for host in hosts:
        answer = result.report(host, "gpu_check")
        if isinstance(answer, dict):
            answers[host] = answer
        else:
            failure = result.failures.get(host) or "no answer"
            answers[host] = {"ok": False, "gpus": [], "problems": [f"GPU test failed: {failure}"]}
    return answers


def gpu_table(answers: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Return the GPU table (one line per node: GPUs, the slowest GPU's TFLOP/s and GB/s, what is left) and
    one line per bad node (``host: problem``)."""
    lines = [f"{'node':<12} {'GPUs':>4} {'bf16 TFLOP/s':>13} {'copy GB/s':>10} {'left MiB':>9} {'s':>6}"]
    bad: list[str] = []
    for host, answer in answers.items():
        tflops, membw = answer.get("tflops"), answer.get("membw_gbs")
        tflops_text = "-" if tflops is None else f"{tflops:.1f}"
        membw_text = "-" if membw is None else f"{membw:.0f}"
        lines.append(
            f"{host:<12} {len(answer.get('gpus') or []):>4} {tflops_text:>13} {membw_text:>10} "
            f"{answer.get('reserved_after_mib', '-')!s:>9} {answer.get('wall_s', '-')!s:>6}"
        )
        bad.extend(f"{host}: {problem}" for problem in answer.get("problems") or [])
        if not answer.get("problems") and not answer.get("ok"):
            bad.append(f"{host}: GPU test failed")
    return lines, bad


def _node_line(fabric: NodeFabric, env: dict[str, str]) -> str:
    rdma = (
        f"rdma {env.get('NCCL_IB_HCA', '')} gid {env.get('NCCL_IB_GID_INDEX', '-')}"
        if fabric.transport == "rdma"
        else f"sockets ({fabric.why_socket})"
    )
    return f"{fabric.host:<12} {env.get('NCCL_SOCKET_IFNAME', '-'):<10} {rdma}"


def measure_links(
    runner: PlaybookRunner,
    spec: JobSpec,
    facts: NodeFacts,
    envs: dict[str, dict[str, str]],
    *,
    size_mb: float,
) -> list[links.LinkResult]:
    """Run the all-reduce rounds on the nodes (TCP, gloo); return one result per group."""
    planned = schedule.planned_rounds(facts.hosts, spec.master_port + PORT_OFFSET)
    pythons = _pythons(spec, facts)
    result = runner.run(
        "check_allreduce",
        {
            "mift_hosts": ",".join(facts.hosts),
            "mift_check_python": pythons,
            "mift_check_env": envs,
            "mift_check_spec": {
                "addrs": dict(facts.train_address),
                "rounds": planned,
                "size_mb": size_mb,
                "iters": links.ITERS,
                "timeout_s": links.ROUND_TIMEOUT_S,
            },
        },
        timeout=links.ROUND_TIMEOUT_S * (schedule.round_count(planned) + 1),
    )
    if result.failures and not result.reports:
        host, line = next(iter(result.failures.items()))
        raise ConfigurationError(f"{host}: all-reduce test failed: {line}")
    return links.merge({h: r.get("allreduce") for h, r in result.reports.items()}, planned)


def _links(
    runner: PlaybookRunner,
    spec: JobSpec,
    facts: NodeFacts,
    envs: dict[str, dict[str, str]],
    *,
    fresh: bool,
    min_gbs: float,
    size_mb: float,
) -> tuple[list[str], list[str], str]:
    """Return the table of links, one line per bad node or link, and where the figures came from (the cache
    of this boot and node set, unless ``fresh``, else measured now and cached)."""
    key = links.cache_key(facts.hosts, facts.train_address, facts.probe)
    record = links.load(key) if key is not None and not fresh else None
    t_links = time.monotonic()
    if record is not None:
        results = links.results_of(record)
        age = time.time() - float(record.get("measured_at") or 0)
        how = f"links served from the cache ({links.cache_dir() / str(key)}.json, measured {age:.0f} s ago)"
    else:
        results = measure_links(runner, spec, facts, envs, size_mb=size_mb)
        rounds = schedule.round_count(schedule.planned_rounds(facts.hosts, 0))
        how = f"links (TCP) measured in {time.monotonic() - t_links:.1f} s ({rounds} rounds)"
    verdict = links.judge(results, min_gbs=min_gbs)
    if record is None and key is not None:
        links.save(key, facts.hosts, verdict, nproc_per_node=facts.nproc_per_node)
    return links.table(verdict), list(verdict.bad), how


def _fabric(
    runner: PlaybookRunner,
    spec: JobSpec,
    facts: NodeFacts,
    envs: dict[str, dict[str, str]],
    answers: dict[str, dict[str, Any]] | None,
    *,
    bad: list[str],
    notes: list[str],
    out: IO[str],
    options: dict[str, Any],
) -> tuple[str, list[str]]:
    """Measure the fabric (GPU or TCP, :func:`launcher.engine.check_fabric.choose`), print its lines, add its
    bad lines and notes; return where its figures came from and the lines."""
    transport, why = check_fabric.choose(str(options["fabric"]), answers, facts.hosts)
    print(f"\nfabric: {transport.upper()} ({why})", file=out)
    if transport == "gpu":
        lines, link_bad, fabric_notes, how = check_fabric.gpu_links(
            runner,
            spec,
            facts,
            envs,
            _pythons(spec, facts),
            base_port=spec.master_port + PORT_OFFSET,
            fresh=bool(options["fresh"]),
            min_gbs=float(options["min_gbs"]),
            max_mib=int(options["max_mib"]),
        )
        notes.extend(fabric_notes)
    elif len(facts.hosts) > 1:
        size_mb = float(options["size_mb"])
        lines, link_bad, how = _links(
            runner,
            spec,
            facts,
            envs,
            fresh=bool(options["fresh"]),
            min_gbs=float(options["min_gbs"]),
            size_mb=size_mb,
        )
        lines = [
            f"links: TCP (gloo on the CPU, {size_mb:g} MiB): the management path, not the GPU fabric; never "
            "the planner's figure",
            *lines,
        ]
    else:
        return "one node: no links", []
    for line in lines:
        print(line, file=out)
    bad.extend(link_bad)
    return how, lines


def run_check(  # noqa: PLR0915 - the check's steps in order, text and JSON from one pass
    job_path: Path,
    *,
    inventory: Path | None,
    fresh: bool = False,
    min_gbs: float = links.MIN_GBS,
    size_mb: float = links.SIZE_MB,
    gpu_tools: bool = True,
    gpu_test: bool = True,
    gpu_min_tflops: float = 0.0,
    gpu_min_membw_gbs: float = 0.0,
    fabric: str = "auto",
    gpu_max_mib: int = 1024,
    out: IO[str] | None = None,
    as_json: bool = False,
) -> ExitCode:
    """Check the job's nodes and links; print the tables and one line per bad node or link (``as_json``: one
    ``check`` object instead, launcher.rundir.json_out)."""
    from launcher.backends import runner as runner_module  # noqa: PLC0415
    from launcher.engine.plan import fabric_of  # noqa: PLC0415
    from launcher.fabric.env import node_fabric  # noqa: PLC0415
    from launcher.preflight.checks import run_preflight  # noqa: PLC0415
    from launcher.preflight.nodeenv import render_node_env  # noqa: PLC0415
    from launcher.spec.inventory import check_hosts  # noqa: PLC0415
    from launcher.validation.job import load_job  # noqa: PLC0415

    out = out or sys.stdout
    json_to, out = (out, io.StringIO()) if as_json else (None, out)
    t0 = time.monotonic()
    inv = inventory.resolve() if inventory else None
    job = load_job(job_path)
    spec = job.spec
    if spec.slurm.login_only:
        raise ConfigurationError(f"{job_path}: check: not with slurm.shared_dir (the nodes are Slurm's)")
    check_hosts(spec, inv, job_path)
    run_id = time.strftime("check-%Y%m%d-%H%M%S")
    workdir = Path(tempfile.mkdtemp(prefix="mift-check-"))
    runner = runner_module.make_runner(workdir, inventory=inv)
    facts = run_preflight(runner, spec, run_id, probe_args=["--gpu-tools"] if gpu_tools else [])
    derived = fabric_of(spec, facts)
    envs = render_node_env(
        spec,
        hosts=facts.hosts,
        master_addr=facts.train_address[facts.master],
        nproc_per_node=facts.nproc_per_node,
        run_id=run_id,
        node_env=facts.node_env,
        fabric_env=derived,
    )
    print(f"{'node':<12} {'interface':<10} transport", file=out)
    node_rows: list[dict[str, Any]] = []
    for host in facts.hosts:
        net = facts.probe[host].get("net") or {}
        node = node_fabric(host, facts.train_address[host], net)
        print(_node_line(node, envs[host]), file=out)
        node_rows.append(_node_row(node, envs[host]))
    releases = {h: _rocm_release(facts.stack.get(h) or {}) for h in facts.hosts}
    accepted = accept_nodes(facts.hosts, facts.train_address, facts.probe, releases)
    bad = list(accepted.bad)
    gpu_notes: list[str] = []
    answers: dict[str, dict[str, Any]] | None = None
    measured: dict[str, dict[str, Any]] = {}
    if gpu_test:
        answers = measure_gpus(
            runner,
            facts.hosts,
            _pythons(spec, facts),
            min_tflops=gpu_min_tflops,
            min_membw_gbs=gpu_min_membw_gbs,
        )
        gpu_notes = [
            f"{h}: torch is a CPU build (no CUDA or HIP): GPU test not run"
            for h, answer in answers.items()
            if answer.get("backend") == "cpu"
        ]
        measured = {h: a for h, a in answers.items() if a.get("backend") != "cpu"}
        if measured:
            gpu_lines, gpu_bad = gpu_table(measured)
            print("", file=out)
            for line in gpu_lines:
                print(line, file=out)
            bad.extend(gpu_bad)
    how, link_lines = _fabric(
        runner,
        spec,
        facts,
        envs,
        answers,
        bad=bad,
        notes=gpu_notes,
        out=out,
        options={
            "fabric": fabric,
            "fresh": fresh,
            "min_gbs": min_gbs,
            "size_mb": size_mb,
            "max_mib": gpu_max_mib,
        },
    )
    for note in [*facts.notes, *accepted.notes, *gpu_notes]:
        print(f"note: {note}", file=out)
    for warning in facts.warnings:
        print(f"warning: {warning}", file=out)
    for line in bad:
        print(f"bad: {line}", file=out)
    verdict_word = f"{len(bad)} bad" if bad else "passed"
    print(
        f"check: {len(facts.hosts)} nodes, {verdict_word}; {how}; total {time.monotonic() - t0:.1f} s",
        file=out,
        flush=True,
    )
    if json_to is not None:
        json_out.write(
            json_out.check_object(
                nodes=node_rows,
                gpus=measured,
                links=link_lines,
                links_from=how,
                notes=[*facts.notes, *accepted.notes, *gpu_notes],
                warnings=list(facts.warnings),
                bad=bad,
                seconds=time.monotonic() - t0,
            ),
            json_to,
        )
    return JOB_FAILED if bad else OK


def _node_row(fabric: NodeFabric, env: dict[str, str]) -> dict[str, Any]:
    """Return a node's row of ``check --json``: its interface and transport, as the table's line."""
    return {
        "host": fabric.host,
        "interface": env.get("NCCL_SOCKET_IFNAME"),
        "transport": fabric.transport,
        "rdma_hca": env.get("NCCL_IB_HCA") if fabric.transport == "rdma" else None,
        "gid_index": env.get("NCCL_IB_GID_INDEX") if fabric.transport == "rdma" else None,
        "why_socket": fabric.why_socket if fabric.transport != "rdma" else None,
    }


def _rocm_release(stack: dict[str, Any]) -> str | None:
    for key in ("rocm_version", "rocm"):
        value = stack.get(key) or (stack.get("versions") or {}).get(key)
        if value:
            return str(value)
    return None
