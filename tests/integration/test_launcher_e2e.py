"""The launcher end to end on 2 provisioned test hosts (cpu backend, the tiny model).

The hosts start from the provisioned host image (``provision.yml`` run once per CI run, see
``mift_testsupport.image``): this suite tests the launcher, not provisioning.

Shows: LoRA SFT with DeepSpeed ZeRO-3 across 2 nodes x ``RANKS_PER_HOST`` (2) ranks (the first run of the
staged pair), and with ZeRO-3 + CPU offload (its second run: world size 4, losses in the metrics, adapter
saved, status succeeded, loss PNG, each rank's log in ``nodes/<host>/``: ``assert_succeeded``, for both);
killing one node's whole trainer (torchrun's ranks orphaned, swept by the node's supervisor) ends with no
trainer process on either host within 30 s, the cause named and the logs kept; and ``validate`` of the seed
DeepSpeed JSON exits 2 naming the key.

Ctrl-C while following and ``stop`` of a run no launcher follows are the faults suite's (``ctrl-c-follow``,
``launcher-sigkill``, with more asserted) and the local tier's (``test_launcher_local.py``: also
``--detach``); one behaviour is tested once per tier (docs/testing.md "One behaviour, one run per tier").
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import TYPE_CHECKING

import pytest
import yaml

from mift_testsupport.cluster import RANKS_PER_HOST, Cluster, JobBase
from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.image import SYSTEMD, provisioned_rig
from mift_testsupport.launcher import finish
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.provision import tiny_model
from mift_testsupport.rig import rig_id_from_env

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

RIG_ID = rig_id_from_env("LAUNCHER_E2E_RIG_ID", 5)
pytestmark = [pytest.mark.rig, pytest.mark.slow]
SEED_JSON = REPO_ROOT / "tests" / "fixtures" / "bad-configs" / "ds_seed_blog.json"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """2 hosts of rig ``LAUNCHER_E2E_RIG_ID`` (5) from the provisioned image; torn down after the module."""
    rig_ready_or_skip(systemd=SYSTEMD)
    work = tmp_path_factory.mktemp("launcher-e2e")
    with provisioned_rig(RIG_ID, 2, log=work / "image-provision.log") as rig:
        yield Cluster(rig, work, base=JobBase(nproc_per_node=RANKS_PER_HOST))


def assert_succeeded(cluster: Cluster, name: str, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    rec = cluster.record(name)
    run = cluster.run_dir(name)
    assert rec["status"] == "succeeded"
    assert rec["nproc_per_node"] == RANKS_PER_HOST
    assert rec["summary"]["world_size"] == 2 * RANKS_PER_HOST, rec["nodes"]
    assert rec["master_addr"] == cluster.rig.ip(1) and rec["node_env"]["host2"]["NODE_RANK"] == "1"
    assert rec["node_env"]["host1"]["MASTER_PORT"] == rec["node_env"]["host2"]["MASTER_PORT"]
    losses = [json.loads(line).get("loss") for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x for x in losses if isinstance(x, float)], losses
    assert any(p.endswith("adapter_model.safetensors") for p in rec["outputs"]["host1"])
    assert (run / "loss.png").stat().st_size > 1000
    for host in ("host1", "host2"):
        assert (run / "nodes" / host / "trainer.log").stat().st_size > 0
    # one log per rank, named by its global rank: host1 holds ranks 0..R-1, host2 R..2R-1
    logs = sorted(p.relative_to(run).as_posix() for p in run.glob("nodes/*/rank*.stderr.log"))
    ranks = [(host, r) for host in (1, 2) for r in range((host - 1) * RANKS_PER_HOST, host * RANKS_PER_HOST)]
    assert logs == sorted(f"nodes/host{h}/rank{r}.stderr.log" for h, r in ranks), logs
    assert f"[rank{RANKS_PER_HOST} local0]: " in (run / "nodes" / "host2" / "trainer.log").read_text()
    # the global batch counts every rank: micro-batch 1 x accumulation 1 x world size 4
    total = f"Total train batch size (w. parallel, distributed & accumulation) = {2 * RANKS_PER_HOST}"
    assert total in (run / "nodes" / "host1" / "trainer.log").read_text()
    assert "final loss" in out.stdout
    status = cluster.run("status", rec["run_id"])
    assert status.returncode == 0 and "succeeded" in status.stdout


def tokenizing_passes(text: str) -> int:
    """LLaMA-Factory's tokenizing passes in a log: its ``Running tokenizer on dataset`` progress bar, counted
    once per pass (the bar redraws the same description)."""
    return len(re.findall(r"Running tokenizer on dataset[^:\n]*: +0%", text))


def run_passes(cluster: Cluster, name: str) -> dict[str, int]:
    """Where one run tokenized: the tokenize step's node log and each trainer's log -> passes."""
    run = cluster.run_dir(name)
    logs = {f"tokenize/{p.name}": p for p in sorted((run / "tokenize").glob("*.log"))}
    logs |= {f"{host} trainer": run / "nodes" / host / "trainer.log" for host in ("host1", "host2")}
    return {label: tokenizing_passes(path.read_text(errors="replace")) for label, path in logs.items()}


def test_run_stages_model_and_dataset_and_records_their_manifests(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Staging, tokenizing once and merging in a run pair. Run 1: the model and dataset reach both
    nodes, verified, before the start; the record holds their manifests; host1 tokenizes (one pass across the
    2 hosts, host2 gets the copy, neither trainer tokenizes); after it the adapter is merged on host1 and the
    merged model gives the same greedy tokens as base + adapter. Run 2, cutoff_len changed: nothing staged,
    tokenized again, once (docs/launcher.md "Staging", "Tokenize once", "Merge after the run"); it trains
    with ZeRO-3 and CPU offload (configs/deepspeed/ds_z3_offload.json), so that the offload config's run to
    success is this second run, not a run of its own."""
    monkeypatch.setenv("MIFT_TOKENIZED_DIR", str(tmp_path / "tokenized"))  # no other run's copy is found
    data = REPO_ROOT / "configs" / "data" / "tiny_alpaca"
    stage = {"model": {"controller": str(tiny_model())}, "dataset_dir": {"controller": str(data)}}
    job = cluster.job("e2e-stage", max_steps=2, stage=stage)
    train = cluster.work / "configs" / "train" / "e2e-stage.yaml"
    cfg = yaml.safe_load(train.read_text())
    cfg.update(model_name_or_path="/opt/mift/staged/tiny-llama", dataset_dir="/opt/mift/staged/tiny_alpaca")
    train.write_text(yaml.safe_dump(cfg, sort_keys=False))
    out = cluster.run("run", str(job), "-i", str(cluster.inventory))
    print(out.stdout)
    assert_succeeded(cluster, "e2e-stage", out)
    rec = cluster.record("e2e-stage")
    items = {item["key"]: item for item in rec["staging"]["items"]}
    assert items["model"]["dest"] == "/opt/mift/staged/tiny-llama" and items["model"]["files"] == 6
    assert items["dataset_dir"]["digest"].startswith("sha256:") and set(rec["staging"]["sent"]) == {
        "host1",
        "host2",
    }
    kept = json.loads((cluster.run_dir("e2e-stage") / "staging" / "model.manifest.json").read_text())
    assert kept["digest"] == items["model"]["digest"] and "model.safetensors" in kept["manifest"]
    assert "staged  model sha256:" in cluster.run("status", rec["run_id"]).stdout
    # tokenized once: by host1's tokenize step; host2 got the copy; neither trainer tokenized
    passes = run_passes(cluster, "e2e-stage")
    print("tokenizing passes, run 1:", passes)
    assert passes == {"tokenize/host1.log": 1, "host1 trainer": 0, "host2 trainer": 0}, passes
    first = rec["tokenized"]
    assert first["tokenized"] and set(first["sent"]) == {"host2"}, first
    for host in ("host1", "host2"):
        assert f"Loaded tokenized dataset from {first['path']}" in (
            cluster.run_dir("e2e-stage") / "nodes" / host / "trainer.log"
        ).read_text(errors="replace")
    # merged on host1; the smoke check's greedy tokens are the same
    merge = rec["merge"]
    assert merge["status"] == "checked" and merge["same"] and merge["host"] == "host1", merge
    result = json.loads((cluster.run_dir("e2e-stage") / "merge" / "result.json").read_text())
    rows = result["answer"]["prompts"]
    assert rows and all(r["merged"] == r["adapter"] and len(r["merged"]) == 16 for r in rows), rows
    print("smoke check:", json.dumps([{k: r[k] for k in ("merged", "adapter", "base")} for r in rows]))
    assert cluster.ssh(1, f"test -s {merge['dest']}/model.safetensors && echo ok").strip() == "ok"

    # run 2: cutoff_len changed -> a new key: tokenized again, once; nothing staged; no merge asked; ZeRO-3
    # with the optimizer and parameters offloaded to the CPU
    cfg.update(cutoff_len=32)
    train.write_text(yaml.safe_dump(cfg, sort_keys=False))
    spec = yaml.safe_load(job.read_text())
    spec["merge"] = {"enabled": False}
    spec["deepspeed"] = str(cluster.base.deepspeed_dir / "ds_z3_offload.json")
    job.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = cluster.run("run", str(job), "-i", str(cluster.inventory))
    print(out.stdout)
    assert_succeeded(cluster, "e2e-stage", out)
    rec2 = cluster.record("e2e-stage")
    assert rec2["run_id"] != rec["run_id"] and rec2["staging"]["sent"] == {}
    second = rec2["tokenized"]
    assert (
        second["key"] != first["key"]
        and second["tokenized"]
        and second["inputs"]["train"]["cutoff_len"] == 32
    )
    assert "cutoff_len 64 -> 32" in out.stdout
    passes = run_passes(cluster, "e2e-stage")
    print("tokenizing passes, run 2:", passes)
    assert passes == {"tokenize/host1.log": 1, "host1 trainer": 0, "host2 trainer": 0}, passes
    assert "merge" not in rec2


def test_killed_trainer_fails_and_stops_everywhere(cluster: Cluster) -> None:
    # recovery off: this case shows the stop everywhere that ends a run (recovery retries a killed trainer)
    job = cluster.job("e2e-kill", max_steps=2000, paced=True, recovery={"max_restarts": 0})
    proc, log = cluster.start("run", str(job), "-i", str(cluster.inventory))
    run_id = cluster.wait_step(cluster.run_id_of("e2e-kill"), proc)
    pid = json.loads(cluster.rig.ssh(2, f"cat /var/lib/mift/runs/{run_id}/state.json").stdout)["pid"]
    cluster.rig.ssh(2, f"kill -9 -- -{pid}")  # the trainer's whole process group (torchrun's ranks survive)
    took = cluster.wait_no_trainers(30)
    out = finish(proc, log)
    assert proc.returncode == 1, out
    rec = cluster.record("e2e-kill")
    assert rec["status"] == "failed", rec["timeline"]
    assert rec["result_reason"].startswith("host2: trainer"), rec["result_reason"]
    for host in ("host1", "host2"):
        assert (cluster.run_dir("e2e-kill") / "nodes" / host / "trainer.log").stat().st_size > 0
    print(f"no trainer left {took:.1f} s after the kill")


@pytest.mark.skipif(not SEED_JSON.exists(), reason="seed JSON not available")
def test_validate_seed_json_names_the_key(cluster: Cluster) -> None:
    out = cluster.run("validate", str(SEED_JSON))
    assert out.returncode == 2
    assert "stage3_parition_grads" in out.stdout + out.stderr
