"""The progress watchdog in the follow loop and the finish step: a stall ends the run as ``stalled``, the stop
dumps the stacks first, the record and the summary say who lags (with a test double of the launcher's Job)."""

from __future__ import annotations

import contextlib
import io
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.engine.finish import finish
from launcher.follow.live import follow
from launcher.follow.verdict import Verdict
from launcher.follow.watchdog import ProgressWatch, Schedule, WatchdogOptions
from launcher.rundir.report import summary_lines
from launcher.rundir.runs import FINAL_STATES, RunDir

HOSTS = ["host1", "host2"]


def _node(step: int, state: str = "S") -> dict[str, Any]:
    return {
        "state": "running",
        "last_log": {"current_steps": step, "total_steps": 100},
        "watch": {"checkpoint": None, "ranks": [{"pid": 40 + step, "rank": "1", "state": state}]},
    }


class JobTEST_DOUBLE:  # noqa: N801 - the test-double marker in the name
    """TEST DOUBLE of launcher.engine.job.Job: scripted polls, every poll judged running, stops recorded."""

    def __init__(self, run: RunDir, polls: list[dict[str, dict[str, Any]]]) -> None:
        self.run = run
        self.hosts = HOSTS
        self.polls = polls
        self.dump_stacks_on_stop = False
        self.stops: list[bool] = []
        self.finalized: list[tuple[str, str]] = []

    def poll(self) -> dict[str, dict[str, Any]]:
        return self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]

    def polling(self, interval_s: float) -> contextlib.nullcontext[Any]:
        del interval_s
        return contextlib.nullcontext(self.poll)

    def judge(self, nodes: dict[str, dict[str, Any]]) -> Verdict:
        del nodes
        return Verdict("running")

    def stop(self) -> None:
        self.stops.append(self.dump_stacks_on_stop)

    def finalize(self, state: str, reason: str = "", nodes: object = None) -> None:
        del nodes
        self.finalized.append((state, reason))
        self.run.set_status(state, reason)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunDir:
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    return RunDir.create("wd-20261204-000000-abcd", {"hosts": HOSTS})


def test_stalled_is_a_final_state() -> None:
    assert "stalled" in FINAL_STATES


def test_a_run_whose_step_stops_ends_stalled_naming_the_stopped_rank(run: RunDir) -> None:
    polls = [{h: _node(s) for h in HOSTS} for s in (1, 2, 3)]
    polls.append({"host1": _node(3), "host2": _node(3, state="T")})  # host2's rank SIGSTOPped after step 3
    job = JobTEST_DOUBLE(run, polls)
    options = WatchdogOptions(k=1, floor_s=1, first_step_s=5)
    watch = ProgressWatch(options, Schedule(), HOSTS, started=0.0)
    watch.last_progress = watch.started = time.monotonic()
    verdict, nodes = follow(
        job,  # type: ignore[arg-type]
        interrupted=threading.Event(),
        poll_interval_s=0.5,
        out=io.StringIO(),
        watch=watch,
    )
    assert verdict.state == "stalled", verdict
    assert "after step 3" in verdict.reason and "lagging: host2/rank 1 (pid 43) stopped" in verdict.reason
    stall = run.load()["stall"]
    assert stall["lagging"] == ["host2"] and stall["step"] == 3 and stall["window_s"] == 1.0
    assert nodes["host2"]["watch"]["ranks"][0]["state"] == "T"


def test_follow_without_a_watch_never_stalls(run: RunDir) -> None:
    job = JobTEST_DOUBLE(run, [{h: _node(3) for h in HOSTS}])
    stop = threading.Event()
    threading.Timer(1.2, stop.set).start()
    verdict, _nodes = follow(job, interrupted=stop, poll_interval_s=0.5, out=io.StringIO())  # type: ignore[arg-type]
    assert verdict.state == "stopped"  # the interrupt ended it, not a stall


def test_finish_of_a_stalled_run_dumps_the_stacks_while_stopping(run: RunDir) -> None:
    job = JobTEST_DOUBLE(run, [{}])
    finish(job, Verdict("stalled", "no progress"))  # type: ignore[arg-type]
    assert job.stops == [True]
    assert job.finalized == [("stalled", "no progress")]
    assert run.load()["status"] == "stalled"


def test_finish_of_a_failed_run_stops_without_dumps(run: RunDir) -> None:
    job = JobTEST_DOUBLE(run, [{}])
    finish(job, Verdict("failed", "host2: trainer exited rc=1"))  # type: ignore[arg-type]
    assert job.stops == [False]


def test_finish_stops_a_trainer_left_running_after_success_and_only_then(run: RunDir) -> None:
    lingering = JobTEST_DOUBLE(run, [{}])
    finish(lingering, Verdict("succeeded", "host1: ... still running 10 s later", stop_lingering=True))  # type: ignore[arg-type]
    assert lingering.stops == [False]
    assert lingering.finalized == [("succeeded", "host1: ... still running 10 s later")]
    done = JobTEST_DOUBLE(run, [{}])
    finish(done, Verdict("succeeded"))  # type: ignore[arg-type]
    assert done.stops == []


def test_the_summary_of_a_stalled_run_names_window_lagging_node_and_stack_files(run: RunDir) -> None:
    (run.nodes_dir / "host2").mkdir(parents=True)
    (run.nodes_dir / "host2" / "stack-rank1-43.txt").write_text("pid 43 state T\n")
    run.update(
        stall={
            "since_progress_s": 31.2,
            "window_s": 30.0,
            "window_why": "floor_s",
            "step": 3,
            "lagging": ["host2"],
            "lag_why": "host2/rank 1 (pid 43) stopped",
        }
    )
    run.update(result_reason="no progress for 31 s after step 3")
    run.set_status("stalled", "no progress for 31 s after step 3")
    lines = summary_lines(run.record(), run)
    assert lines[0].startswith(f"run {run.run_id}: stalled (no progress for 31 s after step 3)")
    assert "  stall       no progress for 31 s, window 30 s (floor_s)" in lines
    assert "  lagging     host2: host2/rank 1 (pid 43) stopped" in lines
    assert "  stacks      1 file(s): nodes/host2/stack-rank1-43.txt" in lines
