"""``plan: auto`` wired: the job spec switch, the engine's rewrite of the shipped YAML, the record, the CLI.

The node facts are written by hand (what preflight reports for one H200 through torch, or 2 x 8 MI300X
through ``mift_gpus``): these tests need no host.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from launcher.commands import plan as plan_command
from launcher.engine.plan import DS_FILE, TRAIN_FILE, build_plan, validate_plan
from launcher.engine.split import record_of, summary_line
from launcher.exceptions import ConfigurationError
from launcher.planning.dsconfig import deepspeed_config
from launcher.planning.memory import Strategy
from launcher.preflight.checks import NodeFacts
from launcher.spec.jobspec_load import load_job_spec_bytes
from launcher.validation.job import LoadedJob, load_job

SHAPE_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 4004,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


def _job(tmp_path: Path, spec: str, **train_keys: Any) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(SHAPE_8B))
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    (data / "dataset_info.json").write_text(json.dumps({"synth": {"file_name": "synth.json"}}))
    (data / "synth.json").write_text(json.dumps([{"instruction": "a", "input": "", "output": "b"}]))
    train = {
        "model_name_or_path": str(model),
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_target": "all",
        "dataset": "synth",
        "dataset_dir": str(data),
        "template": "default",
        "cutoff_len": 1024,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 8,
        "bf16": True,
        "flash_attn": "sdpa",
        "output_dir": "out",
        **train_keys,
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train, sort_keys=False))
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\ntrain_config: train.yaml\nhosts: [n1]\n{spec}")
    return path


def _h200() -> NodeFacts:
    """What preflight reports for the lent H200 (torch probe, no mift_gpus fact)."""
    return NodeFacts(
        hosts=["n1"],
        train_address={"n1": "127.0.0.1"},
        stack={},
        gpus={"n1": {}},
        probe={"n1": {"mem_total_bytes": 126 * 1024**3}},
        nproc_per_node=1,
        torch={
            "n1": {
                "backend": "cuda",
                "device_count": 1,
                "devices": [{"name": "NVIDIA H200", "total_memory": int(139.8 * 1024**3)}],
            }
        },
    )


def _mi300x(nodes: int) -> NodeFacts:
    """Two (or more) 8 x MI300X nodes as provisioning's mift_gpus fact describes them."""
    hosts = [f"n{i + 1}" for i in range(nodes)]
    return NodeFacts(
        hosts=hosts,
        train_address={h: f"10.0.0.{i + 1}" for i, h in enumerate(hosts)},
        stack={h: {} for h in hosts},
        gpus={h: {"product": "AMD Instinct MI300X", "memory_gib": 191.98} for h in hosts},
        probe={h: {"mem_total_bytes": 1536 * 1024**3} for h in hosts},
        nproc_per_node=8,
    )


def _shipped(plan: Any) -> dict[str, Any]:
    return yaml.safe_load(plan.files[TRAIN_FILE])


def test_plan_defaults_to_as_written_and_unknown_values_are_refused(tmp_path):
    spec = load_job_spec_bytes(b"name: j\ntrain_config: t.yaml\n", tmp_path / "job.yaml")
    assert spec.plan == "as_written"
    assert (
        load_job_spec_bytes(b"name: j\ntrain_config: t.yaml\nplan: auto\n", tmp_path / "job.yaml").plan
        == "auto"
    )
    with pytest.raises(ConfigurationError) as err:
        load_job_spec_bytes(b"name: j\ntrain_config: t.yaml\nplan: fastest\n", tmp_path / "job.yaml")
    assert str(err.value).count("\n") == 0
    assert "plan: Input should be 'as_written', 'auto' or 'probe'" in str(err.value)


def test_as_written_ships_the_yaml_split_unchanged(tmp_path):
    job = load_job(_job(tmp_path, "deepspeed: auto\n"))
    plan = build_plan(job, _h200(), "r1")
    shipped = _shipped(plan)
    assert (shipped["per_device_train_batch_size"], shipped["gradient_accumulation_steps"]) == (2, 8)
    assert "disable_gradient_checkpointing" not in shipped
    assert plan.training is None
    assert record_of(plan.training) == {"mode": "as_written"}


def test_auto_rewrites_the_shipped_yaml_keeping_the_global_batch_and_validates_those_bytes(tmp_path):
    job = load_job(_job(tmp_path, "deepspeed: auto\nplan: auto\n"))
    plan = build_plan(job, _h200(), "r1")
    shipped = _shipped(plan)
    # the H200 decision (test_planner_decisions.py): the whole batch in one micro-batch, no recompute
    assert shipped["per_device_train_batch_size"] == 16
    assert shipped["gradient_accumulation_steps"] == 1
    assert shipped["disable_gradient_checkpointing"] is True
    assert shipped["per_device_train_batch_size"] * shipped["gradient_accumulation_steps"] * 1 == 2 * 8 * 1
    assert plan.deepspeed_name == "zero2"  # measured faster than DDP at this split on the H200
    assert DS_FILE in plan.files and shipped["deepspeed"] == DS_FILE
    report = validate_plan(plan, builtin=True)  # what ships is what is validated
    assert not report.problems
    record = record_of(plan.training)
    assert record["mode"] == "auto"
    assert record["global_batch"] == 16
    assert record["choice"]["micro_batch"] == 16
    assert record["as_written"]["micro_batch"] == 2
    assert record["yaml_overrides"] == {
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 1,
        "disable_gradient_checkpointing": True,
    }
    assert record["predicted_gain"] == pytest.approx(2.11, abs=0.02)
    assert record["accelerator"] == "H200"
    assert summary_line(plan.training).startswith(
        "plan: auto: ZeRO-2, micro-batch 16 x accumulation 1, checkpointing off (global batch 16;"
    )


def test_auto_on_two_mi300x_nodes_keeps_the_global_batch_over_16_gpus(tmp_path):
    job = load_job(
        _job(
            tmp_path,
            "deepspeed: none\nplan: auto\n",
            per_device_train_batch_size=1,
            gradient_accumulation_steps=8,
        )
    )
    plan = build_plan(job, _mi300x(2), "r1")
    shipped = _shipped(plan)
    world = 16
    assert (
        shipped["per_device_train_batch_size"] * shipped["gradient_accumulation_steps"] * world
        == 1 * 8 * world
    )
    assert plan.deepspeed_name == "none"  # pinned: only the split is planned
    assert plan.training is not None
    assert plan.training.accelerator.name == "MI300X"
    assert {c.strategy for c in plan.training.candidates} == {Strategy.NONE}
    assert shipped["save_on_each_node"] is True  # the engine's own keys still apply after the rewrite


def _auto_70b_full(tmp_path: Path, **train_keys: Any) -> LoadedJob:
    """A ``deepspeed: auto``, ``plan: auto`` job of Llama-3-70B full fine-tuning (the bundled config)."""
    return load_job(
        _job(
            tmp_path,
            "deepspeed: auto\nplan: auto\n",
            model_name_or_path="/opt/models/Meta-Llama-3-70B",
            finetuning_type="full",
            **train_keys,
        )
    )


def test_auto_with_deepspeed_auto_ships_the_chosen_strategys_config(tmp_path):
    # Llama-3-70B full fine-tuning on one 8 x MI300X node (bundled config): only ZeRO-3 variants fit
    job = _auto_70b_full(
        tmp_path, per_device_train_batch_size=1, gradient_accumulation_steps=8, cutoff_len=4096
    )
    plan = build_plan(job, _mi300x(1), "r1")
    chosen = Strategy(plan.deepspeed_name)
    assert chosen.zero3
    assert plan.training is not None and plan.training.choice is not None
    assert plan.training.choice.strategy is chosen
    shipped = _shipped(plan)
    assert shipped["deepspeed"] == DS_FILE
    assert json.loads(plan.files[DS_FILE]) == deepspeed_config(chosen)
    assert shipped["per_device_train_batch_size"] * shipped["gradient_accumulation_steps"] == 8
    assert shipped["per_device_train_batch_size"] > 1


def test_a_pinned_deepspeed_file_is_planned_as_its_strategy(tmp_path):
    (tmp_path / "z3.json").write_text(json.dumps(deepspeed_config(Strategy.ZERO3)))
    job = load_job(_job(tmp_path, "deepspeed: z3.json\nplan: auto\n"))
    plan = build_plan(job, _h200(), "r1")
    assert plan.training is not None
    assert {c.strategy for c in plan.training.candidates} == {Strategy.ZERO3}
    assert json.loads(plan.files[DS_FILE]) == deepspeed_config(Strategy.ZERO3)
    shipped = _shipped(plan)
    assert shipped["per_device_train_batch_size"] * shipped["gradient_accumulation_steps"] == 16


def test_a_deepspeed_file_that_fixes_the_batch_is_refused_under_plan_auto(tmp_path):
    config = {**(deepspeed_config(Strategy.ZERO2) or {}), "train_micro_batch_size_per_gpu": 2}
    (tmp_path / "z2.json").write_text(json.dumps(config))
    job = load_job(_job(tmp_path, "deepspeed: z2.json\nplan: auto\n"))
    with pytest.raises(ConfigurationError) as err:
        build_plan(job, _h200(), "r1")
    text = str(err.value)
    assert "\n" not in text
    assert "plan: auto, but" in text and "fixes train_micro_batch_size_per_gpu" in text


def test_nothing_fitting_is_one_line_at_plan(tmp_path):
    job = _auto_70b_full(tmp_path)
    with pytest.raises(ConfigurationError) as err:
        build_plan(job, _h200(), "r1")
    text = str(err.value)
    assert "\n" not in text
    assert "plan: auto: Nothing fits at global batch 16" in text


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    plan_command.register(parser.add_subparsers())
    args = parser.parse_args(["plan", *argv])
    return int(args.func(args))


def test_plan_command_prints_the_candidate_table_the_reason_and_the_gain(tmp_path, capsys):
    path = _job(tmp_path, "deepspeed: auto\n")
    assert _cli([str(path), "--hardware", "h200"]) == 0
    text = capsys.readouterr().out
    header = next(
        line for line in text.splitlines() if line.startswith("strategy  ") and "micro-batch" in line
    )
    for column in ("strategy", "checkpointing", "GPU GiB", "host GiB", "tokens/s", "MFU", "fits"):
        assert column in header
    # one decision: `run` applies the fastest strategy at the YAML's split (deepspeed auto, plan as_written);
    # the training plan is what plan: auto would pick, never a second "Chose"
    assert "Chose" not in text
    assert text.count("`run` applies") == 1
    assert "`run` applies no DeepSpeed (DDP): it is the fastest strategy" in text
    assert "yes <- run" in text and "yes <- plan: auto" in text and "(YAML's split)" in text
    assert "plan: as_written" in text
    assert "plan: auto would choose ZeRO-2, micro-batch 16 x accumulation 1, checkpointing off" in text
    assert "DeepSpeed: auto (the job spec): the planner picks the fastest strategy that fits" in text
    assert "2.1x the YAML's split (micro-batch 2 x accumulation 8, checkpointing on" in text


def test_plan_command_json_keeps_its_keys_and_adds_the_training_plan(tmp_path, capsys):
    path = _job(tmp_path, "deepspeed: auto\nplan: auto\n")
    assert _cli([str(path), "--hardware", "h200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choice"] == "none"  # the strategy at the YAML's split, as before
    assert [s["name"] for s in out["strategies"]] == [s.value for s in Strategy]
    assert out["plan_mode"] == "auto"
    training = out["training_plan"]
    assert training["plan"]["micro_batch"] == 16
    assert training["as_written"]["micro_batch"] == 2
    assert training["global_batch"] == 16
    assert len(training["candidates"]) == 5 * 5 * 2
    row = training["candidates"][0]
    assert set(row) >= {
        "strategy",
        "micro_batch",
        "gradient_accumulation_steps",
        "gradient_checkpointing",
        "gpu_mem_gib",
        "tokens_per_s",
        "fits",
    }


def test_a_node_path_model_is_planned_from_the_job_specs_plan_model_config(tmp_path):
    # the model lives on the nodes only (/opt/mift/models/...): the controller needs its config.json
    path = _job(tmp_path, "deepspeed: none\nplan: auto\n", model_name_or_path="/opt/mift/models/my-own-model")
    with pytest.raises(ConfigurationError, match="set plan_model_config in the job spec"):
        build_plan(load_job(path), _h200(), "r1")
    path.write_text(path.read_text() + "plan_model_config: model\n")  # relative to the job spec
    plan = build_plan(load_job(path), _h200(), "r1")
    assert plan.training is not None
    assert plan.training.workload.model.layers == SHAPE_8B["num_hidden_layers"]


def test_resume_true_names_the_last_checkpoint_complete_on_every_node(tmp_path: Path) -> None:
    """``resume: true`` ships the last checkpoint every node holds complete (preflight's list), not "last"."""
    job = load_job(_job(tmp_path, "resume: true\noutput_dir: /var/lib/mift/output/j\n"))
    facts = _mi300x(2)
    facts.probe["n1"]["checkpoints"] = [4, 8, 12]  # n1 finished checkpoint-12, n2 was stopped while saving it
    facts.probe["n2"]["checkpoints"] = [4, 8]
    train = yaml.safe_load(build_plan(job, facts, "r1").files[TRAIN_FILE])
    assert train["resume_from_checkpoint"] == "/var/lib/mift/output/j/checkpoint-8"
    assert train["overwrite_output_dir"] is False
    facts.probe["n2"]["checkpoints"] = []  # none complete everywhere: the trainer decides, as before
    train = yaml.safe_load(build_plan(job, facts, "r2").files[TRAIN_FILE])
    assert "resume_from_checkpoint" not in train


@pytest.mark.parametrize(
    ("optional", "refused"),
    [({"liger_kernel": None}, True), ({"liger_kernel": "0.8.5"}, False), (None, False)],
    ids=["missing", "installed", "not-asked"],
)
def test_liger_on_a_node_without_liger_kernel_is_refused_before_anything_starts(
    tmp_path: Path, optional: dict[str, Any] | None, refused: bool
):
    """LLaMA-Factory fails at start without liger-kernel (provisioned only when asked): one line."""
    facts = _h200()
    if optional is not None:  # None: the probe could not ask the node's venv, nothing to judge
        facts.probe["n1"]["optional"] = optional
    for spec, train, why in (
        (
            "deepspeed: none\n",
            {"enable_liger_kernel": True},
            "training YAML switches liger kernels on (enable_liger_kernel)",
        ),
        (
            "deepspeed: auto\nplan: auto\nplan_liger: true\n",
            {},
            "plan switches liger kernels on (plan_liger)",
        ),
    ):
        job = load_job(_job(tmp_path, spec, **train))
        if refused:
            with pytest.raises(
                ConfigurationError,
                match=rf"^n1: the {re.escape(why)}, but liger-kernel is not installed in the node's venv: "
                "provision with llamafactory_liger_kernel: true",
            ):
                build_plan(job, facts, "r1")
        else:
            assert (
                yaml.safe_load(build_plan(job, facts, "r1").files[TRAIN_FILE])["enable_liger_kernel"] is True
            )
