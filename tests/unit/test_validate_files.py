"""Every bad fixture fails with its expected key and rule, through both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.validation import backends, validate_files, validate_paths

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "fixtures" / "bad-configs"

# file -> (dotted key, rule) of one expected error
EXPECTED = {
    "ds_seed_blog.json": ("zero_optimization.stage3_parition_grads", "unknown-key"),
    "ds_offload_typo.json": ("zero_optimization.offload_optimizer.pin_memroy", "unknown-key"),
    "ds_top_level_typo.json": ("gradient_cliping", "unknown-key"),
    "ds_offload_param_z2.json": ("zero_optimization.offload_param", "offload-param-needs-zero3"),
    "ds_bf16_fp16.json": ("bf16.enabled", "bf16-and-fp16"),
    "ds_batch_mismatch.json": ("train_batch_size", "batch-size-consistency"),
    "ds_bad_value.json": ("zero_optimization.stage", "value-type"),
    "ds_removed_key.json": ("amp", "removed-key"),
    "ds_duplicate_key.json": ("(file)", "syntax"),
    "lf_typo.yaml": ("lora_rnk", "unknown-key"),
    "lf_bad_types.yaml": ("learning_rate", "value-type"),
    "lf_pure_bf16_zero3.yaml": ("pure_bf16", "pure-bf16-zero3"),
    "lf_predict_zero3.yaml": ("predict_with_generate", "predict-with-generate-zero3"),
    "lf_bf16_fp16.yaml": ("fp16", "bf16-and-fp16"),
    "lf_missing_deepspeed.yaml": ("deepspeed", "deepspeed-path-exists"),
    "lf_missing_dataset.yaml": ("dataset", "dataset-exists"),
    "lf_hf_mismatch.yaml": ("per_device_train_batch_size", "hf-values-match"),
    "lf_seed_deepspeed.yaml": ("bf16", "hf-values-match"),
    "lf_missing_model.yaml": ("model_name_or_path", "required-key"),
    "lf_duplicate_key.yaml": ("(file)", "syntax"),
    "unknown_kind.yaml": ("(file)", "kind"),
}


def test_every_fixture_is_listed():
    assert sorted(p.name for p in BAD.iterdir() if p.is_file()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_fixture_fails(monkeypatch, name, builtin):
    monkeypatch.chdir(REPO)
    (report,) = validate_files([BAD / name], builtin=builtin)
    key, rule = EXPECTED[name]
    errors = [(p.key, p.rule) for p in report.problems if p.is_error]
    assert not report.ok
    assert (key, rule) in errors, report.problems


def test_env_var_forces_builtin(monkeypatch):
    monkeypatch.setenv(backends.BUILTIN_ENV, "1")
    assert backends.builtin_forced() is True
    assert backends.builtin_forced(False) is False
    monkeypatch.setenv(backends.BUILTIN_ENV, "0")
    assert backends.builtin_forced() is False


def test_seed_json_named_through_yaml_once(monkeypatch):
    monkeypatch.chdir(REPO)
    problems = validate_paths([BAD / "lf_seed_deepspeed.yaml", BAD / "ds_seed_blog.json"], builtin=True)
    typo = [p for p in problems if p.key == "zero_optimization.stage3_parition_grads"]
    assert len(typo) == 1
    assert typo[0].path == "tests/fixtures/bad-configs/ds_seed_blog.json"  # first seen: through the YAML


def test_folder_skips_non_config_json(tmp_path):
    (tmp_path / "rows.json").write_text("[1, 2]")
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}}')
    reports = validate_files([tmp_path], builtin=True)
    assert [r.path for r in reports] == [str(tmp_path / "ds.json")]
    assert validate_files([tmp_path / "rows.json"], builtin=True)[0].ok is False
