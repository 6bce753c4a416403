"""Where the launcher's own files are and where it keeps its state.

Playbooks named ``playbooks/NAME.yml`` in the package's docstrings are these, not the repository's
``playbooks/`` (provisioning).

Its playbooks are package data (``launcher/playbooks``), so an installed launcher (``pip install`` of the
wheel) finds them from any directory. Its Ansible settings are the repository's ``ansible.cfg`` (the wheel
carries a copy as ``launcher/ansible.cfg``; in a checkout that is a link, and the checkout's file is used).

State: run directories and Ansible's own state. From a checkout (``provision.yml`` two levels above the
package) they stay in the checkout, as the README's commands expect: ``runs/``, ``.ansible/``, and the default
inventory is the one ``ansible.cfg`` names (the demo cluster). An installed launcher keeps them under
``$XDG_STATE_HOME/mift`` (``~/.local/state/mift``) and has no default inventory: ``-i`` names one.
``MIFT_RUNS_DIR`` moves the run directories in either case.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # launcher/, this module being launcher/spec/repo.py
PLAYBOOK_DIR = PACKAGE_DIR / "playbooks"


def _checkout() -> Path | None:
    root = PACKAGE_DIR.parents[1]
    return root if (root / "provision.yml").is_file() and (root / "ansible.cfg").is_file() else None


# the repository checkout the launcher runs from (None: an installed launcher)
CHECKOUT = _checkout()
# the checkout's own file, not the package's link to it: Ansible resolves the relative paths in it (the
# default inventory, roles_path) against the folder of the path it is given, without following the link
ANSIBLE_CFG = CHECKOUT / "ansible.cfg" if CHECKOUT else PACKAGE_DIR / "ansible.cfg"
STATE_DIR = CHECKOUT or Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "mift"
ANSIBLE_HOME = STATE_DIR / ".ansible"
# ssh's control sockets: not under STATE_DIR (a checkout's path can be long; a socket path is at most 107
# bytes: "unix_listener: ... too long for Unix domain socket"); ansible.cfg's control_path_dir: the same
SSH_CONTROL_DIR = Path.home() / ".ansible" / "cp"
