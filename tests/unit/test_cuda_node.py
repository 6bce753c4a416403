"""The launcher on a node whose torch reports CUDA (the lent H200): no ROCm checks, GPU count from torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launcher.exceptions import ConfigurationError
from launcher.preflight.checks import NodeFacts, _check, apply_torch_facts
from launcher.preflight.nodeenv import render_node_env, resolve_nproc
from launcher.preflight.torchinfo import cuda_hosts, torch_backend, torch_gpu_count, torch_gpu_mem_gib
from launcher.spec.jobspec_load import parse_job_spec
from launcher.transfer import nodeprogram

SRC = Path("/jobs/x.yaml")
H200 = 143771 * 1024**2
# what mift_torch_probe.py printed on the lent machine (torch 2.11.0+cu130)
CUDA = {
    "python": "/opt/torch/.venv/bin/python3",
    "torch": "2.11.0+cu130",
    "cuda": "13.0",
    "hip": None,
    "device_count": 1,
    "devices": [{"name": "NVIDIA H200", "total_memory": H200, "arch": None}],
}
ROCM = {
    "torch": "2.9.1+rocm7.0",
    "cuda": None,
    "hip": "7.0.51831",
    "device_count": 8,
    "devices": [
        {"name": "AMD Instinct MI300X", "total_memory": 206158430208, "arch": "gfx942:sramecc+:xnack-"}
    ],
}
CPU = {"torch": "2.13.0+cpu", "cuda": None, "hip": None, "device_count": 0, "devices": []}


def spec(**extra: object):
    return parse_job_spec({"name": "a", "train_config": "t", **extra}, SRC)


def facts(torch: dict[str, dict[str, Any]], **extra: Any) -> NodeFacts:
    hosts = list(torch)
    probe = {"trainer_cli_found": True, "free_bytes": 100 * 1024**3, "port_free": True}
    return NodeFacts(
        hosts=hosts,
        train_address=dict.fromkeys(hosts, "127.0.0.1"),
        stack=extra.pop("stack", {h: {} for h in hosts}),
        gpus=extra.pop("gpus", {h: {} for h in hosts}),
        probe={h: dict(probe) for h in hosts},
        torch=torch,
        **extra,
    )


def test_backend_from_torch_version() -> None:
    assert torch_backend(CUDA) == "cuda"
    assert torch_backend(ROCM) == "rocm"  # a ROCm build sets torch.version.hip (and cuda is None)
    assert torch_backend(CPU) == "cpu"
    assert torch_backend({}) is None
    assert torch_backend({"python": "/x", "error": "ModuleNotFoundError: No module named 'torch'"}) is None
    assert torch_gpu_count(CUDA) == 1 and torch_gpu_count({"error": "x"}) is None
    assert torch_gpu_mem_gib(CUDA) == pytest.approx(140.4, abs=0.01)
    assert torch_gpu_mem_gib(CPU) is None


def test_cuda_node_gets_nproc_from_torch_without_mift_gpus() -> None:
    assert resolve_nproc(spec(), {}, ["gpu-local"], {}, {"gpu-local": CUDA}) == 1
    two = {**CUDA, "device_count": 2, "devices": CUDA["devices"] * 2}
    assert resolve_nproc(spec(), {}, ["a", "b"], {}, {"a": two, "b": two}) == 2
    assert resolve_nproc(spec(nproc_per_node=3), {}, ["a"], {}, {"a": CUDA}) == 3  # the spec wins
    with pytest.raises(ConfigurationError, match="differ"):
        resolve_nproc(spec(), {}, ["a", "b"], {}, {"a": CUDA, "b": two})
    with pytest.raises(ConfigurationError, match="a: torch reports CUDA but sees no GPU"):
        resolve_nproc(spec(), {}, ["a"], {}, {"a": {**CUDA, "device_count": 0, "devices": []}})


def test_rocm_node_still_needs_verified_gpus() -> None:
    with pytest.raises(ConfigurationError, match="h1: no verified GPUs"):
        resolve_nproc(spec(), {}, ["h1"], {}, {"h1": ROCM})
    assert resolve_nproc(spec(), {"h1": {"count": 8}}, ["h1"], {}, {"h1": ROCM}) == 8
    with pytest.raises(ConfigurationError, match="cpu backend"):  # unchanged without a torch probe
        resolve_nproc(spec(), {"h1": {"count": 8}}, ["h1"], {"h1": {"backend": "cpu"}})


def test_mixed_cuda_and_rocm_refused() -> None:
    with pytest.raises(ConfigurationError, match="h2: torch reports ROCm but h1: torch reports CUDA"):
        cuda_hosts(["h1", "h2"], {"h1": CUDA, "h2": ROCM})


def test_preflight_notes_skipped_rocm_checks_and_uses_torch() -> None:
    node = facts({"gpu-local": CUDA})
    apply_torch_facts(node)
    _check(node, spec())
    assert node.nproc_per_node == 1
    assert len(node.notes) == 1
    note = node.notes[0]
    assert "torch 2.11.0+cu130 reports CUDA 13.0" in note and "ROCm-specific checks skipped" in note
    assert "1 x NVIDIA H200 (140.4 GiB)" in note
    assert node.warnings == []  # no 'run provision.yml' advice: the torch versions stand in for mift_stack
    assert node.stack["gpu-local"]["versions"] == {"torch": "2.11.0+cu130", "cuda": "13.0"}
    assert node.gpu_mem_gib("gpu-local") == pytest.approx(140.4, abs=0.01)


def test_preflight_rocm_node_unchanged() -> None:
    node = facts({"h1": ROCM}, gpus={"h1": {"count": 8, "memory_gib": 191.98}})
    apply_torch_facts(node)
    _check(node, spec())
    assert node.notes == [] and node.nproc_per_node == 8
    assert node.gpu_mem_gib("h1") == 191.98  # the verified fact, not torch
    assert any("no node has stack facts" in w for w in node.warnings)


def test_cuda_torch_versions_compared_across_nodes() -> None:
    node = facts({"a": CUDA, "b": {**CUDA, "torch": "2.10.0+cu128", "cuda": "12.8"}})
    apply_torch_facts(node)
    with pytest.raises(ConfigurationError, match=r"b: versions\.(cuda|torch) is"):
        _check(node, spec())


def test_inventory_node_env_under_job_env() -> None:
    envs = render_node_env(
        spec(env={"NCCL_DEBUG": "INFO", "PYTHONPATH": "/job"}),
        hosts=["gpu-local"],
        master_addr="127.0.0.1",
        nproc_per_node=1,
        run_id="r1",
        node_env={"gpu-local": {"PYTHONPATH": "/tmp/site", "NCCL_NVLS_ENABLE": "0", "NPROC_PER_NODE": 9}},
    )
    env = envs["gpu-local"]
    assert env["PYTHONPATH"] == "/job" and env["NCCL_NVLS_ENABLE"] == "0" and env["NCCL_DEBUG"] == "INFO"
    assert env["NPROC_PER_NODE"] == "1"  # the launcher's own variables win


def test_node_venv_defaults_to_the_inventory() -> None:
    assert spec().node_venv is None
    assert spec(node_venv="/opt/x").node_venv == "/opt/x"


def _run_probe(venv: Path) -> dict[str, Any]:
    """What preflight's probe (the node program's, run as preflight.yml does) says torch reports."""
    out = subprocess.run(
        [
            sys.executable,
            str(nodeprogram.program_file()),
            "probe",
            str(venv.parent / "run"),
            "--venv",
            str(venv),
            "--facts-dir",
            str(venv.parent),
            "--dists",
            "torch",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)["torch"]


def test_torch_probe_follows_the_cli_shebang_of_a_pip_target(tmp_path: Path) -> None:
    """A ``pip --target`` folder has bin/llamafactory-cli but no bin/python: its shebang names the python."""
    fake = tmp_path / "fakepython"
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(CUDA)}'\n")
    fake.chmod(0o755)
    (tmp_path / "site" / "bin").mkdir(parents=True)
    cli = tmp_path / "site" / "bin" / "llamafactory-cli"
    cli.write_text(f"#!{fake}\nprint('train')\n")
    cli.chmod(0o755)
    got = _run_probe(tmp_path / "site")
    assert got["python"] == str(fake) and torch_backend(got) == "cuda" and got["device_count"] == 1


def test_torch_probe_reports_an_error_without_python(tmp_path: Path) -> None:
    got = _run_probe(tmp_path / "nothing")
    assert "error" in got and torch_backend(got) is None
    broken = tmp_path / "venv" / "bin"
    broken.mkdir(parents=True)
    (broken / "python3").write_text("#!/bin/sh\necho 'No module named torch' >&2; exit 1\n")
    os.chmod(broken / "python3", 0o755)
    got = _run_probe(tmp_path / "venv")
    assert got["error"] == "No module named torch"
