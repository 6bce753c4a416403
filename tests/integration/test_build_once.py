"""Build once, install everywhere (roles/wheel_cache), end to end on 3 test hosts of rig 4.

The rig id can be moved with ``MIFT_BUILDONCE_RIG_ID``.

The hosts start from the provisioned host image (mift_testsupport.image, made first when it is not current;
CI's host-image stage makes it): the builder's toolchain and python3-dev are there already, as on a cluster
that provision.yml set up, so the cases pay for the builds and installs they are about, not for apt. The
first install of that toolchain on a fresh builder, through this role, is what the image itself is made by
(provision.yml's DeepSpeed build). Builds of the image's own wheels are in the builder's build log: the cases
read their own entries (by dist).

The fixture package tests/fixtures/buildonce_pkg has a C extension, so building its wheel really compiles.
Run 1: exactly one host (the builder, first of `trainers`) builds; the controller caches the wheel; every
host installs it from the cache. Run 2: nothing is built and nothing changes. Run 3: a changed build flag
is a new cache key, so the builder builds once more and every host gets the new binary.

The flash_attn test runs the flash_attn role's build step (its build environment: ninja installed into the
venv first, the venv's bin first on PATH, MAX_JOBS) on the builder with tests/fixtures/torchext_standin, a
STAND-IN for flash-attention's source (a torch C++ op built with torch.utils.cpp_extension against the CPU
torch; the CK kernels need ROCm), in a venv made with python3.11 and the packages python_env chooses on Ubuntu
22.04 (python3.11, python3.11-venv, python3.11-dev: Debian 12 has the same names), and shows ninja ran.
Needs root and the rig (tools/testhosts/rig setup); the build-once test takes about 4 minutes on the 2-core
controller, the flash_attn build test about 2 more.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from mift_testsupport.fixtures import rig_ready_or_skip
from mift_testsupport.image import provisioned_rig
from mift_testsupport.paths import REPO_ROOT
from mift_testsupport.rig import rig_id_from_env

if TYPE_CHECKING:
    from collections.abc import Iterator

ansible_runner = pytest.importorskip("ansible_runner")

REPO = REPO_ROOT
FIXTURE = REPO / "tests" / "fixtures" / "buildonce_pkg"
STANDIN = REPO / "tests" / "fixtures" / "torchext_standin"  # stand-in for flash-attention's source
RIG_ID = rig_id_from_env("MIFT_BUILDONCE_RIG_ID", 4)
HOSTS = 3
BUILD_TASK = "Build the wheel on the builder, buildonce"
INSTALL_TASK = "Install the cached wheel into the venv"
VENV = "/opt/mift/venv-buildonce"
# Run on each host after the role: the fixture's result, the builder's build log (the fixture's builds: the
# image's own are there too), the local fact.
REPORT_SRC = """
import json, pathlib, buildonce_pkg as b
log = pathlib.Path('/var/log/mift/wheel-builds.log')
entries = [json.loads(line) for line in (log.read_text().splitlines() if log.exists() else [])]
fact = json.loads(pathlib.Path('/etc/ansible/facts.d/mift_wheels.fact').read_text())
print(json.dumps({'fnv': hex(b.fnv1a64(b'a')), 'flag': b.BUILD_FLAG, 'fact': fact['buildonce'],
                  'builds': [e['key'] for e in entries if e['dist'] == 'mift_buildonce_fixture']}))
"""

pytestmark = [pytest.mark.rig, pytest.mark.slow]


@pytest.fixture(scope="module")
def inventory() -> Iterator[Path]:
    rig_ready_or_skip()
    with provisioned_rig(RIG_ID, HOSTS) as rig:
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

    def __init__(
        self,
        tmp: Path,
        inventory: Path,
        cache: Path,
        flag: int,
        name: str,
        playbook: list[dict[str, Any]] | None = None,
    ) -> None:
        pdd = tmp / name
        pdd.mkdir()
        self.result = ansible_runner.run(
            private_data_dir=str(pdd),
            playbook=playbook or _playbook(cache, flag),
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

    def slowest(self, count: int = 6) -> list[tuple[float, str, str]]:
        """Return the ``count`` slowest task results as (seconds, host, task), for the CI time budget."""
        timed = [
            (round(float(e["event_data"]["duration"]), 1), e["event_data"]["host"], e["event_data"]["task"])
            for e in self.events
            if e["event"] in ("runner_on_ok", "runner_on_failed")
            and e["event_data"].get("duration") is not None
        ]
        return sorted(timed, reverse=True)[:count]

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


TE_VENV = "/opt/mift/venv-torchext"
TE_BUILD_LOG = "/var/log/mift/wheel-builds-torchext.log"  # not the build-once test's log
TE_BUILD_TASK = "Build the wheel on the builder, flash-attn"
# Run on the builder after the build: the installed op, the fact, the build log and the ninja files.
TE_REPORT_SRC = """
import json, pathlib, subprocess, sys, torch, torchext_standin as t
fact = json.loads(pathlib.Path('/etc/ansible/facts.d/mift_wheels.fact').read_text())['flash-attn']
work = pathlib.Path('/var/tmp/mift-wheel-build') / ('flash-attn-' + fact['key'][:12])
result = json.loads((work / 'result.json').read_text())
keep = ('torchext_standin:', 'Falling back', '[', 'build ')
log = [line.strip() for line in (work / 'build.log').read_text().splitlines()]
dev = subprocess.run(['dpkg-query', '-Wf', '${Status}', 'python3.11-dev'], capture_output=True, text=True)
print(json.dumps({
    'op': t.scaled_add(torch.ones(2), torch.ones(2), 2.0).tolist(), 'fact': fact,
    'python': sys.version.split()[0], 'pyvenv': (pathlib.Path(sys.prefix) / 'pyvenv.cfg').read_text(),
    'dev_status': dev.stdout, 'tools': result['build_tools'], 'flags': result['build_flags'],
    'ninja_files': sorted(str(p.relative_to(work)) for p in (work / 'src').rglob('build.ninja')),
    'log': [line for line in log if line.startswith(keep) or 'Falling back' in line]}))
"""


def _flash_attn_playbook(cache: Path) -> list[dict[str, Any]]:
    return [
        {
            "name": "Run the flash_attn build step with the stand-in source on the builder",
            "hosts": "host1",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "Wait until the host answers over ssh",
                    "ansible.builtin.wait_for_connection": {"timeout": 60},
                },
                {"name": "Gather facts", "ansible.builtin.setup": {}},
                {
                    # the interpreter and packages python_env chooses on Ubuntu 22.04, given explicitly here
                    # (this host is Debian 12, whose own choice is /usr/bin/python3, also 3.11)
                    "name": "Create the venv with python3.11",
                    "ansible.builtin.include_role": {"name": "python_env"},
                    "vars": {
                        "python_env_path": TE_VENV,
                        "python_env_python": "/usr/bin/python3.11",
                        "python_env_apt_packages": ["python3.11", "python3.11-venv", "python3.11-dev"],
                    },
                },
                {
                    "name": "Install the CPU torch",
                    "ansible.builtin.include_role": {"name": "pytorch"},
                    "vars": {"pytorch_backend": "cpu", "pytorch_venv": TE_VENV},
                },
                {
                    "name": "Build through the flash_attn role's build step",
                    "ansible.builtin.include_role": {"name": "flash_attn", "tasks_from": "build"},
                    "vars": {
                        "flash_attn_venv": TE_VENV,
                        "flash_attn_backend": "ck",
                        "flash_attn_source_type": "path",
                        "flash_attn_source_path": str(STANDIN),
                        "wheel_cache_dir": str(cache),
                        "wheel_cache_build_log": TE_BUILD_LOG,
                    },
                },
                {
                    "name": "Report the state of the host",
                    "ansible.builtin.command": {"argv": [f"{TE_VENV}/bin/python", "-c", TE_REPORT_SRC]},
                    "register": "report",
                    "changed_when": False,
                },
            ],
        }
    ]


def test_flash_attn_build_uses_ninja_from_the_venv(tmp_path: Path, inventory: Path) -> None:
    cache = tmp_path / "wheels"
    run = Run(tmp_path, inventory, cache, flag=0, name="flash-attn", playbook=_flash_attn_playbook(cache))
    assert run.result.rc == 0, run.stdout()
    assert [d["res"].get("changed") for d in run.ok_events(TE_BUILD_TASK)] == [True], "exactly one build"
    report = run.reports()["host1"]
    print(json.dumps({k: report[k] for k in ("python", "tools", "flags", "ninja_files", "log")}, indent=1))
    print("slowest tasks (s, host, task):", *run.slowest(), sep="\n  ")

    # the venv was made by python3.11, and the builder got that interpreter's headers
    assert report["python"].startswith("3.11.") and "/usr/bin" in report["pyvenv"]
    assert "python3.11" in report["pyvenv"] and report["dev_status"] == "install ok installed"
    # the build found the venv's ninja first on PATH, torch's extension builder used it with MAX_JOBS
    ninja = f"{TE_VENV}/bin/ninja"
    assert report["tools"]["ninja"] == ninja
    max_jobs = report["flags"]["MAX_JOBS"]
    assert int(max_jobs) >= 1 and report["flags"]["GPU_ARCHS"] == "gfx942"
    assert f"torchext_standin: use_ninja=True MAX_JOBS={max_jobs} ninja={ninja}" in report["log"]
    assert not [line for line in report["log"] if "Falling back" in line]
    assert any(line.startswith("[2/2] c++") for line in report["log"]), report["log"]
    assert report["ninja_files"] == ["src/build/temp.linux-x86_64-cpython-311/build.ninja"]
    # the built op installed from the cache and computes
    assert report["op"] == [3.0, 3.0]
    assert report["fact"]["dist"] == "mift_torchext_standin" and report["fact"]["built_here"] is True
    shutil.rmtree(cache)
