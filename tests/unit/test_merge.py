"""Merging after the run: which runs merge, on which node, what the node program is asked, how
the smoke check's verdict is said and recorded (the node side runs in the rig case; a test double here)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from launcher.exceptions import ConfigurationError, JobFailedError
from launcher.rundir.runs import RunDir
from launcher.spec.jobspec import MERGE_PROMPTS, MergeOptions
from launcher.spec.jobspec_load import parse_job_spec
from launcher.transfer import nodecall
from launcher.transfer.merge import adapter_holders, first_difference, merge_after_run, merge_request, wanted

TRAIN = {"model_name_or_path": "/opt/m", "template": "default", "finetuning_type": "lora", "do_train": True}


@pytest.mark.parametrize(
    ("options", "stages_model", "train", "expect"),
    [
        ({}, True, TRAIN, (True, "")),
        (
            {},
            False,
            TRAIN,
            (False, ""),
        ),  # default: only a job whose base model is staged (verified on the node)
        ({"enabled": True}, False, TRAIN, (True, "")),
        ({"enabled": False}, True, TRAIN, (False, "")),
        (
            {},
            True,
            {**TRAIN, "finetuning_type": "full"},
            (False, "finetuning_type is full: no adapter to merge"),
        ),
        (
            {},
            True,
            {k: v for k, v in TRAIN.items() if k != "finetuning_type"},
            (True, ""),
        ),  # LF's default: lora
        (
            {},
            True,
            {**TRAIN, "do_train": False},
            (False, "the training YAML does not train (do_train is not true)"),
        ),
    ],
)
def test_which_runs_merge(
    options: dict[str, Any], stages_model: bool, train: dict[str, Any], expect: tuple[bool, str]
) -> None:
    assert wanted(MergeOptions(**options), stages_model, train) == expect


def test_the_final_adapter_not_a_checkpoint_is_merged() -> None:
    outputs = {
        "host1": [
            "/r/output/checkpoint-4/adapter_model.safetensors",
            "/r/output/adapter_config.json",
            "/r/output/adapter_model.safetensors",
        ],
        "host2": ["/r/output/checkpoint-4/adapter_model.safetensors"],
        "host3": "not a list",
    }
    assert adapter_holders(outputs) == {"host1": "/r/output"}


def test_the_first_difference_is_named() -> None:
    same = [{"prompt": "a", "merged": [1, 2], "adapter": [1, 2]}]
    assert first_difference(same) is None
    rows = [*same, {"prompt": "b", "merged": [5, 6, 7], "adapter": [5, 9, 7]}]
    assert (
        first_difference(rows)
        == "prompt 2 ('b') differs at token 2: merged [5, 6, 7] vs base + adapter [5, 9, 7]"
    )
    short = [{"prompt": "c", "merged": [5], "adapter": [5, 6]}]
    assert first_difference(short) == "prompt 1 ('c') differs at token 2: merged [5] vs base + adapter [5, 6]"


def test_job_spec_merge_keys_are_checked() -> None:
    src = Path("/jobs/x.yaml")
    base = {"name": "x", "train_config": "t.yaml"}
    spec = parse_job_spec({**base, "merge": {"host": "host2", "device": "gpu", "prompts": ["hi"]}}, src)
    assert spec.merge.device == "gpu" and spec.merge.prompts == ["hi"] and spec.merge.enabled is None
    assert parse_job_spec(base, src).merge.max_new_tokens == 16
    for bad, message in (
        ({"device": "tpu"}, "merge.device"),
        ({"prompts": [" "]}, "a prompt is empty"),
        ({"prompts": []}, "merge.prompts"),
        ({"enabld": True}, "enabled"),
    ):
        with pytest.raises(ConfigurationError, match=message):
            parse_job_spec({**base, "merge": bad}, src)
    assert parse_job_spec({**base, "stage": {"tokenize_once": False}}, src).stage.tokenize_once is False


def _plan(tmp_path: Path, merge: dict[str, Any] | None = None) -> Any:
    spec = parse_job_spec(
        {
            "name": "mg",
            "train_config": "t.yaml",
            "stage": {"model": {"shared": "/opt/m"}},
            "merge": merge or {},
        },
        tmp_path / "job.yaml",
    )
    return SimpleNamespace(
        spec=spec,
        hosts=["host1", "host2"],
        jobs={
            h: {"argv": ["/opt/mift/venv/bin/llamafactory-cli", "train", "train.yaml"]}
            for h in ("host1", "host2")
        },
        envs={h: {"HF_HUB_OFFLINE": "1", "MASTER_ADDR": "10.0.0.1"} for h in ("host1", "host2")},
        run_id="mg-1",
    )


def test_what_the_node_is_asked(tmp_path: Path) -> None:
    request = merge_request(_plan(tmp_path), MergeOptions(device="gpu", dtype="bfloat16"), "/r/output", TRAIN)
    assert request["export"] == {
        "model_name_or_path": "/opt/m",
        "adapter_name_or_path": "/r/output",
        "template": "default",
        "finetuning_type": "lora",
        "trust_remote_code": False,
        "export_device": "auto",
        "export_size": 5,
        "export_legacy_format": False,
        "infer_dtype": "bfloat16",
    }
    assert request["dest"] == "/var/lib/mift/runs/mg-1/merged" and request["device"] == "cuda"
    assert request["base"] == "/opt/m" and request["adapter"] == "/r/output"


class NodeTestDouble:
    """TEST DOUBLE of the node program's ``merge`` answer: tokens as given, the request kept."""

    def __init__(self, merged: list[int], adapter: list[int]) -> None:
        self.merged, self.adapter = merged, adapter
        self.requests: list[tuple[list[str], str, dict[str, Any]]] = []

    def __call__(
        self, ssh: list[str], python: str, verb: str, request: dict[str, Any], **_: Any
    ) -> dict[str, Any]:
        assert verb == "merge"
        self.requests.append((ssh, python, request))
        rows = [
            {"prompt": p, "merged": self.merged, "adapter": self.adapter, "base": [0]}
            for p in request["prompts"]
        ]
        files = {
            "model.safetensors": {"size": 10, "sha256": "a" * 64},
            "config.json": {"size": 2, "sha256": "b" * 64},
        }
        return {
            "ok": True,
            "seconds": 1.5,
            "check_seconds": 2.0,
            "files": files,
            "dtype": "float32",
            "prompts": rows,
            "same": self.merged == self.adapter,
            "peak_rss_kb": 2048,
            "peak_gpu_bytes": 0,
        }


def _merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node: NodeTestDouble, merge: dict[str, Any] | None = None
) -> tuple[RunDir, str]:
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(nodecall, "call", node)
    monkeypatch.setattr(
        "launcher.transfer.staging.node_connections", lambda _r, host, _c: {host: ["ssh", host]}
    )
    run = RunDir.create("mg-1", {"name": "mg"})
    run.update(outputs={"host1": ["/r/output/adapter_model.safetensors"], "host2": []})
    out = io.StringIO()
    try:
        merge_after_run(run, _plan(tmp_path, merge), runner=None, train=TRAIN, out=out)  # type: ignore[arg-type]
    finally:
        text = out.getvalue()
    return run, text


def test_a_checked_merge_is_recorded_beside_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = NodeTestDouble([1, 2, 3], [1, 2, 3])
    run, text = _merge(tmp_path, monkeypatch, node)
    ssh, python, request = node.requests[0]
    assert ssh == ["ssh", "host1"] and python == "/opt/mift/venv/bin/python3"
    assert request["env"] == {
        "HF_HUB_OFFLINE": "1",
        "MASTER_ADDR": "10.0.0.1",
    }  # the trainer's (call drops some)
    record = run.load()["merge"]
    assert (
        record["status"] == "checked"
        and record["same"]
        and record["host"] == "host1"
        and record["prompts"] == 3
    )
    kept = json.loads((run.path / "merge" / "merged.manifest.json").read_text())
    assert kept["digest"] == record["digest"] and set(kept["manifest"]) == {
        "model.safetensors",
        "config.json",
    }
    assert json.loads((run.path / "merge" / "result.json").read_text())["answer"]["same"] is True
    assert "merge: smoke check: 3/3 prompts give the same 16 greedy tokens" in text


def test_different_tokens_fail_the_merge_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(JobFailedError) as err:
        _merge(tmp_path, monkeypatch, NodeTestDouble([1, 2, 3], [1, 4, 3]))
    assert str(err.value) == (
        "merge: smoke check: prompt 1 ('The capital of France is') differs at token 2: merged [1, 2, 3] vs "
        "base + adapter [1, 4, 3]"
    )
    record = json.loads((tmp_path / "runs" / "mg-1" / "record.json").read_text())["merge"]
    assert record["status"] == "failed" and record["error"].startswith("smoke check: prompt 1")
    assert not record["same"] and record["digest"].startswith("sha256:")


def test_a_node_without_the_adapter_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = NodeTestDouble([1], [1])
    with pytest.raises(JobFailedError, match=r"merge: host2: it holds no final adapter \(it is on host1\)"):
        _merge(tmp_path, monkeypatch, node, {"host": "host2"})
    assert node.requests == []


def test_a_login_host_only_run_is_not_merged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = NodeTestDouble([1], [1])
    plan = _plan(tmp_path, {"enabled": True})
    login_only = plan.spec.slurm.model_copy(update={"shared_dir": "/shared", "nodes": 2})
    plan.spec = plan.spec.model_copy(
        update={"slurm": login_only, "stage": plan.spec.stage.model_copy(update={"model": None})}
    )
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(nodecall, "call", node)
    run = RunDir.create("mg-1", {"name": "mg"})
    out = io.StringIO()
    merge_after_run(run, plan, runner=None, train=TRAIN, out=out)  # type: ignore[arg-type]
    assert node.requests == [] and out.getvalue() == (
        "note: merge: not done: the nodes are not reached with slurm.shared_dir (login host only)\n"
    )


def test_opted_out_runs_ask_no_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    node = NodeTestDouble([1], [1])
    run, text = _merge(tmp_path, monkeypatch, node, {"enabled": False})
    assert node.requests == [] and "merge" not in run.load() and text == ""


def test_the_node_programs_environment_has_no_rendezvous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []

    def fake_run(argv: list[str], **kwargs: Any) -> Any:
        seen.append(json.loads(kwargs["input"]))
        return SimpleNamespace(stdout=b'noise\n{"ok": true}\n', returncode=0)

    monkeypatch.setattr(nodecall.subprocess, "run", fake_run)
    # TEST DOUBLE: no node behind "ssh h" to send the node program to
    monkeypatch.setattr(nodecall.nodeprogram, "ship_over_ssh", lambda ssh: None)
    request = {"env": {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "a", "HF_HUB_OFFLINE": "1"}}
    answer = nodecall.call(
        ["ssh", "h"], "/v/bin/python3", "merge", request, log=tmp_path / "l.log", timeout_s=5
    )
    assert answer == {"ok": True} and seen[0]["env"] == {"HF_HUB_OFFLINE": "1"}


def test_no_answer_is_one_line_naming_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_run(argv: list[str], **kwargs: Any) -> Any:
        kwargs["stderr"].write(b"Traceback ...\nModuleNotFoundError: No module named 'peft'\n")
        return SimpleNamespace(stdout=b"", returncode=1)

    monkeypatch.setattr(nodecall.subprocess, "run", fake_run)
    answer = nodecall.call([], "/v/bin/python3", "merge", {}, log=tmp_path / "l.log", timeout_s=5)
    assert answer == {
        "ok": False,
        "error": "no answer from the node program (ModuleNotFoundError: No module named 'peft'; "
        f"log: {tmp_path}/l.log)",
    }


def test_default_prompts_live_in_one_place() -> None:
    assert MergeOptions().prompts == list(MERGE_PROMPTS)


def test_the_stage_report_with_no_destination_gives_the_connection_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """launcher.transfer.staging.node_connections asks the stage playbook for no folder: the node answers
    {}."""
    from launcher.node import stage as mift_stage  # noqa: PLC0415

    assert mift_stage.main(["report", "--cache", ""]) == 0
    assert json.loads(capsys.readouterr().out) == {}
    with pytest.raises(SystemExit):
        mift_stage.main(["recv", "--cache", ""])
