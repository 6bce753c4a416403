#!/usr/bin/python
"""Ansible module: check that an index has each pinned wheel for each node interpreter, before any install."""
# ruff: noqa: E402 - Ansible module layout: DOCUMENTATION/EXAMPLES/RETURN come before the imports

from __future__ import annotations

DOCUMENTATION = r"""
---
module: mift_wheel_check
short_description: Check an index for the pinned wheels of every node interpreter
description:
  - Reads the PEP 503 page C(<index>/<name>/) of each pin once and fails with one line per missing wheel,
    naming the file, the hosts whose interpreter needs it and the versions of that name the index has for
    that interpreter (what to pin instead). Meant to run once, on the controller, before any node installs.
  - Changes nothing, so it runs in check mode.
options:
  index:
    description: Index URL (e.g. https://download.pytorch.org/whl/rocm7.2).
    type: str
    required: true
  pins:
    description: name==version pins.
    type: list
    elements: str
    required: true
  tags_by_host:
    description: Host -> interpreter tag (cp311).
    type: dict
    required: true
author: mift
"""

EXAMPLES = r"""
- name: Check the pinned torch wheels for every node interpreter
  mift_wheel_check:
    index: https://download.pytorch.org/whl/rocm7.2
    pins: [torch==2.11.0+rocm7.2, torchaudio==2.11.0+rocm7.2]
    tags_by_host: {host1: cp311, host2: cp311}
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
missing:
  description: One line per missing wheel.
  type: list
  elements: str
  returned: always
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.mift.cluster.plugins.module_utils.mift_wheel_index import (
    expected_file,
    has_wheel,
    versions_for,
    wheel_files,
)

TIMEOUT_S = 60


def main() -> None:
    """Run the module."""
    module = AnsibleModule(
        argument_spec={
            "index": {"type": "str", "required": True},
            "pins": {"type": "list", "elements": "str", "required": True},
            "tags_by_host": {"type": "dict", "required": True},
        },
        supports_check_mode=True,
    )
    params: dict[str, Any] = module.params
    index = params["index"].rstrip("/")
    by_tag: dict[str, list[str]] = {}
    for host, tag in sorted(params["tags_by_host"].items()):
        by_tag.setdefault(str(tag), []).append(str(host))
    missing: list[str] = []
    for pin in params["pins"]:
        name, _, version = pin.partition("==")
        url = f"{index}/{name}/"
        try:
            page = open_url(url, timeout=TIMEOUT_S).read().decode("utf-8", errors="replace")
        except Exception as exc:  # any fetch failure (HTTP, DNS, TLS) is reported as one line
            module.fail_json(msg=f"error: wheel check: cannot read {url}: {exc}", missing=[])
        files = wheel_files(page)
        label = version.partition("+")[2]
        for tag, hosts in sorted(by_tag.items()):
            if has_wheel(files, name, version, tag):
                continue
            others = versions_for(files, name, tag, label) or versions_for(files, name, tag)
            instead = (
                f"pin one that exists for {tag}: {', '.join(others[:5])}"
                if others
                else f"it has no {name} for {tag}"
            )
            missing.append(
                f"{url} has no {expected_file(name, version, tag)} for {', '.join(hosts)} ({tag}); {instead}"
            )
    if missing:
        module.fail_json(
            msg="error: wheel check before any install: "
            + "; ".join(missing)
            + " (set pytorch_version / pytorch_torchaudio_version, or pytorch_index_url to a mirror that "
            "has them)",
            missing=missing,
        )
    module.exit_json(changed=False, missing=[])


if __name__ == "__main__":
    main()
