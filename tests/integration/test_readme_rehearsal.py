"""README's "On a real cluster", line by line, as a new user runs it, against 2 fresh test hosts.

The lines are read from README at test time and run with bash in a copy of this checkout (so that
``inventory/mycluster`` and the stand-in's edits never touch the tree). What differs from a user's, and why
(each printed by the test):

- ``tools/bootstrap``: not run (it is tested on its own); the copy's ``.venv`` is this venv.
- the inventory: ``inventory/example`` copied by README's own ``cp`` line, then only the edits README's
  comment names: hosts and ``train_address`` (the test hosts' addresses), ``rocm_version`` (the release the
  hosts carry), users (root), and how the controller reaches the hosts (the rig's key and ssh options).
- ``provision.yml`` gets the test-double switches (``-e``: the AMD repository stand-in, no kernel steps, no
  host settings, the CPU backend) that every provisioning of test hosts gets. The hosts start from the
  provisioned host image (``python -m mift_testsupport.image``), so README's provisioning line is a re-run
  that brings them to this checkout's inputs.
- the hub is the stand-in (``mift_testsupport.hub_testdouble``, TEST DOUBLE) serving the tiny model under the
  70B job's gated id, reached through ``HF_ENDPOINT``; ``HF_TOKEN`` is set on the controller only.
- ``run``: the CPU test hosts cannot run the 70B job's GPU settings, so before README's ``run`` line (after
  ``validate`` and ``plan`` ran on the job as shipped) the job spec gets ``CPU_JOB`` and its training YAML
  ``CPU_TRAIN``: the model and the dataset, their staging and everything else stay as shipped.

    RIG_HOME=... REHEARSAL_RIG_ID=32 pytest -q -s tests/integration/test_readme_rehearsal.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from mift_testsupport import proc
from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.hub_testdouble import HubState, Repo, serving
from mift_testsupport.image import SYSTEMD, provisioned_rig
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.provision import TEST_DOUBLE_VARS, tiny_model
from mift_testsupport.rig import rig_id_from_env

if TYPE_CHECKING:
    from mift_testsupport.rig import Rig

RIG_ID = rig_id_from_env("REHEARSAL_RIG_ID", 5)
pytestmark = [pytest.mark.rig, pytest.mark.slow]
JOB = "configs/jobs/llama3-70b-lora-z3.yaml"
HUB_ID = "meta-llama/Meta-Llama-3-70B-Instruct"
TOKEN = "hf_rehearsalSECRET" + "7f3a9c2e5b1d"
# the job spec's settings a CPU test host needs instead of the MI300X ones (the stand-in's only job edits)
CPU_JOB: dict[str, Any] = {
    "nproc_per_node": 1,
    "env": {"OMP_NUM_THREADS": 1, "DS_ACCELERATOR": "cpu"},
    "fabric": {"transport": "auto"},  # no RDMA on the test hosts
    "min_free_disk_gb": 1,
    "train_config": "../train/llama3_70b_lora_sft_ds3.cpu.yaml",
}
CPU_TRAIN: dict[str, Any] = {
    "bf16": False,
    "template": "default",  # the tiny model's tokenizer has no llama3 special tokens
    "cutoff_len": 64,
    "preprocessing_num_workers": 1,
    "dataloader_num_workers": 0,
    "gradient_accumulation_steps": 1,
    "max_steps": 4,
    "save_steps": 2,
    "logging_steps": 1,
}
CPU_TRAIN_DROP = ("flash_attn",)
NODE_DIRS = (
    "/var/lib/mift /opt/mift /root /etc /tmp /var/tmp /var/log"  # where a token could be left on a node
)


def readme_lines() -> list[str]:
    """The commands of README's "On a real cluster" block, in order."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## On a real cluster", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "README: no bash block under 'On a real cluster'"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def copy_checkout(dest: Path) -> Path:
    """The checkout's files (tracked and untracked, not ignored) in ``dest``, with this venv as ``.venv``."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in names:
        if not raw:
            continue
        src = REPO_ROOT / raw.decode()
        target = dest / raw.decode()
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, target)
    venv = Path(sys.prefix)  # this interpreter's venv (a symlink to its python resolves out of it)
    (dest / ".venv").symlink_to(venv)
    return dest


def edit_inventory(copy: Path, rig: Rig) -> list[str]:
    """README's edits to the copied inventory: hosts, train_address, rocm_version, users (+ ssh reach)."""
    inv = copy / "inventory" / "mycluster"
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())
    trainers = hosts["all"]["children"]["trainers"]["hosts"]
    for i, name in enumerate(sorted(trainers), start=1):
        trainers[name]["ansible_host"] = rig.ip(i)
        trainers[name]["train_address"] = rig.ip(i)
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts, sort_keys=False))
    rig_vars = yaml.safe_load(rig.inventory.read_text())["all"]["vars"]
    defaults = yaml.safe_load((copy / "roles" / "mift_defaults" / "defaults" / "main.yml").read_text())
    group = (inv / "group_vars" / "all.yml").read_text()
    edits = {
        "ansible_user": "root",
        "rocm_users": ["root"],
        "rocm_version": str(defaults["mift_defaults_rocm_version"]),  # what the image's hosts carry
        "ansible_ssh_private_key_file": rig_vars["ansible_ssh_private_key_file"],
        "ansible_ssh_common_args": rig_vars["ansible_ssh_common_args"],
        "ansible_python_interpreter": rig_vars["ansible_python_interpreter"],
    }
    for key, value in edits.items():
        line = f"{key}: {json.dumps(value)}"
        group, n = re.subn(rf"(?m)^{key}:.*$", line, group)
        if not n:
            group += line + "\n"
    (inv / "group_vars" / "all.yml").write_text(group)
    return [f"{k}={v}" for k, v in edits.items()] + [
        f"{n}: ansible_host/train_address {rig.ip(i)}" for i, n in enumerate(sorted(trainers), start=1)
    ]


def cpu_job(copy: Path) -> None:
    """The job spec's and its training YAML's CPU settings (``CPU_JOB``, ``CPU_TRAIN``): model, data, stage
    untouched."""
    spec_path = copy / JOB
    spec = yaml.safe_load(spec_path.read_text())
    train_path = (spec_path.parent / spec["train_config"]).resolve()
    train = yaml.safe_load(train_path.read_text())
    train.update(CPU_TRAIN)
    for key in CPU_TRAIN_DROP:
        train.pop(key, None)
    (spec_path.parent / CPU_JOB["train_config"]).write_text(yaml.safe_dump(train, sort_keys=False))
    spec.update({k: v for k, v in CPU_JOB.items() if k != "env"})
    spec["env"] = {**spec.get("env", {}), **CPU_JOB["env"]}
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Any:
    rig_ready_or_skip(systemd=SYSTEMD)
    work = tmp_path_factory.mktemp("rehearsal-image")
    with provisioned_rig(RIG_ID, 2, log=work / "image-provision.log", stale_ok=True) as r:
        yield r


def test_readme_real_cluster_lines_run_as_written(rig: Rig, tmp_path: Path) -> None:
    copy = copy_checkout(tmp_path / "checkout")
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    state = HubState()
    state.add(Repo.from_folder(HUB_ID, tiny_model(), gated=True, granted={TOKEN}))
    log: list[str] = []
    with serving(state) as hub:
        env = {
            **rig.env(),
            "PATH": f"{copy / '.venv' / 'bin'}:{os.environ['PATH']}",
            "PYTHONPATH": str(copy / "python"),
            "MIFT_RUNS_DIR": str(runs),
            "MIFT_CACHE_DIR": str(cache),
            "HF_ENDPOINT": hub.url,
            "HF_TOKEN": TOKEN,
            "HF_HOME": str(tmp_path / "hf-home"),
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("ANSIBLE_CONFIG", None)  # the copy's ansible.cfg, as in a user's checkout
        for line in readme_lines():
            command = line.split("#", 1)[0].strip()
            if command.startswith("tools/bootstrap"):
                log.append(f"$ {line}\n(not run: tools/bootstrap is tested on its own; .venv is this venv)")
                continue
            if command.startswith("ansible-playbook") and "provision.yml" in command:
                extra = tmp_path / "testdouble-vars.json"
                extra.write_text(json.dumps(TEST_DOUBLE_VARS))
                command += f" -e @{extra}"
            if " launcher run " in f" {command} ":
                cpu_job(copy)
                log.append(f"(the stand-in's CPU settings: job spec {CPU_JOB}, training YAML {CPU_TRAIN})")
            t0 = time.monotonic()
            done = proc.run(["bash", "-c", command], env=env, cwd=copy, timeout=3000, check=False, stdin=None)
            took = time.monotonic() - t0
            output = (done.stdout + done.stderr).rstrip()
            shown = output if len(output) < 6000 else output[:1500] + "\n[...]\n" + output[-3500:]
            log.append(f"$ {command}\n{shown}\n(exit {done.returncode}, {took:.0f} s)")
            print(log[-1], flush=True)
            assert done.returncode == 0, f"{command}: exit {done.returncode}\n{output[-3000:]}"
            if command.startswith("cp -r inventory/example"):
                log.append("(README's inventory edits) " + "; ".join(edit_inventory(copy, rig)))
                print(log[-1], flush=True)
    (tmp_path / "rehearsal.log").write_text("\n\n".join(log) + "\n")
    record_path = next(runs.glob("llama3-70b-lora-z3-*/record.json"))
    record = json.loads(record_path.read_text())
    assert record["status"] == "succeeded", record.get("error")
    assert len(record["hosts"]) == 2
    model = next(i for i in record["staging"]["items"] if i["key"] == "model")
    assert model["kind"] == "hub" and model["hub"]["repo"] == HUB_ID and model["hub"]["endpoint"] == hub.url
    manifest = json.loads((record_path.parent / "staging" / "model.manifest.json").read_text())
    assert "model.safetensors" in manifest["manifest"]
    print("record staging:", json.dumps(record["staging"]["items"], indent=1))
    print("model manifest:", json.dumps(manifest["manifest"], indent=1))
    # the token: in no file of the run directory, the controller's caches, the launcher's output, the nodes
    found = subprocess.run(
        ["grep", "-rlF", TOKEN, str(runs), str(cache), str(tmp_path / "rehearsal.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    print(f"$ grep -rlF <token> {runs} {cache} rehearsal.log -> exit {found.returncode} {found.stdout!r}")
    assert found.returncode == 1, found.stdout
    for host in (1, 2):
        on_node = rig.ssh(
            host,
            f"grep -rlF {TOKEN} {NODE_DIRS} 2>/dev/null; true",
        )
        print(f"host{host}: grep -rlF <token> {NODE_DIRS} -> {on_node.stdout!r}")
        assert on_node.stdout.strip() == ""
    assert [r for r in state.requests if r[0] == "GET" and "/lfs-objects/" in r[1]], (
        "the weights came from the hub"
    )
