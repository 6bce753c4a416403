"""Where the launcher's repository files are: the playbooks and the ``ansible.cfg`` they run with."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK_DIR = REPO_ROOT / "playbooks"
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"
