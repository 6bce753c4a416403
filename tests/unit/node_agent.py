"""The node program, as shipped (``python3 AGENT agent ...``), run here by the unit tests: one call of it, its
JSON answer, and waiting until a run's state is one of some."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from launcher.transfer import nodeprogram

AGENT = nodeprogram.program_file()


def run_agent(
    *args: str, env: dict[str, str] | None = None, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """``python3 AGENT agent ARGS`` (60 s at most) with ``stdin`` as its input, its output captured."""
    return subprocess.run(
        [sys.executable, str(AGENT), "agent", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        input=stdin,
    )


def agent_json(*args: str) -> dict[str, Any]:
    """The JSON object the agent prints for ``ARGS``."""
    return dict(json.loads(run_agent(*args).stdout))


def wait_state(run_dir: Path, states: set[str], timeout: float = 30) -> dict[str, Any]:
    """The agent's status of ``run_dir`` once its state is one of ``states``; fails after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = agent_json("status", str(run_dir))
        if status["state"] in states:
            return status
        time.sleep(0.2)
    raise AssertionError(f"state never in {states}: {status}")


def fake_trainer_job(run_dir: Path, *trainer_args: str, expect: tuple[str, ...] = ()) -> dict[str, Any]:
    """The job.json of a run of the fake trainer (tests/unit/fake_trainer.py) writing into ``run_dir/output``:
    run id the folder's name, node rank 0."""
    out = run_dir / "output"
    return {
        "run_id": run_dir.name,
        "node_rank": 0,
        "expect_outputs": list(expect),
        "output_dir": str(out),
        "argv": [sys.executable, str(Path(__file__).with_name("fake_trainer.py")), str(out), *trainer_args],
    }
