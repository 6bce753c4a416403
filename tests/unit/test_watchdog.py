"""The progress watchdog's decisions (launcher/follow/watchdog.py): windows, progress, who lags, the job spec
key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launcher.exceptions import ConfigurationError
from launcher.follow.watchdog import (
    FLIGHT_RECORDER_ENV,
    MIN_INTERVALS,
    ProgressWatch,
    Schedule,
    WatchdogOptions,
    elapsed_seconds,
    lagging,
    p95,
    with_flight_recorder,
)
from launcher.spec.jobspec_load import parse_job_spec

HOSTS = ("host1", "host2")
OPTS = WatchdogOptions(k=5, floor_s=10, first_step_s=60, save_s=40, eval_s=30)
SRC = Path("/jobs/x.yaml")


def nodes(step: int | None, *, total: int = 100, **per_host: Any) -> dict[str, dict[str, Any]]:
    """Every host at ``step`` (None: no step logged); ``per_host``: host -> extra fields of its status."""
    out: dict[str, dict[str, Any]] = {}
    for host in HOSTS:
        node: dict[str, Any] = {"state": "running", "last_log": {}}
        if step is not None:
            node["last_log"] = {"current_steps": step, "total_steps": total}
        node.update(per_host.get(host, {}))
        out[host] = node
    return out


def watch(options: WatchdogOptions = OPTS, schedule: Schedule | None = None) -> ProgressWatch:
    return ProgressWatch(options, schedule or Schedule(), HOSTS, started=0.0)


def steps_every(w: ProgressWatch, seconds: float, count: int, start: float = 5.0) -> float:
    """Feed steps 1..count, one every ``seconds`` after ``start``; return the time of the last one."""
    now = start
    for step in range(1, count + 1):
        assert w.observe(nodes(step), now) is None
        now += seconds
    return now - seconds


def test_p95_is_the_nearest_rank_and_zero_for_no_values() -> None:
    assert p95([]) == 0.0
    assert p95([3.0]) == 3.0
    assert p95([float(v) for v in range(1, 21)]) == 19.0
    assert p95([1.0, 1.0, 1.0, 9.0]) == 9.0


def test_before_the_first_step_the_first_step_window_applies() -> None:
    w = watch()
    assert w.observe(nodes(None), 59.0) is None
    stall = w.observe(nodes(None), 61.0)
    assert stall is not None
    assert stall.window.seconds == 60 and stall.step is None
    assert "before the first step" in stall.reason


def test_a_slow_first_step_inside_first_step_s_is_no_stall() -> None:
    w = watch()
    assert w.observe(nodes(None), 55.0) is None
    assert w.observe(nodes(1), 58.0) is None  # 58 s of start-up, far above the step window of 10 s


def test_until_enough_intervals_the_first_step_window_still_applies() -> None:
    w = watch()
    last = steps_every(w, 1.0, MIN_INTERVALS)  # one interval fewer than needed
    assert w.window().seconds == OPTS.first_step_s
    assert w.observe(nodes(MIN_INTERVALS), last + 50.0) is None


def test_before_an_interval_is_measured_the_trainers_elapsed_time_per_step_stands_for_it() -> None:
    w = watch()
    first = nodes(7)
    for node in first.values():
        node["last_log"]["elapsed_time"] = "0:00:21"  # the controller's first poll saw step 7
    assert w.observe(first, 30.0) is None
    window = w.window()
    assert window.seconds == pytest.approx(5 * 3.0)
    assert window.why.startswith("max(5 x 3.0 s (the trainer's elapsed_time / step 7), floor_s 10)")
    assert w.observe(first, 30.0 + 16.0) is not None


def test_the_slowest_nodes_elapsed_time_per_step_is_taken() -> None:
    w = watch()
    first = nodes(
        2,
        host1={"last_log": {"current_steps": 2, "elapsed_time": "0:00:04"}},
        host2={"last_log": {"current_steps": 2, "elapsed_time": "0:01:00"}},
    )
    w.observe(first, 1.0)
    assert w.estimate == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0:00:05", 5.0),
        ("1:02:03", 3723.0),
        ("1 day, 0:00:10", 86410.0),
        ("2 days, 1:00:00", 176400.0),
        ("soon", None),
        (None, None),
        ("5", None),
    ],
)
def test_elapsed_time_is_read_as_llamafactory_writes_it(text: object, seconds: float | None) -> None:
    assert elapsed_seconds(text) == seconds


def test_window_is_k_times_p95_of_the_step_intervals() -> None:
    w = watch()
    steps_every(w, 4.0, 6)
    window = w.window()
    assert window.seconds == pytest.approx(5 * 4.0)
    assert "5 x p95 4.0 s of 5 step intervals" in window.why


def test_the_floor_applies_when_steps_are_fast() -> None:
    w = watch()
    steps_every(w, 0.5, 6)
    window = w.window()
    assert window.seconds == OPTS.floor_s
    assert window.why.startswith("floor_s")


def test_a_run_without_a_step_stalls_after_its_window_and_not_before() -> None:
    w = watch()
    last = steps_every(w, 4.0, 6)  # window 20 s
    assert w.observe(nodes(6), last + 19.0) is None
    stall = w.observe(nodes(6), last + 21.0)
    assert stall is not None
    assert stall.step == 6 and stall.seconds == pytest.approx(21.0)
    assert stall.window.seconds == pytest.approx(20.0)


def test_a_step_resets_the_clock() -> None:
    w = watch()
    last = steps_every(w, 4.0, 6)
    assert w.observe(nodes(7), last + 15.0) is None
    assert w.observe(nodes(7), last + 15.0 + 19.0) is None


def test_a_save_step_adds_save_s_to_the_window() -> None:
    w = watch(schedule=Schedule(save_steps=4))
    last = steps_every(w, 4.0, 4)  # step 4 is followed by a checkpoint save
    window = w.window()
    assert window.seconds == pytest.approx(5 * 4.0 + 40)
    assert "save_s 40 (checkpoint save after step 4)" in window.why
    assert w.observe(nodes(4), last + 55.0) is None  # a 55 s save: no stall


def test_a_save_longer_than_its_window_still_stalls() -> None:
    w = watch(schedule=Schedule(save_steps=4))
    last = steps_every(w, 4.0, 4)
    assert w.observe(nodes(4), last + 61.0) is not None


def test_the_last_step_adds_save_s_for_the_final_save() -> None:
    w = watch()
    steps_every(w, 4.0, 5)
    assert w.window(total=5).seconds == pytest.approx(20 + 40)
    assert w.window(total=6).seconds == pytest.approx(20)


def test_the_interval_that_held_a_save_is_no_step_interval() -> None:
    w = watch(schedule=Schedule(save_steps=4))
    last = steps_every(w, 4.0, 4)
    assert w.observe(nodes(5), last + 50.0) is None  # step 4 -> 5 held a 46 s save
    assert w.intervals == [4.0, 4.0, 4.0]
    assert w.window().seconds == pytest.approx(20.0)


def test_the_interval_that_held_a_checkpoint_write_is_no_step_interval() -> None:
    w = watch()
    last = steps_every(w, 4.0, 4)
    ckpt = {"step": 4, "complete": True}
    assert w.observe(nodes(4, host1={"watch": {"checkpoint": {**ckpt, "mtime": 1.0}}}), last + 1.0) is None
    assert w.observe(nodes(4, host1={"watch": {"checkpoint": {**ckpt, "mtime": 2.0}}}), last + 15.0) is None
    assert w.observe(nodes(5, host1={"watch": {"checkpoint": {**ckpt, "mtime": 2.0}}}), last + 30.0) is None
    assert w.intervals == [4.0, 4.0, 4.0]
    assert w.observe(nodes(6, host1={"watch": {"checkpoint": {**ckpt, "mtime": 2.0}}}), last + 34.0) is None
    assert w.intervals == [4.0, 4.0, 4.0, 4.0]


def test_an_eval_step_adds_eval_s() -> None:
    w = watch(schedule=Schedule(eval_steps=5))
    steps_every(w, 4.0, 5)
    window = w.window()
    assert window.seconds == pytest.approx(20 + 30)
    assert "eval_s 30 (evaluation after step 5)" in window.why


def test_an_incomplete_checkpoint_on_a_node_counts_as_a_save() -> None:
    w = watch()
    last = steps_every(w, 4.0, 6)
    saving = nodes(6, host2={"watch": {"checkpoint": {"step": 6, "complete": False, "mtime": 1.0}}})
    assert w.observe(saving, last + 50.0) is None
    assert w.window(saving=["host2"]).seconds == pytest.approx(20 + 40)


def test_checkpoint_writes_reset_the_clock() -> None:
    w = watch()
    last = steps_every(w, 4.0, 6)
    for i, t in enumerate((15.0, 30.0, 45.0, 60.0)):  # a save that keeps writing, far past 20 s
        ckpt = {"step": 6, "complete": True, "mtime": 1000.0 + i}
        assert w.observe(nodes(6, host1={"watch": {"checkpoint": ckpt}}), last + t) is None


def test_the_first_checkpoint_report_starts_nothing() -> None:
    w = watch()
    last = steps_every(w, 4.0, 6)
    ckpt = {"step": 4, "complete": True, "mtime": 1.0}
    stall = w.observe(nodes(6, host1={"watch": {"checkpoint": ckpt}}), last + 21.0)
    assert stall is not None  # an old checkpoint seen for the first time is no progress


def test_disabled_never_stalls() -> None:
    w = watch(WatchdogOptions(enabled=False, first_step_s=1))
    assert w.observe(nodes(None), 10_000.0) is None


def test_the_node_with_the_lowest_step_is_named() -> None:
    state = nodes(7, host2={"last_log": {"current_steps": 5}})
    who, why = lagging(HOSTS, state)
    assert who == ("host2",)
    assert why == "host2 at step 5 (others at step 7)"


def test_at_the_same_step_the_node_with_a_stopped_rank_is_named() -> None:
    ranks = [{"pid": 41, "rank": "1", "local_rank": "0", "state": "T"}]
    state = nodes(
        3,
        host1={"watch": {"ranks": [{"pid": 9, "rank": "0", "state": "S"}]}},
        host2={"watch": {"ranks": ranks}},
    )
    who, why = lagging(HOSTS, state)
    assert who == ("host2",)
    assert "host2/rank 1 (pid 41) stopped" in why and "every node at step 3" in why


def test_a_rank_in_uninterruptible_sleep_is_named() -> None:
    state = nodes(3, host1={"watch": {"ranks": [{"pid": 9, "rank": "0", "state": "D"}]}})
    assert lagging(HOSTS, state)[0] == ("host1",)


def test_at_the_same_step_without_a_held_rank_no_node_is_named() -> None:
    who, why = lagging(HOSTS, nodes(3))
    assert who == ()
    assert "no node lags by its step count (every node at step 3)" in why


def test_a_node_that_logs_no_step_is_not_named() -> None:
    state = nodes(3, host2={"last_log": {}})  # only the first node writes trainer_log.jsonl
    assert lagging(HOSTS, state)[0] == ()


def test_the_stall_names_the_lagging_node_in_its_reason() -> None:
    w = watch()
    last = steps_every(w, 4.0, 6)
    held = {"watch": {"ranks": [{"pid": 41, "rank": "1", "state": "T"}]}}
    stall = w.observe(nodes(6, host2=held), last + 25.0)
    assert stall is not None and stall.lagging == ("host2",)
    assert stall.as_dict()["lagging"] == ["host2"]
    assert stall.reason.startswith("no progress for 25 s after step 6 (window 20 s: 5 x p95 4.0 s")
    assert "lagging: host2/rank 1 (pid 41) stopped" in stall.reason


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        ({}, Schedule(save_steps=500)),
        ({"save_steps": 4, "max_steps": 8}, Schedule(save_steps=4, max_steps=8)),
        ({"save_strategy": "epoch", "save_steps": 4}, Schedule()),
        ({"save_strategy": "no"}, Schedule()),
        ({"eval_strategy": "steps", "eval_steps": 50}, Schedule(save_steps=500, eval_steps=50)),
        ({"eval_strategy": "steps", "logging_steps": 10}, Schedule(save_steps=500, eval_steps=10)),
        ({"evaluation_strategy": "steps", "eval_steps": 7}, Schedule(save_steps=500, eval_steps=7)),
        ({"eval_steps": 50}, Schedule(save_steps=500)),  # evaluation off: eval_steps means nothing
        ({"save_steps": "x", "max_steps": -1}, Schedule()),
    ],
)
def test_the_schedule_is_read_from_the_training_yaml(train: dict[str, Any], expected: Schedule) -> None:
    assert Schedule.from_training(train) == expected


def test_job_spec_watchdog_defaults_need_no_setting() -> None:
    spec = parse_job_spec({"name": "a", "train_config": "t"}, SRC)
    assert spec.watchdog == WatchdogOptions()
    assert spec.watchdog.enabled and spec.watchdog.k == 5 and spec.watchdog.floor_s == 300
    assert spec.watchdog.first_step_s == 1800 and spec.watchdog.save_s == 1800


def test_job_spec_watchdog_keys_are_set_and_checked() -> None:
    spec = parse_job_spec({"name": "a", "train_config": "t", "watchdog": {"k": 3, "floor_s": 12}}, SRC)
    assert spec.watchdog.k == 3 and spec.watchdog.floor_s == 12 and spec.watchdog.first_step_s == 1800


@pytest.mark.parametrize(
    ("watchdog", "expected"),
    [
        ({"floor": 3}, "watchdog.floor: unknown key; did you mean 'floor_s'?"),
        ({"k": 0.5}, "watchdog.k: Input should be greater than or equal to 1"),
        ({"first_step_s": 0}, "watchdog.first_step_s: Input should be greater than or equal to 1"),
        ({"enabled": "maybe"}, "watchdog.enabled"),
    ],
)
def test_bad_watchdog_keys_name_the_key(watchdog: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_job_spec({"name": "a", "train_config": "t", "watchdog": watchdog}, SRC)
    assert expected in str(err.value)


def test_the_flight_recorder_is_on_for_gpu_nodes_and_the_job_env_wins() -> None:
    assert with_flight_recorder({"A": "1"}, gpu=False) == {"A": "1"}
    env = with_flight_recorder({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}, gpu=True)
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == FLIGHT_RECORDER_ENV["TORCH_NCCL_DUMP_ON_TIMEOUT"]


def test_the_stall_names_the_held_rank_as_host_slash_rank() -> None:
    """2 ranks per node: the stall record lists host2/rank3 (global rank), the reason its local rank."""
    w = watch()
    last = steps_every(w, 4.0, 6)
    ranks = [
        {"pid": 40, "rank": "2", "local_rank": "0", "state": "S"},
        {"pid": 41, "rank": "3", "local_rank": "1", "state": "T"},
    ]
    stall = w.observe(nodes(6, host2={"watch": {"ranks": ranks}}), last + 25.0)
    assert stall is not None and stall.as_dict()["lagging_ranks"] == ["host2/rank3"]
    assert "lagging: host2/rank 3 (pid 41) stopped (local rank 1), every node at step 6" in stall.reason


def test_a_node_behind_by_its_step_is_named_with_its_held_rank() -> None:
    w = watch()
    last = steps_every(w, 4.0, 6)
    held = {"last_log": {"current_steps": 5}, "watch": {"ranks": [{"pid": 41, "rank": "3", "state": "T"}]}}
    stall = w.observe(nodes(6, host2=held), last + 25.0)
    assert stall is not None and stall.lagging == ("host2",) and stall.ranks == ("host2/rank3",)
    assert stall.lag_why == "host2 at step 5 (others at step 6); host2/rank 3 (pid 41) stopped"
