"""A hub token passed in a job spec's environment never leaks (the ``5 secrets`` group of docs/faults.md).

The run it checks is the suite's one uninterrupted run of the recovery job (``finished_run``), which carries
the token: a full run (start, follow, checkpoints, collect, success) is all the case needs, and that one is
made anyway for the recovery cases' losses.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from mift_testsupport.cluster import Cluster

from .conftest import HOSTS
from .finished_run import NAME, STEPS, Finished

pytestmark = [pytest.mark.rig, pytest.mark.slow]


def test_secrets_never_leak(cluster: Cluster, finished: Finished, fault_record: dict[str, Any]) -> None:
    """A hub token passed as environment appears only in the node env file (0600); run dirs are private."""
    secret = finished.secret
    fault_record.update(
        case="secret-env",
        group="5 secrets",
        input=f"env HF_TOKEN=<secret> in the job spec; a full run ({STEPS} steps, the recovery cases' "
        "uninterrupted run)",
        expected="secret absent from launcher output, controller run dir (record, ansible artifacts, logs) "
        "and node run dir except env.json; env.json 0600; run dirs not world-readable",
    )
    out = finished.out
    run = cluster.run_dir(NAME)
    run_id = finished.run_id
    leaks = [
        f"launcher {stream}"
        for stream, text in (("stdout", out.stdout), ("stderr", out.stderr))
        if secret in text
    ]
    for path in run.rglob("*"):
        if path.is_file() and secret.encode() in path.read_bytes():
            leaks.append(f"controller {path.relative_to(cluster.runs)}")
    world = [
        f"{p.relative_to(cluster.runs)} {p.stat().st_mode & 0o777:o}"
        for p in (run,)
        if p.stat().st_mode & 0o077
    ]
    world += [f"controller copy {p.relative_to(cluster.runs)}" for p in run.glob("files/*/env.json")]
    node = {}
    for host in HOSTS:
        grep = cluster.ssh(
            host,
            f"grep -rl --exclude=env.json {secret} /var/lib/mift/runs/{run_id} /tmp /root 2>/dev/null; true",
        ).split()
        leaks += [f"host{host}:{p}" for p in grep]
        node[host] = cluster.ssh(
            host,
            f"stat -c '%a %n' /var/lib/mift/runs/{run_id} /var/lib/mift/runs/{run_id}/env.json",
            check=False,
        ).split("\n")
        world += [
            f"host{host}:{line}" for line in node[host] if line and not re.match(r"^[0-7]?[0-7]00 ", line)
        ]
    fault_record["observed"] = (
        f"run exit {out.returncode}; leaks: {leaks or 'none'}; world/group-accessible: {world or 'none'}; "
        f"node modes: {node}"
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert not leaks, leaks
    assert not world, world
    for host in HOSTS:
        assert any(line.startswith("600 ") and line.endswith("env.json") for line in node[host]), node[host]
    assert json.loads((run / "record.json").read_text())["spec"]["env"]["HF_TOKEN"] == "***"
