"""The failure line names the cause (docs/launcher.md "The failure's cause"): a trainer that fails by itself
ends the run with the first rank's own exception (type, message), the host and rank that raised it first and
the rank log to read, in the launcher's summary, ``status`` and the record; not torchrun's wrapper.

One input that passes validate and preflight and fails only in the trainer: a ``lora_target`` the model
lacks (only PEFT knows the model's modules). A hub id for ``model_name_or_path`` on nodes that are offline by
design (``HF_HUB_OFFLINE=1``: nothing to download, nothing in the cache) failed in the trainer too until
preflight learnt to refuse a hub id that is neither staged nor in the node's cache (#41): it is now refused
in one line before anything starts (the last test). The collected rank logs of both trainer failures are the
fixtures of tests/unit/test_failure_cause.py (tests/fixtures/failure_logs/README.md says how they were made):
set ``MIFT_KEEP_FAILURE_LOGS=DIR`` to copy a case's ``nodes/`` there.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mift_testsupport.cluster import Cluster

pytestmark = [pytest.mark.rig, pytest.mark.slow]

# case -> (the training YAML's edit, what the cause (its message or what it was raised from) names: PEFT's
# ValueError names the module)
CASES = {
    "cause-lora-module-missing": ({"lora_target": "no_such_module"}, "no_such_module"),
}


def _job_with(cluster: Cluster, name: str, edit: dict[str, str]) -> Path:
    """The faults job ``name`` (4 steps) whose training YAML has ``edit`` applied."""
    job = cluster.job(name, max_steps=4)
    train = job.parent / "configs" / "train" / f"{name}.yaml"
    text = train.read_text()
    for key, value in edit.items():
        text = "\n".join(
            f"{key}: {value}" if line.startswith(f"{key}:") else line for line in text.splitlines()
        )
    train.write_text(text + "\n")
    return job


@pytest.mark.parametrize("case", sorted(CASES))
def test_failure_line_names_the_cause(case: str, cluster: Cluster, fault_record: dict[str, Any]) -> None:
    """The trainers fail by themselves: the summary's and status's line name the first rank's exception."""
    edit, named = CASES[case]
    fault_record.update(
        case=case,
        group="2 faults",
        input=f"the training YAML with {edit} (passes validate and preflight; fails in every rank)",
        expected="exit 1; the result line, status and the record name the first rank's exception type and "
        "message, its host and rank and its rank log; not torchrun's ChildFailedError",
    )
    name = f"faults-{case}"
    job = _job_with(cluster, name, edit)
    out = cluster.run("run", str(job), "-i", str(cluster.inventory), timeout=900)
    rec = cluster.record(name)
    status = cluster.run("status", rec.get("run_id", name), timeout=300)
    cause = rec.get("failure_cause") or {}
    fault_record["observed"] = f"launcher exit {out.returncode}; result: {rec.get('result_reason')}"
    print(f"\n{case}:\n" + "\n".join(line for line in out.stdout.splitlines() if "failed" in line))
    keep = os.environ.get("MIFT_KEEP_FAILURE_LOGS")
    if keep:
        target = Path(keep) / case
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(cluster.run_dir(name) / "nodes", target / "nodes")
        (target / "record.json").write_text(json.dumps(rec, indent=2) + "\n")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-2000:]
    assert named in " <- ".join([str(cause.get("message")), *cause.get("causes", [])]), cause
    assert cause.get("type") not in ("ChildFailedError", "CalledProcessError"), cause
    assert cause.get("host") in rec.get("hosts", []), cause
    log = cluster.run_dir(name) / str(cause.get("log"))
    assert log.is_file() and named in log.read_text(errors="replace"), log
    assert str(log) in rec.get("attempts", [{}])[-1].get("cause", ""), rec.get("attempts")
    line = f"{cause['type']}: "
    assert line in rec.get("result_reason", ""), rec.get("result_reason")
    assert line in out.stdout and str(log) in out.stdout, out.stdout[-3000:]
    assert line in status.stdout and str(log) in status.stdout, status.stdout


def test_model_not_on_offline_nodes_refused_before_the_start(
    cluster: Cluster, fault_record: dict[str, Any]
) -> None:
    """A hub id neither staged nor in the nodes' cache: preflight's one line, nothing started (#41)."""
    fault_record.update(
        case="cause-model-not-on-offline-node",
        group="2 faults",
        input="the training YAML with model_name_or_path: mift-faults/no-such-model (a hub id; the nodes run "
        "offline)",
        expected="exit 2 at preflight with one line naming the id, the hosts and what to do; nothing started",
    )
    name = "faults-cause-model-not-on-offline-node"
    job = _job_with(cluster, name, {"model_name_or_path": "mift-faults/no-such-model"})
    out = cluster.run("run", str(job), "-i", str(cluster.inventory), timeout=900)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    fault_record["observed"] = f"launcher exit {out.returncode}: {lines[-1] if lines else '(no line)'}"
    print("\ncause-model-not-on-offline-node:\n" + "\n".join(lines))
    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-2000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "error: host1, host2: model_name_or_path: mift-faults/no-such-model: not staged"
    ), lines
    assert "stage it (stage.model in the job spec); nothing was started" in lines[0], lines
    assert cluster.record(name).get("status") == "rejected"
