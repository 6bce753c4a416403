"""`launcher check`'s GPU test: its table and bad lines, and the real playbook with
the real node script on this machine (ansible_connection=local; its torch is a CPU build, so the script finds
no GPU and says so: a node whose torch has a GPU backend but no GPU is bad, never ok)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from launcher.backends.runner import PlaybookRunner
from launcher.engine.check import gpu_table, measure_gpus

ansible_runner = pytest.importorskip("ansible_runner")
torch = pytest.importorskip("torch")


def test_table_names_the_slow_gpu_and_the_node_that_did_not_answer() -> None:
    answers = {
        "n1": {
            "ok": True,
            "gpus": [{"gpu": i} for i in range(8)],
            "tflops": 760.1,
            "membw_gbs": 4243.9,
            "problems": [],
            "reserved_after_mib": 0.0,
            "wall_s": 4.15,
        },
        "n2": {
            "ok": False,
            "gpus": [{"gpu": i} for i in range(8)],
            "tflops": 501.0,
            "membw_gbs": 4200.0,
            "problems": ["GPU 5: bf16 matmul 501 TFLOP/s below 80% of the node's best (760)"],
            "reserved_after_mib": 0.0,
            "wall_s": 4.3,
        },
        "n3": {"ok": False, "gpus": [], "problems": ["GPU test failed: no answer"]},
    }
    lines, bad = gpu_table(answers)
    assert lines[1].split() == ["n1", "8", "760.1", "4244", "0.0", "4.15"]
    assert lines[3].split() == ["n3", "0", "-", "-", "-", "-"]
    assert bad == [
        "n2: GPU 5: bf16 matmul 501 TFLOP/s below 80% of the node's best (760)",
        "n3: GPU test failed: no answer",
    ]


def test_the_playbook_runs_the_script_and_says_which_torch_the_node_has(tmp_path: Path) -> None:
    """This machine's torch: a CPU build here (the check makes that a note, not a pass), else a GPU build that
    sees no GPU (bad)."""
    inventory = tmp_path / "hosts.json"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {"node1": {}},
                    "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
                }
            }
        )
    )
    runner = PlaybookRunner(tmp_path / "ansible", inventory=inventory)
    answers = measure_gpus(runner, ["node1"], {"node1": sys.executable}, min_tflops=0, min_membw_gbs=0)
    assert answers["node1"]["ok"] is False
    assert answers["node1"]["problems"] == ["no GPU visible to torch"]
    gpu_build = bool(torch.version.cuda or getattr(torch.version, "hip", None))
    assert answers["node1"]["backend"] == ("cuda" if torch.version.cuda else "rocm" if gpu_build else "cpu")
