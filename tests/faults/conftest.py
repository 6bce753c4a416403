"""Fixtures of the faults suite: 2 provisioned hosts of rig 6, the launcher, host snapshots, the results.

The hosts are brought up and provisioned once per session (``provision.yml`` with the test-double switches and
the tiny model) and torn down at the end (``rig down --purge``). Every test records what it expected and
what it observed; at the end of the session the records, with each test's outcome, are written to
``FAULTS_RESULTS`` (default ``.cache/faults/results.json``), which ``tools/fault_table.py`` renders into
``docs/faults.md``.

``FAULTS_KEEP_RIG=1`` reuses the rig (``FAULTS_RIG_ID``, default 6) when it is up and provisioned and
leaves it up: for development, and in CI to take over the rig the launcher e2e stage provisioned.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
import yaml

if TYPE_CHECKING:
    from collections.abc import Iterator

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).resolve().parent / "corpus"
RIG_ID = int(os.environ.get("FAULTS_RIG_ID", "6"))  # CI: the rig the e2e stage left up
HOSTS = (1, 2)
RESULTS = Path(os.environ.get("FAULTS_RESULTS") or REPO / ".cache" / "faults" / "results.json")
KEEP_RIG = os.environ.get("FAULTS_KEEP_RIG", "") not in ("", "0")
MARKER = "/run/mift-faults-marker"
# processes of a training run on a node (the agent's supervisor is `python3 .../mift_agent.py start ...`; the
# short-lived `mift_agent.py status|stop` of the launcher's playbooks are not part of the run)
TRAINER_PATTERN = "[l]lamafactory|[t]orchrun|[m]ift_agent.py start"
# what a bad input must not touch on a host: files newer than the marker here are changes
WATCHED = " ".join(
    (
        "/var/lib/mift",
        "/opt/mift/configs",
        "/opt/mift/data",
        "/opt/mift/models",
        "/etc/ansible",
        "/etc/mift-testdouble",
        "/tmp",
        "/root",
    )
)
# -mindepth 1: the watched folders themselves are not listed (every Ansible module run creates and removes its
# AnsiballZ payload folder in /tmp, which bumps the mtime of /tmp and nothing else); anything created, changed
# or left in them is listed
SNAPSHOT = (
    f"find {WATCHED} -xdev -mindepth 1 -newer {MARKER} "
    "-not -path '/tmp/.ansible*' -not -path '/root/.ansible*' "
    "-printf 'changed: %p\\n' 2>/dev/null; "
    "ls -A /var/lib/mift/runs 2>/dev/null | sed 's/^/run dir: /'; "
    f"pgrep -af '{TRAINER_PATTERN}' | sed 's/^/process: /'; "
    "ls -d /tmp/pwned* /tmp/mift-escaped 2>/dev/null | sed 's/^/planted: /'; true"
)


def _load_rig_lib() -> ModuleType:
    """Import tests/integration/conftest.py (the rig helpers) under a private name."""
    path = REPO / "tests" / "integration" / "conftest.py"
    spec = importlib.util.spec_from_file_location("mift_faults_riglib", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


riglib = _load_rig_lib()
TEST_DOUBLE_VARS: dict[str, Any] = riglib.TEST_DOUBLE_VARS


class Cluster:
    """The provisioned hosts plus helpers to run the launcher against them and to inspect them."""

    def __init__(self, rig: Any, work: Path) -> None:
        self.rig = rig
        self.work = work
        self.runs = work / "runs"
        self.runs.mkdir(exist_ok=True)
        self.inventory = Path(rig.inventory)

    # --- the launcher ---------------------------------------------------------------------------------
    def env(self, *, real_backend: bool = False) -> dict[str, str]:
        env = {**os.environ, "MIFT_RUNS_DIR": str(self.runs), "PYTHONUNBUFFERED": "1", "LAUNCHER_DEBUG": ""}
        env["PYTHONPATH"] = str(REPO / "python")
        if real_backend:
            env.pop("MIFT_VALIDATE_BUILTIN", None)
        else:  # the shipped key lists: the same checks without importing torch (seconds, not a minute)
            env["MIFT_VALIDATE_BUILTIN"] = "1"
        return env

    def launcher(
        self, *args: str, timeout: float = 900, real_backend: bool = False
    ) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "launcher", *args]
        return subprocess.run(
            argv,
            env=self.env(real_backend=real_backend),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
        )

    def start(self, *args: str, real_backend: bool = False) -> tuple[subprocess.Popen[str], Path]:
        """Start the launcher in the background; return it and the file holding its output."""
        log_path = self.work / f"launcher-{time.monotonic_ns()}.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "launcher", *args],
                env=self.env(real_backend=real_backend),
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=REPO,
                stdin=subprocess.DEVNULL,
            )
        return proc, log_path

    def job(self, name: str, *, max_steps: int = 8, save_steps: int = 10_000, **spec: Any) -> Path:
        """Write a job spec (and its training YAML) for the tiny model under the work dir."""
        cfg = yaml.safe_load((CORPUS / "configs" / "train" / "ok.yaml").read_text())
        cfg.update(max_steps=max_steps, save_steps=save_steps)
        # a configs/train/ folder next to configs/data/: validation maps /opt/mift/data/... to it
        configs = self.work / "configs"
        (configs / "train").mkdir(parents=True, exist_ok=True)
        if not (configs / "data").exists():
            (configs / "data").symlink_to(REPO / "configs" / "data")
        train = configs / "train" / f"{name}.yaml"
        train.write_text(yaml.safe_dump(cfg, sort_keys=False))
        job = yaml.safe_load((CORPUS / "configs" / "jobs" / "ok.yaml").read_text())
        job.update(
            name=name,
            train_config=str(train),
            deepspeed=str(CORPUS / "configs" / "deepspeed" / "ok_z3.json"),
            **spec,
        )
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(job, sort_keys=False))
        return path

    def run_dirs(self) -> set[str]:
        return {p.name for p in self.runs.iterdir()} if self.runs.is_dir() else set()

    def run_dir(self, name: str) -> Path:
        found = sorted(p for p in self.runs.iterdir() if p.name.startswith(f"{name}-"))
        assert found, f"no run directory for {name} in {self.runs}"
        return found[-1]

    def record(self, name: str) -> dict[str, Any]:
        try:
            return dict(json.loads((self.run_dir(name) / "record.json").read_text()))
        except (OSError, ValueError, AssertionError):
            return {}

    # --- the hosts ------------------------------------------------------------------------------------
    def ssh(self, host: int, command: str, *, check: bool = True, timeout: float = 120) -> str:
        return str(self.rig.ssh(host, command, check=check, timeout=timeout).stdout)

    def mark(self) -> None:
        """Touch the marker on every host: a later snapshot lists what changed after it."""
        for host in HOSTS:
            self.ssh(host, f"touch {MARKER}")
        time.sleep(0.05)

    def snapshot(self) -> dict[int, list[str]]:
        """Return host -> changes since the marker, node run dirs, trainer processes, planted files."""
        return {host: sorted(self.ssh(host, SNAPSHOT).splitlines()) for host in HOSTS}

    def trainer_processes(self) -> dict[int, list[str]]:
        """Return host -> training processes alive there (llamafactory, torchrun, the node agent)."""
        probe = f"pgrep -af '{TRAINER_PATTERN}' || true"
        return {host: self.ssh(host, probe).splitlines() for host in HOSTS}

    def trainer_processes_on(self, host: int) -> list[str]:
        """Return the training processes alive on one host."""
        return self.ssh(host, f"pgrep -af '{TRAINER_PATTERN}' || true").splitlines()

    def wait_no_trainers(self, seconds: float, *, since: float | None = None) -> float:
        """Wait until no host runs a training process; return the seconds since ``since`` (or now)."""
        t0 = time.monotonic() if since is None else since
        while True:
            left = self.trainer_processes()
            if not any(left.values()):
                return time.monotonic() - t0
            if time.monotonic() - t0 > seconds:
                raise AssertionError(f"processes left {seconds:.0f} s after the fault: {left}")
            time.sleep(0.5)

    def watch_until_clean(
        self, proc: subprocess.Popen[str], since: float, seconds: float = 180
    ) -> tuple[float, float]:
        """Watch the hosts from ``since`` until the launcher has exited and no training process is left.

        Returns (seconds from ``since`` to the last time a training process was seen, 0 if never; seconds from
        ``since`` to the launcher's exit). Raises when processes are still there after ``seconds``.
        """
        last_seen = since
        ended: float | None = None
        while True:
            now = time.monotonic()
            if ended is None and proc.poll() is not None:
                ended = now - since
            left = self.trainer_processes()
            if any(left.values()):
                last_seen = time.monotonic()
            elif ended is not None:
                return last_seen - since, ended
            if now - since > seconds:
                raise AssertionError(f"launcher exit {ended}; processes left {seconds:.0f} s after: {left}")
            time.sleep(0.5)

    def node_file(self, host: int, run_id: str, name: str) -> str:
        return self.ssh(host, f"cat /var/lib/mift/runs/{shlex.quote(run_id)}/{name}", check=False)

    def node_state(self, host: int, run_id: str) -> dict[str, Any]:
        try:
            return dict(json.loads(self.node_file(host, run_id, "state.json") or "{}"))
        except ValueError:
            return {}

    def wait_step(
        self, run_id_of: Any, proc: subprocess.Popen[str] | None = None, seconds: float = 600
    ) -> str:
        """Wait until host1's trainer logged a step; ``run_id_of()`` returns the run id (or '')."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise AssertionError(f"launcher ended early (rc={proc.returncode})")
            run_id = run_id_of()
            if run_id:
                out = self.ssh(
                    1,
                    f"tail -c 2000 /var/lib/mift/runs/{shlex.quote(run_id)}/output/trainer_log.jsonl",
                    check=False,
                )
                if '"current_steps"' in out:
                    return str(run_id)
            time.sleep(1)
        raise AssertionError(f"no logged training step within {seconds:.0f} s")

    def stop_leftover_runs(self, before: set[str]) -> list[str]:
        """Stop every run created since ``before`` that started trainers (a bad input wrongly accepted)."""
        stopped = []
        for run_id in sorted(self.run_dirs() - before):
            try:
                record = json.loads((self.runs / run_id / "record.json").read_text())
            except (OSError, ValueError):
                continue
            if record.get("hosts"):
                self.launcher("stop", run_id, timeout=300)
                stopped.append(run_id)
        return stopped


def interrupt(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C: SIGINT to the launcher process."""
    proc.send_signal(signal.SIGINT)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """2 test hosts of rig 6, provisioned once for the whole suite; torn down at the end."""
    riglib.rig_ready_or_skip()
    work = tmp_path_factory.mktemp("faults")
    rig = riglib.Rig(rig_id=RIG_ID, hosts=len(HOSTS))
    reuse = KEEP_RIG and (rig.state_dir / "inventory.yml").exists() and riglib.is_provisioned(rig)
    if not reuse:
        rig.down(purge=True)
        rig.up()
    try:
        model = riglib.make_tiny_model(work / "tiny-llama")
        if not reuse:
            t0 = time.monotonic()
            riglib.provision(rig, model, log=work / "provision.log")
            print(f"provisioned rig {RIG_ID} in {time.monotonic() - t0:.0f} s")
        yield Cluster(rig, work)
    finally:
        if not KEEP_RIG:
            rig.down(purge=True)


# --- results: every test fills a record; the outcome is added from the test report ----------------------
_RECORDS: dict[str, dict[str, Any]] = {}


@pytest.fixture
def fault_record(request: pytest.FixtureRequest) -> dict[str, Any]:
    """A dict the test fills: case, group, input, expected, observed (strings)."""
    record: dict[str, Any] = {
        "case": request.node.name,
        "group": "",
        "input": "",
        "expected": "",
        "observed": "",
    }
    _RECORDS[request.node.nodeid] = record
    return record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    record = _RECORDS.get(item.nodeid)
    if record is None:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        record["outcome"] = "skipped" if report.skipped else report.outcome
        record["seconds"] = round(report.duration, 1)
        if report.failed:
            text = str(report.longrepr.reprcrash.message) if hasattr(report.longrepr, "reprcrash") else ""
            record["failure"] = re.sub(r"\s+", " ", text or str(report.longrepr))[:600]


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _RECORDS:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    previous: dict[str, Any] = {}
    if RESULTS.exists() and os.environ.get("FAULTS_MERGE", "") not in ("", "0"):
        previous = {r["nodeid"]: r for r in json.loads(RESULTS.read_text()).get("cases", [])}
    for nodeid, record in _RECORDS.items():
        previous[nodeid] = {"nodeid": nodeid, **record}
    data = {
        "command": os.environ.get("FAULTS_COMMAND")
        or "pytest " + " ".join(shlex.quote(str(a)) for a in session.config.invocation_params.args),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cases": list(previous.values()),
    }
    RESULTS.write_text(json.dumps(data, indent=2) + "\n")
