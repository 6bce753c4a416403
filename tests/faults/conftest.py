"""Fixtures of the faults suite: 2 provisioned hosts, the launcher, host snapshots, the results.

The hosts (rig ``FAULTS_RIG_ID``, default 6) start from the provisioned host image (``provision.yml`` run once
per CI run, ``mift_testsupport.image``) once per session and are torn down at the end (``rig down --purge``);
the provisioning faults re-run ``provision.yml`` on them. The bad inputs that need no host run in-process
(``test_bad_input.py``) and take no hosts. Every test records what it expected and what it observed; at the
end of the session the records, with each test's outcome, are written to ``FAULTS_RESULTS`` (default
``.cache/faults/results.json``; ``FAULTS_MERGE=1`` adds them to the cases already there), which
``tools/fault_table.py`` renders into ``docs/faults.md``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mift_testsupport.cluster import RANKS_PER_HOST, Cluster, JobBase
from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.image import SYSTEMD, provisioned_rig
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.rig import rig_id_from_env
from mift_testsupport.trainers import TRAINER_PATTERN

from .finished_run import Finished, finish_a_run
from .stopped_run import Stopped, stop_a_run

if TYPE_CHECKING:
    from collections.abc import Iterator

CORPUS = Path(__file__).resolve().parent / "corpus"
RIG_ID = rig_id_from_env("FAULTS_RIG_ID", 6)
HOSTS = (1, 2)
RESULTS = Path(os.environ.get("FAULTS_RESULTS") or REPO_ROOT / ".cache" / "faults" / "results.json")
MARKER = "/run/mift-faults-marker"
# the faults' jobs: the corpus's baseline files (every bad case is one edit away from them), 8 steps, no
# checkpoint unless a test asks for one, RANKS_PER_HOST trainer ranks on each host
JOBS = JobBase(
    job=CORPUS / "configs" / "jobs" / "ok.yaml",
    train=CORPUS / "configs" / "train" / "ok.yaml",
    deepspeed_dir=CORPUS / "configs" / "deepspeed",
    deepspeed="ok_z3.json",
    train_overrides={"max_steps": 8, "save_steps": 10_000},
    nproc_per_node=RANKS_PER_HOST,
)
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
    # the node program's cache (launcher/transfer/nodeprogram.py: one file named by its content's hash, sent
    # where missing and kept, as Ansible's own folders are): the folders it is made in and that file only
    "-not -path /root/.cache -not -path /root/.cache/mift-node "
    "-not -path '/root/.cache/mift-node/mift_node-*.pyz' "
    "-printf 'changed: %p\\n' 2>/dev/null; "
    "ls -A /var/lib/mift/runs 2>/dev/null | sed 's/^/run dir: /'; "
    f"pgrep -af '{TRAINER_PATTERN}' | sed 's/^/process: /'; "
    "ls -d /tmp/pwned* /tmp/mift-escaped 2>/dev/null | sed 's/^/planted: /'; true"
)


def mark(cluster: Cluster) -> None:
    """Touch the marker on every host: a later snapshot lists what changed after it."""
    for host in HOSTS:
        cluster.ssh(host, f"touch {MARKER}")
    time.sleep(0.05)


def snapshot(cluster: Cluster) -> dict[int, list[str]]:
    """Return host -> changes since the marker, node run dirs, trainer processes, planted files."""
    return {host: sorted(cluster.ssh(host, SNAPSHOT).splitlines()) for host in HOSTS}


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """2 hosts of rig ``FAULTS_RIG_ID`` (6) from the provisioned image, for the whole session."""
    rig_ready_or_skip(systemd=SYSTEMD)
    work = tmp_path_factory.mktemp("faults")
    with provisioned_rig(RIG_ID, len(HOSTS), log=work / "image-provision.log") as rig:
        yield Cluster(rig, work, real_backend=False, base=JOBS)


@pytest.fixture(scope="session")
def stopped(cluster: Cluster) -> Stopped:
    """The one run Ctrl-C'd while followed, once checkpoint-4 exists (``stopped_run``): ``ctrl-c-follow``
    checks its stop, the resume cases continue it."""
    return stop_a_run(cluster)


@pytest.fixture(scope="session")
def finished(cluster: Cluster) -> Finished:
    """The one uninterrupted run of the recovery job (``finished_run``): the recovery cases' reference losses,
    the secrets case's leak check."""
    return finish_a_run(cluster)


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
    command = os.environ.get("FAULTS_COMMAND") or "pytest " + " ".join(
        shlex.quote(str(a)) for a in session.config.invocation_params.args
    )
    # sessions on two rigs side by side (CI) merge into the same file: one at a time
    with (RESULTS.parent / (RESULTS.name + ".lock")).open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        previous: dict[str, Any] = {}
        commands: list[str] = []
        if RESULTS.exists() and os.environ.get("FAULTS_MERGE", "") not in ("", "0"):
            old = json.loads(RESULTS.read_text())
            previous = {r["nodeid"]: r for r in old.get("cases", [])}
            commands = list(old.get("commands", []))
        for nodeid, record in _RECORDS.items():
            previous[nodeid] = {"nodeid": nodeid, **record}
        data = {
            "commands": list(dict.fromkeys([*commands, command])),
            "finished_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "cases": list(previous.values()),
        }
        tmp = RESULTS.with_name(RESULTS.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(RESULTS)
