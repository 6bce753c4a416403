"""How node states become a job state (success needs every rank finished and the adapter saved)."""

from __future__ import annotations

from launcher.follow.live import render_table
from launcher.follow.verdict import Judge
from launcher.rundir.metrics import summarize

DONE = {"state": "finished", "rc": 0, "outputs_complete": True}
RUN = {"state": "running"}


def judge() -> Judge:
    return Judge(["h1", "h2"], teardown_grace_s=10)


def test_running_until_every_node_finished() -> None:
    assert judge()({"h1": RUN, "h2": RUN}).state == "running"
    assert judge()({"h1": DONE, "h2": RUN}).state == "running"
    assert judge()({"h1": DONE, "h2": {"state": "finished", "rc": 0}}).state == "succeeded"


def test_rc_zero_without_adapter_is_failure() -> None:
    verdict = judge()(
        {
            "h1": {"state": "finished", "rc": 0, "outputs": {"adapter_model.safetensors": False}},
            "h2": {"state": "finished", "rc": 0},
        }
    )
    assert verdict.state == "failed" and "adapter_model.safetensors" in verdict.reason


def test_any_failed_or_vanished_node_fails_the_job() -> None:
    assert judge()({"h1": RUN, "h2": {"state": "failed", "rc": -9}}).reason == "h2: trainer exited rc=-9"
    assert judge()({"h1": {"state": "vanished"}, "h2": RUN}).reason == "h1: trainer vanished"
    assert judge()({"h1": RUN, "h2": {"state": "stopped"}}).state == "stopped"


def test_when_several_nodes_failed_the_cause_is_named_not_the_first_in_the_inventory() -> None:
    # host2's trainer was killed; host1's ranks then failed on the broken collective, seen in the same poll
    collateral = {"state": "failed", "rc": 1, "ended_at": 1000.9}
    killed = {"state": "failed", "rc": -9, "ended_at": 1000.2}
    assert judge()({"h1": collateral, "h2": killed}).reason == "h2: trainer exited rc=-9"
    assert judge()({"h1": collateral, "h2": dict(killed, rc=137)}).reason == "h2: trainer exited rc=137"
    # no signal: the node that ended first is the cause; without times, the inventory's order
    assert judge()({"h1": collateral, "h2": dict(killed, rc=1)}).reason == "h2: trainer exited rc=1"
    plain = {"state": "failed", "rc": 1}
    assert judge()({"h1": plain, "h2": plain}).reason == "h1: trainer exited rc=1"
    # a rank SIGKILLed on h2: torchrun exits 1 there too; its report (rank_exits) tells the cause apart
    killed_rank = dict(plain, rank_exits=[{"rank": 3, "exitcode": -9}, {"rank": 2, "exitcode": -15}])
    peer = dict(plain, rank_exits=[{"rank": 0, "exitcode": 1}, {"rank": 1, "exitcode": -15}], ended_at=1.0)
    assert judge()({"h1": peer, "h2": dict(killed_rank, ended_at=2.0)}).reason == "h2: trainer exited rc=1"


def test_teardown_abort_after_finished_training_is_tolerated() -> None:
    abort = {"state": "failed", "rc": 1, "teardown_abort": True}
    j = judge()
    assert j({"h1": RUN, "h2": abort}, now=0.0).state == "running"  # grace: rank 0 may still be saving
    assert j({"h1": DONE, "h2": abort}, now=3.0).state == "succeeded"
    j = judge()
    j({"h1": RUN, "h2": abort}, now=0.0)
    assert j({"h1": RUN, "h2": abort}, now=11.0).state == "failed"


def test_unreachable_needs_several_polls() -> None:
    j = judge()
    for _ in range(2):
        assert j({"h1": RUN, "h2": {"state": "unreachable"}}).state == "running"
    assert j({"h1": RUN, "h2": {"state": "unreachable"}}).state == "failed"


def test_table_and_summary() -> None:
    nodes = {
        "h1": {
            "state": "running",
            "last_log": {
                "current_steps": 3,
                "total_steps": 8,
                "loss": 6.25,
                "throughput": 41.5,
                "remaining_time": "0:00:05",
            },
        }
    }
    lines = render_table(["h1", "h2"], nodes)
    assert lines[0].split() == ["HOST", "NODE", "RANKS", "STATE", "STEP", "LOSS", "TOK/S", "ELAPSED", "ETA"]
    assert lines[1].split()[:7] == ["h1", "0", "-", "running", "3/8", "6.2500", "41.5"]
    log = [
        {"current_steps": 1, "total_steps": 2, "loss": 6.1},
        {"current_steps": 2, "total_steps": 2, "loss": 6.0},
        {"current_steps": 2, "total_steps": 2},
    ]
    summary = summarize(log, {"train_runtime": 3.5, "train_loss": 6.05})
    assert summary.losses == [(1, 6.1), (2, 6.0)] and summary.final_loss == 6.0 and summary.steps == 2
    assert summary.train_runtime == 3.5


def test_the_table_names_each_nodes_global_ranks() -> None:
    """host/rank: a node's ranks as its agent sees them (a stopped one with its state), else from its node
    rank and the ranks per node."""
    held = {
        "watch": {
            "ranks": [
                {"rank": "3", "local_rank": "1", "pid": 7, "state": "T"},
                {"rank": "2", "local_rank": "0", "pid": 6, "state": "S"},
            ]
        }
    }
    lines = render_table(["h1", "h2"], {"h1": {"state": "running"}, "h2": {"state": "running", **held}}, 2)
    assert lines[1].split()[:4] == ["h1", "0", "0-1", "running"]
    assert lines[2].split()[:4] == ["h2", "1", "2,3:T", "running"]
    assert render_table(["h1", "h2"], {}, 1)[2].split()[:3] == ["h2", "1", "1"]
    running = {"watch": {"ranks": [{"rank": "2", "state": "S"}, {"rank": "3", "state": "R"}]}}
    assert render_table(["h1", "h2"], {"h2": running}, 2)[2].split()[2] == "2-3"  # all there: the span
    one = {"watch": {"ranks": [{"rank": "3", "state": "S"}]}}
    assert render_table(["h1", "h2"], {"h2": one}, 2)[2].split()[2] == "3"  # one gone: those seen


def test_a_master_left_in_torchruns_exit_barrier_succeeds_after_the_grace_and_is_stopped() -> None:
    """h2's rank aborted at exit, so h2's torchrun never joins the exit barrier that h1's torchrun waits in
    (300 s): once h1's outputs are complete and h2 ended, h1 gets teardown_grace_s, then the run succeeds and
    h1's trainer is stopped."""
    abort = {"state": "failed", "rc": 1, "teardown_abort": True}
    saved_running = {"state": "running", "outputs_complete": True}
    j = judge()
    assert j({"h1": saved_running, "h2": abort}, now=0.0).state == "running"
    assert j({"h1": saved_running, "h2": abort}, now=9.0).state == "running"
    verdict = j({"h1": saved_running, "h2": abort}, now=10.0)
    assert verdict.state == "succeeded" and verdict.stop_lingering
    assert verdict.reason.startswith("h1: training finished and every other node ended, but its trainer was")


def test_a_master_still_running_is_not_cut_short_while_another_node_runs_or_before_its_outputs() -> None:
    saved_running = {"state": "running", "outputs_complete": True}
    j = judge()
    for now in (0.0, 30.0, 600.0):  # h2 still trains (evaluation, say): nothing is judged
        assert j({"h1": saved_running, "h2": RUN}, now=now).state == "running"
    j = judge()
    for now in (0.0, 30.0, 600.0):  # h1 has not saved yet: it is training, not lingering
        assert j({"h1": RUN, "h2": DONE}, now=now).state == "running"
    j = judge()  # the grace counts from when the master is first seen lingering, not from the first poll
    assert j({"h1": RUN, "h2": DONE}, now=0.0).state == "running"
    assert j({"h1": saved_running, "h2": DONE}, now=50.0).state == "running"
    assert j({"h1": saved_running, "h2": DONE}, now=60.0).stop_lingering
    assert not judge()({"h1": DONE, "h2": DONE}).stop_lingering
