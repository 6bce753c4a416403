"""Which strategy the planner picks, and the plan command's outputs."""

from __future__ import annotations

import argparse
import json

import pytest
import yaml

from launcher.commands import plan as plan_command
from launcher.exceptions import ConfigurationError
from launcher.planning.hardware import NODE_PRESETS
from launcher.planning.memory import GIB, SPEED_RANK, Cluster, Strategy, Workload, activation_bytes
from launcher.planning.model import BUNDLED_DIR, ModelShape, load_shape
from launcher.planning.training import TrainingPlan, plan_training
from launcher.planning.training_yaml import (
    choose_deepspeed_config,
    plan_as_written,
    plan_training_from_yaml,
    write_auto_config,
)

H200 = Cluster(nodes=1, gpus_per_node=1, gpu_mem_gib=140.4, host_mem_gib=125)
MI300X = 191.98
# the bench's 3B shape (bench/gpu/make_assets.py) and the gpu-lab measurement of it
SHAPE_3B = ModelShape(hidden=3072, intermediate=8192, layers=28, heads=24, kv_heads=8, vocab=4004)
LLAMA3_70B = load_shape(BUNDLED_DIR / "llama3_70b.json")


def make_plan(workload: Workload, cluster: Cluster) -> TrainingPlan:
    """The plan of the YAML's own split (plan: as_written): one candidate per strategy, in speed rank."""
    return plan_training(workload, cluster, accumulation=1, fixed_split=True)


def test_3b_lora_on_one_h200_picks_no_deepspeed():
    plan = make_plan(Workload(SHAPE_3B, "lora", micro_batch=2, cutoff_len=1024), H200)
    assert plan.choice.strategy is Strategy.NONE
    assert all(c.fits for c in plan.candidates)


def test_3b_estimate_is_within_20_percent_of_the_measured_peak():
    # gpu-lab README: no DeepSpeed, micro-batch 2, cutoff 1024: 7779 MiB (nvidia-smi, context included)
    plan = make_plan(Workload(SHAPE_3B, "lora", micro_batch=2, cutoff_len=1024), H200)
    assert plan.candidates[0].estimate.gpu_total / GIB * 1024 == pytest.approx(7779, rel=0.20)


def test_70b_lora_on_one_mi300x_at_the_seed_settings_fits_without_deepspeed():
    # LoRA r8 on all linear layers, micro-batch 1, cutoff 2048: bf16 weights 131 GiB + ~10 GiB; on one GPU
    # ZeRO-3 shards nothing, so it needs as much as DDP: the fastest that fits is no DeepSpeed.
    plan = make_plan(
        Workload(LLAMA3_70B, "lora", micro_batch=1, cutoff_len=2048), Cluster(1, 1, MI300X, 1536)
    )
    assert plan.choice.strategy is Strategy.NONE
    assert 135 < plan.candidates[0].estimate.gpu_total / GIB < 150


def test_70b_lora_long_context_does_not_pick_ddp():
    work = Workload(LLAMA3_70B, "lora", micro_batch=2, cutoff_len=8192)
    one = make_plan(work, Cluster(1, 1, MI300X, 1536))
    assert not one.candidates[0].fits
    assert one.choice is None  # param offload does not lower one GPU's peak (measured), so nothing fits
    assert "Nothing fits" in one.reason()
    two = make_plan(work, Cluster(1, 2, MI300X, 1536))
    assert two.choice.strategy is Strategy.ZERO3
    eight = make_plan(work, Cluster(1, 8, MI300X, 1536))
    assert eight.choice.strategy is Strategy.ZERO3


def test_70b_full_finetune_on_8_mi300x_needs_zero3():
    plan = make_plan(
        Workload(LLAMA3_70B, "full", micro_batch=1, cutoff_len=2048), Cluster(1, 8, MI300X, 1536)
    )
    assert plan.choice.strategy is Strategy.ZERO3
    assert not plan.candidates[0].fits and not plan.candidates[1].fits


def test_speed_order_and_that_each_slower_strategy_needs_no_more_gpu_memory():
    plan = make_plan(
        Workload(LLAMA3_70B, "full", micro_batch=1, cutoff_len=2048), Cluster(2, 8, MI300X, 1536)
    )
    assert tuple(c.strategy for c in plan.candidates) == SPEED_RANK
    gpu = [c.estimate.gpu_total for c in plan.candidates]
    assert gpu[2] >= gpu[3] >= gpu[4]
    assert gpu[0] > gpu[1] > gpu[2]


def test_gradient_checkpointing_off_costs_far_more_activation_memory():
    on = activation_bytes(Workload(LLAMA3_70B, "lora", cutoff_len=4096))
    off = activation_bytes(Workload(LLAMA3_70B, "lora", cutoff_len=4096, gradient_checkpointing=False))
    assert off > 8 * on  # 80 layers kept vs one layer and the layer inputs (measured slopes: docs/planner.md)


def test_host_memory_decides_offload():
    work = Workload(LLAMA3_70B, "full", micro_batch=1, cutoff_len=2048)
    plan = make_plan(work, Cluster(1, 8, 120.0, 512))
    by = {c.strategy: c for c in plan.candidates}
    assert by[Strategy.ZERO3_OFFLOAD_OPT].fits_gpu
    assert not by[Strategy.ZERO3_OFFLOAD_OPT].fits_host  # 16 B x 70.6 B params of pinned host RAM
    assert plan.choice is None


def _model_dir(tmp_path):
    cfg = {
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "vocab_size": 4004,
    }
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "model"


def test_choose_deepspeed_config_api(tmp_path):
    model = _model_dir(tmp_path)
    train = {
        "model_name_or_path": str(model),
        "finetuning_type": "lora",
        "per_device_train_batch_size": 2,
        "cutoff_len": 1024,
    }
    assert choose_deepspeed_config(None, train, 1, 1, 140.4, 125) == ("none", {})
    name, config = choose_deepspeed_config(model, {**train, "finetuning_type": "full"}, 1, 1, 40, 125)
    assert name == "zero3_offload_opt"
    assert config["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    with pytest.raises(ConfigurationError, match="Nothing fits"):
        choose_deepspeed_config(model, {**train, "finetuning_type": "full"}, 1, 1, 8, 125)


def test_write_auto_config(tmp_path):
    plan = make_plan(
        Workload(LLAMA3_70B, "full", micro_batch=1, cutoff_len=2048), Cluster(1, 8, MI300X, 1536)
    )
    path = write_auto_config(plan, tmp_path)
    assert path == tmp_path / "deepspeed_auto.json"
    assert json.loads(path.read_text())["zero_optimization"]["stage"] == 3
    assert json.loads((tmp_path / "plan.json").read_text())["choice"] == "zero3"


def _run_cli(argv):
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    return args.func(args)


def test_plan_command_json_and_table(tmp_path, capsys):
    (tmp_path / "train.yaml").write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": "meta-llama/Meta-Llama-3-70B",
                "finetuning_type": "lora",
                "lora_rank": 16,
                "per_device_train_batch_size": 1,
                "cutoff_len": 4096,
            }
        )
    )
    (tmp_path / "job.yaml").write_text("name: p70\ntrain_config: train.yaml\ndeepspeed: auto\n")
    assert _run_cli([str(tmp_path / "job.yaml"), "--json", "--gpus-per-node", "8"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in out["strategies"]] == [s.value for s in SPEED_RANK]
    assert set(out["strategies"][0]) >= {"name", "gpu_mem_gib", "host_mem_gib", "fits"}
    assert out["choice"] == "none"
    # 70B does not fit one H200 (--nodes 1: the job's hosts, trainers, are 2 nodes in the default inventory)
    assert _run_cli([str(tmp_path / "job.yaml"), "--hardware", "h200", "--nodes", "1"]) == 2
    text = capsys.readouterr().out
    assert "Nothing fits" in text and "ZeRO-3 + optimizer + param offload" in text


def test_node_paths_fall_back_to_bundled_configs_and_unknown_host_ram_is_not_checked():
    train = {"finetuning_type": "lora", "per_device_train_batch_size": 1, "cutoff_len": 2048}
    name, config = choose_deepspeed_config("/opt/models/Meta-Llama-3-70B", train, 1, 1, MI300X, 0)
    assert (name, config) == ("none", {})
    with pytest.raises(ConfigurationError, match="pass --model-config"):
        choose_deepspeed_config("/opt/models/my-own-model", train, 1, 1, MI300X, 0)


def test_a_fixed_split_is_a_training_plan_of_one_split_that_picks_by_the_measured_speed_order():
    # Llama-3-70B LoRA r16, micro-batch 1, cutoff 4096 on one 8 x MI300X node: at the YAML's split, predicted
    # tokens/s put ZeRO-2 ahead of DDP (plan: auto's view); the fixed split keeps the measured order: DDP
    train = {"finetuning_type": "lora", "lora_rank": 16, "per_device_train_batch_size": 1, "cutoff_len": 4096}
    cluster = NODE_PRESETS["mi300x"].cluster()
    fixed = plan_as_written(LLAMA3_70B, train, cluster)
    assert {c.split for c in fixed.candidates} == {fixed.as_written}
    assert tuple(c.strategy for c in fixed.candidates) == SPEED_RANK
    assert fixed.choice is not None and fixed.choice.strategy is Strategy.NONE
    auto = plan_training_from_yaml(LLAMA3_70B, train, cluster)
    assert auto.yaml_best is not None and auto.yaml_best.strategy is Strategy.ZERO2
    # one estimate, one margin, one fit test: the fixed split's candidates are auto's at that split
    at_split = {c.strategy: c for c in auto.at_split(auto.as_written)}
    assert fixed.margin == auto.margin == 0.10
    for c in fixed.candidates:
        twin = at_split[c.strategy]
        assert (c.estimate, c.fits_gpu, c.fits_host) == (twin.estimate, twin.fits_gpu, twin.fits_host)
    # the engine's deepspeed: auto under plan: as_written is this plan's choice
    assert choose_deepspeed_config("/opt/models/Meta-Llama-3-70B", train, 8, 1, 191.98, 1536) == ("none", {})
