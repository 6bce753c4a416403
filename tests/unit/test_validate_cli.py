"""``python -m launcher validate``: exit codes and one line per problem, run in-process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.main import cli

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "fixtures" / "bad-configs"
SEED = Path(__file__).resolve().parents[1] / "fixtures" / "seed" / "ds_seed.json"


def _refused(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Validate ``path``, which must be refused (exit 2); return its error lines."""
    rc = cli(["validate", str(path)])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2, err
    return err


def test_seed_blog_json_fails_naming_the_typo(capsys):
    assert _refused(BAD / "ds_seed_blog.json", capsys) == [
        f"{BAD / 'ds_seed_blog.json'}: zero_optimization.stage3_parition_grads: unknown key; not a DeepSpeed "
        "option (a typo circulating in blog posts); ZeRO-3 always partitions gradients: remove it"
    ]


@pytest.mark.skipif(not SEED.is_file(), reason="shared reference not present")
def test_shared_seed_json_fails(capsys):
    assert cli(["validate", str(SEED)]) == 2
    assert "zero_optimization.stage3_parition_grads" in capsys.readouterr().err


@pytest.mark.parametrize("builtin", [[], ["--builtin"]])
def test_shipped_configs_pass(capsys, builtin):
    rc = cli(["validate", *builtin, str(REPO / "configs" / "deepspeed"), str(REPO / "configs" / "train")])
    out = capsys.readouterr()
    assert rc == 0, out.err
    lines = out.out.splitlines()
    assert (
        f"{REPO / 'configs/deepspeed/ds_z3_offload.json'}: ok (deepspeed config, ZeRO-3 + offload)" in lines
    )
    assert (
        f"{REPO / 'configs/train/llama3_70b_lora_sft_ds3.yaml'}: "
        "ok (llamafactory config, sft lora, ZeRO-3 + offload)" in lines
    )
    for name, what in (("llama3_70b_full_sft_ds3.yaml", "sft full"), ("llama3_8b_lora_sft.yaml", "sft lora")):
        assert any(
            line.startswith(f"{REPO / 'configs/train' / name}: ok (llamafactory config, {what}")
            for line in lines
        )
    assert len(lines) == 8


def test_one_line_per_problem_and_format(capsys):
    assert _refused(BAD / "lf_typo.yaml", capsys) == [
        f"{BAD / 'lf_typo.yaml'}: stage: 'sftt' is not one of: pt, sft, rm, ppo, dpo, kto; "
        "did you mean 'sft'?",
        f"{BAD / 'lf_typo.yaml'}: lora_rnk: unknown key; did you mean 'lora_rank'?",
    ]


def test_quiet_prints_no_ok_lines(capsys):
    assert cli(["validate", "-q", str(REPO / "configs" / "deepspeed")]) == 0
    assert capsys.readouterr().out == ""


def test_missing_file_is_bad_input(capsys, tmp_path):
    assert cli(["validate", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: (file): no such file" in capsys.readouterr().err


def test_warning_does_not_fail(capsys, tmp_path):
    cfg = tmp_path / "ds.json"
    cfg.write_text('{"zero_optimization": {"stage": 3}, "comms_config": {"verbose": false}}')
    assert cli(["validate", str(cfg)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{cfg}: comms_config: warning: not read by DeepSpeed")
    assert out[1] == f"{cfg}: ok (deepspeed config, ZeRO-3)"


def test_help_does_not_import_heavy_packages():
    code = (
        "import sys\nfrom launcher.main import cli\ncli(['validate', '--help'])\n"
        "heavy = [m for m in ('deepspeed', 'llamafactory', 'torch', 'transformers') if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.splitlines()[-1] == "HEAVY="
