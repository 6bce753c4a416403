"""Build once, install everywhere (roles/wheel_cache), end to end on 3 test hosts of rig 4.

The rig id can be moved with ``MIFT_BUILDONCE_RIG_ID``.

The fixture package tests/fixtures/buildonce_pkg has a C extension, so building its wheel really compiles.
Run 1: exactly one host (the builder, first of `trainers`) builds; the controller caches the wheel; every
host installs it from the cache. Run 2: nothing is built and nothing changes. Run 3: a changed build flag
is a new cache key, so the builder builds once more and every host gets the new binary.
Needs root and the rig (tools/testhosts/rig setup); takes about 2-3 minutes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.rig import rig_id_from_env, rig_instance

if TYPE_CHECKING:
    from collections.abc import Iterator

ansible_runner = pytest.importorskip("ansible_runner")

REPO = REPO_ROOT
FIXTURE = REPO / "tests" / "fixtures" / "buildonce_pkg"
RIG_ID = rig_id_from_env("MIFT_BUILDONCE_RIG_ID", 4)
HOSTS = 3
BUILD_TASK = "Build the wheel on the builder, buildonce"
INSTALL_TASK = "Install the cached wheel into the venv"
VENV = "/opt/mift/venv-buildonce"
# Run on each host after the role: the fixture's result, the builder's build log, the local fact.
REPORT_SRC = """
import json, pathlib, buildonce_pkg as b
log = pathlib.Path('/var/log/mift/wheel-builds.log')
lines = log.read_text().splitlines() if log.exists() else []
fact = json.loads(pathlib.Path('/etc/ansible/facts.d/mift_wheels.fact').read_text())
print(json.dumps({'fnv': hex(b.fnv1a64(b'a')), 'flag': b.BUILD_FLAG,
                  'builds': [json.loads(line)['key'] for line in lines], 'fact': fact['buildonce']}))
"""

pytestmark = [pytest.mark.rig, pytest.mark.slow]


@pytest.fixture(scope="module")
def inventory() -> Iterator[Path]:
    rig_ready_or_skip()
    with rig_instance(RIG_ID, HOSTS) as rig:
        yield rig.inventory


def _playbook(cache: Path, flag: int) -> list[dict[str, Any]]:
    return [
        {
            "name": "Build the fixture once and install it everywhere",
            "hosts": "trainers",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Wait until the fresh hosts answer over ssh",
                    "ansible.builtin.wait_for_connection": {"timeout": 60},
                },
                {"name": "Gather facts", "ansible.builtin.setup": {}},
                {
                    "name": "Create the venv",
                    "ansible.builtin.include_role": {"name": "python_env"},
                    "vars": {"python_env_path": VENV, "python_env_pins_file": ""},
                },
                {
                    "name": "Build once through the wheel cache",
                    "ansible.builtin.include_role": {"name": "wheel_cache"},
                    "vars": {
                        "wheel_cache_name": "buildonce",
                        "wheel_cache_source_type": "path",
                        "wheel_cache_source": str(FIXTURE),
                        "wheel_cache_build_env": {"CFLAGS": f"-DMIFT_FIXTURE_FLAG={flag}"},
                        "wheel_cache_dir": str(cache),
                        "wheel_cache_venv": VENV,
                    },
                },
                {
                    "name": "Report the state of the host",
                    "ansible.builtin.command": {"argv": [f"{VENV}/bin/python", "-c", REPORT_SRC]},
                    "register": "report",
                    "changed_when": False,
                },
            ],
        }
    ]


class Run:
    """One ansible-runner run of the playbook and what its events say."""

    def __init__(self, tmp: Path, inventory: Path, cache: Path, flag: int, name: str) -> None:
        pdd = tmp / name
        pdd.mkdir()
        self.result = ansible_runner.run(
            private_data_dir=str(pdd),
            playbook=_playbook(cache, flag),
            inventory=str(inventory),
            envvars={
                "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                "ANSIBLE_INJECT_FACT_VARS": "false",
                # ansible.cfg's relative paths would land in the long private_data_dir (ssh socket limit)
                "ANSIBLE_SSH_CONTROL_PATH_DIR": str(REPO / ".ansible" / "cp"),
                "ANSIBLE_LOCAL_TEMP": str(REPO / ".ansible" / "tmp"),
            },
            quiet=True,
            timeout=900,
        )
        self.events = list(self.result.events)

    def ok_events(self, task: str) -> list[dict[str, Any]]:
        return [
            e["event_data"]
            for e in self.events
            if e["event"] == "runner_on_ok" and e["event_data"].get("task", "").startswith(task)
        ]

    def changed_hosts(self, task: str) -> list[str]:
        return sorted(d["host"] for d in self.ok_events(task) if d["res"].get("changed"))

    def reports(self) -> dict[str, dict[str, Any]]:
        return {
            d["host"]: json.loads(d["res"]["stdout"]) for d in self.ok_events("Report the state of the host")
        }

    def stdout(self) -> str:
        text: str = self.result.stdout.read()
        return text[-6000:]


def test_build_once_install_everywhere(tmp_path: Path, inventory: Path) -> None:
    cache = tmp_path / "wheels"
    hosts = [f"host{i}" for i in range(1, HOSTS + 1)]

    # Run 1: exactly one host builds, every host installs from the controller cache.
    first = Run(tmp_path, inventory, cache, flag=7, name="run1")
    assert first.result.rc == 0, first.stdout()
    builds = first.ok_events(BUILD_TASK)
    assert [d["res"].get("changed") for d in builds] == [True], "exactly one build task ran"
    assert builds[0]["host"] == "host1"
    assert first.changed_hosts(INSTALL_TASK) == hosts
    entries = list(cache.iterdir())
    assert len(entries) == 1, entries
    manifest = json.loads((entries[0] / "manifest.json").read_text())
    assert manifest["builder"] == "host1"
    assert (entries[0] / manifest["wheel"]).is_file()
    assert entries[0].name == f"buildonce-{manifest['key'][:12]}"
    reports = first.reports()
    assert sorted(reports) == hosts
    for host, report in reports.items():
        assert report["fnv"] == "0xaf63dc4c8601ec8c" and report["flag"] == 7
        assert report["fact"]["key"] == manifest["key"]
        assert report["fact"]["builder"] == "host1"
        assert report["fact"]["built_here"] is (host == "host1")
        # the build log exists on the builder only, with one build
        assert report["builds"] == ([manifest["key"]] if host == "host1" else [])

    # Run 2: the cache has the key: nothing is built, nothing changes anywhere.
    second = Run(tmp_path, inventory, cache, flag=7, name="run2")
    assert second.result.rc == 0, second.stdout()
    assert second.ok_events(BUILD_TASK) == []
    assert second.changed_hosts(INSTALL_TASK) == []
    assert all(second.result.stats["changed"].get(h, 0) == 0 for h in hosts), second.result.stats
    assert json.loads((entries[0] / "manifest.json").read_text()) == manifest
    assert {h: r["builds"] for h, r in second.reports().items()} == {
        h: r["builds"] for h, r in reports.items()
    }

    # Run 3: another build flag is another key: one new build, the new binary everywhere.
    third = Run(tmp_path, inventory, cache, flag=9, name="run3")
    assert third.result.rc == 0, third.stdout()
    assert [d["res"].get("changed") for d in third.ok_events(BUILD_TASK)] == [True]
    assert third.changed_hosts(INSTALL_TASK) == hosts
    assert len(list(cache.iterdir())) == 2
    for host, report in third.reports().items():
        assert report["flag"] == 9
        assert len(report["builds"]) == (2 if host == "host1" else 0)
        assert report["fact"]["key"] != manifest["key"]
    shutil.rmtree(cache)
