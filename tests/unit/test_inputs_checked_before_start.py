"""What ``validate`` says ok, ``run`` runs: every job-spec field is checked as the run uses it.

On the controller (``launcher validate`` and ``run`` alike): ``output_dir`` templates name only known fields
and braces pair, a relative ``resume`` path that can never exist on a node is refused. On the nodes (the one
probe of preflight): the model folder, a named resume checkpoint and the dataset folder must be there,
complete, on every node; one problem per missing folder names its hosts, and nothing starts. A run that ended
before its first step reports that, not ``None/None``.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from launcher.backends.runner import PlaybookResult
from launcher.exceptions import ConfigurationError
from launcher.main import cli
from launcher.node import probe as mift_probe
from launcher.node import probe_paths as mift_probe_paths
from launcher.preflight.checks import MODEL_FILES, NodePath, node_paths, run_preflight
from launcher.rundir.report import steps_text
from launcher.rundir.runs import RunRecord
from launcher.spec.jobspec_load import parse_job_spec

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "configs" / "train" / "tiny_cpu_lora_sft.yaml"


def _spec(**fields: Any) -> Any:
    return parse_job_spec({"name": "j", "train_config": str(TRAIN), **fields}, Path("job.yaml"))


def _refusal(**fields: Any) -> str:
    with pytest.raises(ConfigurationError) as err:
        _spec(**fields)
    return str(err.value)


# --- controller: output_dir templates ------------------------------------------------------------------


def test_validate_refuses_an_unknown_output_dir_field_in_one_line(tmp_path: Path, capsys: Any) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"name: j\ntrain_config: {TRAIN}\noutput_dir: /x/{{nope}}\n")
    assert cli(["validate", "--builtin", str(job)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{job}: output_dir: unknown field {{nope}}; known: {{run_id}} "
        "(write {{ or }} for a literal brace)"
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/x/{", "Single '{' encountered"),
        ("/x/}", "Single '}' encountered"),
        ("/x/{}", "positional field {}"),
        ("/x/{0}", "positional field {0}"),
        ("/x/{run_id.upper}", "unknown field {run_id.upper}"),
        ("/x/{run_id!r}", "{run_id}: no format spec or conversion"),
        ("/x/{run_id:>9}", "{run_id}: no format spec or conversion"),
    ],
)
def test_output_dir_braces_that_format_would_reject_are_refused(value: str, expected: str) -> None:
    line = _refusal(output_dir=value)
    assert line.startswith("job.yaml: output_dir: ")
    assert expected in line


def test_output_dir_known_field_and_doubled_braces_are_filled() -> None:
    assert _spec(output_dir="/data/{run_id}/{{x}}").node_output_dir("r1") == "/data/r1/{x}"
    assert _spec().node_output_dir("r1") == "output"


# --- controller: resume paths ---------------------------------------------------------------------------


def test_a_relative_resume_checkpoint_inside_the_fresh_run_directory_is_refused() -> None:
    line = _refusal(resume="checkpoint-notanumber")
    assert line.startswith(
        "job.yaml: resume: checkpoint-notanumber: a relative checkpoint is looked up in the new"
    )


@pytest.mark.parametrize("value", ["/data/out/checkpoint-4", "../other-run/output/checkpoint-4"])
def test_resume_paths_that_can_exist_on_a_node_are_left_to_preflight(value: str) -> None:
    assert _spec(resume=value).resume == value


# --- which node folders a job needs ---------------------------------------------------------------------


def test_node_paths_are_the_model_dataset_and_named_checkpoint() -> None:
    train = {
        "model_name_or_path": "/opt/mift/models/m",
        "dataset_dir": "/opt/mift/data/d",
        "dataset": "a, b",
        "eval_dataset": "b",
    }
    paths = node_paths(train, _spec(resume="/out/checkpoint-4"), deepspeed=True)
    assert paths == [
        NodePath("model_name_or_path", "/opt/mift/models/m", MODEL_FILES),
        NodePath("resume", "/out/checkpoint-4", (("trainer_state.json",), ("global_step*",))),
        NodePath("dataset_dir", "/opt/mift/data/d", (("dataset_info.json",),), ("a", "b")),
    ]
    no_ds = node_paths(train, _spec(resume="/out/checkpoint-4"), deepspeed=False)
    assert "model.safetensors" in no_ds[1].files[1]
    assert "global_step*" not in no_ds[1].files[1]


def test_remote_datasets_and_run_resume_need_no_node_folder_a_hub_id_its_cached_snapshot() -> None:
    train = {
        "model_name_or_path": "meta-llama/Meta-Llama-3-8B",
        "dataset_dir": "REMOTE:org/x",
        "dataset": "a",
    }
    # the trainers run offline: a hub id must be complete in each node's Hugging Face cache (tests/unit/
    # test_hub_preflight.py), no folder path
    hub_only = [("model_name_or_path", "meta-llama/Meta-Llama-3-8B")]
    for paths in (
        node_paths(train, _spec(resume="/out/checkpoint-4"), deepspeed=None, resume_run=True),
        node_paths({**train, "dataset_dir": "none"}, _spec(), deepspeed=None),
        node_paths({**train, "dataset_dir": "/d", "tokenized_path": "/t"}, _spec(), deepspeed=None),
    ):
        assert [(p.what, p.hub) for p in paths] == hub_only


# --- the probe on a node --------------------------------------------------------------------------------


def _require(*paths: NodePath) -> list[dict[str, Any]]:
    return [p.as_extravar() for p in paths]


def test_probe_reports_a_missing_model_folder_and_one_without_weights(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    found = mift_probe_paths.missing_paths(
        tmp_path / "run",
        _require(
            NodePath("model_name_or_path", str(tmp_path / "nope"), MODEL_FILES),
            NodePath("model_name_or_path", str(model), MODEL_FILES),
        ),
    )
    assert found[0] == {
        "what": "model_name_or_path",
        "path": str(tmp_path / "nope"),
        "why": "no such directory",
    }
    assert found[1]["why"].startswith("model.safetensors or model.safetensors.index.json or")
    assert len(found) == 2


def test_probe_follows_a_weights_index_to_its_shards(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00001-of-00002.safetensors").write_text("")
    require = _require(NodePath("model_name_or_path", str(tmp_path), MODEL_FILES))
    [gap] = mift_probe_paths.missing_paths(tmp_path, require)
    assert gap["why"] == "model-00002-of-00002.safetensors (named by model.safetensors.index.json) missing"
    (tmp_path / "model-00002-of-00002.safetensors").write_text("")
    assert mift_probe_paths.missing_paths(tmp_path, require) == []


def test_probe_refuses_a_checkpoint_cut_short_and_resolves_relative_paths_in_the_run_dir(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "runs" / "new"
    ckpt = tmp_path / "runs" / "old" / "output" / "checkpoint-4"
    (ckpt / "global_step4").mkdir(parents=True)
    need = NodePath("resume", "../old/output/checkpoint-4", (("trainer_state.json",), ("global_step*",)))
    [gap] = mift_probe_paths.missing_paths(run_dir, _require(need))
    assert gap["why"] == "trainer_state.json missing"
    (ckpt / "trainer_state.json").write_text("{}")
    assert mift_probe_paths.missing_paths(run_dir, _require(need)) == []


def test_probe_checks_dataset_names_and_their_files(tmp_path: Path) -> None:
    info = {"a": {"file_name": "a.json"}, "hub": {"hf_hub_url": "org/x", "file_name": "x.json"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    need = NodePath("dataset_dir", str(tmp_path), (("dataset_info.json",),), ("a", "hub", "zzz"))
    [gap] = mift_probe_paths.missing_paths(tmp_path, _require(need))
    assert gap["why"] == f"a: {tmp_path / 'a.json'} missing; dataset 'zzz' not in dataset_info.json"


def test_probe_answers_a_bad_require_argument_as_data(tmp_path: Path, capsys: Any) -> None:
    layout = ["--venv", str(tmp_path / "venv"), "--facts-dir", str(tmp_path / "facts"), "--dists", "torch"]
    assert mift_probe.main([str(tmp_path), *layout, "--require", "{not json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["missing"] == [{"what": "--require", "path": "", "why": "not a JSON list of objects"}]
    assert mift_probe.main([str(tmp_path), *layout]) == 0
    assert json.loads(capsys.readouterr().out)["missing"] is None


# --- preflight on the controller ------------------------------------------------------------------------


class _PreflightRunnerDouble:
    """TEST DOUBLE of PlaybookRunner: keeps the extra vars, answers with the given probe reports."""

    def __init__(self, probes: dict[str, dict[str, Any]]) -> None:
        self.cancel_requested = threading.Event()
        self.extravars: dict[str, Any] = {}
        base = {"trainer_cli_found": True, "free_bytes": 10**12, "port_free": True}
        self.reports = {
            h: {"preflight": {"train_address": h, "probe": {**base, **p}, "play_hosts": list(probes)}}
            for h, p in probes.items()
        }

    def run(self, playbook: str, extravars: dict[str, Any]) -> PlaybookResult:
        assert playbook == "preflight"
        self.extravars = extravars
        return PlaybookResult(playbook, 0, "successful", reports=self.reports)


def test_preflight_refuses_missing_folders_in_one_line_naming_every_host() -> None:
    model = {"what": "model_name_or_path", "path": "/opt/mift/models/nope", "why": "no such directory"}
    ckpt = {"what": "resume", "path": "/out/checkpoint-9", "why": "no such directory"}
    runner = _PreflightRunnerDouble({"host1": {"missing": [model, ckpt]}, "host2": {"missing": [model]}})
    need = [NodePath("model_name_or_path", "/opt/mift/models/nope", MODEL_FILES)]
    with pytest.raises(ConfigurationError) as err:
        run_preflight(runner, _spec(nproc_per_node=1), "r1", requires=need)  # type: ignore[arg-type]
    assert str(err.value) == (
        "host1, host2: model_name_or_path: /opt/mift/models/nope: no such directory; "
        "host1: resume: /out/checkpoint-9: no such directory; nothing was started"
    )
    assert [p.path for p in err.value.problems] == ["host1, host2", "host1"]
    assert runner.extravars["mift_require"] == [need[0].as_extravar()]


def test_preflight_passes_when_every_node_has_the_folders() -> None:
    runner = _PreflightRunnerDouble({"host1": {"missing": []}, "host2": {"missing": []}})
    facts = run_preflight(runner, _spec(nproc_per_node=1), "r1")  # type: ignore[arg-type]
    assert facts.hosts == ["host1", "host2"]
    assert "mift_require" not in runner.extravars  # nothing to ask: the probe is not given --require


# --- the report of a run that never logged a step -------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "summary", "expected"),
    [
        ("failed", {"steps": None, "total_steps": None}, "none: failed before its first step"),
        ("stopped", {}, "none: stopped before its first step"),
        ("running", {}, "none logged"),
        ("failed", {"steps": 3, "total_steps": 8}, "3/8"),
        ("succeeded", {"steps": 8, "total_steps": None}, "8/-"),
    ],
)
def test_steps_line_says_when_a_run_ended_before_its_first_step(
    status: str, summary: dict[str, Any], expected: str
) -> None:
    assert steps_text(RunRecord.of({"status": status, "summary": summary})) == expected
