"""rundir/failure_cause.py over the real rank logs of two trainer failures (tests/fixtures/failure_logs/)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from launcher.rundir.failure_cause import find_cause, in_last_attempt, last_exception, with_cause
from launcher.rundir.report import attempt_lines
from launcher.rundir.runs import RunRecord

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "failure_logs"
HOSTS = ["host1", "host2"]


def _run_dir(tmp_path: Path, case: str) -> Path:
    """A copy of the case's run directory with the logs' times of the real run (git keeps none)."""
    run = tmp_path / case
    shutil.copytree(FIXTURES / case, run)
    for rel, mtime in json.loads((FIXTURES / "mtimes.json").read_text()).items():
        if rel.startswith(f"{case}/"):
            os.utime(tmp_path / rel, (mtime, mtime))
    return run


def test_lora_module_missing_names_peft_error_and_first_rank(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "cause-lora-module-missing")
    cause = find_cause(run, HOSTS)
    assert cause is not None
    assert cause.type == "ValueError"
    assert cause.message.startswith("Target modules {'no_such_module'} not found in the base model.")
    # the 4 ranks raised within 50 ms; host2's rank 3 wrote its log first (the judge blamed host1)
    assert (cause.host, cause.rank, cause.log) == ("host2", 3, "nodes/host2/rank3.stderr.log")
    assert cause.ranks_failed == 4
    assert cause.causes == ()


def test_model_missing_offline_names_the_chain_down_to_huggingface_hub(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "cause-model-not-on-offline-node")
    cause = find_cause(run, HOSTS)
    assert cause is not None
    assert (cause.type, cause.message) == ("OSError", "Failed to load tokenizer.")
    assert cause.causes[0].startswith("OSError: We couldn't connect to 'https://huggingface.co'")
    assert cause.causes[1].startswith(
        "huggingface_hub.errors.LocalEntryNotFoundError: Cannot find the requested files in the disk cache"
    )
    assert len(cause.causes) == 2  # the "During handling" context before it is not its cause
    assert (cause.host, cause.rank) == ("host2", 2)


def test_the_failure_line_keeps_the_judges_words_first(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, "cause-lora-module-missing")
    cause = find_cause(run, HOSTS)
    judge = "host2: trainer exited rc=1; not retried: trainer_error is not in recovery.retry_on (node_lost)"
    line = with_cause(judge, cause, run)
    assert line.startswith("host2: trainer exited rc=1: ValueError: Target modules {'no_such_module'}")
    assert line.endswith(
        f"read {run}/nodes/host2/rank3.stderr.log); not retried: trainer_error is not in "
        "recovery.retry_on (node_lost)"
    )
    assert with_cause(judge, None, run) == judge
    attempts = in_last_attempt([{"n": 1}, {"n": 2}], cause, run)  # type: ignore[arg-type]
    assert "cause" not in attempts[0] and "ValueError" in attempts[1]["cause"]


def test_torchrun_and_llamafactory_wrappers_are_never_the_cause() -> None:
    """host2's trainer.log of the lora case: the ranks' lines (prefixed twice), then torchrun's
    ChildFailedError and llamafactory-cli's CalledProcessError, the last tracebacks in the file."""
    text = (FIXTURES / "cause-lora-module-missing/nodes/host2/trainer.log").read_text()
    assert "errors.ChildFailedError" in text and "subprocess.CalledProcessError" in text
    error = last_exception(text)
    assert error is not None and error.type == "ValueError", error
    assert "no_such_module" in error.message


@pytest.mark.parametrize("case", ["cause-lora-module-missing", "cause-model-not-on-offline-node"])
def test_no_logs_no_cause(tmp_path: Path, case: str) -> None:
    run = _run_dir(tmp_path, case)
    for log in run.rglob("rank*.stderr.log"):
        log.write_text("[W1207 04:59:35 socket.cpp:207] [c10d] a warning, no traceback\n")
    assert find_cause(run, HOSTS) is None


def test_the_attempt_line_names_the_cause() -> None:
    """``status``'s and the report's attempt line carry the attempt's cause (the real lora-case record)."""
    record = RunRecord.of(json.loads((FIXTURES / "cause-lora-module-missing" / "record.json").read_text()))
    (line,) = attempt_lines(record)
    assert "trainer_error: host1: trainer exited rc=1: ValueError: Target modules {'no_such_module'}" in line
    assert "read " in line and "nodes/host2/rank3.stderr.log)" in line
    assert line.endswith(
        "-> not retried: trainer_error is not in recovery.retry_on "
        "(node_lost, trainer_signal, stall, gpu_error)"
    )
