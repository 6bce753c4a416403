"""The checkout is the Ansible collection mift.cluster (docs/conventions.md "The roles as a collection"): one
copy of each module and module_util under plugins/, the roles call the modules by FQCN, and the checkout's
ansible.cfg finds the collection in the checkout itself. tools/collection_check builds and installs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
MODULES = {p.stem for p in (REPO / "plugins" / "modules").glob("*.py")}


def _galaxy() -> dict[str, Any]:
    return yaml.safe_load((REPO / "galaxy.yml").read_text(encoding="utf-8"))


def _tasks(items: Any) -> list[dict[str, Any]]:
    """Every task of a task file, those inside block/rescue/always included."""
    found: list[dict[str, Any]] = []
    for task in items or []:
        if not isinstance(task, dict):
            continue
        found.append(task)
        for key in ("block", "rescue", "always"):
            found.extend(_tasks(task.get(key)))
    return found


def test_each_module_and_module_util_has_one_copy_under_plugins() -> None:
    assert sorted(MODULES) == [
        "amd_gpu_facts",
        "mift_pgp_key",
        "mift_platform_report",
        "mift_python_interpreter",
        "mift_wheel_check",
    ]
    assert list((REPO / "roles").glob("*/library")) == []
    assert list((REPO / "roles").glob("*/module_utils")) == []
    names = [p.name for p in (REPO / "plugins").rglob("*.py")]
    assert len(names) == len(set(names))


def test_the_roles_call_every_module_by_its_fqcn() -> None:
    prefix = f"{_galaxy()['namespace']}.{_galaxy()['name']}."
    short, unknown, used = [], [], set()
    for path in sorted((REPO / "roles").glob("*/*/*.yml")):
        if path.parent.name not in {"tasks", "handlers"}:
            continue
        for task in _tasks(yaml.safe_load(path.read_text(encoding="utf-8"))):
            for key in task:
                if key in MODULES:
                    short.append(f"{path.relative_to(REPO)}: {key}")
                elif key.startswith(prefix) and key.removeprefix(prefix) in MODULES:
                    used.add(key.removeprefix(prefix))
                elif key.startswith(prefix):
                    unknown.append(f"{path.relative_to(REPO)}: {key}")
    assert short == []
    assert unknown == []
    assert used == MODULES  # each module is called by some role


def test_the_modules_import_their_module_utils_from_the_collection() -> None:
    package = f"ansible_collections.{_galaxy()['namespace']}.{_galaxy()['name']}.plugins.module_utils."
    utils = {p.stem for p in (REPO / "plugins" / "module_utils").glob("*.py")}
    imported = set()
    for path in (REPO / "plugins" / "modules").glob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            assert not any(line.startswith(f"from ansible.module_utils.{u} ") for u in utils), (path, line)
            if line.startswith(f"from {package}"):
                imported.add(line.removeprefix(f"from {package}").split()[0])
    assert imported == utils


def test_the_checkouts_collection_link_is_the_checkout_and_first_in_ansible_cfg() -> None:
    galaxy = _galaxy()
    link = REPO / "collections" / "ansible_collections" / galaxy["namespace"] / galaxy["name"]
    assert link.is_symlink() and link.resolve() == REPO
    settings = (REPO / "ansible.cfg").read_text(encoding="utf-8").splitlines()
    (line,) = [s for s in settings if s.startswith("collections_path")]
    assert line.split("=", 1)[1].strip().split(":")[0] == "collections"
    # the tarball leaves out what is not the roles and their modules
    assert {"python", "tests", "molecule", "collections", "docs"} <= set(galaxy["build_ignore"])
