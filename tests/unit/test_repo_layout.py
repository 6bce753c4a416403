"""Where the launcher finds its files from a checkout: the playbooks it runs are package data, and the Ansible
settings it hands ansible-runner resolve their relative paths (the default inventory: the demo cluster, which
`tools/demo` runs without -i) against the checkout, not against the package's link to the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.spec.repo import ANSIBLE_CFG, CHECKOUT, PLAYBOOK_DIR


def test_a_checkout_uses_its_own_ansible_cfg_and_the_demo_inventory(tmp_path: Path) -> None:
    assert CHECKOUT is not None and ANSIBLE_CFG == CHECKOUT / "ansible.cfg"
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-config"), "dump", "--only-changed"],
        env={**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE_CFG), "ANSIBLE_HOME": str(tmp_path)},
        cwd=tmp_path,  # not the checkout: the launcher runs from any directory
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    hosts = next(line for line in out.splitlines() if line.startswith("DEFAULT_HOST_LIST("))
    assert hosts.endswith(f"['{CHECKOUT / 'inventory' / 'demo' / 'hosts.yml'}']"), hosts


def test_the_launcher_playbooks_are_package_data_and_the_package_carries_the_settings() -> None:
    assert CHECKOUT is not None  # the tests run from a checkout
    names = {p.stem for p in PLAYBOOK_DIR.glob("*.yml")}
    assert {
        "preflight",
        "launch",
        "poll",
        "poll_stream",
        "stop",
        "collect",
        "stage",
        "check_allreduce",
        "check_gpu",
    } <= names
    assert not (CHECKOUT / "playbooks" / "poll.yml").exists()  # the repository's playbooks: provisioning only
    assert (
        PLAYBOOK_DIR.parent / "ansible.cfg"
    ).read_text() == ANSIBLE_CFG.read_text()  # what the wheel carries
