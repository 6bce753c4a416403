"""The job specs a user starts from (configs/jobs/): each passes ``launcher validate`` as shipped, names its
model on the hub and stages a dataset folder of the user's own (dataset_info.json)."""

from __future__ import annotations

import json

import pytest
import yaml

from mift_testsupport.cli import run_cli
from mift_testsupport.paths import REPO_ROOT

USER_JOBS = {
    "llama3-70b-lora-z3.yaml": "meta-llama/Meta-Llama-3-70B-Instruct",
    "llama3-70b-full-z3.yaml": "meta-llama/Meta-Llama-3-70B-Instruct",
    "llama3-8b-lora.yaml": "meta-llama/Meta-Llama-3-8B-Instruct",
}


@pytest.mark.parametrize("name", sorted(USER_JOBS))
def test_shipped_job_validates_and_stages_hub_model_and_own_dataset(name: str) -> None:
    path = REPO_ROOT / "configs" / "jobs" / name
    result = run_cli(["validate", str(path.relative_to(REPO_ROOT))])
    assert result.rc == 0, result.stderr
    assert "ok (job spec" in result.stdout
    spec = yaml.safe_load(path.read_text())
    assert spec["stage"]["model"]["hub"] == USER_JOBS[name]
    dataset = (path.parent / spec["stage"]["dataset_dir"]["controller"]).resolve()
    train = yaml.safe_load((path.parent / spec["train_config"]).read_text())
    info = json.loads((dataset / "dataset_info.json").read_text())
    assert train["dataset"] in info, f"{name}: {train['dataset']} not in {dataset}/dataset_info.json"
    assert (dataset / info[train["dataset"]]["file_name"]).is_file()
    # the node paths the model and the dataset are staged to
    assert train["model_name_or_path"].startswith("/opt/mift/models/")
    assert train["dataset_dir"].startswith("/")
