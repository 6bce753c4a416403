"""Host keys are checked on real inventories; only the test rig's inventories turn the check off.

ansible.cfg leaves Ansible's host_key_checking on; inventory/example's ssh arguments say StrictHostKeyChecking
accept-new with a known_hosts file next to the inventory, templated by Ansible itself here (the debug module
runs on the controller: no node is contacted); the launcher's staging reaches a node with those same arguments
(launcher.staging.ssh_argv), and ``ssh -G`` (the client's effective configuration, no connection) shows what
ssh will do with them.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.transfer.staging import ssh_argv
from mift_testsupport import proc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "inventory" / "example"


def _ansible_var(inventory: Path, host: str, var: str) -> str:
    ansible = Path(sys.executable).parent / "ansible"
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    argv = [str(ansible), "-i", str(inventory), host, "-m", "ansible.builtin.debug", "-a", f"var={var}", "-o"]
    out = proc.run(argv, env=env, cwd=ROOT, timeout=120, check=True, stdin=None)
    # "mi300x-node01 | SUCCESS => {...}"
    return str(json.loads(out.stdout.split("=>", 1)[1])[var])


def test_ansible_cfg_leaves_host_key_checking_on() -> None:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "ansible.cfg")
    assert cfg.getboolean("defaults", "host_key_checking", fallback=True) is True
    # no host key option in ssh_args: it would come first on ssh's command line and win over an inventory's
    assert "StrictHostKeyChecking" not in cfg.get("ssh_connection", "ssh_args")
    assert "UserKnownHostsFile" not in cfg.get("ssh_connection", "ssh_args")


def test_the_example_inventory_accepts_new_keys_into_its_own_known_hosts() -> None:
    args = _ansible_var(EXAMPLE, "mi300x-node01", "ansible_ssh_common_args")
    assert args == f"-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile={EXAMPLE}/known_hosts"
    # the launcher's staging uses the inventory's ssh arguments as they are
    argv = ssh_argv("ssh", {"host": "192.0.2.11", "user": "ubuntu", "common_args": args})
    assert argv[-1] == "192.0.2.11"
    assert "StrictHostKeyChecking=accept-new" in argv
    assert f"UserKnownHostsFile={EXAMPLE}/known_hosts" in argv


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_ssh_would_check_against_that_file() -> None:
    args = _ansible_var(EXAMPLE, "mi300x-node01", "ansible_ssh_common_args")
    argv = ssh_argv("ssh", {"host": "192.0.2.11", "common_args": args})
    effective = subprocess.run(
        [argv[0], "-G", *argv[1:]], capture_output=True, text=True, timeout=30, check=True
    ).stdout.splitlines()
    assert "stricthostkeychecking accept-new" in effective
    assert f"userknownhostsfile {EXAMPLE}/known_hosts" in effective


def test_only_the_rig_inventories_turn_the_check_off() -> None:
    demo = yaml.safe_load((ROOT / "inventory" / "demo" / "hosts.yml").read_text())["all"]["vars"]
    assert demo["ansible_host_key_checking"] is False
    assert "StrictHostKeyChecking=no" in demo["ansible_ssh_common_args"]
    rig = (ROOT / "tools" / "testhosts" / "rig").read_text()
    assert 'echo "    ansible_host_key_checking: false' in rig
    for inventory in (ROOT / "inventory").iterdir():
        if inventory.name == "demo":
            continue
        text = "".join(p.read_text() for p in inventory.rglob("*.yml"))
        assert "host_key_checking" not in text and "StrictHostKeyChecking=no" not in text, inventory
