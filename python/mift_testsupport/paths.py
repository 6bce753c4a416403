"""Where things are: the repository this package belongs to and the test rig's files."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RIG = REPO_ROOT / "tools" / "testhosts" / "rig"
RIG_HOME = Path(os.environ.get("RIG_HOME") or REPO_ROOT / ".rig")
ANSIBLE_CFG = REPO_ROOT / "ansible.cfg"
TINY_MODEL_SCRIPT = REPO_ROOT / "tools" / "make_tiny_model.py"
