"""The callback mift.cluster.progress (plugins/callback/progress.py) through Ansible's callback API: a real
``ansible-playbook`` run on local hosts of a playbook named provision.yml (3 plays: one with a task named as
the DKMS build and a failing host, a rolling one with serial 1, a wheel build), its [progress] lines read
back; the long steps' names; the same playbook under another name prints none."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mift_testsupport import proc

REPO = Path(__file__).resolve().parents[2]
# the plugin imports ansible, whose import patches sys.intern: in this process that breaks a later torch
# import
# (torch._dynamo: "substitute_in_graph expects a function"); its long_step is called in a child process
LONG_STEP = (
    "import sys; sys.path.insert(0, sys.argv[1]); import progress; print(progress.long_step(sys.argv[2], "
    "sys.argv[3]))"
)

PLAYBOOK = """
- name: ROCm driver
  hosts: nodes
  gather_facts: false
  tasks:
    - name: Install amdgpu-dkms and its DKMS build
      ansible.builtin.command: sleep 0.3
      changed_when: true
    - name: Fail on node2
      ansible.builtin.fail:
        msg: node2 has no GPU
      when: inventory_hostname == 'node2'
- name: Rolling reboot
  hosts: nodes
  serial: 1
  gather_facts: false
  tasks:
    - name: Wait a little
      ansible.builtin.command: "true"
      changed_when: false
- name: Node Python stack
  hosts: nodes
  gather_facts: false
  tasks:
    - name: Build DeepSpeed through the wheel cache with ops prebuilt
      ansible.builtin.command: "true"
      changed_when: false
"""
INVENTORY = (
    "nodes:\n  hosts:\n    node1: {}\n    node2: {}\n    node3: {}\n  vars:\n    ansible_connection: local\n"
)


def _run(tmp_path: Path, name: str, playbook: str = PLAYBOOK, rc: int = 2) -> list[str]:
    (tmp_path / name).write_text(playbook)
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / "collections"),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
        "MIFT_PROGRESS_HEARTBEAT_S": "0",
    }
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "hosts.yml", name]
    out = proc.run(argv, cwd=tmp_path, env=env, check=False)
    assert out.returncode == rc, out.stdout[-3000:] + out.stderr[-2000:]  # PLAYBOOK: node2 failed
    return [line for line in out.stdout.splitlines() if line.startswith("[progress] ")]


def test_progress_lines_of_a_provisioning_run(tmp_path: Path) -> None:
    lines = [re.sub(r"elapsed \d:\d\d:\d\d$", "elapsed T", line) for line in _run(tmp_path, "provision.yml")]
    lines = [re.sub(r" in \d:\d\d:\d\d", " in T", line) for line in lines]
    assert lines[0] == "[progress] provision.yml: 3 phases; elapsed T"
    assert lines[1] == "[progress] phase 1/3 'ROCm driver' started: 3 hosts; elapsed T"
    assert lines[2] == (
        "[progress] long step: DKMS build ('Install amdgpu-dkms and its DKMS build') on 3 hosts, phase 1/3; "
        "elapsed T"
    )
    assert sorted(lines[3:6]) == [
        f"[progress] long step done: DKMS build on node{n} (changed) in T; elapsed T" for n in (1, 2, 3)
    ]
    assert "[progress] phase 1/3 'ROCm driver' done: 2/3 hosts, 1 failed (node2) in T; elapsed T" in lines
    # node2 failed: Ansible runs nothing more there, the later phases count 2 hosts; serial 1: a line a batch
    assert "[progress] phase 2/3 'Rolling reboot' started: 2 hosts; elapsed T" in lines
    assert "[progress] phase 2/3 'Rolling reboot' batch 2: 1/2 hosts done so far; elapsed T" in lines
    assert "[progress] phase 2/3 'Rolling reboot' done: 2/2 hosts in T; elapsed T" in lines
    assert (
        "[progress] long step: wheel build ('Build DeepSpeed through the wheel cache with ops prebuilt') on "
        "2 hosts, phase 3/3; elapsed T"
    ) in lines
    assert lines[-1] == "[progress] done: 3 phases, 2/3 hosts ok; elapsed T"


def test_other_playbooks_get_no_progress_lines(tmp_path: Path) -> None:
    assert _run(tmp_path, "site.yml") == []


@pytest.mark.parametrize(
    ("action", "name", "step"),
    [
        ("ansible.builtin.reboot", "Reboot (policy on-upgrade)", "reboot wait"),
        ("ansible.builtin.apt", "Install amdgpu-dkms 6.12.12", "DKMS build"),
        (
            "ansible.builtin.apt",
            "Install the amdgpu driver packages of the configured release 30.10",
            "DKMS build",
        ),
        ("ansible.builtin.command", "Build, cache and fetch the wheel", "wheel build"),
        (
            "ansible.builtin.include_role",
            "Build torch once and install it everywhere, arch gfx942",
            "wheel build",
        ),
        (
            "ansible.builtin.include_tasks",
            "Build flash-attn through the wheel cache, ck backend",
            "wheel build",
        ),
        ("ansible.builtin.command", "Probe DKMS for amdgpu on kernel 6.8.0", None),
        # named like a long step, doing no long work: an argument check, an assert (seen on fresh test hosts)
        (
            "ansible.builtin.validate_argument_spec",
            "Validating arguments against arg spec 'main' - Build flash-attn for ROCm once (CK gfx942)",
            None,
        ),
        ("ansible.builtin.assert", "Assert headers and the DKMS build exist for the booted kernel", None),
        ("ansible.builtin.apt", "Install the CPU build of torch", None),
    ],
)
def test_long_steps_are_named_by_module_or_task_name(action: str, name: str, step: str | None) -> None:
    out = subprocess.run(
        [sys.executable, "-c", LONG_STEP, str(REPO / "plugins" / "callback"), action, name],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == str(step)


# provision.yml's shape: a play name that stands twice (the fingerprint play before each part), a wrapper
# task named as a wheel build (include_tasks returns at once), a play whose group is empty (Slurm off)
def _play(name: str, hosts: str, task: str) -> str:
    """One play of one task, YAML."""
    return f"- name: {name}\n  hosts: {hosts}\n  gather_facts: false\n  tasks:\n    - {task}\n"


LOOK = '{name: Look, ansible.builtin.command: "true", changed_when: false}'
REPEATED = "".join(
    (
        _play("Fingerprint", "nodes", LOOK),
        _play(
            "Node Python stack",
            "nodes",
            "{name: Build torch once and install it everywhere, ansible.builtin.include_tasks: nothing.yml}",
        ),
        _play("Fingerprint", "nodes", LOOK),
        _play("Slurm", "slurm_nodes", LOOK),
    )
)


def test_phases_follow_the_playbook_order_and_say_what_they_skip(tmp_path: Path) -> None:
    (tmp_path / "nothing.yml").write_text("- name: Nothing here\n  ansible.builtin.debug:\n    msg: built\n")
    lines = _run(tmp_path, "provision.yml", REPEATED, rc=0)
    lines = [re.sub(r"( in \d:\d\d:\d\d)?; elapsed \d:\d\d:\d\d$", "", line) for line in lines]
    assert [line for line in lines if "started" in line or "skipped" in line] == [
        "[progress] phase 1/4 'Fingerprint' started: 3 hosts",
        "[progress] phase 2/4 'Node Python stack' started: 3 hosts",
        "[progress] phase 3/4 'Fingerprint' started: 3 hosts",  # its own place, not phase 1 again
        "[progress] phase 4/4 'Slurm': no hosts, skipped",
    ]
    assert (
        "[progress] long step: wheel build ('Build torch once and install it everywhere') on 3 hosts, "
        "phase 2/4" in lines
    )
    assert not [line for line in lines if "long step done" in line]  # the wrapper's 0 s is no build's time
    assert lines[-1] == "[progress] done: 4 phases, 3/3 hosts ok"
