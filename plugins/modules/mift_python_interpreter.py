#!/usr/bin/python
"""Ansible module: decide which interpreter builds the node venv and which apt packages provide it."""
# ruff: noqa: E402 - Ansible module layout: DOCUMENTATION/EXAMPLES/RETURN come before the imports

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mift_python_interpreter
short_description: Choose the node venv's interpreter per distribution and release
description:
  - Looks up O(distribution) and O(release) in the table of the C(mift_python_choice) module_utils
    (Ubuntu jammy = python3.11 from jammy-updates, Ubuntu noble and Debian bookworm = the system python3).
  - An explicit O(python) overrides the table on any release; O(apt_packages) then lists what provides it.
  - Fails with one line on a release the table does not know when no override is given.
  - Changes nothing, so it runs in check mode.
options:
  distribution:
    description: C(ansible_facts['distribution']), e.g. Ubuntu.
    type: str
    required: true
  release:
    description: C(ansible_facts['distribution_release']), e.g. jammy.
    type: str
    required: true
  python:
    description: Interpreter path that overrides the table; empty uses the table.
    type: str
    default: ""
  apt_packages:
    description: Packages that provide the interpreter; empty uses the table's (none for an override).
    type: list
    elements: str
    default: []
author: mift
"""

EXAMPLES = r"""
- name: Choose the interpreter of the venv
  mift_python_interpreter:
    distribution: "{{ ansible_facts['distribution'] }}"
    release: "{{ ansible_facts['distribution_release'] }}"
  register: __python_env_choice
"""

RETURN = r"""
python:
  description: Interpreter that builds the venv.
  type: str
  returned: success
  sample: /usr/bin/python3.11
version:
  description: Python major.minor the table expects at that path (empty for an override).
  type: str
  returned: success
  sample: "3.11"
apt_packages:
  description: Packages that provide the interpreter, its venv module and its headers.
  type: list
  elements: str
  returned: success
  sample: [python3.11, python3.11-venv, python3.11-dev]
source:
  description: Where the packages come from.
  type: str
  returned: success
minimum:
  description: Oldest Python the stack accepts (major.minor).
  type: str
  returned: success
  sample: "3.11"
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mift.cluster.plugins.module_utils.mift_python_choice import (
    MIN_PYTHON,
    UnsupportedPlatformError,
    choose,
    version_text,
)


def main() -> None:
    """Run the module."""
    module = AnsibleModule(
        argument_spec={
            "distribution": {"type": "str", "required": True},
            "release": {"type": "str", "required": True},
            "python": {"type": "str", "default": ""},
            "apt_packages": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params: dict[str, Any] = module.params
    result: dict[str, Any] = {"changed": False, "minimum": version_text(MIN_PYTHON)}
    if params["python"]:
        result.update(
            python=params["python"],
            version="",
            apt_packages=list(params["apt_packages"]),
            source="python_env_python (set by the inventory)",
        )
        module.exit_json(**result)
    try:
        choice = choose(params["distribution"], params["release"])
    except UnsupportedPlatformError as exc:
        module.fail_json(msg=str(exc), **result)
    result.update(
        python=choice.python,
        version=choice.version,
        apt_packages=list(params["apt_packages"]) or list(choice.apt_packages),
        source=choice.source,
    )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
