"""The node program of launch and preflight: its install (files from stdin, modes, the agent), and the local
facts the probe reads."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from launcher.node import probe as node_probe
from launcher.spec.nodelayout import layout
from launcher.transfer import nodeprogram

# the node program as shipped (``python3 PROGRAM install ...``: the launch playbook's one command)
PROGRAM = nodeprogram.program_file()
JOB = {"run_id": "r1", "node_rank": 0, "argv": ["true"], "output_dir": "output", "expect_outputs": []}


def _install(run_dir: Path, files: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), "install", str(run_dir), *args],
        input=json.dumps(files),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_writes_the_program_and_the_files_with_their_modes_then_execs_the_agent(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    files = {"bundle.json": json.dumps({"files": {}, "job": JOB, "env": {"T": "s"}})}
    proc = _install(run_dir, files, "prepare", "--grace", "8")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["state"] == "queued"  # the agent's prepare answered
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in run_dir.iterdir()}
    assert modes["mift_node.pyz"] == 0o700 and modes["env.json"] == 0o600
    assert (run_dir / "mift_node.pyz").read_bytes() == PROGRAM.read_bytes()


def test_agent_failure_is_the_tasks_exit_status(tmp_path: Path) -> None:
    proc = _install(
        tmp_path / "r2", {}, "start", "--grace", "8", "--wait", "1"
    )  # no bundle: nothing to start
    assert proc.returncode == 1 and json.loads(proc.stdout)["ok"] is False


def test_an_unknown_command_is_refused(tmp_path: Path) -> None:
    proc = _install(tmp_path / "r5", {}, "rm")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "mift_install: unknown agent command 'rm'"
    assert not (tmp_path / "r5").exists()


def test_a_path_in_a_file_name_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    run_dir = tmp_path / "r3"
    proc = _install(run_dir, {"../escape.py": "x"}, "start")
    assert proc.returncode == 1
    assert proc.stderr.strip() == "mift_install: refusing file name '../escape.py'"
    assert not (tmp_path / "escape.py").exists() and not run_dir.exists()


def test_an_unknown_program_is_refused_with_the_list() -> None:
    proc = subprocess.run([sys.executable, str(PROGRAM), "nope"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "mift_node: program 'nope' is not one of agent, allreduce, gpu-allreduce, gpu-check, install, lease, "
        "prepare, probe, stage"
    )


def _probe_module():  # the node program's probe
    return node_probe


def test_probe_reads_the_local_facts_preflight_needs(tmp_path: Path) -> None:
    """The probe answers mift_stack/mift_gpus/mift_flash_attn as Ansible's local facts would; {} otherwise."""
    mift_probe = _probe_module()
    (tmp_path / "mift_stack.fact").write_text('{"torch": "2.9.1"}')
    (tmp_path / "mift_gpus.fact").write_text("[1, 2]")  # not an object
    (tmp_path / "mift_flash_attn.fact").write_bytes(b"\xff\xfe")  # not text
    assert mift_probe.local_facts(tmp_path) == {
        "mift_stack": {"torch": "2.9.1"},
        "mift_gpus": {},
        "mift_flash_attn": {},
    }
    absent = mift_probe.local_facts(tmp_path / "absent")
    assert absent == {name: {} for name in ("mift_stack", "mift_gpus", "mift_flash_attn")}


def _fake_venv(tmp_path: Path) -> Path:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "torch-2.9.1.dist-info").mkdir(parents=True)
    (site / "torch-2.9.1.dist-info" / "RECORD").write_text("torch/__init__.py,,\n")
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("")
    (venv / "bin").mkdir()
    (venv / "bin" / "python3").symlink_to(sys.executable)
    return venv


def test_torch_key_changes_with_what_torch_answers_depend_on(tmp_path: Path, monkeypatch) -> None:
    probe = _probe_module()
    venv = _fake_venv(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    for name in probe.VISIBLE_DEVICES:
        monkeypatch.delenv(name, raising=False)
    key = probe.torch_key(venv)
    assert key and probe.torch_key(venv) == key  # stable
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert probe.torch_key(venv) not in (None, key)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    record = venv / "lib" / "python3.11" / "site-packages" / "torch-2.9.1.dist-info" / "RECORD"
    record.write_text("torch/__init__.py,,\ntorch/version.py,,\n")  # a pip reinstall rewrites RECORD
    assert probe.torch_key(venv) not in (None, key)
    assert probe.torch_key(tmp_path / "no-venv") is None  # no torch metadata: torch is always asked


def test_probe_skips_torch_when_the_controller_holds_the_answer_for_the_key(tmp_path: Path) -> None:
    probe = _probe_module()
    venv = _fake_venv(tmp_path)
    fresh = probe.cmd_facts(tmp_path, None, venv, facts_dir=tmp_path, stack_dists=layout().stack_packages)
    assert "cached" not in fresh["torch"] and fresh["torch"]["key"] == probe.torch_key(venv)
    again = probe.cmd_facts(
        tmp_path,
        None,
        venv,
        facts_dir=tmp_path,
        stack_dists=layout().stack_packages,
        torch_known=fresh["torch"]["key"],
    )
    assert again["torch"] == {"cached": True, "key": fresh["torch"]["key"]}
    stale = probe.cmd_facts(
        tmp_path, None, venv, facts_dir=tmp_path, stack_dists=layout().stack_packages, torch_known="0" * 32
    )
    assert "cached" not in stale["torch"]


def test_controller_keeps_answers_without_errors_and_fills_cached_replies(tmp_path: Path) -> None:
    from launcher.preflight.torch_answers import TorchAnswers  # noqa: PLC0415

    path = tmp_path / "cache" / "torch-probe.json"
    first = TorchAnswers(path)
    assert first.known() == {}
    answer = {"torch": "2.9.1", "device_count": 8, "key": "k1"}
    out = first.resolve({"h1": answer, "h2": {"error": "No module named 'torch'", "key": "k2"}})
    assert out == {"h1": answer, "h2": {"error": "No module named 'torch'", "key": "k2"}}
    second = TorchAnswers(path)  # the next run reads what the first kept
    assert second.known() == {"h1": "k1"}
    assert second.resolve({"h1": {"cached": True, "key": "k1"}})["h1"] == {**answer, "cached": True}
    assert "error" in second.resolve({"h1": {"cached": True, "key": "other"}})["h1"]
    # a failing torch forgets the host: the next run asks it again
    second.resolve({"h1": {"error": "CUDA init failed", "key": "k3"}})
    assert TorchAnswers(path).known() == {}
    path.write_bytes(b"\xff not json")
    assert TorchAnswers(path).known() == {}


def test_probe_lists_only_complete_checkpoints(tmp_path: Path) -> None:
    """A checkpoint-N folder without trainer_state.json (a stop while saving it) is not one to resume from."""
    mift_probe = _probe_module()
    complete = {4: ("adapter_model.safetensors", "trainer_state.json"), 8: ("trainer_state.json",)}
    for step, files in complete.items():
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        for name in files:
            (folder / name).write_text("{}")
    cut_short = tmp_path / "checkpoint-12"
    (cut_short / "global_step12").mkdir(parents=True)
    (cut_short / "adapter_model.safetensors").write_text("x")
    (tmp_path / "checkpoint-16").mkdir()  # empty
    (tmp_path / "checkpoint-x").mkdir()
    assert mift_probe.checkpoints(tmp_path) == [4, 8]
    assert mift_probe.checkpoints(tmp_path / "missing") == []


def test_the_facts_name_optional_kernels_apart_from_the_stack(tmp_path: Path):
    """liger-kernel is asked in the same interpreter as the stack, reported apart (no stack drift from it)."""
    mift_probe = _probe_module()
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)  # this machine's python: no liger-kernel here
    facts = mift_probe.cmd_facts(
        tmp_path, None, venv, facts_dir=tmp_path, stack_dists=layout().stack_packages
    )
    assert set(facts["versions"]) == set(layout().stack_packages)
    assert facts["optional"] == {"liger_kernel": None}
    none = mift_probe.cmd_facts(
        tmp_path, None, tmp_path / "no-venv", facts_dir=tmp_path, stack_dists=layout().stack_packages
    )
    assert none["versions"] is None and none["optional"] is None  # nothing asked: nothing claimed
