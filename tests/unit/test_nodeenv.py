"""Per-node environment rendering (with provisioning's runtime env), processes per node, stack drift, train
config preparation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml

from launcher.backends.runner import PlaybookResult
from launcher.engine.plan import build_plan
from launcher.exceptions import ConfigurationError
from launcher.preflight.checks import NodeFacts, run_preflight, stack_drift
from launcher.preflight.nodeenv import masked, mi300x_env, provisioned_env, render_node_env, resolve_nproc
from launcher.spec.jobspec_load import parse_job_spec
from launcher.validation.job import load_job

SRC = Path("/jobs/x.yaml")


def spec(**extra: object):
    return parse_job_spec({"name": "a", "train_config": "t", **extra}, SRC)


def test_render_node_env_ranks_and_shared_master() -> None:
    envs = render_node_env(
        spec(env={"NCCL_DEBUG": "INFO", "HF_TOKEN": "x"}, master_port=29611),
        hosts=["h1", "h2"],
        master_addr="10.0.0.1",
        nproc_per_node=8,
        run_id="r1",
    )
    assert envs["h1"]["NODE_RANK"] == "0" and envs["h2"]["NODE_RANK"] == "1"
    for env in envs.values():
        assert env["NNODES"] == "2" and env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"] == "29611"
        assert env["NPROC_PER_NODE"] == "8" and env["FORCE_TORCHRUN"] == "1" and env["NCCL_DEBUG"] == "INFO"
        assert env["HF_HUB_OFFLINE"] == "1"
    assert masked(envs)["h2"]["HF_TOKEN"] == "***" and envs["h2"]["HF_TOKEN"] == "x"


def test_nproc_from_spec_else_verified_gpus() -> None:
    assert resolve_nproc(spec(nproc_per_node=2), {}, ["h1"], {}) == 2
    gpus = {"h1": {"count": 8}, "h2": {"count": 8}}
    assert resolve_nproc(spec(), gpus, ["h1", "h2"], {}) == 8


def test_nproc_must_be_explicit_without_gpus_or_on_cpu() -> None:
    with pytest.raises(ConfigurationError, match="h2: no verified GPUs"):
        resolve_nproc(spec(), {"h1": {"count": 8}}, ["h1", "h2"], {})
    with pytest.raises(ConfigurationError, match="cpu backend"):
        resolve_nproc(spec(), {"h1": {"count": 8}}, ["h1"], {"h1": {"backend": "cpu"}})
    with pytest.raises(ConfigurationError, match="differ"):
        resolve_nproc(spec(), {"h1": {"count": 8}, "h2": {"count": 4}}, ["h1", "h2"], {})


def test_stack_drift_names_host_and_package() -> None:
    same = {"versions": {"torch": "2.13.0", "deepspeed": "0.19.8"}, "backend": "cpu", "hostname": "a"}
    other = {"versions": {"torch": "2.12.0", "deepspeed": "0.19.8"}, "backend": "cpu", "hostname": "b"}
    assert stack_drift({"h1": same, "h2": {**same, "hostname": "b"}}, ["h1", "h2"]) == []
    assert stack_drift({"h1": same, "h2": other}, ["h1", "h2"]) == [
        "h2: versions.torch is 2.12.0 (h1: 2.13.0)"
    ]


def _facts(*hosts: str) -> NodeFacts:
    return NodeFacts(
        hosts=list(hosts),
        train_address={h: f"10.0.0.{i}" for i, h in enumerate(hosts)},
        stack={h: {} for h in hosts},
        gpus={h: {} for h in hosts},
        probe={h: {} for h in hosts},
        nproc_per_node=1,
    )


def test_plan_sets_deepspeed_output_and_resume(tmp_path: Path) -> None:
    train = tmp_path / "t.yaml"
    train.write_text("finetuning_type: lora\ndeepspeed: /somewhere/ds.json\noutput_dir: /x\n")
    ds = tmp_path / "ds.json"
    ds.write_text('{"zero_optimization": {"stage": 3}}')
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "a",
                "train_config": "t.yaml",
                "deepspeed": "ds.json",
                "output_dir": "/data/{run_id}",
                "resume": True,
            }
        )
    )
    plan = build_plan(load_job(job), _facts("h1", "h2"), "r1")
    shipped = yaml.safe_load(plan.files["train.yaml"])
    assert shipped["deepspeed"] == "ds_config.json" and shipped["output_dir"] == "/data/r1"
    assert shipped["overwrite_output_dir"] is False and shipped["save_on_each_node"] is True
    assert plan.expect_outputs == ("adapter_model.safetensors", "all_results.json")
    assert yaml.safe_load(plan.files["ds_config.json"])["checkpoint"] == {"use_node_local_storage": True}
    assert plan.jobs["h1"]["expect_outputs"] and not plan.jobs["h2"]["expect_outputs"]
    train.write_text("finetuning_type: lora\noutput_dir: /x\n")
    job.write_text(yaml.safe_dump({"name": "a", "train_config": "t.yaml"}))
    no_ds = build_plan(load_job(job), _facts("h1"), "r1")
    shipped = yaml.safe_load(no_ds.files["train.yaml"])
    assert "deepspeed" not in shipped and shipped["overwrite_output_dir"] is True
    assert set(no_ds.files) == {"train.yaml"}


def test_provisioned_env_exports_the_triton_switch_of_flash_attn() -> None:
    switch = {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"}
    assert provisioned_env({"enabled": True, "backend": "triton", "runtime_env": switch}) == switch
    # a fact written before runtime_env was recorded still gets it; CK, disabled and absent facts get nothing
    assert provisioned_env({"enabled": True, "backend": "triton"}) == switch
    assert provisioned_env({"enabled": True, "backend": "ck", "runtime_env": {}}) == {}
    assert provisioned_env({"enabled": False, "backend": "", "runtime_env": {}}) == {}
    assert provisioned_env(None) == {}


class _Runner:
    """Test double of PlaybookRunner: returns the preflight reports of two nodes, runs nothing."""

    def __init__(self, reports: dict[str, dict[str, object]]) -> None:
        self.cancel_requested = threading.Event()
        self.reports = reports

    def run(self, playbook: str, extravars: dict[str, object]) -> PlaybookResult:
        assert playbook == "preflight"
        return PlaybookResult(playbook, 0, "successful", reports=self.reports)


def test_preflight_passes_the_flash_attn_runtime_env_to_the_trainer() -> None:
    """A node provisioned with flash-attn's Triton backend gets FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE."""
    probe = {"trainer_cli_found": True, "free_bytes": 10**12, "port_free": True}
    switch = {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"}
    fact = {"enabled": True, "backend": "triton", "runtime_env": switch}
    reports = {
        host: {
            "preflight": {
                "train_address": address,
                "probe": probe,
                "flash_attn": fact,
                "node_env": node_env,
                "play_hosts": ["h1", "h2"],
            }
        }
        for host, address, node_env in [
            ("h1", "10.0.0.1", {}),
            ("h2", "10.0.0.2", {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "FALSE"}),  # the inventory wins
        ]
    }
    job = spec(nproc_per_node=1)
    facts = run_preflight(_Runner(reports), job, "r1")  # type: ignore[arg-type]
    envs = render_node_env(
        job, hosts=facts.hosts, master_addr="10.0.0.1", nproc_per_node=1, run_id="r1", node_env=facts.node_env
    )
    assert envs["h1"]["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "TRUE"
    assert envs["h2"]["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "FALSE"
    with_job_env = render_node_env(
        spec(nproc_per_node=1, env={"FLASH_ATTENTION_TRITON_AMD_ENABLE": "0"}),
        hosts=facts.hosts,
        master_addr="10.0.0.1",
        nproc_per_node=1,
        run_id="r1",
        node_env=facts.node_env,
    )
    assert with_job_env["h1"]["FLASH_ATTENTION_TRITON_AMD_ENABLE"] == "0"  # the job spec wins over both


# AMD's MI300X run-time settings (launcher.preflight.nodeenv.MI300X_ENV; sources in docs/stack.md)
ROCM_STACK = {"backend": "rocm", "hip": "7.2.53211"}
EIGHT = {"verified": True, "count": 8}


def test_mi300x_defaults_on_a_rocm_node_with_8_gpus() -> None:
    assert mi300x_env("h1", stack=ROCM_STACK, gpus=EIGHT) == {
        "NCCL_MIN_NCHANNELS": "112",
        "HSA_OVERRIDE_CPU_AFFINITY_DEBUG": "0",
        "TORCH_BLAS_PREFER_HIPBLASLT": "1",
    }


def test_no_mi300x_settings_on_cpu_or_cuda_nodes() -> None:
    assert mi300x_env("h1", stack={"backend": "cpu"}, gpus={}) == {}
    assert mi300x_env("h1", stack={"backend": "cuda", "hip": None}, gpus=EIGHT, tunableop="tune") == {}


def test_channels_only_with_8_gpus() -> None:
    env = mi300x_env("h1", stack=ROCM_STACK, gpus={"verified": True, "count": 4})
    assert "NCCL_MIN_NCHANNELS" not in env
    assert env["TORCH_BLAS_PREFER_HIPBLASLT"] == "1"


def test_inventory_changes_and_drops_a_default() -> None:
    env = mi300x_env(
        "h1",
        stack=ROCM_STACK,
        gpus=EIGHT,
        overrides={"NCCL_MIN_NCHANNELS": 64, "TORCH_BLAS_PREFER_HIPBLASLT": None},
    )
    assert env == {"NCCL_MIN_NCHANNELS": "64", "HSA_OVERRIDE_CPU_AFFINITY_DEBUG": "0"}


@pytest.mark.parametrize(("mode", "tuning"), [("tune", "1"), ("use", "0")])
def test_tunableop_is_opt_in_with_a_kept_per_node_file(mode: str, tuning: str) -> None:
    assert "PYTORCH_TUNABLEOP_ENABLED" not in mi300x_env("h1", stack=ROCM_STACK, gpus=EIGHT)
    env = mi300x_env("h1", stack=ROCM_STACK, gpus=EIGHT, tunableop=mode)
    assert env["PYTORCH_TUNABLEOP_ENABLED"] == "1"
    assert env["PYTORCH_TUNABLEOP_TUNING"] == tuning
    assert env["PYTORCH_TUNABLEOP_FILENAME"] == "/var/lib/mift/tunableop/tunableop_results.csv"
    assert "/runs/" not in env["PYTORCH_TUNABLEOP_FILENAME"]  # not in a run directory: kept between runs


def test_bad_tunableop_mode_and_overrides_are_one_line_errors() -> None:
    with pytest.raises(ConfigurationError, match=r"^h2: mift_tunableop 'yes' is not one of off, tune, use$"):
        mi300x_env("h2", stack=ROCM_STACK, gpus=EIGHT, tunableop="yes")
    with pytest.raises(ConfigurationError, match=r"^h2: mift_mi300x_env must be a mapping"):
        mi300x_env("h2", stack=ROCM_STACK, gpus=EIGHT, overrides=["NCCL_MIN_NCHANNELS=1"])  # type: ignore[arg-type]


def test_inventory_node_env_and_job_env_win_over_the_mi300x_defaults() -> None:
    node_env = {"h1": {**mi300x_env("h1", stack=ROCM_STACK, gpus=EIGHT), "NCCL_MIN_NCHANNELS": "32"}}
    envs = render_node_env(
        spec(env={"TORCH_BLAS_PREFER_HIPBLASLT": "0"}),
        hosts=["h1"],
        master_addr="10.0.0.1",
        nproc_per_node=8,
        run_id="r1",
        node_env=node_env,
    )
    assert envs["h1"]["NCCL_MIN_NCHANNELS"] == "32"
    assert envs["h1"]["TORCH_BLAS_PREFER_HIPBLASLT"] == "0"
    assert envs["h1"]["HSA_OVERRIDE_CPU_AFFINITY_DEBUG"] == "0"
