"""The node programs as one file (launcher/nodeprogram.py): built once per content, sent where missing, run.

The "ssh" here is ``sh -c`` on this machine (TEST DOUBLE for a node's shell: no node here), with HOME a
temporary folder, so the node's ``~/.cache/mift-node`` is the test's own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from launcher.transfer import nodeprogram

SHELL = ["sh", "-c"]  # TEST DOUBLE: the node's shell, as ssh HOST would give it


def test_the_file_is_built_once_per_content_and_holds_the_whole_package(tmp_path: Path) -> None:
    first = nodeprogram.build(tmp_path)
    assert first.name == f"mift_node-{nodeprogram.digest(nodeprogram.sources())}.pyz"
    stamp = first.stat().st_mtime_ns
    assert nodeprogram.build(tmp_path) == first and first.stat().st_mtime_ns == stamp  # cached: not rebuilt
    names = set(zipfile.ZipFile(first).namelist())
    assert "__main__.py" in names
    assert {f"mift_node/{n}" for n in nodeprogram.sources()} <= names
    assert not [n for n in names if "__pycache__" in n]


def test_a_changed_source_is_a_new_name() -> None:
    files = nodeprogram.sources()
    changed = {**files, "agent.py": files["agent.py"] + b"\n"}
    assert nodeprogram.digest(changed) != nodeprogram.digest(files)


def test_sent_where_missing_then_run_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    argv = nodeprogram.command(SHELL, sys.executable, "agent", "status", str(tmp_path / "no-run"))
    on_node = tmp_path / "home" / ".cache" / "mift-node" / nodeprogram.program_file().name
    assert on_node.read_bytes() == nodeprogram.program_file().read_bytes()
    out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert json.loads(out.stdout) == {
        "ok": False,
        "state": "absent",
        "error": f"{tmp_path / 'no-run'}: no such run directory",
    }
    stamp = on_node.stat().st_mtime_ns
    nodeprogram.ship_over_ssh(SHELL)  # there already: not sent again
    assert on_node.stat().st_mtime_ns == stamp


def test_a_node_that_cannot_take_it_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".cache").write_text("a file where the folder would be")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(OSError, match=r"^sending the node program: .*\.cache"):
        nodeprogram.ship_over_ssh(SHELL)
