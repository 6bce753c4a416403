"""The launcher end to end on 2 test hosts provisioned by provision.yml (cpu backend, the tiny model).

Shows: LoRA SFT with DeepSpeed ZeRO-3 across 2 nodes, and with ZeRO-3 + CPU offload (world size 2, losses
in the metrics, adapter saved, status succeeded, loss PNG); killing one node's trainer, Ctrl-C while following
and ``stop`` on a detached run all end with no trainer process on either host within 30 s and the logs
kept; and ``validate`` of the seed DeepSpeed JSON exits 2 naming the key.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import ModuleType

REPO = Path(__file__).parents[2]
# rig 5 by default; CI hands the provisioned rig on to the faults suite (see .ci/run)
RIG_ID = int(os.environ.get("LAUNCHER_E2E_RIG_ID", "5"))
KEEP_RIG = os.environ.get("LAUNCHER_E2E_KEEP_RIG") == "1"
pytestmark = [pytest.mark.rig, pytest.mark.slow]
SEED_JSON = REPO / "tests" / "fixtures" / "bad-configs" / "ds_seed_blog.json"


def launcher_env(runs: Path) -> dict[str, str]:
    return {**os.environ, "MIFT_RUNS_DIR": str(runs), "PYTHONUNBUFFERED": "1"}


class Cluster:
    """The provisioned rig plus helpers to run the launcher against it."""

    def __init__(self, rig: Any, runs: Path, work: Path) -> None:
        self.rig = rig
        self.runs = runs
        self.work = work

    def launcher(self, *args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "launcher", *args]
        return subprocess.run(
            argv,
            env=launcher_env(self.runs),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=REPO,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "launcher", *args]
        return subprocess.Popen(
            argv,
            env=launcher_env(self.runs),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )

    def job(self, name: str, deepspeed: str = "ds_z3.json", max_steps: int | None = None) -> Path:
        """Write a job spec (and, for long runs, a training YAML with more steps) under the work dir."""
        train = REPO / "configs" / "train" / "tiny_cpu_lora_sft.yaml"
        if max_steps is not None:  # in a configs/{train,data} layout, as the validator maps node paths
            cfg = yaml.safe_load(train.read_text())
            cfg.update(max_steps=max_steps, save_steps=10_000)
            train = self.work / "configs" / "train" / f"{name}.yaml"
            train.parent.mkdir(parents=True, exist_ok=True)
            if not (self.work / "configs" / "data").exists():
                (self.work / "configs" / "data").symlink_to(REPO / "configs" / "data")
            train.write_text(yaml.safe_dump(cfg))
        spec = yaml.safe_load((REPO / "configs" / "jobs" / "tiny-lora-z3.yaml").read_text())
        spec.update(
            name=name, train_config=str(train), deepspeed=str(REPO / "configs" / "deepspeed" / deepspeed)
        )
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    def run_dir(self, name: str) -> Path:
        (path,) = [p for p in self.runs.iterdir() if p.name.startswith(f"{name}-")]
        return path

    def record(self, name: str) -> dict[str, Any]:
        return json.loads((self.run_dir(name) / "record.json").read_text())

    def trainer_processes(self, run_id: str) -> dict[int, str]:
        """Return host -> the processes of the run still alive there (empty string: none)."""
        probe = (
            f"for f in /proc/[0-9]*/environ; do grep -qs 'MIFT_AGENT_KEY={run_id}@' $f && "
            "cat ${f%/environ}/cmdline | tr '\\0' ' ' && echo; done; "
            "pgrep -af '[t]orchrun|[l]lamafactory' || true"  # brackets: never match this probe itself
        )
        return {i: self.rig.ssh(i, probe).stdout.strip() for i in (1, 2)}

    def wait_no_trainers(self, run_id: str, seconds: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            if not any(self.trainer_processes(run_id).values()):
                return time.monotonic() - t0
            time.sleep(1)
        raise AssertionError(f"trainer processes left after {seconds} s: {self.trainer_processes(run_id)}")


@pytest.fixture(scope="module")
def cluster(
    rig_module_factory: Callable[..., Any], rig_lib: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """2 test hosts of rig 5, provisioned by provision.yml with the test-double vars and the tiny model.

    ``LAUNCHER_E2E_REUSE=1`` (development only) takes the rig as it is: already up and provisioned.
    ``LAUNCHER_E2E_KEEP_RIG=1`` brings it up and provisions it as usual but leaves it up afterwards, for the
    faults suite to reuse (``FAULTS_RIG_ID``, ``FAULTS_KEEP_RIG``); whoever sets it takes it down.
    """
    work = tmp_path_factory.mktemp("launcher-e2e")
    runs = work / "runs"
    runs.mkdir()
    if os.environ.get("LAUNCHER_E2E_REUSE") == "1":
        yield Cluster(rig_lib.Rig(rig_id=RIG_ID, hosts=2), runs, work)
        return
    if KEEP_RIG:  # up as usual, but no teardown: the faults stage takes it over
        rig_lib.rig_ready_or_skip()
        rig = rig_lib.Rig(rig_id=RIG_ID, hosts=2)
        rig.down(purge=True)
        rig.up()
    else:
        rig = rig_module_factory(RIG_ID, 2)
    rig_lib.provision(rig, rig_lib.make_tiny_model(work / "tiny-llama"))
    yield Cluster(rig, runs, work)


def assert_succeeded(cluster: Cluster, name: str, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    rec = cluster.record(name)
    run = cluster.run_dir(name)
    assert rec["status"] == "succeeded"
    assert rec["summary"]["world_size"] == 2, rec["nodes"]
    assert rec["master_addr"] == cluster.rig.ip(1) and rec["node_env"]["host2"]["NODE_RANK"] == "1"
    assert rec["node_env"]["host1"]["MASTER_PORT"] == rec["node_env"]["host2"]["MASTER_PORT"]
    losses = [json.loads(line).get("loss") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x for x in losses if isinstance(x, float)], losses
    assert any(p.endswith("adapter_model.safetensors") for p in rec["outputs"]["host1"])
    assert (run / "loss.png").stat().st_size > 1000
    for host in ("host1", "host2"):
        assert (run / "nodes" / host / "trainer.log").stat().st_size > 0
    assert "final loss" in out.stdout
    status = cluster.launcher("status", rec["run_id"])
    assert status.returncode == 0 and "succeeded" in status.stdout


def test_lora_sft_zero3_two_nodes(cluster: Cluster) -> None:
    out = cluster.launcher("run", str(cluster.job("e2e-z3")), "-i", str(cluster.rig.inventory))
    assert_succeeded(cluster, "e2e-z3", out)


def test_lora_sft_zero3_offload_two_nodes(cluster: Cluster) -> None:
    out = cluster.launcher(
        "run", str(cluster.job("e2e-z3off", "ds_z3_offload.json")), "-i", str(cluster.rig.inventory)
    )
    assert_succeeded(cluster, "e2e-z3off", out)


def _wait_first_step(cluster: Cluster, name: str, proc: subprocess.Popen[str] | None = None) -> str:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"launcher ended early: {proc.stdout.read() if proc.stdout else ''}")
        try:
            rec = cluster.record(name)
        except (ValueError, OSError):
            rec = {}
        last = (rec.get("nodes") or {}).get("host1", {}).get("last_log") or {}
        if last.get("current_steps"):
            return str(rec["run_id"])
        time.sleep(1)
    raise AssertionError("no logged step within 600 s")


def test_killed_trainer_fails_and_stops_everywhere(cluster: Cluster) -> None:
    proc = cluster.start(
        "run", str(cluster.job("e2e-kill", max_steps=2000)), "-i", str(cluster.rig.inventory)
    )
    run_id = _wait_first_step(cluster, "e2e-kill", proc)
    pid = json.loads(cluster.rig.ssh(2, f"cat /var/lib/mift/runs/{run_id}/state.json").stdout)["pid"]
    cluster.rig.ssh(2, f"kill -9 -- -{pid}")  # the trainer's whole process group (torchrun's ranks survive)
    took = cluster.wait_no_trainers(run_id, 30)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    rec = cluster.record("e2e-kill")
    assert rec["status"] == "failed", rec["timeline"]
    assert rec["result_reason"].startswith("host2: trainer"), rec["result_reason"]
    for host in ("host1", "host2"):
        assert (cluster.run_dir("e2e-kill") / "nodes" / host / "trainer.log").stat().st_size > 0
    print(f"no trainer left {took:.1f} s after the kill")


def test_ctrl_c_while_following_stops_everywhere(cluster: Cluster) -> None:
    proc = cluster.start(
        "run", str(cluster.job("e2e-sigint", max_steps=2000)), "-i", str(cluster.rig.inventory)
    )
    run_id = _wait_first_step(cluster, "e2e-sigint", proc)
    proc.send_signal(signal.SIGINT)
    took = cluster.wait_no_trainers(run_id, 30)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    assert cluster.record("e2e-sigint")["status"] == "stopped"
    assert (cluster.run_dir("e2e-sigint") / "nodes" / "host2" / "trainer.log").is_file()
    print(f"no trainer left {took:.1f} s after Ctrl-C")


def test_stop_on_detached_run(cluster: Cluster) -> None:
    out = cluster.launcher(
        "run", str(cluster.job("e2e-detach", max_steps=2000)), "-i", str(cluster.rig.inventory), "--detach"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = _wait_first_step_via_status(cluster, "e2e-detach")
    t0 = time.monotonic()
    stop = cluster.launcher("stop", run_id)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    cluster.wait_no_trainers(run_id, max(1.0, 30 - (time.monotonic() - t0)))
    assert cluster.record("e2e-detach")["status"] == "stopped"
    assert (cluster.run_dir("e2e-detach") / "nodes" / "host1" / "trainer.log").stat().st_size > 0
    assert cluster.launcher("status", run_id).returncode == 1


def _wait_first_step_via_status(cluster: Cluster, name: str) -> str:
    run_id = str(cluster.record(name)["run_id"])
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        cluster.launcher("status", run_id)
        last = (cluster.record(name).get("nodes") or {}).get("host1", {}).get("last_log") or {}
        if last.get("current_steps"):
            return run_id
        time.sleep(2)
    raise AssertionError("no logged step within 600 s")


@pytest.mark.skipif(not SEED_JSON.exists(), reason="seed JSON not available")
def test_validate_seed_json_names_the_key(cluster: Cluster) -> None:
    out = cluster.launcher("validate", str(SEED_JSON))
    assert out.returncode == 2
    assert "stage3_parition_grads" in out.stdout + out.stderr
