"""The bad-input corpus (tests/faults/corpus/cases.yaml): every case exits 2 with one clear stderr line.

Each case must exit 2 with one stderr line that matches the case's expression (naming the file, key or host at
fault).

* Cases that need no host (most of them) run in-process through the CLI entry point
  (``launcher.main.cli(argv)``) with the Ansible runner replaced by ``RunnerMustNotBeCalled``, a test double
  that fails the case when it is constructed or called: they are rejected before any playbook could touch a
  host, in well under a second each. The inventory they name is a file with the rig's layout whose addresses
  (192.0.2.0/24, TEST-NET-1) answer nowhere.
* Cases marked ``needs_hosts`` (an unreachable host, the node's GPUs, port or disk, a path on the node)
  run the launcher against 2 provisioned test hosts and must change nothing on any of them: no file under
  the watched node folders newer than a marker touched just before the case, no new node run directory, no
  training process, no file planted by shell code. A valid environment value carrying shell metacharacters
  must reach the trainer verbatim, as data (read during the suite's stopped run, ``stopped_run``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from mift_testsupport.cli import run_cli
from mift_testsupport.cluster import Cluster
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.proc import ansible_bin, run

from .conftest import CORPUS, HOSTS, mark, snapshot
from .stopped_run import EVIL, Stopped

if TYPE_CHECKING:
    from collections.abc import Iterator

CASES: list[dict[str, Any]] = yaml.safe_load((CORPUS / "cases.yaml").read_text())
NO_HOST = [c for c in CASES if not c.get("needs_hosts")]
ON_HOSTS = [c for c in CASES if c.get("needs_hosts")]
LISTENER_PID = "/run/mift-faults-listener.pid"
GPU_PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "gpu_verify.yml"
NOWHERE = "192.0.2"  # TEST-NET-1 (RFC 5737): documentation addresses, routed nowhere


def _nowhere_inventory(folder: Path) -> Path:
    """An inventory like the rig's (trainers host1, host2) at addresses where nothing answers."""
    path = folder / "inventory-nowhere.yml"
    hosts = {
        f"host{i}": {"ansible_host": f"{NOWHERE}.{10 + i}", "train_address": f"{NOWHERE}.{10 + i}"}
        for i in (1, 2)
    }
    inv = {"all": {"children": {"trainers": {"hosts": hosts}}, "vars": {"ansible_user": "root"}}}
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def _unreachable_inventory(cluster: Cluster) -> Path:
    """The rig's inventory plus host3 at an address of the rig's network where nothing answers."""
    path = cluster.work / "inventory-unreachable.yml"
    if not path.exists():
        inv = yaml.safe_load(cluster.inventory.read_text())
        net = cluster.rig.net
        inv["all"]["children"]["trainers"]["hosts"]["host3"] = {
            "ansible_host": f"{net}.13",
            "train_address": f"{net}.13",
        }
        path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def _argv(case: dict[str, Any], inventory: Path, unreachable: Path | None = None) -> list[str]:
    values = {
        "corpus": str(CORPUS.relative_to(REPO_ROOT)),
        "jobs": str((CORPUS / "configs" / "jobs").relative_to(REPO_ROOT)),
        "inv": str(inventory),
        "inv_unreachable": str(unreachable or "{inv_unreachable}: a case that needs hosts"),
    }
    return [str(a).format(**values) for a in case["argv"]]


def _reverify_gpus(cluster: Cluster, host: str) -> None:
    # the running hosts keep running (on their image); host2's GPU profile changes in place
    cluster.rig.up(profiles={2: "mi250x" if host == "mi250x" else "mi300x"})
    verify = run(
        [
            ansible_bin("ansible-playbook"),
            "-i",
            str(cluster.inventory),
            str(GPU_PLAYBOOK),
            "-e",
            json.dumps({"faults_target": "host2"}),
        ],
        env=cluster.rig.env(),
        cwd=REPO_ROOT,
        timeout=600,
        check=False,
    )
    assert verify.returncode == 0, verify.stdout[-3000:]


@contextlib.contextmanager
def host_condition(cluster: Cluster, name: str | None) -> Iterator[None]:
    """Create the host condition a case needs (before the marker), remove it afterwards."""
    if name == "port_in_use":
        server = (
            "import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 29500)); s.listen(); "
            "time.sleep(900)"
        )
        inner = f"echo $$ > {LISTENER_PID}; exec python3 -c {shlex.quote(server)}"
        cluster.ssh(1, f"setsid -f sh -c {shlex.quote(inner)} >/dev/null 2>&1 </dev/null")
        time.sleep(1)
        try:
            yield
        finally:
            cluster.ssh(1, f"kill $(cat {LISTENER_PID}) && rm -f {LISTENER_PID}", check=False)
    elif name == "wrong_gpu":
        _reverify_gpus(cluster, "mi250x")
        try:
            yield
        finally:
            _reverify_gpus(cluster, "mi300x")
    else:
        assert name is None, f"unknown setup {name!r}"
        yield


def _error_lines(stderr: str, *, usage: bool) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    if usage:  # argparse: "usage: ..." and its indented continuation lines come first
        while lines and (lines[0].startswith("usage:") or lines[0][:1].isspace()):
            lines.pop(0)
    return lines


def _one_line_problems(case: dict[str, Any], rc: int, stderr: str) -> tuple[list[str], list[str]]:
    """The case's stderr lines (argparse's usage lines left out) and what is wrong with the result."""
    lines = _error_lines(stderr, usage=bool(case.get("usage")))
    problems = []
    if rc != 2:
        problems.append(f"exit {rc}, not 2")
    if len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines, not 1")
    if not any(re.compile(case["expect"]).search(line) for line in lines[:1]):
        problems.append(f"stderr does not match {case['expect']!r}")
    return lines, problems


def _record_case(record: dict[str, Any], case: dict[str, Any], untouched: str) -> None:
    """Fill the case's table row: what it is and what it must do (``untouched``: what must not happen)."""
    record.update(
        case=case["id"],
        group="1 bad input",
        input=case["what"],
        command="python -m launcher " + " ".join(shlex.quote(a) for a in case["argv"]),
        expected=f"exit 2; one stderr line matching `{case['expect']}`; {untouched}",
    )


def _shown(lines: list[str]) -> str:
    return f"{len(lines)} stderr line(s): " + " | ".join(line[:240] for line in lines[:3])


@pytest.mark.parametrize("case", NO_HOST, ids=[c["id"] for c in NO_HOST])
def test_bad_input_in_process(case: dict[str, Any], tmp_path: Path, fault_record: dict[str, Any]) -> None:
    """A bad input that needs no host: rejected in-process before the Ansible runner is ever constructed."""
    _record_case(fault_record, case, "the Ansible runner never constructed (RunnerMustNotBeCalled)")
    env = {
        "MIFT_RUNS_DIR": str(tmp_path / "runs"),
        "MIFT_VALIDATE_BUILTIN": None if case.get("real_backend") else "1",
        "LAUNCHER_DEBUG": None,
    }
    out = run_cli(_argv(case, _nowhere_inventory(tmp_path)), env=env)
    lines, problems = _one_line_problems(case, out.rc, out.stderr)
    if out.runner_calls:
        problems.append(f"the Ansible runner was reached: {out.runner_calls}")
    fault_record["observed"] = (
        f"exit {out.rc} in {out.seconds:.2f} s (in-process); {_shown(lines)}; "
        f"Ansible runner: {'reached ' + str(out.runner_calls) if out.runner_calls else 'not reached'}"
    )
    assert not problems, "; ".join(problems) + f"\nstderr: {out.stderr[-1500:]}\nstdout: {out.stdout[-800:]}"


def test_runner_double_is_reached_by_a_valid_job(tmp_path: Path) -> None:
    """The in-process cases prove something only if a job that passes validation does reach the runner."""
    env = {"MIFT_RUNS_DIR": str(tmp_path / "runs"), "MIFT_VALIDATE_BUILTIN": "1", "LAUNCHER_DEBUG": None}
    job = CORPUS.relative_to(REPO_ROOT) / "configs" / "jobs" / "ok.yaml"
    out = run_cli(["run", str(job), "-i", str(_nowhere_inventory(tmp_path)), "--detach"], env=env)
    assert out.runner_calls, f"exit {out.rc}; stderr: {out.stderr[-1500:]}"
    assert out.rc != 0


@pytest.mark.rig
@pytest.mark.slow
@pytest.mark.parametrize("case", ON_HOSTS, ids=[c["id"] for c in ON_HOSTS])
def test_bad_input_on_hosts(case: dict[str, Any], cluster: Cluster, fault_record: dict[str, Any]) -> None:
    """A bad input only the nodes can reveal: rejected by preflight, nothing changed on any host."""
    _record_case(fault_record, case, "no change on any host")
    before_runs = cluster.run_dirs()
    with host_condition(cluster, case.get("setup")):
        mark(cluster)
        before = snapshot(cluster)
        t0 = time.monotonic()
        out = cluster.run(
            *_argv(case, cluster.inventory, _unreachable_inventory(cluster)),
            timeout=600,
            real_backend=bool(case.get("real_backend")),
        )
        took = time.monotonic() - t0
        after = snapshot(cluster)
    changes = {h: sorted(set(after[h]) - set(before[h])) for h in after}
    stopped = cluster.stop_leftover_runs(before_runs)
    for host, found in changes.items():  # shell code that ran must not poison the next case
        if any(line.startswith("planted: ") for line in found):
            cluster.ssh(host, "rm -rf /tmp/pwned* /tmp/mift-escaped", check=False)
    lines, problems = _one_line_problems(case, out.returncode, out.stderr)
    changed = {f"host{h}": c for h, c in changes.items() if c}
    fault_record["observed"] = (
        f"exit {out.returncode} in {took:.1f} s; {_shown(lines)}"
        + (f"; host changes: {changed}" if changed else "; no host change")
        + (f"; started and stopped {stopped}" if stopped else "")
    )
    if changed:
        problems.append(f"hosts changed: {changed}")
    assert not problems, "; ".join(problems) + f"\nstderr: {out.stderr[-1500:]}\nstdout: {out.stdout[-800:]}"


@pytest.mark.rig
@pytest.mark.slow
def test_env_value_with_shell_metacharacters_arrives_as_data(
    stopped: Stopped, fault_record: dict[str, Any]
) -> None:
    """A valid env value full of shell code reaches the trainer's environment verbatim and runs nowhere (read
    on the hosts while the suite's stopped run trained, before its Ctrl-C: ``stopped_run``)."""
    fault_record.update(
        case="env-value-metachar-as-data",
        group="1 bad input",
        input=f"env MIFT_FAULTS_EVIL={EVIL!r} (valid input; the job of the suite's stopped run)",
        expected="accepted; the value is verbatim in the node env file and the trainer's environ; "
        "no /tmp/pwned* on any host",
    )
    fault_record["observed"] = "; ".join(
        f"host{h}: env file verbatim={a}, trainer environ verbatim={b}, planted={p or 'none'}"
        for h, (a, b, p) in stopped.evil.items()
    )
    assert sorted(stopped.evil) == list(HOSTS), stopped.evil
    for host, (in_file, in_environ, planted) in stopped.evil.items():
        assert in_file and in_environ and not planted, f"host{host}: {stopped.evil[host]}"
