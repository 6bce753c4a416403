"""``logs RUN --rank N``: one global rank's lines, from the trainer.log of the node that runs it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from launcher.commands.logs import rank_lines, show_logs
from launcher.exceptions import ConfigurationError
from launcher.rundir.runs import RunDir

if TYPE_CHECKING:
    from pathlib import Path

LOG = (
    "W torchrun: OMP_NUM_THREADS set to 1\n"
    "[rank2 local0]: Process rank: 2, world size: 4\n"
    "[rank3 local1]: Process rank: 3, world size: 4\n"
    "[rank2 local0]: step 1\n"
    "[rank3 local1]: [INFO] partial line without its end"
)


def test_rank_lines_keep_only_that_ranks_prefix() -> None:
    assert rank_lines(LOG, 2) == "[rank2 local0]: Process rank: 2, world size: 4\n[rank2 local0]: step 1\n"
    assert rank_lines(LOG, 1) == ""


def test_logs_rank_reads_the_node_that_runs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    run = RunDir.create("lr-20261205-000000-abcd", {"hosts": ["host1", "host2"], "nproc_per_node": 2})
    run.set_status("succeeded")
    (run.nodes_dir / "host2").mkdir(parents=True)
    (run.nodes_dir / "host2" / "trainer.log").write_text(LOG)
    assert show_logs(run.run_id, node="0", follow=False, rank=3) == 0
    assert capsys.readouterr().out == "[rank3 local1]: Process rank: 3, world size: 4\n"  # whole lines only
    with pytest.raises(ConfigurationError, match=r"--rank 4: not a rank of this run \(world size 4\)"):
        show_logs(run.run_id, node="0", follow=False, rank=4)


def test_logs_of_an_active_run_fetch_only_the_node_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """One node's log is one node's collect, not every node's (the playbook's hosts: ``Job.hosts``)."""
    from launcher.backends.runner import PlaybookResult  # noqa: PLC0415
    from launcher.engine.job import Job  # noqa: PLC0415

    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    run = RunDir.create("lg-20261207-000000-abcd", {"hosts": ["host1", "host2", "host3"], "backend": "ssh"})
    run.set_status("running")
    fetched: list[list[str]] = []

    def collect(job: Job) -> PlaybookResult:  # TEST DOUBLE of the collect playbook: host2's log arrives
        fetched.append(list(job.hosts))
        (run.nodes_dir / "host2").mkdir(parents=True, exist_ok=True)
        (run.nodes_dir / "host2" / "trainer.log").write_text("step 1\n")
        return PlaybookResult("collect", 0, "successful")

    monkeypatch.setattr(Job, "collect", collect)
    assert show_logs(run.run_id, node="1", follow=False) == 0
    assert fetched == [["host2"]]
    assert capsys.readouterr().out == "step 1\n"
