"""Unit tests of roles/mift_defaults/files/mift_fingerprint.py: the per-part fingerprints that let a re-run of
provision.yml skip the hosts whose part is unchanged (playbooks/state.yml)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "roles" / "mift_defaults" / "files" / "mift_fingerprint.py"


def _run(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.read_text(), *args], capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def _spec(tmp: Path) -> dict[str, Any]:
    return {
        "record": str(tmp / "facts" / "mift_fingerprint.fact"),
        "parts": {
            "stack": {"paths": [str(tmp / "venv" / "*.txt")], "venvs": [str(tmp / "venv")]},
            "configs": {"paths": [str(tmp / "configs")]},
        },
        "facts": {"stack": str(tmp / "facts" / "mift_stack.fact")},
    }


def _setup(tmp: Path) -> None:
    site = tmp / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "peft-0.17.1.dist-info").mkdir(parents=True)
    (site / "torch-2.13.0+cpu.dist-info").mkdir()
    (tmp / "venv" / "mift-pins.txt").write_text("peft==0.17.1\n")
    (tmp / "configs").mkdir()
    (tmp / "configs" / "ds_z3.json").write_text("{}\n")


def test_recorded_part_matches_until_what_it_covers_changes(tmp_path: Path) -> None:
    _setup(tmp_path)
    spec = json.dumps(_spec(tmp_path))
    first = _run("check", spec)
    assert first["parts"]["stack"]["recorded"] is None  # nothing recorded yet: the part runs
    assert _run("record", spec, "stack", "inputs-1")["changed"] is True
    assert _run("record", spec, "stack", "inputs-1")["changed"] is False  # a second record changes nothing
    again = _run("check", spec)["parts"]["stack"]
    assert again["recorded"] == {"node": again["now"], "inputs": "inputs-1"}
    # a distribution removed from the venv (the stack-drift fault) changes the fingerprint
    (tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "peft-0.17.1.dist-info").rmdir()
    assert _run("check", spec)["parts"]["stack"]["now"] != again["now"]


def test_parts_are_independent_and_files_count_by_content(tmp_path: Path) -> None:
    _setup(tmp_path)
    spec = json.dumps(_spec(tmp_path))
    before = _run("check", spec)["parts"]
    (tmp_path / "configs" / "ds_z3.json").write_text('{"zero_optimization": {"stage": 3}}\n')
    after = _run("check", spec)["parts"]
    assert after["configs"]["now"] != before["configs"]["now"]
    assert after["stack"]["now"] == before["stack"]["now"]


def test_missing_paths_and_recorded_facts_are_reported_not_fatal(tmp_path: Path) -> None:
    spec = _spec(tmp_path)  # nothing exists
    result = _run("check", json.dumps(spec))
    assert set(result["parts"]) == {"stack", "configs"} and result["facts"] == {"stack": {}}
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "mift_stack.fact").write_text('{"versions": {"torch": "2.13.0+cpu"}}\n')
    assert _run("check", json.dumps(spec))["facts"]["stack"]["versions"]["torch"] == "2.13.0+cpu"


def test_tree_digest_follows_the_controller_files(tmp_path: Path) -> None:
    (tmp_path / "role").mkdir()
    (tmp_path / "role" / "main.yml").write_text("a: 1\n")
    spec = json.dumps({"stack": [str(tmp_path / "role")], "configs": [str(tmp_path / "role"), ""]})
    first = _run("tree", spec)
    assert first["stack"] == _run("tree", spec)["stack"]
    (tmp_path / "role" / "main.yml").write_text("a: 2\n")
    assert _run("tree", spec)["stack"] != first["stack"]
