"""The node layout (venv, runs root, facts and helper folders) has one home, read by both halves:
provisioning's ``roles/mift_defaults/defaults/main.yml`` is what the launcher ships and reads."""

from __future__ import annotations

import ast
import json
import re
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import ansible_runner
import pytest
import yaml

from launcher.backends.runner import PlaybookRunner
from launcher.spec.nodelayout import layout

REPO = Path(__file__).resolve().parents[2]
ROLE_DEFAULTS = REPO / "roles" / "mift_defaults" / "defaults" / "main.yml"
PACKAGE = REPO / "python" / "launcher"


def test_the_launcher_reads_the_provisioning_defaults_file_itself() -> None:
    shipped = Path(str(resources.files("launcher") / "data" / "node_layout.yml"))
    assert shipped.resolve() == ROLE_DEFAULTS.resolve()  # in the checkout: a link, never a second copy
    defaults = yaml.safe_load(ROLE_DEFAULTS.read_text())
    assert (layout().venv, layout().runs_root, layout().facts_dir, layout().libexec_dir) == (
        defaults["mift_defaults_venv"],
        defaults["mift_defaults_runs_root"],
        defaults["mift_defaults_facts_dir"],
        defaults["mift_defaults_libexec_dir"],
    )
    assert layout().run_dir("r1") == f"{defaults['mift_defaults_runs_root']}/r1"


def _literals(path: Path) -> list[str]:
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_no_launcher_module_or_playbook_carries_a_copy_of_a_layout_path() -> None:
    paths = (layout().venv, layout().runs_root, layout().facts_dir, layout().libexec_dir)
    copies = [
        f"{py.relative_to(REPO)}: {text!r}"
        for py in sorted(PACKAGE.rglob("*.py"))
        for text in _literals(py)
        if any(text == p or text.startswith(p + "/") for p in paths)
    ]
    quoted = re.compile("|".join(rf"['\"]{re.escape(p)}(/[^'\"]*)?['\"]" for p in paths))
    copies += [
        f"{yml.relative_to(REPO)}:{n}: {line.strip()}"
        for yml in sorted((PACKAGE / "playbooks").glob("*.yml"))
        for n, line in enumerate(yml.read_text().splitlines(), 1)
        if not line.lstrip().startswith("#") and quoted.search(line)
    ]
    assert copies == []


def test_every_playbook_run_gets_the_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, object] = {}

    def ansible_runner_test_double(**kwargs: object) -> object:  # records what the runner was given
        seen.update(kwargs)
        return SimpleNamespace(rc=0, status="successful", stats={})

    monkeypatch.setattr(ansible_runner, "run", ansible_runner_test_double)
    PlaybookRunner(tmp_path).run("poll", {"mift_run_id": "r1"})
    vars_file = Path(str(seen["extravars"]))  # a file of the run's own (ansible-playbook -e @file)
    extravars = json.loads(vars_file.read_text())
    assert extravars["mift_layout"]["runs_root"] == layout().runs_root
    assert extravars["mift_run_id"] == "r1"
