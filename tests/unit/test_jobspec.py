"""Job spec parsing: typed fields, unknown keys rejected with the nearest valid key, paths resolved."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.exceptions import ConfigurationError
from launcher.spec.jobspec import is_secret, mask_env
from launcher.spec.jobspec_load import load_job_spec, parse_job_spec
from launcher.validation.job import load_job

REPO = Path(__file__).parents[2]
SRC = Path("/jobs/x.yaml")


def test_example_job_specs_load() -> None:
    for path in sorted((REPO / "configs" / "jobs").glob("*.yaml")):
        spec = load_job_spec(path)
        assert spec.train_config.is_file(), path


def test_defaults_and_relative_paths() -> None:
    spec = parse_job_spec({"name": "a", "train_config": "../train/t.yaml", "deepspeed": "ds.json"}, SRC)
    assert spec.train_config == Path("/train/t.yaml")
    assert spec.deepspeed == Path("/jobs/ds.json")
    assert spec.hosts == "trainers" and spec.master_port == 29500 and spec.nproc_per_node is None
    assert spec.output_dir == "output" and spec.resume is False


def test_deepspeed_auto_and_none_stay_words() -> None:
    assert parse_job_spec({"name": "a", "train_config": "t", "deepspeed": "auto"}, SRC).deepspeed == "auto"
    assert parse_job_spec({"name": "a", "train_config": "t", "deepspeed": "none"}, SRC).deepspeed == "none"
    # left out: the training YAML decides (launcher.validation.job.choose_deepspeed)
    assert parse_job_spec({"name": "a", "train_config": "t"}, SRC).deepspeed is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"name": "a", "train_config": "t", "master_prot": 1},
            "master_prot: unknown key; did you mean 'master_port'?",
        ),
        ({"name": "a", "train_config": "t", "nproc_per_nod": 2}, "did you mean 'nproc_per_node'?"),
        ({"name": "a", "train_config": "t", "timeouts": {"stop_grace": 3}}, "did you mean 'stop_grace_s'?"),
        ({"name": "a", "train_config": "t", "zzz": 1}, "x.yaml: zzz: unknown key"),
        ({"name": "a"}, "train_config: required key missing"),
        ({"name": "a", "train_config": "t", "master_port": 80}, "master_port: Input should be greater than"),
        ({"name": "a", "train_config": "t", "nproc_per_node": 0}, "nproc_per_node"),
        ({"name": "a", "train_config": "t", "env": {"MASTER_PORT": "1"}}, "set by the launcher"),
        (
            {"name": "a", "train_config": "t", "env": {"BAD-NAME": "1"}},
            "not a valid environment variable name",
        ),
        ({"name": "bad name", "train_config": "t"}, "name: String should match pattern"),
    ],
)
def test_bad_specs_name_the_key(data: dict, expected: str) -> None:
    with pytest.raises(ConfigurationError, match=None) as err:
        parse_job_spec(data, SRC)
    assert expected in str(err.value)
    assert err.value.exit_code == 2


def test_missing_train_config_file(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ntrain_config: nope.yaml\n")
    with pytest.raises(ConfigurationError, match=r"train_config: .*nope.yaml: no such file"):
        load_job(spec)


def test_not_a_mapping(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("- a\n")
    with pytest.raises(ConfigurationError, match="must be a mapping"):
        load_job_spec(spec)


def test_env_values_become_strings_and_secrets_are_masked() -> None:
    spec = parse_job_spec(
        {
            "name": "a",
            "train_config": "t",
            "env": {"NCCL_DEBUG": "INFO", "N": 3, "ON": True, "HF_TOKEN": "hf_x"},
        },
        SRC,
    )
    env = spec.env_strings()
    assert env == {"NCCL_DEBUG": "INFO", "N": "3", "ON": "1", "HF_TOKEN": "hf_x"}
    assert mask_env(env)["HF_TOKEN"] == "***" and mask_env(env)["NCCL_DEBUG"] == "INFO"
    assert is_secret("WANDB_API_KEY") and is_secret("db_password") and not is_secret("NCCL_IB_HCA")


def test_host_list_pattern() -> None:
    spec = parse_job_spec({"name": "a", "train_config": "t", "hosts": ["host1", "host2"]}, SRC)
    assert spec.host_pattern == "host1,host2"
