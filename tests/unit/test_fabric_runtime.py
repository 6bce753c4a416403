"""The collectives' transport at run time: RCCL/NCCL's ``Using network X`` line parsed by
the node agent, judged by the launcher while it follows a multi-node run where RDMA was expected.

The parser runs over REAL captured lines (tests/fixtures/nccl, provenance in its PROVENANCE.md). The ``net``
facts of the engine test are TEST DOUBLES (test_fabric_env's RoCE port double); the nodes are a test double
of PlaybookRunner (``TransportNodesDouble``).
"""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from poll_stream_double import PollStreamDouble, lease_taken
from test_cli_in_process import HOSTS, _facts, _job, _patch_runner, lab  # noqa: F401 - the lab fixture
from test_fabric_env import roce_port_double

from launcher.backends.runner import PlaybookResult
from launcher.exceptions import ConfigurationError
from launcher.fabric.env import resolve_fabric
from launcher.fabric.runtime import DEBUG_ENV, TransportCheck, TransportWatch, hidden_by
from launcher.follow.live import follow
from launcher.follow.recovery import classify, decide
from launcher.follow.verdict import Verdict
from launcher.main import cli
from launcher.node import status as node_status
from launcher.rundir.runs import RunDir
from launcher.spec.jobspec import FabricOptions, RecoveryPolicy

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


# --- the agent's parser, over real captured lines ---------------------------------------------------------


@pytest.mark.parametrize(
    ("capture", "names"),
    [
        ("rccl_socket_no_libibverbs.log", ["Socket"]),
        ("nccl_socket_container.log", ["Socket"]),
        ("nccl_ib_joined_line.log", ["IB"]),
        ("nccl_roce_ib.log", ["IB"]),
        ("nccl_ibext_v8_plugin.log", ["IBext_v8"]),
    ],
)
def test_the_agent_reads_the_network_rccl_chose(capture: str, names: list[str]) -> None:
    text = (FIXTURES / capture).read_text()
    assert node_status.net_transport(text) == names
    # as trainer.log holds them: torchrun tees each rank's line with its prefix
    teed = "".join(f"[rank{i} local{i}]: {line}\n" for i, line in enumerate(text.splitlines()))
    assert node_status.net_transport(teed) == names


def test_no_line_is_none_and_only_the_current_start_counts(tmp_path: Path) -> None:
    """A log without the line (gloo, NCCL_DEBUG off, not initialized yet) reports None; a restart's status
    reads its own start only (the offset of _log_facts)."""
    log = tmp_path / "trainer.log"
    socket = (FIXTURES / "nccl_socket_container.log").read_text()
    log.write_text("Process rank: 0, world size: 2, device: cpu, distributed training: True\n")
    assert node_status._log_facts(log)["net_transport"] is None
    assert node_status._log_facts(tmp_path / "missing.log")["net_transport"] is None
    log.write_text(socket)
    offset = log.stat().st_size
    with log.open("a") as fh:
        fh.write((FIXTURES / "nccl_roce_ib.log").read_text())
    assert node_status._log_facts(log)["net_transport"] == ["Socket", "IB"]
    assert node_status._log_facts(log, offset)["net_transport"] == ["IB"]


# --- what hides the line ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "why"),
    [
        (dict(DEBUG_ENV), ""),
        ({"NCCL_DEBUG": "info"}, ""),  # no subsystem list: NCCL's default mask has INIT
        ({"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_SUBSYS": "ALL"}, ""),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^COLL,P2P"}, ""),
        ({"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "INIT"}, "NCCL_DEBUG=WARN"),
        ({}, "an empty NCCL_DEBUG"),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL"}, "NCCL_DEBUG_SUBSYS=COLL"),
        ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^INIT"}, "NCCL_DEBUG_SUBSYS=^INIT"),
        ({**DEBUG_ENV, "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"}, "NCCL_DEBUG_FILE=/tmp/nccl.%h.%p"),
    ],
)
def test_what_hides_the_line(env: dict[str, str], why: str) -> None:
    assert hidden_by(env) == why


# --- the fabric plan decides whether the run is judged ----------------------------------------------------

ADDR = {"host1": "10.0.0.1", "host2": "10.0.0.2"}


def rdma_net_double(host: str) -> dict[str, Any]:
    """TEST DOUBLE: a node's ``net`` facts: eth0 carrying its train_address, one ACTIVE RoCE port."""
    return {
        "interfaces": [
            {"name": "lo", "state": "UNKNOWN", "addrs": ["127.0.0.1"]},
            {"name": "eth0", "state": "UP", "addrs": [ADDR[host]]},
        ],
        "rdma": [roce_port_double("rdma0")],
        "libibverbs": True,
        "boot_id": f"boot-{host}",
    }


def _plan(hosts: list[str], env: dict[str, str] | None = None, **options: str) -> Any:
    probe = {h: {"net": rdma_net_double(h)} for h in hosts}
    overrides = {h: dict(env or {}) for h in hosts}
    return resolve_fabric(hosts, ADDR, probe, overrides, FabricOptions(**options))


def test_rdma_expected_on_every_node_asks_for_the_line_and_judges_it() -> None:
    plan = _plan(["host1", "host2"])
    assert plan.transport_check == TransportCheck("auto", "fail", {})
    assert plan.debug_env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    assert "NCCL_DEBUG" not in plan.envs["host1"]  # `check` derives without it; the run adds debug_env
    assert not plan.notes


@pytest.mark.parametrize(
    ("hosts", "options", "env"),
    [
        (["host1"], {}, {}),  # single node: no collective crosses a network
        (["host1", "host2"], {"transport": "socket"}, {}),  # sockets asked for
        (["host1", "host2"], {}, {"NCCL_IB_DISABLE": "1"}),  # sockets asked for through env
    ],
)
def test_not_judged_where_rdma_is_not_expected(
    hosts: list[str], options: dict[str, str], env: dict[str, str]
) -> None:
    plan = _plan(hosts, env, **options)
    assert plan.transport_check is None and plan.debug_env == {}


def test_an_env_that_hides_the_line_is_said_once_and_that_node_is_not_judged() -> None:
    plan = _plan(["host1", "host2"], {"NCCL_DEBUG": "WARN"})
    assert plan.transport_check is not None
    assert dict(plan.transport_check.hidden) == {"host1": "NCCL_DEBUG=WARN", "host2": "NCCL_DEBUG=WARN"}
    assert plan.notes == (
        "fabric: the collectives' transport is not judged at run time on host1, host2: NCCL_DEBUG=WARN hides "
        'RCCL/NCCL\'s "Using network" line (leave NCCL_DEBUG/NCCL_DEBUG_SUBSYS to the launcher, or set '
        "NCCL_DEBUG=INFO)",
    )


def test_sockets_predicted_before_the_start_are_not_judged_again() -> None:
    probe = {
        "host1": {"net": rdma_net_double("host1")},
        "host2": {"net": {**rdma_net_double("host2"), "rdma": []}},
    }
    with pytest.raises(ConfigurationError):
        resolve_fabric(["host1", "host2"], ADDR, probe, {}, FabricOptions())
    plan = resolve_fabric(["host1", "host2"], ADDR, probe, {}, FabricOptions(socket_fallback="warn"))
    assert plan.transport_check is None  # every node got sockets, said before the start


# --- the decision --------------------------------------------------------------------------------------

SOCKET_LINE = (
    'host2: collectives fell back to TCP sockets at run time (RCCL/NCCL: "Using network Socket") where RDMA '
    "was expected (fabric.transport: auto)"
)


def test_fail_names_the_node_on_sockets_in_one_line() -> None:
    watch = TransportWatch(TransportCheck("auto", "fail"))
    assert watch.observe({"host1": {"state": "running"}, "host2": {"state": "running"}}) == ([], "")
    nodes = {"host1": {"net_transport": ["IB"]}, "host2": {"net_transport": ["Socket"]}}
    assert watch.observe(nodes) == ([], f"{SOCKET_LINE}; fabric.socket_fallback: fail")
    assert watch.record()["used"] == {"host1": ["IB"], "host2": ["Socket"]}


def test_warn_prints_the_line_once_and_goes_on() -> None:
    watch = TransportWatch(TransportCheck("auto", "warn"))
    nodes = {"host1": {"net_transport": ["IBext_v8"]}, "host2": {"net_transport": ["Socket"]}}
    assert watch.observe(nodes) == (
        [f"warning: {SOCKET_LINE}; fabric.socket_fallback: warn: the run goes on"],
        "",
    )
    assert watch.observe(nodes) == ([], "")


def test_rdma_everywhere_or_a_hidden_node_says_nothing() -> None:
    ib = {"host1": {"net_transport": ["IB"]}, "host2": {"net_transport": ["IB"]}}
    assert TransportWatch(TransportCheck("rdma", "fail")).observe(ib) == ([], "")
    hidden = TransportWatch(TransportCheck("auto", "fail", {"host2": "NCCL_DEBUG_FILE=/x"}))
    assert hidden.observe({"host2": {"net_transport": ["Socket"]}}) == ([], "")


def test_the_failure_is_socket_fallback_and_never_retried() -> None:
    reason = f"{SOCKET_LINE}; fabric.socket_fallback: fail"
    failure = classify(reason, {"host1": {"state": "failed", "rc": 1}, "host2": {"state": "running"}})
    assert (failure.kind, failure.host) == ("socket_fallback", "host2")
    decision = decide(RecoveryPolicy(), [], failure)
    assert not decision.retry
    assert decision.why == (
        "not retried: a fall-back to TCP sockets where RDMA was expected (fabric.socket_fallback: fail) is "
        "never retried"
    )
    with pytest.raises(ValueError, match=r"socket_fallback: .* is never retried"):
        RecoveryPolicy(retry_on=["socket_fallback"])


# --- the engine, in-process against a test double of the nodes ---------------------------------------------


class TransportNodesDouble(PollStreamDouble):
    """Test double of PlaybookRunner: two RoCE nodes (TEST DOUBLE net facts); from the second poll on host2's
    agent reports ``Using network Socket``, host1's ``IB``; the run finishes on the fourth poll."""

    calls: list[str]
    shipped: dict[str, Any]
    polls = 0

    def __init__(self, private_data_dir: Path, *, inventory: Path | None = None, **_: Any) -> None:
        self.cancel_requested = threading.Event()
        private_data_dir.mkdir(parents=True, exist_ok=True)

    def run(self, playbook: str, extravars: dict[str, Any], **_: Any) -> PlaybookResult:
        TransportNodesDouble.calls.append(playbook)
        result = PlaybookResult(playbook=playbook, rc=0, status="successful")
        if playbook == "preflight":
            result.reports = {
                h: {"preflight": {**_facts(h), "probe": {**_facts(h)["probe"], "net": rdma_net_double(h)}}}
                for h in HOSTS
            }
        elif playbook == "launch":
            files = Path(extravars["mift_files_dir"])
            TransportNodesDouble.shipped = {
                h: json.loads((files / h / "bundle.json").read_text()) for h in HOSTS
            }
            result.reports = {
                h: {"start": {"ok": True, "state": "running"}, **lease_taken(extravars)} for h in HOSTS
            }
        elif playbook == "poll":
            TransportNodesDouble.polls += 1
            seen = TransportNodesDouble.polls >= 2  # RCCL's init is done by the second poll
            nets = {"host1": ["IB"], "host2": ["Socket"]} if seen else {"host1": None, "host2": None}
            if TransportNodesDouble.polls >= 4:
                nodes = {
                    "host1": {
                        "state": "finished",
                        "rc": 0,
                        "outputs_complete": True,
                        "net_transport": nets["host1"],
                    },
                    "host2": {"state": "finished", "rc": 0, "net_transport": nets["host2"]},
                }
            else:
                nodes = {h: {"state": "running", "net_transport": nets[h]} for h in HOSTS}
            result.reports = {h: {"status": n} for h, n in nodes.items()}
        return result


def _run_transport(
    root: Path, monkeypatch: pytest.MonkeyPatch, name: str, **spec: Any
) -> tuple[int, dict[str, Any]]:
    TransportNodesDouble.calls, TransportNodesDouble.polls = [], 0
    _patch_runner(monkeypatch, TransportNodesDouble)
    job = _job(root, name, "plain.yaml", poll_interval_s=0.5, **spec)
    rc = int(cli(["run", str(job), "-i", str(root / "hosts.ini")]))
    record = json.loads(next((root / "runs").glob(f"{name}-*/record.json")).read_text())
    return rc, record


def test_engine_fail_stops_every_node_and_is_not_retried(lab, monkeypatch, capsys):  # noqa: F811
    rc, record = _run_transport(lab, monkeypatch, "sockfail")
    out = capsys.readouterr().out
    assert rc == 1, out
    # the derived environment asked RCCL/NCCL for the line
    for host in HOSTS:
        env = TransportNodesDouble.shipped[host]["env"]
        assert (env["NCCL_DEBUG"], env["NCCL_DEBUG_SUBSYS"], env["NCCL_IB_HCA"]) == (
            "INFO",
            "INIT,NET",
            "=rdma0:1",
        )
    never = "not retried: a fall-back to TCP sockets where RDMA was expected (fabric.socket_fallback: fail)"
    assert f"attempt 1 failed (socket_fallback on host2): {never} is never retried" in out
    # the verdict names the node in one line; the summary repeats the run's reason, as for every failure
    first = next(line for line in out.splitlines() if SOCKET_LINE in line)
    assert first.startswith(f"failed: {SOCKET_LINE}; fabric.socket_fallback: fail; {never} is never")
    assert first.endswith("; stopping every node ...")
    assert record["status"] == "failed" and len(record["attempts"]) == 1
    assert record["attempts"][0]["kind"] == "socket_fallback"
    assert record["transport"]["used"] == {"host1": ["IB"], "host2": ["Socket"]}
    assert record["nodes"]["host2"]["net_transport"] == ["Socket"]
    calls = TransportNodesDouble.calls
    assert calls.count("launch") == 1 and "stop" in calls and "collect" in calls  # stopped, logs kept
    assert calls.index("stop") < calls.index("collect")


def test_engine_warn_says_it_once_and_the_run_goes_on(lab, monkeypatch, capsys):  # noqa: F811
    rc, record = _run_transport(lab, monkeypatch, "sockwarn", fabric={"socket_fallback": "warn"})
    out = capsys.readouterr().out
    assert rc == 0, out
    warned = [line for line in out.splitlines() if SOCKET_LINE in line]
    assert warned == [f"warning: {SOCKET_LINE}; fabric.socket_fallback: warn: the run goes on"]
    assert record["status"] == "succeeded"
    assert record["transport"] == {
        "expected": "rdma",
        "fabric_transport": "auto",
        "socket_fallback": "warn",
        "not_judged": {},
        "used": {"host1": ["IB"], "host2": ["Socket"]},
    }


def test_engine_an_env_that_hides_the_line_is_not_judged(lab, monkeypatch, capsys):  # noqa: F811
    rc, record = _run_transport(lab, monkeypatch, "sockhidden", env={"NCCL_DEBUG": "WARN"})
    out = capsys.readouterr().out
    assert rc == 0, out
    assert TransportNodesDouble.shipped["host1"]["env"]["NCCL_DEBUG"] == "WARN"  # the job spec's env wins
    notes = [line for line in out.splitlines() if "not judged" in line]
    assert len(notes) == 1 and notes[0].startswith("note: fabric: the collectives' transport is not judged")
    assert SOCKET_LINE not in out and record["status"] == "succeeded"


# --- the follow loop: a run that ended in the poll that first showed sockets -----------------------------


class EndedJobTEST_DOUBLE:  # noqa: N801 - the test-double marker in the name
    """TEST DOUBLE of launcher.engine.job.Job: one poll, both nodes finished, host2's RCCL said Socket."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self.hosts = list(HOSTS)

    def poll(self) -> dict[str, dict[str, Any]]:
        return {
            "host1": {"state": "finished", "rc": 0, "outputs_complete": True, "net_transport": ["IB"]},
            "host2": {"state": "finished", "rc": 0, "net_transport": ["Socket"]},
        }

    def polling(self, interval_s: float) -> contextlib.nullcontext[Any]:
        del interval_s
        return contextlib.nullcontext(self.poll)

    def judge(self, nodes: dict[str, dict[str, Any]]) -> Verdict:
        del nodes
        return Verdict("succeeded")


def test_a_run_that_ended_in_that_poll_keeps_its_verdict_and_still_says_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIFT_RUNS_DIR", str(tmp_path / "runs"))
    run = RunDir.create("net-20261205-000000-abcd", {"hosts": list(HOSTS)})
    out = io.StringIO()
    verdict, _ = follow(
        EndedJobTEST_DOUBLE(run),  # type: ignore[arg-type]
        interrupted=threading.Event(),
        poll_interval_s=0.5,
        out=out,
        transport=TransportWatch(TransportCheck("rdma", "fail")),
    )
    assert verdict.state == "succeeded"
    said = [line for line in out.getvalue().splitlines() if SOCKET_LINE.replace("auto", "rdma") in line]
    assert said == [
        f"warning: {SOCKET_LINE.replace('auto', 'rdma')}; fabric.socket_fallback: fail (the run had ended: "
        "succeeded)"
    ]
    assert run.load()["transport"]["used"] == {"host1": ["IB"], "host2": ["Socket"]}
