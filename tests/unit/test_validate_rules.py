"""Each named cross-field rule, on in-memory configs, plus the schema helpers and shipped key lists."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from launcher.validation import (
    deepspeed_facts,
    deepspeed_schema,
    llamafactory_schema,
    rules,
    validate_deepspeed,
    validate_llamafactory,
)
from launcher.validation.schema import FieldSpec, check_value

REPO = Path(__file__).resolve().parents[2]
Z3 = {"zero_optimization": {"stage": 3}}


def _rules(problems):
    return {p.rule for p in problems if p.is_error}


def test_offload_param_needs_zero3():
    cfg = {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    assert _rules(rules.offload_param_needs_zero3("f", deepspeed_facts(cfg))) == {"offload-param-needs-zero3"}
    cfg["zero_optimization"]["stage"] = 3
    assert rules.offload_param_needs_zero3("f", deepspeed_facts(cfg)) == []


def test_bf16_and_fp16_auto_is_fine():
    both_auto = {"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}
    assert rules.bf16_and_fp16("f", deepspeed_facts(both_auto)) == []
    both_on = {"fp16": {"enabled": True}, "bf16": {"enabled": True}}
    assert _rules(rules.bf16_and_fp16("f", deepspeed_facts(both_on))) == {"bf16-and-fp16"}


@pytest.mark.parametrize(
    ("train", "micro", "accum", "bad"),
    [(16, 2, 8, False), (32, 2, 8, False), (10, 4, 1, True), ("auto", 4, 1, False), (16, "auto", 8, False)],
)
def test_batch_size_consistency(train, micro, accum, bad):
    cfg = {
        "train_batch_size": train,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
    }
    assert bool(rules.batch_size_consistency("f", deepspeed_facts(cfg))) is bad


def test_batch_values_positive_int_or_auto():
    assert _rules(rules.batch_values("f", deepspeed_facts({"train_micro_batch_size_per_gpu": 0}))) == {
        "batch-values"
    }
    assert rules.batch_values("f", deepspeed_facts({"train_micro_batch_size_per_gpu": "auto"})) == []


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("pure_bf16", "pure-bf16-zero3"),
        ("predict_with_generate", "predict-with-generate-zero3"),
        ("use_unsloth", "unsloth-zero3"),
    ],
)
def test_zero3_incompatibilities(key, rule):
    facts = deepspeed_facts(Z3)
    assert _rules(rules.llamafactory_rules("f", {key: True}, facts)) == {rule}
    assert (
        rules.llamafactory_rules("f", {key: True}, deepspeed_facts({"zero_optimization": {"stage": 2}})) == []
    )
    assert rules.llamafactory_rules("f", {key: True}, None) == []


def test_galore_under_deepspeed():
    found = rules.optimizer_tricks_deepspeed("f", {"use_galore": True}, deepspeed_facts(Z3))
    assert _rules(found) == {"optimizer-tricks-deepspeed"}


def test_hf_values_match_numeric_only():
    facts = deepspeed_facts({"train_micro_batch_size_per_gpu": 4, "gradient_clipping": "auto"})
    assert _rules(rules.hf_values_match("f", {"per_device_train_batch_size": 4}, facts)) == set()
    assert _rules(rules.hf_values_match("f", {"per_device_train_batch_size": 2}, facts)) == {
        "hf-values-match"
    }


@pytest.mark.parametrize(("value", "bad"), [("0", True), ("false", True), ("1", False), ("true", False)])
def test_deepspeed_needs_torchrun(value, bad):
    assert bool(rules.deepspeed_needs_torchrun("job.yaml", True, {"FORCE_TORCHRUN": value})) is bad
    assert rules.deepspeed_needs_torchrun("job.yaml", False, {"FORCE_TORCHRUN": "0"}) == []
    assert rules.deepspeed_needs_torchrun("job.yaml", True, {}) == []


def test_inline_deepspeed_dict_is_validated():
    cfg = {
        "model_name_or_path": "m",
        "deepspeed": {"zero_optimization": {"stage": 3, "stage3_parition_grads": True}},
    }
    report = validate_llamafactory(cfg, "x.yaml", Path("/nonexistent"), builtin=True)
    assert [p.key for p in report.problems] == ["zero_optimization.stage3_parition_grads"]


def test_node_paths_map_to_controller_copies():
    yaml_path = REPO / "configs" / "train" / "x.yaml"
    cfg = {
        "model_name_or_path": "m",
        "deepspeed": "/opt/mift/configs/deepspeed/ds_z3.json",
        "dataset_dir": "/opt/mift/data/tiny_alpaca",
        "dataset": "tiny_alpaca",
    }
    report = validate_llamafactory(cfg, str(yaml_path), builtin=True)
    assert report.ok, report.problems
    cfg["deepspeed"] = "/opt/mift/configs/deepspeed/ds_z4.json"
    cfg["dataset_dir"] = "/opt/mift/data/nope"
    report = validate_llamafactory(cfg, str(yaml_path), builtin=True)
    assert {p.key for p in report.problems} == {"deepspeed", "dataset_dir"}


def test_remote_and_default_dataset_dirs_are_not_checked():
    for dataset_dir in ("data", "REMOTE:llamafactory/demo_data", "/somewhere/only/on/nodes"):
        cfg = {"model_name_or_path": "m", "dataset": "nope", "dataset_dir": dataset_dir}
        assert validate_llamafactory(cfg, "/tmp/x.yaml", builtin=True).ok


def test_deepspeed_summary_and_deprecation_warning():
    report = validate_deepspeed({"zero_optimization": {"stage": 2, "cpu_offload": True}}, "f", builtin=True)
    assert report.ok
    assert [(p.key, p.severity.value) for p in report.problems] == [
        ("zero_optimization.cpu_offload", "warning")
    ]
    assert report.summary == "ZeRO-2"


def test_check_value():
    spec = FieldSpec(frozenset({"int"}))
    assert check_value(1e9, spec) is not None
    assert check_value(1e9, spec, lax=True) is None
    assert check_value(1, FieldSpec(frozenset({"float"}))) is None
    assert "did you mean 'sft'" in (check_value("sftt", FieldSpec(frozenset({"str"}), ("sft", "pt"))) or "")
    assert check_value(True, FieldSpec(frozenset({"int"}))) is not None


@pytest.mark.skipif(not importlib.util.find_spec("llamafactory"), reason="LLaMA-Factory not installed")
def test_shipped_llamafactory_keys_match_installed():
    live, shipped = llamafactory_schema.live_schema(), llamafactory_schema.shipped_schema()
    if live.version != shipped.version or live.transformers_version != shipped.transformers_version:
        pytest.skip("installed versions differ from the shipped list")
    assert live.to_json() == shipped.to_json()


@pytest.mark.skipif(not importlib.util.find_spec("deepspeed"), reason="DeepSpeed not installed")
def test_shipped_deepspeed_keys_match_installed():
    live, shipped = deepspeed_schema.live_schema(), deepspeed_schema.shipped_schema()
    if live.version != shipped.version:
        pytest.skip("installed version differs from the shipped list")
    assert live.to_json() == shipped.to_json()


def test_shipped_key_files_state_their_versions():
    data = REPO / "python" / "launcher" / "data"
    assert json.loads((data / "llamafactory_keys.json").read_text())["llamafactory_version"]
    assert json.loads((data / "deepspeed_keys.json").read_text())["deepspeed_version"]


def test_committed_dataset_is_what_the_generator_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_tiny_model", REPO / "tools" / "make_tiny_model.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_dataset(tmp_path)
    committed = REPO / "configs" / "data" / "tiny_alpaca"
    for name in ("tiny_alpaca.json", "dataset_info.json"):
        assert (tmp_path / name).read_bytes() == (committed / name).read_bytes()
    assert len(json.loads((committed / "tiny_alpaca.json").read_text())) == 64


def test_ddp_timeout_far_above_a_hang_window_warns_once():
    import yaml  # noqa: PLC0415

    warned = rules.ddp_timeout_hides_hangs("train.yaml", {"ddp_timeout": 180000000}, None)
    assert [(p.key, p.rule, p.is_error) for p in warned] == [
        ("ddp_timeout", "ddp-timeout-hides-hangs", False)
    ]
    assert str(warned[0]).startswith("train.yaml: ddp_timeout: warning: 180000000 s (5.7 years): ")
    assert "set 3600 (1 h)" in str(warned[0])
    for fine in (600, 3600, rules.DDP_TIMEOUT_WARN_S, None, "auto", True):
        assert rules.ddp_timeout_hides_hangs("f", {"ddp_timeout": fine}, None) == []
    # every shipped training YAML uses a value a hang cannot hide behind
    for path in sorted((REPO / "configs" / "train").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        assert rules.ddp_timeout_hides_hangs(str(path), cfg, None) == [], path


@pytest.mark.parametrize(
    ("report_to", "refused", "instead"),
    [
        ("wandb", "wandb", "tensorboard"),
        ("mlflow", "mlflow", "tensorboard"),
        (["tensorboard", "wandb"], "wandb", "tensorboard"),
        ("wandb,mlflow", "wandb, mlflow", "tensorboard"),
        ("all", "all", "tensorboard"),
    ],
)
def test_online_tracker_refused_with_what_works(report_to, refused, instead):
    problems = rules.online_tracker_offline_nodes("t.yaml", {"report_to": report_to}, None)
    assert [p.rule for p in problems] == ["online-tracker-offline-nodes"]
    assert str(problems[0]).startswith(f"t.yaml: report_to: {refused}: the nodes are offline by design")
    assert f"use report_to: {instead} (its event files are collected" in str(problems[0])


@pytest.mark.parametrize("report_to", ["none", "tensorboard", ["tensorboard"], None])
def test_offline_trackers_pass(report_to):
    assert rules.online_tracker_offline_nodes("t.yaml", {"report_to": report_to}, None) == []
