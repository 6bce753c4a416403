"""The node layout: where the venv, the run directories, the local facts and the helper scripts are on a node.

One home for both halves: ``roles/mift_defaults/defaults/main.yml``, which provisioning reads as role defaults
and the launcher reads here (the package ships it as ``data/node_layout.yml``, a link to that file in the
checkout, a copy in the wheel). The launcher's playbooks get the values as the extra variable ``mift_layout``
(:meth:`NodeLayout.extravars`, added to every playbook run by :mod:`launcher.backends.runner`) and prefer
what an
inventory sets: ``mift_node_venv``, then ``mift_defaults_venv``, then ``mift_layout.venv``.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from typing import Any

import yaml

FILE = "node_layout.yml"
EXTRA_VAR = "mift_layout"


@dataclasses.dataclass(frozen=True)
class NodeLayout:
    """The node paths the launcher and provisioning agree on (absolute paths on the nodes)."""

    venv: str
    runs_root: str
    facts_dir: str
    libexec_dir: str
    stack_packages: tuple[str, ...]  # the stack's distributions: stack_check records them, preflight compares

    def run_dir(self, run_id: str) -> str:
        """The node run directory of ``run_id``."""
        return f"{self.runs_root}/{run_id}"

    def extravars(self) -> dict[str, Any]:
        """The playbooks' view: ``{"mift_layout": {"venv": ..., "runs_root": ..., ...}}``."""
        return {EXTRA_VAR: dataclasses.asdict(self)}


@functools.cache
def layout() -> NodeLayout:
    """Read the layout from the shipped defaults file (once per process)."""
    text = (resources.files("launcher") / "data" / FILE).read_text()
    values = yaml.safe_load(text)
    return NodeLayout(
        venv=str(values["mift_defaults_venv"]),
        runs_root=str(values["mift_defaults_runs_root"]),
        facts_dir=str(values["mift_defaults_facts_dir"]),
        libexec_dir=str(values["mift_defaults_libexec_dir"]),
        stack_packages=tuple(str(d) for d in values["mift_defaults_stack_packages"]),
    )
