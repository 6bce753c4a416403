"""``provision.yml`` on test hosts: the test-double variables, the tiny model, the playbook run, its recap."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mift_testsupport.paths import REPO_ROOT, RIG_HOME, TINY_MODEL_SCRIPT
from mift_testsupport.proc import ansible_bin, run

if TYPE_CHECKING:
    import subprocess

    from mift_testsupport.rig import Rig

# What provision.yml needs on test hosts: the AMD repository test double the rig serves, no kernel steps, no
# host settings applied, the CPU backend (the switches of inventory/demo/group_vars/all.yml).
TEST_DOUBLE_VARS: dict[str, Any] = {
    "rocm_repo_base_url": "http://controller:8080/amd",
    # the test double's throwaway key: the rocm role refuses a key whose fingerprint is not listed
    "rocm_apt_key_fingerprints": [
        f"{{{{ lookup('ansible.builtin.file', '{RIG_HOME / 'repo/amd/rocm/rocm.gpg.key.fingerprint'}') }}}}"
    ],
    "rocm_manage_kernel": False,
    "host_tuning_apply": False,
    "pytorch_backend": "cpu",
}
RECAP_RE = re.compile(
    r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.MULTILINE
)


TINY_MODEL = REPO_ROOT / ".cache" / "tiny-llama"


def make_tiny_model(dest: Path) -> Path:
    """Write the tiny LLaMA model (tools/make_tiny_model.py) to ``dest`` unless it is there; return it.

    The model is made in a folder next to ``dest`` and renamed: a suite running at the same time never sees
    half a model.
    """
    if not (dest / "config.json").exists():
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        run([sys.executable, str(TINY_MODEL_SCRIPT), str(tmp)], timeout=600)
        try:
            tmp.rename(dest)
        except OSError:  # made meanwhile by another suite (the script is deterministic): keep that one
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def tiny_model() -> Path:
    """The tiny model every suite ships (``.cache/tiny-llama``), made once."""
    TINY_MODEL.parent.mkdir(parents=True, exist_ok=True)
    return make_tiny_model(TINY_MODEL)


def provision_argv(inventory: Path, model: Path, *extra_args: str) -> list[str]:
    """The ``ansible-playbook provision.yml`` command for test hosts (run it from the repository root)."""
    extra = {**TEST_DOUBLE_VARS, "train_configs_model_src": str(model)}
    return [
        ansible_bin("ansible-playbook"),
        "provision.yml",
        "-i",
        str(inventory),
        "-e",
        json.dumps(extra),
        *extra_args,
    ]


def provision(
    rig: Rig, model: Path, *, log: Path | None = None, timeout: float = 3600
) -> subprocess.CompletedProcess[str]:
    """Run provision.yml on the rig with the test-double switches and ``model``; assert that it passed.

    The playbook's output goes to ``log`` when given.
    """
    out = run(
        provision_argv(rig.inventory, model),
        env=rig.env(),
        cwd=REPO_ROOT,
        timeout=timeout,
        check=False,
    )
    if log is not None:
        log.write_text(out.stdout + out.stderr)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    return out


def recap(text: str) -> dict[str, dict[str, int]]:
    """Return host -> {ok, changed, unreachable, failed} from an ansible-playbook PLAY RECAP."""
    return {
        m[0]: {"ok": int(m[1]), "changed": int(m[2]), "unreachable": int(m[3]), "failed": int(m[4])}
        for m in RECAP_RE.findall(text)
    }


def is_provisioned(rig: Rig) -> bool:
    """Return True when every host of the rig has the node venv and the stack fact (provision.yml ran)."""
    probe = "test -x /opt/mift/venv/bin/llamafactory-cli && test -s /etc/ansible/facts.d/mift_stack.fact"
    return all(rig.ssh(h, probe, check=False).returncode == 0 for h in range(1, rig.hosts + 1))
