#!/usr/bin/python
"""Ansible module: refuse an OpenPGP key file whose primary key is not one of the allowed fingerprints."""
# ruff: noqa: E402 - Ansible module layout: DOCUMENTATION/EXAMPLES/RETURN come before the imports

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mift_pgp_key
short_description: Check the fingerprints of an OpenPGP public key file against an allow-list
description:
  - Reads O(path) (armored or binary), computes the fingerprint of every primary key in it
    (RFC 4880 / RFC 9580, as C(gpg --show-keys --with-colons) prints it) and fails with one line unless each
    one is in O(allowed).
  - Needs no gpg on the host. Changes nothing, so it runs in check mode.
options:
  path:
    description: The downloaded key file.
    type: path
    required: true
  allowed:
    description: Allowed primary key fingerprints (spaces and case are ignored).
    type: list
    elements: str
    required: true
  source:
    description: Where the file came from, for the message (a URL).
    type: str
    default: ""
  missing_ok:
    description: Succeed without a check when O(path) does not exist (check mode before the first download).
    type: bool
    default: false
author: mift
"""

EXAMPLES = r"""
- name: Check the fingerprint of AMD's signing key
  mift_pgp_key:
    path: /etc/apt/keyrings/rocm.asc.download
    allowed: [CA8BB4727A47B4D09B4EE8969386B48A1A693C5C]
    source: https://repo.radeon.com/rocm/rocm.gpg.key
"""

RETURN = r"""
fingerprints:
  description: Primary key fingerprints found in the file.
  type: list
  elements: str
  returned: always
  sample: [CA8BB4727A47B4D09B4EE8969386B48A1A693C5C]
"""

from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mift.cluster.plugins.module_utils.mift_openpgp import (
    KeyFileError,
    normalise,
    primary_fingerprints,
)


def main() -> None:
    """Run the module."""
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "allowed": {"type": "list", "elements": "str", "required": True},
            "source": {"type": "str", "default": ""},
            "missing_ok": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    params: dict[str, Any] = module.params
    path = Path(params["path"])
    where = params["source"] or str(path)
    allowed = [normalise(item) for item in params["allowed"] if item.strip()]
    if not path.is_file() and params["missing_ok"]:
        module.exit_json(changed=False, fingerprints=[], skipped_reason=f"{path} not downloaded (check mode)")
    if not allowed:
        module.fail_json(
            msg=f"no allowed fingerprint for {where}: set rocm_apt_key_fingerprints", fingerprints=[]
        )
    try:
        found = primary_fingerprints(path.read_bytes())
    except (OSError, KeyFileError) as exc:
        module.fail_json(msg=f"{where} is not an OpenPGP public key: {exc}", fingerprints=[])
    refused = [fpr for fpr in found if fpr not in allowed]
    if refused:
        module.fail_json(
            msg=(
                f"{where}: key fingerprint {', '.join(refused)} is not an allowed one "
                f"({', '.join(allowed)}); refusing it (likely cause: a mirror or a man in the middle "
                "serves another key, or AMD rotated its key; fix: compare with AMD's published "
                "fingerprint and add the new one to rocm_apt_key_fingerprints)"
            ),
            fingerprints=found,
        )
    module.exit_json(changed=False, fingerprints=found)


if __name__ == "__main__":
    main()
