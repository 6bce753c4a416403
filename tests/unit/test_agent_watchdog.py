"""The node agent's side of the progress watchdog: what it reports (checkpoint, rank states), the stack dumps
of ``stop --dump-stacks`` (on a SIGSTOPped process too), the flight recorder's files; with the fake trainer
test double of test_agent.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tarfile
import time
from pathlib import Path

from node_agent import agent_json, wait_state
from test_agent import make_run, marked

from launcher.node import collect as node_collect
from launcher.node import stop as node_stop
from launcher.node import supervise as node_supervise
from launcher.node import watch as node_watch


def test_checkpoint_fact_reports_the_newest_checkpoint_and_whether_it_is_complete(tmp_path: Path) -> None:
    assert node_watch.checkpoint_fact(tmp_path) is None
    for step in (4, 12, 8):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-x").mkdir()
    done = node_watch.checkpoint_fact(tmp_path)
    assert done is not None and done["step"] == 12 and done["complete"] is True
    (tmp_path / "checkpoint-16" / "global_step16").mkdir(parents=True)
    shard = tmp_path / "checkpoint-16" / "global_step16" / "shard.pt"
    shard.write_bytes(b"x")
    os.utime(shard, (2000.0, 2000.0))
    saving = node_watch.checkpoint_fact(tmp_path)
    assert saving == {"step": 16, "complete": False, "mtime": 2000.0}


def test_the_flight_recorder_files_go_into_the_run_dir_only_when_it_is_on(tmp_path: Path) -> None:
    off: dict[str, str] = {}
    node_watch.flight_recorder_env(off, tmp_path)
    assert off == {}
    on = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/mine/pipe"}
    node_watch.flight_recorder_env(on, tmp_path)
    assert on["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path / "nccl-trace-rank")
    assert on["TORCH_FR_DUMP_TEMP_FILE"] == on["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
    assert on["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/mine/pipe"  # the job's own setting wins


def test_poking_the_flight_recorder_writes_into_each_rank_pipe(tmp_path: Path) -> None:
    pipe = tmp_path / "nccl-trace-pipe-rank0.pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # the rank's end (ProcessGroupNCCL's DumpPipe)
    try:
        assert node_stop.poke_flight_recorder(tmp_path) == [pipe.name]
        assert os.read(reader, 8) == b"1"
    finally:
        os.close(reader)
    assert node_stop.poke_flight_recorder(tmp_path) == []  # no reader left: nothing to poke


def _rank_run(tmp_path: Path, run_id: str) -> Path:
    run_dir = make_run(tmp_path, run_id, "--steps", "1000", "--step-s", "0.2")
    (run_dir / "env.json").write_text(json.dumps({"RANK": "1", "LOCAL_RANK": "0"}))
    agent_json("start", str(run_dir))
    wait_state(run_dir, {"running"})
    return run_dir


def test_status_reports_the_state_of_every_rank(tmp_path: Path) -> None:
    run_dir = _rank_run(tmp_path, "w-ranks")
    try:
        time.sleep(0.5)
        worker = max(marked(run_dir))
        os.kill(worker, signal.SIGSTOP)
        ranks = agent_json("status", str(run_dir))["watch"]["ranks"]
        states = {r["pid"]: r["state"] for r in ranks}
        assert states[worker] == "T"
        assert {r["rank"] for r in ranks} == {"1"}
    finally:
        agent_json("stop", str(run_dir), "--grace", "1")


def test_stop_with_dump_writes_the_stacks_of_a_stopped_process_then_stops_it(tmp_path: Path) -> None:
    run_dir = _rank_run(tmp_path, "w-dump")
    time.sleep(0.5)
    worker = max(marked(run_dir))
    os.kill(worker, signal.SIGSTOP)  # a rank stuck for good: nothing in it answers a signal
    stopped = agent_json("stop", str(run_dir), "--grace", "1", "--dump-stacks")
    assert stopped["ok"] and stopped["left"] == [] and marked(run_dir) == []
    assert f"stack-rank1-{worker}.txt" in stopped["stacks"]
    text = (run_dir / f"stack-rank1-{worker}.txt").read_text()
    assert text.startswith(f"pid {worker} state T rank 1 local_rank 0")
    assert f"thread {worker} (python" in text  # the kernel's view of every thread
    if (Path(sys.executable).parent / "py-spy").exists() or shutil.which("py-spy"):  # the agent's lookup
        assert "py-spy dump --nonblocking (rc 0)" in text and "main (fake_trainer.py:" in text, text
    else:
        assert "py-spy: not installed in the node venv nor on PATH" in text, text
    archive = Path(agent_json("collect", str(run_dir))["archive"])
    with tarfile.open(archive) as tar:
        assert f"stack-rank1-{worker}.txt" in tar.getnames()


def test_a_plain_stop_writes_no_stacks(tmp_path: Path) -> None:
    run_dir = _rank_run(tmp_path, "w-plain")
    stopped = agent_json("stop", str(run_dir), "--grace", "1")
    assert stopped["ok"] and "stacks" not in stopped
    assert list(run_dir.glob("stack-*")) == []


def test_torchrun_keeps_each_rank_log_in_the_run_dir_with_a_rank_prefix(tmp_path: Path) -> None:
    env = {"PET_TEE": "0"}
    node_supervise.rank_log_env(env, tmp_path)
    assert env["PET_LOG_DIR"] == str(tmp_path / "ranks")
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank${rank} local${local_rank}]: "
    assert env["PET_TEE"] == "0"  # the job's own setting wins


def test_collect_ships_each_rank_log_named_by_its_global_rank(tmp_path: Path) -> None:
    """torchrun's <log dir>/<run id>_<random>/attempt_<n>/<local rank>/std*.log -> rank<N>.<stream>.log,
    N = NODE_RANK x NPROC_PER_NODE + local rank (host2 of 2 ranks per node: ranks 2 and 3)."""
    run_dir = tmp_path / "r1"
    (run_dir / "output").mkdir(parents=True)
    (run_dir / "job.json").write_text(json.dumps({"run_id": "r1", "node_rank": 1}))
    (run_dir / "env.json").write_text(json.dumps({"NODE_RANK": "1", "NPROC_PER_NODE": "2"}))
    for local in (0, 1):
        folder = run_dir / "ranks" / "none_abc123" / "attempt_0" / str(local)
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text(f"out {local}\n")
        (folder / "stderr.log").write_text(f"err {local}\n")
        (folder / "error.json").write_text("{}")
    names = node_supervise.rank_logs(run_dir)
    assert sorted(names) == [f"rank{n}.{s}.log" for n in (2, 3) for s in ("stderr", "stdout")]
    collected = node_collect.cmd_collect(run_dir)
    with tarfile.open(collected["archive"]) as tar:
        assert {"rank2.stderr.log", "rank3.stdout.log"} <= set(tar.getnames())
        member = tar.extractfile("rank3.stderr.log")
        assert member is not None and member.read() == b"err 1\n"


def test_collect_ships_the_trainers_tensorboard_event_files(tmp_path: Path) -> None:
    """report_to: tensorboard: the event files HF's Trainer writes under <output_dir>/runs/<time>_<host>/
    reach the controller's nodes/<host>/ (flat: their names are unique), where `tensorboard --logdir` reads
    them."""
    from launcher.engine.job import unpack_collected  # noqa: PLC0415

    run_dir = tmp_path / "r1"
    events = run_dir / "output" / "runs" / "Dec05_03-10-00_host1"
    events.mkdir(parents=True)
    (run_dir / "job.json").write_text(json.dumps({"run_id": "r1", "node_rank": 0}))
    name = "events.out.tfevents.1796440200.host1.71.0"
    (events / name).write_bytes(b"\x18\x00tfevents")
    collected = node_collect.cmd_collect(run_dir)
    host_dir = tmp_path / "nodes" / "host1"
    host_dir.mkdir(parents=True)
    Path(collected["archive"]).replace(host_dir / "collect.tar.gz")
    unpack_collected(host_dir)
    assert (host_dir / name).read_bytes() == b"\x18\x00tfevents"
    assert node_supervise.tensorboard_files(tmp_path / "none") == []  # no output yet: nothing, no error


def test_the_trainer_writes_tensorboard_events_under_its_output(tmp_path: Path) -> None:
    """transformers 5 writes event files where TENSORBOARD_LOGGING_DIR says, else into runs/ of the working
    directory: the agent points it under the output (relative or absolute), and the job's env wins."""
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    env = node_supervise._trainer_env(run_dir, {"run_id": "r1", "output_dir": "output"})
    assert env["TENSORBOARD_LOGGING_DIR"] == str(run_dir / "output" / "runs")
    env = node_supervise._trainer_env(run_dir, {"run_id": "r1", "output_dir": "/data/out"})
    assert env["TENSORBOARD_LOGGING_DIR"] == "/data/out/runs"
    (run_dir / "env.json").write_text(json.dumps({"TENSORBOARD_LOGGING_DIR": "/elsewhere"}))
    env = node_supervise._trainer_env(run_dir, {"run_id": "r1", "output_dir": "output"})
    assert env["TENSORBOARD_LOGGING_DIR"] == "/elsewhere"
