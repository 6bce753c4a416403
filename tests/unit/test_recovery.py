"""Recovery: the failure kinds, the retry decisions, the job spec's policy, the attempts' record
and report, and the engine's attempt loop in-process against a test double of the nodes."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from poll_stream_double import PollStreamDouble, lease_taken
from test_cli_in_process import HOSTS, _facts, _job, _patch_runner, lab  # noqa: F401 - the lab fixture
from test_plan_wiring import SHAPE_8B

from launcher.backends.runner import PlaybookResult
from launcher.exceptions import ConfigurationError
from launcher.follow import recovery
from launcher.follow.recovery import Failure, classify, decide
from launcher.follow.verdict import Judge
from launcher.main import cli
from launcher.node import status as node_status
from launcher.rundir.metrics import summarize
from launcher.rundir.report import attempt_lines
from launcher.rundir.runs import RunRecord
from launcher.spec.jobspec import RecoveryPolicy
from launcher.spec.jobspec_load import parse_job_spec

# torchrun's report of a rank killed by SIGKILL (the lines the agent reports as failure_lines)
KILLED = ["exitcode  : -9 (pid: 4242)", "traceback : Signal 9 (SIGKILL) received by PID 4242"]
# a rank out of GPU memory (ROCm's torch; the agent reports the trainer log's failure lines)
OUT_OF_MEMORY = {
    "state": "failed",
    "rc": 1,
    "failure_lines": ["torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB."],
}
# what the surviving rank's node says when its peer is gone: a collective error, exit status 1
PEER_GONE = {
    "state": "failed",
    "rc": 1,
    "failure_lines": ["exitcode  : 1 (pid: 77)"],
    "log_tail": "RuntimeError",
}


# --- classify -------------------------------------------------------------------------------------------


def test_a_rank_killed_on_host2_is_trainer_signal_on_host2_even_when_host1_is_named_first():
    nodes = {"host1": PEER_GONE, "host2": {"state": "failed", "rc": 1, "failure_lines": KILLED}}
    failure = classify("host1: trainer exited rc=1", nodes)
    assert (failure.kind, failure.host) == ("trainer_signal", "host2")
    assert "host1: trainer exited rc=1" in failure.reason


# --- torchrun's reports, captured (tests/fixtures/torchrun/README.md) ------------------------------------

REPORTS = Path(__file__).parents[1] / "fixtures" / "torchrun"


def _failed_node(name: str) -> dict[str, Any]:
    """One node's status as the agent reports it from a captured trainer.log (llamafactory-cli exits 1)."""
    return {"state": "failed", "rc": 1, **node_status._log_facts(REPORTS / name)}


@pytest.mark.parametrize(
    ("name", "exits"),
    [
        ("config-error.node0.log", [(0, -15), (1, 1)]),
        ("config-error.node1.log", [(2, 1), (3, 1)]),
        ("rank-killed.node0.log", [(0, 1), (1, -15)]),
        ("rank-killed.node1.log", [(2, -15), (3, -9)]),
    ],
)
def test_the_agent_reads_each_failed_ranks_exit_from_torchruns_report(
    name: str, exits: list[tuple[int, int]]
):
    assert [(e["rank"], e["exitcode"]) for e in _failed_node(name)["rank_exits"]] == exits


@pytest.mark.parametrize("named", ["host1", "host2"])
def test_every_rank_failing_by_itself_is_trainer_error_though_torchrun_sigtermed_a_sibling(named: str):
    """The CI failure of stop 34: node 0's report held torchrun's SIGTERM of a sibling (2 runs in 5)."""
    nodes = {"host1": _failed_node("config-error.node0.log"), "host2": _failed_node("config-error.node1.log")}
    assert "Signal 15 (SIGTERM) received" in "\n".join(nodes["host1"]["failure_lines"])
    failure = classify(f"{named}: trainer exited rc=1", nodes)
    assert failure.kind == "trainer_error", failure
    assert not decide(RecoveryPolicy(), [], failure).retry


@pytest.mark.parametrize("named", ["host1", "host2"])
def test_a_rank_killed_from_outside_is_trainer_signal_on_its_node_whichever_node_is_named(named: str):
    nodes = {"host1": _failed_node("rank-killed.node0.log"), "host2": _failed_node("rank-killed.node1.log")}
    failure = classify(f"{named}: trainer exited rc=1", nodes)
    assert (failure.kind, failure.host) == ("trainer_signal", "host2"), failure
    assert decide(RecoveryPolicy(), [], failure).retry


# torch's message when an NCCL/RCCL collective breaks because a peer went away (the text of NVIDIA/nccl issues
# #2076 and #934, where torch raised it): on a GPU cluster it is what host1's ranks say when host2's is killed
NCCL_PEER_GONE = [
    "torch.distributed.DistBackendError: NCCL error in: "
    "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1347, "
    "remote process exited or there was a network error, NCCL version 2.18.5",
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
]


@pytest.mark.parametrize("named", ["host1", "host2"])
def test_a_collective_broken_by_a_killed_peer_is_no_gpu_error_and_does_not_outrank_the_kill(named: str):
    host1 = _failed_node("rank-killed.node0.log")
    host1["failure_lines"] = NCCL_PEER_GONE + host1["failure_lines"]
    nodes = {"host1": host1, "host2": _failed_node("rank-killed.node1.log")}
    failure = classify(f"{named}: trainer exited rc=1", nodes)
    assert (failure.kind, failure.host) == ("trainer_signal", "host2"), failure
    assert recovery.excluded_after(failure, []) is None  # host1's healthy GPUs are not excluded
    assert Judge(["host1", "host2"])(nodes).reason == "host2: trainer exited rc=1"
    # a GPU error of host1's own still is one, next to the peer lines
    host1["failure_lines"] = [*NCCL_PEER_GONE, "RuntimeError: HIP error: an illegal memory access"]
    assert classify(f"{named}: trainer exited rc=1", nodes).kind == "gpu_error"


@pytest.mark.parametrize(
    ("codes", "outside"),
    [
        ([1, -15], []),  # torchrun stopped the sibling of a rank that failed by itself
        ([-15, -15], [15, 15]),  # every rank SIGTERMed: from outside (no rank failed by itself)
        ([-9, -15], [9, 15]),  # the OOM killer, then torchrun: no rank failed by itself
        ([1, -9], [9]),  # a sibling's gloo error raced torchrun's noticing the SIGKILL
        ([1, -6], [6]),  # an abort is never torchrun's
    ],
)
def test_outside_signals(codes: list[int], outside: list[int]):
    exits = [{"rank": rank, "exitcode": code} for rank, code in enumerate(codes)]
    assert recovery.outside_signals(exits) == outside


@pytest.mark.parametrize(
    ("reason", "nodes", "kind", "host"),
    [
        ("host2: unreachable for 2 polls (11 s)", {}, "node_lost", "host2"),
        ("host2: trainer vanished", {}, "node_lost", "host2"),
        ("host1: trainer exited rc=-9", {"host1": {"state": "failed", "rc": -9}}, "trainer_signal", "host1"),
        (
            "host1: trainer exited rc=137",
            {"host1": {"state": "failed", "rc": 137}},
            "trainer_signal",
            "host1",
        ),
        (
            "host1: trainer exited rc=1",
            {
                "host1": {
                    "state": "failed",
                    "rc": 1,
                    "failure_lines": ["torch.OutOfMemoryError: HIP out of memory"],
                }
            },
            "oom",
            "host1",
        ),
        (
            "host1: trainer exited rc=1",
            {
                "host1": PEER_GONE,
                "host2": {"state": "failed", "rc": 1, "failure_lines": ["HIP error: an illegal"]},
            },
            "gpu_error",
            "host2",
        ),
        (
            "host2: GPU 3: uncorrectable ECC errors rose from 0 to 1; trainer stopped",
            {
                "host1": PEER_GONE,
                "host2": {"state": "failed", "rc": -15, "gpu_fault": "GPU 3: uncorrectable ECC errors rose"},
            },
            "gpu_error",
            "host2",
        ),
        ("job_s timeout of 60 s reached", {}, "timeout", ""),
        ("host2: start failed: no llamafactory-cli", {}, "start_failed", "host2"),
        ("host1: trainers exited but output_dir lacks all_results.json", {}, "incomplete_output", "host1"),
        (
            "host1: trainer exited rc=1",
            {"host1": {"state": "failed", "rc": 1, "log_tail": "ValueError"}},
            "trainer_error",
            "host1",
        ),
        ("host1: trainer exited rc=2", {}, "trainer_error", "host1"),
    ],
)
def test_classify(reason: str, nodes: dict[str, Any], kind: str, host: str):
    failure = classify(reason, nodes)
    assert (failure.kind, failure.host) == (kind, host), failure


def test_a_stall_is_blamed_on_the_one_lagging_node_else_on_none():
    assert recovery.stall_failure("no progress for 60 s", ["host2"]) == Failure(
        "stall", "host2", "no progress for 60 s"
    )
    assert recovery.stall_failure("no progress for 60 s", ["host1", "host2"]).host == ""


# --- decide ---------------------------------------------------------------------------------------------


POLICY = RecoveryPolicy()  # the job spec's defaults: 3 restarts, node/signal/stall/GPU, 30 s, same twice


def test_defaults_live_in_the_recovery_module():
    assert POLICY.max_restarts == recovery.DEFAULT_MAX_RESTARTS == 3
    assert (
        POLICY.retry_on == recovery.DEFAULT_RETRY_ON == ("node_lost", "trainer_signal", "stall", "gpu_error")
    )
    assert POLICY.backoff_s == recovery.DEFAULT_BACKOFF_S == 30.0
    assert POLICY.same_failure_limit == recovery.DEFAULT_SAME_FAILURE_LIMIT == 2


def test_a_killed_trainer_is_retried_after_the_backoff():
    decision = decide(POLICY, [], Failure("trainer_signal", "host2", "host2: trainer exited rc=-9"))
    assert decision.retry and decision.backoff_s == 30.0
    assert decision.why == "retrying: trainer_signal is in recovery.retry_on; restart 1 of 3 in 30 s"


@pytest.mark.parametrize("kind", ["trainer_error", "start_failed", "incomplete_output", "timeout"])
def test_what_the_job_itself_does_wrong_is_not_retried_by_default(kind: str):
    decision = decide(POLICY, [], Failure(kind, "host1", "x"))
    assert not decision.retry
    assert decision.why.startswith(f"not retried: {kind} is not in recovery.retry_on")


OOM = Failure("oom", "host1", "host1: trainer exited rc=1")


def test_out_of_memory_with_a_fixed_plan_is_not_retried_and_the_line_says_how_to_let_the_launcher_re_plan():
    """oom was in the list above ("not in recovery.retry_on") before item 6: its line now says why and how."""
    decision = decide(POLICY, [], OOM)
    assert not decision.retry
    assert decision.why == (
        "not retried: out of memory: a fixed plan (plan: as_written) would run out again; set plan: auto in "
        "the job spec to let the launcher re-plan with a larger margin (recovery.replan_oom)"
    )


def test_out_of_memory_under_plan_auto_is_re_planned_by_default():
    assert POLICY.replan_oom is recovery.DEFAULT_REPLAN_OOM is True
    decision = decide(POLICY, [], OOM, replan=True)
    assert decision.retry and decision.backoff_s == 30.0
    assert decision.why == (
        "re-planning: out of memory under plan: auto, the next plan that fits with a larger margin; "
        "restart 1 of 3 in 30 s"
    )
    # each re-planned attempt runs another plan: a second out of memory on the same node is not "the same
    # failure twice in a row"; the retry budget still bounds it
    assert decide(POLICY, [OOM], OOM, replan=True).retry
    used_up = decide(POLICY, [OOM, OOM, OOM], OOM, replan=True)
    assert not used_up.retry and used_up.why == "not retried: the retry budget is used up (3 of 3 restarts)"


def test_replan_oom_false_and_max_restarts_zero_switch_the_re_plan_off():
    off = decide(RecoveryPolicy(replan_oom=False), [], OOM, replan=True)
    assert not off.retry and off.why == "not retried: out of memory, and recovery.replan_oom is false"
    assert not decide(RecoveryPolicy(max_restarts=0), [], OOM, replan=True).retry
    assert RecoveryPolicy(retry_on=(), replan_oom=True).enabled  # re-planning alone is a policy that retries
    assert not RecoveryPolicy(retry_on=(), replan_oom=False).enabled


@pytest.mark.parametrize("kind", ["config_error", "preflight"])
def test_a_config_or_preflight_failure_is_never_retried(kind: str):
    decision = decide(POLICY, [], Failure(kind, "", "x"))
    assert not decision.retry and "is never retried" in decision.why


def test_the_same_failure_twice_in_a_row_ends_the_run():
    first = Failure("trainer_signal", "host2", "a")
    decision = decide(POLICY, [first], Failure("trainer_signal", "host2", "b"))
    assert not decision.retry
    assert decision.why == (
        "not retried: trainer_signal on host2 2 times in a row (recovery.same_failure_limit 2)"
    )
    # on another node it is another failure: retried
    assert decide(POLICY, [first], Failure("trainer_signal", "host1", "b")).retry


def test_the_retry_budget_runs_out():
    policy = RecoveryPolicy(max_restarts=2, same_failure_limit=5)
    failures = [Failure("node_lost", "host2", "x"), Failure("trainer_signal", "host1", "y")]
    assert decide(policy, failures[:1], failures[1]).retry
    decision = decide(policy, failures, Failure("node_lost", "host2", "z"))
    assert not decision.retry
    assert decision.why == "not retried: the retry budget is used up (2 of 2 restarts)"


def test_max_restarts_zero_switches_recovery_off():
    policy = RecoveryPolicy(max_restarts=0)
    assert not policy.enabled
    assert not decide(policy, [], Failure("node_lost", "host2", "x")).retry


# --- the job spec's recovery key --------------------------------------------------------------------------


def _spec(tmp_path: Path, recovery_value: object) -> None:
    parse_job_spec({"name": "j", "train_config": "t.yaml", "recovery": recovery_value}, tmp_path / "job.yaml")


def test_job_spec_accepts_a_policy(tmp_path: Path):
    spec = parse_job_spec(
        {"name": "j", "train_config": "t.yaml", "recovery": {"max_restarts": 1, "retry_on": ["node_lost"]}},
        tmp_path / "job.yaml",
    )
    assert spec.recovery.max_restarts == 1 and spec.recovery.retry_on == ("node_lost",)
    assert spec.recovery.backoff_s == recovery.DEFAULT_BACKOFF_S


@pytest.mark.parametrize(
    ("value", "where", "message"),
    [
        ({"retry_on": ["node_lots"]}, "recovery.retry_on", "'node_lots' is not a failure kind"),
        (
            {"retry_on": ["config_error"]},
            "recovery.retry_on",
            "config_error: a bad job spec or config is never",
        ),
        (
            {"retry_on": ["preflight"]},
            "recovery.retry_on",
            "preflight: a validation or preflight failure is never",
        ),
        (
            {"retry_on": ["oom"]},
            "recovery.retry_on",
            "oom: out of memory is never retried as is (the same plan runs out again); with plan: auto, "
            "recovery.replan_oom (default true) re-plans it",
        ),
        ({"max_restarts": -1}, "recovery.max_restarts", "greater than or equal to 0"),
        ({"same_failure_limit": 1}, "recovery.same_failure_limit", "greater than or equal to 2"),
        ({"max_restart": 2}, "recovery.max_restart", "unknown key; did you mean 'max_restarts'?"),
    ],
)
def test_job_spec_refuses_a_bad_policy_in_one_line(tmp_path: Path, value: object, where: str, message: str):
    with pytest.raises(ConfigurationError) as err:
        _spec(tmp_path, value)
    (problem,) = err.value.problems
    assert problem.key == where and message in problem.message, problem


# --- the record: attempts in status, list and the report ----------------------------------------------------


RECORD = {
    "run_id": "r",
    "status": "succeeded",
    "attempts": [
        {
            "attempt": 1,
            "started_at": 0,
            "ended_at": 60,
            "state": "failed",
            "hosts": ["host1", "host2"],
            "resume_step": None,
            "kind": "trainer_signal",
            "reason": "host2: trainer exited rc=1",
            "decision": "retrying: trainer_signal is in recovery.retry_on; restart 1 of 3 in 30 s",
        },
        {
            "attempt": 2,
            "started_at": 90,
            "ended_at": 200,
            "state": "succeeded",
            "hosts": ["host1", "host2"],
            "resume_step": 4,
        },
    ],
}


def test_attempt_lines_list_every_attempt():
    lines = attempt_lines(RunRecord.of(RECORD))
    assert len(lines) == 2
    assert (
        "attempt 1  failed" in lines[0] and "nodes host1,host2  from step 0 trainer_signal: host2" in lines[0]
    )
    assert lines[0].endswith("-> retrying: trainer_signal is in recovery.retry_on; restart 1 of 3 in 30 s")
    assert "attempt 2  succeeded" in lines[1] and lines[1].endswith("from checkpoint-4")
    # one attempt that no failure ended: nothing to show
    assert attempt_lines(RunRecord.of({"attempts": [{"attempt": 1, "state": "succeeded"}]})) == []


def test_attempt_lines_show_each_attempts_plan_under_plan_auto():
    plans = [
        {
            "strategy": "zero3",
            "micro_batch": 4,
            "gradient_accumulation_steps": 2,
            "gradient_checkpointing": False,
            "offload": "none",
            "margin": 0.1,
            "global_batch": 16,
        },
        {
            "strategy": "zero3_offload_opt",
            "micro_batch": 2,
            "gradient_accumulation_steps": 4,
            "gradient_checkpointing": True,
            "offload": "optimizer",
            "margin": 0.2,
            "global_batch": 16,
        },
    ]
    record = {
        **RECORD,
        "attempts": [{**a, "plan": p} for a, p in zip(RECORD["attempts"], plans, strict=True)],
    }
    first, second = attempt_lines(RunRecord.of(record))
    assert (
        "from step 0  [plan zero3, micro-batch 4 x accumulation 2, checkpointing off, offload none, "
        "margin 10%] trainer_signal: host2" in first
    )
    assert second.endswith(
        "from checkpoint-4  [plan zero3_offload_opt, micro-batch 2 x accumulation 4, checkpointing on, "
        "offload optimizer, margin 20%]"
    )


def test_list_shows_the_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path))
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "record.json").write_text(json.dumps({**RECORD, "created_at": 1}))
    assert cli(["list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[-1] == "ATTEMPTS" and row.endswith("2 (trainer_signal)")


def test_losses_of_a_resumed_attempt_count_once_per_step():
    log = [{"current_steps": s, "loss": 1.0 + s} for s in (1, 2, 3, 4, 5, 6)]
    log += [{"current_steps": s, "loss": 2.0 + s} for s in (5, 6, 7)]
    summary = summarize(log, {})
    assert [s for s, _ in summary.losses] == [1, 2, 3, 4, 5, 6, 7]
    assert dict(summary.losses)[5] == 7.0 and summary.final_loss == 9.0


# --- the engine: attempts against a test double of the nodes -----------------------------------------------


class FlakyNodesDouble(PollStreamDouble):
    """Test double of PlaybookRunner: two healthy nodes whose first attempt fails (host2's rank SIGKILLed at
    step 6, checkpoint-4 complete on both) and whose second attempt finishes; records every playbook run."""

    calls: list[tuple[str, dict[str, Any]]]
    launches = 0
    on_stop: Any = None
    polls = 0
    slow_cause = 0  # polls after host1's failure before host2's reaches its state
    # how the first attempt fails: "signal", "gpu" (telemetry's fault), "stall", "oom"; "oom_always": each
    first_fault = "signal"
    shipped_all: list[dict[str, Any]]  # every launch's bundles (host -> bundle), in order

    def __init__(self, private_data_dir: Path, *, inventory: Path | None = None, **_: Any) -> None:
        self.cancel_requested = threading.Event()
        private_data_dir.mkdir(parents=True, exist_ok=True)

    def run(self, playbook: str, extravars: dict[str, Any], **_: Any) -> PlaybookResult:
        FlakyNodesDouble.calls.append((playbook, extravars))
        if playbook == "stop" and FlakyNodesDouble.on_stop is not None:
            FlakyNodesDouble.on_stop()
        result = PlaybookResult(playbook=playbook, rc=0, status="successful")
        if playbook == "preflight":
            ckpts = [4] if FlakyNodesDouble.launches else []
            result.reports = {
                h: {"preflight": {**_facts(h), "probe": {**_facts(h)["probe"], "checkpoints": ckpts}}}
                for h in HOSTS
            }
        elif playbook == "launch":
            FlakyNodesDouble.launches += 1
            files = Path(extravars["mift_files_dir"])
            FlakyNodesDouble.shipped = {h: json.loads((files / h / "bundle.json").read_text()) for h in HOSTS}
            FlakyNodesDouble.shipped_all = [
                *getattr(FlakyNodesDouble, "shipped_all", []),
                FlakyNodesDouble.shipped,
            ]
            result.reports = {
                h: {"start": {"ok": True, "state": "running"}, **lease_taken(extravars)} for h in HOSTS
            }
        elif playbook == "poll":
            FlakyNodesDouble.polls += 1
            killed = {"state": "failed", "rc": 1, "failure_lines": KILLED}
            if FlakyNodesDouble.launches == 1 and FlakyNodesDouble.polls <= FlakyNodesDouble.slow_cause:
                nodes = {"host1": PEER_GONE, "host2": {"state": "running"}}
            elif FlakyNodesDouble.launches == 1 and FlakyNodesDouble.first_fault == "stall":
                nodes = {"host1": {"state": "running"}, "host2": {"state": "running"}}  # no step, ever
            elif FlakyNodesDouble.first_fault == "oom_always" or (
                FlakyNodesDouble.launches == 1 and FlakyNodesDouble.first_fault == "oom"
            ):
                nodes = {"host1": OUT_OF_MEMORY, "host2": PEER_GONE}
            elif FlakyNodesDouble.launches == 1 and FlakyNodesDouble.first_fault == "gpu":
                broken = {"state": "failed", "rc": -15, "gpu_fault": "GPU 3: uncorrectable ECC errors rose"}
                nodes = {"host1": {"state": "running"}, "host2": broken}
            elif FlakyNodesDouble.launches == 1:
                nodes = {"host1": PEER_GONE, "host2": killed}
            else:
                done = {"state": "finished", "rc": 0, "outputs_complete": True}
                nodes = {"host1": done, "host2": {"state": "finished", "rc": 0}}
            result.reports = {h: {"status": n} for h, n in nodes.items()}
        return result

    shipped: dict[str, Any]


def _run_flaky(
    folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    job: Path,
    *,
    first_fault: str = "signal",
    slow_cause: int = 0,
    on_stop: Any = None,
) -> int:
    """`launcher run` of `job` (inventory: the lab `folder`'s hosts.ini) against a fresh FlakyNodesDouble
    whose first attempt fails by `first_fault` (`slow_cause` polls late, `on_stop` called at each stop); the
    double's settings are set back after."""
    FlakyNodesDouble.calls, FlakyNodesDouble.launches, FlakyNodesDouble.on_stop = [], 0, on_stop
    FlakyNodesDouble.first_fault, FlakyNodesDouble.shipped_all = first_fault, []
    FlakyNodesDouble.polls, FlakyNodesDouble.slow_cause = 0, slow_cause
    _patch_runner(monkeypatch, FlakyNodesDouble)
    try:
        return cli(["run", str(job), "-i", str(folder / "hosts.ini")])
    finally:
        FlakyNodesDouble.first_fault, FlakyNodesDouble.slow_cause = "signal", 0
        FlakyNodesDouble.on_stop = None


def _record(folder: Path, name: str) -> dict[str, Any]:
    """The record.json of the run named `name` in the lab's folder."""
    return json.loads(next((folder / "runs").glob(f"{name}-*/record.json")).read_text())


def test_a_failed_attempt_is_retried_from_the_last_common_checkpoint(lab, monkeypatch, capsys):  # noqa: F811
    job = _job(lab, "flaky", "plain.yaml", poll_interval_s=0.5, recovery={"backoff_s": 0})
    rc = _run_flaky(lab, monkeypatch, job)
    out = capsys.readouterr().out
    assert rc == 0, out
    record = _record(lab, "flaky")
    assert record["status"] == "succeeded"
    first, second = record["attempts"]
    assert (first["state"], first["kind"], first["failed_host"], first["resume_step"]) == (
        "failed",
        "trainer_signal",
        "host2",
        None,
    )
    assert (second["state"], second["resume_step"], second["hosts"]) == ("succeeded", 4, list(HOSTS))
    assert "attempt 1 failed (trainer_signal on host2): retrying" in out
    assert "resuming from output/checkpoint-4 (complete on every node)" in out
    # every node was stopped between the attempts, and the second preflight listed output_dir's checkpoints
    playbooks = [name for name, _ in FlakyNodesDouble.calls]
    assert playbooks.index("stop") < playbooks.index("launch", playbooks.index("launch") + 1)
    second_preflight = [v for name, v in FlakyNodesDouble.calls if name == "preflight"][1]
    assert second_preflight["mift_checkpoints_of"] == "output"
    train = FlakyNodesDouble.shipped["host1"]["files"]["train.yaml"]
    assert "resume_from_checkpoint: output/checkpoint-4" in train and "overwrite_output_dir: false" in train
    assert "attempt 2  succeeded" in out  # the final report lists both attempts


def test_a_failure_not_in_retry_on_ends_the_run_with_one_attempt(lab, monkeypatch, capsys):  # noqa: F811
    job = _job(lab, "noretry", "plain.yaml", poll_interval_s=0.5, recovery={"retry_on": ["node_lost"]})
    assert _run_flaky(lab, monkeypatch, job) == 1
    out = capsys.readouterr().out
    record = _record(lab, "noretry")
    assert record["status"] == "failed" and len(record["attempts"]) == 1
    assert "not retried: trainer_signal is not in recovery.retry_on (node_lost)" in out
    assert FlakyNodesDouble.launches == 1


def test_an_explicit_policy_with_detach_is_refused_in_one_line(lab, monkeypatch, capsys):  # noqa: F811
    _patch_runner(monkeypatch, FlakyNodesDouble)
    job = _job(lab, "det", "plain.yaml", recovery={"max_restarts": 2})
    assert cli(["run", str(job), "-i", str(lab / "hosts.ini"), "--detach"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "recovery: a detached run is not followed" in lines[0], lines


def test_launcher_stop_during_the_backoff_ends_the_run(lab, monkeypatch, capsys):  # noqa: F811
    """`launcher stop` from another terminal while the run waits to retry: no next attempt."""
    from launcher.rundir.runs import list_runs  # noqa: PLC0415

    job = _job(lab, "stopped", "plain.yaml", poll_interval_s=0.5, recovery={"backoff_s": 0})

    def stop() -> None:
        list_runs()[-1].set_status("stopped", "stopped by `launcher stop`")

    assert _run_flaky(lab, monkeypatch, job, on_stop=stop) == 1
    assert "stopped while waiting to retry" in capsys.readouterr().out
    assert FlakyNodesDouble.launches == 1


@pytest.mark.parametrize("late", [1, 2])
def test_the_cause_reported_polls_late_is_still_the_cause(lab, monkeypatch, capsys, late: int):  # noqa: F811
    """host1's rank fails first (its peer is gone), host2's SIGKILL shows one or two polls later: the engine
    polls again (up to SETTLE_POLLS) before judging: the failure is trainer_signal on host2 (retried), not
    host1's trainer_error."""
    job = _job(lab, "slow", "plain.yaml", poll_interval_s=0.5, recovery={"backoff_s": 0})
    assert _run_flaky(lab, monkeypatch, job, slow_cause=late) == 0
    record = _record(lab, "slow")
    first = record["attempts"][0]
    assert (first["kind"], first["failed_host"]) == ("trainer_signal", "host2"), first
    assert "attempt 1 failed (trainer_signal on host2): retrying" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("fault", "kind", "host", "dumped"),
    [("gpu", "gpu_error", "host2", False), ("stall", "stall", "", True)],
)
def test_a_gpu_fault_or_a_stall_is_retried(lab, monkeypatch, capsys, fault, kind, host, dumped):  # noqa: F811
    """The telemetry's GPU fault and the watchdog's stall are failures the default policy retries; the stop
    after a stall dumps the stacks first, as the stop that ends a stalled run does."""
    watchdog = {"first_step_s": 1, "floor_s": 1}
    job = _job(lab, fault, "plain.yaml", poll_interval_s=0.5, recovery={"backoff_s": 0}, watchdog=watchdog)
    rc = _run_flaky(lab, monkeypatch, job, first_fault=fault)
    out = capsys.readouterr().out
    assert rc == 0, out
    record = _record(lab, fault)
    first, second = record["attempts"]
    assert (first["kind"], first["failed_host"] or "") == (kind, host), first
    assert first["state"] == ("stalled" if fault == "stall" else "failed")
    assert second["state"] == "succeeded" and record["status"] == "succeeded"
    stops = [v for name, v in FlakyNodesDouble.calls if name == "stop"]
    assert [bool(v.get("mift_stop_dump")) for v in stops] == [dumped], stops


def test_a_stall_not_retried_ends_the_run_stalled(lab, monkeypatch, capsys):  # noqa: F811
    watchdog = {"first_step_s": 1, "floor_s": 1}
    job = _job(
        lab,
        "stuck",
        "plain.yaml",
        poll_interval_s=0.5,
        recovery={"retry_on": ["node_lost"]},
        watchdog=watchdog,
    )
    assert _run_flaky(lab, monkeypatch, job, first_fault="stall") == 1
    out = capsys.readouterr().out
    record = _record(lab, "stuck")
    assert record["status"] == "stalled" and len(record["attempts"]) == 1, record["attempts"]
    assert "not retried: stall is not in recovery.retry_on (node_lost)" in out
    assert FlakyNodesDouble.launches == 1


# --- out of memory, re-planned ------------------------------------------------------------------------------


def _auto_job(lab: Path, name: str, **extra: Any) -> Path:  # noqa: F811 - the lab fixture's folder
    """A plan: auto job: the tiny YAML at accumulation 4 (global batch 8 on 2 x 1 GPU), planned with an 8B
    shape (plan_model_config: the tiny model is a node path)."""
    import yaml  # noqa: PLC0415

    train = yaml.safe_load((lab / "configs" / "train" / "plain.yaml").read_text())
    train.update(per_device_train_batch_size=1, gradient_accumulation_steps=4)
    (lab / "configs" / "train" / "ga4.yaml").write_text(yaml.safe_dump(train))
    model = lab / "configs" / "jobs" / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(SHAPE_8B))
    return _job(lab, name, "ga4.yaml", plan="auto", plan_model_config="model", **extra)


def _split(bundle: dict[str, Any]) -> tuple[int, int, bool]:
    import yaml  # noqa: PLC0415

    train = yaml.safe_load(bundle["files"]["train.yaml"])
    return (
        train["per_device_train_batch_size"],
        train["gradient_accumulation_steps"],
        bool(train["disable_gradient_checkpointing"]),
    )


def test_out_of_memory_under_plan_auto_ships_a_smaller_plan_at_the_same_global_batch(
    lab,  # noqa: F811
    monkeypatch,
    capsys,
):
    job = _auto_job(lab, "oomauto", poll_interval_s=0.5, recovery={"backoff_s": 0})
    rc = _run_flaky(lab, monkeypatch, job, first_fault="oom")
    out = capsys.readouterr().out
    print(out)
    assert rc == 0, out
    record = _record(lab, "oomauto")
    first, second = record["attempts"]
    assert (first["state"], first["kind"], first["failed_host"]) == ("failed", "oom", "host1")
    assert first["decision"].startswith("re-planning: out of memory under plan: auto")
    assert (second["state"], second["resume_step"]) == ("succeeded", 4)
    # each attempt's record holds the plan it ran: a smaller split, the same global batch, a larger margin
    print(json.dumps([first["plan"], second["plan"]], indent=1))
    assert first["plan"]["global_batch"] == second["plan"]["global_batch"] == 8
    assert (first["plan"]["margin"], second["plan"]["margin"]) == (0.1, 0.2)
    assert first["plan"] != second["plan"]
    # what was shipped: another micro-batch x accumulation (or checkpointing), the same product x 2 GPUs
    shipped = [_split(bundles["host1"]) for bundles in FlakyNodesDouble.shipped_all]
    assert len(shipped) == 2 and shipped[0] != shipped[1], shipped
    assert [micro * accumulation * 2 for micro, accumulation, _ in shipped] == [8, 8]
    assert [
        (p["micro_batch"], p["gradient_accumulation_steps"]) for p in (first["plan"], second["plan"])
    ] == [s[:2] for s in shipped]
    second_yaml = FlakyNodesDouble.shipped_all[1]["host1"]["files"]["train.yaml"]
    assert "resume_from_checkpoint: output/checkpoint-4" in second_yaml
    assert "attempt 1 failed (oom on host1): re-planning: out of memory under plan: auto" in out
    assert "re-planned after out of memory: " in out and "(global batch 8, margin 20%; was " in out
    assert "margin 10%]" in out and "margin 20%]" in out  # the final report's attempt lines


def test_out_of_memory_with_a_fixed_plan_ends_the_run_with_one_attempt(lab, monkeypatch, capsys):  # noqa: F811
    job = _job(lab, "oomfixed", "plain.yaml", poll_interval_s=0.5, recovery={"backoff_s": 0})
    assert _run_flaky(lab, monkeypatch, job, first_fault="oom") == 1
    out = capsys.readouterr().out
    record = _record(lab, "oomfixed")
    assert record["status"] == "failed" and len(record["attempts"]) == 1
    assert "plan" not in record["attempts"][0]
    assert (
        "attempt 1 failed (oom on host1): not retried: out of memory: a fixed plan (plan: as_written) would "
        "run out again; set plan: auto in the job spec to let the launcher re-plan with a larger margin"
        in out
    )
    assert FlakyNodesDouble.launches == 1


def test_out_of_memory_every_time_shrinks_the_plan_until_nothing_fits_then_stops_with_the_numbers(
    lab,  # noqa: F811
    monkeypatch,
    capsys,
):
    job = _auto_job(lab, "oomall", poll_interval_s=0.5, recovery={"backoff_s": 0, "max_restarts": 10})
    assert _run_flaky(lab, monkeypatch, job, first_fault="oom_always") == 1
    out = capsys.readouterr().out
    record = _record(lab, "oomall")
    plans = [a["plan"] for a in record["attempts"]]
    print("\n".join(attempt_lines(RunRecord.of(record))))
    assert record["status"] == "failed" and len(plans) == FlakyNodesDouble.launches >= 2
    assert [round(p["margin"], 2) for p in plans] == [round(0.1 * (i + 1), 2) for i in range(len(plans))]
    assert {p["global_batch"] for p in plans} == {8}
    assert len({(p["micro_batch"], p["gradient_checkpointing"]) for p in plans}) == len(plans)  # each another
    last = record["attempts"][-1]["decision"]
    print(last)
    assert last.startswith(
        "not retried: out of memory with no DeepSpeed (DDP), micro-batch 1 x accumulation 4"
    )
    # the nodes report no GPU memory: the planner's default (MI300X, 191.98 GiB)
    assert (
        "GiB per GPU of 192.0 GiB); no plan at global batch 8 needs less GPU memory with the same checkpoint "
        "layout (none)" in last
    )
    assert [ln for ln in out.splitlines() if ln.startswith(f"attempt {len(plans)} failed")] == [
        f"attempt {len(plans)} failed (oom on host1): {last}"
    ]


# --- spares: exclusion, the spare's choice, the refusals, the fewer-nodes line -----------------------------


def _failure(kind: str, host: str = "host2") -> Failure:
    return Failure(kind, host, f"{host}: {kind}")


@pytest.mark.parametrize("kind", ["node_lost", "gpu_error"])
def test_a_lost_node_or_a_gpu_error_excludes_the_node_at_once(kind: str):
    assert recovery.excluded_after(_failure(kind), []) == "host2"


def test_a_stall_excludes_the_node_only_the_second_time_on_it():
    assert recovery.excluded_after(_failure("stall"), []) is None
    assert recovery.excluded_after(_failure("stall"), [_failure("stall", "host1")]) is None
    # not in a row: a signal in between does not reset what the node did before
    earlier = [_failure("stall"), _failure("trainer_signal", "host1")]
    assert recovery.excluded_after(_failure("stall"), earlier) == "host2"


@pytest.mark.parametrize("kind", ["trainer_signal", "trainer_error", "oom", "start_failed"])
def test_a_failure_of_the_job_or_its_process_excludes_no_node(kind: str):
    assert recovery.excluded_after(_failure(kind), [_failure(kind)]) is None


def test_a_failure_blamed_on_no_node_excludes_none():
    assert (
        recovery.excluded_after(Failure("stall", "", "every node at step 6"), [_failure("stall", "")]) is None
    )


def test_spares_are_tried_in_inventory_order_skipping_those_in_use_or_excluded():
    spares = ["host3", "host4", "host1", "host5"]
    assert recovery.spare_candidates(spares, ["host1", "host2"], ["host2", "host4"]) == ["host3", "host5"]
    assert recovery.spare_candidates([], ["host1"], []) == []


def test_the_spare_takes_the_excluded_nodes_rank_slot():
    assert recovery.replace_host(["host1", "host2", "host4"], "host2", "host3") == ["host1", "host3", "host4"]


def test_no_spare_left_ends_with_one_line_saying_why_not_fewer_nodes():
    line = recovery.fewer_nodes_line("host2", ["host1", "host2"], 2, {})
    assert "\n" not in line
    assert line.startswith("not retried: host2 is excluded and no spare left in recovery.spares; ")
    assert "not continuing on 1 node(s): the checkpoint was written by 4 ranks" in line
    assert "on 2 ranks needs DeepSpeed's universal checkpoint conversion, not done here" in line
    tried = recovery.fewer_nodes_line("host2", ["host1", "host2"], 2, {"host3": "host3: unreachable"})
    assert "no spare passed preflight (host3: host3: unreachable)" in tried


def _spares_spec(tmp_path: Path, **extra: Any) -> None:
    parse_job_spec({"name": "j", "train_config": "t.yaml", **extra}, tmp_path / "job.yaml")


@pytest.mark.parametrize(
    ("extra", "where", "message"),
    [
        (
            {"recovery": {"spares": "spares"}},
            "recovery.spares",
            "recovery.spares: the checkpoints would be on node-local disks (output_dir output), and a lost "
            "node's ZeRO shards die with it, so no spare could resume; put output_dir on a file system every "
            "node sees and set output_shared: true",
        ),
        (
            {"output_shared": True},
            "output_shared",
            "output_shared: needs an absolute output_dir on the shared file system",
        ),
        (
            {
                "recovery": {"spares": "spares", "max_restarts": 0},
                "output_shared": True,
                "output_dir": "/s/o",
            },
            "recovery.spares",
            "recovery.spares: recovery is off (recovery.max_restarts: 0)",
        ),
        (
            {
                "recovery": {"spares": "spares"},
                "output_shared": True,
                "output_dir": "/s/{run_id}",
                "stage": {"model": {"controller": "/m"}},
            },
            "recovery.spares",
            "recovery.spares: a spare would lack the folders the job stages (stage:); not supported yet",
        ),
    ],
)
def test_job_spec_refuses_a_spares_policy_that_cannot_work_in_one_line(
    tmp_path: Path, extra: dict[str, Any], where: str, message: str
):
    with pytest.raises(ConfigurationError) as err:
        _spares_spec(tmp_path, **extra)
    (problem,) = err.value.problems
    assert problem.key == where and message in f"{problem.key}: {problem.message}", problem
    assert "\n" not in problem.message


def test_job_spec_accepts_spares_with_a_shared_output_dir(tmp_path: Path):
    spec = parse_job_spec(
        {
            "name": "j",
            "train_config": "t.yaml",
            "recovery": {"spares": "spares"},
            "output_shared": True,
            "output_dir": "/srv/shared/{run_id}/output",
        },
        tmp_path / "job.yaml",
    )
    assert spec.recovery.spares == "spares" and spec.output_shared


def test_attempt_lines_say_which_spare_took_whose_place():
    record = {
        "attempts": [
            {**RECORD["attempts"][0], "kind": "node_lost"},
            {**RECORD["attempts"][1], "hosts": ["host1", "host3"], "replaced": {"host2": "host3"}},
        ]
    }
    lines = attempt_lines(RunRecord.of(record))
    assert "nodes host1,host3 (host3 in host2's place)  from checkpoint-4" in lines[1]


class SpareNodesDouble(PollStreamDouble):
    """Test double of PlaybookRunner: trainers host1, host2 and the spare host3 (the inventory's ``spares``)
    on a shared output_dir. The first attempt fails with a GPU error on host2 (checkpoint-4 complete); later
    attempts finish. ``spare_down``: host3 is unreachable (its preflight fails)."""

    calls: list[tuple[str, dict[str, Any]]]
    launches = 0
    spare_down = False
    spare_blind = False  # host3 does not see the shared output_dir's checkpoints (not shared after all)
    started: list[list[str]]  # the nodes of each launch

    def __init__(self, private_data_dir: Path, *, inventory: Path | None = None, **_: Any) -> None:
        self.cancel_requested = threading.Event()
        private_data_dir.mkdir(parents=True, exist_ok=True)

    def run(self, playbook: str, extravars: dict[str, Any], **_: Any) -> PlaybookResult:
        SpareNodesDouble.calls.append((playbook, extravars))
        hosts = [h for h in str(extravars.get("mift_hosts") or "").split(",") if h]
        result = PlaybookResult(playbook=playbook, rc=0, status="successful")
        if playbook == "preflight":
            if SpareNodesDouble.spare_down and "host3" in hosts:
                result.rc, result.status = 4, "failed"
                result.unreachable = ["host3"]
                result.failures = {"host3": "ssh: connect to host host3 port 22: No route to host"}
                return result
            ckpts = [4] if SpareNodesDouble.launches else []
            result.reports = {
                h: {
                    "preflight": {
                        **_facts("host1"),
                        "train_address": f"10.0.0.{h[-1]}",
                        "probe": {
                            **_facts("host1")["probe"],
                            "checkpoints": [] if h == "host3" and SpareNodesDouble.spare_blind else ckpts,
                        },
                        "play_hosts": hosts,
                    }
                }
                for h in hosts
            }
        elif playbook == "launch":
            SpareNodesDouble.launches += 1
            SpareNodesDouble.started.append(hosts)
            result.reports = {
                h: {"start": {"ok": True, "state": "running"}, **lease_taken(extravars)} for h in hosts
            }
        elif playbook == "poll":
            running = SpareNodesDouble.started[-1]
            if SpareNodesDouble.launches == 1:
                broken = {"state": "failed", "rc": -15, "gpu_fault": "GPU 3: uncorrectable ECC errors rose"}
                nodes = {"host1": {"state": "running"}, "host2": broken}
            else:
                nodes = {
                    h: {"state": "finished", "rc": 0, "outputs_complete": i == 0}
                    for i, h in enumerate(running)
                }
            result.reports = {h: {"status": n} for h, n in nodes.items()}
        return result


def _spares_job(lab: Path, name: str) -> Path:  # noqa: F811 - the lab fixture's folder
    (lab / "hosts.ini").write_text("[trainers]\nhost1\nhost2\n\n[spares]\nhost3\n")
    return _job(
        lab,
        name,
        "plain.yaml",
        poll_interval_s=0.5,
        recovery={"backoff_s": 0, "spares": "spares"},
        output_shared=True,
        output_dir="/srv/shared/{run_id}/output",
    )


def test_a_spare_takes_the_place_of_a_node_with_a_gpu_error(lab, monkeypatch, capsys):  # noqa: F811
    SpareNodesDouble.calls, SpareNodesDouble.launches, SpareNodesDouble.started = [], 0, []
    SpareNodesDouble.spare_down = SpareNodesDouble.spare_blind = False
    _patch_runner(monkeypatch, SpareNodesDouble)
    rc = cli(["run", str(_spares_job(lab, "spare")), "-i", str(lab / "hosts.ini")])
    out = capsys.readouterr().out
    assert rc == 0, out
    record = _record(lab, "spare")
    first, second = record["attempts"]
    assert (first["kind"], first["failed_host"], first["hosts"]) == ("gpu_error", "host2", ["host1", "host2"])
    assert "host2 excluded, spare host3 next (of host3)" in first["decision"]
    assert (second["hosts"], second["replaced"], second["resume_step"]) == (
        ["host1", "host3"],
        {"host2": "host3"},
        4,
    )
    assert list(record["excluded"]) == ["host2"]
    assert SpareNodesDouble.started == [["host1", "host2"], ["host1", "host3"]]
    # the spare's preflight ran with the survivor, and listed the shared output_dir's checkpoints
    second_preflight = [v for name, v in SpareNodesDouble.calls if name == "preflight"][1]
    assert second_preflight["mift_hosts"] == "host1,host3"
    assert second_preflight["mift_checkpoints_of"].startswith("/srv/shared/spare-")
    assert "spare host3 takes host2's place (node rank 1); nodes: host1, host3" in out
    # on shared storage the ranks write one checkpoint: no per-node copies
    train = yaml.safe_load(
        lab.joinpath("runs").glob("spare-*").__next__().joinpath("files", "host3", "train.yaml").read_text()
    )
    assert "save_on_each_node" not in train
    assert train["resume_from_checkpoint"].endswith("/output/checkpoint-4")


def test_no_spare_passing_preflight_ends_the_run_saying_why_not_fewer_nodes(lab, monkeypatch, capsys):  # noqa: F811
    SpareNodesDouble.calls, SpareNodesDouble.launches, SpareNodesDouble.started = [], 0, []
    SpareNodesDouble.spare_down, SpareNodesDouble.spare_blind = True, False
    _patch_runner(monkeypatch, SpareNodesDouble)
    rc = cli(["run", str(_spares_job(lab, "nospare")), "-i", str(lab / "hosts.ini")])
    out = capsys.readouterr().out
    assert rc == 1, out
    record = _record(lab, "nospare")
    assert record["status"] == "failed" and SpareNodesDouble.launches == 1
    assert set(record["excluded"]) == {"host2", "host3"}
    assert "spare host3: excluded: ssh: connect to host host3 port 22: No route to host" in out
    assert "no spare passed preflight (host3: ssh: connect to host host3" in record["result_reason"]
    assert "not continuing on 1 node(s)" in record["result_reason"]


def test_a_spares_group_missing_from_the_inventory_is_refused_in_one_line(lab, monkeypatch, capsys):  # noqa: F811
    _patch_runner(monkeypatch, SpareNodesDouble)
    job = _spares_job(lab, "nogroup")
    (lab / "hosts.ini").write_text("[trainers]\nhost1\nhost2\n")
    assert cli(["run", str(job), "-i", str(lab / "hosts.ini")]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert (
        len(lines) == 1 and "recovery.spares: spares: no such host or group in the inventory" in lines[0]
    ), lines


def test_a_spare_that_does_not_see_the_checkpoints_is_refused(lab, monkeypatch, capsys):  # noqa: F811
    """output_shared: true, but host3 lacks checkpoint-4 that host1 sees: the folder is not shared."""
    SpareNodesDouble.calls, SpareNodesDouble.launches, SpareNodesDouble.started = [], 0, []
    SpareNodesDouble.spare_down, SpareNodesDouble.spare_blind = False, True
    _patch_runner(monkeypatch, SpareNodesDouble)
    assert cli(["run", str(_spares_job(lab, "blind")), "-i", str(lab / "hosts.ini")]) == 1
    out = capsys.readouterr().out
    assert SpareNodesDouble.launches == 1
    assert (
        "spare host3: excluded: does not see checkpoint-4 in /srv/shared/blind-" in out
        and "which the others have: output_dir is not on a file system every node sees" in out
    ), out


def test_the_train_loss_of_a_resumed_run_is_the_mean_of_every_attempts_logged_losses():
    """transformers divides the resumed attempt's losses by every step (the p28 H100 run: 6.73 for losses
    near 9): a resumed run's train_loss is the mean of the logged losses, said so; a run that was never
    resumed keeps the trainer's."""
    log = [{"current_steps": s, "loss": 9.0} for s in range(1, 16)]
    log += [{"current_steps": s, "loss": 8.0} for s in range(11, 41)]
    summary = summarize(log, {"train_loss": 8.0 * 30 / 40})
    assert summary.train_loss == (10 * 9.0 + 30 * 8.0) / 40 and summary.train_loss_from == "logged"
    plain = summarize([{"current_steps": s, "loss": 9.0} for s in range(1, 5)], {"train_loss": 9.0})
    assert plain.train_loss == 9.0 and plain.train_loss_from == "trainer"
    # resumed in a new output_dir: its log starts after the checkpoint; no whole-run mean can be made
    late = summarize([{"current_steps": s, "loss": 8.0} for s in (11, 12, 11, 12)], {"train_loss": 4.0})
    assert late.train_loss is None and late.train_loss_from is None
