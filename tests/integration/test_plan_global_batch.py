"""``plan: auto`` keeps the global batch: on 2 provisioned test hosts (cpu backend, tiny model, same seed).

The same job runs twice: the training YAML as written (micro-batch 1 x accumulation 4 x 2 nodes = 8 samples
per optimizer step, DeepSpeed ZeRO-3 pinned by the job spec) and with ``plan: auto``, whose plan re-splits
those 8 samples (the planner chooses fewer, larger micro-batches under ZeRO-3). Shows: both trainers report
the same total train batch size (8) and reach the same epoch at every optimizer step (the same samples per
step), and their losses agree within 2% at each of the 20 steps.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import pytest

from mift_testsupport.cluster import Cluster, JobBase
from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.image import SYSTEMD, provisioned_rig
from mift_testsupport.provision import TINY_MODEL
from mift_testsupport.rig import rig_id_from_env

if TYPE_CHECKING:
    from collections.abc import Iterator

RIG_ID = rig_id_from_env("PLAN_RIG_ID", 8)
pytestmark = [pytest.mark.rig, pytest.mark.slow]
STEPS = 20
TRAIN = {
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 4,
    "seed": 42,
    "logging_steps": 1,
    "lr_scheduler_type": "constant",
}
TOTAL_BATCH_RE = re.compile(r"Total train batch size \(w\. parallel, distributed & accumulation\) = (\d+)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """2 hosts of rig ``PLAN_RIG_ID`` (8) from the provisioned image; torn down after the module."""
    rig_ready_or_skip(systemd=SYSTEMD)
    work = tmp_path_factory.mktemp("plan-global-batch")
    with provisioned_rig(RIG_ID, 2, log=work / "image-provision.log") as rig:
        yield Cluster(rig, work, base=JobBase(train_overrides=TRAIN))


def _run(cluster: Cluster, name: str, **spec: Any) -> dict[str, Any]:
    out = cluster.run("run", str(cluster.job(name, max_steps=STEPS, **spec)), "-i", str(cluster.inventory))
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    record = cluster.record(name)
    assert record["status"] == "succeeded"
    run = cluster.run_dir(name)
    entries = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [e for e in entries if isinstance(e.get("loss"), float)]
    log = (run / "nodes" / "host1" / "trainer.log").read_text(errors="replace")
    totals = TOTAL_BATCH_RE.findall(log)
    return {"record": record, "steps": steps, "total_batch": totals, "stdout": out.stdout}


def test_auto_plan_keeps_the_samples_per_step_and_the_losses(cluster: Cluster) -> None:
    as_written = _run(cluster, "plan-as-written", plan="as_written")
    auto = _run(cluster, "plan-auto", plan="auto", plan_model_config=str(TINY_MODEL))

    plan = auto["record"]["plan"]
    assert plan["mode"] == "auto" and plan["global_batch"] == 8
    split = (plan["choice"]["micro_batch"], plan["choice"]["gradient_accumulation_steps"])
    assert split != (1, 4), "the plan should re-split the batch for this test to mean something"
    assert split[0] * split[1] * 2 == 8
    assert "plan: auto: " in auto["stdout"]
    assert as_written["record"]["plan"] == {"mode": "as_written"}

    # the same samples per optimizer step: the trainers' own count, and the same epoch reached at every step
    assert as_written["total_batch"] == ["8"] and auto["total_batch"] == ["8"]
    assert len(as_written["steps"]) == len(auto["steps"]) == STEPS
    assert [s["epoch"] for s in as_written["steps"]] == [s["epoch"] for s in auto["steps"]]

    # the same losses, within 2%, at every one of the 20 steps
    pairs = [(a["loss"], b["loss"]) for a, b in zip(as_written["steps"], auto["steps"], strict=True)]
    worst = max(abs(a - b) / abs(a) for a, b in pairs)
    # what the issue asks to show (pytest -s prints it)
    print(
        "\nas written: micro-batch 1 x accumulation 4 x 2 nodes, total train batch "
        f"{as_written['total_batch']}"
        f"\nplan: auto: micro-batch {split[0]} x accumulation {split[1]} x 2 nodes, total train batch "
        f"{auto['total_batch']}\nepochs per step equal: {len(pairs)} steps; losses (as written, auto) step 1 "
        f"{pairs[0]}, step {len(pairs)} {pairs[-1]}; worst relative difference {worst:.4%}"
    )
    assert worst <= 0.02, pairs
