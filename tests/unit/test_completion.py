"""``completion bash|zsh`` (shtab over the launcher's parser): bash completes commands and run ids from the
runs folder; the zsh script is generated and names the same run-id function."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher.commands.completion import completion_script
from launcher.main import build_parser

COMPLETE = """
source "$1"
COMP_WORDS=($2); COMP_WORDS+=("$3"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}
_shtab_mi300x_launcher
printf '%s\\n' "${COMPREPLY[@]}"
"""


def _complete(tmp_path: Path, words: str, current: str, runs: Path) -> list[str]:
    script = tmp_path / "mi300x-launcher.bash"
    script.write_text(completion_script("bash", build_parser()))
    out = subprocess.run(
        ["bash", "-c", COMPLETE, "complete", str(script), words, current],
        capture_output=True,
        text=True,
        check=True,
        env={"MIFT_RUNS_DIR": str(runs), "PATH": "/usr/bin:/bin"},
    )
    return [line for line in out.stdout.splitlines() if line]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    for run_id in ("tiny-20261207-050000-ab12", "tiny-20261207-051500-cd34", "big-20261207-052000-ef56"):
        (root / run_id).mkdir(parents=True)
        (root / run_id / "record.json").write_text(json.dumps({"run_id": run_id, "status": "succeeded"}))
    (root / "not-a-run").mkdir()  # no record.json: not offered
    return root


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_run_ids_from_the_runs_folder(tmp_path: Path, runs: Path) -> None:
    assert sorted(_complete(tmp_path, "mi300x-launcher logs", "", runs)) == [
        "big-20261207-052000-ef56",
        "tiny-20261207-050000-ab12",
        "tiny-20261207-051500-cd34",
    ]
    assert _complete(tmp_path, "mi300x-launcher status", "ti", runs) == [
        "tiny-20261207-050000-ab12",
        "tiny-20261207-051500-cd34",
    ]
    assert _complete(tmp_path, "mi300x-launcher stop", "b", runs) == ["big-20261207-052000-ef56"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_and_options(tmp_path: Path, runs: Path) -> None:
    assert "completion" in _complete(tmp_path, "mi300x-launcher", "", runs)
    assert "--json" in _complete(tmp_path, "mi300x-launcher status", "--", runs)
    assert _complete(tmp_path, "mi300x-launcher completion", "", runs) == ["bash", "zsh"]


def test_zsh_script_names_the_run_id_function() -> None:
    script = completion_script("zsh", build_parser())
    assert script.startswith("#compdef mi300x-launcher")
    assert "_mift_run_ids() {" in script and ":_mift_run_ids" in script
