"""``plan`` plans the cluster `run` would use and states the one decision `run` applies.

The inventories are real files read by ansible-inventory (inventory/example, and small ones written here);
the torch answers are the controller's own cache file, written here as preflight keeps it
(launcher.torch_answers).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.commands.plan_cluster import plan_cluster, resolve_nodes
from launcher.exceptions import ConfigurationError
from launcher.main import cli
from launcher.planning.hardware import NODE_PRESETS
from launcher.preflight.torch_answers import FILE_NAME
from launcher.validation.files import validate_files

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example"
JOB_70B = ROOT / "configs" / "jobs" / "llama3-70b-lora-z3.yaml"
MI300X = NODE_PRESETS["mi300x"]
GIB = 1024**3


def _answer(count: int, gib: float) -> dict[str, object]:
    devices = [{"name": "AMD Instinct MI300X", "total_memory": int(gib * GIB), "arch": "gfx942"}] * count
    return {"key": "k", "answer": {"device_count": count, "devices": devices}}


def test_a_group_is_resolved_through_the_inventory() -> None:
    nodes = resolve_nodes("trainers", EXAMPLE)
    assert nodes.hosts == ("mi300x-node01", "mi300x-node02")
    assert "hosts: trainers: mi300x-node01, mi300x-node02" in nodes.source


def test_a_host_list_and_hosts_and_groups_mixed(tmp_path: Path) -> None:
    assert resolve_nodes(["a", "b"], None).hosts == ("a", "b")
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        yaml.safe_dump(
            {"all": {"children": {"g": {"hosts": {"h1": {}, "h2": {}}}, "x": {"hosts": {"h3": {}}}}}}
        )
    )
    assert resolve_nodes("h3,g", inv).hosts == ("h3", "h1", "h2")


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ("nosuch", "hosts: nosuch: no such host or group in the inventory"),
        ("trainers:!mi300x-node02", "is a pattern, which plan cannot resolve: pass --nodes N"),
    ],
)
def test_a_name_the_inventory_lacks_is_one_line(hosts: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        resolve_nodes(hosts, EXAMPLE)
    assert expected in str(err.value) and "\n" not in str(err.value)


def _cluster(**kwargs: object):
    defaults: dict[str, object] = {
        "hosts": "trainers",
        "inventory": EXAMPLE,
        "preset": MI300X,
        "preset_name": "mi300x",
        "facts_file": {},
    }
    return plan_cluster(**{**defaults, **kwargs})  # type: ignore[arg-type]


def test_without_an_inventory_one_node_is_planned_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    # an installed launcher (no checkout, no ansible.cfg inventory) and no -i
    monkeypatch.setattr("launcher.commands.plan_cluster.default_inventory", lambda: None)
    planned = _cluster(inventory=None)
    assert planned.cluster.nodes == 1
    assert (
        planned.nodes.source == "hosts: trainers not resolved: no inventory, name one with -i; planned as 1"
    )


def test_provisioned_facts_win_over_the_preset_when_every_node_has_them() -> None:
    answers = {"mi300x-node01": _answer(8, 191.98), "mi300x-node02": _answer(4, 191.98)}
    planned = _cluster(answers=answers, answers_path="/c/torch-probe.json")
    assert (planned.cluster.nodes, planned.cluster.gpus_per_node) == (2, 4)  # the fewest GPUs of any node
    assert planned.cluster.gpu_mem_gib == pytest.approx(191.98)
    assert planned.gpus_from == "provisioned: the torch answers of 2 node(s) held in /c/torch-probe.json"
    assert planned.host_mem_from == "preset mi300x"


def test_without_facts_for_every_node_the_preset_is_said() -> None:
    planned = _cluster(answers={"mi300x-node01": _answer(8, 191.98)})
    assert planned.gpus_from == "preset mi300x: no provisioned facts held for these nodes"
    assert planned.gpu_mem_from == "preset mi300x"
    line = planned.line()
    assert line.startswith("cluster from: 2 node(s) (") and "\n" not in line


def test_the_inventory_count_comes_before_the_preset(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "vars": {"gpu_verify_expected_count": 4},
                    "children": {"trainers": {"hosts": {"n1": {}}}},
                }
            }
        )
    )
    planned = _cluster(inventory=inv)
    assert (planned.cluster.gpus_per_node, planned.gpus_from) == (
        4,
        "the inventory's gpu_verify_expected_count",
    )


def test_flags_and_the_job_spec_win() -> None:
    answers = {"mi300x-node01": _answer(8, 191.98), "mi300x-node02": _answer(8, 191.98)}
    planned = _cluster(answers=answers, nproc_per_node=2, gpu_mem_flag=64.0)
    assert (planned.cluster.gpus_per_node, planned.gpus_from) == (2, "the job spec's nproc_per_node")
    assert (planned.cluster.gpu_mem_gib, planned.gpu_mem_from) == (64.0, "--gpu-mem-gib")
    assert _cluster(nodes_flag=3).cluster.nodes == 3


def _plan_text(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli(["plan", *argv])
    return code, capsys.readouterr().out


def test_the_70b_job_on_the_example_inventory_is_2_nodes_and_one_decision(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, text = _plan_text(capsys, str(JOB_70B), "-i", str(EXAMPLE))
    assert code == 0
    assert "cluster 2 node(s) x 8 GPU(s)" in text
    assert "Chose" not in text and text.count("`run` applies") == 1
    assert "`run` applies ZeRO-3 (configs/deepspeed/ds_z3.json) at the YAML's split" in text
    assert "yes <- run" in text and "yes <- plan: auto" in text
    # the job spec's deepspeed replaces the YAML's offload file: said in one line
    (line,) = [ln for ln in text.splitlines() if ln.startswith("DeepSpeed: ")]
    assert line == (
        "DeepSpeed: configs/deepspeed/ds_z3.json (the job spec's deepspeed), replacing the training YAML's "
        "deepspeed: /opt/mift/configs/deepspeed/ds_z3_offload.json"
    )


def test_held_torch_answers_are_read_by_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    cache = Path(os.environ["MIFT_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    (cache / FILE_NAME).write_text(
        json.dumps({"mi300x-node01": _answer(4, 191.98), "mi300x-node02": _answer(4, 191.98)})
    )
    try:
        code, text = _plan_text(capsys, str(JOB_70B), "-i", str(EXAMPLE))
    finally:
        (cache / FILE_NAME).unlink()
    assert code == 0
    assert "cluster 2 node(s) x 4 GPU(s), 192.0 GiB per GPU" in text
    assert "4 GPU(s) per node (provisioned: the torch answers of 2 node(s) held in" in text


def _job(tmp_path: Path, spec: str) -> Path:
    (tmp_path / "train.yaml").write_text(
        yaml.safe_dump(
            {
                "model_name_or_path": "meta-llama/Meta-Llama-3-70B",
                "stage": "sft",
                "do_train": True,
                "finetuning_type": "lora",
                "dataset": "demo",
                "template": "llama3",
                "output_dir": "out",
                "per_device_train_batch_size": 1,
                "gradient_accumulation_steps": 8,
                "cutoff_len": 2048,
            }
        )
    )
    path = tmp_path / "job.yaml"
    path.write_text(f"name: j\ntrain_config: train.yaml\nhosts: [n1, n2]\n{spec}")
    return path


def test_deepspeed_auto_is_shown_as_auto(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = _job(tmp_path, "deepspeed: auto\n")
    code, text = _plan_text(capsys, str(job))
    assert code == 0
    assert "DeepSpeed: auto (the job spec): the planner picks the fastest strategy that fits" in text
    assert text.count("`run` applies") == 1 and "Chose" not in text
    cli(["plan", str(job), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["deepspeed"] == "auto" and out["applied"]["deepspeed"] == "auto"
    assert out["applied"]["strategy"] == out["choice"]  # plan: as_written: the strategy at the YAML's split


def test_plan_auto_applies_the_training_plan_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _plan_text(capsys, str(_job(tmp_path, "deepspeed: auto\nplan: auto\n")))
    assert code == 0
    assert "Chose" not in text and text.count("`run` applies") == 1
    assert re.search(r"`run` applies (ZeRO|no DeepSpeed)[^,]*, micro-batch \d+ x accumulation \d+", text)
    assert "(At the YAML's own split, for reference" in text and "<- run" not in text


def test_validate_says_what_plan_needs_for_a_model_not_on_the_controller(tmp_path: Path) -> None:
    job = _job(tmp_path, "plan: auto\n")
    train = yaml.safe_load((tmp_path / "train.yaml").read_text())
    train["model_name_or_path"] = "my-org/my-private-model"  # a hub id with no bundled config
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train))
    (report,) = validate_files([job], builtin=True)
    lines = [str(p) for p in report.problems if p.rule == "plan-model-config"]
    assert lines == [
        f"{job}: plan: auto: the planner needs the model's config.json on this controller, and "
        "model_name_or_path: my-org/my-private-model: no config.json on this machine; pass --model-config "
        "(launcher plan) or set plan_model_config in the job spec (the config.json alone is enough)"
    ]
    # a bundled config (Llama-3-70B) or as_written: nothing to say
    train["model_name_or_path"] = "meta-llama/Meta-Llama-3-70B"
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train))
    (report,) = validate_files([job], builtin=True)
    assert not [p for p in report.problems if p.rule == "plan-model-config"]


def test_a_closed_pipe_ends_the_cli_quietly() -> None:
    # `python -m launcher plan ... | head -1`: the reader goes away after one line
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "plan", str(JOB_70B), "-i", str(EXAMPLE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert first.startswith(b"model 70.55 B params")
    assert err == ""
    assert code in (0, 1)  # 0: the command had finished when the pipe closed; 1: cut short
