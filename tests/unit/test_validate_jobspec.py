"""Job specs are validated by launcher.spec.jobspec, then the training YAML and DeepSpeed file they name."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.main import cli

REPO = Path(__file__).resolve().parents[2]
pytest.importorskip("launcher.spec.jobspec")


def _job(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_good_job_spec(tmp_path, capsys):
    job = _job(
        tmp_path,
        f"name: tiny\ntrain_config: {REPO}/configs/train/tiny_cpu_lora_sft.yaml\n"
        f"deepspeed: {REPO}/configs/deepspeed/ds_z3.json\n",
    )
    assert cli(["validate", "--builtin", str(job)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{job}: ok (job spec, tiny: sft lora, ZeRO-3)"]


def test_job_spec_problems_are_lines(tmp_path, capsys):
    job = _job(tmp_path, f"name: tiny\ntrain_config: {REPO}/configs/train/tiny_cpu_lora_sft.yaml\nnmae: x\n")
    assert cli(["validate", str(job)]) == 2
    assert f"{job}: nmae: unknown key; did you mean 'name'?" in capsys.readouterr().err.splitlines()


def test_job_spec_deepspeed_override_meets_yaml_rules(tmp_path, capsys):
    train = tmp_path / "train.yaml"
    train.write_text(
        "model_name_or_path: m\nstage: sft\nfinetuning_type: full\npure_bf16: true\nbf16: true\n"
    )
    job = _job(
        tmp_path, f"name: t\ntrain_config: train.yaml\ndeepspeed: {REPO}/configs/deepspeed/ds_z3.json\n"
    )
    assert cli(["validate", "--builtin", str(job)]) == 2
    assert f"{train}: pure_bf16: `pure_bf16` is incompatible with DeepSpeed ZeRO-3" in capsys.readouterr().err
