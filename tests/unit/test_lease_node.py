"""The node side of the GPU lease (launcher/node/lease.py), run here on real files and processes: take,
refuse a live holder, take over a stale one (its run ended; no process of it left after STALE_S), --force,
release only one's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.node import lease as node

STALE_S = 60.0


def _lease(run_id: str, started_at: float | None = None) -> dict[str, object]:
    return {
        "run_id": run_id,
        "user": "alice",
        "controller": "ctl",
        "pid": 123,
        "started_at": time.time() if started_at is None else started_at,
    }


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "gpu-lease.json", tmp_path / "runs"


def test_take_then_refuse_a_live_holder_then_release(paths: tuple[Path, Path]) -> None:
    lease, runs = paths
    assert node.take(lease, runs, _lease("a"), STALE_S, False)["taken"]
    assert json.loads(lease.read_text())["run_id"] == "a"
    answer = node.take(lease, runs, _lease("b"), STALE_S, False)
    assert (answer["taken"], answer["holder"]["run_id"], answer["holder"]["user"]) == (False, "a", "alice")
    assert node.take(lease, runs, _lease("a"), STALE_S, False)["taken"]  # its own: a retry
    assert not node.release(lease, "b")["released"] and lease.exists()  # never another run's
    assert node.release(lease, "a")["released"] and not lease.exists()


def test_a_lease_whose_run_ended_on_the_node_is_taken_over(paths: tuple[Path, Path]) -> None:
    lease, runs = paths
    node.take(lease, runs, _lease("a"), STALE_S, False)
    (runs / "a").mkdir(parents=True)
    (runs / "a" / "state.json").write_text(json.dumps({"state": "exited", "rc": 1}))
    answer = node.take(lease, runs, _lease("b"), STALE_S, False)
    assert answer["taken"] and answer["took_over"]["run_id"] == "a"
    assert answer["why"] == "its run ended on this node (exited)"


def test_an_old_lease_with_no_process_left_is_stale_a_live_process_keeps_it(paths: tuple[Path, Path]) -> None:
    lease, runs = paths
    node.take(lease, runs, _lease("a", started_at=time.time() - 2 * STALE_S), STALE_S, False)
    env = {**os.environ, "MIFT_AGENT_KEY": f"a@{runs / 'a'}"}  # what every process of run a carries
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        time.sleep(0.2)
        assert proc.pid in node.processes_of("a")
        assert not node.take(lease, runs, _lease("b"), STALE_S, False)["taken"]
    finally:
        proc.kill()
        proc.wait()
    answer = node.take(lease, runs, _lease("b"), STALE_S, False)
    assert answer["taken"] and answer["why"].startswith("no process of its run on this node, leased 1")


def test_a_young_lease_without_processes_is_live_force_takes_it(paths: tuple[Path, Path]) -> None:
    lease, runs = paths
    node.take(lease, runs, _lease("a"), STALE_S, False)  # taken, the trainers not started yet
    assert not node.take(lease, runs, _lease("b"), STALE_S, False)["taken"]
    answer = node.take(lease, runs, _lease("b"), STALE_S, True)
    assert answer["taken"] and answer["why"] == "--force"
    assert json.loads(lease.read_text())["run_id"] == "b"
