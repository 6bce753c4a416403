"""The trainer TEST DOUBLE of the control-plane benchmark (mift_testsupport.trainer_testdouble) writes what
the launcher reads of LLaMA-Factory (trainer_log.jsonl, checkpoints, the outputs, the join lines) and obeys
SIGTERM as torchrun does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mift_testsupport import trainer_testdouble as double


def start(tmp_path: Path, steps: int, step_s: float, nproc: int = 2) -> tuple[subprocess.Popen[str], Path]:
    out = tmp_path / "output"
    train = tmp_path / "train.yaml"
    train.write_text(f"model_name_or_path: /x\noutput_dir: {out}\nsave_steps: 2\nmax_steps: {steps}\n")
    env = {
        **os.environ,
        double.STEP_S_VAR: str(step_s),
        "NPROC_PER_NODE": str(nproc),
        "NNODES": "2",
        "NODE_RANK": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, double.__file__, "train", str(train)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, out


def test_rank_zero_logs_every_step_saves_checkpoints_and_the_outputs(tmp_path: Path) -> None:
    proc, out = start(tmp_path, steps=4, step_s=0.05)
    text, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, text
    assert "Process rank: 0, world size: 4" in text and "Process rank: 1, world size: 4" in text, text
    entries = [json.loads(x) for x in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert [e["current_steps"] for e in entries] == [1, 2, 3, 4]
    assert all(e["total_steps"] == 4 and "loss" in e for e in entries)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert (out / "checkpoint-4" / "trainer_state.json").is_file()
    assert (out / "adapter_model.safetensors").is_file() and (out / "all_results.json").is_file()
    steps = [line.split("\t") for line in (out / double.STEPS_FILE).read_text().splitlines()]
    assert [int(s) for s, _ in steps] == [1, 2, 3, 4]
    assert all(float(t) <= time.time() for _, t in steps)


def test_sigterm_to_the_parent_ends_every_rank_and_exits_143(tmp_path: Path) -> None:
    proc, out = start(tmp_path, steps=1000, step_s=0.05)
    deadline = time.monotonic() + 30
    while not (out / "trainer_log.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, text
    left = subprocess.run(
        ["pgrep", "-f", f"{double.__file__} --rank"], capture_output=True, text=True, check=False
    )
    assert not left.stdout.strip(), left.stdout
    assert not (out / "all_results.json").exists()
