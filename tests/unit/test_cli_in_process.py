"""Defects once found in run, validate and plan: one test each, in-process through ``launcher.main.cli``.

``run`` is driven against ``NodesDouble``, a test double of ``launcher.backends.runner.PlaybookRunner`` (this
machine
has no nodes for these tests): it answers the preflight and launch playbooks as two healthy CPU nodes would
and keeps the bundle each node would have received. ``RunnerMustNotBeCalled`` fails the test if anything
constructs
it: bad input must be refused before a runner exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from poll_stream_double import PollStreamDouble, lease_taken

from launcher.backends import runner as runner_module
from launcher.backends.runner import PlaybookResult
from launcher.engine.lease import lease_file
from launcher.main import cli
from launcher.spec.repo import PLAYBOOK_DIR
from mift_testsupport import proc
from mift_testsupport.cli import RunnerMustNotBeCalled

REPO = Path(__file__).resolve().parents[2]
HOSTS = ("host1", "host2")


def _facts(host: str) -> dict[str, Any]:
    return {
        "train_address": f"10.0.0.{HOSTS.index(host) + 1}",
        "stack": {},
        "gpus": {},
        "probe": {
            "trainer_cli": "/opt/mift/venv/bin/llamafactory-cli",
            "trainer_cli_found": True,
            "free_bytes": 10**12,
            "port_free": True,
            "versions": None,
            "mem_total_bytes": 64 * 1024**3,
        },
        "torch": {},
        "node_env": {},
        "play_hosts": list(HOSTS),
    }


class NodesDouble(PollStreamDouble):
    """Test double of PlaybookRunner: two healthy nodes, no ssh; keeps what ``launch`` would ship per node."""

    shipped: dict[str, dict[str, Any]]
    on_preflight: Any = None
    played: list[tuple[str, dict[str, Any]]]  # every playbook run, with its extra vars
    busy: dict[str, Any] | None = (
        None  # host2's lease held by this other run (launch.yml then starts nothing)
    )

    def __init__(self, private_data_dir: Path, *, inventory: Path | None = None, **_: Any) -> None:
        self.private_data_dir = private_data_dir
        self.inventory = inventory
        self.cancel_requested = threading.Event()
        private_data_dir.mkdir(parents=True, exist_ok=True)

    def run(self, playbook: str, extravars: dict[str, Any], **_: Any) -> PlaybookResult:
        result = PlaybookResult(playbook=playbook, rc=0, status="successful")
        NodesDouble.played.append((playbook, extravars))
        if playbook == "preflight":
            if NodesDouble.on_preflight is not None:
                NodesDouble.on_preflight()
            result.reports = {h: {"preflight": _facts(h)} for h in HOSTS}
        elif playbook == "launch":
            files = Path(extravars["mift_files_dir"])
            for host in HOSTS:
                NodesDouble.shipped[host] = json.loads((files / host / "bundle.json").read_text())
            if NodesDouble.busy is not None and "mift_lease_argv" in extravars:  # launch.yml: refused, undone
                holder = {"taken": False, "holder": NodesDouble.busy}
                result.reports = {"host1": {"lease": {"taken": True}}, "host2": {"lease": holder}}
                return result
            result.reports = {
                h: {"start": {"ok": True, "state": "running"}, **lease_taken(extravars)} for h in HOSTS
            }
        elif playbook == "collect" and "mift_lease_argv" in extravars:  # the finish gives the lease back
            result.reports = {h: {"lease": {"released": True, "changed": True}} for h in HOSTS}
        return result


def _patch_runner(monkeypatch: pytest.MonkeyPatch, cls: type) -> None:
    # the one seam where the launcher builds its runner (launcher.backends.runner.make_runner)
    monkeypatch.setattr(runner_module, "PlaybookRunner", cls)


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A configs/{train,deepspeed,data} layout (as the nodes see it under /opt/mift), an inventory, runs/."""
    for sub in ("train", "deepspeed", "jobs"):
        (tmp_path / "configs" / sub).mkdir(parents=True)
    (tmp_path / "configs" / "data").symlink_to(REPO / "configs" / "data")
    for name in ("ds_z3.json", "ds_z3_offload.json"):
        (tmp_path / "configs" / "deepspeed" / name).write_bytes(
            (REPO / "configs" / "deepspeed" / name).read_bytes()
        )
    train = yaml.safe_load((REPO / "configs" / "train" / "tiny_cpu_lora_sft.yaml").read_text())
    (tmp_path / "configs" / "train" / "plain.yaml").write_text(yaml.safe_dump(train))
    train["deepspeed"] = "/opt/mift/configs/deepspeed/ds_z3_offload.json"
    (tmp_path / "configs" / "train" / "names_ds.yaml").write_text(yaml.safe_dump(train))
    (tmp_path / "hosts.ini").write_text("[trainers]\nhost1\nhost2\n")
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("MIFT_CACHE_DIR", str(tmp_path / "cache"))
    NodesDouble.shipped = {}
    NodesDouble.on_preflight = None
    NodesDouble.played = []
    NodesDouble.busy = None
    return tmp_path


def _job(lab: Path, name: str, train: str, **extra: Any) -> Path:
    spec = {"name": name, "train_config": f"../train/{train}", "hosts": list(HOSTS), "nproc_per_node": 1}
    spec.update(extra)
    path = lab / "configs" / "jobs" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _run(lab: Path, job: Path) -> int:
    return int(cli(["run", str(job), "-i", str(lab / "hosts.ini"), "--detach"]))


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


# --- the DeepSpeed file the training YAML names ------------------------------------------------------------


def test_spec_silent_ships_the_deepspeed_file_the_yaml_names(lab, monkeypatch, capsys):
    """Spec without ``deepspeed`` + YAML naming ZeRO-3: the run ships that ZeRO-3 config (was: dropped)."""
    _patch_runner(monkeypatch, NodesDouble)
    assert _run(lab, _job(lab, "silent", "names_ds.yaml")) == 0, capsys.readouterr().err
    for host in HOSTS:
        bundle = NodesDouble.shipped[host]
        train = yaml.safe_load(bundle["files"]["train.yaml"])
        assert train["deepspeed"] == "ds_config.json"
        ds = json.loads(bundle["files"]["ds_config.json"])
        assert ds["zero_optimization"]["stage"] == 3
        assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"


def test_spec_none_against_a_yaml_deepspeed_file_is_refused(lab, monkeypatch, capsys):
    """Spec ``deepspeed: none`` while the YAML names a DeepSpeed file: one line, exit 2, no runner."""
    _patch_runner(monkeypatch, RunnerMustNotBeCalled)
    job = _job(lab, "contradict", "names_ds.yaml", deepspeed="none")
    assert _run(lab, job) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "contradict.yaml: deepspeed:" in line and "ds_z3_offload.json" in line


# --- what is validated is what is shipped -------------------------------------------------------------------


def test_shipped_training_yaml_is_the_validated_one(lab, monkeypatch, capsys):
    """The training YAML edited on disk while preflight runs: the nodes get what was validated."""
    _patch_runner(monkeypatch, NodesDouble)
    train = lab / "configs" / "train" / "plain.yaml"
    original = yaml.safe_load(train.read_text())

    def edit() -> None:
        train.write_text(train.read_text().replace("max_steps: 8", "max_steps: 999999"))

    NodesDouble.on_preflight = edit
    assert _run(lab, _job(lab, "toctou", "plain.yaml")) == 0, capsys.readouterr().err
    shipped = yaml.safe_load(NodesDouble.shipped["host1"]["files"]["train.yaml"])
    assert shipped["max_steps"] == original["max_steps"] == 8


# --- the GPU lease ------------------------------------------------------------------------------------------


def test_the_finish_gives_the_gpu_lease_back_in_its_collect_playbook(lab, monkeypatch, capsys):
    """A run's launch playbook takes the GPU lease, ``stop``'s collect playbook gives it back: no lease
    playbook of its own."""
    _patch_runner(monkeypatch, NodesDouble)
    assert _run(lab, _job(lab, "leased", "plain.yaml")) == 0, capsys.readouterr().err
    run_id = next(d.name for d in (lab / "runs").iterdir())
    cli(["stop", run_id])
    played = [name for name, _ in NodesDouble.played]
    assert "lease" not in played, played
    launch = next(v for name, v in NodesDouble.played if name == "launch")
    assert launch["mift_lease_argv"][:2] == ["take", lease_file()]
    assert json.loads(launch["mift_lease_argv"][3])["run_id"] == run_id
    collect = next(v for name, v in NodesDouble.played if name == "collect")
    assert collect["mift_lease_argv"] == ["release", lease_file(), run_id]
    record = json.loads((lab / "runs" / run_id / "record.json").read_text())
    assert record["lease_released"] == list(HOSTS)


def test_a_node_leased_by_another_live_run_refuses_the_run_at_its_start(lab, monkeypatch, capsys):
    """host2's lease is another run's: one line naming that run and its owner, the run rejected, no lease
    recorded; its launch playbook started nothing (it gives host1's back itself: launch.yml)."""
    _patch_runner(monkeypatch, NodesDouble)
    NodesDouble.busy = {"run_id": "other-run", "user": "ann", "controller": "ctl", "pid": 7, "started_at": 0}
    assert _run(lab, _job(lab, "second", "plain.yaml")) != 0
    line = _one_error_line(capsys.readouterr().err)
    assert "host2: GPUs leased by run other-run of ann@ctl (pid 7, since" in line and "run --force" in line
    record = json.loads(next((lab / "runs").iterdir()).joinpath("record.json").read_text())
    assert record["status"] == "rejected" and "lease" not in record
    assert record["attempts"][-1]["state"] == "rejected"
    assert [name for name, _ in NodesDouble.played] == ["preflight", "launch"]


# --- loaders: any bytes, any path ---------------------------------------------------------------------------


def test_validate_non_utf8_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"model_name_or_path: caf\xe9\nstage: sft\n")
    assert cli(["validate", str(bad)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(bad) in line and "UTF-8" in line


@pytest.mark.parametrize("content", [None, "README.txt"])
def test_validate_folder_without_configs_is_an_error(tmp_path, capsys, content):
    folder = tmp_path / "empty"
    folder.mkdir()
    if content:
        (folder / content).write_text("not a config\n")
    assert cli(["validate", str(folder)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(folder) in line and "nothing" in line


@pytest.mark.timeout(30)
def test_run_on_a_fifo_is_one_line_exit_2(lab, monkeypatch, capsys):
    _patch_runner(monkeypatch, RunnerMustNotBeCalled)
    fifo = lab / "job.yaml"
    os.mkfifo(fifo)
    assert cli(["run", str(fifo), "--detach"]) == 2
    assert "not a regular file" in _one_error_line(capsys.readouterr().err)


def test_run_on_a_symlink_loop_is_one_line_exit_2(lab, monkeypatch, capsys):
    _patch_runner(monkeypatch, RunnerMustNotBeCalled)
    loop = lab / "loop.yaml"
    loop.symlink_to(lab / "loop.yaml")
    assert cli(["run", str(loop), "--detach"]) == 2
    assert str(loop) in _one_error_line(capsys.readouterr().err)


def test_validate_huge_file_is_refused_unread(tmp_path, capsys):
    huge = tmp_path / "huge.json"
    with huge.open("wb") as fh:
        fh.truncate(200 * 1024 * 1024)  # sparse: 200 MiB of NUL bytes
    assert cli(["validate", str(huge)]) == 2
    assert "too large" in _one_error_line(capsys.readouterr().err)


# --- typed problems, no string round trip -------------------------------------------------------------------


def test_job_spec_problems_keep_their_own_key(tmp_path):
    """Two job spec errors are two problems, each with its key (was: one problem, keys glued into a
    message)."""
    from launcher.validation import validate_file  # noqa: PLC0415

    job = tmp_path / "two.yaml"
    job.write_text("name: two\ntrain_config: t.yaml\nmaster_prot: 1\nnproc_per_node: two\n")
    report = validate_file(job)
    assert {p.key for p in report.problems} == {"master_prot", "nproc_per_node"}
    assert all(p.path == str(job) for p in report.problems)


def test_plan_reads_the_training_yaml_like_validation(lab, capsys):
    """``plan`` used a third YAML loader that accepted duplicate keys; now the one loader refuses them."""
    train = lab / "configs" / "train" / "dup.yaml"
    train.write_text((lab / "configs" / "train" / "plain.yaml").read_text() + "cutoff_len: 4096\n")
    job = _job(lab, "dup", "dup.yaml")
    assert cli(["plan", str(job)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "dup.yaml" in line and "duplicate key 'cutoff_len'" in line


# --- the playbooks' data is data ----------------------------------------------------------------------------


def test_playbooks_hand_results_back_as_data_not_task_names():
    for playbook in ("preflight", "launch", "poll", "stop", "collect"):
        plays = yaml.safe_load((PLAYBOOK_DIR / f"{playbook}.yml").read_text())
        tasks = [t for play in plays for t in play.get("tasks", [])]
        assert not [t["name"] for t in tasks if str(t.get("name", "")).startswith("Report")], playbook
        assert any("ansible.builtin.set_stats" in t for t in tasks), playbook


# --- launch cost --------------------------------------------------------------------------------------------


def _imports_after(code: str, env: dict[str, str]) -> set[str]:
    script = f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"
    out = proc.run([sys.executable, "-c", script], env=env, cwd=REPO, timeout=300, check=False, stdin=None)
    assert out.stdout.strip(), out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_help_imports_no_engine_dependency(tmp_path):
    """``--help`` needs argparse only: not ansible_runner, pydantic or yaml."""
    loaded = _imports_after(
        "from launcher.main import cli\ntry:\n    cli(['--help'])\nexcept SystemExit:\n    pass",
        {**os.environ, "MIFT_CACHE_DIR": str(tmp_path)},
    )
    assert not loaded & {"ansible_runner", "pydantic", "yaml", "torch"}


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("llamafactory") is None,
    reason="DeepSpeed/LLaMA-Factory not installed: nothing heavy to avoid",
)
def test_second_validation_of_the_same_files_imports_no_torch(tmp_path):
    """The real classes' verdict is cached per (file content, package versions): the second run skips
    torch."""
    env = {**os.environ, "MIFT_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("MIFT_VALIDATE_BUILTIN", None)
    code = (
        "from launcher.main import cli\nassert cli(['validate', '-q', 'configs/jobs/tiny-lora-z3.yaml']) == 0"
    )
    first = _imports_after(code, env)
    assert "torch" in first  # the real classes ran once
    second = _imports_after(code, env)
    assert not second & {"torch", "deepspeed", "llamafactory", "transformers"}
