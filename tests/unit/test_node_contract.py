"""The controller/node contract as the controller uses it: node answers checked once where they arrive, and
the state names are the strings the wire carries."""

from __future__ import annotations

import json
import typing

import pytest

from launcher.backends.agent import nodes_from
from launcher.backends.runner import PlaybookResult
from launcher.node import contract
from launcher.rundir.runs import RunRecord


def test_state_names_are_the_strings_on_the_wire() -> None:
    assert typing.get_args(contract.NodeState) == contract.STATES
    assert contract.STATES == (
        "absent",
        "queued",
        "starting",
        "running",
        "finished",
        "failed",
        "stopped",
        "vanished",
    )
    assert set(contract.FINAL_STATES) <= set(contract.STATES)
    assert contract.UNREACHABLE not in contract.STATES  # the controller's word, never a node's
    assert json.dumps({"state": contract.RUNNING}) == '{"state": "running"}'


def test_a_poll_answer_that_is_not_a_status_counts_as_no_answer() -> None:
    result = PlaybookResult(
        "poll",
        2,
        "failed",
        reports={
            "h1": {"status": {"state": "running", "rc": None}},
            "h2": {"status": ["not", "a", "status"]},
            "h3": {"status": {"state": 5}},
        },
        failures={"h4": "Ask the node agent for the trainer's state: Expecting value: line 1 column 1"},
        unreachable=["h2"],
    )
    nodes = nodes_from(result, ["h1", "h2", "h3", "h4"])
    assert nodes == {
        "h1": {"state": "running", "rc": None},
        "h2": {"state": "unreachable"},
        "h3": {"state": "unreachable"},
        "h4": {
            "state": "absent",
            "error": "Ask the node agent for the trainer's state: Expecting value: line 1 column 1",
        },
    }


def test_collect_result_is_checked_once() -> None:
    good = contract.collect_result_from(
        {"ok": True, "status": {"state": "finished", "rc": 0}, "outputs": ["/o/a"], "archive": "/r/c.tgz"}
    )
    assert good["status"]["state"] == contract.FINISHED and good["outputs"] == ["/o/a"]
    assert good["gpu_after"] is None
    assert contract.collect_result_from({"status": {"state": "failed"}, "outputs": "x"})["outputs"] == []
    with pytest.raises(contract.ContractError, match=r"^host1: collect: status: not a node status"):
        contract.collect_result_from({"ok": True, "outputs": []}, "host1: collect")
    with pytest.raises(contract.ContractError, match=r"^host1: collect: not a JSON object$"):
        contract.collect_result_from("garbage", "host1: collect")


def test_run_record_nodes_are_node_statuses() -> None:
    record = RunRecord.of(
        {"run_id": "r", "status": "running", "nodes": {"h1": {"state": "running"}, "h2": 3}}
    )
    # h2's entry is no status: left out (the table shows "?")
    assert record.nodes == {"h1": {"state": "running"}}
