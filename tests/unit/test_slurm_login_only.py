"""The slurm backend's login-host-only mode (job spec ``slurm.shared_dir``): the batch script, the job spec
and backend checks, the facts the plan is made from, and the node agent's side (``shared-*`` on the login
host, ``slurm-check`` and ``slurm-step --ranks`` on a node) on a tmp folder standing in for the shared file
system, with a ``scontrol`` TEST DOUBLE (this machine runs no Slurm)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from launcher.backends import backend_of, choose_backend
from launcher.backends.slurm import SlurmBackend, first_failure
from launcher.backends.slurm_script import Allocation, Partition, check_request, sbatch_script
from launcher.backends.slurm_shared import (
    SharedSlurmBackend,
    expectations,
    preflight_output_dir,
    rank_facts,
    record_fields,
)
from launcher.exceptions import ConfigurationError
from launcher.preflight.checks import NodeFacts
from launcher.spec.jobspec import SlurmOptions
from launcher.spec.jobspec_load import parse_job_spec
from launcher.spec.nodelayout import layout
from launcher.transfer import nodeprogram
from mift_testsupport.slurm import srun_task_env

if TYPE_CHECKING:
    from launcher.engine.plan import RunPlan

AGENT = nodeprogram.program_file()  # the node program, as shipped (``python3 AGENT agent ...``)
FAKE = Path(__file__).with_name("fake_trainer.py")
SHARED = {"shared_dir": "/shared/mift", "nodes": 2}


def spec(**fields: Any) -> Any:
    return parse_job_spec({"name": "a", "train_config": "t", **fields}, Path("x.yaml"))


# --- the batch script and the checks before anything is submitted -----------------------------------------
def test_the_batch_script_lets_slurm_pick_the_nodes_and_checks_each_first() -> None:
    alloc = Allocation(
        run_id="r1",
        run_dir="/shared/mift/r1",
        nodes=("rank0", "rank1"),
        gpus_per_node=1,
        stop_grace_s=8,
        options=SlurmOptions.model_validate(SHARED),
        ranks=True,
    )
    lines = sbatch_script(alloc).splitlines()
    assert "#SBATCH --nodes=2" in lines and "#SBATCH --gpus-per-node=1" in lines
    assert not [line for line in lines if "--nodelist" in line]
    assert "#SBATCH --chdir=/shared/mift/r1" in lines
    assert "#SBATCH --output=/shared/mift/r1/rank0/slurm.out" in lines
    tasks = "--nodes=2 --ntasks=2 --ntasks-per-node=1"
    check = (
        f"srun --kill-on-bad-exit=1 {tasks} python3 /shared/mift/r1/mift_node.pyz agent slurm-check "
        "/shared/mift/r1 || exit 3"
    )
    step = (
        f"exec srun --kill-on-bad-exit=1 {tasks} python3 /shared/mift/r1/mift_node.pyz agent slurm-step "
        "/shared/mift/r1 --grace 8 --ranks"
    )
    assert lines.index(check) < lines.index(step) == len(lines) - 1  # the check runs first


def test_too_many_nodes_name_slurm_nodes() -> None:
    parts = [Partition("mift", 2, 8, default=True)]
    with pytest.raises(ConfigurationError) as err:
        check_request(parts, SlurmOptions.model_validate({**SHARED, "nodes": 3}), 3, 1, "job.yaml")
    assert str(err.value) == "job.yaml: slurm.nodes: the job asks for 3 nodes, partition 'mift' has 2"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"slurm": {"shared_dir": "/s"}}, "shared_dir (login host only) needs nodes"),
        ({"slurm": {"nodes": 2}}, "nodes is the node count of the login-host-only mode: it needs shared_dir"),
        ({"slurm": {"shared_dir": "rel/dir", "nodes": 2}}, "slurm.shared_dir: must be an absolute path"),
        ({"slurm": {"shared_dir": "/s", "nodes": 0}}, "slurm.nodes"),
        ({"slurm": SHARED, "hosts": "trainers"}, "hosts: names nodes, but with slurm.shared_dir"),
        ({"slurm": SHARED, "output_dir": "/var/out"}, "output_dir: /var/out is outside slurm.shared_dir"),
        ({"slurm": SHARED, "plan": "probe"}, "plan: probe runs on the first node over ssh"),
        ({"slurm": SHARED, "resume": True, "output_dir": "/shared/mift/o"}, "resume: not supported"),
    ],
)
def test_job_spec_login_only_mistakes_fail_in_one_line(fields: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        spec(**fields)
    assert expected in str(err.value)
    assert "\n" not in str(err.value).strip()


def test_job_spec_login_only_is_accepted() -> None:
    ok = spec(slurm=SHARED, output_dir="/shared/mift/out/{run_id}")
    assert ok.slurm.login_only and ok.slurm.nodes == 2
    assert not spec().slurm.login_only
    assert preflight_output_dir(spec(slurm=SHARED), "r1") == "/shared/mift/r1/rank0/output"
    assert record_fields(spec(slurm=SHARED), "head", "r1") == {
        "login_host": "head",
        "shared_dir": "/shared/mift",
        "run_root": "/shared/mift/r1",
        "nodes": 2,
    }


def test_the_login_only_mode_needs_the_slurm_backend(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    login1: {}\n  vars:\n    mift_slurm_login_host: login1\n")
    job = tmp_path / "job.yaml"
    with pytest.raises(
        ConfigurationError, match=r"slurm\.shared_dir: the login-host-only mode needs backend slurm"
    ):
        choose_backend(None, inv, job, login_only=True)
    assert choose_backend("slurm", inv, job, login_only=True) == {
        "backend": "slurm",
        "slurm": {"login_host": "login1"},
    }


def test_a_recorded_login_only_run_gets_its_backend() -> None:
    shared = backend_of({"backend": "slurm", "slurm": {"login_host": "h", "job_id": "7", "run_root": "/s/r"}})
    assert isinstance(shared, SharedSlurmBackend) and shared.root == "/s/r" and shared.job_id == "7"
    assert shared.extra_vars == {
        "mift_slurm_login": "h",
        "mift_slurm_job_id": "7",
        "mift_slurm_run_root": "/s/r",
    }
    plain = backend_of({"backend": "slurm", "slurm": {"login_host": "h"}})
    assert type(plain) is SlurmBackend and "mift_slurm_run_root" not in plain.extra_vars


def test_the_plan_is_made_from_the_login_hosts_facts_once_per_rank() -> None:
    login = NodeFacts(
        hosts=["head"],
        train_address={"head": "10.0.0.3"},
        stack={"head": {"versions": {"torch": "2.6"}}},
        gpus={"head": {"count": 8}},
        probe={"head": {"versions": {"torch": "2.6"}}},
        nproc_per_node=8,
    )
    facts = rank_facts(login, 3)
    assert facts.hosts == ["rank0", "rank1", "rank2"] and facts.master == "rank0"
    assert facts.nproc_per_node == 8
    assert all(
        facts.gpus[r] == {"count": 8} and facts.probe[r]["versions"] == {"torch": "2.6"} for r in facts.hosts
    )
    assert any("login host only: planned from head's facts for 3 nodes" in n for n in facts.notes)

    plan = cast("RunPlan", SimpleNamespace(spec=spec(slurm=SHARED, min_free_disk_gb=2), facts=facts))
    assert expectations(plan) == {
        "versions": {"torch": "2.6"},
        "min_free_bytes": 2 * 1024**3,
        "facts_dir": layout().facts_dir,
    }


def test_first_failure_says_the_ranks_node_and_its_reason() -> None:
    nodes: dict[str, dict[str, Any]] = {
        "rank0": {"state": "queued", "slurm_node": "n1"},
        "rank1": {
            "state": "failed",
            "rc": 3,
            "reason": "preflight: /v/bin/llamafactory-cli not found",
            "slurm_node": "n2",
        },
    }
    assert first_failure(nodes) == "rank1 (n2): preflight: /v/bin/llamafactory-cli not found"
    assert (
        first_failure({"h2": {"state": "failed", "rc": -9, "slurm_node": "h2"}}) == "h2: trainer exited rc=-9"
    )


# --- the node agent: login host (shared-*) and nodes (slurm-check, slurm-step --ranks) ----------------------
def run(
    argv: list[str], *, env: dict[str, str] | None = None, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60, env=env, input=stdin)


def agent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, str(AGENT), "agent", *args], env=env)


def prepared_root(tmp_path: Path, versions: dict[str, str] | None = None, *trainer_args: str) -> Path:
    """A shared run root with 2 ranks prepared through the node program's install, as slurm_shared_prepare.yml
    does."""
    root = tmp_path / "shared" / "r-login"
    files = {}
    expect = {"versions": versions or {}, "min_free_bytes": 0, "facts_dir": str(tmp_path / "facts")}
    files["expect.json"] = json.dumps(expect)
    for rank in (0, 1):
        out = "output"
        job = {
            "run_id": "r-login",
            "node_rank": rank,
            "output_dir": out,
            "expect_outputs": ["adapter_model.safetensors", "all_results.json"] if rank == 0 else [],
            "argv": [sys.executable, str(FAKE), out, *trainer_args],
        }
        env = {"NNODES": "2", "NODE_RANK": str(rank), "MASTER_ADDR": "", "MASTER_PORT": "29500"}
        files[f"rank{rank}/bundle.json"] = json.dumps({"files": {}, "job": job, "env": env})
    proc = run([sys.executable, str(AGENT), "install", str(root), "shared-prepare"], stdin=json.dumps(files))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["ok"] and set(answer["results"]) == {"rank0", "rank1"}
    assert answer["results"]["rank1"]["start"]["state"] == "queued"
    assert (
        not (root / "rank1" / "bundle.json").exists()
        and (root / "rank1" / "env.json").stat().st_mode & 0o777 == 0o600
    )
    return root


def test_install_refuses_paths_except_rank_bundles(tmp_path: Path) -> None:
    for name, command in (
        ("../x", "shared-prepare"),
        ("rank0/job.json", "shared-prepare"),
        ("rank0/bundle.json", "prepare"),
    ):
        proc = run(
            [sys.executable, str(AGENT), "install", str(tmp_path / "r"), command],
            stdin=json.dumps({name: "x"}),
        )
        assert proc.returncode != 0 and "refusing file name" in proc.stderr, (name, command)


def task_env(tmp_path: Path, node_id: str, node: str) -> dict[str, str]:
    return srun_task_env(tmp_path, node_id, ("n1", "n2"), node)


def test_each_node_runs_its_rank_and_the_login_host_reads_the_states(tmp_path: Path) -> None:
    root = prepared_root(tmp_path, None, "--steps", "2", "--step-s", "0.05")  # both ranks write outputs
    for rank, node in ((0, "n1"), (1, "n2")):
        env = task_env(tmp_path, str(rank), node)
        check = agent("slurm-check", str(root), env=env)
        assert check.returncode == 0 and json.loads(check.stdout)["preflight"] == "ok", (
            check.stdout + check.stderr
        )
        step = agent("slurm-step", str(root), "--grace", "2", "--ranks", env=env)
        assert step.returncode == 0, step.stdout + step.stderr
    env1 = json.loads((root / "rank1" / "env.json").read_text())
    assert (env1["NODE_RANK"], env1["NNODES"], env1["MASTER_ADDR"]) == ("1", "2", "n1")
    status = json.loads(agent("shared-status", str(root)).stdout)["results"]
    assert {r: (s["status"]["state"], s["status"]["slurm_node"]) for r, s in status.items()} == {
        "rank0": ("finished", "n1"),
        "rank1": ("finished", "n2"),
    }
    assert status["rank0"]["status"]["processes"] is None  # on the login host no pid means anything
    collected = json.loads(agent("shared-collect", str(root)).stdout)["results"]
    assert Path(collected["rank1"]["collect"]["archive"]).is_file()
    assert any(p.endswith("adapter_model.safetensors") for p in collected["rank0"]["collect"]["outputs"])


def test_a_running_rank_read_remotely_is_running_whatever_its_pid(tmp_path: Path) -> None:
    root = prepared_root(tmp_path)
    state = {"state": "running", "pid": 2**22 + 1, "supervisor_pid": 2**22 + 2, "started_at": 1.0}
    (root / "rank0" / "state.json").write_text(json.dumps(state))
    remote = json.loads(agent("shared-status", str(root)).stdout)["results"]["rank0"]["status"]
    local = json.loads(agent("status", str(root / "rank0")).stdout)
    assert remote["state"] == "running" and local["state"] == "vanished"  # the pid lives on another host


def test_a_node_that_cannot_run_its_rank_records_why_and_fails(tmp_path: Path) -> None:
    root = prepared_root(tmp_path, {"mift-no-such-dist": "1.0"})
    check = agent("slurm-check", str(root), env=task_env(tmp_path, "1", "n2"))
    assert check.returncode == 1
    assert (
        "n2 (rank 1): preflight: mift-no-such-dist is not installed, the job was planned for 1.0"
        in check.stderr
    )
    status = json.loads(agent("shared-status", str(root)).stdout)["results"]["rank1"]["status"]
    assert status["state"] == "failed" and status["rc"] == 3 and status["reason"].startswith("preflight: ")
    job = json.loads((root / "rank0" / "job.json").read_text())
    job["argv"][0] = str(tmp_path / "no-such-cli")
    (root / "rank0" / "job.json").write_text(json.dumps(job))
    check = agent("slurm-check", str(root), env=task_env(tmp_path, "0", "n1"))
    assert check.returncode == 1 and f"{tmp_path}/no-such-cli not found" in check.stderr
    missing = agent("slurm-check", str(root), env=task_env(tmp_path, "5", "n6"))
    assert missing.returncode == 1 and "rank5: no such run directory" in missing.stderr


def test_stop_marks_ranks_slurm_ended_and_reports_a_job_still_there(tmp_path: Path) -> None:
    root = prepared_root(tmp_path)
    (root / "rank0" / "state.json").write_text(json.dumps({"state": "running", "pid": 1}))
    still = agent("shared-stop", str(root))  # squeue still shows the job
    assert still.returncode == 1
    assert json.loads(still.stdout)["results"]["rank0"]["stop"]["left"] == [
        "the slurm job is still on its nodes"
    ]
    gone = json.loads(agent("shared-stop", str(root), "--job-gone").stdout)
    assert gone["ok"] and {r: s["stop"]["left"] for r, s in gone["results"].items()} == {
        "rank0": [],
        "rank1": [],
    }
    assert json.loads((root / "rank0" / "state.json").read_text())["state"] == "stopped"
    again = json.loads(agent("shared-stop", str(root), "--job-gone").stdout)
    assert not any(s["stop"]["changed"] for s in again["results"].values())  # idempotent


def test_the_node_table_shows_each_ranks_slurm_node() -> None:
    from launcher.follow.live import render_table  # noqa: PLC0415

    lines = render_table(
        ["rank0", "h2"],
        {"rank0": {"state": "running", "slurm_node": "n1"}, "h2": {"state": "running", "slurm_node": "h2"}},
    )
    assert lines[1].split()[:5] == ["rank0", "(n1)", "0", "-", "running"] and lines[2].split()[:2] == [
        "h2",
        "1",
    ]
